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

Checking costs time in proportion to the file's size, whatever it holds. The YAML reader bounds
the file (`MAX_POLICY_BYTES`, nesting, values); before any validation, a file of more than
`MAX_TOOLS` tools, or whose ``defaults:`` (checked again under every tool) is larger than
`MAX_DEFAULTS_CHARS`, is refused; and only the first `MAX_LISTED_PROBLEMS` problems are worded,
the others counted.
"""

from __future__ import annotations

__all__ = [
    "MAX_DEFAULTS_CHARS",
    "MAX_DEPTH",
    "MAX_LISTED_PROBLEMS",
    "MAX_NUMBER_CHARS",
    "MAX_POLICY_BYTES",
    "MAX_TOOLS",
    "MAX_VALUES",
    "check_policy_files",
    "load_policy",
    "load_policy_data",
    "load_policy_text",
    "read_policy_file",
    "read_policy_text",
]

import difflib
import os
import stat
from collections.abc import Mapping, Sequence
from typing import Any, TextIO

from loguru import logger
from pydantic import ValidationError

from pipecat_actions._printable import printable
from pipecat_actions.errors import PolicyError, PolicyProblem
from pipecat_actions.policy._problems import Loc, ProblemList, key_path, shown
from pipecat_actions.policy._yaml import (
    MAX_DEPTH,
    MAX_LISTED_PROBLEMS,
    MAX_NUMBER_CHARS,
    MAX_POLICY_BYTES,
    MAX_VALUES,
    YamlRefused,
    parse_policy_yaml,
    too_large,
)
from pipecat_actions.policy.document import CURRENT_VERSION, PolicyFile, PolicySet
from pipecat_actions.policy.fields import cancel_tool_name
from pipecat_actions.policy.model import ToolPolicy

MAX_TOOLS = 1000
"""The most tools a policy file may list (a model is rarely offered more than a hundred)."""

MAX_DEFAULTS_CHARS = 2048
"""The largest ``defaults:`` a policy file may have, in characters of its keys and text (a
number, true/false or null counts one): they are checked again as part of every tool."""

_MAX_SUGGESTIONS = 5
"""The most "did you mean" suggestions worked out for one file; each compares a name with every
tool's."""

_MAX_LISTED_NAMES_CHARS = 300
"""About how much of the list of the file's tools a problem shows."""


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
    return load_policy_text(read_policy_file(source), source=source)


def read_policy_file(source: str) -> str:
    """The text of the policy file ``source`` (UTF-8, a byte order mark dropped).

    Raises:
        PolicyError: The file cannot be read, is too large or is not UTF-8 text.
    """
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
    return text


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
    return _warned(read_policy_text(text, source=source))


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
    return _warned(_load(data, source, text_keys=False))


def _warned(policies: PolicySet) -> PolicySet:
    """``policies``, once each deprecated shape of its file is logged as one warning line."""
    for note in policies.deprecations:
        logger.warning(note)
    return policies


def read_policy_text(text: str, *, source: str) -> PolicySet:
    """`load_policy_text` without logging its deprecations (`policy migrate` reports them)."""
    try:
        data = parse_policy_yaml(text)
    except YamlRefused as exc:
        raise PolicyError(
            [PolicyProblem(source, key_path(loc), reason) for loc, reason in exc.problems]
        ) from None
    return _load(data, source, text_keys=True)


def _load(data: object, source: str, *, text_keys: bool) -> PolicySet:
    """Check and merge parsed data; ``text_keys`` when the YAML reader made sure of its keys."""
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
    problems = ProblemList(source)
    policies: dict[str, ToolPolicy] = {}
    deprecated: list[str] = []
    try:
        refusal = _too_large_to_check(data)
        if refusal is not None:
            raise PolicyError([PolicyProblem(source, key_path(refusal[0]), refusal[1])])
        if not text_keys:
            _non_text_keys(data, (), problems)
        if not problems:
            policies = _check_document(data, problems, deprecated)
    except RecursionError:
        problems = ProblemList(source)
        problems.add((), "the document is nested too deeply to check")
    if problems:
        raise PolicyError(problems.report())
    version = data.get("version")
    notes = tuple(printable(f"policy {source}: {note}") for note in deprecated)
    return PolicySet(
        policies,
        source=source,
        version=version if isinstance(version, int) else CURRENT_VERSION,
        deprecations=notes,
    )


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


