# make venv   .venv with pipelib and its pinned dependencies (skipped when it exists)
# make book   fetch the offline JavaScript, run every notebook, build _build/html with -W
# make lab    JupyterLab, to read and run the chapters live
# make soak   the chapters that time real processes, 3 times on 2 busy cores (see below)
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `make book BOOK_FLAGS=` rebuilds only changed pages: faster, but a page whose notebook did not
# change keeps the figures of the library as it was when that page was last built.
BOOK_FLAGS ?= --all
# JupyterLab refuses to run as root unless told (containers, cloud GPU machines)
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: venv book lab

venv: $(BIN)/jupyter-book $(BIN)/ds_report

$(BIN)/jupyter-book:
	$(PYTHON) -m venv $(VENV)
	@echo "installing the pinned packages into $(VENV) (log: $(VENV)/pip.log)"
	$(BIN)/pip install -q -e '.[book,dev]' > $(VENV)/pip.log 2>&1 || (tail -50 $(VENV)/pip.log; exit 1)

# DeepSpeed after torch, without build isolation (pyproject.toml's `deepspeed` extra; FACTS.md)
DEEPSPEED_PIN = import tomllib; print(*tomllib.load(open("pyproject.toml", "rb"))["project"]["optional-dependencies"]["deepspeed"])
$(BIN)/ds_report: $(BIN)/jupyter-book
	@pin=$$($(BIN)/python -c '$(DEEPSPEED_PIN)'); \
	echo "installing $$pin against the venv's torch (log: $(VENV)/pip-deepspeed.log)"; \
	$(BIN)/pip install -q --no-build-isolation "$$pin" > $(VENV)/pip-deepspeed.log 2>&1 \
		|| (tail -50 $(VENV)/pip-deepspeed.log; exit 1)

book: venv
	tools/book_assets.sh $(BIN)/python
	$(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going $(BOOK_FLAGS)
	@echo "The book: $(CURDIR)/_build/html/index.html"

# No "Would you like to get notified about official Jupyter news?" pop-up and no update check:
# the venv's settings overrides say no, and the server fetches nothing.
LAB_OVERRIDES := $(VENV)/share/jupyter/lab/settings/overrides.json
lab: venv
	@mkdir -p $(dir $(LAB_OVERRIDES))
	@echo '{"@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": false}}' > $(LAB_OVERRIDES)
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 --LabApp.news_url=None \
		--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate $(LAB_FLAGS)

# make test   everything CI checks: unit and cluster tests, nbval on every chapter, the static
#             book built with -W and opened in headless Chromium, and no process left behind.
#             The 15 slowest phases on screen; every test's time kept in $(TEST_RESULTS):
#             durations.txt (all of --durations=0, slowest first) and junit.xml (CI artifacts)
PYTEST_FLAGS ?=
TEST_RESULTS ?= _build/test-results
.PHONY: test browser
test: venv browser
	tools/book_assets.sh $(BIN)/python
	$(BIN)/python -m pytest tests notebooks --ignore=tests/fixtures -p no:cacheprovider \
		--nbval-lax --nbval-cell-timeout=600 --nbval-sanitize-with=tests/nbval_sanitize.cfg \
		--durations=15 --durations-file=$(TEST_RESULTS)/durations.txt \
		--junitxml=$(TEST_RESULTS)/junit.xml $(PYTEST_FLAGS)

# make soak   chapters 01, 04, 05 and 06 (the ones that time real processes) under nbval SOAK_RUNS
#             times in a row while two busy loops keep both cores of a 2-core laptop busy: every
#             measured assertion must hold on a loaded machine. The loops are killed on any exit,
#             and stop by themselves should the shell that started them die.
SOAK_CHAPTERS ?= notebooks/01_hardware.ipynb notebooks/04_parallel_computing.ipynb \
	notebooks/05_point_to_point.ipynb notebooks/06_collectives.ipynb
SOAK_RUNS ?= 3
SOAK_BURNERS ?= 2
.PHONY: soak
soak: venv
	@SOAK_BURN='import os; p = os.getppid(); exec("while os.getppid() == p:\n    for _ in range(100000): pass")'; \
	burners=""; trap 'kill $$burners 2>/dev/null; wait $$burners 2>/dev/null' EXIT; trap 'exit 130' INT TERM; \
	for i in $$(seq $(SOAK_BURNERS)); do $(BIN)/python -c "$$SOAK_BURN" & burners="$$burners $$!"; done; \
	echo "soak: $(SOAK_BURNERS) busy loops (pids$$burners), $(SOAK_RUNS) runs"; \
	passed=0; \
	for run in $$(seq $(SOAK_RUNS)); do \
		echo "=== soak run $$run/$(SOAK_RUNS), load $$(cut -d' ' -f1-3 /proc/loadavg)"; \
		if $(BIN)/python -m pytest $(SOAK_CHAPTERS) -p no:cacheprovider -q \
			--nbval-lax --nbval-cell-timeout=600 --nbval-sanitize-with=tests/nbval_sanitize.cfg \
			$(PYTEST_FLAGS); then passed=$$((passed + 1)); fi; \
	done; \
	echo "=== soak: $$passed/$(SOAK_RUNS) runs passed with $(SOAK_BURNERS) busy loops"; \
	test $$passed -eq $(SOAK_RUNS)

# Debian's Chromium for the browser check (installed when missing and we may use apt)
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "chromium not found: the browser test will be skipped (install Debian's chromium)"; fi; \
	fi
