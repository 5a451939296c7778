# Two commands do all set-up on a fresh machine:
#   make demo   - venv, install, then a local 4-process cluster training digits with two passive parties
#   make test   - venv, install, lint, stale-codegen check, and the whole test suite
# For contributors:
#   make test-fast - the tests that start no processes and take under ~30 s each (< 3 min on 2 cores)
#   make lint      - ruff check and ruff format --check, the same as make test runs
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test test-fast lint proto bench clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh scripts/install-torch.sh
	bash scripts/setup.sh "$(PYTHON)" "$(VENV)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vflnet run configs/digits-2p.yaml

test: lint
	$(BIN)/python -m vflnet.wire.codegen --check
	$(BIN)/python -m pytest -q -ra

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -ra -m "not e2e and not slow"

lint: $(STAMP)
	$(BIN)/ruff check vflnet tests scripts
	$(BIN)/ruff format --check vflnet tests scripts

proto: $(STAMP)
	$(BIN)/python -m vflnet.wire.codegen

bench: $(STAMP)
	$(BIN)/vflnet bench transport

clean:
	rm -rf $(VENV) runs .pytest_cache
