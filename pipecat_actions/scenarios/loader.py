"""Reading a scenario file: strict YAML, every problem named by its step and key."""

from __future__ import annotations

__all__ = ["LoadedScenario", "ScenarioError", "load_scenario", "load_scenario_text"]

import contextlib
import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from pipecat_actions.errors import PolicyError, PolicyProblem, ScenarioError
from pipecat_actions.policy import PolicySet, load_policy, load_policy_data
from pipecat_actions.policy._problems import key_path, shown
from pipecat_actions.policy._yaml import MAX_POLICY_BYTES, YamlRefused, parse_policy_yaml
from pipecat_actions.scenarios.faults import HOOKS
from pipecat_actions.scenarios.model import (
    STEP_KINDS,
    BargeInStep,
    CallerStep,
    FaultStep,
    HandoffStep,
    HangUpStep,
    IdleStep,
    LlmStep,
    ReconnectStep,
    Scenario,
    Step,
    TogetherStep,
    UserStep,
)

_KINDS = frozenset({"book", "move", "cancel", "refund"})
"""The restaurant provider's kinds of side effect."""
_TOGETHER = frozenset(
    {"user", "barge_in", "approve", "reject", "advance", "fault", "until", "compensate", "wait"}
)
"""The steps a ``together`` step may hold."""
_NEED_A_CALL = (UserStep, BargeInStep, IdleStep, HandoffStep)
"""Steps that need a conversation: refused between a hang-up and the reconnect."""

Loc = tuple[str | int, ...]
_M = TypeVar("_M", bound=BaseModel)


@dataclass(frozen=True)
class LoadedScenario:
    """A checked scenario, ready to run.

    Attributes:
        spec: The file's content.
        steps: Its steps, each validated.
        policy: The tool policies it runs with.
        source: Where it was read from.
    """

    spec: Scenario
    steps: list[Step]
    policy: PolicySet
    source: str
    factory: Callable[[Any], Any] | None = None
    """The app's factory (None: the built-in restaurant)."""
    lines: Mapping[str, int] = field(default_factory=dict)
    """The line (1-based) each step starts on, by key path (``steps[3]``,
    ``steps[3].together[0]``, as `flat_steps` names them); empty for text that has none."""

    def where(self, key: str) -> str:
        """``source:line`` of the step at ``key`` (``source`` alone when its line is unknown)."""
        line = self.lines.get(key)
        return self.source if line is None else f"{self.source}:{line}"

    @property
    def labels(self) -> list[str]:
        """The call labels, in the order the calls are made."""
        return [c.as_ for s in self.steps if isinstance(s, LlmStep) for c in s.calls if c.as_]


def flat_steps(steps: list[Step]) -> Iterator[tuple[str, Step]]:
    """Every step, those inside ``together`` too, with its key path."""
    for index, step in enumerate(steps):
        if isinstance(step, TogetherStep):
            for inner, member in enumerate(step.steps):
                yield f"steps[{index}].together[{inner}]", member
        else:
            yield f"steps[{index}]", step


def load_scenario(path: str | os.PathLike[str]) -> LoadedScenario:
    """Read and check a scenario file.

    Raises:
        ScenarioError: The file is missing, too large, not clean YAML, or not a valid
            scenario; each problem names the step (``steps[3].barge_in.after_secs``).
    """
    source = str(path)
    try:
        with open(path, "rb") as file:
            data = file.read(MAX_POLICY_BYTES + 1)
        text = data.decode("utf-8")
    except FileNotFoundError:
        raise ScenarioError([PolicyProblem(source, "", "no such file")]) from None
    except IsADirectoryError:
        raise ScenarioError([PolicyProblem(source, "", "is a directory")]) from None
    except UnicodeDecodeError as exc:
        raise ScenarioError(
            [PolicyProblem(source, "", f"is not UTF-8 text (byte {exc.start})")]
        ) from None
    except OSError as exc:
        raise ScenarioError(
            [PolicyProblem(source, "", f"cannot be read: {exc.strerror or exc}")]
        ) from None
    return load_scenario_text(text, source=source, base=Path(path).parent)


