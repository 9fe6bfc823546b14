#!/usr/bin/env bash
# trm_sudoku on a TPU v4-64, end to end (docs/tpu_runbook.md explains each step):
#   TPU_PROJECT=my-project BUCKET=gs://my-trm-runs bash launch/trm_sudoku_v4_64.sh
# Re-running it after a preemption resumes the run (same RUN_NAME, same BUCKET).
# DRY_RUN=1 prints every gcloud command instead of running it. SPOT=0 asks for on-demand capacity.
set -euo pipefail
cd "$(dirname "$0")/.."

: "${TPU_PROJECT:?set TPU_PROJECT to your Google Cloud project}"
: "${BUCKET:?set BUCKET to a gs:// bucket in us-central2 for checkpoints}"
RUN_NAME="${RUN_NAME:-trm-sudoku-v4-64}"
PYTHON="${PYTHON:-python}"
flags=()
[ "${DRY_RUN:-0}" = 1 ] && flags+=(--dry-run)
spot=()
[ "${SPOT:-1}" = 1 ] && spot+=(--spot)

# launcher flags go right after the step: everything after '--' belongs to the remote command
tpu() { local step=$1; shift; "$PYTHON" -m launch.tpu "$step" "${flags[@]}" "$@"; }

if [ "${DRY_RUN:-0}" = 1 ] || ! "$PYTHON" -m launch.tpu status >/dev/null 2>&1; then
  tpu create "${spot[@]}"
fi
echo "wait until 'python -m launch.tpu status' shows ACTIVE, then press enter" >&2
[ "${DRY_RUN:-0}" = 1 ] || read -r _
tpu setup
tpu exec -- python -m data.sudoku --output-dir data_out/sudoku-extreme-1k-aug-1000 \
  --subsample-size 1000 --num-aug 1000
tpu run --run-name "$RUN_NAME" --out-dir "$BUCKET/runs" \
  ${WANDB_API_KEY:+--env "WANDB_API_KEY=$WANDB_API_KEY"} \
  -- +experiment=trm_sudoku mesh=v4-64
tpu logs --run-name "$RUN_NAME"
