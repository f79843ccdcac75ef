"""Request values read the way vLLM reads them.

vLLM's request models are pydantic models in lax mode: `"1000"`, `1000.0` and `1e3` are all
max_tokens=1000 there, and `"true"`, `"yes"`, `1` are all stream=True. Deciding on the JSON type
instead (as the sidecar once did for integers, and later for `stream`) let every other spelling
past the decision. Each reader here runs pydantic's own lax validator for the field's type, and a
value pydantic would refuse is refused with the sidecar's 400 before the request takes a slot.
A value that is already of the exact type skips the validator (the common case, for speed).
"""

from __future__ import annotations

from typing import Any

from pydantic import TypeAdapter, ValidationError

from palmyra_serve.sidecar.core import errors

_INT = TypeAdapter(int)
_BOOL = TypeAdapter(bool)
_FLOAT = TypeAdapter(float)


def _read(payload: dict, param: str, adapter: TypeAdapter, exact: type, what: str) -> Any:
    value = payload.get(param)
    if value is None or type(value) is exact:
        return value
    try:
        return adapter.validate_python(value)
    except ValidationError:
        raise errors.invalid_parameter(param, f"{param} must be {what}.") from None


def as_int(payload: dict, param: str) -> int | None:
    """The field as vLLM's pydantic model would read it (None when absent or null)."""
    return _read(payload, param, _INT, int, "an integer")


def as_bool(payload: dict, param: str) -> bool | None:
    """A boolean as vLLM reads it: `"true"`, `"1"`, `"yes"`, `"on"`, `1` are True (None when absent)."""
    return _read(payload, param, _BOOL, bool, "a boolean")


def as_float(payload: dict, param: str) -> float | None:
    return _read(payload, param, _FLOAT, float, "a number")


def as_dict(payload: dict, param: str) -> dict[str, Any] | None:
    value = payload.get(param)
    if value is None or isinstance(value, dict):
        return value
    raise errors.invalid_parameter(param, f"{param} must be an object.")
