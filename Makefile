# Every target creates .venv first if it is missing, so a fresh clone needs nothing by hand.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test test-stress test-durable-kills lint imports typecheck pytest bench demo docs clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet -e ".[dev,docs]"
	touch $(STAMP)

install: $(STAMP)

SOURCES := $(wildcard pipecat_actions tests bench bots examples conftest.py)

lint: $(STAMP)
	$(BIN)/ruff check $(SOURCES)
	$(BIN)/ruff format --check $(SOURCES)
	PYTHONPATH=. $(BIN)/lint-imports

# The layer rules ([tool.importlinter] in pyproject.toml) alone; `lint` runs them too.
imports: $(STAMP)
	PYTHONPATH=. $(BIN)/lint-imports

typecheck: $(STAMP)
	$(BIN)/mypy

# The console's browser tests drive Debian's chromium (Playwright never downloads a browser
# here). Installed when it is missing and this machine can (root with apt-get, as in CI);
# otherwise one line says what is missing, and those tests fail saying it again
# (PIPECAT_ACTIONS_SKIP_BROWSER=1 skips them).
.PHONY: browser
browser:
	@command -v chromium >/dev/null 2>&1 || [ -n "$$PIPECAT_ACTIONS_SKIP_BROWSER" ] || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium for the console's browser tests"; \
	    export DEBIAN_FRONTEND=noninteractive; \
	    apt-get install -y -q chromium >/dev/null 2>&1 || \
	      { apt-get update -q >/dev/null && apt-get install -y -q chromium >/dev/null; } || \
	      echo "could not install chromium: the console's browser tests will fail"; \
	  else \
	    echo "missing: Debian's chromium for the console's browser tests (sudo apt-get install chromium)"; \
	  fi; }

# Two workers (pytest-xdist) on the two cores; each has a PostgreSQL database of its own.
# PYTEST_WORKERS=0 runs the suite in one process.
PYTEST_WORKERS ?= 2
pytest: $(STAMP) browser
	$(BIN)/python -m pytest -n $(PYTEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

test: lint typecheck docs pytest

# The documentation site (mkdocs.yml, docs/): MkDocs with Material, the API reference from the
# docstrings (mkdocstrings). --strict: a warning (a broken link, a missing page or example
# file, a docstring mkdocstrings cannot read) fails the build. The site is written to site/.
docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --quiet

# The suite (or what STRESS_ARGS names) run again and again while CPU burners, started and
# killed by PID, keep every core busy: how a test proves it is not flaky before it is committed.
#   make test-stress                                  the whole suite, 3 rounds
#   make test-stress STRESS_ARGS="--rounds 20 -- tests/runtime/test_cancel.py"
STRESS_ARGS ?= --rounds 3
test-stress: $(STAMP)
	$(BIN)/python -m tests.stress $(STRESS_ARGS)

# Issue 33's full kill test: 3 DBOS workers, 200 durable operations, 20 SIGKILLs at points of
# a step drawn at random (make test runs the same test at 60:6, each point once). A minute or
# more. DURABLE_KILLS=OPERATIONS:KILLS changes the scale, DURABLE_KILL_SEED=N replays a run.
DURABLE_KILLS ?= 200:20
test-durable-kills: $(STAMP)
	PIPECAT_ACTIONS_DURABLE_KILLS=$(DURABLE_KILLS) \
	  PIPECAT_ACTIONS_DURABLE_KILL_SEED=$(DURABLE_KILL_SEED) \
	  $(BIN)/python -m pytest -p no:randomly -q tests/durable/test_kills.py

# make demo REALTIME=openai (or gemini): the story on a real speech-to-speech service against
# a fake provider on 127.0.0.1, offline. make demo FLOW=1: the reservation as a Pipecat Flows
# conversation (configs/flows/restaurant.yaml), offline. make demo DURABLE=1: the booking and the
# refund run by a DBOS worker process on the machine's PostgreSQL ($PIPECAT_ACTIONS_PG_ADMIN_URL,
# default postgresql://postgres@127.0.0.1:5432/postgres), in a database the demo makes and drops.
demo: $(STAMP)
	$(if $(word 2,$(FLOW) $(REALTIME) $(DURABLE)),$(error FLOW=1, REALTIME=... and DURABLE=1 are separate demos; give one))
	$(if $(REALTIME),$(BIN)/python -m bots.realtime_demo $(REALTIME),$(if $(FLOW),$(BIN)/python -m bots.flow_demo,$(if $(DURABLE),$(BIN)/python -m bots.durable_demo,$(BIN)/python -m bots.demo)))

# make bot FLOW=1: the Daily bot runs the Pipecat Flows reservation (cascade only).
.PHONY: bot
bot: $(STAMP)
	FLOW=$(FLOW) REALTIME=$(REALTIME) $(BIN)/python bots/daily_bot.py -t daily

# The work of one propose against its floor, counted (statements, tasks, WAL frames, fsyncs,
# CPU instructions under valgrind), stats at BENCH_ROWS operations (default 100,000;
# BENCH_ROWS=1000000 for issue 34's figure), then the latency ratios of bench/postgres.py and
# bench/ledger.py. BENCH_ARGS passes more options to bench/work.py (--help lists them).
# Then the query plan of each query that reads a kept index of pa_operations (bench/index_plans.py).
# BENCH_MANY=1 adds rows of bench/many_processes.py to the table (sessions over 4 and 8 processes
# on one PostgreSQL ledger against bare handlers, a few minutes; BENCH_MANY_SESSIONS=1000 for
# issue 34's figure, default 200). BENCH_SCALE_ROWS=10000000 adds rows of bench/ten_million.py
# (a PostgreSQL ledger of that many operations beside the same one empty: about 15 GB of disk
# and 15 minutes at 10M, the database dropped after).
# agent-ledger (the `bench` extra) is installed for the comparison; without it that row says so.
BENCH_STAMP := $(VENV)/.bench-installed
$(BENCH_STAMP): pyproject.toml | $(STAMP)
	$(BIN)/python -m pip install --quiet -e ".[bench]" && touch $(BENCH_STAMP) || \
	  echo "could not install the bench extra: the agent-ledger rows will say not measured"

bench: $(STAMP) $(BENCH_STAMP)
	$(BIN)/python bench/work.py $(if $(BENCH_ROWS),--rows $(BENCH_ROWS)) \
	  $(if $(BENCH_MANY),--many $(or $(BENCH_MANY_SESSIONS),200)) \
	  $(if $(BENCH_SCALE_ROWS),--scale-rows $(BENCH_SCALE_ROWS)) $(BENCH_ARGS)
	$(BIN)/python bench/index_plans.py

clean:
	rm -rf $(VENV) .pipecat_actions .mypy_cache .ruff_cache .pytest_cache site
