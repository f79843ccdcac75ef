"""What the checks compare against, each with where it comes from. Sources, not restatements:
tests/unit/test_doctor_facts.py reads the vendored upstream files and fails when these differ."""

from __future__ import annotations

# The driver's own record of its version (vllm-ascend's `docker run` mounts it into the container).
DRIVER_VERSION_FILE = "usr/local/Ascend/driver/version.info"

# The CANN the engine image carries (vllm-ascend v0.18.0's image, docs/source/installation.md).
CANN_VERSION = "8.5.1"

# The oldest driver (HDK) line doctor accepts for it: 25.5. vllm-ascend's installation page defers
# to CANN's release notes for the HDK; the pairing shows in its own guides (kv_pool.md: HDK >= 26.0.0
# goes with CANN >= 9.0.0, and 25.5.0 <= HDK < 26.0.0 with the 8.5 line before it), and HAMi's
# Ascend device plugin (v1.4.0, docs/hami.md) requires driver >= 25.5 outright. Compared by
# major.minor: a 25.5 release candidate is the 25.5 line.
MIN_DRIVER_LINE = (25, 5)
MIN_DRIVER_SOURCE = "CANN 8.5's release notes; HAMi's Ascend device plugin also requires 25.5 or later"

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
