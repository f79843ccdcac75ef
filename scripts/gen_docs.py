#!/usr/bin/env python3
"""Generate the reference parts of docs/configuration.md, docs/metrics.md and docker-compose.yml
from the code.

    python scripts/gen_docs.py           rewrite the generated blocks in place
    python scripts/gen_docs.py --check   exit 1 (with a diff) when a committed doc is stale

Only the text between `<!-- BEGIN GENERATED name -->` and `<!-- END GENERATED name -->` (in YAML:
`# BEGIN GENERATED name` and `# END GENERATED name`) is rewritten; the hand-written prose around
it survives. Sources of truth:
- settings: palmyra_serve.settings.Settings.model_fields (env var PALMYRA_<FIELD>), the basics first,
  then by group (palmyra_serve.settings.GROUPS)
- CLI: palmyra_serve.cli.build_parser(), every subcommand and option
- engine command: palmyra_serve.engine.launcher.build_command() with default settings, per platform
- sidecar metrics: a fresh SidecarMetrics registry, walked with collect()
- Compose's settings pass-through: the same Settings fields, less those docker-compose.yml fixes
- the access log's keys: palmyra_serve.sidecar.core.record.ACCESS_LOG_KEYS
The engine (vllm:) metrics table in docs/metrics.md is hand-maintained; tests/static/test_docs.py
checks it against the dashboards and alert rules.
"""

from __future__ import annotations

import argparse
import difflib
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TypedDict

from prometheus_client.metrics import MetricWrapperBase

from palmyra_serve.cli import build_parser
from palmyra_serve.engine.launcher import PLATFORMS, build_command
from palmyra_serve.settings import GROUPS, Settings, basics
from palmyra_serve.sidecar.core.metrics import PHASES, STARTUP_PHASES, SidecarMetrics, tenant_families

REPO = Path(__file__).resolve().parent.parent

ENV_PREFIX = "PALMYRA_"
CONFIG_DOC = REPO / "docs" / "configuration.md"
METRICS_DOC = REPO / "docs" / "metrics.md"
DEPLOYMENT = REPO / "k8s" / "base" / "deployment.yaml"
COMPOSE_FILE = REPO / "docker-compose.yml"
FIELDS_DOC = REPO / "docs" / "request-fields.md"
API_DOC = REPO / "docs" / "api.md"
BLOCK = re.compile(
    r"(<!-- BEGIN GENERATED (?P<name>[\w-]+) [^>]*-->\n)(?P<body>.*?)(<!-- END GENERATED (?P=name) -->)", re.S
)
YAML_BLOCK = re.compile(
    r"(# BEGIN GENERATED (?P<name>[\w-]+) [^\n]*\n)(?P<body>.*?)(# END GENERATED (?P=name)\n)", re.S
)
# Settings docker-compose.yml sets itself, because the layout decides them (addresses and ports
# inside the shared network namespace, the engine key it requires, the model volume's paths), or
# that only `palmyra-serve up` reads; every other setting passes from the env file to both
# containers. The images' commands give host and port as flags, which win over the environment.
COMPOSE_FIXED = {
    "host": "flag of the images' commands",
    "port": "flag of the sidecar image's command; PALMYRA_PORT is the published host port",
    "probe_port": "the healthchecks' and Prometheus' port, 8081",
    "engine_url": "the engine on the shared loopback",
    "engine_port": "flag of the engine's command",
    "engine_api_key": "required, set by the Compose file itself",
    "model": "the engine serves the `models` volume; model-init reads PALMYRA_MODEL",
    "model_dir": "the `models` volume",
    "model_source": "the `models` volume",
    "up_log_dir": "`palmyra-serve up` only",
}
# Labels whose values are open-ended (not a fixed, pre-created set): shown by name and meaning only.
OPEN_LABELS = {"status": "HTTP status code as a string", "version": "palmyra-serve version"}
# Where the launcher's environment would otherwise leak the caller's machine into the document.
LAUNCHER_ENV = ("PYTORCH_NPU_ALLOC_CONF", "VLLM_CPU_KVCACHE_SPACE")
EXAMPLE_MODEL_PATH = "/models/palmyra-mini"


