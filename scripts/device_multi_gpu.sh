#!/usr/bin/env bash
# Issue 10's device call: multi-GPU correctness of every parallel layout over
# NCCL, checkpoints moved between layouts, and data-parallel weak scaling, in
# one run of about 500 s on a machine with N = 1, 2, 4 or 8 visible GPUs.
#
# Usage (device): bash scripts/device_multi_gpu.sh
#   (the lead: cd .devhead && timeout 580 bash scripts/device_multi_gpu.sh > $OUT/run.log 2>&1)
# Usage (CPU, to shake out config keys): bash scripts/device_multi_gpu.sh --device cpu --ranks 2
#   (MPI ranks through `colossus run --backend mpi`, a tiny model, a few steps;
#   binary: $COLOSSUS_BIN, else build-multigpu/bin/colossus, else build/bin/colossus)
# Options: --ranks N (default: the number of visible GPUs; 2 on the CPU),
#   --budget S (seconds from the start after which no new run starts; 500),
#   --steps K (correctness steps; 50 on GPUs, 8 on the CPU),
#   --only correctness|scaling (one part).
#
# 1. Builds the CLI against the image's torch with scripts/device_build.sh (as
#    device_train_smoke.sh; needs .devdeps carried; its logs stay in the work
#    folder, not in $OUT).
# 2. Correctness: a small GPT-2 (gpt2-tiny widened to 128, 8 heads, max(4, 2N)
#    layers so that pp=N with 2 chunks per stage has a block per virtual
#    stage; T=128, global batch 16 sequences, dropout off, AdamW, cosine LR,
#    clipping at 1.0) trains 50 steps from the same seed in each layout that
#    fits N ranks, fp32 and bf16, and each loss curve (metrics.jsonl, every
#    step) is compared with the 1-rank DDP run of the same precision. The
#    global batch is the same everywhere: dp ranks read 16/dp sequences each
#    (the sampler interleaves, so the union is the 1-rank batch), pipelines
#    take it as N microbatches (data.batch_size 16/N, train.grad_accum N).
#    Layouts: ddp, low_level_zero 1/2, gemini static with and without
#    optimizer offload (dp=N); hybrid_parallel tp=N; sp all_to_all and
#    ring_attn (sp_size=N), split_gather (tp=N); pp=N 1f1b, interleaved (2
#    chunks), zero_bubble; N>=4: tp2 x pp(N/2); zero_stage 1 with tp2 (dp
#    N/2; N=1: dp1 x tp1); N=8: zero_stage 1 dp2 x tp2 x pp2. A zero_stage + tp run that stops
#    with an error (the composition not built yet) is SKIP with the message.
#    With N=1 every plugin runs at world size 1 on the GPU through NCCL and
#    the layouts needing 2+ ranks (split_gather, pp) are SKIP.
#    A LLaMA-style model (llama-tiny widened, GQA 8/4 heads) repeats ddp,
#    zero2, tp, both sp modes and pp 1f1b after the scaling part, if time
#    is left.
# 3. Checkpoints across layouts: `colossus train --resume` restores model,
#    optimizer, scheduler, data position and per-rank RNG state. It refuses
#    another data layout (dp, batch, accumulation, seq) and needs each rank's
#    RNG file, so a full resume can go from N ranks to 1 with the same data
#    layout: tp=N at step 25 -> DDP on 1 rank, and pp=N (1f1b) at step 25 ->
#    DDP on 1 rank with grad_accum N; the continued curve (steps 26-50) is
#    compared with the uninterrupted 1-rank run. The other way (1 rank -> N
#    ranks) is weights only: model.pretrained = the 1-rank run's step-25
#    model/ folder (HF layout) in tp=N and in DDP on 1 rank, both with a fresh
#    optimizer for 10 steps, compared with each other.
# 4. Scaling: DDP weak scaling on 1, 2, 4, .. N GPUs, bf16, HybridAdam:
#    gpt2-124m (B=16 per GPU, T=1024) and llama-1b-like (B=8, T=2048), 25
#    steps each, of which steps 6-25 are timed (metrics.jsonl's tokens_per_s
#    per 5-step interval, combined as total tokens / total time): tokens/s
#    total and per GPU, ms per step, MFU, efficiency = per-GPU tokens/s over
#    the 1-GPU run's. Each run also writes its final checkpoint (the trainer
#    always saves at the last step); that is outside the timed steps and is
#    deleted afterwards.
# 5. Prints the correctness table (layout | ranks | precision | max rel diff |
#    tolerance | PASS/FAIL/SKIP) and the scaling table last, and writes both
#    to $OUT/multi_gpu.md (OUT defaults to /tmp/colossus-out; nothing else is
#    written there). Exit code 0 only if no case FAILed.
# Order: GPT-2 fp32, the checkpoint cases, GPT-2 bf16 (these stop starting
# runs early enough to leave ~20 s per scaling run), scaling, LLaMA. Every run
# has a time limit (a hung collective costs one run, not the call), and no new
# run starts after the budget; those are SKIP "time budget".
# Not covered here: expert parallelism (the trainer has no MoE plugin; the
# moe tests and scripts/device_moe.sh cover it), 7B-scale runs and TP inference.
set -uo pipefail
cd "$(dirname "$0")/.."
# NVLink multicast off (the device README): mandatory, never remove.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1

