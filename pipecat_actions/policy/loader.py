"""Loading policy files: from a path, from text or from parsed data, to a checked `PolicySet`.

Every failure is a `PolicyError` listing every problem found, each with the file, the key path
and a plain reason; no YAML, pydantic, decoding or OS exception escapes. Checking goes in two
passes so that independent mistakes are all reported at once:

1. the document as written: YAML shape, keys, types and allowed values of ``defaults:`` and of
   each tool's own entry, at the key where each was written;
2. each tool's settings merged over ``defaults:``, against the cross-field rules, and the
   rules that span tools (a compensation names another mutation of the same file).

A tool whose own entry failed the first pass is not merged (its problems would repeat);
nothing is merged when ``defaults:`` failed.
"""

from __future__ import annotations

__all__ = [
    "MAX_POLICY_BYTES",
    "check_policy_files",
    "load_policy",
    "load_policy_data",
    "load_policy_text",
]

import difflib
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from pydantic import ValidationError

from pipecat_actions._printable import printable
from pipecat_actions.errors import PolicyError, PolicyProblem
from pipecat_actions.policy._problems import Loc, key_path, problems_from_validation, shown
from pipecat_actions.policy._yaml import (
    MAX_POLICY_BYTES,
    YamlRefused,
    parse_policy_yaml,
    too_large,
)
from pipecat_actions.policy.document import PolicyFile, PolicySet
from pipecat_actions.policy.fields import cancel_tool_name
from pipecat_actions.policy.model import ToolPolicy


def load_policy(path: str | os.PathLike[str]) -> PolicySet:
    """Read, check and merge a policy file.

    Args:
        path: The YAML policy file.

    Returns:
        The merged policy of every tool in the file; its ``source`` is ``path``.

    Raises:
        PolicyError: The file cannot be read or is invalid; ``problems`` lists every problem.
    """
    source = os.fspath(path)
    data = _read_bytes(source)
    if data.startswith(b"\xef\xbb\xbf"):
        data = data[3:]
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1) + 1
        raise PolicyError(
            [
                PolicyProblem(
                    source,
                    "",
                    f"is not UTF-8 text: byte 0x{data[exc.start]:02x} at line {line}, column "
                    f"{column} cannot be decoded; save the file as UTF-8",
                )
            ]
        ) from None
    return load_policy_text(text, source=source)


def load_policy_text(text: str, *, source: str = "<string>") -> PolicySet:
    """Check and merge a policy given as YAML text.

    Args:
        text: The YAML document.
        source: What to call it in problems and in `PolicySet.source`.

    Returns:
        The merged policy of every tool in the document.

    Raises:
        PolicyError: The text is not a valid policy; ``problems`` lists every problem.
    """
    try:
        data = parse_policy_yaml(text)
    except YamlRefused as exc:
        raise PolicyError(
            [PolicyProblem(source, key_path(loc), reason) for loc, reason in exc.problems]
        ) from None
    return load_policy_data(data, source=source)


def load_policy_data(data: object, *, source: str = "<data>") -> PolicySet:
    """Check and merge a policy given as already-parsed data (a mapping like the YAML's).

    Use this for a policy embedded in another document, such as a scenario file.

    Args:
        data: The policy document: ``{"version": 1, "defaults": {...}, "tools": {...}}``.
        source: What to call it in problems and in `PolicySet.source`.

    Returns:
        The merged policy of every tool in the document.

    Raises:
        PolicyError: The data is not a valid policy; ``problems`` lists every problem.
    """
    if not isinstance(data, Mapping):
        raise PolicyError(
            [
                PolicyProblem(
                    source,
                    "",
                    "the top level must be a mapping with version, defaults and tools "
                    f"(got {shown(data)})",
                )
            ]
        )
    try:
        problems = _non_text_keys(data, (), source)
        policies: dict[str, ToolPolicy] = {}
        if not problems:
            problems, policies = _check_document(data, source)
    except RecursionError:
        problems = [PolicyProblem(source, "", "the document is nested too deeply to check")]
    if problems:
        raise PolicyError(problems)
    return PolicySet(policies, source=source)


def check_policy_files(paths: Sequence[str], *, out: TextIO, err: TextIO) -> int:
    """Check policy files and report on each, for ``pipecat-actions policy check``.

    Prints ``OK <path> (<n> tools)`` to ``out`` for a valid file, and one
    ``<file>: <key_path>: <reason>`` line per problem to ``err`` for an invalid one.

    Args:
        paths: The files to check, in order.
        out: Where valid files are reported.
        err: Where problems are reported.

    Returns:
        0 when every file is valid, else 1.
    """
    status = 0
    for path in paths:
        try:
            policies = load_policy(path)
        except PolicyError as exc:
            status = 1
            for problem in exc.problems:
                # A key or value of the file is quoted in the problem: never obeyed by the
                # terminal (an ESC in a tool name would recolour it, set its title...).
                print(printable(str(problem)), file=err)
        else:
            count = len(policies)
            print(printable(f"OK {path} ({count} tool{'' if count == 1 else 's'})"), file=out)
    return status


