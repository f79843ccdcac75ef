"""`palmyra-serve doctor` and the engine's preflight: gather, check, report."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping
from pathlib import Path

from palmyra_serve.doctor import facts
from palmyra_serve.doctor.checks import Finding, Wanted, check_golden_digest, run_checks
from palmyra_serve.doctor.host import gather
from palmyra_serve.doctor.report import exit_status, render_json, render_text, verdict
from palmyra_serve.settings import Settings

log = logging.getLogger(__name__)


def image_ids(env: Mapping[str, str]) -> tuple[int, int]:
    """HwHiAiUser's ids the image was built with: the Ascend image records its build arguments in
    HWHIAIUSER_UID / HWHIAIUSER_GID; elsewhere the defaults the Dockerfile builds with."""

    def number(name: str, default: int) -> int:
        value = env.get(name, "")
        return int(value) if value.isdigit() else default

    return number("HWHIAIUSER_UID", facts.IMAGE_UID_DEFAULT), number("HWHIAIUSER_GID", facts.IMAGE_GID_DEFAULT)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="/", help="the host's root as mounted here (default /)")
    p.add_argument(
        "--image-arch",
        dest="image_arch",
        default=None,
        help="the engine image's architecture (`docker image inspect -f '{{.Architecture}}' IMAGE`), "
        "checked against this machine's",
    )
    p.add_argument("--json", action="store_true", help="print the findings as JSON")
    p.add_argument("--no-npu-smi", dest="skip_npu_smi", action="store_true", help="do not run `npu-smi info`")
    p.add_argument(
        "--only",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        default=None,
        metavar="CHECK[,CHECK]",
        help="report and judge only these checks (names as the report prints them, e.g. driver): for a look "
        "from a container other than the engine's, whose user and devices differ",
    )


def diagnose(root: str, want: Wanted, env: Mapping[str, str] | None = None, run_npu_smi: bool = True) -> list[Finding]:
    return run_checks(gather(root, env, run_smi=run_npu_smi), want)


def wanted(settings: Settings, env: Mapping[str, str], image_arch: str | None = None) -> Wanted:
    uid, gid = image_ids(env)
    return Wanted(
        platform=settings.platform,
        gpu_memory_utilization=settings.gpu_memory_utilization,
        enforce_eager=settings.enforce_eager,
        image_arch=image_arch,
        image_uid=uid,
        image_gid=gid,
    )


def served_checkpoint(settings: Settings) -> Path:
    """The directory the engine serves without fetching anything: resolve()'s first two choices."""
    local = Path(settings.model)
    return local if settings.model_source in ("auto", "local") and local.is_dir() else settings.model_dir


def golden_finding(settings: Settings) -> Finding:
    """The engine's own comparison of its weights with the golden file's, judged as its start would.
    Not part of preflight: the engine's start makes it itself, on whatever platform."""
    from palmyra_serve.model.digest import compare_with_golden

    if settings.golden_file is None:
        return check_golden_digest(None, settings.golden_digest)
    return check_golden_digest(
        compare_with_golden(settings.golden_file, served_checkpoint(settings)), settings.golden_digest
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    findings = diagnose(args.root, wanted(settings, os.environ, args.image_arch), run_npu_smi=not args.skip_npu_smi)
    findings.append(golden_finding(settings))
    if args.only:
        unknown = sorted(set(args.only) - {f.check for f in findings})
        if unknown:
            print(f"doctor: no check named {', '.join(unknown)}; the checks: {', '.join(f.check for f in findings)}")
            return 2
        findings = [f for f in findings if f.check in args.only]
    print(render_json(findings) if args.json else render_text(findings))
    return exit_status(findings)


def preflight(settings: Settings, mode: str) -> bool:
    """The engine's start on Ascend: log every finding; False (do not start) when one is a stop
    and mode is "stop". One `npu-smi info` and a few stat calls: 9 ms median on a stand-in host
    (a script for npu-smi), so the real npu-smi's own run time is what it adds to a start."""
    if mode == "off":
        return True
    findings = diagnose("/", wanted(settings, os.environ))
    for f in findings:
        level = logging.WARNING if f.level in ("warn", "stop") else logging.INFO
        log.log(level, "doctor: %s: %s", f.check, f.message, extra={"fields": {"doctor": f.level, "fix": f.fix}})
    result = verdict(findings)
    if exit_status(findings) and mode == "stop":
        log.error("doctor: refusing to start: %s (PALMYRA_DOCTOR=warn starts it anyway)", result)
        return False
    log.info("doctor: %s", result)
    return True
