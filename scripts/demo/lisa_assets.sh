#!/usr/bin/env bash
# Stage 7 of the demo recipe: the LISA and EAGLE-3 drafters (same data, same budget) and the
# GASV / LANTERN calibration tables for the bundled demo target, then copy them into the package.
#
#   bash scripts/drafters/retrain_and_ablate.sh runs/issue11   # the drafters (issue 11 recipe: 8,192
#                                                              # sequences at cfg 2.0, batch 16, 400 steps
#                                                              # then --extend to 1,600)
#   RUNS=runs/issue11 bash scripts/demo/lisa_assets.sh         # tables + copy both drafters (fp16)
#   ONLY=tables bash scripts/demo/lisa_assets.sh               # GASV v2 tables only (a few minutes, 1 thread)
#
# Needs the demo target/VQ in lisa_trt/assets/demo (stages 1-6) and the finished drafter runs in
# RUNS (the training script resumes them after an interruption). The tables are GASV version 2 (beta_c measured on
# s(v|z) over the sampled token's K_n = 16 codebook neighbours, the statistic the runtime gates on).
# Shipped GASV defaults kappa 2, lambda 0.4, delta 0.3: the fastest quality-neutral GASV point of bench/gasv_frontier.json.
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-runs/demo}
mkdir -p "$OUT"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1

if [ "${ONLY:-}" = "tables" ]; then
  lisa-trt calibrate --model demo --out "$OUT/tables.safetensors" --overwrite --rollouts 64 --seed 0 --kappa 2 --lambda 0.4 --delta 0.3 > "$OUT/calibrate.log" 2>&1
  cp "$OUT/tables.safetensors" lisa_trt/assets/demo/tables.safetensors
  echo "wrote lisa_trt/assets/demo/tables.safetensors"
  exit 0
fi
RUNS=${RUNS:-runs/issue11}
for kind in lisa eagle3; do
  [ -f "$RUNS/$kind/drafter.safetensors" ] || { echo "no $RUNS/$kind/drafter.safetensors: run scripts/drafters/retrain_and_ablate.sh $RUNS first" >&2; exit 1; }
done
lisa-trt calibrate --model demo --out "$OUT/tables.safetensors" --overwrite --rollouts 64 --seed 0 --kappa 2 --lambda 0.4 --delta 0.3 > "$OUT/calibrate.log" 2>&1

A=lisa_trt/assets/demo
cp "$OUT/tables.safetensors" "$A/tables.safetensors"
python - "$RUNS" "$A" <<'PY'
import sys
from pathlib import Path
import torch
from lisa_trt.demo.registry import load_demo_target
from lisa_trt.models.drafter import load_drafter, save_drafter
out, assets = Path(sys.argv[1]), Path(sys.argv[2])
target = load_demo_target()
for kind in ("lisa", "eagle3"):
    d = load_drafter(out / kind / "drafter.safetensors", target)
    d = d.to(torch.float16)  # shipped in fp16 (loaded back as fp32)
    save_drafter(d, assets / f"drafter_{kind}.safetensors")
    print("wrote", assets / f"drafter_{kind}.safetensors")
PY
