"""Scenario files for a team's own agent: version 2 of the format, on real pipelines.

A team's app (its actions and its own system of record) is found relative to the scenario
file; the runner's fault layer wraps every effect and hook; the user can hang up and call
back; a barge-in can be timed from a call; world steps can happen while the user speaks;
arguments can come from one earlier call; expectations count tellings, requests, audit
events and what was never told. Every version-1 file keeps working (tests/scenarios).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from pipecat_actions.scenarios import ScenarioError, load_scenario, load_scenario_text, run_scenario

ROOT = Path(__file__).resolve().parents[2]
CLINIC = ROOT / "configs" / "scenarios" / "clinic"
RESTAURANT_POLICY = "policy: ../../configs/restaurant.yaml\n"
D = textwrap.dedent
BOOK = (
    "- llm: {say: Booking it., calls: [{tool: book_table, as: booking, args: "
    "{restaurant_id: trattoria, date: '2030-05-01', time: '21:00', party_size: 2, "
    "guest_name: Alice, phone: '555-0101'}}]}\n"
)


def restaurant(steps: str, expect: str = "", *, head: str = "") -> str:
    return (
        "name: v2\n"
        + head
        + RESTAURANT_POLICY
        + "steps:\n"
        + textwrap.indent(steps, "  ")
        + (("expect:\n" + textwrap.indent(D(expect), "  ")) if expect else "")
    )


async def run_text(text: str) -> object:
    report = await run_scenario(
        load_scenario_text(text, source="v2.yaml", base=ROOT / "tests" / "scenarios")
    )
    return report


def failed(report: object) -> list[str]:
    return [f"{c.what}: {c.found}" for c in report.checks if not c.passed]  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "path",
    sorted((CLINIC / "scenarios").glob("*.yaml")),
    ids=lambda p: p.stem,
)
async def test_the_clinic_example_runs_its_own_app_and_system_of_record(path: Path) -> None:
    report = await run_scenario(load_scenario(path))
    assert report.passed, failed(report)


def lost_answer(hook_faults: str, probing: str, reconciles: int) -> str:
    """A booking whose answer is lost: UNKNOWN, then ``probing`` until the (faulted) reconcile
    hook finds it; it must commit, be told once, and the hook be asked ``reconciles`` times."""
    return restaurant(
        "- user: A table for two at nine, please.\n"
        "- fault: {fault: lose_response_after_commit, kind: book}\n"
        + D(hook_faults)
        + BOOK
        + "- until: {op: booking, status: [UNKNOWN]}\n"
        + D(probing)
        + D("""\
        - until: {op: booking, status: [COMMITTED], delivered: true}
        - llm: You are booked at nine.
        - idle: {quiet_secs: 0.5, calls: true}
        """),
        "operations:\n  - {op: booking, status: COMMITTED, told: 1}\n"
        f"requests: {{book_table: 1, book_table.reconcile: {reconciles}}}\n"
        "side_effects: {book: 1}\n",
    )


async def test_a_fault_on_a_reconcile_hook_answers_pending_then_the_next_probe_finds_it() -> None:
    text = lost_answer(
        "- fault: {target: book_table.reconcile, fault: pending}\n", "- advance: 30\n", 2
    )
    report = await run_text(text)
    assert report.passed, failed(report)


async def test_an_expectation_on_how_often_it_was_told_fails_when_it_does_not_hold() -> None:
    text = restaurant(
        "- user: A table for two at nine, please.\n"
        + BOOK
        + "- until: {op: booking, status: [COMMITTED], delivered: true}\n"
        "- llm: You are booked at nine.\n- idle: {quiet_secs: 0.5, calls: true}\n",
        "operations:\n  - {op: booking, told: 2}\nrequests: {book_table: 3}\n"
        "undelivered: [booking]\n",
    )
    report = await run_text(text)
    assert failed(report) == [
        "booking: told 2 time(s): 1",
        "3 request(s) reached book_table: 1",
        "committed and never told: booking: none",
    ]


async def test_the_user_hangs_up_an_approval_lands_and_the_call_back_hears_it() -> None:
    text = restaurant(
        D("""\
        - user: Can I get my deposit back for booking bk_0001?
        - llm:
            say: I will ask a manager.
            calls: [{tool: refund_deposit, as: refund, args: {booking_id: bk_0001, amount: 2000}}]
        - until: {op: refund, status: [AWAITING_APPROVAL]}
        - llm: A manager has to approve it.
        - idle: {quiet_secs: 0.3}
        - hang_up
        - approve: refund
        - until: {op: refund, status: [COMMITTED]}
        - reconnect
        - llm: Welcome back, your deposit has been refunded.
        - idle: {quiet_secs: 0.5, calls: true}
        """),
        D("""\
        operations:
          - {op: refund, status: COMMITTED, told: 1}
        undelivered: []
        side_effects: {refund: 1}
        heard: {includes: [manager has to approve, deposit has been refunded]}
        order:
          - {op: refund, status: COMMITTED}
          - {heard: deposit has been refunded}
        """),
    )
    report = await run_text(text)
    assert report.passed, failed(report)


def test_a_step_that_needs_a_conversation_after_a_hang_up_is_refused_until_a_reconnect() -> None:
    with pytest.raises(ScenarioError) as raised:
        load_scenario_text(
            restaurant("- user: Hi.\n- hang_up\n- user: Hello?\n- hang_up\n"),
            source="s.yaml",
            base=ROOT / "tests" / "scenarios",
        )
    assert [str(p) for p in raised.value.problems] == [
        "s.yaml: steps[2]: user needs a conversation, and the user hung up: reconnect first",
        "s.yaml: steps[3]: the user has already hung up",
    ]


async def test_a_barge_in_timed_from_running_cuts_in_while_the_booking_runs() -> None:
    text = restaurant(
        D("""\
        - fault: {fault: latency, kind: book, secs: 5}
        - user: A table for two at nine, please.
        """)
        + BOOK
        + D("""\
        - barge_in: {op: booking, at: running, after_secs: 0.1, text: "Is there parking?"}
        - llm: Yes, next door.
        - idle: {quiet_secs: 0.3}
        - advance: 6
        - until: {op: booking, status: [COMMITTED], delivered: true}
        - llm: You are booked at nine.
        - idle: {quiet_secs: 0.5, calls: true}
        """),
        D("""\
        operations:
          - {op: booking, status: COMMITTED, told: 1}
        side_effects: {book: 1}
        heard: {includes: [next door, booked at nine], excludes: [cancel]}
        order:
          - {op: booking, status: RUNNING}
          - {heard: next door}
          - {op: booking, status: COMMITTED}
        """),
        head="provider: {latency: {}}\n",
    )
    report = await run_text(text)
    assert report.passed, failed(report)


async def test_an_approval_lands_while_the_user_speaks() -> None:
    text = restaurant(
        D("""\
        - user: Can I get my deposit back for booking bk_0001?
        - llm:
            say: I will ask a manager.
            calls: [{tool: refund_deposit, as: refund, args: {booking_id: bk_0001, amount: 2000}}]
        - until: {op: refund, status: [AWAITING_APPROVAL]}
        - llm: A manager has to approve it.
        - idle: {quiet_secs: 0.3}
        - together:
            - user: {text: "Is the terrace open tonight?", speech_secs: 1}
            - approve: refund
        - llm: Yes, the terrace is open.
        - until: {op: refund, status: [COMMITTED], delivered: true}
        - llm: And your deposit has been refunded.
        - idle: {quiet_secs: 0.5, calls: true}
        """),
        D("""\
        operations:
          - op: refund
            status: COMMITTED
            events:
              - {to_status: ADMITTED, actor: "approver:rosa"}
              - {to_status: COMMITTED}
        order:
          - {op: refund, status: ADMITTED}
          - {heard: terrace is open}
        """),
    )
    report = await run_text(text)
    assert report.passed, failed(report)


def test_together_holds_one_thing_the_user_does_and_only_world_steps() -> None:
    with pytest.raises(ScenarioError) as raised:
        load_scenario_text(
            restaurant(
                "- together: [{user: a}, {user: b}]\n- together: [{crash: {}}, {wait: 1}]\n"
            ),
            source="s.yaml",
            base=ROOT / "tests" / "scenarios",
        )
    problems = [str(p) for p in raised.value.problems]
    assert problems[0] == "s.yaml: steps[0].together: the user does one thing at a time"
    assert problems[1].startswith("s.yaml: steps[1].together[0]: crash cannot happen together")


async def test_seeded_bookings_fill_the_slot_before_the_story_starts() -> None:
    text = restaurant(
        "- user: A table for two at nine, please.\n"
        + BOOK
        + "- until: {op: booking, status: [FAILED_FINAL]}\n"
        "- llm: Sorry, nine is full.\n- idle: {quiet_secs: 0.5, calls: true}\n",
        "operations:\n  - {op: booking, status: FAILED_FINAL, error_contains: no table free}\n"
        "side_effects: {book: 0}\n",
        head="provider:\n  restaurants: {trattoria: 1}\n  bookings:\n"
        "    - {date: '2030-05-01', time: '21:00', party_size: 4}\n",
    )
    report = await run_text(text)
    assert report.passed, failed(report)


async def test_an_argument_read_from_an_earlier_call_by_its_label() -> None:
    text = restaurant(
        D("""\
        - user: A table for two at nine, please.
        """)
        + BOOK
        + D("""\
        - until: {op: booking, status: [COMMITTED], delivered: true}
        - llm: You are booked at nine.
        - idle: {quiet_secs: 0.5, calls: true}
        - user: Actually, cancel it.
        - llm:
            calls:
              - tool: cancel_booking
                as: cancel
                from_call: {booking_id: booking.result.booking_id}
        - until: {op: cancel, status: [AWAITING_CONFIRMATION]}
        - llm: Shall I cancel it?
        - idle: {quiet_secs: 0.5, calls: true}
        """),
        D("""\
        operations:
          - {tool: cancel_booking, args: {booking_id: bk_0001}, status: AWAITING_CONFIRMATION}
        side_effects: {book: 1}
        settled: false
        """),
    )
    report = await run_text(text)
    assert report.passed, failed(report)


@pytest.mark.parametrize(
    ("step", "problem"),
    [
        ("- fault: {target: nope, fault: raise}\n", "'nope' is not a tool of the policy"),
        ("- fault: {target: book_table.undo, fault: raise}\n", "'undo' is not a hook"),
        ("- fault: {fault: raise}\n", "raise is a fault on an action: say which with target"),
        ("- fault: {target: book_table, kind: book, fault: hang}\n", "not both"),
    ],
)
def test_a_fault_on_something_the_app_does_not_have_is_a_file_problem(
    step: str, problem: str
) -> None:
    with pytest.raises(ScenarioError) as raised:
        load_scenario_text(restaurant(step), source="s.yaml", base=ROOT / "tests" / "scenarios")
    assert any(problem in str(p) for p in raised.value.problems), raised.value.problems


def test_a_step_that_needs_nothing_more_may_be_written_bare() -> None:
    loaded = load_scenario_text(
        restaurant("- user: Hi.\n- crash\n- release_hung\n- reconnect\n"),
        source="s.yaml",
        base=ROOT / "tests" / "scenarios",
    )
    assert [type(s).__name__ for s in loaded.steps] == [
        "UserStep",
        "CrashStep",
        "ReleaseHungStep",
        "ReconnectStep",
    ]


def test_scenario_new_writes_a_file_that_runs_and_never_replaces_one(tmp_path: Path) -> None:
    import subprocess
    import sys

    path = tmp_path / "mine.yaml"

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "pipecat_actions.cli", "scenario", *args],
            capture_output=True,
            text=True,
            cwd=tmp_path,
            timeout=300,
        )

    made = cli("new", str(path))
    assert made.returncode == 0, made.stderr
    ran = cli("run", str(path))
    assert ran.returncode == 0, ran.stdout + ran.stderr
    assert "1 of 1 scenario(s) passed" in ran.stdout
    before = path.read_bytes()
    again = cli("new", str(path))
    assert again.returncode == 2
    assert again.stderr.strip() == f"pipecat-actions: {path} exists; nothing was written"
    assert path.read_bytes() == before


OWN_BOOKINGS_APP = '''
from pipecat_actions.admission.authorization import Decision
from pipecat_actions.scenarios import ScenarioApp
from pipecat_actions.testing.restaurant import build_actions


class OwnBookingsOnly:
    """A caller may cancel only a booking made under their name."""

    def __init__(self, sor):
        self.sor = sor

    async def authorize(self, request):
        if request.tool != "cancel_booking":
            return Decision.allow()
        booking = self.sor.get_booking(request.args["booking_id"])
        if booking is None or booking.guest != request.principal:
            return Decision.deny("that booking is not yours")
        return Decision.allow()


def build(world):
    sor = world.restaurant
    return ScenarioApp(build_actions(sor), authorizer=OwnBookingsOnly(sor))
'''


async def test_a_second_caller_cannot_cancel_the_first_callers_booking(tmp_path: Path) -> None:
    (tmp_path / "own_bookings.py").write_text(OWN_BOOKINGS_APP)
    text = D(
        """\
        version: 2
        name: two callers
        app: own_bookings.py:build
        policy:
          version: 1
          tools:
            book_table:
              kind: mutation
              idempotency: {key_fields: [restaurant_id, date, time, party_size]}
            cancel_booking:
              kind: mutation
              idempotency: {key_fields: [booking_id]}
        session: {principal: alice}
        steps:
          - user: A table for two at nine, please.
          - llm:
              calls:
                - tool: book_table
                  as: booking
                  args: {restaurant_id: trattoria, date: "2030-05-01", time: "21:00",
                         party_size: 2, guest_name: alice}
          - until: {op: booking, status: [COMMITTED], delivered: true}
          - llm: You are booked at nine.
          - idle: {quiet_secs: 0.5, calls: true}
          - caller: bob
          - user: Cancel booking bk_0001.
          - llm: {calls: [{tool: cancel_booking, as: bobs_cancel, args: {booking_id: bk_0001}}]}
          - until: {op: bobs_cancel, status: [REJECTED]}
          - llm: I cannot cancel that booking.
          - idle: {quiet_secs: 0.5, calls: true}
          - caller: alice
          - user: Please cancel my booking bk_0001.
          - llm: {calls: [{tool: cancel_booking, as: alices_cancel, args: {booking_id: bk_0001}}]}
          - until: {op: alices_cancel, status: [COMMITTED], delivered: true}
          - llm: It is cancelled.
          - idle: {quiet_secs: 0.5, calls: true}
        expect:
          operations:
            - {op: booking, status: COMMITTED}
            - {op: bobs_cancel, status: REJECTED, error_contains: not yours}
            - {op: alices_cancel, status: COMMITTED}
          side_effects: {book: 1, cancel: 1}
          requests: {cancel_booking: 1}
          heard: {includes: [booked at nine, cannot cancel, it is cancelled]}
        """
    )
    report = await run_scenario(load_scenario_text(text, source="two.yaml", base=tmp_path))
    assert report.passed, failed(report)
    sessions = {op.session_id for op in report.run.operations}  # type: ignore[attr-defined]
    assert len(sessions) == 2


async def test_a_reconcile_hook_that_raises_then_hangs_is_asked_again_until_it_answers() -> None:
    text = lost_answer(
        D("""\
        - fault: {target: book_table.reconcile, fault: raise}
        - fault: {target: book_table.reconcile, fault: hang}
        """),
        "- advance: 30\n- release_hung\n- advance: 30\n",
        3,
    )
    report = await run_text(text)
    assert report.passed, failed(report)


def slow_read(expect: str) -> str:
    """The clinic's free_slots read, slowed on the scenario's clock, then told."""
    return D("""\
        version: 2
        name: a slow read is told once
        app: ../clinic_app.py:build
        policy: ../policy.yaml
        session: {principal: patient-7, agent: null}
        steps:
          - fault: {target: free_slots, fault: latency, secs: 5}
          - user: Is Dr Okafor free this morning?
          - llm: {calls: [{tool: free_slots, as: slots, args: {doctor: Dr Okafor}}]}
          - wait: 0.3
          - advance: 6
          - until: {op: slots, status: [COMMITTED], delivered: true}
          - llm: Dr Okafor is free at nine.
          - idle: {quiet_secs: 0.3, calls: true}
        expect:
          operations:
        """) + textwrap.indent(D(expect), "    ")


async def test_a_read_told_to_the_model_counts_as_told_and_delivered() -> None:
    text = slow_read("- {op: slots, status: COMMITTED, delivered: true, told: 1}\n")
    loaded = load_scenario_text(text, source="read.yaml", base=CLINIC / "scenarios")
    report = await run_scenario(loaded)
    assert report.passed, failed(report)


async def test_a_wrong_count_of_a_reads_telling_fails_with_what_was_found() -> None:
    text = slow_read("- {op: slots, told: 2}\n- {op: slots, delivered: false}\n")
    loaded = load_scenario_text(text, source="read.yaml", base=CLINIC / "scenarios")
    report = await run_scenario(loaded)
    assert failed(report) == ["slots: told 2 time(s): 1", "slots: never told to the LLM: told"]


CANCEL_FROM = D("""\
    - llm:
        calls:
          - tool: cancel_booking
            as: cancel
            from_call: {{booking_id: {path}}}
    """)


def test_an_argument_from_a_call_not_made_before_its_step_is_a_file_problem() -> None:
    text = restaurant(
        "- user: Cancel my booking.\n"
        + CANCEL_FROM.format(path="booking.result.booking_id")
        + BOOK
        + "- llm: Done.\n"
    )
    with pytest.raises(ScenarioError) as raised:
        load_scenario_text(text, source="v2.yaml", base=ROOT / "tests" / "scenarios")
    assert [str(p) for p in raised.value.problems] == [
        "v2.yaml: steps[1].llm.calls[0].from_call: booking_id: the call labelled 'booking' is "
        "not made before this step"
    ]


async def test_an_argument_an_earlier_answer_does_not_hold_fails_the_run() -> None:
    text = restaurant(
        "- user: A table for two at nine, please.\n"
        + BOOK
        + D("""\
        - until: {op: booking, status: [COMMITTED], delivered: true}
        - llm: You are booked at nine.
        - idle: {quiet_secs: 0.5, calls: true}
        - user: Actually, cancel it.
        """)
        + CANCEL_FROM.format(path="booking.result.reference")
        + D("""\
        - llm: Shall I cancel it?
        - idle: {quiet_secs: 0.5, calls: true}
        """),
        "side_effects: {book: 1}\nsettled: false\n",
    )
    report = await run_text(text)
    assert failed(report) == [
        "every argument read from an earlier answer found it: steps[6].llm.calls[0].from_call."
        "booking_id: the answer to 'booking' has nothing at 'booking.result.reference'"
    ]


def clinic_read(steps: str, expect: str) -> str:
    """The clinic's free_slots read, slowed by 5 s on the scenario's clock."""
    return (
        D("""\
        version: 2
        name: a slow read
        app: ../clinic_app.py:build
        policy: ../policy.yaml
        session: {principal: patient-7, agent: null}
        steps:
          - fault: {target: free_slots, fault: latency, secs: 5}
          - user: Is Dr Okafor free this morning?
          - llm:
              say: Let me look at Dr Okafor's diary for this morning, one moment please.
              calls: [{tool: free_slots, as: slots, args: {doctor: Dr Okafor}}]
        """)
        + textwrap.indent(D(steps), "  ")
        + "expect:\n"
        + textwrap.indent(D(expect), "  ")
    )


async def test_until_a_slow_read_runs_holds_while_it_runs_with_no_ledger_row_yet() -> None:
    text = clinic_read(
        """\
        - until: {op: slots, status: [RUNNING]}
        - advance: 6
        - until: {op: slots, status: [COMMITTED], delivered: true}
        - llm: Dr Okafor is free at nine.
        - idle: {quiet_secs: 0.3, calls: true}
        """,
        "operations:\n  - {op: slots, status: COMMITTED, told: 1}\n",
    )
    loaded = load_scenario_text(text, source="r.yaml", base=CLINIC / "scenarios")
    report = await run_scenario(loaded)
    assert report.passed, failed(report)


async def test_a_barge_in_timed_from_a_slow_reads_running_cuts_in_while_it_runs() -> None:
    text = clinic_read(
        """\
        - barge_in: {op: slots, at: running, after_secs: 0.2, text: Or this afternoon}
        - llm: This afternoon works too.
        - idle: {quiet_secs: 0.3, calls: true}
        """,
        "operations:\n  - {op: slots, count: 1}\nheard: {includes: [afternoon works]}\n",
    )
    loaded = load_scenario_text(text, source="r.yaml", base=CLINIC / "scenarios")
    report = await run_scenario(loaded)
    assert report.passed, failed(report)
    said, *_ = report.run.heard
    assert said.interrupted  # cut while the read ran
