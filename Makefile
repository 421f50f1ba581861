# patcher: `make install` then `make test`. See README.md.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: install host test test-slow test-fast lint bench clean

install: $(BIN)/patcher

$(BIN)/patcher: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	@touch $@

# The host packages (apt) and real inputs (Debian's PyTorch tree, by sha256) the tests use;
# both scripts do nothing when all is already there.
host:
	bash .ci/install-host.sh
	bash .ci/fetch-sources.sh
	bash .ci/fetch-legacy-wheels.sh

# CI runs `make test` (the 1.13.1 series' compile check of every unit included); the compile
# check of 2.6.0's whole series with nvcc 12.4 would take CI too close to its time on two cores
# and runs with `make test-slow`.
test: host install
	$(BIN)/pytest -m 'not full_compile' $(PYTEST_ARGS)

test-slow: host install
	$(BIN)/pytest -m full_compile $(PYTEST_ARGS)

test-fast: install
	$(BIN)/pytest -m 'not docker and not slow' $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check patcher tests benchmarks

bench: install
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
