"""One case of the crash-point matrix: run the child to its crash point, recover, check.

1. The child (``_child.py``) runs the plan on a real runtime and is SIGKILLed at the point:
   it kills itself right after the point's write or call, or the parent kills it when it
   says it is waiting there (a request in flight, an approval pending).
2. One or two fresh runtimes open the same ledger with a clock past the dead owner's leases
   and ``recover()`` at the same moment; the provider file is the same one.
3. The recovery window: whenever the runtimes' work has settled (no ledger call in flight and
   nothing new for a few turns of the event loop: it waits on the clock, on a person or on
   nothing), the clock moves a second while anything still runs, so heartbeats, backoffs and
   probes come round, and jumps to the next deadline once only people are awaited (an
   approval that nobody gives expires there); the operator approves or rejects per the plan.
   It ends when nothing is left to do or after `WINDOW_SECS` of clock time. What happens at
   which clock time never depends on how fast the machine is; real time only bounds a hang.
4. The checker (``_checker.py``) judges the ledger and the provider.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.approvals import Approver, approve_operation, reject_operation
from pipecat_actions.clock import ManualClock
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.ledger import Operation, SqlLedger
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.scenarios.timeline import TimelineLedger
from pipecat_actions.status import TERMINAL_STATUSES, ActionStatus
from tests._file_system_of_record import FileSystemOfRecord
from tests.crash._actions import crash_actions, policy_for
from tests.crash._checker import Verdict, check, gather, settled
from tests.crash._plan import Plan, Point

S = ActionStatus
REPO_ROOT = Path(__file__).resolve().parents[2]
CLOCK_SKIP_SECS = 120.0
"""How far ahead of the dead child the recoverers' clock starts: its 30 s leases are over."""
WINDOW_SECS = 3600.0
"""The longest recovery window, in clock time."""
HANG_GUARD_SECS = 120.0
"""Bound on any real-time wait here (the child's next line, recovery, the whole window): far
beyond what a busy machine takes, it only turns a hang into a reported problem."""
SETTLE_TURNS = 20
"""Event-loop turns without a ledger call or a new clock sleeper that make the runtimes' work
settled: between two ledger calls it is a few turns of plain asyncio hops (the provider file is
written synchronously), however long a turn takes."""
LEASE_SECS = 30.0
_WAITING_FOR_PEOPLE = frozenset({S.AWAITING_APPROVAL, S.AWAITING_CONFIRMATION})
_STATUS_AT_POINT = {
    Point.AFTER_RUNNING_BEFORE_SEND: "RUNNING",
    Point.AFTER_SEND_BEFORE_ANSWER: "RUNNING",
    Point.AFTER_PROVIDER_COMMIT: "RUNNING",
    Point.AFTER_COMMITTED_BEFORE_DELIVERY: "COMMITTED",
    Point.DURING_RECONCILIATION: "UNKNOWN",
}
"""The ledger status the target must be in when the child dies there."""


@dataclass
class Case:
    """What one case did and what the checker found."""

    plan: Plan
    backend: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    crash: dict[str, Any] = field(default_factory=dict)
    left: dict[str, str] = field(default_factory=dict)
    verdict: Verdict = field(default_factory=Verdict)
    problems: list[str] = field(default_factory=list)
    stderr: str = ""

    def title(self) -> str:
        """``point / backend / seed N``: enough to run the case again."""
        return f"{self.plan.point.value} / {self.backend} / seed {self.plan.seed}"

    def report(self) -> str:
        """The failure message: the case, its plan, the crash, the problems, the child's lines."""
        lines = [
            f"crash case {self.title()}",
            f"  plan: {self.plan.describe()}",
            f"  crash: {json.dumps(self.crash)}",
            f"  left by the crash: {self.left}",
            f"  after recovery: {self.verdict.summary()}",
            *(f"  PROBLEM: {p}" for p in self.problems),
            "  child said:",
            *(f"    {json.dumps(line)}" for line in self.lines),
        ]
        if self.stderr.strip():
            lines += ["  child stderr (end):", self.stderr[-3000:]]
        return "\n".join(lines)


def backend_of(ledger_url: str) -> str:
    """``sqlite`` or ``postgres``."""
    return "sqlite" if ledger_url.startswith("sqlite") else "postgres"


