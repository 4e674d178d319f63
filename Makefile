# Two commands: `make lab` (open the quickstart notebook) and `make test` (every check).
# Both work from a fresh clone on a machine with Python >= 3.11; they create ./.venv.

PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
# `make lab` runs `python -m toolkit.lab` (toolkit/lab.py) from the repository root: 127.0.0.1 only,
# on the first free port from 8888 (or LAB_PORT=...), a fresh token, and the quickstart's full URL
# printed before the server starts; extra jupyter flags: LAB_ARGS=...
LAB_PORT ?=
LAB_ARGS ?=
PYTEST_ARGS ?=

.PHONY: lab test lint typecheck unit venv clean test-lowest gpu-check profile-fit

# A venv whose interpreter no longer runs (moved checkout, removed Python) loses its stamps
# and is rebuilt below, instead of being half-used.
ifeq ($(shell $(PY) -c 'import sys' >/dev/null 2>&1 && echo ok),)
$(shell rm -f $(VENV)/.created $(VENV)/.installed $(VENV)/.installed-dev)
endif

# A stamp per install set: pip runs again only when pyproject.toml changes.
$(VENV)/.created:
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "toolkit needs Python >= 3.11, found " + sys.version.split()[0])'
	@if [ -d $(VENV) ] && ! $(PY) -c 'import sys' >/dev/null 2>&1; then echo "rebuilding broken $(VENV)"; rm -rf $(VENV); fi
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --upgrade pip
	@touch $@

$(VENV)/.installed: $(VENV)/.created pyproject.toml
	$(PIP) install -e .
	@touch $@

$(VENV)/.installed-dev: $(VENV)/.created pyproject.toml
	$(PIP) install -e '.[dev]'
	@touch $@ $(VENV)/.installed

venv: $(VENV)/.installed

lab: $(VENV)/.installed
	@LAB_PORT=$(LAB_PORT) $(PY) -m toolkit.lab $(LAB_ARGS)

# pyinstrument's call tree of `python -m toolkit fit` on a Qwen3-30B-A3B-shaped sparse GGUF against one
# 24 GiB RPC device (PROFILE_HTML=FILE.html writes a flame graph instead)
PROFILE_HTML ?=
profile-fit: $(VENV)/.installed-dev
	$(PY) benchmarks/bench_fit.py --profile $(PROFILE_HTML)

lint: $(VENV)/.installed-dev
	$(PY) -m ruff check toolkit tests
	$(VENV)/bin/lint-imports

typecheck: $(VENV)/.installed-dev
	$(PY) -m mypy toolkit

# unit + notebook + browser tests; with CI=true the browser tests fail instead of skipping
unit: $(VENV)/.installed-dev
	$(PY) -m pytest $(PYTEST_ARGS)

# all four steps run even when one fails, so one run shows every problem; any failure fails.
# lint-imports checks the layer contracts in pyproject.toml; pytest runs the docstring examples too.
test: $(VENV)/.installed-dev
	@status=0; \
	echo "== ruff check toolkit tests"; $(PY) -m ruff check toolkit tests || status=1; \
	echo "== mypy toolkit"; $(PY) -m mypy toolkit || status=1; \
	echo "== lint-imports"; $(VENV)/bin/lint-imports || status=1; \
	echo "== pytest $(PYTEST_ARGS)"; $(PY) -m pytest $(PYTEST_ARGS) || status=1; \
	exit $$status

# On a machine with an NVIDIA GPU and JAX's CUDA plugin: every architecture's tiny models on the GPU
# against the CPU, and XLA's memory analysis beside the ggml plan (benchmarks/gpu_check.py; --cpu: dry run).
# GPU_CHECK_PYTHON: an interpreter that already has jax[cuda], numpy and gguf (default: the venv's).
GPU_CHECK_PYTHON ?= $(PY)
GPU_CHECK_ARGS ?=
gpu-check:
	$(GPU_CHECK_PYTHON) benchmarks/gpu_check.py $(GPU_CHECK_ARGS)

# The suite (without the browser) against the lower bounds in pyproject.toml, in .venv-lowest.
test-lowest:
	rm -rf .venv-lowest
	$(PYTHON) -m venv .venv-lowest
	.venv-lowest/bin/python -m pip --disable-pip-version-check install --upgrade pip
	.venv-lowest/bin/python -c 'import tomllib; d = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]; print("\n".join(x.replace(">=", "==") for x in d))' > .venv-lowest/lowest.txt
	.venv-lowest/bin/python -m pip --disable-pip-version-check install -c .venv-lowest/lowest.txt -e '.[dev]'
	.venv-lowest/bin/python -m pytest -m 'not browser' $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .venv-lowest .pytest_cache .mypy_cache .ruff_cache test-artifacts
