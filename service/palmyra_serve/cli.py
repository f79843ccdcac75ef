"""The `palmyra-serve` console script: one thin subcommand each, parse then call into the packages.

Flags override PALMYRA_* environment variables: each flag's dest is a Settings field, and only
flags given on the command line are passed to Settings().
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable
from typing import get_args

from palmyra_serve import __version__
from palmyra_serve.settings import Settings

S = argparse.SUPPRESS


def _choices(field: str) -> list[str]:
    """A flag's choices are its Settings field's Literal values: one list, in settings.py."""
    values = get_args(Settings.model_fields[field].annotation)
    assert values, f"Settings.{field} is not a Literal"
    return list(values)


def _settings(args: argparse.Namespace) -> Settings:
    fields = Settings.model_fields
    return Settings(**{k: v for k, v in vars(args).items() if k in fields})


def _add_listen(p: argparse.ArgumentParser, port_dest: str, default_port: int) -> None:
    p.add_argument("--host", default=S, help="listen address (PALMYRA_HOST, default 127.0.0.1)")
    p.add_argument("--port", dest=port_dest, type=int, default=S, help=f"listen port (default {default_port})")


def _add_model(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=S, help="hub id or local directory (PALMYRA_MODEL)")
    p.add_argument("--model-dir", dest="model_dir", default=S, help="where weights are kept (PALMYRA_MODEL_DIR)")
    p.add_argument(
        "--source",
        dest="model_source",
        default=S,
        choices=_choices("model_source"),
        help="PALMYRA_MODEL_SOURCE",
    )
    p.add_argument(
        "--stand-in-size",
        dest="stand_in_size",
        default=S,
        choices=_choices("stand_in_size"),
        help="stand-in shape when no weights can be had (PALMYRA_STAND_IN_SIZE)",
    )


def _add_engine(p: argparse.ArgumentParser) -> None:
    p.add_argument("--platform", default=S, choices=_choices("platform"), help="PALMYRA_PLATFORM")
    p.add_argument("--dtype", default=S, help="PALMYRA_DTYPE (default bfloat16)")
    p.add_argument("--max-model-len", dest="max_model_len", type=int, default=S, help="PALMYRA_MAX_MODEL_LEN")
    p.add_argument(
        "--enforce-eager",
        dest="enforce_eager",
        action="store_true",
        default=S,
        help="PALMYRA_ENFORCE_EAGER: skip compilation (faster start, slower decode)",
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
            return 1
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
    """validate and bench live in palmyra_serve.tools; imported only when used."""

    def add(p: argparse.ArgumentParser) -> None:
        importlib.import_module(f"palmyra_serve.tools.{module}").add_arguments(p)

    def run(args: argparse.Namespace) -> int:
        return int(importlib.import_module(f"palmyra_serve.tools.{module}").run(args))

    return add, run


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="palmyra-serve", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"palmyra-serve {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("up", help="run engine + sidecar locally and wait until ready (the quick start)")
    _add_listen(p, "port", 8080)
    p.add_argument("--engine-port", dest="engine_port", type=int, default=S, help="engine port (default 8000)")
    _add_model(p)
    _add_engine(p)
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("engine", help="launch the vLLM OpenAI server for the detected platform")
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

    p = sub.add_parser("doctor", help="check an Ascend host before the engine starts: what fails, and the fix")
    from palmyra_serve.doctor.command import add_arguments as add_doctor_arguments

    add_doctor_arguments(p)
    p.add_argument(
        "--platform",
        default=S,
        choices=_choices("platform"),
        help="PALMYRA_PLATFORM (ascend: a host without the driver is a failure)",
    )
    p.set_defaults(func=cmd_doctor)

    p = sub.add_parser("sidecar", help="run the sidecar in front of the engine")
    _add_listen(p, "port", 8080)
    p.add_argument("--engine-url", dest="engine_url", default=S, help="PALMYRA_ENGINE_URL")
    p.add_argument(
        "--probe-port",
        dest="probe_port",
        type=int,
        default=S,
        help="PALMYRA_PROBE_PORT: a second port serving only /health, /health/sidecar and /ready",
    )
    p.set_defaults(func=cmd_sidecar)

    p = sub.add_parser("make-model", help="write the random-weight stand-in checkpoint")
    p.add_argument("--size", choices=_choices("stand_in_size"), default="tiny")
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_make_model)

    p = sub.add_parser("fetch-model", help="resolve weights (local, hub, mirror, ModelScope, else stand-in)")
    _add_model(p)
    p.add_argument("--dest", default=None, help="where to put them (default PALMYRA_MODEL_DIR)")
    p.set_defaults(func=cmd_fetch_model)

    for name, help_text in (
        ("validate", "accuracy against the fp32 Transformers reference"),
        ("bench", "prefill, decode, TTFT and throughput against any endpoint"),
    ):
        add, run = _tool(name)
        p = sub.add_parser(name, help=help_text)
        add(p)
        p.set_defaults(func=run)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
