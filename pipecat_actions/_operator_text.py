"""The text renderings of what an operator reads (`pipecat_actions.operator`'s plain data).

Every value from the ledger is shown through `printable` (a terminal never obeys what a tool
call wrote) and laid out as plain text: table cells are rich `Text`, never markup, so a name
like ``[/x]`` or ``[bold]`` is shown as it is. Tables have a header row and are never wrapped
or cut (ids stay whole); a record is ``name: value`` lines, its JSON values indented.
"""

from __future__ import annotations

__all__ = [
    "ledger_line",
    "render_approval",
    "render_approvals",
    "render_reconciled",
    "render_rows",
    "render_statistics",
    "render_timeline",
    "shown_url",
    "when",
]

import json
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from pipecat_actions._printable import printable, printable_json

_NOTHING = "-"


def when(at: float | None) -> str | None:
    """Return epoch seconds as an ISO 8601 UTC time (milliseconds), or None."""
    return (
        None if at is None else datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds")
    )


def shown_url(url: str) -> str:
    """Return a ledger's URL as a person types it: without its async driver.

    ``sqlite+aiosqlite:////srv/ledger.db`` is shown as ``sqlite:////srv/ledger.db``. Give it an
    already redacted URL (`SqlLedger.url`): nothing here hides a password.
    """
    scheme, sep, rest = url.partition("://")
    return f"{scheme.partition('+')[0]}{sep}{rest}" if sep else url


def ledger_line(url: str) -> str:
    """Return the line that names the ledger a command read: ``ledger: URL``."""
    return f"ledger: {printable(shown_url(url))}"


def render_rows(rows: list[dict[str, Any]]) -> str:
    """Render operations (`pipecat_actions.operator.describe`) as a text table."""
    if not rows:
        return "no operation matches"
    return _table(
        ["operation", "tool", "status", "principal", "created"],
        [
            [row["operation_id"], row["tool"], row["status"], row["principal"], row["created_at"]]
            for row in rows
        ],
    )


def render_timeline(data: dict[str, Any]) -> str:
    """Render an operation and its audit events (`pipecat_actions.operator.timeline`)."""
    op = data["operation"]
    lines = _fields((name, value) for name, value in op.items() if name not in ("args", "result"))
    lines += _json_block("args", op["args"])
    lines += _json_block("result", op["result"])
    lines += ["", "audit timeline:"]
    lines.append(
        _table(
            ["seq", "at", "event", "from", "to", "actor", "detail"],
            [
                [
                    event["seq"],
                    event["at"],
                    event["kind"],
                    event["from"] or _NOTHING,
                    event["to"],
                    event["actor"],
                    _NOTHING if event["detail"] is None else _compact(event["detail"]),
                ]
                for event in data["events"]
            ],
        )
        if data["events"]
        else "  (no event)"
    )
    return "\n".join(lines)


def render_approvals(rows: list[dict[str, Any]]) -> str:
    """Render the operations awaiting approval (`describe_approval`) as a text table."""
    if not rows:
        return "no operation is waiting for approval"
    return _table(
        ["operation", "tool", "tenant", "requester", "args hash", "expires"],
        [
            [
                row["operation_id"],
                row["tool"],
                row["tenant"],
                row["principal"],
                row["args_hash"][:12],
                when(row["expires_at"]) or _NOTHING,
            ]
            for row in rows
        ],
    )


def render_approval(data: dict[str, Any]) -> str:
    """Render one operation for its approver (`describe_approval`): fields, then arguments."""
    times = ("created_at", "expires_at")
    blocks = ("args", "before_state")
    lines = _fields(
        (name, when(value) if name in times else _listed(value))
        for name, value in data.items()
        if name not in blocks
    )
    for name in blocks:
        lines += _json_block(name, data.get(name))
    return "\n".join(lines)


def render_statistics(data: dict[str, Any]) -> str:
    """Render `pipecat_actions.operator.statistics` as text: one block per tool."""
    if not data["tools"]:
        return "no operation matches"
    lines: list[str] = []
    if data.get("conflicts"):
        lines.append(
            f"CONFLICTS: {data['conflicts']} operations the ledger held as failed were reported "
            "committed by the system of record (see: ledger list --conflicts)"
        )
    for tool, entry in data["tools"].items():
        lines.append(
            f"{printable(tool)}: {entry['operations']} operations, {entry['proposals']} proposals"
        )
        for key, value in entry.items():
            if key in ("operations", "proposals") or value in (None, {}, 0):
                continue
            if isinstance(value, dict) and "p50_secs" in value:
                sample = (
                    f", p50 and p95 from a sample of {value['sampled']}"
                    if "sampled" in value
                    else ""
                )
                shown = (
                    f"p50 {value['p50_secs']:.3f} s  p95 {value['p95_secs']:.3f} s  "
                    f"max {value['max_secs']:.3f} s  (n={value['count']}{sample})"
                )
            elif isinstance(value, dict):
                shown = ", ".join(f"{printable(str(k))} {v}" for k, v in value.items())
            elif key.endswith("_rate"):
                shown = f"{value:.1%}"
            else:
                shown = printable(str(value))
            lines.append(f"  {key.replace('_', ' '):<26} {shown}")
    return "\n".join(lines)


def render_reconciled(rows: list[dict[str, Any]]) -> str:
    """Render the outcome of `pipecat_actions.operator.reconcile` as a text table."""
    if not rows:
        return "no operation is UNKNOWN"
    return _table(
        ["operation", "tool", "before", "after", "changed", "note"],
        [
            [
                row["operation_id"],
                row["tool"],
                row["before"],
                row["after"],
                "yes" if row["changed"] else "no" + (" (escalated)" if row["escalated"] else ""),
                row["note"] or "",
            ]
            for row in rows
        ],
    )


def _fields(pairs: Iterable[tuple[str, Any]]) -> list[str]:
    """One ``name: value`` line per field; nothing is shown as ``-``, a flag as yes or no."""
    lines = []
    for name, value in pairs:
        if value is None:
            shown = _NOTHING
        elif isinstance(value, bool):
            shown = "yes" if value else "no"
        else:
            shown = printable(str(value))
        lines.append(f"{name}: {shown}")
    return lines


def _listed(value: Any) -> Any:
    """A list of names as ``a, b`` (None when empty); any other value as it is."""
    if isinstance(value, list):
        return ", ".join(str(item) for item in value) or None
    return value


def _json_block(name: str, value: Any) -> list[str]:
    """``name:`` then ``value`` as indented JSON, each line printable."""
    if value is None:
        return [f"{name}: {_NOTHING}"]
    return [f"{name}:", *(f"  {line}" for line in printable_json(value).split("\n"))]


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "), default=str)


def _table(headers: list[str], rows: list[list[Any]]) -> str:
    """Render a table with rich: no colours, no markup, never wrapped or cut."""
    import io

    from rich import box
    from rich.cells import cell_len
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    table = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False)
    for header in headers:
        table.add_column(Text(header), no_wrap=True)
    cells = [[printable(str(cell)) for cell in row] for row in rows]
    for row in cells:
        table.add_row(*(Text(cell) for cell in row))
    widths = [
        max([cell_len(header)] + [cell_len(row[i]) for row in cells])
        for i, header in enumerate(headers)
    ]
    buffer = io.StringIO()
    console = Console(
        file=buffer,
        width=sum(widths) + 3 * len(widths) + 2,
        color_system=None,
        markup=False,
        emoji=False,
        highlight=False,
    )
    console.print(table)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines()).strip("\n")
