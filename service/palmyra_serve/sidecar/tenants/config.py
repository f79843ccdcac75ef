"""The tenants file: named tenants, their keys as digests, their limits. Parsing and checks only.

The file (YAML, PALMYRA_TENANTS_FILE) can live in Git or a ConfigMap because it holds no key, only
each key's SHA-256 (`sha256:<64 hex>`, what `palmyra-serve tenants digest` prints). A mistake is
refused with the line it is on: unknown fields, a malformed digest, a limit that is not a positive
number, a name used twice, one key in two tenants. Keys from PALMYRA_API_KEYS / PALMYRA_API_KEYS_FILE
stay valid and belong to the tenant `default`, which the file may name (without keys) to give it
limits, a weight or a priority.

Limits are per minute (requests, tokens: prompt plus completion) over a sliding minute, and
concurrent requests per replica; a weight (the tenant's share of the admission queue under
overload) and a priority (lower is served first by an engine with priority scheduling, as vLLM's
request field). An absent limit is no limit. `prefix_cache: shared` lets a tenant's prompts share
the engine's prefix cache with the other tenants that say so (by default each tenant's cache
entries are its own: policy/fields.py's cache_salt).

The file is read with a size limit before it is parsed (MAX_FILE_BYTES), with libyaml's parser
when PyYAML has it, and composed a second time (for line numbers) only when it is refused.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from palmyra_serve.sidecar.core.share import Share

DEFAULT_TENANT = "default"
# Tenant names are Prometheus label values and log fields: short and plain.
NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,62}$"
DIGEST_PREFIX = "sha256:"
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
# Bounds that keep a typo from becoming a denial of service or an overflow.
MAX_TENANTS = 1000
MAX_PRIORITY = 1000
MAX_WEIGHT = 1000.0
# A file of MAX_TENANTS tenants with a few keys each is under 400 KB.
MAX_FILE_BYTES = 1 << 20
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class TenantsFileError(ValueError):
    """The tenants file cannot be used; the message names the file and the line."""


def key_digest(key: str) -> str:
    """The form a key takes in the tenants file."""
    return DIGEST_PREFIX + hashlib.sha256(key.encode()).hexdigest()


class TenantSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(pattern=NAME_PATTERN)
    keys: list[str] = Field(default_factory=list)
    requests_per_minute: int | None = Field(None, gt=0)
    tokens_per_minute: int | None = Field(None, gt=0)
    max_concurrent: int | None = Field(None, gt=0)
    weight: float = Field(1.0, gt=0, le=MAX_WEIGHT)
    priority: int = Field(0, ge=-MAX_PRIORITY, le=MAX_PRIORITY)
    prefix_cache: Literal["private", "shared"] = "private"

    @field_validator("keys")
    @classmethod
    def _digests(cls, keys: list[str]) -> list[str]:
        for key in keys:
            if not _DIGEST.match(key):
                raise ValueError(
                    "each key is a digest, sha256: and 64 lowercase hex digits "
                    "(palmyra-serve tenants digest prints it); never the key itself"
                )
        return keys

    @field_validator("weight", mode="before")
    @classmethod
    def _weight_number(cls, value: Any) -> Any:
        return float(value) if type(value) is int else value  # strict mode would refuse `weight: 2`


class _File(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    tenants: list[TenantSpec] = Field(max_length=MAX_TENANTS)


@dataclass(frozen=True)
class Tenants:
    """A parsed tenants file: the specs by name, which tenant each key digest belongs to, and each
    tenant's share of the admission queue (its weight over all tenants' weights, `default` counted
    with weight 1 when the file does not name it)."""

    by_name: dict[str, TenantSpec]
    by_digest: dict[bytes, str]  # raw SHA-256 digest -> tenant name
    shares: dict[str, Share] = field(default_factory=dict)

    def __post_init__(self) -> None:
        specs = dict(self.by_name)
        specs.setdefault(DEFAULT_TENANT, TenantSpec(name=DEFAULT_TENANT))
        total = sum(spec.weight for spec in specs.values())
        for name, spec in specs.items():
            self.shares[name] = Share(name, spec.weight, spec.weight / total)
            self.by_name.setdefault(name, spec)

    def spec(self, name: str) -> TenantSpec:
        return self.by_name[name]

    def share(self, name: str) -> Share:
        return self.shares[name]


NO_TENANTS = Tenants({}, {})


def parse(text: str, source: str) -> Tenants:
    """The tenants a file's text describes; TenantsFileError naming the line of the first mistake."""
    if len(text) > MAX_FILE_BYTES:
        raise TenantsFileError(f"{source}: over {MAX_FILE_BYTES} bytes")
    try:
        data = yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise TenantsFileError(f"{source}{where}: not YAML ({getattr(exc, 'problem', exc)})") from None
    if data is None:
        data = {"tenants": []}
    try:
        parsed = _File.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        line = _line_of(_compose(text), err["loc"])
        where = ".".join(str(p) for p in err["loc"]) or "the file"
        raise TenantsFileError(f"{source} line {line}: {where}: {err['msg']}") from None
    by_name: dict[str, TenantSpec] = {}
    by_digest: dict[bytes, str] = {}
    for i, spec in enumerate(parsed.tenants):
        if spec.name in by_name:
            line = _line_of(_compose(text), ("tenants", i))
            raise TenantsFileError(f"{source} line {line}: tenant {spec.name!r} is named twice")
        if spec.name != DEFAULT_TENANT and not spec.keys:
            line = _line_of(_compose(text), ("tenants", i))
            raise TenantsFileError(
                f"{source} line {line}: tenant {spec.name!r} has no keys "
                f"(only {DEFAULT_TENANT!r}, the tenant of PALMYRA_API_KEYS, may have none)"
            )
        by_name[spec.name] = spec
        for j, key in enumerate(spec.keys):
            raw = bytes.fromhex(key[len(DIGEST_PREFIX) :])
            if raw in by_digest:
                key_line = _line_of(_compose(text), ("tenants", i, "keys", j))
                raise TenantsFileError(
                    f"{source} line {key_line}: this key is also {by_digest[raw]!r}'s: a key belongs to one tenant"
                )
            by_digest[raw] = spec.name
    return Tenants(by_name, by_digest)


def _compose(text: str) -> Any:
    """The YAML's node tree, for the line of a mistake (only on the way to refusing the file)."""
    return yaml.compose(text, Loader=_LOADER)


def read(path: Path) -> Tenants:
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
        if len(raw) > MAX_FILE_BYTES:
            raise TenantsFileError(f"PALMYRA_TENANTS_FILE {path}: over {MAX_FILE_BYTES} bytes")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TenantsFileError(f"PALMYRA_TENANTS_FILE {path}: cannot read it ({exc})") from None
    return parse(text, f"PALMYRA_TENANTS_FILE {path}")


def _line_of(node: Any, loc: tuple[Any, ...]) -> int:
    """1-based line of the YAML node at a pydantic error location (the deepest one that exists)."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        if isinstance(node, yaml.MappingNode):
            match = next((v for k, v in node.value if getattr(k, "value", None) == part), None)
            key = next((k for k, _ in node.value if getattr(k, "value", None) == part), None)
            if match is None:
                break
            line = (key or match).start_mark.line + 1
            node = match
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            node = node.value[part]
            line = node.start_mark.line + 1
        else:
            break
    return line
