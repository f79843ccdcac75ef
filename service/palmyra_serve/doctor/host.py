"""What doctor looks at, gathered once: files under a root (`/` on a real host or in the engine
container; a temporary tree in the tests), the environment, who this process is, the machine, and
one `npu-smi info` run. Everything the checks judge is in the HostView; nothing else is read."""

from __future__ import annotations

import os
import platform
import re
import stat
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from palmyra_serve.doctor import facts

_DAVINCI = re.compile(r"^v?davinci(\d+)$")
NPU_SMI_TIMEOUT_S = 10.0  # a hung driver makes npu-smi hang: never let it hold the engine's start


@dataclass(frozen=True)
class Node:
    path: str  # relative to the root, e.g. dev/davinci0
    uid: int
    gid: int
    mode: int


@dataclass(frozen=True)
class Account:
    uid: int
    gid: int


@dataclass(frozen=True)
class HostView:
    root: str
    env: Mapping[str, str]
    machine: str
    uid: int
    groups: frozenset[int]
    driver_version: str | None  # the Version= line of version.info; None: no such file
    driver_version_raw: str | None
    npu_smi: str | None  # where it was found, relative to the root
    npu_smi_output: str | None  # `npu-smi info`'s output; None: not run or it failed
    npu_smi_error: str | None
    npus: tuple[Node, ...]  # /dev/davinciN, sorted by N
    vnpus: tuple[Node, ...]  # /dev/vdavinciN: soft-partitioned (virtual) NPUs
    control: Mapping[str, Node | None] = field(default_factory=dict)  # facts.CONTROL_DEVICES
    host_user: Account | None = None  # HwHiAiUser in <root>/etc/passwd
    accounts: frozenset[int] | None = None  # every uid <root>/etc/passwd names; None: unreadable
    driver_libraries: tuple[str, ...] = ()  # facts.DRIVER_HAL where found, relative to the root
    shm_bytes: int | None = None  # the size of <root>/dev/shm; None: not there
    # /dev/davinci_manager where npu-smi runs: this process's own /dev, whatever the root (doctor
    # in a container judging a mounted host root runs the host's npu-smi here).
    manager_here: bool = True


def _node(root: Path, rel: str) -> Node | None:
    try:
        st = os.stat(root / rel)
    except OSError:
        return None
    return Node(rel, st.st_uid, st.st_gid, stat.S_IMODE(st.st_mode))


def _version(text: str) -> str | None:
    for line in text.splitlines():
        key, _, value = line.partition("=")
        if key.strip().lower() == "version" and value.strip():
            return value.strip()
    return None


def driver_version(root: str = "/") -> str | None:
    """The Ascend driver's version from its version.info; None where there is none."""
    try:
        return _version((Path(root) / facts.DRIVER_VERSION_FILE).read_text(errors="replace"))
    except OSError:
        return None


def cann_version(root: str = "/", machine: str | None = None) -> str | None:
    """The installed CANN toolkit's version (facts.CANN_INSTALL_INFO); None where none is installed."""
    arch = machine or platform.machine()
    for pattern in facts.CANN_INSTALL_INFO:
        for path in sorted(Path(root).glob(pattern.format(arch=arch)), reverse=True):
            try:
                found = _version(path.read_text(errors="replace"))
            except OSError:
                continue
            if found:
                return found
    return None


def _account(root: Path, name: str) -> Account | None:
    try:
        lines = (root / "etc/passwd").read_text(errors="replace").splitlines()
    except OSError:
        return None
    for line in lines:
        parts = line.split(":")
        if len(parts) >= 4 and parts[0] == name and parts[2].isdigit() and parts[3].isdigit():
            return Account(int(parts[2]), int(parts[3]))
    return None


def _uids(root: Path) -> frozenset[int] | None:
    try:
        lines = (root / "etc/passwd").read_text(errors="replace").splitlines()
    except OSError:
        return None
    parts = [line.split(":") for line in lines]
    return frozenset(int(p[2]) for p in parts if len(p) >= 3 and p[2].isdigit())


def _shm_bytes(root: Path) -> int | None:
    try:
        st = os.statvfs(root / "dev/shm")
    except OSError:
        return None
    return st.f_blocks * st.f_frsize


def run_npu_smi(path: Path) -> tuple[str | None, str | None]:
    try:
        done = subprocess.run(
            [str(path), "info"], capture_output=True, text=True, timeout=NPU_SMI_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return None, f"`npu-smi info` did not answer in {NPU_SMI_TIMEOUT_S:.0f} s (a hung driver?)"
    except OSError as exc:
        return None, f"`npu-smi info` could not run: {exc}"
    if done.returncode != 0:
        return None, f"`npu-smi info` exited {done.returncode}: {(done.stderr or done.stdout).strip()[-300:]}"
    return done.stdout, None


def gather(root: str = "/", env: Mapping[str, str] | None = None, run_smi: bool = True) -> HostView:
    base = Path(root)
    env = dict(os.environ if env is None else env)
    try:
        raw: str | None = (base / facts.DRIVER_VERSION_FILE).read_text(errors="replace")
    except OSError:
        raw = None
    smi = next((p for p in facts.NPU_SMI_PATHS if os.access(base / p, os.X_OK)), None)
    output, error = run_npu_smi(base / smi) if smi and run_smi else (None, None)
    try:
        dev = sorted(os.listdir(base / "dev"))
    except OSError:
        dev = []
    numbered = sorted((int(m.group(1)), name) for name in dev if (m := _DAVINCI.match(name)))
    nodes = [(name, _node(base, f"dev/{name}")) for _, name in numbered]
    return HostView(
        root=str(base),
        env=env,
        machine=platform.machine(),
        uid=os.getuid(),
        groups=frozenset({os.getgid(), *os.getgroups()}),
        driver_version=_version(raw) if raw is not None else None,
        driver_version_raw=raw,
        npu_smi=smi,
        npu_smi_output=output,
        npu_smi_error=error,
        npus=tuple(n for name, n in nodes if n and not name.startswith("v")),
        vnpus=tuple(n for name, n in nodes if n and name.startswith("v")),
        control={rel: _node(base, rel) for rel in facts.CONTROL_DEVICES},
        host_user=_account(base, facts.IMAGE_USER),
        accounts=_uids(base),
        driver_libraries=tuple(
            f"{d}/{facts.DRIVER_HAL}" for d in facts.DRIVER_LIBRARY_DIRS if (base / d / facts.DRIVER_HAL).exists()
        ),
        shm_bytes=_shm_bytes(base),
        manager_here=os.path.exists("/dev/davinci_manager"),
    )
