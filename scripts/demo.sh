#!/usr/bin/env bash
# The main demo: check the installation, then a 4-rank collective job through
# `colossus run`. (The trainer demo takes this place once `colossus train` lands.)
set -euo pipefail
build=${1:-build}
bin="$build/bin"
echo "== colossus check"
"$bin/colossus" check
echo
echo "== colossus run --nproc_per_node 4 collectives_demo"
"$bin/colossus" run --nproc_per_node 4 "$bin/collectives_demo"
