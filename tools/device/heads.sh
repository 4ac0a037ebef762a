#!/usr/bin/env bash
# Device call 3: train both draft heads against .ckpt/target (each sized by a
# 30-step timing run), export to a scratch models/ folder, check it with the
# Hugging Face stack, and measure acceptance lengths.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT/heads"
filt() { grep --line-buffered -v -e UserWarning -e run_backward -e 'Loading weights'; }
for kind in eagle eagle3; do
  budget=$([ $kind = eagle ] && echo 120 || echo 170)
  if ! python3 tools/train/train_heads.py --kind $kind --steps 30 --warmup 5 --out /tmp/hb 2>&1 | filt | tail -3; then
    echo "strict deterministic mode failed for $kind; falling back to warn-only"
    export SPECULA_WARN_ONLY=1
    python3 tools/train/train_heads.py --kind $kind --steps 30 --warmup 5 --out /tmp/hb 2>&1 | filt | tail -2
  fi
  s=$(python3 -c "import json; print(json.load(open('/tmp/hb/${kind}_log.json'))['train_seconds'] / 30)")
  steps=$(python3 -c "print(min(4000, int($budget / $s) // 100 * 100))")
  echo "HEAD $kind step_s $s steps $steps"
  python3 tools/train/train_heads.py --kind $kind --steps "$steps" --out .ckpt/heads --max-seconds $((budget + 40)) 2>&1 | filt
  cp .ckpt/heads/$kind.safetensors .ckpt/heads/${kind}_log.json "$OUT/heads/"
done
python3 tools/export/export_models.py --ckpt .ckpt --out /tmp/models
python3 tools/export/hf_check.py --models /tmp/models --out "$OUT/hf_check.json" 2>&1 | filt | grep -v tensors:
python3 tools/eagle/eval_accept.py --ckpt .ckpt --out "$OUT/accept.json"
