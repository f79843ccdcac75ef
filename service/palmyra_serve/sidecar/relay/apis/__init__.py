"""What differs between the APIs a generation route speaks, as the relay sees it: one module per API,
each one ApiRelay. A new route is a module here, its line in core/routes.py's allow-list and its
field table in policy/fields.py; the relay's steps (relay/handler.py) stay as they are.

An ApiRelay says how the route's body is rewritten for accounting (chat's streams must ask for the
usage report; the Responses API must store nothing), how its stream is accounted (relay/sse.py for
OpenAI's choices, relay/typed_events.py for typed events) and its non-streamed body's usage read,
and whether the API always reports usage (then a missing report costs the whole reservation).
"""

from __future__ import annotations

from palmyra_serve.sidecar.core.routes import Api
from palmyra_serve.sidecar.relay.apis import messages, openai, responses
from palmyra_serve.sidecar.relay.apis.base import ApiRelay

BY_API: dict[Api, ApiRelay] = {
    Api.COMPLETIONS: openai.COMPLETIONS,
    Api.CHAT: openai.CHAT,
    Api.RESPONSES: responses.RESPONSES,
    Api.MESSAGES: messages.MESSAGES,
}

__all__ = ["BY_API", "ApiRelay"]
