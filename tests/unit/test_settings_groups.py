"""Settings in groups: every field is declared by exactly one group class, Settings is the groups and
nothing more, the basics are the few every operator sets, and the env names stay what they were
(tests/static/test_contract.py holds the names, types and defaults themselves)."""

from __future__ import annotations

import inspect

import pytest
from pydantic import Field, ValidationError
from pydantic_settings import BaseSettings

from palmyra_serve.settings import GROUPS, Settings, basics, is_basic

# The settings nearly every operator sets (docs/configuration.md lists them first): which model under
# which name, on which device with which context length, behind which keys, tenants and ports.
BASICS = [
    "model",
    "served_model_name",
    "engine_api_key",
    "platform",
    "max_model_len",
    "npu_devices",
    "host",
    "port",
    "probe_port",
    "api_keys",
    "api_keys_file",
    "tenants_file",
]


def owners(groups: tuple[type[BaseSettings], ...]) -> dict[str, list[str]]:
    """Field name -> the groups that declare it themselves (not by inheritance)."""
    out: dict[str, list[str]] = {}
    for group in groups:
        for name in group.__annotations__:
            if name in group.model_fields:
                out.setdefault(name, []).append(group.__name__)
    return out


def test_every_setting_belongs_to_exactly_one_group():
    found = owners(GROUPS)
    assert set(found) == set(Settings.model_fields), set(found) ^ set(Settings.model_fields)
    shared = {name: groups for name, groups in found.items() if len(groups) != 1}
    assert not shared, f"declared by more than one group: {shared}"


def test_settings_is_the_groups_and_declares_nothing_of_its_own():
    assert set(Settings.__bases__) == set(GROUPS)
    own = [name for name in inspect.get_annotations(Settings) if name != "model_config"]
    assert not own, f"declare {own} in the group of their concern, not on Settings"
    # A group is a plain group: it builds on no other group (a field then would have two homes).
    for group in GROUPS:
        assert group.__bases__ == (BaseSettings,), group


def test_fields_run_in_the_groups_order():
    expected = [name for group in GROUPS for name in group.model_fields]
    assert list(Settings.model_fields) == expected


def test_the_basics_are_the_few_every_operator_sets():
    assert basics() == BASICS
    assert len(BASICS) < len(Settings.model_fields) / 4, "a basic is what nearly everyone sets, not a tuning knob"
    assert all(is_basic(Settings.model_fields[name]) for name in BASICS)


def test_the_groups_check_can_fail():
    class One(BaseSettings):
        a: int = Field(1)
        b: int = Field(2)

    class Other(BaseSettings):
        b: int = Field(3)

    assert owners((One, Other)) == {"a": ["One"], "b": ["One", "Other"]}


def test_env_names_and_validators_work_across_groups(monkeypatch):
    monkeypatch.setenv("PALMYRA_API_KEYS", "key-one-xyz, key-two-xyz")  # front end
    monkeypatch.setenv("PALMYRA_MAX_QUEUE", "7")  # admission
    monkeypatch.setenv("PALMYRA_GOLDEN_INTERVAL_S", "60")  # health
    monkeypatch.setenv("PALMYRA_MAX_MODEL_LEN", "")  # empty: the default
    settings = Settings()
    assert settings.api_keys == ["key-one-xyz", "key-two-xyz"]
    assert (settings.max_queue, settings.golden_interval_s, settings.max_model_len) == (7, 60.0, 8192)
    with pytest.raises(ValidationError, match="OTLP/HTTP"):
        Settings(otlp_traces_endpoint="otel-collector:4317")
    with pytest.raises(ValidationError):
        Settings(quota_replicas=0)
