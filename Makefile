# memfit developer entry points. `make test` is what CI (.ci/run) runs.
SHELL := /bin/bash
.DEFAULT_GOAL := help

VENV ?= $(HOME)/.cache/memfit/venv-py311
PY := $(VENV)/bin/python
PURE := operator/memfit/api operator/memfit/memory operator/memfit/timing operator/memfit/planner operator/memfit/kube operator/memfit/lifecycle operator/memfit/catalog.py operator/memfit/mig.py
export TORCH_EXTENSIONS_DIR ?= $(HOME)/.cache/memfit/torch_extensions
export PIP_DISABLE_PIP_VERSION_CHECK := 1

.PHONY: help venv testbin testbin-demo testbin-demo-node prometheus realnode lint test test-extended test-unit test-integration test-e2e test-realnode crds dashboard demo demo-realnode demo-finetune plan clean

help: ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed 's/:.*## /\t/'

venv: ## create or reuse the venv (outside the repo) with every extra installed
	@MEMFIT_VENV=$(VENV) hack/venv.sh >/dev/null

testbin: ## build etcd, kube-apiserver, controller-manager, scheduler, kwok, helm, kubelet, kube-proxy, CoreDNS, Kueue (cached by version)
	@hack/install-testbin.sh >/dev/null

testbin-demo: ## only what `make demo` runs: the control plane and KWOK (no Helm, no Kueue, no node binaries)
	@hack/install-testbin.sh --demo >/dev/null

testbin-demo-node: ## what `make demo-realnode` runs: the control plane, KWOK and the real node's binaries
	@hack/install-testbin.sh --demo-node >/dev/null

prometheus: ## prometheus + promtool from Debian into ~/.cache/memfit/prometheus (no service)
	@hack/install-prometheus.sh >/dev/null

realnode: ## Debian packages for the real node (containerd, runc, CNI, docker.io, debootstrap); needs root, else the tier skips
	@hack/install-realnode.sh || echo "make realnode: packages not installed; the real-node tier will skip (docs/realnode.md)"

crds: venv ## regenerate crds/ and the chart's copy from the API models
	$(VENV)/bin/memfit crds
	$(VENV)/bin/memfit crds --out charts/memfit/files/crds

dashboard: venv ## regenerate charts/memfit/files/dashboards/memfit.json from hack/dashboard/spec.py
	$(PY) hack/dashboard/generate.py

lint: venv ## ruff, mypy --strict on the pure packages, import boundaries, CRD drift
	$(VENV)/bin/ruff check .
	$(VENV)/bin/mypy --strict $(wildcard $(PURE))
	$(VENV)/bin/lint-imports
	$(VENV)/bin/memfit crds --check
	$(VENV)/bin/memfit crds --check --out charts/memfit/files/crds
	$(PY) hack/dashboard/generate.py --check
	$(VENV)/bin/hadolint Dockerfile trainer-image/Dockerfile

test-unit: venv ## pure modules, fast
	$(PY) -m pytest tests/unit -q

test-integration: venv testbin ## real control plane + KWOK + pod runner + operator
	MEMFIT_REQUIRE_CLUSTER=$${MEMFIT_REQUIRE_CLUSTER:-1} $(PY) -m pytest tests/integration -q -ra

test-e2e: venv testbin prometheus ## helm, Prometheus, images, helm install into the local cluster
	MEMFIT_REQUIRE_CLUSTER=$${MEMFIT_REQUIRE_CLUSTER:-1} $(PY) -m pytest tests/e2e -q -ra

test-realnode: venv testbin realnode ## kubelet + containerd node running the images built from our Dockerfiles
	MEMFIT_REQUIRE_CLUSTER=$${MEMFIT_REQUIRE_CLUSTER:-1} $(PY) -m pytest tests/realnode -q -ra

test: venv testbin prometheus realnode lint ## everything this machine supports: lint + unit + trainer + integration + e2e + realnode (not the `extended` tests; the trainer tier beside the cluster tiers)
	PY=$(PY) hack/run-tests.sh

test-extended: venv testbin prometheus realnode ## the `extended` tests `make test` leaves out (docs/testing.md)
	MEMFIT_REQUIRE_CLUSTER=$${MEMFIT_REQUIRE_CLUSTER:-1} $(PY) -m pytest tests -q -ra --durations=30 -m extended

demo: venv testbin-demo ## local cluster + simulated GPU pools + operator: the quickstart to Succeeded (on the real node when it and its images are ready, else the local pod runner)
	$(PY) hack/demo.py

demo-realnode: venv testbin-demo-node realnode ## the quickstart in containers on a real kubelet node (builds the node's images on first use: about 13 min cold)
	$(PY) hack/demo.py --runtime real-node

demo-finetune: venv testbin-demo-node realnode ## a real fine-tune on the local cluster (on the real node when supported): tiny pretrained Llama + JSONL corpus on claims -> eval loss A -> B, saved model
	$(PY) hack/demo.py --finetune --dir /tmp/memfit-demo-finetune --images build

plan: venv ## offline plan of the quickstart with the built-in GPU catalog
	$(VENV)/bin/memfit plan examples/quickstart.yaml

clean: ## remove local caches inside the repo (the venv and binaries live outside)
	rm -rf .pytest_cache .mypy_cache .ruff_cache
