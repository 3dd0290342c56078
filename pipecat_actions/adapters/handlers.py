"""Binding the runtime to a Pipecat `LLMService`: one handler per action (`attach`).

Pipecat has no pre-run hook for tool calls, so admission happens inside the handler the
runtime registers for each action. The handler never runs the effect itself: it proposes the
call to the runtime, which runs it in a task of its own, and waits (shielded) for the outcome.
When Pipecat cancels the handler (a barge-in on a blocking tool, Pipecat's ``timeout_secs``, or
an LLM ``cancel_<tool>`` call), only the waiting stops; the action's ``on_interruption`` policy
decides what happens to the business action.

The schemas the model is offered are `pipecat_actions.adapters.tools`; handlers the
application registers itself go through the runtime with `pipecat_actions.adapters.routed`.
"""

from __future__ import annotations

__all__ = [
    "CONFIRM_TOOL",
    "asks_for_confirmation",
    "attach",
    "attached_to",
    "cancel_target",
    "needs_confirm_tool",
    "owns_tool",
]

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pipecat.frames.frames import TTSSpeakFrame
from pipecat.services.llm_service import FunctionCallParams, LLMService

from pipecat_actions.adapters._pipecat_private import llm_service
from pipecat_actions.filler import Filler
from pipecat_actions.policy import ExecutionMode, FillerPolicy
from pipecat_actions.policy.fields import cancel_tool_name
from pipecat_actions.runtime.calls import CONFIRM_TOOL, asks_for_confirmation
from pipecat_actions.session import SessionState, warn_if_untracked
from pipecat_actions.status import ActionStatus

if TYPE_CHECKING:
    from pipecat_actions.runtime import ActionRuntime


def owns_tool(runtime: ActionRuntime, tool: str) -> bool:
    """Whether calls of ``tool`` are the runtime's (`Calls.owns`)."""
    return runtime.calls.owns(tool)


def attach(runtime: ActionRuntime, llm: LLMService, session: SessionState) -> None:
    """Register a handler on ``llm`` for every action of ``runtime``, bound to ``session``.

    Each mutation also gets ``cancel_<name>`` (unless that is a tool of its own): the model's
    request to stop it, answered by `ActionRuntime.cancel_for_model`; advertised by
    `tools_schema` only when the policy sets ``cancellable_by_llm``.
    """
    for name, binding in runtime.calls.bindings.items():
        if binding.action.app_handler:
            continue  # Pipecat calls the application's own handler, routed through the runtime
        # cancellable_by_llm is the runtime's (cancel_<name>, below), never Pipecat's own:
        # Pipecat's answers {"cancelled": ...} whatever became of the action.
        llm.register_function(
            name,
            _attached(_handler(runtime, name, session), runtime, session),
            cancel_on_interruption=binding.policy.cancel_on_interruption,
            timeout_secs=binding.policy.timeout_secs,
            cancellable_by_llm=False,
        )
    for name in runtime.calls.cancel_tools():
        # Also for a tool whose policy does not allow it (not advertised then): a model that
        # calls it anyway is refused in words, and the action goes on.
        _register_cancel_tool(runtime, llm, name, session)
    if needs_confirm_tool(runtime):

        async def confirm(params: FunctionCallParams) -> None:
            args = params.arguments

            async def announce(tool: str) -> None:
                # The confirmed background action starts now: its line is said, as when a
                # background action starts without a confirmation.
                line = _announcement(runtime, tool)
                if line:
                    await params.llm.push_frame(TTSSpeakFrame(line))

            result = await runtime.calls.confirm(
                str(args.get("operation_id", "")),
                str(args.get("confirmation_token", "")),
                session,
                on_started=announce,
            )
            await params.result_callback(result)

        llm.register_function(CONFIRM_TOOL, _attached(confirm, runtime, session))


def attached_to(llm: LLMService, tool: str) -> tuple[ActionRuntime, SessionState] | None:
    """The runtime and session whose `attach` registered ``llm``'s handler of ``tool``, if any.

    None when ``tool`` has no handler on ``llm``, or one `attach` did not register (the
    application's own, or none at all: Pipecat then answers the model that the function "is
    not currently available").
    """
    item = llm_service(llm)._functions.get(tool)
    owner = getattr(item.handler, _ATTACHED, None) if item is not None else None
    return owner if isinstance(owner, tuple) else None


_ATTACHED = "_pipecat_actions_attached"
"""The attribute of a handler `attach` registered: its runtime and session."""


def _attached(
    handler: Callable[..., Any], runtime: ActionRuntime, session: SessionState
) -> Callable[..., Any]:
    setattr(handler, _ATTACHED, (runtime, session))
    # `instrument` on the same service leaves it alone: it is the runtime's already.
    handler._pipecat_actions_wrapped = True  # type: ignore[attr-defined]
    return handler


def _announcement(runtime: ActionRuntime, tool: str) -> str | None:
    """The ``announce`` line of a background ``tool``, if it has one."""
    binding = runtime.calls.bindings.get(tool)
    policy = binding.policy if binding is not None else None
    return policy.announce if policy and policy.mode is ExecutionMode.BACKGROUND else None


