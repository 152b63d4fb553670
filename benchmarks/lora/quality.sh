#!/usr/bin/env bash
# Does a LoRA fine-tune teach a new question kind as a full fine-tune does? The demo model trained from
# scratch on every kind but "describe" (the main job's recipe: tiny config, 2 ranks), then fine-tuned on
# describing alone from its exported weights (vision frozen, forward only): a full fine-tune of the text
# decoder against rank-16 LoRA adapters on its blocks' linears, each at the rates given, the same steps and
# data; held-out accuracy on the describe questions (and, after, on the old kinds: what each forgot).
# (Counting as the new kind teaches nothing to either in 150 steps: its answer words start far below the
# others in the output bias, which the answer prior set from the old kinds' answers.)
# Writes benchmarks/results/lora_quality_<host>_<date>.md (an earlier file of the day goes below it).
#   benchmarks/lora/quality.sh [build-dir] [fine-tune steps] ["full rates"] ["lora rates"]
set -euo pipefail
cd "$(dirname "$0")/../.."
build=${1:-build}
steps=${2:-150}
full_rates=${3:-1e-4 3e-4}
lora_rates=${4:-1e-3 3e-3}
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
  "$train" --layout 2 --weights "$work/base/model" --kinds "$new" --steps "$steps" --save "$work/$name" --eval-samples 200 --quiet "$@" |
    grep "held-out accuracy after" | sed "s/^/$name $new: /" | tee -a "$raw"
  local t1; t1=$(date +%s)
  # what it keeps of the old kinds: the held-out set of the base's kinds, answered by the exported model
  "$train" --layout 1 --weights "$work/$name/model" --kinds "$old" --steps 0 --eval-samples 200 --quiet |
    grep "held-out accuracy before" | sed "s/^/$name old kinds: /" | tee -a "$raw"
  echo "($name: $(( t1 - t0 )) s)" | tee -a "$raw"
}
for lr in $full_rates; do finetune "full_lr$lr" --lr "$lr" --optimizer adamw; done
for lr in $lora_rates; do finetune "lora16_lr$lr" --lr "$lr" --optimizer adamw --lora 16; done
out=benchmarks/results/lora_quality_$(hostname -s)_$(date +%Y%m%d).md
source benchmarks/results_file.sh && results_begin "$out" "LoRA against a full fine-tune: teaching the demo model a new question kind"
{
  echo "- base: moondream_train --layout 2 --kinds $old (the main job's recipe: tiny config from scratch, 450 steps, 2 CPU ranks)"
  echo "- fine-tunes: moondream_train --layout 2 --weights base/model --kinds $new --steps $steps --optimizer adamw --lr LR (vision frozen, forward only); full: every text weight; lora16: --lora 16 (alpha 16) on text.blocks.N.{attn.qkv, attn.proj, mlp.fc1, mlp.fc2}, the rest frozen"
  echo "- held-out: 200 $new questions after the fine-tune; then 200 questions of the old kinds asked of the fine-tuned export"
} >> "$out"
results_end "$out" "$raw"
