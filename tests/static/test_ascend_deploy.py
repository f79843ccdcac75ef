"""The Ascend deployment files (k8s Ascend overlays, docker-compose.yml's Ascend services) held
against the upstream files they must agree with, stored under tests/data/ascend-deploy/ (see the
README there for sources, versions and licenses):

- HAMi v2.10.0's device-configmap: the resource names HAMi really registers per chip model;
- MindCluster v26.1.0's Ascend Device Plugin DaemonSets: the node label the plugin runs on
  (`workerselector: dls-worker-node`) and its Volcano mode; MindCluster v7.3.0's npu-exporter
  manifest: how npu-exporter is run (privileged, root, driver tree);
- vllm-ascend v0.18.0's quick start (the devices and driver mounts of its own `docker run`), its
  Kubernetes guide (the MindCluster and CCE resource names) and its CCE manifest (what it mounts);
- from tests/data/ascend-image/: MindCluster v7.3.0's ascend-for-volcano constants (the
  `ring-controller.atlas` label and its 910B value, the node-label keys and accelerator types), the
  `ascend` RuntimeClass of HAMi's ascend-device-plugin v1.4.0 and the runtime Ascend Docker
  Runtime's installer (MindCluster v26.1.0) registers in containerd (the RuntimeClass's handler
  must be it; the HAMi overlay must name that class, the other overlays none), and the ENV of
  upstream's image (which no deployment may override).

A wrong resource name, a device handed to the exporter or a mount upstream does not make fails
here. The rendered Compose file comes from podman-compose itself, the Kubernetes objects from
kubectl's kustomize (schema validation of every overlay is in test_k8s.py).
"""

from __future__ import annotations

import copy
import http.server
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from palmyra_serve.doctor.facts import NPU_SMI_PATHS
from tests.helpers import ascend_command as cmd
from tests.helpers import ascend_upstream as up
from tests.helpers.ascend_command import image_env
from tests.helpers.ascend_host import BASE_LIST
from tests.helpers.compose_files import ascend_compose_config
from tests.helpers.k8s_manifests import ASCEND, config_data, container, pod_spec, render

REPO = Path(__file__).resolve().parents[2]
DATA = REPO / "tests" / "data" / "ascend-deploy"
HAMI_CHIPS = REPO / "k8s" / "overlays" / "ascend-hami" / "chips"
BIN = Path(sys.executable).parent
# Overlays that mount the host driver explicitly (the host-driver component), next to what Ascend
# Docker Runtime mounts for their device plugin (k8s/README.md: a clash is to verify on a cluster).
HOST_DRIVER_OVERLAYS = {"ascend-mindcluster", "ascend-mindcluster-a3", "ascend-mindcluster-volcano", "ascend-hami"}
DAVINCI_N = re.compile(r"/dev/davinci\d+$")


# --- upstream data --------------------------------------------------------------------------------


def hami_vnpus() -> list[dict[str, Any]]:
    """The `vnpus.configs` list of HAMi's device-configmap template. Only that block is read; its
    Helm expressions (runtimeClassName, overwriteEnv) become placeholders, the names stay literal."""
    lines = (DATA / "hami-v2.10.0-device-configmap.yaml").read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "vnpus:")
    indent = len(lines[start]) - len(lines[start].lstrip())
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if line.strip() and len(line) - len(line.lstrip()) <= indent:
            break
        block.append(line)
    text = re.sub(r"\{\{[^}]*\}\}", "helm-expression", "\n".join(line[indent:] for line in block))
    configs = yaml.safe_load(text)["vnpus"]["configs"]
    assert len(configs) >= 5, "the vnpus block was not found whole"
    return configs


def upstream_docker_run() -> tuple[list[str], list[str]]:
    """--device and -v host paths of vllm-ascend's quick-start `docker run` (the Ubuntu tab)."""
    text = (DATA / "vllm-ascend-v0.18.0-quick_start.md").read_text(encoding="utf-8")
    run = text[text.index("docker run") :]
    run = run[: run.index("```")]
    words = shlex.split(run.replace("\\\n", " "))
    devices = [words[i + 1] for i, w in enumerate(words) if w == "--device"]
    mounts = [words[i + 1].split(":")[0] for i, w in enumerate(words) if w == "-v"]
    # $DEVICE is the one NPU (/dev/davinciN); /root/.cache is upstream's cache, ours is /cache.
    return devices, [m for m in mounts if m != "/root/.cache"]


def upstream_daemonset(name: str) -> dict[str, Any]:
    docs = yaml.safe_load_all((DATA / name).read_text(encoding="utf-8"))
    return next(d for d in docs if d and d["kind"] == "DaemonSet")


