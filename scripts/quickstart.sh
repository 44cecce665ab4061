#!/usr/bin/env bash
# One command from a fresh Debian 12 machine to a trained model:
# installs dependencies, builds, fetches GPT-2's vocabulary, builds the small default
# corpus (State of the Union addresses), tokenises it into shards and trains
# configs/tiny.yaml (on the GPU when one is visible, else on the CPU).
#   scripts/quickstart.sh [flashgpt train options...]   e.g. --set train.steps=100
# Each run starts runs/tiny afresh (train --overwrite), unless the options --resume it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install_deps.sh
bash scripts/build.sh
bash scripts/fetch_vocab.sh
python3 scripts/corpus/build.py --subset sotu
./build/flashgpt prepare --input cache/corpus/sotu.txt --out cache/shards/sotu --val-fraction 0.05
overwrite=(--overwrite)
for arg in "$@"; do [[ $arg == --resume* ]] && overwrite=(); done
./build/flashgpt train --config configs/tiny.yaml "${overwrite[@]}" "$@"
