#!/usr/bin/env python3
"""Check models/ with the Hugging Face stack (run where transformers,
tokenizers and safetensors are installed, e.g. the device machine).

    python3 tools/export/hf_check.py --name specula-byte-6m --out .ckpt/hf_check.json

* LlamaForCausalLM.from_pretrained loads the target; its float32 logits on
  validation windows are compared with this repository's PyTorch model
  (tools/train/model.py) on the same weights, and HF's greedy generate()
  with ours.
* tokenizers and AutoTokenizer load tokenizer.json; ids are the UTF-8 bytes
  after <s>, and decoding round-trips.
* safetensors opens all three model files; dtypes and shapes are listed.
"""

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "train"))
sys.path.insert(0, str(HERE.parent / "eagle"))
import spec_decode as SD  # noqa: E402
import st_io  # noqa: E402
from data import load_split, val_windows  # noqa: E402
from model import BOS, LlamaShape, Target  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="models")
    ap.add_argument("--name", default="specula-byte-6m")
    ap.add_argument("--corpus", default=".corpus")
    ap.add_argument("--out", default=".ckpt/hf_check.json")
    a = ap.parse_args()
    import safetensors
    import tokenizers
    import transformers
    from safetensors import safe_open
    from transformers import AutoTokenizer, LlamaForCausalLM

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    root = Path(a.models) / a.name
    res = {"transformers": transformers.__version__, "tokenizers": tokenizers.__version__,
           "safetensors": safetensors.__version__, "torch": torch.__version__}

    hf = LlamaForCausalLM.from_pretrained(root, dtype=torch.float32).to(dev).eval()
    cfg = json.loads((root / "config.json").read_text())
    shape = LlamaShape(**{k: cfg[k] for k in LlamaShape().to_dict()})
    ours = Target(shape)
    ours.load_state_dict({k: v.float() for k, v in st_io.load(root / "model.safetensors").items()})
    ours.to(dev).eval()

    w = val_windows(load_split(a.corpus, "val"), shape.max_position_embeddings)[:8]
    x = torch.as_tensor(np.stack(w[:8])[:, :-1], device=dev)
    with torch.no_grad():
        lh = hf(input_ids=x).logits.float()
        lo = ours(x)[0].float()
    diff = (lh - lo).abs()
    res["logits_fp32"] = {
        "windows": int(x.shape[0]), "tokens": int(x.numel()),
        "max_abs_diff": diff.max().item(), "mean_abs_diff": diff.mean().item(),
        "max_abs_logit": lo.abs().max().item(),
        "argmax_agreement": (lh.argmax(-1) == lo.argmax(-1)).float().mean().item()}
    hf16 = LlamaForCausalLM.from_pretrained(root, dtype=torch.bfloat16).to(dev).eval()
    with torch.no_grad():
        lb = hf16(input_ids=x).logits.float()
    res["logits_hf_bf16_vs_ours_fp32"] = {
        "max_abs_diff": (lb - lo).abs().max().item(),
        "argmax_agreement": (lb.argmax(-1) == lo.argmax(-1)).float().mean().item()}

    prompt = [BOS] + list(b"The kernel documentation says")
    with torch.no_grad():
        g = hf.generate(torch.tensor([prompt], device=dev), max_new_tokens=64, do_sample=False,
                        eos_token_id=None, pad_token_id=cfg["pad_token_id"])
    hf_cont = g[0, len(prompt):].tolist()
    our_cont = SD.greedy(ours, prompt, 64)
    res["greedy_64"] = {"equal": hf_cont == our_cont[:len(hf_cont)],
                        "text": bytes(t for t in our_cont if t < 256).decode("utf-8", "replace")}

    text = "Hello, wörld — ünïcode € 😀\n\ttabs"
    tk = tokenizers.Tokenizer.from_file(str(root / "tokenizer.json"))
    ids = tk.encode(text).ids
    at = AutoTokenizer.from_pretrained(root)
    ids2 = at(text)["input_ids"]
    want = [BOS] + list(text.encode())
    res["tokenizer"] = {
        "ids_are_bytes": ids == want, "auto_tokenizer_ids_are_bytes": ids2 == want,
        "roundtrip": tk.decode(ids, skip_special_tokens=True) == text,
        "auto_roundtrip": at.decode(ids2, skip_special_tokens=True) == text,
        "vocab_size": tk.get_vocab_size(),
        "specials": [tk.id_to_token(i) for i in (256, 257, 258)]}

    files = {}
    for sub in [a.name, a.name + "-eagle", a.name + "-eagle3"]:
        p = Path(a.models) / sub / "model.safetensors"
        with safe_open(str(p), framework="pt") as f:
            files[sub] = {k: [str(f.get_tensor(k).dtype), list(f.get_tensor(k).shape)]
                          for k in f.keys()}
    res["safetensors"] = files
    ok = (res["logits_fp32"]["max_abs_diff"] < 1e-3 and res["greedy_64"]["equal"]
          and all(v for k, v in res["tokenizer"].items() if isinstance(v, bool)))
    res["passed"] = bool(ok)
    print(json.dumps({k: v for k, v in res.items() if k != "safetensors"}, indent=1))
    for sub, t in files.items():
        print(sub, len(t), "tensors:", ", ".join(f"{k} {v[0][6:]} {v[1]}" for k, v in list(t.items())[:40]))
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(res, indent=1) + "\n")
    print("HF CHECK", "PASSED" if ok else "FAILED")


if __name__ == "__main__":
    main()