def load_scenario_text(
    text: str, *, source: str = "<string>", base: Path | None = None
) -> LoadedScenario:
    """Check a scenario given as YAML text; ``base`` resolves a relative policy path."""
    try:
        data = parse_policy_yaml(text)
    except YamlRefused as exc:
        raise ScenarioError(
            [PolicyProblem(source, key_path(loc), reason) for loc, reason in exc.problems]
        ) from None
    if not isinstance(data, Mapping):
        raise ScenarioError(
            [PolicyProblem(source, "", f"the top level must be a mapping (got {shown(data)})")]
        )
    problems: list[PolicyProblem] = []
    spec = _validate(Scenario, data, (), source, problems)
    steps: list[Step] = []
    raw_steps = data.get("steps")
    if isinstance(raw_steps, list):
        for index, raw in enumerate(raw_steps):
            step = _step(raw, ("steps", index), source, problems)
            if step is not None:
                steps.append(step)
    if spec is None or problems:
        raise ScenarioError(problems)
    _check_labels(spec, steps, source, problems)
    _check_sequence(spec, steps, source, problems)
    policy = _policy(spec, source, base or Path.cwd(), problems)
    factory = _app(spec, source, base or Path.cwd(), problems)
    if problems or policy is None:
        raise ScenarioError(problems)
    for index, step in enumerate(steps):
        for call_index, call in enumerate(step.calls if isinstance(step, LlmStep) else []):
            if call.tool not in policy and call.tool != "confirm_action":
                # Unknown tools are allowed on purpose only through the policy: say so.
                problems.append(
                    PolicyProblem(
                        source,
                        key_path(("steps", index, "llm", "calls", call_index, "tool")),
                        f"{call.tool!r} is not a tool of the policy "
                        f"(tools: {', '.join(sorted(policy.names()))})",
                    )
                )
    for where, step in flat_steps(steps):
        if isinstance(step, FaultStep) and step.target is not None:
            tool, _, hook = step.target.partition(".")
            if tool not in policy:
                problems.append(
                    PolicyProblem(
                        source, f"{where}.fault.target", f"{tool!r} is not a tool of the policy"
                    )
                )
            elif hook and hook not in HOOKS:
                problems.append(
                    PolicyProblem(
                        source,
                        f"{where}.fault.target",
                        f"{hook!r} is not a hook (hooks: {', '.join(HOOKS)})",
                    )
                )
    if problems:
        raise ScenarioError(problems)
    return LoadedScenario(spec, steps, policy, source, factory, _step_lines(text))


