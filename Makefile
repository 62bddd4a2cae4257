# Everything runs in .venv. torch is installed first, pinned to its CPU build (torch==2.13.0+cpu from
# PyTorch's CPU index, or from a local wheel where pip's configuration finds one), so pip never
# resolves a plain `torch` to the multi-GB CUDA build; the project install then keeps it.
# A CUDA user: make setup TORCH_BUILD=cu128 (any build download.pytorch.org/whl/<build> has for 2.13.0).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
TORCH_VERSION := 2.13.0
TORCH_BUILD ?= cpu
TORCH_INDEX ?= https://download.pytorch.org/whl/$(TORCH_BUILD)
# --no-deps: only torch itself is looked up on PyTorch's index (its dependencies come with the project);
# --retries 1: offline, the unreachable index costs a second, not minutes
TORCH_INSTALL = -m pip install --quiet --no-deps --retries 1 --extra-index-url $(TORCH_INDEX) torch==$(TORCH_VERSION)+$(TORCH_BUILD)

.PHONY: setup test test-fast style demo bench search kvpress-setup kvpress-table

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) $(TORCH_INSTALL)
	$(PY) -m pip install --quiet -e ".[dev,postgres]"
	touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest

test-fast: $(STAMP)
	$(PY) -m pytest -m "not integration"

style: $(STAMP)
	$(PY) -m ruff check lazyllm tuner tests benchmarks examples
	$(PY) -m ruff format --check lazyllm tuner tests benchmarks examples
	$(PY) -m mypy

demo: $(STAMP)
	$(PY) -m lazyllm.demo

bench: $(STAMP)
	$(PY) benchmarks/prefill_speed.py
	$(PY) benchmarks/generation_speed.py

# the README's quickstart: LongBench QA and the fresh-prompt pool packaged with the project, no data flag
search: $(STAMP)
	$(PY) -m tuner.search --task qa

# kvpress 0.5.5 pins transformers<5.3, so it gets its own venv (torch first, as above); only
# benchmarks/kvpress_table.py uses it (as a subprocess), and CI never builds it.
KVPRESS_VENV := .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.installed

kvpress-setup: $(KVPRESS_STAMP)

$(KVPRESS_STAMP):
	$(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KVPRESS_VENV)/bin/python $(TORCH_INSTALL)
	$(KVPRESS_VENV)/bin/python -m pip install --quiet kvpress==0.5.5
	touch $(KVPRESS_STAMP)

kvpress-table: $(STAMP) $(KVPRESS_STAMP)
	$(PY) benchmarks/kvpress_table.py --openqa-dir ../shared/data/open-qa
