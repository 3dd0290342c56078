"""Scenario files are checked before anything runs; each problem names its step and key."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipecat_actions.scenarios import ScenarioError, load_scenario, load_scenario_text

ROOT = Path(__file__).resolve().parents[2]
POLICY = """
policy:
  version: 1
  tools:
    book_table:
      kind: mutation
      idempotency: {key_fields: [restaurant_id, date, time]}
"""
CALL = (
    "  - llm: {calls: [{tool: book_table, as: booking, args: "
    "{restaurant_id: trattoria, date: '2030-05-01', time: '21:00', party_size: 2}}]}\n"
)


def scenario(steps: str, expect: str = "", head: str = "name: broken\n" + POLICY) -> str:
    return head + "steps:\n" + textwrap.dedent(steps) + expect


def problems_of(text: str) -> list[str]:
    with pytest.raises(ScenarioError) as caught:
        load_scenario_text(text, source="s.yaml", base=ROOT)
    return [str(p) for p in caught.value.problems]


@pytest.mark.parametrize(
    ("steps", "expected"),
    [
        ("  - dance: now\n", "s.yaml: steps[0]: unknown step 'dance'; steps are: user,"),
        ("  - {user: hi, wait: 1}\n", "steps[0]: a step is a mapping with exactly one key"),
        ("  - user\n", "steps[0].user.text: required key is missing"),
        ("  - sing\n", "steps[0]: a step is a mapping with exactly one key"),
        ("  - barge_in: {text: hi, after: 1}\n", "steps[0].barge_in.after: unknown key"),
        ("  - advance: -3\n", "steps[0].advance.secs: Input should be greater than 0"),
        ("  - wait: soon\n", "steps[0].wait.secs: Input should be a valid number"),
        ("  - until: {op: booking}\n", "steps[0].until.status: required key is missing"),
        (
            "  - until: {op: nobody, status: [RUNNING]}\n",
            "steps[0].until.op: no call is labelled 'nobody'",
        ),
        (
            "  - until: {op: booking, status: [DONE]}\n" + CALL,
            "steps[0].until.status[0]: Input should be",
        ),
        ("  - fault: {fault: latency, kind: book}\n", "steps[0].fault: secs goes with the latency"),
        ("  - fault: {fault: meteor}\n", "steps[0].fault.fault: Input should be"),
        ("  - llm: {}\n", "steps[0].llm: an llm step says something, makes calls, or both"),
        (
            "  - llm: {calls: [{tool: launch_rocket}]}\n",
            "steps[0].llm.calls[0].tool: 'launch_rocket' is not a tool of the policy",
        ),
        (CALL + CALL, "steps[1].llm.calls[0].as: label 'booking' is used twice"),
        ("  - crash: soon\n", "steps[0].crash: takes a mapping, got 'soon'"),
    ],
)
def test_a_malformed_step_is_refused_naming_the_step_and_key(steps: str, expected: str) -> None:
    found = problems_of(scenario(steps))
    assert any(expected in problem for problem in found), found


def test_every_problem_of_a_file_is_reported_at_once() -> None:
    found = problems_of(scenario("  - dance: now\n  - wait: soon\n  - advance: 0\n"))
    where = [p.split(": ")[1] for p in found]
    assert where == ["steps[0]", "steps[1].wait.secs", "steps[2].advance.secs"]


def test_an_expectation_on_an_unknown_label_or_key_is_refused() -> None:
    expect = "expect:\n  operations:\n    - {op: ghost, status: COMMITTED}\n"
    ghost = problems_of(scenario(CALL, expect))
    assert any("expect.operations[0].op: no call is labelled 'ghost'" in p for p in ghost), ghost
    unknown = problems_of(scenario(CALL, "expect:\n  heard: {sounds: [x]}\n"))
    assert any("expect.heard.sounds: unknown key" in p for p in unknown), unknown


def test_a_broken_inline_policy_is_reported_with_its_key_path() -> None:
    head = "name: x\npolicy:\n  version: 1\n  tools:\n    book_table: {kind: teleport}\n"
    found = problems_of(scenario("  - wait: 1\n", head=head))
    assert any("tools.book_table.kind" in p for p in found), found


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "file is empty"),
        ("name: a\nname: b\n", "duplicate key"),
        ("- just\n- a list\n", "the top level must be a mapping"),
        ("a: &x [1]\nb: *x\n", "alias"),
        ("name: x\n" + POLICY, "steps: required key is missing"),
        ("name: x\npolicy: missing.yaml\nsteps: [{wait: 1}]\n", "no such file"),
    ],
)
def test_a_file_that_is_not_a_scenario_is_refused_with_the_reason(text: str, expected: str) -> None:
    found = problems_of(text)
    assert any(expected in problem for problem in found), found


def test_a_missing_or_binary_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match="no such file"):
        load_scenario(tmp_path / "nope.yaml")
    binary = tmp_path / "bin.yaml"
    binary.write_bytes(b"name: \xff\xfe\n")
    with pytest.raises(ScenarioError, match="not UTF-8"):
        load_scenario(binary)


def test_the_suite_files_all_load() -> None:
    for path in sorted((ROOT / "tests" / "scenarios").glob("*.yaml")):
        loaded = load_scenario(path)
        assert loaded.steps, path


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pipecat_actions.cli", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )


def test_the_command_refuses_a_malformed_file_in_one_line_per_problem(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(scenario("  - dance: now\n"))
    done = cli("scenario", "run", str(bad))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.strip().splitlines() == [
        f"pipecat-actions: {bad}: steps[0]: unknown step 'dance'; steps are: "
        "user, barge_in, llm, wait, idle, advance, until, fault, release_hung, approve, "
        "reject, handoff, crash, reconnect, hang_up, caller, compensate, together"
    ]
    assert "Traceback" not in done.stderr


def test_the_command_reports_a_failed_expectation_and_exits_1(tmp_path: Path) -> None:
    failing = tmp_path / "fails.yaml"
    failing.write_text(
        scenario(
            "  - user: Hello.\n  - llm: Hello, how can I help?\n  - idle: {quiet_secs: 0.3}\n",
            "expect:\n  heard: {includes: [goodbye], excludes: [help]}\n",
        )
    )
    done = cli("scenario", "run", str(failing))
    assert done.returncode == 1, done.stderr
    assert "FAIL broken" in done.stdout
    assert "FAIL heard includes 'goodbye'" in done.stdout
    assert "FAIL heard never has 'help'" in done.stdout
    assert "0 of 1 scenario(s) passed" in done.stdout

    as_json = cli("scenario", "run", "--json", str(failing))
    assert as_json.returncode == 1
    [report] = json.loads(as_json.stdout)
    assert report["passed"] is False
    assert [c["what"] for c in report["checks"] if not c["passed"]] == [
        "heard includes 'goodbye'",
        "heard never has 'help'",
    ]
    assert report["heard"] == [{"text": "Hello, how can I help?", "interrupted": False}]


def test_the_command_passes_a_scenario_that_holds_and_exits_0(tmp_path: Path) -> None:
    ok = tmp_path / "ok.yaml"
    ok.write_text(
        scenario(
            "  - user: Hello.\n  - llm: Hello, how can I help?\n  - idle: {quiet_secs: 0.3}\n",
            "expect:\n  heard: {includes: [how can I help]}\n  side_effects: {book: 0}\n",
        )
    )
    done = cli("scenario", "run", str(ok))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "PASS broken" in done.stdout


APP = '''
from pipecat_actions import ActionContext, action


def actions(sor):
    @action
    async def count_tables(ctx: ActionContext, restaurant_id: str) -> dict:
        """Count the free tables of a restaurant."""
        return {"free": len(sor.bookings(restaurant_id)) + 7}

    return [count_tables]
'''


async def test_a_scenario_runs_the_applications_own_actions_from_module_factory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from pipecat_actions.scenarios import run_scenario

    (tmp_path / "my_agent_actions.py").write_text(APP)
    monkeypatch.syspath_prepend(str(tmp_path))
    text = (
        "name: own app\napp: my_agent_actions:actions\n"
        "policy:\n  version: 1\n  tools:\n    count_tables: {kind: read}\n"
        "steps:\n  - user: How many tables are free?\n"
        "  - llm: {calls: [{tool: count_tables, as: count, args: {restaurant_id: trattoria}}]}\n"
        "  - llm: Seven tables are free.\n  - idle: {quiet_secs: 0.3, calls: true}\n"
        "expect:\n  operations:\n    - {op: count, status: COMMITTED, result: {free: 7}}\n"
        "  heard: {includes: [seven tables]}\n"
    )
    report = await run_scenario(load_scenario_text(text, source="own.yaml", base=tmp_path))
    assert report.passed, [c for c in report.checks if not c.passed]


def test_an_app_that_cannot_be_imported_is_a_file_problem_in_one_line(tmp_path: Path) -> None:
    text = scenario("  - wait: 0.1\n", head="name: x\napp: no_such_module_here:build\n" + POLICY)
    with pytest.raises(ScenarioError) as raised:
        load_scenario_text(text, source="x.yaml", base=ROOT)
    (problem,) = raised.value.problems
    assert str(problem) == (
        "x.yaml: app: 'no_such_module_here:build' cannot be loaded: "
        "ModuleNotFoundError: No module named 'no_such_module_here'"
    )
    broken = tmp_path / "app.yaml"
    broken.write_text(text)
    done = cli("scenario", "run", str(broken))
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "Traceback" not in done.stderr and "FAIL" not in done.stdout


FACTORIES = '''
from pipecat_actions import ActionContext, action


def raises(world):
    raise RuntimeError("the booking database is down")


def no_actions(world):
    return 42


def takes_nothing():
    return []


def other_tools(world):
    @action
    async def free_slots(ctx: ActionContext, doctor: str) -> dict:
        """The slots a doctor has free."""
        return {"free": []}

    return [free_slots]
'''


@pytest.mark.parametrize(
    ("factory", "problem"),
    [
        (
            "raises",
            "app: 'factories.py:raises' cannot be built: "
            "RuntimeError: the booking database is down",
        ),
        (
            "no_actions",
            "app: 'factories.py:no_actions' returned int: return a list of actions (@action) "
            "or a ScenarioApp",
        ),
        ("takes_nothing", "app: 'factories.py:takes_nothing' cannot be built: TypeError: "),
        (
            "other_tools",
            "policy: names tools the app 'factories.py:other_tools' has no action for: "
            "book_table (its actions: free_slots)",
        ),
        ("missing", "app: factories.py has no 'missing'"),
    ],
)
def test_an_app_whose_factory_cannot_build_it_is_a_file_problem_in_one_line(
    tmp_path: Path, factory: str, problem: str
) -> None:
    from pipecat_actions.scenarios import check_app

    (tmp_path / "factories.py").write_text(FACTORIES)
    text = scenario(
        "  - wait: 0.1\n", head=f"version: 2\nname: x\napp: factories.py:{factory}\n" + POLICY
    )
    with pytest.raises(ScenarioError) as raised:
        check_app(load_scenario_text(text, source="x.yaml", base=tmp_path))
    (found,) = raised.value.problems
    assert str(found).startswith(f"x.yaml: {problem}"), str(found)


def test_the_command_exits_2_with_one_line_for_a_factory_that_raises(tmp_path: Path) -> None:
    (tmp_path / "factories.py").write_text(FACTORIES)
    good = tmp_path / "good.yaml"
    good.write_text(scenario("  - wait: 0.1\n", expect="expect: {settled: true}\n"))
    broken = tmp_path / "broken.yaml"
    broken.write_text(
        scenario("  - wait: 0.1\n", head="version: 2\nname: x\napp: factories.py:raises\n" + POLICY)
    )
    done = cli("scenario", "run", str(good), str(broken))
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stdout == ""  # checked before anything ran, the good file too
    assert done.stderr.strip().splitlines() == [
        f"pipecat-actions: {broken}: app: 'factories.py:raises' cannot be built: "
        "RuntimeError: the booking database is down"
    ]
