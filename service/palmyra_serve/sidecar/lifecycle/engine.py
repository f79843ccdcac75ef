"""What the lifecycle asks of the engine: the control-plane calls the health poll, warmup, the canary
and the golden check make (upstream/control.py's EngineClient answers them; the composition root,
app.py, hands it in), so that this package depends on no other concern."""

from __future__ import annotations

from typing import Any, Protocol

from palmyra_serve.sidecar.core.generation import GenerationResult


class Engine(Protocol):
    async def health(self, timeout_s: float) -> tuple[bool, str]: ...

    async def models(self, timeout_s: float) -> list[dict[str, Any]]: ...

    async def version(self, timeout_s: float) -> str | None: ...

    async def generate(self, route: str, payload: dict[str, Any], timeout_s: float) -> GenerationResult: ...
