#!/bin/bash
# Slurm prolog/epilog: tell unified-gpu-exporter which job holds which GPU (docs/jobs.md).
#
# Installed once, run as both (slurm.conf, on every GPU node):
#   PrologFlags=Alloc                       # the prolog runs at allocation, before the first step
#   Prolog=/etc/slurm/prolog.d/*            # with this file linked as prolog.d/50-gpu-job-map.sh
#   Epilog=/etc/slurm/epilog.d/*            # and as epilog.d/50-gpu-job-map.sh
# The script runs as root under slurmd; it reads SLURM_SCRIPT_CONTEXT (prolog_slurmd /
# epilog_slurmd) or its first argument (prolog | epilog).
#
# It writes one file per GPU of the job into UGX_JOB_MAP_DIR, in one of the two formats the
# exporter reads (enrich.hpc_jobs in its config):
#   UGX_JOB_MAP_FORMAT=json  AMD device-metrics-exporter's: a JSON object with SLURM_JOB_ID,
#                            SLURM_JOB_USER, SLURM_JOB_PARTITION, SLURM_CLUSTER_NAME (default)
#   UGX_JOB_MAP_FORMAT=dcgm  dcgm-exporter's --hpc-job-mapping-dir: one job id per line
# The epilog takes its job out (the file goes when no job is left), so the job leaves the GPU's
# series within one poll.
#
# The job's GPUs, first found: SLURM_JOB_GPUS (Slurm's GPU ids, set for Prolog/Epilog with GRES
# gpu), CUDA_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES, ZE_AFFINITY_MASK (NVIDIA, AMD, Intel), else
# the NVIDIA device nodes (major 195) the job's cgroup-v1 devices controller allows
# (ConstrainDevices=yes).  A file is named by the GPU's index (the exporter's `gpu` label): Slurm's
# ids match it where gres.conf lists the GPUs in PCI bus order, as AutoDetect=nvml/rsmi does.
#
# A prolog that fails drains the node, so this script always exits 0 and reports problems on
# stderr (slurmd's log).
set -u
umask 022

DIR="${UGX_JOB_MAP_DIR:-/run/unified-gpu-exporter/jobs}"
FORMAT="${UGX_JOB_MAP_FORMAT:-json}"
CGROUP_ROOT="${UGX_CGROUP_ROOT:-/sys/fs/cgroup}"

warn() { echo "gpu-job-map: $*" >&2; }

context="${1:-${SLURM_SCRIPT_CONTEXT:-}}"
case "$context" in
  prolog|prolog_slurmd) action=prolog ;;
  epilog|epilog_slurmd) action=epilog ;;
  *) warn "unknown context '${context}' (run as Prolog/Epilog or with prolog|epilog)"; exit 0 ;;
esac
job="${SLURM_JOB_ID:-}"
if ! [[ "$job" =~ ^[0-9A-Za-z][0-9A-Za-z_.+-]{0,63}$ ]]; then
  warn "no valid SLURM_JOB_ID"; exit 0
fi
case "$FORMAT" in json|dcgm) ;; *) warn "UGX_JOB_MAP_FORMAT must be json or dcgm"; exit 0 ;; esac

gpu_ids() {
  local list="${SLURM_JOB_GPUS:-${CUDA_VISIBLE_DEVICES:-${ROCR_VISIBLE_DEVICES:-${ZE_AFFINITY_MASK:-}}}}"
  if [ -z "$list" ]; then  # the devices the job's cgroup lets through (cgroup v1)
    local f
    for f in "$CGROUP_ROOT"/devices/slurm/uid_*/job_"$job"/devices.list; do
      [ -r "$f" ] || continue
      list=$(sed -n 's/^c 195:\([0-9]\{1,3\}\) .*/\1/p' "$f" | paste -sd, -)
      break
    done
  fi
  local id
  IFS=',' read -ra ids <<< "$list"
  for id in "${ids[@]}"; do
    id="${id%%.*}"  # ZE_AFFINITY_MASK's device.subdevice: the device
    [[ "$id" =~ ^[0-9]{1,4}$ ]] && echo "$((10#$id))"
  done | sort -un
}

json_string() {  # a JSON string of $1: quotes and backslashes escaped, control characters dropped
  local s="${1//\\/\\\\}"
  s="${s//\"/\\\"}"
  printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\037')"
}

put() {  # replace file $1 with stdin, atomically (the exporter never reads half a file)
  local tmp
  tmp=$(mktemp "$DIR/.gpu-job-map.XXXXXX") || return 1
  cat > "$tmp" && chmod 0644 "$tmp" && mv -f "$tmp" "$DIR/$1" || { rm -f "$tmp"; return 1; }
}

if [ -L "$DIR" ]; then warn "$DIR is a symlink: refused"; exit 0; fi
if [ ! -d "$DIR" ]; then
  [ "$action" = epilog ] && exit 0
  mkdir -p -m 0755 "$DIR" || { warn "cannot create $DIR"; exit 0; }
fi
gpus=$(gpu_ids)
[ -n "$gpus" ] || exit 0

exec 9>"$DIR/.lock" || { warn "cannot lock $DIR"; exit 0; }
flock -w 10 9 || warn "lock busy; going on"
for gpu in $gpus; do
  file="$DIR/$gpu"
  if [ "$FORMAT" = json ]; then
    if [ "$action" = prolog ]; then
      {
        printf '{"SLURM_JOB_ID": %s, "SLURM_JOB_USER": %s, ' "$(json_string "$job")" "$(json_string "${SLURM_JOB_USER:-}")"
        printf '"SLURM_JOB_PARTITION": %s, "SLURM_CLUSTER_NAME": %s, ' "$(json_string "${SLURM_JOB_PARTITION:-}")" \
          "$(json_string "${SLURM_CLUSTER_NAME:-}")"
        printf '"SLURM_JOB_GPUS": %s, "SLURM_SCRIPT_CONTEXT": %s}\n' "$(json_string "${SLURM_JOB_GPUS:-}")" \
          "$(json_string "$context")"
      } | put "$gpu" || warn "cannot write $file"
    elif [ -f "$file" ] && [ ! -L "$file" ] && grep -q "\"SLURM_JOB_ID\": \"$job\"" "$file"; then
      rm -f "$file"  # only this job's file: a later job sharing the GPU keeps its own
    fi
  else
    others=""
    if [ -f "$file" ] && [ ! -L "$file" ]; then
      others=$(grep -vxF -e "$job" -e 0 -e '' "$file" | head -n 15)
    fi
    if [ "$action" = prolog ]; then
      printf '%s\n' $others "$job" | put "$gpu" || warn "cannot write $file"
    elif [ -n "$others" ]; then
      printf '%s\n' $others | put "$gpu" || warn "cannot write $file"
    else
      rm -f "$file"
    fi
  fi
done
exit 0
