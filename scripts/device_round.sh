#!/usr/bin/env bash
# One device call for the open issues' GPU checks when the device time is
# short: builds colossus_cli and the benches once and runs `colossus check`
# (scripts/device_build.sh, sm_90, no tests), then runs each stage under its
# own time limit, so one slow stage does not cost the others their results:
#   offload   scripts/device_offload_numerics.sh (issue 27 point 1: Gemini with
#             the optimizer offloaded follows DDP's fp32 curve within 1e-5)
#   fp8       bench_train_gpt2 on llama-1b-like with --fp8 (issue 28: the FP8
#             step against the bf16 step of the same run; no Python peers)
#   gemini    bench_gemini_capacity's throughput part (issue 27 point 3: full
#             optimizer offload against plain AdamW on llama-1b-like;
#             GEMINI_FLAGS="--modes ...,gemini_nvme" adds the NVMe tier)
#   capacity  bench_gemini_capacity's ladder for gemini_auto (default ratios)
#             from 66 layers of the LLaMA-7B shape (13.6B; issue 27 point 2),
#             CAPACITY_FLAGS more
#   fp8curve  `colossus train` on llama-1b-like, bf16 then use_fp8, same seed
#             and built-in corpus, FP8CURVE_STEPS (500) steps each, compared by
#             scripts/compare_loss_curves.py (issue 28: within 1% of bf16's
#             curve; windows of 50 steps) with both runs' tokens/s
#   decode    bench_gemv + bench_inference's decode table (issue 26);
#             DECODE_FLAGS="" adds the 1000-request mix; DECODE_PEER=1 runs
#             transformers beside it (greedy agreement, its decode speed)
#   serve     scripts/device_serve_bench.sh: `colossus serve` under
#             bench/serve_bench.py at several request rates (issue 26),
#             SERVE_LIMIT_S (300) in all, SERVE_BENCH_RATES to shorten it
#   train8b   `colossus train` on llama3-8b-like (8.03B) under Gemini auto,
#             bf16, T=4096, every block checkpointed, granularity full then
#             mlp (issue 28's 8B point): tokens/s, MFU and peak memory from
#             its metrics.jsonl
#   bench8b   bench_train_gpt2 on llama3-8b-like, T=4096, B=1 (issue 28's
#             8B point against HF + torch.compile): every block checkpointed
#             (full) with the compile-bf16 peer (transformers' gradient
#             checkpointing), then granularity mlp alone; BENCH8B_LIMIT_S (420)
#   long32k   bench_train_gpt2 on llama-1b-like at T = 32768, B = 1, every
#             block checkpointed, one GPU (issue 28's long-context training
#             step), against HF + torch.compile with gradient checkpointing;
#             LONG32K_LIMIT_S (300)
#   ring      bench_ring_attention: sp 2/4/8 simulated at T = 32K-128K on the
#             fused block kernel against one SDPA call, and the matmul blocks
#             beside it at 8K (issue 28's long-context point); exits 3 when
#             the ring's output or gradients leave SDPA's
# STAGES="offload gemini fp8 decode" picks and orders them. A stage's log is
# $OUT/<stage>.log, packed at the end with every other output into
# $OUT/all_logs.tar.gz (the device returns 8 files); the summary table is
# printed last with every exit code. FP8_PROFILE_STEPS=N adds the Kineto
# kernel breakdown of the FP8 step.
# A later call on the same warm machine skips the build (ninja is a no-op).
# Usage (device): bash scripts/device_round.sh   (needs .devdeps carried)
set -uo pipefail
cd "$(dirname "$0")/.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export TORCH_CUDA_ARCH_LIST=9.0 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
t0=$(date +%s)
stamp() { echo "[$(( $(date +%s) - t0 )) s] $*"; }
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,memory.total \
  --format=csv,noheader 2>&1 | tee "$out/nvidia-smi.csv"

# Configure, build and `colossus check` (its log: $OUT/check.txt).
stamp "build + colossus check"
# Only the benches the chosen stages run (device time is scarce).
targets=()
for stage in ${STAGES:-offload gemini fp8 decode}; do
  case $stage in
    gemini|capacity) targets+=(bench_gemini_capacity) ;;
    fp8|bench8b|long32k) targets+=(bench_train_gpt2) ;;
    decode) targets+=(bench_inference bench_gemv) ;;
    serve) targets+=(colossus_cli bench_inference) ;;
    ring) targets+=(bench_ring_attention) ;;
  esac
done
if ! COLOSSUS_TESTS=OFF bash scripts/device_build.sh $(printf '%s\n' "${targets[@]}" | sort -u) \
    ${EXTRA_TARGETS:-} > "$out/build_and_check.log" 2>&1; then
  tail -60 "$out/build_and_check.log"
  exit 1
