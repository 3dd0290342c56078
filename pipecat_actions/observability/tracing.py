"""OpenTelemetry spans for admission, each attempt, reconciliation and delivery.

Off and free unless configured: nothing here imports ``opentelemetry`` until `OtelTracer` is
built, and while tracing is off every instrumentation point gets the shared `NULL_SPAN`
(a context manager that does nothing). Tracing is turned on by `enable_tracing`, or by
itself when the pipeline runs with Pipecat's tracing on (``PipelineWorker(...,
enable_tracing=True)``): the `ActionResultGate` then hands the runtime Pipecat's per-pipeline
tracing context, and the spans become children of Pipecat's turn spans.

Every span carries ``pipecat_actions.session_id``, ``.turn_id``, ``.tool_call_id``,
``.operation_id``, ``.tool`` and ``.idempotency_key_hash`` (the first 16 hex characters of
the SHA-256 of the key). Never the key itself (it names the principal) nor the arguments.
"""

from __future__ import annotations

__all__ = ["NULL_SPAN", "OtelTracer", "Span", "SpanIds", "key_hash"]

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from pipecat_actions.ledger import Operation

AttributeValue = str | int | float | bool


def key_hash(idempotency_key: str) -> str:
    """Return what spans carry instead of an idempotency key: 16 hex chars of its SHA-256."""
    return hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True, slots=True)
class SpanIds:
    """The correlation ids every span of an operation carries."""

    session_id: str
    tool: str
    turn_id: str | None = None
    tool_call_id: str | None = None
    operation_id: str | None = None
    idempotency_key: str | None = None

    @classmethod
    def of(cls, op: Operation) -> SpanIds:
        """Return the ids of an operation as the ledger holds it."""
        return cls(
            session_id=op.session_id,
            tool=op.tool,
            turn_id=op.turn_id,
            tool_call_id=op.provider_call_id,
            operation_id=op.operation_id,
            idempotency_key=op.idempotency_key,
        )

    def attributes(self) -> dict[str, AttributeValue]:
        """Return the span attributes (the key hashed, ids left out when unknown)."""
        found: dict[str, AttributeValue] = {
            "pipecat_actions.session_id": self.session_id,
            "pipecat_actions.tool": self.tool,
        }
        for name, value in (
            ("turn_id", self.turn_id),
            ("tool_call_id", self.tool_call_id),
            ("operation_id", self.operation_id),
        ):
            if value is not None:
                found[f"pipecat_actions.{name}"] = value
        if self.idempotency_key is not None:
            found["pipecat_actions.idempotency_key_hash"] = key_hash(self.idempotency_key)
        return found


class Span(Protocol):
    """What an instrumentation point may do with its span."""

    def set(self, key: str, value: AttributeValue) -> None:
        """Set an attribute (``pipecat_actions.`` is prefixed)."""

    def fail(self, description: str) -> None:
        """Mark the span as an error, with a short description (never arguments)."""

    def as_parent(self) -> Any:
        """Return an OpenTelemetry context with this span as the parent (None: no span)."""


class _NullSpan:
    """The span of every instrumentation point while tracing is off: does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NullSpan:
        return self

    def __exit__(self, *exc_info: object) -> None:
        return None

    def set(self, key: str, value: AttributeValue) -> None:
        """Do nothing."""

    def fail(self, description: str) -> None:
        """Do nothing."""

    def as_parent(self) -> None:
        """No span, no parent."""
        return None


NULL_SPAN = _NullSpan()
"""The one span object used while tracing is off."""


class _OtelSpan:
    __slots__ = ("_span",)

    def __init__(self, span: Any) -> None:
        self._span = span

    def set(self, key: str, value: AttributeValue) -> None:
        self._span.set_attribute(f"pipecat_actions.{key}", value)

    def fail(self, description: str) -> None:
        from opentelemetry.trace import Status, StatusCode

        self._span.set_status(Status(StatusCode.ERROR, description))

    def as_parent(self) -> Any:
        from opentelemetry.trace import set_span_in_context

        return set_span_in_context(self._span)


class OtelTracer:
    """Makes OpenTelemetry spans; imports ``opentelemetry`` when built.

    Args:
        tracer_provider: The provider to use; the global one (the one Pipecat's
            ``setup_tracing`` installs) when None.

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (``pipecat-actions[tracing]``).
    """

    def __init__(self, tracer_provider: Any = None) -> None:
        from opentelemetry import trace

        self._tracer = trace.get_tracer(
            "pipecat_actions", _package_version(), tracer_provider=tracer_provider
        )

    @contextmanager
    def span(self, name: str, ids: SpanIds, parent: Any) -> Iterator[Span]:
        """Open span ``name`` under ``parent`` (an OpenTelemetry context, or None: current).

        The span is current while the block runs, so spans the effect makes (an HTTP
        client's, say) are its children; an exception leaving the block is recorded.
        """
        with self._tracer.start_as_current_span(
            name, context=parent, attributes=ids.attributes()
        ) as span:
            yield _OtelSpan(span)


def _package_version() -> str | None:
    try:
        return version("pipecat-actions")
    except PackageNotFoundError:  # a source tree that was never installed
        return None