def hami_problems(limits: dict[str, Any], configs: list[dict[str, Any]]) -> list[str]:
    """What HAMi v2.10.0 would make of an engine's limits: [] when they ask for exactly one
    whole NPU of one chip model HAMi knows, by both of that model's names."""
    accel = {k: v for k, v in limits.items() if "/" in k}
    matches = [c for c in configs if c["resourceName"] in accel]
    if len(matches) != 1:
        return [f"{sorted(accel)} names {len(matches)} HAMi chip models, not one"]
    chip = matches[0]
    problems = []
    if set(accel) != {chip["resourceName"], chip["resourceMemoryName"]}:
        problems.append(f"{sorted(accel)} is not {chip['resourceName']} + {chip['resourceMemoryName']}")
    if int(accel[chip["resourceName"]]) != 1:
        problems.append("not one NPU")
    memory = int(accel.get(chip["resourceMemoryName"], chip["memoryAllocatable"]))
    # HAMi's trimMemory: the first template that fits, else the whole chip up to its capacity.
    fits = [t["memory"] for t in chip.get("templates", []) if memory <= t["memory"]]
    granted = fits[0] if fits else (chip["memoryAllocatable"] if memory <= chip["memoryCapacity"] else 0)
    if granted != chip["memoryAllocatable"]:
        problems.append(f"{memory} MiB is granted as {granted} MiB, not the whole {chip['commonWord']}")
    return problems


# --- Kubernetes: HAMi -------------------------------------------------------------------------------


def test_hami_overlay_asks_for_a_chip_model_hami_registers():
    configs = hami_vnpus()
    limits = container(pod_spec(render("ascend-hami")), "engine")["resources"]["limits"]
    assert hami_problems(limits, configs) == []


