"""In-process metrics: counters, gauges and distributions per tool, in one small registry.

The runtime and the processors never touch this registry directly: they report what happened
to `Telemetry` (one narrow interface), which turns it into the metrics listed in `METRICS`.
Read it with `ActionMetrics.snapshot` (plain data, per tool, with the derived rates), or
expose it to Prometheus with `pipecat_actions.observability.prometheus`.

The registry is written from the event loop and may be read from another thread (the
Prometheus HTTP server), so every access holds one uncontended lock.
"""

from __future__ import annotations

__all__ = ["BUCKETS_SECS", "METRICS", "ActionMetrics", "MetricKind", "MetricSpec", "Sample"]

import bisect
import statistics
import threading
from collections import deque
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class MetricKind(StrEnum):
    """How a metric behaves."""

    COUNTER = "counter"
    """Only grows: how many times something happened."""
    GAUGE = "gauge"
    """Goes up and down: how many things are in a state now."""
    HISTOGRAM = "histogram"
    """A distribution of durations in seconds."""


@dataclass(frozen=True)
class MetricSpec:
    """One metric of the catalogue.

    Attributes:
        name: Its name (Prometheus adds ``pipecat_actions_`` and ``_total`` or ``_seconds``).
        kind: Counter, gauge or histogram.
        help: What it counts, in plain words.
        label: The name of its extra label besides ``tool`` (e.g. ``reason``), if any.
    """

    name: str
    kind: MetricKind
    help: str
    label: str | None = None


C, G, H = MetricKind.COUNTER, MetricKind.GAUGE, MetricKind.HISTOGRAM

METRICS: tuple[MetricSpec, ...] = (
    MetricSpec(
        "proposals", C, "Tool calls proposed by the model, by admission outcome.", "outcome"
    ),
    MetricSpec("operations", C, "Operations started (mutations admitted, reads run)."),
    MetricSpec("refusals", C, "Calls refused at admission, by reason.", "reason"),
    MetricSpec(
        "duplicates_suppressed",
        C,
        "Repeated requests not executed again: joined to the first one or rejected.",
        "how",
    ),
    MetricSpec("attempts", C, "Calls of the effect (first attempts and retries)."),
    MetricSpec("retries", C, "Attempts after the first one."),
    MetricSpec("timeouts", C, "Operations whose deadline passed before they had an outcome."),
    MetricSpec("outcomes", C, "Operations reaching a final status, by status.", "status"),
    MetricSpec("unknown", C, "Operations that entered UNKNOWN (the outcome was not known)."),
    MetricSpec("late_answers", C, "Effects that answered after the deadline or a cancel."),
    MetricSpec(
        "late_results",
        C,
        "Outcomes told after the conversation moved on (a late developer message).",
    ),
    MetricSpec("suppressed_results", C, "Late outcomes recorded but not told (policy)."),
    MetricSpec("cancellations_requested", C, "Cancellations asked of the system of record."),
    MetricSpec("cancellations_confirmed", C, "Requested cancellations the provider confirmed."),
    MetricSpec("cancelled_before_send", C, "Operations cancelled before anything was sent."),
    MetricSpec("compensations", C, "Compensation operations started."),
    MetricSpec("compensated", C, "Committed operations reversed by a compensation."),
    MetricSpec("handoffs_with_pending", C, "Pending operations of a session at an agent handoff."),
    MetricSpec(
        "reconciliations", C, "Reconciliations of UNKNOWN operations, by finding.", "result"
    ),
    MetricSpec("reconciliation_errors", C, "Reconcile hooks that raised."),
    MetricSpec("escalations", C, "UNKNOWN operations handed to a person."),
    MetricSpec(
        "conflicts",
        C,
        "Operations the ledger held as failed that the system of record reports committed.",
    ),
    MetricSpec("unknown_now", G, "Operations in UNKNOWN now (as seen by this process)."),
    MetricSpec("admission_latency", H, "From a call's proposal to the admission decision."),
    MetricSpec("execution_to_commit", H, "From sending the committing attempt to COMMITTED."),
    MetricSpec("admission_to_commit", H, "From the operation's creation to COMMITTED."),
    MetricSpec(
        "commit_to_acknowledged",
        H,
        "From COMMITTED to the bot finishing, uninterrupted, the reply that told it.",
    ),
)
"""Every metric the registry keeps; exporters and the documentation's list come from this table."""

SPECS: Mapping[str, MetricSpec] = {spec.name: spec for spec in METRICS}
_HISTOGRAMS = frozenset(spec.name for spec in METRICS if spec.kind is MetricKind.HISTOGRAM)
_VALUES = frozenset(SPECS) - _HISTOGRAMS

BUCKETS_SECS: tuple[float, ...] = (
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
    300.0,
)
"""Upper bounds of the histogram buckets, in seconds (an implicit +Inf bucket follows)."""

_RECENT = 1024
"""How many recent values a distribution keeps for its quantiles in `snapshot`."""


