"""What the checks compare against, each with where it comes from. Sources, not restatements:
tests/unit/test_doctor_facts.py reads the vendored upstream files and fails when these differ."""

from __future__ import annotations

# The driver's own record of its version (vllm-ascend's `docker run` mounts it into the container).
DRIVER_VERSION_FILE = "usr/local/Ascend/driver/version.info"

# Where an installed CANN toolkit records its version (a `version=` line), newest layout first:
# CANN 8.5's /usr/local/Ascend/cann/<arch>-linux, its versioned directory, and the older
# ascend-toolkit/latest tree (CANN's installation guides: "cat .../ascend_toolkit_install.info").
CANN_INSTALL_INFO = (
    "usr/local/Ascend/cann/{arch}-linux/ascend_toolkit_install.info",
    "usr/local/Ascend/cann-*/{arch}-linux/ascend_toolkit_install.info",
    "usr/local/Ascend/ascend-toolkit/latest/{arch}-linux/ascend_toolkit_install.info",
)

# The CANN the engine image carries (vllm-ascend v0.18.0's image, docs/source/installation.md).
CANN_VERSION = "8.5.1"

# The driver (HDK) lines CANN 8.5 goes with, from CANN 8.5.0's release notes (version mapping:
# "Ascend HDK 25.5.X, 25.3.X, 25.2.X, 25.0.X"; vllm-ascend's installation page defers to them).
# Compared by major.minor: a 25.5 release candidate is the 25.5 line. Below the oldest, CANN 8.5
# fails at device initialisation (driver 24.1: vllm-ascend#5468). 25.5 is not CANN's floor: it is
# what HAMi's Ascend device plugin (v1.4.0, docs/hami.md) and vllm-ascend's KV pool
# (kv_pool.md, 25.5.0 <= HDK < 26.0.0) need, which doctor says when the driver is below it.
COMPATIBLE_DRIVER_LINES = ((25, 5), (25, 3), (25, 2), (25, 0))
MIN_DRIVER_LINE = min(COMPATIBLE_DRIVER_LINES)
MIN_DRIVER_SOURCE = "CANN 8.5's release notes pair it with HDK 25.0, 25.2, 25.3 and 25.5"
HAMI_DRIVER_LINE = (25, 5)

# The driver's user-space libraries, in the directories CANN's base image puts on LD_LIBRARY_PATH
# (cann-container-image, 8.5.1 Dockerfiles); Ascend Docker Runtime mounts their parent,
# driver/lib64 (base.list). torch_npu cannot load without libascend_hal.so: "libascend_hal.so:
# cannot open shared object file", then "Failed to load the backend extension: torch_npu"
# (vllm-ascend#1440).
DRIVER_LIBRARY_DIRS = (
    "usr/local/Ascend/driver/lib64",
    "usr/local/Ascend/driver/lib64/common",
    "usr/local/Ascend/driver/lib64/driver",
)
DRIVER_HAL = "libascend_hal.so"

# /dev/shm: vllm-ascend's `docker run` gives the container 1 GiB (--shm-size=1g, installation.md);
# Docker's default is 64 MiB.
MIN_SHM_BYTES = 1 << 30

# Chip families, from vllm-ascend's own table (setup.py at v0.18.0, soc_to_device): a SOC_VERSION
# (the image's, in its ENV; upstream builds the A2 image with ascend910b1, the A3 one with
# ascend910_9391) names the device type its kernels were built for. npu-smi's Name column for an
# A2 chip (910B1..910B4) or a 310P (310P1..310P7) is the SOC without its "ascend" prefix.
SOC_TO_DEVICE = {
    "ascend910b1": "A2",
    "ascend910b2": "A2",
    "ascend910b2c": "A2",
    "ascend910b3": "A2",
    "ascend910b4": "A2",
    "ascend910b4-1": "A2",
    "ascend910_9391": "A3",
    "ascend910_9381": "A3",
    "ascend910_9372": "A3",
    "ascend910_9392": "A3",
    "ascend910_9382": "A3",
    "ascend910_9362": "A3",
    "ascend310p1": "_310P",
    "ascend310p3": "_310P",
    "ascend310p5": "_310P",
    "ascend310p7": "_310P",
}
# The images this repository builds: A2 (the default base) and A3 (VLLM_ASCEND_BASE=...-a3).
IMAGE_DEVICE_TYPES = ("A2", "A3")

# vllm-ascend v0.18.0's release notes, Known Issue: an issue on x86 hosts resolved only in CANN
# 9.0.0 (vllm-ascend#7993); the image ships CANN_VERSION.
X86_FIXED_IN_CANN = "9.0.0"

# Where driver installs put npu-smi, in the order HAMi's Ascend device plugin looks (v1.4.0,
# docs/hami.md); Ascend Docker Runtime's base.list mounts the last. No one path is guaranteed, so
# nothing here mounts one fixed path (a missing bind source fails the pod or becomes an empty
# directory); doctor looks in each. vllm-ascend runs without it: its health query and its CPU
# binding log a warning and go on (vllm_ascend/worker/worker.py).
NPU_SMI_PATHS = (
    "usr/local/Ascend/driver/tools/npu-smi",
    "usr/local/sbin/npu-smi",
    "usr/local/bin/npu-smi",
)

# The driver's shared control devices, next to one /dev/davinciN per NPU (vllm-ascend's
# `docker run`; Ascend Docker Runtime's base.list mounts the same).
CONTROL_DEVICES = ("dev/davinci_manager", "dev/devmm_svm", "dev/hisi_hdc")

# The image's runtime user: HwHiAiUser, built with HWHIAIUSER_UID / HWHIAIUSER_GID (default 1000,
# the common choice of the driver's installer, not a fixed one).
IMAGE_USER = "HwHiAiUser"
IMAGE_UID_DEFAULT = 1000
IMAGE_GID_DEFAULT = 1000

# npu-smi's Health column: OK is healthy; Critical means the chip is unusable; Warning and Alarm
# may still run, so they warn.
HEALTH_OK = "OK"
HEALTH_STOP = frozenset({"Critical"})

# Architectures upstream publishes images for (vllm-ascend's image workflow builds amd64 and arm64).
# An image of the other one ends in "exec format error" at its first command.
IMAGE_ARCHES = {"x86_64": "amd64", "amd64": "amd64", "aarch64": "arm64", "arm64": "arm64"}

# A soft-partitioned NPU (HAMi's hami-vnpu-core slicing): HAMi's Ascend device plugin gives such a
# container these variables (ascend-device-plugin v1.4.0, internal/server/allocate.go). vllm-ascend
# does not support its default ACL graph mode, PIECEWISE, there (v0.18.0 graph_mode.md, "Common
# Limitations"; vllm-ascend#8585): eager mode is the fallback its graph-mode guide gives.
SOFT_PARTITION_ENV = ("NPU_MEM_QUOTA", "NPU_GLOBAL_SHM_PATH")
# A template (hard) vNPU: the plugins pass its template in this variable, and the host has
# /dev/vdavinciN nodes (Ascend Docker Runtime mounts each as /dev/davinciN in the container).
HARD_PARTITION_ENV = "ASCEND_VNPU_SPECS"
