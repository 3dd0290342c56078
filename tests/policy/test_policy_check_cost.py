"""Checking a policy file costs work in proportion to its size, whatever the file holds.

A hostile file (thousands of tools, a problem on every line, a ``defaults:`` merged under every
tool, numbers PyYAML reads in quadratic time) is refused early, by a named limit stated in the
refusal, or checked in linear work, and its report is a screenful. The work is counted here
(problems listed, functions called, parser events read), never timed: durations are figures for
``bench/policy_check.py``.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
import yaml
from yaml.constructor import SafeConstructor

from pipecat_actions.policy import (
    MAX_DEFAULTS_CHARS,
    MAX_LISTED_PROBLEMS,
    MAX_NUMBER_CHARS,
    MAX_TOOLS,
    MAX_VALUES,
    PolicyError,
    PolicyProblem,
    _yaml,
    load_policy,
    load_policy_data,
    load_policy_text,
)

CONFIGS = sorted((Path(__file__).parents[2] / "configs").glob("*.yaml"))
BAD_FILES = sorted((Path(__file__).parent / "bad").glob("*.yaml"))


def _problems(text: str) -> list[PolicyProblem]:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text)
    return caught.value.problems


def _tools(count: int, entry: Callable[[int], str], head: str = "") -> str:
    return f"version: 1\n{head}tools:\n" + "".join(f"  {entry(i)}\n" for i in range(count))


def _tool(settings: str, lines: Iterator[str] | list[str] = ()) -> str:
    """One tool ``t`` with ``settings`` lines (indented under it), then ``lines`` as written."""
    return "version: 1\ntools:\n  t:\n" + settings + "".join(lines)


# --- limits, refused before any validation ------------------------------------------------------


@pytest.mark.parametrize("as_data", [False, True], ids=["yaml", "data"])
def test_more_tools_than_the_limit_are_refused_before_any_tool_is_checked(as_data: bool) -> None:
    # Every entry is wrong: had any been validated, its problem would be listed.
    text = _tools(MAX_TOOLS + 1, lambda i: f"t{i}: {{kind: nope}}")

    with pytest.raises(PolicyError) as caught:
        load_policy_data(yaml.safe_load(text)) if as_data else load_policy_text(text)

    assert [(p.key_path, p.reason) for p in caught.value.problems] == [
        ("tools", f"lists {MAX_TOOLS + 1} tools; a policy file may list at most {MAX_TOOLS} tools")
    ]


def test_defaults_larger_than_their_limit_are_refused_before_any_tool_is_checked() -> None:
    paths = ", ".join(f"a.p{i}" for i in range(MAX_DEFAULTS_CHARS // 4))
    head = f"defaults:\n  colour: red\n  redact: [{paths}]\n"
    text = _tools(3, lambda i: f"t{i}: {{kind: nope}}", head=head)

    (problem,) = _problems(text)

    assert problem.key_path == "defaults"
    assert f"defaults may hold at most {MAX_DEFAULTS_CHARS}" in problem.reason
    assert "checked again as part of each tool (3 here)" in problem.reason


def test_the_most_tools_allowed_load_under_defaults_near_their_limit() -> None:
    paths = ", ".join(f"a.p{i}" for i in range(MAX_DEFAULTS_CHARS // 8))
    head = f"defaults:\n  kind: mutation\n  arguments: [a, b]\n  redact: [{paths}]\n"

    def booking(i: int) -> str:
        undo = f"book_{(i + 1) % MAX_TOOLS}"
        return f"book_{i}: {{resource: 'table:{{a}}:{{b}}', compensation: {{tool: {undo}}}}}"

    policies = load_policy_text(_tools(MAX_TOOLS, booking, head=head))

    assert len(policies) == MAX_TOOLS
    assert len(policies["book_999"].redact) == MAX_DEFAULTS_CHARS // 8


def test_a_file_of_more_values_than_the_limit_is_refused_where_it_passes_it() -> None:
    head = "version: 1\ntools:\n  t:\n    kind: read\n    limits:\n"
    # Twice the limit: nothing after the value that passes it is read.
    items = ", ".join("1" for _ in range(2 * MAX_VALUES))
    text = f"{head}      overflow: degrade\n      degrade_result: {{x: [{items}]}}\n"

    with _EventCounter() as read:
        (problem,) = _problems(text)

    assert problem.key_path == ""
    assert problem.reason.startswith("at line 7, column ")
    assert f"a policy file may hold at most {MAX_VALUES}" in problem.reason
    assert MAX_VALUES < read.events < MAX_VALUES + 100


def test_a_number_longer_than_the_limit_is_a_problem_and_is_never_computed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # PyYAML reads a base-60 number of n parts in time n squared; a hex one in linear time.
    computed = _count_calls(monkeypatch, SafeConstructor, "construct_yaml_int")
    for number in ["1:" * (MAX_NUMBER_CHARS // 2 + 1) + "1", "0x" + "f" * MAX_NUMBER_CHARS]:
        (problem,) = _problems(_tool(f"    kind: read\n    max_payload_bytes: {number}\n"))

        assert problem.key_path == "tools.t.max_payload_bytes"
        assert f"more digits than the {MAX_NUMBER_CHARS} a number may have" in problem.reason
    assert computed() == 0


# --- problems: the first ones listed, the others counted ---------------------------------------

HOW_MANY = 3 * MAX_LISTED_PROBLEMS

MANY_PROBLEMS = {
    "repeated keys": _tool("    kind: read\n", ["    kind: read\n"] * HOW_MANY),
    "keys read as numbers": _tool("    kind: read\n", (f"    {i}: x\n" for i in range(HOW_MANY))),
    "dates that do not exist": _tool(
        "    kind: read\n    limits:\n      degrade_result:\n",
        (f"        k{i}: 2026-13-45\n" for i in range(HOW_MANY)),
    ),
    "unknown keys": _tool("    kind: read\n", (f"    x{i}: 1\n" for i in range(HOW_MANY))),
    "broken tool entries": _tools(HOW_MANY, lambda i: f"t{i}: {{kind: nope}}"),
    "placeholders that are not arguments": _tool(
        "    kind: mutation\n    arguments: [a]\n    resource: '"
        + "".join(f"{{p{i}}}" for i in range(HOW_MANY))
        + "'\n"
    ),
    "compensations naming no tool": _tools(
        HOW_MANY, lambda i: f"t{i}: {{kind: mutation, compensation: {{tool: gone_{i}}}}}"
    ),
    "cancel tools taken": _tools(
        HOW_MANY,
        lambda i: (
            f"t{i}: {{kind: mutation, cancellable_by_llm: true}}\n  cancel_t{i}: {{kind: read}}"
        ),
    ),
}


@pytest.mark.parametrize("text", MANY_PROBLEMS.values(), ids=MANY_PROBLEMS.keys())
def test_only_the_first_problems_are_listed_and_the_others_are_counted(text: str) -> None:
    problems = _problems(text)

    assert len(problems) == MAX_LISTED_PROBLEMS + 1
    assert len(set(problems)) == len(problems)
    last = problems[-1]
    assert last.key_path == ""
    assert last.reason.startswith(
        f"and {HOW_MANY - MAX_LISTED_PROBLEMS} more problems, not listed: a check lists the "
        f"first {MAX_LISTED_PROBLEMS} problems of a file"
    )


def test_a_problem_that_is_not_listed_is_never_worded(monkeypatch: pytest.MonkeyPatch) -> None:
    # Each unknown key's "did you mean" compares it with every key allowed there.
    suggested = _count_calls(monkeypatch, difflib, "get_close_matches")

    _problems(MANY_PROBLEMS["unknown keys"])

    assert suggested() == MAX_LISTED_PROBLEMS


def test_compensations_naming_no_tool_make_few_suggestions_however_many_tools(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Each suggestion compares a name with every tool's: one per tool would be quadratic.
    suggested = _count_calls(monkeypatch, difflib, "get_close_matches")
    for count in (50, 100):
        text = _tools(
            count, lambda i: f"tool_{i}: {{kind: mutation, compensation: {{tool: t{i}}}}}"
        )

        problems = _problems(text)

        assert len(problems) == min(count, MAX_LISTED_PROBLEMS)
        assert all(len(str(problem)) < 500 for problem in problems)  # not every tool named
    assert suggested() <= 2 * 5


def test_a_value_deep_under_long_keys_is_reported_in_one_short_line() -> None:
    # Its path, worded at every value, would cost the nesting times the key length each.
    keys = [f"{'k' * 1000}{level}" for level in range(20)]
    lines = [f"{' ' * (8 + 2 * level)}{key}:\n" for level, key in enumerate(keys)]
    leaf = " " * (8 + 2 * len(keys))
    lines += [f"{leaf}- {{a: 1}}\n"] * 2000 + [f"{leaf}- {{a: .inf}}\n"]
    text = _tool("    kind: read\n    limits:\n      degrade_result:\n", lines)

    (problem,) = _problems(text)

    assert problem.key_path == "tools.t.limits.degrade_result"
    assert "[2000].a is the number inf; numbers must be finite" in problem.reason
    assert len(str(problem)) < 2000


# --- linear work: twice the file, about twice the function calls -------------------------------

GROWING = {
    "valid tools": lambda n: _tools(n, lambda i: f"t{i}: {{kind: read, description: tool {i}}}"),
    "tools under shared defaults": lambda n: _tools(
        n,
        lambda i: f"t{i}: {{limits: {{max_queued: {i}}}}}",
        head="defaults:\n  kind: read\n  limits: {overflow: degrade, degrade_result: {x: "
        + str(list(range(150)))
        + "}}\n",
    ),
    "compensations naming misspelt tools": lambda n: _tools(
        n, lambda i: f"tool_number_{i}: {{kind: mutation, compensation: {{tool: tool_nmber_{i}}}}}"
    ),
    "cancel tools taken": lambda n: _tools(
        n, lambda i: f"t{i}: {{kind: mutation, cancellable_by_llm: true}}\n  cancel_t{i}: {{}}"
    ),
    "unknown keys": lambda n: _tool("    kind: read\n", (f"    x{i}: 1\n" for i in range(8 * n))),
    "repeated keys": lambda n: _tool("    kind: read\n", ["    kind: read\n"] * (8 * n)),
    "placeholders that are not arguments": lambda n: _tool(
        "    kind: mutation\n    arguments: [a]\n    resource: '"
        + "".join(f"{{p{i}}}" for i in range(8 * n))
        + "'\n"
    ),
}


@pytest.mark.parametrize("make", GROWING.values(), ids=GROWING.keys())
def test_checking_twice_the_file_makes_about_twice_the_calls(make: Callable[[int], str]) -> None:
    small, large = _calls_to_check(make(200)), _calls_to_check(make(400))

    assert large < 2.3 * small, (small, large)


# --- the YAML reader without libyaml -----------------------------------------------------------


def test_without_libyaml_the_reader_reads_policies_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with_libyaml = {path: load_policy(path) for path in CONFIGS}
    bad = {path: _key_paths(path) for path in BAD_FILES}
    monkeypatch.setattr(_yaml, "_LOADER", yaml.SafeLoader)

    assert {path: load_policy(path) for path in CONFIGS} == with_libyaml
    assert {path: _key_paths(path) for path in BAD_FILES} == bad


def _key_paths(path: Path) -> list[str]:
    with pytest.raises(PolicyError) as caught:
        load_policy(path)
    return [problem.key_path for problem in caught.value.problems]


# --- counters ----------------------------------------------------------------------------------


def _count_calls(monkeypatch: pytest.MonkeyPatch, owner: Any, name: str) -> Callable[[], int]:
    """Count the calls of ``owner.name`` from now on; return a function giving the count."""
    calls = 0
    real = getattr(owner, name)

    def counted(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        return real(*args, **kwargs)

    if isinstance(owner, type) and hasattr(owner, "yaml_constructors"):
        tag = {function: tag for tag, function in owner.yaml_constructors.items()}[real]
        monkeypatch.setitem(owner.yaml_constructors, tag, counted)
    else:
        monkeypatch.setattr(owner, name, counted)
    return lambda: calls


class _EventCounter:
    """Counts the parser events the policy reader takes while in the ``with`` block."""

    def __init__(self) -> None:
        self.events = 0

    def __enter__(self) -> _EventCounter:
        real = _yaml._LOADER
        counter = self

        class Counting(real):  # type: ignore[valid-type,misc]
            def get_event(self) -> Any:
                counter.events += 1
                return super().get_event()

        self._real = real
        _yaml._LOADER = Counting
        return self

    def __exit__(self, *exc: object) -> None:
        _yaml._LOADER = self._real


def _calls_to_check(text: str) -> int:
    """How many Python and builtin functions loading ``text`` calls, valid or not."""
    calls = 0

    def profile(_frame: FrameType, event: str, _arg: object) -> None:
        nonlocal calls
        if event in ("call", "c_call"):
            calls += 1

    sys.setprofile(profile)
    try:
        load_policy_text(text)
    except PolicyError:
        pass
    finally:
        sys.setprofile(None)
    return calls
