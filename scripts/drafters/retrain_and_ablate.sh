#!/usr/bin/env bash
# Issue 11 items 2 and 3: retrain both bundled drafters at the SAME, larger budget at the
# deployment CFG (2.0), then the distillation ablation. Hours of CPU: run on a real machine.
# Every run resumes from RUN/checkpoints after an interruption (re-run the same command).
#   bash scripts/drafters/retrain_and_ablate.sh [RUNS_DIR] [STEPS]
set -euo pipefail
RUNS=${1:-runs/issue11}
STEPS=${2:-6000}
COMMON=(--model demo --steps "$STEPS" --batch-size 16 --ttt-steps 4 --num-samples 8192 --cfg-scale 2.0
        --features online --checkpoint-every 200 --eval-every 250 --eval-images 16 --seed 0)
lisa-trt train "${COMMON[@]}" --loss eagle3 --out "$RUNS/eagle3"
lisa-trt train "${COMMON[@]}" --loss lisa --out "$RUNS/lisa"
for term in selection soft_gate truncated_ce kd; do
  lisa-trt train "${COMMON[@]}" --loss lisa --loss-off "$term" --out "$RUNS/lisa-no-$term"
done
# the same two losses on real-image tokens (keep whichever decodes better)
# lisa-trt train "${COMMON[@]}" --loss lisa --data images --image-dir IMAGES --out "$RUNS/lisa-images"
python bench/plot_training.py "$RUNS/eagle3" "$RUNS/lisa" --labels EAGLE-3,LISA --out bench/drafter_training.png
D="eagle3=$RUNS/eagle3/drafter.safetensors,lisa=$RUNS/lisa/drafter.safetensors"
for term in selection soft_gate truncated_ce kd; do D="$D,lisa-no-$term=$RUNS/lisa-no-$term/drafter.safetensors"; done
python bench/lisa_ablation.py --num-images 256 --drafters "$D" --methods exact,gasv --oracle --no-sweep \
  --json bench/lisa_ablation.json
