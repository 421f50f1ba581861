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

# CI runs `make test`. The compile checks of whole series (1.13.1 with nvcc 11.2, 2.6.0 with nvcc
# 12.4) do not fit CI's time on two cores: `make test-slow` runs them and writes their reports into
# evidence/, stamped with the series they compiled; CI fails when a stamp no longer matches the
# catalog (tests/test_slow_evidence.py), so commit what test-slow writes.
test: host install
	$(BIN)/pytest -m 'not full_compile' $(PYTEST_ARGS)

test-slow: host install
	PATCHER_RECORD_COMPILE_CHECK=1 $(BIN)/pytest -m full_compile $(PYTEST_ARGS)

test-fast: install
	$(BIN)/pytest -m 'not docker and not slow' $(PYTEST_ARGS)

lint: install
	$(BIN)/ruff check patcher tests benchmarks

bench: install
	$(BIN)/python -m benchmarks

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
