"""The scenario file format: strict pydantic models of what a scenario file may say.

A scenario file is one YAML document::

    name: barge-in after RUNNING
    description: The user cuts in while the booking runs; it still commits and is told.
    policy: ../../configs/restaurant.yaml     # a path (relative to this file) or a mapping
    provider: {latency: {book: 2}}
    steps:
      - user: A table for two at nine, please.
      - llm: {say: Booking it now., calls: [{tool: book_table, as: booking, args: {...}}]}
      - until: {op: booking, status: RUNNING}
      - barge_in: Is there parking?
      - llm: Yes, next door.
      - advance: 2
      - idle: {quiet_secs: 1}
    expect:
      operations:
        - {op: booking, status: COMMITTED, delivered: true}
      side_effects: {book: 1}
      heard: {excludes: [cancelled]}

`Scenario` is the whole file; each step is one of the ``*Step`` models, written as a mapping
with exactly one key (the step's kind). ``llm`` steps are the model's script: they are
consumed one per inference in file order, wherever they sit among the other steps (place
them where the inference happens, for the reader). Every other step runs in order, waiting
for the one before to finish. Time has two sources: the conversation runs in real time, the
runtime and the fake provider on a manual clock that only ``advance`` moves, so deadlines,
retries, latencies and expiries happen exactly when the scenario says.
"""

from __future__ import annotations

__all__ = [
    "STEP_KINDS",
    "AdvanceStep",
    "ApproveStep",
    "BargeInStep",
    "BookingSetup",
    "CallSpec",
    "CallerStep",
    "CompensateStep",
    "CrashStep",
    "EventExpectation",
    "Expectations",
    "FaultStep",
    "HandoffStep",
    "HangUpStep",
    "HeardExpectation",
    "IdleStep",
    "LlmStep",
    "OperationExpectation",
    "OrderItem",
    "ProviderSetup",
    "ReconnectStep",
    "RejectStep",
    "ReleaseHungStep",
    "Scenario",
    "SessionSetup",
    "Step",
    "TextExpectation",
    "TogetherStep",
    "UntilStep",
    "UserStep",
    "WaitStep",
]

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import BaseModel, ConfigDict, Field, model_validator

from pipecat_actions.status import ActionStatus