device=cuda ranks="" budget=500 steps="" only=""
while [[ $# -gt 0 ]]; do
  case $1 in
    --device) device=$2; shift 2 ;;
    --ranks) ranks=$2; shift 2 ;;
    --budget) budget=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) echo "usage: $0 [--device cuda|cpu] [--ranks N] [--budget S] [--steps K] [--only correctness|scaling]"; exit 2 ;;
  esac
done
out=${OUT:-/tmp/colossus-out}
mkdir -p "$out"
work=${MULTI_GPU_WORK:-/tmp/colossus-multi-gpu}
rm -rf "$work"
mkdir -p "$work"
t0=$(date +%s)
elapsed() { echo $(( $(date +%s) - t0 )); }
stamp() { echo "[$(elapsed) s] $*"; }
commit=$(git rev-parse --short HEAD 2>/dev/null || echo "${COLOSSUS_COMMIT:-unknown}")

if [[ $device == cuda ]]; then
  stamp "build (scripts/device_build.sh)"
  # Run from an exported tree inside the checkout (.devhead): use the carried .devdeps beside it.
  [[ -d .devdeps || ! -d ../.devdeps ]] || ln -s ../.devdeps .devdeps
  OUT="$work/build" COLOSSUS_TESTS=OFF bash scripts/device_build.sh > "$work/device_build.log" 2>&1 \
    || { tail -60 "$work/device_build.log"; exit 1; }
  grep -E "^build:|FAIL" "$work/device_build.log" | head -20
  bin=$PWD/build-gpu/bin/colossus
  backend=nccl
  gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
  N=${ranks:-$gpus}
  machine="$gpus x $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"
  # Correctness model: see the header. 8 heads: tp/sp up to 8 divide them.
  L=$(( 2 * N > 4 ? 2 * N : 4 ))
  H=128 HEADS=8 KV=4 T=128 G=16 STEPS=${steps:-50} BYTES=1000000 RUN_LIMIT=90
  SCALE=("gpt2-124m:16:1024" "llama-1b-like:8:2048") SCALE_STEPS=25 SCALE_LOG=5 SCALE_LIMIT=150 SCALE_BYTES=4000000
else
  for candidate in "${COLOSSUS_BIN:-}" build-multigpu/bin/colossus build/bin/colossus; do
    [[ -n $candidate && -x $candidate ]] && { bin=$(realpath "$candidate"); break; }
  done
  [[ -n ${bin:-} ]] || { echo "no colossus binary: set COLOSSUS_BIN"; exit 1; }
  backend=mpi
  gpus=0
  N=${ranks:-2}
  machine="CPU ($(nproc) cores), MPI"
  L=$(( 2 * N > 4 ? 2 * N : 4 ))
  HEADS=$(( N > 4 ? N : 4 )) G=$(( N > 4 ? N : 4 ))
  H=64 KV=2 T=32 STEPS=${steps:-8} BYTES=200000 RUN_LIMIT=300
  SCALE=("gpt2-tiny:2:32" "llama-tiny:2:32") SCALE_STEPS=10 SCALE_LOG=2 SCALE_LIMIT=300 SCALE_BYTES=200000
