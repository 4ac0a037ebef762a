#!/usr/bin/env bash
# Device call 1: environment, reference self-checks on the GPU, the whole
# pipeline on a tiny model (train -> heads -> export -> HF check -> acceptance),
# then timing/determinism of the real target's training step.
set -u -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; T=/tmp/tiny; mkdir -p "$OUT" "$T"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
python3 -c "import torch, transformers, tokenizers, safetensors, numpy; print('torch', torch.__version__, 'transformers', transformers.__version__, 'tokenizers', tokenizers.__version__, 'safetensors', safetensors.__version__, 'numpy', numpy.__version__)"
python3 tools/eagle/check_reference.py || echo "CHECK_REFERENCE FAILED"
tiny="--hidden-size 64 --intermediate-size 128 --num-hidden-layers 6"
python3 tools/train/train_target.py --out $T/target --steps 40 --batch 8 --seq 256 $tiny --eval-every 20 --warmup 5 \
  && python3 tools/train/train_heads.py --kind eagle --target $T/target/target.safetensors --out $T/heads --steps 20 --batch 4 --seq 256 --ttt 3 \
  && python3 tools/train/train_heads.py --kind eagle3 --target $T/target/target.safetensors --out $T/heads --steps 20 --batch 4 --seq 256 --ttt 3 \
  && python3 tools/export/export_models.py --ckpt $T --out $T/models \
  && python3 tools/export/hf_check.py --models $T/models --out $T/hf.json \
  && python3 tools/eagle/eval_accept.py --ckpt $T --out $T/acc.json --prompts 3 --new-tokens 32 \
  || echo "TINY PIPELINE FAILED"
python3 tools/train/train_target.py --bench 30 || echo "BENCH FAILED"
python3 tools/train/train_target.py --bench 20 --no-compile || echo "BENCH EAGER FAILED"
