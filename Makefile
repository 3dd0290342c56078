# Every target creates .venv first if it is missing, so a fresh clone needs nothing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest bench demo clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev]"
	touch $(STAMP)

install: $(STAMP)

SOURCES := $(wildcard pipecat_actions tests bench bots)

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/python -m pytest $(PYTEST_ARGS)

test: lint typecheck pytest

demo: $(STAMP)
	$(BIN)/python -m bots.demo

.PHONY: bot
bot: $(STAMP)
	$(BIN)/python bots/daily_bot.py -t daily

bench: $(STAMP)
	$(BIN)/python bench/ledger.py

clean:
	rm -rf $(VENV) .pipecat_actions .mypy_cache .ruff_cache .pytest_cache