def env_name(field: str) -> str:
    return ENV_PREFIX + field.upper()


def cell(text: object) -> str:
    """One Markdown table cell: no pipes, no newlines."""
    return str(text).replace("|", "\\|").replace("\n", " ")


# --- settings ---------------------------------------------------------------------------------


def type_name(annotation: object) -> str:
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        inner = " or ".join(type_name(a) for a in rest)
        return f"{inner}, optional" if len(rest) < len(args) else inner
    if origin is list:
        return f"comma-separated list of {type_name(args[0])}" if args else "list"
    if annotation is Path:
        return "path"
    return getattr(annotation, "__name__", str(annotation))


def default_text(value: object) -> str:
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, list):
        return f"`{','.join(map(str, value))}`" if value else "empty"
    if value == "":
        return 'empty (`""`)'
    return f"`{value}`"


def flags_by_dest(parser: argparse.ArgumentParser) -> dict[str, list[tuple[str, str]]]:
    """Settings field -> [(flag, subcommand)] for every CLI option that sets it."""
    out: dict[str, list[tuple[str, str]]] = {}
    for name, sub in subcommands(parser):
        for action in options(sub):
            # Only SUPPRESS-default options feed Settings (cli._settings); validate/bench have their own --model.
            if action.dest in Settings.model_fields and action.default is argparse.SUPPRESS:
                out.setdefault(action.dest, []).append((action.option_strings[-1], name))
    return out


def settings_rows(names: list[str], flags: dict[str, list[tuple[str, str]]]) -> list[str]:
    rows = ["| Variable | Type | Default | Flag | Meaning |", "|---|---|---|---|---|"]
    for name in names:
        field = Settings.model_fields[name]
        by_flag: dict[str, list[str]] = {}
        for flag, command in flags.get(name, []):
            by_flag.setdefault(flag, []).append(command)
        flag_text = "; ".join(f"`{f}` ({', '.join(cmds)})" for f, cmds in by_flag.items()) or "—"
        rows.append(
            "| "
            + " | ".join(
                cell(c)
                for c in (
                    f"`{env_name(name)}`",
                    type_name(field.annotation),
                    default_text(field.get_default(call_default_factory=True)),
                    flag_text,
                    field.description or "",
                )
            )
            + " |"
        )
    return rows


def group_heading(group: type) -> tuple[str, str]:
    """(title, one-sentence introduction) from a group's docstring, "Title: what it holds."."""
    title, _, intro = " ".join(inspect.cleandoc(group.__doc__ or "").split()).partition(": ")
    assert title and intro, f"{group.__name__}: its docstring reads 'Title: what the group holds.'"
    return title, intro[:1].upper() + intro[1:]


def settings_table() -> str:
    """The basics first (the few settings every operator sets), then each group's tuning knobs: every
    setting in exactly one table."""
    flags = flags_by_dest(build_parser())
    basic = basics()
    out = [
        "### Basics",
        "",
        "What nearly every deployment sets: the model and its name, the device, the context length, "
        "the keys and tenants, the ports. Everything else is tuning whose default serves most deployments, "
        "below by group.",
        "",
        *settings_rows(basic, flags),
    ]
    for group in GROUPS:
        title, intro = group_heading(group)
        names = [name for name in group.model_fields if name not in basic]
        if names:
            out += ["", f"### {title}", "", intro, "", *settings_rows(names, flags)]
    return "\n".join(out) + "\n"


# --- CLI --------------------------------------------------------------------------------------


def subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    # argparse has no public accessor for subparsers; _SubParsersAction has been stable for decades.
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from action.choices.items()


def subcommand_help(parser: argparse.ArgumentParser) -> dict[str, str]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return {a.dest: a.help or "" for a in action._choices_actions}
    return {}


def options(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction)]


