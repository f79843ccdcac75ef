"""Rehearsal of the engine-ascend layer with podman, on a LOCAL STAND-IN for upstream's image.

No registry and no NPU here, so the real base (quay.io/ascend/vllm-ascend:v0.18.0) cannot be
pulled. scripts/podman/build-vllm-ascend-stand-in.sh builds a stand-in with the layout the
project's layer relies on (the three CANN set_env.sh at their real paths, each recording that it
was sourced; Python 3.11 at upstream's prefix holding the resolved versions of what the launcher
imports). The Dockerfile's engine-ascend target is then built on it, exactly as on the real base,
with non-default HwHiAiUser ids, and run the way an operator would: as that user, read-only root,
/cache and /models volumes (an empty /cache, as an emptyDir starts), tmpfs /tmp, and the node's
HwHiAiUser group added by number (`--group-add`, what Compose's group_add and the pod's
supplementalGroups do). What it proves: the build's own checks pass (base unmoved, pip check,
launcher import), the entrypoint sources all three scripts for the non-root user, the ids and
groups, every directory the image's and the deployments' (Compose's, the k8s overlay's)
environment names is writable under the read-only root, and the engine command the image prints
is the very line test_ascend_image.py generates on the host and puts through vLLM 0.18.0's parser.
What it cannot prove: anything of CANN, torch-npu or vLLM on an NPU.
Heavy: run under the machine-wide lock (flock /tmp/palmyra-engine.lock ...).
"""

from __future__ import annotations

import platform
from pathlib import Path

import pytest

from tests.helpers import ascend_command as cmd
from tests.helpers import ascend_host
from tests.helpers import ascend_upstream as up
from tests.helpers.podman import PODMAN_DIR, podman, run_logged

pytestmark = pytest.mark.container

STAND_IN = "localhost/palmyra-stand-in/vllm-ascend:v0.18.0"
IMAGE = "localhost/ascend-image-rehearsal/engine-ascend:stand-in"
UID, GID = 1234, 2345  # not the default 1000: the build arguments must take effect
# The node's HwHiAiUser group when it is not the image's: added by number, as group_add does.
NODE_GID = 3456
# What the launcher imports that upstream's image has, at the versions upstream's set resolves to.
FROM_UPSTREAM = (
    "pydantic",
    "pydantic-core",
    "typing-extensions",
    "typing-inspection",
    "annotated-types",
    "python-dotenv",
    "huggingface-hub",
    "modelscope",
)
# Every variable naming a directory the engine, CANN, vLLM or a library writes into.
DIR_VARS = (
    "PALMYRA_WORK_DIR",
    "HOME",
    "TMPDIR",
    "VLLM_CACHE_ROOT",
    "VLLM_CONFIG_ROOT",
    "HF_HOME",
    "MODELSCOPE_CACHE",
    "TORCHINDUCTOR_CACHE_DIR",
    "TRITON_CACHE_DIR",
    "NUMBA_CACHE_DIR",
    "ASCEND_CACHE_PATH",
    "ASCEND_WORK_PATH",
    "ASCEND_PROCESS_LOG_PATH",
)


