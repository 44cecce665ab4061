#!/usr/bin/env python3
"""Training-step throughput: flashgpt vs PyTorch, GPT-2 124M, bf16, B x 1024 tokens.

flashgpt: runs the C++ harness (tests/cuda/test_cuda_model.cpp, BenchTrainStepGpt2_124M):
forward + backward + grad norm + AdamW with fp32 master weights, bf16 activations,
FlashAttention; it prints tokens/s and a per-op breakdown (CUDA events around each op).
PyTorch: the same model (vocab padded to 50304, tied LM head, tanh GELU) with
torch.compile, bf16 autocast, SDPA (is_causal), fused AdamW, grad-norm clipping,
gradient accumulation 1. Both: 3 warm-up steps, then the mean over --steps steps.
Prints both tokens/s and the ratio flashgpt / PyTorch.

  python3 scripts/bench_train.py --tests build/flashgpt_tests [--B 64] [--steps 10]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

V, VP, C, L, H, T = 50257, 50304, 768, 12, 12, 1024


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C)
        self.c_attn = nn.Linear(C, 3 * C)
        self.attn_proj = nn.Linear(C, C)
        self.ln_2 = nn.LayerNorm(C)
        self.c_fc = nn.Linear(C, 4 * C)
        self.mlp_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T_, _ = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.attn_proj(y.transpose(1, 2).reshape(B, T_, C))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x)), approximate="tanh"))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.wte = nn.Embedding(VP, C)
        self.wpe = nn.Embedding(T, C)
        self.h = nn.ModuleList(Block() for _ in range(L))
        self.ln_f = nn.LayerNorm(C)
        for p in self.parameters():
            if p.dim() == 2:
                nn.init.normal_(p, 0.0, 0.02)

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte.weight.t()  # tied head, padded vocab
        return F.cross_entropy(logits.float().view(-1, VP), targets.view(-1))


def bench_torch(B, steps, warmup):
    torch.backends.cuda.matmul.allow_tf32 = True
    model = GPT().cuda()
    decay = [p for p in model.parameters() if p.dim() == 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=6e-4, betas=(0.9, 0.95), eps=1e-8, fused=True)
    cmodel = torch.compile(model)
    idx = torch.randint(0, V, (B, T), device="cuda")
    tgt = torch.randint(0, V, (B, T), device="cuda")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = cmodel(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        return loss

    t0 = time.time()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    print(f"pytorch: compile + {warmup} warm-up steps took {time.time() - t0:.1f} s", flush=True)
    t0 = time.time()
    for _ in range(steps):
        loss = step()
    torch.cuda.synchronize()
    sec = time.time() - t0
    mem = torch.cuda.max_memory_allocated() / 2**30
    return {"ms_per_step": 1e3 * sec / steps, "tokens_per_s": B * T * steps / sec,
            "loss": float(loss.detach()), "max_mem_gib": mem}


def bench_flashgpt(tests, B, attn="flash"):
    env = dict(os.environ, FLASHGPT_BENCH="1", FLASHGPT_BENCH_B=str(B), FLASHGPT_BENCH_ATTN=attn)
    p = subprocess.run([tests, "--gtest_filter=CudaModel.BenchTrainStepGpt2_124M"], env=env,
                       capture_output=True, text=True)
    print(p.stdout, end="", flush=True)
    print(p.stderr, end="", file=sys.stderr)
    for line in p.stdout.splitlines():
        if line.startswith("FLASHGPT_BENCH_JSON "):
            return json.loads(line[len("FLASHGPT_BENCH_JSON "):])
    print(f"flashgpt benchmark (attention={attn}) failed (exit {p.returncode})", flush=True)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", required=True, help="path of flashgpt_tests")
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--skip-torch", action="store_true")
    args = ap.parse_args()
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    ours = bench_flashgpt(args.tests, args.B)
    if ours is None:  # FlashAttention failing must not hide the rest of the step
        ours = bench_flashgpt(args.tests, args.B, attn="naive")
    if ours is None:
        raise SystemExit("flashgpt benchmark failed")
    theirs = None if args.skip_torch else bench_torch(args.B, args.steps, args.warmup)
    print(f"\nGPT-2 124M training step, bf16, B={args.B} T={T} (tokens/step {args.B * T}):")
    print(f"  flashgpt : {ours['ms_per_step']:8.1f} ms/step  {ours['tokens_per_s']:10.0f} tokens/s"
          f"  ({ours['tflops']:.0f} TFLOP/s model FLOPs, attention {ours['attention']})")
    if theirs:
        print(f"  pytorch  : {theirs['ms_per_step']:8.1f} ms/step  {theirs['tokens_per_s']:10.0f} tokens/s"
              f"  (torch.compile, autocast bf16, SDPA, fused AdamW; peak mem {theirs['max_mem_gib']:.1f} GiB)")
        print(f"  ratio flashgpt/pytorch tokens/s: {ours['tokens_per_s'] / theirs['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
