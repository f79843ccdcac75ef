"""Fixtures shared by the static tier's modules."""

from __future__ import annotations

from pathlib import Path

import jsonschema
import pytest

from tests.helpers.k8s_manifests import load_crd, strict_schema


@pytest.fixture(scope="session")
def crd_validators(data_dir: Path) -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> validator, from the CRDs vendored in tests/data/schemas/crds."""
    validators = {}
    for path in sorted((data_dir / "schemas" / "crds").glob("*.yaml")):
        crd = load_crd(path)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            schema = strict_schema(version["schema"]["openAPIV3Schema"])
            validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft7Validator(schema)
    assert validators, "no CRDs found"
    return validators
