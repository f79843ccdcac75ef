"""What the tools need from an OpenAI-compatible endpoint: headers, /v1/models, a completion, SSE.

Only the stable OpenAI surface plus vLLM's documented extensions (`ignore_eos`,
`return_tokens_as_token_ids`, `max_model_len` in /v1/models); a server without them still answers,
it just loses the exactness those buy (see docs/validate-and-bench.md).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

TOKEN_ID_PREFIX = "token_id:"
# Where the key comes from when no flag gives it: this project's name for a client's key, then the
# OpenAI SDK's, so a shell set up for the SDK works as is.
KEY_VARIABLES = ("PALMYRA_API_KEY", "OPENAI_API_KEY")


def add_key_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--api-key-file",
        default=None,
        metavar="PATH",
        help="a file holding the bearer key the endpoint wants (its first line)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        help="the bearer key itself; other users of the machine can read a command line, so prefer "
        f"--api-key-file or {' / '.join(KEY_VARIABLES)}, read (in that order) when neither flag is given",
    )


def api_key(args: argparse.Namespace, environ: Mapping[str, str] = os.environ) -> str | None:
    """The key to send: --api-key, else --api-key-file, else the first of KEY_VARIABLES set."""
    if args.api_key:
        return str(args.api_key)
    if args.api_key_file:
        lines = Path(args.api_key_file).read_text(encoding="utf-8").splitlines()
        return lines[0].strip() if lines and lines[0].strip() else None
    return next((environ[name] for name in KEY_VARIABLES if environ.get(name)), None)


class EndpointError(RuntimeError):
    """The endpoint answered with an error or something unreadable."""


@dataclass(frozen=True)
class ModelInfo:
    id: str
    max_model_len: int | None


def headers(api_key: str | None) -> dict[str, str]:
    h = {"Content-Type": "application/json"}
    if api_key:
        h["Authorization"] = f"Bearer {api_key}"
    return h


def parse_models(body: dict, wanted: str | None) -> ModelInfo:
    """Pick the served model from a /v1/models body (the wanted name, else the only one)."""
    data = body.get("data") or []
    if not data:
        raise EndpointError("/v1/models lists no model")
    chosen = next((m for m in data if m.get("id") == wanted), None) if wanted else None
    if chosen is None:
        if wanted and len(data) > 0 and wanted not in {m.get("id") for m in data}:
            names = ", ".join(str(m.get("id")) for m in data)
            raise EndpointError(f"model {wanted!r} not served (served: {names})")
        chosen = data[0]
    mml = chosen.get("max_model_len")
    return ModelInfo(id=str(chosen["id"]), max_model_len=int(mml) if mml else None)


def check_response(status: int, text: str) -> dict:
    """The JSON body of a 200, else an EndpointError carrying the OpenAI error message."""
    try:
        body = json.loads(text) if text else {}
    except json.JSONDecodeError as exc:
        raise EndpointError(f"HTTP {status}: unreadable body {text[:200]!r}") from exc
    if status != 200:
        err = body.get("error") if isinstance(body, dict) else None
        msg = err.get("message") if isinstance(err, dict) else text[:300]
        raise EndpointError(f"HTTP {status}: {msg}")
    return body


def sse_events(lines: Iterator[str]) -> Iterator[dict]:
    """The JSON payloads of an SSE stream's `data:` lines, up to `[DONE]`."""
    for line in lines:
        if not line.startswith("data:"):
            continue
        payload = line[5:].strip()
        if payload == "[DONE]":
            return
        if payload:
            event = json.loads(payload)
            if isinstance(event, dict) and "error" in event:
                raise EndpointError(f"stream error: {event['error']}")
            yield event


class Tokenizer(Protocol):
    """What token_id needs of a tokenizer (a transformers one, loaded only by the caller)."""

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]: ...


def token_id(token: str, tokenizer: Tokenizer | None = None) -> int | None:
    """A completion logprobs token as an id: exact with vLLM's `return_tokens_as_token_ids`,
    otherwise a best effort through the tokenizer (None when the text is not a single token)."""
    if token.startswith(TOKEN_ID_PREFIX):
        return int(token[len(TOKEN_ID_PREFIX) :])
    if tokenizer is None:
        return None
    ids = tokenizer.encode(token, add_special_tokens=False)
    return ids[0] if len(ids) == 1 else None