Label = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z_][A-Za-z0-9_-]*$")]
Secs = Annotated[float, Field(ge=0, le=3600)]
Kind = Literal["book", "move", "cancel", "refund"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --- setup ---------------------------------------------------------------------------------


class SessionSetup(_Strict):
    """The conversation the scenario plays."""

    session_id: str = Field(default="scenario-call", min_length=1, max_length=128)
    principal: str = Field(default="alice", min_length=1, max_length=128)
    tenant: str = Field(default="default", min_length=1, max_length=128)
    agent: str | None = Field(default="host", description="The agent active at the start.")


class PaymentSetup(_Strict):
    """A captured payment refunds can draw on."""

    payment_id: str = Field(min_length=1)
    amount_cents: int = Field(ge=1)
    principal: str = Field(default="alice", min_length=1)


class BookingSetup(_Strict):
    """A booking the restaurant already holds when the scenario starts (not a side effect)."""

    restaurant_id: str = Field(default="trattoria", min_length=1)
    date: str = Field(min_length=1)
    time: str = Field(min_length=1)
    party_size: int = Field(ge=1, le=100)
    guest: str = Field(default="someone else", min_length=1)


class ProviderSetup(_Strict):
    """The fake system of record at the start."""

    restaurants: dict[str, int] = Field(
        default_factory=lambda: {"trattoria": 4},
        description="Restaurant id -> tables per slot.",
    )
    payments: list[PaymentSetup] = Field(
        default_factory=lambda: [PaymentSetup(payment_id="dep_bk_0001", amount_cents=2000)]
    )
    honours_idempotency_keys: bool = Field(
        default=True, description="False: a repeated key makes a second side effect."
    )
    latency: dict[Kind, Secs] = Field(
        default_factory=dict, description="Seconds (manual clock) each call of a kind takes."
    )
    bookings: list[BookingSetup] = Field(
        default_factory=list, description="Bookings held before the conversation starts."
    )


# --- steps ---------------------------------------------------------------------------------


class UserStep(_Strict):
    """The user says ``text`` (VAD start, speech, transcript, VAD stop)."""

    text: str = Field(min_length=1, max_length=2000)
    speech_secs: float = Field(default=0.2, ge=0, le=30)


class BargeInStep(_Strict):
    """The user talks over the bot: waits until the bot speaks, then speaks ``text``.

    With ``op``, the moment is a call's instead: ``after_secs`` (real time) after the labelled
    call's operation was admitted (``at: admitted``) or started running (``at: running``),
    the user speaks, over the bot if it is speaking then.
    """

    text: str | None = Field(default=None, max_length=2000)
    after_secs: float = Field(default=0.2, ge=0, le=30)
    speech_secs: float = Field(default=0.2, ge=0, le=30)
    timeout_secs: float = Field(
        default=60,
        gt=0,
        le=600,
        description="A hang guard in real seconds: only a stuck story waits this long.",
    )
    op: Label | None = Field(default=None, description="Time it from this call's operation.")
    at: Literal["admitted", "running"] = Field(
        default="running", description="With op: from its admission or from its RUNNING."
    )

    @model_validator(mode="after")
    def _words_for_a_timed_barge_in(self) -> BargeInStep:
        if self.op is not None and self.text is None:
            raise ValueError("a barge-in timed from a call says something (give text)")
        return self


class CallSpec(_Strict):
    """One tool call the model makes."""

    tool: str = Field(min_length=1, max_length=128)
    args: dict[str, Any] = Field(default_factory=dict)
    as_: Label | None = Field(
        default=None,
        alias="as",
        description="A label that expectations and steps use for the operation of this call.",
    )
    from_context: dict[str, str] = Field(
        default_factory=dict,
        description=(
            "Arguments read at inference time from the latest tool result in the context that "
            "has the named field: {operation_id: operation_id, confirmation_token: ...}."
        ),
    )
    from_call: dict[str, Annotated[str, Field(pattern=r"^[A-Za-z_][A-Za-z0-9_-]*\.[^.].*$")]] = (
        Field(
            default_factory=dict,
            description=(
                "Arguments read at inference time from the result of one earlier labelled "
                "call: {booking_id: booking.result.booking_id, operation_id: "
                "booking.operation_id} (a dotted path in what that call answered)."
            ),
        )
    )
    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class LlmStep(_Strict):
    """One answer of the model: text, tool calls, or both (the text first)."""

    say: str | None = Field(default=None, max_length=2000)
    calls: list[CallSpec] = Field(default_factory=list, max_length=16)

    @model_validator(mode="after")
    def _something(self) -> LlmStep:
        if self.say is None and not self.calls:
            raise ValueError("an llm step says something, makes calls, or both")
        return self


class WaitStep(_Strict):
    """Let ``secs`` real seconds pass."""

    secs: float = Field(ge=0, le=60)


class IdleStep(_Strict):
    """Wait until nobody speaks, no call is open and nothing happens for ``quiet_secs``."""

    quiet_secs: float = Field(default=0.5, ge=0, le=30)
    timeout_secs: float = Field(default=15, gt=0, le=120)
    calls: bool = Field(
        default=False, description="Also wait for every function call to be answered."
    )


class AdvanceStep(_Strict):
    """Move the runtime's and the provider's clock ``secs`` forward, then let work settle.

    In story order: before the clock moves, the model has made every call of the llm steps
    written before this one, each call has reached the runtime (admitted, refused or running
    as a read), and the work it started waits on the clock. However slow the machine, what
    happens at which clock time is what the file says.
    """

    secs: float = Field(gt=0, le=86_400)


class UntilStep(_Strict):
    """Wait until the labelled operation has a status (and, if asked, was told).

    ``timeout_secs`` is a hang guard, not a budget: a story that reaches the status gets there
    however long a busy machine takes; only one that is stuck fails, after that many real
    seconds of waiting, naming the status it was in.
    """

    op: Label
    status: list[ActionStatus] = Field(min_length=1)
    delivered: bool = Field(
        default=False,
        description=(
            "Also wait until its outcome was told to the conversation (the gate records a "
            "delivery right after pushing it): what the bot says next is about it."
        ),
    )
    timeout_secs: float = Field(
        default=60,
        gt=0,
        le=600,
        description="A hang guard in real seconds: only a stuck story waits this long.",
    )


class FaultStep(_Strict):
    """Arm a fault, on the restaurant's provider or on any action.

    Without ``target``: the next calls of ``kind`` (every kind if left out) the restaurant's
    provider receives. With ``target``: the action's effect or hook it names, whatever system of
    record it calls (see `pipecat_actions.scenarios.faults`).
    """

    fault: Literal[
        "error_before_send",
        "fail_after_send",
        "lose_response_after_commit",
        "hang",
        "latency",
        "slow_cancel",
        "raise",
        "pending",
    ]
    kind: Kind | None = None
    target: str | None = Field(
        default=None,
        min_length=1,
        max_length=200,
        description="TOOL (its effect) or TOOL.HOOK (reconcile, compensate, snapshot, ...).",
    )
    times: int = Field(default=1, ge=1, le=1000)
    secs: float | None = Field(
        default=None, ge=0, le=3600, description="latency and slow_cancel only"
    )
    ignore_cancellation: bool = Field(default=False, description="hang only")

    @model_validator(mode="after")
    def _secs_for_latency(self) -> FaultStep:
        if (self.fault in ("latency", "slow_cancel")) != (self.secs is not None):
            raise ValueError("secs goes with the latency and slow_cancel faults, and only them")
        if self.target is not None and self.kind is not None:
            raise ValueError("a fault is on a provider kind or on an action (target), not both")
        if self.target is None and self.fault in ("raise", "pending"):
            raise ValueError(f"{self.fault} is a fault on an action: say which with target")
        if self.target is not None and self.fault == "slow_cancel":
            raise ValueError("slow_cancel is the restaurant provider's; on a target use hang")
        return self


class ReleaseHungStep(_Strict):
    """Let every hung provider call go on."""


class ApproveStep(_Strict):
    """A person approves the labelled operation (bound to the arguments they saw)."""

    op: Label
    approver: str = Field(
        default="rosa",
        min_length=1,
        description="Who approves, signed in (a name), working for the scenario's tenant.",
    )
    roles: list[str] = Field(
        default_factory=lambda: ["manager"], description="The roles their sign-in gives them."
    )
    reason: str = Field(default="approved in the scenario", min_length=1)
    seen_args: dict[str, Any] | None = Field(
        default=None,
        description=(
            "The arguments the approver saw, when not the operation's own (an approval of "
            "stale arguments must be refused)."
        ),
    )
    refused: bool = Field(
        default=False,
        description=(
            "The approval is meant to be refused (a stale screen, too late, a role the policy "
            "does not accept): the step fails if it is accepted. Without it, a refused "
            "approval fails the step, naming its file and line."
        ),
    )


class RejectStep(_Strict):
    """A person rejects the labelled operation."""

    op: Label
    approver: str = Field(default="rosa", min_length=1)
    roles: list[str] = Field(default_factory=lambda: ["manager"])
    reason: str = Field(default="rejected in the scenario", min_length=1)
    refused: bool = Field(
        default=False,
        description=(
            "The rejection is meant to be refused: the step fails if it is accepted. Without "
            "it, a refused rejection fails the step, naming its file and line."
        ),
    )


class HandoffStep(_Strict):
    """Another agent takes the conversation over."""

    agent: str = Field(min_length=1, max_length=128)


class CrashStep(_Strict):
    """The bot process dies at once and a new one starts on the same ledger.

    The runtime stops without writing anything more and the conversation is cut; a new
    runtime (a new lease owner) opens on the same ledger with the clock past the dead
    owner's leases, recovers its operations, and a new conversation on the same session
    starts for the steps that follow.
    """

    recover: bool = True


class ReconnectStep(_Strict):
    """The user's connection drops and comes back: a new pipeline on the same session.

    After a ``hang_up``, the user calls back: the new pipeline starts here.
    """


class CallerStep(_Strict):
    """Another caller: the pipeline ends and a conversation with ``principal`` starts.

    Each caller has a session of their own (``session_id``, default ``call-PRINCIPAL``) and
    keeps it: ``caller: alice`` later goes back to alice's session in a new pipeline, as a
    call back would. Operations, labels and expectations span every caller; an app's
    `ScenarioApp.authorizer` decides what each may do (the default allows everything).
    """

    principal: str = Field(min_length=1, max_length=128)
    session_id: str | None = Field(default=None, min_length=1, max_length=128)
    agent: str | None = Field(default="host", description="The agent active in their call.")


class HangUpStep(_Strict):
    """The user hangs up: the pipeline ends, the runtime goes on.

    The steps that follow run with no conversation (``advance``, ``approve``, ``fault``,
    ``until``...) until a ``reconnect`` starts a new pipeline on the same session; a step that
    needs one (``user``, ``barge_in``, ``idle``, ``handoff``) before that is refused.
    """


class CompensateStep(_Strict):
    """The application compensates (undoes) the labelled committed operation."""

    op: Label
    reason: str = Field(default="compensated in the scenario", min_length=1)


class TogetherStep(_Strict):
    """Steps that happen at the same time: each starts at once, the next step waits for all.

    At most one of them is something the user does (``user``, ``barge_in``); the others are
    steps of the world (``approve``, ``reject``, ``advance``, ``fault``, ``until``,
    ``compensate``, ``wait``): an approval landing while the user speaks.
    """

    steps: list[Any] = Field(min_length=2, max_length=16)


Step: TypeAlias = (
    UserStep
    | BargeInStep
    | LlmStep
    | WaitStep
    | IdleStep
    | AdvanceStep
    | UntilStep
    | FaultStep
    | ReleaseHungStep
    | ApproveStep
    | RejectStep
    | HandoffStep
    | CrashStep
    | ReconnectStep
    | HangUpStep
    | CallerStep
    | CompensateStep
    | TogetherStep
)

STEP_KINDS: dict[str, tuple[type[BaseModel], str | None]] = {
    # kind: (model, the field a scalar value fills: `user: hello` is `user: {text: hello}`)
    "user": (UserStep, "text"),
    "barge_in": (BargeInStep, "text"),
    "llm": (LlmStep, "say"),
    "wait": (WaitStep, "secs"),
    "idle": (IdleStep, None),
    "advance": (AdvanceStep, "secs"),
    "until": (UntilStep, None),
    "fault": (FaultStep, "fault"),
    "release_hung": (ReleaseHungStep, None),
    "approve": (ApproveStep, "op"),
    "reject": (RejectStep, "op"),
    "handoff": (HandoffStep, "agent"),
    "crash": (CrashStep, None),
    "reconnect": (ReconnectStep, None),
    "hang_up": (HangUpStep, None),
    "caller": (CallerStep, "principal"),
    "compensate": (CompensateStep, "op"),
    "together": (TogetherStep, "steps"),
}
"""Each step kind, its model and the field a scalar value stands for."""


# --- expectations --------------------------------------------------------------------------


class EventExpectation(_Strict):
    """An audit event the operation's trail must hold (every given field must match)."""

    kind: str | None = Field(default=None, description="created, transition, delivered, ...")
    to_status: ActionStatus | None = None
    actor: str | None = Field(default=None, description="A substring of the event's actor.")
    detail: dict[str, Any] = Field(
        default_factory=dict, description="Values the event's detail holds."
    )


class OperationExpectation(_Strict):
    """What must be true of the operations a selector picks."""

    op: Label | None = Field(default=None, description="The label of a call (see `CallSpec`).")
    tool: str | None = Field(default=None, description="Every operation of this tool ...")
    args: dict[str, Any] = Field(
        default_factory=dict, description="... whose arguments include these values."
    )
    in_status: ActionStatus | None = Field(
        default=None,
        description=(
            "... that ended in this status: of calls racing for one resource, how many won "
            "and how many were refused, whichever of them did."
        ),
    )
    count: int | None = Field(
        default=None, ge=0, description="How many operations match (default 1 for op/tool)."
    )
    status: ActionStatus | None = None
    path: list[ActionStatus] | None = Field(
        default=None,
        description="Every status the operation went through after REQUESTED, in order.",
    )
    escalated: bool | None = None
    delivered: bool | None = Field(default=None, description="Told to a conversation.")
    acknowledged: bool | None = Field(default=None, description="Heard to the end by the user.")
    attempts: int | None = Field(default=None, ge=0)
    result: dict[str, Any] | None = Field(default=None, description="Values the result holds.")
    error_contains: str | None = None
    compensated_by_committed: bool | None = Field(
        default=None, description="A linked compensation operation exists and COMMITTED."
    )
    told: int | None = Field(
        default=None, ge=0, description="How many times its outcome was told, exactly."
    )
    events: list[EventExpectation] = Field(
        default_factory=list, description="Audit events its trail holds, in this order."
    )

    @model_validator(mode="after")
    def _selector(self) -> OperationExpectation:
        if (self.op is None) == (self.tool is None):
            raise ValueError("select the operations with op (a call label) or tool, not both")
        if self.op is not None and (self.args or self.in_status is not None):
            raise ValueError(
                "args and in_status narrow a tool selector; an op label is one operation"
            )
        return self


class TextExpectation(_Strict):
    """Substrings (case-insensitive) that must, or must never, appear."""

    includes: list[str] = Field(default_factory=list, description="In this order.")
    excludes: list[str] = Field(default_factory=list)


class HeardExpectation(TextExpectation):
    """What the user heard; ``includes`` may only match utterances heard to the end."""

    complete: bool = Field(
        default=False, description="Included phrases must be in utterances not cut off."
    )


class OrderItem(_Strict):
    """A point in the conversation, for causal order: one key only."""

    op: Label | None = None
    status: ActionStatus | None = Field(default=None, description="With op: reaching it.")
    delivered: Label | None = Field(default=None, description="The operation told to the LLM.")
    heard: str | None = Field(default=None, description="The user started hearing this.")

    @model_validator(mode="after")
    def _one(self) -> OrderItem:
        kinds = [self.op is not None, self.delivered is not None, self.heard is not None]
        if sum(kinds) != 1:
            raise ValueError("an order item is one of {op, status}, {delivered}, {heard}")
        if (self.op is None) != (self.status is None):
            raise ValueError("op and status go together")
        return self


class Expectations(_Strict):
    """What must be true at the end of the scenario."""

    operations: list[OperationExpectation] = Field(default_factory=list)
    operation_count: int | None = Field(
        default=None, ge=0, description="Operations of the session in the ledger, in all."
    )
    side_effects: dict[str, int] = Field(
        default_factory=dict,
        description="Committed provider mutations by kind, exactly (the app's `effects`).",
    )
    requests: dict[str, int] = Field(
        default_factory=dict,
        description=(
            "Requests that reached each effect or hook (TOOL or TOOL.HOOK), exactly, "
            "whether or not they then failed (version 2)."
        ),
    )
    undelivered: list[Label] | None = Field(
        default=None,
        description="The labelled calls whose committed outcome was never told, exactly.",
    )
    max_effects_per_key: int | None = Field(default=1, ge=0)
    heard: HeardExpectation = Field(default_factory=HeardExpectation)
    context: TextExpectation = Field(
        default_factory=TextExpectation, description="The LLM context at the end."
    )
    order: list[OrderItem] = Field(default_factory=list)
    script_consumed: bool = Field(
        default=True, description="Every llm step was used by an inference."
    )
    settled: bool = Field(
        default=True,
        description="No operation is left in flight (escalated UNKNOWN counts as settled).",
    )


class Scenario(_Strict):
    """One scenario file."""

    version: Literal[1, 2] = Field(
        default=1,
        description=(
            "2: the app's factory gets a `ScenarioWorld` and may bring its own system of "
            "record; faults may name a target: TOOL[.HOOK]."
        ),
    )
    name: str = Field(min_length=1, max_length=200)
    description: str = Field(default="", max_length=4000)
    regression: str | None = Field(default=None, description="The upstream bug it guards.")
    policy: str | dict[str, Any] = Field(
        description="A policy file (relative to the scenario) or the policy document inline."
    )
    app: str = Field(
        default="restaurant",
        description=(
            "restaurant (built in), or module:factory or path/to/file.py:factory, found "
            "relative to the scenario file; version 1: factory(sor) -> actions, version 2: "
            "factory(world) -> actions or a ScenarioApp."
        ),
    )
    seed: dict[str, Any] = Field(
        default_factory=dict,
        description="Version 2: handed to the app's factory (world.seed) to seed its records.",
    )
    session: SessionSetup = Field(default_factory=SessionSetup)
    provider: ProviderSetup = Field(default_factory=ProviderSetup)
    system_prompt: str = Field(default="You take restaurant bookings.", max_length=4000)
    lease_secs: float = Field(default=10, gt=0, le=3600)
    timeout_secs: float = Field(default=60, gt=0, le=600, description="Bound on the run.")
    steps: list[Any] = Field(min_length=1, max_length=500)
    expect: Expectations = Field(default_factory=Expectations)
