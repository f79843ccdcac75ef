"""tenants/config.py: the tenants file. Digests only, every mistake refused with its line, the
`default` tenant for plain keys, each tenant's share of the queue; and tenants/keys.py naming the
tenant of a key, reloading the file and keeping the previous tenants when a new file is invalid."""

from __future__ import annotations

import os

import pytest

from palmyra_serve.sidecar.tenants.config import DEFAULT_TENANT, TenantsFileError, key_digest, parse
from palmyra_serve.sidecar.tenants.keys import ApiKeys

SEARCH_KEY = "search-team-key-0123456789"
BATCH_KEY = "batch-team-key-0123456789"

GOOD = f"""
tenants:
  - name: search
    keys: ["{key_digest(SEARCH_KEY)}"]
    requests_per_minute: 600
    tokens_per_minute: 200000
    max_concurrent: 16
    weight: 3
    priority: -1
  - name: batch
    keys:
      - {key_digest(BATCH_KEY)}
  - name: default
    tokens_per_minute: 5000
"""


def test_a_good_file_names_each_tenant_its_keys_and_limits():
    tenants = parse(GOOD, "f")
    search = tenants.spec("search")
    assert (search.requests_per_minute, search.tokens_per_minute, search.max_concurrent) == (600, 200000, 16)
    assert (search.weight, search.priority) == (3.0, -1)
    assert tenants.spec("batch").tokens_per_minute is None and tenants.spec("batch").weight == 1.0
    assert tenants.spec(DEFAULT_TENANT).tokens_per_minute == 5000
    assert sorted(tenants.by_digest.values()) == ["batch", "search"]
    # Queue shares follow the weights: 3 / (3 + 1 + 1).
    assert tenants.share("search").queue_share == pytest.approx(0.6)
    assert tenants.share("batch").queue_share == pytest.approx(0.2)


def test_without_a_file_the_default_tenant_has_the_whole_queue():
    tenants = parse("", "f")
    assert tenants.share(DEFAULT_TENANT).queue_share == 1.0
    assert tenants.spec(DEFAULT_TENANT).requests_per_minute is None


BAD = [
    ("tenants:\n  - name: a\n    keys: [x]\n", 3, "digest"),
    ("tenants:\n  - name: a\n    keys: []\n    burst: 5\n", 4, "Extra inputs"),
    ("tenants:\n  - name: Search Team\n    keys: []\n", 2, "pattern"),
    (f"tenants:\n  - name: a\n    keys: ['{key_digest('k' * 20)}']\n    tokens_per_minute: 0\n", 4, "greater than 0"),
    (f"tenants:\n  - name: a\n    keys: ['{key_digest('k' * 20)}']\n    weight: -2\n", 4, "greater than 0"),
    (f"tenants:\n  - name: a\n    keys: ['{key_digest('k' * 20)}']\n    requests_per_minute: '60'\n", 4, "integer"),
    ("tenants:\n  - name: lonely\n", 2, "has no keys"),
    (
        f"tenants:\n  - name: a\n    keys: ['{key_digest('k' * 20)}']\n"
        f"  - name: a\n    keys: ['{key_digest('j' * 20)}']\n",
        4,
        "named twice",
    ),
    (
        f"tenants:\n  - name: a\n    keys: ['{key_digest('k' * 20)}']\n  - name: b\n    keys:\n"
        f"      - '{key_digest('j' * 20)}'\n      - '{key_digest('k' * 20)}'\n",
        7,
        "also 'a'",
    ),
    ("tenants: [\n", 2, "not YAML"),
    ("teams: []\n", 1, "Field required"),
]


@pytest.mark.parametrize(("text", "line", "says"), BAD, ids=[b[2] for b in BAD])
def test_every_mistake_is_refused_with_its_line(text: str, line: int, says: str):
    with pytest.raises(TenantsFileError) as caught:
        parse(text, "tenants.yaml")
    assert f"tenants.yaml line {line}:" in str(caught.value) and says in str(caught.value)


def test_keys_name_their_tenant_and_plain_keys_are_default(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(GOOD)
    keys = ApiKeys(["plain-key-0123456789"], tenants_path=path)
    assert keys.identify(f"Bearer {SEARCH_KEY}".encode()) == "search"
    assert keys.identify(f"Bearer {BATCH_KEY}".encode()) == "batch"
    assert keys.identify(b"Bearer plain-key-0123456789") == DEFAULT_TENANT
    assert keys.identify(b"Bearer " + SEARCH_KEY[:-1].encode()) is None
    assert keys.identify(None) is None


def test_a_tenants_file_alone_turns_keys_on(tmp_path):
    path = tmp_path / "tenants.yaml"
    path.write_text(GOOD)
    keys = ApiKeys([], tenants_path=path)
    assert keys.enabled and keys.identify(None) is None and keys.identify(f"Bearer {SEARCH_KEY}".encode()) == "search"


def test_the_file_is_reloaded_and_an_invalid_one_keeps_the_previous_tenants(tmp_path):
    now = [0.0]
    path = tmp_path / "tenants.yaml"
    path.write_text(GOOD)
    keys = ApiKeys([], clock=lambda: now[0], tenants_path=path)
    moved = GOOD.replace("name: batch", "name: nightly")
    path.write_text(moved)
    os.utime(path, ns=(1, 10**18))
    now[0] = 2.0
    assert keys.identify(f"Bearer {BATCH_KEY}".encode()) == "nightly"
    path.write_text(moved + "    oops: 1\n")
    os.utime(path, ns=(1, 2 * 10**18))
    now[0] = 4.0
    assert keys.identify(f"Bearer {BATCH_KEY}".encode()) == "nightly"  # the invalid file changed nothing
    assert keys.tenants.spec("search").tokens_per_minute == 200000


def test_the_tenants_command_writes_digests_and_checks_a_file(tmp_path):
    import subprocess
    import sys

    cli = [sys.executable, "-m", "palmyra_serve.cli", "tenants"]
    out = subprocess.run([*cli, "digest"], input=f"{SEARCH_KEY}\n\n{BATCH_KEY}\n", capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.split() == [key_digest(SEARCH_KEY), key_digest(BATCH_KEY)]
    good = tmp_path / "good.yaml"
    good.write_text(GOOD)
    checked = subprocess.run([*cli, "check", str(good)], capture_output=True, text=True)
    assert checked.returncode == 0 and checked.stdout.startswith("search: 1 key(s), queue share 60%")
    bad = tmp_path / "bad.yaml"
    bad.write_text(GOOD.replace("weight: 3", "wieght: 3"))
    refused = subprocess.run([*cli, "check", str(bad)], capture_output=True, text=True)
    assert refused.returncode == 1 and "line 8" in refused.stderr and "wieght" in refused.stderr