fi
case $N in 1|2|4|8) ;; *) echo "N = $N ranks: use 1, 2, 4 or 8 (--ranks)"; exit 2 ;; esac
(( G % N == 0 )) || { echo "global batch $G is not divisible by $N ranks"; exit 2; }
HALF=$(( STEPS / 2 ))
stamp "$machine: $N rank(s), backend $backend, commit $commit, budget ${budget} s"

# --- the report helper (python3: metrics.jsonl -> rows; rows -> tables) ---
cat > "$work/report.py" <<'PY'
import json, math, os, sys

def records(run_dir):
    path = os.path.join(run_dir, "metrics.jsonl")
    if not os.path.exists(path):
        return []
    out = []
    for line in open(path):
        line = line.strip()
        if line:
            try:
                out.append(json.loads(line))
            except ValueError:
                pass
    return out

def losses(run_dir):
    return {r["step"]: r["loss"] for r in records(run_dir) if "loss" in r}

def compare(rows, layout, ranks, precision, run_dir, ref_dir, tol, after):
    # max over steps > after of |loss - ref| / |ref|
    run, ref = losses(run_dir), losses(ref_dir)
    steps = sorted(s for s in ref if s > after)
    note, status, worst = "", "FAIL", float("nan")
    if not steps:
        note = f"reference {ref_dir} has no loss records"
    elif any(s not in run for s in steps):
        have = sorted(run)
        note = f"loss records missing: has steps {have[:1]}..{have[-1:]} of {steps[0]}..{steps[-1]}"
    else:
        diffs = []
        for s in steps:
            a, b = run[s], ref[s]
            if a is None or b is None or not math.isfinite(a) or not math.isfinite(b):
                diffs.append((float("inf"), s))
            else:
                diffs.append((abs(a - b) / abs(b), s))
        worst, at = max(diffs)
        status = "PASS" if worst <= tol else "FAIL"
        note = (f"steps {steps[0]}-{steps[-1]}, worst at {at}; loss {ref[steps[0]]:.4f} -> {ref[steps[-1]]:.4f}"
                f" (this run {run[steps[-1]]:.4f})")
    row = dict(layout=layout, ranks=ranks, precision=precision, maxrel=worst, tol=tol, status=status, note=note)
    print(f"{status} {layout} ranks={ranks} {precision}: max rel diff {worst:.2e} (tol {tol:g}); {note}")
    rows.append(row)

def scaling(path, model, gpus, batch, seq, run_dir, warm):
    recs = [r for r in records(run_dir) if r.get("tokens_per_s") and r["step"] > warm]
    row = dict(model=model, gpus=gpus, batch=batch, seq=seq)
    if not recs:
        row["error"] = "no timed records"
    else:
        # equal tokens per interval: total tokens / total time = harmonic mean
        tps = len(recs) / sum(1.0 / r["tokens_per_s"] for r in recs)
        mfu = [r["mfu"] for r in recs if r.get("mfu") is not None]
        row.update(tokens_per_s=tps, ms_per_step=1e3 * batch * seq * gpus / tps,
                   mfu=sum(mfu) / len(mfu) if mfu else None, steps=f"{warm + 1}-{recs[-1]['step']}")
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")
    print("scaling:", json.dumps(row))

