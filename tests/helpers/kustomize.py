"""A throw-away kustomization that stacks components on an overlay, as an operator's own overlay
does: kustomize takes only relative paths, so it is written where it is rendered."""

from __future__ import annotations

import os
from pathlib import Path

import yaml


def write_stack(directory: Path, overlay: Path, components: list[Path]) -> Path:
    """Write `directory`/kustomization.yaml: `overlay` as its resource, `components` on top."""
    doc = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(overlay, directory)],
        "components": [os.path.relpath(c, directory) for c in components],
    }
    (directory / "kustomization.yaml").write_text(yaml.safe_dump(doc), encoding="utf-8")
    return directory
