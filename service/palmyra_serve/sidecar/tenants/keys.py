"""Client API keys: required unless explicitly disabled, compared in constant time, reloaded on change.

Fails closed: with no usable key and no explicit PALMYRA_AUTH_DISABLED=true the sidecar refuses
to start (AuthConfigError), and so does a key file that is empty or only comments, or a key that is
one of the placeholders the example configurations ship (settings.placeholder_key, the one rule,
which the engine key at start and the engine launcher use too). Keys configured alongside
PALMYRA_AUTH_DISABLED=true are still enforced: a contradiction resolves to the safe side.

Keys are hashed once; a presented key is hashed and looked up among the stored digests. The lookup
compares SHA-256 digests, never keys: a timing difference could only tell an attacker about the
digest of what it sent, and a prefix of a digest says nothing about a key (finding a key whose
digest starts a certain way is a preimage search), so neither a prefix of a valid key nor timing
reveals anything, with one dictionary lookup whatever the number of keys. The key file
is stat()ed at most once a second from the request path (one clock read per request otherwise);
a changed file (mtime, size or inode: a Kubernetes secret mount swaps a symlink) is re-read. A new
file that is unusable is logged and ignored: the previous keys stay in force.

Tenants (tenants/config.py): a key also says whose it is. Keys from PALMYRA_API_KEYS and the key
file are the tenant `default`'s; the tenants file (PALMYRA_TENANTS_FILE) adds named tenants by
their keys' digests, and is watched and reloaded the same way (an invalid new file is logged, the
previous tenants stay). identify() answers the tenant's name, or None for no valid key.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from palmyra_serve.settings import KEY_RECIPE, MIN_KEY_CHARS, Settings, engine_key_refusal, placeholder_key, split_keys
from palmyra_serve.sidecar.tenants import config as tenants_config
from palmyra_serve.sidecar.tenants.config import DEFAULT_TENANT, Tenants, TenantsFileError

log = logging.getLogger("palmyra.sidecar")

RELOAD_EVERY_S = 1.0


def credential(authorization: bytes | None, api_key: bytes | None) -> bytes | None:
    """The Authorization value a request's key is read from: its own, else the Anthropic SDK's
    `x-api-key` header as a bearer token (the same key either way)."""
    if authorization is not None or api_key is None:
        return authorization
    return b"Bearer " + api_key


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


class _Watched:
    """A file re-read when its signature changes, checked at most once per RELOAD_EVERY_S."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.sig = _signature(path)

    def changed(self) -> bool:
        sig = _signature(self.path)
        if sig == self.sig:
            return False
        self.sig = sig
        return True