def _read_bytes(source: str) -> bytes:
    def refuse(reason: str) -> PolicyError:
        return PolicyError([PolicyProblem(source, "", reason)])

    try:
        info = os.stat(source)
        if stat.S_ISDIR(info.st_mode):
            raise refuse("is a directory, not a policy file")
        if not stat.S_ISREG(info.st_mode):
            raise refuse("is not a regular file")
        if info.st_size > MAX_POLICY_BYTES:
            raise refuse(too_large(info.st_size))
        with open(source, "rb") as file:
            data = file.read(MAX_POLICY_BYTES + 1)
    except FileNotFoundError:
        raise refuse("no such file") from None
    except PermissionError:
        raise refuse("permission denied: the file cannot be read") from None
    except (OSError, ValueError) as exc:
        raise refuse(f"cannot be read: {getattr(exc, 'strerror', None) or exc}") from None
    if len(data) > MAX_POLICY_BYTES:
        raise refuse(too_large(len(data)))
    return data


def _non_text_keys(value: object, loc: Loc, source: str) -> list[PolicyProblem]:
    # Parsed YAML never has these (the YAML reader refuses them); other data sources may.
    problems: list[PolicyProblem] = []
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                problems.extend(_non_text_keys(item, (*loc, key), source))
            else:
                reason = f"key {shown(key)} is not text"
                problems.append(PolicyProblem(source, key_path(loc), reason))
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            problems.extend(_non_text_keys(item, (*loc, index), source))
    return problems


def _check_document(
    data: Mapping[Any, Any], source: str
) -> tuple[list[PolicyProblem], dict[str, ToolPolicy]]:
    problems: list[PolicyProblem] = []
    document: PolicyFile | None
    try:
        document = PolicyFile.model_validate(data)
    except ValidationError as exc:
        problems = problems_from_validation(exc, file=source)
        document = _checkable_part(data, exc)
    policies: dict[str, ToolPolicy] = {}
    if document is not None:
        for name in document.names():
            try:
                policies[name] = ToolPolicy.model_validate(document.settings_for(name))
            except ValidationError as exc:
                problems.extend(problems_from_validation(exc, file=source, prefix=("tools", name)))
    tools = data.get("tools")
    if document is not None and isinstance(tools, Mapping):
        names = [name for name in tools if isinstance(name, str)]
        problems.extend(_compensation_problems(document, names, source))
        problems.extend(_cancel_tool_problems(document, names, source))
    return list(dict.fromkeys(problems)), policies


def _checkable_part(data: Mapping[Any, Any], exc: ValidationError) -> PolicyFile | None:
    """Return the tools whose own entries passed, with the defaults, to merge and cross-check.

    None when ``defaults:`` or ``tools:`` themselves are broken, or no tool entry passed.
    """
    locs: list[Loc] = [tuple(error["loc"]) for error in exc.errors()]
    if any(loc[:1] == ("defaults",) or loc == ("tools",) for loc in locs):
        return None
    broken = {loc[1] for loc in locs if loc[:1] == ("tools",) and len(loc) > 1}
    tools = data.get("tools")
    if not isinstance(tools, Mapping):
        return None
    sound = {name: entry for name, entry in tools.items() if name not in broken}
    if not sound:
        return None
    try:
        return PolicyFile.model_validate(
            {"version": 1, "defaults": data.get("defaults"), "tools": sound}
        )
    except ValidationError:
        return None


def _compensation_problems(
    document: PolicyFile, tool_names: Sequence[str], source: str
) -> list[PolicyProblem]:
    problems: list[PolicyProblem] = []
    for name in document.names():
        compensation = document.settings_for(name).get("compensation")
        target = compensation.get("tool") if isinstance(compensation, Mapping) else None
        if not isinstance(target, str):
            continue
        if target == name:
            reason = "a tool cannot compensate itself; name the tool that undoes this one"
        elif target not in tool_names:
            reason = f"names {target!r}, which is not a tool in this file"
            close = difflib.get_close_matches(target, tool_names, n=1)
            listed = ", ".join(tool_names)
            reason += f"; did you mean {close[0]!r}?" if close else f" (tools: {listed})"
        elif target in document.tools and document.settings_for(target).get("kind") == "read":
            reason = f"names {target!r}, which is kind: read; only a mutation can undo a change"
        else:
            continue
        problems.append(
            PolicyProblem(source, key_path(("tools", name, "compensation", "tool")), reason)
        )
    return problems


def _cancel_tool_problems(
    document: PolicyFile, tool_names: Sequence[str], source: str
) -> list[PolicyProblem]:
    """A tool the model may cancel needs its ``cancel_<name>`` free for the runtime's tool."""
    problems: list[PolicyProblem] = []
    for name in document.names():
        if document.settings_for(name).get("cancellable_by_llm") is not True:
            continue
        cancel = cancel_tool_name(name)
        if cancel in tool_names:
            reason = (
                f"the model stops {name} with the tool {cancel!r}, which is already a tool in "
                "this file; rename one of them, or set cancellable_by_llm: false"
            )
            problems.append(
                PolicyProblem(source, key_path(("tools", name, "cancellable_by_llm")), reason)
            )
    return problems
