#!/usr/bin/env bash
# The one prepared script for a short GPU slot (issue 13): all of it fits in 7 minutes of GPU time,
# start-up, probe, runs, calibration and validation included, and every record and figure is
# written under the output folder the moment it exists, so a slot cut short keeps what it measured.
#
#   bash benchmarks/gpu_session.sh [--out DIR] [--base PROFILE] [--dry-run]
#
# --out DIR     where everything goes (default: $OUT when set, else runs/gpu-session)
# --base NAME   the datasheet profile of the GPU (default h200); the probe keeps its peaks
# --dry-run     the same path on a CPU with a tiny model (under 2 minutes): for tests and rehearsal
#
# Steps, each under its own time limit, the whole under a 400 s budget (a step that would not fit
# in what is left is skipped and said so in session.log):
#  1. nvidia-smi -> nvidia-smi.txt
#  2. probe (matmul curve, copy bandwidth, collectives) -> probed.toml; the trainer's raw read of a
#     traced step against prof.events() on this device (benchmarks/trace_read_speed.py) -> trace_read.txt
#  3. 6 short runs of 350M and 760M GPT-3 shapes in bf16 across micro-batch and recompute
#     (benchmarks/trainer_gpu.py) -> runs/<name>/{record.json,steps.csv,tensorboard/}, runs/summary.json
#  4. with more than one GPU: one tp2 run and one pp2 run -> runs/tp2, runs/pp2
#  5. planner calibrate on the single-GPU runs (leave-one-out error printed) -> calibrated.toml
#  6. planner validate of every run, probed and calibrated profiles -> validate-*.txt / .json, .png
#  7. in what is left: the 760M mb8 run under two memory caps (trainer_gpu.py --ceiling) -> ceiling/
# Afterwards copy the folder to benchmarks/runs/<gpu>/ and commit it.
set -uo pipefail
OUT_DIR=${OUT:-runs/gpu-session}
BASE=h200
DRY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --out) OUT_DIR=$2; shift 2 ;;
    --base) BASE=$2; shift 2 ;;
    --dry-run) DRY=1; shift ;;
    *) echo "gpu_session.sh: unknown argument '$1' (allowed: --out DIR, --base PROFILE, --dry-run)" >&2; exit 2 ;;
  esac
done
mkdir -p "$OUT_DIR/runs" || exit 2
LOG="$OUT_DIR/session.log"
START=$(date +%s)
BUDGET_S=400  # of the 7 minutes: 20 s left for the machine's own start and the copy back
log() { echo "[$(date +%T) +$(( $(date +%s) - START ))s] $*" | tee -a "$LOG"; }
# step NAME LIMIT_S CMD...: run CMD with its output in session.log, under min(LIMIT_S, what is left).
step() {
  local name=$1 limit=$2; shift 2
  local left=$(( START + BUDGET_S - $(date +%s) ))
  if [ "$left" -lt 15 ]; then log "skip $name: only ${left}s of the budget left"; return 1; fi
  [ "$limit" -gt "$left" ] && limit=$left
  log "$name (limit ${limit}s)"
  timeout --kill-after=10 "$limit" "$@" >> "$LOG" 2>&1
  local rc=$?
  [ $rc -ne 0 ] && log "$name: exit $rc$([ $rc -eq 124 ] && echo ' (timed out)')"
  return $rc
}

if [ "$DRY" = 1 ]; then
  GPUS=2  # rehearse the multi-GPU step too, on 2 CPU processes
  PROBE=(--device cpu --nprocs 2 --quick)
  RUNS=(--tiny --steps 6)
  MODEL=(--arch gpt --layers 2 --hidden 64 --heads 4 --vocab 512 --seq-len 64 --dropout 0 --precision fp32)
  STEPS=6
  FACTORS=matmul,layer_overhead_s
  DEVICE=cpu
else
  GPUS=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
  PROBE=(--base "$BASE" --nprocs 1 --quick)
  RUNS=(--steps 30 --gpu "$BASE")
  MODEL=(--preset gpt3-350m --seq-len 2048 --dropout 0 --precision bf16 --gpu "$BASE")
  STEPS=30
  FACTORS=matmul,memory,layer_overhead_s
  DEVICE=cuda
fi
log "output: $OUT_DIR; dry run: $DRY; GPUs: $GPUS; base profile: $BASE"
step nvidia-smi 10 bash -c "nvidia-smi > '$OUT_DIR/nvidia-smi.txt' 2>&1 || echo 'no nvidia-smi' > '$OUT_DIR/nvidia-smi.txt'"
step probe 60 python -m planner probe --out "$OUT_DIR/probed.toml" "${PROBE[@]}"
step trace-read 30 bash -c "python benchmarks/trace_read_speed.py --device $DEVICE > '$OUT_DIR/trace_read.txt' 2>&1"
step runs 200 python benchmarks/trainer_gpu.py --out "$OUT_DIR/runs" "${RUNS[@]}"
if [ "$GPUS" -gt 1 ]; then
  for layout in "tp2:--tp 2 --sequence-parallel" "pp2:--pp 2"; do
    name=${layout%%:*}
    # shellcheck disable=SC2086
    step "$name" 60 python -m reference_trainer.launch "${MODEL[@]}" ${layout#*:} --nproc-per-node 2 \
      --micro-batch 4 --global-batch 16 --steps "$STEPS" --trace-steps 1 --profile-warmup-steps 2 \
      --checkpoint-interval 0 --run-name "$name" --runs-dir "$OUT_DIR/runs"
  done
fi
SINGLE=$(ls -d "$OUT_DIR"/runs/*/record.json 2>/dev/null | grep -v -e '/tp2/' -e '/pp2/' | xargs -r -n1 dirname)
if [ -f "$OUT_DIR/probed.toml" ] && [ -n "$SINGLE" ]; then
  # shellcheck disable=SC2086
  step calibrate 60 python -m planner calibrate $SINGLE --base "$OUT_DIR/probed.toml" --out "$OUT_DIR/calibrated.toml" \
    --factors "$FACTORS" --parts
  for profile in probed calibrated; do
    [ -f "$OUT_DIR/$profile.toml" ] || continue
    step "validate ($profile)" 30 bash -c "python -m planner validate '$OUT_DIR/runs' --gpu '$OUT_DIR/$profile.toml' \
      --plot '$OUT_DIR/validate-$profile.png' > '$OUT_DIR/validate-$profile.txt' && python -m planner validate \
      '$OUT_DIR/runs' --gpu '$OUT_DIR/$profile.toml' --format json > '$OUT_DIR/validate-$profile.json'"
  done
else
  log "no probe or no run record: calibration skipped"
fi
# Last, in what is left of the budget: the 760M mb8 run again under two memory caps (its reserved
# peak; its allocated peak + 2%), its step time against the uncapped run's (issue 14's memory ceiling).
if [ -f "$OUT_DIR/runs/760m-mb8/record.json" ]; then
  step ceiling 60 python benchmarks/trainer_gpu.py --out "$OUT_DIR/ceiling" "${RUNS[@]}" --ceiling "$OUT_DIR/runs/760m-mb8"
fi
find "$OUT_DIR" -name checkpoints -type d -prune -exec rm -rf {} + 2>/dev/null
log "done in $(( $(date +%s) - START ))s; records: $(ls "$OUT_DIR"/runs/*/record.json 2>/dev/null | wc -l)"
