"""Small helpers for talking to the OpenAI-shaped API in tests."""

from __future__ import annotations

import json

import httpx


def completion(prompt: str = "hi", **extra) -> dict:
    return {"model": "palmyra-mini", "prompt": prompt, "max_tokens": 4, **extra}


def assert_openai_error(resp: httpx.Response, status: int, code: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert isinstance(err["message"], str) and err["message"]
    assert isinstance(err["type"], str)
    if code is not None:
        assert err["code"] == code
    return err


def raw_json_post(path: str, payload: dict) -> bytes:
    """A whole HTTP/1.1 POST as bytes, for tests that hold the socket themselves (to cut it)."""
    body = json.dumps(payload).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
