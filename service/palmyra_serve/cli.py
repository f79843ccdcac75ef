"""Serve Writer/palmyra-mini through vLLM's OpenAI-compatible server, behind a sidecar that guards
it (API keys, admission control, health, metrics), on an Ascend NPU or a plain CPU.

Every flag has a PALMYRA_* environment variable (docs/configuration.md); a flag given on the
command line wins over it.
"""

# Longer than 400 lines: one argparse parser for every subcommand (docs/configuration.md is
# generated from it); each command's work lives in its package.

from __future__ import annotations

import argparse
import importlib
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import get_args

from palmyra_serve import __version__
from palmyra_serve.settings import Settings

S = argparse.SUPPRESS

# Common invocations, shown under each command's --help (and the whole list under the top level's).
EXAMPLES: dict[str, list[tuple[str, str]]] = {
    "up": [
        ("palmyra-serve up", "serve on this machine's CPU (weights from the hub, else a random stand-in)"),
        ("palmyra-serve up --model /data/palmyra-mini", "serve weights already on disk"),
        ("PALMYRA_API_KEYS=$(openssl rand -hex 32) palmyra-serve up", "require a client key"),
    ],
    "engine": [
        ("palmyra-serve engine --print-command", "show the vLLM command this host would run"),
        ("palmyra-serve engine --host 127.0.0.1 --port 8000", "run vLLM (the sidecar's upstream)"),
    ],
    "doctor": [
        ("palmyra-serve doctor", "is this host ready for the Ascend engine? each failure with its fix"),
        ("palmyra-serve doctor --json", "the same findings, for a script"),
    ],
    "sidecar": [
        ("palmyra-serve sidecar --engine-url http://127.0.0.1:8000", "guard an engine that runs already"),
    ],
    "tenants": [
        ("openssl rand -hex 32 | tee search.key | palmyra-serve tenants digest", "a new key and its digest"),
        ("palmyra-serve tenants check tenants.yaml", "is this tenants file valid? (each mistake with its line)"),
    ],
    "make-model": [("palmyra-serve make-model --out /tmp/tiny", "a tiny random-weight checkpoint")],
    "fetch-model": [
        ("palmyra-serve fetch-model --dest models/palmyra-mini", "download the weights before starting"),
    ],
    "validate": [
        ("PALMYRA_API_KEY=KEY palmyra-serve validate --quick", "does the endpoint serve the model?"),
        ("palmyra-serve validate --model-dir models/palmyra-mini --out out/", "accuracy against fp32"),
    ],
    "golden": [
        ("palmyra-serve golden --model-dir models/palmyra-mini --out golden.json", "record the fp32 reference"),
    ],
    "bench": [
        ("PALMYRA_API_KEY=KEY palmyra-serve bench --out out/", "latency and throughput tables, with plots"),
        ("palmyra-serve bench --compare a/results.json b/results.json", "two runs side by side"),
    ],
}


def _examples(name: str) -> str:
    return "examples:\n" + "\n".join(f"  {cmd}\n      {what}" for cmd, what in EXAMPLES[name])


def _choices(field: str) -> list[str]:
    """A flag's choices are its Settings field's Literal values: one list, in palmyra_serve.settings."""
    values = get_args(Settings.model_fields[field].annotation)
    assert values, f"Settings.{field} is not a Literal"
    return list(values)


def _settings(args: argparse.Namespace) -> Settings:
    fields = Settings.model_fields
    return Settings(**{k: v for k, v in vars(args).items() if k in fields})


def _add_listen(p: argparse.ArgumentParser, port_dest: str, default_port: int) -> None:
    p.add_argument("--host", default=S, help="listen address (PALMYRA_HOST, default 127.0.0.1)")
    env = "PALMYRA_PORT" if port_dest == "port" else "PALMYRA_ENGINE_PORT"
    p.add_argument("--port", dest=port_dest, type=int, default=S, help=f"listen port ({env}, default {default_port})")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=S, help="hub id or local directory (PALMYRA_MODEL)")
    p.add_argument("--model-dir", dest="model_dir", default=S, help="where weights are kept (PALMYRA_MODEL_DIR)")
    p.add_argument(
        "--source",
        dest="model_source",
        default=S,
        choices=_choices("model_source"),
        help="where weights come from; auto: a local directory, else the hub, else the stand-in where allowed "
        "(PALMYRA_MODEL_SOURCE)",
    )
    p.add_argument(
        "--stand-in-size",
        dest="stand_in_size",
        default=S,
        choices=_choices("stand_in_size"),
        help="stand-in shape when no weights can be had (PALMYRA_STAND_IN_SIZE)",
    )


