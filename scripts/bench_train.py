#!/usr/bin/env python3
"""Training-step throughput: flashgpt vs PyTorch, GPT-2 124M, bf16, B x 1024 tokens.

flashgpt: `flashgpt bench train -c configs/gpt2-124m.yaml --breakdown`:
forward + backward + grad norm + AdamW with fp32 master weights, bf16 activations,
FlashAttention; it prints tokens/s and a per-op breakdown (CUDA events around each op).
PyTorch: the same model (vocab padded to 50304, tied LM head, tanh GELU) with
torch.compile, bf16 autocast, SDPA (is_causal), fused AdamW, grad-norm clipping,
gradient accumulation 1. Both: --warmup steps, then the median step time over --steps
steps (each step ends with a device synchronisation). Prints both tokens/s and the
ratio flashgpt / PyTorch.

  python3 scripts/bench_train.py [--flashgpt build/flashgpt] [--B 64] [--steps 20]
  python3 scripts/bench_train.py --config configs/tiny.yaml --skip-torch   # flashgpt only, any config
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
    """GPT-2 124M as flashgpt's configs/gpt2-124m.yaml (also used by memory_torch.py)."""

    def __init__(self, max_t=T):
        super().__init__()
        self.wte = nn.Embedding(VP, C)
        self.wpe = nn.Embedding(max_t, C)
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
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    sec = sorted(times)[len(times) // 2]
    mem = torch.cuda.max_memory_allocated() / 2**30
    return {"ms_per_step": 1e3 * sec, "tokens_per_s": B * T / sec,
            "loss": float(loss.detach()), "max_mem_gib": mem}


def bench_flashgpt(flashgpt, config, B, steps, warmup, attn="flash"):
    cmd = [flashgpt, "bench", "train", "-c", config, "--set", f"train.batch_size={B}",
           "--set", "train.total_batch=0", "--set", f"model.attention={attn}",
           "--steps", str(steps), "--warmup", str(warmup), "--breakdown"]
    p = subprocess.run(cmd, capture_output=True, text=True)
    print(p.stdout, end="", flush=True)
    print(p.stderr, end="", file=sys.stderr)
    for line in p.stdout.splitlines():
        if line.startswith("FLASHGPT_BENCH_TRAIN_JSON "):
            r = json.loads(line[len("FLASHGPT_BENCH_TRAIN_JSON "):])
            r["attention"] = attn
            return r
    print(f"flashgpt benchmark (attention={attn}) failed (exit {p.returncode})", flush=True)
    return None


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashgpt", default="build/flashgpt", help="path of the flashgpt binary")
    ap.add_argument("--B", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--config", default="configs/gpt2-124m.yaml",
                    help="flashgpt's model config; the PyTorch side is always GPT-2 124M, so another "
                         "config needs --skip-torch")
    args = ap.parse_args()
    if args.config != "configs/gpt2-124m.yaml" and not args.skip_torch:
        raise SystemExit("--config other than configs/gpt2-124m.yaml needs --skip-torch "
                         "(the PyTorch model is GPT-2 124M)")
    print(f"GPU: {torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    ours = bench_flashgpt(args.flashgpt, args.config, args.B, args.steps, args.warmup)
    if ours is None:  # FlashAttention failing must not hide the rest of the step
        ours = bench_flashgpt(args.flashgpt, args.config, args.B, args.steps, args.warmup, attn="naive")
    if ours is None:
        raise SystemExit("flashgpt benchmark failed")
    theirs = None if args.skip_torch else bench_torch(args.B, args.steps, args.warmup)
    model = "GPT-2 124M" if args.config == "configs/gpt2-124m.yaml" else args.config
    print(f"\n{model} training step, B={args.B} T={ours['T']} (tokens/step {args.B * ours['T']}):")
    print(f"  flashgpt : {ours['ms_per_step']:8.1f} ms/step  {ours['tokens_per_s']:10.0f} tokens/s"
          f"  ({ours['tflops_per_rank']:.0f} TFLOP/s model FLOPs, attention {ours['attention']})")
    if theirs:
        print(f"  pytorch  : {theirs['ms_per_step']:8.1f} ms/step  {theirs['tokens_per_s']:10.0f} tokens/s"
              f"  (torch.compile, autocast bf16, SDPA, fused AdamW; peak mem {theirs['max_mem_gib']:.1f} GiB)")
        print(f"  ratio flashgpt/pytorch tokens/s: {ours['tokens_per_s'] / theirs['tokens_per_s']:.3f}")


if __name__ == "__main__":
    main()
