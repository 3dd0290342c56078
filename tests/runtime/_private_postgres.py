"""A PostgreSQL cluster of a test's own, on a free port, that the test may stop and start.

The shared server on 5432 is never stopped: an outage is played on a cluster made here with
``initdb`` in a temporary folder and run with ``pg_ctl`` (as the ``postgres`` user when the
tests run as root, since PostgreSQL refuses to run as root).
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

import pytest


def _bin(name: str) -> str:
    found = shutil.which(name) or next(
        iter(sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), reverse=True)), None
    )
    if found is None:
        pytest.fail(f"{name} is not installed: the private PostgreSQL cluster cannot be made")
    return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class PrivateCluster:
    """A PostgreSQL cluster in a folder of its own, on 127.0.0.1:``port``, trust auth."""

    def __init__(self) -> None:
        # Not under pytest's tmp_path: its folders are closed to the postgres user.
        self.root = Path(tempfile.mkdtemp(prefix="pa-private-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sockets"
        self.port = _free_port()
        self._as_postgres = os.geteuid() == 0

    @property
    def url(self) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        command = list(argv)
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        done = subprocess.run(command, capture_output=True, text=True, timeout=120, check=False)
        if done.returncode != 0:
            raise AssertionError(f"{' '.join(argv)} failed: {done.stdout}\n{done.stderr}")

    def create(self) -> None:
        self.sockets.mkdir(parents=True)
        if self._as_postgres:
            shutil.chown(self.root, "postgres")
            shutil.chown(self.sockets, "postgres")
        self._run(
            _bin("initdb"), "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8"
        )

    def start(self) -> None:
        options = f"-p {self.port} -k {self.sockets} -c listen_addresses=127.0.0.1"
        self._run(
            _bin("pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(self.root / "log"),
            "-w", "start",
        )  # fmt: skip

    def stop(self, mode: str = "immediate") -> None:
        """Stop the server (``immediate``: as a crash would, every connection cut)."""
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "stop")

    def remove(self) -> None:
        with contextlib.suppress(AssertionError):  # already stopped
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
