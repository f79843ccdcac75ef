"""The checks: pure judgements of a HostView, each a Finding with the fix for anything not ok.

Levels, and when doctor stops the engine (`palmyra-serve engine` on Ascend, PALMYRA_DOCTOR=stop):
- stop: the engine cannot start or cannot use the NPU, whatever else is right: no device node, a
  device this user may not open, the driver's libraries missing, a visible-device number past the
  devices present, an image of the other architecture or built for another chip family, a chip
  npu-smi calls Critical, no Ascend driver where Ascend was asked for.
- warn: it may start, and the field showed it going wrong: a driver older than CANN's oldest line,
  npu-smi missing or failing, less free HBM than vLLM will ask for, an NPU another process holds,
  HwHiAiUser's ids differing from the image's, a user with no passwd entry, a small /dev/shm,
  variables that disagree, a soft-partitioned vNPU without eager mode, CANN 8.5 on x86.
- ok / info: nothing to do; info says what was seen (a CPU host, the architecture)."""

# Longer than 400 lines: every check doctor runs, one small pure function each, in the order its
# report lists them.

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from palmyra_serve.doctor import facts
from palmyra_serve.doctor.host import HostView, Node
from palmyra_serve.doctor.npu_smi import parse, processes
from palmyra_serve.model.digest import WeightsMatch

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
            f"driver {host.driver_version} is older than {minimum}, the oldest line CANN {facts.CANN_VERSION} goes "
            "with: device initialisation fails (e.g. `halMemGetInfo ... drvRetCode=17`, `507899`, `207004`)",
            f"upgrade the host's driver and firmware to {minimum} or later ({facts.MIN_DRIVER_SOURCE})",
        )
    note = ""
    if line < facts.HAMI_DRIVER_LINE:
        hami = ".".join(map(str, facts.HAMI_DRIVER_LINE))
        note = f"; HAMi's Ascend device plugin needs {hami} or later"
    return Finding(
        name, "ok", f"driver {host.driver_version} (CANN {facts.CANN_VERSION} needs {minimum} or later{note})"
    )


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
        unchecked = "; the NPU's health, free HBM and the processes holding it go unchecked"
        if not host.manager_here:
            return Finding(
                name,
                "warn",
                host.npu_smi_error + unchecked,
                "npu-smi needs /dev/davinci_manager: give this container the control devices and one NPU "
                "(`--device /dev/davinci_manager --device /dev/devmm_svm --device /dev/hisi_hdc --device "
                "/dev/davinci0`), or run `npu-smi info` on the host",
            )
        return Finding(
            name, "warn", host.npu_smi_error + unchecked, "run `npu-smi info` on the host: the driver may need a reset"
        )
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
    if own_system(host) and "HWHIAIUSER_UID" in host.env:
        # In the engine image, reading its own /etc/passwd: the image against itself. What can fail
        # here is the device group (devices) and this uid's own entry (user account).
        return Finding(
            name,
            "info",
            "compared on the host only (`doctor --root /host`): here /etc/passwd is the image's own",
        )
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


def check_driver_libraries(host: HostView) -> Finding:
    name = "driver libraries"
    if not is_ascend_host(host):
        return Finding(name, "info", "not checked (not an Ascend host)")
    if host.driver_libraries:
        return Finding(name, "ok", f"/{host.driver_libraries[0]}")
    where = ", ".join("/" + d for d in facts.DRIVER_LIBRARY_DIRS)
    return Finding(
        name,
        "stop",
        f"no {facts.DRIVER_HAL} in {where}: torch_npu cannot load (`{facts.DRIVER_HAL}: cannot open shared "
        "object file`, then `Failed to load the backend extension: torch_npu`)",
        "mount the host's /usr/local/Ascend/driver/lib64 read-only, as vllm-ascend's `docker run` and the Compose "
        "file do; in Kubernetes run the pod "
        "under Ascend Docker Runtime (runtimeClassName: ascend, or the node's default runtime), which mounts "
        "driver/lib64: MindCluster's device plugin without it passes the device nodes only",
    )


def own_system(host: HostView) -> bool:
    """True when doctor looks at the system it runs in (the engine's start, or doctor run there),
    not at a host root mounted into another container: its user and /dev/shm are the engine's."""
    return host.root == "/"


ENGINE_ONLY = "judged where the engine runs (its start logs it): here the root is a mounted host's"


def check_account(host: HostView) -> Finding:
    name = "user account"
    if not own_system(host):
        return Finding(name, "info", ENGINE_ONLY)
    if host.accounts is None:
        return Finding(name, "info", "no /etc/passwd to read")
    if host.uid in host.accounts:
        return Finding(name, "ok", f"uid {host.uid} has an /etc/passwd entry")
    return Finding(
        name,
        "warn",
        f"uid {host.uid} has no entry in /etc/passwd: getpwuid() fails for it, and with it HCCL "
        "(`HcclGetRootInfo ... error code is 19`) and torch's cache paths",
        "run as the image's user (HwHiAiUser, HWHIAIUSER_UID) or build the image with "
        f"--build-arg HWHIAIUSER_UID={host.uid}; a Kubernetes runAsUser must be a uid the image knows",
    )


def chip_device_type(name: str) -> str | None:
    """npu-smi's chip name -> vllm-ascend's device type: '910B3' -> 'A2', '310P3' -> '_310P'; None
    for a name that is no SOC of vllm-ascend's table (an A3's, a 910A's)."""
    return facts.SOC_TO_DEVICE.get("ascend" + name.strip().lower())


