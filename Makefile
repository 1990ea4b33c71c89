# unified-gpu-exporter: the two commands a newcomer needs are `make run` and `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
EXPORTER := $(VENV)/bin/unified-gpu-exporter
ARGS   ?=

.PHONY: run test install install-run system-deps docs check-docs bench soak lint clean kubernetes fleet print-address dist

# constraints.txt pins every dependency (the image and CI install the same versions).
# Two steps: what the exporter needs to run (make run), then the test toolchain (make test,
# make install; with the release tools, which tests/test_release.py runs). A venv made by the
# second has the first too.
$(VENV)/.runtime: pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet --constraint constraints.txt -e '.[nvidia]'
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install --quiet --constraint constraints.txt -e '.[test,release,nvidia,otlp,otlp-grpc]'
	touch $@

install-run: $(VENV)/.runtime
install: $(VENV)/.installed

## make run: install the exporter (runtime dependencies only) into .venv and start it (on :9632
## unless ARGS has --web.listen-address); with no GPU found it serves the built-in simulated node.
# the listen addresses ARGS gives (both --web.listen-address=A and --web.listen-address A), else :9632
LISTEN = $(shell printf '%s\n' $(ARGS) | awk 'f {print; f=0; next} /^--web\.listen-address=/ {sub(/^[^=]*=/, ""); print; next} /^--web\.listen-address$$/ {f=1}' | paste -sd' ' -)
ADDRESS = $(or $(LISTEN),:9632)

run: install-run
	@if $(EXPORTER) --list-devices >/dev/null 2>&1; then \
		echo "GPUs found: serving real devices on $(ADDRESS)"; exec $(EXPORTER) $(ARGS); \
	else \
		echo "no GPU found: serving the built-in SIMULATED node on $(ADDRESS) (--simulate)"; \
		exec $(EXPORTER) --simulate $(ARGS); \
	fi

## make print-address ARGS=...: the address `make run` announces (used by its test)
print-address:
	@echo $(ADDRESS)

## make test: install with the test toolchain (system packages too where possible) and run the
## whole suite.
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

## make docs: regenerate the generated docs from this checkout, installing nothing (the generators
## need only pydantic and PyYAML: the venv's Python when there is one, else $(PYTHON)); a file is
## replaced only when its generator succeeded.
DOCS_PY = $(if $(wildcard $(PY)),$(PY),$(PYTHON))
docs:
	$(DOCS_PY) -m exporter.docs > docs/metrics.md.tmp && mv docs/metrics.md.tmp docs/metrics.md \
		|| { rm -f docs/metrics.md.tmp; exit 1; }
	$(DOCS_PY) -m exporter.otlp.docs > docs/otel.md.tmp && mv docs/otel.md.tmp docs/otel.md \
		|| { rm -f docs/otel.md.tmp; exit 1; }
	$(DOCS_PY) -m exporter.run.config_reference > docs/configuration.md.tmp \
		&& mv docs/configuration.md.tmp docs/configuration.md || { rm -f docs/configuration.md.tmp; exit 1; }
	$(DOCS_PY) scripts/gen-alert-docs.py
	$(DOCS_PY) scripts/gen-setting-docs.py

## make kubernetes: regenerate what deploy/kubernetes derives from other files (the
## PrometheusRule from deploy/prometheus/rules, dashboard ConfigMaps from deploy/grafana) and
## the kubelet pod-resources protobuf module from its vendored .proto.
kubernetes: install
	$(PY) scripts/gen-alertmanager.py
	$(PY) scripts/gen-kubernetes-monitoring.py
	cd exporter/enrich && ../../$(PY) -m grpc_tools.protoc -I. --python_out=. podresources_v1.proto

# bench/run.py compiles the exporter's bytecode first (an installed wheel and the image carry it)
bench: install system-deps
	$(PY) bench/run.py

soak: install system-deps
	mkdir -p "$(ARTIFACTS_DIR)"
	SOAK=1 ARTIFACTS_DIR="$(ARTIFACTS_DIR)" $(PY) -m pytest -m soak $(PYTEST_ARGS)

lint: install
	$(VENV)/bin/ruff check .

## make dist: the release artefacts in dist/ (docs/releasing.md): wheel, sdist, the image build
## context, the pinned constraints, a CycloneDX SBOM of what a wheel install pulls in, SHA256SUMS.
$(VENV)/.release: $(VENV)/.runtime
	$(PY) -m pip install --quiet --constraint constraints.txt -e '.[release]'
	touch $@

dist: $(VENV)/.release
	$(PY) scripts/make-dist.py --out dist

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
