#!/usr/bin/env python3
"""Train an EAGLE or EAGLE-3 draft head against the frozen target.

    python3 tools/train/train_heads.py --kind eagle3 --target .ckpt/target/target.safetensors

The head learns from the target itself: its inputs are the target's hidden
states on corpus windows and its labels are the target's next-token
distributions (soft cross-entropy), never the corpus bytes.

Both kinds are trained with a training-time test over --ttt steps (the
EAGLE-3 recipe): step 0 sees the target's features; step k>0 sees the head's
own output from step k-1 at the same position, the token k places further on,
and attends to the step-0 keys up to its position plus its own earlier
steps' keys at that position, i.e. exactly what a chain in the draft tree
attends to at inference (see tools/eagle/spec_decode.py). Step k at position t
sits at RoPE position t+k. The EAGLE head adds the EAGLE-1 feature regression
(smooth L1 to the target's next normed hidden state, classification weight
0.1). Step losses are weighted 0.8**k.

Writes <out>/<kind>.safetensors (SGLang tensor names; bf16 weights, d2t/t2d
for EAGLE-3) and <out>/<kind>_log.json.
"""

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import st_io  # noqa: E402
from data import Batches, load_split  # noqa: E402
from model import (PAD, Eagle3Head, EagleHead, LlamaShape, Target,  # noqa: E402
                   count_params, deterministic_setup, eagle3_aux_layers,
                   target_features)


def parse():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kind", choices=["eagle", "eagle3"], required=True)
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--target", default=".ckpt/target/target.safetensors")
    ap.add_argument("--target-log", default=None, help="train_log.json with the target's shape")
    ap.add_argument("--out", default=".ckpt/heads")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1200)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--ttt", type=int, default=6)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--wd", type=float, default=0.0)
    ap.add_argument("--cls-weight", type=float, default=0.1, help="EAGLE only")
    ap.add_argument("--max-seconds", type=float, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return ap.parse_args()


def load_target(path, shape_from, device):
    shape = LlamaShape(**json.loads(Path(shape_from).read_text())["shape"])
    t = Target(shape)
    t.load_state_dict({k: v.float() for k, v in st_io.load(path).items()})
    t.to(device).eval()
    for p in t.parameters():
        p.requires_grad_(False)
    return t


def make_head(kind, target, seed):
    shape = target.cfg
    torch.manual_seed(seed)
    head = EagleHead(shape) if kind == "eagle" else Eagle3Head(shape)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for n, p in head.named_parameters():
            if p.dim() == 1 and "norm" in n:
                p.fill_(1.0)
            elif p.dim() == 1:
                p.zero_()
            else:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
        if kind == "eagle3":
            # Start the draft lm_head from the target's rows for the draft
            # vocabulary: the draft's normed output lives in a similar space.
            ids = head.to_target_ids(torch.arange(head.lm_head.weight.shape[0]))
            head.lm_head.weight.copy_(target.lm_head.weight.detach().cpu()[ids])
    return head


def ttt_masks(seq, steps, device):
    """Step k's mask over [step-0 keys | step-1 keys | ... | step-k keys]:
    causal over step 0, the diagonal (same position) for each later step."""
    tril = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
    eye = torch.eye(seq, dtype=torch.bool, device=device)
    return [None] + [torch.cat([tril] + [eye] * k, dim=1)[None, None] for k in range(1, steps)]


def shift(ids, k):
    """ids[:, t+k] at position t, PAD past the end."""
    out = torch.full_like(ids, PAD)
    out[:, :ids.shape[1] - k] = ids[:, k:]
    return out


def ttt_forward(head, target, x, masks, aux, steps, amp=True):
    """Runs the target and `steps` unrolled draft steps on windows x [B,T].
    Returns (target probabilities over the draft vocabulary [B,T,V'],
    target final normed hidden [B,T,h], [(draft logits, draft output)] per
    step); step k's entry at position t predicts token t+2+k."""
    kind = head.kind
    with torch.no_grad(), torch.autocast(device_type=x.device.type, dtype=torch.bfloat16,
                                         enabled=amp):
        logits, final_h, caught = target(x, capture=aux)
        feats = target_features(kind, final_h, caught, aux)
    tprob = logits.float().softmax(-1)
    if kind == "eagle3":
        tprob = tprob[..., head.t2d]        # draft-vocabulary columns
    embed = target.model.embed_tokens
    lm_head = target.lm_head if kind == "eagle" else None
    t = x.shape[1]
    hidden, ks, vs, outs = feats, [], [], []
    for k in range(steps):
        pos = (torch.arange(t, device=x.device) + k)[None]
        past = None if k == 0 else (torch.cat(ks, dim=2), torch.cat(vs, dim=2))
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16, enabled=amp):
            d_logits, out, (kk, vv) = head.step(embed(shift(x, 1 + k)), hidden, pos,
                                                masks[k], past, lm_head)
        ks.append(kk)
        vs.append(vv)
        outs.append((d_logits, out))
        hidden = out
    return tprob, final_h, outs


