"""A client connection as the app sees it: how the relay hears at once that its client left, and
what the front end (edge/protocol.py, which makes one per connection) knows of its requests."""

from __future__ import annotations

from collections.abc import Callable, MutableMapping
from typing import Any

# The scope key under which every request finds its connection's DisconnectHook.
DISCONNECT_HOOK = "palmyra.disconnect_hook"


class DisconnectHook:
    """A connection as the app sees it (scope[DISCONNECT_HOOK]), one per connection.

    How the relay learns at once that its client went away: uvicorn tells an app only through
    receive(), so hearing it while relaying took a task per request parked in receive(); instead
    the connection calls `on_disconnect` from connection_lost. uvicorn runs a connection's
    (pipelined) requests one after the other, so one relay at most has it set.
    Also what the front end knows of the connection's requests: `authenticated` once one of them
    passed the key check (mark_authenticated), which decides what may be closed at the cap."""

    __slots__ = ("_abort", "_reopen", "authenticated", "lost", "on_disconnect", "write_pauses")

    def __init__(self, abort: Callable[[], None] | None = None) -> None:
        self.lost = False  # the connection is gone (also before any relay registered)
        self.on_disconnect: Callable[[], None] | None = None
        # Times the client's transport paused writing (its client read slower than the relay
        # wrote): a stream relayed across a pause was paced by its client, not by the engine, so
        # admission learns no inter-token gap from it (relay/handler.py).
        self.write_pauses = 0
        self.authenticated = False
        self._abort = abort
        self._reopen: Any = None  # the uvicorn cycle whose keep-alive the front end turned off

    def abort(self) -> None:
        """Drop the connection now (what an app cannot do through ASGI)."""
        if not self.lost and self._abort is not None:
            self._abort()


def mark_authenticated(scope: MutableMapping[str, Any]) -> None:
    """The request of `scope` passed the key check: its connection is no longer anonymous, and
    keeps its keep-alive if the front end had taken it away from an anonymous request."""
    hook = scope.get(DISCONNECT_HOOK)
    if hook is None:
        return
    hook.authenticated = True
    if hook._reopen is not None:
        hook._reopen.keep_alive = True
        hook._reopen = None
