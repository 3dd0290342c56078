"""`Proposals`: one proposed tool call, from admission to the tool result the model reads.

A read is admitted and run in the caller's task. A mutation is admitted in a task of its own
that runs to its end even when the caller is cancelled (a barge-in), then started by the
`Runner`; a duplicate joins the operation it repeats (waiting for it here, or through the ledger
when another process runs it); a refusal is answered at once. Whatever the ledger does, the
answer is truthful: a ledger failure is told as such, never as Pipecat's generic "failed".
"""

from __future__ import annotations

__all__ = ["Proposals"]

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any

from loguru import logger

from pipecat_actions._printable import bounded
from pipecat_actions._shelter import Shelter
from pipecat_actions.actions import Binding
from pipecat_actions.admission.admitter import Admitter
from pipecat_actions.admission.decisions import Admission, Joined, ReadAdmission, Refusal, Shared
from pipecat_actions.errors import LedgerError
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import ToolKind
from pipecat_actions.results import reconcilable, refusal_result, render, render_operation
from pipecat_actions.runtime._joins import JoinNotes, SharedWaits
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime._runner import Runner
from pipecat_actions.runtime.decisions import Decisions
from pipecat_actions.runtime.reads import Reads
from pipecat_actions.runtime.supersession import Supersession
from pipecat_actions.session import SessionState
from pipecat_actions.status import AWAITING_PERSON_STATUSES, IN_FLIGHT_STATUSES, ActionStatus

S = ActionStatus

UNKNOWN_TOOL_LABEL = "(unknown tool)"
"""The tool label of the metrics and spans of calls of a tool the runtime does not have."""

_ADOPTABLE = frozenset({*IN_FLIGHT_STATUSES, S.UNKNOWN})
"""What a joined call takes over from a gone owner: whatever its owner still had to settle."""

_Started = dict[str, Any] | ReadAdmission | Shared | Joined | Tracked
"""What admitting a mutation leads to: an answer, a read or shared answer, a join, or a run."""


