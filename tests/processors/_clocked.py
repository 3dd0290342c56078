"""Pipeline tests on a manual clock: a frame-script driver and the causes a script waits for.

The system of record and the runtime run on a `ScriptClock` (a `ManualClock`), so a provider
answers, a slow cancel acts and a deadline passes exactly when the script advances the clock,
never because the machine happened to be fast or slow (STYLE rule 11). A script is a list of
steps for `run_script`: a frame is queued into the pipeline, as with Pipecat's ``run_test``;
a coroutine function is awaited at that point of the script, to move the clock or to wait for
a cause (a ledger status, a frame having been pushed, a processor having finished the work it
started). The same coroutine functions serve `run_conversation` scripts as ``Call(...)``.

Every wait polls and is bounded only by a generous hang guard: it measures nothing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeAlias, TypeVar

from pipecat.frames.frames import EndFrame, Frame, StartFrame
from pipecat.observers.base_observer import BaseObserver, FramePushed
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.worker import PipelineWorker
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.processors.frameworks.rtvi.observer import RTVIObserverParams
from pipecat.workers.runner import WorkerRunner

from pipecat_actions.clock import ManualClock
from pipecat_actions.ledger import Operation
from pipecat_actions.runtime import ActionRuntime
from pipecat_actions.runtime.deliveries import SessionDelivery
from pipecat_actions.runtime.pipeline_delivery import _record_in_place
from pipecat_actions.status import ActionStatus
from tests._waiting import HANG_GUARD_SECS, eventually, guarded


class Flush:
    """A `run_script` step: wait until the pipeline has drained (Pipecat's ``flush_pipeline``).

    Every frame queued or pushed before it has then been processed, and so has the work a
    processor started by pushing upstream (an LLM run a tool result asked for); background
    tasks a processor started are not waited for (see `idle`).
    """


FLUSH = Flush()

Step: TypeAlias = Frame | Flush | Callable[[], Awaitable[Any]]
"""A `run_script` step: a frame to queue, `FLUSH`, or a coroutine function to await there."""

_FrameT = TypeVar("_FrameT", bound=Frame)


class ScriptClock(ManualClock):
    """A `ManualClock` that remembers each sleep asked of it, so a script can wait for one.

    Waiting until the provider has asked to sleep its latency is waiting until the request is
    on its way: advancing the clock after that makes it answer, advancing it before would not.
    """

    def __init__(self) -> None:
        super().__init__()
        self.requested: list[float] = []

    async def sleep(self, secs: float) -> None:
        self.requested.append(secs)  # registered with the clock before the first await
        await super().sleep(secs)

    async def asked(self, secs: float, times: int = 1) -> None:
        """Wait until ``times`` sleeps of ``secs`` have been asked for."""
        await until(lambda: self.requested.count(secs) >= times, what=f"{times} sleeps of {secs}s")


async def until(check: Callable[[], Any], *, what: str) -> None:
    """Poll ``check`` (sync or async) until it is truthy; fail after the hang guard."""
    await eventually(check, what=what)


async def outcome(runtime: ActionRuntime, operation_id: str) -> Operation:
    """Wait for the outcome of an operation the runtime runs (`ActionRuntime.wait`).

    When it returns, the runtime's listeners (the gate) have been told the outcome.
    """
    return await guarded(runtime.wait(operation_id), what=f"the outcome of {operation_id}")


async def operation(runtime: ActionRuntime, tool: str, *statuses: ActionStatus) -> Operation:
    """Wait until ``tool`` has one operation in the ledger, in one of ``statuses``; return it."""
    found: list[Operation] = []

    async def check() -> bool:
        ops = [op for op in await runtime.ledger.list() if op.tool == tool]
        assert len(ops) <= 1, ops
        found[:] = ops
        return bool(ops) and (not statuses or ops[0].status in statuses)

    await until(check, what=f"{tool} operation in {[s.value for s in statuses]}")
    return found[0]


async def idle(processor: FrameProcessor) -> None:
    """Wait until the tasks ``processor``'s own code started have all finished.

    A processor does its background work in tasks made with ``self.create_task`` (STYLE rule
    6), which Pipecat names ``"<processor>::<coroutine>"``; its frame loops are Pipecat's own
    coroutines, not its class's, and are left out. Idle means it acted on what it was told.
    """
    own = {name for cls in type(processor).__mro__[:-1] for name in vars(cls)}
    own -= {name for cls in FrameProcessor.__mro__ for name in vars(cls)}
    if isinstance(getattr(processor, "delivery", None), SessionDelivery):
        # The delivery service's work runs as the processor's tasks; its watchers of
        # operations run elsewhere wait on the clock for as long as the pipeline runs.
        own |= set(vars(SessionDelivery)) - {"_watch"}
        own.add(_record_in_place.__name__)  # its task holds the session, not the delivery
    prefix = f"{processor}::"

    def done() -> bool:
        return not any(
            task.get_name().startswith(prefix) and task.get_name()[len(prefix) :] in own
            for task in processor.task_manager.current_tasks()
            if not task.done()
        )

    await until(done, what=f"idle {processor}")


class FrameLog(BaseObserver):
    """Every push of a frame in the pipeline, in push order; a script can wait for one."""

    def __init__(self) -> None:
        super().__init__()
        self.pushes: list[FramePushed] = []

    async def on_push_frame(self, data: FramePushed) -> None:
        self.pushes.append(data)

    def pushed(
        self,
        frame_type: type[_FrameT],
        *,
        by: FrameProcessor | None = None,
        direction: FrameDirection | None = FrameDirection.DOWNSTREAM,
    ) -> list[_FrameT]:
        """The frames of a type pushed (by one processor, one way), in order."""
        return [
            p.frame
            for p in self.pushes
            if isinstance(p.frame, frame_type)
            and (by is None or p.source is by)
            and (direction is None or p.direction is direction)
        ]

    async def wait_pushed(
        self,
        frame_type: type[Frame],
        *,
        by: FrameProcessor | None = None,
        direction: FrameDirection | None = FrameDirection.DOWNSTREAM,
        count: int = 1,
    ) -> None:
        """Wait until ``count`` frames of a type have been pushed (by ``by``, one way)."""
        source = f" by {by}" if by is not None else ""
        await until(
            lambda: len(self.pushed(frame_type, by=by, direction=direction)) >= count,
            what=f"{count} {frame_type.__name__} pushed{source}",
        )


async def run_script(
    processors: Sequence[FrameProcessor],
    steps: Sequence[Step],
    *,
    observers: Sequence[BaseObserver] = (),
    rtvi: RTVIObserverParams | None = None,
) -> None:
    """Run ``steps`` against a pipeline of ``processors``, then end it with an ``EndFrame``.

    As Pipecat's ``run_test``: frames are queued downstream once the pipeline has started.
    `FLUSH` waits for the pipeline to drain. A coroutine-function step is awaited in place;
    if it raises, the pipeline is cancelled and the error propagates. With ``rtvi``, the worker
    adds Pipecat's RTVI processor and observer, with these parameters, as it does by default.
    """
    worker = PipelineWorker(
        Pipeline(list(processors)),
        cancel_on_idle_timeout=False,
        idle_timeout_secs=None,
        enable_rtvi=rtvi is not None,
        rtvi_observer_params=rtvi,
        observers=list(observers),
    )
    started = asyncio.Event()

    async def on_started(worker: PipelineWorker, frame: StartFrame) -> None:
        started.set()

    worker.add_event_handler("on_pipeline_started", on_started)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    run = asyncio.ensure_future(runner.run())
    try:
        async with asyncio.timeout(3 * HANG_GUARD_SECS):
            await started.wait()
            for step in steps:
                if isinstance(step, Frame):
                    await worker.queue_frame(step)
                elif isinstance(step, Flush):
                    drained = await worker.flush_pipeline(timeout=HANG_GUARD_SECS)
                    assert drained, f"hung: the pipeline did not drain in {HANG_GUARD_SECS} s"
                else:
                    await step()
            await worker.queue_frame(EndFrame())
            await asyncio.shield(run)
    finally:
        if not run.done():
            await worker.cancel(reason="run_script failed")
            await run
