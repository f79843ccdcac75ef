"""Stand-in Ascend host layouts for doctor: a temporary root with the driver's version.info, the
device nodes (plain files with the owner and mode a driver install gives them: doctor reads
stat(), and no test may create real device nodes), HwHiAiUser in etc/passwd, and an `npu-smi`
that prints a recorded `npu-smi info`. The recordings are the code blocks of MindCluster's own docs,
vendored unmodified in tests/data/ascend-host/ (tests/data/README.md): read out of them here, never
retyped."""

from __future__ import annotations

import os
import stat
import textwrap
from dataclasses import dataclass
from pathlib import Path

from palmyra_serve.doctor.host import HostView
from tests.helpers.paths import DATA

HOST_DATA = DATA / "ascend-host"
COLLECTING_LOGS = HOST_DATA / "mindcluster-v26.1.0-03_collecting_logs.md"
OFFLINE_RESET = HOST_DATA / "mindcluster-v26.1.0-03_configuring_offline_reset_for_inference_job.md"
SOFT_PARTITION = HOST_DATA / "mindcluster-v26.1.0-01_soft_allocation_scheduling_inference.md"
BASE_LIST = HOST_DATA / "mindcluster-v26.1.0-base.list"


def code_blocks(doc: Path) -> list[str]:
    """The fenced code blocks of a Markdown file, dedented, block quotes' `> ` taken off."""
    blocks: list[str] = []
    current: list[str] | None = None
    for raw in doc.read_text().splitlines():
        line = raw[2:] if raw.startswith("> ") else ("" if raw == ">" else raw)
        if line.lstrip().startswith("```"):
            if current is None:
                current = []
            else:
                blocks.append(textwrap.dedent("\n".join(current) + "\n"))
                current = None
        elif current is not None:
            current.append(line)
    return blocks


def sample(doc: Path, *needles: str, after: str | None = None) -> str:
    """The first code block of doc holding every needle; with `after`, only what follows the line
    ending in that command, up to the next blank line (the docs print several commands per block)."""
    found = [b for b in code_blocks(doc) if all(n in b for n in needles)]
    assert found, f"no code block in {doc.name} holds {needles}"
    if after is None:
        return found[0]
    lines = found[0].splitlines()
    start = next(i for i, line in enumerate(lines) if line.rstrip().endswith(after)) + 1
    end = next((i for i in range(start, len(lines)) if not lines[i].strip()), len(lines))
    return "\n".join(lines[start:end]) + "\n"


def npu_smi_healthy() -> str:
    """Eight 910-class NPUs, all OK, 32768 MB HBM each (npu-smi 23.0.5)."""
    return sample(COLLECTING_LOGS, "npu-smi 23.0.5", "HBM-Usage(MB)", after="npu-smi info")


def npu_smi_busy() -> str:
    """Eight NPUs, each held by a `python` process using 30780 MB (npu-smi 23.0.rc3)."""
    return sample(COLLECTING_LOGS, "npu-smi 23.0.rc3", "139667")


def npu_smi_named(table: str, name: str) -> str:
    """A recorded table with its chip names filled in: MindCluster's docs print `xxx` where npu-smi
    prints the chip's name (e.g. 910B3). Only that cell changes; the parser splits on `|`."""
    assert " xxx " in table
    return table.replace(" xxx ", f" {name} ")


def npu_smi_warning() -> str:
    """The same table with NPU 0's Health at Warning."""
    return sample(OFFLINE_RESET, "| Warning")


def npu_smi_a3_soft_partition() -> str:
    """Atlas A3 under soft partitioning: one NPU, two chips, the Phy-ID column, 3130 / 65536 MB HBM."""
    return sample(SOFT_PARTITION, "Phy-ID", "HBM-Usage(MB)")


def driver_version_info() -> str:
    """/usr/local/Ascend/driver/version.info as printed on a host (Version=24.1.rc1)."""
    return sample(COLLECTING_LOGS, "Version=", "ascendhal_version=")


@dataclass
class Layout:
    driver_version: str | None = "25.5.0"
    npu_smi_at: str | None = "usr/local/bin/npu-smi"
    npu_smi_output: str | None = None  # None: npu_smi_healthy()
    npu_smi_exit: int = 0
    npus: tuple[int, ...] = (0,)
    vnpus: tuple[int, ...] = ()
    control: tuple[str, ...] = ("davinci_manager", "devmm_svm", "hisi_hdc")
    node_owner: tuple[int, int] = (1000, 1000)  # HwHiAiUser's uid:gid as the driver installed it
    node_mode: int = 0o660
    user: tuple[int, int] | None = (1000, 1000)  # HwHiAiUser in etc/passwd; None: no such user
    driver_library: str | None = "usr/local/Ascend/driver/lib64/driver"  # where libascend_hal.so is
    shm: bool = True  # a dev/shm directory (its size is the temporary file system's: tests set it)


def build(root: Path, layout: Layout) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    if layout.driver_version is not None:
        info = root / "usr/local/Ascend/driver/version.info"
        info.parent.mkdir(parents=True, exist_ok=True)
        info.write_text(f"Version={layout.driver_version}\nascendhal_version=7.35.23\n")
    dev = root / "dev"
    dev.mkdir(exist_ok=True)
    names = [f"davinci{i}" for i in layout.npus] + [f"vdavinci{i}" for i in layout.vnpus] + list(layout.control)
    for name in names:
        node = dev / name
        node.write_bytes(b"")
        os.chown(node, *layout.node_owner)
        node.chmod(layout.node_mode)
    if layout.shm:
        (dev / "shm").mkdir(exist_ok=True)
    if layout.driver_library is not None:
        lib = root / layout.driver_library
        lib.mkdir(parents=True, exist_ok=True)
        (lib / "libascend_hal.so").write_bytes(b"")
    etc = root / "etc"
    etc.mkdir(exist_ok=True)
    lines = ["root:x:0:0:root:/root:/bin/bash"]
    if layout.user is not None:
        lines.append(f"HwHiAiUser:x:{layout.user[0]}:{layout.user[1]}::/home/HwHiAiUser:/bin/bash")
    (etc / "passwd").write_text("\n".join(lines) + "\n")
    if layout.npu_smi_at is not None:
        out = root / "npu-smi-info.out"
        out.write_text(npu_smi_healthy() if layout.npu_smi_output is None else layout.npu_smi_output)
        smi = root / layout.npu_smi_at
        smi.parent.mkdir(parents=True, exist_ok=True)
        # Relative to the script's own place, so the layout works wherever it is mounted.
        up = "/".join(".." for _ in Path(layout.npu_smi_at).parent.parts)
        smi.write_text(f'#!/bin/sh\ncat "$(dirname "$0")/{up}/npu-smi-info.out"\nexit {layout.npu_smi_exit}\n')
        smi.chmod(smi.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return root


def build_empty_ascend_view(env: dict[str, str] | None = None) -> HostView:
    """An Ascend host's view with nothing on it but a driver version: for checks whose fix text is
    the subject, not the host."""
    return HostView(
        root="/",
        env=env or {},
        machine="aarch64",
        uid=1000,
        groups=frozenset({1000}),
        driver_version="25.5.0",
        driver_version_raw="Version=25.5.0\n",
        npu_smi=None,
        npu_smi_output=None,
        npu_smi_error=None,
        npus=(),
        vnpus=(),
    )
