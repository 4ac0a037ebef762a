#!/usr/bin/env python3
"""Train the byte-level Llama target on the corpus from tools/corpus.

    python3 tools/train/train_target.py --out .ckpt/target

Deterministic given --seed and --steps: weights are initialised from a CPU
generator, batches come from a seeded numpy generator, and PyTorch's
deterministic algorithms are switched on (cuBLAS workspace pinned, flash
attention's deterministic backward). Writes <out>/target.safetensors (bf16,
Hugging Face names) and <out>/train_log.json.

--bench runs the first steps twice from the same seed and reports whether the
losses agree bit for bit and how long a step takes; nothing is saved.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

# Must be set before cuBLAS starts for its kernels to be deterministic.
os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import st_io  # noqa: E402
from data import Batches, evaluate, load_split, val_windows  # noqa: E402
from model import LlamaShape, Target, count_params, deterministic_setup  # noqa: E402


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--out", default=".ckpt/target")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--steps", type=int, default=8200)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--min-lr-frac", type=float, default=0.1)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--wd", type=float, default=0.1)
    ap.add_argument("--clip", type=float, default=1.0)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--max-seconds", type=float, default=0,
                    help="safety stop (0 = none); a run that hits it is not reproducible")
    ap.add_argument("--bench", type=int, default=0, metavar="STEPS")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    # Shape (defaults = the shipped model).
    for k, v in LlamaShape().to_dict().items():
        ap.add_argument("--" + k.replace("_", "-"), type=type(v), default=v)
    return ap.parse_args()


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (a.min_lr_frac + (1 - a.min_lr_frac) * 0.5 * (1 + math.cos(math.pi * p)))


class LossOf(torch.nn.Module):
    """Forward + loss in one module so torch.compile fuses the logits' cast
    and the cross-entropy."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x, y):
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            logits = self.model(x)[0]
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), y.reshape(-1))


def build(a, shape, device):
    model = Target(shape)
    model.init_weights(a.seed)
    model.onehot_embed = True
    model.to(device)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2 and "embed_tokens" not in n]
    rest = [p for n, p in model.named_parameters() if not (p.dim() >= 2 and "embed_tokens" not in n)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.wd},
                             {"params": rest, "weight_decay": 0.0}],
                            lr=a.lr, betas=(0.9, 0.95), eps=1e-8,
                            **({"fused": True} if device.type == "cuda" else {}))
    step_fn = LossOf(model)
    if not a.no_compile and device.type == "cuda":
        step_fn = torch.compile(step_fn)
    return model, opt, step_fn


def train(a, shape, device, train_stream, val_w, steps, log_every=100, save=True):
    model, opt, step_fn = build(a, shape, device)
    batches = Batches(train_stream, a.batch, a.seq, a.seed, device)
    log = {"steps": [], "evals": []}
    losses = []
    t0 = time.time()
    t_mark, stopped_early = t0, None
    for step in range(steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x, y = batches.next()
        loss = step_fn(x, y)
        loss.backward()
        gn = torch.nn.utils.clip_grad_norm_(model.parameters(), a.clip)
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.detach())
        if (step + 1) % log_every == 0 or step + 1 == steps:
            lv = torch.stack(losses[-log_every:]).float().mean().item()
            now = time.time()
            n = min(log_every, len(losses))
            tps = n * a.batch * a.seq / max(1e-9, now - t_mark)
            t_mark = now
            print(f"step {step + 1:6d}  loss {lv:.4f}  lr {lr_at(step, a):.2e}  "
                  f"gnorm {gn.item():.2f}  {tps / 1e6:.2f} Mtok/s  {now - t0:.0f}s", flush=True)
            log["steps"].append({"step": step + 1, "loss": lv, "time": now - t0})
        if val_w is not None and a.eval_every and (step + 1) % a.eval_every == 0 and step + 1 < steps:
            ev = evaluate(model, val_w, device)
            print(f"  eval step {step + 1}: val loss {ev['loss']:.4f}  bpb {ev['bpb']:.4f}", flush=True)
            log["evals"].append({"step": step + 1, **ev})
        if a.max_seconds and time.time() - t0 > a.max_seconds:
            stopped_early = step + 1
            print(f"STOPPED EARLY at step {stopped_early} (max-seconds)", flush=True)
            break
    if device.type == "cuda":
        torch.cuda.synchronize()
    log["train_seconds"] = time.time() - t0
    log["stopped_early"] = stopped_early
    return model, log, [l.item() for l in losses]


def main():
    a = parse()
    device = torch.device(a.device)
    deterministic_setup()
    shape = LlamaShape(**{k: getattr(a, k) for k in LlamaShape().to_dict()})

    t_load = time.time()
    train_stream = load_split(a.corpus, "train")
    val_stream = load_split(a.corpus, "val")
    val_w = val_windows(val_stream, a.seq)
    print(f"corpus: train {len(train_stream):,} tokens, val {len(val_stream):,} tokens "
          f"({time.time() - t_load:.1f}s)", flush=True)
    print(f"params {count_params(Target(shape)):,}  shape {shape.to_dict()}", flush=True)

    if a.bench:
        runs = []
        for r in range(2):
            t = time.time()
            _, log, losses = train(a, shape, device, train_stream, None, a.bench, log_every=a.bench)
            runs.append((losses, time.time() - t))
        # Time per step from a third, warm run's second half.
        half = a.bench // 2
        _, log, _ = train(a, shape, device, train_stream, None, a.bench, log_every=half)
        dt = (log["steps"][-1]["time"] - log["steps"][0]["time"]) / (a.bench - half)
        same = runs[0][0] == runs[1][0]
        print(f"BENCH steps {a.bench} deterministic {same} step_ms {dt * 1000:.1f} "
              f"first_run_s {runs[0][1]:.1f} last_loss {runs[0][0][-1]:.6f} {runs[1][0][-1]:.6f}",
              flush=True)
        return

    model, log, _ = train(a, shape, device, train_stream, val_w, a.steps)
    # The shipped weights are bf16: measure the validation loss of exactly
    # those, computed in float32.
    sd = {k: v.detach().to(torch.bfloat16) for k, v in model.state_dict().items()}
    ref = Target(shape)
    ref.load_state_dict({k: v.float() for k, v in sd.items()})
    ref.to(device)
    final = evaluate(ref, val_w, device, autocast=False)
    print(f"FINAL val loss {final['loss']:.5f}  bpb {final['bpb']:.5f}  "
          f"train_seconds {log['train_seconds']:.1f}", flush=True)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    st_io.save(sd, out / "target.safetensors", metadata={"format": "pt"})
    log.update({"final_val": final, "args": vars(a), "shape": shape.to_dict(),
                "params": count_params(model), "torch": torch.__version__,
                "device_name": torch.cuda.get_device_name() if device.type == "cuda" else "cpu"})
    (out / "train_log.json").write_text(json.dumps(log, indent=1) + "\n")


if __name__ == "__main__":
    main()
