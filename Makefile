# README.md's commands: `make demo` (the main job), `make unit` (lint, unit tests), `make test` (what CI runs),
# `make docs` (the site).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test unit lint docs install-llama-cpp install-local install-dev install-chat-ui install-docs \
	install-open-webui test-open-webui

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# llama-cpp-python, pinned and built from source for a portable instruction set rather than for this CPU
# (GGML_NATIVE): the x86-64-v3 set (AVX2, FMA, F16C, BMI2) on x86_64, llama.cpp's generic build elsewhere. A native
# build crashes on Intel AMX hosts (the AMX kernels llama.cpp then selects segfault on this model's Q4_K weights) and
# gives different greedy replies on different CPUs; the portable build gives the same replies on every host
# (tests/integration/test_golden_replies.py). `make LLAMA_NATIVE=1 ...` builds for this CPU instead, for speed.
# The wheel is built with pip's cache off (the cache does not key on CMAKE_ARGS, so a cached wheel of another build
# would come back) into $(LLAMA_WHEELS), where tests/integration/test_wheel.py finds it for its fresh environment.
LLAMA_CPP_PYTHON ?= 0.3.36
LLAMA_NATIVE ?= 0
LLAMA_WHEELS := .cache/llama-cpp-python
ifeq ($(LLAMA_NATIVE),1)
LLAMA_BUILD := native
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=ON
else ifeq ($(shell uname -m),x86_64)
LLAMA_BUILD := x86-64-v3
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF -DGGML_SSE42=ON -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DGGML_BMI2=ON
else
LLAMA_BUILD := generic
LLAMA_CMAKE_ARGS := -DGGML_NATIVE=OFF
endif
LLAMA_STAMP := $(VENV)/.llama-cpp-python-$(LLAMA_CPP_PYTHON)-$(LLAMA_BUILD)

$(LLAMA_STAMP): | $(BIN)/python
	rm -rf $(LLAMA_WHEELS) $(VENV)/.llama-cpp-python-*
	CMAKE_ARGS="$(LLAMA_CMAKE_ARGS)" $(BIN)/pip wheel --quiet --no-cache-dir --no-deps -w $(LLAMA_WHEELS) \
		"llama-cpp-python==$(LLAMA_CPP_PYTHON)"
	$(BIN)/pip install --quiet --no-cache-dir --force-reinstall --no-deps $(LLAMA_WHEELS)/llama_cpp_python-*.whl
	$(BIN)/pip install --quiet $(LLAMA_WHEELS)/llama_cpp_python-*.whl  # its dependencies
	touch $@

install-llama-cpp: $(LLAMA_STAMP)

# Each install step leaves a stamp in $(VENV), so a second `make unit` or `make test` installs nothing unless
# pyproject.toml (or the chat UI's constraints) changed.
LOCAL_STAMP := $(VENV)/.installed-local
DEV_STAMP := $(VENV)/.installed-dev
CHAT_UI_STAMP := $(VENV)/.installed-chat-ui
DOCS_STAMP := $(VENV)/.installed-docs
SHARED_SQUAD := ../shared/data/squad2-dev-subset/squad2_dev_subset.json

$(LOCAL_STAMP): pyproject.toml $(LLAMA_STAMP)
	$(BIN)/pip install --quiet -e ".[local]"
	touch $@

install-local: $(LOCAL_STAMP)

# torch first, pinned to a version (2.13.0), not to a build: pip takes whichever 2.13.0 wheel its indexes offer (from
# PyPI on Linux, the CUDA build with ~2 GB of NVIDIA wheels; where a CPU wheel is on pip's find-links or extra index,
# that one). Without the pin, the `dense` extra would pull the newest torch.
$(DEV_STAMP): pyproject.toml $(LLAMA_STAMP)
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[local,dev,dense,elasticsearch,ollama,serve]"
	touch $@

install-dev: $(DEV_STAMP)

# Index a SQuAD 2.0 file and answer a handful of its questions with cascade on the embedded model, in the demo's own
# store. The file: `make demo DATASET=PATH` (a path or URL of a SQuAD JSON file), else ../shared's SQuAD 2.0 dev subset
# where it is there, else $$HAYSTACK_FUSION_SQUAD, else the official SQuAD 2.0 dev set, downloaded once into
# ~/.cache/haystack_fusion.
DATASET ?= $(wildcard $(SHARED_SQUAD))
demo: install-local
	$(BIN)/haystack-fusion demo --strategy cascade --questions 6 $(if $(DATASET),--dataset "$(DATASET)")

# The chat UI test (tests/integration/test_chat_ui.py): Debian's Chromium, driven headless by Playwright's Python driver
# (the `dev` extra; no browser download), and Hayhooks' Chainlit UI pinned by constraints/chainlit.txt, without which
# pip's resolver backtracks for 10+ minutes. apt-get runs only as root and only when a package is missing.
$(CHAT_UI_STAMP): pyproject.toml constraints/chainlit.txt $(DEV_STAMP)
	@dpkg -s chromium fonts-liberation fonts-noto-color-emoji >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		chromium fonts-liberation fonts-noto-color-emoji; }
	$(BIN)/pip install --quiet -c constraints/chainlit.txt -e ".[chainlit]"
	touch $@

install-chat-ui: $(CHAT_UI_STAMP)

# The Open WebUI test (tests/integration/test_open_webui.py): the real Open WebUI, pinned, in an environment of its own
# (its dependencies clash with the project's), driven in Debian's Chromium. torch first, pinned as for install-dev, so
# pip takes a CPU wheel where one is on its find-links instead of the CUDA build. `make test` installs it (about 2-3
# minutes, 2.9 GB) and runs the test with the rest; `make test-open-webui` runs it alone.
OPEN_WEBUI ?= 0.12.4
OPEN_WEBUI_VENV := .venv-open-webui
OPEN_WEBUI_STAMP := $(OPEN_WEBUI_VENV)/.installed-open-webui-$(OPEN_WEBUI)

$(OPEN_WEBUI_STAMP):
	@dpkg -s chromium fonts-liberation fonts-noto-color-emoji >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		chromium fonts-liberation fonts-noto-color-emoji; }
	$(PYTHON) -m venv $(OPEN_WEBUI_VENV)
	$(OPEN_WEBUI_VENV)/bin/pip install --quiet "torch==2.13.0"
	$(OPEN_WEBUI_VENV)/bin/pip install --quiet "open-webui==$(OPEN_WEBUI)"
	touch $@

install-open-webui: $(OPEN_WEBUI_STAMP)

test-open-webui: install-dev install-open-webui
	$(BIN)/pytest tests/integration/test_open_webui.py -v

$(DOCS_STAMP): pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet -e ".[docs]"
	touch $@

install-docs: $(DOCS_STAMP)

# The documentation site (mkdocs.yml): the guides and the API reference from the docstrings (mkdocstrings reads the
# source rather than importing it, so no extra is needed), built into site/. --strict: a broken link or a docstring
# griffe cannot read fails the build. NO_MKDOCS_2_WARNING silences Material's banner about its end of life.
docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy haystack_fusion
	$(BIN)/lint-imports

# The contributors' loop: lint, then the unit tests (no model, no server, no browser).
unit: lint
	$(BIN)/pytest tests/unit

# Everything CI runs: lint, the documentation site, then the unit tests and the integration tests (embedded model,
# local servers, Chromium with the chat UI and Open WebUI, the wheel in a fresh environment, the SQuAD 2.0 subset in
# ../shared).
test: lint install-chat-ui install-open-webui docs
	$(BIN)/pytest
