"""Hearing a client leave while its request waits for a slot or is relayed: a queued request gives
its place up at once, a relayed one is cancelled (which closes the engine connection, and vLLM
aborts the generation). A non-streamed generation sends nothing until it is done, so this is heard
from the connection itself."""

from __future__ import annotations

import asyncio
from typing import Any

from palmyra_serve.sidecar.core.disconnect import DISCONNECT_HOOK, DisconnectHook


class Gone:
    """The relay's task and whether this module cancelled it because its client went away."""

    __slots__ = ("flag", "task")

    def __init__(self, task: asyncio.Task) -> None:
        self.flag = False
        self.task = task

    def cancel_relay(self) -> None:
        """Unwinding the relay closes the engine connection, which makes the engine abort the
        generation."""
        self.flag = True
        self.task.cancel()


class Pacing:
    """Whether a stream's client set its pace: the client's transport paused the relay's writes
    (its reader was slower than the engine) since the stream began. Admission learns the engine's
    gap only from streams the engine paced."""

    __slots__ = ("hook", "pauses")

    def __init__(self, hook: DisconnectHook) -> None:
        self.hook = hook
        self.pauses = hook.write_pauses

    def by_client(self) -> bool:
        return self.hook.write_pauses != self.pauses


def disconnect_hook(scope: dict, receive: Any) -> tuple[DisconnectHook, asyncio.Task | None]:
    """The connection's DisconnectHook: the front end's (edge/protocol.py), which hears a client
    leave from connection_lost at no cost per request; under another ASGI server, one made here
    and fed by a task waiting on ASGI's own `http.disconnect` (the body is read by then, so that
    task is receive()'s only caller)."""
    hook: DisconnectHook | None = scope.get(DISCONNECT_HOOK)
    if hook is not None:
        return hook, None
    hook = DisconnectHook()
    return hook, asyncio.create_task(_hear_disconnect(receive, hook))


async def _hear_disconnect(receive: Any, hook: DisconnectHook) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    hook.lost = True
    if hook.on_disconnect is not None:
        hook.on_disconnect()
