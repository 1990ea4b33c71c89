#!/usr/bin/env bash
# Device check for the NVML source on a machine with a real NVIDIA GPU and this repo checked out.
#
#   deploy/device-check/nvml_check.sh            # results in $OUT or ./nvml-check-out
#
# Python packages: uses the current interpreter if it can import pynvml; otherwise creates a venv
# (.venv-nvml-check) and installs nvidia-ml-py + the project (needs network).  Offline: put the
# packages (pynvml.py, yaml, pydantic, ...) in a directory and pass it as PYTHONPATH.
# Steps: 1) nvml_probe.py: raw readings of 3 polls, GPM support per metric id, memory identity;
#        2) `python -m exporter --once --collector.nvml` and a check that every canonical NVIDIA
#           metric this GPU should produce is present.  Total runtime < 60 s.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/nvml-check-out}"
export OUT
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
log() { echo "[nvml_check] $*" | tee -a "$OUT/check.log"; }

log "host: $(uname -a)"
command -v nvidia-smi >/dev/null && timeout 15 nvidia-smi -L 2>&1 | tee -a "$OUT/check.log"
log "python: $($PY --version 2>&1)  PYTHONPATH=${PYTHONPATH:-}"

if ! $PY -c 'import pynvml' 2>/dev/null; then
  log "pynvml not importable: creating .venv-nvml-check"
  $PY -m venv .venv-nvml-check && PY=.venv-nvml-check/bin/python \
    && timeout 120 $PY -m pip install -q nvidia-ml-py -e . 2>&1 | tail -3 | tee -a "$OUT/check.log"
fi

log "step 1: probe"
timeout 45 $PY deploy/device-check/nvml_probe.py 2>&1 | tee "$OUT/probe.log"

log "step 2: --once"
if $PY -c 'import exporter.cli, yaml, pydantic, prometheus_client' 2>/dev/null; then
  timeout 30 $PY -m exporter --once --collector.nvml \
      $(for c in dcgm amdgpu amdsmi intel levelzero; do echo "--no-collector.$c"; done) \
      >"$OUT/once.prom" 2>"$OUT/once.stderr"
  log "--once rc=$? lines=$(wc -l <"$OUT/once.prom")"
  $PY - "$OUT/once.prom" "$OUT/raw_readings.json" <<'EOF' 2>&1 | tee -a "$OUT/check.log"
import json, re, sys
prom = open(sys.argv[1]).read()
present = set(re.findall(r"^(gpu_[a-z_]+?)(?:\{| )", prom, re.M))
raw = json.load(open(sys.argv[2])) if sys.argv[2] else {}
fields = {r["field"] for p in raw.get("polls", []) for r in p["readings"]}
expect = {  # canonical metric: raw field(s) that must have been read for it to be expected
    "gpu_compute_utilization_percent": "utilization.gpu", "gpu_memory_used_bytes": "memory.used",
    "gpu_memory_total_bytes": "memory.total", "gpu_memory_free_bytes": "memory.free",
    "gpu_memory_reserved_bytes": "memory.reserved", "gpu_memory_utilization_percent": "memory.used",
    "gpu_temperature_celsius": "temperature.gpu", "gpu_power_watts": "power.usage",
    "gpu_power_limit_watts": "power.limit.enforced", "gpu_energy_joules_total": "energy.total",
    "gpu_clock_mhz": "clock.sm", "gpu_clock_max_mhz": "clock_max.memory",
    "gpu_memory_bus_width_bytes": "memory.bus_width", "gpu_memory_peak_bandwidth_gbps": "memory.bus_width",
    "gpu_throttle_active": "clocks_event_reasons.SwPowerCap",
    "gpu_pcie_bytes_total": "field.PCIE_COUNT_TX_BYTES", "gpu_pcie_replays_total": "field.PCIE_REPLAY_COUNTER",
    "gpu_interconnect_bytes_total": "field.NVLINK_THROUGHPUT_DATA_TX",
    "gpu_ecc_errors_total": "ecc.volatile.corrected", "gpu_memory_remapped_rows": "remapped_rows.pending",
    "gpu_compute_occupancy_percent": "gpm.sm_occupancy", "gpu_sm_active_percent": "gpm.sm_util",
    "gpu_tensor_utilization_percent": "gpm.any_tensor_util",
    "gpu_memory_bandwidth_utilization_percent": "utilization.memory",
    "gpu_memory_bandwidth_gbps": "gpm.dram_bw_util",
}
missing = [m for m, f in expect.items() if f in fields and m not in present]
print("canonical present:", sorted(present))
print("expected but missing:", missing or "none")
print("not expected (raw field absent on this GPU):", sorted(m for m, f in expect.items() if f not in fields))
EOF
else
  log "core not importable here (yaml/pydantic/prometheus_client); --once skipped"
fi
log "done; files in $OUT"
