"""The checks: pure judgements of a HostView, each a Finding with the fix for anything not ok.

Levels, and when doctor stops the engine (`palmyra-serve engine` on Ascend, PALMYRA_DOCTOR=stop):
- stop: the engine cannot start or cannot use the NPU, whatever else is right: no device node, a
  device this user may not open, a visible-device number past the devices present, an image of the
  other architecture, a chip npu-smi calls Critical, no Ascend driver where Ascend was asked for.
- warn: it may start, and the field showed it going wrong: a driver older than the minimum, npu-smi
  missing or failing, less free HBM than vLLM will ask for, HwHiAiUser's ids differing from the
  image's, variables that disagree, a soft-partitioned vNPU without eager mode.
- ok / info: nothing to do; info says what was seen (a CPU host, the architecture)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from palmyra_serve.doctor import facts
from palmyra_serve.doctor.host import HostView, Node
from palmyra_serve.doctor.npu_smi import parse

Level = Literal["ok", "info", "warn", "stop"]
LEVELS: tuple[Level, ...] = ("ok", "info", "warn", "stop")


@dataclass(frozen=True)
class Finding:
    check: str
    level: Level
    message: str
    fix: str = ""


@dataclass(frozen=True)
class Wanted:
    """What the engine will ask of the host: from the settings and the operator's flags."""

    platform: str = "auto"  # "ascend": a host without the driver is a failure, not a CPU host
    gpu_memory_utilization: float = 0.85
    enforce_eager: bool = False
    image_arch: str | None = None  # the image's architecture, when checking a host for an image
    image_uid: int = facts.IMAGE_UID_DEFAULT
    image_gid: int = facts.IMAGE_GID_DEFAULT


def is_ascend_host(host: HostView) -> bool:
    return bool(host.driver_version_raw is not None or host.npus or host.vnpus or host.npu_smi)


def driver_line(version: str) -> tuple[int, int] | None:
    """'25.5.0' -> (25, 5); '25.5.rc1' -> (25, 5); anything without two leading numbers -> None."""
    parts = version.strip().split(".")
    if len(parts) < 2 or not parts[0].isdigit() or not parts[1].isdigit():
        return None
    return int(parts[0]), int(parts[1])


def _ids(value: str) -> list[int] | None:
    items = [v.strip() for v in value.split(",") if v.strip()]
    return [int(v) for v in items] if items and all(v.isdigit() for v in items) else None


def _can_open(node: Node, uid: int, groups: frozenset[int]) -> bool:
    if uid == 0:
        return True
    if node.uid == uid:
        return node.mode & 0o600 == 0o600
    if node.gid in groups:
        return node.mode & 0o060 == 0o060
    return node.mode & 0o006 == 0o006


def check_driver(host: HostView, want: Wanted) -> Finding:
    name = "driver"
    if not is_ascend_host(host):
        if want.platform == "ascend":
            return Finding(
                name,
                "stop",
                "no Ascend driver here: no /usr/local/Ascend/driver/version.info, no /dev/davinci*, no npu-smi",
                "install the Ascend driver (HDK) on the host and pass its devices and files to the engine "
                "(docs/ascend.md, 'The first hour on a real 910B'); or, on a host without an NPU, run the CPU engine: "
                "`docker compose --env-file compose/cpu.env up -d` with Compose, PALMYRA_PLATFORM=cpu elsewhere",
            )
        return Finding(name, "info", "not an Ascend host (no driver, no /dev/davinci*, no npu-smi): nothing to check")
    if host.driver_version is None:
        return Finding(
            name,
            "warn",
            f"/{facts.DRIVER_VERSION_FILE} is missing or has no Version= line: the driver version is unchecked",
            f"mount the host's /{facts.DRIVER_VERSION_FILE} read-only (the Compose file and the overlays do)",
        )
    minimum = ".".join(map(str, facts.MIN_DRIVER_LINE))
    line = driver_line(host.driver_version)
    if line is None:
        return Finding(
            name,
            "warn",
            f"driver version {host.driver_version!r} is not in the major.minor form doctor compares",
            f"check by hand that it is {minimum} or later ({facts.MIN_DRIVER_SOURCE})",
        )
    if line < facts.MIN_DRIVER_LINE:
        return Finding(
            name,
            "warn",
            f"driver {host.driver_version} is older than {minimum}, the line CANN {facts.CANN_VERSION} goes with",
            f"upgrade the host's driver and firmware to {minimum} or later ({facts.MIN_DRIVER_SOURCE})",
        )
    return Finding(name, "ok", f"driver {host.driver_version} (CANN {facts.CANN_VERSION} needs {minimum} or later)")


