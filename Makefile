# make venv   .venv with pipelib and its pinned dependencies (skipped when it exists)
# make book   fetch the offline JavaScript, run every notebook, build _build/html with -W
# make lab    JupyterLab, to read and run the chapters live
# make soak   the chapters that time real processes, 3 times on 2 busy cores (see below)
# make chapters DEVICE=cpu   every chapter under nbval on real CPU engines (DEVICE=sim, cpu or cuda)
#
# Which torch build (for venv, book, lab, test; a new venv only: rm -rf .venv to switch):
#   TORCH=      (default) the pin as pip finds it: from PyPI on Linux that is the CUDA build,
#               several GB of NVIDIA libraries
#   TORCH=cpu   from PyTorch's CPU wheel index, https://download.pytorch.org/whl/cpu (no CUDA
#               libraries: a laptop without an NVIDIA GPU)
#   TORCH=cuda  from PyTorch's CUDA index for CUDA=$(CUDA) (default cu128; pick the one pytorch.org
#               lists for torch's pin and your driver: nvidia-smi shows the CUDA it supports)
# Python 3.11, 3.12 or 3.13 (every pinned package has wheels for the three, or builds from source:
# DeepSpeed); `make PYTHON=python3.12 ...` picks one.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
TORCH ?=
CUDA ?= cu128
TORCH_INDEX_cpu := https://download.pytorch.org/whl/cpu
TORCH_INDEX_cuda = https://download.pytorch.org/whl/$(CUDA)
ifneq ($(filter-out cpu cuda,$(TORCH)),)
$(error TORCH=$(TORCH) is not a torch build this Makefile knows: use TORCH=cpu, TORCH=cuda (CUDA=cu128 or another of pytorch.org's) or leave it unset)
endif
TORCH_INDEX = $(TORCH_INDEX_$(TORCH))
TORCH_PIN = import tomllib; print(next(p for p in tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"] if p.startswith("torch==")))
# `make book BOOK_FLAGS=` rebuilds only changed pages: faster, but a page whose notebook did not
# change keeps the figures of the library as it was when that page was last built.
BOOK_FLAGS ?= --all
# JupyterLab refuses to run as root unless told (containers, cloud GPU machines)
LAB_FLAGS ?= $(if $(filter 0,$(shell id -u)),--allow-root)

.PHONY: venv book lab python-version

# The first check: a Python the pins support (the venv's own once it exists), said in one line
PYTHON_USED = $(if $(wildcard $(BIN)/python),$(BIN)/python,$(PYTHON))
PYTHON_CHECK = import sys; v = sys.version_info[:2]; print("%d.%d" % v); sys.exit(not (3, 11) <= v <= (3, 13))
python-version:
	@v=$$($(PYTHON_USED) -c '$(PYTHON_CHECK)' 2>/dev/null) || { echo "pipelib needs Python 3.11, 3.12 or 3.13, and $(PYTHON_USED) is $${v:-missing}: install one (Debian/Ubuntu: apt-get install python3 python3-venv; or pyenv) and run make PYTHON=python3.12 (rm -rf $(VENV) first if it was made with another)"; exit 1; }
	@$(PYTHON_USED) -c 'import ensurepip, venv' 2>/dev/null || { echo "$(PYTHON_USED) has no venv module: apt-get install python3-venv (or python3.X-venv for your version), then make again"; exit 1; }

venv: python-version $(BIN)/jupyter-book $(BIN)/ds_report

$(BIN)/jupyter-book: | python-version
	$(PYTHON) -m venv $(VENV)
	@echo "installing the pinned packages into $(VENV) (log: $(VENV)/pip.log)"
	$(if $(TORCH_INDEX),@pin=$$($(BIN)/python -c '$(TORCH_PIN)'); echo "installing $$pin from $(TORCH_INDEX) (TORCH=$(TORCH))"; \
		$(BIN)/pip install -q "$$pin" --index-url $(TORCH_INDEX) > $(VENV)/pip-torch.log 2>&1 \
		|| (tail -50 $(VENV)/pip-torch.log; exit 1))
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
.PHONY: test browser system-packages slurm
test: venv browser slurm
	tools/book_assets.sh $(BIN)/python
	$(BIN)/python -m pytest tests notebooks --ignore=tests/fixtures -p no:cacheprovider \
		--nbval-lax --nbval-cell-timeout=600 --nbval-sanitize-with=tests/nbval_sanitize.cfg \
		--durations=15 --durations-file=$(TEST_RESULTS)/durations.txt \
		--junitxml=$(TEST_RESULTS)/junit.xml $(PYTEST_FLAGS)

# make chapters DEVICE=cpu   every chapter under nbval as CI runs it, its clusters on DEVICE: each
#             chapter's parameters cell reads PIPELIB_BOOK_DEVICE (pipelib.book_device), so the
#             notebooks run unedited; asserts that hold on the simulated device only print that they
#             are skipped. --noconftest: the book keeps its copies of the simulated run. CI runs
#             chapters 07, 09, 12, 14 and 17 so (tests/test_chapters_on_cpu.py).
DEVICE ?=
CHAPTERS ?= $(sort $(wildcard notebooks/[0-9][0-9]_*.ipynb))
.PHONY: chapters
chapters: venv
	PIPELIB_BOOK_DEVICE=$(DEVICE) $(BIN)/python -m pytest $(CHAPTERS) -p no:cacheprovider --noconftest -q \
		--nbval-lax --nbval-cell-timeout=600 --nbval-sanitize-with=tests/nbval_sanitize.cfg $(PYTEST_FLAGS)

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

# Debian packages the tests use, installed in one apt-get call when missing and we may use apt:
# Chromium (the browser check), Open MPI (Cluster(launcher="mpi")), SLURM and munge (a one-node
# SLURM for launcher="slurm"). Each is package:a program it installs.
SYSTEM_PACKAGES := chromium:chromium openmpi-bin:mpiexec libopenmpi-dev:mpicc slurm-wlm:sbatch munge:munged
system-packages:
	@missing=""; for pp in $(SYSTEM_PACKAGES); do \
		command -v $${pp#*:} >/dev/null 2>&1 || missing="$$missing $${pp%%:*}"; done; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's$$missing"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else echo "not found:$$missing (not root, or no apt): the tests that need them will be skipped"; fi; \
	fi

# Debian's Chromium for the browser check
browser: system-packages

# a one-node SLURM on this machine for the SLURM launcher's test (root only; tools/slurm_localhost.sh)
slurm: system-packages
	@if [ "$$(id -u)" = 0 ] && command -v slurmctld >/dev/null 2>&1; then tools/slurm_localhost.sh start; \
	else echo "no local SLURM (needs root and slurm-wlm): the SLURM launcher's test will be skipped"; fi
