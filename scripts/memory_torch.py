#!/usr/bin/env python3
"""PyTorch's side of the long-context memory sweep (issue 10): GPT-2 124M trained the way a
PyTorch user writes it, at the same context lengths and batch sizes as `flashgpt memory
--measure`, with SDPA's flash and math backends.

Model: nanoGPT-style GPT-2 124M (vocabulary padded to 50304, tied LM head, tanh GELU,
learned positions with max(1024, T) rows, as flashgpt's sweep), eager (no torch.compile),
bf16 autocast, full logits and F.cross_entropy, grad-norm clipping, fused AdamW. One
training step per point after --warmup steps, --steps timed (median).

Memory: device memory the caching allocator holds at its peak (torch.cuda.max_memory_reserved:
what the GPU gives up, the counterpart of flashgpt's cudaMemGetInfo difference; the CUDA
context is in neither) and the peak of live tensors (max_memory_allocated). A backend that
runs out of memory at some T is recorded as OOM there and not run at longer T.

Output: a table, and with --json FILE the points in the format `flashgpt memory --measured`
reads, so that flashgpt's plot and table show them beside its own.

  python3 scripts/memory_torch.py --seq 1K,4K,16K,64K,128K --tokens-per-step 65536 --json torch.json
"""
import argparse
import json
import math
import os
import sys
import time

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_train import GPT, C, L, V, VP  # noqa: E402  the same model as the training-step benchmark

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0}  # dense bf16, as flashgpt's backend.cpp


def flops_per_token(model, T):
    """flashgpt's formula (layers/gpt2.cpp): 6·N without the position table, plus causal attention."""
    n = sum(p.numel() for name, p in model.named_parameters() if not name.startswith("wpe"))
    return 6 * n + L * 2 * 2 * T * C * 0.5 * 3


def parse_count(s):
    s = s.strip()
    mult = {"K": 1 << 10, "k": 1 << 10, "M": 1 << 20, "m": 1 << 20}.get(s[-1:], 1)
    return int(s[:-1] if mult > 1 else s) * mult


def label(T):
    return f"{T >> 20}M" if T % (1 << 20) == 0 else f"{T >> 10}K" if T % 1024 == 0 else str(T)


def run_point(T, B, backend, warmup, steps):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    model = GPT(max(1024, T)).cuda()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with sdpa_kernel(backend), torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()

    for _ in range(warmup):
        step()
    times = []
    for _ in range(steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    sec = sorted(times)[len(times) // 2]
    fpt = flops_per_token(model, T)
    return {"status": "ok", "measured_bytes": torch.cuda.max_memory_reserved(),
            "allocated_bytes": torch.cuda.max_memory_allocated(), "step_ms": 1e3 * sec,
            "tokens_per_s": B * T / sec, "flops_per_token": fpt}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seq", default="1K,2K,4K,8K,16K,32K,64K,128K,256K", help="context lengths")
    ap.add_argument("--tokens-per-step", type=int, default=65536, help="B = max(1, N / T)")
    ap.add_argument("--backends", default="flash,math", help="SDPA backends: flash, math")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--json", help="write the points here, for flashgpt memory --measured")
    args = ap.parse_args()
    name = torch.cuda.get_device_name()
    peak = next((v for k, v in PEAK_TFLOPS.items() if k in name), 0.0)
    total = torch.cuda.get_device_properties(0).total_memory
    print(f"GPU: {name}, {total / 2**30:.1f} GiB; torch {torch.__version__}; GPT-2 124M eager, bf16 autocast, "
          f"fused AdamW; memory = peak reserved by the caching allocator (peak allocated in brackets)", flush=True)
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "math": SDPBackend.MATH}
    points = []
    for bname in args.backends.split(","):
        out_of_memory_at = None
        for T in [parse_count(s) for s in args.seq.split(",")]:
            B = max(1, args.tokens_per_step // T)
            p = {"T": T, "B": B, "attention": f"PyTorch SDPA {bname}", "recompute": "eager", "gpu": name,
                 "gpu_total_bytes": total}
            if out_of_memory_at is not None:
                p.update(status="OOM", detail=f"not run: out of memory already at T={label(out_of_memory_at)}")
            else:
                t0 = time.time()
                try:
                    p.update(run_point(T, B, backends[bname], args.warmup, args.steps))
                    if peak:
                        p["mfu"] = p["tokens_per_s"] * p["flops_per_token"] / (peak * 1e12)
                except torch.OutOfMemoryError as e:
                    p.update(status="OOM", detail=str(e).splitlines()[0])
                    out_of_memory_at = T
                torch.cuda.empty_cache()
                p["seconds"] = time.time() - t0
            points.append(p)
            if p["status"] == "ok":
                print(f"{label(T):>6} B={B:<3} SDPA {bname:<5} {p['measured_bytes'] / 2**30:7.2f} GiB "
                      f"({p['allocated_bytes'] / 2**30:.2f}) {p['tokens_per_s']:10.0f} tokens/s"
                      f"  MFU {100 * p.get('mfu', 0):4.1f}%  ({p['seconds']:.1f} s)", flush=True)
            else:
                print(f"{label(T):>6} B={B:<3} SDPA {bname:<5} OOM  {p['detail'][:100]}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(points, f, indent=1)


if __name__ == "__main__":
    main()
