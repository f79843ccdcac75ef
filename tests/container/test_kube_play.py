"""The rendered CPU overlay (`kubectl kustomize k8s/overlays/cpu`), run for real with `podman kube play`.

What runs is the Deployment exactly as rendered (init container `fetch-model`, `engine`, `sidecar`,
their args, env from the ConfigMap and the Secret, security contexts, resource limits, volumes),
with only these changes for this machine, each printed by the test:

- Kinds podman cannot play (Service, NetworkPolicy, PodDisruptionBudget, HorizontalPodAutoscaler,
  ...) are filtered out and listed. The Secret `palmyra-serve-secrets` the README asks operators to
  create is created with `podman secret create` instead of played: podman 4.3 stores a played Secret
  as YAML but reads secretKeyRef values back as a JSON map ("secret ... is not valid JSON").
- hostNetwork: true (no bridge networks on these machines; everything stays on 127.0.0.1, so the
  fixed ports 8000, 8080 and 8081 must be free). The pod's loopback is then the machine's, so "outside
  the pod" is this machine's non-loopback address: there the engine's port must be closed while
  the sidecar's answers (and /invocations, off the sidecar's allow-list, is a 404 that never
  reaches the engine).
- The `model` volume becomes a hostPath holding a copy of the tiny stand-in at
  <dir>/palmyra-mini, so `fetch-model` finds the weights and exits 0 (its skip path); the
  ConfigMap gains HF_ENDPOINT=http://127.0.0.1:9 and HF_HUB_OFFLINE=1 so nothing could leave the
  machine if it did not.
- httpGet probes become the equivalent exec probes `python3 /opt/palmyra/healthchecks/http_probe.py
  http://127.0.0.1:<port><path> --timeout <timeoutSeconds>` (same port, path and timeout): podman
  turns an httpGet probe into a `curl` run inside the container and our images ship no curl, so
  every httpGet probe would report unhealthy.
- The containers' `ports` lists go (only the sidecar has one; the engine declares none): under
  hostNetwork podman 4.3 turns them into port mappings and refuses them ("PortMappings can only be
  used with Bridge or slirp4netns networking"); the processes listen on the host anyway.
- imagePullPolicy: Never, so podman uses the locally built images and never asks a registry.
- Volumes get a `palmyra-kp-` prefix: podman 4.3 makes each emptyDir a *named* volume called after
  the pod's volume name ("cache", "shm", ...), which could collide with unrelated volumes. The
  memory-backed /dev/shm emptyDir is pre-created as a 1 GiB tmpfs volume owned by the pod's
  runAsUser: podman's plain volume would be a root-owned disk directory uid 1000 cannot write.
- podman < 4.6 applies the pod's restartPolicy to init containers (podman issues #15631/#16343,
  fixed by PR #18481): under `Always` it reruns `fetch-model` in a loop and `kube play` then fails
  to remove it. On such a podman the run uses restartPolicy OnFailure, which restarts a SIGKILLed
  container (exit 137) just as Always does.
- Resource limits stay: podman/runc applies them here (the test checks the engine's memory limit).

Podman without systemd never schedules probes, so the test runs them by hand: `podman
healthcheck run` (the liveness probe podman installed from the manifest) and every probe command
of the patched manifest through `podman exec`. The healthcheck podman installs is the liveness
probe (checked); readiness and startup probes, preStop and the grace period are not exercised by
podman here, so the shutdown ordering stays covered by tests/static only.

Run (heavy: starts vLLM):
    flock /tmp/palmyra-engine.lock .venv/bin/python -m pytest tests/container/test_kube_play.py -v -s
"""

from __future__ import annotations

import base64
import copy
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import psutil
import pytest
import yaml

from tests.helpers.podman import PROBE, REPO, BuiltImages, completion, http, listening_addresses, podman, wait_ready

