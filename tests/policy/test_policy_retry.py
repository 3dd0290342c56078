"""`RetryPolicy.delay_for`: a pure, bounded, monotone backoff."""

from __future__ import annotations

import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipecat_actions.policy import RetryPolicy

UNTIMED = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
"""Hypothesis without its wall-clock checks (a 200 ms deadline per example, the too-slow
health check): on a busy machine they fail a correct property at random."""


@st.composite
def retry_policies(draw: st.DrawFn) -> RetryPolicy:
    initial = draw(st.floats(min_value=0, max_value=1e6))
    return RetryPolicy(
        max_attempts=draw(st.integers(min_value=1, max_value=100)),
        initial_backoff_secs=initial,
        multiplier=draw(st.floats(min_value=1, max_value=1e3)),
        max_backoff_secs=draw(st.floats(min_value=initial, max_value=max(initial, 1) * 1e3)),
        jitter=draw(st.floats(min_value=0, max_value=1)),
    )


attempts = st.integers(min_value=1, max_value=10_000)
rands = st.floats(min_value=0, max_value=1)


def test_default_backoff_doubles_from_half_a_second_up_to_ten() -> None:
    retry = RetryPolicy()

    assert [retry.delay_for(n) for n in range(1, 8)] == [0.5, 1, 2, 4, 8, 10, 10]


def test_jitter_spreads_the_delay_by_its_fraction_either_way() -> None:
    retry = RetryPolicy(initial_backoff_secs=1, jitter=0.2)

    assert retry.delay_for(1, rand=0.0) == pytest.approx(0.8)
    assert retry.delay_for(1, rand=0.5) == 1
    assert retry.delay_for(1, rand=1.0) == pytest.approx(1.2)


def test_zero_jitter_ignores_the_random_input() -> None:
    retry = RetryPolicy(initial_backoff_secs=1, jitter=0)

    assert {retry.delay_for(3, rand=r) for r in (0.0, 0.3, 0.99)} == {4}


@UNTIMED
@given(retry_policies(), attempts)
def test_delay_without_jitter_never_decreases_with_the_attempt(
    retry: RetryPolicy, attempt: int
) -> None:
    assert retry.delay_for(attempt) <= retry.delay_for(attempt + 1)


@UNTIMED
@given(retry_policies(), attempts)
def test_delay_at_half_rand_is_the_capped_exponential_backoff(
    retry: RetryPolicy, attempt: int
) -> None:
    try:
        expected = retry.initial_backoff_secs * retry.multiplier ** (attempt - 1)
    except OverflowError:
        expected = math.inf
    assert retry.delay_for(attempt, rand=0.5) == min(expected, retry.max_backoff_secs)


@UNTIMED
@given(retry_policies(), attempts, rands)
def test_delay_is_never_negative_nor_above_the_jittered_cap(
    retry: RetryPolicy, attempt: int, rand: float
) -> None:
    delay = retry.delay_for(attempt, rand=rand)

    assert 0 <= delay <= retry.max_backoff_secs * (1 + retry.jitter)
    assert math.isfinite(delay)


@UNTIMED
@given(retry_policies(), attempts, rands)
def test_delay_stays_within_jitter_of_the_unjittered_backoff(
    retry: RetryPolicy, attempt: int, rand: float
) -> None:
    base = retry.delay_for(attempt)
    low, high = base * (1 - retry.jitter), base * (1 + retry.jitter)

    delay = retry.delay_for(attempt, rand=rand)

    assert low - 1e-9 * base <= delay <= high + 1e-9 * base


@UNTIMED
@given(retry_policies(), attempts, rands)
def test_delay_is_a_pure_function_of_its_inputs(
    retry: RetryPolicy, attempt: int, rand: float
) -> None:
    assert retry.delay_for(attempt, rand=rand) == retry.delay_for(attempt, rand=rand)


@pytest.mark.parametrize("attempt", [0, -1])
def test_attempts_are_counted_from_one(attempt: int) -> None:
    with pytest.raises(ValueError, match="from 1"):
        RetryPolicy().delay_for(attempt)


@pytest.mark.parametrize("rand", [-0.1, 1.1, math.nan])
def test_rand_outside_the_unit_interval_is_refused(rand: float) -> None:
    with pytest.raises(ValueError, match=r"within \[0, 1\]"):
        RetryPolicy().delay_for(1, rand=rand)


def test_max_backoff_below_initial_backoff_is_refused() -> None:
    with pytest.raises(ValueError, match="max_backoff_secs: must be at least initial"):
        RetryPolicy(initial_backoff_secs=5, max_backoff_secs=1)
