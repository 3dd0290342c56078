"""Hostile YAML in a policy is refused with one short, escaped line per problem, never a crash.

PyYAML's constructors raise plain Python errors for scalars they cannot read (a number of more
digits than Python reads, ``2026-13-45`` read as a date, ``!!int abc``, ``!!bool maybe``), and a
value or key can be arbitrarily long or hold control characters. Whatever is written, wherever
it is written, loading ends in a `PolicyError` (or a valid policy), and each problem is one
line, bounded, with nothing in it a terminal would obey: for ``load_policy``, for ``pipecat-actions
policy check`` and for ``ActionRuntime.create``.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pipecat_actions._printable import printable
from pipecat_actions.admission.authorization import AllowAll
from pipecat_actions.cli import main
from pipecat_actions.policy import PolicyError, load_policy, load_policy_text
from pipecat_actions.runtime import ActionRuntime

MAX_LINE_CHARS = 1000

HOSTILE_SCALARS = [
    "9" * 5000,
    "-" + "9" * 5000,
    "-1" + "0" * 4290,
    "!!int " + "9" * 5001,
    "0x" + "f" * 5000,
    "0b" + "1" * 20000,
    "1:" * 3000 + "1",
    "2026-13-45",
    "2026-02-30",
    "2026-02-03 25:61:00",
    "!!int abc",
    "!!float abc",
    "!!int ''",
    "!!float ''",
    "!!bool maybe",
    "!!timestamp nope",
    "!!binary '***'",
    "!!python/object:os.system x",
    "!!set x",
    ".nan",
    "-.inf",
    '"\\e]0;owned\\a"',
    '"\\e[31mred\\u202e"',
    '"\\ud800"',
    '"' + "\\e[2J" * 500 + '"',
    "x" * 100_000,
]

# Where a scalar is written, as keys under tools.t (an int: an item of the list above it).
PLACES = [
    ("max_payload_bytes",),
    ("description",),
    ("kind",),
    ("deadline_secs",),
    ("timeout_secs",),
    ("retry", "max_attempts"),
    ("limits", "max_queued"),
    ("limits", "rate_per_minute"),
    ("confirmation", "expires_after_secs"),
    ("limits", "degrade_result", "note"),
    ("confirmation", "prompt"),
    ("idempotency", "key_fields", 0),
    ("redact", 0),
    ("visible_to", 0),
]


def _document(place: tuple[str | int, ...], scalar: str) -> str:
    """A policy of one tool ``t`` (a mutation, unless ``kind`` is the place) with ``scalar``."""
    lines = ["version: 1", "tools:", "  t:"]
    if place != ("kind",):
        lines.append("    kind: mutation")
    indent = "    "
    for index, part in enumerate(place):
        following = place[index + 1] if index + 1 < len(place) else None
        if isinstance(part, int):
            continue
        if following is None:
            lines.append(f"{indent}{part}: {scalar}")
        elif isinstance(following, int):
            lines.append(f"{indent}{part}:")
            lines.append(f"{indent}  - {scalar}")
        else:
            lines.append(f"{indent}{part}:")
            indent += "  "
    return "\n".join(lines) + "\n"


def _problem_lines(text: str) -> list[str]:
    """The problem lines of loading ``text`` (none for a valid policy: a long description)."""
    try:
        load_policy_text(text)
    except PolicyError as exc:
        return [str(problem) for problem in exc.problems] or ["(a PolicyError without problems)"]
    return []


def _assert_refused_in_short_escaped_lines(text: str) -> None:
    for line in _problem_lines(text):
        assert "\n" not in line, line[:200]
        assert len(line) <= MAX_LINE_CHARS, (len(line), line[:200])
        assert printable(line) == line, line[:200]


@pytest.mark.parametrize("scalar", HOSTILE_SCALARS, ids=lambda s: f"{s[:16]!r}x{len(s)}")
def test_a_hostile_scalar_anywhere_is_refused_in_short_escaped_lines(scalar: str) -> None:
    for place in PLACES:
        _assert_refused_in_short_escaped_lines(_document(place, scalar))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    place=st.sampled_from(PLACES),
    scalar=st.sampled_from(HOSTILE_SCALARS)
    | st.integers(min_value=4290, max_value=4400).map(lambda digits: "1" + "0" * digits)
    | st.builds(
        lambda y, m, d: f"{y:04d}-{m:02d}-{d:02d}",
        st.integers(0, 9999),
        st.integers(0, 99),
        st.integers(0, 99),
    )
    | st.builds(
        lambda tag, text: f"!!{tag} '{text}'",
        st.sampled_from(["int", "float", "bool", "timestamp", "binary", "null", "str"]),
        st.text("abc019-:.+_ xX", max_size=12),
    ),
)
def test_any_hostile_scalar_at_any_key_is_a_policy_error_never_a_crash(
    place: tuple[str | int, ...], scalar: str
) -> None:
    _assert_refused_in_short_escaped_lines(_document(place, scalar))


def test_a_5000_digit_number_is_a_problem_at_its_key() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(_document(("max_payload_bytes",), "9" * 5000))
    (problem,) = caught.value.problems
    assert problem.key_path == "tools.t.max_payload_bytes"
    assert "more digits than the 4300" in problem.reason
    assert "sys.set_int_max_str_digits" not in problem.reason


def test_an_impossible_date_is_a_problem_at_its_key() -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy_text(_document(("description",), "2026-13-45"))
    (problem,) = caught.value.problems
    assert problem.key_path == "tools.t.description"
    assert "'2026-13-45'" in problem.reason and "a date" in problem.reason


def test_a_huge_key_is_shown_in_part_with_its_length() -> None:
    key = "k" * 100_000  # an explicit key (? ...): YAML limits a plain key to 1024 characters
    text = f"version: 1\ntools:\n  t:\n    kind: mutation\n    ? {key}\n    : 1\n"
    with pytest.raises(PolicyError) as caught:
        load_policy_text(text)
    (problem,) = caught.value.problems
    assert "(100000 characters)" in problem.key_path
    assert len(str(problem)) <= MAX_LINE_CHARS


def test_policy_check_reports_a_5000_digit_number_in_one_line_without_a_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(_document(("max_payload_bytes",), "9" * 5000))

    code = main(["policy", "check", str(bad)])

    captured = capsys.readouterr()
    assert code == 1
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"{bad}: tools.t.max_payload_bytes: ")
    assert "Traceback" not in captured.err and len(line) <= MAX_LINE_CHARS


def test_policy_check_json_reports_hostile_yaml_as_problems(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(_document(("retry", "max_attempts"), "!!bool maybe"))

    code = main(["policy", "check", "--json", str(bad)])

    assert code == 1
    assert '"ok": false' in capsys.readouterr().out


async def test_the_runtime_refuses_a_hostile_policy_file_with_a_policy_error(
    tmp_path: Path,
) -> None:
    bad = tmp_path / "policy.yaml"
    bad.write_text(_document(("deadline_secs",), "9" * 5000))

    with pytest.raises(PolicyError, match=r"tools\.t\.deadline_secs: .*4300"):
        await ActionRuntime.create(
            bad, authorizer=AllowAll(), ledger_url=f"sqlite:///{tmp_path}/l.db"
        )
    with pytest.raises(PolicyError):
        load_policy(bad)
