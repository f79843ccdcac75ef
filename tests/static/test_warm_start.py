"""Warm start, checked as relations between files: every cache that makes a restart faster lives on
the cache volume (images, Compose, every Kubernetes overlay), and the engine's startup probe and the
autoscalers' windows are sized by the time to ready T that docs/autoscaling.md uses, which must
cover the cold start measured in benchmarks/results/startup.json (benchmarks/startup.py)."""

from __future__ import annotations

import json
import re
from pathlib import PurePosixPath

import pytest

from tests.helpers.compose_files import COMPOSE, env_of, load, volume_targets
from tests.helpers.dockerfile import parse_dockerfile
from tests.helpers.k8s_manifests import OVERLAYS, REPO, container, hpa, pod_spec, render, scaledobject

# What a restart reuses (benchmarks/results/startup.md): vLLM's cache (model info; its AOT compile
# cache where that loads back), inductor's compiled kernels, Triton's, and the temp directory,
# where inductor keeps its C++ precompiled header whatever TORCHINDUCTOR_CACHE_DIR says.
RESTART_CACHES = ("VLLM_CACHE_ROOT", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR", "TMPDIR")
# The startup probe kills a start that has not answered within its budget, and a killed start
# begins again from zero: too short a budget is a restart loop that never serves; too long only
# delays noticing a start that hung (the pod is not ready meanwhile, so no request is lost).
PROBE_MARGIN = 3
RESULTS = REPO / "benchmarks" / "results" / "startup.json"
AUTOSCALING_DOC = REPO / "docs" / "autoscaling.md"


def under(path: str, mount: str) -> bool:
    return PurePosixPath(mount) in (PurePosixPath(path), *PurePosixPath(path).parents)


def misplaced(env: dict[str, str], cache_mount: str) -> list[str]:
    """The restart caches that are unset or not on the cache volume."""
    return [k for k in RESTART_CACHES if k not in env or not under(env[k], cache_mount)]


def measured() -> dict:
    return json.loads(RESULTS.read_text(encoding="utf-8"))


def cold_full_s() -> float:
    """The slowest measured cold time to ready of the full-size stand-in."""
    return max(r["ready_s"] for r in measured()["sizes"]["full"]["runs"] if r["mode"] == "cold")


def sizing_t() -> int:
    """The T docs/autoscaling.md sizes the windows by."""
    found = re.findall(r"\*\*T = (\d+) s\*\*", AUTOSCALING_DOC.read_text(encoding="utf-8"))
    assert len(found) == 1, "docs/autoscaling.md must state its T once, as **T = <n> s**"
    return int(found[0])


# --- the caches are on the cache volume --------------------------------------------------------


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_restart_caches_are_on_the_cache_volume_in_every_overlay(overlay):
    spec = pod_spec(render(overlay))
    engine = container(spec, "engine")
    env = {e["name"]: e.get("value", "") for e in engine["env"]}
    [cache_mount] = [m["mountPath"] for m in engine["volumeMounts"] if m["name"] == "cache"]
    assert misplaced(env, cache_mount) == []
    # ...and not under a mount of another volume nested inside it.
    others = [m["mountPath"] for m in engine["volumeMounts"] if m["name"] != "cache"]
    assert not [k for k in RESTART_CACHES for o in others if under(env[k], o)]


def test_restart_caches_are_on_the_named_cache_volume_in_compose():
    compose = load(COMPOSE)
    for name in ("engine", "engine-cpu"):
        service = compose["services"][name]
        mounts = {target: source for target, source in volume_targets(service).items()}
        [cache_mount] = [target for target, source in mounts.items() if source == "cache"]
        assert "cache" in compose["volumes"]  # a named volume: it outlives a recreated container
        assert misplaced(env_of(service), cache_mount) == [], name


@pytest.mark.parametrize("target", ("engine-cpu", "engine-cuda"))
def test_restart_caches_are_on_the_cache_volume_in_the_images(target):
    env = parse_dockerfile((REPO / "Dockerfile").read_text()).stages[target].env()
    compose = load(COMPOSE)
    [cache_mount] = [t for t, s in volume_targets(compose["services"]["engine-cpu"]).items() if s == "cache"]
    assert misplaced(env, cache_mount) == []


def test_the_cache_check_can_fail():
    good = {k: f"/cache/{k.lower()}" for k in RESTART_CACHES}
    assert misplaced(good, "/cache") == []
    assert misplaced({**good, "TMPDIR": "/tmp"}, "/cache") == ["TMPDIR"]
    assert misplaced({**good, "TRITON_CACHE_DIR": "/cachex/triton"}, "/cache") == ["TRITON_CACHE_DIR"]
    assert misplaced({k: v for k, v in good.items() if k != "VLLM_CACHE_ROOT"}, "/cache") == ["VLLM_CACHE_ROOT"]


# --- sized by the measured time to ready --------------------------------------------------------


def test_committed_measurement_has_cold_and_warm_runs_of_both_stand_ins():
    data = measured()
    for size in ("tiny", "full"):
        runs = data["sizes"][size]["runs"]
        assert {r["mode"] for r in runs} == {"cold", "warm"}, size
        for r in runs:
            # a warm run found the cache a cold run left; a cold run found it empty
            assert (r["cache_bytes_before"] > 0) == (r["mode"] == "warm"), (size, r["label"])


def test_sizing_t_covers_the_measured_cold_start():
    assert sizing_t() >= cold_full_s()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_startup_probe_budget_covers_t_with_margin(overlay):
    probe = container(pod_spec(render(overlay)), "engine")["startupProbe"]
    budget = probe["failureThreshold"] * probe["periodSeconds"]
    assert budget >= PROBE_MARGIN * max(sizing_t(), cold_full_s()), budget


def test_autoscaler_windows_are_sized_by_t():
    t = sizing_t()
    keda = scaledobject()
    # A removed replica costs T to get back; 1 -> 0 (when someone enables it) likewise.
    assert keda["spec"]["cooldownPeriod"] >= 2 * t
    for behavior in (hpa()["spec"]["behavior"], keda["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]):
        # One step per T: the previous step's replicas are ready before the next is measured.
        assert all(p["periodSeconds"] >= t for p in behavior["scaleUp"]["policies"])
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 2 * t
        assert all(p["periodSeconds"] >= t for p in behavior["scaleDown"]["policies"])
        # A burst shorter than T is over before a replica started for it serves.
        assert behavior["scaleUp"]["stabilizationWindowSeconds"] < t
