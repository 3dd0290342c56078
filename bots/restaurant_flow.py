"""The restaurant reservation flow: its config, its policy and the code behind its functions.

``configs/flows/restaurant.yaml`` is a Pipecat Flows `FlowConfig` (greet → collect → book →
confirm, with ``checking`` and ``try_again``); ``configs/restaurant_flow_policy.yaml`` is the
pipecat_actions policy of its functions. `restaurant_flow` joins them to the handlers here
through `FlowActions`, so every call of ``collect_details`` and ``book_table`` is admitted and
recorded by the runtime, and the book node branches on the runtime's truthful status::

    runtime = await ActionRuntime.create(FLOW_POLICY, routed=flow_tools(), ...)
    actions, flow = restaurant_flow(runtime, session, sor)
    flow_manager = FlowManager(worker=worker, llm=llm, context_aggregator=pair,
                               global_functions=flow.global_functions)
    actions.attach(flow_manager, gate)
    flow_manager.state.update(flow_state(today))
    await flow_manager.initialize(flow.initial_node)

The offline flow demo (`bots.flow_demo`) and the Daily bot (``FLOW=1``) both use it.
"""

from __future__ import annotations

__all__ = [
    "FLOW_CONFIG",
    "FLOW_POLICY",
    "flow_handlers",
    "flow_hooks",
    "flow_state",
    "flow_tools",
    "restaurant_flow",
]

import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipecat.flows import TRANSITION_IN_YAML, Flow, FlowConfig, FlowManager

from pipecat_actions import ActionContext, EffectFailed, Reconciliation, action_context
from pipecat_actions.adapters.flows import FlowActions, FunctionHooks, flow_functions
from pipecat_actions.testing.restaurant import RESTAURANT
from pipecat_actions.testing.system_of_record import FakeSystemOfRecord, ProviderRejected

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime
    from pipecat_actions.session import SessionState

ROOT = Path(__file__).resolve().parents[1]
FLOW_CONFIG = ROOT / "configs" / "flows" / "restaurant.yaml"
FLOW_POLICY = ROOT / "configs" / "restaurant_flow_policy.yaml"


def flow_tools(config: str | Path = FLOW_CONFIG) -> list[str]:
    """The flow's functions the runtime routes: ``ActionRuntime.create(routed=flow_tools())``."""
    return flow_functions(FlowConfig.from_file(config))


def flow_state(today: datetime.date | str) -> dict[str, Any]:
    """What the flow's prompts refer to (``{{ restaurant }}``, ``{{ today }}``) before it starts."""
    day = today.isoformat() if isinstance(today, datetime.date) else today
    return {"restaurant": RESTAURANT, "today": day}


def flow_handlers(sor: FakeSystemOfRecord) -> dict[str, Any]:
    """The Flows direct functions the config names, bound to the restaurant ``sor``."""

    async def collect_details(
        flow_manager: FlowManager, date: str, time: str, party_size: int, guest_name: str
    ) -> tuple[dict[str, Any], Any]:
        """Record the caller's booking details once they have given all of them.

        Args:
            flow_manager: The conversation's flow manager (Flows passes it; not for the model).
            date: The day of the booking, YYYY-MM-DD.
            time: The time of the booking, HH:MM on the hour or half hour.
            party_size: How many guests, 1 to 8.
            guest_name: The name the booking is under.
        """
        details = {
            "restaurant_id": RESTAURANT,
            "date": date,
            "time": time,
            "party_size": int(party_size),
            "guest_name": guest_name,
        }
        flow_manager.state["details"] = details
        return details, TRANSITION_IN_YAML

    async def book_table(
        flow_manager: FlowManager,
        restaurant_id: str,
        date: str,
        time: str,
        party_size: int,
        guest_name: str,
    ) -> tuple[dict[str, Any], Any]:
        """Book the table with the details the caller gave; returns the booking reference.

        Args:
            flow_manager: The conversation's flow manager (Flows passes it; not for the model).
            restaurant_id: The restaurant's id.
            date: The day, YYYY-MM-DD.
            time: The time, HH:MM.
            party_size: How many guests.
            guest_name: The name the booking is under.
        """
        try:
            booking = await sor.book(
                restaurant_id,
                date,
                time,
                int(party_size),
                guest_name,
                # The operation's own key: the restaurant deduplicates a retry on it, and the
                # reconcile hook finds the booking under it.
                idempotency_key=action_context().idempotency_key,
            )
        except ProviderRejected as exc:
            raise EffectFailed(str(exc)) from exc
        result = {"booking_id": booking.booking_id, "date": booking.date, "time": booking.time}
        flow_manager.state["booking"] = result
        return result, TRANSITION_IN_YAML

    return {"collect_details": collect_details, "book_table": book_table}


def flow_hooks(sor: FakeSystemOfRecord) -> dict[str, FunctionHooks]:
    """The hooks of the flow's booking: an unknown outcome is asked of the restaurant."""

    async def find_booking(ctx: ActionContext) -> Reconciliation:
        found = sor.find_by_idempotency_key(ctx.idempotency_key)
        if found is None:
            return Reconciliation.not_found()
        return Reconciliation.committed({"booking_id": getattr(found, "booking_id", None)})

    return {"book_table": FunctionHooks(reconcile=find_booking)}


def restaurant_flow(
    runtime: ActionRuntime,
    session: SessionState,
    sor: FakeSystemOfRecord,
    *,
    config: str | Path = FLOW_CONFIG,
) -> tuple[FlowActions, Flow]:
    """The flow's `FlowActions` and its configured `Flow`, its functions routed through ``runtime``.

    Raises:
        ConfigurationError: A function of the config has no entry in the runtime's policy.
    """
    actions = FlowActions(runtime, session, hooks=flow_hooks(sor))
    flow = actions.flow(FlowConfig.from_file(config), handlers=flow_handlers(sor))
    return actions, flow
