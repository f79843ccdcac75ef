"""The Ascend engine image held against upstream's real sources, not against its own values.

- Upstream's images are read from their own files, vendored unmodified in tests/data/ascend-image/
  (tests/helpers/ascend_upstream.py parses them): the Dockerfile builds FROM the image vllm-ascend's
  workflow publishes from its Dockerfile for the release (Dockerfile.a3's for Atlas A3), and every
  image the project names is one it publishes; Dockerfile.a3 is Dockerfile's recipe on the A3 CANN
  base with its own SOC_VERSION, as the project says; the layer sets no variable upstream's ENV or
  the CANN base's ENV sets (SOC_VERSION, TASK_QUEUE_ENABLE, OMP_NUM_THREADS, CANN's paths); the
  entrypoint sources every script the CANN base's ENTRYPOINT sources (both bases), and the
  rehearsal's stand-in has the CANN ENTRYPOINT, Python prefix, WORKDIR and CMD of the real image.
  Each of these checks is run against a deliberately altered copy of the vendored files too, and
  fails there (test_upstream_derived_checks_can_fail).
- vllm-ascend v0.18.0's Python set (rebuilt from its and vLLM's source distributions on the
  package index, in upstream's install order) resolves for the CANN base's CPython on manylinux
  x86_64 and aarch64 (the workflow's platforms) with the versions upstream pins; the wheels
  upstream's Dockerfile takes from its bucket are named and what can be verified about them is;
  the project's additions resolve with that set without moving any of it (the build proves the
  same against the real base: check-base-unmoved). The index's vllm-ascend sdist carries the very
  Dockerfiles vendored from the git tag.
- The command the launcher prints for the image's CMD (ascend_command.py; the rehearsal asserts
  the image prints this very line) is accepted by vLLM 0.18.0's own argument parser (its source on
  PYTHONPATH), as are the settings the docs recommend, which reach vLLM as meant; every `vllm:`
  metric the monitoring, alerts, autoscaler, router and sidecar use is defined in vLLM 0.18.0's
  source.
Needs the package index for the Python set (cached under ~/.cache/palmyra-serve-tests; a clear
failure offline); the checks on the vendored files need nothing.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.helpers import ascend_command as cmd
from tests.helpers import ascend_upstream as up
from tests.helpers.vllm_metric_names import base_name, used_metric_lines
from tests.helpers.vllm_parser import PARSE

pytestmark = pytest.mark.static


REPO = up.REPO
EXPECTED = up.JSON_FACTS["expected"]
# Where the project names upstream's images, CANN's release or SOC_VERSION (CHANGELOG.md is history).
MENTIONS = (
    "Dockerfile",
    "docker-compose.yml",
    "README.md",
    "docs/ascend.md",
    "compose/README.md",
    "k8s/README.md",
    "docker/engine-entrypoint.sh",
    "scripts/podman/vllm-ascend-stand-in.Containerfile",
    "scripts/podman/build-image.sh",
)
STAND_IN = REPO / "scripts" / "podman" / "vllm-ascend-stand-in.Containerfile"


def mention_files() -> list[Path]:
    return [
        *(REPO / m for m in MENTIONS),
        *sorted((REPO / "docs").glob("*.md")),
        *sorted((REPO / "k8s").rglob("*.yaml")),
    ]


def report(res: up.Resolution) -> str:
    keys = (
        "torch",
        "torch-npu",
        "triton-ascend",
        "torchvision",
        "torchaudio",
        "fastapi",
        "pydantic",
        "transformers",
        "numpy",
        "opencv-python-headless",
        "modelscope",
        "ray",
    )
    built = [f"{k} {v} (source)" for k, v in res.from_source.items()]
    return f"{res.arch}: " + ", ".join([*built, *(f"{k} {res.versions.get(k)}" for k in keys)])


# --- the Dockerfile against upstream's files (tests/data/ascend-image) -------------------------------


def base_image_problems(root: Path = up.IMAGE_DATA) -> list[str]:
    """The project's base images against what vllm-ascend's image workflow publishes for the
    release: the Dockerfile's default is the image built from upstream's Dockerfile, the A3 build
    argument it documents is the one built from Dockerfile.a3, and every vllm-ascend image the
    project names anywhere is one of those two."""
    images = up.published(root).images
    ours = {images[d] for d in up.VARIANTS}
    problems = []
    text = (REPO / "Dockerfile").read_text(encoding="utf-8")
    base = re.search(r"^ARG VLLM_ASCEND_BASE=(\S+)$", text, re.MULTILINE)
    if not base or base.group(1) != images["Dockerfile"]:
        problems.append(
            f"ARG VLLM_ASCEND_BASE={base and base.group(1)}: "
            f"upstream's Dockerfile is published as {images['Dockerfile']}"
        )
    if not re.search(r"^FROM \$\{VLLM_ASCEND_BASE\} AS engine-ascend$", text, re.MULTILINE):
        problems.append("the engine-ascend stage is not FROM ${VLLM_ASCEND_BASE}")
    if f"VLLM_ASCEND_BASE={images['Dockerfile.a3']}" not in text:
        problems.append(
            f"the Dockerfile does not document the A3 build argument VLLM_ASCEND_BASE={images['Dockerfile.a3']}"
        )
    repository = images["Dockerfile"].rsplit(":", 1)[0]
    for path in mention_files():
        for named in re.findall(rf"{re.escape(repository)}:[\w.-]*\w", path.read_text(encoding="utf-8")):
            if named not in ours:
                problems.append(f"{path.relative_to(REPO)} names {named}, which the workflow does not publish")
    return problems


def test_dockerfile_builds_from_the_release_image_and_names_the_a3_variant() -> None:
    assert base_image_problems() == []
    # The platforms upstream builds both images for are the architectures checked below.
    assert up.ARCHES == ("x86_64", "aarch64"), up.published().platforms


def cann_version(tag: str) -> str:
    return tag.split("-", 1)[0]


def variant_problems(root: Path = up.IMAGE_DATA) -> list[str]:
    """Dockerfile.a3 is Dockerfile's recipe on the A3 CANN base with its own SOC_VERSION (the
    Dockerfile's comment says so, and builds the A3 image with the same target), and what the
    project says about each variant's SOC_VERSION and CANN release is what upstream's files say."""
    a2, a3 = (up.variant(d, root) for d in up.VARIANTS)
    problems = []
    if sorted(a2.runs) != sorted(a3.runs):
        problems.append("Dockerfile.a3 runs other steps than Dockerfile: not the same recipe")
    if set(a2.env) != set(a3.env) or {k for k in a2.env if a2.env[k] != a3.env[k]} != {"SOC_VERSION"}:
        problems.append(f"the variants' ENV differ beyond SOC_VERSION: {a2.env} / {a3.env}")
    if (a2.vllm_tag, a2.workdir, a2.cmd) != (a3.vllm_tag, a3.workdir, a3.cmd):
        problems.append("the variants differ in VLLM_TAG, WORKDIR or CMD")
    cann = {v.dockerfile: up.cann_dockerfile(v.cann_tag, root) for v in (a2, a3)}
    for what in (up.cann_entrypoint_scripts, up.python_prefix, up.cann_os):
        if what(cann["Dockerfile"]) != what(cann["Dockerfile.a3"]):
            problems.append(f"the A2 and A3 CANN bases differ in {what.__name__}: one layer cannot serve both")
    release = {cann_version(v.cann_tag) for v in (a2, a3)}
    if len(release) != 1:
        problems.append(f"the variants are on different CANN releases: {release}")
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    said = re.search(r"upstream's Dockerfile\.a3: [^)]*SOC_VERSION=(\w+)", dockerfile)
    if not said or said.group(1) != a3.env["SOC_VERSION"]:
        problems.append(
            f"the Dockerfile gives Dockerfile.a3's SOC_VERSION as {said and said.group(1)}: "
            f"upstream's is {a3.env['SOC_VERSION']}"
        )
    a3_overlay = (REPO / "k8s" / "overlays" / "ascend-mindcluster-a3" / "kustomization.yaml").read_text("utf-8")
    said = re.search(r"The A2 image \((\w+) kernels\)", a3_overlay)
    if not said or said.group(1) != a2.env["SOC_VERSION"]:
        problems.append(
            f"the A3 overlay gives the A2 image's SOC_VERSION as {said and said.group(1)}: "
            f"upstream's is {a2.env['SOC_VERSION']}"
        )
    # Besides the images' release, a page may name the CANN that vllm-ascend v0.18.0's own release
    # notes tell users to upgrade to (its known issues fixed there), and no other.
    allowed = release | cann_upgrade_targets()
    for path in mention_files():
        for named in set(re.findall(r"\bCANN (\d+\.\d+\.\d+)", path.read_text(encoding="utf-8"))) - allowed:
            problems.append(f"{path.relative_to(REPO)} names CANN {named}; the images are on CANN {release}")
    return problems


def cann_upgrade_targets() -> set[str]:
    """The CANN versions vllm-ascend v0.18.0's release notes (tests/data/ascend-host/) name as the
    ones to upgrade to, in that release's section."""
    notes = (REPO / "tests" / "data" / "ascend-host" / "vllm-ascend-v0.18.0-release_notes.md").read_text("utf-8")
    release = notes[notes.index("## v0.18.0 ") :]
    release = release[: release.index("\n## v", 5)]
    return {
        v
        for line in release.splitlines()
        if "upgrade" in line.lower()
        for v in re.findall(r"CANN (\d+\.\d+\.\d+)", line)
    }


