# syntax=docker/dockerfile:1
# unified-gpu-exporter container image.
#   docker build -t unified-gpu-exporter .
#   docker run --rm --read-only --gpus all -p 9632:9632 \
#     -v /sys:/host/sys:ro -v ugx-state:/var/lib/unified-gpu-exporter unified-gpu-exporter
# Runs as an unprivileged user with a read-only root file system; the only writable path it
# needs is the state directory (a volume). GPU device nodes come from the container runtime
# (NVIDIA container toolkit, or --device /dev/dri --device /dev/kfd with --group-add for AMD/Intel).

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

# ---- builder: build the wheel and install it with its dependencies into a venv --------------
FROM ${PYTHON_IMAGE} AS builder
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY exporter ./exporter
COPY mappings ./mappings
RUN python -m pip wheel --no-deps --wheel-dir /dist . \
 && python -m venv /opt/venv \
 && /opt/venv/bin/pip install "$(ls /dist/*.whl)[nvidia,kubernetes]" \
 && /opt/venv/bin/python -m compileall -q /opt/venv

# ---- runtime: slim, non-root, read-only root file system compatible -------------------------
FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="unified-gpu-exporter" \
      org.opencontainers.image.description="Prometheus exporter for NVIDIA, AMD and Intel GPUs with one canonical metric schema" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
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
# A TCP connect check: works with TLS and basic auth enabled, needs no curl in the image.
HEALTHCHECK --interval=30s --timeout=5s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import socket; socket.create_connection(('127.0.0.1', 9632), timeout=4).close()"]
ENTRYPOINT ["unified-gpu-exporter"]
CMD ["--web.listen-address=:9632"]
