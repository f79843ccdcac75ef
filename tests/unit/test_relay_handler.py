"""The relay's hot path (relay/handler.py) in-process: the real Relay with real admission, metrics
and health, driven through ASGI with no server; the engine pool and the client's disconnect are
injected (ScriptedPool, a fault-injection stand-in for upstream/pool.py's EnginePool).

The scope carries no front-end DisconnectHook, as under any ASGI server other than the sidecar's
own: a client's going away is then heard through ASGI's `http.disconnect`.

Then the relay's parts on their own: the request id it takes from the client or makes, the
allow-list of engine response headers it passes on, and a fault in the relay itself, answered as a
500, counted and told to readiness."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any, ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.admission.control import build_admission
from palmyra_serve.sidecar.admission.plan import AdmissionPlan
from palmyra_serve.sidecar.core.disconnect import DISCONNECT_HOOK, DisconnectHook
from palmyra_serve.sidecar.core.metrics import SidecarMetrics
from palmyra_serve.sidecar.lifecycle.health import HealthState
from palmyra_serve.sidecar.observability import access_log
from palmyra_serve.sidecar.relay.handler import Relay
from palmyra_serve.sidecar.relay.ingress import request_id_from
from palmyra_serve.sidecar.tenants.keys import ApiKeys
from palmyra_serve.sidecar.tenants.tenancy import Tenancy
from palmyra_serve.sidecar.upstream.failures import StreamInterrupted

BODY = b'{"model": "m", "prompt": "hi", "max_tokens": 8, "stream": true}'


def sse_token(i: int) -> bytes:
    event = {"id": "c", "object": "text_completion", "choices": [{"index": 0, "text": f"t{i}", "finish_reason": None}]}
    return b"data: " + json.dumps(event).encode() + b"\n\n"


class ScriptedResponse:
    """An engine response whose body arrives as scripted: bytes, a pause on an event, or a fault."""

    def __init__(self, status: int, content_type: bytes, script: list[Any]) -> None:
        self.status = status
        self.reason = "OK"
        self.raw_headers = [(b"content-type", content_type), (b"server", b"engine"), (b"set-cookie", b"x=1")]
        self.content_type = content_type.decode()
        self._script = list(script)
        self.released = False

    async def read_some(self) -> bytes:
        while self._script:
            step = self._script.pop(0)
            if isinstance(step, asyncio.Event):
                await step.wait()
                continue
            if isinstance(step, Exception):
                raise step
            return step
        return b""

    @property
    def finished(self) -> bool:
        return not self._script

    def release(self) -> None:
        self.released = True


class ScriptedPool:
    def __init__(self, response: ScriptedResponse) -> None:
        self.response = response
        self.requests: list[tuple[str, bytes, list[tuple[bytes, bytes]]]] = []

    async def request(self, method: str, target: bytes, headers: list[tuple[bytes, bytes]], body: bytes) -> Any:
        self.requests.append((method, target, headers))
        return self.response


class Harness:
    def __init__(self, response: ScriptedResponse) -> None:
        self.settings = Settings(auth_disabled=True)
        self.metrics = SidecarMetrics()
        self.health = HealthState(self.metrics, liveness_budget_s=30)
        self.admission = build_admission(self.settings, AdmissionPlan.of(self.settings))
        self.learnt: list[tuple[float | None, str]] = []
        release = self.admission.release

        def spy(ticket: Any, itl_s: float | None = None, outcome: Any = "ok") -> None:
            self.learnt.append((itl_s, outcome))
            release(ticket, itl_s, outcome)

        self.admission.release = spy  # type: ignore[method-assign]  # a spy: the real release still runs
        self.log = io.StringIO()
        self.pool = ScriptedPool(response)
        self.relay = Relay(
            self.settings,
            self.metrics,
            self.admission,
            Tenancy(self.settings, ApiKeys.from_settings(self.settings)),
            self.health,
            pool=self.pool,  # type: ignore[arg-type]
            access_log=access_log.AccessLog(self.log),
        )
        self.sent: list[dict] = []

    async def call(self, receive: Callable[[], Awaitable[dict]], scope_extra: dict | None = None) -> None:
        scope = {
            "type": "http",
            "method": "POST",
            "path": "/v1/completions",
            "headers": [(b"content-type", b"application/json"), (b"x-request-id", b"req-1")],
            "query_string": b"",
            **(scope_extra or {}),
        }

        async def send(message: dict) -> None:
            self.sent.append(message)

        await self.relay(scope, receive, send)
        self.relay.publish.access_log.flush()

    def logged(self) -> dict:
        lines = self.log.getvalue().splitlines()
        assert len(lines) == 1, lines
        return json.loads(lines[0])

    def body(self) -> bytes:
        return b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body")


def body_then(after: asyncio.Event | None = None) -> Callable[[], Awaitable[dict]]:
    """ASGI receive: the request body, then (once `after` is set, or never) the client's disconnect."""
    messages = [{"type": "http.request", "body": BODY, "more_body": False}]

    async def receive() -> dict:
        if messages:
            return messages.pop(0)
        if after is None:
            await asyncio.Event().wait()
        else:
            await after.wait()
        return {"type": "http.disconnect"}

    return receive


