#!/usr/bin/env python3
"""Peers for `specula bench attention --device cuda` (issue 54), measured on the same GPU in the
same sitting: PyTorch's scaled_dot_product_attention through its cuDNN and FlashAttention-2
backends on the shapes specula's CUDA bench runs, timed the same way (cold L2: a 256 MiB buffer is
written before every timed call; CUDA events around the call; the median of 30 calls after 3
untimed ones) and reported by the same formulas (prefill: 4 x head_dim x visible (query, key)
pairs x query heads; decode: the K and V bytes read), next to a copy and a bf16 GEMM ceiling
measured here. The peers read contiguous K/V (they have no page table); specula reads pages.

Usage (on the GPU machine): python3 tools/attention_peer.py [--filter TEXT] [--json FILE]
A backend that refuses a shape (GQA, a lower-right causal mask) prints n/a with the reason.
"""
import argparse
import json
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

# name, batch, query heads, KV heads, head_dim, new tokens, keys, causal: the rows of
# `specula bench attention --device cuda` (cuda_cases in src/specula/cli/bench_attention.cpp).
CASES = [
    ("decode B=1 L=32768", 1, 32, 8, 128, 1, 32768, False),
    ("decode B=64 L=4096", 64, 32, 8, 128, 1, 4096, False),
    ("decode B=256 L=1024", 256, 32, 8, 128, 1, 1024, False),
    ("prefill causal hd64 B=2 S=8192", 2, 32, 32, 64, 8192, 8192, True),
    ("prefill noncausal hd64 B=2 S=8192", 2, 32, 32, 64, 8192, 8192, False),
    ("prefill causal hd128 B=2 S=8192", 2, 32, 32, 128, 8192, 8192, True),
    ("prefill noncausal hd128 B=2 S=8192", 2, 32, 32, 128, 8192, 8192, False),
    ("extend prefix=8192 +1024 B=2", 2, 32, 8, 128, 1024, 9216, True),
    ("prefill S=131072 qwen2.5-7b-1m", 1, 28, 4, 128, 131072, 131072, True),
]
BACKENDS = [("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash2", SDPBackend.FLASH_ATTENTION)]


def median_seconds(fn, flush, iters=30, warmup=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        flush.fill_(1)  # evicts the L2 (50 MB on an H200) before the call
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def ceilings(flush):
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = median_seconds(lambda: dst.copy_(src), flush, iters=10)
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    gemm_s = median_seconds(lambda: a @ b, flush, iters=10)
    return 2 * src.numel() / copy_s / 1e12, 2 * 8192**3 / gemm_s / 1e12


def visible_pairs(q_len, kv_len, causal):
    if not causal:
        return q_len * kv_len
    prefix = kv_len - q_len  # queries are the last rows (bottom-right causal)
    return q_len * prefix + q_len * (q_len + 1) // 2


def run_case(case, backend, flush):
    name, batch, hq, hkv, dim, q_len, kv_len, causal = case
    q = torch.randn(batch, hq, q_len, dim, dtype=torch.bfloat16, device="cuda")
    k = torch.randn(batch, hkv, kv_len, dim, dtype=torch.bfloat16, device="cuda")
    v = torch.randn_like(k)
    kwargs = {"enable_gqa": hq != hkv}
    if causal and q_len == kv_len:
        kwargs["is_causal"] = True
    elif causal:
        kwargs["attn_mask"] = causal_lower_right(q_len, kv_len)
    with sdpa_kernel(backend):
        call = lambda: F.scaled_dot_product_attention(q, k, v, **kwargs)
        call()  # a refusal raises here
        seconds = median_seconds(call, flush)
    flops = 4 * dim * visible_pairs(q_len, kv_len, causal) * hq * batch
    kv_bytes = batch * kv_len * hkv * 2 * dim * 2
    return seconds, flops / seconds / 1e12, kv_bytes / seconds / 1e12


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--json", default="", help="write the rows to this file")
    args = parser.parse_args()
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    copy_tbps, gemm_tflops = ceilings(flush)
    print(f"attention peers  {torch.cuda.get_device_name()}  torch {torch.__version__}  "
          f"cuDNN {torch.backends.cudnn.version()}")
    print(f"ceilings measured now: copy {copy_tbps:.2f} TB/s (read + written), bf16 GEMM {gemm_tflops:.0f} TFLOP/s; "
          "L2 cold at each call's start; contiguous K/V\n")
    print(f"{'case':<38} {'backend':<7} {'ms/call':>9} {'KV TB/s':>8} {'of copy':>8} {'TFLOP/s':>8} {'of gemm':>8}")
    rows = []
    for case in CASES:
        if args.filter not in case[0]:
            continue
        decode = case[5] == 1
        for label, backend in BACKENDS:
            try:
                seconds, tflops, tbps = run_case(case, backend, flush)
            except RuntimeError as error:  # the backend does not serve the shape
                reason = str(error).strip().splitlines()[0][:60]
                print(f"{case[0]:<38} {label:<7} {'n/a':>9}  ({reason})")
                rows.append({"case": case[0], "backend": label, "error": str(error)})
                continue
            share = f"{100 * tbps / copy_tbps:.0f}%" if decode else ""
            gemm_share = "" if decode else f"{100 * tflops / gemm_tflops:.0f}%"
            print(f"{case[0]:<38} {label:<7} {seconds * 1e3:>9.3f} {tbps:>8.2f} {share:>8} {tflops:>8.1f} {gemm_share:>8}")
            rows.append({"case": case[0], "backend": label, "seconds_per_call": seconds, "tflops": tflops,
                         "kv_tbytes_per_second": tbps})
            torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "copy_tbps": copy_tbps, "gemm_tflops": gemm_tflops,
                       "rows": rows}, f, indent=1)
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