def check_npu_smi(host: HostView) -> Finding:
    name = "npu-smi"
    if not is_ascend_host(host):
        return Finding(name, "info", "not looked for (not an Ascend host)")
    if host.npu_smi is None:
        where = ", ".join("/" + p for p in facts.NPU_SMI_PATHS)
        return Finding(
            name,
            "warn",
            f"npu-smi is in none of {where}: the NPU's health and free HBM go unchecked, and vllm-ascend's CPU "
            "binding (on by default on ARM hosts) runs npu-smi too",
            "mount the host's npu-smi into the engine container (docs/ascend-troubleshooting.md, \"npu-smi is not "
            'in the container"; in Kubernetes the Ascend runtime mounts it), or turn CPU binding off: '
            "PALMYRA_ENGINE_EXTRA_ARGS='--additional-config.enable_cpu_binding false'",
        )
    if host.npu_smi_error:
        return Finding(name, "warn", host.npu_smi_error, "run `npu-smi info` on the host: the driver may need a reset")
    return Finding(name, "ok", f"/{host.npu_smi} answers")


def check_devices(host: HostView) -> Finding:
    name = "devices"
    if not is_ascend_host(host):
        return Finding(name, "info", "no /dev/davinci* (not an Ascend host)")
    missing = [rel for rel, node in host.control.items() if node is None]
    if not host.npus and not host.vnpus:
        missing.insert(0, "dev/davinciN")
    if missing:
        return Finding(
            name,
            "stop",
            "device nodes missing: " + ", ".join("/" + m for m in missing),
            "pass /dev/davinciN and the control devices /dev/davinci_manager, /dev/devmm_svm, /dev/hisi_hdc "
            "(Compose: devices:; Kubernetes: the device plugin with the Ascend runtime, runtimeClassName: ascend)",
        )
    nodes = [*host.npus, *host.vnpus, *(n for n in host.control.values() if n is not None)]
    shut = [n for n in nodes if not _can_open(n, host.uid, host.groups)]
    if shut:
        first = shut[0]
        return Finding(
            name,
            "stop",
            f"uid {host.uid} (groups {sorted(host.groups)}) may not open "
            + ", ".join(f"/{n.path} (owner {n.uid}:{n.gid}, mode {n.mode:o})" for n in shut),
            f"run with the device group: Compose HWHIAIUSER_GID={first.gid} (group_add), Kubernetes "
            f"securityContext.supplementalGroups: [{first.gid}], or build the image with HWHIAIUSER_GID={first.gid}",
        )
    listed = ", ".join("/" + n.path for n in [*host.npus, *host.vnpus])
    return Finding(name, "ok", f"{listed} and the three control devices, all open to uid {host.uid}")


def check_user(host: HostView, want: Wanted) -> Finding:
    name = "HwHiAiUser"
    if not is_ascend_host(host):
        return Finding(name, "info", "not checked (not an Ascend host)")
    account = host.host_user
    if account is None:
        return Finding(
            name,
            "warn",
            "no HwHiAiUser in /etc/passwd: the driver's device nodes belong to some other account",
            "read the devices' group (`stat -c %g /dev/davinci0`) and give it to the engine (HWHIAIUSER_GID)",
        )
    if (account.uid, account.gid) != (want.image_uid, want.image_gid):
        return Finding(
            name,
            "warn",
            f"HwHiAiUser here is {account.uid}:{account.gid}, the image's is {want.image_uid}:{want.image_gid}",
            f"build the image with --build-arg HWHIAIUSER_UID={account.uid} --build-arg HWHIAIUSER_GID={account.gid}, "
            f"or add group {account.gid} (Compose HWHIAIUSER_GID, Kubernetes supplementalGroups)",
        )
    return Finding(name, "ok", f"HwHiAiUser is {account.uid}:{account.gid}, as in the image")


def visible_ids(host: HostView) -> tuple[list[int] | None, str]:
    """The logical NPU numbers the engine will use and the variable they come from (the launcher
    exports PALMYRA_NPU_DEVICES as ASCEND_RT_VISIBLE_DEVICES)."""
    for var in ("PALMYRA_NPU_DEVICES", "ASCEND_RT_VISIBLE_DEVICES"):
        value = host.env.get(var)
        if value:
            return _ids(value), var
    return [0], ""


def check_visible_devices(host: HostView) -> list[Finding]:
    name = "visible devices"
    if not is_ascend_host(host):
        return [Finding(name, "info", "not checked (not an Ascend host)")]
    out: list[Finding] = []
    mine, rt = host.env.get("PALMYRA_NPU_DEVICES"), host.env.get("ASCEND_RT_VISIBLE_DEVICES")
    if mine and rt and mine != rt:
        out.append(
            Finding(
                name,
                "warn",
                f"PALMYRA_NPU_DEVICES={mine} replaces ASCEND_RT_VISIBLE_DEVICES={rt} for the engine",
                "set one of them",
            )
        )
    ids, var = visible_ids(host)
    count = len(host.npus) + len(host.vnpus)
    if not count:
        return [*out, Finding(name, "info", "no NPU device node to number (see devices)")]
    if ids is None:
        out.append(Finding(name, "stop", f"{var}={host.env.get(var)!r} is not a list of NPU numbers", f"e.g. {var}=0"))
        return out
    beyond = [i for i in ids if i >= count]
    if count and beyond:
        out.append(
            Finding(
                name,
                "stop",
                f"{var or 'the default'} asks for NPU {','.join(map(str, ids))}, but {count} NPU device node(s) are "
                "present, numbered from 0 in a container whatever their host numbers",
                f"{var or 'PALMYRA_NPU_DEVICES'}={','.join(map(str, range(min(count, len(ids)))))}",
            )
        )
    runtime = host.env.get("ASCEND_VISIBLE_DEVICES")
    runtime_ids = _ids(runtime) if runtime else None
    if runtime_ids is not None and count and len(runtime_ids) != count:
        out.append(
            Finding(
                name,
                "warn",
                f"ASCEND_VISIBLE_DEVICES={runtime} (set by the device plugin) names {len(runtime_ids)} NPU(s), "
                f"{count} device node(s) are present",
                "run the pod with the Ascend runtime (runtimeClassName: ascend), which turns that variable "
                "into device nodes",
            )
        )
    if not out:
        shown = ",".join(map(str, ids))
        out.append(Finding(name, "ok", f"NPU {shown} of {count} present" + (f" ({var})" if var else " (default)")))
    return out