@pytest.fixture(autouse=True)
def access_log_on() -> Any:
    logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.INFO)
    yield
    logging.getLogger(access_log.LOGGER_NAME).setLevel(logging.NOTSET)


def test_a_stream_is_relayed_chunk_by_chunk_counted_logged_and_taught_to_admission() -> None:
    chunks = [sse_token(i) for i in range(12)] + [b"data: [DONE]\n\n"]
    h = Harness(ScriptedResponse(200, b"text/event-stream", chunks))
    asyncio.run(h.call(body_then()))

    start = h.sent[0]
    assert start["status"] == 200
    names = [n for n, _ in start["headers"]]
    assert names == [b"content-type", b"x-request-id"]  # the engine's server and set-cookie stay inside
    bodies = [m for m in h.sent if m["type"] == "http.response.body"]
    assert [m["body"] for m in bodies] == chunks  # one write per chunk as it came, never buffered
    assert bodies[-1]["more_body"] is False and all(m["more_body"] for m in bodies[:-1])
    assert h.pool.response.released
    method, target, headers = h.pool.requests[0]
    assert (method, target) == ("POST", b"/v1/completions") and (b"x-request-id", b"req-1") in headers

    line = h.logged()
    assert line["status"] == 200 and line["completion_tokens"] == 12 and line["request_id"] == "req-1"
    assert {"ttft_ms", "itl_ms", "duration_ms"} <= line.keys()
    assert "error" not in line and "client_paced" not in line
    assert len(h.learnt) == 1 and h.learnt[0][1] == "ok" and h.learnt[0][0] is not None
    assert h.learnt[0][0] == pytest.approx(line["itl_ms"] / 1000, abs=1e-6)
    assert h.admission.in_flight == 0


def test_a_client_leaving_mid_stream_cancels_the_relay_under_a_plain_asgi_server() -> None:
    gone = asyncio.Event()
    never = asyncio.Event()  # the engine's next chunk, which the client never waits for
    h = Harness(ScriptedResponse(200, b"text/event-stream", [sse_token(0), sse_token(1), never, sse_token(2)]))

    async def scenario() -> None:
        call = asyncio.create_task(h.call(body_then(gone)))
        async with asyncio.timeout(5):
            while len(h.sent) < 3:  # the start and two chunks are out; the engine is now silent
                await asyncio.sleep(0.001)
        gone.set()
        async with asyncio.timeout(5):
            await call  # returns without the engine ever speaking again

    asyncio.run(scenario())
    line = h.logged()
    assert line["status"] == 499 and line["client_disconnected"] is True
    assert h.pool.response.released  # the engine connection is closed
    assert h.learnt == [(None, "ignore")] and h.admission.in_flight == 0


