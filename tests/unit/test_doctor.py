"""doctor's checks on stand-in host layouts (tests/helpers/ascend_host.py: a temporary root with the
driver's files, device nodes and an npu-smi printing tables recorded in MindCluster's docs): a
passing host, each failure the field showed, a CPU host. Each case asserts the level that decides
whether the engine starts, and that the fix names what to change."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from palmyra_serve.doctor import facts
from palmyra_serve.doctor import host as host_module
from palmyra_serve.doctor.checks import Finding, Wanted, run_checks
from palmyra_serve.doctor.host import HostView, gather
from palmyra_serve.doctor.npu_smi import parse, processes
from palmyra_serve.doctor.report import exit_status, render_text, verdict
from tests.helpers import ascend_host
from tests.helpers.ascend_host import Layout

OPERATOR = (1000, frozenset({1000}))  # the image's HwHiAiUser, as the engine container runs it
GIB = 1 << 30


def view(
    tmp_path: Path, layout: Layout, env: dict[str, str] | None = None, who=OPERATOR, machine: str = "aarch64"
) -> HostView:
    """The stand-in host as doctor gathers it, run as `who` on `machine`; its /dev/shm, a directory
    of the temporary file system here, is given vllm-ascend's 1 GiB."""
    root = ascend_host.build(tmp_path / "host", layout)
    seen = gather(str(root), env or {})
    shm = GIB if seen.shm_bytes is not None else None
    return dataclasses.replace(seen, uid=who[0], groups=who[1], machine=machine, shm_bytes=shm)


def as_own_system(host: HostView) -> HostView:
    """The same view as doctor has it on the system it runs in (root `/`): the engine's start."""
    return dataclasses.replace(host, root="/")


def findings(host: HostView, **wanted) -> dict[str, list[Finding]]:
    out: dict[str, list[Finding]] = {}
    for f in run_checks(host, Wanted(**wanted)):
        out.setdefault(f.check, []).append(f)
    return out


def levels(host: HostView, **wanted) -> dict[str, str]:
    """The worst level per check."""
    order = ["ok", "info", "warn", "stop"]
    return {k: max((f.level for f in v), key=order.index) for k, v in findings(host, **wanted).items()}


def test_a_healthy_host_passes_every_check(tmp_path):
    host = as_own_system(view(tmp_path, Layout(npu_smi_at="usr/local/sbin/npu-smi")))  # HAMi's default place
    got = levels(host)
    assert {k: v for k, v in got.items() if k not in ("architecture", "CANN on x86", "chip family")} == {
        "driver": "ok",
        "driver libraries": "ok",
        "npu-smi": "ok",
        "devices": "ok",
        "HwHiAiUser": "ok",
        "user account": "ok",
        "visible devices": "ok",
        "NPU state": "ok",
        "HBM": "ok",
        "NPU in use": "ok",
        "/dev/shm": "ok",
        "vNPU": "ok",
    }
    assert got["CANN on x86"] == "info" and got["chip family"] == "info"  # aarch64; not in the image
    all_findings = run_checks(host, Wanted())
    assert exit_status(all_findings) == 0 and verdict(all_findings) == "verdict: ready for the Ascend engine"


@pytest.mark.parametrize(
    "where", ["usr/local/Ascend/driver/tools/npu-smi", "usr/local/sbin/npu-smi", "usr/local/bin/npu-smi"]
)
def test_npu_smi_is_found_in_each_place_driver_installs_put_it(tmp_path, where):
    host = view(tmp_path, Layout(npu_smi_at=where))
    assert host.npu_smi == where and levels(host)["npu-smi"] == "ok"


