"""How an `ActionRuntime` is put together: every part, built once with its collaborators.

`build_parts` is the only place that knows the wiring; each part gets what it uses, passed in,
and shares state with the others only through the collaborators named here (the operation
registry, the ledger, the executor, the clock).
"""

from __future__ import annotations

__all__ = ["RuntimeParts", "build_parts"]

from dataclasses import dataclass

from pipecat_actions.actions import Binding
from pipecat_actions.admission.admitter import Admitter
from pipecat_actions.admission.authorization import Authorizer
from pipecat_actions.admission.limits import Limiter
from pipecat_actions.clock import Clock
from pipecat_actions.durable.handoff import hands_off
from pipecat_actions.execution.executor import Executor, ReconcileSchedule
from pipecat_actions.execution.expiry import Expiry
from pipecat_actions.execution.tracked import Tracked
from pipecat_actions.execution.watchdog import Watchdog
from pipecat_actions.ledger import Ledger, Operation
from pipecat_actions.observability.ledger import ObservedLedger
from pipecat_actions.observability.telemetry import Telemetry
from pipecat_actions.policy import PolicySet
from pipecat_actions.runtime._joins import JoinNotes, SharedWaits
from pipecat_actions.runtime._operations import Operations
from pipecat_actions.runtime._runner import Runner
from pipecat_actions.runtime.automatic_compensation import AutomaticCompensation
from pipecat_actions.runtime.compensation import Compensator
from pipecat_actions.runtime.decisions import Decisions
from pipecat_actions.runtime.deliveries import Deliveries
from pipecat_actions.runtime.model_cancels import ModelCancels
from pipecat_actions.runtime.progress import Progress
from pipecat_actions.runtime.proposals import Proposals
from pipecat_actions.runtime.reads import Reads
from pipecat_actions.runtime.recovery import RecoverUnsent, Recovery
from pipecat_actions.runtime.supersession import Supersession


@dataclass(frozen=True, eq=False)
class RuntimeParts:
    """The collaborators and parts of one runtime (see `build_parts`)."""

    policy: PolicySet
    ledger: Ledger
    """The ledger as the runtime writes it: every write passes the telemetry on its way."""
    telemetry: Telemetry
    clock: Clock
    owner: str
    actor: str
    lease_secs: float
    bindings: dict[str, Binding]
    """The registered actions; `ActionRuntime.register` adds to it, the parts read it."""
    limiter: Limiter
    executor: Executor
    watchdog: Watchdog
    admitter: Admitter
    operations: Operations
    runner: Runner
    reads: Reads
    decisions: Decisions
    compensator: Compensator
    recovery: Recovery
    proposals: Proposals
    join_notes: JoinNotes
    elsewhere: SharedWaits
    supersession: Supersession
    deliveries: Deliveries
    progress: Progress
    model_cancels: ModelCancels


