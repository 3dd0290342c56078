"""One backoff formula for every schedule: exponential, capped, never overflowing."""

from __future__ import annotations

import pytest

from pipecat_actions.clock import backoff_secs
from pipecat_actions.execution.durable import WriteRetry
from pipecat_actions.execution.executor import ReconcileSchedule
from pipecat_actions.policy import RetryPolicy


def test_each_pause_grows_by_the_multiplier_up_to_the_cap() -> None:
    assert [backoff_secs(0.5, 2.0, 3.0, step) for step in range(1, 6)] == [0.5, 1.0, 2.0, 3.0, 3.0]
    assert [backoff_secs(0.25, 1.0, 9.0, step) for step in (1, 50)] == [0.25, 0.25]


def test_a_step_too_large_to_compute_is_the_cap() -> None:
    assert backoff_secs(0.5, 10.0, 7.0, 10_000) == 7.0


def test_steps_count_from_one() -> None:
    with pytest.raises(ValueError, match="counts its steps from 1, got 0"):
        backoff_secs(0.5, 2.0, 3.0, 0)


def test_the_retry_policy_the_writes_and_reconciliation_share_it() -> None:
    retry = RetryPolicy(max_attempts=5, initial_backoff_secs=0.3, max_backoff_secs=2.0)
    writes = WriteRetry(initial_secs=0.3, multiplier=2.0, max_secs=2.0)
    probes = ReconcileSchedule(initial_secs=0.3, multiplier=2.0, max_secs=2.0)
    for step in range(1, 8):
        expected = backoff_secs(0.3, 2.0, 2.0, step)
        assert retry.delay_for(step, rand=0.5) == pytest.approx(expected)  # no jitter at 0.5
        assert writes.pause(step) == expected == probes.pause(step)
