# Two entry points for a fresh machine: `make demo` (the main job) and `make test`.
# Setup is idempotent: it creates .venv once, installs torch==2.13.0 only when torch is missing
# (a bare `torch` requirement would pull a multi-GB CUDA build), then the package itself.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.bcr-installed

.PHONY: setup demo test
setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -c "import torch" 2>/dev/null || $(PY) -m pip install --quiet torch==2.13.0
	$(PY) -m pip install --quiet -e ".[test]"
	touch $(STAMP)

demo: setup
	$(VENV)/bin/bcr verify
	$(VENV)/bin/bcr demo

test: setup
	$(PY) -m pytest -q
