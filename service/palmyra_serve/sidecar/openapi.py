"""The OpenAPI document also describes the relayed routes, so clients and fuzzers see one API.

The relay never goes through FastAPI, so these routes are added to the document only. Request
schemas list the fields OpenAI clients send; the engine validates them and its errors pass through.
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {"type": "object", "required": ["message", "type"],
                             "properties": {"message": {"type": "string"}, "type": {"type": "string"},
                                            "param": {"type": ["string", "null"]},
                                            "code": {"type": ["string", "integer", "null"]}}}},
}
_COMMON = {
    "model": {"type": "string"},
    "max_tokens": {"type": ["integer", "null"]},
    "temperature": {"type": ["number", "null"]},
    "top_p": {"type": ["number", "null"]},
    "n": {"type": ["integer", "null"]},
    "stream": {"type": ["boolean", "null"]},
    "stop": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}, {"type": "null"}]},
    "seed": {"type": ["integer", "null"]},
    "logprobs": {},
}
_COMPLETION = {
    "type": "object", "required": ["model", "prompt"],
    "properties": {**_COMMON, "prompt": {"anyOf": [{"type": "string"}, {"type": "array"}]}},
}
_CHAT = {
    "type": "object", "required": ["model", "messages"],
    "properties": {**_COMMON, "messages": {"type": "array", "items": {
        "type": "object", "required": ["role", "content"],
        "properties": {"role": {"type": "string"}, "content": {"type": ["string", "array", "null"]}}}}},
}


def _responses(ok: str) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": _ERROR}}}
    out: dict[str, Any] = {"200": {"description": ok, "content": {"application/json": {"schema": {"type": "object"}},
                                                                  "text/event-stream": {"schema": {"type": "string"}}}}}
    for code, what in (("400", "Invalid request"), ("401", "Missing or wrong API key"), ("404", "Unknown model"),
                       ("413", "Body too large"), ("429", "At capacity (Retry-After)"),
                       ("503", "Draining or engine unavailable (Retry-After)"), ("504", "Engine timeout")):
        out[code] = {"description": what, **err}
    return out


def _post(summary: str, schema: dict) -> dict:
    return {"post": {"summary": summary, "tags": ["relayed to the engine"],
                     "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
                     "responses": _responses(summary)}}


PROXIED_PATHS = {
    "/v1/completions": _post("Text completion (streaming with stream=true)", _COMPLETION),
    "/v1/chat/completions": _post("Chat completion (streaming with stream=true)", _CHAT),
    "/v1/models": {"get": {"summary": "Served models", "tags": ["relayed to the engine"],
                           "responses": _responses("The model list")}},
}


def add_proxied_routes(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema["paths"].update(PROXIED_PATHS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