@pytest.fixture(scope="module")
def rehearsal_image(podman_env: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    logs = tmp_path_factory.mktemp("ascend-rehearsal")
    run_logged([str(PODMAN_DIR / "build-local-bases.sh")], logs / "bases.log", timeout=900)
    versions = up.upstream_set("x86_64").versions
    packages = " ".join(f"{name}=={versions[name]}" for name in FROM_UPSTREAM)
    run_logged([str(PODMAN_DIR / "build-vllm-ascend-stand-in.sh"), packages], logs / "stand-in.log", timeout=1200)
    run_logged(
        [
            str(PODMAN_DIR / "build-image.sh"),
            "engine-ascend",
            IMAGE,
            "--build-arg",
            f"VLLM_ASCEND_BASE={STAND_IN}",
            "--build-arg",
            f"HWHIAIUSER_UID={UID}",
            "--build-arg",
            f"HWHIAIUSER_GID={GID}",
        ],
        logs / "engine-ascend.log",
        timeout=1800,
    )
    build = (logs / "engine-ascend.log").read_text()
    return IMAGE, build


PROBE = r"""
set -u
echo "id: $(id)"
echo "groups: $(id -G)"
echo "user: $(id -un) group: $(id -gn)"
echo "cwd: $(pwd)"
echo "sourced: ${STAND_IN_CANN_SOURCED:-none}"
echo "bishengir: $(command -v bishengir-compile || echo missing)"
echo "ld_preload: ${LD_PRELOAD:-}"
for var in DIR_VARS; do
  d=${!var:-}
  [ -n "$d" ] || continue
  # As the process that uses it would: create it when missing, then write into it.
  if mkdir -p "$d" 2>/dev/null && touch "$d/.probe" 2>/dev/null && rm "$d/.probe"; then
    echo "writable: $var=$d"
  else
    echo "NOT writable: $var=$d"
  fi
done
if touch /tmp/.probe 2>/dev/null && rm /tmp/.probe; then
  echo "writable: tmpfs=/tmp"
else
  echo "NOT writable: tmpfs=/tmp"
fi
echo "root: $(awk '$2 == "/" { split($4, o, ","); print o[1] }' /proc/mounts | tail -1)"
echo "command: $("$@")"
"""


def run_as_operator(
    image: str,
    cache: Path,
    models: Path,
    *command: str,
    env: dict[str, str] | None = None,
    groups: tuple[int, ...] = (),
    mounts: tuple[str, ...] = (),
):
    args = [
        "run",
        "--rm",
        "--network",
        "host",
        "--read-only",
        "--tmpfs",
        "/tmp:rw,mode=1777",
        "-v",
        f"{cache}:/cache",
        "-v",
        f"{models}:/models:ro",
    ]
    for mount in mounts:
        args += ["-v", mount]
    for gid in groups:
        args += ["--group-add", str(gid)]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return podman(*args, image, *command, check=False, timeout=300)


def probe(
    image: str, cache: Path, models: Path, env: dict[str, str], groups: tuple[int, ...]
) -> tuple[dict, dict, str]:
    """Runs PROBE through the image's entrypoint, then the image's CMD with --print-command."""
    script = PROBE.replace("DIR_VARS", " ".join(DIR_VARS))
    run = run_as_operator(
        image, cache, models, "bash", "-c", script, "probe", *cmd.print_argv(), env=env, groups=groups
    )
    print(run.stdout)
    print(run.stderr)
    assert run.returncode == 0, run.stderr
    out: dict[str, str] = {}
    dirs: dict[str, tuple[bool, str]] = {}
    for line in run.stdout.splitlines():
        key, sep, value = line.partition(": ")
        if key in ("writable", "NOT writable"):
            var, _, path = value.partition("=")
            dirs[var] = (key == "writable", path)
        elif sep:
            out.setdefault(key, value)
    return out, dirs, run.stderr


@pytest.fixture()
def volumes(tmp_path: Path) -> tuple[Path, Path]:
    # As a fresh emptyDir / host directory: empty, owned by the runtime ids (fsGroup / chown).
    import os

    cache, models = tmp_path / "cache", tmp_path / "models"
    for path in (cache, models):
        path.mkdir()
        os.chown(path, UID, GID)
    return cache, models


def test_build_proves_the_base_unmoved_and_imports_the_launcher(rehearsal_image: tuple[str, str]) -> None:
    # The report is read from the image, not from the build's output: a build whose layer comes
    # from the cache prints nothing of the step, yet the image holds what that step wrote.
    image, build = rehearsal_image
    report = podman("run", "--rm", "--entrypoint", "cat", image, "/opt/palmyra/base-unmoved.txt", timeout=120)
    added = [line for line in report.stdout.splitlines() if "check-base-unmoved: added" in line]
    print(report.stdout)
    assert added and added[-1].endswith("base unmoved, pip check clean: True"), (report.stdout, build[-3000:])
    assert "orjson==" in added[-1] and "pydantic-settings==" in added[-1] and "palmyra-serve==" in added[-1]
    # The launcher imports in the built image, under the image's own entrypoint (CANN sourced).
    imports = podman(
        "run",
        "--rm",
        image,
        "python3",
        "-c",
        "import palmyra_serve.engine.launcher; print('imported')",
        check=False,
        timeout=300,
    )
    assert imports.returncode == 0 and imports.stdout.strip().endswith("imported"), imports.stderr


def test_entrypoint_user_groups_writable_dirs_and_engine_command(rehearsal_image: tuple[str, str], volumes) -> None:
    image, _build = rehearsal_image
    cache, models = volumes
    out, dirs, stderr = probe(image, cache, models, env=cmd.DEPLOYED_ENV, groups=(NODE_GID,))
    assert out["user"] == "HwHiAiUser group: HwHiAiUser"
    assert f"uid={UID}(HwHiAiUser) gid={GID}(HwHiAiUser)" in out["id"]
    assert {str(GID), str(NODE_GID)} <= set(out["groups"].split()), "the node's group, added by number, is held"
    assert out["cwd"] == "/cache/work"
    assert out["sourced"].split(":") == up.FACTS["cann_entrypoint_scripts"]
    assert out["bishengir"].endswith("ascendnpu-ir/bin/bishengir-compile")
    assert out["root"] == "ro", "the root filesystem is mounted read-only"
    for script in up.FACTS["cann_entrypoint_scripts"]:
        assert f"engine-entrypoint: sourced {script}" in stderr
    # Every directory the image's environment names, at the image's value, is writable.
    image_env = cmd.image_env()
    on_cache = {k for k, v in image_env.items() if v.startswith("/cache")}
    assert on_cache <= set(DIR_VARS), (
        f"a path variable of the image the probe does not know: {on_cache - set(DIR_VARS)}"
    )
    assert dirs == {**{k: (True, image_env[k]) for k in on_cache}, "tmpfs": (True, "/tmp")}, dirs
    # The printed command is the host's line, which test_ascend_image.py parses with vLLM 0.18.0.
    image_assigned, image_words = cmd.split(out["command"])
    host_assigned, host_words = cmd.host_command("ascend")
    assert image_words[0].startswith(up.FACTS["python"]["prefix"] + "/bin/python"), "upstream's interpreter runs vLLM"
    assert (image_assigned, image_words[1:]) == (host_assigned, host_words[1:])
    assert image_words[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--trust-remote-code" not in image_words and "--api-key" not in image_words


def deployed(where: str) -> tuple[dict[str, str], tuple[int, ...]]:
    """The engine's environment and added groups as Compose and the k8s overlay deploy them."""
    if where == "compose":
        from tests.helpers.compose_files import ascend_compose_config

        engine = ascend_compose_config(HWHIAIUSER_GID=str(NODE_GID))["engine"]
        return {k: str(v) for k, v in engine["environment"].items()}, tuple(int(g) for g in engine["group_add"])
    from tests.helpers.k8s_manifests import config_data, container, pod_spec, render

    objects = render("ascend-hami")
    spec = pod_spec(objects)
    env = {
        **config_data(objects),
        **{e["name"]: e["value"] for e in container(spec, "engine").get("env", []) if "value" in e},
    }
    return env, tuple(spec["securityContext"].get("supplementalGroups", []))


@pytest.mark.parametrize("where", ["compose", "k8s"])
def test_deployed_environment_is_writable_under_the_read_only_root(
    rehearsal_image: tuple[str, str], volumes, where: str
) -> None:
    image, _build = rehearsal_image
    cache, models = volumes
    env, groups = deployed(where)
    assert groups, f"{where} adds HwHiAiUser's group"
    out, dirs, _stderr = probe(image, cache, models, env=env, groups=groups)
    assert {str(g) for g in groups} <= set(out["groups"].split()), out["groups"]
    assert out["root"] == "ro"
    assert {"HOME", "ASCEND_PROCESS_LOG_PATH", "TMPDIR", "PALMYRA_WORK_DIR"} <= set(dirs), dirs
    not_writable = {var: path for var, (ok, path) in dirs.items() if not ok}
    assert not not_writable, f"{where}: not writable under the read-only root: {not_writable}"
    for var, (_ok, path) in dirs.items():
        assert path == env.get(var, cmd.image_env().get(var, path)), f"{where}: {var} is {path}"


def test_default_command_refuses_the_stand_in_and_says_how_to_give_weights(
    rehearsal_image: tuple[str, str], volumes
) -> None:
    image, _build = rehearsal_image
    cache, models = volumes
    # No weights on /models, the hub unreachable: an accelerator image must not serve random weights.
    run = run_as_operator(image, cache, models, env={"HF_ENDPOINT": "http://127.0.0.1:9"})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "random stand-in is refused" in run.stderr and "HF_ENDPOINT=<mirror URL>" in run.stderr
    assert "serving a RANDOM-WEIGHT" not in run.stderr


def test_missing_cann_script_stops_the_start(rehearsal_image: tuple[str, str], volumes) -> None:
    image, _build = rehearsal_image
    cache, models = volumes
    # A base without the ascendnpu-ir script (the old entrypoint's omission), injected by pointing
    # the script list at a path that does not exist in the image.
    scripts = "ascend-toolkit/set_env.sh cann-8.5.1/share/info/ascendnpu-ir/bin/set_env.sh.gone nnal/atb/set_env.sh"
    run = run_as_operator(image, cache, models, "true", env={"PALMYRA_CANN_ENV_SCRIPTS": scripts})
    assert run.returncode == 1 and "CANN environment incomplete" in run.stderr, run.stderr


def test_doctor_in_the_image_judges_a_mounted_host_and_names_the_group_to_add(
    rehearsal_image: tuple[str, str], volumes, tmp_path: Path
) -> None:
    """`palmyra-serve doctor --root /host` through the image's entrypoint, as the operator's first
    check runs it: a stand-in 910B host (driver 25.5, the NPU and control devices of a HwHiAiUser
    whose ids differ from the image's, npu-smi in /usr/local/sbin printing MindCluster's table)."""
    image, _build = rehearsal_image
    cache, models = volumes
    host = ascend_host.build(
        tmp_path / "host",
        ascend_host.Layout(
            npu_smi_at="usr/local/sbin/npu-smi",
            # A 910B3 (an Atlas A2 chip, the image's family; the docs print its name as xxx).
            npu_smi_output=ascend_host.npu_smi_named(ascend_host.npu_smi_healthy(), "910B3"),
            user=(1000, NODE_GID),
            node_owner=(1000, NODE_GID),
        ),
    )
    doctor = ("palmyra-serve", "doctor", "--root", "/host")
    with_group = run_as_operator(image, cache, models, *doctor, groups=(NODE_GID,), mounts=(f"{host}:/host:ro",))
    print(with_group.stdout, with_group.stderr)
    assert with_group.returncode == 0, with_group.stdout + with_group.stderr
    lines = with_group.stdout.splitlines()
    assert "[ok  ] devices: /dev/davinci0 and the three control devices, all open to uid 1234" in lines
    assert any(
        line.startswith(f"[WARN] HwHiAiUser: HwHiAiUser here is 1000:{NODE_GID}, the image's is {UID}:{GID}")
        for line in lines
    )
    assert "[ok  ] npu-smi: /usr/local/sbin/npu-smi answers" in lines
    # The warnings: the ids differ, and what this machine adds (x86: vllm-ascend v0.18.0's known issue).
    expected = {"HwHiAiUser"}
    if platform.machine() == "x86_64":
        expected.add("CANN on x86")
    warned = {line.split("]", 1)[1].split(":", 1)[0].strip() for line in lines if line.startswith("[WARN]")}
    assert warned == expected, with_group.stdout
    assert lines[-1] == f"verdict: the engine can start; {len(expected)} warning(s) above may still stop it"
    # Without the node's group the image's user cannot open the devices: a certain failure.
    without = run_as_operator(image, cache, models, *doctor, mounts=(f"{host}:/host:ro",))
    assert without.returncode == 1, without.stdout + without.stderr
    assert f"HWHIAIUSER_GID={NODE_GID}" in without.stdout and "[STOP] devices:" in without.stdout