def expand_help(action: argparse.Action, prog: str) -> str:
    """What `--help` prints for this option (argparse's own %-expansion)."""
    if not action.help:
        return ""
    params = {k: v for k, v in vars(action).items() if v is not argparse.SUPPRESS}
    params["prog"] = prog
    if isinstance(params.get("default"), list):
        params["default"] = ",".join(map(str, params["default"]))
    return action.help % params


def option_name(action: argparse.Action) -> str:
    if not action.option_strings:
        return f"`{action.metavar or action.dest}`"
    flag = ", ".join(action.option_strings)
    if action.nargs == 0:
        return f"`{flag}`"
    metavar = action.metavar or action.dest.upper()
    if isinstance(metavar, tuple):
        metavar = " ".join(metavar)
    return f"`{flag} {metavar}`"


def option_default(action: argparse.Action) -> str:
    if action.default is argparse.SUPPRESS:
        if action.dest in Settings.model_fields:
            field = Settings.model_fields[action.dest]
            return f"`{env_name(action.dest)}` ({default_text(field.get_default(call_default_factory=True))})"
        return "—"
    if action.nargs == 0:
        return "off" if not action.default else "on"
    if action.required:
        return "required"
    return default_text(action.default)


def cli_reference() -> str:
    parser = build_parser()
    helps = subcommand_help(parser)
    out: list[str] = []
    for name, sub in subcommands(parser):
        out += [
            f"### `palmyra-serve {name}`",
            "",
            helps.get(name, "").rstrip(".") + ".",
            "",
            "| Option | Default | Meaning |",
            "|---|---|---|",
        ]
        for action in options(sub):
            meaning = expand_help(action, sub.prog)
            if action.choices:
                choices = "one of " + ", ".join(f"`{c}`" for c in action.choices)
                meaning = f"{meaning} ({choices})" if meaning else choices
            out.append(
                "| " + " | ".join(cell(c) for c in (option_name(action), option_default(action), meaning)) + " |"
            )
        out.append("")
    return "\n".join(out)


@contextmanager
def clean_launcher_env() -> Iterator[None]:
    saved = {k: os.environ.pop(k) for k in LAUNCHER_ENV if k in os.environ}
    try:
        yield
    finally:
        os.environ.update(saved)


def engine_commands() -> str:
    """What `palmyra-serve engine` runs on each platform with every setting at its default."""
    settings = Settings.model_construct()  # defaults only: the caller's PALMYRA_* must not leak in
    out: list[str] = []
    with clean_launcher_env():
        for platform in PLATFORMS:
            cmd = build_command(settings, EXAMPLE_MODEL_PATH, platform)
            argv = ["python", *cmd.argv[1:]]  # argv[0] is this machine's interpreter path
            env = " ".join(f"{k}={v}" for k, v in sorted(cmd.env.items()))
            out += [
                f"**{platform}**" + (f" (environment: `{env}`)" if env else "") + ":",
                "",
                "```text",
                " \\\n    ".join(" ".join(pair) for pair in _pairs(argv)),
                "```",
                "",
            ]
    return "\n".join(out)


def _pairs(argv: list[str]) -> Iterator[list[str]]:
    """Group `--flag value` for one-per-line display."""
    head = ["python", "-m", argv[2]]
    yield head
    rest = argv[3:]
    i = 0
    while i < len(rest):
        if i + 1 < len(rest) and not rest[i + 1].startswith("--"):
            yield rest[i : i + 2]
            i += 2
        else:
            yield rest[i : i + 1]
            i += 1


# --- metrics ----------------------------------------------------------------------------------


def _instruments(metrics: SidecarMetrics) -> dict[str, MetricWrapperBase]:
    return {w._name: w for w in vars(metrics).values() if isinstance(w, MetricWrapperBase)}


class Family(TypedDict):
    """One metric family as the tables show it."""

    name: str
    type: str
    labels: dict[str, list[str]]
    help: str
    buckets: list[str]
    client_port: bool  # False: the probe port's /metrics only (ClientView)


