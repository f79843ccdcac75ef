"""Request bodies, read whole before admission: under a size limit, a deadline of their own and a
budget over every connection at once (reading happens before admission, so without it
max_connections slow uploads could each hold a full body). A drain refuses the uploads still
arriving rather than waiting out their deadline."""

from __future__ import annotations

import asyncio
from typing import Any

from palmyra_serve.sidecar.core import errors


class ClientGone(Exception):
    """The client disconnected; nothing more can be sent."""


class BodyReader:
    def __init__(self, limit: int, timeout_s: float, budget: int, retry_after_s: int) -> None:
        self.limit = limit
        self.timeout_s = timeout_s
        self.budget = budget
        self.retry_after_s = retry_after_s
        self.held = 0  # bytes of bodies held now, over all connections
        self._uploads: set[asyncio.Task] = set()  # requests whose body is still arriving
        self._refused = False

    async def read(self, receive: Any, content_length: bytes | None) -> bytes:
        """The whole body; counted in `held` until the caller gives it back (release)."""
        limit = self.limit
        if content_length is not None and content_length.isdigit() and int(content_length) > limit:
            raise errors.body_too_large(limit)
        chunks: list[bytes] = []
        size = 0
        uploading: asyncio.Task | None = None
        try:
            # A slow-loris body must not hold a connection (or, later, a slot): a deadline of its
            # own, much shorter than the engine's read timeout.
            async with asyncio.timeout(self.timeout_s):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        raise ClientGone
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    self.held += len(chunk)
                    if size > limit:
                        raise errors.body_too_large(limit)
                    if self.held > self.budget:
                        raise errors.bodies_over_budget(self.retry_after_s)
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
                    if uploading is None:  # a body still arriving: a drain must be able to end it
                        uploading = asyncio.current_task()
                        assert uploading is not None
                        self._uploads.add(uploading)
        except BaseException as exc:
            self.held -= size  # on success the caller releases it when the request ends
            if isinstance(exc, TimeoutError):
                raise errors.body_timeout() from None
            if isinstance(exc, asyncio.CancelledError) and uploading is not None and self._refused:
                uploading.uncancel()  # refuse_uploads() cancelled it: answer, rather than vanish
                raise errors.draining(self.retry_after_s) from None
            raise
        finally:
            if uploading is not None:
                self._uploads.discard(uploading)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def release(self, size: int) -> None:
        self.held -= size

    def uploads_arriving(self) -> int:
        return len(self._uploads)

    def refuse_uploads(self) -> None:
        """Draining, with admission closed: a body still arriving would only be refused once it is
        complete (a slow upload could hold the process's exit for its whole body deadline), so it
        is refused now, 503 with Retry-After and the connection closed."""
        self._refused = True
        for task in self._uploads:
            task.cancel()
