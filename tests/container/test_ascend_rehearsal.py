"""Rehearsal of the engine-ascend layer with podman, on a LOCAL STAND-IN for upstream's image.

No registry and no NPU here, so the real base (quay.io/ascend/vllm-ascend:v0.18.0) cannot be
pulled. scripts/podman/build-vllm-ascend-stand-in.sh builds a stand-in with the layout the
project's layer relies on (the three CANN set_env.sh at their real paths, each recording that it
was sourced; Python 3.11 at upstream's prefix holding the resolved versions of what the launcher
imports). The Dockerfile's engine-ascend target is then built on it, exactly as on the real base,
with non-default HwHiAiUser ids, and run the way an operator would: as that user, read-only root,
/cache and /models volumes (an empty /cache, as an emptyDir starts), tmpfs /tmp. What it proves:
the build's own checks pass (base unmoved, pip check, launcher import), the entrypoint sources all
three scripts for the non-root user, the ids and groups, every writable directory, and the exact
engine command. What it cannot prove: anything of CANN, torch-npu or vLLM on an NPU.
Heavy: run under the machine-wide lock (flock /tmp/palmyra-heavy.lock ...).
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest
from podman_helpers import PODMAN_DIR, REPO, podman, run_logged

pytestmark = pytest.mark.container

sys.path.insert(0, str(REPO / "tests" / "static"))
import ascend_upstream as up

STAND_IN = "localhost/palmyra-stand-in/vllm-ascend:v0.18.0"
IMAGE = "localhost/ascend-image-rehearsal/engine-ascend:stand-in"
UID, GID = 1234, 2345  # not the default 1000: the build arguments must take effect
# What the launcher imports that upstream's image has, at the versions upstream's set resolves to.
FROM_UPSTREAM = ("pydantic", "pydantic-core", "typing-extensions", "typing-inspection", "annotated-types",
                 "python-dotenv", "huggingface-hub", "modelscope")
WRITABLE = ("/cache/work", "/cache/home", "/cache/vllm", "/cache/huggingface", "/cache/modelscope",
            "/cache/torchinductor", "/cache/triton", "/cache/numba", "/cache/ascend/cache", "/cache/ascend/work",
            "/cache/ascend/log", "/tmp")


@pytest.fixture(scope="module")
def rehearsal_image(podman_env: None, tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    logs = tmp_path_factory.mktemp("ascend-rehearsal")
    run_logged([str(PODMAN_DIR / "build-local-bases.sh")], logs / "bases.log", timeout=900)
    versions = up.upstream_set("x86_64").versions
    packages = " ".join(f"{name}=={versions[name]}" for name in FROM_UPSTREAM)
    run_logged([str(PODMAN_DIR / "build-vllm-ascend-stand-in.sh"), packages], logs / "stand-in.log", timeout=1200)
    run_logged(
        [str(PODMAN_DIR / "build-image.sh"), "engine-ascend", IMAGE, "--build-arg", f"VLLM_ASCEND_BASE={STAND_IN}",
         "--build-arg", f"HWHIAIUSER_UID={UID}", "--build-arg", f"HWHIAIUSER_GID={GID}"],
        logs / "engine-ascend.log", timeout=1800,
    )
    build = (logs / "engine-ascend.log").read_text()
    return IMAGE, build


PROBE = r"""
set -u
echo "id: $(id)"
echo "user: $(id -un) group: $(id -gn)"
echo "cwd: $(pwd)"
echo "sourced: ${STAND_IN_CANN_SOURCED:-none}"
echo "bishengir: $(command -v bishengir-compile || echo missing)"
echo "ld_preload: ${LD_PRELOAD:-}"
for d in WRITABLE; do
  if touch "$d/.probe" 2>/dev/null && rm "$d/.probe"; then echo "writable: $d"; else echo "NOT writable: $d"; fi
done
echo "root: $(awk '$2 == "/" { split($4, o, ","); print o[1] }' /proc/mounts | tail -1)"
echo "command: $(PALMYRA_ENGINE_API_KEY=k palmyra-serve engine --no-fetch --print-command)"
"""


def run_as_operator(image: str, cache: Path, models: Path, *command: str, env: dict[str, str] | None = None):
    args = ["run", "--rm", "--network", "host", "--read-only", "--tmpfs", "/tmp:rw,mode=1777",
            "-v", f"{cache}:/cache", "-v", f"{models}:/models:ro"]
    for key, value in (env or {}).items():
        args += ["-e", f"{key}={value}"]
    return podman(*args, image, *command, check=False, timeout=300)


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
    _image, build = rehearsal_image
    added = [line for line in build.splitlines() if "check-base-unmoved: added" in line]
    print("\n".join(added))
    assert added and added[-1].endswith("base unmoved, pip check clean: True"), build[-3000:]
    assert "orjson==" in added[-1] and "pydantic-settings==" in added[-1] and "palmyra-serve==" in added[-1]


def test_entrypoint_user_writable_dirs_and_engine_command(rehearsal_image: tuple[str, str], volumes) -> None:
    image, _build = rehearsal_image
    cache, models = volumes
    probe = PROBE.replace("WRITABLE", " ".join(WRITABLE))
    run = run_as_operator(image, cache, models, "bash", "-c", probe)
    print(run.stdout)
    print(run.stderr)
    assert run.returncode == 0, run.stderr
    out = dict(line.split(": ", 1) for line in run.stdout.splitlines() if ": " in line and not line.startswith("writable"))
    assert out["user"] == "HwHiAiUser group: HwHiAiUser"
    assert f"uid={UID}(HwHiAiUser) gid={GID}(HwHiAiUser)" in out["id"]
    assert out["cwd"] == "/cache/work"
    assert out["sourced"].split(":") == up.FACTS["cann_entrypoint_scripts"]
    assert out["bishengir"].endswith("ascendnpu-ir/bin/bishengir-compile")
    assert out["root"] == "ro", "the root filesystem is mounted read-only"
    assert [line.removeprefix("writable: ") for line in run.stdout.splitlines() if line.startswith("writable: ")] == list(WRITABLE)
    for script in up.FACTS["cann_entrypoint_scripts"]:
        assert f"engine-entrypoint: sourced {script}" in run.stderr
    words = shlex.split(out["command"])
    assert words[:2] == ["PYTORCH_NPU_ALLOC_CONF=expandable_segments:True", "VLLM_API_KEY=***"], words
    assert words[2].startswith(up.FACTS["python"]["prefix"] + "/bin/python"), "upstream's interpreter runs vLLM"
    assert words[3:5] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--trust-remote-code" not in words and "--api-key" not in words


def test_default_command_refuses_the_stand_in_and_says_how_to_give_weights(rehearsal_image: tuple[str, str], volumes) -> None:
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
