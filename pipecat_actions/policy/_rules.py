"""How policy models report broken cross-field rules: every broken rule at once, each at its key.

A pydantic model validator can raise only one error, at the model's own location. The models
collect every `Violation` first and raise them together through `raise_violations`; the loader
spreads them back into one problem per key path.
"""

from __future__ import annotations

__all__ = ["RULE_ERROR_TYPE", "Violation", "raise_violations"]

from collections.abc import Sequence
from dataclasses import dataclass

from pydantic_core import PydanticCustomError

RULE_ERROR_TYPE = "policy_rule"
"""The pydantic error ``type`` that carries `Violation` objects in its ``ctx``."""


@dataclass(frozen=True, slots=True)
class Violation:
    """One broken cross-field rule.

    Attributes:
        path: Key path of the offending setting, relative to the model that checked it.
        reason: What is wrong and how to fix it, in plain words.
    """

    path: tuple[str | int, ...]
    reason: str

    def __str__(self) -> str:
        where = ".".join(str(part) for part in self.path)
        return f"{where}: {self.reason}" if where else self.reason


def raise_violations(violations: Sequence[Violation]) -> None:
    """Raise every violation as one pydantic error, or return when there is none.

    Args:
        violations: The broken rules found by a model validator.

    Raises:
        PydanticCustomError: Of type `RULE_ERROR_TYPE`; ``ctx["violations"]`` holds the tuple.
    """
    if not violations:
        return
    raise PydanticCustomError(
        RULE_ERROR_TYPE,
        "{summary}",
        {"summary": "; ".join(str(v) for v in violations), "violations": tuple(violations)},
    )