OVERLAY = REPO / "k8s" / "overlays" / "cpu"
DEPLOYMENT = "palmyra-serve"
SECRET = "palmyra-serve-secrets"
# podman 4.3.1's kube play panics on a secret volume (nil pointer in kube.VolumeFromSecret, seen
# here): the client-key volume is played as a host directory holding the same file, written by the
# fixture. The Secret volume itself is checked by the static tier only.
SECRET_FILES_DIR = "secret-files"
ENGINE_KEY = "kube-play-test-engine-key"
VOLUME_PREFIX = "palmyra-kp-"
PORTS = (8000, 8080, 8081)  # fixed by the manifest; host networking puts them on this machine
ENGINE_PORT, SIDECAR_PORT, PROBE_PORT = PORTS
PLAYABLE = {"Deployment", "ConfigMap"}
# What podman cannot play (or this run must not): anything new in the overlay fails the test until
# someone decides whether podman can run it.
KNOWN_UNPLAYABLE = {"Service", "NetworkPolicy", "PodDisruptionBudget", "HorizontalPodAutoscaler", "Secret"}
READY_TIMEOUT_S = 360
INIT_FIX_VERSION = (4, 6)


# --- the manifest, rendered and patched ----------------------------------------------------


def render_overlay() -> list[dict]:
    out = subprocess.run(
        ["kubectl", "kustomize", str(OVERLAY)], capture_output=True, text=True, timeout=120, check=True
    )
    return [doc for doc in yaml.safe_load_all(out.stdout) if doc]


def split_playable(objects: list[dict]) -> tuple[list[dict], list[str]]:
    kept = [o for o in objects if o["kind"] in PLAYABLE]
    dropped = sorted(f"{o['kind']}/{o['metadata']['name']}" for o in objects if o["kind"] not in PLAYABLE)
    # ConfigMaps first: the Deployment's envFrom refers to them.
    kept.sort(key=lambda o: o["kind"] != "ConfigMap")
    return kept, dropped


def exec_probe(probe: dict, named_ports: dict[str, int]) -> dict:
    """An httpGet probe turned into the same check through the images' stdlib probe script."""
    get = probe.pop("httpGet")
    port = named_ports[get["port"]] if isinstance(get["port"], str) else int(get["port"])
    timeout = probe.get("timeoutSeconds", 1)  # Kubernetes' default
    probe["exec"] = {
        "command": ["python3", PROBE, f"http://127.0.0.1:{port}{get.get('path', '/')}", "--timeout", str(timeout)]
    }
    return probe


