"""Hostile and broken requests through the real sidecar to the real vLLM CPU engine: every one gets
a clear 4xx in OpenAI's error shape (never a 5xx), and the engine still generates afterwards."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.helpers import procs
from tests.helpers.api import HTTP, MODEL, completion
from tests.helpers.reliability import FAST, figure, generate_ok

pytestmark = pytest.mark.engine_contract  # also run against vLLM 0.18.0 (the vllm018 tier)

BODY_LIMIT = 64 * 1024
READ_TIMEOUT_S = 2.0
BODY_TIMEOUT_S = 2.0  # the body's own deadline (PALMYRA_BODY_TIMEOUT_S; 30 s by default)
RESULTS: list[tuple[str, int, bool]] = []  # (case, status, clear 4xx?) for the closing figure

JSON = {"content-type": "application/json"}
CHAT = "/v1/chat/completions"
COMPL = "/v1/completions"
RESP = "/v1/responses"
MSG = "/v1/messages"  # answered in Anthropic's shape, whose error object also has a message and a type

# (name, path, raw body) — raw bytes, so broken JSON and broken UTF-8 reach the server as sent.
CASES: list[tuple[str, str, bytes]] = [
    ("malformed JSON", COMPL, b'{"model": "palmyra-mini", "prompt": "hi",'),
    ("JSON array body", COMPL, b"[1, 2, 3]"),
    ("JSON null body", COMPL, b"null"),
    ("empty body", COMPL, b""),
    ("prompt of wrong type", COMPL, b'{"model": "palmyra-mini", "prompt": {"a": 1}, "max_tokens": 2}'),
    ("max_tokens of wrong type", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": "ten"}'),
    ("messages of wrong type", CHAT, b'{"model": "palmyra-mini", "messages": "hi", "max_tokens": 2}'),
    ("message without role", CHAT, b'{"model": "palmyra-mini", "messages": [{"content": "hi"}], "max_tokens": 2}'),
    ("missing prompt", COMPL, b'{"model": "palmyra-mini", "max_tokens": 2}'),
    ("unknown model", COMPL, b'{"model": "gpt-17", "prompt": "hi", "max_tokens": 2}'),
    ("empty prompt", COMPL, b'{"model": "palmyra-mini", "prompt": "", "max_tokens": 2}'),
    ("empty token list", COMPL, b'{"model": "palmyra-mini", "prompt": [], "max_tokens": 2}'),
    (
        "prompt over max-model-len",
        COMPL,
        b'{"model": "palmyra-mini", "max_tokens": 2, "prompt": [' + b", ".join([b"9707"] * 3000) + b"]}",
    ),
    ("token id beyond vocabulary", COMPL, b'{"model": "palmyra-mini", "prompt": [999999999], "max_tokens": 2}'),
    ("huge max_tokens", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 1000000000}'),
    (
        "max_tokens beyond int64",
        COMPL,
        b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 99999999999999999999999}',
    ),
    ("negative max_tokens", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": -5}'),
    ("negative temperature", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "temperature": -1}'),
    ("top_p above 1", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "top_p": 5}'),
    ("n = 0", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "n": 0}'),
    ("absurd n", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "n": 100000}'),
    (
        "absurd presence_penalty",
        COMPL,
        b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "presence_penalty": 1e300}',
    ),
    ("absurd logprobs", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "logprobs": 1000000}'),
    ("NaN temperature", COMPL, b'{"model": "palmyra-mini", "prompt": "hi", "max_tokens": 2, "temperature": NaN}'),
    ("invalid UTF-8", COMPL, b'{"model": "palmyra-mini", "prompt": "caf\xc3\x28 \xff\xfe", "max_tokens": 2}'),
    (
        "invalid UTF-8 in chat",
        CHAT,
        b'{"model": "palmyra-mini", "messages": [{"role": "user", "content": "\xed\xa0\x80"}], "max_tokens": 2}',
    ),
    ("responses: malformed JSON", RESP, b'{"model": "palmyra-mini", "input":'),
    ("responses: input of wrong type", RESP, b'{"model": "palmyra-mini", "input": 3}'),
    ("responses: unknown model", RESP, b'{"model": "gpt-17", "input": "hi", "max_output_tokens": 2}'),
    ("responses: huge max_output_tokens", RESP, b'{"model": "palmyra-mini", "input": "hi", "max_output_tokens": 1e12}'),
    ("responses: stored state", RESP, b'{"model": "palmyra-mini", "input": "hi", "previous_response_id": "r"}'),
    (
        "responses: image input",
        RESP,
        b'{"model": "palmyra-mini", "input": [{"role": "user", "content": [{"type": "input_image"}]}]}',
    ),
    (
        "messages: missing max_tokens",
        MSG,
        b'{"model": "palmyra-mini", "messages": [{"role": "user", "content": "hi"}]}',
    ),
    (
        "messages: unknown model",
        MSG,
        b'{"model": "gpt-17", "max_tokens": 2, "messages": [{"role": "user", "content": "hi"}]}',
    ),
    (
        "messages: system role in messages",
        MSG,
        b'{"model": "palmyra-mini", "max_tokens": 2, "messages": [{"role": "system", "content": "x"}]}',
    ),
    (
        "messages: invalid UTF-8",
        MSG,
        b'{"model": "palmyra-mini", "max_tokens": 2, "messages": [{"role": "user", "content": "\xed\xa0\x80"}]}',
    ),
    ("messages: JSON array body", MSG, b"[1, 2, 3]"),
    (
        "oversized body",
        COMPL,
        b'{"model": "palmyra-mini", "max_tokens": 2, "prompt": "' + b"x" * (BODY_LIMIT + 1) + b'"}',
    ),
]


@pytest.fixture(scope="module")
def sidecar(engine_server, log_dir) -> Iterator[procs.Server]:
    env = {
        **FAST,
        "PALMYRA_MAX_BODY_BYTES": str(BODY_LIMIT),
        "PALMYRA_READ_TIMEOUT_S": str(READ_TIMEOUT_S),
        # The body has a deadline of its own (not the engine read timeout), short here.
        "PALMYRA_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    }
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


def openai_error(resp: httpx.Response) -> dict | None:
    try:
        err = resp.json().get("error")
    except (ValueError, AttributeError):
        return None
    if (
        isinstance(err, dict)
        and isinstance(err.get("message"), str)
        and err["message"]
        and isinstance(err.get("type"), str)
    ):
        return err
    return None


@pytest.mark.parametrize("name, path, body", [pytest.param(*case, id=case[0]) for case in CASES])
def test_bad_request_gets_an_openai_shaped_4xx(sidecar, name, path, body):
    resp = HTTP.post(f"{sidecar.url}{path}", content=body, headers=JSON, timeout=60)
    print(f"  {name}: {resp.status_code} {resp.text[:160]}")
    RESULTS.append((name, resp.status_code, 400 <= resp.status_code < 500 and openai_error(resp) is not None))
    assert 400 <= resp.status_code < 500, resp.text[:300]
    assert openai_error(resp) is not None, resp.text[:300]


def test_oversized_chunked_body_is_refused_with_413(sidecar):
    """No Content-Length to refuse up front: the limit is enforced while reading."""
    chunks = (b"x" * 16384 for _ in range(BODY_LIMIT // 16384 + 2))
    resp = HTTP.post(f"{sidecar.url}{COMPL}", content=chunks, headers=JSON, timeout=60)
    RESULTS.append(("oversized chunked body", resp.status_code, resp.status_code == 413))
    err = openai_error(resp)
    assert resp.status_code == 413 and err is not None and err["code"] == "request_too_large", resp.text[:300]


@pytest.mark.parametrize(
    "method, path, body",
    [
        pytest.param(
            "POST",
            CHAT,
            b'{"model": "nope", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}',
            id="unknown model, chat",
        ),
        pytest.param("POST", "/v1/nothing-here", b"{}", id="unknown /v1 route"),
        pytest.param("GET", COMPL, None, id="GET on a POST route"),
    ],
)
def test_wrong_route_method_or_model_is_an_openai_shaped_4xx(sidecar, method, path, body):
    resp = httpx.request(method, f"{sidecar.url}{path}", content=body, headers=JSON, timeout=30)
    print(f"  {method} {path}: {resp.status_code} {resp.text[:160]}")
    RESULTS.append(
        (f"{method} {path}", resp.status_code, 400 <= resp.status_code < 500 and openai_error(resp) is not None)
    )
    assert 400 <= resp.status_code < 500, resp.text[:300]
    assert openai_error(resp) is not None, resp.text[:300]


def test_slow_loris_body_gets_408_within_its_body_deadline(sidecar):
    """Headers promise 200 bytes; the body then trickles in a byte every 0.5 s and never completes."""
    body = completion(max_tokens=2)
    with socket.create_connection(("127.0.0.1", sidecar.port), timeout=30) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 200\r\n\r\n"
        )
        t0 = time.monotonic()
        sock.settimeout(0.5)
        answer = b""
        for byte in str(body).encode()[:200]:
            try:
                sock.sendall(bytes([byte]))
            except OSError:
                break  # the server already answered and closed
            try:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
                if b"\r\n\r\n" in answer:
                    break
            except TimeoutError:
                continue
        took = time.monotonic() - t0
        sock.settimeout(5)
        try:
            while b"}}" not in answer:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            pass
    head, _, rest = answer.partition(b"\r\n\r\n")
    figure(
        "slow-loris",
        status=head.split(b" ")[1].decode() if head else None,
        answered_after_s=round(took, 2),
        body_timeout_s=BODY_TIMEOUT_S,
    )
    assert head.startswith(b"HTTP/1.1 408"), answer[:300]
    assert b'"request_timeout"' in rest and b'"error"' in rest
    assert BODY_TIMEOUT_S - 0.1 <= took <= BODY_TIMEOUT_S + 1.5
    assert generate_ok(sidecar.url)


def test_engine_still_generates_after_the_abuse(sidecar, engine_server):
    """Runs last in this module: every bad request above went through first."""
    bad = [f"{n} -> {s}" for n, s, ok in RESULTS if not ok]
    figure("bad input", cases=len(RESULTS), clear_4xx=len(RESULTS) - len(bad), not_ok=bad)
    assert generate_ok(sidecar.url)
    assert HTTP.get(f"{engine_server.url}/health", timeout=5).status_code == 200
    data = HTTP.get(f"{sidecar.url}/v1/models", timeout=10).json()["data"]
    assert [m["id"] for m in data] == [MODEL]
