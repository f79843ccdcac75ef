"""vllm-ascend v0.18.0's Python set, rebuilt from upstream's own files on the package index.

Used by test_ascend_image.py. Everything comes from the index the user's tools use (pip's default,
or PALMYRA_TEST_INDEX_URL): vLLM's and vllm-ascend's source distributions (their requirement
lists, exactly what upstream's Dockerfile installs from, since it builds both from source), the
index's version lists, and a resolution by uv (`uv pip compile --python-platform`), which reads
wheel metadata by range requests instead of downloading wheels (pip's --dry-run downloads every
wheel it resolves: ~GBs per architecture). Downloads are cached under
~/.cache/palmyra-serve-tests. The recipe facts (install order, the wheels taken from outside the
index) are tests/static/ascend_upstream_v0.18.0.json, with their sources.

Which release: the one the Dockerfile's VLLM_ASCEND_BASE tag names (vllm-ascend's source
distribution of that version), and the vLLM tag that release's own Dockerfile clones. Changing the
image's base therefore changes what is resolved here.
"""

from __future__ import annotations

import ast
import hashlib
import json
import os
import re
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import InvalidVersion, Version

from tests.helpers.models import TEST_CACHE as CACHE

REPO = Path(__file__).resolve().parents[2]
FACTS = json.loads((Path(__file__).with_name("ascend_upstream_v0.18.0.json")).read_text())
BIN = Path(sys.executable).parent
ARCHES = ("x86_64", "aarch64")
# Ubuntu 22.04 (the CANN base) has glibc 2.35: wheels up to manylinux_2_35 install there.
PLATFORM = {"x86_64": "x86_64-manylinux_2_35", "aarch64": "aarch64-manylinux_2_35"}
PYTHON = FACTS["python"]["version"]


def index_url() -> str:
    """The index the user's pip would use: PALMYRA_TEST_INDEX_URL, else pip's own default."""
    if os.environ.get("PALMYRA_TEST_INDEX_URL"):
        return os.environ["PALMYRA_TEST_INDEX_URL"].rstrip("/")
    from pip._internal.models.index import PyPI  # pip's default, not restated here

    return PyPI.simple_url.rstrip("/")


def _ssl() -> ssl.SSLContext:
    cafile = os.environ.get("PIP_CERT") or os.environ.get("SSL_CERT_FILE")
    return ssl.create_default_context(cafile=cafile) if cafile else ssl.create_default_context()


def _get(url: str, accept: str | None = None, timeout: float = 60) -> bytes:
    req = urllib.request.Request(url, headers={"Accept": accept} if accept else {})
    try:
        with urllib.request.urlopen(req, context=_ssl(), timeout=timeout) as resp:
            return resp.read()
    except (urllib.error.URLError, OSError) as exc:
        pytest.fail(
            f"the package index is not reachable ({url}: {exc}). These checks resolve vllm-ascend's set against "
            "the real index: run them online, or point PALMYRA_TEST_INDEX_URL at a mirror.",
            pytrace=False,
        )


@cache
def project(name: str) -> dict:
    """The index's PEP 691 JSON page of a project (files, versions)."""
    raw = _get(f"{index_url()}/{canonicalize_name(name)}/", accept="application/vnd.pypi.simple.v1+json")
    return json.loads(raw)


def files_of(name: str, version: str) -> list[str]:
    out = []
    for f in project(name)["files"]:
        fn = f["filename"]
        if fn.endswith(".whl"):
            parts = fn.split("-")
            if parts[1] == version:
                out.append(fn)
        elif fn.endswith((".tar.gz", ".zip")) and fn[: -len(".tar.gz")].rsplit("-", 1)[-1] == version:
            out.append(fn)
    return out


def download(name: str, filename: str) -> Path:
    """A file from the index, sha256-checked, cached."""
    dest = CACHE / "index-files" / filename
    entry = next((f for f in project(name)["files"] if f["filename"] == filename), None)
    assert entry, f"{filename} is not on the index"
    want = entry["hashes"]["sha256"]
    if dest.exists() and hashlib.sha256(dest.read_bytes()).hexdigest() == want:
        return dest
    data = _get(entry["url"], timeout=600)
    assert hashlib.sha256(data).hexdigest() == want, f"{filename}: sha256 mismatch"
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.with_suffix(".part")
    tmp.write_bytes(data)
    tmp.replace(dest)
    return dest


def sdist_root(name: str, version: str) -> Path:
    """The unpacked source distribution (cached)."""
    (filename,) = [f for f in files_of(name, version) if f.endswith(".tar.gz")]
    root = CACHE / "sdist" / filename.removesuffix(".tar.gz")
    if not (root / "PKG-INFO").exists():
        with tarfile.open(download(name, filename)) as tar:
            tar.extractall(root.parent, filter="data")
    assert (root / "PKG-INFO").exists(), root
    return root


def pkg_info(root: Path) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for line in (root / "PKG-INFO").read_text().split("\n\n", 1)[0].splitlines():
        key, sep, value = line.partition(": ")
        if sep:
            out.setdefault(key, []).append(value)
    return out