def test_hami_check_fails_on_a_name_hami_does_not_register():
    """The names this overlay used before (and HAMi's docs of older releases show)."""
    configs = hami_vnpus()
    assert hami_problems({"huawei.com/Ascend910B": 1, "huawei.com/Ascend910B-memory": 32768}, configs)
    # A right name with a vNPU-sized memory ask is a slice, not the whole chip.
    assert hami_problems({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B3-memory": 32768}, configs)
    assert hami_problems({"huawei.com/Ascend910B3": 1, "huawei.com/Ascend910B4-memory": 32768}, configs)


def test_every_hami_chip_choice_matches_hami_and_covers_its_910b_family():
    configs = {c["commonWord"]: c for c in hami_vnpus()}
    offered = {}
    for path in sorted(HAMI_CHIPS.glob("*.yaml")):
        patch = yaml.safe_load(path.read_text(encoding="utf-8"))
        engine = next(c for c in patch["spec"]["template"]["spec"]["containers"] if c["name"] == "engine")
        limits = engine["resources"]["limits"]
        assert hami_problems(limits, list(configs.values())) == [], path.name
        assert f"huawei.com/{path.stem}" in limits, f"{path.name} is named after its chip model"
        offered[path.stem] = limits
    # Every 910B chip model HAMi knows can be picked (910A, 910C and 310P are not this image's).
    assert set(offered) == {word for word in configs if word.startswith("Ascend910B")}


# Where the docs tell operators which RuntimeClass the HAMi overlay needs.
RUNTIME_CLASS_DOCS = ("k8s/README.md", "docs/ascend-troubleshooting.md")


def needs_ascend_runtime(spec: dict[str, Any], configs: list[dict[str, Any]]) -> bool:
    """Whether the engine asks for a HAMi resource: HAMi's ascend-device-plugin only sets
    ASCEND_VISIBLE_DEVICES, and Ascend Docker Runtime makes the device nodes and driver mounts from
    it (the plugin's docs: deploy the RuntimeClass, name it in the pod). MindCluster's plugin and
    CCE's make the devices themselves or run where Ascend Docker Runtime is the node's default
    runtime (its installer sets default_runtime_name / default-runtime), and name no class."""
    limits = container(spec, "engine")["resources"]["limits"]
    return any(c["resourceName"] in limits for c in configs)


def runtime_class_problems(spec: dict[str, Any], root: Path = up.IMAGE_DATA) -> list[str]:
    """An overlay's runtimeClassName against upstream's files: the RuntimeClass ascend-device-plugin
    ships must have as handler the runtime Ascend Docker Runtime's installer registers; a pod that
    needs that runtime must name that class (HAMi's device-configmap only passes on the chart value
    devices.ascend.runtimeClassName, which an operator may leave empty); others name none."""
    runtime_class = up.ascend_runtime_class(root)
    name, handler = runtime_class["metadata"]["name"], runtime_class["handler"]
    registered = up.ascend_docker_runtime_name(root)
    problems = []
    if handler != registered:
        problems.append(
            f"the RuntimeClass {name} has handler {handler}; Ascend Docker Runtime registers the runtime {registered}"
        )
    named = spec.get("runtimeClassName")
    if needs_ascend_runtime(spec, hami_vnpus()):
        if named is None:
            problems.append(f"asks for a HAMi resource but names no runtimeClassName (needs {name})")
        elif named != name:
            problems.append(f"runtimeClassName {named}: the RuntimeClass for Ascend Docker Runtime is {name}")
    elif named is not None:
        problems.append(f"runtimeClassName {named} where the device plugin needs none")
    return problems


def runtime_class_doc_problems(root: Path = up.IMAGE_DATA) -> list[str]:
    name = up.ascend_runtime_class(root)["metadata"]["name"]
    problems = []
    for doc in RUNTIME_CLASS_DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        said = set(re.findall(r"runtimeClassName: (\w[\w.-]*)", text)) | set(
            re.findall(r'RuntimeClass "([^"]+)"', text)
        )
        if said != {name}:
            problems.append(f"{doc} names the RuntimeClass {sorted(said)}; upstream's is {name}")
    return problems


@pytest.mark.parametrize("overlay", ASCEND)
def test_hami_overlay_uses_ascend_docker_runtime(overlay):
    spec = pod_spec(render(overlay))
    assert runtime_class_problems(spec) == []
    if overlay == "ascend-hami":
        # HAMi's plugin only sets ASCEND_VISIBLE_DEVICES; Ascend Docker Runtime makes the devices.
        assert needs_ascend_runtime(spec, hami_vnpus()) and spec["runtimeClassName"]
        # HAMi fills in its configured runtimeClassName only where a pod names none (device.go),
        # and its device-configmap takes it from the chart's values (empty by default), per chip
        # model: a setting the operator may not have made, so the pod names the class itself.
        assert {c.get("runtimeClassName") for c in hami_vnpus()} == {"helm-expression"}
    assert runtime_class_doc_problems() == []


RUNTIME_CLASS_FILE = "hami-ascend-device-plugin-v1.4.0-ascend-runtimeclass.yaml"
RUNTIME_CONSTANTS = "mindcluster-v26.1.0-ascend-docker-runtime-constant.go.txt"
CONTAINERD = "mindcluster-v26.1.0-ascend-docker-runtime-containerd_process.go.txt"
VOLCANO_CONSTANTS = "mindcluster-v7.3.0-ascend-for-volcano-constants.go.txt"
VOLCANO_TYPES = "mindcluster-v7.3.0-ascend-for-volcano-type.go.txt"


def altered(tmp_path: Path, name: str, old: str, new: str) -> Path:
    """A copy of tests/data/ascend-image with `old` replaced by `new` in one file."""
    root = tmp_path / "ascend-image"
    shutil.copytree(up.IMAGE_DATA, root)
    text = (root / name).read_text(encoding="utf-8")
    assert old in text, f"{name}: {old!r} not found: the mutation no longer applies"
    (root / name).write_text(text.replace(old, new), encoding="utf-8")
    return root


@pytest.mark.parametrize(
    "fault",
    [
        "handler-renamed",
        "runtime-renamed",
        "containerd-gets-no-ascend-runtime",
        "class-renamed",
        "hami-names-none",
        "hami-names-another",
        "mindcluster-names-one",
    ],
)
def test_runtime_class_check_can_fail(tmp_path, fault):
    spec = pod_spec(render("ascend-hami"))
    root = up.IMAGE_DATA
    if fault == "handler-renamed":
        root = altered(tmp_path, RUNTIME_CLASS_FILE, "handler: ascend", "handler: ascend-docker-runtime")
    elif fault == "runtime-renamed":
        root = altered(tmp_path, RUNTIME_CONSTANTS, 'runtimeName       = "ascend"', 'runtimeName       = "ascend-rt"')
    elif fault == "containerd-gets-no-ascend-runtime":
        root = altered(tmp_path, CONTAINERD, "addRuntime(runtimeName,", "addRuntime(defaultRuntimeValue,")
    elif fault == "class-renamed":
        root = altered(tmp_path, RUNTIME_CLASS_FILE, "name: ascend", "name: ascend-npu")
        assert runtime_class_doc_problems(root), "the docs' class is checked against upstream's"
    elif fault == "hami-names-none":
        del spec["runtimeClassName"]
    elif fault == "hami-names-another":
        spec["runtimeClassName"] = "ascend-docker-runtime"
    else:
        spec = pod_spec(render("ascend-mindcluster"))
        spec["runtimeClassName"] = "ascend"
    assert runtime_class_problems(spec, root)


# --- Kubernetes: MindCluster and CCE -------------------------------------------------------------


def _without(spec: dict[str, Any], *keys: str) -> dict[str, Any]:
    spec = copy.deepcopy(spec)
    for key in keys:
        spec.pop(key, None)
    return spec


PLUGIN = "mindcluster-v26.1.0-ascendplugin.yaml"
PLUGIN_VOLCANO = "mindcluster-v26.1.0-ascendplugin-volcano.yaml"


def plugin_selector(name: str = PLUGIN) -> dict[str, str]:
    return dict(upstream_daemonset(name)["spec"]["template"]["spec"]["nodeSelector"])


def test_mindcluster_resource_and_node_label_are_the_device_plugins():
    spec = pod_spec(render("ascend-mindcluster"))
    # The plugin's DaemonSet (MindCluster v26.1.0, both modes) runs only on nodes with this label,
    # so only they have the resource: the engine selects the same nodes, by the same label.
    assert plugin_selector() == plugin_selector(PLUGIN_VOLCANO) == {"workerselector": "dls-worker-node"}
    assert spec["nodeSelector"] == plugin_selector()
    guide = (DATA / "vllm-ascend-v0.18.0-using_volcano_kthena.md").read_text(encoding="utf-8")
    mindcluster_line = next(line for line in guide.splitlines() if "If using [MindCluster]" in line)
    limits = container(spec, "engine")["resources"]["limits"]
    assert [name for name in limits if "/" in name] == ["huawei.com/Ascend910"]
    assert "`huawei.com/Ascend910`" in mindcluster_line
    assert "runtimeClassName" not in spec and "schedulerName" not in spec
    # The same names in ascend-for-volcano's constants (the label key, the 910 resource).
    assert mindcluster_problems(render("ascend-mindcluster"), volcano=False) == []


def test_mindcluster_volcano_overlay_adds_only_what_volcano_mode_needs():
    plugin_args = " ".join(upstream_daemonset(PLUGIN_VOLCANO)["spec"]["template"]["spec"]["containers"][0]["args"])
    assert "-volcanoType=true" in plugin_args
    plain = render("ascend-mindcluster")
    volcano = render("ascend-mindcluster-volcano")
    spec = pod_spec(volcano)
    assert spec["schedulerName"] == "volcano"
    # ring-controller.atlas: ascend-910b, read from ascend-for-volcano's constants (910B / Atlas A2).
    assert mindcluster_problems(volcano, volcano=True) == []
    assert volcano_doc_problems() == []
    assert _without(spec, "schedulerName") == pod_spec(plain)


def _pod_labels(objects: list[dict[str, Any]]) -> dict[str, str]:
    return next(o for o in objects if o["kind"] == "Deployment")["spec"]["template"]["metadata"]["labels"]


def mindcluster_problems(
    objects: list[dict[str, Any]], volcano: bool, root: Path = up.IMAGE_DATA, selector: dict[str, str] | None = None
) -> list[str]:
    """A MindCluster overlay against ascend-for-volcano's constants (MindCluster v7.3.0) and the
    device plugin's DaemonSet (v26.1.0): the resource is its 910 card name; the nodeSelector is the
    plugin DaemonSet's own (the nodes that have the resource), with no key but ascend-for-volcano's
    accelerator labels beside it; in Volcano mode the pod carries the job-kind label
    (ring-controller.atlas) with the 910B value, which the plugin's GetPluginNameByReq maps to the
    910 card handler."""
    consts = up.volcano_constants(root)
    spec = pod_spec(objects)
    problems = []
    resources = [n for n in container(spec, "engine")["resources"]["limits"] if "/" in n]
    if resources != [consts["NPU910CardName"]]:
        problems.append(f"asks for {resources}; ascend-for-volcano's 910 card is {consts['NPU910CardName']}")
    wanted = plugin_selector() if selector is None else selector
    chosen = spec.get("nodeSelector", {})
    if any(chosen.get(k) != v for k, v in wanted.items()):
        problems.append(f"nodeSelector {chosen} is not the device plugin DaemonSet's {wanted}")
    if set(chosen) - set(wanted) - {consts["Accelerator"], consts["AcceleratorType"]}:
        problems.append(f"nodeSelector {chosen} uses a key neither the plugin nor ascend-for-volcano does")
    kind = _pod_labels(objects).get(consts["JobKindKey"])
    if volcano and kind != consts["JobKind910BValue"]:
        problems.append(f"pod label {consts['JobKindKey']}={kind}; the 910B job kind is {consts['JobKind910BValue']}")
    if not volcano and kind is not None:
        problems.append(f"{consts['JobKindKey']} outside Volcano mode")
    return problems


def volcano_doc_problems(root: Path = up.IMAGE_DATA) -> list[str]:
    """k8s/README.md's words for the Volcano overlay: the label and the optional accelerator-type
    values are ascend-for-volcano's."""
    consts = up.volcano_constants(root)
    text = (REPO / "k8s" / "README.md").read_text(encoding="utf-8")
    problems = []
    labels = set(re.findall(r"`([\w.-]+): ([\w.-]+)`", text))
    kinds = {v for k, v in labels if k.startswith("ring-controller")}
    if not kinds or {k for k, _ in labels if k.startswith("ring-controller")} != {consts["JobKindKey"]}:
        problems.append(f"the README's job-kind label is not {consts['JobKindKey']}")
    if kinds != {consts["JobKind910BValue"]}:
        problems.append(
            f"the README gives the job kind {sorted(kinds)}; ascend-for-volcano's 910B is {consts['JobKind910BValue']}"
        )
    modules = {v for k, v in consts.items() if k.startswith("Module") and k.endswith("AcceleratorType")}
    if f"`{consts['AcceleratorType']}`" not in text:
        problems.append(f"the README does not name the {consts['AcceleratorType']} nodeSelector")
    for named in set(re.findall(r"`(module-[\w-]+)`", text)) - modules:
        problems.append(f"the README's accelerator-type {named} is not one of {sorted(modules)}")
    return problems


@pytest.mark.parametrize("fault", ["910b-value", "job-kind-key", "plugin-selector", "overlay-label"])
def test_mindcluster_checks_can_fail(tmp_path, fault):
    objects = render("ascend-mindcluster-volcano")
    root = up.IMAGE_DATA
    selector = None
    if fault == "910b-value":
        root = altered(
            tmp_path, VOLCANO_CONSTANTS, 'JobKind910BValue = "ascend-910b"', 'JobKind910BValue = "ascend-910B"'
        )
        assert volcano_doc_problems(root), "the README's value is checked too"
    elif fault == "job-kind-key":
        root = altered(tmp_path, VOLCANO_TYPES, 'JobKindKey = "ring-controller.atlas"', 'JobKindKey = "job-kind.atlas"')
        assert volcano_doc_problems(root), "the README's key is checked too"
    elif fault == "plugin-selector":
        selector = {"workerselector": "dls-master-node"}
    else:
        _pod_labels(objects)["ring-controller.atlas"] = "ascend-910"
    assert mindcluster_problems(objects, volcano=True, root=root, selector=selector)


def test_a3_overlay_is_the_mindcluster_overlay_with_the_a3_image():
    a2, a3 = pod_spec(render("ascend-mindcluster")), pod_spec(render("ascend-mindcluster-a3"))
    for name in ("engine", "fetch-model"):
        assert container(a2, name)["image"] == "palmyra-serve-engine:ascend"
        assert container(a3, name)["image"] == "palmyra-serve-engine:ascend-a3"
        container(a3, name)["image"] = container(a2, name)["image"]
    assert a3 == a2


def test_cce_overlay_mounts_no_more_of_the_host_than_vllm_ascends_cce_manifest():
    upstream = (DATA / "vllm-ascend-v0.18.0-lws-a2.yaml.jinja2").read_text(encoding="utf-8")
    assert "huawei.com/ascend-1980:" in upstream
    upstream_paths = set(re.findall(r"hostPath:\s*\n\s*path:\s*(\S+)", upstream))
    assert upstream_paths == {"/usr/local/Ascend/driver/tools"}
    spec = pod_spec(render("ascend-cce"))
    host_paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert host_paths <= upstream_paths
    assert [n for n in container(spec, "engine")["resources"]["limits"] if "/" in n] == ["huawei.com/ascend-1980"]


# --- Kubernetes: every Ascend overlay -------------------------------------------------------------


def _quantity_gib(text: str) -> float:
    quantity = re.fullmatch(r"(\d+)(Mi|Gi)", text)
    assert quantity, f"not a Mi/Gi quantity: {text}"
    number, unit = quantity.groups()
    return int(number) / (1024 if unit == "Mi" else 1)


@pytest.mark.parametrize("overlay", ASCEND)
def test_ascend_pod_user_groups_and_writable_places(overlay):
    spec = pod_spec(render(overlay))
    pod = spec["securityContext"]
    # One HwHiAiUser gid everywhere: the device nodes' group (supplementalGroups), the volumes'
    # group (fsGroup, so /cache and /tmp are writable) and the process's group.
    assert pod["supplementalGroups"] == [pod["runAsGroup"]] == [pod["fsGroup"]]
    engine = container(spec, "engine")
    assert engine["securityContext"]["readOnlyRootFilesystem"] is True
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in engine["volumeMounts"]}
    for path in ("/cache", "/tmp"):
        assert not mounts[path].get("readOnly", False), path
        assert "emptyDir" in volumes[mounts[path]["name"]] or "persistentVolumeClaim" in volumes[mounts[path]["name"]]
    shm = volumes[mounts["/dev/shm"]["name"]]["emptyDir"]
    assert shm["medium"] == "Memory" and _quantity_gib(shm["sizeLimit"]) >= 1
    env = {e["name"] for e in engine.get("env", [])}
    # The device plugin decides which NPUs the container sees (numbered from 0): never set here.
    assert not env & {"ASCEND_RT_VISIBLE_DEVICES", "ASCEND_VISIBLE_DEVICES", "PALMYRA_NPU_DEVICES"}
    assert "privileged" not in engine["securityContext"]


@pytest.mark.parametrize("overlay", ASCEND)
def test_ascend_host_driver_mounts_are_vllm_ascends(overlay):
    spec = pod_spec(render(overlay))
    host = {v["hostPath"]["path"].rstrip("/"): v["hostPath"].get("type") for v in spec["volumes"] if "hostPath" in v}
    if overlay not in HOST_DRIVER_OVERLAYS:
        assert host == {}
        return
    _devices, upstream = upstream_docker_run()
    # vllm-ascend's `docker run` mounts, less what Ascend Docker Runtime (which both device plugins
    # work through here) mounts itself: its base.list, read as upstream ships it. A second mount of
    # a runtime path could clash with the runtime's; a fixed npu-smi path fails nodes without it.
    runtime = set(BASE_LIST.read_text().split())
    assert set(host) == {p.rstrip("/") for p in upstream} - runtime
    assert not {p for p in host if p.endswith("/npu-smi")}
    # Typed, so a node without the driver fails with a FailedMount event, not an empty directory.
    assert set(host.values()) <= {"Directory", "File"}


def test_every_ascend_overlay_is_checked_by_test_k8s():
    overlays = {p.name for p in (REPO / "k8s" / "overlays").iterdir() if p.name.startswith("ascend-")}
    assert overlays == set(ASCEND)


# --- Compose ----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rendered() -> dict[str, Any]:
    # A host index and gid other than the defaults, to see them travel.
    return ascend_compose_config(PALMYRA_NPU_DEVICES="3", HWHIAIUSER_GID="1234")


def test_compose_engine_devices_and_mounts_are_vllm_ascends(rendered):
    engine = rendered["engine"]
    devices, mounts = upstream_docker_run()
    assert engine["devices"] == ["/dev/davinci3" if d == "$DEVICE" else d for d in devices]
    volumes = {v.split(":")[0].rstrip("/"): v for v in engine["volumes"]}
    # Every mount of vllm-ascend's `docker run`, read-only, but npu-smi's: its host path varies
    # (doctor's facts: three places) and a bind mount of a missing path creates an empty directory.
    smi = {"/" + p for p in NPU_SMI_PATHS}
    for path in mounts:
        if path in smi:
            assert not any(target.split(":")[1] == path for target in engine["volumes"]), path
        else:
            assert volumes[path.rstrip("/")].endswith(":ro"), path
    # The NPUs a non-privileged container was given are numbered from 0 inside it.
    npus = [d for d in engine["devices"] if DAVINCI_N.match(d)]
    assert engine["environment"]["ASCEND_RT_VISIBLE_DEVICES"] == ",".join(str(i) for i in range(len(npus)))
    assert engine["environment"]["PALMYRA_NPU_DEVICES"] == engine["environment"]["ASCEND_RT_VISIBLE_DEVICES"]


def test_compose_engine_user_group_and_read_only_root(rendered):
    engine = rendered["engine"]
    assert [str(g) for g in engine["group_add"]] == ["1234"]
    assert engine["read_only"] is True
    tmp = [t.split(":", 1) for t in engine["tmpfs"] if t.split(":")[0] == "/tmp"]
    # Docker's tmpfs default is noexec, which would break loading what compilers build there.
    assert len(tmp) == 1 and "exec" in tmp[0][1].split(",")
    assert "cache:/cache" in engine["volumes"]
    size = re.fullmatch(r"(\d+)([mg])", str(engine["shm_size"]).lower())
    assert size and int(size.group(1)) / (1024 if size.group(2) == "m" else 1) >= 1
    assert "privileged" not in engine and "user" not in engine  # the image's HwHiAiUser


# --- HOME and CANN's log path: the image decides, deployments do not contradict it ----------------

# Where the engine-ascend image puts HOME and CANN's logs (its ENV); Compose and every Ascend
# overlay leave them to it, and the docs describe the image's values.
IMAGE_OWNED = ("HOME", "ASCEND_PROCESS_LOG_PATH")
PATH_DOCS = ("docs/ascend-troubleshooting.md", "compose/README.md", "k8s/README.md", "README.md")


def env_disagreements(env: dict[str, Any], image: dict[str, str]) -> list[str]:
    """Variables the engine-ascend image sets that a deployment sets to another value."""
    return [f"{k}={env[k]} (the image: {v})" for k, v in image.items() if k in env and str(env[k]) != v]


def ascend_engine_envs(rendered: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The literal environment of every container that runs the engine-ascend image."""
    envs = {
        "compose engine": rendered["engine"]["environment"],
        "compose model-init": rendered["model-init"]["environment"],
    }
    for overlay in ASCEND:
        spec = pod_spec(render(overlay))
        for c in [*spec.get("initContainers", []), *spec["containers"]]:
            if c["image"].split(":")[0].endswith("palmyra-serve-engine"):
                envs[f"{overlay} {c['name']}"] = {e["name"]: e["value"] for e in c.get("env", []) if "value" in e}
    return envs


def test_deployments_leave_home_and_cann_logs_to_the_image(rendered):
    image = image_env()
    assert all(image[k].startswith("/cache/") for k in IMAGE_OWNED), "on the cache volume, not the read-only root"
    envs = ascend_engine_envs(rendered)
    assert len(envs) >= 2 + 2 * len(ASCEND), sorted(envs)
    problems = {where: bad for where, env in envs.items() if (bad := env_disagreements(env, image))}
    assert not problems, problems
    # The check sees the override this file used to carry.
    assert env_disagreements({"HOME": "/tmp", "ASCEND_PROCESS_LOG_PATH": "/tmp/ascend/log"}, image)


def upstream_env_keys(root: Path = up.IMAGE_DATA) -> set[str]:
    """What upstream's image sets with ENV: vllm-ascend's Dockerfiles and their CANN bases."""
    keys: set[str] = set()
    for dockerfile in up.VARIANTS:
        v = up.variant(dockerfile, root)
        keys |= set(v.env) | set(up.final_stage(up.cann_dockerfile(v.cann_tag, root)).env())
    return keys


def upstream_env_problems(envs: dict[str, dict[str, Any]], root: Path = up.IMAGE_DATA) -> dict[str, list[str]]:
    """Per deployment container, the variables it sets that upstream's image sets with ENV."""
    owned = upstream_env_keys(root)
    return {where: sorted(set(env) & owned) for where, env in envs.items() if set(env) & owned}


def test_deployments_leave_upstreams_env_to_the_image(rendered):
    owned = upstream_env_keys()
    assert {"SOC_VERSION", "TASK_QUEUE_ENABLE", "OMP_NUM_THREADS", "ASCEND_TOOLKIT_HOME"} <= owned, owned
    envs = ascend_engine_envs(rendered)
    assert upstream_env_problems(envs) == {}
    # The check sees a deployment that sets one.
    envs["compose engine"] = {**envs["compose engine"], "OMP_NUM_THREADS": "4"}
    assert upstream_env_problems(envs) == {"compose engine": ["OMP_NUM_THREADS"]}


def test_docs_give_the_images_home_and_cann_log_path():
    image = image_env()
    troubleshooting = (REPO / PATH_DOCS[0]).read_text(encoding="utf-8")
    for name in IMAGE_OWNED:
        assert f"{name}={image[name]}" in troubleshooting, name
    for doc in PATH_DOCS:
        text = (REPO / doc).read_text(encoding="utf-8")
        values = set(re.findall(r"ASCEND_PROCESS_LOG_PATH=([^\s`),;]+)", text))
        assert values <= {image["ASCEND_PROCESS_LOG_PATH"]}, f"{doc}: {values}"
        if doc != "k8s/README.md":  # there the base's HOME=/tmp (CPU image) is described too
            assert set(re.findall(r"\bHOME=([^\s`),;]+)", text)) <= {image["HOME"]}, doc


def test_compose_a3_image_is_one_setting_away():
    assert (
        ascend_compose_config(PALMYRA_ENGINE_ASCEND_IMAGE="palmyra-serve-engine:ascend-a3")["engine"]["image"]
        == "palmyra-serve-engine:ascend-a3"
    )


def exporter_problems(service: dict[str, Any]) -> list[str]:
    """How a Compose npu-exporter differs from its upstream DaemonSet (MindCluster v7.3.0), and
    whether it could take an NPU from the engine."""
    upstream = upstream_daemonset("mindcluster-v7.3.0-npu-exporter.yaml")["spec"]["template"]["spec"]["containers"][0]
    problems = []
    if any(DAVINCI_N.match(str(d).split(":")[0]) for d in service.get("devices", [])):
        problems.append("holds a /dev/davinciN")
    if service.get("devices"):
        problems.append("is given devices (upstream: none, privileged)")
    sc = upstream["securityContext"]
    if service.get("privileged") is not sc["privileged"]:
        problems.append("not privileged like upstream")
    if str(service.get("user", "")).split(":") != [str(sc["runAsUser"]), str(sc["runAsGroup"])]:
        problems.append("not root like upstream")
    if service.get("read_only") is not sc["readOnlyRootFilesystem"]:
        problems.append("root filesystem not read-only like upstream")
    targets = {v.split(":")[1]: v for v in service.get("volumes", [])}
    for mount in upstream["volumeMounts"]:
        if mount["name"] in ("ascend-driver", "ascend-dcmi") and not targets.get(mount["mountPath"], "").endswith(
            ":ro"
        ):
            problems.append(f"{mount['mountPath']} not mounted read-only")
    ours = " ".join(service.get("command", []))
    upstream_flags = {f.split("=")[0] for f in " ".join(upstream["args"]).split() if f.startswith("-")}
    for flag in re.findall(r"\s(-[\w-]+)=", ours):
        if flag not in upstream_flags:
            problems.append(f"flag {flag} not in upstream's command")
    if "npu-exporter" not in ours or service.get("entrypoint", [None])[0] != "/bin/bash":
        problems.append("the image's ENTRYPOINT would ignore the command")
    if "healthcheck" not in service:
        problems.append("no healthcheck")
    return problems


def test_compose_npu_exporter_runs_as_upstream_without_the_engines_device(rendered):
    exporter = rendered["npu-exporter"]
    assert exporter_problems(exporter) == []
    assert "-port=8082" in exporter["command"][0]  # where Prometheus scrapes it


@pytest.mark.parametrize("fault", ["engine-device", "not-privileged", "flag-typo", "no-healthcheck"])
def test_exporter_check_can_fail(rendered, fault):
    exporter = copy.deepcopy(rendered["npu-exporter"])
    if fault == "engine-device":
        exporter["devices"] = ["/dev/davinci3"]
    elif fault == "not-privileged":
        exporter["privileged"] = False
    elif fault == "flag-typo":
        exporter["command"] = [exporter["command"][0].replace("-updateTime=", "-update-time=")]
    else:
        del exporter["healthcheck"]
    assert exporter_problems(exporter)


class _Status(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status)
        self.end_headers()
        self.wfile.write(b"NPU-Exporter")

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def exporter_stand_in() -> Iterator[tuple[int, type[_Status]]]:
    """A plain HTTP server on 127.0.0.1 in the exporter's place, whose status a test sets."""
    handler = type("Handler", (_Status,), {})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1], handler
    server.shutdown()
    server.server_close()


def _run_exporter_healthcheck(test: list[str], port: int) -> int:
    assert test[0] == "CMD"
    argv = [arg.replace("/127.0.0.1/8082", f"/127.0.0.1/{port}") for arg in test[1:]]
    assert argv != test[1:], "the healthcheck no longer targets 127.0.0.1:8082"
    return subprocess.run(argv, capture_output=True, timeout=30, check=False).returncode


def test_compose_npu_exporter_healthcheck_tells_up_from_down(rendered, exporter_stand_in):
    """The exporter's healthcheck command itself (bash only, as in its image) against a real
    server: healthy on 200, unhealthy on an error status or nothing listening."""
    test = rendered["npu-exporter"]["healthcheck"]["test"]
    port, handler = exporter_stand_in
    assert _run_exporter_healthcheck(test, port) == 0
    handler.status = 500
    assert _run_exporter_healthcheck(test, port) != 0
    with socket.socket() as sock:  # a port nobody listens on once closed
        sock.bind(("127.0.0.1", 0))
        closed = sock.getsockname()[1]
    assert _run_exporter_healthcheck(test, closed) != 0


NPU_METRIC = re.compile(r"\b(?:npu_chip_info|machine_npu)_[a-z_]*[a-z]\b")


def test_every_npu_metric_queried_is_one_the_pinned_npu_exporter_exports():
    sample = (DATA / "mindcluster-v7.3.0-npu-exporter-prometheus_metrics.txt").read_text(encoding="utf-8")
    exported = {line.split("{")[0].split()[0] for line in sample.splitlines() if line and not line.startswith("#")}
    queried = set()
    for path in [*(REPO / "monitoring").rglob("*.json"), *(REPO / "monitoring" / "prometheus").rglob("*.yml")]:
        queried |= set(NPU_METRIC.findall(path.read_text(encoding="utf-8")))
    assert "npu_chip_info_hbm_used_memory" in queried  # the dashboards do query the exporter
    assert queried - exported == set()


def test_no_service_but_the_engine_gets_an_npu(rendered):
    for name, service in rendered.items():
        if name != "engine":
            assert not [d for d in service.get("devices", []) if "davinci" in str(d)], name


# --- vLLM 0.18.0's own environment validation ----------------------------------------------------

VALIDATE = r"""
import json, os, sys
for key in [k for k in os.environ if k.startswith("VLLM_")]:
    del os.environ[key]
import vllm.envs as envs
results = {}
for where, env in json.loads(sys.argv[1]).items():
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        envs.validate_environ(True)
        results[where] = "ok"
    except ValueError as exc:
        results[where] = str(exc)
    os.environ.clear()
    os.environ.update(saved)
print("VALIDATED " + json.dumps(results))
"""


def engine_environments() -> dict[str, dict[str, str]]:
    """The environment vLLM starts in, per deployment: the image's ENV, what the deployment sets,
    then what the launcher adds (tests/helpers/ascend_command.py prints it)."""

    image = image_env()
    launcher, _argv = cmd.host_command("ascend")
    out = {"Dockerfile (engine-ascend)": {**image, **launcher}}
    compose = {k: str(v) for k, v in ascend_compose_config()["engine"]["environment"].items()}
    out["docker-compose.yml (engine)"] = {**image, **compose, **launcher}
    for overlay in ASCEND:
        objects = render(overlay)
        engine = container(pod_spec(objects), "engine")
        values = {e["name"]: e["value"] for e in engine.get("env", []) if "value" in e}
        secrets = {e["name"]: "from-a-secret" for e in engine.get("env", []) if "valueFrom" in e}
        out[f"k8s/overlays/{overlay}"] = {**image, **config_data(objects), **values, **secrets, **launcher}
    return out


def test_every_engine_environment_passes_vllm_018s_hard_environment_validation():
    envs = engine_environments()
    assert any(k.startswith("VLLM_") for env in envs.values() for k in env), "no VLLM_ variable at all"
    # The control: the model card's VLLM_USE_V1=0 is unknown to vLLM 0.18, and the check says so.
    envs["control: VLLM_USE_V1=0"] = {**envs["Dockerfile (engine-ascend)"], "VLLM_USE_V1": "0"}
    run = subprocess.run(
        [sys.executable, "-c", VALIDATE, json.dumps(envs)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(up.sdist_root("vllm", up.vllm_version()))},
        timeout=300,
        check=False,
    )
    lines = [x for x in run.stdout.splitlines() if x.startswith("VALIDATED ")]
    assert run.returncode == 0 and lines, run.stderr[-3000:]
    results = json.loads(lines[0].removeprefix("VALIDATED "))
    control = results.pop("control: VLLM_USE_V1=0")
    assert control == "Unknown vLLM environment variable detected: VLLM_USE_V1"
    assert results == dict.fromkeys(results, "ok"), results
