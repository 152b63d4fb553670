#!/usr/bin/env bash
# Multi-process checks of moondream_train, each with real ranks on loopback (free ports: mpx picks them
# when MASTER_PORT is unset) and bounded time:
#   parity2 | parity4: 10 steps of the 2-/4-stage pipeline match one process (plain LibTorch), loss
#                      within 1e-5 relative every step, and every weight at the end within 1e-4
#   frozen:   with --freeze-vision on the vision stage runs forward only (its rank's table has no backward);
#             layouts 2 (1F1B, ZB-H1) and 4 match one process with the encoder frozen, and vision is unchanged
#   balanced: --plan shows where layouts 2, 2b, 4 and 4b put the pieces; the balanced layouts (the encoder's
#             tail and text layers on one stage; the frozen encoder over forward-only stages) match one process,
#             and a 4b checkpoint resumes in layouts 2, 1 and 2b with the uninterrupted losses
#   rebalance: layout 2b cut for declared (1,0.5 and 0.5,1) and probed device speeds matches the equal cut's
#             losses, the slower device holding fewer pieces; a run whose rank 0 is held to 0.3 of a core mid-run
#             (scripts/slow_rank.py) names it, saves, restarts on a cut for the measured speeds and ends with the
#             uninterrupted run's losses
#   dp:       2 replicas x 2 stages match one process computing the same global batch
#   shard:    ZeRO-2 and -3 over 2 replicas x 2 stages (and over a tensor-parallel stage) match one
#             process; their checkpoints resume unsharded and the other way round; ZeRO-3's memory
#   tp:       vision | text split over 2 ranks (tensor parallel, 3 ranks) matches one process for 10 steps,
#             and so do 2 replicas of it (6 ranks); its exported model is whole (moondream_query reads it);
#             with grouped-query attention, one key/value head shared by the 2 ranks
#   lora:     LoRA adapters (rank 4) on the text decoder's linears, the base frozen: the 2-stage pipeline with
#             the text stage tensor-parallel over 2 ranks, and 2 replicas x 2 stages (also at ZeRO-3), match one process for 5
#             steps; the merged export is base + alpha/r B.A within 1e-6; checkpoints hold the adapters alone
#             and resume in the same layout (the same losses) and in one process; moondream_query answers with the
#             base plus the adapters as with the merged model; bad patterns, adapters and mixed loads named
#   quant:    QLoRA (rank-4 adapters on an nf4 base) with the text stage tensor-parallel over 2 ranks matches one
#             process for 4 steps, its export merges into the dequantized base; int4 quantization-aware training
#             likewise, its quantized export (packed codes and scales) answers in moondream_query; bad flags named
#   resume:   a run resumed from its step-3 checkpoint repeats the uninterrupted run's losses
#   resumetp: the same with the text stage tensor-parallel (each rank's shards and 8-bit AdamW state)
#   restart:  7 seeded faults under --max-restarts end with the uninterrupted run's weights, bit for bit
#   crashsave: a crash after each phase of a save leaves a checkpoint that --resume uses
#   reshard:  a checkpoint of one layout (split, schedule, replicas, one process) resumes in another with the same losses
#   reshardtp: the same between tensor-parallel degrees; the consolidated export is the whole model
#   errors:   bad input stops with a message that names the fix
#   torchrun: the 2-stage pipeline started by torchrun (its default rendezvous: the agent's store; $TORCHRUN,
#             default torchrun) repeats the self-launched run's losses and weights
#   demo:     the main job, short: trains from scratch on 2 ranks, then moondream_query answers (a held-out
#             picture's fitting questions; a PIL-drawn PNG and JPEG; a truncated JPEG is refused, named)
# Usage: train_checks.sh CHECK MOONDREAM_TRAIN WORKDIR [MOONDREAM_QUERY]
set -euo pipefail
check=$1 train=$2 work=$3/$1 query=${4:-}
rm -rf "$work" && mkdir -p "$work"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# parity in fp32 AdamW (the 8-bit moments round a last-bit difference of the reduction order up to a
# quantisation step); resume runs the recipe's 8-bit AdamW, whose state must survive the checkpoint
small=(--config tiny --microbatch-size 2 --eval-samples 0 --quiet --timeout 60 --optimizer adamw)

# compare A.jsonl B.jsonl [from-step [tol]]: losses and gradient norms (before clipping; the metrics keep 6
# digits) within tol (1e-5) relative, step for step
compare() {
  python3 - "$@" <<'PY'
import json, sys
a = {j["step"]: j for j in map(json.loads, open(sys.argv[1]))}
b = {j["step"]: j for j in map(json.loads, open(sys.argv[2]))}
first = int(sys.argv[3]) if len(sys.argv) > 3 else 0
steps = sorted(s for s in b if s >= first)
assert steps and all(s in a for s in steps), f"steps differ: {sorted(a)} vs {sorted(b)}"
rel = lambda k, s: abs(a[s][k] - b[s][k]) / abs(a[s][k])
worst, worst_norm = max(rel("loss", s) for s in steps), max(rel("grad_norm", s) for s in steps)
for s in steps: print(f"step {s}: loss {a[s]['loss']:.8f} {b[s]['loss']:.8f}, grad norm {a[s]['grad_norm']} {b[s]['grad_norm']}")
print(f"{len(steps)} steps, worst relative loss difference {worst:.2e}, gradient norm {worst_norm:.2e}")
tol = float(sys.argv[4]) if len(sys.argv) > 4 else 1e-5
sys.exit(0 if worst <= tol and worst_norm <= tol else 1)
PY
}
# weights A B [tol]: every tensor of the exported models within tol (1e-4) relative (max abs diff / max abs)
weights() {
  python3 - "$@" <<'PY'
import json, struct, sys, os, array
def load(path):
    files = [os.path.join(path, f) for f in sorted(os.listdir(path)) if f.endswith(".safetensors")] if os.path.isdir(path) else [path]
    out = {}
    for f in files:
        with open(f, "rb") as h:
            n = struct.unpack("<Q", h.read(8))[0]
            head = json.loads(h.read(n)); data = h.read()
        for k, v in head.items():
            if k == "__metadata__": continue
            assert v["dtype"] == "F32"
            b, e = v["data_offsets"]; out[k] = array.array("f", data[b:e])
    return out
a, b = load(sys.argv[1]), load(sys.argv[2])
assert a.keys() == b.keys(), f"different tensors: {set(a) ^ set(b)}"
worst = 0.0
for k in a:
    scale = max(max(map(abs, a[k])), 1e-12)
    worst = max(worst, max(abs(x - y) for x, y in zip(a[k], b[k])) / scale)
tol = float(sys.argv[3]) if len(sys.argv) > 3 else 1e-4
print(f"{len(a)} tensors, worst relative weight difference {worst:.2e} (at most {tol:g})")
sys.exit(0 if worst <= tol else 1)
PY
}
# parity_run REF NAME ARGS...: trains with ARGS into $work/NAME (log, metrics, exported model), then checks
# its losses, gradient norms and weights against the run saved as $work/REF
parity_run() {
  local ref=$1 name=$2
  shift 2
  "$train" "${small[@]}" "$@" --save "$work/$name" --metrics "$work/$name.jsonl" | tee "$work/$name.log"
  compare "$work/$ref.jsonl" "$work/$name.jsonl"
  weights "$work/$ref/model" "$work/$name/model"
}

