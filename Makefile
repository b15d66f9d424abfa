# The two commands of the README. Each sets up .venv when it is missing or out of date.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
HOST ?= 127.0.0.1
PORT ?= 8000
export LITELLM_LOCAL_MODEL_COST_MAP := True

AXE := tests/e2e/node_modules/axe-core/axe.min.js

.PHONY: run test lint bench clean browser

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The whole platform on one machine: a development mailbox (var/mail), the follow-up dispatcher
# and the API with the participant pages; Ctrl-C stops all three.
run: $(STAMP)
	$(BIN)/afterward demo
	$(BIN)/afterward mailbox --port 1025 & mailbox=$$!; \
	$(BIN)/afterward scheduler & scheduler=$$!; \
	trap 'kill $$mailbox $$scheduler 2>/dev/null' EXIT INT TERM; \
	$(BIN)/afterward api --host $(HOST) --port $(PORT)

# The browser tests use Debian's Chromium (installed here when missing) and axe-core from npm.
$(AXE): tests/e2e/package.json tests/e2e/package-lock.json
	npm ci --prefix tests/e2e --no-audit --no-fund --silent
	touch $(AXE)

browser:
	@command -v chromium >/dev/null 2>&1 || { echo "installing Debian's chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) $(AXE) browser
	AFTERWARD_REQUIRE_BROWSER=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) var/*.db var/*.db-* .pytest_cache .mypy_cache .ruff_cache tests/e2e/node_modules tests/e2e/artifacts
