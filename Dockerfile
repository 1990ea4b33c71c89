# syntax=docker/dockerfile:1
# unified-gpu-exporter container image (NVIDIA: nvidia-ml-py is included; the driver's
# libnvidia-ml.so.1 comes from the host through the NVIDIA container toolkit).
#   docker build --build-arg VERSION=$(python3 -c 'import exporter; print(exporter.__version__)') \
#     -t unified-gpu-exporter .
#   docker run -d --read-only --gpus all -p 9632:9632 \
#     -v ugx-state:/var/lib/unified-gpu-exporter unified-gpu-exporter
# The container's /sys is the host's (read-only): no mount is needed.  Where the host's sysfs is
# mounted elsewhere, name it: -v /sys:/host/sys:ro ... unified-gpu-exporter --path.sysfs=/host/sys
# (arguments replace CMD: repeat --web.listen-address and --state.dir if you change them).
# Runs as an unprivileged user with a read-only root file system; the only writable path is the
# state directory (a volume: learned baselines persist across restarts and upgrades).
#
# Variants (build arguments):
#   EXTRAS=nvidia,kubernetes (default)  NVML + Kubernetes pod attribution.
#   EXTRAS=nvidia,kubernetes,otlp       + the OTLP push over HTTP (exporters.otlp, docs/otel-guide.md);
#                                       otlp-grpc instead of otlp for protocol: grpc.
#   AMD: amdgpu sysfs works in every variant (--device /dev/dri --device /dev/kfd, --group-add
#     video/render).  amdsmi needs ROCm's libamd_smi.so, which is not on PyPI: build FROM a ROCm
#     base image (e.g. --build-arg PYTHON_IMAGE=<rocm/dev-ubuntu-24.04 with python3.11>) and
#     EXTRAS=nvidia,kubernetes,amd.
#   Intel: i915/xe sysfs works in every variant (--device /dev/dri).  Level Zero Sysman needs the
#     Level Zero loader (libze_loader.so.1, Debian package libze1) and EXTRAS=...,intel (pyzes).
#     See README "Container".

# A pinned base (tag and, for reproducible builds, its digest: PYTHON_IMAGE=python:3.11.11-slim-bookworm@sha256:...)
ARG PYTHON_IMAGE=python:3.11.11-slim-bookworm

# ---- builder: build the wheel and install it with its pinned dependencies into a venv --------
FROM ${PYTHON_IMAGE} AS builder
ARG EXTRAS=nvidia,kubernetes
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY exporter ./exporter
COPY mappings ./mappings
RUN python -m venv /opt/venv \
 && /opt/venv/bin/pip install --constraint constraints.txt setuptools \
 && /opt/venv/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /dist . \
 && /opt/venv/bin/pip install --constraint constraints.txt "$(ls /dist/*.whl)[${EXTRAS}]" \
 && /opt/venv/bin/pip uninstall --yes setuptools \
 && /opt/venv/bin/python -m compileall -q /opt/venv

# ---- runtime: slim, non-root, read-only root file system compatible -------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION
LABEL org.opencontainers.image.title="unified-gpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA, AMD and Intel GPUs with one canonical metric schema" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
# STATE_DIRECTORY: the exporter's default --state.dir (as under systemd), so baselines persist
# whatever arguments replace CMD
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    STATE_DIRECTORY=/var/lib/unified-gpu-exporter
COPY --from=builder /opt/venv /opt/venv
# Fixed numeric non-root user (65532, as in distroless "nonroot"); video/render access to GPU
# device nodes is granted at run time (--group-add / pod supplementalGroups).
RUN groupadd --system --gid 65532 exporter \
 && useradd --system --uid 65532 --gid 65532 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin exporter \
 && install -d -o 65532 -g 65532 -m 0700 /var/lib/unified-gpu-exporter
VOLUME ["/var/lib/unified-gpu-exporter"]
USER 65532:65532
EXPOSE 9632
# GET /healthz at the address (and scheme) the running exporter's own flags configure; no curl.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-m", "exporter.serve.healthcheck"]
ENTRYPOINT ["unified-gpu-exporter"]
CMD ["--web.listen-address=:9632", "--state.dir=/var/lib/unified-gpu-exporter"]
