"""Every route of the console but the sign-in form asks for the signed-in operator.

The routes are routers per area (`pipecat_actions.console.routes`); the operator is a
dependency (`signed_in`), so a route added without it (a page any passer-by could read) fails
here, not in a review.
"""

from __future__ import annotations

from typing import Any

from fastapi.dependencies.models import Dependant
from fastapi.routing import APIRoute

from pipecat_actions.console.context import signed_in
from pipecat_actions.console.routes import ROUTERS

OPEN_TO_ALL = {("GET", "/login"), ("POST", "/login")}
"""Signing in needs nobody signed in."""


def _asks_for(dependant: Dependant, wanted: Any) -> bool:
    return any(d.call is wanted or _asks_for(d, wanted) for d in dependant.dependencies)


def test_every_route_but_signing_in_depends_on_the_signed_in_operator() -> None:
    routes = [r for router in ROUTERS for r in router.routes if isinstance(r, APIRoute)]
    served = {(method, route.path): route for route in routes for method in route.methods}
    open_to_all = {
        key for key, route in served.items() if not _asks_for(route.dependant, signed_in)
    }
    assert open_to_all == OPEN_TO_ALL
    assert len(served) == 12
    assert ("POST", "/approvals/{operation_id}/approve") in served
    assert ("GET", "/sessions/{session_id:path}") in served
