"""An engine's error answer, as the client gets it: always rebuilt, never relayed as it came (a 5xx
says only that the engine failed, its text goes to the log), in the shape of the route's API."""

from __future__ import annotations

import orjson

from palmyra_serve.sidecar.core import error_shapes
from palmyra_serve.sidecar.core.errors import ErrorCode
from palmyra_serve.sidecar.core.routes import Api

# An engine error body is read whole to reshape it (vLLM's are under 1 KiB: its validation
# handler truncates what it echoes); a larger one is a misbehaving engine (502). Counted per
# request in memory_budget.py.
MAX_ERROR_BODY = 64 * 1024


# What of an engine's 4xx message a client gets: vLLM's say what was wrong with the request
# (a context length, a bad parameter) and echo at most a little of it.
MAX_CLIENT_MESSAGE = 1000


def from_engine(status: int, body: bytes, reason: str, request_id: str, api: Api | None = None) -> bytes:
    """The body a client gets for an engine error (below), in the shape of the route's API."""
    answer = _from_engine(status, body, reason, request_id)
    if api is Api.MESSAGES:
        return error_shapes.anthropic_from_openai(status, answer, request_id)
    return answer


def _from_engine(status: int, body: bytes, reason: str, request_id: str) -> bytes:
    """The body a client gets for an engine error, always rebuilt, never relayed as it came.

    A 5xx says only that the engine failed, and where the details are: the engine's own text
    (a traceback can hold a prompt, a path or a token) goes to the sidecar's log under the request
    id. A 4xx is the request's own fault, and its message is what the client needs: kept, bounded
    to MAX_CLIENT_MESSAGE characters, with OpenAI's four fields and nothing else. vLLM's framework
    level bodies ({"detail": ...} for an undecodable body, {"error": "Unauthorized"}) are read the
    same way."""
    if status >= 500:
        return orjson.dumps(
            {
                "error": {
                    "message": f"The inference engine failed on this request (request id {request_id}).",
                    "type": ErrorCode.ENGINE_ERROR.type,
                    "param": None,
                    "code": ErrorCode.ENGINE_ERROR,
                }
            }
        )
    try:
        payload = orjson.loads(body) if body else None
    except orjson.JSONDecodeError:
        payload = None
    error = payload.get("error") if isinstance(payload, dict) else None
    kind: object = None
    if isinstance(error, dict):
        message, param, code = error.get("message"), error.get("param"), error.get("code", status)
        kind = error.get("type")
    elif isinstance(payload, dict):
        message = payload.get("detail", error if error is not None else payload.get("message"))
        param, code = None, status
    else:
        message, param, code = body.decode("utf-8", "replace") or reason, None, status
    if not isinstance(message, str):
        message = orjson.dumps(message).decode()
    return orjson.dumps(
        {
            "error": {
                "message": message[:MAX_CLIENT_MESSAGE] or reason,
                "type": kind if isinstance(kind, str) and 0 < len(kind) <= 64 else "invalid_request_error",
                "param": param[:200] if isinstance(param, str) else None,
                "code": code if isinstance(code, int | str) and not isinstance(code, bool) else status,
            }
        }
    )
