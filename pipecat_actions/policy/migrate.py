"""`pipecat-actions policy migrate FILE`: an older policy file rewritten in the current format.

The rewrite edits the file's text where a change is needed and leaves every other byte as it
was: comments, blank lines, quoting, key order and flow or block style are all kept. From
version 1 (0.1.0) to version 2:

* ``version: 1`` becomes ``version: 2``;
* an entry whose ``confirmation.mode`` is ``approval`` and that names nobody who may approve
  gets ``approver_roles: [approver]`` (how a version 1 file is read in this release), with a
  comment saying so; 0.1.0 let anyone approve, which no release allows any more.

What the file alone cannot tell is left to the start-up check, and said: an entry for a tool
with no action behind it (version 2 refuses it when the runtime starts; version 1 warns).

The input must be a policy this release reads; any problem in it is reported as
``policy check`` reports it, and the file is not touched. The result is checked to load as
version 2 with no deprecation before it is written.
"""

from __future__ import annotations

__all__ = ["Migration", "migrate_policy_file", "migrate_policy_text"]

import os
import tempfile
from dataclasses import dataclass, field

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode

from pipecat_actions.errors import PolicyError, PolicyProblem
from pipecat_actions.policy._yaml import parse_policy_yaml
from pipecat_actions.policy.document import CURRENT_VERSION, PolicyFile
from pipecat_actions.policy.loader import (
    VERSION_1_APPROVER_ROLE,
    read_policy_file,
    read_policy_text,
    version_1_approval_without_approvers,
)

_ADDED = (
    f"approver_roles: [{VERSION_1_APPROVER_ROLE}]  # added by policy migrate: name who approves"
)

NO_ACTION_NOTE = (
    "an entry for a tool with no action behind it is refused at start-up from version 2 (a "
    "version 1 file warns, naming it); this command cannot see your actions: start the "
    "application once on the old file, then remove each entry named, or name it in "
    "ActionRuntime.create(routed=[...])"
)
"""What `migrate_policy_text` cannot do from the file alone, said with every migration."""


@dataclass
class Migration:
    """The result of migrating one policy text.

    Attributes:
        text: The text in the current format (the input itself when nothing changed).
        from_version: The version the input said.
        changes: One line per change made, by key path.
        notes: What the file alone cannot settle, for the user to check.
    """

    text: str
    from_version: int
    changes: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        """Whether the text was rewritten."""
        return bool(self.changes)


