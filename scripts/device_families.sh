#!/usr/bin/env bash
# Issue 23's GPU rows, one device call per stage (no download: transformers
# makes random models on the device, scripts/family_oracle.py).
#   families (default): builds the CLI (scripts/device_build.sh, which also runs
#     `colossus check`: the paged kernels' sliding-window cases among them), then
#     for qwen2, mistral, gemma2 and gemma3 (tiny shapes, head_dim 64, windows of
#     48 under a 110-token prompt + 40 new tokens): `colossus generate --device
#     cuda --greedy --ids_out` against transformers' greedy generate, fp32 (must
#     be equal) and bf16 (equal, or the first difference at a near-tie, shown
#     with HF's margin there), and bf16 again on the best-conditioned of 8
#     prompts (the largest smallest top-2 margin in transformers' run), where
#     rounding cannot flip a step.
#   qwen7b: a Qwen2.5-7B-shaped model (bf16, made on the GPU): greedy for 32
#     tokens against transformers, then `colossus train` 20 steps with
#     low_level_zero stage 2 + cpu_offload and with gemini; loss finite, peak
#     device memory (nvidia-smi, sampled) and host RSS (/usr/bin/time) reported.
#     Run it on a warm machine right after `families` (build-gpu is reused).
#     Parts can run in separate calls: `qwen7b greedy`, `qwen7b zero2_offload`,
#     `qwen7b gemini` (the table in $OUT grows; the model is made once).
# A Markdown table goes to stdout and $OUT/families.md. `--cpu` runs the
# families stage on this machine's CPU build (a dry run of the script).
# Usage (device): bash scripts/device_families.sh [families|qwen7b [make|greedy|agreement|zero2_offload|gemini]...]   (CPU: --cpu)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
work=${FAMILIES_WORK:-$PWD/build-gpu/families}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
stage=${1:-families}
device=cuda; python=python3; bin=build-gpu/bin/colossus
if [[ "$stage" == "--cpu" ]]; then
  stage=families; device=cpu; python=.venv/bin/python; bin=build/bin/colossus; work=/tmp/colossus_families
fi
mkdir -p "$work"
table="$out/families.md"
prompt="The quick brown fox jumps over the lazy dog, and then it runs far away into the forest where nobody can see it."

if [[ "$device" == cuda && ! -x "$bin" || "$device" == cuda && "$stage" == families ]]; then
  stamp "build"
  OUT="$out" COLOSSUS_TESTS=OFF bash scripts/device_build.sh > "$out/device_build.log" 2>&1 \
    || { tail -60 "$out/device_build.log"; exit 1; }
  grep -E "^build:" "$out/device_build.log"
  grep -E "paged_attention|reshape_and_cache|FAIL" "$out/check.txt" | head -20
fi

# One generate comparison: family dir dtype -> a table row.
# With candidates > 1, transformers picks the best-conditioned of that many
# prompts (family_oracle.py greedy --candidates) and ours runs on the same one.
compare_row() {
  local name=$1 dir=$2 dtype=$3 new=$4 candidates=${5:-1}
  local tag="$name.$dtype.c$candidates" label=$dtype
  (( candidates > 1 )) && label="$dtype, best of $candidates prompts"
  local hf="$work/$tag.hf.json" ours="$work/$tag.ours.jsonl" verdict chosen
  $python scripts/family_oracle.py greedy "$dir" --prompt "$prompt" --new "$new" --dtype "$dtype" --device "$device" \
    --candidates "$candidates" > "$hf" 2> "$work/$tag.hf.err" \
    || { echo "| $name | $label | transformers failed: $(tail -1 "$work/$tag.hf.err") |" >> "$table"; return; }
  chosen=$($python -c 'import json, sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])["prompt"])' "$hf")
  local status=0
  "$bin" generate "$dir" --prompt "$chosen" --max_new_tokens "$new" --greedy --device "$device" --dtype "$dtype" \
    --ids_out "$ours" > "$work/$tag.ours.txt" 2> "$work/$tag.ours.err" || status=$?
  if (( status != 0 )); then
    echo "| $name | $label | colossus generate exit $status: $(tail -1 "$work/$tag.ours.err") |" >> "$table"
    return
  fi
  verdict=$($python scripts/family_oracle.py compare "$hf" "$ours")
  echo "| $name | $label | $verdict; $(grep -o '[0-9.]* tok/s' "$work/$tag.ours.err" | tail -1) |" >> "$table"
}

