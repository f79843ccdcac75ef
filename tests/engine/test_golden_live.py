"""The golden check on the real engine: the tiny stand-in agrees with its own fp32 golden reference
check after check (no false alarm; benchmarks/results/golden-soak.md runs many more), and a
reference recorded for other weights (another seed) keeps the replica out of rotation with the
reason `output_drift`."""

from __future__ import annotations

import json
import time
from pathlib import Path

import httpx
import pytest

from palmyra_serve.model import stand_in
from palmyra_serve.tools import golden
from tests.helpers import procs
from tests.helpers.models import stand_in_model
from tests.helpers.waiting import wait_until

TOKENS = 8  # per prompt: the check's cost, 22 prompts x 8 tokens
# The tiny stand-in's random weights give flat distributions (median top-2 margin 0.05 nats), so
# the default tolerance would call half of its positions ties. Measured on it (docs/validate-and-
# bench.md): bf16 moves a chosen token's log-probability by at most 0.008 nats against fp32, and
# its greedy path parted from fp32's only at margins under 0.008; 0.02 leaves 2.5x headroom.
TOLERANCE = "0.02"
# Checks close together, so that a few run in a test's time: the interval (1 s) is shorter than the
# replay (2 to 3 s here), so the share is what spaces them (the next is due 1 / 0.5 = 2 replays'
# seconds after one began): the bound on the check's cost, on the real engine's timings.
SCHEDULE = {"PALMYRA_GOLDEN_INTERVAL_S": "1", "PALMYRA_GOLDEN_MAX_SHARE": "0.5"}


def _record(model_dir: Path, out: Path) -> Path:
    out.write_text(json.dumps(golden.record(model_dir, TOKENS, 3)))
    return out


@pytest.fixture(scope="module")
def references(tmp_path_factory) -> dict[str, Path]:
    here = tmp_path_factory.mktemp("golden")
    other = stand_in.build(here / "seed1", "tiny", seed=1)
    return {"own": _record(stand_in_model("tiny"), here / "own.json"), "other": _record(other, here / "other.json")}


def _counter(page: str, verdict: str) -> float:
    for line in page.splitlines():
        if line.startswith(f'palmyra_golden_checks_total{{verdict="{verdict}"}}'):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def test_its_own_reference_agrees_check_after_check(engine_server, log_dir, references):
    env = {"PALMYRA_GOLDEN_FILE": str(references["own"]), "PALMYRA_GOLDEN_TOLERANCE": TOLERANCE, **SCHEDULE}
    with (
        procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as sc,
        httpx.Client(timeout=10) as client,
    ):

        def two_checks() -> str | None:
            page = client.get(f"{sc.url}/metrics").text
            return page if _counter(page, "agree") >= 2 else None

        page = wait_until(two_checks, 120, "two golden checks")
        body = client.get(f"{sc.url}/ready").json()
    assert body["ready"] is True, body
    output = body["output"]
    assert output["verdict"] == "agree" and output["failed_prompts"] == []
    assert output["positions_compared"] > 0 and output["agreement"] > 0.5
    assert _counter(page, "drift") == 0 and _counter(page, "error") == 0
    # Idle: no check waited for capacity; the next is due max(1 s, 2 x its seconds) after it began.
    assert output["in_flight"] == 0 and output["waited_s"] < 2.0
    assert abs(output["next_in_s"] - (max(1.0, 2 * output["seconds"]) - output["seconds"])) < 0.1, output
    print(f"golden checks: {_counter(page, 'agree'):.0f} agreed; last: {output}")


def test_a_reference_for_other_weights_keeps_the_replica_out_with_output_drift(engine_server, log_dir, references):
    env = {"PALMYRA_GOLDEN_FILE": str(references["other"]), "PALMYRA_GOLDEN_TOLERANCE": TOLERANCE, **SCHEDULE}
    t0 = time.monotonic()
    with (
        procs.sidecar(
            engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env, wait_ready=False
        ) as sc,
        httpx.Client(timeout=10) as client,
    ):
        body = wait_until(
            lambda: b if (b := client.get(f"{sc.url}/ready").json()).get("output") else None,
            120,
            "the first golden check",
        )
        took = time.monotonic() - t0
        assert body["ready"] is False and body["last_error"].startswith("output_drift: ")
        assert body["output"]["verdict"] == "drift" and len(body["output"]["failed_prompts"]) >= 11
        assert client.get(f"{sc.url}/v1/models").status_code in (200, 401)  # it serves; rotation is /ready's
    print(f"drift detected {took:.1f} s after the sidecar started: {body['output']}")
