# The two commands of the README, and the checks CI runs. VENV can point elsewhere (CI uses a fresh one).
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test lint bench clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

setup: $(VENV)/.installed

demo: setup  ## start the local broker (unless KAFKA_BOOTSTRAP_SERVERS is set) and run the main demo
	$(VENV)/bin/controlmsg demo

test: setup  ## the whole test suite; starts its own broker unless KAFKA_BOOTSTRAP_SERVERS is set
	$(PY) -m pytest

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy

bench: setup
	$(PY) benchmarks/bench_protocol.py

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
