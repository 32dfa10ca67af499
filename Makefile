# Beacon. Two commands a newcomer needs: `make demo` and `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help
# No default team for what touches an account: `make deploy` must never land the demo by accident.
TEAM ?=
SYNTH_TEAM := $(or $(TEAM),demo)
ACCOUNT_GOALS := deploy destroy diff bootstrap
ifneq ($(filter $(ACCOUNT_GOALS),$(MAKECMDGOALS)),)
ifeq ($(strip $(TEAM)),)
$(error make $(filter $(ACCOUNT_GOALS),$(MAKECMDGOALS)) needs TEAM=<team>, the name of a file in config/teams/ (it never defaults to demo))
endif
endif
PY := .venv/bin/python
# One line of a .pth file: the nearest checkout above the working directory, else this one.
CHECKOUT_PTH := import os, sys; (lambda here, fallback: sys.path.extend(p for p in (lambda root: (root, os.path.join(root, 'runtime')))(next((os.sep.join(here[:n]) for n in range(len(here), 0, -1) if os.path.isfile(os.sep.join([*here[:n], 'runtime', 'beacon', '__init__.py']))), fallback)) if p not in sys.path))(os.getcwd().split(os.sep), '$(CURDIR)')
STAMP_PY := .venv/.installed
STAMP_DEV := .venv/.installed-dev
STAMP_NODE := node_modules/.installed
CHECKOV_VENV := .beacon/tools/checkov-venv
STAMP_CHECKOV := $(CHECKOV_VENV)/.installed
INSTALL_LOG := .beacon/install.log
CDK := JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 npx --no-install cdk
export JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION := 20
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help install install-dev demo test synth lint docs bootstrap diff deploy destroy bench gpu-check clean

help:
	@echo "make demo    install what the demo needs, then run Beacon end to end on an embedded AWS (no account)"
	@echo "make test    install what is missing (the test toolchain too), then run every test"
	@echo "make synth   synthesize all stacks of TEAM=$(SYNTH_TEAM) into cdk.out/ (cdk-nag enforced)"
	@echo "make lint    ruff and mypy"
	@echo "make bench   the measured figures -> .beacon/bench/report.json"
	@echo "make bootstrap TEAM=<name>  npx cdk bootstrap: once per account and region, before the first deploy"
	@echo "make diff TEAM=<name>       npx cdk diff --all: what a deploy would change"
	@echo "make deploy TEAM=<name>     npx cdk deploy --all -c team=<name>"
	@echo "make destroy TEAM=<name>    every stack but the retained data (bucket, file system, keys); says what remains"
	@echo "make gpu-check  the job on CUDA with nccl (one rank per GPU); needs a GPU"
	@echo "make docs       serve the documentation site (docs/) at http://127.0.0.1:8000; make test builds it strictly"

# Reinstalls only when a pin changes; a second run touches no network.
# What the demo and the `beacon` command need; the test toolchain is a stamp of its own (`make test` adds it).
$(STAMP_PY): requirements.txt requirements-demo.txt runtime/requirements.txt constraints.txt pyproject.toml runtime/pyproject.toml
	@mkdir -p .beacon
	@echo "beacon: installing Python packages into .venv (log: $(INSTALL_LOG))"
	@test -x $(PY) || python3 -m venv .venv >>$(INSTALL_LOG) 2>&1
	@$(PY) -m pip install -q -c constraints.txt -r requirements-demo.txt >>$(INSTALL_LOG) 2>&1 \
		|| { echo "beacon: pip install failed; see $(INSTALL_LOG)" >&2; tail -5 $(INSTALL_LOG) >&2; exit 1; }
	@$(PY) -m pip install -q --no-deps --no-build-isolation -e . >>$(INSTALL_LOG) 2>&1 \
		|| { echo "beacon: installing the beacon command failed; see $(INSTALL_LOG)" >&2; exit 1; }
	@# The repository's rooms (config, stacks, workloads, the runtime and its smoke job) are imported from
	@# the checkout a process runs in (a git worktree sharing this venv included), else from this one;
	@# never installed under generic top-level names.
	@printf '%s\n' "$(CHECKOUT_PTH)" > "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/beacon-checkout.pth"
	@touch $@

