"""The mark of a basic setting: one that nearly every operator sets (which model, under which name,
on which device, behind which keys and ports), as opposed to the tuning knobs whose defaults serve
most deployments. The configuration reference lists the basics first."""

from __future__ import annotations

from pydantic.config import JsonDict
from pydantic.fields import FieldInfo

# A field's json_schema_extra: Field(..., json_schema_extra=BASIC).
BASIC: JsonDict = {"basic": True}


def is_basic(field: FieldInfo) -> bool:
    extra = field.json_schema_extra
    return isinstance(extra, dict) and extra.get("basic") is True
