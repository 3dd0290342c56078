"""Prometheus exposition of a runtime's in-process metrics (``pipecat-actions[prometheus]``).

For long-running bots::

    from pipecat_actions.observability.prometheus import start_prometheus
    start_prometheus(runtime, port=9464)          # http://127.0.0.1:9464/metrics

or register `ActionMetricsCollector` in a registry you already serve. Series are named
``pipecat_actions_<metric>_total`` (counters), ``pipecat_actions_<metric>`` (gauges) and
``pipecat_actions_<metric>_seconds`` (histograms), labelled by ``tool`` and, for some, one
more label (``outcome``, ``reason``, ``status``, ...); see `METRICS`.

This module imports ``prometheus_client``; nothing else in the package does.
"""

from __future__ import annotations

__all__ = ["ActionMetricsCollector", "Measured", "start_prometheus"]

from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from pipecat_actions.observability.metrics import (
    BUCKETS_SECS,
    ActionMetrics,
    MetricKind,
    Sample,
)

_PREFIX = "pipecat_actions_"


class ActionMetricsCollector(Collector):
    """A Prometheus collector reading an `ActionMetrics` registry at each scrape.

    Args:
        metrics: The registry (``runtime.metrics``).
    """

    def __init__(self, metrics: ActionMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterator[Metric]:
        """Yield one metric family per entry of `METRICS`, with its current series."""
        bounds = [str(b) for b in BUCKETS_SECS] + ["+Inf"]
        for spec, samples in self.metrics.samples():
            labels = ["tool"] if spec.label is None else ["tool", spec.label]
            labelled = spec.label is not None

            family: Metric
            if spec.kind is MetricKind.COUNTER:
                family = CounterMetricFamily(_PREFIX + spec.name, spec.help, labels=labels)
                for sample in samples:
                    family.add_metric(_label_values(sample, labelled), sample.value)
            elif spec.kind is MetricKind.GAUGE:
                family = GaugeMetricFamily(_PREFIX + spec.name, spec.help, labels=labels)
                for sample in samples:
                    family.add_metric(_label_values(sample, labelled), sample.value)
            else:
                family = HistogramMetricFamily(
                    f"{_PREFIX}{spec.name}_seconds", spec.help, labels=labels
                )
                for sample in samples:
                    family.add_metric(
                        _label_values(sample, labelled),
                        list(zip(bounds, [float(n) for n in sample.buckets], strict=True)),
                        sample.total,
                    )
            yield family


def _label_values(sample: Sample, labelled: bool) -> list[str]:
    return [sample.tool, sample.label] if labelled else [sample.tool]


class Measured(Protocol):
    """What `start_prometheus` needs of a runtime: its metrics."""

    @property
    def metrics(self) -> ActionMetrics:
        """The runtime's `ActionMetrics`."""
        ...


def start_prometheus(
    runtime: Measured,
    port: int,
    *,
    addr: str = "127.0.0.1",
    registry: CollectorRegistry | None = None,
) -> tuple[Any, Any]:
    """Serve ``runtime``'s metrics at ``http://addr:port/metrics`` from a daemon thread.

    Args:
        runtime: The runtime whose metrics to serve.
        port: The TCP port (0: any free one; read it from the returned server).
        addr: The address to listen on; loopback by default.
        registry: Where to register the collector; a new registry (only these metrics)
            when None.

    Returns:
        The HTTP server and its thread; ``server.shutdown()`` stops it.
    """
    registry = registry if registry is not None else CollectorRegistry()
    registry.register(ActionMetricsCollector(runtime.metrics))
    server, thread = start_http_server(port, addr=addr, registry=registry)
    return server, thread
