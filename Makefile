# unified-gpu-exporter: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXPORTER := $(VENV)/bin/unified-gpu-exporter
ARGS   ?=

.PHONY: run test install system-deps docs check-docs bench soak lint clean kubernetes fleet print-address

# constraints.txt pins every dependency (the image and CI install the same versions)
$(VENV)/.installed: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --constraint constraints.txt -e '.[test,nvidia,otlp,otlp-grpc]'
	touch $@

install: $(VENV)/.installed

## make run: install into .venv and start the exporter (on :9632 unless ARGS has
## --web.listen-address); with no GPU found it serves the built-in simulated node.
# the listen addresses ARGS gives (both --web.listen-address=A and --web.listen-address A), else :9632
LISTEN = $(shell printf '%s\n' $(ARGS) | awk 'f {print; f=0; next} /^--web\.listen-address=/ {sub(/^[^=]*=/, ""); print; next} /^--web\.listen-address$$/ {f=1}' | paste -sd' ' -)
ADDRESS = $(or $(LISTEN),:9632)

run: install
	@if $(EXPORTER) --list-devices >/dev/null 2>&1; then \
		echo "GPUs found: serving real devices on $(ADDRESS)"; exec $(EXPORTER) $(ARGS); \
	else \
		echo "no GPU found: serving the built-in SIMULATED node on $(ADDRESS) (--simulate)"; \
		exec $(EXPORTER) --simulate $(ARGS); \
	fi

## make print-address ARGS=...: the address `make run` announces (used by its test)
print-address:
	@echo $(ADDRESS)

## make test: install (system packages too where possible) and run the whole suite.
# Tests keep their artefacts (the landing page's screenshot, the demo's alert and panel report)
# under ARTIFACTS_DIR; build/ is git-ignored, and CI keeps build/artifacts.
ARTIFACTS_DIR ?= $(CURDIR)/build/artifacts

test: install system-deps
	mkdir -p "$(ARTIFACTS_DIR)"
	ARTIFACTS_DIR="$(ARTIFACTS_DIR)" $(PY) -m pytest $(PYTEST_ARGS)

## make fleet: the reference fleet on this machine (deploy/fleet, docs/fleet.md): simulated nodes in
## four clusters on three clouds, Prometheus agents, VictoriaMetrics, vmalert, Alertmanager.
## Prints where to look; Ctrl-C stops it all.  FLEET_ARGS=--real-timing keeps the rules' for:.
fleet: install system-deps
	$(PY) deploy/fleet/fleet.py $(FLEET_ARGS)

system-deps:
	@scripts/install-system-deps.sh

docs: install
	$(PY) -m exporter.docs > docs/metrics.md
	$(PY) -m exporter.otlp.docs > docs/otel.md
	$(PY) scripts/gen-alert-docs.py

## make kubernetes: regenerate what deploy/kubernetes derives from other files (the
## PrometheusRule from deploy/prometheus/rules, dashboard ConfigMaps from deploy/grafana) and
## the kubelet pod-resources protobuf module from its vendored .proto.
kubernetes: install
	$(PY) scripts/gen-alertmanager.py
	$(PY) scripts/gen-kubernetes-monitoring.py
	cd exporter/enrich && ../../$(PY) -m grpc_tools.protoc -I. --python_out=. podresources_v1.proto

# bytecode first: an installed wheel and the image carry it (compileall in the Dockerfile), while a
# checkout run with PYTHONDONTWRITEBYTECODE=1 would compile every module at each start (~0.2 s
# of the spawn-to-first-scrape time measured here)
bench: install system-deps
	$(PY) -m compileall -q exporter >/dev/null
	$(PY) bench/run.py

soak: install system-deps
	mkdir -p "$(ARTIFACTS_DIR)"
	SOAK=1 ARTIFACTS_DIR="$(ARTIFACTS_DIR)" $(PY) -m pytest -m soak $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