def migrate_policy_text(text: str, *, source: str = "<string>") -> Migration:
    """Rewrite a policy text in the current format (`CURRENT_VERSION`), keeping its comments.

    Args:
        text: The YAML policy.
        source: What to call it in problems.

    Returns:
        The migration; ``text`` is the input unchanged if it is already current.

    Raises:
        PolicyError: The input is not a policy this release reads (each problem named, as by
            ``policy check``), or the rewrite would not load as the current version.
    """
    policies = read_policy_text(text, source=source)  # every problem of the input, or none
    if policies.version == CURRENT_VERSION:
        return Migration(text=text, from_version=policies.version)
    data = parse_policy_yaml(text)
    assert isinstance(data, dict)  # read_policy_text accepted it
    settings = PolicyFile.model_validate(data).merged_settings()
    root = yaml.compose(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    assert isinstance(root, MappingNode)
    edits: list[tuple[int, int, str]] = []
    changes: list[str] = []
    version = _value(root, "version")
    assert isinstance(version, ScalarNode)
    edits.append((version.start_mark.index, version.end_mark.index, str(CURRENT_VERSION)))
    changes.append(f"version: {policies.version} -> {CURRENT_VERSION}")
    tools = _value(root, "tools")
    assert isinstance(tools, MappingNode)
    for name, merged in settings.items():
        if not version_1_approval_without_approvers(merged):
            continue
        entry = _value(tools, name)
        if not isinstance(entry, MappingNode) or not entry.value:
            raise _cannot(source, name, "its entry is empty")
        confirmation = _value(entry, "confirmation")
        roles = f"approver_roles: [{_ROLE}]"
        if isinstance(confirmation, MappingNode) and confirmation.value:
            edits.append(_insert(text, confirmation, [_ADDED], roles))
        elif confirmation is None:
            # Its approval comes from defaults: the entry gets a confirmation of its own.
            lines = ["confirmation:", f"  {_ADDED}"]
            edits.append(_insert(text, entry, lines, f"confirmation: {{{roles}}}"))
        else:
            raise _cannot(source, name, "its confirmation is not a mapping of settings")
        changes.append(
            f"tools.{name}.confirmation: approval named nobody: added approver_roles: [{_ROLE}]"
        )
    migrated = text
    for start, end, replacement in sorted(edits, reverse=True):
        migrated = migrated[:start] + replacement + migrated[end:]
    check = read_policy_text(migrated, source=source)
    if check.version != CURRENT_VERSION or check.deprecations:  # pragma: no cover - a bug here
        raise _cannot(source, "", "the rewrite does not load as the current version")
    return Migration(
        text=migrated, from_version=policies.version, changes=changes, notes=[NO_ACTION_NOTE]
    )


_ROLE = VERSION_1_APPROVER_ROLE


def migrate_policy_file(path: str | os.PathLike[str], *, write: bool = True) -> Migration:
    """Migrate the policy file at ``path``; with ``write``, replace it (atomically) if changed.

    The file keeps its permissions; it is replaced by a complete new file in one rename, so a
    failure leaves the old file as it was.

    Raises:
        PolicyError: As `migrate_policy_text`, or the file cannot be read or written.
    """
    source = os.fspath(path)
    migration = migrate_policy_text(read_policy_file(source), source=source)
    if not write or not migration.changed:
        return migration
    folder = os.path.dirname(os.path.abspath(source))
    try:
        mode = os.stat(source).st_mode & 0o7777
        handle, temporary = tempfile.mkstemp(prefix=".migrate-", dir=folder)
        try:
            with os.fdopen(handle, "w", encoding="utf-8", newline="") as out:
                out.write(migration.text)
            os.chmod(temporary, mode)
            os.replace(temporary, source)
        except BaseException:
            os.unlink(temporary)
            raise
    except OSError as exc:
        reason = getattr(exc, "strerror", None) or str(exc)
        raise PolicyError([PolicyProblem(source, "", f"cannot be rewritten: {reason}")]) from None
    return migration


def _value(mapping: MappingNode, key: str) -> Node | None:
    """The value node of ``key`` in ``mapping``, or None."""
    for key_node, value in mapping.value:
        if isinstance(key_node, ScalarNode) and key_node.value == key:
            return value if isinstance(value, Node) else None
    return None


def _insert(text: str, mapping: MappingNode, lines: list[str], flow: str) -> tuple[int, int, str]:
    """An edit adding an entry to ``mapping``: ``lines`` before its first key, or ``flow``."""
    if mapping.flow_style:
        close = text.rindex("}", mapping.start_mark.index, mapping.end_mark.index)
        empty = not text[mapping.start_mark.index + 1 : close].strip()
        return (close, close, flow if empty else f", {flow}")
    first = mapping.value[0][0]
    indent = " " * first.start_mark.column
    at = text.rfind("\n", 0, first.start_mark.index) + 1  # before the first key's line
    mode = _value(mapping, "mode")
    if mode is not None and mode.start_mark.line == mode.end_mark.line:
        after = text.find("\n", mode.end_mark.index)  # right after the line of its mode
        at = len(text) if after < 0 else after + 1
        if after < 0:
            lines = ["", *lines]  # the file ends on that line, without a newline
    added = "\n".join(f"{indent}{line}" if line else "" for line in lines)
    return (at, at, added + "\n")


def _cannot(source: str, tool: str, reason: str) -> PolicyError:
    where = f"tools.{tool}" if tool else ""
    return PolicyError(
        [PolicyProblem(source, where, f"cannot be migrated: {reason}; edit it by hand")]
    )