def _too_large_to_check(data: Mapping[Any, Any]) -> tuple[Loc, str] | None:
    """Refuse, before any validation, a document whose checking would cost out of proportion.

    Returns:
        The key path and reason of the refusal, or None when the document may be checked.
    """
    tools = data.get("tools")
    if isinstance(tools, Mapping) and len(tools) > MAX_TOOLS:
        return ("tools",), (
            f"lists {len(tools)} tools; a policy file may list at most {MAX_TOOLS} tools"
        )
    defaults = data.get("defaults")
    if defaults is not None and _size_passes(defaults, MAX_DEFAULTS_CHARS):
        count = len(tools) if isinstance(tools, Mapping) else 0
        return ("defaults",), (
            f"holds more than {MAX_DEFAULTS_CHARS} characters of settings; defaults may hold "
            f"at most {MAX_DEFAULTS_CHARS}, as they are checked again as part of each tool "
            f"({count} here): move what only some tools need to their own entries"
        )
    return None


def _size_passes(value: object, limit: int) -> bool:
    """True when ``value`` holds more than ``limit`` characters of keys and text.

    A number, true/false, null, list or mapping counts one. Stops looking once past the limit.
    """
    size = 0
    pending = [value]
    while pending:
        item = pending.pop()
        size += len(item) if isinstance(item, str) else 1
        if isinstance(item, Mapping):
            for key, nested in item.items():
                size += len(key) if isinstance(key, str) else 1
                pending.append(nested)
        elif isinstance(item, list | tuple):
            pending.extend(item)
        if size > limit:
            return True
    return False


def _non_text_keys(value: object, loc: Loc, problems: ProblemList) -> None:
    # Parsed YAML never has these (the YAML reader refuses them); other data sources may.
    if isinstance(value, Mapping):
        for key, item in value.items():
            if isinstance(key, str):
                _non_text_keys(item, (*loc, key), problems)
            else:
                problems.add(loc, f"key {shown(key)} is not text")
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _non_text_keys(item, (*loc, index), problems)


def _check_document(
    data: Mapping[Any, Any], problems: ProblemList, deprecated: list[str]
) -> dict[str, ToolPolicy]:
    document: PolicyFile | None
    try:
        document = PolicyFile.model_validate(data)
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        problems.add_errors(errors)
        document = _checkable_part(data, errors)
    policies: dict[str, ToolPolicy] = {}
    if document is None:
        return policies
    # Each tool's settings are merged once; ``defaults:`` is read out of its model once.
    settings = document.merged_settings()
    if document.version == 1:
        settings = _read_version_1(settings, deprecated)
    for name, merged in settings.items():
        try:
            policies[name] = ToolPolicy.model_validate(merged)
        except ValidationError as exc:
            problems.add_errors(exc.errors(include_url=False), ("tools", name))
    tools = data.get("tools")
    if isinstance(tools, Mapping):
        names = [name for name in tools if isinstance(name, str)]
        _compensation_problems(settings, names, problems)
        _cancel_tool_problems(settings, frozenset(names), problems)
    return policies


def _checkable_part(data: Mapping[Any, Any], errors: Sequence[Any]) -> PolicyFile | None:
    """Return the tools whose own entries passed, with the defaults, to merge and cross-check.

    None when ``defaults:`` or ``tools:`` themselves are broken, or no tool entry passed.
    """
    locs: list[Loc] = [tuple(error["loc"]) for error in errors]
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
            {"version": data.get("version"), "defaults": data.get("defaults"), "tools": sound}
        )
    except ValidationError:
        return None


