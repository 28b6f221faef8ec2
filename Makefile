# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Setup is idempotent: it creates .venv once, installs torch==2.13.0 only when torch is missing
# (a bare `torch` requirement would pull a multi-GB CUDA build), then the package itself, and
# registers the venv's Python as the Jupyter kernel `bcr-lab` that the notebooks run on. The browser
# tests drive the system Chromium: setup installs Debian's `chromium` when it is missing and we are root, and
# Debian's `bubblewrap`, the sandbox HumanEval's unit tests run model code in.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bcr-installed
KERNEL := $(VENV)/share/jupyter/kernels/bcr-lab/kernel.json

.PHONY: setup demo test test-fast
setup: $(STAMP) $(KERNEL)
	@command -v chromium >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq chromium; } \
		|| echo "chromium is missing and cannot be installed here: tests/test_browser.py will skip"
	@command -v bwrap >/dev/null 2>&1 || { [ "$$(id -u)" = 0 ] && apt-get update -qq && apt-get install -y -qq bubblewrap; } \
		|| echo "bubblewrap is missing and cannot be installed here: HumanEval cannot be scored (tests/test_sandbox.py will skip)"

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

$(KERNEL): $(STAMP)
	$(PY) -m ipykernel install --sys-prefix --name bcr-lab --display-name "BCR lab (Python)"

# The main job: correctness checks, then the quickstart notebook run headless into an HTML report.
demo: setup
	$(VENV)/bin/bcr verify
	$(VENV)/bin/bcr notebooks --only 00_quickstart --out reports
	@echo "Open reports/00_quickstart.html in a browser; \`$(VENV)/bin/jupyter lab notebooks/\` for the interactive lab."

test: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q

# The inner loop: lint, then every test that needs no real model, no notebook run and no browser.
test-fast: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -q -m "not real_model and not notebooks and not browser"
