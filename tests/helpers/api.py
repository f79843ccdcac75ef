"""Small helpers for talking to the OpenAI-shaped API in tests."""

from __future__ import annotations

import json
from typing import Any, Literal

import httpx
from pydantic import BaseModel


# Plain-HTTP clients for the tests, which never speak TLS. httpx's default client builds a
# certificate store first: about 18 ms of CPU in one burst. While the CPU engine generates on
# these 2-vCPU VMs, a burst like that has waited on the run queue for the whole generation
# (12.7 s of run-queue wait for 0.015 s of CPU, /proc/self/schedstat), which stalled test clients
# long enough to miss what they were watching. Without verification a client costs 0.2 ms.
# No keep-alive on the shared one, so it holds no connection between calls (as httpx.get did).
def plain_client(**kwargs: Any) -> httpx.Client:
    return httpx.Client(verify=False, **kwargs)


HTTP = plain_client(limits=httpx.Limits(max_keepalive_connections=0))


MODEL = "palmyra-mini"  # the served model name of the tests' engines, real and fake

# One function tool and the question that calls it, and a two-value schema for `parse`: the
# client calls the engine tier and benchmarks/client_calls.py make with the unmodified SDKs.
WEATHER: Any = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
            "required": ["city"],
            "additionalProperties": False,
        },
    },
}
ASK: Any = [{"role": "user", "content": "What is the weather in Paris?"}]


class Verdict(BaseModel):
    answer: Literal["yes", "no"]


def completion(prompt: str | list[int] = "hi", max_tokens: int | str = 4, **extra: object) -> dict:
    """A /v1/completions body; `extra` adds or overrides fields (n, stream, ignore_eos, ...)."""
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, **extra}


def ready_body(client: httpx.Client, url: str) -> tuple[int, dict]:
    """GET /ready: its status and JSON body."""
    resp = client.get(f"{url}/ready")
    return resp.status_code, resp.json()


def body_when_ready(client: httpx.Client, url: str) -> dict | None:
    """/ready's body when it says ready (200), else None: a wait_until predicate."""
    status, body = ready_body(client, url)
    return body if status == 200 else None


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if code is not None:
        assert err["code"] == code
    return err


def raw_json_post(path: str, payload: dict, headers: dict[str, str] | None = None) -> bytes:
    """A whole HTTP/1.1 POST as bytes, for tests that hold the socket themselves (to cut it)."""
    body = json.dumps(payload).encode()
    extra = "".join(f"{name}: {value}\r\n" for name, value in (headers or {}).items())
    return (
        f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n{extra}"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


def metric_value(client: httpx.Client, url: str, name: str) -> float:
    """One series of a server's /metrics page, by its full name and labels."""
    for line in client.get(f"{url}/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not on the metrics page")
