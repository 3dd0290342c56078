"""A broken cross-field rule of a policy, and how broken rules are raised together.

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


_SUMMARISED = 10
"""How many broken rules the error's message spells out; ``ctx["violations"]`` has them all."""


class _Violations(tuple[Violation, ...]):
    """The broken rules in an error's context, shown in short.

    pydantic writes out every value of an error's context when it words the error's message,
    whether the message names it or not: a hundred thousand broken rules (placeholders that
    are not arguments) must not cost a hundred thousand ``repr`` each time.
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"<{len(self)} broken rules>"

    __str__ = __repr__


def raise_violations(violations: Sequence[Violation]) -> None:
    """Raise every violation as one pydantic error, or return when there is none.

    Args:
        violations: The broken rules found by a model validator.

    Raises:
        PydanticCustomError: Of type `RULE_ERROR_TYPE`; ``ctx["violations"]`` holds them all,
            in a tuple; the message spells out the first ten.
    """
    if not violations:
        return
    summary = "; ".join(str(v) for v in violations[:_SUMMARISED])
    if len(violations) > _SUMMARISED:
        summary += f"; and {len(violations) - _SUMMARISED} more"
    raise PydanticCustomError(
        RULE_ERROR_TYPE,
        "{summary}",
        {"summary": summary, "violations": _Violations(violations)},
    )
