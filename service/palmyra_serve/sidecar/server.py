"""Serve the sidecar with uvicorn, draining on SIGTERM instead of closing the listener at once.

uvicorn's own handler stops accepting connections on the first signal. Here the first SIGTERM or
SIGINT turns the replica not-ready while the listener stays open (new requests get 503 with
Retry-After), waits for in-flight requests up to the drain timeout, and only then lets uvicorn
shut down; the process exits 0. A second SIGINT forces the exit.

SIGHUP reloads, as daemons do: the key and tenants files are read again at once (they are also
watched, once a second); nothing stops and nothing in flight is touched.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
from types import FrameType

import uvicorn

from palmyra_serve.settings import Settings
from palmyra_serve.sidecar.app import SidecarApp, create_app
from palmyra_serve.sidecar.edge.protocol import bounded_protocol
from palmyra_serve.sidecar.lifecycle.golden import GoldenFileError
from palmyra_serve.sidecar.tenants.config import TenantsFileError
from palmyra_serve.sidecar.tenants.keys import AuthConfigError

log = logging.getLogger("palmyra.sidecar")


class DrainingServer(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, app: SidecarApp) -> None:
        super().__init__(config)
        self.sidecar = app.sidecar
        self._drain_requested = False
        self._draining: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_signal_handler(signal.SIGHUP, self._reload)
        await super().serve(sockets)

    def _reload(self) -> None:
        log.info("SIGHUP: reading the key and tenants files again")
        self.sidecar.tenancy.keys.reload_now()

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        # Not recorded in _captured_signals: uvicorn would re-raise it after shutdown and the
        # process would die of the signal instead of exiting 0.
        if self._drain_requested or self._loop is None:
            if sig == signal.SIGINT:
                self.force_exit = True
            self.should_exit = True
            return
        self._drain_requested = True
        self._loop.call_soon_threadsafe(self._start_drain)

    def _start_drain(self) -> None:
        self._draining = asyncio.ensure_future(self._drain_then_exit())

    async def _drain_then_exit(self) -> None:
        await self.sidecar.drain()
        self.should_exit = True


def serve(settings: Settings) -> None:
    try:
        app = create_app(settings)
    except (AuthConfigError, TenantsFileError, GoldenFileError) as exc:
        # Fail closed, and say why in one line rather than a traceback.
        log.error("refusing to start: %s", exc)
        raise SystemExit(2) from None
    if settings.probe_port and settings.probe_port == settings.port:
        log.error("refusing to start: PALMYRA_PROBE_PORT must differ from the sidecar's port (%d)", settings.port)
        raise SystemExit(2)
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        loop="uvloop",
        http=bounded_protocol(settings, app.sidecar.metrics),  # httptools, bounded (edge/protocol.py)
        ws="none",
        lifespan="on",
        access_log=False,
        log_config=None,
        server_header=False,
        backlog=2048,
        proxy_headers=False,  # nothing here reads the client address; saves a middleware per request
        timeout_keep_alive=30,
        timeout_graceful_shutdown=int(settings.drain_timeout_s) + 5,
    )
    sockets = None
    if settings.probe_port:
        # Both listeners in one server: one app, one drain, one shutdown. The probe port's
        # connections have their own cap (edge/protocol.py) and paths (app.py).
        sockets = [config.bind_socket(), _bind(settings.host, settings.probe_port, config.backlog)]
    DrainingServer(config, app).run(sockets=sockets)


def _bind(host: str, port: int, backlog: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        log.error("refusing to start: cannot listen on the probe port %s:%d: %s", host, port, exc)
        raise SystemExit(2) from None
    sock.listen(backlog)
    sock.set_inheritable(True)
    return sock
