#!/usr/bin/env python3
"""Runs PyTorch's SDPA with the cuDNN backend, forward and backward, four times at one shape
(bf16, (B, H, T, D)), for a profiler to look at cuDNN's kernels beside ours: the fourth
launch of each is the one to profile, e.g.

  scripts/ncu_profile.sh /tmp/cudnn_bwd bprop -- \\
      python3 scripts/cudnn_attention_run.py --batch 1 --heads 32 --seq 16384 --head-dim 64

(`ncu_profile.sh` skips three launches by default). --names prints the CUDA kernels of one
more iteration, with their times, to find the names to match. --layout qkv gives cuDNN
flashgpt's training layout (q, k, v strided views of one (B, T, 3, H, D) tensor) instead of
contiguous (B, H, T, D) tensors: on an H100 its backward read as much from DRAM and ran as
fast either way (BENCHMARKS.md, "Fifty-seventh session", call 3)."""
import argparse

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, required=True)
    ap.add_argument("--heads", type=int, required=True)
    ap.add_argument("--seq", type=int, required=True)
    ap.add_argument("--head-dim", type=int, required=True)
    ap.add_argument("--full", action="store_true", help="no causal mask")
    ap.add_argument("--names", action="store_true", help="print the kernels of one more iteration")
    ap.add_argument("--layout", choices=("bhtd", "qkv"), default="bhtd",
                    help="bhtd: q, k, v and the output gradient each a contiguous (B, H, T, D) tensor "
                    "(scripts/bench_attention.py's baseline); qkv: flashgpt's training layout, q, k and v "
                    "views of one (B, T, 3, H, D) tensor and the gradient a view of (B, T, H, D)")
    a = ap.parse_args()
    shape = (a.batch, a.heads, a.seq, a.head_dim)
    if a.layout == "bhtd":
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
        dout = torch.ones(shape, device="cuda", dtype=torch.bfloat16)
    else:
        qkv = torch.randn(a.batch, a.seq, 3, a.heads, a.head_dim, device="cuda", dtype=torch.bfloat16,
                          requires_grad=True)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        dout = torch.ones(a.batch, a.seq, a.heads, a.head_dim, device="cuda", dtype=torch.bfloat16).transpose(1, 2)

    def step():
        o = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=not a.full)
        o.backward(dout)

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        for _ in range(4):
            step()
        torch.cuda.synchronize()
        if a.names:
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                step()
                torch.cuda.synchronize()
            for e in prof.key_averages():
                if e.device_time_total > 0:
                    print(f"{e.key}  {e.device_time_total / 1e3:.3f} ms  x{e.count}")


if __name__ == "__main__":
    main()