VERSION_1_APPROVER_ROLE = "approver"
"""The role a version 1 entry's approval with nobody named is read with (and migrated to)."""


def version_1_approval_without_approvers(merged: Mapping[str, Any]) -> bool:
    """Whether a tool's merged settings ask for approval and name nobody who may give it.

    Version 1 (0.1.0) accepted it and let anyone approve; version 2 refuses it.
    """
    confirmation = merged.get("confirmation")
    if not isinstance(confirmation, Mapping) or confirmation.get("mode") != "approval":
        return False
    return not confirmation.get("approvers") and not confirmation.get("approver_roles")


def _read_version_1(
    settings: Mapping[str, dict[str, Any]], deprecated: list[str]
) -> dict[str, dict[str, Any]]:
    """A version 1 file's merged settings as version 2 reads them; a note for each change.

    An approval that names nobody is read as one that anyone holding the role
    `VERSION_1_APPROVER_ROLE` may give: 0.1.0 let any operator approve, which the approvals
    console and CLI no longer allow; this release never lets anyone approve unnamed.
    """
    read: dict[str, dict[str, Any]] = {}
    for name, merged in settings.items():
        if version_1_approval_without_approvers(merged):
            confirmation = {
                **merged["confirmation"],
                "approver_roles": (VERSION_1_APPROVER_ROLE,),
            }
            merged = {**merged, "confirmation": confirmation}  # the defaults stay unchanged
            deprecated.append(
                f"tools.{name}.confirmation: approval with no approvers is deprecated (version "
                f"1; version 2 refuses it): read as approver_roles: [{VERSION_1_APPROVER_ROLE}]"
                "; name who approves, or run `pipecat-actions policy migrate FILE`"
            )
        read[name] = merged
    return read


def _compensation_problems(
    settings: Mapping[str, Mapping[str, Any]], tool_names: Sequence[str], problems: ProblemList
) -> None:
    known = frozenset(tool_names)
    suggestions = 0
    listed = _listed_names(tool_names)
    for name, merged in settings.items():
        compensation = merged.get("compensation")
        target = compensation.get("tool") if isinstance(compensation, Mapping) else None
        if not isinstance(target, str):
            continue
        loc = ("tools", name, "compensation", "tool")
        if target == name:
            problems.add(loc, "a tool cannot compensate itself; name the tool that undoes this one")
        elif target not in known:
            reason = f"names {target!r}, which is not a tool in this file"
            if problems.full or suggestions >= _MAX_SUGGESTIONS:
                problems.add(loc, f"{reason} (tools: {listed})")
                continue
            suggestions += 1
            close = difflib.get_close_matches(target, tool_names, n=1)
            reason += f"; did you mean {close[0]!r}?" if close else f" (tools: {listed})"
            problems.add(loc, reason)
        elif target in settings and settings[target].get("kind") == "read":
            problems.add(
                loc,
                f"names {target!r}, which is kind: read; only a mutation can undo a change",
            )


def _listed_names(tool_names: Sequence[str]) -> str:
    """The file's tool names for a problem: the first few, and how many there are."""
    shown_names: list[str] = []
    length = 0
    for name in tool_names:
        if length > _MAX_LISTED_NAMES_CHARS:
            return f"{', '.join(shown_names)}... ({len(tool_names)} tools)"
        shown_names.append(name)
        length += len(name) + 2
    return ", ".join(shown_names)


def _cancel_tool_problems(
    settings: Mapping[str, Mapping[str, Any]], tool_names: frozenset[str], problems: ProblemList
) -> None:
    """A tool the model may cancel needs its ``cancel_<name>`` free for the runtime's tool."""
    for name, merged in settings.items():
        if merged.get("cancellable_by_llm") is not True:
            continue
        cancel = cancel_tool_name(name)
        if cancel in tool_names:
            problems.add(
                ("tools", name, "cancellable_by_llm"),
                f"the model stops {name} with the tool {cancel!r}, which is already a tool in "
                "this file; rename one of them, or set cancellable_by_llm: false",
            )
