"""The golden reference as the deployments carry it: Compose mounts compose/golden/ where both the
engine and the sidecar read it; k8s/components/golden, rendered with the real kustomize on top of
the CPU overlay as an operator's overlay stacks it, validates against the Kubernetes schemas and
puts the file where PALMYRA_GOLDEN_FILE points, read-only, in the same two containers. Its shipped
placeholder is one the engine's start refuses (it names no weights), never one it would pass."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path, PurePosixPath

import kubernetes_validate
import pytest
import yaml

from palmyra_serve.model.digest import recorded_weights

REPO = Path(__file__).resolve().parents[2]
COMPONENT = REPO / "k8s" / "components" / "golden"
K8S_VERSIONS = ("1.27.0", "1.37.0")  # the oldest and newest the manifests claim (k8s/README.md)
READERS = ("engine", "sidecar")


@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    if shutil.which("kubectl") is None:
        pytest.skip("kubectl is not installed (./test.sh installs it)")
    with tempfile.TemporaryDirectory(prefix="palmyra-golden-") as tmp:
        (Path(tmp) / "kustomization.yaml").write_text(
            yaml.safe_dump(
                {
                    "apiVersion": "kustomize.config.k8s.io/v1beta1",
                    "kind": "Kustomization",
                    "resources": [os.path.relpath(REPO / "k8s" / "overlays" / "cpu", tmp)],
                    "components": [os.path.relpath(COMPONENT, tmp)],
                }
            )
        )
        done = subprocess.run(["kubectl", "kustomize", tmp], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def test_the_component_validates(rendered):
    for obj in rendered:
        if "." in obj["apiVersion"].split("/")[0]:
            continue  # custom kinds: the static tier's k8s tests validate those against their CRDs
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)


def test_the_engine_and_the_sidecar_read_the_file_where_the_setting_points(rendered):
    config = next(
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("palmyra-serve-config")
    )
    golden = PurePosixPath(config["data"]["PALMYRA_GOLDEN_FILE"])
    deployment = next(o for o in rendered if o["kind"] == "Deployment")
    spec = deployment["spec"]["template"]["spec"]
    volume = next(v for v in spec["volumes"] if v["name"] == "golden")
    configmap = next(
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"] == volume["configMap"]["name"]
    )
    assert golden.name in configmap["data"]
    for c in spec["containers"]:
        mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
        if c["name"] in READERS:
            # A directory, not a subPath: a subPath mount never sees a changed file.
            assert mounts[str(golden.parent)] == {"name": "golden", "mountPath": str(golden.parent), "readOnly": True}
            assert config["metadata"]["name"] in [r["configMapRef"]["name"] for r in c["envFrom"]]
        else:
            assert "golden" not in {m["name"] for m in mounts.values()}


def test_the_shipped_placeholder_is_refused_by_the_engines_start():
    with pytest.raises(ValueError, match="names no weights digest"):
        recorded_weights(COMPONENT / "golden.json")


def test_compose_mounts_the_golden_directory_in_every_engine_and_the_sidecar():
    compose = yaml.safe_load((REPO / "docker-compose.yml").read_text())
    mounts = {
        name: {str(v).split(":")[1]: str(v) for v in service.get("volumes", [])}
        for name, service in compose["services"].items()
    }
    for name in ("engine", "engine-cpu", "sidecar"):
        assert mounts[name]["/etc/palmyra/golden"] == "./compose/golden:/etc/palmyra/golden:ro", name
