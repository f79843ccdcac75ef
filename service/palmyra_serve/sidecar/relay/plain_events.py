"""The plain token event of completions' and chat's streams, as msgspec decodes it strictly.

What a successful decode proves is exactly what relay/sse.py's general path would count as one
token event of choice 0: `error` typed as UNSET refuses the key whatever its value; `usage` may only
be null or absent; `choices` holds exactly one choice, of index 0, whose text (completions' `text`,
chat's `delta.content`) is a non-empty string. Fields the accounting ignores build no object.
"""

from __future__ import annotations

from typing import Annotated, Any, Generic, Literal, TypeVar

import msgspec

_Text = Annotated[str, msgspec.Meta(min_length=1)]
_Choice = TypeVar("_Choice")


class _TextChoice(msgspec.Struct, gc=False):
    text: _Text
    index: Literal[0] = 0


class _Delta(msgspec.Struct, gc=False):
    content: _Text


class _DeltaChoice(msgspec.Struct, gc=False):
    delta: _Delta
    index: Literal[0] = 0


class _Event(msgspec.Struct, Generic[_Choice], gc=False):
    choices: tuple[_Choice]
    usage: None = None
    error: msgspec.UnsetType = msgspec.UNSET


# A read's events as one array, and a read of one event alone (no array built around it).
COMPLETIONS_TOKENS: msgspec.json.Decoder[Any] = msgspec.json.Decoder(list[_Event[_TextChoice]])
CHAT_TOKENS: msgspec.json.Decoder[Any] = msgspec.json.Decoder(list[_Event[_DeltaChoice]])
COMPLETIONS_TOKEN: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_Event[_TextChoice])
CHAT_TOKEN: msgspec.json.Decoder[Any] = msgspec.json.Decoder(_Event[_DeltaChoice])