@dataclass
class _Distribution:
    count: int = 0
    total: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_SECS) + 1))
    recent: deque[float] = field(default_factory=lambda: deque(maxlen=_RECENT))

    def add(self, value: float) -> None:
        self.count += 1
        self.total += value
        self.buckets[bisect.bisect_left(BUCKETS_SECS, value)] += 1
        self.recent.append(value)

    def summary(self) -> dict[str, float]:
        ordered = sorted(self.recent)
        return {
            "count": self.count,
            "sum_secs": round(self.total, 6),
            "p50_secs": round(statistics.median(ordered), 6),
            "p95_secs": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.95))], 6),
            "max_secs": round(ordered[-1], 6),
        }


@dataclass(frozen=True)
class Sample:
    """One series of a metric, for exporters.

    Attributes:
        tool: The tool label.
        label: The value of the metric's extra label ("" when it has none).
        value: A counter's or gauge's value (histograms: the count).
        buckets: Histogram only: cumulative counts per bucket of `BUCKETS_SECS`, then +Inf.
        total: Histogram only: the sum of every value, in seconds.
    """

    tool: str
    label: str
    value: float
    buckets: tuple[int, ...] = ()
    total: float = 0.0


class ActionMetrics:
    """Counters, gauges and distributions of the metrics in `METRICS`, per tool."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, str, str], float] = {}
        self._distributions: dict[tuple[str, str], _Distribution] = {}

    def add(self, name: str, tool: str, amount: float = 1.0, *, label: str = "") -> None:
        """Add ``amount`` to a counter, or to a gauge (negative to lower it).

        Raises:
            KeyError: ``name`` is not a counter or gauge of `METRICS`.
        """
        if name not in _VALUES:
            raise KeyError(f"{name} is not a counter or gauge of METRICS")
        key = (name, tool, label)
        with self._lock:
            self._values[key] = self._values.get(key, 0.0) + amount

    def observe(self, name: str, tool: str, secs: float) -> None:
        """Record one duration of a histogram.

        Raises:
            KeyError: ``name`` is not a histogram of `METRICS`.
        """
        if name not in _HISTOGRAMS:
            raise KeyError(f"{name} is not a histogram of METRICS")
        key = (name, tool)
        with self._lock:
            distribution = self._distributions.get(key)
            if distribution is None:
                distribution = self._distributions[key] = _Distribution()
            distribution.add(max(secs, 0.0))

    def value(self, name: str, tool: str, label: str = "") -> float:
        """Return a counter's or gauge's current value (0 when never touched)."""
        with self._lock:
            return self._values.get((name, tool, label), 0.0)

    def samples(self) -> Iterator[tuple[MetricSpec, list[Sample]]]:
        """Yield every metric of `METRICS` with its current series (a consistent copy)."""
        with self._lock:
            values = dict(self._values)
            distributions = {
                key: (d.count, d.total, tuple(d.buckets)) for key, d in self._distributions.items()
            }
        for spec in METRICS:
            if spec.kind is MetricKind.HISTOGRAM:
                series = []
                for (name, tool), (count, total, buckets) in sorted(distributions.items()):
                    if name != spec.name:
                        continue
                    cumulative, running = [], 0
                    for n in buckets:
                        running += n
                        cumulative.append(running)
                    series.append(Sample(tool, "", count, tuple(cumulative), total))
            else:
                series = [
                    Sample(tool, label, value)
                    for (name, tool, label), value in sorted(values.items())
                    if name == spec.name
                ]
            yield spec, series

    def snapshot(self) -> dict[str, Any]:
        """Return every metric as plain data: per tool, then the rates derived from them.

        Counters with a label are a mapping of label to count; histograms give count, sum,
        p50, p95 and max (quantiles over the most recent values). Rates per tool:
        ``timeout_rate`` and ``retry_rate`` per operation started, ``duplicate_rate`` per call
        proposed, ``cancel_confirm_rate`` per cancellation requested.
        """
        with self._lock:
            values = dict(self._values)
            summaries = {key: d.summary() for key, d in self._distributions.items() if d.count}
        tools: dict[str, dict[str, Any]] = {}
        for (name, tool, label), value in sorted(values.items()):
            entry = tools.setdefault(tool, {})
            number = int(value) if float(value).is_integer() else value
            if SPECS[name].label is None:
                entry[name] = number
            else:
                entry.setdefault(name, {})[label] = number
        for (name, tool), summary in sorted(summaries.items()):
            tools.setdefault(tool, {})[f"{name}_secs"] = summary
        for entry in tools.values():
            entry["rates"] = _rates(entry)
        return {"tools": tools}


def _total(entry: Mapping[str, Any], name: str) -> float:
    value = entry.get(name, 0)
    return float(sum(value.values())) if isinstance(value, Mapping) else float(value)


def _ratio(part: float, whole: float) -> float | None:
    return None if whole <= 0 else round(part / whole, 4)


def _rates(entry: Mapping[str, Any]) -> dict[str, float | None]:
    operations = _total(entry, "operations")
    return {
        "timeout_rate": _ratio(_total(entry, "timeouts"), operations),
        "retry_rate": _ratio(_total(entry, "retries"), operations),
        "duplicate_rate": _ratio(
            _total(entry, "duplicates_suppressed"), _total(entry, "proposals")
        ),
        "cancel_confirm_rate": _ratio(
            _total(entry, "cancellations_confirmed"), _total(entry, "cancellations_requested")
        ),
    }
