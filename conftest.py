"""The README's code blocks run as tests (pytest-markdown-docs); this is what they run with.

``--markdown-docs`` (in pyproject's ``addopts``) collects README.md's ``python`` blocks, each a
test; the collector it would also add for every Python file (their docstrings) is dropped
here, so only the README is read. README.md's conventions (see its "Code blocks" section):

* every block runs from the repository's root, with ``$PIPECAT_ACTIONS_LEDGER_URL`` set to a
  SQLite file of its own, so a default ledger never lands in ``.pipecat_actions/``;
* a block marked ``fixture:NAME`` gets NAME from the fixtures below: ``runtime``, ``session``
  and the offline stand-ins for the services a deployment brings (``llm``, ``stt``, ``tts``,
  ``transport``, ``user_params``, ``messages``);
* loguru sinks a block adds are removed after it.

The YAML, JSON and shell blocks are checked by ``tests/test_readme.py``.
"""

from __future__ import annotations

import warnings
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger
from pytest_markdown_docs.plugin import MarkdownDocstringCodeModule

ROOT = Path(__file__).resolve().parent


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Any:
    """Keep what pytest collects from a file, less the docstring tests ``--markdown-docs`` adds."""
    collected = yield
    return [c for c in collected if not isinstance(c, MarkdownDocstringCodeModule)]


def _in_readme(request: pytest.FixtureRequest) -> bool:
    return request.node.path == ROOT / "README.md"


@pytest.fixture(autouse=True)
def _readme_block(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Where a README block runs: the repository's root, a ledger of its own."""
    if not _in_readme(request):
        yield
        return
    monkeypatch.chdir(ROOT)
    # README's import paths of the adapters moved under pipecat_actions.adapters; they keep
    # working for a release (forwarders that warn), and the README may still show them.
    warnings.filterwarnings(
        "ignore",
        message=r"pipecat_actions\.(binding|processors|realtime|flows|pipeline)\b.* deprecated",
        category=DeprecationWarning,
    )
    monkeypatch.setenv("PIPECAT_ACTIONS_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    sinks = set(logger._core.handlers)  # type: ignore[attr-defined]
    yield
    for sink in set(logger._core.handlers) - sinks:  # type: ignore[attr-defined]
        logger.remove(sink)


@pytest.fixture
async def runtime(tmp_path: Path) -> AsyncIterator[Any]:
    """The restaurant's runtime: configs/restaurant.yaml, its actions on the fake provider."""
    from pipecat_actions import ActionRuntime, AllowAll
    from pipecat_actions.testing.restaurant import build_actions, new_system_of_record

    opened = await ActionRuntime.create(
        ROOT / "configs" / "restaurant.yaml",
        authorizer=AllowAll(),
        actions=build_actions(new_system_of_record()),
        ledger_url=f"sqlite:///{tmp_path / 'runtime.db'}",
    )
    yield opened
    await opened.close()


@pytest.fixture
def session() -> Any:
    """The conversation: ``call-1``, on behalf of ``alice``."""
    from pipecat_actions import SessionState

    return SessionState(session_id="call-1", principal="alice")


@pytest.fixture
def llm() -> Any:
    """The LLM service: the testing kit's `ScriptedLLM` (yours: OpenAI's, Gemini's, ...)."""
    from pipecat_actions.testing import ScriptedLLM

    return ScriptedLLM([])


@pytest.fixture
def stt() -> Any:
    """No speech-to-text offline: the fake transport delivers transcripts itself."""
    return None


@pytest.fixture
def tts() -> Any:
    """The TTS service: the testing kit's `FakeTTS` (silent audio)."""
    from pipecat_actions.testing import FakeTTS

    return FakeTTS()


@pytest.fixture
def transport() -> Any:
    """The transport: the testing kit's `FakeTransport` (yours: Daily, WebRTC, ...)."""
    from pipecat_actions.testing import FakeTransport

    return FakeTransport()


@pytest.fixture
def user_params() -> Any:
    """The user aggregator's parameters, for the fake transport's turns."""
    from pipecat_actions.testing import offline_user_params

    return offline_user_params()


@pytest.fixture
def messages() -> list[dict[str, str]]:
    """The conversation's first messages."""
    return [{"role": "system", "content": "You book tables at the trattoria."}]