def _step_lines(text: str) -> dict[str, int]:
    """The line each step starts on, by key path: read from the YAML's nodes (already clean)."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError:  # pragma: no cover - the text was parsed cleanly before
        return {}
    lines: dict[str, int] = {}
    if not isinstance(root, yaml.MappingNode):
        return lines
    for key, value in root.value:
        if key.value != "steps" or not isinstance(value, yaml.SequenceNode):
            continue
        for index, item in enumerate(value.value):
            lines[f"steps[{index}]"] = item.start_mark.line + 1
            if isinstance(item, yaml.MappingNode) and len(item.value) == 1:
                kind, members = item.value[0]
                if kind.value == "together" and isinstance(members, yaml.SequenceNode):
                    for inner, member in enumerate(members.value):
                        lines[f"steps[{index}].together[{inner}]"] = member.start_mark.line + 1
    return lines


def _validate(
    model: type[_M], data: object, loc: Loc, source: str, problems: list[PolicyProblem]
) -> _M | None:
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        for error in exc.errors(include_url=False):
            where = key_path((*loc, *error["loc"]))
            problems.append(PolicyProblem(source, where, _reason(error)))
        return None


def _reason(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown key"
    if kind == "missing":
        return "required key is missing"
    message = str(error["msg"])
    if "input" in error and kind not in ("value_error",):
        message += f" (got {shown(error['input'])})"
    return message.removeprefix("Value error, ")


def _step(raw: object, loc: Loc, source: str, problems: list[PolicyProblem]) -> Step | None:
    where = key_path(loc)
    if isinstance(raw, str) and raw in STEP_KINDS:
        raw = {raw: None}  # `- crash` is `- crash: {}`: a step that needs nothing more
    if not isinstance(raw, Mapping) or len(raw) != 1:
        problems.append(
            PolicyProblem(
                source,
                where,
                "a step is a mapping with exactly one key, its kind "
                f"({', '.join(STEP_KINDS)}); got {shown(raw)}"
                + (f" with keys {', '.join(map(str, raw))}" if isinstance(raw, Mapping) else ""),
            )
        )
        return None
    ((kind, value),) = raw.items()
    if kind not in STEP_KINDS:
        problems.append(
            PolicyProblem(
                source, where, f"unknown step {kind!r}; steps are: {', '.join(STEP_KINDS)}"
            )
        )
        return None
    model, scalar_field = STEP_KINDS[kind]
    if kind == "together":
        return _together(value, loc, source, problems)
    if value is None or value is True:
        value = {}
    elif not isinstance(value, Mapping):
        if scalar_field is None:
            problems.append(
                PolicyProblem(source, f"{where}.{kind}", f"takes a mapping, got {shown(value)}")
            )
            return None
        value = {scalar_field: value}
    step = _validate(model, value, (*loc, kind), source, problems)
    return step  # type: ignore[return-value]


def _together(
    value: object, loc: Loc, source: str, problems: list[PolicyProblem]
) -> TogetherStep | None:
    where = key_path((*loc, "together"))
    if not isinstance(value, list) or len(value) < 2:
        problems.append(
            PolicyProblem(source, where, f"takes a list of two steps or more, got {shown(value)}")
        )
        return None
    members: list[Step] = []
    users = 0
    for index, raw in enumerate(value):
        kind = next(iter(raw), None) if isinstance(raw, Mapping) and len(raw) == 1 else None
        if kind is not None and kind not in _TOGETHER:
            problems.append(
                PolicyProblem(
                    source,
                    key_path((*loc, "together", index)),
                    f"{kind} cannot happen together with other steps "
                    f"(these can: {', '.join(sorted(_TOGETHER))})",
                )
            )
            continue
        step = _step(raw, (*loc, "together", index), source, problems)
        if step is None:
            continue
        users += isinstance(step, UserStep | BargeInStep)
        members.append(step)
    if users > 1:
        problems.append(PolicyProblem(source, where, "the user does one thing at a time"))
    if len(members) != len(value):
        return None
    return TogetherStep.model_construct(steps=members)


def _check_sequence(
    spec: Scenario, steps: list[Step], source: str, problems: list[PolicyProblem]
) -> None:
    """Hang-ups and reconnects in an order a phone call can have; kinds the app can count."""
    away = False
    for where, step in flat_steps(steps):
        if isinstance(step, HangUpStep):
            if away:
                problems.append(PolicyProblem(source, where, "the user has already hung up"))
            away = True
        elif isinstance(step, ReconnectStep | CallerStep):
            away = False
        elif away and isinstance(step, _NEED_A_CALL):
            kind = next(k for k, (m, _) in STEP_KINDS.items() if isinstance(step, m))
            problems.append(
                PolicyProblem(
                    source,
                    where,
                    f"{kind} needs a conversation, and the user hung up: reconnect first",
                )
            )
    if spec.app == "restaurant":
        for kind in spec.expect.side_effects:
            if kind not in _KINDS:
                problems.append(
                    PolicyProblem(
                        source,
                        f"expect.side_effects.{kind}",
                        f"the restaurant counts {', '.join(sorted(_KINDS))}; not {kind!r}",
                    )
                )
    if spec.version == 1 and spec.seed:
        problems.append(PolicyProblem(source, "seed", "seed goes with version: 2"))


def _app(
    spec: Scenario, source: str, base: Path, problems: list[PolicyProblem]
) -> Callable[[Any], Any] | None:
    """Import the app's factory, relative to the scenario file; one line if it cannot be."""
    if spec.app == "restaurant":
        return None
    target, _, attribute = spec.app.rpartition(":")
    if not target or not attribute:
        problems.append(
            PolicyProblem(
                source, "app", "write restaurant, module:factory or path/to/file.py:factory"
            )
        )
        return None
    try:
        if target.endswith(".py"):
            path = Path(target) if Path(target).is_absolute() else base / target
            module_spec = importlib.util.spec_from_file_location(
                f"_pipecat_actions_scenario_app_{abs(hash(str(path.resolve())))}", path
            )
            if module_spec is None or module_spec.loader is None or not path.is_file():
                raise FileNotFoundError(f"no file {path}")
            module = importlib.util.module_from_spec(module_spec)
            sys.modules[module_spec.name] = module  # as an import does (dataclasses need it)
            with _importable_from(path.parent):
                module_spec.loader.exec_module(module)
        else:
            with _importable_from(base):
                module = importlib.import_module(target)
        factory = getattr(module, attribute)
    except AttributeError:
        problems.append(PolicyProblem(source, "app", f"{target} has no {attribute!r}"))
        return None
    except Exception as exc:  # whatever the app's import raised: one line, nothing run
        problems.append(
            PolicyProblem(
                source, "app", f"{spec.app!r} cannot be loaded: {type(exc).__name__}: {exc}"
            )
        )
        return None
    if not callable(factory):
        problems.append(PolicyProblem(source, "app", f"{spec.app!r} is not callable"))
        return None
    return factory  # type: ignore[no-any-return]


