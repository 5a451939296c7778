# Two commands do all set-up on a fresh machine:
#   make demo   - venv, install, then a local 4-process cluster training digits with two passive parties
#   make test   - venv, install, stale-codegen check, lint, and the whole test suite
PYTHON ?= python3.11
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint proto bench clean setup

setup: $(STAMP)

$(STAMP): pyproject.toml scripts/setup.sh
	bash scripts/setup.sh "$(PYTHON)" "$(VENV)"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/vflnet run configs/digits-2p.yaml

test: $(STAMP)
	$(BIN)/python -m vflnet.wire.codegen --check
	$(BIN)/ruff check vflnet tests scripts
	$(BIN)/python -m pytest -q -ra

lint: $(STAMP)
	$(BIN)/ruff check vflnet tests scripts
	$(BIN)/ruff format --check vflnet tests

proto: $(STAMP)
	$(BIN)/python -m vflnet.wire.codegen

bench: $(STAMP)
	$(BIN)/vflnet bench transport

clean:
	rm -rf $(VENV) runs .pytest_cache
