"""The approvals console: the operator's side of the ledger, in a browser.

``pipecat-actions console --ledger URL --users FILE`` serves it on 127.0.0.1:8321. It shows
what waits for a person (the exact arguments and their hash, the before-state, who asked, the
tool's risk, who may decide and a live countdown to the request's expiry), lets an operator
approve or reject it with a reason, and shows every operation with its audit timeline, the
conflicts (an operation the ledger held as failed that the system of record reports
committed), the committed operations someone is owed and was never told (never a read), and
the UNKNOWN ones (with the reconcile action
when ``--app`` names the application's `OperatorApp`). Pages update without a reload when the
agent adds or settles an operation.

Operators sign in with a credentials file (`pipecat_actions.console.users`), or a reverse proxy
signs them in and names them in a trusted header (``--user-header``, ``--roles-header``). Every
decision is checked by `pipecat_actions.approvals`: the approver must be one the tool's policy
names, never the requester, with a reason, for the arguments' hash shown on the page.
"""

from __future__ import annotations

__all__ = ["ConsoleSettings", "RunningConsole", "create_app", "serve", "start_console"]

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipecat_actions.console.app import ConsoleSettings, create_app
    from pipecat_actions.console.server import RunningConsole, serve, start_console

_WHERE = {
    "ConsoleSettings": "app",
    "create_app": "app",
    "RunningConsole": "server",
    "serve": "server",
    "start_console": "server",
}


def __getattr__(name: str) -> Any:
    # Imported when first used: the CLI reads the credentials file without loading FastAPI.
    if name not in _WHERE:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(f"{__name__}.{_WHERE[name]}"), name)
