# Every target builds .venv itself when it is missing, so each works from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv test lint demo demo-serve serve bench clean

venv: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q -c constraints.txt torch==2.13.0
	$(PIP) install -q -c constraints.txt -e '.[service,postgres,dev]'
	touch $(STAMP)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: venv lint
	$(VENV)/bin/pytest -q

demo: venv
	$(PY) -m examples.demo

demo-serve: venv
	$(PY) -m examples.demo --keep-serving

serve: venv
	$(VENV)/bin/fxtune serve

bench: venv
	$(PY) -m bench.passes_report
	$(PY) -m bench.run
	$(PY) -m bench.overlap
	$(PY) -m bench.gloo_async
	$(PY) -m bench.train --threads 1

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
