"""Upgrading in place: the policy files of every release load, warned, and migrate.

The compatibility rule (docs/upgrading.md): a shape a release stops accepting warns for one
release before it is refused. At 0.1.0 (policy version 1) an approval with nobody named to give
it, and an entry for a tool with no action, were valid; version 2 refuses both, and a version 1
file with either loads in this release with one warning line each.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, ConfigurationError, action
from pipecat_actions.cli import main
from pipecat_actions.policy import PolicyError, load_policy, load_policy_text
from pipecat_actions.policy.migrate import migrate_policy_text
from pipecat_actions.testing import capture_logs

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "policies"
RELEASE_FILES = sorted(FIXTURES.glob("*/*.yaml"))

# What each file of an older release holds that is deprecated now: tool -> its deprecations.
DEPRECATED = {
    "0.1.0/restaurant.yaml": ["refund_deposit"],
    "0.1.0/ecommerce_support.yaml": ["issue_refund", "charge_back_refund"],
}


def _name(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


def _comments(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip().startswith("#")]


def test_there_are_policy_files_of_each_release() -> None:
    assert {path.parent.name for path in RELEASE_FILES} >= {"0.1.0", "0.2.0"}


@pytest.mark.parametrize("path", RELEASE_FILES, ids=_name)
def test_a_release_s_policy_file_loads_with_one_warning_line_per_deprecated_shape(
    path: Path,
) -> None:
    with capture_logs("WARNING", format="{message}") as lines:
        policies = load_policy(path)
    tools = DEPRECATED.get(_name(path), [])
    assert [line.strip() for line in lines] == list(policies.deprecations)
    assert len(policies.deprecations) == len(tools)
    for tool, line in zip(tools, policies.deprecations, strict=True):
        assert line.startswith(f"policy {path}: tools.{tool}.confirmation: approval with no ")
        assert "pipecat-actions policy migrate" in line
        assert "\n" not in line
        # Read as the migration writes it: only holders of the role approver may approve.
        assert policies[tool].confirmation.approver_roles == ("approver",)
        assert policies[tool].confirmation.approvers == ()


@pytest.mark.parametrize("path", RELEASE_FILES, ids=_name)
def test_a_release_s_policy_file_migrates_to_the_current_format_keeping_its_comments(
    path: Path,
) -> None:
    old = path.read_text()
    migration = migrate_policy_text(old, source=str(path))
    assert re.search(r"^version: 2$", migration.text, re.MULTILINE)
    # Every comment line kept, in order; the migration's own comment ends each line it adds.
    assert _comments(migration.text) == _comments(old)
    added = [line.strip() for line in migration.text.splitlines() if line not in old.splitlines()]
    assert added == [
        "version: 2",
        *["approver_roles: [approver]  # added by policy migrate: name who approves"]
        * len(DEPRECATED.get(_name(path), [])),
    ]
    with capture_logs("WARNING") as lines:
        current = load_policy_text(migration.text, source="migrated")
    assert current.version == 2 and current.deprecations == () and lines == []
    before = load_policy_text(old)  # the same tools, read the same way
    assert {name: before[name] for name in before} == {name: current[name] for name in current}
    again = migrate_policy_text(migration.text)
    assert not again.changed and again.text == migration.text


def test_version_2_refuses_an_approval_nobody_may_give() -> None:
    with pytest.raises(PolicyError, match=r"confirmation\.approvers.*approval needs someone"):
        load_policy_text(
            "version: 2\ntools:\n  refund:\n    kind: mutation\n"
            "    confirmation: {mode: approval}\n"
        )


@action
async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
    """Book a table."""
    return {"time": time}


async def _start(tmp_path: Path, version: int) -> ActionRuntime:
    policy = load_policy_text(
        f"version: {version}\ntools:\n  book_table:\n    kind: mutation\n"
        "  cancel_order:\n    kind: mutation\n",
        source="p.yaml",
    )
    return await ActionRuntime.create(
        policy,
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path}/l.db",
    )


async def test_a_version_1_entry_for_a_tool_with_no_action_starts_with_one_warning_line(
    tmp_path: Path,
) -> None:
    with capture_logs("WARNING", format="{message}") as lines:
        runtime = await _start(tmp_path, 1)
    await runtime.close()
    [line] = [line for line in lines if "no action" in line]
    assert line.startswith(
        "policy p.yaml: entries for tools with no action are deprecated (version 1; version 2 "
        "refuses them): cancel_order never offered to the LLM"
    )


async def test_a_version_2_entry_for_a_tool_with_no_action_stops_start_up(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="entries for tools with no action: cancel_order"):
        await _start(tmp_path, 2)


# --- the command -----------------------------------------------------------------------------


def _cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_policy_migrate_rewrites_the_file_in_place_and_says_what_it_changed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "restaurant.yaml"
    path.write_text((FIXTURES / "0.1.0" / "restaurant.yaml").read_text())
    path.chmod(0o640)
    code, out, err = _cli(capsys, "policy", "migrate", str(path))
    assert (code, err) == (0, "")
    assert out.splitlines()[:3] == [
        f"{path}: migrated from version 1",
        "  version: 1 -> 2",
        "  tools.refund_deposit.confirmation: approval named nobody: added approver_roles: "
        "[approver]",
    ]
    assert "note: an entry for a tool with no action" in out
    assert load_policy(path).version == 2
    assert path.stat().st_mode & 0o777 == 0o640
    code, out, _ = _cli(capsys, "policy", "migrate", str(path))
    assert (code, out) == (0, f"{path}: already the current format; nothing to change\n")


def test_policy_migrate_stdout_prints_the_file_and_leaves_it_as_it_was(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "p.yaml"
    old = "version: 1  # the first format\ntools:\n  r:\n    kind: mutation\n"
    path.write_text(old)
    code, out, err = _cli(capsys, "policy", "migrate", str(path), "--stdout")
    assert code == 0
    assert out == "version: 2  # the first format\ntools:\n  r:\n    kind: mutation\n"
    assert err.startswith(f"{path}: would migrate from version 1\n")
    assert path.read_text() == old


@pytest.mark.parametrize(
    ("content", "problem"),
    [
        (None, "no such file"),
        ("version: 1\ntools:\n  r:\n    kind: mutatoin\n", "tools.r.kind"),
        ("version: 9\ntools:\n  r:\n    kind: read\n", "unsupported policy version 9"),
        ("version: 1\ntools: [\n", "invalid YAML at line 3"),
        ("- a list\n", "the top level must be a mapping"),
    ],
    ids=["missing", "invalid setting", "unknown version", "broken yaml", "not a policy"],
)
def test_policy_migrate_refuses_what_is_not_a_policy_it_reads_and_leaves_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], content: str | None, problem: str
) -> None:
    path = tmp_path / "p.yaml"
    if content is not None:
        path.write_text(content)
    code, out, err = _cli(capsys, "policy", "migrate", str(path))
    assert code == 1 and out == ""
    assert problem in err
    assert err.splitlines()[-1] == f"{path}: not migrated (the file is unchanged)"
    assert "Traceback" not in err
    if content is not None:
        assert path.read_text() == content
    assert sorted(p.name for p in tmp_path.iterdir()) == ([] if content is None else ["p.yaml"])
