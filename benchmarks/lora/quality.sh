#!/usr/bin/env bash
# Does a LoRA fine-tune teach a new question kind as a full fine-tune does? The demo model trained from
# scratch on every kind but "describe" (the main job's recipe: tiny config, 2 ranks), then fine-tuned from
# its exported weights (vision frozen, forward only) on a mix that asks "describe" 4 times as often as each
# old kind: a full fine-tune of the text decoder against rank-16 LoRA adapters on its blocks' linears, and on
# the blocks and the vocabulary head, the same steps and data; held-out accuracy per kind.
# (The new kind's answer words start far below the others in the frozen output bias, which the base's answer
# prior set from the old kinds' answers: adapters on the blocks alone did not raise them in 300 steps.)
# Writes benchmarks/results/lora_quality_<host>_<date>.md (an earlier file of the day goes below it).
#   benchmarks/lora/quality.sh [build-dir] [fine-tune steps] ["full rates"] ["lora rates"]
# (results of 2026-12-07: 300 steps, full 5e-4, LoRA 2e-3; WORK=dir keeps the runs and reuses a trained base)
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-300}
full_rates=${3:-5e-4}
lora_rates=${4:-2e-3}
train=$build/examples/moondream/moondream_train
work=${WORK:-$(mktemp -d)}
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
mkdir -p "$work"
raw=$work/raw.txt
old=color,shape,position,count
new=describe
start=$(date +%s)
if [ ! -f "$work/base/checkpoint/latest" ]; then  # (model/ is written before training too, by the first evaluation)
  : > "$raw"
  "$train" --layout 2 --kinds "$old" --save "$work/base" --eval-samples 200 --quiet | grep "held-out accuracy" | sed 's/^/base: /' | tee -a "$raw"
  echo "(base: $(( $(date +%s) - start )) s)" | tee -a "$raw"
fi
finetune() {  # finetune NAME FLAGS...: fine-tunes on the new kind, then asks the old ones
  local name=$1; shift
  local t0; t0=$(date +%s)
  "$train" --layout 2 --weights "$work/base/model" --kinds "$old,$new=4" --steps "$steps" --save "$work/$name" --eval-samples 200 --quiet "$@" |
    grep "held-out accuracy after" | sed "s/^/$name: /" | tee -a "$raw"
  local t1; t1=$(date +%s)
  # what it keeps of the old kinds: the held-out set of the base's kinds, answered by the exported model
  "$train" --layout 1 --weights "$work/$name/model" --kinds "$old" --steps 0 --eval-samples 200 --quiet |
    grep "held-out accuracy before" | sed "s/^/$name old kinds: /" | tee -a "$raw"
  echo "($name: $(( t1 - t0 )) s)" | tee -a "$raw"
}
for lr in $full_rates; do finetune "full_lr$lr" --lr "$lr" --optimizer adamw; done
for lr in $lora_rates; do
  finetune "lora16_blocks_lr$lr" --lr "$lr" --optimizer adamw --lora 16
  finetune "lora16_blocks_head_lr$lr" --lr "$lr" --optimizer adamw --lora 16 --lora-targets 'text\.(blocks\.[0-9]+\.(attn\.(qkv|proj)|mlp\.(fc1|fc2))|lm_head)'
done
out=benchmarks/results/lora_quality_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && results_begin "$out" "LoRA against a full fine-tune: teaching the demo model a new question kind"
{
  echo "- base: moondream_train --layout 2 --kinds $old (the main job's recipe: tiny config from scratch, 450 steps, 2 CPU ranks)"
  echo "- fine-tunes: moondream_train --layout 2 --weights base/model --kinds $old,$new=4 --steps $steps --optimizer adamw --lr LR (vision frozen, forward only); full: every text weight; lora16_blocks: --lora 16 (alpha 16) on text.blocks.N.{attn.qkv, attn.proj, mlp.fc1, mlp.fc2}; lora16_blocks_head: and text.lm_head; the rest frozen"
  echo "- held-out: 200 questions of the fine-tune's mix; then 200 of the old kinds alone asked of the fine-tuned export"
} >> "$out"
results_end "$out" "$raw"
