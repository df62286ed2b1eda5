# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv in the repo root and installs what it needs; a second run with nothing
# changed skips the installs (stamp files inside .venv track pyproject.toml).
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# The CPU build CI uses lies on local disk; on a GPU machine pass TORCH="torch" (or your CUDA
# build) to keep or install the torch you want. Skipped when a torch is already in the venv.
TORCH  ?= torch==2.13.0
OUT    ?= out/bench

.PHONY: demo test test-fast doctor gpu-check clean

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

$(VENV)/.stamp-base: pyproject.toml | $(PY)
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .
	touch $@

$(VENV)/.stamp-dev: pyproject.toml $(VENV)/.stamp-base
	$(PIP) install -q -e ".[dev,hf,torchao,export]"
	touch $@

demo: $(VENV)/.stamp-base
	$(VENV)/bin/overdrive bench --out $(OUT)

doctor: $(VENV)/.stamp-base
	$(VENV)/bin/overdrive doctor

test: $(VENV)/.stamp-dev
	$(PY) -m pytest -q tests

test-fast: $(VENV)/.stamp-dev
	$(PY) -m pytest -q tests -m "not slow"

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