def table(rows_path, scaling_path, md_path, header):
    lines = [header, "", "## Correctness (loss curves vs the 1-rank DDP run of the same precision)", "",
             "| layout | ranks | precision | max rel diff | tolerance | result | note |", "|---|---|---|---|---|---|---|"]
    rows = [json.loads(l) for l in open(rows_path)] if os.path.exists(rows_path) else []
    for r in rows:
        diff = "" if r["maxrel"] is None or (isinstance(r["maxrel"], float) and math.isnan(r["maxrel"])) else f"{r['maxrel']:.2e}"
        tol = "" if r["tol"] is None else f"{r['tol']:g}"
        lines.append(f"| {r['layout']} | {r['ranks']} | {r['precision']} | {diff} | {tol} | {r['status']} | {r['note']} |")
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in ("PASS", "FAIL", "SKIP")}
    lines += ["", f"{counts['PASS']} PASS, {counts['FAIL']} FAIL, {counts['SKIP']} SKIP", ""]
    lines += ["## DDP weak scaling (bf16, HybridAdam; tokens/s over the timed steps)", "",
              "| model | GPUs | batch/GPU x seq | tokens/s total | tokens/s per GPU | ms/step | MFU | efficiency vs 1 GPU | timed steps |",
              "|---|---|---|---|---|---|---|---|---|"]
    srows = [json.loads(l) for l in open(scaling_path)] if os.path.exists(scaling_path) else []
    base = {}
    for s in srows:
        if s["gpus"] == 1 and "tokens_per_s" in s:
            base[s["model"]] = s["tokens_per_s"]
    for s in srows:
        if "tokens_per_s" not in s:
            lines.append(f"| {s['model']} | {s['gpus']} | {s['batch']} x {s['seq']} | {s.get('error', '')} | | | | | |")
            continue
        per = s["tokens_per_s"] / s["gpus"]
        eff = f"{per / base[s['model']]:.1%}" if s["model"] in base else ""
        mfu = f"{s['mfu']:.1%}" if s.get("mfu") is not None else ""
        lines.append(f"| {s['model']} | {s['gpus']} | {s['batch']} x {s['seq']} | {s['tokens_per_s']:,.0f} | {per:,.0f} | "
                     f"{s['ms_per_step']:.1f} | {mfu} | {eff} | {s['steps']} |")
    text = "\n".join(lines) + "\n"
    open(md_path, "w").write(text)
    print(text)
    return 1 if counts["FAIL"] else 0

if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "compare":
        rows_path, layout, ranks, precision, run_dir, ref_dir, tol, after = args
        rows = []
        compare(rows, layout, int(ranks), precision, run_dir, ref_dir, float(tol), int(after))
        open(rows_path, "a").write(json.dumps(rows[0]) + "\n")
    elif cmd == "row":  # a SKIP/FAIL without a curve
        rows_path, layout, ranks, precision, status, note = args
        open(rows_path, "a").write(json.dumps(dict(layout=layout, ranks=int(ranks), precision=precision,
                                                   maxrel=None, tol=None, status=status, note=note)) + "\n")
    elif cmd == "scaling":
        path, model, gpus, batch, seq, run_dir, warm = args
        scaling(path, model, int(gpus), int(batch), int(seq), run_dir, int(warm))
    elif cmd == "table":
        sys.exit(table(*args))
PY
rows=$work/rows.jsonl
report() { python3 "$work/report.py" "$@"; }

# --- base configs (every key that matters is stated; runs override the rest) ---
write_config() {  # FILE MODEL-SECTION BATCH SEQ BYTES CACHE
  cat > "$1" <<EOF
$2

[data]
source = "builtin"
tokenizer = "byte"
builtin_bytes = $5
seq_len = $4
batch_size = $3
eval_fraction = 0.02
cache_dir = "$6"

[optimizer]
name = "adamw"
lr = 1e-3
weight_decay = 0.1
beta1 = 0.9
beta2 = 0.95

[lr_scheduler]
name = "cosine"
warmup_steps = 5
min_lr_ratio = 0.1

[plugin]
name = "ddp"

[train]
steps = $STEPS
seed = 42
log_every = 1
eval_every = 0
eval_batches = 0
save_every = 0
keep_last = 3
async_save = false
tensorboard = false
sample_tokens = 0
EOF
}
write_config "$work/gpt2.toml" "[model]
preset = \"gpt2-tiny\"
init_seed = 0

[model.config]
n_embd = $H
n_head = $HEADS
n_layer = $L
n_positions = $T" "$G" "$T" "$BYTES" "$work/data"
write_config "$work/llama.toml" "[model]
preset = \"llama-tiny\"
init_seed = 0

[model.config]
hidden_size = $H
num_attention_heads = $HEADS
num_key_value_heads = $KV
intermediate_size = $(( 2 * H ))
num_hidden_layers = $L
max_position_embeddings = $T" "$G" "$T" "$BYTES" "$work/data"

# One `colossus train` on RANKS ranks into $work/ID (log $work/ID.log); 0 if it
# finished. A run that would start past DEADLINE is not started (rc 200).
run_train() {  # ID RANKS LIMIT DEADLINE CONFIG ARGS...
  local id=$1 n=$2 limit=$3 deadline=$4 config=$5
  shift 5
  if (( $(elapsed) >= deadline )); then return 200; fi
  rm -rf "${work:?}/$id"
  local start=$(date +%s)
  timeout -k 10 "$limit" "$bin" run -n "$n" --backend "$backend" --exit_timeout 30 \
    "$bin" train "$config" --train.output_dir="$work/$id" "$@" > "$work/$id.log" 2>&1
  local rc=$?
  echo "  [$(elapsed) s] $id: $n rank(s), $(( $(date +%s) - start )) s, exit $rc"
  return $rc
}