fi
grep -E "^build:" "$out/build_and_check.log"
grep -E "FAIL" "$out/check.txt" | head -20
tail -3 "$out/check.txt"
stamp "build + check done"

# COLOSSUS_COMMIT labels the benches' rows (the device copy's git metadata
# can lag the tree it carries).
commit_flag=()
[[ -n ${COLOSSUS_COMMIT:-} ]] && commit_flag=(--commit "$COLOSSUS_COMMIT")
declare -A rc
run_stage() {  # name, limit in seconds, command...
  local name=$1 limit=$2; shift 2
  stamp "$name (limit $limit s)"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  rc[$name]=$?
  stamp "$name: exit ${rc[$name]}"
}
for stage in ${STAGES:-offload gemini fp8 decode}; do
  case $stage in
    offload) run_stage offload 200 env COLOSSUS_BIN=build-gpu/bin/colossus bash scripts/device_offload_numerics.sh ;;
    fp8) run_stage fp8 "${FP8_LIMIT_S:-200}" build-gpu/bin/bench_train_gpt2 --model llama-1b-like --batch 8 --no-python \
           --cuda-graph off --steps 20 --warmup 5 --check-steps 20 --phase-steps 0 --profile-steps ${FP8_PROFILE_STEPS:-0} \
           --fp8 "${FP8_RECIPE:-tensorwise}" --json "$out/bench_train_fp8.json" ;;
    gemini) run_stage gemini "${GEMINI_LIMIT_S:-170}" build-gpu/bin/bench_gemini_capacity --parts throughput \
              --modes adamw,gemini_offload --budget-s $(( ${GEMINI_LIMIT_S:-170} - 10 )) --try-timeout-s 120 \
              --no-record ${GEMINI_FLAGS:-} ;;
    capacity) run_stage capacity "${CAPACITY_LIMIT_S:-400}" build-gpu/bin/bench_gemini_capacity --parts capacity \
              --modes gemini_auto --start gemini_auto=66 --layer-step 4 \
              --budget-s $(( ${CAPACITY_LIMIT_S:-400} - 150 )) --try-timeout-s 150 --no-record ${CAPACITY_FLAGS:-} ;;
    decode) run_stage gemv 60 build-gpu/bin/bench_gemv --no-record --out-dir "$out" ${commit_flag[@]+"${commit_flag[@]}"}
            peer=(--no-python)
            [[ ${DECODE_PEER:-0} == 1 ]] && peer=(--python python3 --peer-variants dynamic --peer-max-seconds 10)
            run_stage decode "${DECODE_LIMIT_S:-150}" build-gpu/bin/bench_inference --workdir /tmp/bench_inference \
              --out-dir "$out" --no-record "${peer[@]}" --time-limit $(( ${DECODE_LIMIT_S:-150} - 20 )) \
              ${commit_flag[@]+"${commit_flag[@]}"} ${DECODE_FLAGS:---mix-requests 0} ;;
    serve) run_stage serve_bench "${SERVE_LIMIT_S:-300}" env SERVE_BENCH_BUDGET_S=$(( ${SERVE_LIMIT_S:-300} - 10 )) \
             SERVE_BENCH_SKIP_BUILD=1 bash scripts/device_serve_bench.sh ;;
    train8b) run_stage train8b "${TRAIN8B_LIMIT_S:-300}" bash -c '
              for g in full mlp; do
                build-gpu/bin/colossus train examples/configs/plugins/gemini.toml --model.preset=llama3-8b-like \
                  --data.seq_len=${TRAIN8B_SEQ:-4096} --data.batch_size=1 --optimizer.name=hybrid_adam \
                  --model.gradient_checkpointing_ratio=1.0 --model.gradient_checkpointing_granularity=$g \
                  --train.steps=6 --train.log_every=1 --train.save=false --train.output_dir=/tmp/train8b_$g \
                  || exit $?
                echo "granularity $g: $(grep tokens_per_s /tmp/train8b_$g/metrics.jsonl | tail -1)"
              done' ;;
    bench8b) run_stage bench8b "${BENCH8B_LIMIT_S:-420}" bash -c "
              build-gpu/bin/bench_train_gpt2 --model llama3-8b-like --seq 4096 --batch 1 --steps 5 --warmup 2 \
                --check-steps 3 --phase-steps 0 --profile-steps 0 --cuda-graph off --checkpoint full \
                --peers compile-bf16 --python python3 --peer-timeout 300 --workdir /tmp/bench8b \
                --json '$out/bench8b_full.json' && \
              build-gpu/bin/bench_train_gpt2 --model llama3-8b-like --seq 4096 --batch 1 --steps 5 --warmup 2 \
                --check-steps 3 --phase-steps 0 --profile-steps 0 --cuda-graph off --checkpoint mlp --no-python \
                --workdir /tmp/bench8b_mlp --json '$out/bench8b_mlp.json'" ;;
    long32k) run_stage long32k "${LONG32K_LIMIT_S:-300}" \
              build-gpu/bin/bench_train_gpt2 --model llama-1b-like --seq 32768 --batch 1 --steps 5 --warmup 2 \
                --check-steps 3 --phase-steps 0 --profile-steps 0 --cuda-graph off --checkpoint full \
                --peers compile-amp --python python3 --peer-timeout 200 --workdir /tmp/long32k \
                --json "$out/long32k.json" ;;
    fp8curve) run_stage fp8curve "${FP8CURVE_LIMIT_S:-300}" bash -c '
              for run in bf16 fp8; do
                build-gpu/bin/colossus train examples/configs/plugins/ddp.toml --model.preset=llama-1b-like \
                  --data.seq_len=1024 --data.batch_size=8 --model.use_fp8=$([[ $run == fp8 ]] && echo true || echo false) \
                  --train.steps=${FP8CURVE_STEPS:-500} --train.log_every=1 --train.eval_every=${FP8CURVE_STEPS:-500} \
                  --train.save=false --train.output_dir=/tmp/fp8curve_$run > /tmp/fp8curve_$run.log 2>&1 \
                  || { tail -20 /tmp/fp8curve_$run.log; exit 4; }
              done
              python3 scripts/compare_loss_curves.py /tmp/fp8curve_bf16/metrics.jsonl /tmp/fp8curve_fp8/metrics.jsonl \
                --labels bf16,fp8' ;;
    ring) run_stage ring "${RING_LIMIT_S:-240}" bash -c "build-gpu/bin/bench_ring_attention --no-record --out-dir '$out' \
            --batches 1 --heads 32 --seqs 8192 --sp 2,8 --kernels fused,math --iters 3 && \
            build-gpu/bin/bench_ring_attention --no-record --out-dir '$out' --batches 1 --heads 32 \
            --seqs ${RING_SEQS:-32768,65536,131072} --sp 2,4,8 --iters 3" ;;
    *) echo "unknown stage $stage (offload, gemini, capacity, fp8, fp8curve, decode, serve, ring, train8b, bench8b)"; exit 2 ;;
  esac
