# Everything runs in .venv; torch is installed first (CPU build 2.13.0 from local disk here),
# so pip never resolves a plain `torch` to a multi-GB CUDA build.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-fast style demo bench search kvpress-setup kvpress-table

setup: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet torch==2.13.0
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

search: $(STAMP)
	$(PY) -m tuner.search --task qa --data-dir ../shared/data/longbench --openqa-dir ../shared/data/open-qa

# kvpress 0.5.5 pins transformers<5.3, so it gets its own venv (torch first, as above); only
# benchmarks/kvpress_table.py uses it (as a subprocess), and CI never builds it.
KVPRESS_VENV := .venv-kvpress
KVPRESS_STAMP := $(KVPRESS_VENV)/.installed

kvpress-setup: $(KVPRESS_STAMP)

$(KVPRESS_STAMP):
	$(PYTHON) -m venv $(KVPRESS_VENV)
	$(KVPRESS_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(KVPRESS_VENV)/bin/python -m pip install --quiet torch==2.13.0
	$(KVPRESS_VENV)/bin/python -m pip install --quiet kvpress==0.5.5
	touch $(KVPRESS_STAMP)

kvpress-table: $(STAMP) $(KVPRESS_STAMP)
	$(PY) benchmarks/kvpress_table.py --openqa-dir ../shared/data/open-qa