def test_a_cpu_host_is_told_so_and_passes_unless_ascend_was_asked_for(tmp_path):
    empty = tmp_path / "cpu-host"
    empty.mkdir()
    host = dataclasses.replace(gather(str(empty), {}), machine="x86_64")
    got = run_checks(host, Wanted())
    assert exit_status(got) == 0
    assert verdict(got) == "verdict: not an Ascend host; the CPU engine needs none of this"
    asked = run_checks(host, Wanted(platform="ascend"))
    driver = next(f for f in asked if f.check == "driver")
    assert exit_status(asked) == 1 and driver.level == "stop" and "PALMYRA_PLATFORM=cpu" in driver.fix


def test_a_driver_older_than_cann_8_5s_oldest_line_warns_with_the_upgrade(tmp_path):
    # The version.info MindCluster's docs print: Version=24.1.rc1 (24.1 fails with CANN 8.5).
    layout = Layout()
    root = ascend_host.build(tmp_path / "host", layout)
    (root / "usr/local/Ascend/driver/version.info").write_text(ascend_host.driver_version_info())
    host = dataclasses.replace(gather(str(root), {}), uid=1000, groups=frozenset({1000}))
    driver = findings(host)["driver"][0]
    assert host.driver_version == "24.1.rc1"
    assert driver.level == "warn" and "25.0 or later" in driver.fix and "24.1.rc1" in driver.message


@pytest.mark.parametrize(
    ("version", "level"),
    [
        ("25.5.0", "ok"),
        ("25.5.rc1", "ok"),
        ("26.0.0", "ok"),
        ("25.3.rc1", "ok"),
        ("25.2.0", "ok"),
        ("25.0.rc1", "ok"),
        ("24.1.0", "warn"),
        ("x.y", "warn"),
    ],
)
def test_driver_lines_are_compared_by_major_and_minor(tmp_path, version, level):
    assert levels(view(tmp_path, Layout(driver_version=version)))["driver"] == level


def test_a_driver_cann_accepts_but_hami_does_not_says_so_without_warning(tmp_path):
    driver = findings(view(tmp_path, Layout(driver_version="25.3.rc1")))["driver"][0]
    assert driver.level == "ok" and "HAMi's Ascend device plugin needs 25.5 or later" in driver.message
    assert "HAMi" not in findings(view(tmp_path / "b", Layout(driver_version="25.5.0")))["driver"][0].message


def test_a_missing_version_info_warns_that_the_driver_is_unchecked(tmp_path):
    got = findings(view(tmp_path, Layout(driver_version=None)))["driver"][0]
    assert got.level == "warn" and "version.info" in got.fix


def test_no_npu_smi_warns_and_names_cpu_bindings_switch(tmp_path):
    host = view(tmp_path, Layout(npu_smi_at=None))
    got = findings(host)
    assert got["npu-smi"][0].level == "warn" and "enable_cpu_binding" in got["npu-smi"][0].fix
    assert got["NPU state"][0].level == "info"  # unchecked, not failed
    assert exit_status(run_checks(host, Wanted())) == 0


def test_an_npu_smi_that_fails_or_hangs_warns_and_never_holds_the_start(tmp_path, monkeypatch):
    assert findings(view(tmp_path / "a", Layout(npu_smi_exit=3)))["npu-smi"][0].level == "warn"
    layout = Layout(npu_smi_output="")
    root = ascend_host.build(tmp_path / "b", layout)
    (root / "usr/local/bin/npu-smi").write_text("#!/bin/sh\nexec sleep 30\n")
    monkeypatch.setattr(host_module, "NPU_SMI_TIMEOUT_S", 0.5)
    host = gather(str(root), {})
    assert host.npu_smi_error and "did not answer" in host.npu_smi_error


@pytest.mark.parametrize(
    ("layout", "missing"),
    [
        (Layout(npus=()), "/dev/davinciN"),
        (Layout(control=("davinci_manager", "hisi_hdc")), "/dev/devmm_svm"),
    ],
)
def test_missing_device_nodes_stop_the_engine(tmp_path, layout, missing):
    got = findings(view(tmp_path, layout))["devices"][0]
    assert got.level == "stop" and missing in got.message and "runtimeClassName: ascend" in got.fix


