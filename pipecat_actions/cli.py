"""The ``pipecat-actions`` command.

Every failure the user can cause (a bad file, a bad URL, an unreachable database) ends with one
line on stderr and a non-zero exit status, never a traceback::

    pipecat-actions policy check FILE...      validate policy files (exit 1 if any is invalid)
    pipecat-actions policy migrate FILE       rewrite an older policy file in the current format
    pipecat-actions db upgrade                create or upgrade the ledger schema
    pipecat-actions db status                 show the schema revision of a ledger database
    pipecat-actions approvals list|show|approve|reject   operations waiting for a person
    pipecat-actions ledger list [filters] | ledger show OP  operations and their audit timeline
    pipecat-actions ledger list --conflicts   what the system of record contradicted
    pipecat-actions ledger new-keys | ledger rotate-keys    keys of sealed (sensitive) values
    pipecat-actions undelivered               committed operations nobody was told about
    pipecat-actions stats [--since SECS] [--tool T]       per-tool metrics, every row
    pipecat-actions reconcile [OP | --all] --app MODULE:ATTR   ask the hooks about UNKNOWN ones
    pipecat-actions scenario run FILE... [--verbose]      replay scenarios (exit 1 on a failure)
    pipecat-actions scenario new FILE                    start a scenario file from a template
    pipecat-actions worker --app MODULE:ATTR [--once]     own the work of bots that are gone
    pipecat-actions worker --dbos --app MODULE:ATTR       run durable operations (DBOS)
    pipecat-actions durable check [OP...]                 settle what an ended workflow left

Every command that opens a ledger names it with ``--ledger URL`` (default
``$PIPECAT_ACTIONS_LEDGER_URL``; a plain path is a SQLite file); the older ``db upgrade URL``,
``db status URL`` and ``scenario run --ledger-url URL`` still work, with a one-line warning.
``--json`` prints machine-readable output. ``ledger list`` and ``undelivered`` print
pages of ``--limit`` rows, oldest first; a full page ends with the ``--after CURSOR`` that
reads the next one (on stderr with ``--json``).

What the commands print cannot be mistaken or used against the terminal: the first line names
the ledger read (``ledger: URL``, password hidden; on stderr with ``--json``, whose output is
the JSON alone), every text line goes through `printable` (a control character or a bidi
override from the ledger is shown escaped, never obeyed) and nothing from the ledger is read as
rich markup. Only ``db upgrade`` creates a ledger: the other commands open an existing one and
say so when there is none, or when what is there is not a ledger (never with a hint to make a
ledger of someone else's database), or when it cannot be reached (what to check, in one
line). The read commands (``ledger``, ``undelivered``, ``stats``, ``approvals list|show``,
``db status``) open it read-only: they change nothing on disk, neither the file nor its
folder (but ``--reveal``, which records on the operation who was shown its sealed values). A
reader that goes away (``| head``) ends the command quietly, with the status of a command
killed by SIGPIPE (141).
"""

from __future__ import annotations

__all__ = ["main", "run"]

# `pipecat-actions --help` and an operator's command start in a fraction of a second: this
# module imports only the standard library and the package's light modules; what a command
# needs (the ledger and SQLAlchemy, the runtime, the policy model, loguru) is imported when
# that command runs. `tests/test_cli_startup.py` checks which libraries each command loads.
import argparse
import math
import os
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from pipecat_actions._printable import printable, printable_lines
from pipecat_actions.console.command import (
    add_approver_arguments,
    add_console_parser,
    add_users_parser,
)
from pipecat_actions.errors import PipecatActionsError
from pipecat_actions.status import ActionStatus

if TYPE_CHECKING:
    import loguru

    from pipecat_actions.ledger import Ledger, SqlLedger
    from pipecat_actions.ledger.records import Operation, OperationFilter


def _cursor(text: str) -> tuple[float, str]:
    """Parse a page cursor ``CREATED_AT/OPERATION_ID`` (as `_cursor_of` prints it)."""
    created_at, slash, operation_id = text.partition("/")
    try:
        if not slash or not operation_id or not math.isfinite(float(created_at)):
            raise ValueError(text)
        return float(created_at), operation_id
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a cursor (CREATED_AT/OPERATION_ID, as a page prints it)"
        ) from None


