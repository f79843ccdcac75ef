"""tenants/keys.py: API keys. Only a whole bearer key passes; keys fail closed (no key without the
explicit switch, a placeholder, the engine key held to the same rule, an empty or unreadable key
file); a key file in the comma-list format k8s/README.md writes; and the file reloaded at most
once a second, its previous keys kept in force while it is unusable."""

from __future__ import annotations

import os

import pytest

from palmyra_serve.sidecar.tenants.keys import ApiKeys, AuthConfigError, validate_engine_key


def test_api_keys_accept_only_whole_bearer_keys():
    keys = ApiKeys(["k-123-abcd", "other-key-9"])
    assert keys.check(b"Bearer k-123-abcd") and keys.check(b"bearer other-key-9")
    for bad in (None, b"", b"Bearer k-123-abc", b"Bearer k-123-abcde", b"k-123-abcd", b"Basic k-123-abcd", b"Bearer "):
        assert not keys.check(bad)
    assert ApiKeys([], disabled=True).check(None)


def test_keys_fail_closed(tmp_path):
    with pytest.raises(AuthConfigError, match="PALMYRA_AUTH_DISABLED=true"):
        ApiKeys([])
    assert ApiKeys([], disabled=True).check(None)
    enforced = ApiKeys(["a-real-key-123"], disabled=True)  # keys win over the switch
    assert not enforced.check(None) and enforced.check(b"Bearer a-real-key-123")
    for placeholder in ("changeme", "CHANGE-ME", "replace-me", "change-me-engine-key", "<your key>", "short"):
        with pytest.raises(AuthConfigError, match="placeholder"):
            ApiKeys([placeholder])
        # The engine key is held to the same rule (the sidecar refuses to start with it).
        with pytest.raises(AuthConfigError, match="engine key"):
            validate_engine_key(placeholder)
    validate_engine_key(None)  # no engine key: the engine has none (a local dev engine)
    validate_engine_key("a-real-engine-key-123")
    empty = tmp_path / "empty"
    empty.write_text("# a comment\n\n")
    with pytest.raises(AuthConfigError, match="holds no key"):
        ApiKeys([], empty)
    with pytest.raises(AuthConfigError, match="cannot read"):
        ApiKeys([], tmp_path / "missing")


def test_a_key_file_takes_the_format_k8s_readme_writes(tmp_path):
    """`kubectl create secret ... --from-literal=api-keys="$(openssl rand -hex 32),..."` puts a
    comma list in the mounted file: two keys, not one key with a comma in it."""
    path = tmp_path / "api-keys"
    path.write_text("first-key-abcdef,second-key-abcdef")  # no newline, as --from-literal writes it
    keys = ApiKeys([], path)
    assert keys.check(b"Bearer first-key-abcdef") and keys.check(b"Bearer second-key-abcdef")
    assert not keys.check(b"Bearer first-key-abcdef,second-key-abcdef")


def test_key_file_reloads_at_most_once_a_second(tmp_path):
    now = [100.0]
    path = tmp_path / "keys"
    path.write_text("first-key-abcdef\n")
    keys = ApiKeys(["env-key-abcdef"], path, clock=lambda: now[0])
    assert keys.check(b"Bearer first-key-abcdef") and keys.check(b"Bearer env-key-abcdef")
    path.write_text("second-key-abcdef\n")
    os.utime(path, ns=(10**18, 10**18))
    assert not keys.check(b"Bearer second-key-abcdef"), "checked again before a second passed"
    now[0] += 1.0
    assert keys.check(b"Bearer second-key-abcdef") and not keys.check(b"Bearer first-key-abcdef")
    assert keys.check(b"Bearer env-key-abcdef")
    path.write_text("# oops\n")  # unusable: the previous keys stay in force
    os.utime(path, ns=(2 * 10**18, 2 * 10**18))
    now[0] += 1.0
    assert keys.check(b"Bearer second-key-abcdef")


def _tenants_yaml(names: list[str]) -> str:
    from palmyra_serve.sidecar.tenants.config import key_digest

    rows = [f"  - name: {n}\n    keys: ['{key_digest(f'{n}-key-0123456789abc')}']\n" for n in names]
    return "tenants:\n" + "".join(rows)


def test_a_changed_tenants_file_is_parsed_off_the_loop_and_swapped_in_on_it(tmp_path):
    """Attack: a 10,000-tenant file was parsed twice with pure-Python YAML on the event loop (the
    sidecar stalled 5.1 s). The parse runs in an executor; the loop only swaps the result in."""
    import asyncio
    import threading

    path = tmp_path / "tenants.yaml"
    path.write_text(_tenants_yaml(["alpha"]))
    keys = ApiKeys([], tenants_path=path)
    seen_threads: list[str] = []
    keys.on_tenants = lambda tenants: seen_threads.append(threading.current_thread().name)

    async def scenario() -> None:
        path.write_text(_tenants_yaml(["alpha", "bravo"]))
        keys.reload_now()
        assert set(keys.tenants.by_name) == {"alpha", "default"}  # not yet: the parse is elsewhere
        for _ in range(200):
            if "bravo" in keys.tenants.by_name:
                break
            await asyncio.sleep(0.01)
        assert "bravo" in keys.tenants.by_name

    asyncio.run(scenario())
    assert seen_threads == ["MainThread"]


def test_an_oversized_tenants_file_is_refused_before_it_is_parsed(tmp_path):
    from palmyra_serve.sidecar.tenants import config

    path = tmp_path / "tenants.yaml"
    path.write_text("tenants:\n" + "#" * (config.MAX_FILE_BYTES + 1))
    with pytest.raises(config.TenantsFileError, match="over"):
        config.read(path)


def test_a_reload_drops_the_series_of_removed_tenants():
    from prometheus_client import generate_latest

    from palmyra_serve.sidecar.core.metrics import SidecarMetrics
    from palmyra_serve.sidecar.tenants import config

    metrics = SidecarMetrics()
    metrics.show_tenants(config.parse(_tenants_yaml(["alpha", "bravo"]), "f").by_name)
    for name in ("alpha", "bravo"):
        metrics.count_tenant(name, 200, 3, 5)
        metrics.tenant_refusal(name, "rate_limit_tokens")
    metrics.show_tenants(config.parse(_tenants_yaml(["alpha"]), "f").by_name)
    page = generate_latest(metrics.registry).decode()
    assert 'tenant="alpha"' in page and 'tenant="bravo"' not in page