def check_chip_family(host: HostView) -> Finding:
    name = "chip family"
    soc = host.env.get("SOC_VERSION", "")
    image = facts.SOC_TO_DEVICE.get(soc.lower())
    if image is None:
        return Finding(name, "info", "no SOC_VERSION of vllm-ascend's in the environment: not in the engine image")
    chips = parse(host.npu_smi_output) if host.npu_smi_output else []
    if not chips:
        return Finding(name, "info", f"the image is built for {image} (SOC_VERSION={soc}); no npu-smi table to compare")
    chip = chips[0].name
    found = chip_device_type(chip)
    fix = (
        "Atlas A2 (910B): the default build; Atlas A3: build with --build-arg "
        "VLLM_ASCEND_BASE=quay.io/ascend/vllm-ascend:v0.18.0-a3; 310P and 910A: not served by this image "
        f"(vllm-ascend v0.18.0 needs CANN {facts.X86_FIXED_IN_CANN} for 310P, and does not support 910A)"
    )
    if found == image:
        return Finding(name, "ok", f"chip {chip} is {found}, as the image (SOC_VERSION={soc})")
    if found is not None:
        return Finding(name, "stop", f"chip {chip} is {found}; the image is built for {image} (SOC_VERSION={soc})", fix)
    if image == "A2":
        return Finding(
            name,
            "warn",
            f"chip {chip} is none of the Atlas A2 chips (910B1-910B4) this image is built for (SOC_VERSION={soc}): "
            "an A3 or a 910A?",
            fix,
        )
    return Finding(name, "info", f"chip {chip}: not compared (the image is built for {image}, SOC_VERSION={soc})")


def check_shm(host: HostView) -> Finding:
    name = "/dev/shm"
    if not is_ascend_host(host):
        return Finding(name, "info", "not checked (not an Ascend host)")
    if not own_system(host):
        return Finding(name, "info", ENGINE_ONLY)
    if host.shm_bytes is None:
        return Finding(name, "warn", "no /dev/shm here", "give the container a /dev/shm of 1 GiB or more")
    size = host.shm_bytes / (1 << 20)
    minimum = facts.MIN_SHM_BYTES >> 20
    if host.shm_bytes < facts.MIN_SHM_BYTES:
        return Finding(
            name,
            "warn",
            f"{size:.0f} MiB; vllm-ascend's own `docker run` gives {minimum} MiB (--shm-size=1g)",
            "Docker: --shm-size=1g (Compose: shm_size); Kubernetes: an emptyDir with medium: Memory on /dev/shm",
        )
    return Finding(name, "ok", f"{size:.0f} MiB")


def check_cann_on_x86(host: HostView) -> Finding:
    name = "CANN on x86"
    if not is_ascend_host(host) or facts.IMAGE_ARCHES.get(host.machine) != "amd64":
        return Finding(name, "info", "not an x86 Ascend host")
    return Finding(
        name,
        "warn",
        f"vllm-ascend v0.18.0 lists a known issue on x86 hosts that CANN {facts.X86_FIXED_IN_CANN} resolves; "
        f"this image ships CANN {facts.CANN_VERSION} (vllm-ascend#7993)",
        "prefer an aarch64 host, or watch the first start and generations closely "
        "(docs/ascend-troubleshooting.md, 'x86 hosts')",
    )


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
    held = [p for p in processes(host.npu_smi_output) if (p.npu, p.chip) == (chip.npu, chip.chip)]
    if held:
        who = ", ".join(f"pid {p.pid} ({p.name}, {p.memory_mb} MB)" for p in held)
        out.append(
            Finding(
                "NPU in use",
                "warn",
                f"{label} is held by {who}: vLLM then fails with `Free memory on device ... is less than desired "
                "GPU memory utilization`, and npu-smi in a second container with -8005 / -8020",
                "stop that process or its container (`docker ps`; the pid is the host's), or pick a free NPU "
                "(PALMYRA_NPU_DEVICES)",
            )
        )
    else:
        out.append(Finding("NPU in use", "ok", f"{label}: no process holds it"))
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


def check_golden_digest(match: WeightsMatch | None, mode: str) -> Finding:
    """The engine's start compares the served weights with PALMYRA_GOLDEN_FILE's (engine/golden_gate.py):
    a stop here is a refused start under PALMYRA_GOLDEN_DIGEST=refuse, a warning under warn."""
    name = "golden digest"
    if match is None:
        return Finding(name, "info", "no PALMYRA_GOLDEN_FILE: the served weights are not compared with a reference")
    if match.matches:
        return Finding(name, "ok", f"{match.describe()} (hashed in {match.seconds:.1f} s)")
    return Finding(
        name,
        "stop" if mode == "refuse" else "warn",
        match.describe(),
        "serve the weights the reference names, or record one for these (palmyra-serve golden --model-dir DIR "
        "--out FILE) and point PALMYRA_GOLDEN_FILE at it; PALMYRA_GOLDEN_DIGEST=warn starts the engine anyway",
    )


def run_checks(host: HostView, want: Wanted) -> list[Finding]:
    return [
        check_driver(host, want),
        check_driver_libraries(host),
        check_npu_smi(host),
        check_devices(host),
        check_user(host, want),
        check_account(host),
        *check_visible_devices(host),
        *check_npu_state(host, want),
        check_chip_family(host),
        check_shm(host),
        check_architecture(host, want),
        check_cann_on_x86(host),
        check_vnpu(host, want),
    ]