async def _every(ledger: Ledger, filters: OperationFilter) -> list[Operation]:
    """Every operation ``filters`` selects, a page at a time (lists are never cut short)."""
    from dataclasses import replace

    found: list[Operation] = []
    page = replace(filters, limit=1000)
    while True:
        rows = await ledger.list(page)
        found.extend(rows)
        if len(rows) < page.limit:
            return found
        page = replace(page, after=(rows[-1].created_at, rows[-1].operation_id))


_MAX_LIMIT = 1_000_000


def _limit(text: str) -> int:
    """Parse ``--limit``: a whole number of rows, 1 to `_MAX_LIMIT`."""
    try:
        rows = int(text)
    except ValueError:
        rows = 0
    if not 1 <= rows <= _MAX_LIMIT:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a page size: give 1 to {_MAX_LIMIT} rows (a full page ends "
            "with the --after that reads the next)"
        )
    return rows


def _secs(text: str) -> float:
    """Parse ``--since``: a finite, non-negative number of seconds."""
    try:
        secs = float(text)
    except ValueError:
        secs = -1.0
    if not (math.isfinite(secs) and secs >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds (0 or more)")
    return secs


def _cursor_of(op: Operation) -> str:
    return f"{op.created_at!r}/{op.operation_id}"


_LEDGER_HELP = (
    "the ledger: sqlite:///PATH (or a plain PATH) or postgresql://USER@HOST/DB "
    "(default: $PIPECAT_ACTIONS_LEDGER_URL, else ./.pipecat_actions/ledger.db)"
)
"""How every command that opens a ledger describes its ``--ledger URL``."""


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line on stderr (and exit status 2)."""

    def error(self, message: str) -> NoReturn:
        """Print ``message`` on one line and exit with status 2."""
        self.exit(2, f"{self.prog}: {printable(message)} (see --help)\n")


def _build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="pipecat-actions",
        description="Operate pipecat_actions: policies and the action ledger.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    policy = commands.add_parser("policy", help="work with tool policy files")
    policy_commands = policy.add_subparsers(dest="policy_command", required=True)
    check = policy_commands.add_parser("check", help="validate policy files")
    check.add_argument("files", nargs="+", metavar="FILE", help="YAML policy files")
    check.add_argument("--json", action="store_true", help="machine-readable output")
    migrate = policy_commands.add_parser(
        "migrate",
        help="rewrite an older policy file (version 1, 0.1.0) in the current format, keeping "
        "its comments",
    )
    migrate.add_argument("file", metavar="FILE", help="the YAML policy file, rewritten in place")
    migrate.add_argument(
        "--stdout", action="store_true", help="print the migrated file instead of rewriting it"
    )

    db = commands.add_parser("db", help="manage the ledger database")
    db_commands = db.add_subparsers(dest="db_command", required=True)
    db_parsers = []
    for name, help_text in (
        ("upgrade", "create the ledger schema, or upgrade it to this version"),
        ("status", "show the ledger schema revision"),
    ):
        sub = db_commands.add_parser(name, help=help_text)
        # The URL as an argument is the older form: it still works, with a warning.
        sub.add_argument("positional_url", nargs="?", default=None, help=argparse.SUPPRESS)
        sub.add_argument(
            "--allow-unsafe-postgres",
            action="store_true",
            help="accept a PostgreSQL server running with synchronous_commit=off or fsync=off",
        )
        if name == "upgrade":
            sub.add_argument(
                "--dbos",
                action="store_true",
                help="also create or upgrade DBOS's tables in the same PostgreSQL database, for "
                "execution: durable (bots may start before the first worker --dbos)",
            )
        db_parsers.append(sub)
    approvals = commands.add_parser("approvals", help="operations waiting for a person")
    approval_commands = approvals.add_subparsers(dest="approvals_command", required=True)
    listing = approval_commands.add_parser("list", help="list operations awaiting approval")
    show = approval_commands.add_parser("show", help="show one operation and its arguments")
    show.add_argument("operation_id")
    _add_reveal(show)
    decide = []
    for name in ("approve", "reject"):
        sub = approval_commands.add_parser(name, help=f"{name} an operation")
        sub.add_argument("operation_id")
        sub.add_argument(
            "--approver",
            required=True,
            help="who decides, as in the credentials file (asked for their password; recorded)",
        )
        sub.add_argument("--reason", required=True, help="why (required, recorded)")
        add_approver_arguments(sub)
        decide.append(sub)
    decide[0].add_argument(
        "--args-hash",
        required=True,
        help="the args hash `approvals show` printed: what is approved (refused if the "
        "operation holds other arguments)",
    )
    add_console_parser(commands)
    add_users_parser(commands)
    ledger = commands.add_parser("ledger", help="read the action ledger")
    ledger_commands = ledger.add_subparsers(dest="ledger_command", required=True)
    ledger_list = ledger_commands.add_parser("list", help="list operations")
    ledger_list.add_argument("--status", action="append", choices=[s.value for s in ActionStatus])
    ledger_list.add_argument("--session", default=None)
    ledger_list.add_argument("--tool", default=None)
    ledger_list.add_argument("--principal", default=None)
    ledger_list.add_argument(
        "--since", type=_secs, default=None, metavar="SECS", help="only the last SECS seconds"
    )
    ledger_list.add_argument(
        "--conflicts",
        action="store_true",
        help="only conflicts: operations the ledger held as failed that the system of record "
        "reports committed (recorded as COMMITTED, escalated; whoever was told it failed was "
        "told wrong)",
    )
    ledger_show = ledger_commands.add_parser("show", help="an operation and its audit timeline")
    ledger_show.add_argument("operation_id")
    _add_reveal(ledger_show)
    rotate = ledger_commands.add_parser(
        "rotate-keys",
        help="re-encrypt every sealed value with the first key of $PIPECAT_ACTIONS_LEDGER_KEYS",
    )
    rotate.add_argument(
        "--actor",
        default=None,
        help="who rotates, for the audit trail (default: operator:<login name>)",
    )
    new_keys = ledger_commands.add_parser(
        "new-keys", help="print fresh values of the ledger's key variables"
    )
    new_keys.add_argument("--json", action="store_true", help="machine-readable output")
    undelivered = commands.add_parser("undelivered", help="committed, never told to anyone")
    for paged in (ledger_list, undelivered):
        paged.add_argument("--limit", type=_limit, default=200, help="rows per page (default 200)")
        paged.add_argument(
            "--after",
            type=_cursor,
            default=None,
            metavar="CURSOR",
            help="the page after this cursor (printed at the end of a full page)",
        )
    stats = commands.add_parser("stats", help="per-tool statistics from the ledger")
    stats.add_argument(
        "--since", type=_secs, default=None, metavar="SECS", help="only the last SECS seconds"
    )
    stats.add_argument("--tool", default=None, help="only this tool")
    scenario = commands.add_parser("scenario", help="replay scenario files")
    scenario_commands = scenario.add_subparsers(dest="scenario_command", required=True)
    scenario_run = scenario_commands.add_parser("run", help="run scenarios and check them")
    scenario_run.add_argument("files", nargs="+", metavar="FILE", help="YAML scenario files")
    scenario_run.add_argument(
        "--verbose", "-v", action="store_true", help="every check and the story of each run"
    )
    scenario_run.add_argument(
        "--ledger",
        default=None,
        metavar="URL",
        help="an empty database for the scenarios' ledgers (default: a temporary SQLite file)",
    )
    scenario_run.add_argument(
        "--fresh-database",
        action="store_true",
        help="--ledger names a PostgreSQL server: each scenario runs on a database of its own, "
        "made there and dropped after it (a scenario with durable tools runs a DBOS worker)",
    )
    # The option's older name: it still works, with a warning.
    scenario_run.add_argument("--ledger-url", default=None, help=argparse.SUPPRESS)
    scenario_run.add_argument("--json", action="store_true", help="machine-readable output")
    scenario_new = scenario_commands.add_parser(
        "new", help="write a scenario file that runs as it is, to start a new one from"
    )
    scenario_new.add_argument("path", metavar="FILE", help="the file to write (never replaced)")
    reconcile = commands.add_parser(
        "reconcile", help="ask the application's reconcile hooks about UNKNOWN operations"
    )
    target = reconcile.add_mutually_exclusive_group(required=True)
    target.add_argument("operation_id", nargs="?", default=None, metavar="OP")
    target.add_argument("--all", action="store_true", help="every UNKNOWN operation")
    reconcile.add_argument(
        "--app",
        default=os.environ.get("PIPECAT_ACTIONS_APP"),
        metavar="MODULE:ATTR",
        help="the application's OperatorApp, or a function returning one "
        "(default: $PIPECAT_ACTIONS_APP)",
    )
    reconcile.add_argument(
        "--actor",
        default=None,
        help="who reconciles, for the audit trail (default: operator:<login name>)",
    )
    reconcile.add_argument(
        "--probes", type=int, default=1, help="how often each hook is asked (default 1)"
    )
    worker = commands.add_parser(
        "worker",
        help="own the operations of bot processes that are gone (recovery, deadlines, expiry)",
    )
    worker.add_argument(
        "--app",
        default=os.environ.get("PIPECAT_ACTIONS_APP"),
        metavar="MODULE:ATTR",
        help="the application's OperatorApp, or a function returning one "
        "(default: $PIPECAT_ACTIONS_APP)",
    )
    worker.add_argument(
        "--dbos",
        action="store_true",
        help="run as a DBOS application: execute the execution: durable operations handed to "
        "DBOS by the bots (PostgreSQL; see docs/durable.md)",
    )
    worker.add_argument(
        "--executor-id",
        default=None,
        help="with --dbos: its DBOS executor id, stable across restarts (default $DBOS__VMID, "
        "else host and pid); a worker started again under a dead one's id recovers its work",
    )
    worker.add_argument(
        "--polling-secs",
        type=float,
        default=1.0,
        help="with --dbos: how often each DBOS queue is polled for work (default 1)",
    )
    worker.add_argument(
        "--pool-size",
        type=int,
        default=None,
        help="the most PostgreSQL connections its ledger opens (default 5; the worker holds "
        "at most 2 more), and with --dbos DBOS's pool too (default 20); see docs/durable.md "
        "for the sum to keep under the server's max_connections",
    )
    worker.add_argument("--owner", default=None, help="its name in leases")
    worker.add_argument(
        "--lease-secs", type=float, default=30.0, help="its lease (default 30; claims every third)"
    )
    worker.add_argument(
        "--once",
        action="store_true",
        help="claim what is stale, finish it, print a summary and exit (for a scheduled job): "
        "exit status 0 when all it claimed is finished or waits for a person, 3 when it left "
        "some that need someone, 1 when it cannot run",
    )
    durable = commands.add_parser(
        "durable", help="durable operations (execution: durable) and their DBOS workflows"
    )
    durable_commands = durable.add_subparsers(dest="durable_command", required=True)
    durable_check = durable_commands.add_parser(
        "check",
        help="read each unsettled durable operation's DBOS workflow; settle the ones whose "
        "workflow ended without settling them (FAILED_FINAL if unsent, UNKNOWN if maybe sent)",
    )
    durable_check.add_argument("operation_ids", nargs="*", metavar="OP")
    opening = [
        listing, show, *decide, ledger_list, ledger_show, rotate, undelivered, stats, reconcile,
    ]  # fmt: skip
    for sub in [*db_parsers, *opening, worker, durable_check]:
        sub.add_argument("--ledger", default=None, metavar="URL", help=_LEDGER_HELP)
        sub.add_argument("--json", action="store_true", help="machine-readable output")
    return parser


def _add_reveal(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--reveal",
        action="store_true",
        help="show sealed (sensitive) values decrypted: needs $PIPECAT_ACTIONS_LEDGER_KEYS, "
        "and is recorded on the operation as revealed by operator:<login name>",
    )


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit status."""
    return _run_command(_parse(argv))


def _run_command(args: argparse.Namespace) -> int:
    """Run the command ``args`` names; a `PipecatActionsError` is one line on stderr."""
    import asyncio

    try:
        if args.command == "policy" and args.policy_command == "migrate":
            return _policy_migrate(args, sys.stdout)
        if args.command == "policy":
            return _policy_check(args, sys.stdout)
        if args.command == "db":
            return asyncio.run(_db(args, sys.stdout))
        if args.command == "approvals":
            return asyncio.run(_approvals(args, sys.stdout))
        if args.command == "ledger" and args.ledger_command == "new-keys":
            return _new_keys(args, sys.stdout)
        if args.command == "ledger" and args.ledger_command == "rotate-keys":
            return asyncio.run(_rotate_keys(args, sys.stdout))
        if args.command in ("ledger", "undelivered", "stats"):
            return asyncio.run(_read_ledger(args, sys.stdout))
        if args.command == "scenario" and args.scenario_command == "new":
            from pipecat_actions.scenarios.command import new_scenario_file

            return new_scenario_file(args.path, out=sys.stdout)
        if args.command == "scenario":
            from pipecat_actions.scenarios.command import run_scenario_files

            return asyncio.run(
                run_scenario_files(
                    args.files,
                    out=sys.stdout,
                    err=sys.stderr,
                    as_json=args.json,
                    verbose=args.verbose,
                    ledger_url=args.ledger,
                    fresh_database=args.fresh_database,
                )
            )
        if args.command == "reconcile":
            return asyncio.run(_reconcile(args, sys.stdout))
        if args.command == "console":
            from pipecat_actions.console.command import run_console

            return asyncio.run(run_console(args, sys.stdout))
        if args.command == "users":
            from pipecat_actions.console.command import run_users

            return run_users(args, sys.stdout)
        if args.command == "worker":
            return asyncio.run(_worker(args, sys.stdout))
        if args.command == "durable":
            return asyncio.run(_durable_check(args, sys.stdout))
    except PipecatActionsError as exc:
        print(f"pipecat-actions: {printable(str(exc))}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    raise AssertionError(f"unhandled command {args.command}")  # pragma: no cover


_OLDER_LEDGER_FORMS = {
    ("db", "upgrade"): ("positional_url", "URL"),
    ("db", "status"): ("positional_url", "URL"),
    ("scenario", "run"): ("ledger_url", "--ledger-url URL"),
}
"""Where a command took its ledger before every command took ``--ledger URL``."""


def _parse(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse ``argv``; a ledger given in an older form becomes ``args.ledger``, with a warning.

    The older form still works and says, in one line on stderr, how to write it now; the
    ledger given both ways is a usage error (exit status 2).
    """
    parser = _build_parser()
    args = parser.parse_args(argv)
    command = (args.command, getattr(args, f"{args.command}_command", None))
    if command not in _OLDER_LEDGER_FORMS:
        return args
    attribute, old_form = _OLDER_LEDGER_FORMS[command]
    old = getattr(args, attribute)
    if old is None:
        return args
    said = " ".join(command)
    if args.ledger is not None:
        parser.error(f"{said}: give the ledger once, as --ledger URL (not also as {old_form})")
    print(
        f"pipecat-actions: warning: `{said} {old_form}` is deprecated; write `{said} --ledger URL`",
        file=sys.stderr,
    )
    args.ledger = old
    return args


async def _open_existing(url: str | None, **options: Any) -> SqlLedger:
    """Open the ledger a command uses: one that exists, never a new one (`must_exist`).

    The read commands pass ``read_only=True``.
    """
    from pathlib import PurePath

    from pipecat_actions.errors import LedgerNotFound
    from pipecat_actions.ledger import SqlLedger
    from pipecat_actions.ledger.engine import ENV_LEDGER_URL

    try:
        return await SqlLedger.create(url, must_exist=True, **options)
    except LedgerNotFound as exc:
        if url or os.environ.get(ENV_LEDGER_URL):
            raise
        # Nothing at the default place: the demo, which people run first, keeps its own there.
        demo = f"sqlite:///{PurePath(exc.path).with_name('demo.db')}"
        raise LedgerNotFound(f"{exc}; `make demo` writes its own, {demo}", path=exc.path) from None


def _say(text: str, out: TextIO) -> None:
    """Print ``text``, each of its lines `printable`."""
    print(printable_lines(text), file=out)


def _print_read(
    args: argparse.Namespace,
    url: str,
    data: object,
    render: Callable[[], str],
    out: TextIO,
    *,
    more: str | None = None,
) -> None:
    """Print what a command read from the ledger at ``url``: its JSON or its text.

    Text starts with the ``ledger:`` line; with ``--json`` that line (and ``more``, a page's
    cursor) goes to stderr, and ``render`` is never called.
    """
    import json

    from pipecat_actions._operator_text import ledger_line

    if args.json:
        for line in (ledger_line(url), more):
            if line:
                _say(line, sys.stderr)
        print(json.dumps(data, indent=2), file=out)
        return
    _say("\n".join([ledger_line(url), render(), *([more] if more else [])]), out)


def _policy_check(args: argparse.Namespace, out: TextIO) -> int:
    import json

    from pipecat_actions.policy import PolicyError, check_policy_files, load_policy

    if not args.json:
        return check_policy_files(args.files, out=out, err=sys.stderr)
    report = []
    for path in args.files:
        try:
            policies = load_policy(path)
            entry = {"file": path, "ok": True, "tools": list(policies.names())}
            report.append({**entry, "deprecations": list(policies.deprecations)})
        except PolicyError as exc:
            problems = [str(problem) for problem in exc.problems]
            report.append({"file": path, "ok": False, "problems": problems})
    print(json.dumps(report, indent=2), file=out)
    return 0 if all(entry["ok"] for entry in report) else 1


def _policy_migrate(args: argparse.Namespace, out: TextIO) -> int:
    from pipecat_actions.policy import PolicyError
    from pipecat_actions.policy.migrate import migrate_policy_file

    try:
        migration = migrate_policy_file(args.file, write=not args.stdout)
    except PolicyError as exc:
        for problem in exc.problems:
            print(printable(str(problem)), file=sys.stderr)
        print(printable(f"{args.file}: not migrated (the file is unchanged)"), file=sys.stderr)
        return 1
    if args.stdout:
        out.write(migration.text)
    report = out if not args.stdout else sys.stderr
    if not migration.changed:
        print(printable(f"{args.file}: already the current format; nothing to change"), file=report)
        return 0
    done = "migrated" if not args.stdout else "would migrate"
    print(printable(f"{args.file}: {done} from version {migration.from_version}"), file=report)
    for line in [*migration.changes, *(f"note: {note}" for note in migration.notes)]:
        print(printable(f"  {line}"), file=report)
    return 0


async def _reconcile(args: argparse.Namespace, out: TextIO) -> int:
    import getpass

    from pipecat_actions import operator
    from pipecat_actions.errors import ConfigurationError

    if not args.app:
        raise ConfigurationError(
            "reconcile needs the application's actions: pass --app MODULE:ATTR "
            "or set PIPECAT_ACTIONS_APP"
        )
    if args.probes < 1:
        raise ConfigurationError("--probes must be at least 1")
    actor = args.actor or f"operator:{getpass.getuser()}"
    app = await operator.load_app(args.app)
    ledger = await _open_existing(args.ledger)
    try:
        rows = await operator.reconcile(
            ledger,
            app,
            operation_ids=[args.operation_id] if args.operation_id else [],
            actor=actor,
            probes=args.probes,
        )
    finally:
        await ledger.close()
    _print_read(args, ledger.url, rows, lambda: operator.render_reconciled(rows), out)
    return 0


async def _durable_check(args: argparse.Namespace, out: TextIO) -> int:
    import json

    from pipecat_actions.durable.reconcile import check_durable
    from pipecat_actions.ledger.engine import default_ledger_url

    views = await check_durable(args.ledger or default_ledger_url(), list(args.operation_ids))
    for view in views:
        op = view.operation
        if args.json:
            print(
                json.dumps(
                    {
                        "operation_id": op.operation_id,
                        "status": op.status.value,
                        "workflow_status": view.workflow_status,
                        "moved": view.moved,
                    }
                ),
                file=out,
            )
            continue
        workflow = view.workflow_status or "no workflow"
        moved = f", moved to {op.status.value}" if view.moved else ""
        print(
            f"{printable(op.operation_id)} {printable(op.tool)}: ledger {op.status.value}, "
            f"workflow {workflow}{moved}",
            file=out,
        )
    if not views and not args.json:
        print("no unsettled durable operation", file=out)
    return 0


async def _worker(args: argparse.Namespace, out: TextIO) -> int:
    import asyncio
    import signal

    from pipecat_actions import operator
    from pipecat_actions.errors import ConfigurationError
    from pipecat_actions.worker import run_worker

    if not args.app:
        raise ConfigurationError(
            "worker needs the application's actions: pass --app MODULE:ATTR "
            "or set PIPECAT_ACTIONS_APP"
        )
    if not (math.isfinite(args.lease_secs) and args.lease_secs > 0):
        raise ConfigurationError("--lease-secs must be a positive number of seconds")
    app = await operator.load_app(args.app)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    handled = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(sig, stop.set)
            handled.append(sig)
        except (RuntimeError, ValueError):  # not the main thread (embedded): no handler
            pass
    try:
        if args.pool_size is not None and args.pool_size < 1:
            raise ConfigurationError("--pool-size must be at least 1")
        if args.dbos:
            if not (math.isfinite(args.polling_secs) and args.polling_secs > 0):
                raise ConfigurationError("--polling-secs must be a positive number of seconds")
            if args.once:
                raise ConfigurationError("--once is not for --dbos: DBOS hands a worker its work")
            from pipecat_actions.dbos_worker import run_dbos_worker

            return await run_dbos_worker(
                app,
                ledger_url=args.ledger,
                stop=stop,
                out=out,
                executor_id=args.executor_id,
                polling_secs=args.polling_secs,
                pool_size=args.pool_size,
                as_json=args.json,
            )
        return await run_worker(
            app,
            ledger_url=args.ledger,
            stop=stop,
            out=out,
            owner=args.owner,
            lease_secs=args.lease_secs,
            once=args.once,
            as_json=args.json,
            pool_size=args.pool_size,
        )
    finally:
        for sig in handled:
            loop.remove_signal_handler(sig)


async def _db(args: argparse.Namespace, out: TextIO) -> int:
    from pipecat_actions._operator_text import shown_url
    from pipecat_actions.ledger import LedgerSettings, SqlLedger

    settings = LedgerSettings(allow_unsafe_postgres=args.allow_unsafe_postgres)
    if args.db_command == "upgrade":
        ledger = await SqlLedger.create(
            args.ledger, settings=settings, create_schema=False, check_schema=False
        )
        try:
            beside = (await ledger.schema_state()).other_tables
            before, after = await ledger.upgrade_schema()
        finally:
            await ledger.close()
        data: dict[str, object] = {
            "url": ledger.url, "before": before, "after": after, "beside": list(beside)
        }  # fmt: skip
        said = (
            f"schema already at revision {after}"
            if before == after
            else f"schema upgraded from {before or 'empty'} to {after}"
        )
        if beside and before != after:
            # Said, since a mistyped URL puts a ledger into someone else's database.
            said += f" (beside the database's own tables: {', '.join(beside)})"
        if args.dbos:
            from pipecat_actions.durable import install_dbos_schema
            from pipecat_actions.ledger.engine import default_ledger_url

            await install_dbos_schema(args.ledger or default_ledger_url())
            data["dbos"] = "ready"
            said += "; DBOS tables ready (schema dbos)"
        _print_read(args, ledger.url, data, lambda: said, out)
        return 0
    ledger = await _open_existing(
        args.ledger, settings=settings, check_schema=False, read_only=True
    )
    try:
        state = await ledger.schema_state()
    finally:
        await ledger.close()
    if state.up_to_date:
        verdict = "up to date"
    elif state.empty:
        verdict = f"empty: run `pipecat-actions db upgrade --ledger {shown_url(ledger.url)}`"
    elif state.known:
        verdict = (
            f"older than this code ({state.head}): "
            f"run `pipecat-actions db upgrade --ledger {shown_url(ledger.url)}`"
        )
    else:
        verdict = f"newer than this code ({state.head}): upgrade pipecat_actions"
    status: dict[str, object] = {
        "url": ledger.url,
        "revision": state.current,
        "head": state.head,
        "up_to_date": state.up_to_date,
        "verdict": verdict,
    }
    _print_read(
        args, ledger.url, status, lambda: f"revision {state.current or 'none'}, {verdict}", out
    )
    return 0 if state.up_to_date else 1


async def _approvals_read(args: argparse.Namespace, out: TextIO) -> int:
    """``approvals list`` and ``approvals show``."""
    from pipecat_actions import operator
    from pipecat_actions.ledger.records import OperationFilter

    # Revealing is recorded on the operation: only then is the ledger opened for writing.
    reveal = args.approvals_command == "show" and args.reveal
    ledger = await _open_existing(args.ledger, read_only=not reveal)
    try:
        if args.approvals_command == "list":
            waiting = await _every(ledger, OperationFilter(status=[ActionStatus.AWAITING_APPROVAL]))
            waiting.sort(key=lambda op: (op.deadline_at or float("inf"), op.created_at))
            data: Any = [operator.describe_approval(op) for op in waiting]
            render: Callable[[Any], str] = operator.render_approvals
        else:
            from pipecat_actions.approvals import approval_rule

            op = await ledger.get(args.operation_id)
            rule = await approval_rule(ledger, op.operation_id)
            sealer = (
                await operator.reveal(ledger, op, actor=_operator_actor()) if args.reveal else None
            )
            data = operator.describe_approval(op, rule, sealer)
            render = operator.render_approval
    finally:
        await ledger.close()
    _print_read(args, ledger.url, data, lambda: render(data), out)
    return 0


async def _approvals(args: argparse.Namespace, out: TextIO) -> int:
    if args.approvals_command in ("list", "show"):
        return await _approvals_read(args, out)
    from pipecat_actions.approvals import approve_operation, reject_operation
    from pipecat_actions.clock import SystemClock
    from pipecat_actions.console.command import authenticated_approver
    from pipecat_actions.operator import describe_approval as describe

    ledger = await _open_existing(args.ledger)
    try:
        command = args.approvals_command
        approver = authenticated_approver(args)
        if command == "approve":
            op = await approve_operation(
                ledger,
                args.operation_id,
                approver=approver,
                reason=args.reason,
                now=SystemClock().now(),
                args_hash=args.args_hash,
            )
        else:
            op = await reject_operation(
                ledger,
                args.operation_id,
                approver=approver,
                reason=args.reason,
                now=SystemClock().now(),
            )
        _print_read(
            args, ledger.url, describe(op), lambda: f"{op.operation_id}: {op.status.value}", out
        )
        return 0
    finally:
        await ledger.close()


async def _read_ledger(args: argparse.Namespace, out: TextIO) -> int:
    import time
    from dataclasses import replace

    from pipecat_actions import operator
    from pipecat_actions.ledger.records import OperationFilter

    since = None if getattr(args, "since", None) is None else time.time() - args.since
    more = None
    reveal = getattr(args, "reveal", False)
    # Revealing is recorded on the operation: only then is the ledger opened for writing.
    ledger = await _open_existing(args.ledger, read_only=not reveal)
    try:
        if args.command == "stats":
            data: Any = await operator.statistics(
                ledger, OperationFilter(tool=args.tool, created_from=since)
            )
            render: Callable[[Any], str] = operator.render_statistics
        elif args.command == "ledger" and args.ledger_command == "show":
            data = await operator.timeline(
                ledger, args.operation_id, revealed_by=_operator_actor() if reveal else None
            )
            render = operator.render_timeline
        else:
            if args.command == "undelivered":
                wanted = OperationFilter(status=[ActionStatus.COMMITTED], undelivered=True)
            else:
                wanted = OperationFilter(
                    status=[ActionStatus(s) for s in args.status] if args.status else None,
                    session_id=args.session,
                    tool=args.tool,
                    principal=args.principal,
                    created_from=since,
                    conflicted=True if args.conflicts else None,
                )
            # One row past the page says whether another page follows.
            ops = await ledger.list(replace(wanted, after=args.after, limit=args.limit + 1))
            page = ops[: args.limit]
            data = [operator.describe(op) for op in page]
            render = operator.render_rows
            if len(ops) > args.limit:
                more = f"more: --after {_cursor_of(page[-1])}"
    finally:
        await ledger.close()
    _print_read(args, ledger.url, data, lambda: render(data), out, more=more)
    return 0


def _operator_actor(given: str | None = None) -> str:
    """Who an operator's command acts as, for the audit trail: ``operator:<login name>``."""
    import getpass

    return given or f"operator:{getpass.getuser()}"


def _new_keys(args: argparse.Namespace, out: TextIO) -> int:
    import json

    from pipecat_actions.ledger.keys import new_keys

    keys = new_keys()
    if args.json:
        print(json.dumps(keys, indent=2), file=out)
    else:
        for name, value in keys.items():
            print(f"{name}={value}", file=out)
    return 0


async def _rotate_keys(args: argparse.Namespace, out: TextIO) -> int:
    from pipecat_actions.ledger.rotation import render_rotation, rotate_sealed_values

    ledger = await _open_existing(args.ledger)
    try:
        report = await rotate_sealed_values(ledger, actor=_operator_actor(args.actor))
    finally:
        await ledger.close()
    _print_read(args, ledger.url, report, lambda: render_rotation(report), out)
    return 1 if report["unreadable"] or report["busy"] else 0


def _warn(message: loguru.Message) -> None:
    """Write a log record as one printable line (its traceback, if any, is left out)."""
    print(f"pipecat-actions: {printable(message.record['message'])}", file=sys.stderr)


def run() -> None:
    """The console script: `main`, with warnings and errors only on stderr."""
    import signal

    try:
        args = _parse(None)
        # Once the arguments are good (`--help` and a usage error import no logging library):
        # a command's output is what it prints, and a failure is one line, so no debug log.
        from loguru import logger

        logger.remove()
        logger.add(_warn, level="WARNING", format="{message}")
        status = _run_command(args)
        sys.stdout.flush()  # here, where a closed pipe is caught, rather than at exit
    except BrokenPipeError:
        # The reader went away (`| head`). As the signal module's documentation does: point
        # stdout at devnull, so that the interpreter's own flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        status = 128 + signal.SIGPIPE
    raise SystemExit(status)


if __name__ == "__main__":  # pragma: no cover
    run()
