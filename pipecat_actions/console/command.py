"""``pipecat-actions console``, ``pipecat-actions users`` and the CLI approver's sign-in.

The CLI decides on approvals under the rules the console enforces: the approver is
authenticated against the same credentials file (``--users FILE`` or
``$PIPECAT_ACTIONS_USERS``), with the password typed at the terminal's prompt or given on
standard input (``--password-stdin``, for a script), never on the command line.
"""

from __future__ import annotations

__all__ = [
    "ENV_USERS",
    "add_approver_arguments",
    "add_console_parser",
    "add_users_parser",
    "authenticated_approver",
    "run_console",
    "run_users",
]

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any, TextIO

from pipecat_actions._printable import printable, printable_json

if TYPE_CHECKING:
    from pipecat_actions.approvals import Approver
    from pipecat_actions.console.users import Operator

# The command's parsers are built for every `pipecat-actions` command line: what only running
# one of these commands needs (the credentials file's code, the policy model behind an
# approver's name) is imported when it runs.

ENV_USERS = "PIPECAT_ACTIONS_USERS"
"""The environment variable naming the credentials file."""


def _users_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--users",
        default=os.environ.get(ENV_USERS),
        metavar="FILE",
        help=f"the operators' credentials file (default: ${ENV_USERS})",
    )


def add_approver_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the sign-in of ``approvals approve|reject``: ``--users`` and ``--password-stdin``."""
    _users_argument(parser)
    parser.add_argument(
        "--password-stdin",
        action="store_true",
        help="read the approver's password from the first line of standard input",
    )


def _password(args: argparse.Namespace, prompt: str, *, twice: bool = False) -> str:
    import getpass

    from pipecat_actions.console.users import UsersFileError

    if args.password_stdin:
        line = sys.stdin.readline()
        return line.rstrip("\r\n")
    if not sys.stdin.isatty():
        raise UsersFileError(
            "no terminal to ask the password at: give it on standard input with --password-stdin"
        )
    first = getpass.getpass(prompt)
    if twice and getpass.getpass("again: ") != first:
        raise UsersFileError("the two passwords differ; nothing was changed")
    return first


def authenticated_approver(args: argparse.Namespace) -> Approver:
    """Sign ``args.approver`` in against the credentials file; return them as an `Approver`.

    Raises:
        UsersFileError: No credentials file, or the name or password is wrong.
    """
    from pipecat_actions.console.users import Credentials, UsersFileError

    if not args.users:
        raise UsersFileError(
            "deciding on an approval needs the operators' credentials file to check who you "
            f"are: pass --users FILE or set ${ENV_USERS} (create it with "
            "`pipecat-actions users add NAME --users FILE`)"
        )
    credentials = Credentials(args.users)
    credentials.operators()  # a missing or malformed file says so before the prompt
    password = _password(args, f"password for {printable(args.approver)}: ")
    operator = credentials.authenticate(args.approver.strip(), password)
    if operator is None:
        raise UsersFileError(
            f"unknown approver or wrong password (credentials {printable(str(args.users))})"
        )
    return operator.approver(f"cli: credentials file {os.path.abspath(args.users)}")


def _tenant_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--tenant",
        action="append",
        default=[],
        metavar="TENANT",
        help="a tenant whose operations they may decide on (repeat for several)",
    )
    parser.add_argument(
        "--all-tenants",
        action="store_true",
        help="they may decide on the operations of every tenant",
    )


def _tenants(args: argparse.Namespace) -> list[str] | None:
    """The tenants ``--tenant``/``--all-tenants`` give, or None when neither is given."""
    from pipecat_actions.approvals import ALL_TENANTS
    from pipecat_actions.console.users import UsersFileError

    if args.all_tenants and args.tenant:
        raise UsersFileError("give --tenant or --all-tenants, not both")
    if args.all_tenants:
        return [ALL_TENANTS]
    return list(args.tenant) or None


def add_users_parser(commands: Any) -> None:
    """Add ``pipecat-actions users add|tenants|remove|list``."""
    users = commands.add_parser("users", help="the operators' credentials file (console, CLI)")
    sub = users.add_subparsers(dest="users_command", required=True)
    add = sub.add_parser("add", help="add an operator, or change their password, roles and tenants")
    add.add_argument("name")
    add.add_argument(
        "--role", action="append", default=[], help="a role they hold (repeat for several)"
    )
    _tenant_arguments(add)
    add.add_argument(
        "--password-stdin", action="store_true", help="read the password from standard input"
    )
    tenants = sub.add_parser(
        "tenants", help="set the tenants an operator decides in (their password is kept)"
    )
    tenants.add_argument("name")
    _tenant_arguments(tenants)
    remove = sub.add_parser("remove", help="remove an operator")
    remove.add_argument("name")
    listing = sub.add_parser("list", help="list the operators, their roles and tenants")
    listing.add_argument("--json", action="store_true", help="machine-readable output")
    for parser in (add, tenants, remove, listing):
        _users_argument(parser)


def _shown_tenants(operator: Operator) -> str:
    from pipecat_actions.approvals import ALL_TENANTS

    if operator.tenants is None:
        return "none declared (decides nothing)"
    return (
        "every tenant" if ALL_TENANTS in operator.tenants else ", ".join(sorted(operator.tenants))
    )


def run_users(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``pipecat-actions users``."""
    from pipecat_actions.console.users import Credentials, UsersFileError
    from pipecat_actions.policy.fields import check_approver_name

    if not args.users:
        raise UsersFileError(f"name the credentials file: --users FILE or ${ENV_USERS}")
    credentials = Credentials(args.users)
    where = printable(str(args.users))
    if args.users_command in ("add", "tenants"):
        tenants = _tenants(args)
        if args.users_command == "tenants":
            if tenants is None:
                raise UsersFileError("name their tenants: --tenant TENANT... or --all-tenants")
            operator = credentials.set_tenants(args.name, tenants)
        else:
            try:
                check_approver_name(args.name)
            except ValueError as exc:
                raise UsersFileError(str(exc)) from None
            listed = credentials.path.exists() and credentials.find(args.name) is not None
            if tenants is None and not listed:
                raise UsersFileError(
                    f"say which tenants {printable(args.name)} decides in: --tenant TENANT "
                    "(repeat for several) or --all-tenants; nobody is global by default"
                )
            password = _password(args, f"new password for {printable(args.name)}: ", twice=True)
            operator = credentials.add(args.name, password, frozenset(args.role), tenants)
        roles = ", ".join(sorted(operator.roles)) or "no role"
        print(
            f"{where}: {printable(operator.name)} ({printable(roles)}; tenants: "
            f"{printable(_shown_tenants(operator))})",
            file=out,
        )
        return 0
    if args.users_command == "remove":
        if not credentials.remove(args.name):
            raise UsersFileError(f"{printable(args.name)} is not in {where}")
        print(f"{where}: {printable(args.name)} removed", file=out)
        return 0
    operators = credentials.operators()
    if getattr(args, "json", False):
        print(f"credentials: {where}", file=sys.stderr)
        rows: list[dict[str, Any]] = [
            {
                "name": op.name,
                "roles": sorted(op.roles),
                "tenants": None if op.tenants is None else sorted(op.tenants),
            }
            for op in operators.values()
        ]
        print(printable_json(rows), file=out)
        return 0
    print(f"credentials: {where}", file=out)
    if not operators:
        print("no operator", file=out)
        return 0
    print(f"{'NAME':<32} {'ROLES':<24} TENANTS", file=out)
    for operator in operators.values():
        roles = ", ".join(sorted(operator.roles))
        print(
            f"{printable(operator.name):<32} {printable(roles):<24} "
            f"{printable(_shown_tenants(operator))}",
            file=out,
        )
    return 0