def port_listened(port: int) -> bool:
    """A listener on the port (SO_REUSEADDR: connections lingering in TIME_WAIT from earlier tests
    do not count; uvicorn and vLLM bind with it too)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("0.0.0.0", port))
        except OSError:
            return True
        return False


def podman_version() -> tuple[int, ...]:
    text = podman("version", "--format", "{{.Client.Version}}").stdout.strip()
    return tuple(int(part) for part in text.split("-")[0].split(".")[:2])


def patch_for_podman(kept: list[dict], model_root: Path, version: tuple[int, ...]) -> tuple[list[dict], list[str]]:
    """Return the objects to play and a list of what was changed, in words."""
    objs = copy.deepcopy(kept)
    notes: list[str] = []
    for cm in (o for o in objs if o["kind"] == "ConfigMap"):
        cm.setdefault("data", {}).update({"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": "1"})
        notes.append(f"ConfigMap/{cm['metadata']['name']}: + HF_ENDPOINT=http://127.0.0.1:9, HF_HUB_OFFLINE=1")
    (dep,) = (o for o in objs if o["kind"] == "Deployment")
    pod = dep["spec"]["template"]["spec"]
    pod["hostNetwork"] = True
    notes.append("hostNetwork: true")
    if version < INIT_FIX_VERSION:
        pod["restartPolicy"] = "OnFailure"
        notes.append(
            f"restartPolicy: OnFailure (podman {'.'.join(map(str, version))} restarts init containers under Always)"
        )
    for volume in pod["volumes"]:
        if volume["name"] == "model":
            volume.pop("emptyDir", None)
            volume["hostPath"] = {"path": str(model_root), "type": "Directory"}
            notes.append(f"volume model: emptyDir -> hostPath {model_root} (tiny stand-in in palmyra-mini/)")
        if volume.get("secret", {}).get("secretName") == SECRET:
            files = model_root.parent / SECRET_FILES_DIR
            volume.pop("secret")
            volume["hostPath"] = {"path": str(files), "type": "Directory"}
            notes.append(
                f"volume {volume['name']}: secret {SECRET} -> hostPath {files} (podman 4.3 panics on secret volumes)"
            )
        volume["name"] = VOLUME_PREFIX + volume["name"]
    named_ports = {p["name"]: p["containerPort"] for c in pod["containers"] for p in c.get("ports", []) if "name" in p}
    for ctr in pod.get("initContainers", []) + pod["containers"]:
        ctr["imagePullPolicy"] = "Never"
        if ctr.pop("ports", None):
            notes.append(
                f"{ctr['name']}: ports list dropped "
                "(podman 4.3 turns it into port mappings, refused with host networking)"
            )
        for mount in ctr.get("volumeMounts", []):
            mount["name"] = VOLUME_PREFIX + mount["name"]
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if "httpGet" in ctr.get(kind, {}):
                exec_probe(ctr[kind], named_ports)
                notes.append(f"{ctr['name']} {kind}: httpGet -> exec {' '.join(ctr[kind]['exec']['command'][2:])}")
    notes.append(f"imagePullPolicy: Never; volumes renamed {VOLUME_PREFIX}<name>")
    return objs, notes


def deployment(objs: list[dict]) -> dict:
    return next(o for o in objs if o["kind"] == "Deployment")


def container_spec(objs: list[dict], name: str) -> dict:
    return next(c for c in deployment(objs)["spec"]["template"]["spec"]["containers"] if c["name"] == name)


# --- the running pod -----------------------------------------------------------------------


@dataclass
class KubePod:
    workdir: Path
    manifest: Path
    objs: list[dict]
    dropped: list[str]
    notes: list[str]
    model_dir: Path
    model_mtimes: dict[str, float]
    played_at: float  # unix time just before `kube play`
    pod: str = ""
    engine: str = ""
    sidecar: str = ""
    timings: dict[str, float] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return "http://127.0.0.1:8080"


def inspect(name: str) -> dict:
    return json.loads(podman("inspect", name).stdout)[0]


def our_volumes() -> list[str]:
    names = podman("volume", "ls", "--format", "{{.Name}}").stdout.split()
    return [n for n in names if n.startswith(VOLUME_PREFIX)]


def pod_containers(pod: str) -> list[str]:
    return podman("ps", "-a", "--filter", f"pod={pod}", "--format", "{{.Names}}").stdout.split()


def pods_of_deployment() -> list[str]:
    return podman("pod", "ps", "--filter", f"name={DEPLOYMENT}-pod", "--format", "{{.Name}}").stdout.split()


def teardown(kp: KubePod) -> None:
    podman("kube", "down", str(kp.manifest), check=False, timeout=180)
    for pod in pods_of_deployment():
        podman("pod", "rm", "-f", "-t", "10", pod, check=False, timeout=180)
    for volume in our_volumes():
        podman("volume", "rm", "-f", volume, check=False)
    podman("secret", "rm", SECRET, check=False)


def make_shm_volume(objs: list[dict]) -> None:
    """The memory-backed /dev/shm emptyDir as podman can give it: a tmpfs volume the pod's user owns."""
    pod = deployment(objs)["spec"]["template"]["spec"]
    (shm,) = (v for v in pod["volumes"] if v.get("emptyDir", {}).get("medium") == "Memory")
    size = shm["emptyDir"].get("sizeLimit", "1Gi")
    assert size.endswith("Gi"), size
    blocks = int(size[:-2]) * 262144  # 4 KiB pages; podman's `size=` option means quota, not tmpfs size
    uid, gid = pod["securityContext"]["runAsUser"], pod["securityContext"]["runAsGroup"]
    podman(
        "volume",
        "create",
        "--opt",
        "type=tmpfs",
        "--opt",
        "device=tmpfs",
        "--opt",
        f"o=nr_blocks={blocks},uid={uid},gid={gid}",
        shm["name"],
    )


