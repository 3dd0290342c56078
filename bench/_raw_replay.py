"""The floor of a PostgreSQL propose: the statements proposes sent, replayed on raw asyncpg.

    python bench/_raw_replay.py URL REPLAY_FILE PROPOSES WARMUP

Run by ``bench/work.py`` under ``valgrind --tool=callgrind``, twice (PROPOSES N and 2N), so that
start-up cancels out of the difference. REPLAY_FILE is a pickled list, one entry per propose,
of the ``(sql, parameters)`` it sent (``_per_propose.count_proposes``): its rows are replayed on
one connection into a database of the ledger's schema, emptied first. Nothing of ours runs but
the SQL, and its parameters were built beforehand; it imports asyncpg alone, so that its
start-up is short under callgrind.
"""

from __future__ import annotations

import asyncio
import pickle
import sys
from pathlib import Path
from typing import Any

import asyncpg


async def replay(url: str, calls: list[list[tuple[str, tuple[Any, ...]]]]) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute("TRUNCATE pa_operation_events, pa_operations CASCADE")
        for sent in calls:
            for sql, params in sent:
                await conn.fetchrow(sql, *params)
    finally:
        await conn.close()


def main(argv: list[str]) -> None:
    url, replay_file, proposes, warmup = argv
    calls = pickle.loads(Path(replay_file).read_bytes())
    wanted = int(warmup) + int(proposes)
    if len(calls) < wanted:
        raise SystemExit(f"{replay_file} holds {len(calls)} proposes, not {wanted}")
    asyncio.run(replay(url, calls[:wanted]))


if __name__ == "__main__":
    main(sys.argv[1:])
