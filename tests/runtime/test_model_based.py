"""A model-based test: random interleavings of proposals, faults, time, barge-ins and restarts.

Hypothesis drives the real runtime (SQLite ledger, fake system of record, manual clock) and
checks it against a small reference model after every step:

* every audit trail follows the status table, numbered without gaps;
* no idempotency key ever causes more than one real booking (the provider does not dedupe);
* COMMITTED only when the system of record has the booking; CANCELLED, REJECTED and EXPIRED
  only when it does not;
* once time has run past every deadline and recovery had its turn, nothing is left in flight
  except UNKNOWN operations that were escalated.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    Reconciliation,
    SessionState,
    action,
)
from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import ForwardingLedger, Ledger, SqlLedger
from pipecat_actions.policy import load_policy_text
from pipecat_actions.status import TERMINAL_STATUSES, TRANSITIONS, ActionStatus
from pipecat_actions.testing import FakeSystemOfRecord, ProviderRejected
from tests import _waiting

S = ActionStatus
POLICY = """
version: 1
tools:
  book_table:
    kind: mutation
    idempotency: {key_fields: [time]}
    on_interruption: cancel_if_not_started
    admit_when: %s
    deadline_secs: 5
"""
TIMES = ["19:00", "19:30", "20:00", "20:30"]
_runs = itertools.count()

QUIET_TURNS = 50
"""Loop turns in a row with no ledger call in flight after which the runtime is at rest."""


class CountingLedger(ForwardingLedger):
    """The real ledger, counting the calls in flight (a write waits for the writer thread).

    Every wait of the runtime is on the manual clock, on the session, on the provider (whose
    latency runs on the same clock) or on the ledger. With no ledger call in flight for many
    loop turns in a row, nothing is left that real time would move: the runtime is at rest
    until the model moves the clock or acts.
    """

    def __init__(self, inner: Ledger) -> None:
        super().__init__(inner)
        self.in_flight = 0
        for name in Ledger.__abstractmethods__:
            if name != "close":
                setattr(self, name, self._counted(getattr(inner, name)))

    def _counted(self, call: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
        @functools.wraps(call)
        async def counted(*args: Any, **kwargs: Any) -> Any:
            self.in_flight += 1
            try:
                return await call(*args, **kwargs)
            finally:
                self.in_flight -= 1

        return counted


class RuntimeModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.tmp = tempfile.TemporaryDirectory()
        self.url = f"sqlite:///{Path(self.tmp.name) / f'ledger-{next(_runs)}.db'}"
        self.clock = ManualClock()
        self.sor = FakeSystemOfRecord(clock=self.clock, honours_idempotency_keys=False)
        self.sor.add_restaurant("r1", tables=10)
        self.sor.faults.set_latency(1.0, kind="book")
        self.admit_when = "immediately"
        self.session = SessionState(session_id="call-1", principal="alice")
        self.runtime: ActionRuntime | None = None
        self.ledger: CountingLedger | None = None
        self.restarts = 0
        self.run(self._open())

    # --- plumbing --------------------------------------------------------------------------

    def run(self, coroutine: Any) -> Any:
        return self.loop.run_until_complete(coroutine)

    def settle(self) -> None:
        """Run the loop until the runtime is at rest (see `CountingLedger`)."""
        self.run(self._at_rest())

    async def _at_rest(self) -> None:
        # Ledger writes finish in the writer thread: wait for them, then let every task
        # woken by them run on, until no ledger call starts again for QUIET_TURNS turns. The
        # hang guard only turns a runtime that never comes to rest into a clear failure.
        give_up = time.monotonic() + _waiting.HANG_GUARD_SECS
        quiet = 0
        while quiet < QUIET_TURNS:
            assert self.ledger is not None
            if self.ledger.in_flight:
                quiet = 0
                if time.monotonic() > give_up:
                    raise _waiting.hung("the runtime to come to rest")
                await asyncio.sleep(0.001)
            else:
                quiet += 1
                await asyncio.sleep(0)

    def actions(self) -> list[Any]:
        sor = self.sor

        async def find(ctx: ActionContext) -> Reconciliation:
            found = sor.find_by_idempotency_key(ctx.idempotency_key)
            return (
                Reconciliation.committed({"found": True}) if found else (Reconciliation.not_found())
            )

        @action(reconcile=find)
        async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
            """Book a table."""
            try:
                booking = await sor.book(
                    "r1", "2030-05-01", time, 2, "Ada", idempotency_key=ctx.idempotency_key
                )
            except ProviderRejected:
                raise
            return {"booking_id": booking.booking_id}

        return [book_table]

    async def _open(self) -> None:
        # A process of its own: its own ledger connection, closed with it (`_close`).
        self.ledger = CountingLedger(await SqlLedger.create(self.url, clock=self.clock))
        self.runtime = await ActionRuntime.create(
            load_policy_text(POLICY % self.admit_when),
            authorizer=AllowAll(),
            actions=self.actions(),
            ledger=self.ledger,
            clock=self.clock,
            lease_secs=3,
            owner=f"owner-{self.restarts}",
        )

    async def _stop(self) -> None:
        for task in self._pending:
            task.cancel()
        if self.runtime is not None:
            await self.runtime.close(grace_secs=0)
        await asyncio.gather(*self._pending, return_exceptions=True)
        await self._close()

    async def _close(self) -> None:
        if self.runtime is not None:
            await self.runtime.close(grace_secs=0)
        if self.ledger is not None:
            await self.ledger.close()
            self.ledger = None

    # --- rules -----------------------------------------------------------------------------

    @rule(
        time=st.sampled_from(TIMES),
        fault=st.sampled_from(
            ["none", "none", "error_before_send", "lose_response_after_commit", "fail_after_send"]
        ),
    )
    def propose(self, time: str, fault: str) -> None:
        assert self.runtime is not None
        if fault != "none":
            getattr(self.sor.faults, fault)("book")
        self.session.start_generation()
        task = self.loop.create_task(
            self.runtime.propose("book_table", {"time": time}, self.session)
        )
        self._pending.append(task)
        self.settle()

    @rule(secs=st.sampled_from([0.2, 1.0, 3.0, 6.0]))
    def advance(self, secs: float) -> None:
        self.clock.advance(secs)
        self.settle()

    @rule()
    def barge_in(self) -> None:
        self.session.interrupt()
        for task in self._pending:
            if not task.done():
                task.cancel()  # Pipecat cancels the blocking handler
        self.settle()

    @rule()
    def restart(self) -> None:
        assert self.runtime is not None
        self.run(self._close())
        self.restarts += 1
        self.clock.advance(4)  # the old owner's lease runs out
        self.run(self._open())
        self.settle()

    # --- invariants ------------------------------------------------------------------------

    @property
    def _pending(self) -> list[asyncio.Task[Any]]:
        if not hasattr(self, "_tasks"):
            self._tasks: list[asyncio.Task[Any]] = []
        return self._tasks

    def operations(self) -> list[Any]:
        assert self.runtime is not None
        return list(self.run(self.runtime.ledger.list()))

    @invariant()
    def trails_follow_the_table(self) -> None:
        assert self.runtime is not None
        for op in self.operations():
            trail = self.run(self.runtime.ledger.events(op.operation_id))
            # Background work may add events between the two reads: numbered from 1, no gap.
            assert [e.seq for e in trail] == list(range(1, len(trail) + 1))
            assert len(trail) >= op.event_seq
            for event in trail:
                if event.from_status != event.to_status:
                    assert event.to_status in TRANSITIONS[event.from_status], event

    def by_key(self) -> dict[str, list[Any]]:
        """The operations that held each idempotency key.

        An operation that ended with nothing standing (FAILED_FINAL, CANCELLED, ...) lets go
        of its key, and a repeat of the intent is a new operation under the same key (README,
        "At most once"): the provider's effects of a key are those of all of them.
        """
        keys: dict[str, list[Any]] = {}
        for op in self.operations():
            keys.setdefault(op.idempotency_key, []).append(op)
        return keys

    def assert_effects_agree(self, key: str, ops: list[Any], *, maybe: Any) -> None:
        """The provider (it does not dedupe) made one booking per operation that happened:
        each COMMITTED one, none of those that did not, and one or none of those ``maybe``
        says may or may not have happened (in flight, UNKNOWN)."""
        effects = self.sor.effects_for_key(key)
        happened = sum(op.status is S.COMMITTED for op in ops)
        unsure = sum(op.status is not S.COMMITTED and maybe(op) for op in ops)
        assert effects <= 1, ops
        assert happened <= effects <= happened + unsure, (effects, ops)

    @invariant()
    def at_most_one_booking_per_key_and_statuses_agree_with_the_provider(self) -> None:
        # Meanwhile a FAILED_FINAL operation may still be contradicted by a late answer (it is
        # then escalated); CANCELLED, REJECTED and EXPIRED say for good that nothing happened.
        for key, ops in self.by_key().items():
            self.assert_effects_agree(
                key, ops, maybe=lambda op: op.status not in (S.CANCELLED, S.REJECTED, S.EXPIRED)
            )

    def settled(self) -> bool:
        return all(
            op.status in TERMINAL_STATUSES or op.escalated_at is not None
            for op in self.operations()
        )

    def run_out_the_clock(self) -> None:
        # Bounded in clock steps, each run until the runtime is at rest: a slow machine takes
        # longer instead of failing.
        for _ in range(60):
            self.clock.advance(10)
            self.settle()
            if self.settled():
                return

    def teardown(self) -> None:
        """At the end: run time out and restart once; then nothing may be left in flight."""
        try:
            self.run_out_the_clock()
            self.restart()
            self.run_out_the_clock()
            for op in self.operations():
                assert op.status in TERMINAL_STATUSES or (
                    op.status is S.UNKNOWN and op.escalated_at is not None
                ), op
            # At rest, only an operation handed to a person may or may not have happened: a
            # FAILED_FINAL one that nobody escalated did not.
            for key, ops in self.by_key().items():
                self.assert_effects_agree(key, ops, maybe=lambda op: op.escalated_at is not None)
        finally:
            self.run(self._stop())
            self.loop.close()
            self.tmp.cleanup()


LONG = os.environ.get("PIPECAT_ACTIONS_LONG") == "1"
"""The long variant (see the README): many more and longer random runs."""

pytestmark = pytest.mark.timeout(1800 if LONG else 300)

RuntimeModel.TestCase.settings = settings(
    max_examples=60 if LONG else 15,
    stateful_step_count=20 if LONG else 12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_runtime_against_the_reference_model = RuntimeModel.TestCase