def test_a3_variant_is_the_same_recipe_on_the_a3_base_with_its_soc_version() -> None:
    assert variant_problems() == []


def env_override_problems(layer: dict[str, str], root: Path = up.IMAGE_DATA) -> list[str]:
    """Variables of the project's layer that upstream's image already sets with ENV: vllm-ascend's
    Dockerfile (SOC_VERSION, TASK_QUEUE_ENABLE, OMP_NUM_THREADS, ...) or the CANN base's final
    stage (its toolkit, NNAL and Python paths). The layer adds; it overrides none of them."""
    problems = []
    for dockerfile in up.VARIANTS:
        v = up.variant(dockerfile, root)
        cann = up.final_stage(up.cann_dockerfile(v.cann_tag, root)).env()
        for source, env in ((f"vllm-ascend's {dockerfile}", v.env), (f"CANN {v.cann_tag}", cann)):
            problems += [
                f"the layer sets {k}={layer[k]}; {source} sets {k}={env[k]}" for k in sorted(set(layer) & set(env))
            ]
    return problems


def test_the_layer_overrides_no_env_of_upstreams_image() -> None:
    upstream_env = up.variant().env
    # What the reviewer named is among what is read (the parser sees the ENV block).
    assert {"SOC_VERSION", "TASK_QUEUE_ENABLE", "OMP_NUM_THREADS"} <= set(upstream_env), upstream_env
    assert env_override_problems(cmd.image_env()) == []
    # The check sees an override of what upstream sets.
    assert env_override_problems({**cmd.image_env(), "OMP_NUM_THREADS": "4"})