class Proposals:
    """Admits proposed calls and answers each with a truthful tool result.

    Args:
        ledger: Read for the state of an operation a caller does not wait for.
        bindings: The registered actions, by tool name.
        admitter: Decides about each call.
        telemetry: Scopes each admission.
        operations: The registry of the operations this process owns.
        runner: Starts admitted operations.
        reads: Runs admitted reads.
        decisions: Applies ``on_interruption`` when the caller is cancelled.
        join_notes: Records the calls that joined an operation.
        elsewhere: Waits for operations another process runs.
        supersession: Says which later request replaced an operation.
        adopt: Takes over an operation whose owner is gone (`Recovery.adopt`).
    """

    def __init__(
        self,
        *,
        ledger: Ledger,
        bindings: Mapping[str, Binding],
        admitter: Admitter,
        telemetry: Telemetry,
        operations: Operations,
        runner: Runner,
        reads: Reads,
        decisions: Decisions,
        join_notes: JoinNotes,
        elsewhere: SharedWaits,
        supersession: Supersession,
        adopt: Callable[[Operation], Awaitable[Tracked | None]],
    ) -> None:
        self._ledger = ledger
        self._bindings = bindings
        self._admitter = admitter
        self._telemetry = telemetry
        self._operations = operations
        self._runner = runner
        self._reads = reads
        self._decisions = decisions
        self._join_notes = join_notes
        self._elsewhere = elsewhere
        self._supersession = supersession
        self._adopt = adopt
        self._admitting: dict[str, asyncio.Future[_Started]] = {}
        """tool_call_id → its admission, while it runs (it outlives a cancelled caller)."""
        self._tasks: set[asyncio.Task[None]] = set()
        """The tasks of admissions under way (`_admit_and_run`)."""

    def admitting(self, tool_call_id: str) -> bool:
        """Whether an admission of ``tool_call_id`` is under way."""
        return tool_call_id in self._admitting

    async def admitted_as(self, tool_call_id: str) -> str | None:
        """The operation ``tool_call_id`` became, once an admission under way for it ends.

        A barge-in can cancel the wait while the call is still being admitted; admission runs
        on to its end, and what it made of the call is what closes it truthfully. None: the
        call became no operation (refused, a read, or never proposed here).
        """
        admitting = self._admitting.get(tool_call_id)
        if admitting is not None:
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await asyncio.shield(admitting)
        return self._operations.operation_for_call(tool_call_id)

    async def propose(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        *,
        tool_call_id: str | None,
        wait: bool,
        on_started: Callable[[str], Awaitable[None]] | None,
    ) -> dict[str, Any]:
        """Admit a proposed call and answer it; see `ActionRuntime.propose`."""
        # A tool name the model made up is the model's text: logged bounded and escaped.
        named = tool if tool in self._bindings else bounded(tool, 64)
        with logger.contextualize(
            session_id=session.session_id,
            turn_id=str(session.user_turn),
            generation=session.generation,
            tool_call_id=tool_call_id,
            tool=named,
        ):
            try:
                result = await self._propose(
                    tool, arguments, session, tool_call_id, wait=wait, on_started=on_started
                )
            except LedgerError as exc:
                result = self._ledger_failed(named, tool_call_id, exc)
            logger.bind(operation_id=result.get("operation_id")).debug(
                "tool call {} of {}: {}", tool_call_id, named, result.get("status")
            )
            return result

    def _ledger_failed(
        self, tool: str, tool_call_id: str | None, exc: LedgerError
    ) -> dict[str, Any]:
        """The truthful answer to a call whose ledger work failed (never Pipecat's "failed").

        With no operation known for the call, nothing was started by it; a repeat of the same
        intent is safe (it has the same idempotency key, so it joins the operation if the
        insert did commit after all). With one, it exists and its outcome is not known here.
        """
        operation_id = self._operations.operation_for_call(tool_call_id) if tool_call_id else None
        logger.bind(operation_id=operation_id).warning(
            "tool call {} of {}: the ledger failed: {}", tool_call_id, tool, exc
        )
        if operation_id is None:
            if exc.retryable:
                return refusal_result(
                    f"{tool} could not be recorded because the action ledger is unavailable, "
                    "so this call did not carry it out. It is safe to ask again in a moment.",
                    code="ledger_unavailable",
                )
            return refusal_result(
                f"{tool} could not be recorded (the action ledger refused it), so this call "
                "did not carry it out.",
                code="ledger_error",
            )
        return render(
            S.UNKNOWN,
            tool=tool,
            operation_id=operation_id,
            reconcilable=reconcilable(self._bindings, tool),
            note="Its record could not be read just now; the outcome will be told when known.",
        )

    async def _propose(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        tool_call_id: str | None,
        *,
        wait: bool,
        on_started: Callable[[str], Awaitable[None]] | None,
    ) -> dict[str, Any]:
        binding = self._bindings.get(tool)
        if binding is not None and binding.policy.kind is ToolKind.READ:
            # A read writes nothing before its effect, so it is admitted and run in the
            # caller's own task: no hand-off to another task on the hot path.
            with self._telemetry.admission(tool, session, tool_call_id) as scope:
                read = await self._admitter.admit(
                    tool, arguments, session, tool_call_id=tool_call_id
                )
                scope.decided(read)
            if isinstance(read, ReadAdmission):
                return await self._reads.read(tool, read, session, tool_call_id)
            if isinstance(read, Refusal):
                return read.result
            if isinstance(read, Shared):
                return await self._reads.shared(read)
        # Admission runs to its end even when the caller is cancelled meanwhile (a barge-in):
        # an operation it inserted must be started and bounded, never left behind. Its task
        # then runs the operation itself (one task for both, `_admit_and_run`).
        loop = asyncio.get_running_loop()
        admitting: asyncio.Future[_Started] = loop.create_future()
        task = loop.create_task(
            self._admit_and_run(tool, arguments, session, tool_call_id, admitting)
        )
        self._tasks.add(task)  # until it answers `admitting` (then `Operations.own` keeps it)
        if tool_call_id:
            self._admitting[tool_call_id] = admitting
            admitting.add_done_callback(lambda _: self._admitting.pop(tool_call_id, None))
        try:
            admitted = await asyncio.shield(admitting)
        except asyncio.CancelledError:
            admitting.add_done_callback(self._interrupted_during_admission)
            admitting.add_done_callback(functools.partial(self._unanswered, session))
            raise
        if isinstance(admitted, dict):
            return admitted
        if isinstance(admitted, ReadAdmission):
            return await self._reads.read(tool, admitted, session, tool_call_id)
        if isinstance(admitted, Shared):
            return await self._reads.shared(admitted)
        if isinstance(admitted, Joined):
            return await self._joined(admitted, session, wait=wait)
        tracked = admitted
        if on_started is not None:
            await on_started(tracked.operation_id)
        if not wait:
            return self._render(await self._ledger.get(tracked.operation_id))
        try:
            final = await asyncio.shield(tracked.done)
        except asyncio.CancelledError:
            self._operations.spawn(self._decisions.interrupted(tracked.operation_id))
            raise
        return await self._told(self._render(final), final, session)

    async def _admit_and_run(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        tool_call_id: str | None,
        admitting: asyncio.Future[_Started],
    ) -> None:
        """Admit a call, answer ``admitting``, then run the operation admitted, if any.

        No caller can cancel this task (they wait for ``admitting``, shielded); the runtime
        stops it through its `Shelter` once it runs an operation, so that its ledger writes
        need no task or shield of their own.
        """
        shelter = Shelter.enter()
        try:
            try:
                started, execution = await self._admit_and_start(
                    tool, arguments, session, tool_call_id
                )
            except asyncio.CancelledError:
                admitting.cancel()
                raise
            except BaseException as exc:
                admitting.set_exception(exc)
                return
            admitting.set_result(started)
        finally:
            self._tasks.discard(shelter.task)
        if execution is None:
            return
        self._operations.own(shelter)
        assert isinstance(started, Tracked)
        with logger.contextualize(operation_id=started.operation_id):
            await execution

    async def _admit_and_start(
        self,
        tool: str,
        arguments: Mapping[str, Any] | str,
        session: SessionState,
        tool_call_id: str | None,
    ) -> tuple[_Started, Coroutine[Any, Any, None] | None]:
        # Metrics and spans are per tool: a name the model made up is counted under one label,
        # never kept (one series per made-up name would grow without end).
        label = tool if tool in self._bindings else UNKNOWN_TOOL_LABEL
        with self._telemetry.admission(label, session, tool_call_id) as scope:
            admitted = await self._admitter.admit(
                tool, arguments, session, tool_call_id=tool_call_id
            )
            scope.decided(admitted)
        if isinstance(admitted, Refusal):
            return admitted.result, None
        if isinstance(admitted, Joined):
            # Recorded so that an operator can tell a repeated request from a retry of ours;
            # in batches, off the caller's path (a burst of duplicates is one write or a few).
            self._join_notes.note(
                admitted.operation.operation_id,
                tool_call_id=tool_call_id,
                turn_id=str(session.user_turn),
                session_id=session.session_id,
            )
            if tool_call_id:
                self._operations.note_call(tool_call_id, admitted.operation.operation_id)
            # Until this call is answered (`_joined`), its outcome is told there, in place.
            self._operations.begin_answer(session.session_id, admitted.operation.operation_id)
        if not isinstance(admitted, Admission):
            return admitted, None
        if tool_call_id:
            self._operations.note_call(tool_call_id, admitted.operation.operation_id)
        tracked, execution = self._runner.prepare(admitted, session)
        if admitted.operation.status in AWAITING_PERSON_STATUSES:
            # Nothing runs until a person answers (`prepare` returns no execution for it).
            return self._asking(self._render(admitted.operation), admitted.operation), None
        return tracked, execution

    async def _joined(self, joined: Joined, session: SessionState, *, wait: bool) -> dict[str, Any]:
        """The answer of a call admission joined to an operation: the operation's outcome.

        From admission on (`_admit_and_start`), the session's delivery leaves that outcome to
        this answer, which tells it in place; a late telling would say it a second time.
        """
        op = joined.operation
        session_id, operation_id = session.session_id, op.operation_id
        try:
            tracked = self._operations.get(operation_id)
            if tracked is None and op.status in _ADOPTABLE:
                # Run by another process: if that process is gone, its operation would wait
                # for its lease. It is taken over (and reconciled) now instead.
                tracked = await self._adopt(op)
            if wait and op.status in IN_FLIGHT_STATUSES:
                if tracked is not None:
                    op = await asyncio.shield(tracked.done)
                else:
                    op = await self._elsewhere.wait(op)
            note = "This request was already made; this is its outcome."
            result = self._asking(self._render(op, note=note), op)
            return await self._told(result, op, session) if wait else result
        finally:
            # Answered in place (`_told` noted it), or stopped: later outcomes are told late.
            self._operations.end_answer(session_id, operation_id)

    async def _told(
        self, result: dict[str, Any], op: Operation, session: SessionState
    ) -> dict[str, Any]:
        """A call's final result, saying whether a later user turn superseded ``op``.

        Decided here, in the handler's task, from the operation at hand: never in the
        pipeline's frame path, and with no read of the operation again. The delivery record
        is made from ``op`` too, when the result reaches the conversation.
        """
        self._operations.note_answered(op, session.session_id)
        return await self._supersession.note(result, op)

    def _render(self, op: Operation, *, note: str | None = None) -> dict[str, Any]:
        """The tool result of ``op`` (an UNKNOWN one says whether a hook or a person checks)."""
        return render_operation(op, reconcilable=reconcilable(self._bindings, op.tool), note=note)

    def _asking(self, result: dict[str, Any], op: Operation) -> dict[str, Any]:
        """Add the policy's ``confirmation.prompt``, filled in, to a needs-confirmation result."""
        binding = self._bindings.get(op.tool)
        prompt = binding.policy.confirmation.prompt if binding else None
        if op.status is not S.AWAITING_CONFIRMATION or not prompt:
            return result
        args = op.args if isinstance(op.args, dict) else {}
        try:
            # Values are inserted as text, never parsed again: braces in them stay as they are.
            question = prompt.format_map({k: str(v) for k, v in args.items()})
        except (KeyError, IndexError, ValueError):
            return result  # the validator checked the placeholders; arguments may be missing
        return {**result, "ask": question, "message": f"{result['message']} Ask: {question}"}

    def _unanswered(self, session: SessionState, admitting: asyncio.Future[_Started]) -> None:
        """A call stopped during admission that joined an operation will never answer it."""
        if admitting.cancelled() or admitting.exception() is not None:
            return
        joined = admitting.result()
        if isinstance(joined, Joined):
            self._operations.end_answer(session.session_id, joined.operation.operation_id)

    def _interrupted_during_admission(self, admitting: asyncio.Future[_Started]) -> None:
        if admitting.cancelled() or admitting.exception() is not None:
            return
        started = admitting.result()
        if isinstance(started, Tracked):
            self._operations.spawn(self._decisions.interrupted(started.operation_id))