class ApiKeys:
    def __init__(
        self,
        keys: list[str],
        path: Path | None = None,
        disabled: bool = False,
        clock: Callable[[], float] = time.monotonic,
        tenants_path: Path | None = None,
    ) -> None:
        """Raises AuthConfigError when the configuration would start open or with placeholder keys,
        TenantsFileError when the tenants file is unusable."""
        self._env_digests = [_digest(k) for k in validate(list(keys), "PALMYRA_API_KEYS")]
        self._key_file = _Watched(path) if path is not None else None
        self._tenants_file = _Watched(tenants_path) if tenants_path is not None else None
        self._clock = clock
        self._file_digests = [_digest(k) for k in read_key_file(path)] if path is not None else []
        self.tenants = tenants_config.read(tenants_path) if tenants_path is not None else tenants_config.NO_TENANTS
        self.on_tenants: Callable[[Tenants], None] | None = None  # the metrics' view, bound by the app
        self._tenants_reading = False  # a changed tenants file is being read off the loop
        self._index()
        self._next_check = clock() + RELOAD_EVERY_S
        if disabled and self._digests:
            log.warning("PALMYRA_AUTH_DISABLED=true is ignored: API keys are configured and stay required")
        elif not disabled and not self._digests:
            raise AuthConfigError(
                "no client API key configured: set PALMYRA_API_KEYS, PALMYRA_API_KEYS_FILE or "
                "PALMYRA_TENANTS_FILE, or PALMYRA_AUTH_DISABLED=true to serve without authentication"
            )
        self.enabled = bool(self._digests)

    def _index(self) -> None:
        """Every stored digest with its tenant (a tenants file cannot claim a plain key: they are
        `default`'s, which the file's own keys for `default` join)."""
        plain = dict.fromkeys(self._env_digests + self._file_digests, DEFAULT_TENANT)
        claimed = [self.tenants.by_digest[d] for d in plain if d in self.tenants.by_digest]
        if claimed:
            log.warning(
                "a plain API key is also listed in the tenants file: it stays the default tenant's",
                extra={"fields": {"tenants": sorted(set(claimed))}},
            )
        self._digests = {**self.tenants.by_digest, **plain}

    @classmethod
    def from_settings(cls, settings: Settings) -> ApiKeys:
        return cls(
            settings.api_keys, settings.api_keys_file, settings.auth_disabled, tenants_path=settings.tenants_file
        )

    def check(self, authorization: bytes | None) -> bool:
        """True when the Authorization header carries a configured key (or auth is disabled)."""
        return self.identify(authorization) is not None

    def identify(self, authorization: bytes | None) -> str | None:
        """The tenant whose key the Authorization header carries (`default` when auth is disabled);
        None for a missing or unknown key."""
        if not self.enabled:
            return DEFAULT_TENANT
        if self._key_file is not None or self._tenants_file is not None:
            now = self._clock()
            if now >= self._next_check:
                self._next_check = now + RELOAD_EVERY_S
                self._maybe_reload()
        if not authorization or authorization[:7].lower() != b"bearer ":
            return None
        return self._digests.get(hashlib.sha256(authorization[7:].strip()).digest())

    def reload_now(self) -> None:
        """Read the watched files again whether or not they look changed (SIGHUP)."""
        for watched in (self._key_file, self._tenants_file):
            if watched is not None:
                watched.sig = None
        self._next_check = self._clock() + RELOAD_EVERY_S
        self._maybe_reload()

    def _maybe_reload(self) -> None:
        if self._key_file is not None and self._key_file.changed():
            try:
                self._file_digests = [_digest(k) for k in read_key_file(self._key_file.path)]
            except AuthConfigError as exc:
                log.error(
                    "API key file changed but is unusable; the previous keys stay in force",
                    extra={"fields": {"error": str(exc)}},
                )
            else:
                self._index()
                log.info("API keys reloaded", extra={"fields": {"keys": len(self._digests)}})
        if self._tenants_file is not None and self._tenants_file.changed():
            self._reload_tenants()

    def _reload_tenants(self) -> None:
        """Read and parse the changed tenants file off the event loop (a large file takes a parse
        of its own time; requests go on meanwhile with the tenants in force), then swap it in on
        the loop. Outside a running loop (the CLI, unit tests) it happens at once."""
        assert self._tenants_file is not None
        path = self._tenants_file.path
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._apply_tenants(_read_tenants(path))
            return
        if self._tenants_reading:
            self._tenants_file.sig = None  # changed again while being read: read once more after
            return
        self._tenants_reading = True
        future = loop.run_in_executor(None, _read_tenants, path)
        future.add_done_callback(self._tenants_read)

    def _tenants_read(self, future: asyncio.Future[Tenants | TenantsFileError]) -> None:
        self._tenants_reading = False
        if not future.cancelled():
            self._apply_tenants(future.result())

    def _apply_tenants(self, tenants: Tenants | TenantsFileError) -> None:
        if isinstance(tenants, TenantsFileError):
            log.error(
                "tenants file changed but is unusable; the previous tenants stay in force",
                extra={"fields": {"error": str(tenants)}},
            )
            return
        self.tenants = tenants
        self._index()
        if self.on_tenants is not None:
            self.on_tenants(tenants)
        log.info("tenants reloaded", extra={"fields": {"tenants": len(tenants.by_name)}})


def _read_tenants(path: Path) -> Tenants | TenantsFileError:
    try:
        return tenants_config.read(path)
    except TenantsFileError as exc:
        return exc
