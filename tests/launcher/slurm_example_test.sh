#!/usr/bin/env bash
# examples/slurm/train.sbatch under a stand-in SLURM: fake `scontrol` and
# `srun` on PATH (srun runs its command once per node with SLURM_NODEID set,
# or once per task for LAUNCH=srun) and COLOSSUS=echo, so the test sees the
# exact command each node would run.
set -euo pipefail
repo=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir "$work/bin"
cat > "$work/bin/scontrol" <<'SH'
#!/usr/bin/env bash
[[ "$*" == "show hostnames node-[a-b]" ]] || { echo "unexpected scontrol $*" >&2; exit 1; }
printf 'node-a\nnode-b\n'
SH
cat > "$work/bin/srun" <<'SH'
#!/usr/bin/env bash
per_node=0
while [[ $1 == --* ]]; do [[ $1 == --ntasks-per-node=1 ]] && per_node=1; shift; done
if (( per_node )); then
  for node in 0 1; do SLURM_NODEID=$node "$@"; done
else
  for task in 0 1 2 3; do SLURM_PROCID=$task "$@" | sed "s/^/task $task: MASTER=$MASTER_ADDR:$MASTER_PORT /"; done
fi
SH
chmod +x "$work/bin/"*
export PATH="$work/bin:$PATH" SLURM_JOB_NODELIST="node-[a-b]" SLURM_NNODES=2 SLURM_GPUS_PER_NODE=h100:2 COLOSSUS=echo
out=$(bash "$repo/examples/slurm/train.sbatch" cfg.toml --resume)
echo "$out"
for node in 0 1; do
  grep -qx "run --nproc-per-node 2 --nnodes 2 --node-rank $node --rdzv-endpoint node-a:29500 echo train cfg.toml --resume" \
    <<< "$out" || { echo "FAIL: no command for node $node"; exit 1; }
done
out=$(LAUNCH=srun MASTER_PORT=6000 bash "$repo/examples/slurm/train.sbatch" cfg.toml)
echo "$out"
[[ $(grep -c "MASTER=node-a:6000 train cfg.toml" <<< "$out") == 4 ]] || { echo "FAIL: LAUNCH=srun"; exit 1; }
if LAUNCH=bogus bash "$repo/examples/slurm/train.sbatch" cfg.toml 2> "$work/err"; then echo "FAIL: bogus LAUNCH ran"; exit 1; fi
grep -q "not one of" "$work/err"
echo PASS
