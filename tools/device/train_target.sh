#!/usr/bin/env bash
# Device call 2: time the training step (and check that two runs from one
# seed agree), size the run to ~7 minutes of steps, and train the target.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
python3 tools/train/train_target.py --bench 20 2>&1 | grep --line-buffered -v -e UserWarning -e run_backward | tee "$OUT/bench.log"
ms=$(grep -o 'step_ms [0-9.]*' "$OUT/bench.log" | awk '{print $2}')
steps=$(python3 -c "print(min(9000, int(420000 / float('$ms')) // 100 * 100))")
echo "STEPS $steps"
python3 tools/train/train_target.py --steps "$steps" --out "$OUT/target" --max-seconds 480 2>&1 \
  | grep --line-buffered -v -e UserWarning -e run_backward | tee "$OUT/train.log"
