#!/usr/bin/env bash
# The installed package as an outside project sees it (CTest: package_install):
# installs this build into a scratch prefix, checks the exported targets carry
# none of our warning flags, builds examples/cpp against the prefix with its
# own CMake configure (no library is rebuilt) and runs it on 2 MPI ranks with
# the installed `colossus run`, expecting exit 0, a loss per step and a last
# loss below the first.
# Usage: package_test.sh BUILD_DIR SOURCE_DIR WORK_DIR TORCH_PREFIX CXX_COMPILER [CCACHE]
set -euo pipefail
build=$1 source=$2 work=$3 torch_prefix=$4 cxx=$5 ccache=${6:-}
steps=10
fail() { echo "package_install: $*" >&2; exit 1; }

# What the package installs must be built; after `make build` this is a no-op.
cmake --build "$build" --target colossus_package_contents

rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
cmake --install "$build" --prefix "$prefix" > "$work/install.log" || { cat "$work/install.log"; fail "cmake --install failed"; }
for f in bin/colossus include/colossus/booster/booster.h include/colossus/models/config.h \
         lib/libcolossus_booster.a lib/cmake/Colossus/ColossusConfig.cmake lib/cmake/Colossus/ColossusConfigVersion.cmake; do
  [ -e "$prefix/$f" ] || fail "the install lacks $f"
done
# Our warnings and -Werror stay ours: nothing exported may carry them.
if grep -n -E -- '-Werror|-Wall|-Wextra|-fopenmp-simd|INTERFACE_COMPILE_OPTIONS' "$prefix"/lib/cmake/Colossus/*.cmake; then
  fail "the exported targets carry Colossus's own compile options (above)"
fi

launcher=()
[ -n "$ccache" ] && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER="$ccache")
start=$(date +%s)
CCACHE_BASEDIR=$work CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime,time_macros \
  cmake -S "$source/examples/cpp" -B "$work/example" -G Ninja -DCMAKE_CXX_COMPILER="$cxx" \
  -DCMAKE_PREFIX_PATH="$prefix;$torch_prefix" "${launcher[@]}" > "$work/configure.log" 2>&1 \
  || { cat "$work/configure.log"; fail "configuring examples/cpp against the prefix failed"; }
CCACHE_BASEDIR=$work CCACHE_SLOPPINESS=include_file_mtime,include_file_ctime,time_macros \
  cmake --build "$work/example" || fail "building examples/cpp against the prefix failed"
echo "package_install: example configured and built in $(( $(date +%s) - start )) s"

# The installed binary launches the example: 2 ranks over MPI on the CPU.
cd "$work"
status=0
"$prefix/bin/colossus" run -n 2 "$work/example/tiny_trainer" "$work/data" "$steps" > "$work/run.log" 2>&1 || status=$?
cat "$work/run.log"
[ "$status" = 0 ] || fail "the example exited with $status"
losses=$(grep -c -E "step [0-9]+/$steps loss [0-9]+\.[0-9]+" "$work/run.log" || true)
[ "$losses" = "$steps" ] || fail "expected $steps loss lines from rank 0, found $losses"
# Training did something: the last step's loss is below the first's.
first=$(grep -o -E "step 1/$steps loss [0-9.]+" "$work/run.log" | awk '{print $NF}')
last=$(grep -o -E "step $steps/$steps loss [0-9.]+" "$work/run.log" | awk '{print $NF}')
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a) }' || fail "the loss did not fall: $first -> $last"
echo "package_install: ok"