# The first error line of a run's log (for the table), and its tail (for run.log).
error_of() {
  local msg
  msg=$(grep -m1 -E "error:|Error|what\(\)|terminate|killed by|signal" "$work/$1.log" | cut -c1-300 | tr '|' '/')
  [[ $2 == 124 || $2 == 137 ]] && msg="timed out after its limit; ${msg}"
  echo "${msg:-exit $2}"
}
show_failure() {
  echo "  --- $1.log (last lines) ---"
  grep -v -E "^\s*$" "$work/$1.log" | tail -12 | cut -c1-400 | sed 's/^/  | /'
}

# Runs one case and records its row: compared with REF from step AFTER on, or
# SKIP/FAIL. SKIPPABLE=1: a run refused with an error about ZeRO is SKIP (its message).
case_run() {  # LABEL PRECISION RANKS ID REF AFTER TOL DEADLINE SKIPPABLE CONFIG ARGS...
  local label=$1 precision=$2 n=$3 id=$4 ref=$5 after=$6 tol=$7 deadline=$8 skippable=$9 config=${10}
  shift 10
  run_train "$id" "$n" "$RUN_LIMIT" "$deadline" "$config" "$@"
  local rc=$?
  if (( rc == 200 )); then
    report row "$rows" "$label" "$n" "$precision" SKIP "time budget (${budget} s) spent before this run"
    echo "SKIP $label ranks=$n $precision: time budget"
    return 1
  elif (( rc != 0 )); then
    local msg
    msg=$(error_of "$id" $rc)
    # Only a refusal naming ZeRO/zero_stage (a composition not built yet) is a SKIP.
    if [[ $skippable == 1 && $rc == 1 ]] && grep "colossus: error:" "$work/$id.log" | grep -qi "zero"; then
      report row "$rows" "$label" "$n" "$precision" SKIP "refused: $msg"
      echo "SKIP $label ranks=$n $precision: $msg"
    else
      report row "$rows" "$label" "$n" "$precision" FAIL "$msg"
      echo "FAIL $label ranks=$n $precision: $msg"
      show_failure "$id"
    fi
    return 1
  fi
  report compare "$rows" "$label" "$n" "$precision" "$work/$id" "$work/$ref" "$tol" "$after"
}
skip_row() {  # LABEL RANKS PRECISION REASON
  report row "$rows" "$1" "$2" "$3" SKIP "$4"
  echo "SKIP $1 ranks=$2 $3: $4"
}

