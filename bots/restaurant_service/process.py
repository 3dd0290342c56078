"""Start the restaurant service as a child process, and always stop it.

::

    with RestaurantProcess.start(db_path) as restaurant:     # 127.0.0.1, a free port
        api = RestaurantAPI(restaurant.url)
        await restaurant.admin.arm("book", "drop_after_commit")

The child is stopped when the block ends, on an exception or Ctrl-C too (SIGTERM, then SIGKILL
after a grace period). Its standard input is a pipe held by this process, and the child exits
when that pipe closes: if this process is itself killed, the restaurant goes with it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]


class RestaurantAdmin:
    """The service's admin endpoints: arm faults, set latencies, read counters."""

    def __init__(self, url: str) -> None:
        self.url = url

    async def arm(self, kind: str, fault: str, *, secs: float = 0.0, times: int = 1) -> None:
        """Arm ``fault`` for the next ``times`` requests of ``kind`` (see `app`)."""
        await self._post(
            "/admin/faults", {"kind": kind, "fault": fault, "secs": secs, "times": times}
        )

    async def set_latency(self, kind: str, secs: float) -> None:
        """Every request of ``kind`` takes ``secs`` before it commits, from now on."""
        await self._post("/admin/latency", {"kind": kind, "secs": secs})

    async def stats(self) -> dict[str, Any]:
        """Requests received and side effects committed, by kind; faults still armed."""
        return await self._get("/admin/stats")

    async def bookings(self, **fields: str) -> list[dict[str, Any]]:
        """The bookings whose fields equal ``fields`` (the provider's own lookup)."""
        return list((await self._get("/bookings", fields))["bookings"])

    async def _post(self, path: str, body: dict[str, Any]) -> None:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            (await client.post(path, json=body)).raise_for_status()

    async def _get(self, path: str, params: dict[str, str] | None = None) -> Any:
        async with httpx.AsyncClient(base_url=self.url, timeout=10) as client:
            response = await client.get(path, params=params)
            response.raise_for_status()
            return response.json()


class RestaurantProcess:
    """A running restaurant service (`bots.restaurant_service`) in a child process.

    Attributes:
        url: Where it listens (``http://127.0.0.1:PORT``).
        db: Its SQLite database.
        process: The child.
        admin: Its admin endpoints.
    """

    def __init__(self, url: str, db: Path, process: subprocess.Popen[str]) -> None:
        self.url, self.db, self.process = url, db, process
        self.admin = RestaurantAdmin(url)

    @classmethod
    def start(cls, db: str | os.PathLike[str], *args: str, port: int = 0) -> RestaurantProcess:
        """Start the service on ``db`` (more flags in ``args``) and wait until it listens."""
        command = [
            sys.executable,
            "-m",
            "bots.restaurant_service",
            "--db",
            str(db),
            "--port",
            str(port),
            "--exit-with-stdin",
            *args,
        ]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
        }
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert process.stdout is not None
            # The child prints its address first; a child that dies prints nothing (EOF).
            line = process.stdout.readline()
            prefix = "restaurant_service: listening on "
            if not line.startswith(prefix):
                raise RuntimeError(
                    f"the restaurant service did not start (exit {process.poll()}): {line!r}"
                )
        except BaseException:
            _stop(process)
            raise
        return cls(line[len(prefix) :].strip(), Path(db), process)

    def stop(self) -> None:
        """Stop the service (SIGTERM, then SIGKILL); safe to call twice."""
        _stop(self.process)

    def __enter__(self) -> RestaurantProcess:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def _stop(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    for pipe in (process.stdin, process.stdout):
        if pipe is not None:
            pipe.close()
