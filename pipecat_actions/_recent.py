"""Bounded memories of the most recent: a mapping that forgets its oldest entries past a bound.

A long-running process keeps many small per-call or per-operation memories (which operation a
tool call became, what was told, a conversation's budget); each must stay bounded however long
the process runs, forgetting the least recently set first.
"""

from __future__ import annotations

__all__ = ["remember"]

from collections import OrderedDict
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(memory: OrderedDict[K, V], key: K, value: V, *, keep: int) -> None:
    """Set ``memory[key] = value`` as its most recent entry; forget the oldest past ``keep``."""
    memory[key] = value
    memory.move_to_end(key)
    if len(memory) > keep:
        memory.popitem(last=False)
