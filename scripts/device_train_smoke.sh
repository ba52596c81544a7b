#!/usr/bin/env bash
# `colossus train` as users run it, for every plugin and save mode (issue 20),
# then `colossus serve` under load. One device call: builds the CLI against the
# image's torch (scripts/device_build.sh; .devdeps carried, made by
# scripts/pack_device_deps.sh), then for each case:
#   train 40 steps (GPT-2 124M shape, B=16, T=1024, bf16, HybridAdam), saving
#   every 10 with keep_last 2 -> exit 0; "checkpoint saved" logged for steps
#   10, 20, 30, 40; on disk exactly step-30, step-40 and `latest` -> step-40,
#   no *.partial / *.tmp.* debris; `colossus generate` loads both kept steps;
#   then `--resume` from step-30 into a fresh output dir runs to step 40, exit 0
#   (and its step-40 loss is shown beside the first run's).
# One case's checkpoint also loads in transformers; one short case runs under
# compute-sanitizer memcheck (0 errors); then scripts/serve_load_check.py
# drives `colossus serve` (llama-1b-like, bf16, CUDA graphs) with 256 requests
# from 64 clients and SIGTERMs it with requests in flight.
# Cases run four at a time on the one GPU. Prints a Markdown table last; logs
# go to $OUT. `--cpu` runs the same matrix on this machine's CPU build with a
# tiny model (a dry run of the script; no sanitizer, a tiny served model).
# Usage (device): bash scripts/device_train_smoke.sh        (CPU: --cpu)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
# Logs collect under $work/out; $OUT gets the table and one archive of them
# (the device tool returns at most 8 files).
final_out=${OUT:-/tmp/colossus-out}
work=${SMOKE_WORK:-/tmp/colossus_smoke}
out=$work/out
rm -rf "$work" && mkdir -p "$out" "$final_out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
# The device call ends at 600 s: stages that would start too late are skipped (and say so).
budget=${SMOKE_BUDGET_S:-570}
elapsed() { echo $(( $(date +%s) - t0 )); }

cpu=0
[[ "${1:-}" == "--cpu" ]] && cpu=1
if (( cpu )); then
  bin=build/bin/colossus
  python=.venv/bin/python
  model_toml=$'n_embd = 64\nn_layer = 2\nn_head = 4\nn_positions = 128'
  seq_len=64; batch=4; builtin=200000; lanes=2; device=cpu
  serve_model_flags=(--model.preset=llama-tiny)
  serve_args=(--max_batch_size 8 --max_input_len 64 --max_output_len 64 --block_size 8)
  load=(--requests 64 --clients 16 --max-tokens 16 --inflight 8)
else
  stamp "build"
  OUT="$out" COLOSSUS_TESTS=OFF bash scripts/device_build.sh > "$out/device_build.log" 2>&1 \
    || { tail -60 "$out/device_build.log"; exit 1; }
  grep -E "^build:" "$out/device_build.log"
  # The crash's cause in isolation: remove_all bound to torch's copy vs libstdc++'s.
  torch_lib=$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')
  (for order in torch_first stdcxx_first; do
    first=(); [[ $order == stdcxx_first ]] && first=(-Wl,--push-state,--no-as-needed -lstdc++ -Wl,--pop-state)
    g++ -std=c++20 -O1 scripts/stdlib_binding_probe.cpp -I"$torch_lib/../include" -L"$torch_lib" -Wl,-rpath,"$torch_lib" \
      "${first[@]}" -ltorch -ltorch_cpu -lc10 -o "/tmp/probe_$order" > "$out/probe_build_$order.log" 2>&1 \
      && { /tmp/probe_$order > "$out/probe_$order.log" 2>&1; echo "probe $order: exit $?, $(head -1 "$out/probe_$order.log")"; } \
      || echo "probe $order: did not build (probe_build_$order.log)"
  done > "$out/probe.txt") &
  bin=build-gpu/bin/colossus
  python=python3
  # Where the built binary's std::filesystem::remove_all comes from (every
  # symbol bound at start-up, so the one the prune calls is in the list).
  cxx=$(grep -m1 '^CMAKE_CXX_COMPILER:' build-gpu/CMakeCache.txt | cut -d= -f2)
  { echo "CMake's compiler: $cxx ($("$cxx" -dumpfullversion)), its libstdc++.so: $("$cxx" -print-file-name=libstdc++.so)"
    echo "NEEDED: $(readelf -d "$bin" | grep NEEDED | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
    grep -A8 '^build bin/colossus:' build-gpu/build.ninja | grep -m1 'LINK_FLAGS' | cut -c1-300
    LD_BIND_NOW=1 LD_DEBUG=bindings "$bin" --version 2>&1 \
      | grep -m1 'remove_allERKNS_7__cxx114pathERSt10error_code' | sed 's/.*binding file/binding file/'
  } > "$out/binding.txt" 2>&1
  cat "$out/binding.txt"
  model_toml=$'n_embd = 768\nn_layer = 12\nn_head = 12\nn_positions = 1024'
  seq_len=1024; batch=16; builtin=8000000; lanes=7; device=cuda
  # Trained long enough on the built-in corpus that greedy choices are confident.
  serve_model_flags=(--model.preset=llama-1b-like --data.seq_len=256 --data.batch_size=16 --train.steps=60
                     --data.builtin_bytes=4000000)
  # No --device / --dtype / --use_cuda_graph: the vLLM-style defaults must pick
  # the GPU, the checkpoint's dtype in bf16 and CUDA graphs (the log line says so).
  serve_args=(--max_batch_size 64 --max_input_len 256
              --max_output_len 256 --threads 96)
  load=(--requests 256 --clients 64 --max-tokens 64 --inflight 32 --min-agree-chars 16)