CLIENT_KEY = "kube-play-client-key"  # the Secret's api-keys entry: the sidecar requires one


def create_secret(workdir: Path) -> None:
    # podman 4.3 reads a secretKeyRef's secret as a JSON map of base64 values.
    path = workdir / "secret.json"
    # api-keys is required: the sidecar fails closed without a client key (it reads it from the
    # mounted volume's file; the engine key comes by secretKeyRef).
    data = {
        "engine-api-key": base64.b64encode(ENGINE_KEY.encode()).decode(),
        "api-keys": base64.b64encode(CLIENT_KEY.encode()).decode(),
    }
    path.write_text(json.dumps(data))
    path.chmod(0o600)
    podman("secret", "create", SECRET, str(path))
    path.unlink()
    # The Secret volume's one item, as the kubelet would project it (see SECRET_FILES_DIR).
    files = workdir / SECRET_FILES_DIR
    files.mkdir(mode=0o755)
    (files / "api-keys").write_text(CLIENT_KEY)
    (files / "api-keys").chmod(0o644)


@pytest.fixture(scope="module")
def kube_pod(built_images: BuiltImages, tiny_model_dir: Path) -> Iterator[KubePod]:
    assert shutil.which("kubectl"), "kubectl missing: needed to render the overlay"
    assert shutil.which("catatonit"), (
        "catatonit missing: podman kube play builds its pause image from it (apt-get install catatonit)"
    )
    for port in PORTS:
        assert not port_listened(port), (
            f"127.0.0.1:{port} is taken: the CPU overlay's pod uses fixed ports {PORTS} with host networking"
        )
    # Not under pytest's tmp dirs: those are 0700 under root, and the pod runs as uid 1000.
    workdir = Path(tempfile.mkdtemp(prefix="palmyra-kube-play-"))
    workdir.chmod(0o755)
    model_dir = workdir / "models" / "palmyra-mini"
    shutil.copytree(tiny_model_dir, model_dir)
    for path in [workdir / "models", *model_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)
    model_dir.chmod(0o755)
    mtimes = {p.name: p.stat().st_mtime for p in model_dir.iterdir()}

    kept, dropped = split_playable(render_overlay())
    objs, notes = patch_for_podman(kept, workdir / "models", podman_version())
    manifest = workdir / "palmyra-serve.kube.yaml"
    manifest.write_text(yaml.safe_dump_all(objs, sort_keys=False))
    kp = KubePod(workdir, manifest, objs, dropped, notes, model_dir, mtimes, played_at=0.0)
    print(f"\nkube play: dropped kinds podman cannot play: {', '.join(dropped)}")
    print(f"kube play: Secret/{SECRET} created with `podman secret create` (podman 4.3 cannot read a played Secret)")
    for note in notes:
        print(f"kube play: patched {note}")

    teardown(kp)  # leftovers of an interrupted run
    try:
        create_secret(workdir)
        make_shm_volume(objs)
        kp.played_at = time.time()
        started = time.monotonic()
        play = podman("kube", "play", str(manifest), check=False, timeout=600)
        assert play.returncode == 0, f"podman kube play failed:\n{play.stdout[-3000:]}\n{play.stderr[-3000:]}"
        (kp.pod,) = pods_of_deployment()
        names = pod_containers(kp.pod)
        kp.engine = next(n for n in names if n.endswith("-engine"))
        kp.sidecar = next(n for n in names if n.endswith("-sidecar"))
        print(f"kube play: pod {kp.pod}, containers {names}")
        wait_ready(kp.url, [kp.engine, kp.sidecar], READY_TIMEOUT_S)
        kp.timings["play_to_ready_s"] = time.monotonic() - started
        print(f"kube play: play -> ready in {kp.timings['play_to_ready_s']:.0f} s")
        yield kp
    finally:
        teardown(kp)
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"kube play: timings {json.dumps({k: round(v, 1) for k, v in kp.timings.items()})}")