def test_sdists_are_the_tagged_sources_upstream_builds() -> None:
    # vllm-ascend's Dockerfile installs its git tag; the index's sdist is that source: it carries
    # the very Dockerfiles vendored from the tag, and the pins they state.
    ascend = up.sdist_root("vllm-ascend", up.vllm_ascend_version())
    assert up.pkg_info(ascend)["Version"] == [up.vllm_ascend_version()]
    for name in up.VARIANTS:
        assert (ascend / name).read_bytes() == up.vllm_ascend_file(name).read_bytes(), name
    vllm = up.sdist_root("vllm", up.vllm_version())
    assert up.pkg_info(vllm)["Version"] == [up.vllm_version()]
    # The resolver's release (read from the project's Dockerfile and the sdist) is this one.
    assert up.release() == (up.vllm_ascend_version(), up.vllm_version())
    reqs: dict[str, str] = {
        canonicalize_name(Requirement(r).name): str(Requirement(r).specifier)
        for r in up.read_requirements(ascend / "requirements.txt")
    }
    assert reqs["torch"] == f"=={EXPECTED['torch']}"
    assert reqs["torch-npu"] == f"=={EXPECTED['torch-npu']}"
    assert reqs["triton-ascend"] == f"=={EXPECTED['triton-ascend']}"
    assert SpecifierSet(reqs["fastapi"]) == SpecifierSet(EXPECTED["fastapi_bound"])


# --- (a) the Python set resolves on both architectures ----------------------------------------


@pytest.mark.parametrize("arch", up.ARCHES)
def test_upstream_set_resolves_with_upstreams_pins(arch: str) -> None:
    res = up.upstream_set(arch)
    print(report(res))
    for note in res.notes:
        print(f"  note: {note}")
    v = res.versions
    # The release the Dockerfile's base names, and the vLLM its own Dockerfile clones (ARG VLLM_TAG).
    assert res.from_source.get("vllm") == up.vllm_version(), report(res)
    assert res.from_source.get("vllm-ascend") == up.vllm_ascend_version(), report(res)
    assert v["torch"] == EXPECTED["torch"], report(res)
    assert v["torch-npu"] == EXPECTED["torch-npu"], report(res)
    assert v["triton-ascend"] == EXPECTED["triton-ascend"], report(res)
    assert Version(v["fastapi"]) in SpecifierSet(EXPECTED["fastapi_bound"]), report(res)
    # Upstream's own choices survive the resolution: vllm-ascend's numpy<2 and opencv bound.
    assert Version(v["numpy"]) < Version("2"), report(res)
    assert "modelscope" in v, "upstream installs modelscope: the modelscope model source relies on it"


def outside_wheel_problems(root: Path = up.IMAGE_DATA) -> list[str]:
    """The torch_npu and triton_ascend wheels upstream's Dockerfile installs from its bucket after
    vllm-ascend, read from the Dockerfile: both variants install the same, one of each for every
    platform the workflow builds, for the CANN base's CPython, on a manylinux the CANN base's glibc
    runs, replacing (not equal to) the pin vllm-ascend declares."""
    problems = []
    wheels = up.outside_wheels("Dockerfile", root)
    if up.outside_wheels("Dockerfile.a3", root) != wheels:
        problems.append("Dockerfile.a3 installs other bucket wheels than Dockerfile")
    if set(wheels) != {"torch-npu", "triton-ascend"}:
        problems.append(f"the bucket wheels are {sorted(wheels)}")
    cann = up.cann_dockerfile(up.variant("Dockerfile", root).cann_tag, root)
    cp = "cp" + up.python_version(cann).replace(".", "")
    glibc = tuple(int(x) for x in up.JSON_FACTS["glibc"][up.cann_os(cann)].split("."))
    for name, per_arch in wheels.items():
        if set(per_arch) != set(up.architectures(root)):
            problems.append(f"{name}: wheels for {sorted(per_arch)}, the images are built for {up.architectures(root)}")
        for arch, wheel in per_arch.items():
            _name, _version, _build, tags = parse_wheel_filename(wheel.filename)
            if not any(t.interpreter == cp and t.abi == cp and _manylinux_ok(t, arch, glibc) for t in tags):
                problems.append(f"{wheel.filename} does not install on {cp} / glibc {glibc} {arch}")
            # `pip check` in upstream's image reports these (check-base-unmoved tolerates the base's own).
            if Version(wheel.version) in SpecifierSet(f"=={EXPECTED[name]}"):
                problems.append(f"{wheel.filename} is the pin {EXPECTED[name]} itself, not a replacement")
    return problems


def _manylinux_ok(tag: Tag, arch: str, glibc: tuple[int, ...]) -> bool:
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag.platform)
    return m is not None and m.group(3) == arch and (int(m.group(1)), int(m.group(2))) <= glibc


def test_wheels_from_outside_the_index_are_named_and_checked() -> None:
    """torch_npu and triton_ascend builds upstream installs from its own bucket, after vllm-ascend.

    What can be verified here without that bucket: the versions are not on the index (a recipe
    asking the index for them fails), each replaces the index pin vllm-ascend declares, upstream's
    filenames install on the CANN base's CPython / manylinux for both architectures, and the pin
    they replace exists on the index for both. Their contents are unverified without the files.
    """
    assert outside_wheel_problems() == []
    cp = "cp" + up.PYTHON.replace(".", "")
    for name, per_arch in up.outside_wheels().items():
        pin = EXPECTED[name]
        versions = set(up._versions(name))
        for arch, wheel in per_arch.items():
            public = Version(wheel.version).public
            assert Version(public) not in versions, f"{name} {public} is on the index now: use it"
            assert any(f"{cp}-{cp}-" in f and arch in f for f in up.files_of(name, pin)), (
                f"no {cp} {arch} wheel of {name} {pin} on the index"
            )
            print(f"outside the index: {name} {wheel.version} for {arch}: {wheel.url}")
        assert Version(pin) in versions


