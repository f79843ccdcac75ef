"""Fuzzing with schemathesis: cases generated from the sidecar's own OpenAPI document (relayed and own
routes, valid and invalid bodies) against the real sidecar and the real engine. Zero 5xx, zero
hangs, the sidecar process stays up, and the engine still generates afterwards.

Generation cost is bounded, not the input space: a case asking for hundreds of tokens (or none,
which means "up to max-model-len") or many choices is capped before it is sent, so each case costs
at most a few dozen tokens on the CPU engine. Values the engine must reject (negative, huge, wrong
types) are left as generated.
"""

from __future__ import annotations

import collections
import time

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.core.result import Err

from tests.helpers.api import HTTP
from tests.helpers.reliability import figure, generate_ok

CASE_TIMEOUT_S = 30.0
TOKEN_CAP, N_CAP = 16, 2


def bound_cost(body: object) -> None:
    if not isinstance(body, dict):
        return
    for param in ("max_tokens", "max_completion_tokens"):
        value = body.get(param)
        if value is None or (isinstance(value, int) and not isinstance(value, bool) and TOKEN_CAP < value <= 4096):
            body[param] = TOKEN_CAP
    n = body.get("n")
    if isinstance(n, int) and not isinstance(n, bool) and N_CAP < n <= 16384:
        body["n"] = N_CAP


def fuzz(base_url: str, max_examples: int) -> tuple[collections.Counter, list[str], float]:
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    seen: collections.Counter = collections.Counter()
    failures: list[str] = []
    t0 = time.monotonic()
    for result in schema.get_all_operations():
        if isinstance(result, Err):  # an operation the document describes wrongly is a finding too
            failures.append(f"invalid operation in the API document: {result.err()}")
            continue
        operation = result.ok()
        for mode in GenerationMode:
            _fuzz_one(base_url, operation, mode, max_examples, seen, failures)
    return seen, failures, time.monotonic() - t0


def _fuzz_one(
    base_url: str,
    operation: schemathesis.APIOperation,
    mode: GenerationMode,
    max_examples: int,
    seen: collections.Counter,
    failures: list[str],
) -> None:
    """One operation in one generation mode. A function of its own so that the test hypothesis
    builds closes over this call's operation and mode, not over the caller's loop variables."""

    @settings(
        max_examples=max_examples,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
        phases=[Phase.explicit, Phase.generate],
    )
    @given(case=operation.as_strategy(generation_mode=mode))
    def run(case: schemathesis.Case) -> None:
        bound_cost(case.body)
        try:
            resp = case.call(base_url=base_url, timeout=CASE_TIMEOUT_S)
        except Exception as exc:  # a hang or a dropped connection is a failure, not a crash of the test
            failures.append(f"{operation.label} [{mode.value}] {type(exc).__name__}: {case.body!r:.200}")
            return
        seen[(operation.label, resp.status_code)] += 1
        if resp.status_code >= 500:
            failures.append(
                f"{operation.label} [{mode.value}] {resp.status_code}: {case.body!r:.200} -> {resp.text[:200]}"
            )

    try:
        run()
    except Unsatisfiable:
        pass  # no invalid input exists for an operation without parameters


def check(sidecar_server, engine_server, max_examples: int, label: str) -> None:
    seen, failures, took = fuzz(sidecar_server.url, max_examples)
    statuses: collections.Counter[int] = collections.Counter()
    for (_, status), count in seen.items():
        statuses[status] += count
    figure(
        label,
        cases=sum(seen.values()) + len(failures),
        seconds=round(took, 1),
        statuses=dict(sorted(statuses.items())),
        failures=len(failures),
    )
    for failure in failures[:20]:
        print("  " + failure)
    assert sidecar_server.proc.poll() is None, "the sidecar crashed"
    assert HTTP.get(f"{engine_server.url}/health", timeout=5).status_code == 200
    assert HTTP.get(f"{sidecar_server.url}/ready", timeout=5).status_code == 200
    assert generate_ok(sidecar_server.url)
    assert sum(seen.values()) > 300, "too few cases reached the server for this to mean anything"
    assert not failures


def test_fuzz_the_openapi_surface(sidecar_server, engine_server):
    check(sidecar_server, engine_server, 100, "fuzzing")


@pytest.mark.long
def test_fuzz_the_openapi_surface_long(sidecar_server, engine_server):
    check(sidecar_server, engine_server, 2000, "fuzzing (long)")
