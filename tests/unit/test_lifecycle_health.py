"""Pure parts of the sidecar: key checks, liveness/readiness judgements, and the drain state readiness
shares with admission."""

from __future__ import annotations

import asyncio
from typing import ClassVar

import pytest

from palmyra_serve.sidecar.admission.control import Draining
from palmyra_serve.sidecar.lifecycle.health import HealthState
from palmyra_serve.sidecar.observability.metrics import SidecarMetrics
from palmyra_serve.sidecar.relay.auth import ApiKeys
from palmyra_serve.sidecar.relay.handler import request_id_from


def test_one_drain_state_turns_readiness_first_then_closes_admission():
    """The app's readiness and admission read one drain state (lifecycle/drain.py): announced, the
    replica is not ready yet still admits; closed, admission refuses and the drain waits."""
    from palmyra_serve.settings import Settings
    from palmyra_serve.sidecar.app import SidecarState

    async def scenario():
        state = SidecarState(Settings(_env_file=None, auth_disabled=True), SidecarMetrics())
        state.health.record_health(True, "ok")
        state.health.set_phase("ready")
        state.health.begin_drain()
        assert not state.health.readiness()[0] and not state.admission.draining
        ticket = await state.admission.acquire()  # endpoints still route here: served
        drained = asyncio.create_task(state.admission.drain(5))
        await asyncio.sleep(0)
        assert state.admission.draining and state.health.draining
        with pytest.raises(Draining):
            await state.admission.acquire()
        state.admission.release(ticket)
        assert await drained is True

    asyncio.run(scenario())


def test_api_keys_accept_only_whole_bearer_keys():
    keys = ApiKeys(["k-123-abcd", "other-key-9"])
    assert keys.check(b"Bearer k-123-abcd") and keys.check(b"bearer other-key-9")
    for bad in (None, b"", b"Bearer k-123-abc", b"Bearer k-123-abcde", b"k-123-abcd", b"Basic k-123-abcd", b"Bearer "):
        assert not keys.check(bad)
    assert ApiKeys([], disabled=True).check(None)


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_liveness_starting_dead_hung_and_readiness():
    clock = Clock()
    h = HealthState(SidecarMetrics(), liveness_budget_s=30, clock=clock)
    assert h.liveness()[1]["status"] == "starting" and not h.liveness()[0]
    h.record_health(True, "ok")
    h.set_phase("ready")
    assert h.liveness()[0] and h.readiness()[0]
    h.record_health(False, "refused")
    assert h.liveness()[1]["status"] == "engine_dead" and not h.readiness()[0]
    h.record_health(True, "ok")
    h.record_health(False, "timeout")  # a slow /health is tolerated until the budget is spent
    clock.t += 29
    assert h.liveness()[0]
    clock.t += 2
    assert h.liveness()[1]["status"] == "engine_hung"
    h.record_health(True, "ok")
    h.record_generation(False)
    clock.t += 31
    h.record_health(True, "ok")
    assert h.liveness()[1]["status"] == "engine_hung"  # /health fine, generations failing past budget
    h.record_generation(True)
    assert h.liveness()[0]
    h.begin_drain()
    assert not h.readiness()[0] and h.readiness()[1]["phase"] == "draining" and h.liveness()[0]


def test_a_relay_failure_drops_readiness_until_a_poll_sent_after_it():
    clock = Clock()
    h = HealthState(SidecarMetrics(), liveness_budget_s=30, clock=clock)
    h.record_health(True, "ok")
    h.set_phase("ready")
    asked_before = clock.t
    clock.t += 0.1
    h.report_engine_failure("stream_interrupted")
    ready, body = h.readiness()
    assert not ready and body["relay_failure"] == "stream_interrupted"
    assert h.liveness()[0]  # one cut stream is not a dead engine: liveness waits for the poll
    h.record_health(True, "ok", asked_at=asked_before)  # a poll already under way says nothing of it
    assert not h.readiness()[0]
    clock.t += 0.1
    h.record_health(True, "ok", asked_at=clock.t)
    assert h.readiness()[0] and h.readiness()[1]["relay_failure"] is None


def test_request_ids():
    assert request_id_from(b"abc-DEF_1.2:3") == "abc-DEF_1.2:3"
    assert len(request_id_from(b"has space")) == 32 and len(request_id_from(b"x" * 129)) == 32