def _add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--platform",
        default=S,
        choices=_choices("platform"),
        help="the engine's platform; auto detects torch-npu, then CUDA, else CPU (PALMYRA_PLATFORM)",
    )
    p.add_argument("--dtype", default=S, help="the engine's dtype (PALMYRA_DTYPE, default bfloat16)")
    p.add_argument(
        "--max-model-len",
        dest="max_model_len",
        type=int,
        default=S,
        help="longest prompt + completion in tokens (PALMYRA_MAX_MODEL_LEN, default 8192)",
    )
    p.add_argument(
        "--enforce-eager",
        dest="enforce_eager",
        action="store_true",
        default=S,
        help="skip compilation: faster start, slower decode (PALMYRA_ENFORCE_EAGER)",
    )


def _warn_unknown_variables() -> None:
    import os

    from palmyra_serve.variables import warn_unknown

    warn_unknown(os.environ)


def cmd_engine(args: argparse.Namespace) -> int:
    from palmyra_serve.engine.launcher import build_command, detect_platform, run
    from palmyra_serve.logs import configure

    settings = _settings(args)
    configure(settings.log_level)
    platform = detect_platform() if settings.platform == "auto" else settings.platform
    if args.no_fetch:
        model_path = settings.model
    else:
        from palmyra_serve.model.resolve import ModelUnavailable, resolve

        try:
            model_path = str(resolve(settings, platform=platform))
        except ModelUnavailable as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
    cmd = build_command(settings, model_path, platform)
    if args.print_command:
        print(cmd.redacted())  # alone on stdout: scripts read it
        return 0
    _warn_unknown_variables()
    if platform == "ascend":
        from palmyra_serve.doctor.command import preflight

        if not preflight(settings, settings.doctor):
            return 2  # the host's configuration, like a refused argument: `up` stops rather than restarts
    from palmyra_serve.engine.golden_gate import admit

    if not admit(settings, model_path):
        return 2  # weights the golden reference was not recorded for: restarting serves them again
    return run(cmd)


def cmd_doctor(args: argparse.Namespace) -> int:
    from palmyra_serve.doctor.command import run

    return run(args, _settings(args))


def cmd_sidecar(args: argparse.Namespace) -> int:
    from palmyra_serve.logs import configure
    from palmyra_serve.sidecar.server import serve

    settings = _settings(args)
    configure(settings.log_level)
    _warn_unknown_variables()
    serve(settings)
    return 0


def cmd_up(args: argparse.Namespace) -> int:
    from palmyra_serve.up import run_up

    return run_up(_settings(args))


def cmd_tenants(args: argparse.Namespace) -> int:
    from palmyra_serve.sidecar.tenants import config

    if args.action == "digest":
        for line in sys.stdin.read().splitlines():
            if line.strip():
                print(config.key_digest(line.strip()))
        return 0
    if args.file is None:
        print("error: tenants check needs the file to check", file=sys.stderr)
        return 2
    try:
        tenants = config.read(args.file)
    except config.TenantsFileError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for name, spec in tenants.by_name.items():
        limits = spec.model_dump(exclude={"name", "keys"}, exclude_none=True)
        print(f"{name}: {len(spec.keys)} key(s), queue share {tenants.share(name).queue_share:.0%}, {limits}")
    return 0


def cmd_make_model(args: argparse.Namespace) -> int:
    from palmyra_serve.model.stand_in import build

    out = build(args.out, args.size, args.seed)
    print(out)
    return 0


def cmd_fetch_model(args: argparse.Namespace) -> int:
    from palmyra_serve.logs import configure
    from palmyra_serve.model.resolve import ModelUnavailable, resolve

    settings = _settings(args)
    configure(settings.log_level)
    try:
        print(resolve(settings, args.dest, copy_local=args.dest is not None))
    except ModelUnavailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def _tool(module: str) -> tuple[Callable[[argparse.ArgumentParser], None], Callable[[argparse.Namespace], int]]:
    """validate, golden and bench live in palmyra_serve.tools; imported only when used."""

    def add(p: argparse.ArgumentParser) -> None:
        importlib.import_module(f"palmyra_serve.tools.{module}").add_arguments(p)

    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(f"palmyra_serve.tools.{module}").run(args))

    return add, run


