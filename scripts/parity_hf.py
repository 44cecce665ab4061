#!/usr/bin/env python3
"""flashgpt <-> Hugging Face transformers, on the GPU machine (no network, no model hub).

1. export: a trained flashgpt checkpoint (--trained, e.g. runs/gpt2-124m; without it a
   small model is trained here for 120 steps on the repository's own text) is exported
   with `flashgpt export`, loaded with GPT2LMHeadModel.from_pretrained (and the tokenizer
   with GPT2TokenizerFast.from_pretrained, which must give flashgpt's token ids), and its
   loss on a text (sliding windows, flashgpt's convention) must equal
   `flashgpt eval --text --precision fp32` to 1e-5 relative.
2. import: GPT2LMHeadModel with random weights (GPT-2 124M's shape) saved with
   save_pretrained (fp32, and bf16), imported with `flashgpt import`, must evaluate to
   HF's own loss (labels=...) on the same windows, to 1e-5 relative.
3. generation: greedy `flashgpt sample` (KV cache, FlashDecoding, fp32) against HF's
   greedy generate() on the exported model: the number of identical leading tokens is
   reported (fp32 rounding can flip a near-tie, so it is informative, not pass/fail);
   then a bf16 sample with the default settings is shown.
HF runs in fp32 with TF32 off and eager attention. Exit status 1 if a check fails.

  python3 scripts/parity_hf.py --flashgpt build/flashgpt [--trained runs/gpt2-124m] [--text README.md]
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False
from transformers import GPT2Config, GPT2LMHeadModel  # noqa: E402

EOT = 50256
FAILED = []


def run(cmd, **kw):
    print("$", " ".join(cmd), flush=True)
    res = subprocess.run(cmd, capture_output=True, text=True, errors="replace", **kw)  # samples may cut UTF-8
    if res.returncode != 0:
        print(res.stdout[-2000:], res.stderr[-2000:], file=sys.stderr)
        raise SystemExit(f"command failed with exit code {res.returncode}")
    return res


def check(name, ok, detail):
    print(f"{'PASS' if ok else 'FAIL'}: {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def token_ids(flashgpt, text_file):
    """<|endoftext|> + the text's ids, as `flashgpt eval --text` reads it."""
    with open(text_file, "rb") as f:
        res = subprocess.run([flashgpt, "encode", "--special"], input=f.read(), capture_output=True, check=True)
    return [EOT] + [int(x) for x in res.stdout.split()]


def windows(n_tokens, T, S):
    """(start, first scored target) of each window; targets are ids[1..n_tokens]."""
    out, scored_end, start = [], 0, 0
    while scored_end < n_tokens:
        out.append((start, scored_end + 1))
        scored_end = min(n_tokens, start + T)
        start += S
    return out


@torch.no_grad()
def hf_loss(model, ids, T, S, use_labels):
    """Mean NLL of ids[1:] with flashgpt's sliding windows: HF's own loss (labels=), or
    log-softmax in fp64 of HF's fp32 logits."""
    N = len(ids) - 1
    total, count = 0.0, 0
    for start, first in windows(N, T, S):
        end = min(start + T, N)  # inputs ids[start:end], targets ids[start+1:end+1]
        scored = [i for i in range(start + 1, end + 1) if i >= first]
        if use_labels:
            # HF predicts labels[i] from positions < i: feed one more token (it changes no
            # earlier prediction) and label the scored targets.
            x = torch.tensor([ids[start:end + 1]], device="cuda")
            labels = torch.full_like(x, -100)
            for i in scored:
                labels[0, i - start] = ids[i]
            total += float(model(x, labels=labels).loss) * len(scored)
        else:
            x = torch.tensor([ids[start:end]], device="cuda")
            logp = model(x).logits[0].double().log_softmax(-1)
            total += float(-sum(logp[i - start - 1, ids[i]] for i in scored))
        count += len(scored)
    assert count == N
    return total / N


def flashgpt_eval(args, ckpt, T, S):
    res = run([args.flashgpt, "eval", ckpt, "--text", args.text, "--seq-len", str(T), "--stride", str(S),
               "--precision", "fp32", "--device", "cuda", "--json"])
    return json.loads(res.stdout.strip().splitlines()[-1])