async def run_case(plan: Plan, ledger_url: str, workdir: Path) -> Case:
    """Run one case end to end (see the module docstring) and return what was found."""
    case = Case(plan=plan, backend=backend_of(ledger_url))
    sor_path = workdir / "system-of-record.db"
    sor = FileSystemOfRecord(sor_path, honours_idempotency_keys=plan.dedupes)
    await _crash_child(case, ledger_url, sor_path, workdir)
    if case.problems:
        return case
    clock = ManualClock(time.time() + CLOCK_SKIP_SECS)
    # Each recoverer's ledger counts its calls in flight, for `_settle`.
    ledgers = [
        TimelineLedger(await SqlLedger.create(ledger_url, clock=clock), [])
        for _ in range(plan.recoverers)
    ]
    runtimes = [
        await ActionRuntime.create(
            policy_for(plan.dedupes),
            authorizer=AllowAll(),
            actions=crash_actions(sor),
            ledger=ledgers[index],
            clock=clock,
            owner=f"recoverer-{index}",
            lease_secs=LEASE_SECS,
            recover=False,
            recover_unsent=plan.recover_unsent,  # type: ignore[arg-type]
            schedule=ReconcileSchedule(initial_secs=1.0, max_probes=3),
        )
        for index in range(plan.recoverers)
    ]
    operator = await SqlLedger.create(ledger_url, clock=clock)
    try:
        first = runtimes[0]
        case.left = {op.operation_id: op.status.value for op in await first.ledger.list()}
        claimed = await asyncio.wait_for(
            asyncio.gather(*(runtime.recover() for runtime in runtimes)), HANG_GUARD_SECS
        )
        _check_claims(case, claimed)
        try:
            await asyncio.wait_for(
                _recovery_window(case, first, operator, clock, ledgers), HANG_GUARD_SECS
            )
        except TimeoutError:
            case.problems.append(f"the recovery window hung ({HANG_GUARD_SECS:g} s real time)")
        evidence = await gather(
            first.ledger, sor, case.lines, undelivered=await first.undelivered(), gate=plan.pipeline
        )
        case.verdict = check(evidence)
        case.problems += case.verdict.problems
    finally:
        await operator.close()
        for runtime in runtimes:
            await runtime.close(grace_secs=1.0)
        for ledger in ledgers:
            await ledger.close()
    return case


async def _crash_child(case: Case, ledger_url: str, sor_path: Path, workdir: Path) -> None:
    """Run the child until it dies at the plan's point; record its lines and the crash."""
    plan = case.plan
    stderr_path = workdir / "crash-child.stderr"
    with stderr_path.open("wb") as stderr:
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tests.crash._child",
            json.dumps(plan.to_json()),
            ledger_url,
            str(sor_path),
            cwd=REPO_ROOT,
            # Held open until the child is reaped: the child exits once it closes (an orphan
            # of a dead test never lingers), never after some time of its own.
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
        )
    assert child.stdout is not None
    try:
        while True:
            try:
                raw = await asyncio.wait_for(child.stdout.readline(), HANG_GUARD_SECS)
            except TimeoutError:
                case.problems.append(f"the child said nothing for {HANG_GUARD_SECS:g} s (hung)")
                child.send_signal(signal.SIGKILL)
                break
            if not raw:
                break  # the child is gone: it killed itself, or it failed
            line = json.loads(raw)
            case.lines.append(line)
            if line["event"] == "crash":
                case.crash = line
            elif line["event"] == "crash_point" and not case.crash:
                case.crash = line
                if plan.point is Point.AWAITING_APPROVAL and plan.variant == "approve_before":
                    await _operator_decides(ledger_url, str(line["operation_id"]), "approve")
                child.send_signal(signal.SIGKILL)
            elif line["event"] == "done" and not case.crash:
                case.problems.append("the plan ran out without reaching its crash point")
                child.send_signal(signal.SIGKILL)
    finally:
        # Never kill() a child that may be dead already: Popen polls (and reaps) it first,
        # and asyncio's watcher then reports 255 instead of the signal that killed it.
        try:
            code = await asyncio.wait_for(child.wait(), HANG_GUARD_SECS)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                child.kill()
            code = await child.wait()
        if child.stdin is not None:
            child.stdin.close()
        case.stderr = stderr_path.read_text(errors="replace")
    if code != -signal.SIGKILL:
        case.problems.append(f"the child ended with {code}, not by SIGKILL")
    if not case.crash:
        case.problems.append("the child died without reaching its crash point")
        return
    expected = _STATUS_AT_POINT.get(plan.point)
    if expected is not None and case.crash.get("status") != expected:
        case.problems.append(
            f"at {plan.point.value} the target was {case.crash.get('status')}, not {expected}"
        )
    if plan.variant == "attempt2" and case.crash.get("attempt") != 2:
        case.problems.append(f"the crash came at attempt {case.crash.get('attempt')}, not 2")