def check_npu_state(host: HostView, want: Wanted) -> list[Finding]:
    name = "NPU state"
    if not host.npu_smi_output:
        return [Finding(name, "info", "unchecked: no `npu-smi info` output")]
    chips = parse(host.npu_smi_output)
    ids, _ = visible_ids(host)
    index = ids[0] if ids else 0
    if not chips:
        return [Finding(name, "warn", "`npu-smi info` printed no chip table doctor can read", "run it by hand")]
    if index >= len(chips):
        return [Finding(name, "info", f"npu-smi lists {len(chips)} chip(s); NPU {index} is not among them")]
    chip = chips[index]
    label = f"NPU {chip.npu} chip {chip.chip} ({chip.name})"
    out: list[Finding] = []
    if chip.health == facts.HEALTH_OK:
        out.append(Finding(name, "ok", f"{label}: health {chip.health}"))
    else:
        out.append(
            Finding(
                name,
                "stop" if chip.health in facts.HEALTH_STOP else "warn",
                f"{label}: health {chip.health}",
                "`npu-smi info -t health -i <npu>` names the alarm; pick another NPU (PALMYRA_NPU_DEVICES) or reset it",
            )
        )
    free, total, used = chip.hbm_free_share, chip.hbm_total_mb, chip.hbm_used_mb or 0
    if free is not None and total is not None and free < want.gpu_memory_utilization:
        out.append(
            Finding(
                "HBM",
                "warn",
                f"{label}: {total - used} of {total} MB free "
                f"({free:.0%}); vLLM will ask for {want.gpu_memory_utilization:.0%} and refuse to start with less",
                "stop what holds the NPU (`npu-smi info` lists its processes) or lower PALMYRA_GPU_MEMORY_UTILIZATION",
            )
        )
    elif free is not None:
        out.append(Finding("HBM", "ok", f"{label}: {free:.0%} of {total} MB free"))
    return out


def check_architecture(host: HostView, want: Wanted) -> Finding:
    name = "architecture"
    mine = facts.IMAGE_ARCHES.get(host.machine, host.machine)
    if want.image_arch is None:
        return Finding(name, "info", f"this machine is {mine}: build or pull the {mine} image for it")
    theirs = facts.IMAGE_ARCHES.get(want.image_arch, want.image_arch)
    if theirs != mine:
        return Finding(
            name,
            "stop",
            f"the image is {theirs}, this machine is {mine}: its first command ends in 'exec format error'",
            f"build on this machine, or with `docker build --platform linux/{mine}` (vllm-ascend's release "
            "images exist for amd64 and arm64)",
        )
    return Finding(name, "ok", f"image and machine are both {mine}")


def check_vnpu(host: HostView, want: Wanted) -> Finding:
    name = "vNPU"
    soft = [var for var in facts.SOFT_PARTITION_ENV if host.env.get(var)]
    if soft:
        if want.enforce_eager:
            return Finding(name, "ok", f"a soft-partitioned NPU ({soft[0]} is set), with eager mode")
        return Finding(
            name,
            "warn",
            f"a soft-partitioned NPU ({soft[0]} is set): vllm-ascend's default ACL graph mode (PIECEWISE) "
            "does not run on it",
            "PALMYRA_ENFORCE_EAGER=true",
        )
    template = host.env.get(facts.HARD_PARTITION_ENV)
    if template or host.vnpus:
        what = f"template {template}" if template else ", ".join("/" + n.path for n in host.vnpus)
        return Finding(name, "info", f"template (hard) vNPUs here: {what}")
    return Finding(name, "ok" if is_ascend_host(host) else "info", "whole NPUs, no partition")


def run_checks(host: HostView, want: Wanted) -> list[Finding]:
    return [
        check_driver(host, want),
        check_npu_smi(host),
        check_devices(host),
        check_user(host, want),
        *check_visible_devices(host),
        *check_npu_state(host, want),
        check_architecture(host, want),
        check_vnpu(host, want),
    ]