done

echo "=== results ==="
[[ -n ${rc[offload]+x} ]] && grep -E "^\||FAILED|exit" "$out/offload.log" | tail -16
[[ -n ${rc[gemini]+x} ]] && grep -E "^\||gemini|adamw" "$out/gemini.log" | tail -12
[[ -n ${rc[capacity]+x} ]] && grep -E "^\||capacity gemini_auto" "$out/capacity.log" | cut -c1-400 | tail -8
[[ -n ${rc[fp8]+x} ]] && grep -E "fp8|tok/s|^\|" "$out/fp8.log" | tail -20
[[ -n ${rc[gemv]+x} ]] && tail -15 "$out/gemv.log"
[[ -n ${rc[decode]+x} ]] && tail -40 "$out/decode.log"
[[ -n ${rc[serve_bench]+x} ]] && tail -30 "$out/serve_bench.log"
[[ -n ${rc[train8b]+x} ]] && grep -E "^granularity|error|Error" "$out/train8b.log"
[[ -n ${rc[fp8curve]+x} ]] && tail -16 "$out/fp8curve.log"
[[ -n ${rc[bench8b]+x} ]] && grep -E "^\||tok/s|PASS|FAIL|error" "$out/bench8b.log" | tail -24
[[ -n ${rc[ring]+x} ]] && grep -E "^\||disagree" "$out/ring.log"
# The device returns at most 8 files: everything in one archive, beside the
# few a reader opens first.
for run in /tmp/train8b_full /tmp/train8b_mlp /tmp/fp8curve_bf16 /tmp/fp8curve_fp8; do
  [[ -f $run/metrics.jsonl ]] && cp "$run/metrics.jsonl" "$out/$(basename "$run")_metrics.jsonl"
done
(cd "$out" && tar czf all_logs.tar.gz --exclude=all_logs.tar.gz . && \
  find . -maxdepth 1 -type f ! -name all_logs.tar.gz ! -name check.txt ! -name nvidia-smi.csv \
    ! -name check.json ! -name 'bench_*.json' -delete; find . -mindepth 1 -type d -exec rm -rf {} +) 2>/dev/null
failed=0
for name in "${!rc[@]}"; do
  echo "stage $name: exit ${rc[$name]}"
  [[ ${rc[$name]} -eq 0 ]] || failed=1
done
stamp "done"
exit $failed
