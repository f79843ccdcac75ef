"""`up` and an engine that exits: one that refused its own arguments stops `up` with the engine's
own message; one that crashed is restarted with backoff.

Fault injection: the engines here are not vLLM. `FAKE_ENGINE_REFUSES_ARGUMENTS` is a real
argparse parser given a value it cannot parse (vLLM's parser is an argparse.ArgumentParser: it
prints its usage and `PROG: error: ...` and exits 2, as vLLM did on a mistyped
`--structured-outputs-config` in PALMYRA_ENGINE_EXTRA_ARGS); `FAKE_ENGINE_CRASHES` raises
(exit 1, a traceback). The sidecar is a stand-in too: one that never answers (up sees "sidecar
starting"), or one whose /ready says ready, for an engine that exits 2 after it served.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from palmyra_serve import up
from tests.helpers.procs import free_port
from tests.helpers.waiting import wait_until

# Each fake engine appends its start time to the file named by FAKE_ENGINE_STARTS.
_STARTS = "import os, time; open(os.environ['FAKE_ENGINE_STARTS'], 'a').write(f'{time.monotonic()}\\n')"
FAKE_ENGINE_REFUSES_ARGUMENTS = textwrap.dedent(f"""
    import argparse, json, sys
    {_STARTS}
    parser = argparse.ArgumentParser(prog="api_server.py")
    parser.add_argument("--structured-outputs-config", type=json.loads)
    parser.parse_args(["--structured-outputs-config", "{{backend: xgrammar"])
""")
FAKE_ENGINE_CRASHES = textwrap.dedent(f"""
    {_STARTS}
    raise RuntimeError("fake engine: CUDA error: out of memory")
""")
FAKE_ENGINE_EXITS_2_AFTER_SERVING = textwrap.dedent(f"""
    import sys, time
    {_STARTS}
    time.sleep(0.8)
    sys.exit(2)
""")
FAKE_SIDECAR_SILENT = "import time; time.sleep(120)"
FAKE_SIDECAR_READY = textwrap.dedent("""
    import http.server, sys
    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = b'{"weights": "fake"}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
""")

DRIVER = textwrap.dedent("""
    import json, os, sys
    from pathlib import Path
    from palmyra_serve.up import Children, supervise
    c = json.loads(sys.argv[1])
    sys.exit(supervise(Children(c["engine"], c["sidecar"], dict(os.environ), Path(c["logs"]), c["url"])))
""")


def start_up(tmp_path: Path, engine: str, sidecar: str = FAKE_SIDECAR_SILENT) -> tuple[subprocess.Popen, Path]:
    """`up`'s supervision of the two fakes, its console (stderr) going to tmp_path/console."""
    port = free_port()
    starts = tmp_path / "starts"
    spec = {
        "engine": [sys.executable, "-c", engine],
        "sidecar": [sys.executable, "-c", sidecar, str(port)],
        "logs": str(tmp_path),
        "url": f"http://127.0.0.1:{port}",
    }
    with open(tmp_path / "console", "w") as console:
        proc = subprocess.Popen(
            [sys.executable, "-c", DRIVER, json.dumps(spec)],
            env={**os.environ, "FAKE_ENGINE_STARTS": str(starts)},
            stderr=console,
            stdout=subprocess.DEVNULL,
        )
    return proc, starts


def console_of(tmp_path: Path) -> str:
    return (tmp_path / "console").read_text()


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=20)
    finally:
        proc.kill()


def engine_starts(starts: Path) -> list[float]:
    return [float(x) for x in starts.read_text().split()] if starts.exists() else []


def test_an_engine_that_refuses_its_arguments_stops_up_with_its_message(tmp_path):
    t0 = time.monotonic()
    proc, starts = start_up(tmp_path, FAKE_ENGINE_REFUSES_ARGUMENTS)
    try:
        proc.wait(timeout=20)
    finally:
        proc.kill()
    took = time.monotonic() - t0
    console = console_of(tmp_path)
    assert proc.returncode == up.REFUSED_ARGUMENTS, console
    # The engine's own words, singled out, and no restart.
    assert "the engine refused to start: api_server.py: error: argument --structured-outputs-config" in console
    assert "usage: api_server.py" in console  # the log's tail, as for any engine exit
    assert "restarting the engine" not in console
    assert len(engine_starts(starts)) == 1
    assert took < 10, f"up took {took:.1f} s to stop"


def test_a_crashed_engine_is_still_restarted_with_backoff(tmp_path):
    proc, starts = start_up(tmp_path, FAKE_ENGINE_CRASHES)
    # The second crash is followed by a doubled backoff: the first restart waited 1 s.
    wait_until(lambda: "restarting the engine in 2 s (restart 2)" in console_of(tmp_path), 20, "the second backoff")
    code = stop(proc)
    console = console_of(tmp_path)
    assert code == 0, console
    assert "restarting the engine in 1 s (restart 1)" in console
    assert "refused to start" not in console
    first, second = engine_starts(starts)[:2]
    assert second - first >= 1.0, engine_starts(starts)


def test_exit_2_after_the_engine_was_ready_is_a_crash(tmp_path):
    proc, _starts = start_up(tmp_path, FAKE_ENGINE_EXITS_2_AFTER_SERVING, FAKE_SIDECAR_READY)
    wait_until(lambda: "restarting the engine in 1 s (restart 1)" in console_of(tmp_path), 20, "a restart")
    code = stop(proc)
    console = console_of(tmp_path)
    assert "ready in" in console and "refused to start" not in console
    assert code == 0, console


def test_refusal_message_is_the_last_error_line():
    log = "INFO starting\nusage: api_server.py [-h]\napi_server.py: error: unrecognized arguments: --nope\n"
    assert up.refusal_message(log) == "api_server.py: error: unrecognized arguments: --nope"
    launcher = '{"level": "ERROR", "message": "refusing to start: VLLM_API_KEY is a placeholder"}\n'
    assert "refusing to start: VLLM_API_KEY is a placeholder" in up.refusal_message(launcher)
    assert up.refusal_message("") == "(the engine printed nothing)"
