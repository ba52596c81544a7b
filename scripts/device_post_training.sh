#!/usr/bin/env bash
# Issue 24's GPU rows, one device call (random models made on the device by
# scripts/post_training_peer.py; no download):
#   lora8b: LoRA SFT (r 16 on every linear layer, bf16, padded batches) of a
#     LLaMA-3-8B-shaped model: `colossus train` against HF transformers + PEFT
#     on the same model, records and batch; tokens/s and peak GPU memory
#     (nvidia-smi, sampled, for both processes).
#   sft1b: full SFT of a llama-1b-shaped model, packed against padded rows
#     (tokens/s) and the share of padding packing removes.
#   qlora1b: QLoRA (NF4 base through the CUDA dequantisation kernels) against
#     LoRA over the bf16 base of the llama-1b-shaped model: tokens/s, memory.
# A Markdown table goes to stdout and $OUT/post_training.md, one JSON object a
# row to $OUT/post_training.jsonl (bench/results.jsonl's fields; add them there).
# Usage (device): bash scripts/device_post_training.sh [lora8b|qlora1b|sft1b|all]
#        (CPU dry run with tiny shapes: --cpu)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stage=${1:-all}
device=cuda; python=python3; bin=build-gpu/bin/colossus; work=${POST_TRAINING_WORK:-$PWD/build-gpu/post_training}
big=llama3-8b; small=llama-1b; steps=20; seq=2048; batch=4; precision=bf16
if [[ "$stage" == "--cpu" ]]; then
  stage=all; device=cpu; python=.venv/bin/python; bin=${COLOSSUS_BIN:-build/bin/colossus}; work=/tmp/colossus_post_training
  big=tiny; small=tiny; steps=6; seq=256; batch=2; precision=fp32
fi
mkdir -p "$work"
commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)
machine=$([[ $device == cuda ]] && nvidia-smi --query-gpu=name --format=csv,noheader | head -1 || echo "cpu $(nproc) cores")
table="$out/post_training.md"; rows="$out/post_training.jsonl"; : > "$rows"
echo "| bench | config | colossus | peer | ratio |" > "$table"
echo "|---|---|---|---|---|" >> "$table"

if [[ $device == cuda && ! -x "$bin" ]]; then
  stamp "build"
  OUT="$out" COLOSSUS_TESTS=OFF bash scripts/device_build.sh > "$out/device_build.log" 2>&1 \
    || { tail -60 "$out/device_build.log"; exit 1; }
fi

# Peak GPU memory of whatever runs while $1 (a command line) runs: sampled nvidia-smi, MiB.
peak_file="$work/gpu_peak"
run_sampled() {
  echo 0 > "$peak_file"
  local sampler=""
  if [[ $device == cuda ]]; then
    ( while sleep 0.5; do m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        [[ $m -gt $(cat "$peak_file") ]] && echo "$m" > "$peak_file"; done ) & sampler=$!
  fi
  "$@"; local rc=$?
  [[ -n $sampler ]] && kill $sampler 2>/dev/null
  return $rc
}
# tokens/s of a colossus run: the mean of metrics.jsonl's tokens_per_s past the first two steps.
ours_tokens_per_s() {
  $python - "$1" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"tokens_per_s"' in l]
rates = [r["tokens_per_s"] for r in rows[2:]] or [r["tokens_per_s"] for r in rows]
print(sum(rates) / len(rates))
PY
}
row() {  # bench config metric value peer peer_value
  local ratio; ratio=$($python -c "a,b=float('$4'),float('$6'); print(f'{a/b:.3f}' if b else 'nan')")
  echo "| $1 | $2, $3 | $4 | $5 $6 | $ratio |" >> "$table"
  $python -c "import json,sys; print(json.dumps(dict(date='$(date -u +%F)', commit='$commit', machine='$machine', bench='$1', config='$2', metric='$3', value=float('$4'), peer='$5', peer_value=float('$6'), ratio=float('$ratio'))))" >> "$rows"
}
train_config() {  # dir out_dir packing lora
  local lora_section=""
  [[ $4 == lora || $4 == qlora ]] && lora_section=$'[lora]\nr = 16\nlora_alpha = 32\ntarget_modules = "all-linear"'
  [[ $4 == qlora ]] && lora_section+=$'\nquantize = "nf4"'
  cat <<TOML
[model]
pretrained = "$1/model"
[data]
source = "$1/data.jsonl"
seq_len = $seq
max_length = $seq
batch_size = $batch
packing = $3
shuffle = false
tokenize_threads = 4
[optimizer]
name = "adamw"
lr = 1e-4
weight_decay = 0.0
[lr_scheduler]
name = "constant"
[booster]
mixed_precision = "$precision"
[train]
task = "sft"
steps = $steps
log_every = 1
save_every = 0
keep_last = 1
tensorboard = false
sample_tokens = 0
output_dir = "$2"
$lora_section
TOML
}