@pytest.mark.parametrize("arch", up.ARCHES)
def test_project_additions_move_no_upstream_pin(arch: str) -> None:
    base = up.upstream_set(arch)
    adds = up.additions()
    assert adds, "the launcher needs pydantic-settings and orjson, which upstream's image lacks"
    constraints = [f"{n}=={v}" for n, v in sorted(base.versions.items())]
    overrides = None
    if any("override" in note and note.startswith("x86_64") for note in base.notes) and arch == "x86_64":
        overrides = [f"torch=={base.versions['torch']}"]
    try:
        with_adds = up.compile_set(arch, base.requirements + adds, constraints=constraints, overrides=overrides)
    except up.ResolutionFailed as exc:
        pytest.fail(f"the project's additions {adds} cannot join upstream's set without moving it:\n{exc}")
    moved = {n: (v, with_adds.get(n)) for n, v in base.versions.items() if with_adds.get(n) != v}
    assert not moved, f"moved: {moved}"
    new = sorted(set(with_adds) - set(base.versions))
    declared = {canonicalize_name(Requirement(a).name) for a in adds}
    assert set(new) <= declared, f"undeclared packages would come in: {sorted(set(new) - declared)}"
    print(
        f"{arch}: the image adds {', '.join(f'{n}=={with_adds[n]}' for n in new) or 'nothing'}; upstream's set unmoved"
    )


# The launcher's path in the engine image: `palmyra-serve engine` / `fetch-model`. Every import in
# these modules counts (also the lazy ones: the hub clients); only module-level ones elsewhere.
LAUNCHER_MODULES_ALL = ("settings", "logs.py", "engine/launcher.py", "model/resolve.py")
LAUNCHER_MODULES_TOP = ("__init__.py", "cli.py", "model/stand_in.py", "model/tokenizer.py")


def _imports(path: Path, nested: bool) -> set[str]:
    """The top-level names `path` imports (a package directory: its modules')."""
    import ast

    if path.is_dir():
        return set().union(*(_imports(module, nested) for module in sorted(path.glob("*.py"))))
    tree = ast.parse(path.read_text())
    nodes = ast.walk(tree) if nested else iter(tree.body)
    out = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            out |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def launcher_distributions() -> set[str]:
    from importlib.metadata import packages_distributions

    pkg = REPO / "service" / "palmyra_serve"
    modules = set().union(
        *(_imports(pkg / m, True) for m in LAUNCHER_MODULES_ALL),
        *(_imports(pkg / m, False) for m in LAUNCHER_MODULES_TOP),
    )
    modules -= set(sys.stdlib_module_names) | {"__future__", "palmyra_serve"}
    mapping = packages_distributions()
    return {canonicalize_name(mapping.get(m, [m])[0]) for m in modules}


def test_launcher_imports_only_what_the_image_has() -> None:
    # What the launcher imports, less what upstream's set has, is exactly what the image adds.
    needed = launcher_distributions()
    assert {"pydantic-settings", "huggingface-hub", "modelscope"} <= needed, needed  # the collector works
    for arch in up.ARCHES:
        base = up.upstream_set(arch).versions
        missing = sorted(n for n in needed if n not in base)
        declared = sorted(canonicalize_name(Requirement(a).name) for a in up.additions())
        assert missing == declared, (
            f"{arch}: the base lacks {missing}; engine-ascend-requirements.txt declares {declared}"
        )


# --- (b) vLLM 0.18.0's own parser accepts the printed command ------------------------------------

# The Ascend image runs vLLM 0.18.0; the CPU and CUDA images pin 0.32.0, whose parser reads their
# commands in tests/static/test_cuda_image.py.
PLATFORMS = ("ascend",)
OTLP_URL = "http://otel-collector:4318/v1/traces"
UNKNOWN = "--no-such-flag-in-vllm"
# The operator settings the docs recommend for the engine (docs/ascend-troubleshooting.md, the ACL
# graph capture fix; docs/configuration.md), exactly as written there.
SETTING_DOCS = ("docs/ascend-troubleshooting.md", "docs/configuration.md")


def vllm_018_path() -> Path:
    return up.sdist_root("vllm", up.vllm_version())


def documented_settings() -> dict[str, tuple[str, str]]:
    """Every `PALMYRA_ENGINE_EXTRA_ARGS='...'` and `PALMYRA_ENFORCE_EAGER=...` the docs give."""
    found: dict[str, tuple[str, str]] = {}
    for doc in SETTING_DOCS:
        text = (REPO / doc).read_text()
        for m in re.finditer(r"(PALMYRA_ENGINE_EXTRA_ARGS)='([^']*)'|(PALMYRA_ENFORCE_EAGER)=(\w+)", text):
            name, value = m.group(1) or m.group(3), m.group(2) or m.group(4)
            found[f"{doc}: {name}={value}"] = (name, value)
    return found


def _parser_module() -> str:
    # FlexibleArgumentParser moves between releases: read where 0.18.0 keeps it.
    root = vllm_018_path() / "vllm"
    hits = [p for p in root.rglob("*.py") if "class FlexibleArgumentParser" in p.read_text(errors="ignore")]
    assert len(hits) == 1, f"FlexibleArgumentParser in vLLM 0.18.0: {hits}"
    return ".".join(hits[0].relative_to(root.parent).with_suffix("").parts)


