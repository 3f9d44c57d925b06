# Every target sets itself up: a fresh clone needs only Python 3.11+ and make.
PYTHON ?= python3
VENV := .venv
# Bytecode is cached even where the environment says not to (some CI images set
# PYTHONDONTWRITEBYTECODE=1): each pytest worker and each of the hundreds of
# QuoteFlow, lab and gunicorn processes the tests start would otherwise compile
# every module from source, and the suite's collection alone took 8.5 s, not 3.3.
unexport PYTHONDONTWRITEBYTECODE
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: install test lint typecheck pytest need-redis need-chromium run fleet lab demo bench bench-quick bench-profile clean

install: $(STAMP)

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	$(BIN)/python -m compileall -q quoteflow provider_lab bench tests
	# The caches every later run reuses, built once here: pytest's rewritten
	# test modules (a cold collection costs each test worker 6 s of CPU) and
	# mypy's (10 s cold, under 1 s warm). Without them the first `make test`
	# of a fresh clone took 176 s of pytest, the next four 152-158 s. Their
	# verdicts are make test's to give, so a failure here stops nothing.
	-$(BIN)/python -m pytest --collect-only -q > /dev/null
	-$(BIN)/mypy > /dev/null
	touch $(STAMP)

# Lint and type checks run beside the tests: most tests wait on sockets and
# timers, so the two cores have room for them. The wall time is printed last.
test: need-redis need-chromium $(STAMP)
	@start=$$(date +%s); \
	$(MAKE) --no-print-directory -j3 --output-sync=target lint typecheck pytest; status=$$?; \
	echo "make test: $$(( $$(date +%s) - start )) s wall"; exit $$status

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy

pytest: $(STAMP) need-redis need-chromium
	# Three workers on two cores: the tests mostly wait on budgets and sockets
	# (1.3 of the 2 cores busy). Four took 140 s, not 155-168 s, but starved
	# timing tests into a chance failure in each of two quiet runs
	# (docs/development.md). Whole files stay together (module-scoped
	# processes); the gunicorn fleet tests run one at a time (tests/conftest.py).
	$(BIN)/pytest -q -n 3 --dist loadgroup --durations=10

# The fleet tests and `make fleet` run Debian's redis-server, and the failover
# tests its redis-sentinel: installed here when we are root with apt (as `make
# bench` does for wrk); otherwise make stops with the one command to run. A
# missing redis-server never makes the tests skip here.
REDIS_INSTALL := apt-get update && apt-get install -y redis-server redis-sentinel

need-redis:
	@{ command -v redis-server && command -v redis-sentinel; } >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "redis-server or redis-sentinel not found: running \`$(REDIS_INSTALL)\`"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
	      redis-server redis-sentinel && command -v redis-server >/dev/null 2>&1; \
	  else \
	    echo "redis-server is not installed; install it (as root) with:"; \
	    echo "    $(REDIS_INSTALL)"; \
	    exit 1; \
	  fi; }

# The console's browser tests drive Debian's chromium through Playwright (never a
# browser Playwright downloads): installed here as redis-server is, and likewise
# never a reason for those tests to skip under make test.
CHROMIUM_INSTALL := apt-get update && apt-get install -y chromium

need-chromium:
	@command -v chromium >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "chromium not found: running \`$(CHROMIUM_INSTALL)\`"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium \
	      && command -v chromium >/dev/null 2>&1; \
	  else \
	    echo "chromium is not installed; install it (as root) with:"; \
	    echo "    $(CHROMIUM_INSTALL)"; \
	    exit 1; \
	  fi; }

lab: $(STAMP)
	$(BIN)/python -m provider_lab --port 9101

# Coalescing and the quote cache are on here, so both can be tried by hand
# (they act only on identical requests in flight and on answers with Cache-Control).
# A second QuoteFlow (9103) asks the lab's foreign dialects: docs/suppliers.md's
# three worked suppliers (POST JSON with OAuth2 and price breaks, path with an API key).
# A third (9104) asks the lab's three in its batch dialect: carts, 20 lines a call.
# A fourth (9105) hedges (--hedge): turn boreal's tail on as the banner says to see one.
# The first (9100) serves the console, with the lab's controls; its URL is printed.
run: $(STAMP)
	$(BIN)/python -m provider_lab.run_pair --console --lab-port 9101 --port 9100 --dialects-port 9103 --batch-port 9104 --hedged-port 9105 -- --coalesce --cache-size 1000

# Fleet mode: redis-server (9102), the lab (9101) and 2 gunicorn workers (9100).
fleet: $(STAMP) need-redis
	$(BIN)/python -m provider_lab.run_fleet --lab-port 9101 --port 9100 --redis-port 9102

# SVG=DIR: each case of the main table also written as its waterfall, DIR/<case>.svg.
demo: $(STAMP)
	$(BIN)/python -m provider_lab.demo --service http://127.0.0.1:9100 --lab http://127.0.0.1:9101 --dialects http://127.0.0.1:9103 --batch http://127.0.0.1:9104 --hedged http://127.0.0.1:9105 $(if $(SVG),--svg $(SVG))

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
