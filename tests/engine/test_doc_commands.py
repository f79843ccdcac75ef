"""Every documentation block marked `<!-- doc-test: run -->` (tests/helpers/doc_blocks.py), run as
written: shell blocks by bash, Python blocks by this interpreter, with the client's key in
PALMYRA_API_KEY, against the shared CPU engine behind a sidecar that requires keys. The one change
to the text: the documented address's port (8080) becomes this sidecar's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import doc_blocks, procs

CLIENT_KEY = "doc-commands-client-key-0123456789"
DOCUMENTED_ADDRESS = re.compile(r"(?:127\.0\.0\.1|localhost):8080\b")
RUN = [b for b in doc_blocks.command_blocks() if b.kind == "run"]


@pytest.fixture(scope="module")
def keyed_sidecar(engine_server: procs.Server, log_dir: Path) -> Iterator[procs.Server]:
    env = {"PALMYRA_API_KEYS": CLIENT_KEY, "PALMYRA_AUTH_DISABLED": "false"}
    with procs.sidecar(engine_server.url, log_dir, engine_api_key=engine_server.api_key, extra_env=env) as server:
        yield server


def run_block(block: doc_blocks.Block, port: int) -> subprocess.CompletedProcess[str]:
    text = DOCUMENTED_ADDRESS.sub(f"127.0.0.1:{port}", block.text)
    # The reader's shell: this venv's commands on PATH, the client's key, no settings of the tests.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PALMYRA_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PALMYRA_API_KEY"] = CLIENT_KEY
    argv = [sys.executable, "-c", text] if block.lang == "python" else ["bash", "-e", "-o", "pipefail", "-c", text]
    return subprocess.run(argv, capture_output=True, text=True, env=env, cwd=doc_blocks.REPO, timeout=300)


def test_blocks_to_run_are_found() -> None:
    # README's curl and SDK examples, the API page's, the runbooks' and troubleshooting's first look.
    assert {str(b.path.relative_to(doc_blocks.REPO)) for b in RUN} >= {"README.md", "docs/api.md", "docs/runbooks.md"}


@pytest.mark.parametrize("block", RUN, ids=[b.where for b in RUN])
def test_the_documented_block_runs_as_written(block: doc_blocks.Block, keyed_sidecar: procs.Server) -> None:
    done = run_block(block, keyed_sidecar.port)
    print(f"{block.where}:\n{done.stdout[:600]}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert done.stdout.strip(), "it printed nothing"
    # A refused key or a bad request comes back as an OpenAI error body: none may.
    assert '"error"' not in done.stdout, done.stdout[:2000]
    if "stream" in block.text and '"stream": true' in block.text:
        assert "data: [DONE]" in done.stdout


def test_without_the_key_the_same_blocks_are_refused(keyed_sidecar: procs.Server) -> None:
    # The examples pass because they send the key, not because the sidecar lets anyone in.
    curl = next(b for b in RUN if b.path.name == "api.md" and b.lang == "sh")
    refused = subprocess.run(
        ["bash", "-c", DOCUMENTED_ADDRESS.sub(f"127.0.0.1:{keyed_sidecar.port}", curl.text)],
        capture_output=True,
        text=True,
        env={"PATH": os.environ["PATH"], "PALMYRA_API_KEY": "not-the-key"},
        timeout=60,
    )
    assert '"invalid_api_key"' in refused.stdout, refused.stdout[:1000]
