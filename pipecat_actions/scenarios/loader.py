"""Reading a scenario file: strict YAML, every problem named by its step and key."""

from __future__ import annotations

__all__ = ["LoadedScenario", "ScenarioError", "load_scenario", "load_scenario_text"]

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from pipecat_actions.errors import PipecatActionsError, PolicyError, PolicyProblem
from pipecat_actions.policy import PolicySet, load_policy, load_policy_data
from pipecat_actions.policy._problems import key_path, shown
from pipecat_actions.policy._yaml import MAX_POLICY_BYTES, YamlRefused, parse_policy_yaml
from pipecat_actions.scenarios.model import (
    STEP_KINDS,
    LlmStep,
    Scenario,
    Step,
)

Loc = tuple[str | int, ...]
_M = TypeVar("_M", bound=BaseModel)


class ScenarioError(PipecatActionsError):
    """A scenario file cannot be run; `problems` lists every problem found (file, key, why)."""

    def __init__(self, problems: list[PolicyProblem]) -> None:
        self.problems = list(problems)
        super().__init__("\n".join(str(p) for p in self.problems) or "invalid scenario")


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

    @property
    def labels(self) -> list[str]:
        """The call labels, in the order the calls are made."""
        return [c.as_ for s in self.steps if isinstance(s, LlmStep) for c in s.calls if c.as_]


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
    policy = _policy(spec, source, base or Path.cwd(), problems)
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
    if problems:
        raise ScenarioError(problems)
    return LoadedScenario(spec, steps, policy, source)


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
    for index, step in enumerate(steps):
        label = getattr(step, "op", None)
        if label is not None and label not in seen:
            kind = next(k for k, (m, _) in STEP_KINDS.items() if isinstance(step, m))
            known = ", ".join(sorted(seen)) or "none"
            problems.append(
                PolicyProblem(
                    source,
                    key_path(("steps", index, kind, "op")),
                    f"no call is labelled {label!r} (labels: {known})",
                )
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