def _command(sub: argparse._SubParsersAction, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    """A subcommand whose --help says what it does, then its common invocations."""
    return sub.add_parser(
        name,
        help=summary,
        description=textwrap.fill(f"{summary[0].upper()}{summary[1:]}. {description}", width=95),
        epilog=_examples(name),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="palmyra-serve",
        description=__doc__,
        epilog="start here:\n  palmyra-serve up\n      engine + sidecar on this machine, ready in a few minutes\n"
        "each command's --help shows its flags and examples; docs/configuration.md lists every setting",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"palmyra-serve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = _command(
        sub,
        "up",
        "run engine + sidecar locally and wait until ready (the quick start)",
        "Resolves the weights (a local directory, else the hub, else a random stand-in on CPU), "
        "starts vLLM and the sidecar, restarts the engine if it dies, and stops both on Ctrl-C. "
        "Without PALMYRA_API_KEYS it serves without keys, on this machine only.",
    )
    _add_listen(p, "port", 8080)
    p.add_argument(
        "--engine-port",
        dest="engine_port",
        type=int,
        default=S,
        help="the engine's port (PALMYRA_ENGINE_PORT, default 8000)",
    )
    _add_model(p)
    _add_engine(p)
    p.set_defaults(func=cmd_up)

    p = _command(
        sub,
        "engine",
        "launch the vLLM OpenAI server for the detected platform",
        "Builds vLLM's command from the settings (the container images run this); on Ascend it runs "
        "doctor's checks first (PALMYRA_DOCTOR); with PALMYRA_GOLDEN_FILE it starts only on the weights the "
        "reference was recorded for (PALMYRA_GOLDEN_DIGEST).",
    )
    _add_listen(p, "engine_port", 8000)
    _add_model(p)
    _add_engine(p)
    p.add_argument("--no-fetch", action="store_true", help="pass --model to vLLM as is (no resolution)")
    p.add_argument(
        "--print-command",
        action="store_true",
        help="print the vLLM command (the environment it sets, key masked, then argv) and exit",
    )
    p.set_defaults(func=cmd_engine)

    p = _command(
        sub,
        "doctor",
        "check an Ascend host before the engine starts: what fails, and the fix",
        "Driver, device nodes, HwHiAiUser, visible devices, NPU health and free memory, image "
        "architecture, virtual NPUs. Exit status 1 when the engine cannot start here.",
    )
    from palmyra_serve.doctor.command import add_arguments as add_doctor_arguments

    add_doctor_arguments(p)
    p.add_argument(
        "--platform",
        default=S,
        choices=_choices("platform"),
        help="the platform the engine will run on; ascend: a host without the driver is a failure (PALMYRA_PLATFORM)",
    )
    p.set_defaults(func=cmd_doctor)

    p = _command(
        sub,
        "sidecar",
        "run the sidecar in front of the engine",
        "The only door to the engine: the allow-listed OpenAI routes, API keys, admission control, "
        "/health, /ready (after warmup), /metrics (per-tenant series on --probe-port only), request ids, JSON access "
        "logs, drain on SIGTERM.",
    )
    _add_listen(p, "port", 8080)
    p.add_argument(
        "--engine-url",
        dest="engine_url",
        default=S,
        help="where the engine answers (PALMYRA_ENGINE_URL, default http://127.0.0.1:8000)",
    )
    p.add_argument(
        "--probe-port",
        dest="probe_port",
        type=int,
        default=S,
        help="a second port, never published, serving only /health, /health/sidecar, /ready and the full "
        "/metrics (per-tenant series included), for probes and Prometheus (PALMYRA_PROBE_PORT)",
    )
    p.set_defaults(func=cmd_sidecar)

    p = _command(
        sub,
        "tenants",
        "write a key's digest for the tenants file, or check a tenants file",
        "digest: the line of the tenants file for each key read on standard input (one per line; the key "
        "itself never goes in the file). check: parse a tenants file as the sidecar does, print each tenant, "
        "exit status 1 with the line of the first mistake.",
    )
    p.add_argument("action", choices=["digest", "check"])
    p.add_argument("file", nargs="?", type=Path, help="check: the tenants file")
    p.set_defaults(func=cmd_tenants)

    p = _command(
        sub,
        "make-model",
        "write the random-weight stand-in checkpoint",
        "palmyra-mini's architecture and tokenizer with seeded random weights, for tests and offline "
        "machines; it generates noise, and /ready reports it as weights: random-stand-in.",
    )
    p.add_argument("--size", choices=_choices("stand_in_size"), default="tiny")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_make_model)

    p = _command(
        sub,
        "fetch-model",
        "resolve weights (local, hub, mirror, ModelScope, else stand-in)",
        "Prints the directory that holds them. HF_ENDPOINT points at a mirror.",
    )
    _add_model(p)
    p.add_argument("--dest", default=None, help="where to put them (default: PALMYRA_MODEL_DIR)")
    p.set_defaults(func=cmd_fetch_model)

    for name, help_text, description in (
        (
            "validate",
            "accuracy against the fp32 Transformers reference",
            "Greedy tokens from the endpoint compared with the same checkpoint in fp32 on this machine; "
            "--quick only checks that it lists the model and generates. The key: --api-key-file, "
            "PALMYRA_API_KEY or OPENAI_API_KEY.",
        ),
        (
            "golden",
            "record a checkpoint's fp32 golden reference",
            "Greedy tokens and top-k log-probabilities of 22 varied prompts, from the checkpoint in fp32 "
            "with Transformers on this machine, with the weights' and tokenizer's digests: what a replica's "
            "own tokens are compared with.",
        ),
        (
            "bench",
            "prefill, decode, TTFT and throughput against any endpoint",
            "Seeded random prompts of exact lengths; writes report.md, results.json and plots with "
            "--out. The key: --api-key-file, PALMYRA_API_KEY or OPENAI_API_KEY.",
        ),
    ):
        add, run = _tool(name)
        p = _command(sub, name, help_text, description)
        add(p)
        p.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
