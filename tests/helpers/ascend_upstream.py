"""vllm-ascend v0.18.0's image, read from upstream's own files, and its Python set, rebuilt from
upstream's own files on the package index.

Used by test_ascend_image.py and test_ascend_deploy.py (and tests/container/test_ascend_rehearsal.py,
through FACTS).

What upstream's images ARE comes from the files vendored unmodified in tests/data/ascend-image/
(sources, commits, licenses and sha256 in tests/data/README.md), parsed here, never restated:

- vllm-ascend v0.18.0's Dockerfile and Dockerfile.a3: the CANN base each builds FROM, SOC_VERSION,
  the ENV the image sets, the vLLM tag it clones and the extra it installs, the extra indexes, the
  torch_npu / triton_ascend wheels it takes from its own bucket, the later installs, WORKDIR, CMD;
- its image workflow (schedule_image_build_and_push.yaml): the Dockerfiles and their tag suffixes
  (the workflow it calls names the package index's host, so the registry image, the platforms and
  the suffix's prefix are restated in the JSON, with their source);
- CANN 8.5.1's 910b and a3 Dockerfiles (Ascend/cann-container-image): the scripts the ENTRYPOINT
  sources, the Python prefix, the OS, the ENV, the TARGETPLATFORM -> architecture mapping;
- MindCluster's ascend-for-volcano constants, Ascend Docker Runtime's installer constants and the
  `ascend` RuntimeClass of HAMi's ascend-device-plugin (the deployment checks read those).

Every parser takes the folder it reads (default: the vendored one), so a check can be run against a
deliberately altered copy and shown to fail. tests/helpers/ascend_upstream_v0.18.0.json keeps only
what no vendored file states (its `_about` says why each entry is there).

The Python set: everything comes from the index the user's tools use (pip's default, or
PALMYRA_TEST_INDEX_URL): vLLM's and vllm-ascend's source distributions (their requirement lists,
exactly what upstream's Dockerfile installs from, since it builds both from source), the index's
version lists, and a resolution by uv (`uv pip compile --python-platform`), which reads wheel
metadata by range requests instead of downloading wheels (pip's --dry-run downloads every wheel it
resolves: ~GBs per architecture). Downloads are cached under ~/.cache/palmyra-serve-tests.

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
import shlex
import ssl
import subprocess
import sys
import tarfile
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename
from packaging.version import InvalidVersion, Version

from tests.helpers.models import TEST_CACHE as CACHE

REPO = Path(__file__).resolve().parents[2]
# What no vendored file states (see its _about).
JSON_FACTS: dict[str, Any] = json.loads((Path(__file__).with_name("ascend_upstream_v0.18.0.json")).read_text())
IMAGE_DATA = REPO / "tests" / "data" / "ascend-image"
# The vllm-ascend git tag the vendored files were taken at (the published images' {{raw}} tag).
RELEASE: str = JSON_FACTS["sources"]["vllm_ascend"]["tag"]
# The two upstream Dockerfiles the project builds FROM the images of: Ubuntu, Atlas A2 and Atlas A3
# (the workflow publishes openEuler and 310P variants too; the project uses none of them).
VARIANTS = ("Dockerfile", "Dockerfile.a3")
BIN = Path(sys.executable).parent


# --- Dockerfiles ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Instruction:
    keyword: str
    value: str


@dataclass
class Stage:
    base: str
    name: str | None
    body: list[Instruction]
    global_args: dict[str, str | None]

    def values(self, keyword: str) -> list[str]:
        return [i.value for i in self.body if i.keyword == keyword]

    def last(self, keyword: str) -> str:
        found = self.values(keyword)
        assert found, f"stage FROM {self.base}: no {keyword}"
        return found[-1]

    def args(self) -> dict[str, str | None]:
        """ARG defaults in effect in the stage (a global ARG re-declared without a value keeps its default)."""
        out: dict[str, str | None] = {}
        for value in self.values("ARG"):
            for word in shlex.split(value):
                name, sep, default = word.partition("=")
                out[name] = default if sep else self.global_args.get(name)
        return out

    def env(self) -> dict[str, str]:
        """ENV as the image has it: `K=V ...` and `K V` forms, $X / ${X} expanded from the ARG
        defaults and earlier ENV (names it does not know, such as the base's ${PATH}, stay)."""
        scope: dict[str, str] = {k: v for k, v in self.args().items() if v is not None}
        env: dict[str, str] = {}
        for value in self.values("ENV"):
            words = shlex.split(value)
            pairs = (
                [w.partition("=")[::2] for w in words]
                if "=" in words[0]
                else [(words[0], value.split(None, 1)[1] if len(words) > 1 else "")]
            )
            for key, raw in pairs:
                env[key] = scope[key] = expand(raw, scope)
        return env


def expand(value: str, scope: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: scope.get(m.group(1) or m.group(2), m.group(0)), value)


def instructions(text: str) -> list[Instruction]:
    """A Dockerfile's instructions: comment and blank lines dropped (also inside continuations),
    `\\` continuations joined as the builder joins them."""
    out, pending = [], ""
    for line in text.splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        continued = re.search(r"\\[ \t]*$", line)
        pending += line[: continued.start()] if continued else line
        if continued:
            continue
        keyword, _, value = pending.strip().partition(" ")
        out.append(Instruction(keyword.upper(), value.strip()))
        pending = ""
    assert not pending, "the Dockerfile ends inside a continuation"
    return out


def stages(path: Path) -> list[Stage]:
    """The stages of a Dockerfile, their FROM image expanded with the global ARG defaults."""
    found: list[Stage] = []
    global_args: dict[str, str | None] = {}
    for ins in instructions(path.read_text(encoding="utf-8")):
        if ins.keyword == "FROM":
            words = ins.value.split()
            base = expand(words[0], {k: v for k, v in global_args.items() if v is not None})
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            found.append(Stage(base, name, [], global_args))
        elif found:
            found[-1].body.append(ins)
        elif ins.keyword == "ARG":
            for word in shlex.split(ins.value):
                key, sep, default = word.partition("=")
                global_args[key] = default if sep else None
    assert found, f"{path}: no FROM"
    return found


def final_stage(path: Path) -> Stage:
    return stages(path)[-1]


def exec_form(value: str) -> list[str]:
    words = json.loads(value)
    assert isinstance(words, list) and all(isinstance(w, str) for w in words), value
    return words


def vllm_ascend_file(name: str, root: Path = IMAGE_DATA) -> Path:
    """A vendored file of vllm-ascend's release (Dockerfile, Dockerfile.a3, a workflow)."""
    return root / f"vllm-ascend-{RELEASE}-{name}"


def cann_dockerfile(tag: str, root: Path = IMAGE_DATA) -> Path:
    """The vendored Dockerfile of Ascend/cann-container-image's cann/<tag>/ (the image quay.io/ascend/cann:<tag>)."""
    path = root / f"cann-{tag}-Dockerfile"
    assert path.exists(), f"no vendored CANN Dockerfile for the base tag {tag} (tests/data/ascend-image/)"
    return path


@dataclass(frozen=True)
class Wheel:
    name: str
    version: str
    filename: str
    url: str


@dataclass(frozen=True)
class Variant:
    """What one of vllm-ascend's Dockerfiles says (one published image)."""

    dockerfile: str
    cann_base: str
    cann_tag: str
    env: dict[str, str]
    runs: tuple[str, ...]
    vllm_tag: str
    workdir: str
    cmd: tuple[str, ...]


def variant(dockerfile: str = "Dockerfile", root: Path = IMAGE_DATA) -> Variant:
    (stage,) = stages(vllm_ascend_file(dockerfile, root))
    tag = stage.base.rpartition(":")[2]
    vllm_tag = stage.args().get("VLLM_TAG")
    assert vllm_tag, f"{dockerfile}: no ARG VLLM_TAG"
    return Variant(
        dockerfile=dockerfile,
        cann_base=stage.base,
        cann_tag=tag,
        env=stage.env(),
        runs=tuple(stage.values("RUN")),
        vllm_tag=vllm_tag,
        workdir=stage.last("WORKDIR"),
        cmd=tuple(exec_form(stage.last("CMD"))),
    )


def vllm_version(root: Path = IMAGE_DATA) -> str:
    """The vLLM release upstream's Dockerfile clones (ARG VLLM_TAG=v<version>)."""
    return variant("Dockerfile", root).vllm_tag.removeprefix("v")


def vllm_ascend_version() -> str:
    return RELEASE.removeprefix("v")


def _install_run(v: Variant, marker: str) -> str:
    found = [r for r in v.runs if marker in r]
    assert len(found) == 1, f"{v.dockerfile}: {len(found)} RUN lines with {marker!r}"
    return found[0]


def vllm_extra(root: Path = IMAGE_DATA) -> str:
    """The extra of vLLM's editable install (`pip install -e /vllm-workspace/vllm/[<extra>]`)."""
    run = _install_run(variant("Dockerfile", root), "/vllm-workspace/vllm/[")
    match = re.search(r"VLLM_TARGET_DEVICE=\"?empty\"?\s.*-e /vllm-workspace/vllm/\[(\w+)\]", run)
    assert match, run
    return match.group(1)


def extra_indexes(root: Path = IMAGE_DATA) -> tuple[str, str]:
    """(PyTorch's CPU index passed with --extra-index, the PIP_EXTRA_INDEX_URL exported) of the
    vllm-ascend install step."""
    run = _install_run(variant("Dockerfile", root), "-e /vllm-workspace/vllm-ascend/")
    torch_cpu = re.search(r"-e /vllm-workspace/vllm-ascend/\s+--extra-index\s+(\S+)", run)
    huawei = re.search(r"export PIP_EXTRA_INDEX_URL=(\S+)", run)
    assert torch_cpu and huawei, run
    return torch_cpu.group(1), huawei.group(1)


def later_installs(root: Path = IMAGE_DATA) -> list[str]:
    """What upstream installs after vllm-ascend and its wheels (the one plain `pip install` RUN)."""
    run = _install_run(variant("Dockerfile", root), "python3 -m pip install modelscope")
    words = shlex.split(run.split("&&")[0])
    assert words[:4] == ["python3", "-m", "pip", "install"], words
    return words[4:]


def outside_wheels(dockerfile: str = "Dockerfile", root: Path = IMAGE_DATA) -> dict[str, dict[str, Wheel]]:
    """The torch_npu and triton_ascend wheels the vllm-ascend step installs from upstream's bucket,
    per distribution and architecture, for the CANN base's Python (PYTHON_TAG)."""
    v = variant(dockerfile, root)
    run = _install_run(v, "PTA_WHEEL=")
    python_tag = "cp" + python_version(cann_dockerfile(v.cann_tag, root)).replace(".", "")
    triton = re.search(r'TRITON_ASCEND_WHEEL="([^"]+)"', run)
    assert triton, run
    pta = {
        arch: name
        for tag, arch, name in re.findall(
            r'\[ "\$PYTHON_TAG" = "(\w+)" \] && \[ "\$ARCH" = "(\w+)" \]; then PTA_WHEEL="([^"]+)"', run
        )
        if tag == python_tag
    }
    urls = re.findall(r'python3 -m pip install "(https://[^"]+)/\$\{(\w+)\}"', run)
    assert {u[1] for u in urls} == {"TRITON_ASCEND_WHEEL", "PTA_WHEEL"}, urls
    base = {var: url for url, var in urls}
    out: dict[str, dict[str, Wheel]] = {}
    for var, templates in (("TRITON_ASCEND_WHEEL", dict.fromkeys(pta, triton.group(1))), ("PTA_WHEEL", pta)):
        for arch, template in templates.items():
            filename = urllib.parse.unquote(template.replace("${PYTHON_TAG}", python_tag).replace("${ARCH}", arch))
            name, version, _build, _tags = parse_wheel_filename(filename)
            url = f"{base[var]}/{template.replace('${PYTHON_TAG}', python_tag).replace('${ARCH}', arch)}"
            out.setdefault(canonicalize_name(name), {})[arch] = Wheel(
                canonicalize_name(name), str(version), filename, url
            )
    return out


# --- CANN's Dockerfiles -------------------------------------------------------------------------------


def cann_entrypoint_scripts(path: Path) -> list[str]:
    """The scripts CANN's ENTRYPOINT (`bash -c 'source A && source B && ... && exec "$@"' --`) sources, in order."""
    entrypoint = exec_form(final_stage(path).last("ENTRYPOINT"))
    assert entrypoint[:2] == ["/bin/bash", "-c"] and entrypoint[3:] == ["--"], entrypoint
    steps = [" ".join(step.split()) for step in entrypoint[2].split("&&")]
    assert steps[-1] == 'exec "$@"', entrypoint
    assert all(step.startswith("source ") for step in steps[:-1]), entrypoint
    return [step.removeprefix("source ") for step in steps[:-1]]


def python_prefix(path: Path) -> str:
    """Where the CANN base's CPython lives: the /usr/local/python<x.y.z>/bin its final stage's ENV puts on PATH."""
    entries = final_stage(path).env()["PATH"].split(":")
    (bin_dir,) = [e for e in entries if re.fullmatch(r"/usr/local/python\d+\.\d+\.\d+/bin", e)]
    return bin_dir.removesuffix("/bin")


def python_version(path: Path) -> str:
    """major.minor of the CANN base's CPython (from its prefix, /usr/local/python<x.y.z>)."""
    match = re.fullmatch(r"/usr/local/python(\d+\.\d+)\.\d+", python_prefix(path))
    assert match
    return match.group(1)


def cann_os(path: Path) -> str:
    """The image the CANN base's final stage is FROM (ubuntu:22.04)."""
    return final_stage(path).base


def target_architectures(path: Path) -> dict[str, str]:
    """CANN's TARGETPLATFORM -> architecture mapping (its `case "${TARGETPLATFORM}"` in the download step)."""
    for stage in stages(path):
        for run in stage.values("RUN"):
            if "TARGETPLATFORM" in run:
                found = dict(re.findall(r'"(linux/\w+)"\) echo "(\w+)"', run))
                if found:
                    return found
    raise AssertionError(f"{path}: no TARGETPLATFORM mapping")


# --- vllm-ascend's image workflow ---------------------------------------------------------------------


@dataclass(frozen=True)
class Published:
    images: dict[str, str]  # Dockerfile -> the image the release's tag publishes from it
    platforms: tuple[str, ...]


def published(root: Path = IMAGE_DATA) -> Published:
    """What vllm-ascend's image workflow publishes for the release tag: per Dockerfile of its
    matrix (schedule_image_build_and_push.yaml, vendored), the registry image with the pep440
    `{{raw}}` tag (the git tag as pushed) plus "-" and the matrix's suffix; the platforms each image
    is built for. The called workflow that holds the image name, the platforms and the suffix's
    prefix is not vendored (it names the package index's host): those three come from the JSON's
    `image_workflow`, with their source."""
    caller = yaml.safe_load(vllm_ascend_file("schedule_image_build_and_push.yaml", root).read_text(encoding="utf-8"))
    job = caller["jobs"]["image_build"]
    assert job["uses"].rsplit("/", 1)[1] == JSON_FACTS["image_workflow"]["file"].rsplit("/", 1)[1], job["uses"]
    assert job["with"]["dockerfile"] == "${{ matrix.build_meta.dockerfile }}", job["with"]
    assert job["with"]["suffix"] == "${{ matrix.build_meta.suffix }}", job["with"]
    facts = JSON_FACTS["image_workflow"]
    images = {}
    for entry in job["strategy"]["matrix"]["build_meta"]:
        suffix = f"{facts['suffix_prefix']}{entry['suffix']}" if entry["suffix"] else ""
        images[entry["dockerfile"]] = f"{facts['image']}:{RELEASE}{suffix}"
    return Published(images, tuple(facts["platforms"]))


def architectures(root: Path = IMAGE_DATA) -> tuple[str, ...]:
    """The workflow's platforms as the CANN base names their architectures (x86_64, aarch64)."""
    mapping = target_architectures(cann_dockerfile(variant("Dockerfile", root).cann_tag, root))
    return tuple(mapping[p] for p in published(root).platforms)


# --- MindCluster and HAMi's ascend-device-plugin ----------------------------------------------------------


def go_string_constants(path: Path) -> dict[str, str]:
    """The string constants of a Go file's `const ( ... )` blocks (NAME = "value")."""
    text = path.read_text(encoding="utf-8")
    out: dict[str, str] = {}
    for block in re.findall(r"^const \($(.*?)^\)$", text, re.MULTILINE | re.DOTALL):
        for name, value in re.findall(r'^\s*([A-Za-z_]\w*)\s*=\s*"((?:[^"\\]|\\.)*)"', block, re.MULTILINE):
            assert name not in out, f"{path.name}: {name} twice"
            out[name] = value
    return out


def volcano_constants(root: Path = IMAGE_DATA) -> dict[str, str]:
    """ascend-for-volcano's common/util constants (constants.go and type.go), MindCluster v7.3.0."""
    found: dict[str, str] = {}
    for name in ("constants.go.txt", "type.go.txt"):
        for key, value in go_string_constants(root / f"mindcluster-v7.3.0-ascend-for-volcano-{name}").items():
            assert key not in found, key
            found[key] = value
    return found


def ascend_docker_runtime_name(root: Path = IMAGE_DATA) -> str:
    """The runtime Ascend Docker Runtime's installer (MindCluster v26.1.0) adds to containerd's CRI
    runtimes on `add`: the name its editContainerdConfig passes to addRuntime, a constant of
    constant.go. (Up to v26.0.1 the installer rewrote runc's BinaryName instead: no such runtime.)"""
    consts = go_string_constants(root / "mindcluster-v26.1.0-ascend-docker-runtime-constant.go.txt")
    source = (root / "mindcluster-v26.1.0-ascend-docker-runtime-containerd_process.go.txt").read_text("utf-8")
    added = re.search(r"if arg\.action == addCommand \{[^}]*?addRuntime\((\w+),", source, re.DOTALL)
    assert added, "containerd_process.go: no addRuntime(<name>, ...) on add"
    return consts[added.group(1)]


def ascend_runtime_class(root: Path = IMAGE_DATA) -> dict[str, Any]:
    """HAMi's ascend-device-plugin's RuntimeClass (what its docs tell operators to apply)."""
    text = (root / "hami-ascend-device-plugin-v1.4.0-ascend-runtimeclass.yaml").read_text("utf-8")
    doc = yaml.safe_load(text)
    assert doc["apiVersion"] == "node.k8s.io/v1" and doc["kind"] == "RuntimeClass", doc
    # The file says `handler:` twice (YAML keeps the last): both must agree.
    assert set(re.findall(r"^handler:\s*(\S+)\s*$", text, re.MULTILINE)) == {doc["handler"]}, text
    return doc


# --- derived facts, for the checks that read FACTS -------------------------------------------------------

_CANN = cann_dockerfile(variant("Dockerfile").cann_tag)
ARCHES = architectures()
# The CANN base's OS decides the glibc wheels must fit (the JSON keys glibc by that image).
GLIBC: str = JSON_FACTS["glibc"][cann_os(_CANN)]
PLATFORM = {arch: f"{arch}-manylinux_{GLIBC.replace('.', '_')}" for arch in ARCHES}
PYTHON = python_version(_CANN)
# tests/container/test_ascend_rehearsal.py reads these two from FACTS; both are derived here.
FACTS: dict[str, Any] = {
    **JSON_FACTS,
    "cann_entrypoint_scripts": cann_entrypoint_scripts(_CANN),
    "python": {"version": PYTHON, "prefix": python_prefix(_CANN)},
}


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

    vLLM: requirements/common.txt (VLLM_TARGET_DEVICE=empty) + the extra upstream's Dockerfile names
    ([audio]); vllm-ascend: its requirements.txt (its setup.py's install_requires), installed after
    vLLM, so where both pin a package disjointly, vllm-ascend's wins as in pip's sequential installs;
    then the later installs of upstream's Dockerfile.
    """
    ascend_version, vllm_version = release()
    vllm = sdist_root("vllm", vllm_version)
    ascend = sdist_root("vllm-ascend", ascend_version)
    built = (("vllm", pkg_info(vllm)["Version"][0]), ("vllm-ascend", pkg_info(ascend)["Version"][0]))
    notes = [
        f"vllm {built[0][1]}, vllm-ascend {built[1][1]}: built from their source distributions, as upstream "
        "builds its git tags; their requirement lists are what is resolved"
    ]
    vllm_reqs = read_requirements(vllm / "requirements" / "common.txt") + setup_py_extra(vllm, vllm_extra())
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
    return tuple(kept + resolved_ascend + later_installs()), tuple(notes), built


def uv() -> str:
    path = BIN / "uv"
    assert path.exists(), "uv missing from the venv: pip install -r tests/requirements-tools.txt"
    return str(path)


def _torch_cpu_index() -> str | None:
    """PyTorch's CPU index as upstream's vllm-ascend step passes it (--extra-index), when it answers
    (it does not on every machine)."""
    url = extra_indexes()[0]
    probe = subprocess.run(
        [sys.executable, str(REPO / "docker" / "index-reachable.py"), url],
        capture_output=True,
        text=True,
        check=False,
    )
    return url if probe.returncode == 0 else None


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
        f"{arch}: resolved without Huawei's Ascend pip repository ({extra_indexes()[1]}), which upstream's "
        "vllm-ascend step adds as an extra index (see `resolution` in the facts)"
    )
    from_source = dict(built)
    wheels = [f for f in files_of("vllm-ascend", from_source["vllm-ascend"]) if f.endswith(".whl")]
    cp = "cp" + PYTHON.replace(".", "")
    has = any(f"{cp}-{cp}-" in f and f.endswith(f"_{arch}.whl") for f in wheels)
    notes.append(
        f"{arch}: the index {'has' if has else 'has no'} a {cp} vllm-ascend wheel; "
        "upstream's image builds it from source anyway"
    )
    return Resolution(arch, versions, notes, list(requirements), from_source)


def additions() -> list[str]:
    path = REPO / "docker" / "engine-ascend-requirements.txt"
    return [line.split("#", 1)[0].strip() for line in path.read_text().splitlines() if line.split("#", 1)[0].strip()]