def sidecar_metrics() -> list[Family]:
    metrics = SidecarMetrics()
    metrics.bind_phase(lambda: PHASES[0])  # what HealthState does at start: creates every phase's series
    metrics.record_startup(dict.fromkeys(STARTUP_PHASES, 0.0))  # what the first start-up to ready creates
    metrics.bind_quota_store(lambda: 1.0)  # registered only where a shared quota store is configured
    wrappers = _instruments(metrics)
    hidden = tenant_families(metrics.registry)  # the probe port's only (ClientView)
    families: list[Family] = []
    for family in metrics.registry.collect():
        labels: dict[str, list[str]] = {}
        buckets: list[str] = []
        for sample in family.samples:
            for key, value in sample.labels.items():
                if key == "le":
                    if value not in buckets:
                        buckets.append(value)
                elif value not in labels.setdefault(key, []):
                    labels[key].append(value)
        if not family.samples and family.name in wrappers:
            labels = {name: [] for name in wrappers[family.name]._labelnames}
        families.append(
            {
                "name": family.name,
                "type": family.type,
                "labels": labels,
                "help": family.documentation,
                "buckets": buckets,
                "client_port": family.name not in hidden,
            }
        )
    # A family whose children are created lazily (requests by route and status) has no samples yet;
    # its fixed-set labels take their values from the families that pre-create the same label.
    known: dict[str, list[str]] = {}
    for fam in families:
        for key, values in fam["labels"].items():
            known.setdefault(key, []).extend(v for v in values if v not in known[key])
    for fam in families:
        fam["labels"] = {k: v or known.get(k, []) for k, v in fam["labels"].items()}
        if fam["type"] == "counter":
            fam["name"] += "_total"
    return families


def label_text(labels: dict[str, list[str]]) -> str:
    if not labels:
        return "—"
    parts = []
    for name, values in labels.items():
        if name in OPEN_LABELS:
            parts.append(f"`{name}` ({OPEN_LABELS[name]})")
        else:
            parts.append(f"`{name}` ∈ " + ", ".join(f"`{v}`" for v in values))
    return "; ".join(parts)


def metrics_table() -> str:
    rows = ["| Metric | Type | Labels | Served on | Meaning |", "|---|---|---|---|---|"]
    for m in sidecar_metrics():
        where = "both ports" if m["client_port"] else "probe port only"
        cells = (f"`{m['name']}`", m["type"], label_text(m["labels"]), where, m["help"])
        rows.append("| " + " | ".join(cell(c) for c in cells) + " |")
    return "\n".join(rows) + "\n"


def buckets_table() -> str:
    rows = ["| Histogram | Bucket upper bounds (seconds) |", "|---|---|"]
    for m in sidecar_metrics():
        if m["type"] == "histogram":
            bounds = ", ".join(b for b in m["buckets"] if b != "+Inf")
            rows.append(f"| `{m['name']}` | {bounds}, +Inf |")
    return "\n".join(rows) + "\n"


# --- splicing ---------------------------------------------------------------------------------


def sidecar_memory() -> str:
    """The sidecar's worst-case memory for the default settings, against its container limit."""
    import yaml

    from palmyra_serve.sidecar import memory_budget

    deployment = next(d for d in yaml.safe_load_all(DEPLOYMENT.read_text()) if d and d.get("kind") == "Deployment")
    return memory_budget.markdown(Settings(), memory_budget.container_limit(deployment, "sidecar"))


def access_log_table() -> str:
    """The access log's keys, from the request record that renders them."""
    from palmyra_serve.sidecar.core.record import ACCESS_LOG_KEYS

    rows = [f"| `{key}` | {cell(meaning)} |" for key, meaning in ACCESS_LOG_KEYS.items()]
    return "\n".join(["| key | meaning |", "|---|---|", *rows]) + "\n"


