# Two entry points for a fresh clone: `make demo` and `make test`. Each sets itself up.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DATA ?= ../shared/data

.PHONY: setup demo test test-fast lint clean

$(VENV)/.installed: pyproject.toml
	python3.11 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -e '.[dev]'
	$(PIP) install -q --no-deps dflash==0.1.0  # test-only oracle; its pinned deps conflict
	touch $@

setup: $(VENV)/.installed

demo: setup
	$(PY) examples/demo.py --prompts $(DATA)/spec_bench_questions.jsonl

# The Triton-interpreter kernel tests run in a process of their own: TRITON_INTERPRET must be set
# before triton specialises the kernels, and nothing else in that process may have touched triton.
test: setup
	$(PY) -m pytest -ra tests/kernels
	$(PY) -m pytest -ra --durations=30 -m "slow or not slow" --ignore=tests/kernels

test-fast: setup
	$(PY) -m pytest -ra tests/kernels
	$(PY) -m pytest -ra --ignore=tests/kernels

lint: setup
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV)
