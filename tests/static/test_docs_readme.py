"""Every command a reader copies from README.md names things that exist.

Commands are taken from the README's fenced shell blocks (```sh, ```bash, ```shell, ```console;
in a block that uses `$ ` prompts only the prompted lines). Those starting with `palmyra-serve`,
`./bootstrap.sh`, `./test.sh`, `curl`, `docker`, `kubectl` or `podman` are checked against the
thing they call:
- palmyra-serve: parsed by the real `build_parser()` (so every subcommand and flag exists);
- ./bootstrap.sh, ./test.sh: the words each script accepts, read from its own usage error;
- curl: the URL's port is a known service and its path a route that service serves; a JSON body
  parses, and a generation request names the served model;
- docker compose / docker build / podman build: env files, compose files, profiles, services and
  Dockerfile targets exist;
- kubectl: kustomize directories and files exist; deployment and container names are the manifests'.
Any repository path in any command must exist.
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import shlex
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from palmyra_serve import SERVED_MODEL_NAME
from palmyra_serve.cli import build_parser
from palmyra_serve.settings import Settings
from tests.helpers import doc_blocks

REPO = Path(__file__).resolve().parents[2]
READMES = doc_blocks.doc_files()  # every page a reader follows
SHELL_LANGS = {"sh", "bash", "shell", "console"}
CHECKED = ("palmyra-serve", "./bootstrap.sh", "./test.sh", "curl", "docker", "kubectl", "podman")
OPERATORS = {"|", "||", "&&", ";", "&", "(", ")", "|&", ";;"}
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")
# Top-level repository entries a command may name; any such path must exist.
TRACKED_ROOTS = (
    "k8s/",
    "compose/",
    "scripts/",
    "docker/",
    "monitoring/",
    "healthchecks/",
    "docs/",
    "tests/",
    "service/",
    "benchmarks/",
    "./scripts/",
    "./benchmarks/",
)
GENERATION_PATHS = {"/v1/completions", "/v1/chat/completions"}


# --- extraction -------------------------------------------------------------------------------


def shell_lines(markdown: str) -> list[str]:
    lines: list[str] = []
    for block in doc_blocks.parse(markdown, REPO / "page.md"):
        if block.lang.lower() not in SHELL_LANGS:
            continue
        raw = block.text.splitlines()
        prompted = any(line.startswith("$ ") for line in raw)
        logical, buf = [], ""
        for line in raw:
            if prompted and not buf:
                if not line.startswith("$ "):
                    continue  # output shown after a prompt
                line = line[2:]
            if line.rstrip().endswith("\\"):
                buf += line.rstrip()[:-1] + " "
                continue
            logical.append(buf + line)
            buf = ""
        lines += [line for line in logical if line.strip()]
    return lines


def simple_commands(line: str) -> list[list[str]]:
    """Split one shell line into simple commands (argv lists), dropping comments and operators."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    tokens = list(lexer)
    commands: list[list[str]] = []
    current: list[str] = []
    for token in tokens:
        if token in OPERATORS:
            if current:
                commands.append(current)
            current = []
        else:
            current.append(token)
    if current:
        commands.append(current)
    out = []
    for argv in commands:
        while argv and (ASSIGNMENT.match(argv[0]) or argv[0] in ("sudo", "env", "exec", "time")):
            argv = argv[1:]
        if argv:
            out.append(argv)
    return out


def program(argv: list[str]) -> str | None:
    head = argv[0]
    if head.endswith("/palmyra-serve") or head == "palmyra-serve":
        return "palmyra-serve"
    return head if head in CHECKED else None


def readme_commands() -> list[tuple[str, list[str]]]:
    found = []
    for readme in READMES:
        for line in shell_lines(readme.read_text(encoding="utf-8")):
            for argv in simple_commands(line):
                if program(argv):
                    found.append((readme.relative_to(REPO).as_posix(), argv))
    return found


# --- what exists ------------------------------------------------------------------------------


def script_words(script: str, bogus_arg: str, pattern: str) -> set[str]:
    """The words a script accepts, read from the usage error it prints for a bogus word (exit 2).

    Both scripts check their arguments before installing or running anything."""
    out = subprocess.run([str(REPO / script), bogus_arg], capture_output=True, text=True, timeout=30, cwd=REPO)
    assert out.returncode == 2, (script, out.returncode, out.stderr)
    match = re.search(pattern, out.stderr)
    assert match, out.stderr
    return set(re.split(r"[\s|]+", match.group(1).strip()))


@pytest.fixture(scope="module")
def test_sh_tiers() -> set[str]:
    return script_words("test.sh", "not-a-tier", r"one of: ([^)]*)\)")


