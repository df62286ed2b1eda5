# Two commands on a fresh machine: `make demo` (the main job) and `make test` (the suite).
# Each creates .venv in the repo root and installs what it needs; a second run with nothing
# changed skips the installs (stamp files inside .venv track pyproject.toml and the torch mode).
#
# TORCH picks the torch the venv uses:
#   TORCH=torch==2.13.0 (default)  pip installs that build into .venv (the CPU build CI uses)
#   TORCH=system                   the venv sees this Python's own packages (--system-site-packages)
#                                  and keeps its torch, e.g. the CUDA build a GPU machine came with;
#                                  works offline: no pip upgrade, no isolated build, and when pip
#                                  cannot build at all, src/ is linked into the venv instead.
# Switching TORCH needs `make clean` first (the venv's kind is fixed when it is created).
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    ?= $(PY) -m pip
TORCH  ?= torch==2.13.0
OUT    ?= out/bench
OD     ?= $(PY) -m overdrive
ARGS   ?= --help

ifeq ($(TORCH),system)
MODE       := system
VENV_FLAGS := --system-site-packages
else
MODE       := pinned
VENV_FLAGS :=
endif
BASE := $(VENV)/.stamp-base-$(MODE)
DEV  := $(VENV)/.stamp-dev-$(MODE)

.PHONY: demo quick doctor run test test-all test-fast gpu-check clean browser

$(PY):
	$(PYTHON) -m venv $(VENV_FLAGS) $(VENV)
	@# an old pip cannot do editable installs from pyproject.toml; offline the upgrade fails fast and we go on
	$(PIP) install -q --upgrade --timeout 5 --retries 0 pip || echo "make: pip not upgraded (offline?); keeping $$($(PIP) --version | cut -d' ' -f1-2)"

$(BASE): pyproject.toml | $(PY)
ifeq ($(MODE),system)
	@grep -q "include-system-site-packages = true" $(VENV)/pyvenv.cfg || { echo "make: $(VENV) was created without the system's packages: run 'make clean' first"; exit 2; }
	@$(PY) -c "import torch; print('make: keeping the system torch', torch.__version__, '(CUDA', str(torch.version.cuda) + ')')" || { echo "make: TORCH=system, but $(PYTHON) has no torch: install your build there, or use the default"; exit 2; }
	$(PIP) install -q --no-build-isolation -e . || $(PY) scripts/link_src.py
else
	@! grep -q "include-system-site-packages = true" $(VENV)/pyvenv.cfg || { echo "make: $(VENV) sees the system's packages (made with TORCH=system): run 'make clean' first"; exit 2; }
	$(PY) -c "import torch" 2>/dev/null || $(PIP) install -q "$(TORCH)"
	$(PIP) install -q -e .
endif
	touch $@

$(DEV): pyproject.toml $(BASE)
ifeq ($(MODE),system)
	$(PIP) install -q --no-build-isolation -e ".[dev,hf,torchao,export,triton]" || $(PY) -c "import pytest" || { echo "make: no pytest here and pip cannot install it (offline?)"; exit 2; }
else
	$(PIP) install -q -e ".[dev,hf,torchao,export,liger,trackers,triton]"
	@# the emit targets: lightning (and tyro) from the stacks extra; torchtitan without its dataset/tokenizer deps
	$(PIP) install -q -e ".[stacks]" && $(PIP) install -q --no-deps "torchtitan==0.2.2" || \
	  echo "make: the stacks extra did not install: the emit loader tests for Lightning/torchtitan will skip"
endif
	touch $@

demo: $(BASE)                 ## the bench's default suite (CPU: ~3 min on 2 cores)
	$(OD) bench --out $(OUT)

quick: $(BASE)                ## the short bench suite
	$(OD) bench --quick --out $(OUT)-quick

doctor: $(BASE)               ## what this machine can run
	$(OD) doctor

run: $(BASE)                  ## any command: make run ARGS="plan --model llama3-8b --gpu h200"
	$(OD) $(ARGS)

# The browser tests (tests/browser) drive the system Chromium through Playwright. Where apt and root
# are at hand (CI) both are installed; anywhere else this says why once and those tests skip.
browser: $(DEV)               ## headless Chromium + Playwright for the browser tests (best effort)
	@command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1 || \
	  { if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	      (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >/dev/null 2>&1 || \
	        echo "make: apt-get install chromium failed: the browser tests will skip"; \
	    else echo "make: no Chromium and no apt/root to install it: the browser tests will skip"; fi; }
	@$(PY) -c "import playwright" 2>/dev/null || $(PIP) install -q -e ".[browser]" >/dev/null 2>&1 || \
	  echo "make: pip install playwright failed: the browser tests will skip"

# make test is what CI runs (.ci/run): every test except the long end-to-end runs marked `slow`, plus the
# browser checks of the reports. make test-all adds the slow runs (full training runs, 2-rank FSDP, tune
# end to end, the README walk): tens of minutes on 2 cores, longer on a CPU without bf16 units.
test: $(DEV) browser          ## the suite CI runs (~10 min on 2 cores, install included)
	$(PY) -m pytest -q tests -m "not slow or browser"

test-all: $(DEV) browser      ## everything, the slow end-to-end runs included
	$(PY) -m pytest -q tests

test-fast: $(DEV)             ## everything not marked slow
	$(PY) -m pytest -q tests -m "not slow"

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) out build *.egg-info src/*.egg-info
