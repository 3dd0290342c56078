"""The wire to a fake provider: its errors, its fault switches and the call path that applies them.

What the caller of a provider can learn from each error, drawn as a tree::

    ProviderError                  base of every error the fake raises
    ├── ProviderUnavailable        not sent: nothing happened (also a ConnectionRefusedError)
    ├── ProviderTimeout            outcome unknown: it may have committed (also a TimeoutError)
    ├── ProviderRejected           final: received and refused, nothing committed
    └── ProviderCancelled          cancelled: aborted by `cancel_pending`, nothing committed

The errors also derive from the built-in `ConnectionRefusedError` and `TimeoutError` so that
generic code, which knows nothing of this fake, classifies them as it would a real client's.

`_FakeProvider` is the domain-free half of `FakeSystemOfRecord`: every mutation goes through
`_FakeProvider._mutate`, which counts the call, applies the armed faults in the order a real
request meets them (connect, latency, hang, decision, answer), dedupes on the idempotency key
under the lock and counts the side effect only when the domain's commit function succeeds.
"""

from __future__ import annotations

__all__ = [
    "CallOutcome",
    "FaultName",
    "Faults",
    "OperationKind",
    "ProviderCall",
    "ProviderCancelled",
    "ProviderError",
    "ProviderRejected",
    "ProviderTimeout",
    "ProviderUnavailable",
]

import asyncio
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar, cast

from pipecat_actions.clock import Clock, SystemClock, sleep_from_now

OperationKind = Literal["book", "move", "cancel", "refund"]
"""The mutations the fake performs; each committed one is a counted side effect."""

FaultName = Literal[
    "error_before_send",
    "fail_after_send",
    "lose_response_after_commit",
    "hang",
    "apply_when_abandoned",
]
"""The fault switches that are spent one call at a time."""


