"""Client API keys: required unless explicitly disabled, compared in constant time, reloaded on change.

Fails closed: with no usable key and no explicit PALMYRA_AUTH_DISABLED=true the sidecar refuses
to start (AuthConfigError), and so does a key file that is empty or only comments, or a key that is
one of the placeholders the example configurations ship (settings.placeholder_key, the one rule,
which the engine key at start and the engine launcher use too). Keys configured alongside
PALMYRA_AUTH_DISABLED=true are still enforced: a contradiction resolves to the safe side.

Keys are hashed once; a presented key is hashed and compared against every stored digest with
hmac.compare_digest, so neither a prefix of a valid key nor timing reveals anything. The key file
is stat()ed at most once a second from the request path (one clock read per request otherwise);
a changed file (mtime, size or inode: a Kubernetes secret mount swaps a symlink) is re-read. A new
file that is unusable is logged and ignored: the previous keys stay in force.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from palmyra_serve.settings import KEY_RECIPE, MIN_KEY_CHARS, Settings, engine_key_refusal, placeholder_key, split_keys

log = logging.getLogger("palmyra.sidecar")

RELOAD_EVERY_S = 1.0


class AuthConfigError(ValueError):
    """The key configuration would leave the service open or guessable; the message says why."""


def validate(keys: list[str], source: str) -> list[str]:
    bad = [k for k in keys if placeholder_key(k)]
    if bad:
        raise AuthConfigError(
            f"{source}: {len(bad)} key(s) are placeholders or shorter than {MIN_KEY_CHARS} "
            f"characters (e.g. 'changeme'); generate real ones ({KEY_RECIPE})"
        )
    return keys


def validate_engine_key(key: str | None) -> None:
    """The engine key, by the same rule: a placeholder (one the example configurations ship) would
    leave the engine's /v1 behind a key anyone can read. Unset means the engine has no key."""
    refusal = engine_key_refusal(key, "PALMYRA_ENGINE_API_KEY")
    if refusal:
        raise AuthConfigError(refusal)


def read_key_file(path: Path) -> list[str]:
    """Keys one per line or comma-separated (settings.split_keys); empty or comment-only is an error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise AuthConfigError(f"PALMYRA_API_KEYS_FILE {path}: cannot read it ({exc.strerror})") from None
    keys = split_keys(text)
    if not keys:
        raise AuthConfigError(f"PALMYRA_API_KEYS_FILE {path} holds no key (empty or only comments)")
    return validate(keys, f"PALMYRA_API_KEYS_FILE {path}")


def _signature(path: Path) -> tuple[int, int, int] | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _digest(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


class ApiKeys:
    def __init__(
        self,
        keys: list[str],
        path: Path | None = None,
        disabled: bool = False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Raises AuthConfigError when the configuration would start open or with placeholder keys."""
        self._env_digests = [_digest(k) for k in validate(list(keys), "PALMYRA_API_KEYS")]
        self._path = path
        self._clock = clock
        self._sig = _signature(path) if path is not None else None
        file_keys = read_key_file(path) if path is not None else []
        self._digests = self._env_digests + [_digest(k) for k in file_keys]
        self._next_check = clock() + RELOAD_EVERY_S
        if disabled and self._digests:
            log.warning("PALMYRA_AUTH_DISABLED=true is ignored: API keys are configured and stay required")
        elif not disabled and not self._digests:
            raise AuthConfigError(
                "no client API key configured: set PALMYRA_API_KEYS or PALMYRA_API_KEYS_FILE, "
                "or PALMYRA_AUTH_DISABLED=true to serve without authentication"
            )
        self.enabled = bool(self._digests)

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        return cls(settings.api_keys, settings.api_keys_file, settings.auth_disabled)

    def check(self, authorization: bytes | None) -> bool:
        """True when the Authorization header carries a configured key (or auth is disabled)."""
        if not self.enabled:
            return True
        if self._path is not None:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + RELOAD_EVERY_S
                self._maybe_reload()
        if not authorization or authorization[:7].lower() != b"bearer ":
            return False
        digest = hashlib.sha256(authorization[7:].strip()).digest()
        ok = False
        for stored in self._digests:
            ok |= hmac.compare_digest(digest, stored)  # no early exit: same work for every key
        return ok

    def _maybe_reload(self) -> None:
        assert self._path is not None
        sig = _signature(self._path)
        if sig == self._sig:
            return
        self._sig = sig
        try:
            keys = read_key_file(self._path)
        except AuthConfigError as exc:
            log.error(
                "API key file changed but is unusable; the previous keys stay in force",
                extra={"fields": {"error": str(exc)}},
            )
            return
        self._digests = self._env_digests + [_digest(k) for k in keys]
        log.info("API keys reloaded", extra={"fields": {"keys": len(self._digests)}})
