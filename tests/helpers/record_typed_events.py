"""Record the Responses and Messages APIs' answers of a running engine, as the relay's own pool
reads them, into tests/unit/data/vllm-typed-events.json (under the engine's version).

Run against an engine serving the tiny stand-in:
`python -m tests.helpers.record_typed_events http://127.0.0.1:8000`. The accounting tests
(tests/unit/test_relay_typed_events.py) replay the reads, whole and split anywhere.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import aiohttp
import orjson

from palmyra_serve.sidecar.upstream.pool import EnginePool

SOURCE = "tests/helpers/record_typed_events.py against a running engine, reads as the relay's pool gets them"
OUT = Path(__file__).resolve().parents[1] / "unit" / "data" / "vllm-typed-events.json"
MODEL = "palmyra-mini"
CASES: list[tuple[str, str, dict[str, Any]]] = [
    ("responses", "/v1/responses", {"model": MODEL, "input": "Hello there", "max_output_tokens": 6}),
    (
        "responses-stream",
        "/v1/responses",
        {"model": MODEL, "input": "Hello there", "instructions": "Be brief", "max_output_tokens": 6, "stream": True},
    ),
    ("messages", "/v1/messages", {"model": MODEL, "max_tokens": 6, "messages": [{"role": "user", "content": "Hi"}]}),
    (
        "messages-stream",
        "/v1/messages",
        {
            "model": MODEL,
            "max_tokens": 6,
            "system": "Be brief",
            "stream": True,
            "messages": [{"role": "user", "content": "Hi"}],
        },
    ),
]


async def record(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as session, session.get(f"{url}/version") as resp:
        version = (await resp.json())["version"].split("+")[0]
    pool = EnginePool(url, connect_timeout_s=5.0, read_timeout_s=60.0)
    cases = []
    try:
        for name, path, body in CASES:
            answer = await pool.request(
                "POST", path.encode(), [(b"content-type", b"application/json")], orjson.dumps(body)
            )
            reads = []
            while chunk := await answer.read_some():
                reads.append(chunk.decode())
            answer.release()
            cases.append({"name": name, "path": path, "request": body, "status": answer.status, "reads": reads})
    finally:
        pool.close()
    return {"version": version, "cases": cases}


def main() -> None:
    recorded = asyncio.run(record(sys.argv[1]))
    data: dict[str, Any] = json.loads(OUT.read_text()) if OUT.exists() else {"source": SOURCE, "versions": {}}
    data["versions"][recorded["version"]] = recorded["cases"]
    OUT.write_text(json.dumps(data, indent=1, ensure_ascii=False, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
