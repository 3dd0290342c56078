"""A policy's ``arguments:`` list that is not the action's parameters stops start-up, said exactly.

The list is what a reviewer reads as the tool's arguments, and the policy's placeholders and key
fields are checked against it: a typo or a renamed parameter would let those checks pass on a
field no call ever has.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, ConfigurationError, action
from pipecat_actions.policy import load_policy_text


@action
async def book_table(ctx: ActionContext, time: str, party_size: int = 2) -> dict[str, Any]:
    """Book a table."""
    return {"booked": time}


def _policy(arguments: str) -> Any:
    return load_policy_text(
        f"version: 1\ntools:\n  book_table:\n    kind: mutation\n    arguments: {arguments}\n",
        source="policy.yaml",
    )


async def _create(tmp_path: Path, arguments: str) -> ActionRuntime:
    return await ActionRuntime.create(
        _policy(arguments),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )


async def test_a_name_the_action_does_not_take_is_refused_with_the_close_parameter(
    tmp_path: Path,
) -> None:
    with pytest.raises(ConfigurationError) as refused:
        await _create(tmp_path, "[time, party]")
    message = str(refused.value)
    assert message == (
        "policy policy.yaml: tools.book_table.arguments names what the action does not take: "
        "party (did you mean party_size?); and leaves out its parameters party_size (the "
        "action's parameters: time, party_size); make the list the action's parameters, or "
        "remove it"
    )


async def test_a_parameter_the_list_leaves_out_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match=r"leaves out its parameters party_size \("):
        await _create(tmp_path, "[time]")


async def test_a_list_that_is_the_parameters_in_any_order_starts(tmp_path: Path) -> None:
    runtime = await _create(tmp_path, "[party_size, time]")
    await runtime.close()


async def test_an_entry_without_a_list_starts(tmp_path: Path) -> None:
    runtime = await ActionRuntime.create(
        load_policy_text("version: 1\ntools:\n  book_table:\n    kind: mutation\n"),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )
    await runtime.close()
