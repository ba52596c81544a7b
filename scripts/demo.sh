#!/usr/bin/env bash
# The main demo: a small GPT-2 learns the built-in corpus data-parallel on 4
# CPU ranks (DDP through `colossus run`), evaluates, checkpoints, and then
# `colossus generate` continues a prompt from the saved checkpoint.
set -euo pipefail
build=${1:-build}
bin="$build/bin"
run_dir=${DEMO_RUN_DIR:-runs/demo}
rm -rf "$run_dir"
echo "== colossus run -n 4 colossus train examples/configs/gpt2_demo.toml"
"$bin/colossus" run -n 4 "$bin/colossus" train examples/configs/gpt2_demo.toml --train.output_dir="$run_dir"
echo
echo "== colossus generate $run_dir --prompt 'Once upon a time'"
"$bin/colossus" generate "$run_dir" --prompt "Once upon a time" --max_new_tokens 200 --temperature 0.6 --top_k 20
echo
echo "== what the run left in $run_dir"
echo "metrics.jsonl (one JSON object per logged step), tensorboard/ (tensorboard --logdir $run_dir/tensorboard),"
echo "loss.svg (train/eval loss curve), checkpoints/latest -> $(cat "$run_dir/checkpoints/latest")"
echo "(Hugging Face layout: transformers' from_pretrained(\"$run_dir/checkpoints/$(cat "$run_dir/checkpoints/latest")/model\") loads it)"
