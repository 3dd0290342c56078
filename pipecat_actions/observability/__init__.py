"""Observability: metrics, Prometheus, OpenTelemetry spans, correlation ids, log redaction.

* `ActionMetrics` (``runtime.metrics``): counters, gauges and distributions per tool, fed
  through `Telemetry` (``runtime.telemetry``), the one interface the runtime and the
  processors report to. ``runtime.metrics.snapshot()`` reads them.
* `pipecat_actions.observability.prometheus`: ``start_prometheus(runtime, port)`` or a
  collector, with the optional ``prometheus-client`` (``pipecat-actions[prometheus]``).
* `pipecat_actions.observability.tracing`: spans for admission, attempts, reconciliation and
  delivery, children of Pipecat's turn spans (``pipecat-actions[tracing]``).

* `pipecat_actions.observability.correlation` and ``.redaction``: correlation ids on every
  log line about an operation, and redaction of policy ``redact`` paths and common secrets.

Importing this package imports neither ``prometheus_client`` nor ``opentelemetry``.
"""

from pipecat_actions.observability.metrics import METRICS, ActionMetrics, MetricKind, MetricSpec
from pipecat_actions.observability.telemetry import Telemetry, enable_tracing
from pipecat_actions.observability.tracing import SpanIds, key_hash

__all__ = [
    "METRICS",
    "ActionMetrics",
    "MetricKind",
    "MetricSpec",
    "SpanIds",
    "Telemetry",
    "enable_tracing",
    "key_hash",
]