def request_fields_table() -> str:
    """Every relayed route's field decisions (policy/tables.py), with the engine versions whose
    request model has each field (from the snapshot the unit tests check against both engines)."""
    import json

    from palmyra_serve.sidecar.policy.fields import OPENAI_ONLY
    from palmyra_serve.sidecar.policy.tables import BY_TARGET

    snapshot = json.loads((REPO / "tests" / "unit" / "data" / "vllm-request-fields.json").read_text())
    versions = sorted(snapshot["versions"], key=lambda v: tuple(int(p) for p in v.split(".")))
    out = []
    for target, table in BY_TARGET.items():
        route = target.decode()
        present = {
            v: set().union(*(set(m["fields"]) for r, m in snapshot["versions"][v].items() if r.split("#")[0] == route))
            for v in versions
        }
        counts = {
            d: sum(1 for r in table.values() if r.decision == d)
            for d in ("bounded", "rewritten", "stripped", "refused", "passed")
        }
        out.append(f"### `{route}`\n\n")
        out.append(
            ", ".join(f"{len(present[v])} fields in vLLM {v}" for v in versions)
            + "; decisions: "
            + ", ".join(f"{n} {d}" for d, n in counts.items() if n)
            + ".\n\n"
        )
        out.append("| field | decision | why | vLLM |\n|---|---|---|---|\n")
        for name, rule in table.items():
            where = "OpenAI only" if name in OPENAI_ONLY else ", ".join(v for v in versions if name in present[v])
            out.append(f"| `{name}` | {rule.decision} | {cell(rule.why)} | {where} |\n")
        out.append("\n")
    return "".join(out)


def compose_settings() -> str:
    """The YAML mapping of every setting Compose passes through, each from the variable of the same
    name, empty (the default, for Settings) when the env file and the shell leave it out."""
    lines = [
        f"  {env_name(field)}: ${{{env_name(field)}:-}}\n"
        for field in Settings.model_fields
        if field not in COMPOSE_FIXED
    ]
    return "x-settings: &settings\n" + "".join(lines)


GENERATORS: dict[Path, dict[str, Callable[[], str]]] = {
    CONFIG_DOC: {
        "settings": settings_table,
        "cli": cli_reference,
        "engine-command": engine_commands,
        "sidecar-memory": sidecar_memory,
    },
    METRICS_DOC: {"sidecar-metrics": metrics_table, "sidecar-buckets": buckets_table},
    COMPOSE_FILE: {"compose-settings": compose_settings},
    API_DOC: {"access-log": access_log_table},
    FIELDS_DOC: {"request-fields": request_fields_table},
}


def rel(path: Path) -> str:
    try:
        return str(path.relative_to(REPO))
    except ValueError:
        return str(path)


def render(path: Path, text: str, generators: dict[str, Callable[[], str]] | None = None) -> str:
    wanted = generators if generators is not None else GENERATORS[path]
    block = YAML_BLOCK if path.suffix in (".yml", ".yaml") else BLOCK
    found = {m.group("name") for m in block.finditer(text)}
    missing = set(wanted) - found
    if missing:
        raise SystemExit(
            f"{rel(path)}: no marker block for {sorted(missing)}; add "
            f"'<!-- BEGIN GENERATED NAME (scripts/gen_docs.py) -->' ... '<!-- END GENERATED NAME -->'"
        )

    def fill(m: re.Match) -> str:
        name = m.group("name")
        if name not in wanted:
            raise SystemExit(f"{rel(path)}: unknown generated block {name!r}")
        return m.group(1) + wanted[name]() + m.group(4)

    return block.sub(fill, text)


def main(argv: list[str] | None = None, generators: dict[Path, dict[str, Callable[[], str]]] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare only; exit 1 when a doc is stale")
    args = ap.parse_args(argv)
    stale = 0
    for path, blocks in (generators or GENERATORS).items():
        current = path.read_text(encoding="utf-8")
        wanted = render(path, current, blocks)
        if wanted == current:
            continue
        if args.check:
            stale += 1
            sys.stdout.writelines(
                difflib.unified_diff(current.splitlines(True), wanted.splitlines(True), rel(path), "generated")
            )
        else:
            path.write_text(wanted, encoding="utf-8")
            print(f"wrote {rel(path)}")
    if stale:
        print(f"\n{stale} document(s) stale: run `python scripts/gen_docs.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