# Layouts for N ranks: "id|label|ranks|batch|accum|skippable|skip reason|overrides" (batch per rank per
# microbatch; the global batch G is the same in all).
layouts() {
  local dp=$N hp="--plugin.name=hybrid_parallel"
  local sp="$hp --plugin.enable_sequence_parallelism=true"
  local pp_reason="" half=$(( N / 2 ))
  (( N >= 2 )) || pp_reason="needs 2+ ranks (pp_size = 1 is no pipeline)"
  (( N > 1 )) && echo "ddp|ddp dp=$N|$N|$(( G / dp ))|1|0||--plugin.name=ddp"
  echo "zero1|low_level_zero stage 1 dp=$N|$N|$(( G / dp ))|1|0||--plugin.name=low_level_zero --plugin.stage=1"
  echo "zero2|low_level_zero stage 2 dp=$N|$N|$(( G / dp ))|1|0||--plugin.name=low_level_zero --plugin.stage=2"
  echo "gemini|gemini static dp=$N|$N|$(( G / dp ))|1|0||--plugin.name=gemini --plugin.placement_policy=static --plugin.offload_optim_frac=0.0"
  echo "gemini_off|gemini static optim offload 1.0 dp=$N|$N|$(( G / dp ))|1|0||--plugin.name=gemini --plugin.placement_policy=static --plugin.offload_optim_frac=1.0"
  echo "tp|hybrid tp=$N|$N|$G|1|0||$hp --plugin.tp_size=$N"
  echo "sp_a2a|hybrid sp all_to_all sp=$N|$N|$G|1|0||$sp --plugin.sequence_parallelism_mode=all_to_all --plugin.sp_size=$N"
  echo "sp_ring|hybrid sp ring_attn sp=$N|$N|$G|1|0||$sp --plugin.sequence_parallelism_mode=ring_attn --plugin.sp_size=$N"
  local sg_reason=""
  (( N >= 2 )) || sg_reason="needs tp_size 2+ (shards over the tp group)"
  echo "sp_sg|hybrid sp split_gather tp=$N|$N|$G|1|0|$sg_reason|$sp --plugin.sequence_parallelism_mode=split_gather --plugin.tp_size=$N"
  local M=$N  # microbatches per step: at least the stages
  echo "pp_1f1b|hybrid pp=$N 1f1b, $M microbatches|$N|$(( G / M ))|$M|0|$pp_reason|$hp --plugin.pp_size=$N --plugin.pp_style=1f1b"
  echo "pp_inter|hybrid pp=$N interleaved 2 chunks, $M microbatches|$N|$(( G / M ))|$M|0|$pp_reason|$hp --plugin.pp_size=$N --plugin.pp_style=interleaved --plugin.num_model_chunks=2"
  echo "pp_zb|hybrid pp=$N zero_bubble, $M microbatches|$N|$(( G / M ))|$M|0|$pp_reason|$hp --plugin.pp_size=$N --plugin.pp_style=zero_bubble"
  if (( N >= 4 )); then
    echo "tp2pp|hybrid tp2 x pp$half 1f1b, $M microbatches|$N|$(( G / M ))|$M|0||$hp --plugin.tp_size=2 --plugin.pp_size=$half --plugin.pp_style=1f1b"
  else
    echo "tp2pp|hybrid tp2 x pp(N/2)|$N|1|1|0|needs 4+ ranks|"
  fi
  if (( N >= 2 )); then
    echo "zero1tp|hybrid zero_stage 1 dp$half x tp2|$N|$(( G / half ))|1|1||$hp --plugin.tp_size=2 --plugin.zero_stage=1"
  else  # world size 1: the hybrid plugin's ZeRO path at dp1 x tp1
    echo "zero1tp|hybrid zero_stage 1 dp1 x tp1|$N|$G|1|1||$hp --plugin.tp_size=1 --plugin.zero_stage=1"
  fi
  if (( N == 8 )); then
    echo "zero1tppp|hybrid zero_stage 1 dp2 x tp2 x pp2 1f1b, 2 microbatches|$N|$(( G / 4 ))|2|1||$hp --plugin.tp_size=2 --plugin.pp_size=2 --plugin.pp_style=1f1b --plugin.zero_stage=1"
  else
    echo "zero1tppp|hybrid zero_stage 1 dp2 x tp2 x pp2|$N|1|1|1|needs 8 ranks|"
  fi
}

# The precision flags of a layout: DDP's through the booster, the others' through the plugin (they own it).
precision_args() {  # OVERRIDES PRECISION
  if [[ $1 == *--plugin.name=ddp* ]]; then
    echo "--booster.mixed_precision=$2 --booster.max_norm=1.0"
  else
    echo "--plugin.precision=$2 --plugin.max_norm=1.0"
  fi
}

# Tolerances on the per-step loss, relative to the 1-rank run of the same precision:
# fp32 1e-4: the layouts compute the same sums in another order (NCCL ring/tree all-reduce,
#   reduce-scatter of ZeRO buckets, tp partial sums, pp microbatch accumulation, ring-attention's
#   online softmax), each step's loss differs by ~1e-7 relative and 50 AdamW steps grow that to
#   ~1e-6..1e-5; 1e-4 leaves a margin while a wrong scale (a missed 1/dp, a dropped microbatch,
#   a stale shard) moves the loss by 1e-2 or more.
# bf16 2e-2: bf16 keeps 8 mantissa bits (relative rounding 4e-3); the layouts round at different
#   points (tp partial sums, sp chunks, ZeRO's bf16 gradient buckets), so the parameters take
#   slightly different paths and the loss curves differ by a few 1e-3, growing over 50 steps;
#   2e-2 is a few bf16 ulps of loss, still far below the 1e-1 a real bug gives.
tol_of() { [[ $1 == fp32 ]] && echo 1e-4 || echo 2e-2; }