@pytest.fixture(scope="module")
def bootstrap_words() -> set[str]:
    return script_words("bootstrap.sh", "not-a-command", r"\[([a-z|]+)")


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((REPO / "docker-compose.yml").read_text(encoding="utf-8"))


def dockerfile_targets() -> set[str]:
    targets = set()
    for line in (REPO / "Dockerfile").read_text(encoding="utf-8").splitlines():
        parts = line.split()
        if len(parts) >= 4 and parts[0].upper() == "FROM" and parts[-2].upper() == "AS":
            targets.add(parts[-1])
    return targets


def sidecar_paths() -> set[str]:
    from palmyra_serve.sidecar.app import create_app
    from palmyra_serve.sidecar.core.routes import RELAYED

    app = create_app(Settings(auth_disabled=True))
    return set(app.control.openapi()["paths"]) | set(RELAYED) | {"/openapi.json", "/docs"}


def k8s_deployments() -> dict[str, set[str]]:
    """Deployment name -> its container and init-container names, from the base manifests."""
    out = {}
    for path in (REPO / "k8s" / "base").glob("*.yaml"):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and doc.get("kind") == "Deployment":
                spec = doc["spec"]["template"]["spec"]
                out[doc["metadata"]["name"]] = {
                    c["name"] for c in spec.get("containers", []) + spec.get("initContainers", [])
                }
    return out


# --- checkers: each returns a list of problems ----------------------------------------------


