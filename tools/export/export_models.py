#!/usr/bin/env python3
"""Write the trained pair into models/ in the published formats.

    python3 tools/export/export_models.py --ckpt .ckpt --name specula-byte-6m

models/<name>/         Hugging Face LlamaForCausalLM: config.json,
                       model.safetensors (bf16), tokenizer.json (+ config),
                       generation_config.json
models/<name>-eagle/   LlamaForCausalLMEagle (SGLang / EAGLE-authors layout)
models/<name>-eagle3/  LlamaForCausalLMEagle3 (SGLang / EAGLE-authors layout)

The model cards (README.md) are written by tools/export/make_card.py.
"""

import argparse
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "train"))
import st_io  # noqa: E402
from model import BOS, EOS, PAD, eagle3_aux_layers  # noqa: E402

SPECIALS = [(BOS, "<s>"), (EOS, "</s>"), (PAD, "<pad>")]


def llama_config(shape: dict, arch: str, **extra) -> dict:
    cfg = {
        "architectures": [arch],
        "model_type": "llama",
        "vocab_size": shape["vocab_size"],
        "hidden_size": shape["hidden_size"],
        "intermediate_size": shape["intermediate_size"],
        "num_hidden_layers": shape["num_hidden_layers"],
        "num_attention_heads": shape["num_attention_heads"],
        "num_key_value_heads": shape["num_key_value_heads"],
        "head_dim": shape["head_dim"],
        "hidden_act": "silu",
        "max_position_embeddings": shape["max_position_embeddings"],
        "rms_norm_eps": shape["rms_norm_eps"],
        "rope_theta": shape["rope_theta"],
        "rope_scaling": None,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": 0.02,
        "tie_word_embeddings": False,
        "bos_token_id": BOS,
        "eos_token_id": EOS,
        "pad_token_id": PAD,
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }
    cfg.update(extra)
    return cfg


def bytes_to_unicode() -> dict:
    """The GPT-2 byte-level alphabet that HF's ByteLevel pre-tokenizer and
    decoder use: printable Latin-1 bytes stand for themselves, the others
    are shifted to code points 256 and up."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAC + 1)) + \
        list(range(0xAE, 0xFF + 1))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def tokenizer_json() -> dict:
    """Byte-level BPE with no merges: every byte is one token whose id is the
    byte value; <s>, </s>, <pad> are 256..258 and <s> is prepended."""
    alphabet = bytes_to_unicode()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False,
                  "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": i, "content": s, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}
                         for i, s in SPECIALS],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                       {"Sequence": {"id": "A", "type_id": 0}}],
            "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                     {"Sequence": {"id": "A", "type_id": 0}},
                     {"Sequence": {"id": "B", "type_id": 1}}],
            "special_tokens": {"<s>": {"id": "<s>", "ids": [BOS], "tokens": ["<s>"]}},
        },
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None,
            "continuing_subword_prefix": None, "end_of_word_suffix": None,
            "fuse_unk": False, "byte_fallback": False,
            "vocab": {alphabet[b]: b for b in range(256)},
            "merges": [],
        },
    }


def dump(path: Path, obj):
    path.write_text(json.dumps(obj, indent=2, ensure_ascii=False) + "\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ckpt", default=".ckpt")
    ap.add_argument("--name", default="specula-byte-6m")
    ap.add_argument("--out", default="models")
    a = ap.parse_args()
    ck, out = Path(a.ckpt), Path(a.out)
    shape = json.loads((ck / "target/train_log.json").read_text())["shape"]

    tgt = out / a.name
    tgt.mkdir(parents=True, exist_ok=True)
    st_io.save(st_io.load(ck / "target/target.safetensors"), tgt / "model.safetensors",
               metadata={"format": "pt"})
    dump(tgt / "config.json", llama_config(shape, "LlamaForCausalLM"))
    dump(tgt / "generation_config.json", {
        "bos_token_id": BOS, "eos_token_id": EOS, "pad_token_id": PAD,
        "do_sample": False, "max_length": shape["max_position_embeddings"]})
    dump(tgt / "tokenizer.json", tokenizer_json())
    dump(tgt / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>",
        "add_bos_token": True, "add_eos_token": False,
        "model_max_length": shape["max_position_embeddings"],
        "clean_up_tokenization_spaces": False})
    dump(tgt / "special_tokens_map.json",
         {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>"})

    # EAGLE: one layer, no own embedding or lm_head (SGLang shares the
    # target's), fc with bias as in the EAGLE authors' checkpoints.
    e1 = out / f"{a.name}-eagle"
    e1.mkdir(parents=True, exist_ok=True)
    st_io.save(st_io.load(ck / "heads/eagle.safetensors"), e1 / "model.safetensors",
               metadata={"format": "pt"})
    dump(e1 / "config.json", llama_config(shape, "LlamaForCausalLMEagle", num_hidden_layers=1))

    # EAGLE-3: one midlayer, own draft-vocabulary lm_head, d2t/t2d; the
    # embedding is the target's. eagle_aux_hidden_state_layer_ids uses
    # SGLang's convention (capture the output of layer id, i.e. the stream
    # entering layer id+1), which equals its default [2, L//2, L-3] inputs.
    e3 = out / f"{a.name}-eagle3"
    e3.mkdir(parents=True, exist_ok=True)
    sd3 = st_io.load(ck / "heads/eagle3.safetensors")
    st_io.save(sd3, e3 / "model.safetensors", metadata={"format": "pt"})
    aux = eagle3_aux_layers(shape["num_hidden_layers"])
    dump(e3 / "config.json", llama_config(
        shape, "LlamaForCausalLMEagle3", num_hidden_layers=1,
        draft_vocab_size=int(sd3["lm_head.weight"].shape[0]),
        target_hidden_size=shape["hidden_size"],
        eagle_config={"eagle_aux_hidden_state_layer_ids": [i - 1 for i in aux],
                      "use_aux_hidden_state": True}))

    for d in (tgt, e1, e3):
        print(d, sum(f.stat().st_size for f in d.iterdir()), "bytes")


if __name__ == "__main__":
    main()