# --- probes, by hand -------------------------------------------------------------------------


def run_probe(kp: KubePod, container: str, which: str, kind: str) -> subprocess.CompletedProcess[str]:
    command = container_spec(kp.objs, which)[kind]["exec"]["command"]
    return podman("exec", container, *command, check=False, timeout=60)


def healthcheck(container: str) -> subprocess.CompletedProcess[str]:
    return podman("healthcheck", "run", container, check=False, timeout=60)


def _health(container: str) -> dict:
    state = inspect(container)["State"]
    return state.get("Health") or state.get("Healthcheck") or {}


def health_status(container: str) -> str:
    return _health(container).get("Status", "")


def last_health_output(container: str) -> str:
    log = _health(container).get("Log") or []
    return log[-1]["Output"].strip() if log else ""


# --- the tests --------------------------------------------------------------------------------


def test_unplayable_kinds_filtered_out_and_listed() -> None:
    kept, dropped = split_playable(render_overlay())
    assert sorted(o["kind"] for o in kept) == ["ConfigMap", "Deployment"]
    kinds = {d.split("/")[0] for d in dropped}
    assert kinds <= KNOWN_UNPLAYABLE, f"the overlay has kinds this test has not judged: {kinds - KNOWN_UNPLAYABLE}"
    assert {"Service", "NetworkPolicy"} <= kinds
    print(f"\nnot played by podman: {dropped}")


def test_patches_keep_probe_routes_and_ports() -> None:
    kept, _ = split_playable(render_overlay())
    objs, _ = patch_for_podman(kept, Path("/nonexistent"), (4, 3))
    for original, patched in zip(
        deployment(kept)["spec"]["template"]["spec"]["containers"],
        deployment(objs)["spec"]["template"]["spec"]["containers"],
        strict=True,
    ):
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if kind not in original:
                continue
            get = original[kind]["httpGet"]
            assert patched[kind]["exec"]["command"] == [
                "python3",
                PROBE,
                f"http://127.0.0.1:{get['port']}{get['path']}",
                "--timeout",
                str(original[kind]["timeoutSeconds"]),
            ]
            assert patched[kind]["failureThreshold"] == original[kind]["failureThreshold"]
        assert patched["args" if "args" in original else "command"] == original.get("args", original.get("command"))


def test_pod_starts_with_fetch_model_skipping(kube_pod: KubePod) -> None:
    kp = kube_pod
    assert inspect(kp.engine)["State"]["Running"] and inspect(kp.sidecar)["State"]["Running"]
    # podman removes a finished init container ("once"); its exits stay in the event log.
    died = podman(
        "events",
        "--stream=false",
        "--since",
        str(int(kp.played_at) - 1),
        "--filter",
        f"container={kp.pod}-fetch-model",
        "--filter",
        "event=died",
        "--format",
        "{{.ContainerExitCode}}",
    ).stdout.split()
    assert died and set(died) == {"0"}, f"fetch-model exits: {died}"
    print(f"\nfetch-model ran {len(died)}x, exit codes {died}")
    # The skip path: the weights were found, not rewritten.
    assert {p.name: p.stat().st_mtime for p in kp.model_dir.iterdir()} == kp.model_mtimes
    for name in (kp.engine, kp.sidecar):
        assert podman("exec", name, "id", "-u").stdout.strip() == "1000"
        assert inspect(name)["HostConfig"]["ReadonlyRootfs"] is True
    # Limits from the manifest are really applied (engine: 12Gi).
    assert inspect(kp.engine)["HostConfig"]["Memory"] == 12 * 2**30
    assert (
        podman(
            "exec", kp.engine, "sh", "-c", "touch /dev/shm/w && rm /dev/shm/w && df -k /dev/shm | tail -1"
        ).returncode
        == 0
    )