def test_devices_this_user_may_not_open_stop_the_engine_and_name_the_group(tmp_path):
    host = view(tmp_path, Layout(node_owner=(1001, 1001)))
    got = findings(host)["devices"][0]
    assert got.level == "stop" and "HWHIAIUSER_GID=1001" in got.fix and "supplementalGroups: [1001]" in got.fix
    # ...and with that group added, they open.
    assert levels(dataclasses.replace(host, groups=frozenset({1000, 1001})))["devices"] == "ok"


def test_hwhiaiuser_ids_differing_from_the_images_warn_with_the_build_arguments(tmp_path):
    got = findings(view(tmp_path, Layout(user=(1200, 1300), node_owner=(1200, 1300)), who=(0, frozenset({0}))))
    user = got["HwHiAiUser"][0]
    assert user.level == "warn" and "HWHIAIUSER_UID=1200" in user.fix and "HWHIAIUSER_GID=1300" in user.fix
    assert levels(view(tmp_path / "b", Layout(user=None)))["HwHiAiUser"] == "warn"
    same = view(tmp_path / "c", Layout(user=(1200, 1300)))
    assert levels(same, image_uid=1200, image_gid=1300)["HwHiAiUser"] == "ok"


@pytest.mark.parametrize(
    ("env", "level", "says"),
    [
        ({"ASCEND_RT_VISIBLE_DEVICES": "3"}, "stop", "numbered from 0"),
        ({"PALMYRA_NPU_DEVICES": "1"}, "stop", "numbered from 0"),
        ({"PALMYRA_NPU_DEVICES": "a"}, "stop", "not a list of NPU numbers"),
        ({"PALMYRA_NPU_DEVICES": "0", "ASCEND_RT_VISIBLE_DEVICES": "1"}, "warn", "replaces"),
        ({"ASCEND_VISIBLE_DEVICES": "4,5"}, "warn", "runtimeClassName"),
        ({"ASCEND_RT_VISIBLE_DEVICES": "0", "ASCEND_VISIBLE_DEVICES": "5"}, "ok", "NPU 0 of 1"),
    ],
)
def test_visible_device_variables_must_fit_the_devices_present(tmp_path, env, level, says):
    got = findings(view(tmp_path, Layout(npus=(5,)), env=env))["visible devices"]
    worst = max(got, key=lambda f: ["ok", "info", "warn", "stop"].index(f.level))
    assert worst.level == level and says in worst.message + worst.fix, got


def test_npu_health_warning_warns_and_critical_stops(tmp_path):
    warning = ascend_host.npu_smi_warning()  # MindCluster's table with NPU 0 at Warning
    assert levels(view(tmp_path / "w", Layout(npu_smi_output=warning)))["NPU state"] == "warn"
    critical = warning.replace("| Warning            |", "| Critical           |")
    assert critical != warning
    host = view(tmp_path / "c", Layout(npu_smi_output=critical))
    assert levels(host)["NPU state"] == "stop" and exit_status(run_checks(host, Wanted())) == 1
    # The other NPU of the same table is OK: the chosen one is what counts.
    assert (
        levels(view(tmp_path / "o", Layout(npus=(0, 7), npu_smi_output=critical), env={"PALMYRA_NPU_DEVICES": "1"}))[
            "NPU state"
        ]
        == "ok"
    )


def test_less_free_hbm_than_vllm_asks_for_warns(tmp_path):
    a3 = ascend_host.npu_smi_a3_soft_partition()  # 3130 of 65536 MB in use: 95 % free
    host = view(tmp_path, Layout(npu_smi_output=a3))
    assert levels(host)["HBM"] == "ok"
    got = findings(host, gpu_memory_utilization=0.97)["HBM"][0]
    assert got.level == "warn" and "PALMYRA_GPU_MEMORY_UTILIZATION" in got.fix and "62406 of 65536" in got.message


