"""A pharmacy's voice agent: its actions, on its own system of record. Copy this folder.

Three tools: a status read, a refill that must never be ordered twice, and a transfer to
another pharmacy that a pharmacist approves. `Pharmacy` stands for the pharmacy's API; a real
adapter calls it over the network and sends ``ctx.idempotency_key`` with each request, so the
pharmacy can answer a repeated request with the first answer instead of acting twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pipecat_actions import (
    ActionContext,
    AuthorizationRequest,
    Decision,
    EffectFailed,
    Reconciliation,
    action,
)

if TYPE_CHECKING:
    from pipecat_actions.scenarios import ScenarioApp, ScenarioWorld


@dataclass
class Pharmacy:
    """The pharmacy's system of record: prescriptions, refills ordered (by key), transfers."""

    refills_left: dict[str, int] = field(default_factory=lambda: {"rx-100": 2, "rx-200": 0})
    refills: dict[str, dict[str, Any]] = field(default_factory=dict)
    transfers: list[dict[str, Any]] = field(default_factory=list)

    def refill(self, prescription_id: str, key: str) -> dict[str, Any]:
        """Order a refill; the same key again gets the first answer, and nothing new happens."""
        if key in self.refills:
            return self.refills[key]
        left = self.refills_left.get(prescription_id)
        if left is None:
            raise EffectFailed(f"there is no prescription {prescription_id}")
        if left == 0:
            raise EffectFailed(f"{prescription_id} has no refills left; the doctor must renew it")
        self.refills_left[prescription_id] = left - 1
        order = {"order_id": f"ord-{len(self.refills) + 1}", "ready": "tomorrow"}
        self.refills[key] = order
        return order


def build_actions(pharmacy: Pharmacy) -> list[Any]:
    """The agent's actions on ``pharmacy``: each one needs an entry in policy.yaml."""

    async def find_refill(ctx: ActionContext) -> Reconciliation:
        # The answer to an order was lost: ask the pharmacy whether it has the order's key.
        found = pharmacy.refills.get(ctx.idempotency_key)
        return Reconciliation.committed(found) if found else Reconciliation.not_found()

    @action
    async def refill_status(ctx: ActionContext, prescription_id: str) -> dict[str, Any]:
        """How many refills a prescription has left.

        Args:
            ctx: The operation's context.
            prescription_id: The prescription, as printed on the label (rx-...).
        """
        return {"refills_left": pharmacy.refills_left.get(prescription_id, 0)}

    @action(reconcile=find_refill)
    async def refill_prescription(ctx: ActionContext, prescription_id: str) -> dict[str, Any]:
        """Order a refill of a prescription; it is ready to collect the next day.

        Args:
            ctx: The operation's context (its idempotency key goes to the pharmacy).
            prescription_id: The prescription, as printed on the label (rx-...).
        """
        return pharmacy.refill(prescription_id, ctx.idempotency_key)

    @action
    async def transfer_prescription(
        ctx: ActionContext, prescription_id: str, to_pharmacy: str
    ) -> dict[str, Any]:
        """Move a prescription to another pharmacy (a pharmacist approves it first).

        Args:
            ctx: The operation's context.
            prescription_id: The prescription, as printed on the label (rx-...).
            to_pharmacy: The pharmacy the patient wants it at.
        """
        pharmacy.transfers.append({"prescription_id": prescription_id, "to": to_pharmacy})
        return {"transferred": prescription_id, "to": to_pharmacy}

    return [refill_status, refill_prescription, transfer_prescription]


class Patients:
    """Who may act: here, any signed-in patient. Yours checks the caller against your records."""

    async def authorize(self, request: AuthorizationRequest) -> Decision:
        """Allow a caller the application identified; refuse an anonymous one."""
        if request.principal.startswith("patient-"):
            return Decision.allow()
        return Decision.deny("Please sign in first.")


def scenario_app(world: ScenarioWorld) -> ScenarioApp:
    """The app the scenario files run (``app: ../agent.py:scenario_app``)."""
    from pipecat_actions.scenarios import ScenarioApp

    pharmacy = Pharmacy()
    return ScenarioApp(
        actions=build_actions(pharmacy),
        authorizer=Patients(),
        effects=lambda: {"refill": len(pharmacy.refills), "transfer": len(pharmacy.transfers)},
    )