def build_parts(
    *,
    policy: PolicySet,
    ledger: Ledger,
    authorizer: Authorizer,
    clock: Clock,
    owner: str,
    lease_secs: float,
    recover_unsent: RecoverUnsent,
    schedule: ReconcileSchedule | None,
) -> RuntimeParts:
    """Build every part of a runtime around ``ledger`` (see `ActionRuntime.create`)."""
    telemetry = Telemetry()
    # Every write of this process passes the telemetry on its way to the ledger.
    observed = ObservedLedger(ledger, telemetry)
    actor = f"runtime:{owner}"
    bindings: dict[str, Binding] = {}
    limiter = Limiter(clock.now)

    def told_late(tracked: Tracked, final: Operation) -> None:
        # A late answer settles an operation already finished as UNKNOWN, or an outcome is
        # known before the ledger could take it: its waiters and listeners hear the truth
        # now. The registry is built below.
        operations.finish(tracked, final)

    executor = Executor(
        observed,
        clock,
        authorizer,
        actor=actor,
        schedule=schedule,
        telemetry=telemetry,
        on_late_outcome=told_late,
        on_unrecorded=told_late,
        on_unknown=told_late,
        # Effects report progress to the part built below, with the registry it needs.
        reporter=lambda op, tracked: progress.reporter(op, tracked),
    )
    expiry: Expiry

    async def on_expiry(operation_id: str) -> None:
        # The watchdog, the registry and the expiry rule need one another; the rule is built
        # below, before the watchdog is started.
        await expiry.expire(operation_id)

    watchdog = Watchdog(clock, on_expiry)
    operations = Operations(observed, watchdog, actor=actor)
    progress = Progress(ledger=observed, operations=operations, now=clock.now, actor=actor)
    reads = Reads(
        ledger=observed,
        clock=clock,
        operations=operations,
        limiter=limiter,
        watchdog=watchdog,
        telemetry=telemetry,
        rand=executor.rand,
        actor=actor,
    )
    expiry = Expiry(
        observed,
        operations,
        now=clock.now,
        stop_read=reads.stop,
        reconcile=executor.reconcile,
    )
    # Built before the runner: a durable operation's outcome is awaited there (its worker's).
    elsewhere = SharedWaits(observed, clock, spawn=operations.spawn)
    runner = Runner(
        ledger=observed,
        policy=policy,
        operations=operations,
        executor=executor,
        limiter=limiter,
        watchdog=watchdog,
        hands_off=hands_off(ledger),
        # Its worker's progress reports are told here too, as they reach the ledger.
        observe=lambda op: elsewhere.wait(op, until_settled=True, follow=progress.follower(op)),
    )
    decisions = Decisions(
        ledger=observed,
        clock=clock,
        operations=operations,
        runner=runner,
        watchdog=watchdog,
        actor=actor,
    )
    admitter = Admitter(
        bindings=bindings,
        ledger=observed,
        clock=clock,
        authorizer=authorizer,
        limiter=limiter,
        owner=owner,
        lease_secs=lease_secs,
        cancel=lambda op: decisions.cancel(op.operation_id, reason="replaced by a newer request"),
    )
    compensator = Compensator(
        ledger=observed,
        clock=clock,
        bindings=bindings,
        operations=operations,
        runner=runner,
        watchdog=watchdog,
        owner=owner,
        lease_secs=lease_secs,
        actor=actor,
    )
    recovery = Recovery(
        ledger=observed,
        clock=clock,
        authorizer=authorizer,
        bindings=bindings,
        operations=operations,
        runner=runner,
        executor=executor,
        compensator=compensator,
        watchdog=watchdog,
        owner=owner,
        lease_secs=lease_secs,
        actor=actor,
        recover_unsent=recover_unsent,
    )
    join_notes = JoinNotes(observed, actor=actor, spawn=lambda c: operations.spawn(c, audit=True))
    supersession = Supersession(observed, bindings)
    # compensation.automatic: every outcome of this process is watched for a superseding commit.
    automatic = AutomaticCompensation(
        bindings=bindings,
        supersession=supersession,
        compensator=compensator,
        operations=operations,
        ledger=observed,
        actor=actor,
    )
    operations.watch(automatic.on_outcome)
    proposals = Proposals(
        ledger=observed,
        bindings=bindings,
        admitter=admitter,
        telemetry=telemetry,
        operations=operations,
        runner=runner,
        reads=reads,
        decisions=decisions,
        join_notes=join_notes,
        elsewhere=elsewhere,
        supersession=supersession,
        adopt=recovery.adopt,
    )
    deliveries = Deliveries(
        ledger=observed,
        bindings=bindings,
        clock=clock,
        telemetry=telemetry,
        supersession=supersession,
        operations=operations,
        progress=progress,
    )
    model_cancels = ModelCancels(
        ledger=observed, bindings=bindings, operations=operations, decisions=decisions
    )
    return RuntimeParts(
        policy=policy,
        ledger=observed,
        telemetry=telemetry,
        clock=clock,
        owner=owner,
        actor=actor,
        lease_secs=lease_secs,
        bindings=bindings,
        limiter=limiter,
        executor=executor,
        watchdog=watchdog,
        admitter=admitter,
        operations=operations,
        runner=runner,
        reads=reads,
        decisions=decisions,
        compensator=compensator,
        recovery=recovery,
        proposals=proposals,
        join_notes=join_notes,
        elsewhere=elsewhere,
        supersession=supersession,
        deliveries=deliveries,
        progress=progress,
        model_cancels=model_cancels,
    )
