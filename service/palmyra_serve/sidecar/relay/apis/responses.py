"""OpenAI's Responses API: typed events, usage in the last one, unasked; stateless here."""

from __future__ import annotations

from functools import partial
from typing import Any

from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.policy.inspect import Inspection
from palmyra_serve.sidecar.relay.apis.base import ApiRelay
from palmyra_serve.sidecar.relay.typed_events import BodyUsage, ResponsesAccount


def store_nothing(payload: dict[str, Any], seen: Inspection) -> tuple[bool, bool]:
    """Stateless (policy/fields.py): the engine keeps nothing, whatever the client asked."""
    if payload.get("store") is False:
        return False, False
    payload["store"] = False
    return True, False


RESPONSES = ApiRelay(
    rewrite=store_nothing,
    stream_account=ResponsesAccount,
    body_usage=partial(BodyUsage, Api.RESPONSES),
    reports_usage=True,
)
