"""service/palmyra_serve/variables.py: a PALMYRA_* name that is neither a setting nor a known
variable is named at start, with the closest known one; settings and known variables are not."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

from palmyra_serve.variables import NON_SETTINGS, setting_names, unknown, warn_unknown
from tests.helpers.procs import free_port


def test_a_typo_is_named_with_the_setting_it_resembles_and_known_names_pass():
    names = ["PALMYRA_ENFORCE_EAGRE", "PALMYRA_DTYPE", "PALMYRA_BIND", "PALMYRA_NOTHING_LIKE_IT", "HOME"]
    assert unknown(names) == [("PALMYRA_ENFORCE_EAGRE", "PALMYRA_ENFORCE_EAGER"), ("PALMYRA_NOTHING_LIKE_IT", None)]
    assert unknown(sorted(setting_names() | set(NON_SETTINGS))) == []


def test_each_unknown_variable_is_one_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="palmyra_serve.variables"):
        warn_unknown({"PALMYRA_MAX_MODEL_LENGTH": "4096", "PALMYRA_PORT": "8080"})
    (record,) = caplog.records
    assert record.getMessage() == (
        "PALMYRA_MAX_MODEL_LENGTH is not a palmyra-serve setting and is ignored; did you mean PALMYRA_MAX_MODEL_LEN?"
    )


def test_the_sidecar_says_so_at_start():
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALMYRA_")}
    env.update(PALMYRA_AUTH_DISABLED="true", PALMYRA_MAX_IN_FLGHT="8", PALMYRA_PORT=str(free_port()))
    proc = subprocess.Popen(
        [sys.executable, "-m", "palmyra_serve.cli", "sidecar"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    want = "PALMYRA_MAX_IN_FLGHT is not a palmyra-serve setting and is ignored; did you mean PALMYRA_MAX_IN_FLIGHT?"
    try:
        assert proc.stdout is not None
        lines = []
        for line in proc.stdout:  # the warning comes before uvicorn's first line
            lines.append(line)
            if want in line or "uvicorn" in line or len(lines) > 50:
                break
    finally:
        proc.terminate()
        proc.communicate(timeout=30)  # reads the rest and closes the pipe
    assert any(want in line for line in lines), lines
