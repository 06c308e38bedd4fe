# make venv   .venv with pipelib and its pinned dependencies (skipped when it exists)
# make book   fetch the offline JavaScript, run every notebook, build _build/html with -W
# make lab    JupyterLab, to read and run the chapters live
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# `make book BOOK_FLAGS=` rebuilds only changed pages: faster, but a page whose notebook did not
# change keeps the figures of the library as it was when that page was last built.
BOOK_FLAGS ?= --all
# JupyterLab refuses to run as root unless told (containers, cloud GPU machines)
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: venv book lab

venv: $(BIN)/jupyter-book

$(BIN)/jupyter-book:
	$(PYTHON) -m venv $(VENV)
	@echo "installing the pinned packages into $(VENV) (log: $(VENV)/pip.log)"
	$(BIN)/pip install -q -e '.[book,dev]' > $(VENV)/pip.log 2>&1 || (tail -50 $(VENV)/pip.log; exit 1)

book: venv
	tools/book_assets.sh $(BIN)/python
	$(BIN)/jupyter-book build . --warningiserror --nitpick --keep-going $(BOOK_FLAGS)
	@echo "The book: $(CURDIR)/_build/html/index.html"

lab: venv
	$(BIN)/jupyter lab --ServerApp.ip=127.0.0.1 $(LAB_FLAGS)

# make test   everything CI checks: unit and cluster tests, nbval on every chapter, the static
#             book built with -W and opened in headless Chromium, and no process left behind
PYTEST_FLAGS ?=
.PHONY: test browser
test: venv browser
	tools/book_assets.sh $(BIN)/python
	$(BIN)/python -m pytest tests notebooks --ignore=tests/fixtures -p no:cacheprovider \
		--nbval-lax --nbval-cell-timeout=600 --nbval-sanitize-with=tests/nbval_sanitize.cfg \
		--durations=15 $(PYTEST_FLAGS)

# Debian's Chromium for the browser check (installed when missing and we may use apt)
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
		else echo "chromium not found: the browser test will be skipped (install Debian's chromium)"; fi; \
	fi
