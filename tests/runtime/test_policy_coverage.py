"""Every policy entry is a tool the LLM can be offered: an action, or a handler declared routed.

A policy entry with nothing behind it used to vanish from ``tools_schema()`` without a word.
`ActionRuntime.create` now refuses it, naming it and the registered actions; handlers the
application registers on the LLM (``pipecat_actions.instrument``) and Flows functions are registered
later, so their names are declared at ``create(routed=[...])`` and are never refused.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pipecat.flows import FlowConfig
from pipecat.services.llm_service import FunctionCallParams

from pipecat_actions import (
    ActionContext,
    ActionRuntime,
    AllowAll,
    ConfigurationError,
    action,
    instrument,
)
from pipecat_actions.adapters.flows import flow_functions
from pipecat_actions.operator import OperatorApp, reconcile
from pipecat_actions.policy import load_policy_text
from pipecat_actions.session import SessionState
from pipecat_actions.testing import ScriptedLLM, capture_logs

POLICY = load_policy_text(
    """
version: 2
tools:
  book_table:
    kind: mutation
  lookup_order:
    kind: read
"""
)


@action
async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
    """Book a table."""
    return {"booked": time}


@action
async def lookup_order(ctx: ActionContext, order_id: str) -> dict[str, Any]:
    """Look an order up."""
    return {"order_id": order_id}


def _url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path}/l.db"


async def _refused(tmp_path: Path, policy: Any = POLICY, **options: Any) -> str:
    with pytest.raises(ConfigurationError) as refused:
        await ActionRuntime.create(
            policy, authorizer=AllowAll(), ledger_url=_url(tmp_path), **options
        )
    return str(refused.value)


async def test_a_policy_entry_with_no_action_is_refused_at_create_naming_it(
    tmp_path: Path,
) -> None:
    message = await _refused(tmp_path, actions=[book_table])
    assert "lookup_order" in message
    assert "book_table" in message  # the registered actions, to compare with
    assert "never be offered" in message
    assert "routed=" in message  # what to do for an instrumented or Flows handler


async def test_a_policy_with_no_action_at_all_names_every_entry(tmp_path: Path) -> None:
    message = await _refused(tmp_path)
    assert "book_table, lookup_order" in message
    assert "registered actions: none" in message


async def test_an_entry_close_to_a_registered_action_is_suggested(tmp_path: Path) -> None:
    typo = load_policy_text(
        "version: 2\ntools:\n  book_table:\n    kind: mutation\n"
        "  book_tables:\n    kind: mutation\n"
    )
    message = await _refused(tmp_path, typo, actions=[book_table])
    assert "book_tables (did you mean book_table?)" in message


async def test_an_action_whose_entry_is_misspelt_is_refused_with_the_entry_it_resembles(
    tmp_path: Path,
) -> None:
    typo = load_policy_text("version: 2\ntools:\n  book_tabel:\n    kind: mutation\n")
    message = await _refused(tmp_path, typo, actions=[book_table])
    assert "action book_table has no entry in the policy" in message
    assert "did you mean book_tabel?" in message


async def test_names_declared_routed_pass_and_an_instrumented_handler_runs_under_its_entry(
    tmp_path: Path,
) -> None:
    runtime = await ActionRuntime.create(
        POLICY,
        authorizer=AllowAll(),
        actions=[book_table],
        routed=["lookup_order"],
        ledger_url=_url(tmp_path),
    )
    try:
        assert runtime.routed == frozenset({"lookup_order"})

        async def lookup(params: FunctionCallParams) -> None:
            await params.result_callback({"order_id": params.arguments["order_id"]})

        llm = ScriptedLLM([])
        instrument(runtime, llm, SessionState(session_id="s1", principal="alice"))
        llm.register_function("lookup_order", lookup)
        assert runtime.bindings["lookup_order"].action.app_handler
    finally:
        await runtime.close()


async def test_a_routed_name_with_no_entry_or_that_is_also_an_action_is_refused(
    tmp_path: Path,
) -> None:
    stray = await _refused(tmp_path, actions=[book_table, lookup_order], routed=["lookup_orders"])
    assert "lookup_orders" in stray and "no entry" in stray
    both = await _refused(tmp_path, actions=[book_table, lookup_order], routed=["book_table"])
    assert "book_table" in both and "routed" in both


def test_flow_functions_lists_what_flow_actions_routes(tmp_path: Path) -> None:
    config = FlowConfig.model_validate(
        {
            "initial_node": "greet",
            "global_functions": [{"name": "lookup_order"}],
            "nodes": {
                "greet": {
                    "task_messages": [{"role": "system", "content": "Greet."}],
                    "functions": [
                        {"name": "book_table"},
                        {"name": "ask_again", "description": "Ask.", "transition_only": True,
                         "transition_to": "greet"},
                        {"name": "note_it"},
                    ],
                }
            },
        }
    )  # fmt: skip
    assert flow_functions(config) == ["lookup_order", "book_table", "note_it"]
    assert flow_functions(config, unmanaged=["note_it"]) == ["lookup_order", "book_table"]


async def test_an_operator_app_declares_the_tools_its_bot_routes(tmp_path: Path) -> None:
    from pipecat_actions.ledger import SqlLedger

    ledger = await SqlLedger.create(_url(tmp_path))
    try:
        app = OperatorApp(policy=POLICY, actions=[book_table], routed=["lookup_order"])
        assert await reconcile(ledger, app, actor="operator:test") == []
        with pytest.raises(ConfigurationError, match="lookup_order"):
            await reconcile(
                ledger, OperatorApp(policy=POLICY, actions=[book_table]), actor="operator:test"
            )
    finally:
        await ledger.close()


async def test_a_transition_only_flow_function_with_a_policy_entry_starts_with_one_warning(
    tmp_path: Path,
) -> None:
    # README users wrote an entry for every flow function; a transition_only one runs no code,
    # and its entry is ignored (said once, on one line), not a reason to refuse start-up.
    config = FlowConfig.model_validate(
        {
            "initial_node": "greet",
            "nodes": {
                "greet": {
                    "task_messages": [{"role": "system", "content": "Greet."}],
                    "functions": [
                        {"name": "book_table"},
                        {"name": "lookup_order", "description": "Ask.", "transition_only": True,
                         "transition_to": "greet"},
                    ],
                }
            },
        }
    )  # fmt: skip
    with capture_logs("WARNING") as warned:
        runtime = await ActionRuntime.create(
            POLICY, authorizer=AllowAll(), ledger_url=_url(tmp_path), routed=flow_functions(config)
        )
    await runtime.close()

    (line,) = [text for text in warned if "lookup_order" in text]
    assert "transition_only" in line and "ignored" in line and "\n" not in line.strip()
    # An entry no function of the flow stands behind is still refused.
    others = load_policy_text(
        "version: 2\ntools:\n  book_table:\n    kind: mutation\n  pay:\n    kind: mutation\n"
    )
    refused = await _refused(tmp_path, others, routed=flow_functions(config))
    assert "pay" in refused and "no action" in refused
