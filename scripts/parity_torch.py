#!/usr/bin/env python3
"""flashgpt vs PyTorch on the same GPT-2: loss and every gradient.

flashgpt writes its initial weights, a batch, its loss and its gradients (fp32 model on
the GPU) as raw files (see tests/cuda/test_cuda_model.cpp, DumpForTorchParity):
  meta.json   config, B, T, loss, parameter list (name, offset, shape; ParamInfo order)
  params.bin  grads.bin  fp32 arenas;   inputs.bin  targets.bin  int32 (B*T)
This script builds a GPT-2 of the same config in PyTorch (nanoGPT-style module whose
parameter names and nn.Linear layouts are flashgpt's), loads the weights, runs the batch
and compares. The reference is PyTorch in fp64; PyTorch in fp32 (no TF32) is the naive
same-precision computation that fixes the bound, per element, for every gradient:
    |flashgpt - torch64| <= 2*|torch32 - torch64| + max|torch32 - torch64|
and the loss must agree with torch64 to 1e-5 relative. Exit status 1 on any failure.

  python3 scripts/parity_torch.py --tests build/flashgpt_tests      # dump + compare
  python3 scripts/parity_torch.py --dump DIR                        # compare an existing dump
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class Attention(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.H = H
        self.c_attn = nn.Linear(C, 3 * C)
        self.c_proj = nn.Linear(C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.H, C // self.H).transpose(1, 2) for t in (q, k, v))  # (B, H, T, D)
        s = (q @ k.transpose(-2, -1)) / math.sqrt(C // self.H)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        p = s.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        y = (p @ v).transpose(1, 2).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nn.Module):
    def __init__(self, C):
        super().__init__()
        self.c_fc = nn.Linear(C, 4 * C)
        self.c_proj = nn.Linear(4 * C, C)

    def forward(self, x):
        return self.c_proj(F.gelu(self.c_fc(x), approximate="tanh"))


class Block(nn.Module):
    def __init__(self, C, H):
        super().__init__()
        self.ln_1 = nn.LayerNorm(C, eps=1e-5)
        self.attn = Attention(C, H)
        self.ln_2 = nn.LayerNorm(C, eps=1e-5)
        self.mlp = MLP(C)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, m):
        super().__init__()
        C = m["n_embd"]
        self.V = m["vocab_size"]
        self.wte = nn.Parameter(torch.zeros(m["padded_vocab"], C))
        self.wpe = nn.Parameter(torch.zeros(m["max_seq_len"], C))
        self.h = nn.ModuleList(Block(C, m["n_head"]) for _ in range(m["n_layer"]))
        self.ln_f = nn.LayerNorm(C, eps=1e-5)

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte[idx] + self.wpe[:T]
        for b in self.h:
            x = b(x)
        logits = self.ln_f(x) @ self.wte[: self.V].t()  # the padding rows never score
        losses = F.cross_entropy(logits.view(B * T, -1), targets.view(-1), ignore_index=-1,
                                 reduction="none")
        return losses


def run_torch(meta, params, inputs, targets, dtype, device):
    torch.manual_seed(0)
    model = GPT(meta).to(device=device, dtype=dtype)
    named = dict(model.named_parameters())
    for p in meta["params"]:
        n = int(np.prod(p["shape"]))
        w = params[p["offset"]: p["offset"] + n].reshape(p["shape"])
        with torch.no_grad():
            named[p["name"]].copy_(torch.from_numpy(w.astype(np.float64)).to(dtype))
    assert len(named) == len(meta["params"]), "parameter lists differ"
    idx = torch.from_numpy(inputs).long().to(device).view(meta["B"], meta["T"])
    tgt = torch.from_numpy(targets).long().to(device).view(meta["B"], meta["T"])
    losses = model(idx, tgt)
    valid = (tgt.view(-1) >= 0).sum()
    mean_loss = losses.sum() / valid
    # flashgpt seeds every row's gradient with dloss = 1/(B*T) (see its dump).
    (losses.sum() / (meta["B"] * meta["T"])).backward()
    grads = {p["name"]: named[p["name"]].grad.detach().double().cpu().numpy().ravel()
             for p in meta["params"]}
    return float(mean_loss.detach()), grads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tests", help="flashgpt_tests binary: write a fresh dump first")
    ap.add_argument("--dump", help="directory of an existing dump")
    args = ap.parse_args()
    if not args.tests and not args.dump:
        ap.error("give --tests or --dump")
    d = args.dump or tempfile.mkdtemp(prefix="flashgpt_parity_")
    if args.tests:
        os.makedirs(d, exist_ok=True)
        env = dict(os.environ, FLASHGPT_PARITY_DIR=d)
        subprocess.run([args.tests, "--gtest_filter=CudaModel.DumpForTorchParity"], env=env, check=True)
    meta = json.load(open(os.path.join(d, "meta.json")))
    params = np.fromfile(os.path.join(d, "params.bin"), dtype=np.float32)
    ours = np.fromfile(os.path.join(d, "grads.bin"), dtype=np.float32)
    inputs = np.fromfile(os.path.join(d, "inputs.bin"), dtype=np.int32)
    targets = np.fromfile(os.path.join(d, "targets.bin"), dtype=np.int32)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    loss64, g64 = run_torch(meta, params, inputs, targets, torch.float64, device)
    loss32, g32 = run_torch(meta, params, inputs, targets, torch.float32, device)

    ok = True
    rel = abs(meta["loss"] - loss64) / abs(loss64)
    print(f"loss: flashgpt {meta['loss']:.9f}  torch fp64 {loss64:.9f}  torch fp32 {loss32:.9f}  "
          f"rel err {rel:.2e} (limit 1e-5)")
    ok &= rel <= 1e-5
    print(f"{'parameter':32s} {'max|ours-ref|':>14s} {'max|t32-ref|':>14s} {'err/bound':>10s}")
    for p in meta["params"]:
        n = int(np.prod(p["shape"]))
        o = ours[p["offset"]: p["offset"] + n].astype(np.float64)
        r, t = g64[p["name"]], g32[p["name"]]
        naive_err = np.abs(t - r)
        bound = np.maximum(2 * naive_err + naive_err.max(), 1e-300)
        ratio = np.abs(o - r) / bound
        worst = float(np.nanmax(ratio)) if not np.isnan(ratio).any() else float("nan")
        good = bool(np.all(ratio <= 1))
        ok &= good
        print(f"{p['name']:32s} {np.abs(o - r).max():14.3e} {naive_err.max():14.3e} {worst:10.3f}"
              f"{'' if good else '  FAIL'}")
    print("PARITY", "PASS" if ok else "FAIL")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
