#!/usr/bin/env python3
"""Mean acceptance length of the shipped heads on the prompts `specula bench serve --dataset
text` uses, computed by the reference drafting and verification (spec_decode.py), so the
engine's figure can be compared on identical prompts.

    python3 tools/eagle/accept_on_text.py --num-requests 4 --input-len 128 --output-len 256

Prompts: the file's token ids as the shipped tokenizer encodes it (<s>, then UTF-8 bytes, with
the literal texts of the special tokens <s>, </s> and <pad> as their ids, as Hugging Face's
added-token matching does), windows of --input-len tokens starting at room * i / num_requests (room = tokens - input_len).
Generation never stops at </s> (the benchmark sets ignore_eos); each verify cycle counts
accepted + 1 tokens, the last one too.
"""

import argparse
import json
import sys
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(HERE.parent / "train"))
sys.path.insert(0, str(HERE))
import spec_decode as SD  # noqa: E402
import st_io  # noqa: E402
from model import BOS, Eagle3Head, EagleHead, LlamaShape, Target  # noqa: E402


def load(device):
    cfg = json.loads((ROOT / "models/specula-byte-6m/config.json").read_text())
    shape = LlamaShape(**{k: cfg[k] for k in LlamaShape().to_dict()})
    target = Target(shape)
    target.load_state_dict({k: v.float() for k, v in st_io.load(ROOT / "models/specula-byte-6m/model.safetensors").items()})
    target.to(device).eval()
    heads = {}
    for kind, cls in (("eagle", EagleHead), ("eagle3", Eagle3Head)):
        head = cls(shape)
        sd = st_io.load(ROOT / f"models/specula-byte-6m-{kind}/model.safetensors")
        head.load_state_dict({k: (v if k in ("d2t", "t2d") else v.float()) for k, v in sd.items()})
        heads[kind] = head.to(device).eval()
    # EAGLE-3's aux layers from the head's config (output-of-layer ids, +1 = stream entering).
    c3 = json.loads((ROOT / "models/specula-byte-6m-eagle3/config.json").read_text())
    aux = [i + 1 for i in c3["eagle_config"]["eagle_aux_hidden_state_layer_ids"]]
    return target, heads, aux


def encode(data: bytes):
    specials = {b"<s>": BOS, b"</s>": BOS + 1, b"<pad>": BOS + 2}
    out, i = [], 0
    while i < len(data):
        for text, tid in specials.items():
            if data.startswith(text, i):
                out.append(tid)
                i += len(text)
                break
        else:
            out.append(data[i])
            i += 1
    return out


@torch.no_grad()
def generate(target, head, prompt, max_new, steps, topk, num_draft, aux):
    dev = target.lm_head.weight.device
    seq = list(prompt)
    seq.append(int(target(torch.tensor(seq, device=dev)[None])[0][0, -1].argmax()))
    lens = []
    while len(seq) - len(prompt) < max_new:
        feats = SD.target_features_of(target, head, seq[:-1], aux)
        nodes = SD.draft_tree(target, head, seq, feats, steps, topk, num_draft)
        accepted, bonus = SD.verify(target, seq, nodes)
        lens.append(len(accepted) + 1)
        seq += accepted + [bonus]
    return lens


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--file", default=str(ROOT / "models/specula-byte-6m/README.md"))
    ap.add_argument("--num-requests", type=int, default=4)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=256)
    ap.add_argument("--settings", default="3,1,4;5,4,8;6,8,32")
    a = ap.parse_args()
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    target, heads, aux = load(device)
    ids = [BOS] + encode(Path(a.file).read_bytes())
    room = len(ids) - a.input_len
    prompts = [ids[room * i // a.num_requests: room * i // a.num_requests + a.input_len] for i in range(a.num_requests)]
    for kind, head in heads.items():
        for setting in a.settings.split(";"):
            s, k, n = map(int, setting.split(","))
            lens = []
            for p in prompts:
                lens += generate(target, head, p, a.output_len, s, k, n, aux)
            print(f"{kind:6s} ({s}, {k}, {n}): mean accept length {sum(lens) / len(lens):.3f} over {len(lens)} cycles")


if __name__ == "__main__":
    main()
