#!/usr/bin/env bash
# Nightly evalbeam run for cron (see crontab.example): one output folder per date, one log file per
# run, and evalbeam's exit code passed through unchanged. evalbeam exits non-zero when the run
# failed (2: unusable input, 3: pipeline failure), rejected more input rows than
# --max_rejected_fraction allows (1) or could not compute what was asked (4: every row of a source
# rejected, judge calls failed, ...); this script then exits with the same code and prints one
# line to stderr, which cron mails to MAILTO.
#
# Usage: evalbeam_nightly.sh [CONFIG_FILE]
#   CONFIG_FILE (or $EVALBEAM_NIGHTLY_CONFIG) is a bash file sourced here: see nightly.env.example.
#   Every variable below can also come from the environment.
#
#   GROUNDTRUTHS   path or glob (local, gs://, s3://); the text {run_date} becomes RUN_DATE
#   PREDICTIONS    NAME=PATH entries: a bash array in the config file, or a space-separated string;
#                  {run_date} becomes RUN_DATE
#   OUTPUT_ROOT    the run writes to OUTPUT_ROOT/RUN_DATE
#   RUN_DATE       default: today in UTC (YYYY-MM-DD); set it to re-run a past day
#   TASK           default: classification
#   EVALBEAM       default: evalbeam (cron has a short PATH: prefer an absolute path)
#   EVALBEAM_ARGS  extra arguments: a bash array in the config file, or a space-separated string
#                  (slices, thresholds, --max_rejected_fraction, runner options)
#   LOG_DIR        default: $HOME/evalbeam-logs
#   FORCE=1        run even if OUTPUT_ROOT/RUN_DATE/metrics.jsonl already exists (local outputs only)
#
# Secrets (API keys for later LLM-judge tasks) are not set here: export them in the cron
# environment from a secret store or a root-only file, never as command-line arguments, which any
# local user can read in the process list and which end up in the log below.
set -euo pipefail

config="${1:-${EVALBEAM_NIGHTLY_CONFIG:-}}"
if [[ -n "${config}" ]]; then
  # shellcheck source=/dev/null
  source "${config}"
fi

: "${GROUNDTRUTHS:?set GROUNDTRUTHS}"
: "${PREDICTIONS:?set PREDICTIONS}"
: "${OUTPUT_ROOT:?set OUTPUT_ROOT}"
RUN_DATE="${RUN_DATE:-$(date -u +%F)}"
TASK="${TASK:-classification}"
EVALBEAM="${EVALBEAM:-evalbeam}"
LOG_DIR="${LOG_DIR:-${HOME}/evalbeam-logs}"

if [[ ! "${RUN_DATE}" =~ ^[0-9]{4}-[0-9]{2}-[0-9]{2}$ ]]; then
  echo "RUN_DATE must be YYYY-MM-DD, got ${RUN_DATE}" >&2
  exit 2
fi

# PREDICTIONS and EVALBEAM_ARGS: bash arrays from the config file, or space-separated strings from
# the environment (split on spaces, without glob expansion).
if [[ "$(declare -p PREDICTIONS)" == "declare -a"* ]]; then
  predictions=("${PREDICTIONS[@]}")
else
  read -r -a predictions <<< "${PREDICTIONS}"
fi
extra_args=()
if [[ "$(declare -p EVALBEAM_ARGS 2>/dev/null)" == "declare -a"* ]]; then
  extra_args=(${EVALBEAM_ARGS[@]+"${EVALBEAM_ARGS[@]}"})
elif [[ -n "${EVALBEAM_ARGS:-}" ]]; then
  read -r -a extra_args <<< "${EVALBEAM_ARGS}"
fi

token='{run_date}'
output="${OUTPUT_ROOT%/}/${RUN_DATE}"
cmd=("${EVALBEAM}" "${TASK}" --groundtruths "${GROUNDTRUTHS//"${token}"/${RUN_DATE}}")
for p in "${predictions[@]}"; do
  cmd+=(--predictions "${p//"${token}"/${RUN_DATE}}")
done
cmd+=(--output "${output}" ${extra_args[@]+"${extra_args[@]}"})

# A run is done when its run.json, written last, says "complete" (a killed run leaves "running",
# a failed one "failed"). Only checked for local outputs; for gs:// or s3:// outputs, check before
# rerunning by hand. A rerun replaces evalbeam's own earlier outputs in the folder.
if [[ "${output}" != *://* && -z "${FORCE:-}" ]] && grep -Eq '^  "status": "complete",?$' "${output}/run.json" 2>/dev/null; then
  echo "$(date -u +%FT%TZ) ${output}/run.json says complete: nothing to do (FORCE=1 reruns)"
  exit 0
fi

mkdir -p "${LOG_DIR}"
log="${LOG_DIR}/${TASK}-${RUN_DATE}.log"

# One run at a time: a slow night must not overlap the next one (flock is in util-linux).
if command -v flock >/dev/null 2>&1; then
  exec 9>"${LOG_DIR}/.${TASK}.lock"
  if ! flock -n 9; then
    echo "another evalbeam ${TASK} run holds ${LOG_DIR}/.${TASK}.lock; not starting ${RUN_DATE}" >&2
    exit 75  # EX_TEMPFAIL
  fi
fi

{
  echo "=== $(date -u +%FT%TZ) start ${TASK} ${RUN_DATE}"
  printf 'command:'; printf ' %q' "${cmd[@]}"; printf '\n'
} >>"${log}"

set +e
"${cmd[@]}" >>"${log}" 2>&1
rc=$?
set -e

echo "=== $(date -u +%FT%TZ) end ${TASK} ${RUN_DATE} exit ${rc}" >>"${log}"
if (( rc != 0 )); then
  echo "evalbeam ${TASK} for ${RUN_DATE} exited with ${rc} (1 too many rejected rows, 2 unusable input, 3 failed, 4 incomplete): see ${log}" >&2
fi
exit "${rc}"
