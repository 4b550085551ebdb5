#!/usr/bin/env bash
# Checks that README.md shows this workspace as it is, builds it (weft comes in through
# local_repository) and runs the README's first program twice: with `bazel run` and straight from
# bazel-bin/, with no runfiles variable set. On the GPU when a CUDA driver is installed, else on
# weft's simulator. CI runs it to prove that weft builds and works as an external repository.
#   examples/consumer/run.sh          BAZEL="bazel --output_base=/tmp/ob" examples/consumer/run.sh
set -euo pipefail
cd "$(dirname "$0")"
bazel=(${BAZEL:-bazel})

# The body of the $2-th fenced code block of README.md's section "## $1".
readme_block() {
  awk -v section="## $1" -v want="$2" '
    /^```/ { if (fence) { fence = 0; if (in_section && n == want) exit } else { fence = 1; if (in_section) n++ } next }
    !fence && /^## / { in_section = ($0 == section); next }
    fence && in_section && n == want { print }
  ' ../../README.md
}
stale=0
for check in "A first program|1|app.c" "A first program|2|my_kernels.cu" \
  "Using weft from Bazel|2|BUILD" "Using weft from Bazel|3|.bazelrc"; do
  IFS='|' read -r section n file <<< "$check"
  if ! diff -u --label "README.md (## $section, code block $n)" --label "examples/consumer/$file" \
    <(readme_block "$section" "$n") "$file"; then
    echo "consumer: README.md's section '$section' (code block $n) is not examples/consumer/$file" >&2
    stale=1
  fi
done
[ "$stale" -eq 0 ] || exit 1
echo "consumer: README.md shows app.c, my_kernels.cu, BUILD and .bazelrc as they are"

# No bazel-* links here: they would sit inside weft's own workspace, whose `//...` walks into them.
# app.c builds with -Werror (BUILD): a status left unchecked fails the build.
"${bazel[@]}" build --symlink_prefix=/ //...
bin="$("${bazel[@]}" info bazel-bin 2>/dev/null)"
if [ -z "${WEFT_DRIVER:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libcuda.so.1 '; then
  echo "consumer: no CUDA driver on this machine: running on the simulator (WEFT_DRIVER=sim)"
  export WEFT_DRIVER=sim
fi
# weft finds libweft_sim.so (the program's data) in the program's own runfiles tree: no variable
# names it, under `bazel run` or from bazel-bin/.
unset RUNFILES_DIR RUNFILES_MANIFEST_FILE TEST_SRCDIR
echo "consumer: bazel run //:app"
"${bazel[@]}" run --symlink_prefix=/ //:app
echo "consumer: $bin/app (from /)"
(cd / && "$bin/app")