if [[ $stage == lora8b || $stage == all ]]; then
  dir="$work/$big"
  stamp "make the $big-shaped model"
  [[ -f "$dir/model/config.json" ]] || $python scripts/post_training_peer.py make "$dir" --shape "$big" --device "$device" \
    > "$work/make_big.log" 2>&1 || { tail -5 "$work/make_big.log"; exit 1; }
  stamp "colossus train, LoRA r 16"
  rm -rf "$work/run_lora"
  train_config "$dir" "$work/run_lora" false lora > "$work/lora.toml"
  run_sampled "$bin" train "$work/lora.toml" > "$work/lora.log" 2>&1 || { tail -20 "$work/lora.log"; exit 1; }
  ours_peak=$(cat "$peak_file"); ours_rate=$(ours_tokens_per_s "$work/run_lora/metrics.jsonl")
  rm -rf "$work/run_lora/checkpoints"  # the base in each checkpoint: 16 GB of a 64 GB disk
  stamp "transformers + PEFT, LoRA r 16"
  run_sampled $python scripts/post_training_peer.py peft "$dir" --device "$device" --steps "$steps" --batch "$batch" \
    --seq "$seq" --r 16 > "$work/peft.json" 2> "$work/peft.err" || { tail -20 "$work/peft.err"; exit 1; }
  peer_peak=$(cat "$peak_file"); peer_rate=$($python -c "import json; print(json.load(open('$work/peft.json'))['tokens_per_s'])")
  config="$big shape, LoRA r 16 all-linear, $precision, batch $batch x <= $seq tokens padded, $steps steps"
  row lora_sft "$config" tokens_per_s "$ours_rate" transformers+peft "$peer_rate"
  [[ $device == cuda ]] && row lora_sft "$config" peak_gpu_mib "$ours_peak" transformers+peft "$peer_peak"
fi

if [[ $stage == qlora1b || $stage == all ]]; then
  # QLoRA against LoRA on the same model, data and batch: the NF4 base (its
  # CUDA dequantisation kernels) against the bf16 base, tokens/s and memory.
  dir="$work/$small"
  stamp "make the $small-shaped model"
  [[ -f "$dir/model/config.json" ]] || $python scripts/post_training_peer.py make "$dir" --shape "$small" --device "$device" \
    > "$work/make_small.log" 2>&1 || { tail -5 "$work/make_small.log"; exit 1; }
  declare -A qrate qpeak
  for kind in lora qlora; do
    stamp "colossus train, $kind r 16"
    rm -rf "$work/run_$kind"
    train_config "$dir" "$work/run_$kind" false "$kind" > "$work/$kind.toml"
    run_sampled "$bin" train "$work/$kind.toml" > "$work/$kind.log" 2>&1 || { tail -20 "$work/$kind.log"; exit 1; }
    qrate[$kind]=$(ours_tokens_per_s "$work/run_$kind/metrics.jsonl"); qpeak[$kind]=$(cat "$peak_file")
    rm -rf "$work/run_$kind/checkpoints"
  done
  config="$small shape, r 16 all-linear, $precision, batch $batch x <= $seq tokens padded, $steps steps"
  row qlora_sft "$config" tokens_per_s "${qrate[qlora]}" "colossus LoRA, $precision base" "${qrate[lora]}"
  [[ $device == cuda ]] && row qlora_sft "$config" peak_gpu_mib "${qpeak[qlora]}" "colossus LoRA, $precision base" "${qpeak[lora]}"
fi

if [[ $stage == sft1b || $stage == all ]]; then
  dir="$work/$small"
  stamp "make the $small-shaped model"
  [[ -f "$dir/model/config.json" ]] || $python scripts/post_training_peer.py make "$dir" --shape "$small" --device "$device" \
    > "$work/make_small.log" 2>&1 || { tail -5 "$work/make_small.log"; exit 1; }
  declare -A rate
  for packing in false true; do
    stamp "colossus train, full SFT, packing $packing"
    rm -rf "$work/run_sft_$packing"
    train_config "$dir" "$work/run_sft_$packing" "$packing" full > "$work/sft_$packing.toml"
    "$bin" train "$work/sft_$packing.toml" > "$work/sft_$packing.log" 2>&1 || { tail -20 "$work/sft_$packing.log"; exit 1; }
    rate[$packing]=$(ours_tokens_per_s "$work/run_sft_$packing/metrics.jsonl")
    rm -rf "$work/run_sft_$packing/checkpoints"
  done
  share=$($python scripts/post_training_peer.py padding "$dir" --batch "$batch" --seq "$seq" | $python -c "import json,sys; print(json.load(sys.stdin)['padding_share'])")
  config="$small shape, full SFT, $precision, batch $batch, seq $seq, $steps steps"
  row sft_packing "$config" tokens_per_s "${rate[true]}" "colossus padded" "${rate[false]}"
  echo "| sft_packing | padding share of the padded batches (what packing removes) | $share | | |" >> "$table"
fi
stamp "done"
cat "$table"