fi

# A run's TOML: the model and data above, this case's [plugin] and [booster].
write_config() {  # file plugin_toml booster_toml
  cat > "$1" <<EOF
[model]
preset = "gpt2-tiny"
[model.config]
$model_toml
[data]
source = "builtin"
tokenizer = "byte"
builtin_bytes = $builtin
seq_len = $seq_len
batch_size = $batch
[optimizer]
name = "hybrid_adam"
lr = 6e-4
[lr_scheduler]
name = "cosine"
warmup_steps = 10
total_steps = 40
[plugin]
$2
[booster]
$3
[train]
steps = 40
log_every = 10
eval_every = 20
save_every = 10
keep_last = 2
sample_tokens = 0
EOF
}

bf16_booster='mixed_precision = "bf16"'
fp32_booster='mixed_precision = "fp32"'
# name | [plugin] keys (';' between lines) | [booster] keys
cases=(
  "ddp|name = \"ddp\"|$bf16_booster"
  "zero1|name = \"low_level_zero\";stage = 1;precision = \"bf16\"|$fp32_booster"
  "zero2|name = \"low_level_zero\";stage = 2;precision = \"bf16\"|$fp32_booster"
  "gemini_static|name = \"gemini\";placement_policy = \"static\";precision = \"bf16\"|$fp32_booster"
  "gemini_static_offload|name = \"gemini\";placement_policy = \"static\";offload_optim_frac = 1.0;precision = \"bf16\"|$fp32_booster"
  "gemini_auto|name = \"gemini\";placement_policy = \"auto\";precision = \"bf16\"|$fp32_booster"
  "hybrid_zero1|name = \"hybrid_parallel\";tp_size = 1;pp_size = 1;zero_stage = 1;precision = \"bf16\"|$fp32_booster"
)

loss_at() {  # step metrics.jsonl -> that step's training loss (4 decimals), or nothing
  "$python" - "$1" "$2" 2>/dev/null <<'PY'
import json, sys
step, path = int(sys.argv[1]), sys.argv[2]
for line in open(path):
    row = json.loads(line) if line.strip() else {}
    if row.get("step") == step and "loss" in row:
        print("%.4f" % row["loss"])
        break
PY
}

