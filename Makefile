# Two commands do all set-up on a fresh machine:
#   make demo   - venv, install, then a local 4-process cluster training digits with two passive parties
#   make test   - venv, install, lint, stale-codegen check, the whole test suite, then test-compose
# For contributors:
#   make test-fast - the tests that start no processes and take under ~30 s each (< 3 min on 2 cores)
#   make lint      - ruff check and ruff format --check, the same as make test runs
#   make test-loaded - the whole suite beside two busy processes (scripts/with-cpu-hog.sh): slow is not dead
#   make test-compose - (root) a real container engine and local base image (scripts/containers.sh),
#                    then docker-compose runs of the plain, TLS and attacker clusters (tests/test_compose.py)
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# The suite on both cores: two pytest workers, each test file on one worker (files keep their
# module fixtures and never race each other's lab namespaces)
PARALLEL := -n 2 --dist loadfile

.PHONY: demo test test-fast test-loaded test-compose lint proto bench clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh scripts/install-torch.sh scripts/install-kustomize.sh scripts/mnist70k-wheel.txt
	bash scripts/setup.sh "$(PYTHON)" "$(VENV)"
	touch $(STAMP)

# The resident fork server it starts (or finds) outlives it for 15 idle minutes: a second demo, and
# any vflnet command meanwhile, skip torch's imports (`vflnet warm stop` ends it).
demo: $(STAMP)
	$(BIN)/vflnet warm start
	$(BIN)/vflnet run configs/digits-2p.yaml

# The container engine and base image are prepared in the background while the suite runs (mostly
# downloads); test-compose then finds them cached. A failed preparation is retried there, in view.
test: lint
	$(BIN)/python -m vflnet.wire.codegen --check
	@mkdir -p runs
	bash scripts/containers.sh prepare >runs/containers-prepare.log 2>&1 & prep=$$!; \
	  $(BIN)/python -m pytest -q -ra $(PARALLEL); rc=$$?; \
	  wait $$prep || echo "note: background container preparation failed (runs/containers-prepare.log)"; \
	  if [ $$rc != 0 ]; then bash scripts/containers.sh stop; exit $$rc; fi
	$(MAKE) test-compose

# The engine this starts (if none was running) is stopped again whatever the tests' outcome.
test-compose: $(STAMP)
	bash scripts/containers.sh prepare \
	  && $(BIN)/python -m pytest -q -ra --run-compose -m compose tests/test_compose.py; \
	  rc=$$?; bash scripts/containers.sh stop; exit $$rc

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not e2e and not slow"

# On a loaded machine timings change, results must not: no test may take a slow process for a dead one.
test-loaded: $(STAMP)
	bash scripts/with-cpu-hog.sh $(or $(HOGS),2) $(BIN)/python -m pytest -q -ra $(PARALLEL)

lint: $(STAMP)
	$(BIN)/ruff check vflnet tests scripts
	$(BIN)/ruff format --check vflnet tests scripts

proto: $(STAMP)
	$(BIN)/python -m vflnet.wire.codegen

bench: $(STAMP)
	$(BIN)/vflnet bench transport

clean:
	rm -rf $(VENV) runs .pytest_cache
