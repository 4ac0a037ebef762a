"""Byte-level Llama target and its EAGLE / EAGLE-3 draft heads, in PyTorch.

Module and parameter names follow Hugging Face `LlamaForCausalLM` for the
target and the SGLang checkpoint layouts for the heads, so a state_dict saves
straight into the published formats (see tools/export/export_models.py).

Every forward takes explicit positions and an optional boolean attention mask
(True = may attend) plus optional past keys/values. Training uses the plain
causal path; the tree-drafting reference (tools/eagle/spec_decode.py) and the
draft heads' training-time test use the masked path.
"""

import math
import os
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

BOS, EOS, PAD = 256, 257, 258
VOCAB = 259


@dataclass
class LlamaShape:
    vocab_size: int = VOCAB
    hidden_size: int = 256
    intermediate_size: int = 640
    num_hidden_layers: int = 8
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 64
    max_position_embeddings: int = 1024
    rms_norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def to_dict(self):
        return asdict(self)


def deterministic_setup():
    """Make training and evaluation repeatable on the GPU. Strict mode (not
    warn_only) matters: with warn_only, flash and memory-efficient attention
    keep their non-deterministic backward and only warn; strict mode makes
    them use their deterministic variants. SPECULA_WARN_ONLY=1 relaxes it
    for an op that has no deterministic variant."""
    torch.use_deterministic_algorithms(True, warn_only=os.environ.get("SPECULA_WARN_ONLY") == "1")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    # cuDNN's fused attention backward is non-deterministic unless
    # deterministic mode raises errors; leave attention to flash attention.
    if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def eagle3_aux_layers(num_layers: int):
    """Residual-stream inputs of these target layers feed EAGLE-3 (SGLang's
    default [2, L//2, L-3]; index i = the stream entering layer i, i.e. HF
    `hidden_states[i]`)."""
    return [2, num_layers // 2, num_layers - 3]


# ---------------------------------------------------------------- blocks

class RMSNorm(nn.Module):
    def __init__(self, n: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(n))
        self.eps = eps

    def forward(self, x):
        # Normalise in float32 and scale after casting back, as HF Llama does,
        # so exported weights give the same numbers there.
        dt = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dt)


def rope_cos_sin(positions, head_dim: int, theta: float):
    """cos/sin tables [..., T, head_dim] for integer positions [..., T]
    (HF's non-interleaved 'rotate_half' layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device,
                                        dtype=torch.float32) / head_dim))
    f = positions.to(torch.float32)[..., None] * inv
    emb = torch.cat([f, f], dim=-1)
    return emb.cos(), emb.sin()


def apply_rope(x, cos, sin):
    # x: [B, H, T, D]; cos/sin: [B or 1, T, D]
    cos = cos[:, None].to(x.dtype)
    sin = sin[:, None].to(x.dtype)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def attend(q, k, v, mask):
    """q [B,H,Tq,D], k/v [B,KV,Tk,D]; mask None = causal (Tq == Tk), else a
    boolean [B or 1, 1, Tq, Tk] with True where attention is allowed."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:  # grouped-query attention: kv head j serves q heads j*rep..
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    if hasattr(F, "scaled_dot_product_attention"):
        if mask is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    return attend_reference(q, k, v, mask)


def attend_reference(q, k, v, mask):
    """Plain softmax attention (also used to check the fused path)."""
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    s = (q.float() @ k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if mask is None:
        tq, tk = s.shape[-2:]
        mask = torch.ones(tq, tk, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return (s.softmax(-1) @ v.float()).to(q.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: LlamaShape, in_features: int = None):
        super().__init__()
        d_in = in_features or cfg.hidden_size
        self.nh, self.nkv, self.hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
        self.q_proj = nn.Linear(d_in, self.nh * self.hd, bias=False)
        self.k_proj = nn.Linear(d_in, self.nkv * self.hd, bias=False)
        self.v_proj = nn.Linear(d_in, self.nkv * self.hd, bias=False)
        self.o_proj = nn.Linear(self.nh * self.hd, cfg.hidden_size, bias=False)

    def forward(self, x, cos, sin, mask=None, past=None):
        """Returns (output, (k, v)) where k/v are this call's new keys/values
        (after RoPE), so callers can keep them as a cache."""
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.nh, self.hd).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.nkv, self.hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        kk, vv = k, v
        if past is not None:
            kk = torch.cat([past[0], k], dim=2)
            vv = torch.cat([past[1], v], dim=2)
        o = attend(q, kk, vv, mask)
        return self.o_proj(o.transpose(1, 2).reshape(b, t, self.nh * self.hd)), (k, v)


class MLP(nn.Module):
    def __init__(self, cfg: LlamaShape):
        super().__init__()
        h, i = cfg.hidden_size, cfg.intermediate_size
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, cfg: LlamaShape):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask=None):
        a, _ = self.self_attn(self.input_layernorm(x), cos, sin, mask)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h))


# ---------------------------------------------------------------- target

class LlamaModel(nn.Module):
    def __init__(self, cfg: LlamaShape):
        super().__init__()
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(cfg) for _ in range(cfg.num_hidden_layers))
        self.norm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)