# pytest, ruff, mypy, mkdocs, and the frameworks and trackers the runtime's integrations are tested with.
$(STAMP_DEV): $(STAMP_PY) requirements-dev.txt
	@echo "beacon: installing the test toolchain into .venv (log: $(INSTALL_LOG))"
	@$(PY) -m pip install -q -c constraints.txt -r requirements-dev.txt >>$(INSTALL_LOG) 2>&1 \
		|| { echo "beacon: pip install failed; see $(INSTALL_LOG)" >&2; tail -5 $(INSTALL_LOG) >&2; exit 1; }
	@touch $@

$(STAMP_NODE): package.json package-lock.json
	@mkdir -p .beacon
	@echo "beacon: installing the pinned aws-cdk CLI (npm ci)"
	@npm ci --no-audit --no-fund --loglevel=error >>$(INSTALL_LOG) 2>&1 \
		|| { echo "beacon: npm ci failed; see $(INSTALL_LOG)" >&2; exit 1; }
	@touch $@

# checkov pins boto3 exactly (1.35.x), which .venv's boto3 cannot be: it gets its own venv, for tests only.
$(STAMP_CHECKOV): requirements-checkov.txt constraints-checkov.txt
	@mkdir -p .beacon/tools
	@echo "beacon: installing checkov into $(CHECKOV_VENV) (log: $(INSTALL_LOG))"
	@test -x $(CHECKOV_VENV)/bin/python || python3 -m venv $(CHECKOV_VENV) >>$(INSTALL_LOG) 2>&1
	@$(CHECKOV_VENV)/bin/pip install -q -c constraints-checkov.txt -r requirements-checkov.txt >>$(INSTALL_LOG) 2>&1 \
		|| { echo "beacon: installing checkov failed; see $(INSTALL_LOG)" >&2; exit 1; }
	@touch $@

install: $(STAMP_PY) $(STAMP_NODE)
install-dev: install $(STAMP_DEV)

synth: install
	@rm -rf cdk.out
	@$(CDK) synth --quiet -c team=$(SYNTH_TEAM)
	@$(PY) -m stacks.summary cdk.out

demo: install
	@.venv/bin/beacon local

# Two workers, a test file each: most tests wait on subprocesses, so two cores carry two files.
TEST_WORKERS ?= 2
test: install-dev $(STAMP_CHECKOV)
	@$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --durations=15 $(PYTEST_ARGS)

docs: install-dev
	@NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

lint: install-dev
	@$(PY) -m ruff check .
	@$(PY) -m ruff format --check .
	@$(PY) -m mypy

bootstrap: install
	$(CDK) bootstrap -c team=$(TEAM)

diff: install
	$(CDK) diff --all -c team=$(TEAM)

deploy: install
	$(CDK) deploy --all -c team=$(TEAM)

# `cdk destroy --all` stops at the termination-protected stateful stack; destroy stack by stack instead.
destroy: install
	@rm -rf cdk.out && $(CDK) synth --quiet -c team=$(TEAM) >/dev/null
	@# A running GPU job holds its node up to 24 h and the EC2NodeClass's deletion past the kubectl handler's limit:
	@# stopped first, before the stateful stack's protection is lifted
	@test "$(DRAIN)" = off || $(PY) -m beacon_ops.jobs.drain --team $(TEAM) $(if $(KUBERNETES_URL),--kubernetes-url $(KUBERNETES_URL))
	@$(PY) -m beacon_ops.teardown prepare --team $(TEAM) cdk.out
	@for stack in $$($(PY) -m beacon_ops.teardown order cdk.out); do \
		echo "beacon: destroying $$stack"; \
		$(CDK) destroy --force --exclusively -c team=$(TEAM) $$stack || exit 1; \
	done
	@$(PY) -m beacon_ops.teardown remains --team $(TEAM)

bench: install-dev
	@$(CDK) synth --quiet -c team=demo >/dev/null
	@$(PY) -m bench.run

gpu-check: $(STAMP_PY)
	@$(PY) -m bench.gpu_check

clean:
	rm -rf cdk.out .beacon .pytest_cache .mypy_cache .ruff_cache