# gqa: the tiny config with grouped-query attention, 4 query heads reading 1 key/value head (at --tp 2
# both ranks hold that head: a shared split), written to $work/gqa.json; the flags in array gqa
gqa_config() {
  python3 - "$(dirname "$0")/../configs/tiny.json" "$work/gqa.json" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
c["text"].update(n_heads=4, n_kv_heads=1)
json.dump(c, open(sys.argv[2], "w"))
PY
  gqa=("${small[@]/#tiny/$work/gqa.json}")
}

# reshard "<A flags>" "<B flags>" <optimizer> <tol>: a run of A killed after its step-3 checkpoint, resumed
# as B, repeats the uninterrupted A run's losses from step 3 within tol; $tag: a prefix for its files. A's
# uninterrupted and killed runs are made once per A, optimizer and tag, and serve every B resumed from them.
reshard() {
  local name; name=$(tr -c 'a-z0-9\n' _ <<<"${tag:-}$1-$2-$3" | tr -s _ | sed 's/^_//')
  local from; from=$(tr -c 'a-z0-9\n' _ <<<"${tag:-}$1-$3" | tr -s _ | sed 's/^_//')
  local opts=("${small[@]}" --optimizer "$3" --steps 6 --save-every 3)
  if [ ! -f "$work/$from.full.jsonl" ]; then
    # shellcheck disable=SC2086
    "$train" "${opts[@]}" $1 --metrics "$work/$from.full.jsonl" > /dev/null
    # shellcheck disable=SC2086
    if MPX_FAULT=sigkill:0:3 "$train" "${opts[@]}" $1 --save "$work/$from" > "$work/$from.log" 2>&1; then
      echo "the run ($1) was not killed"; exit 1
    fi
  fi
  # shellcheck disable=SC2086
  "$train" "${opts[@]}" $2 --resume "$work/$from" --metrics "$work/$name.resumed.jsonl" | grep "resumed from"
  echo "$1 -> $2, $3:"
  compare "$work/$from.full.jsonl" "$work/$name.resumed.jsonl" 3 "$4" | tail -n 1
}

# merge_check BASE MERGED ADAPTERS ALPHA: every adapted weight of MERGED is BASE's + ALPHA/r B.A within 1e-6
# (relative to the largest entry), every other tensor BASE's exactly
merge_check() {
  python3 - "$@" <<'PY'
import json, struct, sys, os, array
def load(path):
    out = {}
    for f in sorted(os.listdir(path)):
        if not f.endswith(".safetensors"): continue
        with open(os.path.join(path, f), "rb") as h:
            n = struct.unpack("<Q", h.read(8))[0]; head = json.loads(h.read(n)); data = h.read()
        for k, v in head.items():
            if k == "__metadata__": continue
            b, e = v["data_offsets"]; out[k] = (v["shape"], array.array("f", data[b:e]))
    return out
base, merged, ad, alpha = load(sys.argv[1]), load(sys.argv[2]), load(sys.argv[3]), float(sys.argv[4])
assert ad and all(k.endswith((".lora_a", ".lora_b")) for k in ad), sorted(ad)[:4]
assert base.keys() == merged.keys(), set(base) ^ set(merged)
adapted, worst = set(), 0.0
for k in ad:
    if not k.endswith(".lora_a"): continue
    p = k[:-len("lora_a")]; (r, n_in), A = ad[k]; (n_out, _), B = ad[p + "lora_b"]; _, W = base[p + "weight"]; _, M = merged[p + "weight"]
    scale = max(max(map(abs, W)), 1.0)
    for i in range(n_out):
        for j in range(n_in):
            want = W[i * n_in + j] + alpha / r * sum(B[i * r + q] * A[q * n_in + j] for q in range(r))
            worst = max(worst, abs(M[i * n_in + j] - want) / scale)
    adapted.add(p + "weight")
same = all(base[k][1] == merged[k][1] for k in base if k not in adapted)
print(f"{len(adapted)} adapted weights, worst relative difference from base + alpha/r B.A {worst:.2e}; the {len(base) - len(adapted)} others unchanged: {same}")
sys.exit(0 if worst <= 1e-6 and same and adapted else 1)
PY
}
# tensor_names FILE...: every tensor name in these safetensors files, one per line
tensor_names() {
  python3 - "$@" <<'PY'
import json, struct, sys
for f in sys.argv[1:]:
    with open(f, "rb") as h:
        n = struct.unpack("<Q", h.read(8))[0]
        print("\n".join(k for k in json.loads(h.read(n)) if k != "__metadata__"))
PY
}

case $check in
  parity2|parity4)
    layout=${check#parity}
    "$train" "${small[@]}" --layout 1 --steps 10 --save "$work/single" --metrics "$work/single.jsonl"
    "$train" "${small[@]}" --layout "$layout" --schedule 1f1b --steps 10 --save "$work/pipe" --metrics "$work/pipe.jsonl"
    compare "$work/single.jsonl" "$work/pipe.jsonl"
    weights "$work/single/model" "$work/pipe/model"
    if [ "$layout" = 2 ]; then  # the other schedules walk other tables to the same numbers
      for s in gpipe zbh1; do
        "$train" "${small[@]}" --layout 2 --schedule $s --steps 10 --metrics "$work/$s.jsonl"
        compare "$work/single.jsonl" "$work/$s.jsonl"
      done
    fi
    ;;
  frozen)
    "$train" "${small[@]}" --freeze-vision on --layout 1 --steps 6 --save "$work/single" --metrics "$work/single.jsonl"
    for run in "2 1f1b" "2 zbh1" "4 1f1b"; do
      set -- $run
      parity_run single "p$1$2" --freeze-vision on --layout "$1" --schedule "$2" --steps 6
      grep -q "forward only: stage 0" "$work/p$1$2.log"
      grep -E "^(\[rank 0\] )?rank 0  \|F0\|" "$work/p$1$2.log"                 # the vision rank's timeline ...
      ! grep -E "^(\[rank 0\] )?rank 0  \|.*\|(B|I|W)[0-9]" "$work/p$1$2.log"    # ... has forwards only
    done
    ;;
  balanced)
    "$train" "${small[@]}" --freeze-vision on --plan | tee "$work/plan.log"
    grep -q "^layout 2b: slot 0: vision \[0, 4) + text \[0, " "$work/plan.log"   # tiny: text layers beside the encoder
    "$train" "${small[@]}" --freeze-vision on --layout 1 --steps 6 --save "$work/single" --metrics "$work/single.jsonl"
    for run in "2b 1f1b" "2b gpipe" "4b zbh1"; do
      set -- $run
      parity_run single "p$1$2" --freeze-vision on --layout "$1" --schedule "$2" --steps 6
      grep -q "costs from the config (FLOPs): layout $1: slot 0: vision \[0, 4) + text" "$work/p$1$2.log"
    done
    # a balanced layout's checkpoint resumes in other layouts, balanced or not, and in one process
    "$train" "${small[@]}" --freeze-vision on --layout 4b --steps 6 --save-every 3 --save "$work/b4" > /dev/null
    for layout in 2 1 2b; do
      "$train" "${small[@]}" --freeze-vision on --layout "$layout" --steps 6 --resume "$work/b4/checkpoint/step-00000003" \
        --metrics "$work/resumed$layout.jsonl" > /dev/null
      compare "$work/single.jsonl" "$work/resumed$layout.jsonl" 3
    done
    # heavier encoders (8 blocks, 1.5x and 4x wider; the generated set's 2.9 crops a sample): layout 4b gives
    # the first device encoder blocks only (forward only) and the next the encoder's tail and text layers; or
    # two forward-only devices
    for width in 96 256; do
      python3 - "$(dirname "$0")/../configs/tiny.json" "$work/heavy$width.json" "$width" <<'PY'