def test_the_front_ends_hook_is_used_when_present_and_no_receive_task_is_needed() -> None:
    never = asyncio.Event()
    h = Harness(ScriptedResponse(200, b"text/event-stream", [sse_token(0), never]))
    hook = DisconnectHook()

    async def scenario() -> None:
        call = asyncio.create_task(h.call(body_then(), {DISCONNECT_HOOK: hook}))
        async with asyncio.timeout(5):
            while hook.on_disconnect is None or len(h.sent) < 2:
                await asyncio.sleep(0.001)
        hook.lost = True
        hook.on_disconnect()  # what the front end's connection_lost does
        async with asyncio.timeout(5):
            await call

    asyncio.run(scenario())
    assert h.logged()["status"] == 499 and hook.on_disconnect is None


def test_an_engine_failure_mid_stream_ends_it_with_an_error_event_and_teaches_admission_nothing() -> None:
    h = Harness(
        ScriptedResponse(200, b"text/event-stream", [sse_token(0), sse_token(1), StreamInterrupted("engine reset")])
    )
    asyncio.run(h.call(body_then()))
    assert h.body().startswith(sse_token(0) + sse_token(1))
    assert b'"code":"stream_interrupted"' in h.body().replace(b" ", b"")
    line = h.logged()
    assert line["upstream_error"] == "stream_interrupted" and line["upstream_detail"] == "engine reset"
    assert h.learnt == [(None, "ignore")]


def test_a_json_generation_is_relayed_whole_and_its_usage_counted() -> None:
    answer = json.dumps(
        {"choices": [{"text": "x"}], "usage": {"prompt_tokens": 3, "completion_tokens": 5, "total_tokens": 8}}
    ).encode()
    h = Harness(ScriptedResponse(200, b"application/json", [answer[:10], answer[10:]]))
    asyncio.run(h.call(body_then()))
    assert h.body() == answer
    line = h.logged()
    assert (line["completion_tokens"], line["prompt_tokens"]) == (5, 3)
    assert "itl_ms" not in line and h.learnt == [(None, "ok")]


def test_request_ids():
    assert request_id_from(b"abc-DEF_1.2:3") == "abc-DEF_1.2:3"
    assert len(request_id_from(b"has space")) == 32 and len(request_id_from(b"x" * 129)) == 32


def test_response_headers_are_an_allow_list_of_what_describes_the_body():
    from palmyra_serve.sidecar.relay.pump import response_headers

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

    headers = response_headers(Resp(), "rid-1", [])  # type: ignore[arg-type]
    assert headers == [
        (b"Content-Type", b"application/json"),
        (b"content-length", b"12"),
        (b"retry-after", b"3"),
        (b"x-request-id", b"rid-1"),
    ]


def test_a_fault_in_the_relay_is_a_500_counted_and_told_to_readiness():
    import asyncio

    from palmyra_serve.settings import Settings
    from palmyra_serve.sidecar.admission.control import build_admission
    from palmyra_serve.sidecar.admission.plan import AdmissionPlan
    from palmyra_serve.sidecar.relay.handler import Relay
    from palmyra_serve.sidecar.tenants.keys import ApiKeys

    settings = Settings(auth_disabled=True)
    metrics = SidecarMetrics()
    health = HealthState(metrics, liveness_budget_s=30)
    health.record_health(True, "ok")
    health.set_phase("ready")
    admission = build_admission(settings, AdmissionPlan.of(settings))
    relay = Relay(settings, metrics, admission, Tenancy(settings, ApiKeys.from_settings(settings)), health)

    def broken(ctx: object) -> None:
        raise RuntimeError("a bug in the sidecar")

    relay.inspect = broken  # type: ignore[method-assign]  # the injected fault
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


def _compact(event: dict) -> bytes:
    return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"


