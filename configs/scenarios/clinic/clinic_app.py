"""A clinic's agent, as a team would test its own: its actions and its own system of record.

The scenario files in ``scenarios/`` run this app (``app: ../clinic_app.py:build``, found relative
to the scenario file) with ``version: 2``: the runner calls ``build(world)`` with the
scenario's clock and the file's ``seed``, and wraps every effect and hook below in its fault
layer, so ``fault: {on: book_appointment, fault: lose_response_after_commit}`` happens to this
code exactly as it would to the built-in restaurant.

`AppointmentBook` stands for the clinic's scheduling API. A real adapter calls it over the
network with the idempotency key as a header; the in-memory book answers the same questions:
book (deduplicated on the key), look an appointment up by key (for ``reconcile``), cancel
(for ``compensate``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipecat_actions import ActionContext, EffectFailed, Reconciliation, action
from pipecat_actions.clock import Clock
from pipecat_actions.scenarios import ScenarioApp, ScenarioWorld


@dataclass
class AppointmentBook:
    """The clinic's appointments: one patient per doctor and slot."""

    clock: Clock
    taken: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    by_key: dict[str, dict[str, Any]] = field(default_factory=dict)
    committed: int = 0

    def book(self, doctor: str, slot: str, patient: str, key: str | None) -> dict[str, Any]:
        """Book ``slot`` with ``doctor``; a repeated ``key`` gets the first answer again."""
        if key is not None and key in self.by_key:
            return self.by_key[key]  # the same request again: the first answer, no new effect
        if (doctor, slot) in self.taken:
            raise EffectFailed(f"{doctor} is not free at {slot}")
        appointment = {
            "appointment_id": f"ap_{len(self.taken) + 1:03d}",
            "doctor": doctor,
            "slot": slot,
            "patient": patient,
            "status": "booked",
        }
        self.taken[(doctor, slot)] = appointment
        if key is not None:
            self.by_key[key] = appointment
        self.committed += 1
        return appointment


def build(world: ScenarioWorld) -> ScenarioApp:
    """The clinic's actions on a fresh appointment book seeded from the scenario's ``seed``."""
    book = AppointmentBook(world.clock)
    for taken in world.seed.get("appointments", []):
        book.book(taken["doctor"], taken["slot"], taken.get("patient", "someone else"), None)
    book.committed = 0  # what the story starts with is not one of its effects

    async def find_by_key(ctx: ActionContext) -> Reconciliation:
        found = book.by_key.get(ctx.idempotency_key)
        return Reconciliation.committed(found) if found else Reconciliation.not_found()

    async def cancel_appointment(ctx: ActionContext) -> dict[str, Any]:
        assert ctx.operation is not None
        appointment = dict(ctx.operation.result or {})
        book.taken.pop((appointment["doctor"], appointment["slot"]), None)
        return {"appointment_id": appointment["appointment_id"], "status": "cancelled"}

    @action
    async def free_slots(ctx: ActionContext, doctor: str) -> dict[str, Any]:
        """The slots a doctor has free today.

        Args:
            ctx: The operation's context.
            doctor: The doctor's name.
        """
        slots = ["09:00", "09:30", "10:00", "10:30"]
        return {"doctor": doctor, "free": [s for s in slots if (doctor, s) not in book.taken]}

    @action(reconcile=find_by_key, compensate=cancel_appointment)
    async def book_appointment(ctx: ActionContext, doctor: str, slot: str) -> dict[str, Any]:
        """Book an appointment with a doctor.

        Args:
            ctx: The operation's context (its idempotency key goes to the book).
            doctor: The doctor's name.
            slot: The time, HH:MM.
        """
        return book.book(doctor, slot, ctx.principal, ctx.idempotency_key)

    return ScenarioApp(
        actions=[free_slots, book_appointment],
        effects=lambda: {"appointment": book.committed},
        effects_for_key=lambda key: 1 if key in book.by_key else 0,
    )