def _filler_policy(runtime: ActionRuntime, tool: str) -> FillerPolicy | None:
    """The ``delivery.filler`` of a blocking ``tool``, if it has one."""
    binding = runtime.calls.bindings.get(tool)
    policy = binding.policy if binding is not None else None
    if policy is None or policy.mode is not ExecutionMode.BLOCKING:
        return None
    return policy.delivery.filler


class _Lines:
    """What the bot says while a call of the runtime's is under way: ``announce``, the filler.

    Both go through the normal TTS path (a ``TTSSpeakFrame`` pushed by the LLM service). The
    filler runs from the moment the action started until `stop`, which the handler awaits
    before it hands the call's result to Pipecat: a line is either ahead of the result in the
    pipeline or not said at all (see `pipecat_actions.filler`).
    """

    def __init__(
        self,
        runtime: ActionRuntime,
        tool: str,
        session: SessionState,
        llm: LLMService,
        *,
        announce: bool = True,
    ) -> None:
        self._runtime = runtime
        self._session = session
        self._llm = llm
        self.announcement = _announcement(runtime, tool) if announce else None
        self._filler = _filler_policy(runtime, tool)
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def needed(self) -> bool:
        """Whether anything is said while a call of this tool runs."""
        return bool(self.announcement) or self._filler is not None

    async def say(self, line: str) -> None:
        """Say ``line`` now."""
        await self._llm.push_frame(TTSSpeakFrame(line))

    async def started(self, operation_id: str) -> None:
        """The call's action started: say its announcement, and start its filler."""
        if self.announcement:
            # Said when a background action starts, so the user does not fill the silence
            # and ask again; the policy checks it claims no outcome.
            await self.say(self.announcement)
        if self._filler is not None:
            filler = Filler(
                self._filler,
                clock=self._runtime.calls.clock,
                session=self._session,
                outcome_known=lambda: self._runtime.calls.has_outcome(operation_id),
                say=self.say,
            )
            self._tasks.append(asyncio.get_running_loop().create_task(filler.run()))

    async def stop(self) -> None:
        """Stop the filler, and wait until it has stopped."""
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


def _handler(runtime: ActionRuntime, name: str, session: SessionState) -> Callable[..., Any]:
    async def handler(params: FunctionCallParams) -> None:
        warn_if_untracked(session, f"a call of {name} arrived")
        lines = _Lines(runtime, name, session, params.llm)
        try:
            result = await runtime.calls.propose(
                name,
                dict(params.arguments),
                session,
                tool_call_id=params.tool_call_id,
                on_started=lines.started if lines.needed else None,
            )
        finally:
            await lines.stop()  # before the result: a filler line never follows the outcome
        waits = result.status is ActionStatus.AWAITING_APPROVAL
        if lines.announcement and waits:
            # It waits for a person: the user hears the line too, and waits without asking
            # again (it claims no outcome; the approval's outcome is told later).
            await lines.say(lines.announcement)
        await params.result_callback(result)

    handler.__name__ = f"pipecat_actions_{name}"
    return handler


def _cancel_handler(runtime: ActionRuntime, tool: str, session: SessionState) -> Any:
    """The handler of ``cancel_<tool>``: the runtime's truthful cancel, never Pipecat's."""

    async def handler(params: FunctionCallParams) -> None:
        result = await runtime.calls.cancel_for_model(
            tool, dict(params.arguments or {}), session, tool_call_id=params.tool_call_id
        )
        await params.result_callback(result)

    handler.__name__ = f"pipecat_actions_{cancel_tool_name(tool)}"
    handler._pipecat_actions_wrapped = True  # type: ignore[attr-defined]  # not the app's
    return handler


def cancel_target(runtime: ActionRuntime, tool: str) -> str | None:
    """The mutation whose calls ``tool`` stops, if it is the runtime's (`Calls.cancel_target`)."""
    return runtime.calls.cancel_target(tool)


def _register_cancel_tool(
    runtime: ActionRuntime, llm: LLMService, tool: str, session: SessionState
) -> None:
    """Register the runtime's ``cancel_<tool>`` on ``llm``, in place of Pipecat's own."""
    name = cancel_tool_name(tool)
    if cancel_target(runtime, name) != tool:
        return
    private = llm_service(llm)
    builtin: set[str] = private._cancel_tool_names
    if name in builtin:
        # Pipecat made its own (the application registered the tool with
        # cancellable_by_llm=True before it was routed here): it would answer
        # {"cancelled": ...} whatever became of the action.
        builtin.discard(name)
        private._adapter.builtin_tools.pop(name, None)
        private._functions.pop(name, None)
    # A barge-in on the cancel call itself stops only the waiting: the request runs on.
    llm.register_function(name, _cancel_handler(runtime, tool, session))


def needs_confirm_tool(runtime: ActionRuntime) -> bool:
    """Whether ``runtime`` offers ``confirm_action`` (`Calls.needs_confirm_tool`)."""
    return runtime.calls.needs_confirm_tool()
