"""The code blocks of README.md and of the documentation site (docs/), checked.

The ``python`` blocks run as tests of their own (pytest-markdown-docs; see conftest.py): each is
a complete program, with no top-level ``await`` and nothing given to it, so it runs as written
when pasted into a file. A block that only includes an example file (``--8<-- "examples/..."``,
mkdocs' snippets) is not run as a block: the file it names is checked to exist and to be run by
a test. Every block says its language. YAML blocks are loaded as what they are (a policy, or a
scenario, which is played); JSON and text blocks that show an output are compared with what
the code produces; every ``pipecat-actions`` command line names a real subcommand and real
options, every ``make`` target exists, and every script or test path a command names exists.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from markdown_it import MarkdownIt

from pipecat_actions import ActionContext, ActionRuntime, AllowAll, Approver, SessionState, action
from pipecat_actions.cli import _build_parser
from pipecat_actions.execution.outcomes import EffectFailed
from pipecat_actions.policy import load_policy_text
from pipecat_actions.results import render
from pipecat_actions.scenarios import load_scenario_text, run_scenario
from pipecat_actions.status import ActionStatus

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
PAGES = [README, *sorted(DOCS.rglob("*.md"))]
LANGUAGES = {"python", "yaml", "json", "shell", "text", "toml"}
OP_ID = "op_…"
"""How the documentation writes an operation id it cannot know."""
SNIPPET = re.compile(r'^--8<-- "([^"]+)"$')
"""A line that includes a file into the page (pymdownx.snippets)."""


@dataclass(frozen=True)
class Block:
    language: str
    options: tuple[str, ...]
    text: str
    line: int
    path: Path

    def __str__(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line} ({self.language})"

    @property
    def includes(self) -> list[str]:
        """The files the block includes, if it is only includes."""
        lines = [line.strip() for line in self.text.strip().splitlines()]
        found = [SNIPPET.match(line) for line in lines]
        return [m.group(1) for m in found if m] if lines and all(found) else []


def _blocks() -> list[Block]:
    blocks = []
    for path in PAGES:
        tokens = MarkdownIt("commonmark").parse(path.read_text())
        for token in tokens:
            if token.type == "fence" and token.map:
                info = token.info.split()
                language = info[0] if info else ""
                blocks.append(
                    Block(language, tuple(info[1:]), token.content, token.map[0] + 1, path)
                )
    return blocks


BLOCKS = _blocks()
TEXT = "\n".join(path.read_text() for path in PAGES)


def _of(language: str) -> list[Block]:
    """The blocks of a language, less those that only include an example file."""
    return [b for b in BLOCKS if b.language == language and not b.includes]


def test_every_block_says_its_language() -> None:
    unknown = [str(b) for b in BLOCKS if b.language not in LANGUAGES]
    assert unknown == [], f"say python, yaml, json, shell, toml or text: {unknown}"


def test_every_python_block_runs_as_written() -> None:
    # pytest-markdown-docs skips a block marked `notest`, and gives a block marked `fixture:X`
    # the fixture X: none is, so every block is a test of its own and needs nothing given.
    assert [str(b) for b in BLOCKS if b.language == "python" and b.options] == []
    programs = _of("python")
    assert len(programs) >= 10
    for block in programs:
        # No top-level await: a pasted block runs with `python file.py`.
        ast.parse(block.text, filename=str(block))  # SyntaxError: 'await' outside function
        compile(block.text, str(block), "exec", dont_inherit=True)


def test_every_python_block_imports_from_where_the_names_live_today() -> None:
    import warnings

    for block in _of("python"):
        for node in ast.walk(ast.parse(block.text)):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(
                "pipecat_actions"
            ):
                module = __import__(node.module or "", fromlist=["_"])
                with warnings.catch_warnings():
                    warnings.simplefilter("error", DeprecationWarning)
                    for alias in node.names:
                        getattr(module, alias.name)  # a deprecated name warns: an error here


def test_an_included_example_is_a_file_a_test_runs() -> None:
    included = [(b, name) for b in BLOCKS for name in b.includes]
    assert included, "docs/your-own-agent.md includes the example's files"
    tests = "\n".join(p.read_text() for p in (ROOT / "tests" / "examples").glob("test_*.py"))
    for block, name in included:
        path = ROOT / name
        assert path.is_file(), f"{block}: no {name}"
        assert name.startswith("examples/"), f"{block}: include examples/ files only"
        folder = path.relative_to(ROOT / "examples").parts[0]
        assert f'"{folder}"' in tests, f"{block}: no test under tests/examples runs {folder}"


# --- YAML ----------------------------------------------------------------------------------


def test_every_yaml_block_is_a_policy_or_a_scenario() -> None:
    for block in _of("yaml"):
        assert "steps:" in block.text or block.text.startswith("version: 1"), str(block)


@pytest.mark.parametrize("block", [b for b in _of("yaml") if "steps:" not in b.text], ids=str)
def test_a_policy_block_loads(block: Block) -> None:
    load_policy_text(block.text, source=str(block))


@pytest.mark.parametrize("block", [b for b in _of("yaml") if "steps:" in b.text], ids=str)
async def test_a_scenario_block_plays_and_passes(block: Block, tmp_path: Path) -> None:
    # Read as if it lived beside the shipped scenarios, as its relative policy path says.
    loaded = load_scenario_text(block.text, source=str(block), base=ROOT / "tests" / "scenarios")
    report = await run_scenario(loaded, ledger_url=f"sqlite:///{tmp_path / 'scenario.db'}")
    assert report.passed, [f"{c.what}: {c.found}" for c in report.failures]


# --- what the code produces: JSON and text outputs -------------------------------------------

PRODUCING_POLICY = """
version: 1
tools:
  book_table: {kind: mutation}
