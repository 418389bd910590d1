# The two commands of a fresh clone: `make up` (local cluster + JupyterLab) and `make test`.
VENV   ?= .venv
PYTHON ?= python3
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
# torch is optional at run time; the tests install the CPU build that lies on these machines' disks.
TORCH_SPEC ?= torch==2.13.0

.PHONY: up test test-multinode test-ansible-multinode lint bench bench-smoke install install-test clean labextension compile

# A wheel's modules are compiled when it is installed; an editable install's only on first import,
# and never where PYTHONDONTWRITEBYTECODE is set: then every replica compiled NotebookOS again at
# its start (~70 ms and ~5 MB each, docs/performance.md). Only changed files are compiled again.
PACKAGE_DIRS := notebookos kernel provisioner global_scheduler local_scheduler

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

$(VENV)/.installed-test: pyproject.toml scripts/system-deps.sh | $(VENV)/bin/python
	sh scripts/system-deps.sh
	$(PIP) install -q "$(TORCH_SPEC)" || echo "warning: $(TORCH_SPEC) not installable here; torch tests will skip"
	$(PIP) install -q -e ".[test]"
	mkdir -p $(dir $(JUPYTER_CONFIG)) && cp jupyter-config/jupyter_server_config.d/notebookos.json $(JUPYTER_CONFIG)
	touch $(VENV)/.installed $@

# The JupyterLab extension is committed prebuilt (provisioner/labextension, ~50 kB): a wheel ships
# it under share/jupyter/labextensions (data-files); an editable install gets this copy.
LABEXT_SHARE := $(VENV)/share/jupyter/labextensions/notebookos-jupyterlab

$(LABEXT_SHARE)/package.json: provisioner/labextension/package.json | $(VENV)/bin/python
	rm -rf $(LABEXT_SHARE) && mkdir -p $(dir $(LABEXT_SHARE))
	cp -r provisioner/labextension $(LABEXT_SHARE)

install: $(VENV)/.installed $(LABEXT_SHARE)/package.json
install-test: $(VENV)/.installed-test $(LABEXT_SHARE)/package.json

# Rebuild the extension from labextension/ (npm registry only; Node 20). Run after changing its
# sources: tests/jupyter/test_labextension.py fails while the committed build is older.
labextension: $(VENV)/.installed
	cd labextension && npm ci --no-audit --no-fund && \
		JUPYTERLAB_CORE_PATH="$$(../$(PY) -c 'import jupyterlab, os; print(os.path.join(os.path.dirname(jupyterlab.__file__), "staging"))')" npm run build
	$(PY) -m notebookos.testing.labextension --write
	rm -rf $(LABEXT_SHARE) && mkdir -p $(dir $(LABEXT_SHARE)) && cp -r provisioner/labextension $(LABEXT_SHARE)

compile: | $(VENV)/bin/python
	$(PY) -m compileall -q $(PACKAGE_DIRS)

up: $(VENV)/.installed $(LABEXT_SHARE)/package.json compile
	$(VENV)/bin/notebookos up $(UP_ARGS)

lint: install-test
	$(VENV)/bin/ruff check .

# Everything but the multi-node Docker clusters (marker `multinode`), which take about 14 of the
# suite's minutes on two cores: they are `make test-multinode`, which CI (.ci/run) runs after this.
test: lint compile
	$(VENV)/bin/pytest -m "not multinode" $(PYTEST_ARGS)

# The multi-node Docker clusters (CI runs this after `make test`): the swarm test (four Docker
# engines in containers of this machine's engine, the stack across them, a notebook through a whole
# node's loss) and the ansible playbook over SSH to three bare engines.
test-multinode: install-test compile
	$(VENV)/bin/pytest -s -m multinode tests/deploy $(PYTEST_ARGS)

# The ansible playbook against three Docker engines in containers over SSH (swarm mode, the image
# copied to each as a docker save archive and loaded, the notebook check, a second run with
# changed=0) alone: about 8 minutes here (4 of them the first playbook run, most of that moving
# 1.8 GB of image into three nodes).
test-ansible-multinode: install-test compile
	$(VENV)/bin/pytest -s tests/deploy/test_ansible_multinode.py $(PYTEST_ARGS)

bench: $(VENV)/.installed-test compile
	@for b in benchmarks/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

# Each benchmark in its smoke mode (the same code path with tiny arguments, seconds each; the
# figures mean nothing): what CI runs so that a benchmark cannot rot unseen. Benchmarks that need
# CUDA skip without it; deploy.py builds the image where Docker runs (minutes).
bench-smoke: $(VENV)/.installed-test compile
	@for b in benchmarks/*.py; do echo "== $$b --smoke"; $(PY) $$b --smoke || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
