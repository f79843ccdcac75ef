"""API keys: the one format they are written in, and the one rule for keys that must not be used."""

from __future__ import annotations


def split_keys(text: str) -> list[str]:
    """The one format of API keys, in PALMYRA_API_KEYS and in a key file alike: separated by commas
    or newlines, surrounding blanks dropped, lines starting with # skipped."""
    keys: list[str] = []
    for line in text.splitlines():
        if not line.strip().startswith("#"):
            keys += [k.strip() for k in line.split(",") if k.strip()]
    return keys


# The one rule for keys that must not be used: the values the repository's examples carry (.env,
# compose/*.env, READMEs), the usual suspects, and anything short enough to guess. Client keys
# (sidecar/tenants/keys.py), the engine key at sidecar start and the engine launcher all apply it.
MIN_KEY_CHARS = 8
KEY_RECIPE = "openssl rand -hex 32"
PLACEHOLDER_KEYS = frozenset(
    {
        "changeme",
        "change-me",
        "change_me",
        "replace-me",
        "replace_me",
        "replaceme",
        "your-key",
        "your-api-key",
        "your_api_key",
        "api-key",
        "apikey",
        "secret",
        "password",
        "example",
        "test",
        "key",
        "key1",
        "key2",
        "sk-xxx",
        "xxx",
        "todo",
        "none",
        "null",
        "unused",
        "change-me-engine-key",
        "change-me-client-key",
    }
)


def placeholder_key(key: str) -> bool:
    """True for a key that is a known placeholder, starts like one, or is shorter than MIN_KEY_CHARS."""
    low = key.lower()
    return (
        low in PLACEHOLDER_KEYS
        or low.startswith(("change-me", "changeme", "replace-me", "<"))
        or len(key) < MIN_KEY_CHARS
    )


def engine_key_refusal(key: str | None, source: str) -> str | None:
    """Why the engine key read from `source` must not be used, or None (unset means no key). One
    message for the sidecar's start and the engine launcher alike."""
    if key and placeholder_key(key):
        return (
            f"the engine key ({source}) is a placeholder or shorter than {MIN_KEY_CHARS} characters; "
            f"generate one ({KEY_RECIPE}) and give the engine (VLLM_API_KEY) and the sidecar "
            "(PALMYRA_ENGINE_API_KEY) the same value"
        )
    return None