"""


@pytest.fixture
async def produced(tmp_path: Path) -> list[dict[str, Any]]:
    """Results the runtime gives the model, for the documentation's examples to be compared with."""

    @action
    async def book_table(ctx: ActionContext, time: str) -> dict[str, Any]:
        """Book a table."""
        if time == "23:00":
            raise EffectFailed("the kitchen closes at 22:30")
        return {"booking_id": "bk_1"}

    runtime = await ActionRuntime.create(
        load_policy_text(PRODUCING_POLICY),
        authorizer=AllowAll(),
        actions=[book_table],
        ledger_url=f"sqlite:///{tmp_path / 'produced.db'}",
    )
    try:
        session = SessionState(session_id="call-1", principal="alice")
        return [
            await runtime.propose("book_table", {"time": time}, session)
            for time in ("21:00", "21:00", "23:00")
        ]
    finally:
        await runtime.close()


async def _late_refund(tmp_path: Path) -> str:
    """The developer message that tells a refund a manager approved while the call went on."""
    import asyncio

    from pipecat_actions.testing.restaurant import build_actions, new_system_of_record

    told: asyncio.Queue[Any] = asyncio.Queue()

    class Outlet:
        async def tell(self, what: Any) -> None:
            await told.put(what)

        async def interrupt(self) -> None:
            pass

        def spawn(self, coroutine: Any) -> Any:
            return asyncio.get_running_loop().create_task(coroutine)

    runtime = await ActionRuntime.create(
        ROOT / "configs" / "restaurant.yaml",
        authorizer=AllowAll(),
        actions=build_actions(new_system_of_record()),
        ledger_url=f"sqlite:///{tmp_path / 'late.db'}",
    )
    try:
        session = SessionState(session_id="call-1", principal="alice", active_agent="host")
        delivery = runtime.deliveries.open(session, Outlet())
        delivery.start()
        answer = await runtime.propose(
            "refund_deposit", {"booking_id": "bk_0001", "amount": 2000}, session
        )
        assert answer["status"] == "awaiting_approval"
        delivery.await_outcome(answer["operation_id"])
        waiting = await runtime.ledger.get(answer["operation_id"])
        await runtime.approve(
            waiting.operation_id,
            approver=Approver("rosa", frozenset({"manager"}), frozenset({"default"})),
            reason="paid twice",
            args_hash=waiting.args_hash,
        )
        async with asyncio.timeout(10):
            first = await told.get()
        delivery.close()
        return str(first.text).replace(waiting.operation_id, OP_ID)
    finally:
        await runtime.close()


