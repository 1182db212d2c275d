# One Makefile: CI calls the same targets a person runs.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
export HF_HUB_DISABLE_PROGRESS_BARS := 1

.PHONY: demo test peers chromium crash lint bench docs format clean

LINT_PATHS := $(wildcard src tests bench notebooks)

# torch first, pinned: pip takes the CPU build from this machine's disk; an
# unpinned torch (pulled by sentence-transformers) would be a CUDA build of several GB.
$(VENV)/.deps: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[all]'
	touch $@

$(VENV)/.dev: $(VENV)/.deps
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $@

demo: $(VENV)/.deps
	$(BIN)/statekeep demo

# The peer suites (LangGraph's store tests, the Agents SDK's session tests) come from the
# pinned source distributions on the package index, unpacked into .peers/ (git-ignored);
# tests/integrations/test_peer_suites.py runs them against the adapters on both backends.
peers: $(VENV)/.dev
	$(BIN)/python tests/integrations/peers/fetch.py .peers

# The console's browser tests drive Debian's chromium package through Playwright for Python
# (executable_path, never `playwright install`); installed here when it is not on PATH yet.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
chromium:
	@command -v chromium >/dev/null 2>&1 || { \
		$(SUDO) apt-get update -q && \
		DEBIAN_FRONTEND=noninteractive $(SUDO) apt-get install -y -q --no-install-recommends chromium; }

# The suite runs in TEST_WORKERS processes (pytest-xdist), a test file to a process: most
# tests wait on PostgreSQL, a subprocess or a killed worker, so one process left a core idle.
# Each worker starts its own PostgreSQL and temp folder. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= 2
test: $(VENV)/.dev peers chromium
	$(BIN)/python -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=20

# The long crash run (opt-in): every crash test with CRASH_SCALE times its kills; at the
# default 10 that is over 3,000 SIGKILLs (make test: about 380). Takes a while.
CRASH_SCALE ?= 10
crash: $(VENV)/.dev
	STATEKEEP_CRASH_SCALE=$(CRASH_SCALE) $(BIN)/python -m pytest -m crash tests/workflow

lint: $(VENV)/.dev
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

# The API reference is generated from docstrings; warnings are errors.
docs: $(VENV)/.dev
	$(BIN)/mkdocs build --strict --site-dir site

format: $(VENV)/.dev
	$(BIN)/ruff check --fix $(LINT_PATHS)
	$(BIN)/ruff format $(LINT_PATHS)

bench: $(VENV)/.dev
	$(BIN)/python -m bench

clean:
	rm -rf $(VENV) .statekeep .pytest_cache .mypy_cache .peers
