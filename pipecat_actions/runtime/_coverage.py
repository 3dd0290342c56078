"""Every policy entry is a tool the LLM can be offered: an action, or a handler routed later.

A policy entry with nothing behind it used to vanish silently from ``tools_schema()``: the LLM
was never offered the tool and nobody was told. `ActionRuntime.create` therefore checks, once
its actions are registered, that each entry is either one of them or a name the application
declares as **routed** (``routed=[...]``): a handler it registers on the LLM itself and routes
through the runtime (``instrument``), or a Pipecat Flows function (`FlowActions`).
Those are registered later (``instrument`` at registration or the first inference, Flows when
a node is set), when no single moment knows the whole set, so they are declared up front
instead of being guessed at.

A Flows ``transition_only`` function runs no code and needs no entry. One that carries an
entry anyway (it used to need one) is not refused: `flow_functions` hands its name over as
one that runs no code (`RoutedNames.transition_only`), and the entry is ignored with a warning.
"""

from __future__ import annotations

__all__ = ["RoutedNames", "check_coverage", "check_declared_arguments", "no_policy_entry"]

import difflib
from collections.abc import Collection, Iterable, Mapping

from loguru import logger

from pipecat_actions.actions import ActionDefinition, Binding
from pipecat_actions.errors import ConfigurationError
from pipecat_actions.policy import PolicySet, ToolPolicy

ROUTED_HINT = (
    "for a handler registered on the LLM (instrument(runtime, llm, session)) or a Pipecat "
    "Flows function (FlowActions), name it in ActionRuntime.create(routed=[...])"
)


class RoutedNames(list[str]):
    """Names for ``ActionRuntime.create(routed=...)``, and the functions that run no code.

    `pipecat_actions.adapters.flows.flow_functions` returns one: the list is the routed names, and
    ``transition_only`` the flow's functions that only move the conversation, whose policy
    entries (if any) are ignored with a warning instead of refused.
    """

    def __init__(self, names: Iterable[str], *, transition_only: Iterable[str] = ()) -> None:
        super().__init__(names)
        self.transition_only: frozenset[str] = frozenset(transition_only)


def no_policy_entry(name: str, policy: PolicySet) -> ConfigurationError:
    """The error for an action ``name`` that ``policy`` has no entry for (with a close one)."""
    close = difflib.get_close_matches(name, policy.names(), n=1)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return ConfigurationError(f"action {name} has no entry in the policy {policy.source}{hint}")


def check_coverage(
    policy: PolicySet,
    bindings: Mapping[str, Binding],
    routed: Collection[str],
    *,
    transition_only: Collection[str] = (),
) -> None:
    """Refuse a policy entry that is neither a registered action nor declared ``routed``.

    An entry for a ``transition_only`` name (a Flows function that runs no code) is ignored,
    with a one-line warning.

    A version 1 policy (0.1.0's format) with such an entry starts, with a one-line warning.

    Raises:
        ConfigurationError: Such an entry (each is named, with the registered actions), or a
            routed name the policy has no entry for, or one that is also an action.
    """
    strays = sorted(set(routed) - set(policy.names()))
    if strays:
        raise ConfigurationError(
            f"routed names tools the policy {policy.source} has no entry for: "
            f"{', '.join(strays)}; every routed handler runs under its policy entry"
        )
    both = sorted(name for name in routed if name in bindings)
    if both:
        raise ConfigurationError(
            f"{', '.join(both)}: named in routed=[...] and also given as an @action; a tool is "
            "one or the other"
        )
    unused = [
        name
        for name in policy.names()
        if name in transition_only and name not in bindings and name not in routed
    ]
    if unused:
        logger.warning(
            "policy {}: {} transition_only in the flow (it runs no code); its entry is ignored "
            "and may be removed",
            policy.source,
            ", ".join(unused),
        )
    missing = [
        name
        for name in policy.names()
        if name not in bindings and name not in routed and name not in transition_only
    ]
    if not missing:
        return
    registered = ", ".join(sorted(bindings)) or "none"
    named = []
    for name in missing:
        close = difflib.get_close_matches(name, list(bindings), n=1)
        named.append(f"{name} (did you mean {close[0]}?)" if close else name)
    if policy.version == 1:
        # 0.1.0 accepted such entries: a version 1 file starts, warned, for one more release.
        logger.warning(
            "policy {}: entries for tools with no action are deprecated (version 1; version 2 "
            "refuses them): {} never offered to the LLM (registered actions: {}); remove them "
            "or, {}",
            policy.source,
            ", ".join(named),
            registered,
            ROUTED_HINT,
        )
        return
    raise ConfigurationError(
        f"the policy {policy.source} has entries for tools with no action: {', '.join(named)}; "
        f"the LLM would never be offered them (registered actions: {registered}). Give an "
        f"@action for each in ActionRuntime.create(actions=[...]), or, {ROUTED_HINT}"
    )


def check_declared_arguments(
    definition: ActionDefinition, policy: ToolPolicy, source: object
) -> None:
    """Refuse an entry's ``arguments:`` list that is not the action's parameters.

    The list is what a reviewer reads as the tool's arguments, and the policy's placeholders,
    key fields and redact paths are checked against it: a name the action does not take (a
    typo, a renamed parameter) would make those checks pass on a field no call ever has, and a
    parameter left out would escape them. A handler that reads its own arguments (its model
    takes any name) declares no parameters to compare with; only unknown names are refused then
    if it declares some.

    Raises:
        ConfigurationError: Names the list has and the action does not take, or parameters
            of the action the list leaves out; each named, with the action's parameters.
    """
    if policy.arguments is None:
        return
    parameters = list(definition.json_schema().get("properties", {}))
    takes_any = definition.args_model.model_config.get("extra") == "allow"
    if takes_any and not parameters:
        return
    declared = list(policy.arguments)
    unknown = [] if takes_any else [name for name in declared if name not in parameters]
    left_out = [name for name in parameters if name not in declared]
    if not unknown and not left_out:
        return
    problems = []
    for name in unknown:
        close = difflib.get_close_matches(name, parameters, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        problems.append(f"{name}{hint}")
    said = []
    if unknown:
        said.append(f"names what the action does not take: {', '.join(problems)}")
    if left_out:
        said.append(f"leaves out its parameters {', '.join(left_out)}")
    raise ConfigurationError(
        f"policy {source}: tools.{definition.name}.arguments {'; and '.join(said)} "
        f"(the action's parameters: {', '.join(parameters) or 'none'}); make the list the "
        "action's parameters, or remove it"
    )
