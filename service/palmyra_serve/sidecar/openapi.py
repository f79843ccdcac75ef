"""The OpenAPI document also describes the relayed routes, so clients and fuzzers see one API.

Its paths are exactly routes.RELAYED (a unit test checks it): what is documented is what is relayed.

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
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": ["string", "null"]},
                "code": {"type": ["string", "integer", "null"]},
            },
        }
    },
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
    "type": "object",
    "required": ["model", "prompt"],
    "properties": {**_COMMON, "prompt": {"anyOf": [{"type": "string"}, {"type": "array"}]}},
}
_CHAT = {
    "type": "object",
    "required": ["model", "messages"],
    "properties": {
        **_COMMON,
        "messages": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"type": "string"}, "content": {"type": ["string", "array", "null"]}},
            },
        },
    },
}

_RESPONSES = {
    "type": "object",
    "required": ["model", "input"],
    "properties": {
        "model": {"type": "string"},
        "input": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "instructions": {"type": ["string", "null"]},
        "max_output_tokens": {"type": ["integer", "null"]},
        "temperature": {"type": ["number", "null"]},
        "top_p": {"type": ["number", "null"]},
        "stream": {"type": ["boolean", "null"]},
        "tools": {"type": ["array", "null"], "items": {"type": "object"}},
        "text": {"type": ["object", "null"]},
        "store": {"type": ["boolean", "null"], "description": "Always false: no response is stored."},
    },
}
_MESSAGES = {
    "type": "object",
    "required": ["model", "max_tokens", "messages"],
    "properties": {
        "model": {"type": "string"},
        "max_tokens": {"type": "integer"},
        "system": {"anyOf": [{"type": "string"}, {"type": "array", "items": {"type": "object"}}]},
        "messages": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {"role": {"enum": ["user", "assistant"]}, "content": {"type": ["string", "array"]}},
            },
        },
        "temperature": {"type": ["number", "null"]},
        "stream": {"type": ["boolean", "null"]},
        "stop_sequences": {"type": ["array", "null"], "items": {"type": "string"}},
        "tools": {"type": ["array", "null"], "items": {"type": "object"}},
    },
}
# Anthropic's error shape, which every error of /v1/messages takes (error_shapes.py).
_ANTHROPIC_ERROR = {
    "type": "object",
    "required": ["type", "error"],
    "properties": {
        "type": {"const": "error"},
        "error": {
            "type": "object",
            "required": ["type", "message"],
            "properties": {"type": {"type": "string"}, "message": {"type": "string"}},
        },
        "request_id": {"type": "string"},
    },
}

_TOKENIZE = {
    "type": "object",
    "required": ["model"],
    "properties": {"model": {"type": "string"}, "prompt": {"type": "string"}, "messages": {"type": "array"}},
}
_DETOKENIZE = {
    "type": "object",
    "required": ["model", "tokens"],
    "properties": {"model": {"type": "string"}, "tokens": {"type": "array", "items": {"type": "integer"}}},
}


def _responses(ok: str, error: dict[str, Any] = _ERROR) -> dict[str, Any]:
    err = {"content": {"application/json": {"schema": error}}}
    out: dict[str, Any] = {
        "200": {
            "description": ok,
            "content": {
                "application/json": {"schema": {"type": "object"}},
                "text/event-stream": {"schema": {"type": "string"}},
            },
        }
    }
    for code, what in (
        ("400", "Invalid request, or over a cost cap (max_tokens, n, logprobs, prompts, roles)"),
        ("401", "Missing or wrong API key (Authorization: Bearer, or x-api-key)"),
        ("404", "Unknown model"),
        ("405", "Wrong method for this path (Allow)"),
        ("408", "Body not received in time"),
        ("413", "Body too large"),
        ("414", "Request line too long"),
        ("429", "At capacity (Retry-After)"),
        ("431", "Request headers too large or too many"),
        ("503", "Draining, engine unavailable or too many connections (Retry-After)"),
        ("504", "Engine timeout"),
    ):
        out[code] = {"description": what, **err}
    return out


def _post(summary: str, schema: dict, error: dict[str, Any] = _ERROR) -> dict:
    return {
        "post": {
            "summary": summary,
            "tags": ["relayed to the engine"],
            "requestBody": {"required": True, "content": {"application/json": {"schema": schema}}},
            "responses": _responses(summary, error),
        }
    }


PROXIED_PATHS = {
    "/v1/completions": _post("Text completion (streaming with stream=true)", _COMPLETION),
    "/v1/chat/completions": _post("Chat completion (streaming with stream=true)", _CHAT),
    "/v1/responses": _post("OpenAI Responses API, stateless (streaming with stream=true)", _RESPONSES),
    "/v1/messages": _post(
        "Anthropic Messages API (streaming with stream=true); errors in Anthropic's shape", _MESSAGES, _ANTHROPIC_ERROR
    ),
    "/v1/models": {
        "get": {
            "summary": "Served models",
            "tags": ["relayed to the engine"],
            "responses": _responses("The model list"),
        }
    },
    "/tokenize": _post("Token ids of a prompt or chat (vLLM's; to fit max_tokens within max-model-len)", _TOKENIZE),
    "/detokenize": _post("Text of token ids (vLLM's)", _DETOKENIZE),
}


def add_proxied_routes(app: FastAPI) -> None:
    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            schema["paths"].update(PROXIED_PATHS)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