if [[ "$stage" == families ]]; then
  echo "| family (tiny, window 48) | dtype | colossus generate vs transformers greedy ($device) |" > "$table"
  echo "|---|---|---|" >> "$table"
  for family in qwen2 mistral gemma2 gemma3; do
    stamp "$family"
    dir="$work/$family"
    [[ -f "$dir/config.json" ]] || $python scripts/family_oracle.py make "$family" "$dir" --device "$device" \
      > "$work/$family.make.log" 2>&1 || { echo "| $family | - | make failed: $(tail -1 "$work/$family.make.log") |" >> "$table"; continue; }
    for dtype in fp32 bf16; do compare_row "$family" "$dir" "$dtype" 40; done
    compare_row "$family" "$dir" bf16 40 8
  done
elif [[ "$stage" == qwen7b ]]; then
  dir="$work/qwen2.5-7b"
  stamp "make the Qwen2.5-7B-shaped model"
  [[ -f "$dir/config.json" ]] || $python scripts/family_oracle.py make qwen2 "$dir" --shape qwen2.5-7b --device cuda \
    > "$work/qwen7b.make.log" 2>&1 || { tail -5 "$work/qwen7b.make.log"; exit 1; }
  parts=("${@:2}"); (( ${#parts[@]} )) || parts=(greedy zero2_offload gemini)
  [[ -f "$table" ]] || { echo "| Qwen2.5-7B shape | dtype | result |" > "$table"; echo "|---|---|---|" >> "$table"; }
  if [[ " ${parts[*]} " == *" greedy "* ]]; then
    stamp "greedy, 32 tokens"
    compare_row qwen2.5-7b "$dir" bf16 32
    compare_row qwen2.5-7b "$dir" bf16 32 8
    # fp32 on the GPU (30 GB each, one at a time): the same model without
    # bf16's one-step ties, to tell rounding from a wrong kernel.
    compare_row qwen2.5-7b "$dir" fp32 32
    # Where bf16 parts from transformers: is it a tie? Both bf16 runs against
    # transformers' fp32 run on the same prompt.
    for pair in "transformers bf16:qwen2.5-7b.bf16.c1.hf.json" "colossus bf16:qwen2.5-7b.bf16.c1.ours.jsonl"; do
      if [[ -f "$work/qwen2.5-7b.fp32.c1.hf.json" && -f "$work/${pair#*:}" ]]; then
        verdict=$($python scripts/family_oracle.py compare "$work/qwen2.5-7b.fp32.c1.hf.json" "$work/${pair#*:}" \
          | sed 's/ours/bf16/; s/HF \([0-9]\)/fp32 \1/')
        echo "| qwen2.5-7b | ${pair%%:*} vs transformers fp32 | $verdict |" >> "$table"
      fi
    done
  fi
  if [[ " ${parts[*]} " == *" agreement "* ]]; then
    # Many prompts, each greedy for 32 tokens in transformers fp32 (the
    # reference), transformers bf16, colossus bf16 and colossus fp32: how long
    # each stays on the reference. Equal means for the two bf16 runs say the
    # partings are bf16 rounding at random near-ties, not a fault of ours.
    n=${AGREEMENT_PROMPTS:-12}
    stamp "agreement over $n prompts"
    for dtype in fp32 bf16; do
      $python scripts/family_oracle.py greedy "$dir" --prompt "$prompt" --new 32 --dtype "$dtype" --device "$device" \
        --candidates "$n" --all > "$work/agree.hf.$dtype.jsonl" 2> "$work/agree.hf.$dtype.err" \
        || { tail -3 "$work/agree.hf.$dtype.err"; exit 1; }
    done
    mapfile -t prompts < <($python -c 'import json, sys
for line in open(sys.argv[1]): print(json.loads(line)["prompt"])' "$work/agree.hf.fp32.jsonl")
    prompt_args=(); for p in "${prompts[@]}"; do prompt_args+=(--prompt "$p"); done
    for dtype in bf16 fp32; do
      "$bin" generate "$dir" "${prompt_args[@]}" --max_new_tokens 32 --greedy --device "$device" --dtype "$dtype" \
        --ids_out "$work/agree.ours.$dtype.jsonl" > "$work/agree.ours.$dtype.txt" 2> "$work/agree.ours.$dtype.err" \
        || { tail -3 "$work/agree.ours.$dtype.err"; exit 1; }
    done
    $python scripts/family_oracle.py agreement "$work/agree.hf.fp32.jsonl" "$work/agree.hf.bf16.jsonl" \
      "$work/agree.ours.bf16.jsonl" "$work/agree.ours.fp32.jsonl" \
      --labels "transformers bf16" "colossus bf16" "colossus fp32" > "$out/agreement.md"
    echo "tokens equal to transformers fp32's greedy run, of 32, per prompt:" >> "$table"
    cat "$out/agreement.md" >> "$table"
  fi
  for plugin in zero2_offload gemini; do
    [[ " ${parts[*]} " == *" $plugin "* ]] || continue
    stamp "train $plugin"
    if [[ $plugin == zero2_offload ]]; then
      plugin_toml=$'name = "low_level_zero"\nstage = 2\nprecision = "bf16"\ncpu_offload = true'
    else
      # auto with its default, half the device margin for optimizer shards:
      # 16 bytes a parameter of 7.6B do not fit the 128 GB host beside
      # everything else, and 0.9 of the margin ran the H100 out of memory
      # after the warm-up.
      plugin_toml=$'name = "gemini"\nplacement_policy = "auto"\nprecision = "bf16"'
    fi
    cat > "$work/$plugin.toml" <<TOML
[model]
pretrained = "$dir"
[data]
source = "builtin"
builtin_bytes = 2000000
seq_len = 512
batch_size = 1
[optimizer]
name = "hybrid_adam"
lr = 1e-5
[plugin]
$plugin_toml
[train]
steps = 20
log_every = 1
eval_every = 0
eval_batches = 1
save = false
sample_tokens = 0
output_dir = "$work/run_$plugin"
TOML
    peak_file="$work/$plugin.gpu_peak"; echo 0 > "$peak_file"
    ( while sleep 1; do m=$(nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits | head -1)
        [[ $m -gt $(cat "$peak_file") ]] && echo "$m" > "$peak_file"; done ) & sampler=$!
    timer=(); [[ -x /usr/bin/time ]] && timer=(/usr/bin/time -v)
    # Bounded, so a slow run still reports its steps within one device call.
    timeout "${TRAIN_TIMEOUT_S:-480}" "${timer[@]}" "$bin" train "$work/$plugin.toml" > "$work/$plugin.log" 2> "$work/$plugin.err"
    rc=$?
    kill $sampler 2>/dev/null
    rss_kb=$(grep -m1 "Maximum resident" "$work/$plugin.err" | awk '{print $NF}')
    metrics="$work/run_$plugin/metrics.jsonl"
    loss=$(grep -o '"loss": *[0-9.eE+-]*' "$metrics" 2>/dev/null | tail -1 | sed 's/.*: *//')
    first=$(grep -o '"loss": *[0-9.eE+-]*' "$metrics" 2>/dev/null | head -1 | sed 's/.*: *//')
    steps_done=$(grep -c '"loss"' "$metrics" 2>/dev/null)
    rate=$(grep -o '"tokens_per_s": *[0-9.eE+-]*' "$metrics" 2>/dev/null | tail -1 | sed 's/.*: *//')
    echo "| train 20 steps, $plugin | bf16 | exit $rc, $steps_done logged steps, loss ${first:-none} -> ${loss:-none}, ${rate:-?} tokens/s (last log), peak GPU $(cat "$peak_file") MiB, peak host RSS $(( ${rss_kb:-0} / 1024 )) MiB |" >> "$table"
    [[ $rc -ne 0 ]] && tail -5 "$work/$plugin.err"
  done
else
  echo "unknown stage '$stage'; use families or qwen7b (or --cpu)"; exit 2
fi
stamp "done"
cat "$table"
