r"""``python -m bots.restaurant_service --port 0 --db PATH``: serve the restaurant on 127.0.0.1.

The first line on stdout is ``restaurant_service: listening on http://HOST:PORT`` with the port
actually bound (``--port 0`` picks a free one). Faults and latencies can be armed at start::

    python -m bots.restaurant_service --db r.db --latency book=2.5 --fault book=drop_after_commit
    RESTAURANT_SERVICE_FAULTS="book=error_before_commit,refund=slow_after_commit:3" \
        python -m bots.restaurant_service --db r.db

``--exit-with-stdin`` stops the service when its standard input closes: a parent that keeps
the pipe open takes the service with it whatever way it ends (even SIGKILL).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import socket
import sys
import threading
from collections.abc import Sequence
from typing import get_args

from bots.restaurant_service.app import (
    KINDS,
    Fault,
    FaultName,
    Faults,
    create_app,
    with_dropped_connections,
)
from bots.restaurant_service.store import Store


def _pairs(values: Sequence[str], what: str) -> list[tuple[str, str]]:
    pairs = []
    for value in values:
        for item in filter(None, (v.strip() for v in value.split(","))):
            kind, sep, setting = item.partition("=")
            if not sep or kind not in KINDS:
                raise SystemExit(
                    f"restaurant_service: {what} {item!r}: KIND=VALUE, KIND in {KINDS}"
                )
            pairs.append((kind, setting))
    return pairs


def parse_faults(args: argparse.Namespace) -> Faults:
    """The switches the flags and the environment ask for."""
    faults = Faults(honour_keys=not args.ignore_idempotency_keys, key_ttl_secs=args.key_ttl_secs)
    latencies = [*filter(None, [os.environ.get("RESTAURANT_SERVICE_LATENCY", "")]), *args.latency]
    for kind, secs in _pairs(latencies, "--latency"):
        faults.latency_secs[kind] = float(secs)
    armed = [*filter(None, [os.environ.get("RESTAURANT_SERVICE_FAULTS", "")]), *args.fault]
    for kind, setting in _pairs(armed, "--fault"):
        name, _, secs = setting.partition(":")
        if name not in get_args(FaultName):
            raise SystemExit(f"restaurant_service: unknown fault {name!r}")
        faults.arm(Fault(kind, name, float(secs or 0)))  # type: ignore[arg-type]
    return faults


async def serve(args: argparse.Namespace) -> None:
    import uvicorn

    store = Store(args.db)
    app = with_dropped_connections(create_app(store, parse_faults(args)))
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((args.host, args.port))
    host, port = sock.getsockname()[:2]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        # Longer than a client's idle pool keeps a connection: a request is never written to a
        # connection the service has just closed (that would read as a lost answer).
        timeout_keep_alive=30,
        timeout_graceful_shutdown=2,
    )
    server = uvicorn.Server(config)

    async def announce() -> None:
        # Only once uvicorn accepts connections: a client that reads this line may connect.
        while not server.started:
            if server.should_exit:
                return
            await asyncio.sleep(0.01)
        print(f"restaurant_service: listening on http://{host}:{port}", flush=True)

    announcing = asyncio.ensure_future(announce())
    if args.exit_with_stdin:
        loop = asyncio.get_running_loop()

        def watch() -> None:
            sys.stdin.read()  # returns at EOF: the parent is gone
            loop.call_soon_threadsafe(setattr, server, "should_exit", True)

        threading.Thread(target=watch, daemon=True).start()
    try:
        await server.serve(sockets=[sock])
    finally:
        announcing.cancel()
        store.close()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bots.restaurant_service")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0: a free port (printed)")
    parser.add_argument("--db", required=True, help="the restaurant's SQLite file")
    parser.add_argument("--latency", action="append", default=[], metavar="KIND=SECS")
    parser.add_argument("--fault", action="append", default=[], metavar="KIND=FAULT[:SECS]")
    parser.add_argument(
        "--ignore-idempotency-keys",
        action="store_true",
        default=os.environ.get("RESTAURANT_SERVICE_IGNORE_KEYS", "") == "1",
        help="behave like a provider that does not dedupe on Idempotency-Key",
    )
    parser.add_argument("--key-ttl-secs", type=float, default=24 * 3600.0)
    parser.add_argument("--exit-with-stdin", action="store_true")
    args = parser.parse_args(argv)
    logging.getLogger("uvicorn.error").setLevel(logging.WARNING)
    asyncio.run(serve(args))


if __name__ == "__main__":
    main()
