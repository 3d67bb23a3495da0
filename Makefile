# swarmhub: the README's commands. `make demo` and `make test` set everything up on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# A CPU build of torch unless one is already installed: GPU users install their own torch into .venv first.
TORCH_SPEC ?= torch==2.13.0
CHROMIUM ?= /usr/bin/chromium

.PHONY: setup setup-python setup-web setup-browser setup-faketime demo server test test-fast check docs clean

setup: setup-python setup-web

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	@$(BIN)/python -c "import torch" 2>/dev/null || { echo "Installing $(TORCH_SPEC) (CPU build, about 200 MB: a minute or two)"; $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"; }
	@echo "Installing swarmhub from this folder (editable) with its server and test dependencies (about a minute)"
	@# -qq: pip still stops on errors; it hides setuptools' notice that an editable install maps the folders here.
	@$(BIN)/python -m pip install -qq -e ".[dev]"
	@touch $@

# The worker wheel the hub serves volunteers (server/http/worker_package.py), built once per version of the sources here
# rather than by the first server that starts.
setup-python: $(VENV)/.installed
	@$(BIN)/python -m swarmhub.server.http.worker_package

web/node_modules/.package-lock.json: web/package.json web/package-lock.json
	npm ci --prefix web --no-audit --no-fund --loglevel=error

setup-web: web/node_modules/.package-lock.json

# Browser tests drive Debian's Chromium through Playwright (Playwright's own browser download is not used).
setup-browser:
	@if [ ! -x "$(CHROMIUM)" ]; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "Chromium is missing: run 'sudo apt-get install chromium' (or set CHROMIUM=/path/to/chromium)"; exit 1; \
	  fi; \
	fi

# The lease test runs a replica whose clock runs ahead under libfaketime (Debian's faketime).
setup-faketime:
	@if ! command -v faketime >/dev/null; then \
	  if [ "$$(id -u)" = "0" ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq faketime >/dev/null; \
	  else \
	    echo "faketime is missing: run 'sudo apt-get install faketime'"; exit 1; \
	  fi; \
	fi

demo: setup
	$(BIN)/swarmhub demo

server: setup
	$(BIN)/swarmhub server

# Two lanes at once (tests/lanes.py): the tests that train real swarms to a pace one at a time, the rest beside them.
test: setup setup-browser setup-faketime
	SWARMHUB_CHROMIUM=$(CHROMIUM) $(BIN)/python -m tests.lanes $(PYTEST_ARGS)

test-fast: setup
	$(BIN)/python -m pytest -m "not e2e and not browser and not swarm"

# mypy cannot follow setuptools' package-dir mapping: it checks a tree of links laid out as installed.
check: setup
	$(BIN)/ruff check swarmhub server worker tests migrations bench
	$(BIN)/ruff format --check swarmhub server worker tests migrations bench
	rm -rf build/typecheck && mkdir -p build/typecheck/swarmhub
	cp swarmhub/__init__.py build/typecheck/swarmhub/
	ln -s "$(CURDIR)/swarmhub/common" build/typecheck/swarmhub/common
	for d in server worker web migrations; do ln -s "$(CURDIR)/$$d" build/typecheck/swarmhub/$$d; done
	cd build/typecheck && ../../$(BIN)/mypy --config-file ../../pyproject.toml -p swarmhub.common -p swarmhub.server -p swarmhub.worker
	$(BIN)/mypy --config-file pyproject.toml bench/*.py
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# The docs site (mkdocs.yml) on http://127.0.0.1:8000, rebuilt as the pages change.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve

clean:
	rm -rf $(VENV) web/node_modules .swarmhub-demo
