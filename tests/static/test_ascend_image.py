"""The Ascend engine image held against upstream's real sources, not against its own values.

- vllm-ascend v0.18.0's Python set (rebuilt from its and vLLM's source distributions on the
  package index, in upstream's install order) resolves for CPython 3.11 on manylinux x86_64 and
  aarch64 with the versions upstream pins; the wheels upstream takes from outside the index are
  named and what can be verified about them is; the project's additions resolve with that set
  without moving any of it (the build proves the same against the real base: check-base-unmoved).
- The command the launcher prints for the image's CMD (ascend_command.py; the rehearsal asserts
  the image prints this very line) is accepted by vLLM 0.18.0's own argument parser (its source on
  PYTHONPATH), as are the settings the docs recommend, which reach vLLM as meant; every `vllm:`
  metric the monitoring, alerts, autoscaler, router and sidecar use is defined in vLLM 0.18.0's
  source.
- The Dockerfile builds FROM the image upstream published for the release, and the entrypoint
  sources every script the CANN base's ENTRYPOINT sources.
Needs the package index (cached under ~/.cache/palmyra-serve-tests; a clear failure offline).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.tags import Tag
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import Version

from tests.static import ascend_command as cmd
from tests.static import ascend_upstream as up

pytestmark = pytest.mark.static


REPO = up.REPO
FACTS = up.FACTS
EXPECTED = FACTS["expected"]


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


# --- the Dockerfile against the release ---------------------------------------------------------


def test_dockerfile_builds_from_the_release_image_and_names_the_a3_variant() -> None:
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG VLLM_ASCEND_BASE=(\S+)$", text, re.MULTILINE)
    assert base and base.group(1) == FACTS["image"]["a2"]
    assert re.search(r"^FROM \$\{VLLM_ASCEND_BASE\} AS engine-ascend$", text, re.MULTILINE)
    assert f"VLLM_ASCEND_BASE={FACTS['image']['a3']}" in text, "the A3 build argument is documented"
    # The sdists this file checks are the release the image tag names.
    tag_version = FACTS["image"]["a2"].rsplit(":v", 1)[1]
    for name in ("vllm", "vllm-ascend"):
        root = up.sdist_root(name, FACTS["recipe"][name.replace("-", "_")]["version"])
        assert up.pkg_info(root)["Version"] == [tag_version], name


def test_sdists_are_the_tagged_sources_upstream_builds() -> None:
    # vllm-ascend's Dockerfile installs its git tag; the index's sdist must carry the same pins.
    ascend = up.sdist_root("vllm-ascend", FACTS["recipe"]["vllm_ascend"]["version"])
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
    # The release the Dockerfile's base names, and the vLLM its own Dockerfile clones.
    assert res.from_source.get("vllm") == EXPECTED["vllm"], report(res)
    assert res.from_source.get("vllm-ascend") == EXPECTED["vllm-ascend"], report(res)
    assert v["torch"] == EXPECTED["torch"], report(res)
    assert v["torch-npu"] == EXPECTED["torch-npu"], report(res)
    assert v["triton-ascend"] == EXPECTED["triton-ascend"], report(res)
    assert Version(v["fastapi"]) in SpecifierSet(EXPECTED["fastapi_bound"]), report(res)
    # Upstream's own choices survive the resolution: vllm-ascend's numpy<2 and opencv bound.
    assert Version(v["numpy"]) < Version("2"), report(res)
    assert "modelscope" in v, "upstream installs modelscope: the modelscope model source relies on it"


def test_wheels_from_outside_the_index_are_named_and_checked() -> None:
    """torch_npu and triton_ascend builds upstream installs from its own bucket, after vllm-ascend.

    What can be verified here without that bucket: the versions are not on the index (a recipe
    asking the index for them fails), each replaces the index pin vllm-ascend declares, upstream's
    filenames install on CPython 3.11 / manylinux (glibc 2.35) for both architectures, and the pin
    they replace exists on the index for both. Their contents are unverified without the files.
    """
    for wheel in FACTS["recipe"]["outside_the_index"]:
        name = wheel["name"]
        versions = set(up._versions(name))
        assert Version(wheel["version"]) not in versions, f"{name} {wheel['version']} is on the index now: use it"
        assert Version(wheel["replaces_pin"]) in versions
        assert EXPECTED[name] == wheel["replaces_pin"]
        # `pip check` in upstream's image reports these (check-base-unmoved tolerates the base's own).
        assert Version(wheel["version"]) not in SpecifierSet(f"=={wheel['replaces_pin']}")
        for arch, filename in wheel["files"].items():
            wname, wversion, _build, tags = parse_wheel_filename(filename)
            assert canonicalize_name(wname) == name and wversion.public == wheel["version"]
            assert any(t.interpreter == "cp311" and t.abi == "cp311" and _manylinux_ok(t, arch) for t in tags), filename
            assert any("cp311-cp311-" in f and arch in f for f in up.files_of(name, wheel["replaces_pin"])), (
                f"no cp311 {arch} wheel of {name} {wheel['replaces_pin']} on the index"
            )
        print(
            f"outside the index: {name} {wheel['version']} ({', '.join(wheel['files'].values())}) from {wheel['from']}"
        )


def _manylinux_ok(tag: Tag, arch: str) -> bool:
    m = re.fullmatch(r"manylinux_(\d+)_(\d+)_(\w+)", tag.platform)
    glibc = tuple(int(x) for x in FACTS["image"]["glibc"].split("."))
    return m is not None and m.group(3) == arch and (int(m.group(1)), int(m.group(2))) <= glibc


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
LAUNCHER_MODULES_ALL = ("settings.py", "logs.py", "engine/launcher.py", "model/resolve.py")
LAUNCHER_MODULES_TOP = ("__init__.py", "cli.py", "model/stand_in.py", "model/tokenizer.py")


def _imports(path: Path, nested: bool) -> set[str]:
    import ast

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

PARSE = r"""
import json, sys
import vllm, vllm.platforms
from vllm.platforms.cpu import CpuPlatform
vllm.platforms._current_platform = CpuPlatform()
from vllm.entrypoints.openai.cli_args import make_arg_parser
from PARSER_MODULE import FlexibleArgumentParser
results = {}
for key, argv in json.loads(sys.argv[1]).items():
    parser = make_arg_parser(FlexibleArgumentParser())
    try:
        args = parser.parse_args(argv)
        cc = args.compilation_config
        if isinstance(cc, dict):
            sizes = cc.get("cudagraph_capture_sizes")
        else:
            sizes = getattr(cc, "cudagraph_capture_sizes", None)
        results[key] = {"ok": True, "model": args.model, "served": args.served_model_name, "len": args.max_model_len,
                        "eager": args.enforce_eager, "capture_sizes": sizes,
                        "additional": getattr(args, "additional_config", None)}
    except SystemExit as exc:
        results[key] = {"ok": False, "code": exc.code}