class Checker:
    def __init__(self, tiers: set[str], bootstrap: set[str], compose: dict) -> None:
        self.tiers = tiers
        self.bootstrap = bootstrap
        self.compose = compose
        self.services = set(compose["services"])
        self.profiles = {p for s in compose["services"].values() for p in s.get("profiles", [])}
        self.targets = dockerfile_targets()
        self.sidecar = sidecar_paths()
        self.deployments = k8s_deployments()

    def check(self, argv: list[str]) -> list[str]:
        problems = [f"{a}: no such path in the repository" for a in argv if self._missing_path(a)]
        name = program(argv)
        assert name is not None, f"not a checked program: {argv}"
        method = {
            "palmyra-serve": self.palmyra_serve,
            "./bootstrap.sh": self.bootstrap_sh,
            "./test.sh": self.test_sh,
            "curl": self.curl,
            "docker": self.docker,
            "kubectl": self.kubectl,
            "podman": self.podman,
        }[name]
        return problems + method(argv)

    @staticmethod
    def _missing_path(arg: str) -> bool:
        value = arg.split("=", 1)[1] if arg.startswith("--") and "=" in arg else arg
        if not value.startswith(TRACKED_ROOTS) or any(c in value for c in "$*<>{}"):
            return False
        return not (REPO / value).exists()

    def palmyra_serve(self, argv: list[str]) -> list[str]:
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                build_parser().parse_args(argv[1:])
        except SystemExit as exc:
            if exc.code not in (0, None):
                return [f"palmyra-serve rejects it: {err.getvalue().strip().splitlines()[-1]}"]
        return []

    def bootstrap_sh(self, argv: list[str]) -> list[str]:
        if len(argv) == 1:
            return []
        if argv[1] not in self.bootstrap:
            return [f"./bootstrap.sh accepts {sorted(self.bootstrap)}, not {argv[1]!r}"]
        return self.palmyra_serve(["palmyra-serve", "up", *argv[2:]]) if argv[1] == "up" else []

    def test_sh(self, argv: list[str]) -> list[str]:
        args = argv[1:]
        if "--" in args:
            args = args[: args.index("--")]
        return [f"./test.sh has no tier {a!r} (tiers: {sorted(self.tiers)})" for a in args if a not in self.tiers]

    def curl(self, argv: list[str]) -> list[str]:
        urls = [a for a in argv[1:] if re.match(r"^(https?://)?(localhost|127\.0\.0\.1|0\.0\.0\.0)(:\d+)?(/|$)", a)]
        if len(urls) != 1:
            return [f"curl: expected one URL on localhost/127.0.0.1, found {urls}"]
        url = urlsplit(urls[0] if "://" in urls[0] else "http://" + urls[0])
        path = url.path or "/"
        known = {
            8080: ("sidecar", self.sidecar),
            8000: ("engine", {"/health", "/metrics", "/version"} | self.sidecar),
            9090: ("Prometheus", None),
            3000: ("Grafana", None),
        }
        if url.port not in known:
            return [f"curl: port {url.port} is none of palmyra-serve's ({sorted(known)})"]
        service, paths = known[url.port]
        problems = []
        if paths is not None and path not in paths:
            problems.append(f"curl: the {service} does not serve {path} (it serves {sorted(paths)})")
        if url.port == 9090 and not (path.startswith("/api/v1/") or path in ("/-/ready", "/-/healthy", "/")):
            problems.append(f"curl: {path} is not a Prometheus API path")
        if url.port == 3000 and not (path.startswith("/api/") or path in ("/", "/login")):
            problems.append(f"curl: {path} is not a Grafana path")
        for i, arg in enumerate(argv):
            if arg in ("-d", "--data", "--data-raw", "--data-binary") and i + 1 < len(argv):
                body = argv[i + 1]
                if body.lstrip().startswith("{"):
                    try:
                        payload = json.loads(body)
                    except json.JSONDecodeError as exc:
                        problems.append(f"curl: the JSON body does not parse: {exc}")
                        continue
                    if path in GENERATION_PATHS and payload.get("model") != SERVED_MODEL_NAME:
                        problems.append(f"curl: model must be {SERVED_MODEL_NAME!r}, not {payload.get('model')!r}")
        return problems

    def docker(self, argv: list[str]) -> list[str]:
        if argv[1:2] == ["compose"]:
            return self.compose_args(argv[2:])
        if argv[1:2] == ["build"]:
            return self.build_args(argv[2:])
        if argv[1:2] == ["run"]:
            return self.run_args(argv[2:])
        return [f"docker {argv[1:2]}: only `docker compose`, `docker build` and `docker run` are documented"]

    def run_args(self, args: list[str]) -> list[str]:
        """`docker run [options] IMAGE ARGS`: one of this project's images; with palmyra-serve as the
        entrypoint, its arguments parse as the CLI's."""
        i, entrypoint = 0, None
        while i < len(args) and args[i].startswith("-"):
            opt, _, inline = args[i].partition("=")
            takes_value = opt in (
                "-v",
                "--volume",
                "-e",
                "--env",
                "--entrypoint",
                "--group-add",
                "--device",
                "--name",
                "-p",
            )
            if opt == "--entrypoint":
                entrypoint = inline or args[i + 1]
            i += 1 if inline or not takes_value else 2
        if i >= len(args):
            return ["docker run: no image"]
        image, rest = args[i], args[i + 1 :]
        if image.split(":")[0] not in ("palmyra-serve-engine", "palmyra-serve-sidecar"):
            return [f"docker run: {image} is not one of this project's images"]
        return self.palmyra_serve(["palmyra-serve", *rest]) if entrypoint == "palmyra-serve" else []

    def compose_args(self, args: list[str]) -> list[str]:
        problems, i = [], 0
        while i < len(args) and args[i].startswith("-"):  # options before the subcommand
            opt, _, inline = args[i].partition("=")
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            step = 1 if inline else 2
            if opt in ("-f", "--file", "--env-file") and not (REPO / value).is_file():
                problems.append(f"docker compose {opt}: no file {value}")
            elif opt == "--profile" and value not in self.profiles:
                problems.append(f"docker compose: no profile {value!r} (profiles: {sorted(self.profiles)})")
            elif opt not in ("-f", "--file", "--env-file", "--profile", "-p", "--project-name", "--project-directory"):
                step = 1
            i += step
        if i >= len(args):
            return [*problems, "docker compose: no subcommand"]
        sub, rest = args[i], args[i + 1 :]
        known = {
            "up",
            "down",
            "ps",
            "logs",
            "restart",
            "stop",
            "start",
            "pull",
            "build",
            "config",
            "rm",
            "kill",
            "top",
            "port",
            "images",
            "exec",
            "run",
            "events",
            "create",
            "pause",
            "unpause",
            "wait",
            "watch",
        }
        if sub not in known:
            return [*problems, f"docker compose: no subcommand {sub!r}"]
        if sub in ("exec", "run"):
            positional = [a for a in rest if not a.startswith("-")][:1]
        elif sub in ("port", "config"):
            positional = []
        else:
            positional = [a for a in rest if not a.startswith("-") and not a.isdigit()]
        problems += [f"docker compose {sub}: no service {s!r}" for s in positional if s not in self.services]
        return problems

    def build_args(self, args: list[str]) -> list[str]:
        problems = []
        for i, arg in enumerate(args):
            opt, _, inline = arg.partition("=")
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            if opt == "--target" and value not in self.targets:
                problems.append(f"build: no Dockerfile target {value!r} (targets: {sorted(self.targets)})")
            if opt in ("-f", "--file") and not (REPO / value).is_file():
                problems.append(f"build: no file {value}")
        return problems

    def podman(self, argv: list[str]) -> list[str]:
        if argv[1:2] == ["build"]:
            return self.build_args(argv[2:])
        if argv[1:3] == ["kube", "play"]:
            files = [a for a in argv[3:] if not a.startswith("-")]
            return [f"podman kube play: no file {f}" for f in files if f != "-" and not (REPO / f).is_file()]
        return []  # other podman commands name containers, not repository things

    def kubectl(self, argv: list[str]) -> list[str]:
        problems = []
        args = argv[1:]
        for i, arg in enumerate(args):
            opt, _, inline = arg.partition("=")
            value = inline or (args[i + 1] if i + 1 < len(args) else "")
            if opt in ("-k", "--kustomize") and not (REPO / value / "kustomization.yaml").is_file():
                problems.append(f"kubectl {opt}: {value} is not a kustomization")
            if opt in ("-f", "--filename") and value != "-" and not (REPO / value).exists():
                problems.append(f"kubectl {opt}: no file {value}")
        if args[:1] == ["kustomize"]:
            dirs = [a for a in args[1:] if not a.startswith("-") and a != "LoadRestrictionsNone"]
            problems += [
                f"kubectl kustomize: {d} is not a kustomization"
                for d in dirs
                if not (REPO / d / "kustomization.yaml").is_file()
            ]
        deployment = None
        for arg in args:
            m = re.match(r"^(?:deploy|deployment|deployments)(?:\.apps)?/(.+)$", arg)
            if m:
                deployment = m.group(1)
                if deployment not in self.deployments:
                    problems.append(f"kubectl: no Deployment {deployment!r} (have {sorted(self.deployments)})")
        for i, arg in enumerate(args):
            if (
                arg in ("-c", "--container")
                and i + 1 < len(args)
                and deployment in self.deployments
                and args[i + 1] not in self.deployments[deployment]
            ):
                problems.append(f"kubectl: Deployment {deployment} has no container {args[i + 1]!r}")
        return problems