def test_ready_and_completion_through_the_pod(kube_pod: KubePod) -> None:
    status, ready = http("GET", f"{kube_pod.url}/ready")
    assert status == 200 and ready["ready"] is True and ready["phase"] == "ready"
    assert ready["weights"] == "random-stand-in"
    status, body = completion(kube_pod.url, max_tokens=8, api_key=CLIENT_KEY)
    assert status == 200, body
    assert body["usage"]["completion_tokens"] == 8 and body["choices"][0]["text"]
    # The Secret reached the engine (as VLLM_API_KEY): its /v1 wants the key the sidecar holds.
    assert http("GET", f"http://127.0.0.1:{ENGINE_PORT}/v1/models")[0] == 401


def _outside_address() -> str | None:
    """An IPv4 address of this machine other than loopback: "outside the pod" under hostNetwork."""
    for addresses in psutil.net_if_addrs().values():
        for addr in addresses:
            if addr.family == socket.AF_INET and not ipaddress.ip_address(addr.address).is_loopback:
                return addr.address
    return None


def _connects(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=3):
            return True
    except OSError:
        return False


def test_engine_is_reachable_only_inside_the_pod(kube_pod: KubePod) -> None:
    kp = kube_pod
    # The engine's listener is on the loopback only; the sidecar's on every address.
    engine = listening_addresses(kp.engine, ENGINE_PORT)
    assert engine and all(ipaddress.ip_address(a).is_loopback for a in engine), engine
    assert listening_addresses(kp.sidecar, SIDECAR_PORT) & {"0.0.0.0", "::"}
    # The engine key is not on any command line in the pod (vLLM reads VLLM_API_KEY).
    ps = podman("exec", kp.engine, "sh", "-c", "cat /proc/[0-9]*/cmdline | tr '\\0' ' '").stdout
    assert ENGINE_KEY not in ps and "--api-key" not in ps
    # The engine's metrics are served by the sidecar's port, unchanged.
    status, _ = http("GET", f"{kp.url}/engine/metrics")
    assert status == 200
    outside = _outside_address()
    print(f"\nengine listens on {sorted(engine)}; outside address: {outside}")
    if outside is None:
        return  # no second address on this machine: the listener check above is the proof
    assert not _connects(outside, ENGINE_PORT), f"{outside}:{ENGINE_PORT} answers: the engine is reachable"
    assert http("GET", f"http://{outside}:{SIDECAR_PORT}/health/sidecar")[0] == 200
    # /invocations generates text on vLLM without a key; through the sidecar it is a 401 without a
    # key (checked before any route is revealed) and a 404 with one.
    assert http("POST", f"http://{outside}:{SIDECAR_PORT}/invocations", {"prompt": "hi"})[0] == 401
    assert http("POST", f"http://{outside}:{SIDECAR_PORT}/invocations", {"prompt": "hi"}, api_key=CLIENT_KEY)[0] == 404


def test_probes_by_hand_report_healthy(kube_pod: KubePod) -> None:
    kp = kube_pod
    for container, which in ((kp.engine, "engine"), (kp.sidecar, "sidecar")):
        # What podman installed as the container's healthcheck is the manifest's liveness command.
        test = inspect(container)["Config"]["Healthcheck"]["Test"]
        url = container_spec(kp.objs, which)["livenessProbe"]["exec"]["command"][2]
        assert url in test, test
        # podman 4.3 prints nothing for a passing check: read the verdict and the probe's line back.
        result = healthcheck(container)
        assert result.returncode == 0 and "unhealthy" not in result.stdout, result.stdout + result.stderr
        assert health_status(container) == "healthy"
        assert last_health_output(container).startswith("healthy: HTTP 200"), last_health_output(container)
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            if kind in container_spec(kp.objs, which):
                probe = run_probe(kp, container, which, kind)
                assert probe.returncode == 0 and probe.stdout.startswith("healthy"), (
                    f"{which} {kind}: {probe.stdout}{probe.stderr}"
                )


