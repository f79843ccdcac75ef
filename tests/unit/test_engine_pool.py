"""The relay's HTTP/1.1 pool over real localhost sockets, against scripted servers that answer,
stall, close or speak garbage on purpose (faults the real engine cannot be made to produce)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from palmyra_serve.sidecar import engine_pool
from palmyra_serve.sidecar.engine_pool import (ConnectFailed, EnginePool, StreamInterrupted, UpstreamError,
                                               UpstreamTimeout)

OK_CHUNKED = (b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
              b"6\r\ndata: \r\n2\r\nx\n\r\n0\r\n\r\n")
OK_LENGTH = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\ncontent-length: 2\r\n\r\n{}"

Handler = Callable[[int, int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0)
    return head + await reader.readexactly(length)


class ScriptedServer:
    """Calls handler(connection_number, request_number_on_it, reader, writer) per request; the
    handler returns False to stop serving that connection."""

    def __init__(self, handler: Handler) -> None:
        self.handler = handler
        self.connections = 0
        self.requests: list[bytes] = []
        self._tasks: list[asyncio.Task] = []
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def __aexit__(self, *exc: object) -> None:
        self.server.close()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for writer in self._writers:
            writer.close()
        await self.server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._tasks.append(asyncio.current_task())
        self._writers.append(writer)
        self.connections += 1
        number, served = self.connections, 0
        try:
            while True:
                self.requests.append(await read_request(reader))
                served += 1
                if not await self.handler(number, served, reader, writer):
                    break
        except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
            pass  # the client went away, or the test is over
        writer.close()


def answer(data: bytes) -> Handler:
    async def handler(_conn: int, _req: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(data)
        await writer.drain()
        return True
    return handler


def test_keep_alive_connection_is_reused_and_request_is_written_as_given():
    async def scenario():
        server = ScriptedServer(answer(OK_CHUNKED))
        async with server as url:
            pool = EnginePool(url + "/prefix", 2, 5)
            for _ in range(3):
                resp = await pool.request("POST", b"/v1/completions?x=1", [(b"x-request-id", b"r1")], b'{"a":1}')
                assert resp.status == 200 and resp.content_type == "text/event-stream"
                assert await resp.read() == b"data: x\n"
                resp.release()
            pool.close()
        assert server.connections == 1
        first = server.requests[0]
        assert first.startswith(b"POST /prefix/v1/completions?x=1 HTTP/1.1\r\n")
        assert b"\r\ncontent-length: 7\r\n" in first and b"\r\nx-request-id: r1\r\n" in first
        assert first.endswith(b'\r\n\r\n{"a":1}')
    asyncio.run(scenario())


def test_content_length_body_and_raw_headers_are_kept():
    async def scenario():
        async with ScriptedServer(answer(OK_LENGTH)) as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("GET", b"/v1/nothing", [], b"")
            assert (resp.status, resp.reason, resp.content_type) == (404, "Not Found", "application/json")
            assert (b"Content-Type", b"application/json") in resp.raw_headers
            assert await resp.read() == b"{}"
    asyncio.run(scenario())


def test_kept_alive_connection_closed_by_the_engine_is_retried_once_on_a_fresh_one():
    async def handler(conn: int, req: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if conn == 1 and req == 2:
            return False  # the engine's keep-alive close, racing our reuse: not a byte answered
        writer.write(OK_CHUNKED)
        await writer.drain()
        return True

    async def scenario():
        server = ScriptedServer(handler)
        async with server as url:
            pool = EnginePool(url, 2, 5)
            for _ in range(2):
                resp = await pool.request("POST", b"/v1/completions", [], b"{}")
                assert await resp.read() == b"data: x\n"
                resp.release()
        assert server.connections == 2 and len(server.requests) == 3
    asyncio.run(scenario())


def test_fresh_connection_closed_without_an_answer_is_an_error_not_a_retry():
    async def scenario():
        server = ScriptedServer(lambda *_: asyncio.sleep(0, result=False))
        async with server as url:
            with pytest.raises(UpstreamError) as exc:
                await EnginePool(url, 2, 5).request("POST", b"/v1/completions", [], b"{}")
        assert exc.value.kind == "protocol" and server.connections == 1
    asyncio.run(scenario())


def test_garbage_instead_of_http_is_a_protocol_error():
    async def scenario():
        async with ScriptedServer(answer(b"this is not HTTP at all\r\n\r\n")) as url:
            with pytest.raises(UpstreamError) as exc:
                await EnginePool(url, 2, 5).request("GET", b"/v1/models", [], b"")
        assert type(exc.value) is UpstreamError and exc.value.kind == "protocol"
    asyncio.run(scenario())


def test_refused_connection_is_connect_failed():
    async def scenario():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectFailed) as exc:
            await EnginePool(f"http://127.0.0.1:{port}", 2, 5).request("GET", b"/v1/models", [], b"")
        assert exc.value.kind == "connect"
    asyncio.run(scenario())


def test_silence_before_the_head_and_inside_the_body_times_out():
    async def stall_then_partial(conn: int, _q: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if conn == 1:
            await asyncio.sleep(30)
        writer.write(OK_CHUNKED[:-5])  # head and a chunk, then silence before the last chunk
        await writer.drain()
        await asyncio.sleep(30)
        return False

    async def scenario():
        async with ScriptedServer(stall_then_partial) as url:
            pool = EnginePool(url, 2, 0.3)
            with pytest.raises(UpstreamTimeout):
                await pool.request("POST", b"/v1/completions", [], b"{}")
            pool2 = EnginePool(url, 2, 0.3)
            resp = await pool2.request("POST", b"/v1/completions", [], b"{}")
            assert await resp.read_some() == b"data: x\n"
            with pytest.raises(UpstreamTimeout) as exc:
                await resp.read_some()
            assert exc.value.kind == "timeout"
    asyncio.run(scenario())


def test_engine_dying_mid_body_is_a_stream_interruption_after_the_bytes_that_arrived():
    async def dies(_c: int, _q: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK_CHUNKED[:-12])
        await writer.drain()
        return False

    async def scenario():
        async with ScriptedServer(dies) as url:
            resp = await EnginePool(url, 2, 5).request("POST", b"/v1/completions", [], b"{}")
            assert await resp.read_some() == b"data: "
            with pytest.raises(StreamInterrupted) as exc:
                await resp.read_some()
            assert exc.value.kind == "stream_interrupted"
    asyncio.run(scenario())


def test_connection_close_and_head_responses_are_not_pooled():
    close = OK_CHUNKED.replace(b"transfer-encoding", b"connection: close\r\ntransfer-encoding")

    async def scenario():
        server = ScriptedServer(answer(close))
        async with server as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("GET", b"/a", [], b"")
            await resp.read()
            resp.release()
            assert not pool._idle
        server2 = ScriptedServer(answer(OK_LENGTH[:-2]))  # a HEAD answer: the length, no body
        async with server2 as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("HEAD", b"/a", [], b"")
            assert resp.status == 404 and await resp.read() == b""
            resp.release()
            assert not pool._idle
    asyncio.run(scenario())


def test_a_reader_that_falls_behind_pauses_the_engine_socket_until_it_catches_up(monkeypatch):
    monkeypatch.setattr(engine_pool, "HIGH_WATER", 1000)
    total = 8 * 1024 * 1024
    body = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total + b"x" * total

    async def scenario():
        async with ScriptedServer(answer(body)) as url:
            resp = await EnginePool(url, 2, 5).request("GET", b"/big", [], b"")
            await asyncio.sleep(0.2)  # let the engine's bytes pile up unread
            conn = resp._conn
            assert conn.paused and conn.buffered < total // 2  # reading stopped well before the end
            assert len(await resp.read()) == total and not conn.paused
    asyncio.run(scenario())


def test_idle_connections_are_retired_before_the_engine_would_close_them(monkeypatch):
    async def scenario():
        server = ScriptedServer(answer(OK_CHUNKED))
        async with server as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("GET", b"/a", [], b"")
            await resp.read()
            resp.release()
            monkeypatch.setattr(engine_pool, "MAX_IDLE_S", 0.0)
            resp = await pool.request("GET", b"/a", [], b"")
            await resp.read()
        assert server.connections == 2
    asyncio.run(scenario())
