"""The timed requests behind bench: streamed completions and max_tokens=1 prefills, over httpx.

Times are taken at the client with perf_counter, from just before the request is sent: they include
the network hop and the server's HTTP layer, which is what a caller sees (and what makes the
direct-engine vs through-sidecar comparison meaningful).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from palmyra_serve.tools.endpoint import EndpointError, check_response

if TYPE_CHECKING:
    import httpx


@dataclass
class StreamSample:
    ttft: float  # send -> first SSE chunk carrying a choice (a token; its text may be empty)
    e2e: float  # send -> end of stream
    tokens: int  # usage.completion_tokens when the server reports it, else chunks with a choice

    @property
    def per_token(self) -> float | None:
        """Decode time per output token after the first."""
        return (self.e2e - self.ttft) / (self.tokens - 1) if self.tokens > 1 else None


def _body(model: str, ids: list[int], max_tokens: int, stream: bool) -> dict:
    body = {
        "model": model,
        "prompt": ids,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": stream,
    }
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


async def stream_once(client: httpx.AsyncClient, model: str, ids: list[int], max_tokens: int) -> StreamSample:
    t0 = time.perf_counter()
    ttft = None
    chunks = 0
    usage_tokens = None
    async with client.stream("POST", "/v1/completions", json=_body(model, ids, max_tokens, True)) as r:
        if r.status_code != 200:
            check_response(r.status_code, (await r.aread()).decode("utf-8", "replace"))
        async for line in r.aiter_lines():
            if not line.startswith("data:"):
                continue
            payload = line[5:].strip()
            if payload == "[DONE]":
                break
            event = json.loads(payload)
            if "error" in event:
                raise EndpointError(f"stream error: {event['error']}")
            if event.get("choices"):
                if ttft is None:
                    ttft = time.perf_counter() - t0
                chunks += 1
            if event.get("usage"):
                usage_tokens = event["usage"].get("completion_tokens")
    e2e = time.perf_counter() - t0
    if ttft is None:
        raise EndpointError("stream ended without a token")
    return StreamSample(ttft=ttft, e2e=e2e, tokens=int(usage_tokens) if usage_tokens else chunks)


async def prefill_once(client: httpx.AsyncClient, model: str, ids: list[int]) -> float:
    """Send -> last byte of a non-streamed max_tokens=1 completion: prefill plus one sampled token."""
    t0 = time.perf_counter()
    r = await client.post("/v1/completions", json=_body(model, ids, 1, False))
    elapsed = time.perf_counter() - t0
    check_response(r.status_code, r.text)
    return elapsed
