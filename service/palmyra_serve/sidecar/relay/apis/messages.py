"""Anthropic's Messages API: typed events, usage in message_start and message_delta, unasked. What
it cannot carry of a tenant (its cache salt on older engines, its priority) is the tenants' rule
(tenants/tenancy.py)."""

from __future__ import annotations

from functools import partial
from typing import Any

from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.policy.inspect import Inspection
from palmyra_serve.sidecar.relay.apis.base import ApiRelay
from palmyra_serve.sidecar.relay.typed_events import BodyUsage, MessagesAccount


def as_sent(payload: dict[str, Any], seen: Inspection) -> tuple[bool, bool]:
    return False, False


MESSAGES = ApiRelay(
    rewrite=as_sent,
    stream_account=MessagesAccount,
    body_usage=partial(BodyUsage, Api.MESSAGES),
    reports_usage=True,
)
