"""The field policy's snapshot of vLLM's request models (tests/unit/data/vllm-request-fields.json)
against the vLLM installed here: its 0.32 half is what vLLM's own classes say, read by
tests/helpers/vllm_request_fields.py in a child interpreter (vLLM imports for seconds). The unit
tier holds the decisions to the snapshot; the vllm018 tier holds the 0.18.0 half to the running
engine (tests/engine/test_engine_contract.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
SNAPSHOT = TESTS / "unit" / "data" / "vllm-request-fields.json"
HELPER = TESTS / "helpers" / "vllm_request_fields.py"


def test_the_snapshot_is_this_venvs_vllm():
    versions = json.loads(SNAPSHOT.read_text())["versions"]
    out = subprocess.run([sys.executable, str(HELPER)], capture_output=True, text=True, timeout=120, check=True)
    live = json.loads(out.stdout.strip().splitlines()[-1])
    version = live.pop("vllm")
    assert live == versions[version], f"vLLM {version}'s request models changed: rerun {HELPER.name} and decide"