def test_engine_error_bodies_are_rebuilt_in_openai_shape_and_5xx_text_never_reaches_the_client():
    import orjson

    from palmyra_serve.sidecar.errors import MAX_CLIENT_MESSAGE, from_engine

    shaped = b'{"error": {"message": "bad", "type": "BadRequestError", "param": "n", "code": 400, "extra": 1}}'
    assert orjson.loads(from_engine(400, shaped, "Bad Request", "rid"))["error"] == {
        "message": "bad",
        "type": "BadRequestError",
        "param": "n",
        "code": 400,
    }, "only OpenAI's four fields"
    for status, body, message in (
        (404, b'{"detail":"Not Found"}', "Not Found"),
        (401, b'{"error":"Unauthorized"}', "Unauthorized"),
        (400, b'{"detail":[{"msg":"bad utf-8"}]}', '[{"msg":"bad utf-8"}]'),
        (405, b"", "Method Not Allowed"),
    ):
        err = orjson.loads(from_engine(status, body, message if not body else "x", "rid"))["error"]
        assert err["message"] == message and err["code"] == status and err["param"] is None
        assert err["type"] == "invalid_request_error"
    long = orjson.dumps({"error": {"message": "m" * 10_000, "code": 400}})
    assert len(orjson.loads(from_engine(400, long, "x", "rid"))["error"]["message"]) == MAX_CLIENT_MESSAGE
    # A 5xx's text (here a traceback holding a token) stays in the log: the client gets the request id.
    secret = b'{"error": {"message": "Traceback ... api_key=sk-live-123", "code": 500}}'
    for status, body in ((500, secret), (502, b"<html>bad gateway</html>"), (503, b"")):
        err = orjson.loads(from_engine(status, body, "x", "req-7"))["error"]
        assert "sk-live" not in err["message"] and "html" not in err["message"] and "req-7" in err["message"]
        assert (err["type"], err["code"]) == ("server_error", "engine_error")


def test_access_log_writes_one_json_line_per_request_buffered_briefly():
    import io
    import json
    import logging

    from palmyra_serve.sidecar.observability import access_log

    logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.INFO)
    try:

        async def scenario() -> list[str]:
            stream = io.StringIO()
            log = access_log.AccessLog(stream)
            log.write(1796400000.25, {"request_id": "a", "status": 200})
            log.write(1796400000.5, {"request_id": "b", "status": 429})
            assert stream.getvalue() == ""  # held back, not a write per request
            async with asyncio.timeout(5):  # flushed within FLUSH_S, with no further write to trigger it
                while stream.getvalue().count("\n") < 2:
                    await asyncio.sleep(access_log.FLUSH_S / 5)
            return stream.getvalue().splitlines()

        lines = [json.loads(line) for line in asyncio.run(scenario())]
    finally:
        logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.NOTSET)
    assert [(e["request_id"], e["status"]) for e in lines] == [("a", 200), ("b", 429)]
    assert lines[0]["ts"] == "2026-12-04T16:00:00.250Z" and lines[1]["ts"].endswith(":00.500Z")
    assert {k: lines[0][k] for k in ("level", "logger", "msg")} == {
        "level": "info",
        "logger": "palmyra.access",
        "msg": "request",
    }


def test_access_log_is_silent_above_info():
    import io
    import logging

    from palmyra_serve.sidecar.observability import access_log

    logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.WARNING)
    try:
        stream = io.StringIO()
        log = access_log.AccessLog(stream)
        log.write(0.0, {"request_id": "a"})
        log.flush()
    finally:
        logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.NOTSET)
    assert stream.getvalue() == ""


def test_response_headers_are_an_allow_list_of_what_describes_the_body():
    from palmyra_serve.sidecar.relay.handler import _response_headers

    class Resp:
        raw_headers: ClassVar[list[tuple[bytes, bytes]]] = [
            (b"Content-Type", b"application/json"),
            (b"Connection", b"keep-alive, X-Hop"),
            (b"x-hop", b"1"),
            (b"Proxy-Connection", b"keep-alive"),
            (b"Keep-Alive", b"timeout=5"),
            (b"Transfer-Encoding", b"chunked"),
            (b"x-internal", b"2"),
            (b"server", b"uvicorn"),
            (b"set-cookie", b"session=1"),
            (b"access-control-allow-origin", b"*"),
            (b"content-length", b"12"),
            (b"retry-after", b"3"),
            (b"x-request-id", b"engine's"),
        ]

    headers = _response_headers(Resp(), "rid-1")  # type: ignore[arg-type]
    assert headers == [
        (b"Content-Type", b"application/json"),
        (b"content-length", b"12"),
        (b"retry-after", b"3"),
        (b"x-request-id", b"rid-1"),
    ]


