"""Every relayed route's field table, by the target the engine gets (fields.py, api_fields.py)."""

from __future__ import annotations

from collections.abc import Mapping

from palmyra_serve.sidecar.policy.api_fields import ANTHROPIC_ONLY, MESSAGES, RESPONSES, RESPONSES_ONLY
from palmyra_serve.sidecar.policy.fields import CHAT, COMPLETIONS, DETOKENIZE, OPENAI_ONLY, TOKENIZE, Rule

# Every field above that no vLLM model has: what clients of those APIs send.
CLIENT_ONLY = frozenset(OPENAI_ONLY) | frozenset(RESPONSES_ONLY) | frozenset(ANTHROPIC_ONLY)

BY_TARGET: Mapping[bytes, Mapping[str, Rule]] = {
    b"/v1/chat/completions": {**CHAT, **OPENAI_ONLY},
    b"/v1/completions": {**COMPLETIONS, **OPENAI_ONLY},
    b"/v1/responses": {**RESPONSES, **RESPONSES_ONLY},
    b"/v1/messages": {**MESSAGES, **ANTHROPIC_ONLY},
    b"/tokenize": TOKENIZE,
    b"/detokenize": DETOKENIZE,
}
