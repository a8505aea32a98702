# One entry point for people and CI. `make demo` and `make test` do all set-up on a fresh machine.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_STAMP := $(VENV)/.installed-demo
TEST_STAMP := $(VENV)/.installed-test
BENCH_STAMP := $(VENV)/.installed-bench

NODE_STAMP := tests/node/node_modules/.installed

.PHONY: demo test test-fast lint typecheck pytest bench browser-deps node-deps postgres-up clean events-doc

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

$(DEMO_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e .
	touch $@

$(TEST_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test]'
	touch $@ $(DEMO_STAMP)

$(BENCH_STAMP): pyproject.toml | $(PY)
	$(PY) -m pip install -q -e '.[test,bench]'
	touch $@ $(TEST_STAMP) $(DEMO_STAMP)

demo: $(DEMO_STAMP)
	$(VENV)/bin/thoughtgate demo

## Debian chromium for the browser tests (Playwright drives it via its executable path).
browser-deps:
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing Debian chromium for the browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	  || echo "WARNING: could not install chromium; browser tests will fail and say why"; }

## The real JavaScript clients the tests drive (AG-UI's @ag-ui/client, the MCP TypeScript SDK),
## pinned by tests/node/package-lock.json.
node-deps: $(NODE_STAMP)

$(NODE_STAMP): tests/node/package.json tests/node/package-lock.json
	@command -v npm >/dev/null 2>&1 || { echo "npm is missing: install Node.js 18+ (Debian: apt-get install nodejs npm)"; exit 1; }
	cd tests/node && npm ci --no-audit --no-fund --loglevel=error
	touch $@

postgres-up:
	@pg_isready -q -h 127.0.0.1 -p 5432 2>/dev/null || { \
	  echo "starting PostgreSQL"; \
	  pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start || true; \
	  for i in 1 2 3 4 5 6 7 8 9 10; do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done; }

lint: $(TEST_STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench
	$(VENV)/bin/lint-imports

## docs/events.md from the event vocabulary (a test fails when it is stale)
events-doc: $(DEMO_STAMP)
	$(PY) -m thoughtgate.events.catalogue docs/events.md

typecheck: $(TEST_STAMP)
	$(VENV)/bin/mypy

## Two pytest-xdist workers: a serial run uses about one core for two thirds of its time and waits
## (on subprocesses, PostgreSQL, chromium, a lease to expire) the rest, so a 2-core machine runs
## two test files at once.
## `--dist loadfile` keeps each file, and its module-scoped daemons and browser, on one worker;
## PostgreSQL tests are isolated (a schema, a NOTIFY channel and application_name per test).
## `make test PYTEST_WORKERS=0` runs serially, in one process.
PYTEST_WORKERS ?= 2
PYTEST := $(VENV)/bin/pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile

pytest: $(TEST_STAMP) browser-deps node-deps postgres-up
	$(PYTEST)

test: lint typecheck pytest

## The unit and inprocess tiers only (pyproject.toml, "markers"): no subprocess, no PostgreSQL, no
## browser or node; what to run while working. `make test` runs every tier.
test-fast: $(TEST_STAMP)
	$(PYTEST) -m "unit or inprocess"

bench: $(BENCH_STAMP) postgres-up
	$(PY) -m bench.run

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache tests/node/node_modules
