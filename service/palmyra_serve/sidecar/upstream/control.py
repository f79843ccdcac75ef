"""The sidecar's connection to the engine: one aiohttp session, and the control-plane calls
(health, model list, a generation) that health polling, warmup and the canary make.

Client requests do not go through here: the relay has its own lean pool (upstream/pool.py), chosen
by benchmarks/relay.py. These calls are few and off the hot path, so aiohttp's convenience is free.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson

from palmyra_serve.sidecar.core.generation import GenerationResult
from palmyra_serve.sidecar.upstream.failures import PageTooLarge


def new_session(connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    connector = aiohttp.TCPConnector(limit=0, ttl_dns_cache=300, keepalive_timeout=60)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=read_timeout_s),
        auto_decompress=False,  # relay bytes as the engine sent them
        skip_auto_headers=("User-Agent",),
        json_serialize=lambda o: orjson.dumps(o).decode(),
    )


@dataclass
class EnginePage:
    status: int
    content_type: str
    content_encoding: str | None
    body: bytes


class EngineClient:
    """Control-plane calls to the engine. Never used on the client request path."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str | None) -> None:
        self.session = session
        self.base_url = base_url.rstrip("/")
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}

    async def health(self, timeout_s: float) -> tuple[bool, str]:
        """(ok, status word): ok / refused / timeout / http_<code>."""
        try:
            async with self.session.get(
                f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=timeout_s)
            ) as resp:
                await resp.read()
                return resp.status == 200, "ok" if resp.status == 200 else f"http_{resp.status}"
        except TimeoutError:
            return False, "timeout"
        except aiohttp.ClientConnectorError:
            return False, "refused"
        except aiohttp.ClientError as exc:
            return False, f"error:{type(exc).__name__}"

    async def metrics(self, headers: dict[str, str], timeout_s: float, max_bytes: int) -> EnginePage:
        """The engine's own /metrics page, as it answered (status, type, encoding, bytes).

        Raises TimeoutError, aiohttp.ClientConnectorError (not reachable), aiohttp.ClientError,
        or PageTooLarge."""
        async with asyncio.timeout(timeout_s):
            async with self.session.get(
                f"{self.base_url}/metrics",
                headers={**self.headers, **headers},
                timeout=aiohttp.ClientTimeout(total=None),
            ) as resp:
                parts: list[bytes] = []
                size = 0
                async for chunk in resp.content.iter_any():
                    size += len(chunk)
                    if size > max_bytes:
                        raise PageTooLarge(f"the engine's /metrics page exceeds {max_bytes} bytes")
                    parts.append(chunk)
                return EnginePage(
                    resp.status,
                    resp.headers.get("Content-Type", "text/plain"),
                    resp.headers.get("Content-Encoding"),
                    b"".join(parts),
                )

    async def models(self, timeout_s: float) -> list[dict[str, Any]]:
        async with self.session.get(
            f"{self.base_url}/v1/models", headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            body = await resp.read()
            if resp.status != 200:
                raise RuntimeError(f"/v1/models answered {resp.status}: {body[:200]!r}")
            return orjson.loads(body).get("data", [])

    async def version(self, timeout_s: float) -> str | None:
        """The engine's vLLM version (GET /version), None when it does not say."""
        async with self.session.get(
            f"{self.base_url}/version", headers=self.headers, timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as resp:
            body = await resp.content.read(1024)  # {"version": "0.32.0"}: anything larger is not that
            if resp.status != 200:
                return None
        try:
            version = orjson.loads(body).get("version")
        except (orjson.JSONDecodeError, AttributeError):
            return None
        return version if isinstance(version, str) and len(version) <= 64 else None

    async def generate(self, route: str, payload: dict[str, Any], timeout_s: float) -> GenerationResult:
        """One generation; for stream=True the whole stream is read and must end with [DONE]."""
        t0 = time.monotonic()
        try:
            async with self.session.post(
                f"{self.base_url}{route}",
                json=payload,
                headers=self.headers,
                timeout=aiohttp.ClientTimeout(total=timeout_s),
            ) as resp:
                body = await resp.read()
                took = time.monotonic() - t0
                if resp.status != 200:
                    return GenerationResult(False, took, f"{route} answered {resp.status}: {body[:300]!r}")
                if payload.get("stream"):
                    if not body.rstrip().endswith(b"data: [DONE]") or b'"error"' in body:
                        return GenerationResult(False, took, f"{route} stream ended badly: {body[-300:]!r}")
                    return GenerationResult(True, took, tokens=body.count(b"data: ") - 1)
                answer = orjson.loads(body)
                usage = answer.get("usage") or {}
                ids = None
                if payload.get("return_token_ids"):
                    choices = answer.get("choices") or [{}]
                    ids = choices[0].get("token_ids")
                return GenerationResult(True, took, tokens=int(usage.get("completion_tokens", 0)), token_ids=ids)
        except TimeoutError:
            return GenerationResult(False, time.monotonic() - t0, f"{route} timed out after {timeout_s:.0f} s")
        except (aiohttp.ClientError, ValueError) as exc:
            return GenerationResult(False, time.monotonic() - t0, f"{route} failed: {type(exc).__name__}: {exc}")
