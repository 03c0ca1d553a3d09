# The two set-up commands of README.md: `make demo` (the main job) and `make test` (what CI runs).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin

.PHONY: demo test lint install-local install-dev install-chat-ui

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

install-local: $(BIN)/python
	$(BIN)/pip install --quiet -e ".[local]"

# torch first, pinned to the CPU build (2.13.0+cpu) our machines hold on disk: left to the resolver, the `dense` extra
# would pull the newest torch and ~2 GB of CUDA wheels.
install-dev: $(BIN)/python
	$(BIN)/pip install --quiet "torch==2.13.0"
	$(BIN)/pip install --quiet -e ".[local,dev,dense,elasticsearch,ollama,serve]"

# Index the SQuAD 2.0 dev subset and answer a handful of its questions with concat_pf on the embedded model.
demo: install-local
	$(BIN)/haystack-fusion demo --strategy cascade --questions 6

# The chat UI test (tests/integration/test_chat_ui.py): Debian's Chromium, driven headless by Playwright's Python driver
# (the `dev` extra; no browser download), and Hayhooks' Chainlit UI pinned by constraints/chainlit.txt, without which
# pip's resolver backtracks for 10+ minutes. apt-get runs only as root and only when a package is missing.
install-chat-ui: install-dev
	@dpkg -s chromium fonts-liberation fonts-noto-color-emoji >/dev/null 2>&1 || [ "$$(id -u)" != 0 ] || \
		{ apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
		chromium fonts-liberation fonts-noto-color-emoji; }
	$(BIN)/pip install --quiet -c constraints/chainlit.txt -e ".[chainlit]"

lint: install-dev
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy haystack_fusion

# Lint, then unit tests (MockChatGenerator) and integration tests (embedded model, real SQuAD2 subset).
test: lint install-chat-ui
	$(BIN)/pytest
