"""Helpers for the execution, watchdog, cancellation, compensation, recovery and pipeline tests.

Everything here is real: the runtime, the ledger (SQLite file or PostgreSQL), Pipecat's
pipeline and aggregators, and a system of record that counts real side effects. Two systems of
record are used:

* `FakeSystemOfRecord` (in memory, fault switches) behind the ``book_table`` action of
  `Bookings`;
* `FileSystemOfRecord` (one SQLite row per committed side effect), which outlives the process
  that wrote it, for the SIGKILL tests (`file_actions`, ``_runtime_child.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import textwrap
from collections import defaultdict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipecat.frames.frames import (
    BotStoppedSpeakingFrame,
    Frame,
    InterruptionFrame,
    LLMContextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.tests.utils import run_test

from pipecat_actions import attach, tools_schema
from pipecat_actions.actions import (
    ActionContext,
    ActionDefinition,
    CancelOutcome,
    Reconciliation,
    action,
)
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.clock import Clock, ManualClock
from pipecat_actions.execution.outcomes import EffectFailed
from pipecat_actions.ledger import Ledger
from pipecat_actions.ledger.records import EventKind, Operation, OperationEvent
from pipecat_actions.policy import PolicySet, load_policy_text
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.session import SessionState
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus
from pipecat_actions.testing import (
    FakeSystemOfRecord,
    ProviderCancelled,
    ProviderRejected,
    Say,
    ScriptedLLM,
    ToolCalls,
)
from tests._file_system_of_record import FileSystemOfRecord as FileSystemOfRecord
from tests._waiting import HANG_GUARD_SECS
from tests._waiting import eventually as eventually
from tests._waiting import guarded as guarded

S = ActionStatus
T0 = ManualClock().now()
"""Where a fresh `ManualClock` starts."""
RESTAURANT = "r1"
DATE = "2030-05-01"
REPO_ROOT = Path(__file__).resolve().parents[2]


def policy(text: str) -> PolicySet:
    """Load an inline YAML policy (indentation is removed first)."""
    return load_policy_text(textwrap.dedent(text))


def booking(time: str = "21:00", party_size: int = 2, *, date: str = DATE) -> dict[str, Any]:
    """Return the arguments of a ``book_table`` call."""
    return {"restaurant_id": RESTAURANT, "date": date, "time": time, "party_size": party_size}


def new_session(session_id: str = "call-1", principal: str = "alice") -> SessionState:
    """Return a fresh conversation of ``principal``."""
    return SessionState(session_id=session_id, principal=principal)


class RecordingClock(ManualClock):
    """A `ManualClock` that remembers how long every `sleep` asked to wait."""

    def __init__(self, start: float = T0) -> None:
        super().__init__(start)
        self.requested: list[float] = []

    async def sleep(self, secs: float) -> None:
        self.requested.append(secs)
        await super().sleep(secs)


# --- the booking action on the in-memory fake ---------------------------------------------


class Bookings:
    """The ``book_table`` action on a `FakeSystemOfRecord`, with hooks that record their input.

    Provider answers are mapped the way an application should: a refusal or an abort (nothing
    committed) is `EffectFailed`; unavailability and timeouts keep their built-in classes
    (``ConnectionRefusedError`` = not sent, ``TimeoutError`` = outcome unknown).

    Attributes:
        sor: The system of record.
        ledger: Set by tests that let the hooks read the ledger (the write-ahead check, the
            compensate hook's look-up of the operation it reverses).
        seen: The contexts each hook was called with, by hook name.
        status_at_send: The ledger status of the operation each time the effect was about
            to call the provider.
        client_gives_up: When set, the effect stops waiting for the provider once the test
            sets this event, as a client-side timeout would (``TimeoutError``: the outcome is
            unknown; the request the effect stops waiting for is abandoned).
    """

    def __init__(self, sor: FakeSystemOfRecord) -> None:
        self.sor = sor
        self.ledger: Ledger | None = None
        self.seen: dict[str, list[ActionContext]] = defaultdict(list)
        self.status_at_send: list[tuple[ActionStatus, float | None]] = []
        self.client_gives_up: asyncio.Event | None = None

    def action(
        self,
        *,
        name: str = "book_table",
        reconcile: str | None = "lookup",
        cancel: bool = False,
        snapshot: bool = False,
        compensate: bool = False,
    ) -> ActionDefinition:
        """Return the action, with the hooks asked for.

        Args:
            name: The tool name.
            reconcile: ``lookup`` (the key is found or not: committed / not_found),
                ``patient`` (committed when found, else pending: the provider cannot tell
                yet) or None (no hook).
            cancel: Add a cancel hook that asks the provider's ``cancel_pending``.
            snapshot: Add a snapshot hook (the before-state of the slot).
            compensate: Add a compensate hook that cancels the booking.
        """
        hooks: dict[str, Any] = {
            "lookup": self.find,
            "patient": self.find_or_wait,
            None: None,
        }
        return action(
            name=name,
            description="Book a table at a restaurant.",
            reconcile=hooks[reconcile],
            cancel=self.cancel_request if cancel else None,
            snapshot=self.snapshot if snapshot else None,
            compensate=self.undo if compensate else None,
        )(self.book)

    async def book(
        self, ctx: ActionContext, restaurant_id: str, date: str, time: str, party_size: int
    ) -> dict[str, Any]:
        """Book a table and return its booking id."""
        self.seen["effect"].append(ctx)
        if self.ledger is not None:
            op = await self.ledger.get(ctx.operation_id)
            self.status_at_send.append((op.status, op.sent_at))
        request = self.sor.book(
            restaurant_id,
            date,
            time,
            party_size,
            ctx.principal,
            idempotency_key=ctx.idempotency_key,
        )
        try:
            if self.client_gives_up is None:
                made = await request
            else:
                made = await self._unless_the_client_gives_up(request, self.client_gives_up)
        except (ProviderRejected, ProviderCancelled) as exc:
            raise EffectFailed(str(exc)) from exc
        return {"booking_id": made.booking_id, "time": made.time}

    @staticmethod
    async def _unless_the_client_gives_up(request: Awaitable[Any], gives_up: asyncio.Event) -> Any:
        """Await ``request`` until ``gives_up`` is set; then abandon it and raise TimeoutError."""
        answer = asyncio.ensure_future(request)
        giving_up = asyncio.ensure_future(gives_up.wait())
        try:
            await asyncio.wait({answer, giving_up}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            giving_up.cancel()
            if not answer.done():
                answer.cancel()
                await asyncio.gather(answer, return_exceptions=True)
        if answer.cancelled():
            raise TimeoutError("the client gave up waiting for the provider")
        return answer.result()

    async def find(self, ctx: ActionContext) -> Reconciliation:
        """Ask the provider by idempotency key: committed or not found."""
        self.seen["reconcile"].append(ctx)
        found = self.sor.find_by_idempotency_key(ctx.idempotency_key)
        if found is None:
            return Reconciliation.not_found()
        return Reconciliation.committed({"booking_id": found.booking_id, "time": found.time})

    async def find_or_wait(self, ctx: ActionContext) -> Reconciliation:
        """Ask the provider by idempotency key: committed, or pending while it has no trace."""
        self.seen["reconcile"].append(ctx)
        found = self.sor.find_by_idempotency_key(ctx.idempotency_key)
        if found is None:
            return Reconciliation.pending()
        return Reconciliation.committed({"booking_id": found.booking_id, "time": found.time})

    async def cancel_request(self, ctx: ActionContext) -> CancelOutcome:
        """Ask the provider to abort the request sent with the operation's key."""
        self.seen["cancel"].append(ctx)
        return CancelOutcome(await self.sor.cancel_pending(ctx.idempotency_key))

    async def snapshot(self, ctx: ActionContext) -> dict[str, Any]:
        """Capture the slot before the booking: how many confirmed bookings it holds."""
        self.seen["snapshot"].append(ctx)
        args = ctx.args
        taken = [
            b.booking_id
            for b in self.sor.bookings(args["restaurant_id"], status="confirmed")
            if (b.date, b.time) == (args["date"], args["time"])
        ]
        return {"slot": f"{args['date']} {args['time']}", "confirmed_before": taken}

    async def undo(self, ctx: ActionContext) -> dict[str, Any]:
        """Cancel the booking made by the operation this compensation reverses."""
        self.seen["compensate"].append(ctx)
        # The runtime hands the hook the operation it reverses (its result, before-state).
        original = ctx.operation
        assert original is not None
        assert original.result is not None
        try:
            cancelled = await self.sor.cancel(
                original.result["booking_id"], idempotency_key=ctx.idempotency_key
            )
        except (ProviderRejected, ProviderCancelled) as exc:
            raise EffectFailed(str(exc)) from exc
        return {"booking_id": cancelled.booking_id, "status": cancelled.status}


# --- runtime, ledger and polling helpers --------------------------------------------------


@contextlib.asynccontextmanager
async def running(
    policy_text: str,
    actions: Iterable[ActionDefinition],
    *,
    ledger_url: str,
    clock: Clock | None = None,
    **options: Any,
) -> AsyncIterator[ActionRuntime]:
    """Create an `ActionRuntime` on ``ledger_url`` and close it afterwards."""
    runtime = await ActionRuntime.create(
        policy(policy_text),
        authorizer=AllowAll(),
        actions=actions,
        ledger_url=ledger_url,
        clock=clock,
        **options,
    )
    try:
        yield runtime
    finally:
        await runtime.close()


async def status_of(runtime: ActionRuntime, operation_id: str) -> ActionStatus:
    """Return the ledger status of an operation."""
    return (await runtime.ledger.get(operation_id)).status


async def reaches(runtime: ActionRuntime, operation_id: str, *statuses: ActionStatus) -> Operation:
    """Wait until the operation is in one of ``statuses`` (only a hang guard limits it)."""
    seen: list[ActionStatus] = []

    async def check() -> bool:
        seen[:] = [await status_of(runtime, operation_id)]
        return seen[0] in statuses

    names = ", ".join(status.value for status in statuses)
    await eventually(check, what=lambda: f"{operation_id} to reach {names} (it is {seen[0].value})")
    return await runtime.ledger.get(operation_id)


async def only_operation(runtime: ActionRuntime, tool: str = "book_table") -> Operation:
    """Return the one (non-refused) operation of ``tool`` in the ledger."""
    ops = [
        op for op in await runtime.ledger.list() if op.tool == tool and op.status is not S.REJECTED
    ]
    assert len(ops) == 1, ops
    return ops[0]


def transitions(trail: Sequence[OperationEvent]) -> list[ActionStatus]:
    """The statuses an operation went through after its creation events, in order."""
    return [e.to_status for e in trail if e.kind is EventKind.TRANSITION]


def every_status(trail: Sequence[OperationEvent]) -> set[ActionStatus]:
    """Every status the audit trail ever put the operation in."""
    return {e.to_status for e in trail}


def annotations(trail: Sequence[OperationEvent]) -> list[dict[str, Any]]:
    """The details of the annotation events (escalation, late answers, cancel answers)."""
    return [e.detail or {} for e in trail if e.kind is EventKind.ANNOTATION]


async def noted(runtime: ActionRuntime, operation_id: str, key: str) -> bool:
    """Whether an annotation of the operation's audit trail records ``key``."""
    trail = await runtime.ledger.events(operation_id)
    return any(key in detail for detail in annotations(trail))


def is_settled(op: Operation) -> bool:
    """True when nothing is left to do: a terminal status, or UNKNOWN handed to a person."""
    return op.status in TERMINAL_STATUSES or (
        op.status is S.UNKNOWN and op.escalated_at is not None
    )


# --- driving a real Pipecat pipeline -------------------------------------------------------


class TurnTap(FrameProcessor):
    """Keeps a `SessionState` in step with the conversation, between user aggregator and LLM.

    An inference starts a generation; an `InterruptionFrame` interrupts it; a
    `BotStoppedSpeakingFrame` settles it (the bot finished its reply uninterrupted).
    """

    def __init__(self, session: SessionState) -> None:
        super().__init__()
        self.session = session

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame) and direction is FrameDirection.DOWNSTREAM:
            self.session.start_generation()
        elif isinstance(frame, InterruptionFrame):
            self.session.interrupt()
        elif isinstance(frame, BotStoppedSpeakingFrame):
            self.session.settle_generation()
        await self.push_frame(frame, direction)


