# The two commands of a fresh clone: `make up` (local cluster + JupyterLab) and `make test`.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch is optional at run time; the tests install the CPU build that lies on these machines' disks.
TORCH_SPEC ?= torch==2.13.0

.PHONY: up test lint bench install install-test clean

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade pip

# An editable install does not copy data-files, so the Jupyter config that a wheel installs under
# <prefix>/etc/jupyter is copied by hand.
JUPYTER_CONFIG := $(VENV)/etc/jupyter/jupyter_server_config.d/notebookos.json

$(VENV)/.installed: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q -e .
	mkdir -p $(dir $(JUPYTER_CONFIG)) && cp jupyter-config/jupyter_server_config.d/notebookos.json $(JUPYTER_CONFIG)
	touch $@

$(VENV)/.installed-test: pyproject.toml | $(VENV)/bin/python
	$(PIP) install -q "$(TORCH_SPEC)" || echo "warning: $(TORCH_SPEC) not installable here; torch tests will skip"
	$(PIP) install -q -e ".[test]"
	mkdir -p $(dir $(JUPYTER_CONFIG)) && cp jupyter-config/jupyter_server_config.d/notebookos.json $(JUPYTER_CONFIG)
	touch $(VENV)/.installed $@

install: $(VENV)/.installed
install-test: $(VENV)/.installed-test

up: $(VENV)/.installed
	$(VENV)/bin/notebookos up $(UP_ARGS)

lint: $(VENV)/.installed-test
	$(VENV)/bin/ruff check .

test: lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

bench: $(VENV)/.installed-test
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
