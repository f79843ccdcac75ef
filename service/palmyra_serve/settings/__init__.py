"""The one settings class: every knob, read from PALMYRA_* environment variables.

CLI flags override the environment (cli.py passes them as keyword arguments). Nothing here is
built at import time: callers construct Settings() when they start.

An empty variable counts as unset (the default applies): docker-compose.yml hands every setting
to the containers as `PALMYRA_<NAME>: ${PALMYRA_<NAME>:-}`, so one the env file leaves out arrives empty.

The fields are declared in groups, one class per concern (model, engine, front end, admission,
tenants, health, observability), and Settings is all of them at once: `settings.max_queue` and
`PALMYRA_MAX_QUEUE` name a field whatever its group. Every field belongs to exactly one group
(tests/unit/test_settings_groups.py); the few that nearly every operator sets carry the BASIC mark
(settings/basics.py), which the configuration reference lists first. A new knob goes into the
group of its concern, with a description; then regenerate the docs (scripts/gen_docs.py).
"""

from __future__ import annotations

from pydantic_settings import SettingsConfigDict

from palmyra_serve.settings.admission import AdmissionSettings
from palmyra_serve.settings.basics import BASIC, is_basic
from palmyra_serve.settings.engine import EngineSettings
from palmyra_serve.settings.front_end import FrontEndSettings
from palmyra_serve.settings.health import HealthSettings
from palmyra_serve.settings.keys import (
    KEY_RECIPE,
    MIN_KEY_CHARS,
    PLACEHOLDER_KEYS,
    engine_key_refusal,
    placeholder_key,
    split_keys,
)
from palmyra_serve.settings.model import ModelSettings
from palmyra_serve.settings.observability import ObservabilitySettings
from palmyra_serve.settings.tenants import TenantsSettings

__all__ = [
    "BASIC",
    "GROUPS",
    "KEY_RECIPE",
    "MIN_KEY_CHARS",
    "PLACEHOLDER_KEYS",
    "AdmissionSettings",
    "EngineSettings",
    "FrontEndSettings",
    "HealthSettings",
    "ModelSettings",
    "ObservabilitySettings",
    "Settings",
    "TenantsSettings",
    "basics",
    "engine_key_refusal",
    "is_basic",
    "placeholder_key",
    "split_keys",
]

# The groups in the order the configuration reference shows them.
GROUPS = (
    ModelSettings,
    EngineSettings,
    FrontEndSettings,
    AdmissionSettings,
    TenantsSettings,
    HealthSettings,
    ObservabilitySettings,
)


# Pydantic collects the fields of the last base first: the groups are listed here in reverse, so
# that model_fields (and everything generated from it) runs in GROUPS' order.
class Settings(
    ObservabilitySettings,
    HealthSettings,
    TenantsSettings,
    AdmissionSettings,
    FrontEndSettings,
    EngineSettings,
    ModelSettings,
):
    model_config = SettingsConfigDict(env_prefix="PALMYRA_", extra="ignore", env_ignore_empty=True)


def basics() -> list[str]:
    """The basic settings' field names, in GROUPS' order."""
    return [name for name, field in Settings.model_fields.items() if is_basic(field)]
