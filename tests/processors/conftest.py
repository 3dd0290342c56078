"""Fixtures of the processors' tests."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, action
from pipecat_actions.policy import load_policy_text
from pipecat_actions.testing import FakeSystemOfRecord
from tests.processors._gate import POLICY, Agent, ScriptClock


@pytest.fixture
async def runtime_factory(tmp_path: Path) -> AsyncIterator[Any]:
    """Builds booking agents (`Agent`) on runtimes of their own; closes them after the test."""
    opened: list[ActionRuntime] = []

    async def make(
        late: str = "in_place",
        latency_secs: float = 0.5,
        visible_to: str = "[]",
        authorizer: Any = None,
    ) -> Agent:
        clock = ScriptClock()
        sor = FakeSystemOfRecord(clock=clock)
        sor.add_restaurant("r1", tables=3)
        sor.faults.set_latency(latency_secs)

        @action
        async def book_table(
            ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
        ) -> dict[str, Any]:
            """Book a table."""
            booking = await sor.book(
                restaurant_id, date, time, party_size, "Ada", idempotency_key=ctx.idempotency_key
            )
            return {"booking_id": booking.booking_id, "time": booking.time}

        runtime = await ActionRuntime.create(
            load_policy_text(POLICY % {"late": late, "visible_to": visible_to}),
            authorizer=authorizer or AllowAll(),
            actions=[book_table],
            ledger_url=f"sqlite:///{tmp_path}/ledger-{len(opened)}.db",
            clock=clock,
        )
        opened.append(runtime)
        return Agent(runtime, sor, clock, [])

    yield make
    for runtime in opened:
        await runtime.close(grace_secs=0)