import json, sys
c = json.load(open(sys.argv[1]))
w = int(sys.argv[3])
c["vision"].update(enc_dim=w, enc_ff_dim=4 * w, enc_n_layers=8)
json.dump(c, open(sys.argv[2], "w"))
PY
      heavy=(--config "$work/heavy$width.json" --freeze-vision on --steps 6)
      "$train" "${small[@]}" "${heavy[@]}" --layout 1 --save "$work/hsingle$width" --metrics "$work/hsingle$width.jsonl"
      parity_run "hsingle$width" "h4b$width" "${heavy[@]}" --layout 4b
    done
    grep -q "forward only: stage 0 " "$work/h4b96.log"
    grep -q "layout 4b: slot 0: vision \[0, [0-9]) (forward only) [0-9.]* GFLOP | slot 1: vision \[[0-9], 8) + text \[0, " "$work/h4b96.log"
    grep -q "forward only: stages 0-[12]" "$work/h4b256.log"
    # trained encoder, balanced: every stage trains, the encoder at --vision-lr-scale's 0.1 x the rate — on slot 0
    # (encoder blocks only) by the stage's scale, on slot 1 (the last block beside a decoder layer) as a parameter
    # group of its own; layout 1 gives the encoder an optimizer of its own
    "$train" "${small[@]}" --layout 1 --steps 6 --metrics "$work/trained.jsonl"
    "$train" "${small[@]}" --layout 4b --steps 6 --metrics "$work/trained4b.jsonl" > "$work/trained4b.log"
    grep -q "layout 4b: slot 0: vision \[0, 3) [0-9.]* GFLOP | slot 1: vision \[3, 4) + text \[0, 1) " "$work/trained4b.log"
    compare "$work/trained.jsonl" "$work/trained4b.jsonl"
    ;;
  rebalance)
    # devices of different speeds: layout 2b cut for declared speeds (the slower device's slot holds fewer pieces)
    # and for probed ones matches the equal cut's losses (a cut moves work, not arithmetic); a run whose rank 0 is
    # held to 0.3 of a core from its 4th step (scripts/slow_rank.py: SIGSTOP/SIGCONT) names rank 0, saves,
    # every rank exits 75 and the launcher starts them again on a cut for the measured speeds, which resumes by
    # itself and ends with the uninterrupted run's losses within 1e-5
    run=("${small[@]}" --layout 2b --steps 14)
    "$train" "${run[@]}" --metrics "$work/equal.jsonl" > "$work/equal.log"
    cut() { sed -n 's/.*costs from the config (FLOPs): layout 2b: slot 0: \([^|]*\) [0-9.]* GFLOP |.*/\1/p' "$1"; }
    for sp in 1,0.5 0.5,1; do
      "$train" "${run[@]}" --device-speeds $sp --metrics "$work/s$sp.jsonl" > "$work/s$sp.log"
      grep -q "devices' speeds ${sp/,/, }: declared" "$work/s$sp.log" || { cat "$work/s$sp.log"; exit 1; }
      echo "speeds $sp: slot 0 holds $(cut "$work/s$sp.log"); equal speeds: $(cut "$work/equal.log")"
      compare "$work/equal.jsonl" "$work/s$sp.jsonl" | tail -n 1
    done
    python3 - "$(cut "$work/equal.log")" "$(cut "$work/s1,0.5.log")" "$(cut "$work/s0.5,1.log")" <<'PY'
import re, sys
def pieces(s):  # "vision [0, 4) + text [0, 3)" -> 7
    return sum(int(e) - int(b) for b, e in re.findall(r"\[(\d+), (\d+)\)", s))
equal, fast0, slow0 = map(pieces, sys.argv[1:])
print(f"slot 0's pieces: equal speeds {equal}, slot 1 half as fast {fast0}, slot 0 half as fast {slow0}")
sys.exit(0 if slow0 < equal < fast0 else 1)
PY
    "$train" "${run[@]}" --steps 2 --device-speeds probe --metrics "$work/probe.jsonl" > "$work/probe.log"
    grep "devices' speeds .*: probed: rank 0 [0-9.]* GFLOP/s, rank 1 [0-9.]* GFLOP/s" "$work/probe.log"
    # the slow-down mid-run, re-planned
    "$train" "${run[@]}" --rebalance on --save "$work/rb" --max-restarts 1 --metrics "$work/rb.jsonl" > "$work/rb.log" 2>&1 &
    job=$!
    python3 "$(dirname "$0")/../../../scripts/slow_rank.py" $job 0 0.3 --after "$work/rb.jsonl:3" > "$work/slow.log" 2>&1 &
    if ! wait $job; then cat "$work/rb.log" "$work/slow.log"; exit 1; fi
    wait
    cat "$work/slow.log"
    grep "behind the plan\|re-planning\|restart 1 of 1\|devices' speeds\|resumed from" "$work/rb.log" || { cat "$work/rb.log"; exit 1; }
    grep -q "the device of rank 0 (slot 0) is behind the plan: slot 0 computes at 0\.[0-9]*x" "$work/rb.log"
    grep -q "exited with status 75: it saved a checkpoint and asks to start again on a new plan" "$work/rb.log"
    grep -q "devices' speeds 0\.[0-9]*, 1: measured by the run at step" "$work/rb.log"
    compare "$work/equal.jsonl" "$work/rb.jsonl" | tail -n 1
    python3 - "$work/rb.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print("step seconds as recorded (steps 0-2 at full speed, then rank 0 held; the re-planned cut after the restart):",
      " ".join(f"{r['step']}:{r['seconds']:.3f}" for r in rows))