def train_small(args, work):
    """A small model trained briefly on the repository's text (bf16, the default)."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    docs = []
    for d, _, files in os.walk(root):
        if any(p in d for p in ("/build", "/.git", "/cache", "/runs", "/node_modules")):
            continue
        for f in sorted(files):
            if f.endswith((".cpp", ".h", ".cu", ".cuh", ".md", ".py", ".yaml", ".sh")):
                with open(os.path.join(d, f), errors="replace") as fh:
                    docs.append(fh.read())
    os.makedirs(f"{work}/corpus", exist_ok=True)
    with open(f"{work}/corpus/repo.txt", "w") as f:
        f.write("\n<|endoftext|>\n".join(docs))
    run([args.flashgpt, "prepare", "--input", f"{work}/corpus", "--out", f"{work}/shards", "--val-fraction", "0.1",
         "--no-progress"])
    sets = {"model.n_layer": 4, "model.n_head": 4, "model.n_embd": 256, "model.max_seq_len": 256,
            "train.seq_len": 256, "train.batch_size": 16, "train.steps": 120, "train.warmup_steps": 20,
            "train.lr": 2e-3, "train.eval_every": 0, "train.eval_steps": 2, "train.log_every": 40,
            "data.train": f"{work}/shards/train_*.bin", "data.val": f"{work}/shards/val_*.bin",
            "run.out_dir": f"{work}/trained"}
    cmd = [args.flashgpt, "train", "--overwrite"]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    print(run(cmd).stdout.strip().splitlines()[-1])
    return f"{work}/trained"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--flashgpt", default="build/flashgpt")
    ap.add_argument("--trained", default="", help="a trained checkpoint or run dir (default: train a small one)")
    ap.add_argument("--text", default="README.md", help="text for the losses")
    ap.add_argument("--work", default="", help="scratch directory (default: a temporary one)")
    args = ap.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="parity_hf_")
    print(f"torch {torch.__version__}, transformers {__import__('transformers').__version__}, "
          f"{torch.cuda.get_device_name()}; scratch {work}", flush=True)
    ids = token_ids(args.flashgpt, args.text)

    # 1. export of a trained checkpoint -> transformers
    trained = args.trained if args.trained and os.path.exists(args.trained) else train_small(args, work)
    run([args.flashgpt, "export", trained, "--hf", f"{work}/exported"])
    hf = GPT2LMHeadModel.from_pretrained(f"{work}/exported", attn_implementation="eager").float().cuda().eval()
    T = hf.config.n_positions
    S = T // 2
    ours = flashgpt_eval(args, trained, T, S)
    theirs = hf_loss(hf, ids, T, S, use_labels=False)
    rel = abs(ours["loss"] - theirs) / abs(theirs)
    check("export: transformers' loss on flashgpt's export = flashgpt eval --text (fp32)", rel <= 1e-5,
          f"flashgpt {ours['loss']:.8f}, transformers {theirs:.8f}, relative difference {rel:.2e} "
          f"({ours['tokens']} tokens, T {T}, stride {S})")
    try:
        from transformers import GPT2TokenizerFast
        tok = GPT2TokenizerFast.from_pretrained(f"{work}/exported")
        with open(args.text, encoding="utf-8", errors="replace") as f:
            hf_ids = tok(f.read())["input_ids"]
        check("export: the exported tokenizer gives flashgpt's ids", hf_ids == ids[1:],
              f"{len(hf_ids)} vs {len(ids) - 1} ids")
    except Exception as e:  # tokenizers may be missing: not part of the weights' parity
        print(f"(tokenizer check skipped: {e})")

    # 2. random HF GPT-2 (124M shape) saved with save_pretrained -> flashgpt import
    for dtype in (torch.float32, torch.bfloat16):
        torch.manual_seed(0)
        cfg = GPT2Config(n_layer=12, n_head=12, n_embd=768, n_positions=1024, vocab_size=50257,
                         initializer_range=0.05)
        model = GPT2LMHeadModel(cfg).to(dtype)
        name = "fp32" if dtype == torch.float32 else "bf16"
        model.save_pretrained(f"{work}/random_{name}")
        run([args.flashgpt, "import", f"{work}/random_{name}", "--out", f"{work}/imported_{name}"])
        ref = GPT2LMHeadModel.from_pretrained(f"{work}/random_{name}", attn_implementation="eager").float().cuda().eval()
        T2, S2 = 512, 256  # one token below n_positions: HF's labels path feeds T + 1 tokens
        ours = flashgpt_eval(args, f"{work}/imported_{name}", T2, S2)
        theirs = hf_loss(ref, ids, T2, S2, use_labels=True)
        rel = abs(ours["loss"] - theirs) / abs(theirs)
        check(f"import: random GPT2LMHeadModel ({name} save_pretrained) evaluates to HF's own loss", rel <= 1e-5,
              f"flashgpt {ours['loss']:.8f}, transformers {theirs:.8f}, relative difference {rel:.2e}")
        del ref, model
        torch.cuda.empty_cache()

    # 3. generation
    prompt = "The model"
    n_new = 64
    res = run([args.flashgpt, "sample", trained, "--prompt", prompt, "--temperature", "0", "--max-new-tokens",
               str(n_new), "--precision", "fp32", "--device", "cuda"])
    print(res.stderr.strip().splitlines()[-1])
    ours_text = res.stdout
    enc = subprocess.run([args.flashgpt, "encode"], input=prompt.encode(), capture_output=True, check=True)
    p_ids = [int(x) for x in enc.stdout.split()]
    with torch.no_grad():
        gen = hf.generate(torch.tensor([p_ids], device="cuda"), max_new_tokens=n_new, do_sample=False,
                          pad_token_id=EOT, eos_token_id=EOT)[0].tolist()[len(p_ids):]
    gen = [t for t in gen if t != EOT]
    dec = subprocess.run([args.flashgpt, "decode"], input=" ".join(map(str, gen)).encode(), capture_output=True, check=True)
    theirs_text = prompt + dec.stdout.decode("utf-8", errors="replace")
    ours_text = ours_text.rstrip("\n")
    same = 0
    while same < min(len(ours_text), len(theirs_text)) and ours_text[same] == theirs_text[same]:
        same += 1
    print(f"greedy, fp32: flashgpt and transformers generate the same text for {same - len(prompt)} of "
          f"{len(theirs_text) - len(prompt)} characters (informative: fp32 rounding may flip a near-tie)")
    res = run([args.flashgpt, "sample", trained, "--prompt", prompt, "--max-new-tokens", "96", "--top-k", "50",
               "--seed", "1", "--device", "cuda"])
    print(f"--- bf16 sample (top-k 50, seed 1) ---\n{res.stdout}{res.stderr.strip().splitlines()[-1]}")
    print(f"parity_hf: {len(FAILED)} check(s) failed: {', '.join(FAILED)}" if FAILED else "parity_hf: all checks passed")
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
