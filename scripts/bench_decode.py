#!/usr/bin/env python3
"""FlashDecoding (flashgpt) vs PyTorch SDPA with a single query, in the same run.

Runs `flashgpt bench decode --suite --json` (bf16 KV cache, T = 1K..256K, B = 1 and 16,
(H, D) = (12, 64) and (16, 128)), then times torch.nn.functional.scaled_dot_product_attention
with q (B, H, 1, D) and k, v (B, H, T, D) bf16 on the same shapes, with each SDPA backend
that accepts them (default choice, FLASH_ATTENTION, EFFICIENT_ATTENTION, CUDNN_ATTENTION),
and the device copy bandwidth. Same protocol on both sides: a 512 MiB buffer is read
(--flush read, the default) or overwritten (--flush write) before every timed call (cold
L2), CUDA events, median of --iters. A read leaves clean lines in the L2, as in a real
decode step; a write leaves dirty ones, whose write-back (up to the L2's 50 MB) the timed
call then pays for, which weighs on the short caches (the tables of earlier sessions in
BENCHMARKS.md were taken that way).

Bytes = K + V read = 2*B*H*T*D*2; bandwidth = bytes / time, shown in TB/s, as a share of
the device-to-device copy bandwidth ((bytes read + written) / time of a 2 GiB copy, the
issue's yardstick) and as a share of the read bandwidth (a 2 GiB sum: what a read-only
kernel can reach). Goal (issue 11): faster than the best SDPA backend at every length, >=
80% of the copy bandwidth from T = 16K on; the lines below the table say on how many shapes
ours is at or above SDPA (and which are under it) and its lowest share of the copy
bandwidth from T = 16K. The last columns are references timed under the same protocol
(`flashgpt bench decode --floor`): our fastest plain streaming read of exactly the cache's
bytes and its share of the copy bandwidth (launch and ramp-up included, where the 2 GiB
figures are asymptotes; a reference, not a floor: at B = 16 decode kernels have read
faster, BENCHMARKS.md), a launch that does nothing, and the bulk kernel's reading alone
(its grid, splits and shared-memory stages with no arithmetic and no merge): what its way
of reading costs, apart from what it computes.

--layers N (default 1: the protocol above) times a decode step's N layers instead, on both
sides (`flashgpt bench decode --layers N`): N caches per shape, each its own random k and v
(q shared), the L2 flushed once, then the N calls back to back between the events, ms =
elapsed / N, so that the fixed cost of the events and a launch (~3 us, the empty launch)
is shared as in a real step, while every call still reads a cold cache. The number of
layers of a shape is flashgpt's (its JSON row's "layers": N, or fewer where N layers' K and
V would pass 8 GiB), the `layers` column. SDPA's N calls are enqueued behind a hold of
100 us a call (torch.cuda._sleep), so that PyTorch's dispatch is not timed (flashgpt holds
its stream 200 us before every timed region).

--kernels registers,mma,bulk128,bulk256,tile16,tile32 also times those decode kernels
(FLASHGPT_DECODE_KERNEL, FLASHGPT_DECODE_THREADS; mma: the tensor-core kernel; tileN: the bulk kernel's tile of N KB,
FLASHGPT_DECODE_TILE_KB) in the same run, each against the same SDPA figure; the main table
is the default choice.

  python3 scripts/bench_decode.py --flashgpt build/flashgpt [--iters 10] [--warmup 3] [--kernels LIST] [--flush read|write]
                                  [--layers N]
"""
import argparse
import json
import math
import os
import subprocess
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

FLUSH = torch.zeros(512 << 20, dtype=torch.uint8, device="cuda") if torch.cuda.is_available() else None
FLUSH_MODE = "read"  # main() sets it from --flush
HOLD_CYCLES_PER_CALL = 100 * 2000  # --layers > 1: 100 us a call at about the H100/H200's clock (2 GHz)


def flush_l2(i):
    """Evicts the L2: by reading FLUSH (clean lines left behind) or by overwriting it (dirty)."""
    if FLUSH_MODE == "write":
        FLUSH.fill_(i & 0xFF)
    else:
        FLUSH.view(torch.int32).sum()


def timed_ms(fn, warmup, iters, hold_cycles=0):
    times = []
    for i in range(warmup + iters):
        flush_l2(i)  # evict the cache from L2
        if hold_cycles:
            torch.cuda._sleep(hold_cycles)  # the GPU is still busy while fn's kernels are enqueued
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= warmup:
            times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def copy_bandwidth_tbs():
    x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)  # 2 GiB, far above L2
    y = torch.empty_like(x)
    ms = timed_ms(lambda: y.copy_(x), 3, 20)
    del x, y
    return 2 * (1 << 30) * 2 / (ms * 1e-3) / 1e12


