"""The ``pipecat-actions`` command.

Every failure the user can cause (a bad file, a bad URL, an unreachable database) ends with one
line on stderr and a non-zero exit status, never a traceback::

    pipecat-actions policy check FILE...      validate policy files (exit 1 if any is invalid)
    pipecat-actions db upgrade [URL]          create or upgrade the ledger schema
    pipecat-actions db status [URL]           show the schema revision of a ledger database
"""

from __future__ import annotations

__all__ = ["main"]

import argparse
import asyncio
import sys
from collections.abc import Sequence
from typing import TextIO

from pipecat_actions.errors import PipecatActionsError


def _build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pipecat-actions",
        description="Operate pipecat_actions: policies and the action ledger.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    policy = commands.add_parser("policy", help="work with tool policy files")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_commands.add_parser("check", help="validate policy files")
    check.add_argument("files", nargs="+", metavar="FILE", help="YAML policy files")

    db = commands.add_parser("db", help="manage the ledger database")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    for name, help_text in (
        ("upgrade", "create the ledger schema, or upgrade it to this version"),
        ("status", "show the ledger schema revision"),
    ):
        sub = db_commands.add_parser(name, help=help_text)
        sub.add_argument(
            "url",
            nargs="?",
            default=None,
            help="sqlite:///PATH or postgresql://USER@HOST/DB "
            "(default: $PIPECAT_ACTIONS_LEDGER_URL or ./.pipecat_actions/ledger.db)",
        )
        sub.add_argument(
            "--allow-unsafe-postgres",
            action="store_true",
            help="accept a PostgreSQL server running with synchronous_commit=off or fsync=off",
        )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    args = _build_parser().parse_args(argv)
    try:
        if args.command == "policy":
            from pipecat_actions.policy import check_policy_files

            return check_policy_files(args.files, out=sys.stdout, err=sys.stderr)
        if args.command == "db":
            return asyncio.run(_db(args, sys.stdout))
    except PipecatActionsError as exc:
        print(f"pipecat-actions: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


async def _db(args: argparse.Namespace, out: TextIO) -> int:
    from pipecat_actions.ledger import LedgerSettings, SqlLedger

    settings = LedgerSettings(allow_unsafe_postgres=args.allow_unsafe_postgres)
    if args.db_command == "upgrade":
        ledger = await SqlLedger.create(
            args.url, settings=settings, create_schema=False, check_schema=False
        )
        try:
            before, after = await ledger.upgrade_schema()
        finally:
            await ledger.close()
        if before == after:
            print(f"{ledger.url}: schema already at revision {after}", file=out)
        else:
            print(f"{ledger.url}: schema upgraded from {before or 'empty'} to {after}", file=out)
        return 0
    ledger = await SqlLedger.create(
        args.url, settings=settings, create_schema=False, check_schema=False
    )
    try:
        state = await ledger.schema_state()
    finally:
        await ledger.close()
    if state.up_to_date:
        verdict = "up to date"
    elif state.empty:
        verdict = "empty: run `pipecat-actions db upgrade`"
    elif state.known:
        verdict = f"older than this code ({state.head}): run `pipecat-actions db upgrade`"
    else:
        verdict = f"newer than this code ({state.head}): upgrade pipecat_actions"
    print(f"{ledger.url}: revision {state.current or 'none'}, {verdict}", file=out)
    return 0 if state.up_to_date else 1


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
