"""The parts behind the edge's bounds, in isolation."""

from __future__ import annotations

from palmyra_serve.sidecar.front_end import DisconnectHook, mark_authenticated


def test_marking_a_request_authenticated_gives_its_keep_alive_back():
    class Cycle:
        keep_alive = False

    hook = DisconnectHook()
    cycle = Cycle()
    hook._reopen = cycle
    mark_authenticated({"palmyra.disconnect_hook": hook})
    assert hook.authenticated and cycle.keep_alive and hook._reopen is None
    mark_authenticated({})  # a scope without a connection (unit tests of the relay): nothing to do