PY
    ;;
  dp)
    "$train" "${small[@]}" --layout 1 --emulate-replicas 2 --steps 6 --metrics "$work/single.jsonl"
    "$train" "${small[@]}" --layout 2x2 --steps 6 --metrics "$work/dp.jsonl" --trace "$work/trace.json" | grep "bubble"
    compare "$work/single.jsonl" "$work/dp.jsonl"
    python3 -c "import json, sys; t = json.load(open(sys.argv[1])); assert len(t['traceEvents']) > 0; print(len(t['traceEvents']), 'trace events')" "$work/trace.json"
    ;;
  lora)
    lo=(--lora 4 --lora-alpha 8)
    # SGD: every weight and adapter too; AdamW (the recipe's kind): losses and gradient norms
    "$train" "${small[@]}" --optimizer sgd --layout 1 "${lo[@]}" --steps 5 --save "$work/single" --metrics "$work/single.jsonl" > /dev/null
    parity_run single tp --optimizer sgd --layout 2 --tp 2 "${lo[@]}" --steps 5 | grep "worst"
    weights "$work/single/model/adapters" "$work/tp/model/adapters" 1e-5
    grep -q "text tensor-parallel over 2 ranks), 3 ranks" "$work/tp.log"
    "$train" "${small[@]}" --layout 1 "${lo[@]}" --steps 5 --metrics "$work/single_adamw.jsonl" > /dev/null
    "$train" "${small[@]}" --layout 2 --tp 2 "${lo[@]}" --steps 5 --metrics "$work/tp_adamw.jsonl" > /dev/null
    compare "$work/single_adamw.jsonl" "$work/tp_adamw.jsonl" | tail -n 1
    "$train" "${small[@]}" --layout 1 --emulate-replicas 2 "${lo[@]}" --steps 5 --metrics "$work/single_dp.jsonl" > /dev/null
    "$train" "${small[@]}" --layout 2x2 "${lo[@]}" --steps 5 --metrics "$work/dp.jsonl" > /dev/null
    compare "$work/single_dp.jsonl" "$work/dp.jsonl" | tail -n 1
    # under NCCL's rules (moondream.train.lora_nccl_rules) the parity above is what the messages change
    if [ "${MPX_NCCL_RULES:-0}" = 1 ]; then exit 0; fi
    "$train" "${small[@]}" --layout 2x2 --shard 3 "${lo[@]}" --steps 5 --metrics "$work/zero3.jsonl" > /dev/null  # the adapters sharded
    compare "$work/single_dp.jsonl" "$work/zero3.jsonl" | tail -n 1
    # with activation checkpointing of every block and bf16 autocast: the same, to bf16's precision
    "$train" "${small[@]}" --layout 1 "${lo[@]}" --steps 5 --checkpoint-blocks --precision bf16 --metrics "$work/single_bf16.jsonl" > /dev/null
    "$train" "${small[@]}" --layout 2 --tp 2 "${lo[@]}" --steps 5 --checkpoint-blocks --precision bf16 --metrics "$work/tp_bf16.jsonl" > /dev/null
    compare "$work/single_bf16.jsonl" "$work/tp_bf16.jsonl" 0 "${LORA_BF16_TOL:-1e-2}" | tail -n 1
    # the merged export against the base (the same initialisation, no step) and the adapters
    "$train" "${small[@]}" --layout 1 "${lo[@]}" --steps 0 --save "$work/base" > /dev/null
    merge_check "$work/base/model" "$work/single/model" "$work/single/model/adapters" 8
    merge_check "$work/base/model" "$work/tp/model" "$work/tp/model/adapters" 8
    # moondream_query: the base plus the adapters answers as the merged model does
    "$query" --weights "$work/single/model" --generated 0 > "$work/merged.txt"
    "$query" --weights "$work/base/model" --adapters "$work/single/model/adapters" --generated 0 > "$work/adapted.txt"
    grep -q "^A:" "$work/merged.txt" && diff "$work/merged.txt" "$work/adapted.txt" && echo "base + adapters answers as the merged model"
    # checkpoints hold the adapters alone (and their optimizer state) ...
    # shellcheck disable=SC2046
    names=$(tensor_names $(ls "$work"/tp/checkpoint/step-00000005/stage*.safetensors | grep -v optimizer))
    if grep -v -E '\.lora_[ab]$' <<<"$names" | grep -q .; then echo "a LoRA checkpoint holds more than the adapters"; exit 1; fi
    grep -q "text.blocks.0.mlp.fc1.lora_a" <<<"$names"
    echo "the checkpoint holds $(grep -c . <<<"$names") tensors, all adapters'"
    # ... and resume: the same layout (identical losses), and one process
    tag=lora_ reshard "--layout 2 --tp 2 ${lo[*]}" "--layout 2 --tp 2 ${lo[*]}" adamw 0
    tag=lora_ reshard "--layout 2 --tp 2 ${lo[*]}" "--layout 1 ${lo[*]}" adamw 1e-5
    # bad input: a pattern that names nothing, a plain linear, a frozen encoder; a checkpoint of the other kind
    expect_error() { local text=$1; shift; if out=$("$@" 2>&1); then echo "did not fail: $*"; exit 1; fi; grep -qF -- "$text" <<<"$out" || { echo "expected '$text' in: $out"; exit 1; }; echo "ok: $text"; }
    expect_error "names no linear of config tiny" "$train" "${small[@]}" --layout 2 --lora 4 --lora-targets 'text\.nothing' --steps 1
    expect_error "vision.patch_emb, a plain linear" "$train" "${small[@]}" --layout 1 --lora 4 --lora-targets 'vision\..*' --steps 1
    expect_error "but the vision encoder is frozen" "$train" "${small[@]}" --layout 1 --lora 4 --lora-targets 'vision\.blocks\.0\.mlp\.fc1' --steps 1
    expect_error "holds only the parameters that trained" "$train" "${small[@]}" --layout 2 --tp 2 --steps 6 --resume "$work/tp"
    expect_error "no adapters (.safetensors) at" "$query" --weights "$work/base/model" --adapters "$work/nothing" --generated 0
    "$train" "${small[@]}" --layout 1 --steps 1 --save "$work/full" > /dev/null
    expect_error "holds every parameter" "$train" "${small[@]}" --layout 1 "${lo[@]}" --steps 2 --resume "$work/full"
    ;;
  quant)
    # QLoRA: rank-4 adapters on an nf4 base (blocks of 64, double quantization), the text stage tensor-parallel
    # over 2 ranks against one process (each rank packs its slice of a row with the whole row's statistics:
    # the same base); the export merges the adapters into the dequantized base
    lo=(--lora 4 --lora-alpha 8 --base-precision nf4)
    "$train" "${small[@]}" --optimizer sgd --layout 1 "${lo[@]}" --steps 4 --save "$work/single" --metrics "$work/single.jsonl" > /dev/null
    parity_run single tp --optimizer sgd --layout 2 --tp 2 "${lo[@]}" --steps 4 | grep "worst"
    "$train" "${small[@]}" --layout 1 "${lo[@]}" --steps 0 --save "$work/base" > /dev/null  # the dequantized base
    merge_check "$work/base/model" "$work/tp/model" "$work/tp/model/adapters" 8
    # quantization-aware training in int4 (groups of 64): the 2-stage pipeline with tensor-parallel text
    # against one process; the quantized export (packed codes and scales) answers in moondream_query, held packed
    qa=(--qat int4 --eval-samples 8)
    "$train" "${small[@]}" --layout 1 "${qa[@]}" --steps 4 --save "$work/qat1" --metrics "$work/qat1.jsonl" > "$work/qat1.log"
    "$train" "${small[@]}" --layout 2 --tp 2 "${qa[@]}" --steps 4 --save "$work/qat2" --metrics "$work/qat2.jsonl" > "$work/qat2.log"
    compare "$work/qat1.jsonl" "$work/qat2.jsonl" | tail -n 1
    # under NCCL's rules (moondream.train.quant_nccl_rules) the parity above is what the messages change
    if [ "${MPX_NCCL_RULES:-0}" = 1 ]; then exit 0; fi
    grep "held-out accuracy after" "$work/qat1.log" "$work/qat2.log"
    names=$(tensor_names "$work"/qat2/model/quantized/stage1.safetensors)
    grep -q "text.blocks.0.mlp.fc1.weight.codes" <<<"$names" && grep -q "text.blocks.0.mlp.fc1.weight.scales" <<<"$names"
    if grep -qx "text.blocks.0.mlp.fc1.weight" <<<"$names"; then echo "the quantized export holds fc1's plain weight"; exit 1; fi
    "$query" --weights "$work/qat2/model/quantized" --generated 0 2> "$work/qat_query.err" | grep "^A:" | head -n 2
    grep -q "linears in int4" "$work/qat_query.err"
    # bad input
    expect_error() { local text=$1; shift; if out=$("$@" 2>&1); then echo "did not fail: $*"; exit 1; fi; grep -qF -- "$text" <<<"$out" || { echo "expected '$text' in: $out"; exit 1; }; echo "ok: $text"; }
    expect_error "add --lora RANK" "$train" "${small[@]}" --layout 1 --base-precision nf4 --steps 1
    expect_error "unknown format 'int3'" "$train" "${small[@]}" --layout 1 --lora 4 --base-precision int3 --steps 1
    expect_error "takes int4" "$train" "${small[@]}" --layout 1 --qat nf4 --steps 1
    expect_error "use --base-precision" "$train" "${small[@]}" --layout 1 --qat int4 --lora 4 --steps 1
    expect_error "do not fit config tiny-reference" "$query" --config tiny-reference --weights "$work/qat2/model/quantized" --generated 0
    ;;
  shard)
    # ZeRO over 2 replicas x 2 stages (each replica steps half of every trained stage's parameters and keeps
    # half of their optimizer state; level 2 half of their gradients too, level 3 half of their weights too):
    # levels 2 and 3 match one process computing the same global batch (losses, gradient norms, every
    # weight; level 1 trains from a checkpoint below, and mpx.runtime's ZeRO-1 cases); level 3 over the tensor-parallel text stage too (its gradients go as level 2's); the 8-bit
    # recipe against unsharded 2x2 within its quantisation (the blocks start at the shards' cuts: 1e-3); checkpoints hold the whole state by name, so a sharded run resumes unsharded, in one
    # process and the other way round
    "$train" "${small[@]}" --layout 1 --emulate-replicas 2 --steps 6 --save "$work/single" --metrics "$work/single.jsonl" > /dev/null
    parity_run single zero2 --layout 2x2 --shard 2 --steps 6 | grep "worst"
    parity_run single zero3 --layout 2x2 --shard 3 --steps 6 | grep "worst"
    "$train" "${small[@]}" --layout 2x2 --tp 2 --shard 3 --steps 6 --metrics "$work/zero3tp.jsonl" > /dev/null
    compare "$work/single.jsonl" "$work/zero3tp.jsonl" | tail -n 1
    "$train" "${small[@]}" --optimizer adamw8bit --layout 2x2 --steps 6 --metrics "$work/dp8.jsonl" > /dev/null
    "$train" "${small[@]}" --optimizer adamw8bit --layout 2x2 --shard 2 --steps 6 --metrics "$work/zero2_8.jsonl" > /dev/null
    compare "$work/dp8.jsonl" "$work/zero2_8.jsonl" 0 1e-3 | tail -n 1
    reshard "--layout 2x2 --shard 2" "--layout 1 --emulate-replicas 2" adamw 1e-5
    reshard "--layout 2x2 --shard 3" "--layout 2x2" adamw 1e-5  # ZeRO-3 -> unsharded
    reshard "--layout 1 --emulate-replicas 2" "--layout 2x2 --shard 1" adamw 1e-5  # one process -> ZeRO-1 at DP 2
    # another replica count (another global batch): the level-2 checkpoint resumed by one replica of 2 stages
    # and by one process (the same samples) gives the same losses
    z=$work/layout_2x2_shard_2_adamw
    "$train" "${small[@]}" --optimizer adamw --steps 6 --layout 2 --resume "$z" --metrics "$work/z_to1x2.jsonl" | grep "resumed from"
    "$train" "${small[@]}" --optimizer adamw --steps 6 --layout 1 --resume "$z" --metrics "$work/z_to1.jsonl" > /dev/null
    echo "2x2 at level 2 -> 1x2 against -> one process:"
    compare "$work/z_to1.jsonl" "$work/z_to1x2.jsonl" 3 | tail -n 1
    # --memory-report (malloc's statistics): at level 3 the text rank keeps half its weights between steps and
    # its AdamW state is its half's 8 bytes per parameter, each within 1% (the tiny vision stage's 1 MiB is
    # within its fixed allocations' reach: not checked)
    MPX_KEEP_HOST_MEMORY=0 "$train" "${small[@]}" --layout 2x2 --shard 3 --steps 3 --memory-report > "$work/memory.log"
    line=$(grep -o "memory rank 1: .*" "$work/memory.log") && echo "$line"
    for what in weights "optimizer state"; do
      pct=$(sed -E "s/.*$what [0-9.]+ MiB \(formula [0-9.]+, ([-+0-9.]+)%\).*/\1/" <<<"$line")
      awk -v p="$pct" 'BEGIN { exit !(p < 1 && p > -1) }' || { echo "rank 1's $what is $pct% from the formula"; exit 1; }
    done
    ;;
  tp)
    # the recipe's AdamW: losses and gradient norms; SGD with momentum: also every weight (AdamW turns a
    # rounding difference in a gradient that is ~0 into a full-size step: 2e-4 measured, in a bias)
    "$train" "${small[@]}" --layout 1 --steps 10 --metrics "$work/single.jsonl"
    "$train" "${small[@]}" --layout 2 --tp 2 --steps 10 --metrics "$work/tp.jsonl" | tee "$work/tp.log"
    grep -q "text tensor-parallel over 2 ranks), 3 ranks" "$work/tp.log"
    compare "$work/single.jsonl" "$work/tp.jsonl"
    "$train" "${small[@]}" --optimizer sgd --layout 1 --steps 10 --save "$work/single" --metrics "$work/single_sgd.jsonl"
    "$train" "${small[@]}" --optimizer sgd --layout 2 --tp 2 --steps 10 --save "$work/tp" --metrics "$work/tp_sgd.jsonl"
    compare "$work/single_sgd.jsonl" "$work/tp_sgd.jsonl"
    weights "$work/single/model" "$work/tp/model" 1e-5
    # the vision encoder split too (heads, MLP columns, projection): 4 ranks
    "$train" "${small[@]}" --optimizer sgd --layout 2 --tp 2 --vision-tp 2 --steps 10 --save "$work/vtp" --metrics "$work/vtp_sgd.jsonl" | tee "$work/vtp.log"
    grep -q "vision and text tensor-parallel over 2 ranks each), 4 ranks" "$work/vtp.log"
    compare "$work/single_sgd.jsonl" "$work/vtp_sgd.jsonl"
    weights "$work/single/model" "$work/vtp/model" 1e-5
    "$train" "${small[@]}" --layout 2 --tp 2 --vision-tp 2 --steps 10 --metrics "$work/vtp.jsonl" > /dev/null
    compare "$work/single.jsonl" "$work/vtp.jsonl"
    "$train" "${small[@]}" --layout 1 --emulate-replicas 2 --steps 6 --metrics "$work/single_dp.jsonl"
    "$train" "${small[@]}" --layout 2x2 --tp 2 --steps 6 --metrics "$work/dp_tp.jsonl"
    compare "$work/single_dp.jsonl" "$work/dp_tp.jsonl"
    # the exported model is whole: moondream_query (one process) reads it
    "$query" --weights "$work/tp/model" --generated 0 -q "What color is the shape?" | tee "$work/query"
    grep -q "^A:" "$work/query"
    # grouped-query attention with fewer key/value heads than ranks: the one head shared by both ranks
    gqa_config
    "$train" "${gqa[@]}" --optimizer sgd --layout 1 --steps 6 --save "$work/gqa1" --metrics "$work/gqa1_sgd.jsonl"
    "$train" "${gqa[@]}" --optimizer sgd --layout 2 --tp 2 --steps 6 --save "$work/gqa2" --metrics "$work/gqa2_sgd.jsonl"
    compare "$work/gqa1_sgd.jsonl" "$work/gqa2_sgd.jsonl"
    weights "$work/gqa1/model" "$work/gqa2/model" 1e-5
    "$train" "${gqa[@]}" --layout 1 --steps 6 --metrics "$work/gqa1.jsonl" > /dev/null
    "$train" "${gqa[@]}" --layout 2 --tp 2 --steps 6 --metrics "$work/gqa2.jsonl" > /dev/null
    compare "$work/gqa1.jsonl" "$work/gqa2.jsonl"
    ;;
  resume|resumetp)
    small+=(--optimizer adamw8bit)
    [ "$check" = resumetp ] && small+=(--tp 2)
    "$train" "${small[@]}" --layout 2 --steps 6 --save "$work/full" --metrics "$work/full.jsonl"
    "$train" "${small[@]}" --layout 2 --steps 6 --save "$work/part" --save-every 3 --metrics "$work/part.jsonl" &
    pid=$!
    # stop the run once its step-3 checkpoint exists, as a crash would (the launcher ends every rank)
    for _ in $(seq 600); do [ -f "$work/part/checkpoint/latest" ] && break; sleep 0.1; done
    kill -TERM $pid 2>/dev/null || true
    wait $pid 2>/dev/null || true
    step=$(sed 's/^step-0*//' "$work/part/checkpoint/latest")
    echo "checkpoint at step $step"
    "$train" "${small[@]}" --layout 2 --steps 6 --save "$work/part" --resume "$work/part" --metrics "$work/resumed.jsonl"
    compare "$work/full.jsonl" "$work/resumed.jsonl" "$step"
    weights "$work/full/model" "$work/part/model"
    ;;
  restart)
    # 7 seeded faults (a signal, an exception in a forward, a crash inside a save; a seeded rank and step; a
    # crash after each phase of a save is crashsave's)
    # in 2- and 4-stage runs under --max-restarts: each run finishes by itself, resumed from its latest
    # checkpoint, with the uninterrupted run's losses and its weights bit for bit
    ulimit -c 0
    small+=(--optimizer adamw8bit --steps 6 --save-every 2 --timeout 10)
    for layout in 2 4; do "$train" "${small[@]}" --layout $layout --save "$work/full$layout" --metrics "$work/full$layout.jsonl"; done
    for seed in $(seq 1 7); do
      read -r layout fault <<<"$(python3 - "$seed" <<'PY'
