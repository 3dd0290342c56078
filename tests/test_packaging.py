"""The project installs as a library: its wheel and sdist work outside the repository.

``python -m build`` (offline: ``--no-isolation``, with the build frontend and setuptools of the
dev extra) builds the sdist from a copy of the project's files, then the wheel from the sdist,
so a file the sdist forgets is missing from the wheel too. The wheel is installed with
``--no-deps`` into a fresh venv (no system site packages) in a folder outside the repository;
its dependencies are this venv's, seen through a path file, so that nothing is downloaded.
The package itself is then the wheel's: the test checks where it is imported from. From there
the console script runs, ``db upgrade`` creates a ledger with the packaged migrations, and the
console renders its sign-in page from the packaged templates and serves its static files.
"""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import textwrap
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE_DATA = [
    "pipecat_actions/py.typed",
    "pipecat_actions/ledger/migrations/env.py",
    "pipecat_actions/ledger/migrations/script.py.mako",
    "pipecat_actions/console/templates/login.html",
]

pytestmark = [pytest.mark.packaging, pytest.mark.timeout(600)]


def _run(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    # Outside the repository: a PYTHONPATH naming a checkout (as a worktree's test runs set
    # it) would put that checkout's package before the wheel's.
    outside = {k: v for k, v in (os.environ if env is None else env).items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=outside, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, f"{argv}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The sdist and the wheel built from a copy of the project (the worktree stays clean)."""
    base = tmp_path_factory.mktemp("build")
    source = base / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "CHANGELOG.md"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(
        ROOT / "pipecat_actions",
        source / "pipecat_actions",
        ignore=shutil.ignore_patterns("__pycache__", "*.pyc"),
    )
    dist = base / "dist"
    _run(sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, source, cwd=base)
    [sdist] = dist.glob("*.tar.gz")
    [wheel] = dist.glob("*.whl")
    return sdist, wheel


def test_the_wheel_holds_the_templates_static_files_and_migrations(
    built: tuple[Path, Path],
) -> None:
    sdist, wheel = built
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        [metadata] = [n for n in names if n.endswith(".dist-info/METADATA")]
        meta = email.message_from_bytes(archive.read(metadata))
        [entry_points] = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = archive.read(entry_points).decode()
    assert set(PACKAGE_DATA) <= names
    folder = "pipecat_actions/ledger/migrations/versions"
    versions = {n.rsplit("/", 1)[1] for n in names if n.startswith(f"{folder}/0")}
    assert versions == {path.name for path in (ROOT / folder).glob("0*.py")}
    templates = {n for n in names if n.startswith("pipecat_actions/console/templates/")}
    assert len(templates) == len(list((ROOT / "pipecat_actions/console/templates").iterdir()))
    assert any(n.startswith("pipecat_actions/console/static/") for n in names)
    assert "pipecat-actions = pipecat_actions.cli:run" in scripts
    assert not any(n.startswith(("tests/", "bots/", "bench/")) for n in names)
    # 0.2.0 still brings every service SDK 0.1.0 did (the compatibility rule: 0.3.0 drops
    # them from the core); one extra per service is already there to name.
    requires = meta.get_all("Requires-Dist") or []
    core = [r for r in requires if "extra ==" not in r]
    assert "pipecat-ai[daily,google,openai,runner,silero,webrtc]==1.14.0" in core
    assert {"openai", "google", "daily", "bots"} <= set(meta.get_all("Provides-Extra") or [])
    with tarfile.open(sdist) as archive:
        inside = {name.split("/", 1)[1] for name in archive.getnames() if "/" in name}
    assert {"pyproject.toml", "README.md", *PACKAGE_DATA} <= inside


def test_the_wheel_installed_outside_the_repository_runs_its_command_migrations_and_console(
    built: tuple[Path, Path], tmp_path: Path
) -> None:
    _, wheel = built
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    python = venv / "bin" / "python"
    _run(
        sys.executable, "-m", "pip", "--python", python, "install", "--quiet", "--no-deps",
        "--no-index", "--no-cache-dir", wheel, cwd=tmp_path,
    )  # fmt: skip
    # The dependencies, offline: this venv's packages, after the fresh venv's own (the
    # package is the wheel's; this venv's editable install of it is a finder a path file
    # line does not run).
    site = Path(
        _run(
            python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))", cwd=tmp_path
        ).strip()
    )
    (site / "zz_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PIPECAT_ACTIONS"))}
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    work = tmp_path / "elsewhere"
    work.mkdir()

    where = _run(
        python, "-c", "import pipecat_actions; print(pipecat_actions.__file__)", cwd=work, env=env
    )
    assert Path(where.strip()).is_relative_to(site)

    command = venv / "bin" / "pipecat-actions"
    assert "policy" in _run(command, "--help", cwd=work, env=env)
    ledger = f"sqlite:///{work / 'ledger.db'}"
    _run(command, "db", "upgrade", "--ledger", ledger, cwd=work, env=env)
    status = _run(command, "db", "status", "--ledger", ledger, cwd=work, env=env)
    head = sorted((ROOT / "pipecat_actions/ledger/migrations/versions").glob("0*.py"))[-1]
    assert head.name[:4] in status

    policy = work / "policy.yaml"
    policy.write_text(
        "version: 1\ntools:\n  r:\n    kind: mutation\n    confirmation: {mode: approval}\n"
    )
    migrated = _run(command, "policy", "migrate", policy, cwd=work, env=env)
    assert "migrated from version 1" in migrated
    assert "OK" in _run(command, "policy", "check", policy, cwd=work, env=env)

    console = textwrap.dedent(
        f"""
        import asyncio, httpx
        from pipecat_actions.console import ConsoleSettings, create_app
        from pipecat_actions.console.users import Credentials
        from pipecat_actions.ledger import SqlLedger

        async def main():
            ledger = await SqlLedger.create({ledger!r})
            users = Credentials({str(work / "users")!r})
            users.add("rosa", "a long enough password", ["manager"], ["default"])
            app = create_app(ConsoleSettings(users=users), ledger, ledger_name="here")
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://c") as client:
                page = await client.get("/login")
                static = [r for r in app.routes if getattr(r, "name", "") == "static"]
                print(page.status_code, "<form" in page.text, len(static))
            await ledger.close()

        asyncio.run(main())
        """
    )
    assert _run(python, "-c", console, cwd=work, env=env).split() == ["200", "True", "1"]