print("PARSED " + json.dumps({"vllm": vllm.__file__, "results": results}))
"""
PLATFORMS = ("ascend", "cpu", "cuda")
UNKNOWN = "--no-such-flag-in-vllm"
# The operator settings the docs recommend for the engine (docs/ascend-troubleshooting.md, the ACL
# graph capture fix; docs/configuration.md), exactly as written there.
SETTING_DOCS = ("docs/ascend-troubleshooting.md", "docs/configuration.md")


def vllm_018_path() -> Path:
    return up.sdist_root("vllm", FACTS["recipe"]["vllm"]["version"])


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


def test_vllm_018_parser_refuses_a_flag_it_does_not_know(parsed: dict) -> None:
    assert parsed["results"]["unknown"] == {"ok": False, "code": 2}
    assert UNKNOWN in parsed["stderr"]


# --- (b) metric names in vLLM 0.18.0's source -----------------------------------------------------

SUFFIXES = ("_bucket", "_count", "_sum", "_total", "_created")


# Where vllm: names are read: what Prometheus, Grafana, KEDA and the router load (generated
# dashboards included), and the sidecar, which parses the engine's /metrics page itself
# (sidecar/upstream/capacity.py: vllm:cache_config_info for the admission ceiling).
METRIC_USERS = {"monitoring": {".yaml", ".yml", ".json"}, "k8s": {".yaml", ".yml", ".json"}, "service": {".py"}}


def used_metric_lines() -> dict[str, list[str]]:
    """Every vllm: metric name in monitoring/, k8s/ and service/, with the lines using it."""
    found: dict[str, list[str]] = {}
    for top, suffixes in METRIC_USERS.items():
        for path in (REPO / top).rglob("*"):
            # promtool's test inputs feed old names on purpose and are not queries.
            if not path.is_file() or path.suffix not in suffixes or "tests" in path.parts:
                continue
            for line in path.read_text(errors="ignore").splitlines():
                if line.lstrip().startswith("#"):
                    continue
                for name in re.findall(r"vllm:[a-zA-Z0-9_:]+", line):
                    found.setdefault(name, []).append(f"{path.relative_to(REPO)}: {line.strip()[:200]}")
    return found


def defined_in(root: Path) -> set[str]:
    names = set()
    for path in (root / "vllm").rglob("*.py"):
        names |= set(re.findall(r"[\"'](vllm:[a-zA-Z0-9_:]+)[\"']", path.read_text(errors="ignore")))
    return names


def base_name(name: str) -> str:
    for suffix in SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return name


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


def test_entrypoint_sources_every_script_the_cann_entrypoint_sources(tmp_path: Path) -> None:
    scripts = FACTS["cann_entrypoint_scripts"]
    log = _cann_layout(tmp_path, scripts)
    run = _entrypoint(tmp_path, "sh", "-c", "echo exec-pid $$")
    assert run.returncode == 0, run.stderr
    lines = log.read_text().splitlines()
    assert [line.split()[0] for line in lines] == scripts
    # Sourced in the entrypoint's own shell, which then exec'd the command (same pid).
    pids = {line.split()[1] for line in lines}
    assert pids == {run.stdout.split()[1]}
    # The README's first-hour checklist tells the operator to expect exactly these lines.
    said = [line.replace(str(tmp_path), "/usr/local/Ascend") for line in run.stderr.splitlines() if " sourced " in line]
    assert len(said) == len(scripts) and all(f"`{line}`" in readme_text() for line in said), said


def readme_text() -> str:
    return " ".join((REPO / "README.md").read_text().split())


def test_readme_quotes_the_launchers_start_line(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from palmyra_serve.engine import launcher

    monkeypatch.setattr(launcher, "supervise", lambda argv, env: 0)  # log the start line, run nothing
    caplog.set_level("INFO", logger=launcher.log.name)
    launcher.run(launcher.EngineCommand(argv=["vllm"], platform="ascend"))
    (start,) = [r.getMessage() for r in caplog.records if r.getMessage().endswith(": vllm")]
    assert f"`{start.removesuffix('vllm')}...`" in readme_text(), start


@pytest.mark.parametrize("dropped", range(3))
def test_entrypoint_refuses_to_start_when_a_cann_script_is_missing(tmp_path: Path, dropped: int) -> None:
    scripts = FACTS["cann_entrypoint_scripts"]
    log = _cann_layout(tmp_path, scripts)
    (tmp_path / scripts[dropped].removeprefix("/usr/local/Ascend/")).unlink()
    run = _entrypoint(tmp_path, "true")
    assert (
        run.returncode == 1
        and "missing" in run.stderr
        and scripts[dropped].removeprefix("/usr/local/Ascend/") in run.stderr
    )
    assert not log.exists(), "nothing may be sourced from an incomplete CANN"


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
    # The README's first-hour checklist quotes this line (with the image's additions).
    line = next(x for x in ok.stdout.splitlines() if " added " in x)
    head, tail = line.split(" declared-addition==2.0")
    assert f"`{head} orjson==…, palmyra-serve==…, pydantic-settings==…{tail}`" in readme_text(), line
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
