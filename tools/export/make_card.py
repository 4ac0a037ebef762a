#!/usr/bin/env python3
"""Write the model cards (README.md) of models/<name>{,-eagle,-eagle3} from
the measured results: .corpus/manifest.json, .ckpt/target/train_log.json and
bench.log, .ckpt/heads/*_log.json, .ckpt/accept.json, .ckpt/hf_check.json,
.ckpt/repro/train_log.json and target.sha256 (the reproduce run).

    python3 tools/export/make_card.py --name specula-byte-6m
"""

import argparse
import hashlib
import json
import re
from pathlib import Path

SETTINGS = ["3,1,4", "5,4,8", "6,8,32"]


def js(p):
    return json.loads(Path(p).read_text())


def size(path):
    return Path(path).stat().st_size


def mb(n):
    return f"{n / 1e6:.2f} MB"


def accept_table(acc, kinds):
    rows = ["| head | (3, 1, 4) | (5, 4, 8) | (6, 8, 32) |", "|---|---|---|---|"]
    for k in kinds:
        r = acc["heads"][k]
        rows.append(f"| {k.upper().replace('EAGLE3', 'EAGLE-3')} | "
                    + " | ".join(f"{r[s]['mean_accept_len']:.2f}" for s in SETTINGS) + " |")
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", default="specula-byte-6m")
    ap.add_argument("--models", default="models")
    ap.add_argument("--ckpt", default=".ckpt")
    ap.add_argument("--corpus", default=".corpus")
    a = ap.parse_args()
    ck, root = Path(a.ckpt), Path(a.models)
    man = js(Path(a.corpus) / "manifest.json")
    tl = js(ck / "target/train_log.json")
    bench = (ck / "target/bench.log").read_text()
    det = re.search(r"deterministic (\w+) step_ms ([\d.]+)", bench)
    heads = {k: js(ck / f"heads/{k}_log.json") for k in ("eagle", "eagle3")}
    acc = js(ck / "accept.json")
    hf = js(ck / "hf_check.json")
    rep = js(ck / "repro/train_log.json")
    rep_sha = (ck / "repro/target.sha256").read_text().strip()
    tgt_sha = hashlib.sha256((ck / "target/target.safetensors").read_bytes()).hexdigest()
    shape, args, fv = tl["shape"], tl["args"], tl["final_val"]
    rv = rep["final_val"]
    rel = abs(rv["loss"] - fv["loss"]) / fv["loss"]
    tokens_seen = args["steps"] * args["batch"] * args["seq"]
    name = a.name
    files = {d: sum(size(f) for f in (root / d).iterdir() if f.name != "README.md")
             for d in (name, name + "-eagle", name + "-eagle3")}

    src_rows = ["| source (Debian package) | documents | train bytes | val bytes |", "|---|---|---|---|"]
    labels = {"fortunes": "fortunes, fortunes-min, fortune-anarchism, fortunes-bofh-excuses, "
                          "fortunes-debian-hints (one document per cookie)",
              "jargon": "jargon-text (the Jargon File)",
              "misc": "miscfiles (US Declaration of Independence, Constitution)",
              "debian": "doc-debian, debian-reference-en",
              "python-doc": "python3.11-doc (reStructuredText sources)",
              "perl-doc": "perl-doc (perl*.pod)",
              "linux-doc": "linux-doc-6.1 (Documentation/, English only)"}
    for k, v in man["sources"].items():
        src_rows.append(f"| {labels.get(k, k)} | {v['docs']:,} | {v['train_bytes']:,} | {v['val_bytes']:,} |")
    evals = [e for e in tl["evals"] if e["step"] % 2000 == 0] + [{"step": args["steps"], **fv}]
    curve = " · ".join(f"{e['step']}: {e['loss']:.3f}" for e in evals)
    lg = hf["logits_fp32"]

    card = f"""# {name}

A byte-level Llama-architecture language model trained from scratch for
**specula**'s tests, benchmarks and default demo, with two speculative-decoding
draft heads trained against it: [`{name}-eagle`](../{name}-eagle/) (EAGLE) and
[`{name}-eagle3`](../{name}-eagle3/) (EAGLE-3). It is a small model of Debian's
English documentation: it writes plausible-looking text and code-like prose,
not correct facts.

## Model

| | |
|---|---|
| architecture | `LlamaForCausalLM` (RMSNorm, RoPE θ={shape['rope_theta']:g}, SwiGLU, grouped-query attention) |
| layers × hidden | {shape['num_hidden_layers']} × {shape['hidden_size']}, MLP {shape['intermediate_size']} |
| attention | {shape['num_attention_heads']} query heads, {shape['num_key_value_heads']} KV heads, head_dim {shape['head_dim']} |
| context | {shape['max_position_embeddings']} tokens |
| vocabulary | 259 = 256 bytes (id = byte value) + `<s>` 256, `</s>` 257, `<pad>` 258 |
| parameters | {tl['params']:,} (untied embedding and lm_head) |
| files | model.safetensors bf16 {mb(size(root / name / 'model.safetensors'))}; folder {mb(files[name])} |

`tokenizer.json` is a byte-level BPE with no merges (Hugging Face `tokenizers`
ByteLevel alphabet), so every UTF-8 byte is one token; it prepends `<s>`.
Documents were trained as `<s>` bytes `</s>`.

## Data

{man['train']['bytes'] + man['val']['bytes']:,} bytes of English text from
Debian bookworm `main` packages, built by `tools/corpus/build_corpus.py`
(package versions in the script and in the corpus manifest). doc-rfc is
non-free and unavailable here, Debian ships no Project Gutenberg package, and
bible-kjv-text keeps its text in a private compressed format, so the corpus is
mostly technical documentation plus the fortune collections for conversational
English. Cleaning: NFC, control characters dropped, documents with more than 5%
non-ASCII bytes dropped (translations); files over 16 KB cut at paragraph
boundaries into ~8 KB documents. Deduplication: exact duplicate documents
(case- and whitespace-insensitive) and repeated paragraphs of 120+ characters
are dropped. Split: a document goes to validation when its SHA-256 mod 1000 is
below {man['val_per_mille']} (≈2%): train {man['train']['bytes']:,} bytes in
{man['train']['docs']:,} documents, validation {man['val']['bytes']:,} bytes in
{man['val']['docs']:,} documents.

{chr(10).join(src_rows)}

## Training

`tools/train/train_target.py`: AdamW (β 0.9/0.95, weight decay {args['wd']}
except embeddings), peak LR {args['lr']} with {args['warmup']} warm-up steps and
cosine decay to {args['min_lr_frac']}×, gradient clip {args['clip']}, batch
{args['batch']} × {args['seq']} tokens, {args['steps']:,} steps
({tokens_seen / 1e9:.2f} B tokens, ≈{tokens_seen / man['train']['bytes']:.0f} epochs), seed {args['seed']},
bf16 autocast with float32 master weights, `torch.compile`. One
{tl['device_name']}, PyTorch {tl['torch']}: **{tl['train_seconds']:.0f} s** of
training ({det.group(2)} ms/step). Deterministic: strict
`torch.use_deterministic_algorithms`, cuDNN attention off (flash attention's
deterministic backward), the embedding lookup as a one-hot matmul during
training. Two 20-step runs from one seed agreed bit for bit
({'yes' if det.group(1) == 'True' else 'no'}), and so did the full reproduction below.

## Results

Validation split, float32 compute from the shipped bf16 weights, every token
predicted once with up to 1024 tokens of context:

| | |
|---|---|
| validation loss | **{fv['loss']:.4f}** nats/token |
| bits per byte | **{fv['bpb']:.4f}** (all {fv['tokens']:,} predicted tokens charged to {fv['bytes']:,} bytes) |
| last training loss (mean of last 100 steps) | {tl['steps'][-1]['loss']:.4f} |
| validation loss by step | {curve} |

Speculative decoding with the draft heads, mean acceptance length (accepted
draft tokens + 1 bonus token per verification), {acc['prompts']} validation
prompts of {acc['prompt_bytes']} bytes, {acc['new_tokens']} greedy tokens each,
(num_steps, topk, num_draft_tokens) as in SGLang; every output equals the
target's plain greedy output ({sum(r['greedy_mismatches'] for h in acc['heads'].values() for r in h.values())} mismatches):

{accept_table(acc, ['eagle', 'eagle3'])}

## Checks

* Hugging Face: `LlamaForCausalLM.from_pretrained` (transformers
  {hf['transformers']}) loads this folder; on {lg['windows']} validation windows
  ({lg['tokens']:,} tokens) its float32 logits differ from this repository's
  PyTorch model by at most {lg['max_abs_diff']:.1e} (logits up to
  {lg['max_abs_logit']:.1f}; argmax agreement {lg['argmax_agreement']:.0%}),
  `generate()` gives the same 64 greedy tokens, and `tokenizers` /
  `AutoTokenizer` ({hf['tokenizers']}) encode text to `<s>` + its UTF-8 bytes
  and decode it back: {'passed' if hf['passed'] else 'FAILED'}.
* Reproduction: the command below, run again on the same kind of machine, gave
  validation loss {rv['loss']:.5f} (shipped {fv['loss']:.5f}, difference
  {rel:.2%}) and {'a bit-identical' if rep_sha == tgt_sha else 'a different'} model.safetensors.
* Golden fixtures for the C++ tests: `tests/data/model_pair/` from
  `tools/export/golden.py`.

## Reproduce

On a Debian bookworm machine with apt (CPU, ~1 minute), then on one H100/H200:

```
python3 tools/corpus/build_corpus.py            # writes .corpus/
python3 tools/train/train_target.py             # writes .ckpt/target/ (the one command for this model)
```

The draft heads, the export and the measurements:

```
python3 tools/train/train_heads.py --kind eagle --steps {heads['eagle']['args']['steps']}
python3 tools/train/train_heads.py --kind eagle3 --steps {heads['eagle3']['args']['steps']}
python3 tools/export/export_models.py && python3 tools/export/hf_check.py
python3 tools/eagle/eval_accept.py && python3 tools/export/make_card.py
```

## Limitations

A 5.6M-parameter byte model: it repeats itself, invents APIs and loses the
thread after a sentence or two. The training text is under the licences of the
Debian packages it came from (see each package's copyright file); use the model
for testing inference engines.
"""
    (root / name / "README.md").write_text(card)

    for kind in ("eagle", "eagle3"):
        h = heads[kind]
        ha = h["args"]
        sub = f"{name}-{kind}"
        if kind == "eagle":
            what = f"""Architecture `LlamaForCausalLMEagle` (the layout SGLang and the EAGLE
authors publish): `fc` [{shape['hidden_size']}, {2 * shape['hidden_size']}] with bias over
[embedding(token) ; target feature], then one Llama decoder layer without
input_layernorm. The feature is the target's final *normed* hidden state (the
input of its lm_head); the head's output goes to the target's lm_head without a
norm and is fed back as the next step's feature. Embedding and lm_head are the
target's and are not stored. Trained with feature regression (smooth L1) plus
{ha['cls_weight']} × soft cross-entropy to the target's next-token
distribution."""
        else:
            what = f"""Architecture `LlamaForCausalLMEagle3` (SGLang's `llama_eagle3.py` layout):
the target's residual streams entering layers {h['aux_layers']} (SGLang's default
[2, L//2, L-3]; `eagle_aux_hidden_state_layer_ids` {[i - 1 for i in h['aux_layers']]} in
SGLang's output-of-layer convention) are concatenated and fused by `fc`
[{shape['hidden_size']}, {3 * shape['hidden_size']}]; the midlayer normalises the token
embedding (`input_layernorm`) and the fused hidden (`hidden_norm`),
concatenates them (q/k/v take {2 * shape['hidden_size']} inputs) and keeps the hidden as its
residual; `norm` feeds its own draft-vocabulary `lm_head` [259, {shape['hidden_size']}],
and the pre-norm output is the next step's hidden. The draft vocabulary is the
full byte vocabulary, still shipped as `d2t` (int64, target id = draft id +
d2t[draft id], all zero here) and `t2d` (bool, all true). The embedding is the
target's and is not stored. Trained with soft cross-entropy to the target's
next-token distribution."""
        card = f"""# {sub}

Draft head for [`{name}`](../{name}/) ({'EAGLE' if kind == 'eagle' else 'EAGLE-3'}).

{what}

Both heads were trained with a training-time test over {ha['ttt']} steps (step k
sees its own step k-1 output and attends to the prefix plus its earlier steps
at the same position, as a chain in the draft tree does), loss weights 0.8^k,
on {ha['batch']} × {ha['seq']}-token windows of the training split labelled by the
target itself: `tools/train/train_heads.py --kind {kind} --steps {ha['steps']}`,
{ha['steps']} steps in {h['train_seconds']:.0f} s on one {tl['device_name']};
{h['params']:,} trainable parameters; model.safetensors
{mb(size(root / sub / 'model.safetensors'))} (bf16 weights). Top-1 agreement with the
target at the end of training, per unrolled step: {', '.join(f'{x:.3f}' for x in h['steps'][-1]['acc'])}.

Draft positions: the pair (token s[t+1], feature F[t]) sits at RoPE position t;
a tree node at depth d below the root sits at the root's position + d.
Reference drafting and verification: `tools/eagle/spec_decode.py`.

Mean acceptance length on the validation prompts (see the target's card):

{accept_table(acc, [kind])}
"""
        (root / sub / "README.md").write_text(card)
    print("cards written;", {k: mb(v) for k, v in files.items()})


if __name__ == "__main__":
    main()
