"""The engine-cuda image against what it installs: its base's CUDA is the CUDA of the torch its vLLM
pins (the wheels' own METADATA, vendored in tests/data/cuda-image/), the build checks the same at
build time, FlashInfer is kept from compiling kernels in a runtime image without nvcc, and the CUDA
and CPU engine commands are parsed by the vLLM those images pin (0.32.0, this venv's), not by
the Ascend image's 0.18.0."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from email.parser import Parser
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.helpers import ascend_command as cmd
from tests.helpers.vllm_parser import PARSE

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "cuda-image"
DOCKERFILE = (REPO / "Dockerfile").read_text(encoding="utf-8")
STAGE = "engine-cuda"


def metadata(name: str) -> list[Requirement]:
    (path,) = DATA.glob(f"{name}-*-METADATA")
    return [Requirement(r) for r in Parser().parsestr(path.read_text(encoding="utf-8")).get_all("Requires-Dist", [])]


def pinned(reqs: list[Requirement], name: str) -> str:
    """The version `name` is pinned to (outside any extra)."""
    (req,) = [r for r in reqs if r.name == name and "extra" not in str(r.marker or "")]
    (spec,) = list(req.specifier)
    assert spec.operator == "==", req
    return spec.version


def arg(name: str) -> str:
    found = re.findall(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.MULTILINE)
    assert len(found) == 1, (name, found)
    return found[0]


def test_the_metadata_is_the_pinned_vllms_and_its_torchs():
    vllm = metadata("vllm")
    assert DATA.joinpath(f"vllm-{arg('VLLM_CUDA_VERSION')}-cp38-abi3-manylinux_2_28_x86_64-METADATA").exists()
    torch = pinned(vllm, "torch")
    assert list(DATA.glob(f"torch-{torch}-*-METADATA")), f"vllm pins torch {torch}; its METADATA is not vendored"


def test_the_cuda_base_is_the_cuda_of_the_torch_vllm_pins():
    toolkit = [r for r in metadata("torch") if r.name == "cuda-toolkit"]
    assert len(toolkit) == 1
    (spec,) = list(toolkit[0].specifier)
    wheels_cuda = spec.version.split(".")[:2]  # 13.0.3 -> 13, 0
    cu = {r.name.rsplit("-", 1)[-1] for r in metadata("torch") if r.name.startswith("nvidia-") and "-cu" in r.name}
    assert cu == {f"cu{wheels_cuda[0]}"}, cu
    base = re.fullmatch(r"nvidia/cuda:(\d+)\.(\d+)\.\d+-runtime-ubuntu\d+\.\d+", arg("CUDA_BASE"))
    assert base, arg("CUDA_BASE")
    assert [base.group(1), base.group(2)] == wheels_cuda, (arg("CUDA_BASE"), spec.version)


def stage(name: str) -> str:
    match = re.search(rf"^FROM \S+ AS {re.escape(name)}$(.*?)(?=^FROM |\Z)", DOCKERFILE, re.MULTILINE | re.DOTALL)
    assert match
    return match.group(1)


def test_the_build_fails_when_torchs_cuda_is_not_the_bases():
    text = stage(STAGE)
    assert "torch.version.cuda" in text and "os.environ['CUDA_VERSION']" in text and "assert cuda and" in text


def test_flashinfer_does_not_compile_in_the_runtime_image():
    # vllm pins a FlashInfer whose kernels compile with nvcc at first use; the runtime base has none.
    assert pinned(metadata("vllm"), "flashinfer-python")
    text = stage(STAGE)
    assert "nvcc" not in re.sub(r"#.*", "", text)  # no CUDA compiler installed
    assert cmd.image_env(STAGE).get("VLLM_USE_FLASHINFER_SAMPLER") == "0"


def test_the_docs_state_the_driver_the_image_needs():
    text = (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    major = arg("CUDA_BASE").removeprefix("nvidia/cuda:").split(".")[0]
    assert f"CUDA {major}" in text and "R580" in text and arg("CUDA_BASE") in text
    assert f"torch {pinned(metadata('vllm'), 'torch')}" in text


PLATFORMS_032 = ("cpu", "cuda")


def gpu_doc_extra_args() -> str:
    """The one PALMYRA_ENGINE_EXTRA_ARGS docs/gpu.md gives (for Blackwell)."""
    (value,) = re.findall(
        r"PALMYRA_ENGINE_EXTRA_ARGS='([^']*)'", (REPO / "docs" / "gpu.md").read_text(encoding="utf-8")
    )
    return value


def _module_path(root: Path, module: str) -> Path:
    return root.parent.joinpath(*module.split(".")).with_suffix(".py")


def _serve_modules(root: Path) -> tuple[str, str]:
    """Where the parser of `python -m vllm.entrypoints.openai.api_server` comes from in this vLLM:
    in 0.32 that module is a deprecated shim whose __main__ runs another module's main(), which
    builds its parser with make_arg_parser from a sibling cli_args module. Followed, not assumed."""
    shim = _module_path(root, "vllm.entrypoints.openai.api_server").read_text()
    entry = re.search(r"^\s+from (\S+) import main$", shim, re.MULTILINE)
    assert entry, "api_server's __main__ no longer delegates to a main()"
    text = _module_path(root, entry.group(1)).read_text()
    main = text[text.index("def main():") :]
    args = re.search(r"from (\.+)(\w+) import \(?\s*make_arg_parser", main)
    parser = re.search(r"from (\S+) import FlexibleArgumentParser", main)
    assert args and parser, "main() builds its parser differently"
    package = entry.group(1).split(".")[: -len(args.group(1))]
    return ".".join([*package, args.group(2)]), parser.group(1)


@pytest.fixture(scope="module")
def parsed_032() -> dict:
    """The CUDA and CPU images' printed commands through this venv's vLLM, the version both pin."""
    import vllm

    assert vllm.__version__ == arg("VLLM_CUDA_VERSION"), (vllm.__version__, arg("VLLM_CUDA_VERSION"))
    argvs = {}
    for platform in PLATFORMS_032:
        _env, argv = cmd.host_command(platform)
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], argv
        argvs[platform] = argv[3:]
    argvs["unknown"] = cmd.host_command("cuda", PALMYRA_ENGINE_EXTRA_ARGS="--no-such-flag-in-vllm 1")[1][3:]
    argvs["docs"] = cmd.host_command("cuda", PALMYRA_ENGINE_EXTRA_ARGS=gpu_doc_extra_args())[1][3:]
    root = Path(vllm.__file__).parent
    cli_args, flexible = _serve_modules(root)
    script = PARSE.replace("vllm.entrypoints.openai.cli_args", cli_args).replace("PARSER_MODULE", flexible)
    assert cli_args in script and flexible in script
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run = subprocess.run(
        [sys.executable, "-c", script, json.dumps(argvs)],
        capture_output=True,
        text=True,
        env={**env, "VLLM_TARGET_DEVICE": "cpu"},
        timeout=600,
        check=False,
    )
    lines = [x for x in run.stdout.splitlines() if x.startswith("PARSED ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("PARSED "))
    assert result["vllm"] == vllm.__file__, result["vllm"]
    return result


@pytest.mark.parametrize("platform", PLATFORMS_032)
def test_vllm_032_parses_the_printed_command(parsed_032: dict, platform: str) -> None:
    got = parsed_032["results"][platform]
    assert got["ok"], got
    assert (got["model"], got["served"], got["len"]) == ("/models/palmyra-mini", ["palmyra-mini"], 8192)


def test_vllm_032_accepts_the_setting_the_gpu_page_gives(parsed_032: dict) -> None:
    assert parsed_032["results"]["docs"]["ok"], parsed_032["results"]["docs"]


def test_vllm_032_refuses_a_flag_it_does_not_know(parsed_032: dict) -> None:
    assert parsed_032["results"]["unknown"] == {"ok": False, "code": 2}
