"""docs/scenarios.md documents the scenario format whole: every key the models accept."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import BaseModel

from pipecat_actions.scenarios.model import (
    STEP_KINDS,
    EventExpectation,
    Expectations,
    HeardExpectation,
    OperationExpectation,
    ProviderSetup,
    Scenario,
    SessionSetup,
    TextExpectation,
)

DOC = (Path(__file__).resolve().parents[2] / "docs" / "scenarios.md").read_text()
NAMED = set(re.findall(r"`([a-z_]+)", DOC)) | set(re.findall(r"[{,] ?([a-z_]+)", DOC))
"""Every name the page writes as code, or as a key inside a `{...}` synopsis."""


def _keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def _step_rows() -> dict[str, str]:
    rows = {}
    for line in DOC.splitlines():
        match = re.match(r"\| `([a-z_]+)(?::|`)", line)
        if match:
            rows.setdefault(match.group(1), "")
            rows[match.group(1)] += line
    return rows


@pytest.mark.parametrize("kind", sorted(STEP_KINDS))
def test_every_step_kind_has_a_row_naming_each_of_its_keys(kind: str) -> None:
    rows = _step_rows()
    assert kind in rows, f"docs/scenarios.md has no row for the step {kind!r}"
    model, _ = STEP_KINDS[kind]
    # a scalar is written as its placeholder: `wait: SECS` names `secs`
    missing = [key for key in _keys(model) if not re.search(rf"\b{key}\b", rows[kind], re.I)]
    assert missing == [], f"the {kind!r} row does not name {missing}"


@pytest.mark.parametrize(
    "model",
    [
        Scenario,
        SessionSetup,
        ProviderSetup,
        Expectations,
        OperationExpectation,
        HeardExpectation,
        TextExpectation,
        EventExpectation,
    ],
    ids=lambda m: m.__name__,
)
def test_every_key_of_the_file_and_its_expectations_is_named(model: type[BaseModel]) -> None:
    assert [key for key in _keys(model) if key not in NAMED] == []


def test_the_check_finds_a_key_the_page_does_not_name() -> None:
    class Unwritten(BaseModel):
        a_key_nobody_documented: int = 0

    assert [key for key in _keys(Unwritten) if key not in NAMED] == ["a_key_nobody_documented"]
