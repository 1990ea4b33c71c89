#!/usr/bin/env bash
# Install the system packages the test suite uses (promtool, amtool, a real Prometheus and
# Alertmanager, node_exporter for the benchmark peer, systemd-analyze, openssl, victoria-metrics
# with vmagent/vmalert, kubectl, a one-node Slurm with munge; .ci/run installs the same list).  As root with apt
# (CI, containers) they are installed; otherwise the missing ones are listed and the tests that
# need them are skipped, each naming its package.
set -u
need=(
  "prometheus:prometheus"
  "promtool:prometheus"
  "prometheus-alertmanager:prometheus-alertmanager"
  "amtool:prometheus-alertmanager"
  "victoria-metrics:victoria-metrics"
  "vmagent:victoria-metrics"
  "vmalert:victoria-metrics"
  "prometheus-node-exporter:prometheus-node-exporter"
  "systemd-analyze:systemd"
  "openssl:openssl"
  "victoria-metrics:victoria-metrics"
  "vmagent:victoria-metrics"
  "vmalert:victoria-metrics"
  "kubectl:kubectl"
  "chromium:chromium"
  "slurmctld:slurmctld"
  "slurmd:slurmd"
  "sbatch:slurm-client"
  "munged:munge"
)
missing=()
for entry in "${need[@]}"; do
  bin=${entry%%:*}; pkg=${entry#*:}
  command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t pkgs < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  echo "installing system packages: ${pkgs[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null && apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null \
    || { echo "error: apt-get install ${pkgs[*]} failed" >&2; [ "${CI:-}" = true ] && exit 1; }
  # the Debian packages start services on install in some environments; tests start their own
  for svc in prometheus prometheus-alertmanager prometheus-node-exporter victoria-metrics; do
    (command -v systemctl >/dev/null && systemctl stop "$svc") >/dev/null 2>&1 || true
  done
else
  echo "not root or no apt-get: missing system packages ${pkgs[*]}; the tests that need them will be skipped" >&2
  [ "${CI:-}" = true ] && { echo "error: CI=true and system packages are missing" >&2; exit 1; }
fi
exit 0