import random, sys
seed = int(sys.argv[1]); r = random.Random(seed)
layout = (2, 4)[seed % 2]
kind = ["sigkill", "sigsegv", "abort", "exception", "sigstop", "save1", "save4"][seed - 1]
if kind.startswith("save"):  # phases after 1 are rank 0's; saves come after steps 2 and 4
    print(layout, f"{kind}:{r.randrange(layout) if kind == 'save1' else 0}:{r.choice([2, 4])}")
else:
    print(layout, f"{kind}:{r.randrange(layout)}:{r.randrange(6)}")
PY
)"
      echo "seed $seed: layout $layout, MPX_FAULT=$fault"
      if ! MPX_FAULT=$fault "$train" "${small[@]}" --layout "$layout" --max-restarts 2 --save "$work/run$seed" --metrics "$work/run$seed.jsonl" \
           > "$work/run$seed.log" 2>&1; then cat "$work/run$seed.log"; exit 1; fi
      grep -q "injecting fault ${fault%%:*}" "$work/run$seed.log" && grep "mpx::launch: restart 1 of 2" "$work/run$seed.log" \
        || { cat "$work/run$seed.log"; exit 1; }
      grep "resumed from\|moondream_train: config" "$work/run$seed.log" | tail -n 1
      compare "$work/full$layout.jsonl" "$work/run$seed.jsonl" > /dev/null
      weights "$work/full$layout/model" "$work/run$seed/model" 0
    done
    ;;
  reshard|reshardtp)
    # a checkpoint saved in one layout resumes in another (tensors and optimizer state found by global
    # parameter name; at another tensor-parallel degree the shards joined and re-cut): killed after its
    # step-3 checkpoint, resumed in layout B, the run repeats the uninterrupted layout-A run's losses (fp32
    # AdamW: 1e-5; 8-bit AdamW: its state moves exactly between splits, the layouts' last-bit differences
    # grow through the quantised moments, shown against 1e-3; between degrees the moments are re-quantized)
    if [ "$check" = reshard ]; then
      reshard "--layout 2" "--layout 4" adamw 1e-5
      reshard "--layout 2" "--layout 2 --schedule zbh1" adamw 1e-5
      reshard "--layout 2x2" "--layout 2x2 --schedule gpipe" adamw 1e-5
      reshard "--layout 2" "--layout 4 --schedule zbh1" adamw8bit 1e-3
      # pipeline <-> one process (layout 1 writes the same format: its vision and text as stages 0 and 1)
      reshard "--layout 2" "--layout 1" adamw 1e-5
      reshard "--layout 1" "--layout 4" adamw 1e-5
      reshard "--layout 2x2" "--layout 1 --emulate-replicas 2" adamw 1e-5
      # another replica count changes the global batch: 2x2's checkpoint resumed by 1x2 and by one process
      # (the same samples) give the same losses
      "$train" "${small[@]}" --optimizer adamw --steps 6 --layout 2 --resume "$work/layout_2x2_adamw" \
        --metrics "$work/to1x2.jsonl" | grep "resumed from"
      "$train" "${small[@]}" --optimizer adamw --steps 6 --layout 1 --resume "$work/layout_2x2_adamw" \
        --metrics "$work/to1.jsonl" > /dev/null
      echo "2x2 -> 1x2 against 2x2 -> one process:"
      compare "$work/to1.jsonl" "$work/to1x2.jsonl" 3 | tail -n 1
    else
      reshard "--layout 2" "--layout 2 --tp 2" adamw 1e-5
      reshard "--layout 2 --tp 2" "--layout 1" adamw 1e-5
      reshard "--layout 2 --tp 2" "--layout 2" adamw8bit 1e-3
      reshard "--layout 2 --tp 2 --vision-tp 2" "--layout 2 --vision-tp 2" adamw 1e-5
      # a key/value head shared by the ranks (grouped-query attention): saved once per rank, joined once
      gqa_config
      plain=("${small[@]}")
      small=("${gqa[@]}")
      tag=gqa reshard "--layout 2 --tp 2" "--layout 1" adamw 1e-5
      small=("${plain[@]}")
      # the consolidated export of a tensor-parallel checkpoint is the whole model, bit for bit
      "$train" "${small[@]}" --layout 2 --tp 2 --steps 2 --save "$work/export" > /dev/null
      "${MPX_CHECKPOINT_EXE:?set by CTest: the mpx_checkpoint tool}" info "$work/export/checkpoint" | tail -n 1
      "$MPX_CHECKPOINT_EXE" export "$work/export/checkpoint" "$work/export/whole.safetensors"
      weights "$work/export/model" "$work/export/whole.safetensors" 0
    fi
    ;;
  crashsave)
    # a crash after each phase of a save (runtime/checkpoint/phases.hpp) leaves a checkpoint that --resume finds and uses
    ulimit -c 0
    small+=(--optimizer adamw8bit --steps 4 --save-every 2)
    "$train" "${small[@]}" --layout 2 --save "$work/full"
    for phase in 0 1 2 3 4 5; do
      rank=0; [ $phase = 1 ] && rank=1
      if MPX_FAULT=save$phase:$rank:4 "$train" "${small[@]}" --layout 2 --save "$work/crash$phase" > "$work/crash$phase.log" 2>&1; then
        echo "phase $phase: the run did not crash"; exit 1
      fi
      grep -q "injecting fault save$phase at rank $rank, step 4" "$work/crash$phase.log" || { cat "$work/crash$phase.log"; exit 1; }
      echo "crash after phase $phase of the step-4 save: latest is $(cat "$work/crash$phase/checkpoint/latest")"
      "$train" "${small[@]}" --layout 2 --save "$work/crash$phase" --resume "$work/crash$phase" | grep "resumed from"
      weights "$work/full/model" "$work/crash$phase/model" 0
    done
    ;;
  errors)
    expect() {  # expect TEXT command...: fails, and says TEXT
      local text=$1; shift
      if out=$("$@" 2>&1); then echo "did not fail: $*"; exit 1; fi
      grep -qF -- "$text" <<<"$out" || { echo "expected '$text' in:"; echo "$out"; exit 1; }
      echo "ok: $text"
    }
    printf '{"image": "nope.png", "question": "q", "answer": "a"}\n' > "$work/bad.jsonl"
    expect "bad.jsonl:1: image" "$train" "${small[@]}" --layout 1 --steps 1 --data "$work/bad.jsonl"
    printf 'not json\n' > "$work/bad2.jsonl"
    expect "bad2.jsonl:1: not a JSON object" "$train" "${small[@]}" --layout 2 --steps 1 --data "$work/bad2.jsonl"
    expect "no tokenizer at" "$train" "${small[@]}" --layout 1 --steps 1 --tokenizer /nonexistent
    expect "shipped names" "$train" "${small[@]}" --layout 1 --steps 1 --config nope
    "$train" "${small[@]}" --layout 2 --steps 1 --save "$work/ok"
    expect "mis-shaped" "$train" "${small[@]}" --layout 1 --steps 1 --config tiny-reference --weights "$work/ok/model"
    cp -r "$work/ok" "$work/noshard" && rm "$work/noshard/checkpoint/step-00000001/stage1.optimizer.safetensors"
    expect "stage1.optimizer.safetensors is missing" "$train" "${small[@]}" --layout 2 --tp 2 --steps 2 --resume "$work/noshard"
    expect "does not match this model" "$train" "${small[@]}" --layout 2 --steps 2 --config tiny-reference --resume "$work/ok"
    cp -r "$work/ok" "$work/corrupt" && head -c 100 "$work/ok/checkpoint/step-00000001/stage1.safetensors" > "$work/corrupt/checkpoint/step-00000001/stage1.safetensors"
    expect "stage1.safetensors has 100 bytes" "$train" "${small[@]}" --layout 2 --steps 2 --resume "$work/corrupt"
    cmp "$work/ok/checkpoint/step-00000001/manifest.json" "$work/corrupt/checkpoint/step-00000001/manifest.json"  # a failed resume writes nothing
    expect "use --layout 2, 4 or 2x2" "$train" "${small[@]}" --layout 1 --steps 1 --max-restarts 1
    expect "cuts the vision stage of layout 2 or 2x2" "$train" "${small[@]}" --layout 4 --vision-tp 2 --steps 1
    expect "layout 2b has 2 devices (pipeline slots): give 2" "$train" "${small[@]}" --layout 2b --device-speeds 1,1,1 --steps 1
    expect "'x' is not a positive number" "$train" "${small[@]}" --layout 2b --device-speeds 1,x --steps 1
    expect "use --layout 2b or 4b, or --rebalance report" "$train" "${small[@]}" --layout 2 --rebalance on --steps 1
    expect "give --max-restarts 1 or more" "$train" "${small[@]}" --layout 2b --rebalance on --save "$work/rb" --steps 1
    # two ranks started with a different setting (seed, micro-batch size, config): both stop before step 1,
    # naming the setting and both values
    mismatch() {  # <setting> <rank 0's value> <rank 1's value> <the values as the message shows them, rank 0 then 1>
      local port=$((20000 + RANDOM % 20000))
      local ranks=(WORLD_SIZE=2 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port)
      env RANK=1 LOCAL_RANK=1 "${ranks[@]}" "$train" "${small[@]}" --layout 2 --steps 1 "--$1" "$3" > "$work/rank1.log" 2>&1 &
      expect "run setting '$1' is '$4' on rank 0 but '$5' on rank 1" env RANK=0 LOCAL_RANK=0 "${ranks[@]}" "$train" "${small[@]}" --layout 2 --steps 1 "--$1" "$2"
      if wait $!; then echo "rank 1 did not fail"; exit 1; fi
      grep -qF "run setting '$1' is '$5' on rank 1 but '$4' on rank 0" "$work/rank1.log" || { cat "$work/rank1.log"; exit 1; }
      if grep -q "loss " "$work/rank1.log"; then echo "a step ran"; exit 1; fi
      echo "ok: a different --$1 stops both ranks"
    }
    expect "use --layout 2 or 2x2, or --tp 1" "$train" "${small[@]}" --layout 4 --tp 2 --steps 1
    python3 -c "import json; c = json.load(open('$(dirname "$0")/../configs/tiny.json')); c['text']['vocab_size'] = 51201; json.dump(c, open('$work/odd_vocab.json', 'w'))"
    expect "pad vocab_size to a multiple of --tp" "$train" "${small[@]}" --layout 2 --tp 2 --steps 1 --config "$work/odd_vocab.json"
    mismatch seed 1 2 1 2
    mismatch microbatch-size 2 4 2 4
    mismatch config tiny tiny-reference tiny tiny-reference
    ;;
  torchrun)
    # Debian's torchrun 1.13 on Python 3.11 needs -r 1 -t 1 (it fails parsing them otherwise); 2.x accepts them
    "$train" "${small[@]}" --layout 2 --steps 6 --save "$work/self" --metrics "$work/self.jsonl" > /dev/null
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    ${TORCHRUN:-torchrun} --nproc_per_node 2 --master_port "$port" -r 1 -t 1 --no_python \
      "$train" "${small[@]}" --layout 2 --steps 6 --save "$work/torchrun" --metrics "$work/torchrun.jsonl" > "$work/torchrun.log" 2>&1 \
      || { tail -n 30 "$work/torchrun.log"; exit 1; }
    compare "$work/self.jsonl" "$work/torchrun.jsonl" | tail -n 1
    weights "$work/self/model" "$work/torchrun/model"
    ;;
  demo)
    # a reduced run (120 of the main job's 450 steps): the floor it must clear, which the full run exceeds
    # (benchmarks/results/moondream_demo_*.md): colour answered right on at least 8 in 10 held-out questions
    "$train" --steps 120 --eval-samples 40 --save "$work/run" --log-every 20 | tee "$work/log"
    grep -q "held-out accuracy after training" "$work/log"
    grep "held-out accuracy after training" "$work/log" | grep -oE "; color [0-9]+/[0-9]+" | awk -F'[ /]' '{ if ($3 * 10 < $4 * 8) { print "colour floor missed: " $3 "/" $4; exit 1 } }'
    grep "held-out accuracy after training" "$work/log" | grep -Eq "; consistency [0-9]+/[0-9]+ "  # the answers about one picture agree
    test -s "$work/run/metrics.jsonl" && test -s "$work/run/loss.svg" && test -f "$work/run/checkpoint/latest"
    # the plot: labelled axes and the held-out accuracy under it
    grep -q ">optimizer step<" "$work/run/loss.svg" && grep -q ">training loss (answer tokens, cross-entropy)<" "$work/run/loss.svg"
    grep -q ">held-out accuracy before training: " "$work/run/loss.svg" && grep -q ">held-out accuracy after training: " "$work/run/loss.svg"
    "$query" --weights "$work/run/model" --generated 0 -q "What color is the shape?" -q "How many shapes are there?" | tee "$work/query"
    grep -q "^A:" "$work/query"
    "$query" --weights "$work/run/model" --generated 1 | tee "$work/query_fit"  # a counting picture: only how many
    [ "$(grep -c "^Q:" "$work/query_fit")" = 1 ] && grep -q "^Q: How many shapes are there?" "$work/query_fit"
    # a picture a person supplies, drawn with another library (PIL), as PNG and JPEG; a truncated JPEG is an error saying so
    /usr/bin/python3 - "$work" <<'PY'
import sys
from PIL import Image, ImageDraw
im = Image.new("RGB", (240, 180), "white")
ImageDraw.Draw(im).ellipse((20, 60, 80, 120), fill=(220, 30, 30))
im.save(sys.argv[1] + "/mine.png")
im.save(sys.argv[1] + "/mine.jpg", quality=90)
data = open(sys.argv[1] + "/mine.jpg", "rb").read()
open(sys.argv[1] + "/cut.jpg", "wb").write(data[: len(data) // 2])
PY
    for f in mine.png mine.jpg; do
      "$query" --weights "$work/run/model" --image "$work/$f" -q "What color is the shape?" | tee "$work/query_$f"
      grep -qx "A: red" "$work/query_$f"  # a red circle drawn by PIL on white
    done
    if "$query" --weights "$work/run/model" --image "$work/cut.jpg" -q "What color is the shape?" > "$work/query_cut" 2>&1; then
      echo "a truncated JPEG was answered, not refused"; exit 1
    fi
    grep "cannot decode image" "$work/query_cut" && grep -q "truncated" "$work/query_cut"
    echo "moondream demo: ok"
    ;;
  *) echo "unknown check $check"; exit 2 ;;
esac
