#!/usr/bin/env python3
"""Golden fixtures for the C++ tests, computed from the shipped files.

    python3 tools/export/golden.py --models models --name specula-byte-6m \
        --out tests/data/model_pair

Reads models/<name>{,-eagle,-eagle3}/model.safetensors (bf16), computes in
float32 on the CPU with tools/train/model.py, and writes small JSON files:

target.json  per prompt: token ids (<s> + UTF-8 bytes); at a few positions
             the top-8 logits plus checksums of all 259 logits (sum, sum of
             squares, logsumexp); all logits at the last position; the 64-token
             greedy continuation with the top-1/top-2 logit margin of each step
             (a bf16 engine may flip a step whose margin is tiny).
eagle.json / eagle3.json
             per prompt: the first draft step after the prompt: the target's
             greedy token g is appended, the head runs over the pairs
             (token t+1, feature t) of prompt + g, and its top-8 next tokens
             with probabilities are listed (target ids; EAGLE-3 mapped through
             d2t); plus the first tree for (num_steps, topk, num_draft_tokens)
             = (5, 4, 8) from tools/eagle/spec_decode.py and what greedy
             verification accepts from it.
"""

import argparse
import hashlib
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "train"))
sys.path.insert(0, str(HERE.parent / "eagle"))
import spec_decode as SD  # noqa: E402
import st_io  # noqa: E402
from model import BOS, Eagle3Head, EagleHead, LlamaShape, Target, eagle3_aux_layers  # noqa: E402

PROMPTS = [
    "The quick brown fox",
    "int main(int argc, char **argv)\n{\n",
    "Q:\tWhat is the difference between a duck?\nA:",
    "The kernel provides a simple interface for",
    "import os\nimport sys\n\ndef main():\n",
]
TOPK = 8
NEW_TOKENS = 64
TREE = (5, 4, 8)


def r(x, nd=5):
    return round(float(x), nd)


def sha256(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def load(root, name):
    cfg = json.loads((root / name / "config.json").read_text())
    shape = LlamaShape(**{k: cfg[k] for k in LlamaShape().to_dict()})
    return shape, st_io.load(root / name / "model.safetensors")


def target_entry(t, text):
    ids = [BOS] + list(text.encode())
    with torch.no_grad():
        logits = t(torch.tensor([ids]))[0][0]
    n = len(ids)
    positions = sorted({0, 1, n // 2, n - 1})
    at = []
    for p in positions:
        lg = logits[p]
        v, i = lg.topk(TOPK)
        at.append({"position": p, "top_ids": i.tolist(), "top_logits": [r(x) for x in v],
                   "sum": r(lg.sum(), 4), "sum_sq": r((lg * lg).sum(), 3),
                   "logsumexp": r(torch.logsumexp(lg, 0))})
    seq, margins = list(ids), []
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            lg = t(torch.tensor([seq]))[0][0, -1]
            v, i = lg.topk(2)
            margins.append(r(v[0] - v[1], 4))
            seq.append(int(i[0]))
    cont = seq[len(ids):]
    return {"prompt": text, "ids": ids, "logits_at": at,
            "last_logits": [r(x, 4) for x in logits[-1]],
            "greedy_ids": cont,
            "greedy_text": bytes(c for c in cont if c < 256).decode("utf-8", "replace"),
            "greedy_margins": margins, "min_margin": min(margins)}


def head_entry(t, head, aux, text):
    ids = [BOS] + list(text.encode())
    with torch.no_grad():
        g = int(t(torch.tensor([ids]))[0][0, -1].argmax())
        seq = ids + [g]
        feats = SD.target_features_of(t, head, seq[:-1], aux)
        lm_head = t.lm_head if head.kind == "eagle" else None
        logits, _, _ = head.step(t.model.embed_tokens(torch.tensor([seq[1:]])), feats[None],
                                 torch.arange(len(seq) - 1)[None], None, None, lm_head)
        p = logits[0, -1].float().softmax(-1)
        v, i = p.topk(TOPK)
        if head.kind == "eagle3":
            i = head.to_target_ids(i)
        nodes = SD.draft_tree(t, head, seq, feats, *TREE)
        accepted, bonus = SD.verify(t, seq, nodes)
    index = {id(nd): k for k, nd in enumerate(nodes)}
    return {"prompt": text, "ids": ids, "target_next": g,
            "first_step_top_ids": i.tolist(), "first_step_top_probs": [r(x, 6) for x in v],
            "tree": {"num_steps": TREE[0], "topk": TREE[1], "num_draft_tokens": TREE[2],
                     "nodes": [{"token": nd.token,
                                "parent": -1 if nd.parent is None else index[id(nd.parent)],
                                "depth": nd.depth, "score": r(nd.score, 6)} for nd in nodes],
                     "accepted": accepted, "bonus": bonus}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    ap.add_argument("--name", default="specula-byte-6m")
    ap.add_argument("--out", default="tests/data/model_pair")
    a = ap.parse_args()
    torch.set_num_threads(2)
    root, out = Path(a.models), Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    shape, sd = load(root, a.name)
    t = Target(shape)
    t.load_state_dict({k: v.float() for k, v in sd.items()})
    t.eval()
    aux = eagle3_aux_layers(shape.num_hidden_layers)
    common = {"generator": "tools/export/golden.py", "compute": "float32 on CPU from bf16 weights",
              "model": a.name}

    doc = dict(common, files={"model.safetensors": sha256(root / a.name / "model.safetensors")},
               prompts=[target_entry(t, p) for p in PROMPTS])
    (out / "target.json").write_text(json.dumps(doc, indent=1) + "\n")

    for kind, cls in (("eagle", EagleHead), ("eagle3", Eagle3Head)):
        sub = f"{a.name}-{kind}"
        _, hsd = load(root, sub)
        head = cls(shape)
        head.load_state_dict({k: (v if k in ("d2t", "t2d") else v.float()) for k, v in hsd.items()})
        head.eval()
        doc = dict(common, head=sub, aux_layers=aux if kind == "eagle3" else None,
                   files={"model.safetensors": sha256(root / sub / "model.safetensors")},
                   prompts=[head_entry(t, head, aux, p) for p in PROMPTS])
        (out / f"{kind}.json").write_text(json.dumps(doc, indent=1) + "\n")
    for f in sorted(out.glob("*.json")):
        print(f, f.stat().st_size, "bytes")


if __name__ == "__main__":
    main()