def _without_id(result: dict[str, Any]) -> dict[str, Any]:
    return {**result, "operation_id": OP_ID} if "operation_id" in result else result


def _results_shown() -> Iterator[tuple[Block, dict[str, Any]]]:
    for block in _of("json"):
        value = json.loads(block.text)
        if "status" in value and "type" not in value:
            yield block, value


def test_every_json_block_parses() -> None:
    for block in _of("json"):
        json.loads(block.text)


def test_the_result_envelope_shown_is_what_the_model_gets(produced: list[dict[str, Any]]) -> None:
    shown = list(_results_shown())
    assert shown, "the documentation shows the result envelope"
    for block, value in shown:
        assert value in [_without_id(r) for r in produced], str(block)


def test_the_messages_quoted_are_what_the_model_gets(produced: list[dict[str, Any]]) -> None:
    text = TEXT
    first, joined, failed = produced
    assert joined["operation_id"] == first["operation_id"]
    assert (
        failed["message"] == "book_table did not happen: EffectFailed: the kitchen closes at 22:30."
    )
    for quoted in (failed["message"], joined["message"].removeprefix(first["message"]).strip()):
        assert quoted in text, quoted


async def test_the_late_outcome_shown_is_what_the_gate_tells(tmp_path: Path) -> None:
    shown = [b for b in _of("text") if b.text.startswith("Outcome of an earlier")]
    assert len(shown) == 1
    assert shown[0].text.strip() == await _late_refund(tmp_path)


def test_the_rtvi_message_shown_is_what_a_client_is_sent() -> None:
    from pipecat_actions.adapters.status_reporter import ActionStatusReporter

    (block,) = [b for b in _of("json") if '"action-status"' in b.text]
    value = json.loads(block.text)
    status = ActionStatus(value["status"].upper())
    message = render(status, tool=value["tool"], operation_id=value["operation_id"])["message"]
    sent = ActionStatusReporter._message(
        None,  # type: ignore[arg-type]  # builds the message from its arguments alone
        value["event"],
        tool=value["tool"],
        tool_call_id=value["tool_call_id"],
        status=value["status"],
        message=message,
        operation_id=value["operation_id"],
    )
    assert value == sent


# --- shell ---------------------------------------------------------------------------------

SYNOPSIS = re.compile(r"[\[\]|]|\.\.\.|(^|\s)[A-Z][A-Z_:]*(\s|$)")
"""A synopsis line (``[--ledger URL]``, ``OP | --all``, ``FILE...``), not a command to parse."""


