"""Malformed policy files are refused with the file, the key path and a plain reason.

Each fixture in ``bad/`` starts with one or more lines ``# expect: <key path> | <reason part>``
(``-`` as key path for a problem about the whole file). Cases that cannot be committed as
files (over 1 MiB, non-UTF-8 bytes, missing paths) are generated here.
"""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest

from pipecat_actions.policy import (
    MAX_POLICY_BYTES,
    PolicyError,
    check_policy_files,
    load_policy,
    load_policy_text,
)

BAD_DIR = Path(__file__).parent / "bad"
BAD_FILES = sorted(BAD_DIR.glob("*.yaml"))
_EXPECT = re.compile(r"^# expect: (?P<path>\S+) \| (?P<reason>.+)$")

# Files that cannot carry an expectation comment (a comment would make them non-empty).
_HEADERLESS = {"empty.yaml": [("-", "file is empty")]}

VALID_POLICY = """\
version: 1
tools:
  search_availability:
    kind: read
"""


def _expectations(path: Path) -> list[tuple[str, str]]:
    if path.name in _HEADERLESS:
        return _HEADERLESS[path.name]
    expected = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _EXPECT.match(line)
        if match is None:
            break
        expected.append((match["path"], match["reason"]))
    return expected


def _check(path: Path | str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = check_policy_files([str(path)], out=out, err=err)
    return status, out.getvalue(), err.getvalue()


def _assert_reported(err: str, file: Path | str, key_path: str, reason: str) -> None:
    prefix = f"{file}: " if key_path == "-" else f"{file}: {key_path}: "
    lines = err.splitlines()
    assert any(line.startswith(prefix) and reason in line for line in lines), (
        f"expected a line starting {prefix!r} containing {reason!r}, got:\n{err}"
    )


def test_there_are_at_least_25_bad_fixtures_each_with_an_expectation() -> None:
    assert len(BAD_FILES) >= 25
    assert [p.name for p in BAD_FILES if not _expectations(p)] == []


@pytest.mark.parametrize("bad_file", BAD_FILES, ids=lambda p: p.name)
def test_bad_policy_file_is_refused_naming_file_key_path_and_reason(bad_file: Path) -> None:
    status, out, err = _check(bad_file)

    assert status == 1
    assert out == ""
    assert "Traceback" not in err
    assert "errors.pydantic.dev" not in err
    for key_path, reason in _expectations(bad_file):
        _assert_reported(err, bad_file, key_path, reason)
    # Every problem line is reported once and names the file.
    lines = err.splitlines()
    assert len(lines) == len(set(lines)) == len(_expectations(bad_file))
    assert all(line.startswith(f"{bad_file}: ") for line in lines)


@pytest.mark.parametrize("bad_file", BAD_FILES, ids=lambda p: p.name)
def test_bad_policy_file_raises_policy_error_from_load_policy(bad_file: Path) -> None:
    with pytest.raises(PolicyError) as caught:
        load_policy(bad_file)

    assert caught.value.problems
    assert all(problem.file == str(bad_file) for problem in caught.value.problems)
    assert caught.value.__cause__ is None


def test_file_over_one_mebibyte_is_refused_before_parsing(tmp_path: Path) -> None:
    huge = tmp_path / "huge.yaml"
    padding = "# padding to push the file over the size cap\n" * (MAX_POLICY_BYTES // 40)
    huge.write_text(VALID_POLICY + padding, encoding="utf-8")
    assert huge.stat().st_size > MAX_POLICY_BYTES

    status, out, err = _check(huge)

    assert status == 1
    assert out == ""
    _assert_reported(err, huge, "-", "a policy file may be at most 1 MiB (1048576 bytes)")
    assert "Traceback" not in err


def test_file_of_exactly_the_size_cap_is_still_read(tmp_path: Path) -> None:
    at_cap = tmp_path / "at_cap.yaml"
    padding = "#" * (MAX_POLICY_BYTES - len(VALID_POLICY) - 1) + "\n"
    at_cap.write_text(VALID_POLICY + padding, encoding="utf-8")
    assert at_cap.stat().st_size == MAX_POLICY_BYTES

    assert len(load_policy(at_cap)) == 1


def test_non_utf8_bytes_are_refused_with_line_and_column(tmp_path: Path) -> None:
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(
        b"version: 1\ntools:\n  search_availability:\n    kind: read\n"
        b"    description: Caf\xe9 tables\n"
    )

    status, _out, err = _check(latin1)

    assert status == 1
    _assert_reported(err, latin1, "-", "is not UTF-8 text: byte 0xe9 at line 5, column 21")
    assert "Traceback" not in err


def test_utf8_byte_order_mark_is_accepted(tmp_path: Path) -> None:
    with_bom = tmp_path / "bom.yaml"
    with_bom.write_bytes(b"\xef\xbb\xbf" + VALID_POLICY.encode())

    assert load_policy(with_bom).names() == ("search_availability",)


def test_text_over_one_mebibyte_is_refused_before_parsing() -> None:
    with pytest.raises(PolicyError, match=r"file is 2\.0 MiB \(2097152 bytes\)"):
        load_policy_text("#" * (2 * MAX_POLICY_BYTES))


def test_nonexistent_file_is_reported_not_raised(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere.yaml"

    status, _out, err = _check(missing)

    assert status == 1
    _assert_reported(err, missing, "-", "no such file")


def test_directory_is_reported_as_not_a_policy_file(tmp_path: Path) -> None:
    status, _out, err = _check(tmp_path)

    assert status == 1
    _assert_reported(err, tmp_path, "-", "is a directory, not a policy file")


def test_control_character_in_text_is_reported_with_its_line(tmp_path: Path) -> None:
    nul = tmp_path / "nul.yaml"
    nul.write_bytes(VALID_POLICY.encode() + b"    description: a\x00b\n")

    status, _out, err = _check(nul)

    assert status == 1
    _assert_reported(err, nul, "-", "character U+0000 at line 5 is not allowed")


def test_several_independent_problems_are_all_reported_in_one_go() -> None:
    several = BAD_DIR / "several_problems.yaml"

    with pytest.raises(PolicyError) as caught:
        load_policy(several)

    paths = {problem.key_path for problem in caught.value.problems}
    assert paths == {
        "defaults.timeout_secs",
        "tools.search_availability.mode",
        "tools.book_table.retry.max_attempts",
        "tools.cancel_booking.kind",
        "tools.refund_deposit.approver",
    }


def test_field_problems_and_merged_rule_problems_are_reported_together() -> None:
    mixed = BAD_DIR / "several_merged_problems.yaml"

    with pytest.raises(PolicyError) as caught:
        load_policy(mixed)

    paths = [problem.key_path for problem in caught.value.problems]
    assert "tools.move_booking.timeout_secs" in paths  # a field problem in one tool
    assert "tools.book_table.retry.max_attempts" in paths  # a merged rule in another
    assert "tools.cancel_booking.compensation.tool" in paths  # a rule across tools
    assert len(paths) == 6


def test_check_reports_good_and_bad_files_and_fails_if_any_is_bad(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text(VALID_POLICY, encoding="utf-8")
    bad = BAD_DIR / "missing_kind.yaml"
    out, err = io.StringIO(), io.StringIO()

    status = check_policy_files([str(good), str(bad), str(good)], out=out, err=err)

    assert status == 1
    assert out.getvalue() == f"OK {good} (1 tool)\nOK {good} (1 tool)\n"
    assert err.getvalue().count(f"{bad}: tools.book_table.kind: ") == 1