@pytest.mark.parametrize("split", [False, True], ids=["whole-events", "usage-event-split"])
@pytest.mark.parametrize("null_usage", [False, True], ids=["vllm-0.32", "vllm-0.18"])
def test_the_usage_the_relay_asked_for_is_taken_out_whichever_read_carries_it(null_usage: bool, split: bool) -> None:
    """A stream whose client asked no usage: the relay asked the engine for it, and only the reads
    that may hold it go through the filter (every read on an engine that writes "usage":null, else
    the reads from the usage event on): the client gets the stream it asked for, the record the
    engine's count."""
    extra = {"usage": None} if null_usage else {}
    tokens = [_compact({"id": "c", "choices": [{"index": 0, "text": f"t{i}"}], **extra}) for i in range(6)]
    usage = _compact({"id": "c", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 6}})
    reads = [*tokens, *([usage[:20], usage[20:]] if split else [usage]), b"data: [DONE]\n\n"]
    h = Harness(ScriptedResponse(200, b"text/event-stream", reads))
    asyncio.run(h.call(body_then()))
    expected = b"".join(t.replace(b',"usage":null', b"") for t in tokens) + b"data: [DONE]\n\n"
    assert h.body() == expected
    assert h.logged()["completion_tokens"] == 6


CHAT_BODY = b'{"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "stream": true}'


def _engine_stream(chat: bool, null_usage: bool, finish_apart: bool) -> tuple[bytes, bytes]:
    """A stream as vLLM writes it when asked for usage (compact JSON; 0.18 adds "usage":null to each
    event but the usage report; the finish reason on the last token's event or on an empty one after it), and the
    bytes its client must get: the same without what the relay asked for."""
    extra = {"usage": None} if null_usage else {}
    kind = {"object": "chat.completion.chunk"} if chat else {"object": "text_completion"}

    def choice(i: int) -> dict:
        finish = {"finish_reason": "length"} if i == 4 and not finish_apart else {}
        return (
            {"index": 0, "delta": {"content": f"t{i}"}, **finish} if chat else {"index": 0, "text": f"t{i}", **finish}
        )

    events = [_compact({"id": "c", **kind, "choices": [choice(i)], **extra}) for i in range(5)]
    if chat:
        role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
        events.insert(0, _compact({"id": "c", **kind, "choices": [role], **extra}))
    if finish_apart:
        last = {"index": 0, "delta": {}} if chat else {"index": 0, "text": ""}
        events.append(_compact({"id": "c", **kind, "choices": [{**last, "finish_reason": "stop"}], **extra}))
    usage = _compact({"id": "c", **kind, "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})
    done = b"data: [DONE]\n\n"
    stream = b"".join(events) + usage + done
    return stream, b"".join(e.replace(b',"usage":null', b"") for e in events) + done


@settings(max_examples=200, deadline=None)
@given(chat=st.booleans(), null_usage=st.booleans(), finish_apart=st.booleans(), data=st.data())
def test_whatever_the_reads_the_client_gets_its_stream_without_the_usage_it_did_not_ask_for(
    chat: bool, null_usage: bool, finish_apart: bool, data: st.DataObject
) -> None:
    """The relay passes reads the accounting proved plain token events without a look; a usage
    event (or 0.18's "usage":null) anywhere, in a read of its own, coalesced with others or split
    at any byte, is still taken out, and the record keeps the engine's count. Reads are cut at
    event boundaries (vLLM's own writes), at any byte, or both."""
    stream, expected = _engine_stream(chat, null_usage, finish_apart)
    boundaries = [i + 2 for i in range(len(stream) - 1) if stream[i : i + 2] == b"\n\n"][:-1]
    cut = st.one_of(st.sampled_from(boundaries), st.integers(min_value=1, max_value=len(stream) - 1))
    points = sorted(set(data.draw(st.one_of(st.just(boundaries), st.lists(cut, max_size=12)), label="cuts")))
    reads = [stream[a:b] for a, b in zip([0, *points], [*points, len(stream)], strict=True)]
    h = Harness(ScriptedResponse(200, b"text/event-stream", reads))
    sent = [{"type": "http.request", "body": CHAT_BODY if chat else BODY, "more_body": False}]

    async def receive() -> dict:
        if sent:
            return sent.pop(0)
        await asyncio.Event().wait()
        return {"type": "http.disconnect"}

    path = "/v1/chat/completions" if chat else "/v1/completions"
    asyncio.run(h.call(receive, {"path": path}))
    assert h.body() == expected
    assert h.logged()["completion_tokens"] == 5