@pytest.fixture(scope="module")
def commands() -> dict[str, tuple[dict[str, str], list[str]]]:
    out = {p: cmd.host_command(p) for p in PLATFORMS}
    out["unknown"] = cmd.host_command("ascend", PALMYRA_ENGINE_EXTRA_ARGS=f"{UNKNOWN} 1")
    out["priority"] = cmd.host_command("ascend", PALMYRA_PRIORITY_SCHEDULING="true")
    out["tracing"] = cmd.host_command("ascend", PALMYRA_OTLP_TRACES_ENDPOINT=OTLP_URL)
    for key, (name, value) in documented_settings().items():
        out[key] = cmd.host_command("ascend", **{name: value})
    return out


@pytest.fixture(scope="module")
def parsed(commands: dict[str, tuple[dict[str, str], list[str]]]) -> dict:
    """All printed commands through vLLM 0.18.0's own parser, in one interpreter (importing it is slow)."""
    argvs = {}
    for key, (_env, argv) in commands.items():
        assert argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"], argv
        argvs[key] = argv[3:]
    env = {**os.environ, "PYTHONPATH": str(vllm_018_path()), "VLLM_TARGET_DEVICE": "cpu"}
    run = subprocess.run(
        [sys.executable, "-c", PARSE.replace("PARSER_MODULE", _parser_module()), json.dumps(argvs)],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    lines = [x for x in run.stdout.splitlines() if x.startswith("PARSED ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    result = json.loads(lines[0].removeprefix("PARSED "))
    assert result["vllm"].startswith(str(vllm_018_path())), f"not vLLM 0.18.0's parser: {result['vllm']}"
    result["stderr"] = run.stderr
    return result


def _accepted(parsed: dict, key: str) -> dict:
    got = parsed["results"][key]
    assert got["ok"], f"vLLM 0.18.0 refused {key}:\n" + parsed["stderr"][-2000:]
    assert {k: got[k] for k in ("model", "served", "len")} == {
        "model": "/models/palmyra-mini",
        "served": ["palmyra-mini"],
        "len": 8192,
    }
    return got


@pytest.mark.parametrize("platform", PLATFORMS)
def test_vllm_018_parser_accepts_the_printed_command(commands: dict, parsed: dict, platform: str) -> None:
    env, argv = commands[platform]
    print(f"{platform}: {shlex.join([f'{k}={v}' for k, v in env.items()] + argv)}")
    assert "--api-key" not in argv and env.get("VLLM_API_KEY") == "***"
    got = _accepted(parsed, platform)
    assert got["eager"] is False and got["capture_sizes"] is None  # the defaults: ACL graphs on


def test_the_settings_the_docs_recommend_reach_vllm_018_as_meant(parsed: dict) -> None:
    settings = documented_settings()
    assert any(name == "PALMYRA_ENFORCE_EAGER" for name, _ in settings.values()), settings
    assert any("capture_sizes" in value for _, value in settings.values()), settings
    for key, (name, value) in settings.items():
        got = _accepted(parsed, key)
        if name == "PALMYRA_ENFORCE_EAGER":
            assert got["eager"] is (value.lower() == "true"), key
        if "capture_sizes" in value:
            # The sizes the doc writes are the sizes vLLM receives (shell-splitting the setting
            # must not eat the JSON's quotes).
            meant = [int(n) for n in re.findall(r"\d+", value.split("capture_sizes", 1)[1])]
            assert got["capture_sizes"] == meant, f"{key}: vLLM got {got['capture_sizes']}"
        if "enable_cpu_binding" in value:
            # vllm-ascend reads additional_config["enable_cpu_binding"]: a bool, not the string.
            assert got["additional"] == {"enable_cpu_binding": False}, f"{key}: vLLM got {got['additional']}"
    assert any("enable_cpu_binding" in value for _, value in settings.values()), settings


def test_priority_scheduling_reaches_vllm_018_as_its_priority_policy(parsed: dict) -> None:
    """The sidecar sets tenants' priorities only with PALMYRA_PRIORITY_SCHEDULING; the engine must
    then run the priority policy (under its default, fcfs, vLLM 0.18.0 ignores a request's priority)."""
    assert _accepted(parsed, "priority")["policy"] == "priority"
    assert _accepted(parsed, "ascend")["policy"] == "fcfs"


def test_tracing_reaches_vllm_018_as_its_otlp_traces_endpoint(parsed: dict) -> None:
    """With an OTLP endpoint set, the engine command carries it to vLLM 0.18.0's own tracing, which
    its parser takes as otlp_traces_endpoint; without one, vLLM's tracing stays off."""
    assert _accepted(parsed, "tracing")["otlp"] == OTLP_URL
    assert _accepted(parsed, "ascend")["otlp"] is None


def test_vllm_018_lists_the_opentelemetry_packages_its_tracing_imports() -> None:
    """vLLM 0.18.0's tracing imports the SDK and both OTLP exporters; the vllm-ascend image's
    Python set (resolved from its requirements, as its Dockerfile installs them) has them, so the
    image needs nothing added."""
    root = vllm_018_path()
    otel = (root / "vllm" / "tracing" / "otel.py").read_text()
    for module in (
        "opentelemetry.exporter.otlp.proto.http.trace_exporter",
        "opentelemetry.exporter.otlp.proto.grpc.trace_exporter",
        "opentelemetry.sdk.trace",
    ):
        assert f"from {module} import" in otel, module
    assert 'os.environ.get(OTEL_EXPORTER_OTLP_TRACES_PROTOCOL, "grpc")' in otel  # hence the launcher's http/protobuf
    for arch in up.ARCHES:
        versions = up.upstream_set(arch).versions
        missing = {
            "opentelemetry-sdk",
            "opentelemetry-exporter-otlp-proto-http",
            "opentelemetry-exporter-otlp-proto-grpc",
        }
        missing -= set(versions)
        assert not missing, f"{arch}: the image's Python set lacks {missing}"


def test_vllm_018_parser_refuses_a_flag_it_does_not_know(parsed: dict) -> None:
    assert parsed["results"]["unknown"] == {"ok": False, "code": 2}
    assert UNKNOWN in parsed["stderr"]


# --- (b) metric names in vLLM 0.18.0's source -----------------------------------------------------


def defined_in(root: Path) -> set[str]:
    names = set()
    for path in (root / "vllm").rglob("*.py"):
        names |= set(re.findall(r"[\"'](vllm:[a-zA-Z0-9_:]+)[\"']", path.read_text(errors="ignore")))
    return names


def test_every_metric_the_monitoring_uses_exists_in_vllm_018() -> None:
    used = used_metric_lines()
    assert len(used) >= 10, "the collector found too few names to be looking in the right files"
    assert any(line.startswith("service/") for lines in used.values() for line in lines), (
        "the sidecar's names are collected"
    )
    defined = {base_name(n) for n in defined_in(vllm_018_path())}
    assert "vllm:num_requests_waiting" in defined and "vllm:kv_cache_usage_perc" in defined
    missing = {}
    for name, lines in used.items():
        if base_name(name) in defined:
            continue
        # A name 0.18.0 lacks is acceptable only as a fallback next to one it has, in the same query.
        bare = [
            line
            for line in lines
            if not any(
                base_name(other) in defined for other in re.findall(r"vllm:[a-zA-Z0-9_:]+", line) if other != name
            )
        ]
        if bare:
            missing[name] = bare[:3]
    assert not missing, "metrics used without a vLLM 0.18.0 name beside them:\n" + json.dumps(missing, indent=1)


# --- the entrypoint against the CANN base's ENTRYPOINT ----------------------------------------------


def cann_scripts(root: Path = up.IMAGE_DATA) -> list[str]:
    """The scripts the CANN base's ENTRYPOINT sources: the same for the A2 and A3 bases (one
    entrypoint serves both images), else the first base's with a marker that fails the check."""
    found = [up.cann_entrypoint_scripts(up.cann_dockerfile(up.variant(d, root).cann_tag, root)) for d in up.VARIANTS]
    return found[0] if all(f == found[0] for f in found) else [*found[0], "<the A3 base sources other scripts>"]


SCRIPTS = cann_scripts()


def _cann_layout(root: Path, scripts: list[str]) -> Path:
    log = root / "sourced.log"
    for script in scripts:
        path = root / script.removeprefix("/usr/local/Ascend/")
        path.parent.mkdir(parents=True, exist_ok=True)
        # Vendor-like: an unset variable, a failing probe; records that it ran in THIS shell.
        path.write_text(f'echo "{script} $$ ${{UNSET_BY_DESIGN}}" >> "{log}"\nfalse\n')
    return log


def _entrypoint(root: Path, *command: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {
        "PATH": os.environ["PATH"],
        "HOME": str(root),
        "PALMYRA_ASCEND_ROOT": str(root),
        "PALMYRA_CANN_ENV": "required",
    }
    return subprocess.run(
        ["bash", str(REPO / "docker" / "engine-entrypoint.sh"), *command],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def entrypoint_problems(layout: Path, scripts: list[str]) -> list[str]:
    """The project's entrypoint, run in a CANN layout holding `scripts`, against CANN's ENTRYPOINT:
    it must source exactly those, in that order, in the shell that then execs the command, and say
    so in the lines the Ascend page's first-hour checklist quotes."""
    layout.mkdir(parents=True, exist_ok=True)
    log = _cann_layout(layout, scripts)
    run = _entrypoint(layout, "sh", "-c", "echo exec-pid $$")
    if run.returncode != 0:
        return [f"the entrypoint failed: {run.stderr}"]
    lines = log.read_text().splitlines() if log.exists() else []
    problems = []
    sourced = [line.split()[0] for line in lines]
    if sourced != scripts:
        problems.append(f"the entrypoint sourced {sourced}; CANN's ENTRYPOINT sources {scripts}")
    # Sourced in the entrypoint's own shell, which then exec'd the command (same pid).
    if {line.split()[1] for line in lines} != {run.stdout.split()[1]}:
        problems.append("not sourced in the shell that execs the command")
    # The first-hour checklist (docs/ascend.md) tells the operator to expect exactly these lines.
    said = [line.replace(str(layout), "/usr/local/Ascend") for line in run.stderr.splitlines() if " sourced " in line]
    if len(said) != len(scripts) or not all(f"`{line}`" in first_hour_text() for line in said):
        problems.append(f"docs/ascend.md does not quote what the entrypoint says: {said}")
    return problems


def test_entrypoint_sources_every_script_the_cann_entrypoint_sources(tmp_path: Path) -> None:
    assert len(SCRIPTS) >= 3 and all(s.startswith("/usr/local/Ascend/") for s in SCRIPTS), SCRIPTS
    assert entrypoint_problems(tmp_path, SCRIPTS) == []


def first_hour_text() -> str:
    """The first-hour checklist's page, whitespace folded."""
    return " ".join((REPO / "docs" / "ascend.md").read_text().split())


def test_the_first_hour_checklist_quotes_the_launchers_start_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from palmyra_serve.engine import launcher

    monkeypatch.setattr(launcher, "supervise", lambda argv, env: 0)  # log the start line, run nothing
    caplog.set_level("INFO", logger=launcher.log.name)
    launcher.run(launcher.EngineCommand(argv=["vllm"], platform="ascend"))
    (start,) = [r.getMessage() for r in caplog.records if r.getMessage().endswith(": vllm")]
    assert f"`{start.removesuffix('vllm')}...`" in first_hour_text(), start


@pytest.mark.parametrize("dropped", range(len(SCRIPTS)))
def test_entrypoint_refuses_to_start_when_a_cann_script_is_missing(tmp_path: Path, dropped: int) -> None:
    log = _cann_layout(tmp_path, SCRIPTS)
    (tmp_path / SCRIPTS[dropped].removeprefix("/usr/local/Ascend/")).unlink()
    run = _entrypoint(tmp_path, "true")
    assert (
        run.returncode == 1
        and "missing" in run.stderr
        and SCRIPTS[dropped].removeprefix("/usr/local/Ascend/") in run.stderr
    )
    assert not log.exists(), "nothing may be sourced from an incomplete CANN"


def stand_in_problems(root: Path = up.IMAGE_DATA) -> list[str]:
    """The rehearsal's stand-in for upstream's image (scripts/podman) has the real image's layout
    where the project's layer relies on it: the CANN ENTRYPOINT (same form, same scripts, for which
    it writes stand-in set_env.sh files), the CANN base's Python prefix on PATH, and vllm-ascend's
    WORKDIR and CMD."""
    v = up.variant("Dockerfile", root)
    cann = up.cann_dockerfile(v.cann_tag, root)
    stand_in = up.final_stage(STAND_IN)
    problems = []

    def words(entrypoint: list[str]) -> list[str]:
        return [" ".join(w.split()) for w in entrypoint]

    real = up.exec_form(up.final_stage(cann).last("ENTRYPOINT"))
    if words(up.exec_form(stand_in.last("ENTRYPOINT"))) != words(real):
        problems.append(f"the stand-in's ENTRYPOINT is not CANN's: {real}")
    written = re.search(r"for script in ([^;]+); do", " ".join(stand_in.values("RUN")))
    scripts = [f"/usr/local/Ascend/{s}" for s in written.group(1).split()] if written else []
    if scripts != up.cann_entrypoint_scripts(cann):
        problems.append(f"the stand-in writes {scripts}; CANN's ENTRYPOINT sources {up.cann_entrypoint_scripts(cann)}")
    if up.python_prefix(STAND_IN) != up.python_prefix(cann):
        problems.append(f"the stand-in's Python is at {up.python_prefix(STAND_IN)}, CANN's at {up.python_prefix(cann)}")
    if (stand_in.last("WORKDIR"), tuple(up.exec_form(stand_in.last("CMD")))) != (v.workdir, v.cmd):
        problems.append(f"the stand-in's WORKDIR/CMD are not vllm-ascend's ({v.workdir}, {v.cmd})")
    return problems


def test_rehearsal_stand_in_has_upstreams_entrypoint_python_workdir_and_cmd() -> None:
    assert stand_in_problems() == []


# --- each check above fails on a deliberately altered copy of upstream's files ------------------------


@dataclass(frozen=True)
class Mutation:
    """A deliberate error in a copy of tests/data/ascend-image: `old` -> `new` in each named file,
    then files renamed; `check` (the copy's folder, a scratch folder) must report `said`."""

    edits: list[tuple[str, str, str]]
    check: Callable[[Path, Path], list[str]]
    said: str
    renames: dict[str, str] = field(default_factory=dict)

    def apply(self, tmp_path: Path) -> Path:
        root = tmp_path / "ascend-image"
        shutil.copytree(up.IMAGE_DATA, root)
        for name, old, new in self.edits:
            path = root / name
            text = path.read_text(encoding="utf-8")
            assert old in text, f"{name}: {old!r} not found: the mutation no longer applies"
            path.write_text(text.replace(old, new), encoding="utf-8")
        for old_name, new_name in self.renames.items():
            (root / old_name).rename(root / new_name)
        return root


CANN_A2, CANN_A3 = (up.cann_dockerfile(up.variant(d).cann_tag).name for d in up.VARIANTS)
A2, A3 = (up.vllm_ascend_file(d).name for d in up.VARIANTS)
NNAL = "source /usr/local/Ascend/nnal/atb/set_env.sh && \\"
MUTATIONS = {
    "cann-entrypoint-sources-a-fourth-script": Mutation(
        [(f, NNAL, NNAL + "\n    source /usr/local/Ascend/extra/set_env.sh && \\") for f in (CANN_A2, CANN_A3)],
        lambda root, tmp: entrypoint_problems(tmp / "layout", cann_scripts(root)),
        "CANN's ENTRYPOINT sources",
    ),
    "a3-base-sources-other-scripts": Mutation(
        [(CANN_A3, NNAL, "\\")],
        lambda root, tmp: entrypoint_problems(tmp / "layout", cann_scripts(root)),
        "A3 base sources other scripts",
    ),
    "a3-published-under-another-suffix": Mutation(
        [(up.vllm_ascend_file("schedule_image_build_and_push.yaml").name, "suffix: 'a3'", "suffix: 'a3-ubuntu'")],
        lambda root, tmp: base_image_problems(root),
        "A3 build argument",
    ),
    "a3-soc-version-changes": Mutation(
        [(A3, 'ARG SOC_VERSION="ascend910_9391"', 'ARG SOC_VERSION="ascend910_9392"')],
        lambda root, tmp: variant_problems(root),
        "Dockerfile.a3's SOC_VERSION",
    ),
    "a2-soc-version-changes": Mutation(
        [(A2, 'ARG SOC_VERSION="ascend910b1"', 'ARG SOC_VERSION="ascend910b3"')],
        lambda root, tmp: variant_problems(root),
        "the A2 image's SOC_VERSION",
    ),
    "a3-recipe-differs": Mutation(
        [(A3, "'ray>=2.47.1,<=2.48.0'", "'ray>=2.49'")],
        lambda root, tmp: variant_problems(root),
        "not the same recipe",
    ),
    "cann-release-moves": Mutation(
        [(A2, "cann:8.5.1-910b", "cann:9.0.0-910b"), (A3, "cann:8.5.1-a3", "cann:9.0.0-a3")],
        lambda root, tmp: variant_problems(root),
        "names CANN 8.5.1",
        renames={CANN_A2: CANN_A2.replace("8.5.1", "9.0.0"), CANN_A3: CANN_A3.replace("8.5.1", "9.0.0")},
    ),
    "upstream-env-sets-a-variable-the-layer-sets": Mutation(
        [(A2, "    OMP_NUM_THREADS=1\n", "    OMP_NUM_THREADS=1 \\\n    HF_HOME=/root/.cache/huggingface\n")],
        lambda root, tmp: env_override_problems(cmd.image_env(), root),
        "vllm-ascend's Dockerfile sets HF_HOME",
    ),
    "torch-npu-built-for-a-newer-glibc": Mutation(
        [
            (
                f,
                "gitee7ba04-${PYTHON_TAG}-${PYTHON_TAG}-manylinux_2_28_",
                "gitee7ba04-${PYTHON_TAG}-${PYTHON_TAG}-manylinux_2_39_",
            )
            for f in (A2, A3)
        ],
        lambda root, tmp: outside_wheel_problems(root),
        "does not install on cp311",
    ),
    "cann-moves-its-python": Mutation(
        [(f, "python3.11.14", "python3.11.15") for f in (CANN_A2, CANN_A3)],
        lambda root, tmp: stand_in_problems(root),
        "the stand-in's Python is at",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_upstream_derived_checks_can_fail(tmp_path: Path, mutation: str) -> None:
    m = MUTATIONS[mutation]
    problems = m.check(m.apply(tmp_path), tmp_path)
    assert any(m.said in p for p in problems), problems
    # The unaltered files pass the same check.
    assert m.check(up.IMAGE_DATA, tmp_path / "unaltered") == []


# --- the build's own proof that the layer moved nothing ---------------------------------------------


def _fake_dist(site: Path, name: str, version: str, requires: tuple[str, ...] = ()) -> None:
    # A distribution written straight into site-packages: a fault injected on purpose.
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    lines = [
        "Metadata-Version: 2.1",
        f"Name: {name}",
        f"Version: {version}",
        *(f"Requires-Dist: {r}" for r in requires),
    ]
    (info / "METADATA").write_text("\n".join(lines) + "\n")
    (info / "RECORD").write_text("")


def test_check_base_unmoved_catches_a_moved_an_undeclared_and_a_broken_package(tmp_path: Path) -> None:
    import shutil
    import venv

    env = tmp_path / "base"
    venv.EnvBuilder(with_pip=True).create(env)
    python = str(env / "bin" / "python")
    site = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    )
    script = str(REPO / "docker" / "check-base-unmoved.py")
    _fake_dist(site, "upstream-pinned", "1.0")
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("declared-addition==2.0  # a comment\n")

    def check(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([python, script, *args], capture_output=True, text=True, cwd=tmp_path, check=False)

    assert check("snapshot", "base.json", "constraints.txt").returncode == 0
    assert "upstream-pinned==1.0" in (tmp_path / "constraints.txt").read_text().splitlines()
    _fake_dist(site, "declared-addition", "2.0")
    ok = check("compare", "base.json", str(reqs))
    assert ok.returncode == 0 and "base unmoved, pip check clean: True" in ok.stdout, ok.stderr
    # The first-hour checklist quotes this line (with the image's additions).
    line = next(x for x in ok.stdout.splitlines() if " added " in x)
    head, tail = line.split(" declared-addition==2.0")
    assert f"`{head} orjson==…, palmyra-serve==…, pydantic-settings==…{tail}`" in first_hour_text(), line
    # Moved: the base's package changed version.
    shutil.rmtree(site / "upstream_pinned-1.0.dist-info")
    _fake_dist(site, "upstream-pinned", "1.1")
    moved = check("compare", "base.json", str(reqs))
    assert moved.returncode == 1 and "moved: upstream-pinned 1.0 -> 1.1" in moved.stderr
    shutil.rmtree(site / "upstream_pinned-1.1.dist-info")
    _fake_dist(site, "upstream-pinned", "1.0")
    # Undeclared: something came in that the requirements file does not name.
    _fake_dist(site, "sneaked-in", "0.1")
    undeclared = check("compare", "base.json", str(reqs))
    assert undeclared.returncode == 1 and "added but not declared: sneaked-in 0.1" in undeclared.stderr
    shutil.rmtree(site / "sneaked_in-0.1.dist-info")
    # Broken: pip check reports a problem the base did not have.
    shutil.rmtree(site / "declared_addition-2.0.dist-info")
    _fake_dist(site, "declared-addition", "2.0", requires=("not-installed-anywhere>=1",))
    broken = check("compare", "base.json", str(reqs))
    assert (
        broken.returncode == 1
        and "new pip check problem" in broken.stderr
        and "not-installed-anywhere" in broken.stderr
    )
    # The project, installed --no-deps on purpose, may declare what the engine image lacks (the sidecar's stack).
    shutil.rmtree(site / "declared_addition-2.0.dist-info")
    _fake_dist(site, "declared-addition", "2.0")
    _fake_dist(site, "the-project", "0.1", requires=("sidecar-web-stack==9",))
    no_deps = check("compare", "base.json", str(reqs), "the-project")
    assert (
        no_deps.returncode == 0
        and "installed --no-deps, not checked: the-project 0.1 requires sidecar-web-stack" in no_deps.stdout
    )
