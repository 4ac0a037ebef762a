#!/usr/bin/env python3
"""Double sparsity's channel config from calibration activations (what `--ds-channel-config-path`
reads; SGLang's format).

    python3 tools/ds_channel_config.py --model models/specula-byte-6m --text calib.txt \
        --out ds_channels.json [--seq-len 1024] [--samples 16] [--device cuda]

Runs the Hugging Face model (transformers, PyTorch) over --samples windows of --seq-len tokens of
the text, captures every layer's queries and keys after the rotary embedding (what the KV cache
holds and what the decode's dot products see), and ranks each KV head's channels three ways:

    k_proj:  mean |k_c| over tokens
    q_proj:  mean |q_c| over tokens and the head's query heads
    qk_proj: mean |q_c * k_c| over tokens and the head's query heads (the channel's share of the
             attention logits; SGLang's default, --ds-heavy-channel-type qk)

Each "model.layers.<i>.self_attn.<type>_proj" entry lists, per KV head (one row per KV head, also
for q_proj and qk_proj under GQA, where SGLang's MHA-era files have one per query head), all
head_dim channels, most important first; the engine keeps the first --ds-heavy-channel-num.
"""

import argparse
import json
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="Hugging Face model folder (a Llama-family decoder)")
    ap.add_argument("--text", required=True, help="calibration text (UTF-8)")
    ap.add_argument("--out", required=True, help="the channel config to write (JSON)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--samples", type=int, default=16)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()

    tok = AutoTokenizer.from_pretrained(a.model)
    model = AutoModelForCausalLM.from_pretrained(a.model, torch_dtype=torch.float32).to(a.device).eval()
    cfg = model.config
    layers = model.model.layers
    n_q, n_kv = cfg.num_attention_heads, cfg.num_key_value_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // n_q
    group = n_q // n_kv

    with open(a.text, encoding="utf-8", errors="replace") as f:
        ids = tok(f.read(), return_tensors="pt").input_ids[0]
    if ids.numel() < a.seq_len + 1:
        sys.exit(f"--text has {ids.numel()} tokens; --seq-len {a.seq_len} needs more")
    room = ids.numel() - a.seq_len
    starts = [room * i // max(1, a.samples - 1) for i in range(a.samples)]

    captured = {}

    def hook(name):
        def fn(_module, _inputs, output):
            captured[name] = output.detach()
        return fn

    if getattr(cfg, "partial_rotary_factor", 1.0) != 1.0:
        sys.exit("partial rotary embeddings are not supported (the ranking assumes RoPE over the whole head)")
    handles = []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        # Queries and keys as RoPE sees them: after q_norm / k_norm where the model has them (Qwen3).
        q_src = attn.q_norm if hasattr(attn, "q_norm") else attn.q_proj
        k_src = attn.k_norm if hasattr(attn, "k_norm") else attn.k_proj
        handles.append(q_src.register_forward_hook(hook((i, "q"))))
        handles.append(k_src.register_forward_hook(hook((i, "k"))))

    score = {kind: torch.zeros(len(layers), n_kv, head_dim, dtype=torch.float64) for kind in ("q", "k", "qk")}
    tokens = 0
    with torch.no_grad():
        for s in starts:
            window = ids[s:s + a.seq_len].unsqueeze(0).to(a.device)
            positions = torch.arange(a.seq_len, device=a.device).unsqueeze(0)
            model(window, position_ids=positions)
            # The rotary embedding the model applies, for these positions.
            cos, sin = model.model.rotary_emb(captured[(0, "q")], positions)
            cos, sin = cos[0].unsqueeze(1), sin[0].unsqueeze(1)  # [seq, 1, head_dim]
            for i in range(len(layers)):
                q = captured[(i, "q")].reshape(a.seq_len, n_q, head_dim).float()
                k = captured[(i, "k")].reshape(a.seq_len, n_kv, head_dim).float()
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
                qg = q.view(a.seq_len, n_kv, group, head_dim)
                score["k"][i] += k.abs().sum(0).double().cpu()
                score["q"][i] += qg.abs().sum((0, 2)).double().cpu()
                score["qk"][i] += (qg * k.unsqueeze(2)).abs().sum((0, 2)).double().cpu()
            tokens += a.seq_len
    for h in handles:
        h.remove()

    out = {}
    for kind, s in score.items():
        for i in range(len(layers)):
            order = torch.argsort(s[i], dim=-1, descending=True, stable=True)
            out[f"model.layers.{i}.self_attn.{kind}_proj"] = order.tolist()
    with open(a.out, "w") as f:
        json.dump(out, f)
    print(f"wrote {a.out}: {len(layers)} layers x {n_kv} KV heads x {head_dim} channels, ranked over {tokens} tokens")


if __name__ == "__main__":
    main()
