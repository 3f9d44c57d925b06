# Every target sets itself up: a fresh clone needs only Python 3.11+ and make.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest run lab demo bench bench-quick bench-profile clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

test: lint typecheck pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP)
	$(BIN)/pytest -q

lab: $(STAMP)
	$(BIN)/python -m provider_lab --port 9101

run: $(STAMP)
	$(BIN)/python -m provider_lab.run_pair --lab-port 9101 --port 9100

demo: $(STAMP)
	$(BIN)/python -m provider_lab.demo --service http://127.0.0.1:9100 --lab http://127.0.0.1:9101

# The benchmark (bench/, docs/benchmark.md): needs wrk (apt-get install -y wrk;
# installed automatically when run as root with apt) and the bench extra.
BENCH_STAMP := $(VENV)/.bench-installed

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[bench]'
	touch $(BENCH_STAMP)

bench: $(BENCH_STAMP)
	$(BIN)/python -m bench.run

bench-quick: $(BENCH_STAMP)
	$(BIN)/python -m bench.run --quick

# Where QuoteFlow's CPU goes under saturate and overload (py-spy needs root).
bench-profile: $(BENCH_STAMP)
	$(BIN)/python -m pip install --quiet py-spy
	$(BIN)/python -m bench.run --only saturate,overload --rounds 1 --profile

clean:
	rm -rf $(VENV) build *.egg-info .mypy_cache .ruff_cache
