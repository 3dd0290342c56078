"""Ledger write cost against the raw aiosqlite floor, measured side by side in one run.

    .venv/bin/python bench/ledger.py [--ops N] [--rounds R] [--writers W] [--no-postgres]

Prints, per configuration, the median and p99 latency of one write and the throughput of
``--writers`` concurrent writers, then the ratios the targets are stated in:

* each ledger write (``admit``, ``transition``) costs at most 2x the raw aiosqlite single-row
  insert+commit of the same run (same synchronous setting);
* ``--writers`` concurrent writers sustain at least 0.7x the raw single-connection throughput.

Configurations are measured in interleaved rounds (raw, ours, raw, ours, ...) and the median
round is reported, because this machine is shared and noisy. Figures, not pass/fail.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import uuid
from collections.abc import Callable
from pathlib import Path

import aiosqlite

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from _measure import LedgerCalls, Sample, concurrent, drop_pg, fresh_pg, sequential

from pipecat_actions.ledger import LedgerSettings, SqlLedger

# --- the raw floor -------------------------------------------------------------------------


class RawSqlite:
    """One aiosqlite connection, one single-row INSERT + COMMIT per write."""

    def __init__(self, path: Path, synchronous: str) -> None:
        self.path, self.synchronous = path, synchronous
        self.lock = asyncio.Lock()

    async def __aenter__(self) -> RawSqlite:
        self.db = await aiosqlite.connect(self.path, isolation_level=None)
        await self.db.execute("PRAGMA journal_mode=WAL")
        await self.db.execute(f"PRAGMA synchronous={self.synchronous}")
        await self.db.execute(
            "CREATE TABLE IF NOT EXISTS t (id TEXT PRIMARY KEY, k TEXT UNIQUE, body TEXT)"
        )
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.db.close()

    async def write(self, i: int) -> None:
        async with self.lock:  # one connection: concurrent writers take turns
            await self._write()

    async def _write(self) -> None:
        await self.db.execute("BEGIN")
        await self.db.execute(
            "INSERT INTO t VALUES (?, ?, ?)", (uuid.uuid4().hex, uuid.uuid4().hex, "x" * 400)
        )
        await self.db.commit()


# --- ours ----------------------------------------------------------------------------------


async def measure(args: argparse.Namespace) -> dict[str, dict[str, list[Sample]]]:
    results: dict[str, dict[str, list[Sample]]] = {}

    def keep(config: str, metric: str, sample: Sample) -> None:
        results.setdefault(config, {}).setdefault(metric, []).append(sample)

    pg_name = pg_url = None
    if not args.no_postgres:
        pg_name, pg_url = await fresh_pg()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for r in range(args.rounds):
                for sync in ("FULL", "NORMAL"):
                    raw_path = Path(tmp, f"raw-{sync}-{r}.db")
                    async with RawSqlite(raw_path, sync) as raw:
                        keep(
                            f"raw aiosqlite {sync}",
                            "write",
                            await sequential(args.ops, raw.write),
                        )
                        keep(
                            f"raw aiosqlite {sync}",
                            "concurrent",
                            await concurrent(args.ops, args.writers, raw.write),
                        )
                    ledger = await SqlLedger.create(
                        f"sqlite:///{Path(tmp, f'ours-{sync}-{r}.db')}",
                        settings=LedgerSettings(sqlite_synchronous=sync),  # type: ignore[arg-type]
                    )
                    await _measure_ours(ledger, f"ledger sqlite {sync}", args, keep)
                if pg_url is not None:
                    ledger = await SqlLedger.create(pg_url)
                    await _measure_ours(ledger, "ledger postgres", args, keep)
    finally:
        if pg_name is not None:
            await drop_pg(pg_name)
    return results


async def _measure_ours(
    ledger: SqlLedger,
    config: str,
    args: argparse.Namespace,
    keep: Callable[[str, str, Sample], None],
) -> None:
    try:
        ours = LedgerCalls(ledger)
        keep(config, "admit", await sequential(args.ops, ours.admit))
        keep(config, "transition", await sequential(args.ops, ours.transition))
        keep(config, "concurrent", await concurrent(args.ops, args.writers, ours.admit))
    finally:
        await ledger.close()


def _median_round(samples: list[Sample], key: Callable[[Sample], float]) -> Sample:
    return sorted(samples, key=key)[len(samples) // 2]


def report(results: dict[str, dict[str, list[Sample]]], args: argparse.Namespace) -> None:
    print(f"ops per measurement: {args.ops}, rounds: {args.rounds}, writers: {args.writers}")
    print(
        f"{'configuration':<24}{'metric':<12}{'median ms':>10}{'p99 ms':>10}{'ops/s':>10}"
        f"{'CPU us':>8}"
    )
    chosen: dict[tuple[str, str], Sample] = {}
    for config, metrics in results.items():
        for metric, samples in metrics.items():
            by_throughput = metric == "concurrent"
            s = _median_round(samples, lambda x, t=by_throughput: -x.per_sec if t else x.median_ms)
            chosen[config, metric] = s
            print(
                f"{config:<24}{metric:<12}{s.median_ms:>10.3f}{s.p99_ms:>10.3f}"
                f"{s.per_sec:>10.0f}{s.cpu_us:>8.0f}"
            )
    print()
    print("ratios (targets: write <= 2.0x the raw floor; concurrent >= 0.7x raw single-connection)")
    for sync in ("FULL", "NORMAL"):
        floor = chosen[f"raw aiosqlite {sync}", "write"]
        ours = f"ledger sqlite {sync}"
        for metric in ("admit", "transition"):
            ratio = chosen[ours, metric].median_ms / floor.median_ms
            cpu = chosen[ours, metric].cpu_us / floor.cpu_us
            print(
                f"  {ours} {metric:<10} median {ratio:5.2f}x the raw {sync} floor (CPU {cpu:4.2f}x)"
            )
        throughput = chosen[ours, "concurrent"].per_sec / floor.per_sec
        print(
            f"  {ours} {args.writers} writers   {throughput:5.2f}x the raw single-connection "
            f"throughput ({chosen[ours, 'concurrent'].per_sec:.0f} "
            f"vs {floor.per_sec:.0f} ops/s)"
        )
    if ("ledger postgres", "admit") in chosen:
        floor = chosen["raw aiosqlite FULL", "write"]
        for metric in ("admit", "transition"):
            ratio = chosen["ledger postgres", metric].median_ms / floor.median_ms
            print(f"  ledger postgres {metric:<10} median {ratio:5.2f}x the raw SQLite FULL floor")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--writers", type=int, default=50)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    report(asyncio.run(measure(args)), args)


if __name__ == "__main__":
    main()