correctness() {  # MODEL(gpt2|llama) DEADLINE FILTER(regex of ids; empty: all) PRECISIONS...
  local model=$1 deadline=$2 filter=$3
  shift 3
  local config=$work/$model.toml precision
  for precision in "$@"; do
    local tol=$(tol_of "$precision") ref=${model}_${precision}_ref
    stamp "correctness: $model $precision (tolerance $tol)"
    local ref_extra=()
    [[ $model == gpt2 && $precision == fp32 ]] && ref_extra=(--train.save_every=$HALF)
    if ! run_train "$ref" 1 "$RUN_LIMIT" "$deadline" "$config" --plugin.name=ddp \
         $(precision_args --plugin.name=ddp "$precision") --data.batch_size=$G --train.grad_accum=1 "${ref_extra[@]}"; then
      local msg="time budget"
      [[ -f $work/$ref.log ]] && { msg="reference run failed: $(error_of "$ref" 1)"; show_failure "$ref"; }
      report row "$rows" "$model ddp x1 (reference)" 1 "$precision" FAIL "$msg"
      continue
    fi
    report compare "$rows" "$model ddp x1 (reference, vs itself)" 1 "$precision" "$work/$ref" "$work/$ref" "$tol" 0 > /dev/null
    local line id label n batch accum skippable reason overrides
    while IFS='|' read -r id label n batch accum skippable reason overrides; do
      [[ -n $filter && ! $id =~ ^($filter)$ ]] && continue
      label="$model $label"
      if [[ -n $reason ]]; then skip_row "$label" "$n" "$precision" "$reason"; continue; fi
      local extra=()
      # Checkpoints for the layout-change cases (fp32 GPT-2): tp=N and pp=N 1f1b save at step HALF.
      [[ $model == gpt2 && $precision == fp32 && ( $id == tp || $id == pp_1f1b ) ]] && extra=(--train.save_every=$HALF)
      # shellcheck disable=SC2086
      case_run "$label" "$precision" "$n" "${model}_${precision}_$id" "$ref" 0 "$tol" "$deadline" "$skippable" \
        "$config" $overrides $(precision_args "$overrides" "$precision") --data.batch_size=$batch \
        --train.grad_accum=$accum "${extra[@]}"
    done < <(layouts)
  done
}

checkpoints() {  # DEADLINE
  local deadline=$1 config=$work/gpt2.toml tol=1e-4
  local step_dir=checkpoints/step-$(printf %08d "$HALF")
  stamp "checkpoints across layouts (fp32, saved at step $HALF)"
  local ddp1=(--plugin.name=ddp --booster.max_norm=1.0)
  # Full resume, N ranks -> 1 rank, same data layout.
  if [[ -d $work/gpt2_fp32_tp/$step_dir ]]; then
    case_run "ckpt: tp=$N step $HALF -> ddp x1 --resume" fp32 1 ckpt_tp_to_ddp gpt2_fp32_ref "$HALF" "$tol" \
      "$deadline" 0 "$config" "${ddp1[@]}" --data.batch_size=$G --train.grad_accum=1 \
      --resume "$work/gpt2_fp32_tp/$step_dir"
  else
    report row "$rows" "ckpt: tp=$N -> ddp x1 --resume" 1 fp32 FAIL "no $step_dir from the tp=$N run"
  fi
  if (( N >= 2 )); then
    if [[ -d $work/gpt2_fp32_pp_1f1b/$step_dir ]]; then
      case_run "ckpt: pp=$N 1f1b step $HALF -> ddp x1 grad_accum $N --resume" fp32 1 ckpt_pp_to_ddp gpt2_fp32_ref \
        "$HALF" "$tol" "$deadline" 0 "$config" "${ddp1[@]}" --data.batch_size=$(( G / N )) --train.grad_accum=$N \
        --resume "$work/gpt2_fp32_pp_1f1b/$step_dir"
    else
      report row "$rows" "ckpt: pp=$N -> ddp x1 --resume" 1 fp32 FAIL "no $step_dir from the pp=$N run"
    fi
  else
    skip_row "ckpt: pp=N -> ddp x1 --resume" 1 fp32 "needs 2+ ranks"
  fi
  # Weights only, 1 rank -> N ranks (a resume needs every rank's RNG state and the same dp).
  local pretrained=$work/gpt2_fp32_ref/$step_dir/model
  if [[ -d $pretrained ]]; then
    local fresh=(--model.pretrained="$pretrained" --train.steps=10 --lr_scheduler.total_steps=10)
    if run_train ckpt_w_ddp 1 "$RUN_LIMIT" "$deadline" "$config" "${ddp1[@]}" --data.batch_size=$G "${fresh[@]}"; then
      case_run "ckpt: ddp x1 step $HALF weights -> tp=$N (model.pretrained)" fp32 "$N" ckpt_w_tp ckpt_w_ddp 0 "$tol" \
        "$deadline" 0 "$config" --plugin.name=hybrid_parallel --plugin.tp_size=$N --plugin.max_norm=1.0 \
        --data.batch_size=$G "${fresh[@]}"
    else
      report row "$rows" "ckpt: ddp x1 weights -> tp=$N (model.pretrained)" "$N" fp32 FAIL \
        "the 1-rank run from the weights failed: $(error_of ckpt_w_ddp 1)"
      show_failure ckpt_w_ddp
    fi
  else
    report row "$rows" "ckpt: ddp x1 weights -> tp=$N (model.pretrained)" "$N" fp32 FAIL "no $pretrained"
  fi
}

