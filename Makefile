# One install command, one test command (see README).
PY ?= python3
PIP = $(PY) -m pip

.PHONY: install demo test lint figures bench

install:
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -e ".[dev]"

# the main job: check every theorem of the paper and write figures/theorem_report.{md,json}
demo: install
	$(PY) sims/verify_theorems.py

test: install
	$(PY) -m ruff check .
	$(PY) -m pytest atr_theory tests

figures: install
	for s in sims/*.py; do $(PY) $$s || exit 1; done

bench: install
	$(PY) benchmarks/loss_overhead.py
