"""The status machine: one table, one check, and nothing outside the table is ever applied."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipecat_actions.clock import ManualClock
from pipecat_actions.errors import IllegalTransition
from pipecat_actions.ledger import NewOperation, SqlLedger
from pipecat_actions.status import (
    TERMINAL_STATUSES,
    TRANSITIONS,
    ActionStatus,
    check_transition,
    is_terminal,
    path_from_requested,
)

S = ActionStatus
statuses = st.sampled_from(list(ActionStatus))


def test_every_status_has_a_row_in_the_table() -> None:
    assert set(TRANSITIONS) == set(ActionStatus)


def test_terminal_statuses_have_no_way_out_but_compensation_and_a_conflicts_correction() -> None:
    for status in TERMINAL_STATUSES - {S.COMMITTED, S.FAILED_FINAL}:
        assert TRANSITIONS[status] == frozenset(), status
    assert TRANSITIONS[S.COMMITTED] == {S.COMPENSATING}
    # The system of record reports a commit for an operation held as failed: the ledger
    # follows it (audited as a conflict), and only to COMMITTED.
    assert TRANSITIONS[S.FAILED_FINAL] == {S.COMMITTED}


def test_every_status_is_reachable_from_requested() -> None:
    for status in ActionStatus:
        path = path_from_requested(status)
        assert path[0] is S.REQUESTED and path[-1] is status
        for src, dst in itertools.pairwise(path):
            assert dst in TRANSITIONS[src]


def test_every_non_terminal_status_can_still_end() -> None:
    for start in set(ActionStatus) - TERMINAL_STATUSES:
        seen, frontier = {start}, [start]
        while frontier:
            for nxt in TRANSITIONS[frontier.pop()]:
                if nxt not in seen:
                    seen.add(nxt)
                    frontier.append(nxt)
        assert seen & TERMINAL_STATUSES, start


@pytest.mark.parametrize(
    ("src", "dst"),
    [
        (S.COMMITTED, S.CANCELLED),
        (S.RUNNING, S.CANCELLED),
        (S.UNKNOWN, S.RUNNING),
        (S.FAILED_FINAL, S.RUNNING),
        (S.REQUESTED, S.RUNNING),
        (S.RUNNING, S.RUNNING),
    ],
)
def test_illegal_transition_names_operation_and_both_statuses(
    src: ActionStatus, dst: ActionStatus
) -> None:
    with pytest.raises(IllegalTransition) as info:
        check_transition(src, dst, operation_id="op_42")
    assert info.value.operation_id == "op_42"
    assert info.value.from_status == src and info.value.to_status == dst
    assert f"op_42: illegal transition {src} -> {dst}" in str(info.value)


def test_unknown_status_names_are_illegal_not_a_crash() -> None:
    with pytest.raises(IllegalTransition, match="BOOKED"):
        check_transition("RUNNING", "BOOKED")


def test_committed_counts_as_terminal_but_unknown_does_not() -> None:
    assert is_terminal(S.COMMITTED) and is_terminal("CANCELLED")
    assert not is_terminal(S.UNKNOWN) and not is_terminal(S.CANCEL_REQUESTED)


@given(st.lists(statuses, max_size=40))
def test_random_walks_only_ever_follow_the_table(targets: list[ActionStatus]) -> None:
    current = S.REQUESTED
    for target in targets:
        allowed = target in TRANSITIONS[current]
        try:
            check_transition(current, target)
        except IllegalTransition:
            assert not allowed
            continue
        assert allowed
        current = target


@pytest.fixture(scope="module")
def loop_and_ledger(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[asyncio.AbstractEventLoop, SqlLedger]]:
    loop = asyncio.new_event_loop()
    path: Path = tmp_path_factory.mktemp("status") / "ledger.db"
    ledger = loop.run_until_complete(SqlLedger.create(f"sqlite:///{path}", clock=ManualClock()))
    yield loop, ledger
    loop.run_until_complete(ledger.close())
    loop.close()


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(targets=st.lists(statuses, min_size=1, max_size=25))
def test_ledger_applies_exactly_the_legal_moves_of_a_random_walk(
    loop_and_ledger: tuple[asyncio.AbstractEventLoop, SqlLedger], targets: list[ActionStatus]
) -> None:
    loop, ledger = loop_and_ledger

    async def walk() -> None:
        admitted = await ledger.admit(
            NewOperation(
                tool="book_table",
                kind="mutation",
                args={"n": len(targets)},
                idempotency_key=f"walk-{uuid.uuid4()}",
                session_id="s",
                principal="p",
            )
        )
        op = admitted.operation
        applied = [(S.REQUESTED, S.ADMITTED)]
        for target in targets:
            try:
                op = await ledger.transition(
                    op.operation_id, expected=op.status, to=target, fence=op.fence, actor="walk"
                )
            except IllegalTransition:
                assert target not in TRANSITIONS[op.status]
                continue
            applied.append((applied[-1][1], target))
        trail = [(e.from_status, e.to_status) for e in await ledger.events(op.operation_id)]
        assert trail == applied
        assert all(dst in TRANSITIONS[src] for src, dst in trail)
        assert (await ledger.get(op.operation_id)).status is applied[-1][1]

    loop.run_until_complete(walk())
