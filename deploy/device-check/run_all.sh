#!/usr/bin/env bash
# The whole device check in one run, for a machine lent with one NVIDIA GPU (about 5 minutes):
#
#   bash deploy/device-check/run_all.sh             # results in $OUT (or ./device-check-out)
#   bash deploy/device-check/run_all.sh nvml mps    # only the steps named
#
#   1. nvml_check.sh        NVML readings, GPM support per metric, memory identity, `--once`
#   2. nvml_load_check.py   the exporter as a default install through idle / one copy / two
#                           copies / power-capped matmul / matmul + copy / idle: detection
#                           states alone and co-located
#   3. nvml_mps_check.py    an MPS pair: what NVML names under MPS and the exporter's states
#
# Wheels the machine lacks (pydantic, bcrypt, ... at constraints.txt's versions; see
# nvml_load_check.py's doc) are installed from ./.whl into ./.device-pylib when present.  Each
# step has its own time limit, so one that hangs loses only itself.  $OUT receives at most eight
# files (what the device tool brings back): device-check.tar.gz with every step's files, and the
# summaries and state tables side by side for reading without unpacking.
set -u
cd "$(dirname "$0")/../.."
OUT="${OUT:-$PWD/device-check-out}"
WORK="$(mktemp -d /tmp/device-check.XXXXXX)"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .device-pylib .whl/*.whl >"$WORK/pip.log" 2>&1 || echo "wheel install failed: $WORK/pip.log"
fi
export PYTHONPATH="$PWD/.device-pylib${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1

STEPS=" ${*:-nvml load mps} "
bundle() {  # after every step: a run stopped by the device tool's limit still brings back the earlier ones
  tar czf "$OUT/device-check.tar.gz" -C "$WORK" .
  cp "$WORK/run_all.log" "$OUT/" 2>/dev/null
}
step() {  # name seconds command...: one step, its output in $WORK/<name>/, its rc in the log
  local name=$1 secs=$2; shift 2
  [[ $STEPS == *" $name "* ]] || return 0
  mkdir -p "$WORK/$name"
  local t0=$SECONDS
  OUT="$WORK/$name" timeout -k 10 "$secs" "$@" >"$WORK/$name/stdout.log" 2>&1
  echo "[run_all] $name rc=$? in $((SECONDS - t0)) s" | tee -a "$WORK/run_all.log"
  bundle
}

{ date -u; uname -a; timeout 20 nvidia-smi; python3 --version; } >"$WORK/host.txt" 2>&1
# limits: 60 + 340 + 150 s, with the 10 s kill graces and the setup about 590 s at worst, inside
# the device tool's 600 s a command (seen: 8, 210, 73 s); each step bundles what it recorded
step nvml 60 bash deploy/device-check/nvml_check.sh
step load 340 python3 deploy/device-check/nvml_load_check.py
step mps 150 python3 deploy/device-check/nvml_mps_check.py
cp "$WORK/nvml/summary.txt" "$OUT/nvml_summary.txt" 2>/dev/null
cp "$WORK/load/state_table.txt" "$OUT/load_state_table.txt" 2>/dev/null
cp "$WORK/mps/mps_summary.txt" "$OUT/mps_summary.txt" 2>/dev/null
cp "$WORK/mps/mps_state_table.txt" "$OUT/mps_state_table.txt" 2>/dev/null
