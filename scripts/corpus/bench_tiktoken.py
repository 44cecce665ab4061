#!/usr/bin/env python3
"""Tokenizer throughput of OpenAI's tiktoken (GPT-2 encoding) on one corpus file, and an
exact comparison of its ids with flashgpt's shards of the same file.

There is no network on the GPU machine, so the Encoding is built from the local
encoder.json / vocab.bpe (scripts/fetch_vocab.sh), not downloaded:

    python3 scripts/corpus/bench_tiktoken.py cache/corpus/sotu.txt \
        [--vocab cache/gpt2] [--threads 1] [--compare /tmp/sotu_all/train_000000.bin]

where the shard comes from
    flashgpt prepare --input cache/corpus/sotu.txt --out /tmp/sotu_all --val-fraction 0
(one shard, documents in file order, each preceded by <|endoftext|>).
"""
import argparse
import json
import struct
import time
from pathlib import Path

import tiktoken

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
EOT = 50256
SEPARATOR = "\n<|endoftext|>\n"


def bytes_to_unicode():
    """GPT-2's printable stand-in for every byte (as in its encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


def gpt2_encoding(vocab_dir):
    to_byte = bytes_to_unicode()
    encoder = json.loads((Path(vocab_dir) / "encoder.json").read_text(encoding="utf-8"))
    ranks = {bytes(to_byte[ch] for ch in token): rank for token, rank in encoder.items() if token != "<|endoftext|>"}
    return tiktoken.Encoding("gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                             special_tokens={"<|endoftext|>": EOT})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("file")
    ap.add_argument("--vocab", default="cache/gpt2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--compare", help="a flashgpt shard of the same file made with --val-fraction 0")
    args = ap.parse_args()

    enc = gpt2_encoding(args.vocab)
    text = Path(args.file).read_text(encoding="utf-8")
    docs = [d for d in text.rstrip("\n").split(SEPARATOR) if d]
    nbytes = len(text.encode("utf-8"))
    start = time.perf_counter()
    encoded = enc.encode_ordinary_batch(docs, num_threads=args.threads)
    seconds = time.perf_counter() - start
    ids = []
    for doc in encoded:
        ids.append(EOT)
        ids.extend(doc)
    print(f"tiktoken {tiktoken.__version__}: {nbytes / 1e6:.1f} MB, {len(ids)} tokens in {seconds:.2f} s: "
          f"{nbytes / 1e6 / seconds:.2f} MB/s, {len(ids) / 1e6 / seconds:.2f}M tokens/s ({args.threads} thread(s))")
    if args.compare:
        data = Path(args.compare).read_bytes()
        count = struct.unpack("<3i", data[:12])[2]
        ours = list(struct.unpack(f"<{count}H", data[1024:1024 + 2 * count]))
        if ours == ids:
            print(f"identical: {count} tokens")
        else:
            first = next((i for i, (a, b) in enumerate(zip(ours, ids)) if a != b), min(len(ours), len(ids)))
            print(f"DIFFERENT: flashgpt {len(ours)} tokens, tiktoken {len(ids)}; first difference at {first}: "
                  f"flashgpt {ours[first:first + 8]} tiktoken {ids[first:first + 8]}")
            raise SystemExit(1)


if __name__ == "__main__":
    main()