scaling_part() {  # DEADLINE
  local deadline=$1 spec model batch seq n
  for spec in "${SCALE[@]}"; do
    IFS=: read -r model batch seq <<< "$spec"
    for n in 1 2 4 8; do
      (( n <= N )) || break
      stamp "scaling: $model on $n rank(s), batch $batch x $seq per rank"
      local id=scale_${model}_$n
      write_config "$work/scale_$model.toml" "[model]
preset = \"$model\"
init_seed = 0" "$batch" "$seq" "$SCALE_BYTES" "$work/data_scale"
      if run_train "$id" "$n" "$SCALE_LIMIT" "$deadline" "$work/scale_$model.toml" --booster.mixed_precision=bf16 \
           --optimizer.name=hybrid_adam --optimizer.lr=3e-4 --train.steps=$SCALE_STEPS --train.log_every=$SCALE_LOG \
           --train.keep_last=1; then
        report scaling "$work/scaling.jsonl" "$model" "$n" "$batch" "$seq" "$work/$id" "$SCALE_LOG"
      else
        local rc=$?
        local why="time budget"
        (( rc != 200 )) && { why=$(error_of "$id" $rc); show_failure "$id"; }
        echo "{\"model\": \"$model\", \"gpus\": $n, \"batch\": $batch, \"seq\": $seq, \"error\": \"$(echo "$why" | tr -d '"\\' | cut -c1-200)\"}" \
          >> "$work/scaling.jsonl"
      fi
      rm -rf "${work:?}/$id"  # its final checkpoint: up to 13 GB for llama-1b-like
    done
  done
}

# Scaling runs reserved out of the budget (~20 s each on GPUs: start, 25 steps, the final save).
n_scale=0
for n in 1 2 4 8; do (( n <= N )) && n_scale=$(( n_scale + ${#SCALE[@]} )); done
reserve=$(( n_scale * 20 ))
[[ $device == cpu || $only == correctness ]] && reserve=0
if [[ $only != scaling ]]; then
  # fp32 first: the checkpoint cases continue its runs.
  correctness gpt2 $(( budget - reserve )) "" fp32
  checkpoints $(( budget - reserve ))
  correctness gpt2 $(( budget - reserve )) "" bf16
fi
[[ $only != correctness ]] && scaling_part "$budget"
if [[ $only != scaling ]]; then
  correctness llama "$budget" "ddp|zero2|tp|sp_a2a|sp_ring|pp_1f1b" fp32 bf16
fi

stamp "report"
header="# Multi-GPU correctness and scaling (scripts/device_multi_gpu.sh)

$machine; $N rank(s) over $backend; commit $commit; $(date -u '+%Y-%m-%d %H:%M UTC'); $(( $(date +%s) - t0 )) s.
Correctness model: GPT-2 $L layers x $H ($HEADS heads) and LLaMA $L layers x $H ($HEADS/$KV heads), T=$T, global batch $G, $STEPS steps, same seed."
report table "$rows" "$work/scaling.jsonl" "$out/multi_gpu.md" "$header"
