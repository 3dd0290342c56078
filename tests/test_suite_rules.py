"""Rules the test suite keeps, checked on its own source: no test asserts on a measured duration.

CI machines are shared and busy, so a bound on wall-clock time fails there at random. Time that
matters is driven by `ManualClock`, or a test asserts order and cause; durations are figures for
``bench/``. This reads every module under ``tests/`` and fails on any ``assert`` that uses a
value read from a real clock (``time.monotonic()``, ``time.perf_counter()``, ``time.time()``, an
event loop's ``time()``), directly or through a variable computed from one by arithmetic, and on
any inequality between a number written in the test and a quantity named as a time or duration
(``played_secs``, ``finished_at - created_at``, ``elapsed``). Orders (``a.sent_at <
b.told_at``) and exact manual-clock equalities pass.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
_CLOCK_CALLS = {
    ("time", "monotonic"),
    ("time", "perf_counter"),
    ("time", "time"),
    ("time", "monotonic_ns"),
    ("time", "perf_counter_ns"),
    ("time", "time_ns"),
}


def _reads_real_clock(node: ast.AST) -> bool:
    """``time.monotonic()`` and friends, or ``<loop>.time()`` on an event loop."""
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
        return False
    owner, name = node.func.value, node.func.attr
    if isinstance(owner, ast.Name) and (owner.id, name) in _CLOCK_CALLS:
        return True
    if name != "time" or node.args:
        return False
    if isinstance(owner, ast.Name) and owner.id == "loop":
        return True
    return isinstance(owner, ast.Call) and getattr(owner.func, "attr", "") in {
        "get_running_loop",
        "get_event_loop",
    }


def _timed(node: ast.AST, tainted: set[str]) -> bool:
    """Whether ``node`` is a clock reading, or arithmetic on one (not a call that takes one)."""
    if _reads_real_clock(node):
        return True
    if isinstance(node, ast.Name):
        return node.id in tainted
    if isinstance(node, ast.BinOp):
        return _timed(node.left, tainted) or _timed(node.right, tainted)
    if isinstance(node, ast.UnaryOp):
        return _timed(node.operand, tainted)
    return False


def _mentions_time(node: ast.AST, tainted: set[str]) -> bool:
    return any(_timed(child, tainted) for child in ast.walk(node))


_TIMELIKE_NAMES = {"elapsed", "duration", "took", "lateness", "waited"}


def _timelike(node: ast.AST) -> bool:
    """A quantity that holds a time or a duration by its name (``played_secs``, ``sent_at``)."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    if not isinstance(name, str):
        return False
    return name in _TIMELIKE_NAMES or name.endswith(("_secs", "_at", "_at_secs"))


def _constant(node: ast.AST) -> bool:
    """A number written in the test (or arithmetic on numbers)."""
    if isinstance(node, ast.Constant):
        return isinstance(node.value, int | float) and not isinstance(node.value, bool)
    if isinstance(node, ast.BinOp):
        return _constant(node.left) and _constant(node.right)
    if isinstance(node, ast.UnaryOp):
        return _constant(node.operand)
    return False


def _bounds_a_time(compare: ast.Compare) -> bool:
    """``played_secs < 0.8``, ``a.finished_at - a.created_at < 1.2``: an inequality between a
    measured time and a number. Equalities are exact, so on a real clock they never hold by
    chance: those are manual-clock assertions and pass.
    """
    operands = [compare.left, *compare.comparators]
    for op, left, right in zip(compare.ops, operands, operands[1:], strict=False):
        if not isinstance(op, ast.Lt | ast.LtE | ast.Gt | ast.GtE):
            continue
        for side, other in ((left, right), (right, left)):
            if _constant(other) and any(_timelike(n) for n in ast.walk(side)):
                return True
    return False


def timed_assertions(source: str) -> list[int]:
    """Return the line numbers of asserts that use a real-clock reading (see the module doc)."""
    found: list[int] = []
    tree = ast.parse(source)
    scopes: list[ast.AST] = [tree]
    scopes += [n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
    for scope in scopes:
        tainted: set[str] = set()
        body = [n for n in ast.walk(scope) if not isinstance(n, ast.ClassDef)]
        # Two passes: a variable computed from another tainted one later in the text.
        for _ in range(2):
            for node in body:
                if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                    value = node.value
                    if value is not None and _timed(value, tainted):
                        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                        for target in targets:
                            if isinstance(target, ast.Name):
                                tainted.add(target.id)
                            elif isinstance(target, ast.Attribute):
                                tainted.add(target.attr)
        for node in body:
            if not isinstance(node, ast.Assert):
                continue
            if _mentions_time(node.test, tainted) or any(
                isinstance(c, ast.Compare) and _bounds_a_time(c) for c in ast.walk(node.test)
            ):
                found.append(node.lineno)
        # Attributes set from a clock (self.stopped_at = time.time()) read in an assert.
        for node in body:
            if isinstance(node, ast.Assert):
                for child in ast.walk(node.test):
                    if isinstance(child, ast.Attribute) and child.attr in tainted:
                        found.append(node.lineno)
    return sorted(set(found))


def test_the_checker_finds_a_duration_bound_and_lets_clock_driven_time_through() -> None:
    offending = """
import asyncio, time
async def test_x(clock):
    started = time.monotonic()
    await something()
    elapsed = time.monotonic() - started
    assert elapsed <= 0.35
    t0 = asyncio.get_running_loop().time()
    assert asyncio.get_running_loop().time() - t0 < 1
    assert time.perf_counter() > 0
    assert 0.2 < heard.played_secs < 0.8
    assert op.finished_at - op.created_at < 1.2
"""
    fine = """
import time
async def test_y(clock):
    clock = ManualClock(time.time() + 60)
    before = clock.now()
    clock.advance(5)
    assert clock.now() - before == 5
    assert op.committed_at < stamp.stopped_at <= op.delivered_at
    assert op.deadline_at == clock.now() + 30
    assert 0 <= delay <= retry.max_backoff_secs * 2
    started = time.monotonic()  # a hang guard, never asserted
    while time.monotonic() - started < 60:
        break
"""
    assert timed_assertions(offending) == [7, 9, 10, 11, 12]
    assert timed_assertions(fine) == []


@pytest.mark.parametrize(
    "path",
    sorted(p for p in TESTS.rglob("*.py") if p.name != Path(__file__).name),
    ids=lambda p: str(p.relative_to(TESTS)),
)
def test_no_test_asserts_on_a_wall_clock_duration(path: Path) -> None:
    lines = timed_assertions(path.read_text(encoding="utf-8"))
    assert not lines, (
        f"{path.relative_to(TESTS.parent)} asserts on real elapsed time at line(s) {lines}: "
        "drive time with ManualClock or assert order and cause (durations belong in bench/)"
    )