def head_loss(a, head, target, x, masks, aux):
    tprob, final_h, outs = ttt_forward(head, target, x, masks, aux, a.ttt)
    t = x.shape[1]
    total, stats = 0.0, []
    for k, (d_logits, out) in enumerate(outs):
        n = t - 1 - k                       # positions with a label
        p = tprob[:, 1 + k:]                # target's distribution for token t+2+k
        logq = d_logits[:, :n].float().log_softmax(-1)
        ce = -(p * logq).sum(-1).mean()
        loss = ce
        if head.kind == "eagle":
            reg = F.smooth_l1_loss(out[:, :n].float(), final_h[:, 1 + k:].float())
            loss = reg + a.cls_weight * ce
        acc = (logq.argmax(-1) == p.argmax(-1)).float().mean()
        total = total + (0.8 ** k) * loss
        stats.append((ce.detach(), acc.detach()))
    return total, stats


def lr_at(step, a):
    if step < a.warmup:
        return a.lr * (step + 1) / a.warmup
    p = (step - a.warmup) / max(1, a.steps - a.warmup)
    return a.lr * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * p)))


def export_tensors(head):
    """SGLang checkpoint tensors: float weights in bf16; EAGLE-3 adds the
    draft-vocabulary maps d2t (int64) and t2d (bool)."""
    sd = {}
    for k, v in head.state_dict().items():
        sd[k] = v.detach().cpu() if k in ("d2t", "t2d") else v.detach().cpu().to(torch.bfloat16)
    return sd


def main():
    a = parse()
    device = torch.device(a.device)
    deterministic_setup()
    target_log = a.target_log or str(Path(a.target).with_name("train_log.json"))
    target = load_target(a.target, target_log, device)
    aux = eagle3_aux_layers(target.cfg.num_hidden_layers)
    head = make_head(a.kind, target, a.seed).to(device)
    print(f"{a.kind}: {count_params(head):,} trainable params; aux layers {aux}", flush=True)

    stream = load_split(a.corpus, "train")
    batches = Batches(stream, a.batch, a.seq, a.seed, device)
    masks = ttt_masks(a.seq, a.ttt, device)
    opt = torch.optim.AdamW(head.parameters(), lr=a.lr, betas=(0.9, 0.95),
                            weight_decay=a.wd, **({"fused": True} if device.type == "cuda" else {}))
    log = {"steps": []}
    t0 = time.time()
    hist = []
    stopped = None
    for step in range(a.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(step, a)
        x, _ = batches.next()
        loss, stats = head_loss(a, head, target, x, masks, aux)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        hist.append(torch.stack([torch.stack(s) for s in stats]))
        if (step + 1) % 100 == 0 or step + 1 == a.steps:
            m = torch.stack(hist[-100:]).mean(0).cpu()
            acc = " ".join(f"{v:.3f}" for v in m[:, 1].tolist())
            print(f"step {step + 1:5d}  loss {loss.item():.4f}  ce0 {m[0, 0]:.4f}  "
                  f"acc/step {acc}  {time.time() - t0:.0f}s", flush=True)
            log["steps"].append({"step": step + 1, "ce": m[:, 0].tolist(),
                                 "acc": m[:, 1].tolist(), "time": time.time() - t0})
        if a.max_seconds and time.time() - t0 > a.max_seconds:
            stopped = step + 1
            print(f"STOPPED EARLY at step {stopped}", flush=True)
            break
    log.update({"train_seconds": time.time() - t0, "stopped_early": stopped,
                "args": vars(a), "params": count_params(head), "aux_layers": aux})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    st_io.save(export_tensors(head), out / f"{a.kind}.safetensors", metadata={"format": "pt"})
    (out / f"{a.kind}_log.json").write_text(json.dumps(log, indent=1) + "\n")
    print(f"DONE {a.kind} in {log['train_seconds']:.0f}s", flush=True)


if __name__ == "__main__":
    main()