@contextlib.contextmanager
def _importable_from(folder: Path) -> Iterator[None]:
    """Import with ``folder`` first on the path (the scenario's own folder), then restore."""
    entry = str(folder.resolve())
    sys.path.insert(0, entry)
    try:
        yield
    finally:
        with contextlib.suppress(ValueError):
            sys.path.remove(entry)


def _check_labels(
    spec: Scenario, steps: list[Step], source: str, problems: list[PolicyProblem]
) -> None:
    seen: set[str] = set()
    for index, step in enumerate(steps):
        if isinstance(step, LlmStep):
            for call_index, call in enumerate(step.calls):
                if call.as_ is None:
                    continue
                if call.as_ in seen:
                    problems.append(
                        PolicyProblem(
                            source,
                            key_path(("steps", index, "llm", "calls", call_index, "as")),
                            f"label {call.as_!r} is used twice",
                        )
                    )
                seen.add(call.as_)
    for where, step in flat_steps(steps):
        label = getattr(step, "op", None)
        if label is not None and label not in seen:
            kind = next(k for k, (m, _) in STEP_KINDS.items() if isinstance(step, m))
            known = ", ".join(sorted(seen)) or "none"
            problems.append(
                PolicyProblem(
                    source,
                    f"{where}.{kind}.op",
                    f"no call is labelled {label!r} (labels: {known})",
                )
            )
    earlier: set[str] = set()  # labels of calls made by the llm steps before this one
    for index, step in enumerate(steps):
        for call_index, call in enumerate(step.calls if isinstance(step, LlmStep) else []):
            for argument, path in call.from_call.items():
                label = path.partition(".")[0]
                if label not in earlier:
                    why = (
                        f"{argument}: the call labelled {label!r} is not made before this step"
                        if label in seen
                        else f"{argument}: no call is labelled {label!r}"
                    )
                    problems.append(
                        PolicyProblem(
                            source,
                            key_path(("steps", index, "llm", "calls", call_index, "from_call")),
                            why,
                        )
                    )
        if isinstance(step, LlmStep):
            earlier.update(call.as_ for call in step.calls if call.as_ is not None)
    for label in spec.expect.undelivered or []:
        if label not in seen:
            problems.append(
                PolicyProblem(source, "expect.undelivered", f"no call is labelled {label!r}")
            )
    for index, expectation in enumerate(spec.expect.operations):
        if expectation.op is not None and expectation.op not in seen:
            problems.append(
                PolicyProblem(
                    source,
                    key_path(("expect", "operations", index, "op")),
                    f"no call is labelled {expectation.op!r}",
                )
            )
    for index, item in enumerate(spec.expect.order):
        label = item.op or item.delivered
        if label is not None and label not in seen:
            problems.append(
                PolicyProblem(
                    source, key_path(("expect", "order", index)), f"no call is labelled {label!r}"
                )
            )


def _policy(
    spec: Scenario, source: str, base: Path, problems: list[PolicyProblem]
) -> PolicySet | None:
    try:
        if isinstance(spec.policy, str):
            path = Path(spec.policy)
            return load_policy(path if path.is_absolute() else base / path)
        return load_policy_data(spec.policy, source=f"{source}: policy")
    except PolicyError as exc:
        problems.extend(exc.problems)
        return None