class ProviderError(Exception):
    """Base class of every error raised by the fake system of record.

    Attributes:
        kind: The operation that failed (``"book"``, ``"refund"``...), when there was one.
        idempotency_key: The idempotency key the caller sent, if any.
    """

    def __init__(
        self, message: str, *, kind: str | None = None, idempotency_key: str | None = None
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.idempotency_key = idempotency_key


class ProviderUnavailable(ProviderError, ConnectionRefusedError):
    """The request was never sent: nothing happened, so retrying it is safe."""


class ProviderTimeout(ProviderError, TimeoutError):
    """No answer came back: the request may or may not have committed.

    Never retry blindly: reconcile first (for example with `find_by_idempotency_key`).
    """


class ProviderRejected(ProviderError):
    """The provider received the request and refused it: final, nothing was committed."""


class ProviderCancelled(ProviderError):
    """The request was aborted by `cancel_pending` before it committed: nothing happened."""


class Faults:
    """Fault switches of one fake provider, each spent by the calls it applies to.

    Every switch takes ``kind`` (the operation it applies to; None for any) and ``times``: it
    applies to the next ``times`` calls of that kind the fake receives, counted in arrival
    order so that concurrent tests stay deterministic. A fault planned for a call that then
    fails for another reason (say, a lost response on a call refused for capacity) is spent
    all the same. ``error_before_send`` is checked first; when it fires, no other switch is
    spent. Latency is not spent: it applies to every call until changed.
    """

    def __init__(self) -> None:
        self._armed: dict[tuple[FaultName, OperationKind | None], int] = {}
        self._hang_ignores_cancel: dict[OperationKind | None, list[bool]] = {}
        self._latency_secs: float = 0.0
        self._latency_secs_by_kind: dict[OperationKind, float] = {}

    def error_before_send(self, kind: OperationKind | None = None, times: int = 1) -> None:
        """Make calls raise `ProviderUnavailable` at once: nothing is sent, nothing happens."""
        self._arm("error_before_send", kind, times)

    def fail_after_send(self, kind: OperationKind | None = None, times: int = 1) -> None:
        """Make calls wait their latency, then be refused with `ProviderRejected` (no commit)."""
        self._arm("fail_after_send", kind, times)

    def lose_response_after_commit(self, kind: OperationKind | None = None, times: int = 1) -> None:
        """Make calls commit (or replay), then raise `ProviderTimeout` instead of answering."""
        self._arm("lose_response_after_commit", kind, times)

    def apply_when_abandoned(self, kind: OperationKind | None = None, times: int = 1) -> None:
        """Make received calls run to their end on the provider's side, whoever waits.

        A real provider goes on with a request it received when its client stops waiting
        (a client timeout, a cancelled task, a dead process): with latency, the commit comes
        that much later, though nobody hears its answer. By default the fake abandons a call
        whose awaiting task is cancelled; this switch makes the next ``times`` calls behave
        like a real server instead.
        """
        self._arm("apply_when_abandoned", kind, times)

    def hang(
        self,
        kind: OperationKind | None = None,
        times: int = 1,
        *,
        ignore_cancellation: bool = False,
    ) -> None:
        """Make calls wait, after their latency, until `release_hung` is called.

        A hung call has not committed: `cancel_pending` can still abort it. Cancelling the
        awaiting task abandons it and nothing commits, unless ``ignore_cancellation`` is set:
        then the call swallows the first `asyncio.CancelledError`, keeps waiting and commits
        once released, like an effect that does not stop when its caller gives up.
        """
        self._arm("hang", kind, times)
        self._hang_ignores_cancel.setdefault(kind, []).extend([ignore_cancellation] * times)

    def set_latency(self, secs: float, *, kind: OperationKind | None = None) -> None:
        """Make calls of ``kind`` (None: the default for all) wait ``secs`` on the clock."""
        if secs < 0:
            raise ValueError(f"latency cannot be negative ({secs})")
        if kind is None:
            self._latency_secs = float(secs)
        else:
            self._latency_secs_by_kind[kind] = float(secs)

    def latency_secs(self, kind: OperationKind) -> float:
        """Return the latency a call of ``kind`` waits, in seconds."""
        return self._latency_secs_by_kind.get(kind, self._latency_secs)

    def remaining(self, fault: FaultName, kind: OperationKind | None = None) -> int:
        """Return how many more calls the switch ``fault`` armed for ``kind`` will affect."""
        return self._armed.get((fault, kind), 0)

    def clear(self) -> None:
        """Disarm every switch and remove all latency."""
        self._armed.clear()
        self._hang_ignores_cancel.clear()
        self._latency_secs = 0.0
        self._latency_secs_by_kind.clear()

    def _arm(self, fault: FaultName, kind: OperationKind | None, times: int) -> None:
        if times < 1:
            raise ValueError(f"times must be at least 1 (got {times})")
        self._armed[(fault, kind)] = self._armed.get((fault, kind), 0) + times

    def _take(
        self, fault: FaultName, kind: OperationKind
    ) -> tuple[FaultName, OperationKind | None] | None:
        """Spend one use of ``fault`` for ``kind``; return the switch spent, or None."""
        for switch in ((fault, kind), (fault, None)):
            left = self._armed.get(switch, 0)
            if left > 0:
                self._armed[switch] = left - 1
                return switch
        return None

    def _take_hang(self, kind: OperationKind) -> bool | None:
        """Spend one hang; return None when none applies, else its ``ignore_cancellation``."""
        switch = self._take("hang", kind)
        return None if switch is None else self._hang_ignores_cancel[switch[1]].pop(0)


CallOutcome = Literal[
    "committed",
    "committed_response_lost",
    "replayed",
    "replayed_response_lost",
    "unavailable",
    "rejected",
    "cancelled",
    "abandoned",
]
"""How a mutation ended: ``replayed`` is a repeated key answered without a new side effect;
``abandoned`` means the caller's task was cancelled before the commit."""


@dataclass(frozen=True)
class ProviderCall:
    """One mutation the fake received, as written to its ``log``.

    Attributes:
        kind: The operation.
        params: Its parameters, without the idempotency key.
        idempotency_key: The key sent, if any.
        outcome: How it ended.
        at: Clock time at which it ended.
    """

    kind: OperationKind
    params: dict[str, object]
    idempotency_key: str | None
    outcome: CallOutcome
    at: float


@dataclass
class _InFlight:
    aborted: asyncio.Event = field(default_factory=asyncio.Event)
    decided: bool = False


_Result = TypeVar("_Result")


class _FakeProvider:
    """Call counting, fault injection, idempotency and cancellation, with no domain."""

    def __init__(
        self,
        *,
        clock: Clock | None,
        honours_idempotency_keys: bool,
        supports_cancel: bool,
        slow_cancel_secs: float,
        faults: Faults | None,
    ) -> None:
        self.honours_idempotency_keys = honours_idempotency_keys
        self.supports_cancel = supports_cancel
        self.slow_cancel_secs = slow_cancel_secs
        self.faults = faults if faults is not None else Faults()
        self.side_effects: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.log: list[ProviderCall] = []
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._lock = asyncio.Lock()
        self._release = asyncio.Event()
        self._effects_by_key: Counter[str] = Counter()
        self._latest_by_key: dict[str, object] = {}
        self._replays: dict[tuple[OperationKind, str], tuple[dict[str, object], object]] = {}
        self._seen_keys: set[str] = set()
        self._in_flight: dict[str, list[_InFlight]] = {}

    def effects_for_key(self, key: str) -> int:
        """Return how many real side effects calls with ``key`` caused."""
        return self._effects_by_key[key]

    def release_hung(self) -> None:
        """Let every call currently held by ``faults.hang`` go on; later hangs hang again."""
        self._release.set()
        self._release = asyncio.Event()

    async def cancel_pending(
        self, idempotency_key: str
    ) -> Literal["cancelled", "too_late", "unknown"]:
        """Ask the provider to abort the calls sent with ``idempotency_key``.

        It first waits ``slow_cancel_secs``, during which a call may still commit.

        Returns:
            ``cancelled`` when nothing with that key committed (calls still waiting are aborted
            and raise `ProviderCancelled`); ``too_late`` when one already committed;
            ``unknown`` when the provider never received that key.

        Raises:
            ProviderUnavailable: The provider has no cancel API (``supports_cancel`` is False).
        """
        self.calls["cancel_pending"] += 1
        if not self.supports_cancel:
            raise ProviderUnavailable("this provider cannot cancel requests")
        if self.slow_cancel_secs > 0:
            await self._clock.sleep(self.slow_cancel_secs)
        async with self._lock:
            if self._effects_by_key[idempotency_key] > 0:
                return "too_late"
            if idempotency_key not in self._seen_keys:
                return "unknown"
            for call in self._in_flight.get(idempotency_key, []):
                if not call.decided:
                    call.aborted.set()
            return "cancelled"

    async def _mutate(
        self,
        kind: OperationKind,
        params: dict[str, object],
        key: str | None,
        commit: Callable[[float], _Result],
    ) -> _Result:
        """Run one mutation; ``commit(now)`` changes the domain or raises `ProviderRejected`."""
        if self.faults._take("apply_when_abandoned", kind) is not None:
            # The provider's side of the call runs on its own: the caller may stop waiting.
            served = asyncio.ensure_future(self._serve(kind, params, key, commit))
            served.add_done_callback(_consume)
            return await asyncio.shield(served)
        return await self._serve(kind, params, key, commit)

    async def _serve(
        self,
        kind: OperationKind,
        params: dict[str, object],
        key: str | None,
        commit: Callable[[float], _Result],
    ) -> _Result:
        """One mutation as the provider serves it (see `_mutate`)."""
        fails_before_send = self.faults._take("error_before_send", kind) is not None
        latency = 0.0 if fails_before_send else self.faults.latency_secs(kind)
        sleeping = (
            asyncio.ensure_future(sleep_from_now(self._clock, latency)) if latency > 0 else None
        )
        if sleeping is not None:
            # Counted once its latency sleep is registered with the clock (the task's first
            # step runs before this one resumes): a test that sees the call and then advances
            # a manual clock always makes it answer.
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                sleeping.cancel()
                raise
        self.calls[kind] += 1
        if fails_before_send:
            self._record(kind, params, key, "unavailable")
            msg = f"{kind}: connection refused (injected fault); the request was not sent"
            raise ProviderUnavailable(msg, kind=kind, idempotency_key=key)
        hang = self.faults._take_hang(kind)
        reject = self.faults._take("fail_after_send", kind) is not None
        lose = self.faults._take("lose_response_after_commit", kind) is not None
        call = _InFlight()
        if key is not None:
            self._seen_keys.add(key)
            self._in_flight.setdefault(key, []).append(call)
        try:
            if sleeping is not None:
                await self._wait(call, sleeping, kind, key)
            if hang is not None:
                await self._hang(call, kind, key, ignore_cancellation=hang)
            # Only the decision is serialised: waits above overlap across concurrent calls.
            async with self._lock:
                if call.aborted.is_set():
                    raise _aborted(kind, key)
                call.decided = True
                result, committed = self._decide(kind, params, key, reject, commit)
        except ProviderCancelled:
            self._record(kind, params, key, "cancelled")
            raise
        except ProviderRejected:
            self._record(kind, params, key, "rejected")
            raise
        except asyncio.CancelledError:
            self._record(kind, params, key, "abandoned")
            raise
        finally:
            if key is not None:
                self._in_flight[key].remove(call)
        if lose:
            lost: CallOutcome = "committed_response_lost" if committed else "replayed_response_lost"
            self._record(kind, params, key, lost)
            msg = f"{kind}: the answer was lost (injected fault); the outcome is unknown"
            raise ProviderTimeout(msg, kind=kind, idempotency_key=key)
        self._record(kind, params, key, "committed" if committed else "replayed")
        return result

    def _decide(
        self,
        kind: OperationKind,
        params: dict[str, object],
        key: str | None,
        reject: bool,
        commit: Callable[[float], _Result],
    ) -> tuple[_Result, bool]:
        """Replay a known key or commit; runs under the lock. Returns (result, committed)."""
        if key is not None and self.honours_idempotency_keys and (kind, key) in self._replays:
            original_params, original = self._replays[(kind, key)]
            if original_params != params:
                raise ProviderRejected(
                    f"{kind}: idempotency key {key!r} was already used with other parameters "
                    f"({original_params} != {params})",
                    kind=kind,
                    idempotency_key=key,
                )
            return cast(_Result, original), False
        if reject:
            msg = f"{kind}: refused by the provider (injected fault); nothing was committed"
            raise ProviderRejected(msg, kind=kind, idempotency_key=key)
        try:
            result = commit(self._clock.now())
        except ProviderRejected as exc:
            exc.kind, exc.idempotency_key = kind, key
            raise
        self.side_effects[kind] += 1
        if key is not None:
            self._effects_by_key[key] += 1
            self._latest_by_key[key] = result
            self._replays.setdefault((kind, key), (params, result))
        return result, True

    async def _wait(
        self, call: _InFlight, waiting: Awaitable[object], kind: OperationKind, key: str | None
    ) -> None:
        """Wait for ``waiting`` unless `cancel_pending` aborts the call first."""
        waiter = asyncio.ensure_future(waiting)
        aborter = asyncio.ensure_future(call.aborted.wait())
        try:
            await asyncio.wait((waiter, aborter), return_when=asyncio.FIRST_COMPLETED)
        finally:
            waiter.cancel()
            aborter.cancel()
        if call.aborted.is_set():
            raise _aborted(kind, key)
        waiter.result()

    async def _hang(
        self, call: _InFlight, kind: OperationKind, key: str | None, *, ignore_cancellation: bool
    ) -> None:
        release = self._release
        swallowed = False
        while True:
            try:
                await self._wait(call, release.wait(), kind, key)
                return
            except asyncio.CancelledError:
                if not ignore_cancellation or swallowed:
                    raise
                # Deliberately misbehave once, like an effect that does not stop; uncancel so
                # that asyncio.timeout and TaskGroup around the caller still work afterwards.
                swallowed = True
                task = asyncio.current_task()
                if task is not None:
                    task.uncancel()

    def _record(
        self, kind: OperationKind, params: dict[str, object], key: str | None, outcome: CallOutcome
    ) -> None:
        self.log.append(ProviderCall(kind, params, key, outcome, self._clock.now()))


def _consume(task: asyncio.Future[Any]) -> None:
    """Take a detached call's exception: nobody may be waiting for its answer."""
    if not task.cancelled():
        task.exception()


def _aborted(kind: OperationKind, key: str | None) -> ProviderCancelled:
    msg = f"{kind}: aborted by cancel_pending before commit; nothing was committed"
    return ProviderCancelled(msg, kind=kind, idempotency_key=key)
