"""doctor's facts (service/palmyra_serve/doctor/facts.py) and the fixes built on them, held against
the upstream files vendored in tests/data/ascend-host/ (tests/data/README.md): each assertion reads
upstream's own text, so a fact that drifts from upstream fails here, not on an operator's host."""

from __future__ import annotations

import re

from palmyra_serve.doctor import facts
from palmyra_serve.doctor.checks import Wanted, check_npu_smi, check_vnpu
from tests.helpers import ascend_host

HOST = ascend_host.HOST_DATA
DATA = HOST.parent
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


def test_the_driver_floor_is_cann_8_5s_oldest_line_not_the_kv_pools():
    # CANN 8.5.0's release notes (version mapping) pair it with HDK 25.5.X, 25.3.X, 25.2.X and 25.0.X;
    # vllm-ascend's installation page defers to them rather than naming a version.
    assert re.search(r"\|\s*Ascend HDK\s*\|\s*Refer to the documentation", INSTALLATION)
    assert facts.COMPATIBLE_DRIVER_LINES == ((25, 5), (25, 3), (25, 2), (25, 0))
    assert facts.MIN_DRIVER_LINE == (25, 0) and "release notes" in facts.MIN_DRIVER_SOURCE
    # 25.5 is the KV pool's line (kv_pool.md), which is a feature's need, not CANN's floor.
    kv_pool = (HOST / "vllm-ascend-v0.18.0-kv_pool.md").read_text()
    line = re.search(r"(\d+)\.(\d+)\.\d+<=HDK<26\.0\.0", kv_pool)
    assert line and (int(line.group(1)), int(line.group(2))) == facts.HAMI_DRIVER_LINE
    assert facts.HAMI_DRIVER_LINE > facts.MIN_DRIVER_LINE


def test_the_driver_libraries_are_where_canns_image_loads_them_and_the_runtime_mounts_them():
    cann = (DATA / "ascend-image" / "cann-8.5.1-910b-ubuntu22.04-py3.11-Dockerfile").read_text()
    paths = re.findall(r"^ENV LD_LIBRARY_PATH=(\S+)", cann, re.MULTILINE)
    entries = [d for path in paths for d in path.split(":")]
    driver_dirs = [d.rstrip("/").lstrip("/") for d in entries if d.startswith("/usr/local/Ascend/driver/")]
    assert tuple(driver_dirs) == facts.DRIVER_LIBRARY_DIRS
    assert "/" + facts.DRIVER_LIBRARY_DIRS[0] in ascend_host.BASE_LIST.read_text().split()
    _devices, mounts = docker_run(INSTALLATION)  # vllm-ascend's own `docker run` mounts it too
    assert "/" + facts.DRIVER_LIBRARY_DIRS[0] + "/" in mounts
    upstream = (DATA / "ascend-image" / "vllm-ascend-v0.18.0-Dockerfile").read_text()
    assert f"`{facts.DRIVER_HAL}` path" in upstream


def test_the_device_plugin_mounts_only_device_nodes_without_ascend_docker_runtime():
    main = (HOST / "mindcluster-v26.1.0-ascend-device-plugin-main.go.txt").read_text()
    decide = main[main.index("func setUseAscendDocker()") :]
    assert 'if ascendDocker != "True" {\n\t\tuseAscendDocker = false' in decide
    plugin = (HOST / "mindcluster-v26.1.0-ascend-device-plugin-plugin.go.txt").read_text()
    mount = plugin[plugin.index("func (ps *PluginServer) setNPUDeviceMount") :]
    mount = mount[: mount.index("\n}\n")]
    without = mount[mount.index("if !common.ParamOption.UseAscendDocker {") : mount.index("return\n")]
    # Without the runtime: device specs only, no mount of the driver's libraries.
    assert "mountDefaultDevice(resp" in without and "mountDevice(resp" in without
    assert "resp.Mounts" not in without and "lib64" not in plugin


def test_the_shm_size_is_vllm_ascends():
    sizes = set(re.findall(r"--shm-size=(\w+)", INSTALLATION))
    assert sizes == {"1g"} and facts.MIN_SHM_BYTES == 1 << 30


def test_the_chip_families_are_vllm_ascends_and_the_images_socs_map_to_a2_and_a3():
    setup = (HOST / "vllm-ascend-v0.18.0-setup.py.txt").read_text()
    table = setup[setup.index("soc_to_device = {") : setup.index("}", setup.index("soc_to_device = {"))]
    upstream = dict(re.findall(r'"(ascend[\w-]+)": "(\w+)"', table))
    assert {k: v for k, v in upstream.items() if "vir" not in k} == facts.SOC_TO_DEVICE
    images = {}
    for name in ("vllm-ascend-v0.18.0-Dockerfile", "vllm-ascend-v0.18.0-Dockerfile.a3"):
        soc = re.search(r'^ARG SOC_VERSION="(\S+)"', (DATA / "ascend-image" / name).read_text(), re.MULTILINE)
        assert soc
        images[name] = facts.SOC_TO_DEVICE[soc.group(1)]
    assert tuple(images.values()) == facts.IMAGE_DEVICE_TYPES


def test_the_x86_known_issue_is_vllm_ascend_v0_18_0s():
    notes = (HOST / "vllm-ascend-v0.18.0-release_notes.md").read_text()
    release = notes[notes.index("## v0.18.0 ") :]
    release = release[: release.index("\n## v", 5)]
    known = release[release.index("### Known Issue") :]
    issue = next(line for line in known.splitlines() if "x86" in line)
    assert f"CANN {facts.X86_FIXED_IN_CANN}" in issue and "#7993" in issue
    assert f"**CANN**: Upgraded to {facts.CANN_VERSION}" in release


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