def read_requirements(path: Path) -> list[str]:
    """A requirements file as setup.py reads it (following -r, dropping comments and options)."""
    out = []
    for raw in path.read_text().splitlines():
        line = raw.split(" #", 1)[0].split("#", 1)[0].strip() if not raw.startswith("#") else ""
        if not line:
            continue
        if line.startswith("-r "):
            out += read_requirements(path.parent / line.split()[1])
        elif not line.startswith("-"):
            out.append(line)
    return out


def setup_py_extra(root: Path, extra: str) -> list[str]:
    """One extra of setup(extras_require={...}) read from setup.py's syntax tree, not executed."""
    tree = ast.parse((root / "setup.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.keyword) and node.arg == "extras_require" and isinstance(node.value, ast.Dict):
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and key.value == extra:
                    return [ast.literal_eval(elt) for elt in value.elts]  # type: ignore[attr-defined]
    raise AssertionError(f"no extra {extra!r} in {root}/setup.py")


@dataclass
class Resolution:
    arch: str
    versions: dict[str, str]
    notes: list[str] = field(default_factory=list)
    requirements: list[str] = field(default_factory=list)
    # vLLM and vllm-ascend themselves: built from source in upstream's image (editable installs of
    # their git tags), so not resolved from the index; their versions are their sdists' PKG-INFO.
    from_source: dict[str, str] = field(default_factory=dict)


def release() -> tuple[str, str]:
    """(vllm-ascend, vLLM) versions of the image the Dockerfile builds FROM: the release its
    VLLM_ASCEND_BASE tag names (v<version>, or v<version>-a3), and the vLLM tag that release's own
    Dockerfile clones (ARG VLLM_TAG)."""
    text = (REPO / "Dockerfile").read_text()
    base = re.search(r"^ARG VLLM_ASCEND_BASE=\S+:v(\S+?)(-a3)?$", text, re.MULTILINE)
    assert base, "the Dockerfile has no ARG VLLM_ASCEND_BASE=<image>:v<version> default"
    ascend = base.group(1)
    upstream_dockerfile = (sdist_root("vllm-ascend", ascend) / "Dockerfile").read_text()
    tag = re.search(r"^ARG VLLM_TAG=v(\S+)$", upstream_dockerfile, re.MULTILINE)
    assert tag, f"vllm-ascend {ascend}'s Dockerfile names no ARG VLLM_TAG"
    return ascend, tag.group(1)


def _versions(name: str) -> list[Version]:
    out = []
    for v in project(name).get("versions", []):
        try:
            out.append(Version(v))
        except InvalidVersion:  # legacy, non-PEP 440 releases: no resolver picks them
            continue
    return out


def _specifiers_disjoint(name: str, a: Requirement, b: Requirement) -> bool:
    versions = _versions(name)
    return not any(
        a.specifier.contains(v, prereleases=False) and b.specifier.contains(v, prereleases=False) for v in versions
    )


@cache
def upstream_requirements() -> tuple[tuple[str, ...], tuple[str, ...], tuple[tuple[str, str], ...]]:
    """What upstream's Dockerfile asks pip for, in one list, the notes on how it was built, and the
    versions of vLLM and vllm-ascend it builds from source.

    vLLM: requirements/common.txt (VLLM_TARGET_DEVICE=empty) + the audio extra; vllm-ascend: its
    requirements.txt (its setup.py's install_requires), installed after vLLM, so where both pin a
    package disjointly, vllm-ascend's wins as in pip's sequential installs; then the later installs.
    """
    recipe = FACTS["recipe"]
    ascend_version, vllm_version = release()
    vllm = sdist_root("vllm", vllm_version)
    ascend = sdist_root("vllm-ascend", ascend_version)
    built = (("vllm", pkg_info(vllm)["Version"][0]), ("vllm-ascend", pkg_info(ascend)["Version"][0]))
    notes = [
        f"vllm {built[0][1]}, vllm-ascend {built[1][1]}: built from their source distributions, as upstream "
        "builds its git tags; their requirement lists are what is resolved"
    ]
    vllm_reqs = read_requirements(vllm / "requirements" / "common.txt") + setup_py_extra(vllm, "audio")
    ascend_reqs = read_requirements(ascend / "requirements.txt")
    by_name = {canonicalize_name(Requirement(r).name): Requirement(r) for r in ascend_reqs}
    kept = []
    for line in vllm_reqs:
        req = Requirement(line)
        later = by_name.get(canonicalize_name(req.name))
        if later is not None and _specifiers_disjoint(req.name, req, later):
            notes.append(
                f"upstream's own conflict: vllm {built[0][1]} wants {req}, vllm-ascend pins {later} "
                "and is installed later, so it wins (pip check in upstream's image reports this)"
            )
            continue
        kept.append(line)
    resolved_ascend = []
    for line in ascend_reqs:
        req = Requirement(line)
        pinned = [s.version for s in req.specifier if s.operator == "=="]
        if pinned and not [f for f in files_of(req.name, pinned[0]) if f.endswith(".whl")]:
            # Built from its source distribution in upstream's image: resolve what it declares.
            meta = pkg_info(sdist_root(req.name, pinned[0]))
            assert "Requires-Dist" not in meta.get("Dynamic", []), f"{req}: dependencies computed at build time"
            base = [r for r in meta.get("Requires-Dist", []) if "extra ==" not in r]
            notes.append(
                f"{req}: source distribution only on the index; "
                f"its static metadata declares {base or 'no dependencies'}"
            )
            resolved_ascend += base
            continue
        resolved_ascend.append(line)
    return tuple(kept + resolved_ascend + list(recipe["later"])), tuple(notes), built


def uv() -> str:
    path = BIN / "uv"
    assert path.exists(), "uv missing from the venv: pip install -r tests/requirements-tools.txt"
    return str(path)


def _torch_cpu_index() -> str | None:
    """PyTorch's CPU index as the Dockerfile names it, when it answers (it does not on every machine)."""
    text = (REPO / "Dockerfile").read_text()
    match = re.search(r"^ARG TORCH_CPU_INDEX_URL=(\S+)", text, re.MULTILINE)
    if not match:
        return None
    probe = subprocess.run(
        [sys.executable, str(REPO / "docker" / "index-reachable.py"), match.group(1)],
        capture_output=True,
        text=True,
        check=False,
    )
    return match.group(1) if probe.returncode == 0 else None


def compile_set(
    arch: str,
    requirements: list[str],
    constraints: list[str] | None = None,
    overrides: list[str] | None = None,
    extra_index: str | None = None,
) -> dict[str, str]:
    work = CACHE / "uv-work" / arch
    work.mkdir(parents=True, exist_ok=True)
    (work / "requirements.txt").write_text("\n".join(requirements) + "\n")
    cmd = [
        uv(),
        "pip",
        "compile",
        str(work / "requirements.txt"),
        "--python-platform",
        PLATFORM[arch],
        "--python-version",
        PYTHON,
        "--only-binary",
        ":all:",
        "--no-header",
        "--no-annotate",
        "--quiet",
        "--default-index",
        index_url(),
    ]
    for flag, lines, name in (("-c", constraints, "constraints.txt"), ("--override", overrides, "overrides.txt")):
        if lines:
            (work / name).write_text("\n".join(lines) + "\n")
            cmd += [flag, str(work / name)]
    if extra_index:
        # pip (upstream's installer) takes the best version across indexes: so does this.
        cmd += ["--extra-index-url", extra_index, "--index-strategy", "unsafe-best-match"]
    env = {**os.environ, "UV_NO_CONFIG": "1", "UV_CACHE_DIR": str(CACHE / "uv")}
    cafile = os.environ.get("PIP_CERT")
    if cafile:
        env.setdefault("SSL_CERT_FILE", cafile)
    run = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600, check=False)
    if run.returncode != 0:
        raise ResolutionFailed(f"uv pip compile for {arch} failed:\n{run.stderr[-4000:]}")
    out: dict[str, str] = {}
    for line in run.stdout.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            out[canonicalize_name(name)] = version.split(";")[0].strip()
    return out


class ResolutionFailed(AssertionError):
    pass


@cache
def upstream_set(arch: str) -> Resolution:
    requirements, upstream_notes, built = upstream_requirements()
    notes = list(upstream_notes)
    torch_pin = next(r for r in requirements if canonicalize_name(Requirement(r).name) == "torch")
    overrides = None
    extra = _torch_cpu_index() if arch == "x86_64" else None
    if arch == "x86_64" and extra is None:
        # torch-npu's x86_64 wheel pins torch==<v>+cpu, which only PyTorch's CPU index serves
        # (upstream passes it with --extra-index). Unreachable here: resolve the same release's
        # index build instead, and say so: its nvidia-* and triton requirements are not upstream's.
        overrides = [torch_pin]
        notes.append(
            f"x86_64: torch-npu pins a +cpu torch from PyTorch's CPU index, unreachable here; resolved with "
            f"the override {torch_pin} "
            "(the index's build of that release; its nvidia-*/triton are not in upstream's image)"
        )
    versions = compile_set(arch, list(requirements), overrides=overrides, extra_index=extra)
    notes.append(
        f"{arch}: resolved without Huawei's Ascend pip repository, which upstream's vllm-ascend step adds as an "
        "extra index (see recipe._resolution_here in the facts)"
    )
    from_source = dict(built)
    wheels = [f for f in files_of("vllm-ascend", from_source["vllm-ascend"]) if f.endswith(".whl")]
    has = any("cp311-cp311-" in f and f.endswith(f"_{arch}.whl") for f in wheels)
    notes.append(
        f"{arch}: the index {'has' if has else 'has no'} a cp311 vllm-ascend wheel; "
        "upstream's image builds it from source anyway"
    )
    return Resolution(arch, versions, notes, list(requirements), from_source)


def additions() -> list[str]:
    path = REPO / "docker" / "engine-ascend-requirements.txt"
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines() if line.split("#", 1)[0].strip()]
