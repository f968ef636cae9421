#!/usr/bin/env bash
# The one prepared script for a session that has a GPU (issues 3 and 4): everything in one go,
# results under $OUT (the device tool brings $OUT back). Run from the repository root:
#   OUT=/some/dir bash benchmarks/gpu_session.sh [BASE_PROFILE]      (default base: h200)
# 1. probe the GPU against its datasheet profile; 2. issue 3's runs (a 760M GPT in bf16, 4
# micro-batch/recompute settings, MFU); 3. issue 4's grid on one GPU (model size, sequence length,
# micro-batch, recompute); 4. calibrate on the even runs, validate the odd ones (step time, and
# peak memory against torch.cuda.max_memory_allocated), with a plot.
set -euo pipefail
BASE=${1:-h200}
OUT=${OUT:?set OUT to a folder}
GPU_DIR="$OUT/benchmarks/runs/$BASE"
mkdir -p "$GPU_DIR" "$OUT/hardware_profiles/calibrated"
log() { echo "[$(date +%T)] $*" | tee -a "$OUT/session.log"; }
log "nvidia-smi"; (nvidia-smi || true) >> "$OUT/session.log" 2>&1
log "probe"; python -m planner probe --base "$BASE" --out "$GPU_DIR/probed.toml" --nprocs 1 2>&1 | tee -a "$OUT/session.log"
log "issue 3 runs"; timeout 420 python benchmarks/trainer_gpu.py --steps 120 --gpu "$BASE" --out "$GPU_DIR/trainer" \
  2>&1 | tee -a "$OUT/session.log" || log "trainer_gpu.py failed or timed out"
log "issue 4 grid"; timeout 360 python -m planner profile --grid gpu --out "$GPU_DIR/grid" --gpu "$GPU_DIR/probed.toml" \
  --steps 30 --timeout 120 2>&1 | tee -a "$OUT/session.log" || log "grid incomplete"
EVEN=$(ls -d "$GPU_DIR"/grid/0[02468]-*/ 2>/dev/null || true)
ODD=$(ls -d "$GPU_DIR"/grid/0[13579]-*/ 2>/dev/null || true)
if [ -n "$EVEN" ] && [ -n "$ODD" ]; then
  log "calibrate"; python -m planner calibrate $EVEN --base "$GPU_DIR/probed.toml" --name "$BASE-calibrated" \
    --out "$OUT/hardware_profiles/calibrated/$BASE.toml" 2>&1 | tee -a "$OUT/session.log" || true
  log "validate (probed)"; python -m planner validate $ODD --gpu "$GPU_DIR/probed.toml" 2>&1 | tee -a "$OUT/session.log" || true
  if [ -f "$OUT/hardware_profiles/calibrated/$BASE.toml" ]; then
    log "validate (calibrated)"; python -m planner validate $ODD --gpu "$OUT/hardware_profiles/calibrated/$BASE.toml" \
      --plot "$GPU_DIR/validation.png" 2>&1 | tee -a "$OUT/session.log" || true
  fi
fi
find "$GPU_DIR" -name checkpoints -type d -prune -exec rm -rf {} + ; find "$GPU_DIR" -name '*.log' -size +2M -delete
log "done"