def test_an_image_of_the_other_architecture_stops_and_says_how_to_build(tmp_path):
    host = view(tmp_path, Layout(), machine="x86_64")
    got = findings(host, image_arch="arm64")["architecture"][0]
    assert got.level == "stop" and "--platform linux/amd64" in got.fix
    assert levels(host, image_arch="amd64")["architecture"] == "ok"
    assert levels(dataclasses.replace(host, machine="aarch64"), image_arch="arm64")["architecture"] == "ok"


def test_a_soft_partitioned_npu_needs_eager_mode(tmp_path):
    soft = {"NPU_MEM_QUOTA": "16384", "NPU_GLOBAL_SHM_PATH": "/hami-shared-region/0_global_registry"}
    host = view(tmp_path, Layout(), env=soft)
    got = findings(host)["vNPU"][0]
    assert got.level == "warn" and got.fix == "PALMYRA_ENFORCE_EAGER=true"
    assert levels(host, enforce_eager=True)["vNPU"] == "ok"
    assert levels(view(tmp_path / "t", Layout(), env={"ASCEND_VNPU_SPECS": "vir05_1c_16g"}))["vNPU"] == "info"


def test_the_recorded_tables_parse_into_their_chips():
    healthy = parse(ascend_host.npu_smi_healthy())
    assert [(c.npu, c.health, c.hbm_total_mb) for c in healthy] == [(0, "OK", 32768), (7, "OK", 32768)]
    a3 = parse(ascend_host.npu_smi_a3_soft_partition())
    assert [(c.npu, c.chip, c.hbm_used_mb) for c in a3] == [(0, 0, 3130), (0, 1, 3130)]
    assert parse("") == [] and parse("garbage\n| 1 | 2 |\n") == []


def test_the_report_gives_each_failure_its_fix_and_one_verdict(tmp_path):
    host = view(tmp_path, Layout(npus=()))
    text = render_text(run_checks(host, Wanted()))
    assert "[STOP] devices:" in text and "        fix: pass /dev/davinciN" in text
    assert text.splitlines()[-1].startswith("verdict: the engine will not start here (1 to fix")


@pytest.mark.parametrize("where", facts.DRIVER_LIBRARY_DIRS)
def test_the_driver_libraries_are_found_in_each_directory_cann_loads_them_from(tmp_path, where):
    host = view(tmp_path, Layout(driver_library=where))
    assert levels(host)["driver libraries"] == "ok"


def test_no_driver_libraries_stop_with_torch_npus_own_error(tmp_path):
    # The device plugin without Ascend Docker Runtime: device nodes, no driver/lib64.
    host = view(tmp_path, Layout(driver_library=None))
    got = findings(host)["driver libraries"][0]
    assert got.level == "stop" and "libascend_hal.so: cannot open shared object file" in got.message
    assert "runtimeClassName: ascend" in got.fix and exit_status(run_checks(host, Wanted())) == 1


def test_an_npu_held_by_another_process_warns_with_its_pid(tmp_path):
    busy = ascend_host.npu_smi_busy()  # MindCluster's table: every NPU held by a python process
    got = findings(view(tmp_path, Layout(npu_smi_output=busy)))["NPU in use"][0]
    assert got.level == "warn" and "pid 139667 (python, 30780 MB)" in got.message
    assert "Free memory on device" in got.message and "PALMYRA_NPU_DEVICES" in got.fix
    idle = ascend_host.npu_smi_healthy()  # "No running processes found in NPU 0"
    assert levels(view(tmp_path / "idle", Layout(npu_smi_output=idle)))["NPU in use"] == "ok"
    # NPU 1 of the busy table is held by another pid: the chosen NPU's holder is named.
    second = findings(view(tmp_path / "n1", Layout(npus=(0, 1), npu_smi_output=busy), env={"PALMYRA_NPU_DEVICES": "1"}))
    assert "pid 139577" in second["NPU in use"][0].message


