"""Shared plumbing of the container tier: podman calls, HTTP on 127.0.0.1, readiness waits."""

from __future__ import annotations

import ipaddress
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PODMAN_DIR = REPO / "scripts" / "podman"
ENGINE_IMAGE = "localhost/palmyra-serve-engine:cpu"
SIDECAR_IMAGE = "localhost/palmyra-serve-sidecar:latest"
PROBE = "/opt/palmyra/healthchecks/http_probe.py"


@dataclass(frozen=True)
class BuiltImages:
    engine: str
    sidecar: str
    sizes: dict[str, int]  # image -> bytes
    build_seconds: dict[str, float]


def run_logged(argv: list[str], log: Path, timeout: float) -> float:
    """Run a build step with its output (stdout and stderr, interleaved) in `log`; fail with the
    log's tail unless it exits 0. Returns the seconds it took."""
    started = time.monotonic()
    with log.open("w") as out:
        proc = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, timeout=timeout, check=False)
    elapsed = time.monotonic() - started
    assert proc.returncode == 0, f"{' '.join(argv)} failed after {elapsed:.0f} s:\n{log.read_text()[-6000:]}"
    return elapsed


def build_images(logs: Path) -> dict[str, float]:
    """The local base images, then the sidecar and CPU engine images, each step's output in a log
    under `logs`; returns each image's build seconds. Builds reuse podman's layer cache, so a second
    call finds everything built and takes seconds."""
    logs.mkdir(parents=True, exist_ok=True)
    run_logged([str(PODMAN_DIR / "build-local-bases.sh")], logs / "bases.log", timeout=900)
    seconds = {}
    for target, image in (("sidecar", SIDECAR_IMAGE), ("engine-cpu", ENGINE_IMAGE)):
        seconds[image] = run_logged(
            [str(PODMAN_DIR / "build-image.sh"), target, image], logs / f"{target}.log", timeout=3600
        )
    return seconds


def podman(*args: str, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, check=False)
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args)} failed ({result.returncode}):\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def image_size(image: str) -> int:
    return int(podman("image", "inspect", image, "--format", "{{.Size}}").stdout.strip())


def port_is_free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def http(
    method: str, url: str, body: dict | None = None, timeout: float = 10, api_key: str | None = None
) -> tuple[int, dict]:
    """Status and JSON body (a non-JSON body, such as a metrics page, as {"raw": text})."""
    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            raw = response.read()
            try:
                return response.status, json.loads(raw or b"{}")
            except ValueError:
                return response.status, {"raw": raw.decode(errors="replace")}
    except urllib.error.HTTPError as exc:
        raw = exc.read()
        try:
            return exc.code, json.loads(raw)
        except ValueError:
            return exc.code, {"raw": raw.decode(errors="replace")}


def container_running(name: str) -> bool:
    result = podman("inspect", name, "--format", "{{.State.Running}}", check=False)
    return result.returncode == 0 and result.stdout.strip() == "true"


def wait_ready(url: str, containers: list[str], timeout_s: float, exited_ok: tuple[str, ...] = ()) -> dict:
    """Poll /ready until 200; fail early, with logs, when a container has exited."""
    deadline = time.monotonic() + timeout_s
    last: object = "no answer"
    while time.monotonic() < deadline:
        for name in containers:
            if name not in exited_ok and not container_running(name):
                logs = podman("logs", "--tail", "80", name, check=False)
                raise AssertionError(f"{name} is not running before ready:\n{logs.stdout}{logs.stderr}")
        try:
            last = http("GET", f"{url}/ready", timeout=5)
            if last[0] == 200:
                return last[1]
        except OSError as exc:
            last = repr(exc)
        time.sleep(2)
    tails = {n: podman("logs", "--tail", "60", n, check=False).stderr[-3000:] for n in containers}
    raise AssertionError(f"{url}/ready not 200 after {timeout_s} s (last {last}); logs: {tails}")


def completion(base_url: str, max_tokens: int = 8, api_key: str | None = None) -> tuple[int, dict]:
    return http(
        "POST",
        f"{base_url}/v1/completions",
        {
            "model": "palmyra-mini",
            "prompt": "Hello world",
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
        },
        timeout=120,
        api_key=api_key,
    )


def _proc_net_address(hex_addr: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An address as /proc/net/tcp{,6} prints it: 32-bit words in host (little-endian) order."""
    raw = bytes.fromhex(hex_addr)
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening_addresses(container: str, port: int) -> set[str]:
    """Addresses with a TCP listener on `port` in the container's network namespace."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        out = podman("exec", container, "cat", table, check=False).stdout
        for line in out.splitlines()[1:]:
            fields = line.split()
            local, state = fields[1], fields[3]
            addr, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(str(_proc_net_address(addr)))
    return found