def test_killed_engine_is_restarted_sidecar_untouched(kube_pod: KubePod) -> None:
    kp = kube_pod
    engine_before, sidecar_before = inspect(kp.engine), inspect(kp.sidecar)
    killed_at = time.monotonic()
    os.kill(engine_before["State"]["Pid"], signal.SIGKILL)

    # Until the new engine answers, its liveness probe (the sidecar's /health) must fail, while the
    # sidecar's own liveness keeps passing and its readiness fails.
    engine_failures: list[str] = []
    healthcheck_failures: list[str] = []  # what `podman healthcheck run` recorded
    sidecar_live: list[int] = []
    sidecar_ready_failed = False
    restarted = False
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        state = inspect(kp.engine)
        restarted = restarted or (
            state["RestartCount"] > engine_before["RestartCount"]
            and state["State"]["StartedAt"] != engine_before["State"]["StartedAt"]
        )
        if state["State"]["Running"]:
            probe = run_probe(kp, kp.engine, "engine", "livenessProbe")
            if probe.returncode == 1:
                engine_failures.append(probe.stdout.strip())
                if healthcheck(kp.engine).returncode == 1:
                    healthcheck_failures.append(last_health_output(kp.engine))
            elif probe.returncode == 0 and engine_failures:
                break  # the new engine answers; a pass before any failure: the sidecar's poll was not due yet
        sidecar_live.append(healthcheck(kp.sidecar).returncode)
        sidecar_ready_failed |= run_probe(kp, kp.sidecar, "sidecar", "readinessProbe").returncode == 1
        time.sleep(1)
    kp.timings["kill_to_engine_live_s"] = time.monotonic() - killed_at
    print(f"\nengine probe while down: {len(engine_failures)} failures, e.g. {engine_failures[:1]}")
    assert restarted, f"engine container not restarted: {inspect(kp.engine)['State']}"
    assert engine_failures and all("HTTP 503" in line for line in engine_failures), engine_failures
    assert any("HTTP 503" in line for line in healthcheck_failures), healthcheck_failures
    assert sidecar_live and set(sidecar_live) == {0}, sidecar_live
    assert sidecar_ready_failed

    wait_ready(kp.url, [kp.engine, kp.sidecar], READY_TIMEOUT_S)
    kp.timings["kill_to_ready_again_s"] = time.monotonic() - killed_at
    print(f"engine SIGKILL -> ready again in {kp.timings['kill_to_ready_again_s']:.0f} s")
    sidecar_after = inspect(kp.sidecar)
    assert sidecar_after["State"]["StartedAt"] == sidecar_before["State"]["StartedAt"]
    assert sidecar_after["State"]["Pid"] == sidecar_before["State"]["Pid"]
    assert sidecar_after["RestartCount"] == sidecar_before["RestartCount"]
    engine_after = inspect(kp.engine)
    assert engine_after["State"]["Running"] and engine_after["State"]["Pid"] != engine_before["State"]["Pid"]
    status, body = completion(kp.url, max_tokens=8, api_key=CLIENT_KEY)
    assert status == 200 and body["usage"]["completion_tokens"] == 8, body
    for container in (kp.engine, kp.sidecar):
        result = healthcheck(container)
        assert result.returncode == 0, f"{container}: {result.stdout}{result.stderr}"
        assert health_status(container) == "healthy", last_health_output(container)


def test_kube_down_leaves_nothing(kube_pod: KubePod) -> None:
    teardown(kube_pod)
    assert pods_of_deployment() == []
    assert podman("ps", "-a", "--filter", f"name={DEPLOYMENT}-pod", "--format", "{{.Names}}").stdout.split() == []
    assert our_volumes() == []
    left = podman("secret", "ls", "--format", "{{.Name}}").stdout.split()
    assert SECRET not in left
