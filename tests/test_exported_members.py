"""The public API: `__all__` lists every public name, sorted within each concept group."""

from __future__ import annotations

import ast
import importlib
import inspect
import subprocess
import sys
import types
from pathlib import Path

import pytest

import pipecat_actions
import pipecat_actions.ledger
import pipecat_actions.policy
import pipecat_actions.status


def _groups_of_all(module: object) -> list[list[str]]:
    """Return the names of ``__all__`` in the groups its comments separate."""
    source = Path(inspect.getfile(module)).read_text()  # type: ignore[arg-type]
    lines = source[source.index("__all__ = [") :].splitlines()[1:]
    groups: list[list[str]] = [[]]
    for line in lines:
        stripped = line.strip()
        if stripped == "]":
            break
        if stripped.startswith("#"):
            groups.append([])
        elif stripped:
            groups[-1].append(ast.literal_eval(stripped.rstrip(",")))
    return [g for g in groups if g]


@pytest.mark.parametrize("module", [pipecat_actions, pipecat_actions.ledger], ids=str)
def test_every_public_name_of_the_package_is_exported_and_found_where_it_lives(
    module: types.ModuleType,
) -> None:
    exports: dict[str, str] = module._EXPORTS  # type: ignore[attr-defined]
    assert set(exports) == set(module.__all__)
    for name, where in exports.items():
        assert getattr(module, name) is getattr(importlib.import_module(where), name), name
    public = {name for name in vars(module) if not name.startswith("_")}
    modules = {name for name, value in vars(module).items() if inspect.ismodule(value)}
    assert public - modules <= set(module.__all__)  # nothing public beside the exports
    assert set(module.__all__) <= set(dir(module))


def test_the_package_imports_each_name_when_first_used() -> None:
    code = (
        "import sys, pipecat_actions, pipecat_actions.ledger\n"
        "print(sorted(m for m in sys.modules if m.startswith('pipecat_actions')))\n"
        "from pipecat_actions import ManualClock\n"
        "from pipecat_actions.ledger import Operation\n"
        "print('sqlalchemy' in sys.modules, 'pipecat_actions.runtime' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded, after = done.stdout.splitlines()
    assert loaded == "['pipecat_actions', 'pipecat_actions.ledger']"
    assert after == "False False"


def test_importing_the_package_does_not_import_pipecat() -> None:
    code = "import sys, pipecat_actions, pipecat_actions.cli; print('pipecat' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
    assert out.stderr == ""


def test_exported_names_resolve() -> None:
    for module in (pipecat_actions, pipecat_actions.ledger, pipecat_actions.policy):
        for name in module.__all__:
            assert hasattr(module, name), f"{module.__name__}.{name}"


def test_all_is_sorted_within_each_group() -> None:
    for module in (pipecat_actions, pipecat_actions.ledger, pipecat_actions.policy):
        for group in _groups_of_all(module):
            assert group == sorted(group, key=lambda n: (not n.isupper(), n)), module.__name__


MOVED = {
    "AdmitResult": pipecat_actions.ledger,
    "EventKind": pipecat_actions.ledger,
    "NewOperation": pipecat_actions.ledger,
    "OperationEvent": pipecat_actions.ledger,
    "OperationFilter": pipecat_actions.ledger,
    "default_ledger_url": pipecat_actions.ledger,
    "hash_arguments": pipecat_actions.ledger,
    "TERMINAL_STATUSES": pipecat_actions.status,
    "TRANSITIONS": pipecat_actions.status,
    "is_terminal": pipecat_actions.status,
}


def test_the_package_keeps_storage_plumbing_in_its_sub_packages() -> None:
    assert set(MOVED).isdisjoint(pipecat_actions.__all__)
    assert set(MOVED) == set(pipecat_actions._MOVED)
    for name, module in MOVED.items():
        assert name in module.__all__, f"{module.__name__}.{name}"
        assert pipecat_actions._MOVED[name] == module.__name__


def test_a_moved_name_read_from_the_package_says_where_it_lives() -> None:
    with pytest.raises(AttributeError, match=r"import it from pipecat_actions\.ledger") as info:
        pipecat_actions.NewOperation  # noqa: B018
    assert info.value.name == "NewOperation"
    assert not hasattr(pipecat_actions, "TRANSITIONS")
    with pytest.raises(AttributeError, match=r"from pipecat_actions\.status import is_terminal"):
        getattr(pipecat_actions, "is_terminal")  # noqa: B009


def test_importing_a_moved_name_from_the_package_is_an_import_error() -> None:
    with pytest.raises(ImportError, match="OperationFilter"):
        from pipecat_actions import OperationFilter  # noqa: F401


def test_a_name_deprecated_this_release_still_resolves_with_a_warning_naming_its_home() -> None:
    import pipecat_actions.ledger as ledger

    for name, home in pipecat_actions._DEPRECATED.items():
        assert name not in pipecat_actions.__all__
        with pytest.warns(DeprecationWarning, match=rf"from {home} import {name}"):
            value = getattr(pipecat_actions, name)
        assert value is getattr(importlib.import_module(home), name)
    with pytest.warns(DeprecationWarning, match="pipecat_actions.ledger import SqlLedger"):
        from pipecat_actions import SqlLedger
    assert SqlLedger is ledger.SqlLedger


def test_the_package_exports_about_thirty_names() -> None:
    assert len(pipecat_actions.__all__) <= 38


def test_an_unknown_name_is_a_plain_attribute_error() -> None:
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchThing'"):
        pipecat_actions.NoSuchThing  # noqa: B018


def test_check_placement_is_found_where_the_processors_are() -> None:
    # A newcomer who imports the processors from their package guesses it there too.
    import pipecat_actions.adapters

    check = pipecat_actions.adapters.check_placement
    assert pipecat_actions.check_placement is check
    for module in (pipecat_actions, pipecat_actions.adapters):
        assert {"ActionTurnTracker", "check_placement"} <= set(module.__all__)