def test_a_uid_without_a_passwd_entry_warns_with_hccls_error(tmp_path):
    host = as_own_system(view(tmp_path, Layout(), who=(4242, frozenset({1000}))))
    got = findings(host)["user account"][0]
    assert got.level == "warn" and "error code is 19" in got.message and "HWHIAIUSER_UID=4242" in got.fix
    assert levels(as_own_system(view(tmp_path / "known", Layout())))["user account"] == "ok"
    # A mounted host root's passwd says nothing of the engine container's user.
    assert levels(view(tmp_path / "mounted", Layout(), who=(4242, frozenset({1000}))))["user account"] == "info"


def test_in_the_image_hwhiaiuser_is_not_compared_with_itself(tmp_path):
    # The engine image's preflight reads its own /etc/passwd: never a comparison that cannot fail.
    image_env = {"HWHIAIUSER_UID": "1000", "HWHIAIUSER_GID": "1000"}
    host = dataclasses.replace(view(tmp_path, Layout(user=(1200, 1300)), env=image_env), root="/")
    got = findings(host)["HwHiAiUser"][0]
    assert got.level == "info" and "--root /host" in got.message


@pytest.mark.parametrize(
    ("chip", "soc", "level"),
    [
        ("910B3", "ascend910b1", "ok"),  # an Atlas A2 chip, the A2 image
        ("310P3", "ascend910b1", "stop"),  # a 310P under the A2 image
        ("910B3", "ascend910_9391", "stop"),  # an A2 chip under the A3 image
        ("Ascend910", "ascend910b1", "warn"),  # not an A2 chip: an A3 or a 910A
    ],
)
def test_the_chip_family_must_be_the_images(tmp_path, chip, soc, level):
    table = ascend_host.npu_smi_named(ascend_host.npu_smi_healthy(), chip)
    got = findings(view(tmp_path, Layout(npu_smi_output=table), env={"SOC_VERSION": soc}))["chip family"][0]
    assert got.level == level, got
    if level != "ok":
        assert "vllm-ascend:v0.18.0-a3" in got.fix


def test_a_small_dev_shm_warns(tmp_path):
    host = as_own_system(dataclasses.replace(view(tmp_path, Layout()), shm_bytes=64 << 20))  # Docker's default
    got = findings(host)["/dev/shm"][0]
    assert got.level == "warn" and "64 MiB" in got.message and "--shm-size=1g" in got.fix
    assert levels(as_own_system(view(tmp_path / "none", Layout(shm=False))))["/dev/shm"] == "warn"
    assert levels(dataclasses.replace(host, root=str(tmp_path)))["/dev/shm"] == "info"  # a mounted host's


def test_an_x86_host_is_warned_of_vllm_ascends_known_issue(tmp_path):
    got = findings(view(tmp_path, Layout(), machine="x86_64"))["CANN on x86"][0]
    assert got.level == "warn" and "9.0.0" in got.message and "8.5.1" in got.message
    assert levels(view(tmp_path / "arm", Layout()))["CANN on x86"] == "info"


def test_npu_smi_failing_for_want_of_davinci_manager_says_how_to_run_it(tmp_path):
    # doctor in a container without the control devices, judging a mounted host root that has them.
    host = dataclasses.replace(view(tmp_path, Layout(npu_smi_exit=3)), manager_here=False)
    got = findings(host)["npu-smi"][0]
    assert got.level == "warn" and "--device /dev/davinci_manager" in got.fix
    assert "processes holding it go unchecked" in got.message
    # With the device here, a failing npu-smi points at the driver instead.
    here = dataclasses.replace(host, manager_here=True)
    assert "--device" not in findings(here)["npu-smi"][0].fix


def test_the_busy_table_parses_its_processes():
    held = processes(ascend_host.npu_smi_busy())
    assert [(p.npu, p.pid) for p in held][:2] == [(0, 139667), (1, 139577)] and len(held) == 8
    assert processes(ascend_host.npu_smi_healthy()) == []