def read_bandwidth_tbs():
    """Bytes read per second by a reduction over 2 GiB: the ceiling of a read-only kernel
    such as decoding (a copy also writes, and measures lower)."""
    x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16)
    ms = timed_ms(lambda: x.sum(dtype=torch.float32), 3, 20)
    del x
    return (1 << 30) * 2 / (ms * 1e-3) / 1e12


BACKENDS = [("default", None), ("flash", SDPBackend.FLASH_ATTENTION),
            ("efficient", SDPBackend.EFFICIENT_ATTENTION), ("cudnn", SDPBackend.CUDNN_ATTENTION)]


def bench_sdpa(s, warmup, iters):
    """{backend name: ms} for the SDPA backends that accept the shape: the time of one call,
    timed as flashgpt's row was (its "layers", --layers: that many calls a timed region,
    each on its own k and v, elapsed / layers)."""
    B, H, T, D, layers = s["B"], s["H"], s["T"], s["D"], s.get("layers", 1)
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.bfloat16)
    kv = [(torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16),
           torch.randn(B, H, T, D, device="cuda", dtype=torch.bfloat16)) for _ in range(layers)]
    hold = HOLD_CYCLES_PER_CALL * layers if layers > 1 else 0

    def fn():
        for k, v in kv:
            F.scaled_dot_product_attention(q, k, v)  # one query: nothing to mask

    out = {}
    with torch.no_grad():
        for name, backend in BACKENDS:
            try:
                if backend is None:
                    fn()
                    out[name] = timed_ms(fn, warmup, iters, hold) / layers
                else:
                    with sdpa_kernel([backend]):
                        fn()
                        out[name] = timed_ms(fn, warmup, iters, hold) / layers
            except RuntimeError as e:
                print(f"  SDPA {name} refused {(B, H, T, D)}: {str(e).splitlines()[0][:120]}", file=sys.stderr)
    del q, kv
    torch.cuda.empty_cache()
    return out


def stream_cells(s, copy):
    """The bulk kernel's reading alone (`--floor`'s stream_ms: its grid and stages, no
    arithmetic, no merge) in ms and as a share of the copy bandwidth, or dashes where it
    was not timed (another kernel, or no sm_90a code)."""
    ms = s.get("stream_ms", -1)
    if ms is None or ms < 0:
        return f"{'-':>13} {'-':>6}"
    return f"{ms:13.4f} {100 * s['bytes'] / (ms * 1e-3) / 1e12 / copy:5.1f}%"


def run_flashgpt(args, env, required=True, floor=False):
    """flashgpt bench decode --suite --json [--floor] [--layers N] with extra environment: one
    dict per shape (None when a kernel that is not required cannot run here, e.g. bulk off Hopper)."""
    cmd = [args.flashgpt, "bench", "decode", "--suite", "--json", "--iters", str(args.iters), "--warmup", str(args.warmup),
           "--flush", args.flush] + (["--floor"] if floor else []) + (["--layers", str(args.layers)] if args.layers > 1 else [])
    print("$", *[f"{k}={v}" for k, v in env.items()], *cmd, flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env})
    if res.returncode != 0:
        print(f"flashgpt bench decode failed ({res.returncode}): {res.stderr.strip()[-800:]}", file=sys.stderr)
        if not required:
            return None
        sys.exit(1)
    return [json.loads(line) for line in res.stdout.splitlines() if line.startswith("{")]


