"""core/drain.py: the one drain state readiness and admission share, through the app's
SidecarState: announced, the replica is not ready yet still admits; closed, admission refuses
newcomers and the drain waits for what is in flight."""

from __future__ import annotations

import asyncio

import pytest

from palmyra_serve.sidecar.admission.control import Draining
from palmyra_serve.sidecar.core.metrics import SidecarMetrics


def test_one_drain_state_turns_readiness_first_then_closes_admission():
    """The app's readiness and admission read one drain state (core/drain.py): announced, the
    replica is not ready yet still admits; closed, admission refuses and the drain waits."""
    from palmyra_serve.settings import Settings
    from palmyra_serve.sidecar.app import SidecarState

    async def scenario():
        state = SidecarState(Settings(_env_file=None, auth_disabled=True), SidecarMetrics())
        state.health.record_health(True, "ok")
        state.health.set_phase("ready")
        state.health.begin_drain()
        assert not state.health.readiness()[0] and not state.admission.draining
        ticket = await state.admission.acquire()  # endpoints still route here: served
        drained = asyncio.create_task(state.admission.drain(5))
        await asyncio.sleep(0)
        assert state.admission.draining and state.health.draining
        with pytest.raises(Draining):
            await state.admission.acquire()
        state.admission.release(ticket)
        assert await drained is True

    asyncio.run(scenario())
