"""The child of the crash-point matrix: runs one crash plan on a real runtime and dies at its point.

Usage::

    python -m tests.crash._child PLAN_JSON LEDGER_URL SOR_PATH

It opens an `ActionRuntime` on ``LEDGER_URL`` with the tools of `crash_actions` on the
file-backed system of record at ``SOR_PATH``, proposes the plan's operations wave by wave
(directly, or through a real Pipecat pipeline with the `ActionResultGate` for the delivery
point), and prints JSON lines on stdout:

* ``ready``: the runtime is open (``owner``, ``pid``);
* ``admitted``: the runtime admitted and started an operation (``ref``, ``operation_id``);
* ``told``: what the application (direct) or the conversation's context (pipeline) was told
  about an operation (``ref``, ``operation_id``, ``status``);
* ``crash``: the crash point is reached; the child SIGKILLs itself right after the line;
* ``crash_point``: the crash point is reached; the child waits there for the parent's SIGKILL;
* ``done``: the plan ran out; with no crash line before it, the point was never reached.

The crash points are reached through the runtime's own seams: a `Ledger` that forwards to the
real one and kills the process right after a chosen write is durable (`CrashingLedger`), and
the action's effect, reconcile and compensate hooks (`tests.crash._actions`). Nothing in the
package knows it is being crashed.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from loguru import logger

from pipecat_actions import attach, tools_schema
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.ledger import ForwardingLedger, Ledger, SqlLedger
from pipecat_actions.ledger.records import (
    AdmitResult,
    NewOperation,
    Operation,
)
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import ActionStatus
from tests._file_system_of_record import FileSystemOfRecord
from tests.crash._actions import Faults, crash_actions, policy_for
from tests.crash._plan import OpSpec, Plan, Point

CHILD_LEASE_SECS = 30.0
HANG_GUARD_SECS = 600.0
"""Bounds on the child's own real-time waits (the pipeline's start, its run): the crash point
ends it long before, and the parent's own hang guard kills a child that goes quiet sooner."""
SESSION_ID = "call-crash"


def say(**message: Any) -> None:
    """Print one JSON line and flush it (the parent reads it before the kill lands)."""
    sys.stdout.write(json.dumps(message, default=str) + "\n")
    sys.stdout.flush()


def die(**detail: Any) -> None:
    """Say where, then SIGKILL this process: no cleanup, no flush, no finally."""
    say(event="crash", **detail)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # not reached: the signal is delivered before kill() returns


class CrashingLedger(ForwardingLedger):
    """A `Ledger` that forwards every call and dies right after the plan's chosen write.

    Args:
        inner: The real ledger.
        plan: Says which write is the crash point (an admission insert, a transition).
    """

    def __init__(self, inner: Ledger, plan: Plan) -> None:
        super().__init__(inner)
        self.plan = plan

    def _is_point(self, write: str, op: Operation) -> bool:
        """True when ``write`` (``admitted`` or the status moved to) of ``op`` is the point."""
        plan, tool = self.plan, self.plan.target_op.tool
        if op.args.get("ref") != plan.target:
            return False
        if plan.point is Point.AFTER_ADMISSION_INSERT:
            return write == "admitted" and op.tool == tool
        if plan.point is Point.AFTER_COMMITTED_BEFORE_DELIVERY:
            return write == ActionStatus.COMMITTED and op.tool == tool
        if plan.point is Point.DURING_COMPENSATION and plan.variant == "after_insert":
            return write == "admitted" and op.tool == f"{tool}.compensate"
        if plan.point is Point.DURING_COMPENSATION and plan.variant == "after_compensating":
            return write == ActionStatus.COMPENSATING and op.tool == tool
        return False

    def _after(self, write: str, op: Operation) -> None:
        if self._is_point(write, op):
            die(
                ref=self.plan.target,
                operation_id=op.operation_id,
                status=op.status.value,
                write=write,
            )

    async def admit(self, new: NewOperation) -> AdmitResult:
        """Forward; die after the target's insert when that is the point."""
        result = await super().admit(new)
        if result.created:
            self._after("admitted", result.operation)
        return result

    async def transition(
        self,
        operation_id: str,
        *,
        expected: ActionStatus,
        to: ActionStatus,
        fence: int,
        actor: str,
        detail: Mapping[str, Any] | None = None,
        changes: Mapping[str, Any] | None = None,
    ) -> Operation:
        """Forward; die after the target's move to the point's status."""
        op = await super().transition(
            operation_id,
            expected=expected,
            to=to,
            fence=fence,
            actor=actor,
            detail=detail,
            changes=changes,
        )
        self._after(to, op)
        return op