async def _operator_decides(ledger_url: str, operation_id: str, decision: str) -> None:
    """Approve or reject as ``pipecat-actions approvals`` does: on a ledger of its own."""
    ledger = await SqlLedger.create(ledger_url)
    try:
        await _decide(ledger, operation_id, decision, now=time.time())
    finally:
        await ledger.close()


async def _decide(ledger: SqlLedger, operation_id: str, decision: str, *, now: float) -> None:
    op = await ledger.get(operation_id)
    if decision == "approve":
        await approve_operation(
            ledger,
            operation_id,
            approver=Approver("operator", tenants={"default"}),
            reason="checked",
            now=now,
            args_hash=op.args_hash,
        )
    else:
        await reject_operation(
            ledger,
            operation_id,
            approver=Approver("operator", tenants={"default"}),
            reason="not justified",
            now=now,
        )


def _check_claims(case: Case, claimed: list[list[Operation]]) -> None:
    seen: dict[str, int] = {}
    for index, ops in enumerate(claimed):
        for op in ops:
            if op.operation_id in seen:
                case.problems.append(
                    f"{op.operation_id} was claimed by recoverer {seen[op.operation_id]} and "
                    f"recoverer {index}"
                )
            seen[op.operation_id] = index
    pending = {
        op_id
        for op_id, status in case.left.items()
        if S(status) not in TERMINAL_STATUSES and S(status) is not S.REJECTED
    }
    unclaimed = pending - set(seen)
    if unclaimed:
        case.problems.append(f"left non-terminal by the crash but claimed by nobody: {unclaimed}")


async def _settle(clock: ManualClock, ledgers: list[TimelineLedger]) -> None:
    """Return once no ledger call is in flight and nothing new started for `SETTLE_TURNS`."""
    seen: tuple[int, ...] | None = None
    quiet = 0
    while quiet < SETTLE_TURNS:
        busy = [ledger for ledger in ledgers if ledger.in_flight]
        if busy:
            await asyncio.gather(*(ledger.wait_idle() for ledger in busy))
            seen, quiet = None, 0
            continue
        await asyncio.sleep(0)
        now = (*(ledger.calls for ledger in ledgers), clock.sleepers)
        seen, quiet = now, (quiet + 1 if now == seen else 0)


async def _recovery_window(
    case: Case,
    runtime: ActionRuntime,
    operator: SqlLedger,
    clock: ManualClock,
    ledgers: list[TimelineLedger],
) -> None:
    plan = case.plan
    decision = {"approve_after": "approve", "reject_after": "reject"}.get(plan.variant)
    pending_decision = plan.point is Point.AWAITING_APPROVAL and decision is not None
    start = clock.now()
    stride, last_seen = 1.0, None
    while clock.now() - start < WINDOW_SECS:
        await _settle(clock, ledgers)
        ops = await runtime.ledger.list()
        seen = sorted((op.operation_id, op.event_seq) for op in ops)
        if pending_decision:
            assert decision is not None
            target = str(case.crash["operation_id"])
            await _decide(operator, target, decision, now=clock.now())
            pending_decision = False
            continue
        busy = [op for op in ops if not settled(op, ops) and op.status not in _WAITING_FOR_PEOPLE]
        waiting = [op for op in ops if op.status in _WAITING_FOR_PEOPLE]
        if not busy and not waiting:
            return
        if busy:
            # Something still runs, and has settled: it waits for a heartbeat, a backoff or a
            # probe. Move the clock a little, so they come round one after the other; while
            # nothing is written, a little more each time (a stuck operation reaches the end
            # of the window in a few dozen steps, not thousands).
            stride = 1.0 if seen != last_seen else min(stride * 2, 64.0)
            last_seen = seen
            clock.advance(stride)
        else:
            deadlines = [op.deadline_at for op in waiting if op.deadline_at is not None]
            if not deadlines:
                return
            clock.set(max(clock.now(), min(deadlines)) + 1.0)