# One case and save mode, start to end; writes $work/<case>_<mode>.result
# (one line of '|'-separated cells) and leaves logs beside it.
run_case() {  # name plugin booster async
  local name=$1 plugin=$2 booster=$3 async=$4
  local mode=$([[ $async == true ]] && echo async || echo sync)
  local id=${name}_${mode} dir=$work/${name}_${mode}
  local cfg=$work/$id.toml log=$work/$id.train.log result=$work/$id.result
  write_config "$cfg" "${plugin//;/$'\n'}" "$booster"
  local s=$(date +%s)
  timeout 300 "$bin" train "$cfg" --train.output_dir="$dir" --train.async_save=$async > "$log" 2>&1
  local rc=$? secs=$(( $(date +%s) - s ))
  local saved=$(grep -oE "step [0-9]+: checkpoint saved" "$log" | awk '{print $2}' | tr -d ':' | tr '\n' ' ')
  local ckpt=$dir/checkpoints
  local kept=$(ls "$ckpt" 2>/dev/null | tr '\n' ' ')
  local latest=$(cat "$ckpt/latest" 2>/dev/null)
  local problems=()
  (( rc == 0 )) || problems+=("exit $rc")
  [[ "$saved" == "10 20 30 40 " ]] || problems+=("saved: '$saved'")
  [[ "$kept" == "latest step-00000030 step-00000040 " ]] || problems+=("on disk: '$kept'")
  [[ "$latest" == "step-00000040" ]] || problems+=("latest: '$latest'")
  local loads=0
  for step in step-00000030 step-00000040; do
    if timeout 120 "$bin" generate "$ckpt/$step" --device $device --prompt "Once upon a time" --max_new_tokens 8 --greedy \
         > "$work/$id.generate_$step.log" 2>&1; then
      loads=$((loads + 1))
    else
      problems+=("generate $step: exit $?")
    fi
  done
  # Resume from the step-30 checkpoint into a fresh output dir: runs steps 31-40.
  s=$(date +%s)
  timeout 300 "$bin" train "$cfg" --train.output_dir="$dir.resumed" --train.async_save=$async --resume "$ckpt/step-00000030" \
    > "$work/$id.resume.log" 2>&1
  local rrc=$? rsecs=$(( $(date +%s) - s ))
  (( rrc == 0 )) || problems+=("resume exit $rrc")
  [[ "$(cat "$dir.resumed/checkpoints/latest" 2>/dev/null)" == "step-00000040" ]] || problems+=("resume: no step-40")
  local loss=$(loss_at 40 "$dir/metrics.jsonl") rloss=$(loss_at 40 "$dir.resumed/metrics.jsonl")
  [[ -n "$loss" && -n "$rloss" ]] || problems+=("no step-40 loss in metrics.jsonl")
  local verdict=PASS
  (( ${#problems[@]} == 0 )) || verdict="FAIL: ${problems[*]}"
  echo "| $name | $mode | $rc ($secs s) | ${saved% } | ${kept% } | $loads/2 | $rrc ($rsecs s) | ${loss:-?} / ${rloss:-?} | $verdict |" > "$result"
  # Keep one checkpoint for the transformers check; free the disk otherwise.
  [[ $id == ddp_async ]] || rm -rf "$dir" "$dir.resumed"
}

memcheck_pid=""
# The sanitizer case runs beside the whole matrix (it is slow): tiny, 6 steps, async saves, pruning.
if (( ! cpu )) && command -v compute-sanitizer > /dev/null; then
  (
    cat > "$work/memcheck.toml" <<EOF
[model]
preset = "gpt2-tiny"
[data]
source = "builtin"
builtin_bytes = 100000
seq_len = 64
batch_size = 4
[booster]
mixed_precision = "bf16"
[optimizer]
name = "hybrid_adam"
[train]
steps = 6
save_every = 2
keep_last = 2
log_every = 2
eval_every = 0
async_save = true
sample_tokens = 0
EOF
    # API errors are not reported: NCCL's init probes kernels built for other
    # architectures (cudaFuncGetAttributes -> "no kernel image"), by design.
    timeout $(( budget - $(elapsed) - 30 )) compute-sanitizer --tool memcheck --report-api-errors no --error-exitcode 99 \
      --leak-check no "$bin" train "$work/memcheck.toml" \
      --train.output_dir="$work/memcheck" > "$out/memcheck.log" 2>&1
    echo "$?" > "$work/memcheck.rc"
  ) &
  memcheck_pid=$!
fi
stamp "train matrix: ${#cases[@]} plugins x async/sync, $lanes at a time"
lane_pids=()
for c in "${cases[@]}"; do
  IFS='|' read -r name plugin booster <<< "$c"
  for async in true false; do
    # At most $lanes cases at once: wait for the oldest lane before starting another.
    if (( ${#lane_pids[@]} >= lanes )); then wait "${lane_pids[0]}"; lane_pids=("${lane_pids[@]:1}"); fi
    if (( $(elapsed) > budget - 200 )); then
      echo "| $name | $([[ $async == true ]] && echo async || echo sync) | not run (out of time) | | | | | | FAIL: not run |" \
        > "$work/${name}_$async.result"
      continue
    fi
    run_case "$name" "$plugin" "$booster" $async &
    lane_pids+=($!)
  done
done
wait "${lane_pids[@]}"
stamp "matrix done"

# transformers loads one of the checkpoints (model and tokenizer).
hf="FAIL"
if "$python" - "$work/ddp_async/checkpoints/step-00000040/model" > "$out/hf_load.log" 2>&1 <<'PY'
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1], torch_dtype=torch.float32)
tok = AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.tensor([tok.encode("Once upon a time")])
with torch.no_grad():
    loss = model(input_ids=ids, labels=ids).loss.item()
assert loss == loss and loss < 20, loss
print(f"transformers loss {loss:.4f}")
PY
then hf="PASS ($(tail -1 "$out/hf_load.log"))"; fi
rm -rf "$work/ddp_async" "$work/ddp_async.resumed"

memcheck="not run (no compute-sanitizer or --cpu)"
[[ -n "$memcheck_pid" ]] && wait "$memcheck_pid"
if [[ -f "$work/memcheck.rc" ]]; then
  errors=$(grep -oE "ERROR SUMMARY: [0-9]+ error" "$out/memcheck.log" | tail -1)
  rc=$(cat "$work/memcheck.rc")
  if [[ $rc == 0 && "$errors" == "ERROR SUMMARY: 0 error" ]]; then memcheck="PASS (exit 0, 0 errors)"
  else memcheck="FAIL (exit $rc, ${errors:-no summary})"; fi
fi

# The served model: a llama-1b-like checkpoint from `colossus train` (so it
# has the trainer's byte tokenizer files), optimizer state dropped.
stamp "serve: make the model"
cat > "$work/serve_model.toml" <<EOF
[model]
preset = "llama-tiny"
[data]
source = "builtin"
builtin_bytes = 200000
seq_len = 64
batch_size = 2
[optimizer]
lr = 1e-3
[lr_scheduler]
warmup_steps = 5
[booster]
mixed_precision = "bf16"
[train]
steps = 10
save_every = 0
eval_every = 0
sample_tokens = 0
EOF
serve="FAIL (no model)"
serve_left=$(( budget - $(elapsed) - 20 ))
if (( serve_left < 90 )); then
  serve="FAIL: not run (out of time)"
elif timeout $(( serve_left / 3 )) "$bin" train "$work/serve_model.toml" "${serve_model_flags[@]}" --train.output_dir="$work/serve_run" \
     > "$out/serve_model.log" 2>&1; then
  step_dir=$work/serve_run/checkpoints/$(cat "$work/serve_run/checkpoints/latest")
  served=$step_dir/model
  rm -rf "$step_dir/optimizer"
  stamp "serve: load check"
  if timeout $(( budget - $(elapsed) - 10 )) "$python" scripts/serve_load_check.py --bin "$bin" --model "$served" "${load[@]}" --log "$out/serve.log" \
       --report "$out/serve_report.json" -- "${serve_args[@]}" > "$out/serve_check.txt" 2>&1; then
    serve="PASS"
  else
    serve="FAIL"
  fi
  # On the GPU the defaults must have chosen cuda, bf16 and CUDA graphs.
  if [[ $device == cuda ]] && ! grep -q "bf16, cuda:0, CUDA graphs" "$out/serve.log"; then
    echo "serve defaults: the log does not show bf16 on cuda:0 with CUDA graphs:"; grep "loaded" "$out/serve.log"
    serve="FAIL"
  fi
else
  tail -20 "$out/serve_model.log" 2>/dev/null
fi
wait
stamp "done"

{
  echo "| plugin | saves | train exit (time) | checkpoint saved at | on disk after | generate loads kept steps | --resume from 30 exit (time) | step-40 loss first / resumed | verdict |"
  echo "|---|---|---|---|---|---|---|---|---|"
  cat "$work"/*.result
  echo
  echo "- transformers from_pretrained on ddp/async step-40: $hf"
  echo "- compute-sanitizer memcheck (gpt2-tiny, 6 steps, async saves every 2, keep_last 2; API errors not reported): $memcheck"
  echo "- colossus serve: $serve"
  [[ -f "$out/probe.txt" ]] && sed 's/^/- stdlib binding /' "$out/probe.txt"
  [[ -f "$out/binding.txt" ]] && tail -1 "$out/binding.txt" | sed 's/^/- colossus: /'
} > "$out/train_smoke_table.md"
cp "$work"/*.log "$out/" 2>/dev/null
tar -czf "$final_out/smoke_logs.tgz" -C "$work" out
cp "$out/train_smoke_table.md" "$out/serve_report.json" "$final_out/" 2>/dev/null
cat "$out/serve_check.txt" 2>/dev/null
cat "$out/train_smoke_table.md"
! grep -q "FAIL" "$out/train_smoke_table.md"
