"""The documentation's code blocks run as tests (pytest-markdown-docs); this is where they run.

``--markdown-docs`` (in pyproject's ``addopts``) collects the ``python`` blocks of README.md and
of docs/ (in ``testpaths``), each a test. Each block is a complete program: it is given
nothing, and runs as it would when pasted into a file (``tests/test_doc_blocks.py`` checks
that none uses top-level ``await`` or a fixture). Here:

* every block runs from the repository's root, with ``$PIPECAT_ACTIONS_LEDGER_URL`` set to a
  SQLite file of its own, so a default ledger never lands in ``.pipecat_actions/``;
* loguru sinks a block adds are removed after it;
* a block that only includes an example file (``--8<-- "examples/..."``, mkdocs' snippets) is
  not collected: the example is run by its own test (tests/examples), and
  ``tests/test_doc_blocks.py`` checks that it is;
* the collector ``--markdown-docs`` would also add for every Python file (their docstrings)
  is dropped, so only the Markdown pages are read.

The YAML, JSON and shell blocks are checked by ``tests/test_doc_blocks.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from loguru import logger
from pytest_markdown_docs.plugin import MarkdownDocstringCodeModule, MarkdownInlinePythonItem

ROOT = Path(__file__).resolve().parent
_INCLUDE = re.compile(r'^\s*--8<-- "[^"]+"\s*$')


def _only_includes(item: MarkdownInlinePythonItem) -> bool:
    lines = [line for line in item.code.splitlines() if line.strip()]
    return bool(lines) and all(_INCLUDE.match(line) for line in lines)


@pytest.hookimpl(wrapper=True)
def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> Any:
    """Keep what pytest collects from a file, less the docstring tests ``--markdown-docs`` adds."""
    collected = yield
    return [c for c in collected if not isinstance(c, MarkdownDocstringCodeModule)]


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Drop the blocks that only include an example file (its own test runs it)."""
    items[:] = [
        i for i in items if not (isinstance(i, MarkdownInlinePythonItem) and _only_includes(i))
    ]


def _in_docs(request: pytest.FixtureRequest) -> bool:
    return request.node.path.suffix == ".md"


@pytest.fixture(autouse=True)
def _doc_block(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[None]:
    """Where a documentation block runs: the repository's root, a ledger of its own."""
    if not _in_docs(request):
        yield
        return
    monkeypatch.chdir(ROOT)
    monkeypatch.setenv("PIPECAT_ACTIONS_LEDGER_URL", f"sqlite:///{tmp_path / 'ledger.db'}")
    sinks = set(logger._core.handlers)  # type: ignore[attr-defined]
    yield
    for sink in set(logger._core.handlers) - sinks:  # type: ignore[attr-defined]
        logger.remove(sink)
