"""Optional client API keys, compared in constant time.

Keys are hashed once at start; a presented key is hashed and compared against every stored
digest with hmac.compare_digest, so neither a prefix of a valid key nor timing reveals anything.
"""

from __future__ import annotations

import hashlib
import hmac


class ApiKeys:
    def __init__(self, keys: list[str]) -> None:
        self._digests = [hashlib.sha256(k.encode()).digest() for k in keys]

    @property
    def enabled(self) -> bool:
        return bool(self._digests)

    def check(self, authorization: bytes | None) -> bool:
        """True when the Authorization header carries a configured key (or no keys are configured)."""
        if not self._digests:
            return True
        if not authorization or not authorization[:7].lower() == b"bearer ":
            return False
        digest = hashlib.sha256(authorization[7:].strip()).digest()
        ok = False
        for stored in self._digests:
            ok |= hmac.compare_digest(digest, stored)  # no early exit: same work for every key
        return ok