def test_ready_phase_agrees_with_the_verdict_on_the_page_and_the_metric():
    from prometheus_client import generate_latest

    clock = Clock()
    metrics = SidecarMetrics()
    h = HealthState(metrics, liveness_budget_s=30, clock=clock)
    h.record_health(True, "ok")
    h.set_phase("ready")
    assert h.readiness()[1]["phase"] == "ready"
    h.report_engine_failure("stream_interrupted")  # warmed up, but the engine just failed a stream
    ready, body = h.readiness()
    assert not ready and body["phase"] == "not_ready", "never 'ready' beside ready: false"
    page = generate_latest(metrics.registry).decode()
    assert 'palmyra_warmup_phase{phase="not_ready"} 1.0' in page
    assert 'palmyra_warmup_phase{phase="ready"} 0.0' in page


def test_the_sidecars_own_faults_turn_readiness_false_and_a_completed_request_clears_them():
    from palmyra_serve.sidecar.lifecycle.health import SIDECAR_FAULT, SIDECAR_FAULT_HOLD_S, SIDECAR_FAULTS_NOT_READY

    clock = Clock()
    h = HealthState(SidecarMetrics(), liveness_budget_s=30, clock=clock)
    h.record_health(True, "ok")
    h.set_phase("ready")
    for _ in range(SIDECAR_FAULTS_NOT_READY - 1):
        h.report_sidecar_fault()
    assert h.readiness()[0], "one fault is a request's bad luck, not a broken replica"
    h.report_sidecar_fault()
    ready, body = h.readiness()
    assert not ready and body["relay_failure"] == SIDECAR_FAULT and body["phase"] == "not_ready"
    clock.t += SIDECAR_FAULT_HOLD_S + 1
    assert h.readiness()[0], "ready again after the hold: the next requests say whether it is still broken"
    h.report_sidecar_fault()
    assert not h.readiness()[0]
    h.sidecar_faults_in_row = 0  # what the relay does when a request completes
    assert h.readiness()[0]


def test_a_fault_in_the_relay_is_a_500_counted_and_told_to_readiness():
    import asyncio

    from palmyra_serve.settings import Settings
    from palmyra_serve.sidecar.admission.control import build_admission
    from palmyra_serve.sidecar.admission.plan import AdmissionPlan
    from palmyra_serve.sidecar.relay.auth import ApiKeys
    from palmyra_serve.sidecar.relay.handler import Relay

    settings = Settings(auth_disabled=True)
    metrics = SidecarMetrics()
    health = HealthState(metrics, liveness_budget_s=30)
    health.record_health(True, "ok")
    health.set_phase("ready")
    admission = build_admission(settings, AdmissionPlan.of(settings))
    relay = Relay(settings, metrics, admission, ApiKeys.from_settings(settings), health)

    def broken(body: bytes, entry: object) -> None:
        raise RuntimeError("a bug in the sidecar")

    relay._check_cost = broken  # type: ignore[method-assign]  # the injected fault
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b'{"prompt": "x"}', "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {"type": "http", "method": "POST", "path": "/v1/completions", "headers": [], "query_string": b""}
    for _ in range(3):
        asyncio.run(relay(scope, receive, send))
    starts = [m for m in sent if m["type"] == "http.response.start"]
    assert [m["status"] for m in starts] == [500, 500, 500]
    assert b"internal_error" in sent[1]["body"]
    assert metrics.internal_errors._value.get() == 3
    assert not health.readiness()[0]


def test_a_fault_while_admission_learns_leaves_the_limit_and_frees_the_slot():
    import asyncio

    from palmyra_serve.sidecar.admission.adaptive import AdaptiveAdmission
    from palmyra_serve.sidecar.admission.limit import ConcurrencyGate, LimitConfig

    async def scenario() -> AdaptiveAdmission:
        adm = AdaptiveAdmission(ConcurrencyGate(LimitConfig(initial_limit=4, min_samples=1, window_s=0), 16))
        counted: list[int] = []
        adm.on_fault = lambda: counted.append(1)

        def broken() -> float:
            raise ZeroDivisionError("an arithmetic bug")

        adm.gate.limiter._next_limit = broken  # type: ignore[method-assign]  # the injected fault
        for _ in range(5):
            ticket = await adm.acquire()
            adm.first_token(ticket)
            adm.release(ticket, 0.01)
        assert counted == [1] * 10
        return adm

    adm = asyncio.run(scenario())
    assert adm.faults == 10 and adm.limit == 4 and adm.in_flight == 0
