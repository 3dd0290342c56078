"""The `Limiter` alone: a part with no ledger, no runtime and no Pipecat, on an injected clock.

The runtime's tests show limits through whole conversations; these pin the part's own rules,
so a change to it fails here first, with the rule it broke in the test's name.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipecat_actions.admission.limits import Behind, Coalesced, Degraded, Limiter, Slot
from pipecat_actions.errors import LimitExceeded
from pipecat_actions.policy import load_policy_text
from pipecat_actions.policy.model import ToolPolicy


def tool(limits: str, kind: str = "mutation") -> ToolPolicy:
    """The policy of one tool named ``t`` with ``limits`` (flow YAML)."""
    text = f"version: 1\ntools:\n  t:\n    kind: {kind}\n    limits: {limits}\n"
    return load_policy_text(text).tools["t"]


class Clock:
    """Epoch seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def slot(got: Any) -> Slot:
    assert isinstance(got, Slot), got
    return got


async def test_a_full_tool_rejects_with_the_concurrency_code_and_a_released_slot_frees_it() -> None:
    limiter, policy = Limiter(Clock()), tool("{max_concurrent: 1}")
    first = slot(await limiter.acquire("t", policy, "alice"))
    with pytest.raises(LimitExceeded) as refused:
        await limiter.acquire("t", policy, "bob")
    assert refused.value.code == "concurrency"
    first.release()
    slot(await limiter.acquire("t", policy, "bob"))
    assert limiter.running("t") == 1


async def test_releasing_a_slot_twice_gives_back_one_place_only() -> None:
    limiter, policy = Limiter(Clock()), tool("{max_concurrent: 2}")
    a = slot(await limiter.acquire("t", policy, "alice"))
    slot(await limiter.acquire("t", policy, "bob"))
    a.release()
    a.release()
    assert limiter.running("t") == 1
    slot(await limiter.acquire("t", policy, "carol"))
    with pytest.raises(LimitExceeded):
        await limiter.acquire("t", policy, "dave")


async def test_the_rate_window_slides_on_the_injected_clock() -> None:
    clock = Clock()
    limiter, policy = Limiter(clock), tool("{rate_per_minute: 2}")
    slot(await limiter.acquire("t", policy, "a")).release()
    clock.now += 30
    slot(await limiter.acquire("t", policy, "a")).release()
    with pytest.raises(LimitExceeded) as refused:
        await limiter.acquire("t", policy, "a")
    assert refused.value.code == "rate"
    clock.now += 30  # the first start is now a minute old: it leaves the window
    slot(await limiter.acquire("t", policy, "a"))
    with pytest.raises(LimitExceeded):
        await limiter.acquire("t", policy, "a")


async def test_a_principals_own_earlier_call_puts_a_mutation_behind_it_not_out() -> None:
    limiter, policy = Limiter(Clock()), tool("{per_principal: 1}")
    earlier = slot(await limiter.acquire("t", policy, "alice", behind_own=True))
    assert isinstance(await limiter.acquire("t", policy, "alice", behind_own=True), Behind)
    slot(await limiter.acquire("t", policy, "bob", behind_own=True))  # others are not held
    waiting = asyncio.ensure_future(limiter.wait_for_slot("t", policy, "alice"))
    await asyncio.sleep(0)
    assert not waiting.done()
    earlier.release()
    later = await waiting
    assert isinstance(later, Slot)


async def test_behind_is_not_given_when_the_tool_is_full_for_everyone() -> None:
    limiter, policy = Limiter(Clock()), tool("{per_principal: 1, max_concurrent: 1}")
    slot(await limiter.acquire("t", policy, "alice", behind_own=True))
    with pytest.raises(LimitExceeded):
        await limiter.acquire("t", policy, "alice", behind_own=True)


async def test_queued_callers_take_freed_slots_in_turn_and_the_queue_is_bounded() -> None:
    limiter, policy = Limiter(Clock()), tool("{max_concurrent: 1, overflow: queue, max_queued: 1}")
    holder = slot(await limiter.acquire("t", policy, "a"))
    queued = asyncio.ensure_future(limiter.acquire("t", policy, "b"))
    await asyncio.sleep(0)
    with pytest.raises(LimitExceeded) as refused:  # the one place in the queue is taken
        await limiter.acquire("t", policy, "c")
    assert refused.value.code == "concurrency"
    holder.release()
    slot(await queued)
    assert limiter.running("t") == 1


async def test_an_identical_read_joins_the_running_one_and_degrade_answers_the_fallback() -> None:
    limiter = Limiter(Clock())
    reads = tool("{max_concurrent: 1, overflow: coalesce}", kind="read")
    slot(await limiter.acquire("t", reads, "a", coalesce_key="k"))
    result: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
    limiter.register_read("t", "k", result)
    joined = await limiter.acquire("t", reads, "b", coalesce_key="k")
    assert isinstance(joined, Coalesced) and joined.result is result
    result.set_result({"open": True})
    await asyncio.sleep(0)  # the done callback forgets the read: a later one is not joined
    with pytest.raises(LimitExceeded):
        await limiter.acquire("t", reads, "c", coalesce_key="k")

    degrading = tool("{max_concurrent: 1, overflow: degrade, degrade_result: {busy: true}}", "read")
    slot(await limiter.acquire("d", degrading, "a"))
    degraded = await limiter.acquire("d", degrading, "b")
    assert isinstance(degraded, Degraded) and degraded.result == {"busy": True}


def test_the_session_budget_counts_per_session_and_tool() -> None:
    limiter, policy = Limiter(Clock()), tool("{session_budget: 2}")
    limiter.charge_session("t", policy, "s1")
    limiter.charge_session("t", policy, "s1")
    with pytest.raises(LimitExceeded) as refused:
        limiter.charge_session("t", policy, "s1")
    assert refused.value.code == "session_budget"
    limiter.charge_session("t", policy, "s2")  # another conversation has its own budget


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["take", "release"]), st.sampled_from(["a", "b", "c"])),
        max_size=40,
    ),
    cap=st.integers(min_value=1, max_value=3),
    own=st.integers(min_value=1, max_value=2),
)
def test_no_sequence_of_calls_goes_over_a_cap_or_leaks_a_place(
    steps: list[tuple[str, str]], cap: int, own: int
) -> None:
    policy = tool(f"{{max_concurrent: {cap}, per_principal: {own}}}")

    async def play() -> None:
        limiter = Limiter(Clock())
        held: dict[str, list[Slot]] = {"a": [], "b": [], "c": []}
        for verb, who in steps:
            if verb == "release":
                if held[who]:
                    held[who].pop().release()
            else:
                try:
                    held[who].append(slot(await limiter.acquire("t", policy, who)))
                except LimitExceeded:
                    total = sum(map(len, held.values()))
                    assert total >= cap or len(held[who]) >= own  # refused only when full
            assert limiter.running("t") == sum(map(len, held.values())) <= cap
            assert all(len(slots) <= own for slots in held.values())
        for slots in held.values():
            for s in slots:
                s.release()
        assert limiter.running("t") == 0

    asyncio.run(play())
