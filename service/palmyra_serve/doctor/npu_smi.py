"""`npu-smi info`'s chip table, parsed: one Chip per NPU row pair, in the order npu-smi prints them.

The table (driver 23.x to 25.x, as Ascend's docs print it) gives each chip two lines between
`+===...` separators: `| <npu> <name> | <health> | <power> <temp> <hugepages> |`, then
`| <chip> | <bus-id> | <aicore%> <memory used / total> <HBM used / total> |`. The process table
that follows (`| NPU Chip | Process id | ...`) ends the chip table; processes() reads it: one row
`| <npu> <chip> | <pid> | <name> | <memory MB> |` per process holding an NPU, or
`| No running processes found in NPU <n> |`."""

from __future__ import annotations

import re
from dataclasses import dataclass

_USAGE = re.compile(r"(\d+)\s*/\s*(\d+)")


@dataclass(frozen=True)
class Chip:
    npu: int
    chip: int
    name: str
    health: str
    hbm_used_mb: int | None
    hbm_total_mb: int | None

    @property
    def hbm_free_share(self) -> float | None:
        if not self.hbm_total_mb or self.hbm_used_mb is None:
            return None
        return max(0.0, (self.hbm_total_mb - self.hbm_used_mb) / self.hbm_total_mb)


@dataclass(frozen=True)
class NpuProcess:
    npu: int
    chip: int
    pid: int
    name: str
    memory_mb: int | None


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse(text: str) -> list[Chip]:
    chips: list[Chip] = []
    block: list[str] = []
    in_table = False
    for raw in text.splitlines():
        line = raw.rstrip()
        if _is_process_header(line):
            break  # the process table: no more chips
        if line.startswith("+"):
            in_table = in_table or "=" in line
            if len(block) >= 2:
                chip = _chip(block[0], block[1])
                if chip is not None:
                    chips.append(chip)
            block = []
            continue
        if in_table and line.startswith("|"):
            block.append(line)
    return chips


def _chip(first: str, second: str) -> Chip | None:
    head, tail = _cells(first), _cells(second)
    if len(head) < 2 or len(tail) < 3:
        return None
    npu_name = head[0].split()
    chip_id = tail[0].split()
    if not npu_name or not npu_name[0].isdigit() or not chip_id or not chip_id[0].isdigit():
        return None
    usages = _USAGE.findall(tail[-1])
    used, total = (int(usages[-1][0]), int(usages[-1][1])) if usages else (None, None)
    return Chip(
        npu=int(npu_name[0]),
        chip=int(chip_id[0]),
        name=" ".join(npu_name[1:]),
        health=head[1].split()[0] if head[1] else "",
        hbm_used_mb=used,
        hbm_total_mb=total,
    )


def _is_process_header(line: str) -> bool:
    return "Process id" in line or "Process ID" in line


def processes(text: str) -> list[NpuProcess]:
    """The rows of the process table: who holds which NPU (none when npu-smi says no process runs)."""
    found: list[NpuProcess] = []
    in_table = False
    for raw in text.splitlines():
        line = raw.strip()
        if _is_process_header(line):
            in_table = True
            continue
        if not in_table or not line.startswith("|"):
            continue
        cells = _cells(line)
        if len(cells) < 4:
            continue
        ids, pid = cells[0].split(), cells[1].split()
        if len(ids) < 2 or not all(i.isdigit() for i in ids[:2]) or not pid or not pid[0].isdigit():
            continue
        memory = cells[3].split()
        found.append(
            NpuProcess(
                npu=int(ids[0]),
                chip=int(ids[1]),
                pid=int(pid[0]),
                name=cells[2],
                memory_mb=int(memory[0]) if memory and memory[0].isdigit() else None,
            )
        )
    return found
