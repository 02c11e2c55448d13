# Every target builds .venv itself when it is missing, so each works from a fresh clone.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv test test-quick bytecode lint docs tables demo demo-serve serve bench bench-zoo gpu-check clean

venv: $(STAMP)

# Everything through uv, which installs and compiles in parallel: `make venv` takes 47-48 s on
# this project's 2 cores with an empty uv cache, 63-65 s with torch and the pip upgrade through
# pip (the same packages, paired runs). uv does not read pip's settings, so the folders
# PIP_FIND_LINKS names (a local CPU wheel of torch here) are passed on; without one, torch==2.13.0
# comes from the index, as it would through pip. pip itself is upgraded in the same step: the
# installed-wheel tests install through the venv's pip (16 s longer with Python 3.11's own).
$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q -c constraints.txt uv
	$(VENV)/bin/uv pip install -q --python $(PY) --compile-bytecode -c constraints.txt \
		$(foreach links,$(PIP_FIND_LINKS),--find-links $(links)) \
		--upgrade-package pip pip -e '.[service,postgres,dev]'
	touch $(STAMP)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# `make test` runs the whole suite, as CI does (.ci/run), in two runs: every test but the
# `serial` ones on the xdist workers (tests/conftest.py says how many), then the serial ones (a
# speed verdict or a tight time limit) in one process (-n 0), with nothing beside them, on the
# caches the first run warmed. Both runs go on when the other fails; a failure in either fails
# the target.
# `make test-quick` leaves out the tests marked `slow` (real third-party models, services and
# tuning runs end to end, the installed wheel): the loop to run while working.
PYTEST := $(VENV)/bin/pytest -q
test: venv lint bytecode docs
	status=0; \
	$(PYTEST) -m "not serial" || status=$$?; \
	$(PYTEST) -n 0 -m serial || status=$$?; \
	exit $$status

test-quick: venv lint bytecode docs
	status=0; \
	$(PYTEST) -m "not slow and not serial" || status=$$?; \
	$(PYTEST) -n 0 -m "serial and not slow" || status=$$?; \
	exit $$status

# The documentation site (mkdocs.yml), built offline with --strict: a broken link, a missing page
# or a generated page that no longer builds (the HTTP API from the app's OpenAPI document, the
# settings tables from the settings objects: docs/hooks/generate.py) fails `make test`.
docs: venv
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

# The README's and the docs' results tables and plot, from bench/out/ (one JSON per benchmark).
tables: venv
	$(PY) -m bench.tables

# Bytecode first: where PYTHONDONTWRITEBYTECODE=1 (CI containers set it) every Python the suite
# starts, a few hundred of them, would compile fxtune's modules from source again.
bytecode: venv
	$(PY) -m compileall -q -j 0 tuner service worker examples bench tests fxtune_cli.py

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
	$(PY) -m bench.zoo

# The model zoo alone (issue 19): 12 public architectures, `fxtune tune` at 60 s and 300 s each,
# then what it shipped against eager, torch.compile and AOTInductor (about 2 hours on 2 cores).
# ZOO_ARGS="--budgets 60 --load 2" takes the short budget with two busy processes on the cores.
bench-zoo: venv
	$(PY) -m bench.zoo $(ZOO_ARGS)

# Every CUDA path end to end, into OUT/gpu-check.json and .md, the rows' logs in OUT/logs (issue 22);
# a run on a GPU also becomes the current one, bench/out/gpu-check.json (`make tables` renders it).
# Not through the venv: on a GPU host it runs the machine's own torch (bench/gpu_check.sh says
# how it picks). Without CUDA it writes "no CUDA device: nothing checked" and exits 0;
# GPU_CHECK_ARGS="--device cpu" is a dry run of the harness on the CPU.
OUT ?= build/gpu-check
gpu-check:
	bash bench/gpu_check.sh $(OUT) $(GPU_CHECK_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache build/site
