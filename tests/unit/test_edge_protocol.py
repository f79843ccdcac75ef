"""edge/protocol.py: the answers the front end writes itself are complete HTTP responses, and
marking a request authenticated gives its connection's keep-alive back."""

from __future__ import annotations

from palmyra_serve.sidecar.core import errors
from palmyra_serve.sidecar.core.disconnect import DisconnectHook, mark_authenticated
from palmyra_serve.sidecar.edge.protocol import raw_response


def test_protocol_answers_are_complete_http_responses():
    raw = raw_response(errors.too_many_connections(1))
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503 ")
    assert f"content-length: {len(body)}".encode() in head and b"connection: close" in head
    assert b"retry-after: 1" in head and b'"code":"too_many_connections"' in body


def test_marking_a_request_authenticated_gives_its_keep_alive_back():
    class Cycle:
        keep_alive = False

    hook = DisconnectHook()
    cycle = Cycle()
    hook._reopen = cycle
    mark_authenticated({"palmyra.disconnect_hook": hook})
    assert hook.authenticated and cycle.keep_alive and hook._reopen is None
    mark_authenticated({})  # a scope without a connection (unit tests of the relay): nothing to do