@pytest.fixture(scope="module")
def checker(test_sh_tiers, bootstrap_words, compose) -> Checker:
    return Checker(test_sh_tiers, bootstrap_words, compose)


COMMANDS = readme_commands()


def test_readme_has_checked_commands():
    # The README's two fresh-machine commands, at least, are found and checked.
    programs = {program(argv) for source, argv in COMMANDS if source == "README.md"}
    assert {"./bootstrap.sh", "./test.sh"} <= programs


@pytest.mark.parametrize("source,argv", COMMANDS, ids=[f"{s}:{shlex.join(a)[:60]}" for s, a in COMMANDS])
def test_readme_command_names_things_that_exist(checker, source, argv):
    assert checker.check(argv) == []


BAD = [
    "palmyra-serve up --no-such-flag",
    "palmyra-serve serve",
    "./bootstrap.sh setup",
    "./test.sh unit integration",
    "curl -s http://127.0.0.1:8080/readyz",
    "curl -s http://127.0.0.1:8081/ready",
    'curl http://127.0.0.1:8080/v1/completions -d \'{"model": "gpt-4", "prompt": "Hi"}\'',
    'curl http://127.0.0.1:8080/v1/completions -d \'{"model": "palmyra-mini",}\'',
    "docker compose --profile gpu up -d",
    "docker compose --env-file compose/gpu.env up -d",
    "docker compose logs engine-npu",
    "docker build --target engine-npu -t x .",
    "kubectl apply -k k8s/overlays/ascend-910c",
    "kubectl -n palmyra logs deploy/palmyra-serve -c vllm",
    "podman kube play k8s/rendered.yaml",
]


@pytest.mark.parametrize("line", BAD)
def test_checker_rejects_commands_that_do_not_exist(checker, line):
    (argv,) = simple_commands(line)
    assert checker.check(argv) != []


def test_extraction_handles_prompts_continuations_and_pipes():
    md = (
        '```sh\n$ curl -s http://127.0.0.1:8080/ready \\\n    | python3 -m json.tool\n{"ready": true}\n```\n'
        "```text\ncurl http://nope\n```\n"
        "```bash\nPALMYRA_LONG=1 ./test.sh unit  # comment\n"
        "kubectl kustomize k8s/overlays/cpu | kubectl apply -f -\n```\n"
    )
    lines = shell_lines(md)
    assert [" ".join(line.split()) for line in lines] == [
        "curl -s http://127.0.0.1:8080/ready | python3 -m json.tool",
        "PALMYRA_LONG=1 ./test.sh unit # comment",
        "kubectl kustomize k8s/overlays/cpu | kubectl apply -f -",
    ]
    assert [simple_commands(line) for line in lines] == [
        [["curl", "-s", "http://127.0.0.1:8080/ready"], ["python3", "-m", "json.tool"]],
        [["./test.sh", "unit"]],
        [["kubectl", "kustomize", "k8s/overlays/cpu"], ["kubectl", "apply", "-f", "-"]],
    ]
