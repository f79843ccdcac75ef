"""The relay's HTTP/1.1 pool over real localhost sockets, against scripted servers that answer,
stall, close or speak garbage on purpose (faults the real engine cannot be made to produce)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from palmyra_serve.sidecar.upstream import pool as engine_pool
from palmyra_serve.sidecar.upstream.failures import ConnectFailed, StreamInterrupted, UpstreamError, UpstreamTimeout
from palmyra_serve.sidecar.upstream.pool import EnginePool

OK_CHUNKED = (
    b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    b"6\r\ndata: \r\n2\r\nx\n\r\n0\r\n\r\n"
)
OK_LENGTH = b"HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\ncontent-length: 2\r\n\r\n{}"

Handler = Callable[[int, int, asyncio.StreamReader, asyncio.StreamWriter], Awaitable[bool]]


async def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> None:
    """Until condition() holds (polled on the loop, so the pool's callbacks run meanwhile)."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.005)


async def read_request(reader: asyncio.StreamReader) -> bytes:
    head = await reader.readuntil(b"\r\n\r\n")
    length = next(
        (int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")), 0
    )
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
        task = asyncio.current_task()
        assert task is not None  # a handler runs in its own task
        self._tasks.append(task)
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


def test_a_request_written_to_a_reused_connection_that_closes_unanswered_is_not_sent_again():
    async def handler(conn: int, req: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        if conn == 1 and req == 2:
            return False  # read the request, then close: the engine may have started a generation
        writer.write(OK_CHUNKED)
        await writer.drain()
        return True

    async def scenario():
        server = ScriptedServer(handler)
        async with server as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("POST", b"/v1/completions", [], b"{}")
            assert await resp.read() == b"data: x\n"
            resp.release()
            with pytest.raises(UpstreamError) as exc:
                await pool.request("POST", b"/v1/completions", [], b"{}")
            assert exc.value.code == "bad_upstream"
        # The second request reached the engine once, and only once: a generation never runs twice.
        assert server.connections == 1 and len(server.requests) == 2

    asyncio.run(scenario())


def test_a_pooled_connection_the_engine_closed_while_idle_is_not_used():
    async def handler(conn: int, _req: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(OK_CHUNKED)
        await writer.drain()
        return conn != 1  # the first connection is closed by the engine right after its answer

    async def scenario():
        server = ScriptedServer(handler)
        async with server as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("POST", b"/v1/completions", [], b"{}")
            await resp.read()
            resp.release()
            await wait_for(lambda: not pool._idle or pool._idle[0].closed)
            resp = await pool.request("POST", b"/v1/completions", [], b"{}")
            assert await resp.read() == b"data: x\n"
        assert server.connections == 2 and len(server.requests) == 2

    asyncio.run(scenario())


def test_fresh_connection_closed_without_an_answer_is_an_error_not_a_retry():
    async def scenario():
        server = ScriptedServer(lambda *_: asyncio.sleep(0, result=False))
        async with server as url:
            with pytest.raises(UpstreamError) as exc:
                await EnginePool(url, 2, 5).request("POST", b"/v1/completions", [], b"{}")
        assert exc.value.code == "bad_upstream" and server.connections == 1

    asyncio.run(scenario())


def test_refused_connection_is_connect_failed():
    async def scenario():
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        server.close()
        await server.wait_closed()
        with pytest.raises(ConnectFailed) as exc:
            await EnginePool(f"http://127.0.0.1:{port}", 2, 5).request("GET", b"/v1/models", [], b"")
        assert exc.value.code == "engine_unavailable"

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
            assert exc.value.code == "engine_timeout"

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
            assert exc.value.code == "stream_interrupted"

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


def test_a_connection_that_answered_an_error_is_not_reused():
    # vLLM 0.18's server closed the connection right after some 4xx answers, unannounced: the next
    # request written into that close came back unanswered. An error's connection is not pooled.
    bad_request = OK_LENGTH.replace(b"404 Not Found", b"400 Bad Request")

    async def scenario():
        for head, pooled in ((bad_request, 0), (OK_CHUNKED, 1)):
            server = ScriptedServer(answer(head))
            async with server as url:
                pool = EnginePool(url, 2, 5)
                resp = await pool.request("POST", b"/v1/completions", [], b"{}")
                await resp.read()
                resp.release()
                assert len(pool._idle) == pooled, head[:20]

    asyncio.run(scenario())


def test_a_reader_that_falls_behind_pauses_the_engine_socket_until_it_catches_up(monkeypatch):
    monkeypatch.setattr(engine_pool, "HIGH_WATER", 1000)
    total = 8 * 1024 * 1024
    body = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n" % total + b"x" * total

    async def scenario():
        async with ScriptedServer(answer(body)) as url:
            resp = await EnginePool(url, 2, 5).request("GET", b"/big", [], b"")
            conn = resp._conn
            await wait_for(lambda: conn.paused)  # the engine's bytes pile up unread until reading stops
            assert conn.buffered < total // 2  # reading stopped well before the end
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


def test_interim_1xx_responses_are_skipped_and_the_final_one_is_the_answer():
    interim = b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>; rel=preload\r\n\r\n"

    async def scenario():
        server = ScriptedServer(answer(interim + OK_LENGTH.replace(b"404 Not Found", b"200 OK")))
        async with server as url:
            pool = EnginePool(url, 2, 5)
            for _ in range(2):  # and the connection stays usable after them
                resp = await pool.request("POST", b"/v1/completions", [], b"{}")
                assert (resp.status, resp.reason) == (200, "OK")
                assert [k for k, _ in resp.raw_headers] == [b"Content-Type", b"content-length"]
                assert await resp.read() == b"{}"
                resp.release()
        assert server.connections == 1

    asyncio.run(scenario())


def test_a_close_delimited_body_is_complete_at_the_close():
    async def close_delimited(_c: int, _q: int, _r: asyncio.StreamReader, writer: asyncio.StreamWriter) -> bool:
        writer.write(b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"a":')
        await writer.drain()
        writer.write(b"1}")
        await writer.drain()
        return False

    async def scenario():
        async with ScriptedServer(close_delimited) as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("GET", b"/v1/models", [], b"")
            assert await resp.read() == b'{"a":1}'
            assert resp._conn.complete and resp._conn.error is None
            resp.release()
            assert not pool._idle  # its connection is gone: never pooled

    asyncio.run(scenario())


def test_trailers_of_a_chunked_body_are_dropped_not_added_to_the_headers():
    trailed = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n"
        b"trailer: x-evil\r\n\r\n6\r\ndata: \r\n2\r\nx\n\r\n0\r\nx-evil: 1\r\nset-cookie: a=b\r\n\r\n"
    )

    async def scenario():
        async with ScriptedServer(answer(trailed)) as url:
            pool = EnginePool(url, 2, 5)
            resp = await pool.request("GET", b"/a", [], b"")
            assert await resp.read() == b"data: x\n"
            names = [k for k, _ in resp.raw_headers]
            assert names == [b"content-type", b"transfer-encoding", b"trailer"]
            resp.release()
            assert len(pool._idle) == 1  # a complete, reusable response

    asyncio.run(scenario())


@pytest.mark.parametrize(
    "head",
    [
        b"this is not HTTP at all\r\n\r\n",
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: h2c\r\n\r\n",  # no upgrade was asked for
        b"HTTP/1.1 200 OK\r\n" + b"".join(b"x-h%d: v\r\n" % i for i in range(101)) + b"content-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-big: " + b"v" * (70 * 1024) + b"\r\ncontent-length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nx-endless: " + b"v" * (300 * 1024),  # never ends: refused before it does
    ],
    ids=["garbage", "101", "too-many-fields", "too-large", "never-ending-field"],
)
def test_an_unreadable_or_oversized_engine_head_is_a_protocol_error(head: bytes):
    async def scenario():
        async with ScriptedServer(answer(head)) as url:
            with pytest.raises(UpstreamError) as exc:
                await EnginePool(url, 2, 5).request("GET", b"/v1/models", [], b"")
            assert type(exc.value) is UpstreamError and exc.value.code == "bad_upstream"

    asyncio.run(scenario())
