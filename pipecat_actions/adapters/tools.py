"""The tool schemas the model is offered for the runtime's actions (and its own tools).

Each registered action's schema (its description and its argument model's JSON schema), the
runtime's ``cancel_<tool>`` for a mutation whose policy sets ``cancellable_by_llm``, and
``confirm_action`` when a policy asks for verbal confirmations.
"""

from __future__ import annotations

__all__ = ["tools_schema"]

from typing import TYPE_CHECKING

from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema

from pipecat_actions.policy.fields import cancel_tool_name
from pipecat_actions.runtime.calls import CONFIRM_TOOL

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime


def tools_schema(runtime: ActionRuntime) -> ToolsSchema:
    """Return the schemas of every registered action (and ``confirm_action`` when needed)."""
    tools = [
        FunctionSchema(
            name=binding.action.name,
            description=binding.action.description,
            **binding.action.json_schema(),
        )
        for binding in runtime.calls.bindings.values()
        if not binding.action.app_handler  # advertised by the application (or Flows)
    ]
    tools.extend(
        _cancel_schema(name)
        for name in runtime.calls.cancel_tools()
        if runtime.calls.bindings[name].policy.cancellable_by_llm
    )
    if runtime.calls.needs_confirm_tool():
        tools.append(
            FunctionSchema(
                name=CONFIRM_TOOL,
                description=(
                    "Carry out an operation the user has just confirmed out loud. Call it only "
                    "after the user said yes in a new reply, with the operation_id and "
                    "confirmation_token of the needs-confirmation result."
                ),
                properties={
                    "operation_id": {"type": "string"},
                    "confirmation_token": {"type": "string"},
                },
                required=["operation_id", "confirmation_token"],
            )
        )
    return ToolsSchema(standard_tools=tools)


def _cancel_schema(tool: str) -> FunctionSchema:
    """The schema of ``cancel_<tool>``: what the model is told about stopping ``tool``."""
    return FunctionSchema(
        name=cancel_tool_name(tool),
        description=(
            f"Stop a {tool} request the user no longer wants (they say to drop it, or ask for "
            "something that replaces it). Only this call stops it: saying so does not. With no "
            f"arguments it stops the one {tool} request still pending; if several are, give "
            "the operation_id of the one to stop. Its answer is what really happened: "
            "cancelled (nothing happened), cancel requested (the outcome follows), or that it "
            "had already happened (then ask the user whether to undo it, if the answer names "
            "an undo_tool). Tell the user exactly that."
        ),
        properties={
            "operation_id": {
                "type": "string",
                "description": f"Which {tool} request to stop, as its result named it. Needed "
                "only when several are pending.",
            },
            "tool_call_id": {
                "type": "string",
                "description": f"Or the tool_call_id of the {tool} call to stop.",
            },
        },
        required=[],
    )
