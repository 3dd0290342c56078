"""The console's routes, one router per area; each asks for the operator with ``Depends``.

* `sign_in`: ``/login`` and ``/logout``;
* `pages`: the front page, its live fragments and ``/events``;
* `operations`: one operation (and revealing its sealed values, reconciling it) and one
  conversation's timeline;
* `approvals`: the decisions.

What a route needs it declares (`pipecat_actions.console.context`): the `Console`, the
signed-in operator, the ledger as that operator may see it.
"""

from __future__ import annotations

__all__ = ["ROUTERS"]

from fastapi import APIRouter

from pipecat_actions.console.routes import approvals, operations, pages, sign_in

ROUTERS: tuple[APIRouter, ...] = (
    sign_in.router,
    pages.router,
    operations.router,
    approvals.router,
)
