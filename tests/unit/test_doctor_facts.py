"""doctor's facts (service/palmyra_serve/doctor/facts.py) and the fixes built on them, held against
the upstream files vendored in tests/data/ascend-host/ (tests/data/README.md): each assertion reads
upstream's own text, so a fact that drifts from upstream fails here, not on an operator's host."""

from __future__ import annotations

import re

from palmyra_serve.doctor import facts
from palmyra_serve.doctor.checks import Wanted, check_npu_smi, check_vnpu
from tests.helpers import ascend_host

HOST = ascend_host.HOST_DATA
INSTALLATION = (HOST / "vllm-ascend-v0.18.0-installation.md").read_text()


def docker_run(text: str) -> tuple[list[str], list[str]]:
    """The first `docker run` of vllm-ascend's installation page: its --device and -v host paths."""
    block = text[text.index("docker run") :]
    block = block[: block.index("-it $IMAGE")]
    devices = re.findall(r"--device (\S+)", block)
    mounts = [m.split(":")[0] for m in re.findall(r"-v (\S+)", block)]
    return devices, mounts


def test_the_cann_doctor_names_is_the_one_vllm_ascend_requires():
    cann = re.search(r"\|\s*CANN\s*\|\s*== ([\d.]+)", INSTALLATION)
    assert cann and cann.group(1) == facts.CANN_VERSION


def test_the_minimum_driver_line_is_the_one_upstream_pairs_with_cann_8_5():
    kv_pool = (HOST / "vllm-ascend-v0.18.0-kv_pool.md").read_text()
    # vllm-ascend pairs HDK >= 26.0.0 with CANN >= 9.0.0; the HDK line before it, 25.5 up to 26.0,
    # is the 8.5 release's.
    assert "HDK >= 26.0.0<br>CANN >= 9.0.0" in kv_pool
    line = re.search(r"(\d+)\.(\d+)\.\d+<=HDK<26\.0\.0", kv_pool)
    assert line and (int(line.group(1)), int(line.group(2))) == facts.MIN_DRIVER_LINE
    # The installation page itself gives no version, only CANN's release notes: doctor says so.
    assert re.search(r"\|\s*Ascend HDK\s*\|\s*Refer to the documentation", INSTALLATION)
    assert "release notes" in facts.MIN_DRIVER_SOURCE


def test_the_control_devices_and_driver_files_are_vllm_ascends():
    devices, mounts = docker_run(INSTALLATION)
    assert [d for d in devices if d != "$DEVICE"] == ["/" + d for d in facts.CONTROL_DEVICES]
    assert "/" + facts.DRIVER_VERSION_FILE in mounts


def test_npu_smi_is_looked_for_wherever_upstream_puts_it():
    _devices, mounts = docker_run(INSTALLATION)
    runtime = ascend_host.BASE_LIST.read_text().split()
    smi = {p for p in [*mounts, *runtime] if p.endswith("/npu-smi")}
    assert smi and smi <= {"/" + p for p in facts.NPU_SMI_PATHS}


def test_vllm_ascend_runs_without_npu_smi_so_no_deployment_must_mount_it():
    worker = (HOST / "vllm-ascend-v0.18.0-worker_worker.py.txt").read_text()
    health = worker[worker.index("def check_health") :]
    assert (
        '["npu-smi", "info"' in health
        and 'except FileNotFoundError:\n            logger.info("npu-smi tool not found.")' in health
    )
    assert "bind_cpus(self.local_rank)\n            except Exception as e:\n                logger.warning(" in worker


def test_cpu_bindings_switch_is_the_one_vllm_ascend_documents():
    config = (HOST / "vllm-ascend-v0.18.0-additional_config.md").read_text()
    row = re.search(r"\|\s*`(enable_cpu_binding)`\s*\|\s*bool\s*\|\s*`True`\s*\|\s*([^|]*)\|", config)
    assert row and "ARM" in row.group(2)
    empty = ascend_host.build_empty_ascend_view()
    fix = check_npu_smi(empty).fix
    assert f"--additional-config.{row.group(1)} false" in fix


def test_eager_mode_on_soft_partitions_is_what_vllm_ascends_graph_mode_guide_implies():
    guide = (HOST / "vllm-ascend-v0.18.0-graph_mode.md").read_text()
    assert "NPU soft partitioning + `CUDAGraphMode.PIECEWISE` is not supported" in guide
    assert "## Fallback to the Eager Mode" in guide and "--enforce-eager" in guide
    soft = ascend_host.build_empty_ascend_view(env={facts.SOFT_PARTITION_ENV[0]: "16384"})
    assert check_vnpu(soft, Wanted()).fix == "PALMYRA_ENFORCE_EAGER=true"