def goal_summary(rows, sdpa_ms):
    """Issue 11's speed goal: on how many shapes ours (rows, the --json objects) is at least as
    fast as the best SDPA backend (sdpa_ms, the same order; nan where none ran), the lowest
    ratio (SDPA's time / ours) and the shapes under it."""
    pairs = [(sd / r["ms"], f"B{r['B']} H{r['H']} D{r['D']} T{r['T']}") for r, sd in zip(rows, sdpa_ms) if not math.isnan(sd)]
    if not pairs:
        return "no SDPA backend ran"
    under = [f"{name} {x:.4f}" for x, name in pairs if x < 1]  # (4 places: 0.9995 is under)
    return (f"at or above the best SDPA backend on {len(pairs) - len(under)} of {len(pairs)} shapes, "
            f"{min(x for x, _ in pairs):.3f}-{max(x for x, _ in pairs):.2f}x" + (f"; under: {', '.join(under)}" if under else ""))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashgpt", default="build/flashgpt")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--kernels", default="", help="comma list of registers, bulk128, bulk256, tile16, tile32 to compare")
    ap.add_argument("--flush", choices=["read", "write"], default="read",
                    help="evict the L2 before each timed call by reading (default) or writing 512 MiB")
    ap.add_argument("--layers", type=int, default=1,
                    help="time N calls back to back, each on its own layer's cache, as elapsed / N (a decode step)")
    args = ap.parse_args()
    if args.layers < 1:
        ap.error("--layers must be at least 1")
    global FLUSH_MODE
    FLUSH_MODE = args.flush

    ours = run_flashgpt(args, {}, floor=True)
    variants = {}
    for name in filter(None, args.kernels.split(",")):
        if name in ("registers", "mma"):
            env = {"FLASHGPT_DECODE_KERNEL": name}
        elif name.startswith("tile"):  # the bulk kernel's tile, its default threads
            env = {"FLASHGPT_DECODE_KERNEL": "bulk", "FLASHGPT_DECODE_TILE_KB": name[len("tile"):]}
        elif name.startswith("bulk"):  # bulk<threads>
            env = {"FLASHGPT_DECODE_KERNEL": "bulk", "FLASHGPT_DECODE_THREADS": name[len("bulk"):]}
        else:
            sys.exit(f"--kernels: unknown kernel '{name}' (registers, mma, bulk128, bulk256, tile16, tile32)")
        rows = run_flashgpt(args, env, required=False)
        if rows is not None:
            variants[name] = rows
    copy = copy_bandwidth_tbs()
    read = read_bandwidth_tbs()
    when = "each call" if args.layers == 1 else (
        f"each run of {args.layers} layers' calls (fewer where their K and V would pass 8 GiB: the layers column), "
        f"back to back, each on its own k and v; ms = the run's time / layers")
    print(f"GPU: {torch.cuda.get_device_name()}, torch {torch.__version__}; bf16 KV cache, one query per sequence; "
          f"device copy bandwidth {copy:.2f} TB/s (read + write), read bandwidth {read:.2f} TB/s (a 2 GiB sum); "
          f"median of {args.iters}, L2 flushed (by a {args.flush} of 512 MiB) before {when}")
    layers_head = "" if args.layers == 1 else f" | {'layers':>6}"
    print(f"{'B':>3} {'H':>3} {'D':>4} {'T':>7} | {'ours ms':>8} {'TB/s':>6} {'%copy':>6} {'%read':>6} {'splits':>6} | "
          f"{'SDPA best':>9} {'backend':>9} {'TB/s':>6} | {'speedup':>7} {'kernel':>14} | "
          f"{'plain read':>9} {'%copy':>6} {'empty':>7} | {'reading alone':>13} {'%copy':>6}" + layers_head)
    worst_share_16k, floor_at_worst = float("inf"), float("nan")
    sdpa_ms = []
    for s in ours:
        sd = bench_sdpa(s, args.warmup, args.iters)
        best_name, best_ms = min(sd.items(), key=lambda kv: kv[1]) if sd else ("-", float("nan"))
        sdpa_ms.append(best_ms)
        tbs = s["bytes"] / (best_ms * 1e-3) / 1e12
        floor_share = s["bytes"] / (s["read_ms"] * 1e-3) / 1e12 / copy
        speedup = best_ms / s["ms"]
        share = s["tbs"] / copy
        if s["T"] >= 16384 and share < worst_share_16k:
            worst_share_16k, floor_at_worst = share, floor_share
        print(f"{s['B']:>3} {s['H']:>3} {s['D']:>4} {s['T']:>7} | {s['ms']:8.4f} {s['tbs']:6.2f} {100 * share:5.1f}% "
              f"{100 * s['tbs'] / read:5.1f}% {s['splits']:>6} | {best_ms:9.4f} {best_name:>9} {tbs:6.2f} | "
              f"{speedup:6.2f}x {s.get('kernel', '-'):>14} | {s['read_ms']:9.4f} {100 * floor_share:5.1f}% "
              f"{s['empty_ms']:7.4f} | {stream_cells(s, copy)}" +
              ("" if args.layers == 1 else f" | {s.get('layers', 1):>6}"), flush=True)
    print(goal_summary(ours, sdpa_ms))
    print(f"lowest share of the copy bandwidth from T=16K on: {100 * worst_share_16k:.1f}% "
          f"(a plain read of the same bytes: {100 * floor_at_worst:.1f}%)")
    if variants:
        print("\nthe kernels compared (ms, and the best SDPA backend's time / ours):")
        print(f"{'B':>3} {'H':>3} {'D':>4} {'T':>7} | {'SDPA ms':>8} | " + " | ".join(f"{n:>17}" for n in variants))
        for i, s in enumerate(ours):
            cells = [f"{v[i]['ms']:8.4f} {sdpa_ms[i] / v[i]['ms']:6.2f}x" for v in variants.values()]
            print(f"{s['B']:>3} {s['H']:>3} {s['D']:>4} {s['T']:>7} | {sdpa_ms[i]:8.4f} | " + " | ".join(f"{c:>17}" for c in cells))


if __name__ == "__main__":
    main()
