# Two entry points, each self-sufficient on a fresh clone: `make demo` and `make test`.
# The venv is rebuilt only when pyproject.toml changes (the stamp file records the last install).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.octlm-installed
DEMO := runs/demo

.PHONY: demo test lint clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first and pinned: the CPU wheel on this disk; an unpinned torch pulls a CUDA build.
	$(BIN)/pip install --quiet --disable-pip-version-check torch==2.13.0
	$(BIN)/pip install --quiet --disable-pip-version-check -e '.[dev]'
	@touch $(STAMP)

demo: $(STAMP)
	$(BIN)/octlm prepare --out $(DEMO)/data --vocab-size 4096 --force

test: $(STAMP)
	$(BIN)/python -m pytest -q

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
