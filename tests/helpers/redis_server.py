"""A real redis-server (Debian's) on a free port, its password from a file, nothing persisted."""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.helpers.procs import free_port, spawn, stop


@dataclass
class Redis:
    url: str
    port: int
    password_file: Path
    proc: subprocess.Popen

    def cli(self, *args: str) -> str:
        password = self.password_file.read_text().strip()
        out = subprocess.run(
            ["redis-cli", "-p", str(self.port), "--no-auth-warning", "-a", password, *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return out.stdout.strip()


@contextlib.contextmanager
def redis_server(log_dir: Path, port: int | None = None) -> Iterator[Redis]:
    assert shutil.which("redis-server"), "redis-server is missing (./test.sh installs Debian's)"
    port = port or free_port()
    password_file = log_dir / f"redis-{port}.password"
    password_file.write_text("a-redis-password-0123456789\n")
    conf = log_dir / f"redis-{port}.conf"  # the password in a file, never on the command line
    conf.write_text(
        f'port {port}\nbind 127.0.0.1\nrequirepass a-redis-password-0123456789\nsave ""\nappendonly no\ndir {log_dir}\n'
    )
    proc = spawn(["redis-server", str(conf)], log_dir / f"redis-{port}.log", {})
    server = Redis(f"redis://127.0.0.1:{port}/0", port, password_file, proc)
    try:
        deadline = time.monotonic() + 20
        while server.cli("PING") != "PONG":
            assert proc.poll() is None, (log_dir / f"redis-{port}.log").read_text()
            assert time.monotonic() < deadline, "redis-server did not answer"
            time.sleep(0.05)
        yield server
    finally:
        stop(proc)
