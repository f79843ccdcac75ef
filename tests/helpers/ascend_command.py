"""The engine command the engine-ascend image runs, generated here on the host.

One definition for two checks, so that the line vLLM 0.18.0's parser accepts is the line the image
prints: test_ascend_image.py generates it with the launcher on the host and parses it;
tests/container/test_ascend_rehearsal.py runs the same argv, with the same environment, in the
rehearsal image and asserts the printed line equals this one (only the interpreter's path differs).

The argv is the Dockerfile's own CMD of the engine-ascend stage (what Compose and the manifests run
too) plus `--no-fetch --print-command`; the environment is what a deployment gives the engine
(the weights' directory as PALMYRA_MODEL, an engine key) plus any setting a case adds.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
STAGE = "engine-ascend"
PRINT = ("--no-fetch", "--print-command")
# The weights model-init put on /models, as Compose sets PALMYRA_MODEL (in k8s the launcher resolves
# the configMap's hub id to the same directory), and an engine key.
DEPLOYED_ENV = {"PALMYRA_MODEL": "/models/palmyra-mini", "PALMYRA_ENGINE_API_KEY": "k"}


def stage_text(stage: str = STAGE) -> str:
    """The lines of one Dockerfile stage, from its FROM to the next FROM."""
    text = (REPO / "Dockerfile").read_text()
    match = re.search(rf"^FROM \S+ AS {re.escape(stage)}$(.*?)(?=^FROM |\Z)", text, re.MULTILINE | re.DOTALL)
    assert match, f"no stage {stage} in the Dockerfile"
    return match.group(1)


def image_cmd(stage: str = STAGE) -> list[str]:
    """The stage's CMD (exec form)."""
    cmds = re.findall(r"^CMD (\[.*\])$", stage_text(stage), re.MULTILINE)
    assert len(cmds) == 1, f"{stage}: {len(cmds)} CMD lines"
    cmd = json.loads(cmds[0])
    assert cmd[:2] == ["palmyra-serve", "engine"], cmd
    return cmd


def image_env(stage: str = STAGE) -> dict[str, str]:
    """The stage's ENV values (the `ENV K=V \\` block form the Dockerfile uses)."""
    env: dict[str, str] = {}
    for block in re.findall(r"^ENV (.*?)(?<!\\)$", stage_text(stage), re.MULTILINE | re.DOTALL):
        for word in shlex.split(block.replace("\\\n", " ")):
            key, sep, value = word.partition("=")
            assert sep, f"{stage}: ENV {word} is not K=V"
            env[key] = value
    return env


def print_argv() -> list[str]:
    """What to run in the image: its CMD, printing instead of starting vLLM."""
    return [*image_cmd(), *PRINT]


def split(line: str) -> tuple[dict[str, str], list[str]]:
    """A printed command: the environment assignments it starts with, then the argv."""
    words = shlex.split(line)
    assigned = {}
    while words and re.fullmatch(r"[A-Z_][A-Z0-9_]*=.*", words[0]):
        key, _, value = words.pop(0).partition("=")
        assigned[key] = value
    return assigned, words


def host_command(platform: str = "ascend", **settings: str) -> tuple[dict[str, str], list[str]]:
    """The line the launcher prints here for `platform`, with DEPLOYED_ENV and `settings` set."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALMYRA_")}
    env.update({"PYTHONPATH": str(REPO / "service"), **DEPLOYED_ENV, "PALMYRA_PLATFORM": platform, **settings})
    run = subprocess.run(
        [sys.executable, "-m", "palmyra_serve.cli", *print_argv()[1:]],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=True,
    )
    return split(run.stdout)