class Target(nn.Module):
    """`LlamaForCausalLM` with untied embeddings."""

    def __init__(self, cfg: LlamaShape):
        super().__init__()
        self.cfg = cfg
        self.model = LlamaModel(cfg)
        self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
        self.onehot_embed = False

    def init_weights(self, seed: int):
        g = torch.Generator().manual_seed(seed)
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() == 1:
                nn.init.ones_(p)
                continue
            s = std
            # Residual-branch outputs start small so depth does not blow up
            # the stream (GPT-2 style scaling).
            if name.endswith("o_proj.weight") or name.endswith("down_proj.weight"):
                s = std / math.sqrt(2 * self.cfg.num_hidden_layers)
            with torch.no_grad():
                p.copy_(torch.randn(p.shape, generator=g) * s)

    def forward(self, ids, positions=None, mask=None, capture=()):
        """ids [B,T]. Returns (logits, final normed hidden, {i: stream entering
        layer i for i in capture}). positions default to 0..T-1."""
        b, t = ids.shape
        if positions is None:
            positions = torch.arange(t, device=ids.device)[None]
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        if self.onehot_embed:
            # Training path: the lookup as a one-hot matmul, so the embedding
            # gradient is a GEMM instead of an atomic scatter-add (which a
            # compiler may emit and which is not deterministic).
            w = self.model.embed_tokens.weight
            x = F.one_hot(ids, w.shape[0]).to(w.dtype) @ w
        else:
            x = self.model.embed_tokens(ids)
        caught = {}
        for i, layer in enumerate(self.model.layers):
            if i in capture:
                caught[i] = x
            x = layer(x, cos, sin, mask)
        h = self.model.norm(x)
        return self.lm_head(h), h, caught


# ---------------------------------------------------------------- drafts

class EagleLayer(nn.Module):
    """EAGLE's single decoder layer: a Llama layer whose input_layernorm is
    skipped (SGLang's llama_eagle.py replaces it with the identity, following
    the EAGLE authors), so the checkpoint has no input_layernorm weight."""

    def __init__(self, cfg: LlamaShape):
        super().__init__()
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x, cos, sin, mask, past):
        a, kv = self.self_attn(x, cos, sin, mask, past)
        h = x + a
        return h + self.mlp(self.post_attention_layernorm(h)), kv


class EagleHead(nn.Module):
    """`LlamaForCausalLMEagle`: fc([embed(token); target feature]) -> one
    layer -> predicted next feature. Its embedding and lm_head are the
    target's (not stored); the feature is the target's final *normed* hidden
    state (the input of its lm_head), and the head's output goes to lm_head
    without a norm."""

    kind = "eagle"

    def __init__(self, cfg: LlamaShape):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(2 * h, h, bias=True)
        self.layers = nn.ModuleList([EagleLayer(cfg)])

    def step(self, emb, hidden, positions, mask=None, past=None, lm_head=None):
        """emb/hidden [B,T,h]. Returns (logits, hidden to feed the next
        draft step, (k, v))."""
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.fc(torch.cat([emb, hidden], dim=-1))
        out, kv = self.layers[0](x, cos, sin, mask, past)
        return lm_head(out), out, kv


class Eagle3Head(nn.Module):
    """`LlamaForCausalLMEagle3` as in SGLang's llama_eagle3.py: fc fuses the
    three captured target streams [3h -> h]; the midlayer normalises the token
    embedding (input_layernorm) and the hidden (hidden_norm), concatenates
    them (so q/k/v take 2h inputs), and keeps the hidden as its residual; the
    final norm feeds a draft-vocabulary lm_head, and the pre-norm output is
    what the next draft step receives as its hidden."""

    kind = "eagle3"

    def __init__(self, cfg: LlamaShape, draft_vocab=None):
        super().__init__()
        self.cfg = cfg
        h = cfg.hidden_size
        self.fc = nn.Linear(3 * h, h, bias=False)
        self.midlayer = nn.Module()
        self.midlayer.input_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.midlayer.hidden_norm = RMSNorm(h, cfg.rms_norm_eps)
        self.midlayer.self_attn = Attention(cfg, in_features=2 * h)
        self.midlayer.post_attention_layernorm = RMSNorm(h, cfg.rms_norm_eps)
        self.midlayer.mlp = MLP(cfg)
        self.norm = RMSNorm(h, cfg.rms_norm_eps)
        # Draft vocabulary: here the whole byte vocabulary, but kept as the
        # published mapping so consumers exercise it: target id = draft id +
        # d2t[draft id]; t2d[target id] says whether it is in the draft vocab.
        ids = torch.arange(cfg.vocab_size) if draft_vocab is None else torch.as_tensor(draft_vocab)
        self.lm_head = nn.Linear(h, len(ids), bias=False)
        self.register_buffer("d2t", ids - torch.arange(len(ids)))
        t2d = torch.zeros(cfg.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        self.register_buffer("t2d", t2d)

    def step(self, emb, hidden, positions, mask=None, past=None, lm_head=None):
        cos, sin = rope_cos_sin(positions, self.cfg.head_dim, self.cfg.rope_theta)
        if hidden.shape[-1] != emb.shape[-1]:
            hidden = self.fc(hidden)
        m = self.midlayer
        x = torch.cat([m.input_layernorm(emb), m.hidden_norm(hidden)], dim=-1)
        a, kv = m.self_attn(x, cos, sin, mask, past)
        h = hidden + a
        out = h + m.mlp(m.post_attention_layernorm(h))
        return self.lm_head(self.norm(out)), out, kv

    def to_target_ids(self, draft_ids):
        return draft_ids + self.d2t[draft_ids]


def target_features(head_kind: str, final_hidden, caught, aux_layers):
    """What the target hands a draft head per position."""
    if head_kind == "eagle":
        return final_hidden
    return torch.cat([caught[i] for i in aux_layers], dim=-1)


def count_params(m: nn.Module) -> int:
    return sum(p.numel() for p in m.parameters())