class Child:
    """Runs one plan (see the module docstring)."""

    def __init__(self, plan: Plan, runtime: ActionRuntime) -> None:
        self.plan = plan
        self.runtime = runtime
        self.session = SessionState(session_id=SESSION_ID, principal="alice")
        self.operation_ids: dict[str, str] = {}
        self.background: set[asyncio.Task[Any]] = set()

    async def propose(self, op: OpSpec) -> None:
        """Propose one operation and say what the application was told."""

        async def started(operation_id: str) -> None:
            self.operation_ids[op.ref] = operation_id
            say(event="admitted", ref=op.ref, operation_id=operation_id)

        # The application does not wait for a provider that never answers.
        wait = op.behaviour != "hang"
        told = await self.runtime.propose(
            op.tool, {"ref": op.ref}, self.session, wait=wait, on_started=started
        )
        if told.get("operation_id"):
            self.operation_ids[op.ref] = str(told["operation_id"])
        say(
            event="told",
            ref=op.ref,
            operation_id=told.get("operation_id"),
            status=told.get("status"),
        )

    async def run_direct(self) -> None:
        """Propose wave after wave; start the point's follow-up once the target's wave ends."""
        for wave in self.plan.waves():
            generation = self.session.start_generation()
            proposals = [asyncio.ensure_future(self.propose(op)) for op in wave]
            # book_later waits for the reply that proposed it to finish uninterrupted.
            await asyncio.sleep(0.02)
            self.session.settle_generation(generation)
            await asyncio.gather(*proposals)
            if any(op.ref == self.plan.target for op in wave):
                self.after_target_wave()
        await asyncio.gather(*self.background)

    def after_target_wave(self) -> None:
        """Start the compensation, or tell the parent the approval is pending."""
        target = self.operation_ids.get(self.plan.target)
        if self.plan.point is Point.DURING_COMPENSATION:
            assert target is not None
            task = asyncio.ensure_future(self.compensate(target))
            self.background.add(task)
        elif self.plan.point is Point.AWAITING_APPROVAL:
            # The parent kills the child when it reads this (after approving, for
            # approve_before); meanwhile the next waves go on.
            say(event="crash_point", ref=self.plan.target, operation_id=target)

    async def compensate(self, operation_id: str) -> None:
        """Reverse the target booking (the user changed their mind)."""
        final = await self.runtime.compensate(
            operation_id, actor="app", reason="the user changed their mind"
        )
        say(
            event="told",
            ref=f"{self.plan.target}.compensate",
            operation_id=final.operation_id,
            status=final.status.value.lower(),
        )

    async def run_pipeline(self) -> None:
        """Propose every wave as one LLM response through a real Pipecat pipeline."""
        from pipecat.frames.frames import LLMRunFrame
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.processors.aggregators.llm_response_universal import (
            LLMContextAggregatorPair,
        )
        from pipecat.tests.utils import SleepFrame, run_test

        from pipecat_actions.adapters import ActionResultGate, ActionTurnTracker
        from pipecat_actions.testing import Say, ScriptedLLM, ToolCalls
        from tests.crash._context_tap import ContextTap

        script: list[Any] = [
            ToolCalls([(op.tool, {"ref": op.ref}) for op in wave]) for wave in self.plan.waves()
        ]
        llm = ScriptedLLM([*script, Say("That is everything.")])
        attach(self.runtime, llm, self.session)
        context = LLMContext(
            messages=[{"role": "user", "content": "Please do all of these."}],
            tools=tools_schema(self.runtime),
        )
        pair = LLMContextAggregatorPair(context)
        gate = ActionResultGate(self.runtime, self.session)
        pipeline = Pipeline(
            [pair.user(), ActionTurnTracker(self.session), llm, gate, pair.assistant()]
        )
        # The pipeline runs until the crash point kills the process: it is never ended on a
        # timer the plan might outlast on a busy machine.
        await run_test(
            pipeline,
            frames_to_send=[LLMRunFrame(), SleepFrame(sleep=HANG_GUARD_SECS)],
            observers=[ContextTap(gate, say)],
            start_timeout=HANG_GUARD_SECS,
        )


async def main(plan_json: str, ledger_url: str, sor_path: str) -> None:
    """Run the plan until the crash point kills this process."""
    plan = Plan.from_json(json.loads(plan_json))
    sor = FileSystemOfRecord(Path(sor_path), honours_idempotency_keys=plan.dedupes)
    inner = await SqlLedger.create(ledger_url)
    ledger = CrashingLedger(inner, plan)

    async def hold(**detail: Any) -> None:
        say(event="crash_point", **detail)
        await asyncio.Event().wait()  # until the parent's SIGKILL

    async def status_of(operation_id: str) -> str:
        return (await inner.get(operation_id)).status.value

    faults = Faults(plan=plan, crash=die, hold=hold, status_of=status_of)
    runtime = await ActionRuntime.create(
        policy_for(plan.dedupes),
        authorizer=AllowAll(),
        actions=crash_actions(sor, faults),
        ledger=ledger,
        owner=f"child-{os.getpid()}",
        lease_secs=CHILD_LEASE_SECS,
        recover=False,
        schedule=ReconcileSchedule(initial_secs=0.02, max_probes=3),
    )
    say(event="ready", owner=runtime.owner, pid=os.getpid())
    child = Child(plan, runtime)
    if plan.pipeline:
        await child.run_pipeline()
    else:
        await child.run_direct()
    say(event="done")
    await asyncio.Event().wait()  # until the parent's SIGKILL


def exit_when_stdin_closes() -> None:
    """Exit at once when stdin reaches its end: the parent is gone (or let go of this child)."""

    def watch() -> None:
        sys.stdin.read()
        os._exit(0)

    threading.Thread(target=watch, name="stdin-watch", daemon=True).start()


if __name__ == "__main__":
    logger.remove()
    logger.add(sys.stderr, level="WARNING")
    exit_when_stdin_closes()
    asyncio.run(main(*sys.argv[1:4]))
    os._exit(0)
