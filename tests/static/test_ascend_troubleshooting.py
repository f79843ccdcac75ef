"""docs/ascend-troubleshooting.md against doctor and the upstream texts it quotes: every check doctor
runs has its row in the doctor table, the driver floor and the x86 known issue read as doctor's
facts say, the documented doctor container can run npu-smi, and the five failures seen most are
quoted as upstream prints them (vllm-ascend v0.18.0's FAQ, vendored in tests/data/ascend-host/)."""

from __future__ import annotations

import re
import shlex

from palmyra_serve.doctor import facts
from palmyra_serve.doctor.checks import Wanted, check_driver_libraries, run_checks
from tests.helpers import ascend_host

DOC = ascend_host.HOST_DATA.parents[2] / "docs" / "ascend-troubleshooting.md"
TEXT = DOC.read_text(encoding="utf-8")


def sh_blocks(text: str) -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```$", text, re.MULTILINE | re.DOTALL)


def section(title: str) -> str:
    start = TEXT.index(f"## {title}")
    end = TEXT.find("\n## ", start + 1)
    return TEXT[start : end if end != -1 else len(TEXT)]


def doctor_table() -> dict[str, str]:
    """The doctor section's table: each check name (a row may name several) -> its row."""
    rows: dict[str, str] = {}
    for line in section("Before the engine starts").splitlines():
        if line.startswith("| ") and not line.startswith(("| check ", "|---")):
            for name in line.split("|")[1].split(","):
                rows[name.strip()] = line
    return rows


def test_every_check_doctor_runs_has_its_row():
    names = {f.check for f in run_checks(ascend_host.build_empty_ascend_view(), Wanted())}
    assert names - set(doctor_table()) == set(), sorted(names - set(doctor_table()))


def test_the_driver_row_names_cann_8_5s_oldest_line():
    row = doctor_table()["driver"]
    minimum = ".".join(map(str, facts.MIN_DRIVER_LINE))
    assert f"older than {minimum}" in row
    for line in facts.COMPATIBLE_DRIVER_LINES:
        assert ".".join(map(str, line)) in row


def test_the_documented_doctor_container_can_run_npu_smi():
    blocks = [b for b in sh_blocks(section("Before the engine starts")) if "doctor --root /host" in b]
    assert len(blocks) == 1
    words = shlex.split(blocks[0].replace("\\\n", " "))
    devices = {words[i + 1] for i, w in enumerate(words) if w == "--device"}
    assert {"/" + d for d in facts.CONTROL_DEVICES} <= devices and "/dev/davinci0" in devices


def test_the_five_failures_are_quoted_as_upstream_prints_them():
    five = section("The five failures seen most")
    # 1. what doctor's driver-libraries check quotes is what the page quotes.
    stop = check_driver_libraries(ascend_host.build_empty_ascend_view())
    quoted = re.findall(r"`([^`]*cannot open shared object file[^`]*)`", stop.message)
    assert quoted and all(q in five for q in quoted)
    assert "Failed to load the backend extension: torch_npu" in stop.message
    assert "Failed to load the backend extension: torch_npu" in five
    # 5. the FAQ's own message for graph capture out of streams, verbatim.
    faq = (ascend_host.HOST_DATA / "vllm-ascend-v0.18.0-faqs.md").read_text(encoding="utf-8")
    streams = re.search(r"\] (ACLgraph has insufficient available streams[^.]*\.)", faq)
    assert streams and streams.group(1) in five
    assert "Compilation error occasionally encounters with triton-ascend" in faq and "triton-ascend" in five
    # Each of the five is numbered and names an upstream issue or the FAQ.
    items = re.findall(r"^\*\*(\d)\. ", five, re.MULTILINE)
    assert items == ["1", "2", "3", "4", "5"]
    for marker in ("-8005", "Free memory on device", "EL0004", "207001", "drvRetCode=17", "507899", "207004"):
        assert marker in five, marker


def test_the_x86_section_is_vllm_ascends_known_issue():
    x86 = section("x86 hosts")
    assert f"CANN {facts.X86_FIXED_IN_CANN}" in x86 and facts.CANN_VERSION in x86 and "#7993" in x86
