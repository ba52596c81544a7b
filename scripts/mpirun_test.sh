#!/usr/bin/env bash
# Runs a test binary on N CPU ranks under OpenMPI (used by CTest). Flags: run
# as root in CI, oversubscribe the 2 cores, no core binding, and shared-memory
# transport without CMA (often blocked in containers).
set -euo pipefail
n=$1; shift
exec mpirun -np "$n" --oversubscribe --bind-to none --allow-run-as-root \
  --mca btl self,vader --mca btl_vader_single_copy_mechanism none \
  --mca mpi_yield_when_idle 1 -x OMP_NUM_THREADS=1 "$@"