async def converse(
    runtime: ActionRuntime,
    session: SessionState,
    script: Sequence[Say | ToolCalls],
    frames: Sequence[Frame],
) -> list[dict[str, Any]]:
    """Run one conversation through a real pipeline; return the context's messages."""
    context = LLMContext(
        messages=[{"role": "user", "content": "A table for two at nine, please."}],
        tools=tools_schema(runtime),
    )
    pair = LLMContextAggregatorPair(context)
    llm = ScriptedLLM(script)
    attach(runtime, llm, session)
    await run_test(
        Pipeline([pair.user(), TurnTap(session), llm, pair.assistant()]),
        frames_to_send=list(frames),
    )
    return [dict(m) for m in context.get_messages()]


def tool_results(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Return what the context says each tool call answered, by tool_call_id (JSON decoded)."""
    results: dict[str, Any] = {}
    for message in messages:
        if message.get("role") != "tool":
            continue
        content = message.get("content")
        try:
            results[message["tool_call_id"]] = json.loads(content)
        except (TypeError, ValueError):
            results[message["tool_call_id"]] = content
    return results


# --- a system of record that survives a SIGKILL -------------------------------------------


RECOVERY_POLICY = """
    version: 1
    defaults:
      reconciliation: {commit_horizon_secs: 0}
    tools:
      book_slot:
        kind: mutation
        deadline_secs: 600
      book_slot_later:
        kind: mutation
        admit_when: turn_confirmed
        deadline_secs: 600
      send_note:
        kind: mutation
        deadline_secs: 600
"""
"""book_slot and book_slot_later can be reconciled by key; send_note has no reconcile hook.

The file system of record commits inside the effect's own call (horizon 0): once the process
that ran an effect is gone, no trace of it means it did not happen."""

RECOVERY_PLAN: list[tuple[str, dict[str, str]]] = [
    ("book_slot", {"slot": "a1"}),
    ("book_slot", {"slot": "a2"}),
    ("book_slot", {"slot": "b1"}),
    ("book_slot", {"slot": "b2"}),
    ("send_note", {"text": "n1"}),
    ("book_slot_later", {"slot": "c1"}),
]
"""What the child proposes; `RECOVERY_HOLDS` says where each effect stops until the kill."""

RECOVERY_HOLDS = {"a1": "after", "a2": "after", "b1": "before", "b2": "before", "n1": "after"}
"""``after``: committed, answer never returned; ``before``: sent, never committed."""

HOLD_SECS = 3600.0


def file_actions(
    sor: FileSystemOfRecord,
    *,
    holds: Mapping[str, str] | None = None,
    on_event: Callable[..., None] | None = None,
) -> list[ActionDefinition]:
    """The actions of `RECOVERY_POLICY` on a `FileSystemOfRecord`.

    Args:
        sor: Where side effects are committed.
        holds: Per slot or note text, where the effect waits (see `RECOVERY_HOLDS`); none in
            the runtime that recovers.
        on_event: Told ``effect=...`` when an effect reaches its hold.
    """
    holds = holds or {}
    tell = on_event or (lambda **_: None)

    async def effect(ctx: ActionContext, name: str, kind: str) -> dict[str, Any]:
        hold = holds.get(name)
        if hold == "before":
            tell(event="effect", name=name, phase="sent", operation_id=ctx.operation_id)
            await asyncio.sleep(HOLD_SECS)
        row = sor.commit(ctx.idempotency_key, kind, {"name": name})
        if hold == "after":
            tell(event="effect", name=name, phase="committed", operation_id=ctx.operation_id)
            await asyncio.sleep(HOLD_SECS)
        return {"row": row}

    async def book_slot(ctx: ActionContext, slot: str) -> dict[str, Any]:
        """Book a slot."""
        return await effect(ctx, slot, "book")

    async def send_note(ctx: ActionContext, text: str) -> dict[str, Any]:
        """Send a note; it cannot be looked up afterwards."""
        return await effect(ctx, text, "note")

    async def find_row(ctx: ActionContext) -> Reconciliation:
        row = sor.find(ctx.idempotency_key)
        return Reconciliation.not_found() if row is None else Reconciliation.committed({"row": row})

    return [
        action(name="book_slot", reconcile=find_row)(book_slot),
        action(name="book_slot_later", reconcile=find_row)(book_slot),
        action(name="send_note")(send_note),
    ]


@dataclass
class RuntimeChild:
    """A ``_runtime_child.py`` process that talks JSON lines on stdout."""

    process: asyncio.subprocess.Process
    stderr_path: Path

    def stderr(self) -> str:
        """What the child wrote on stderr so far, for failure messages."""
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return "<no stderr>"

    async def read(self) -> dict[str, Any]:
        """Return the child's next JSON line; fail when it ends or stays silent (a hang)."""
        assert self.process.stdout is not None
        try:
            line = await asyncio.wait_for(self.process.stdout.readline(), HANG_GUARD_SECS)
        except TimeoutError:
            raise AssertionError(
                f"the child said nothing for {HANG_GUARD_SECS:g} s:\n{self.stderr()}"
            ) from None
        if not line:
            raise AssertionError(f"the child ended early:\n{self.stderr()}")
        message: dict[str, Any] = json.loads(line)
        return message


@contextlib.asynccontextmanager
async def runtime_child(
    ledger_url: str,
    sor_path: Path,
    workdir: Path,
    *,
    lease_secs: float | None = None,
    owner: str | None = None,
) -> AsyncIterator[RuntimeChild]:
    """Start ``_runtime_child.py``; it is killed and reaped on exit whatever happens.

    Args:
        ledger_url: The ledger it runs on.
        sor_path: The file system of record.
        workdir: Where its stderr is kept.
        lease_secs: Its lease (default: the child's short one).
        owner: Its owner name (default: one of its pid).
    """
    stderr_path = workdir / "runtime-child.stderr"
    extra = [str(lease_secs) if lease_secs is not None else "", owner or ""]
    with stderr_path.open("wb") as stderr:
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.runtime._runtime_child",
            ledger_url,
            str(sor_path),
            *extra,
            cwd=REPO_ROOT,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    child = RuntimeChild(process, stderr_path)
    try:
        yield child
    finally:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
        await process.wait()


async def gather_all(*awaitables: Awaitable[Any]) -> list[Any]:
    """Await every awaitable together (only a hang guard limits the wait)."""
    return list(await guarded(asyncio.gather(*awaitables), what=f"{len(awaitables)} awaitables"))