def add_console_parser(commands: Any) -> None:
    """Add ``pipecat-actions console``."""
    console = commands.add_parser(
        "console", help="the approvals console in the browser, on the ledger"
    )
    console.add_argument("--ledger", default=None, metavar="URL", help="the ledger database")
    _users_argument(console)
    console.add_argument(
        "--user-header",
        default=None,
        metavar="HEADER",
        help="sign-in by a reverse proxy: the trusted header naming the operator "
        "(e.g. X-Forwarded-User); instead of --users",
    )
    console.add_argument(
        "--roles-header",
        default=None,
        metavar="HEADER",
        help="with --user-header: the header listing their roles, comma-separated "
        "(e.g. X-Forwarded-Groups)",
    )
    console.add_argument(
        "--tenants-header",
        default=None,
        metavar="HEADER",
        help="with --user-header: the header listing the tenants the operator decides in, "
        "comma-separated, * for every tenant (e.g. X-Forwarded-Tenants); without it, "
        "operators signed in by the proxy decide nothing",
    )
    console.add_argument(
        "--app",
        default=os.environ.get("PIPECAT_ACTIONS_APP"),
        metavar="MODULE:ATTR",
        help="the application's OperatorApp, for the reconcile action "
        "(default: $PIPECAT_ACTIONS_APP)",
    )
    console.add_argument("--host", default="127.0.0.1", help="where to listen (127.0.0.1)")
    console.add_argument("--port", type=int, default=8321, help="the port (8321)")
    console.add_argument(
        "--public-origin",
        default=None,
        metavar="URL",
        help="the console's address as browsers reach it (https://host[:port]), when a "
        "proxy in front of it changes the Host header; decisions must come from it",
    )
    console.add_argument(
        "--secure-cookies",
        action="store_true",
        help="send the session cookie over HTTPS only (behind a TLS proxy)",
    )


async def run_console(args: argparse.Namespace, out: TextIO) -> int:
    """Run ``pipecat-actions console`` until interrupted."""
    from loguru import logger

    from pipecat_actions._operator_text import ledger_line
    from pipecat_actions.console import ConsoleSettings, serve
    from pipecat_actions.console.users import Credentials

    if args.user_header and args.users and args.users == os.environ.get(ENV_USERS):
        args.users = None  # the environment's default gives way to an explicit proxy sign-in
    settings = ConsoleSettings(
        users=Credentials(args.users) if args.users else None,
        user_header=args.user_header,
        roles_header=args.roles_header,
        tenants_header=args.tenants_header,
        app=args.app,
        secure_cookies=args.secure_cookies,
        public_origin=args.public_origin,
        cookie_name=f"pipecat_actions_console_{args.port}",
    )
    if settings.users is not None:
        settings.users.operators()  # a missing or malformed file says so now, not at sign-in
    elif settings.tenants_header is None:
        logger.warning(
            "console: no --tenants-header: operators the proxy signs in belong to no tenant "
            "and may decide nothing"
        )
    if settings.app is not None:
        from pipecat_actions import operator

        await operator.load_app(settings.app)  # a mistyped --app says so now, not at a click

    def say_where(url: str, ledger_name: str) -> None:
        print(ledger_line(ledger_name), file=out)  # as every other command names it
        print(f"console on {url}/ (Ctrl-C stops it)", file=out)
        out.flush()

    await serve(
        settings, ledger_url=args.ledger, host=args.host, port=args.port, on_started=say_where
    )
    return 0