def _commands() -> Iterator[tuple[Block, str]]:
    """Each command line of the shell blocks, continuation lines joined, comments dropped."""
    for block in _of("shell"):
        current: str | None = None
        for raw in block.text.splitlines():
            line = raw.split("  #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
            if not line.strip():
                continue
            if raw[:1].isspace() and current is not None:
                current += " " + line.strip()
                continue
            if current is not None:
                yield block, current
            current = line.strip()
        if current is not None:
            yield block, current


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for act in parser._actions:
        if isinstance(act, argparse._SubParsersAction):
            return dict(act.choices)
    return {}


def _options(parser: argparse.ArgumentParser) -> set[str]:
    return {option for act in parser._actions for option in act.option_strings}


def _check_synopsis(command: str) -> None:
    """Every subcommand of a synopsis line exists, and every option is one of its parser's."""
    words = command.split()[1:]
    parsers = [_build_parser()]
    while words and _subparsers(parsers[0]):
        subs = _subparsers(parsers[0])
        names = words.pop(0).split("|")  # `users add|remove|list`: each of them
        missing = [name for name in names if name not in subs]
        assert not missing, f"no subcommand {missing} in {parsers[0].prog}"
        parsers = [subs[name] for name in names]
    known = set().union(*(_options(parser) for parser in parsers))
    for option in re.findall(r"(?<![\w-])(--?[a-z][\w-]*)", " ".join(words)):
        assert option in known, f"{parsers[0].prog} has no {option}"


def _check(command: str) -> None:
    words = shlex.split(command)
    while words and re.fullmatch(r"[A-Z_]+=.*", words[0]):
        words = words[1:]  # an environment assignment for the command
    head = words[0]
    if head == "pipecat-actions":
        if SYNOPSIS.search(command.removeprefix("pipecat-actions")):
            _check_synopsis(command)
        else:
            try:
                _build_parser().parse_args(words[1:])
            except SystemExit as exc:
                raise AssertionError(f"{command}: refused by the parser") from exc
    elif head == "make":
        targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
        assert words[1] in targets, f"no make target {words[1]!r}"
    elif head == ".venv/bin/python":
        if words[1:3] == ["-m", "pytest"]:
            paths = [w for k, w in enumerate(words[3:], 3) if not w.startswith("-")
                     and words[k - 1] != "-k"]  # fmt: skip
        else:
            paths = words[1:2]  # the script; its own arguments follow
        for path in paths:
            assert (ROOT / path).exists(), f"{command}: no {path}"
    elif head == "export":
        assert re.fullmatch(r"[A-Z_]+=\S+", words[1]), command
    else:
        raise AssertionError(f"a command this test does not know: {command}")


def test_the_shell_blocks_name_real_commands() -> None:
    commands = list(_commands())
    assert any(c.startswith("pipecat-actions ") for _, c in commands)
    assert any(c.startswith("make ") for _, c in commands)
    problems = []
    for block, command in commands:
        try:
            _check(command)
        except (AssertionError, ValueError) as exc:
            problems.append(f"{block}: {exc}")
    assert problems == []


def test_the_synopsis_check_catches_a_wrong_option() -> None:
    with pytest.raises(AssertionError, match="has no --nope"):
        _check("pipecat-actions ledger list [--nope N]")
    with pytest.raises(AssertionError, match="no subcommand"):
        _check("pipecat-actions legder list [--json]")
    with pytest.raises(AssertionError, match="refused"):
        _check("pipecat-actions stats --since soon")
    with pytest.raises(AssertionError, match="no make target"):
        _check("make deploy")


def test_the_benchmark_options_listed_exist() -> None:
    listed = 0
    for block in _of("shell"):
        for line in block.text.splitlines():
            script, _, comment = line.partition("#")
            words = script.split()
            if words[:1] != [".venv/bin/python"] or not words[1].startswith("bench/"):
                continue
            source = (ROOT / words[1]).read_text()
            for option in re.findall(r"--[a-z][\w-]*", comment):
                listed += 1
                assert f'"{option}"' in source, f"{block}: {words[1]} has no {option}"
    assert listed > 10


def test_toml_blocks_are_pytest_settings_the_scenario_plugin_reads() -> None:
    import tomllib

    from pipecat_actions.scenarios import pytest_plugin

    blocks = _of("toml")
    assert blocks
    for block in blocks:
        settings = tomllib.loads(block.text)["tool"]["pytest"]["ini_options"]
        assert set(settings) <= {"scenario_files"}, block
        assert all(isinstance(glob, str) for glob in settings["scenario_files"])
    assert "scenario_files" in pytest_plugin.pytest_addoption.__doc__


# --- the landing page ----------------------------------------------------------------------


def test_the_readme_starts_with_the_two_commands_of_a_fresh_machine() -> None:
    first = BLOCKS[0]
    assert first.path == README and first.language == "shell"
    commands = [line.split("#")[0].strip() for line in first.text.splitlines()]
    assert commands == ["make demo", "make test"]
    assert README.read_text().startswith("# pipecat_actions\n\n```shell\nmake demo")


def test_the_readme_links_to_files_that_exist() -> None:
    # mkdocs checks the links of docs/ (--strict); README.md is outside the site.
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README.read_text())
    local = [link for link in links if not link.startswith("http")]
    assert "docs/your-own-agent.md" in local
    assert [link for link in local if not (ROOT / link).exists()] == []


def test_every_page_of_docs_is_in_the_site_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    pages = [p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")]
    assert [page for page in pages if f" {page}" not in nav] == []
