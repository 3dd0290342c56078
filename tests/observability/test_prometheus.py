"""The Prometheus exposition of a real run, parsed back with prometheus-client's own parser."""

from __future__ import annotations

import asyncio
import urllib.request
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from pipecat_actions.clock import ManualClock
from pipecat_actions.observability.prometheus import ActionMetricsCollector, start_prometheus
from tests.observability.test_metrics import POLICY, actions, fake
from tests.runtime._execution_support import Bookings, booking, new_session, running


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            found[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return found


async def test_the_text_exposition_of_a_run_parses_back_to_its_counts(
    tmp_path: Any, clock: ManualClock
) -> None:
    sor = fake(clock)
    sor.faults.lose_response_after_commit("book", times=1)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    async with running(
        POLICY, actions(Bookings(sor), reconcile=None), ledger_url=url, clock=clock
    ) as rt:
        session = new_session()
        await rt.propose("book_table", booking("20:00"), session)  # answer lost: UNKNOWN
        await rt.propose("book_table", booking("21:00"), session)
        await rt.propose("book_table", booking("21:00"), session)  # joined
        registry = CollectorRegistry()
        registry.register(ActionMetricsCollector(rt.metrics))
        text = generate_latest(registry).decode()

    found = _samples(text)
    tool = (("tool", "book_table"),)
    assert found[("pipecat_actions_proposals_total", (("outcome", "admitted"), *tool))] == 2
    assert found[("pipecat_actions_proposals_total", (("outcome", "joined"), *tool))] == 1
    assert found[("pipecat_actions_duplicates_suppressed_total", (("how", "joined"), *tool))] == 1
    assert found[("pipecat_actions_unknown_now", tool)] == 1
    assert found[("pipecat_actions_escalations_total", tool)] == 1
    assert found[("pipecat_actions_admission_latency_seconds_count", tool)] == 3
    inf = (("le", "+Inf"), *tool)
    assert found[("pipecat_actions_admission_latency_seconds_bucket", inf)] == 3
    assert found[("pipecat_actions_execution_to_commit_seconds_count", tool)] == 1
    assert "# HELP pipecat_actions_timeouts_total Operations whose deadline passed" in text


async def test_start_prometheus_serves_the_metrics_over_http_on_loopback(
    tmp_path: Any, clock: ManualClock
) -> None:
    sor = fake(clock)
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    async with running(POLICY, actions(Bookings(sor)), ledger_url=url, clock=clock) as rt:
        await rt.propose("book_table", booking(), new_session())
        server, thread = start_prometheus(rt, 0)
        try:
            port = server.server_port
            body = await asyncio.to_thread(
                lambda: (
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10)
                    .read()
                    .decode()
                )
            )
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)

    found = _samples(body)
    committed = (("status", "COMMITTED"), ("tool", "book_table"))
    assert found[("pipecat_actions_outcomes_total", committed)] == 1
