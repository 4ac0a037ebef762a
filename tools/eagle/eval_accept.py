#!/usr/bin/env python3
"""Mean acceptance length of the draft heads on the validation split.

    python3 tools/eagle/eval_accept.py --ckpt .ckpt --out .ckpt/accept.json

Prompts: BOS + the first --prompt-bytes bytes of validation documents that
are at least twice that long, taken in file order (every document that
qualifies, up to --prompts). For each head and each (num_steps, topk,
num_draft_tokens) setting it generates --new-tokens tokens greedily with
tools/eagle/spec_decode.py, checks the output equals the target's plain
greedy output, and reports the mean over verify cycles of (accepted draft
tokens + 1 bonus token). Runs in float32 from the shipped bf16 weights.
"""

import argparse
import json
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "train"))
sys.path.insert(0, str(HERE))
import spec_decode as SD  # noqa: E402
import st_io  # noqa: E402
from data import load_split, split_docs  # noqa: E402
from model import BOS, Eagle3Head, EagleHead, eagle3_aux_layers  # noqa: E402
from train_heads import load_target  # noqa: E402

SETTINGS = [(3, 1, 4), (5, 4, 8), (6, 8, 32)]


def load_head(kind, path, target, device):
    head = EagleHead(target.cfg) if kind == "eagle" else Eagle3Head(target.cfg)
    sd = st_io.load(path)
    head.load_state_dict({k: (v if k in ("d2t", "t2d") else v.float()) for k, v in sd.items()})
    return head.to(device).eval()


def val_prompts(corpus, n, nbytes):
    docs = split_docs(load_split(corpus, "val"))
    out = []
    for d in docs:
        if len(d) >= 2 * nbytes:
            out.append([BOS] + [int(b) for b in d[:nbytes]])
        if len(out) == n:
            break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--ckpt", default=".ckpt", help="holds target/ and heads/")
    ap.add_argument("--out", default=".ckpt/accept.json")
    ap.add_argument("--prompts", type=int, default=40)
    ap.add_argument("--prompt-bytes", type=int, default=128)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--heads", default="eagle,eagle3")
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    ck = Path(a.ckpt)
    target = load_target(ck / "target/target.safetensors", ck / "target/train_log.json", device)
    aux = eagle3_aux_layers(target.cfg.num_hidden_layers)
    prompts = val_prompts(a.corpus, a.prompts, a.prompt_bytes)
    t0 = time.time()
    refs = [SD.greedy(target, p, a.new_tokens) for p in prompts]
    print(f"{len(prompts)} prompts, greedy references in {time.time() - t0:.0f}s", flush=True)
    result = {"prompts": len(prompts), "prompt_bytes": a.prompt_bytes,
              "new_tokens": a.new_tokens, "heads": {}}
    for kind in a.heads.split(","):
        head = load_head(kind, ck / f"heads/{kind}.safetensors", target, device)
        rows = {}
        for ns, k, nd in SETTINGS:
            t0 = time.time()
            lens, mismatches = [], 0
            for p, ref in zip(prompts, refs):
                out, ls = SD.speculative(target, head, p, a.new_tokens, ns, k, nd, aux)
                mismatches += out != ref
                lens += ls
            mean = sum(lens) / len(lens)
            key = f"{ns},{k},{nd}"
            rows[key] = {"mean_accept_len": mean, "cycles": len(lens),
                         "greedy_mismatches": mismatches, "seconds": time.time() - t0}
            print(f"{kind:6s} (steps,topk,draft)=({key}): mean acceptance {mean:.3f} "
                  f"over {len(lens)} cycles, {mismatches} outputs differ from greedy "
                  f"({time.time() - t0:.0f}s)", flush=True)
        result["heads"][kind] = rows
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
