#!/usr/bin/env bash
# Tests bench/results.py ($1) on a fabricated CSV whose medians and ratios are known exactly:
# goals met and not met, min–max ranges, a repeated line (the first is kept), a baseline with
# other rep numbers (paired in rep order), one with fewer reps (ratio of the medians), a missing
# baseline, a curve, merging two CSVs, meta.txt, and a CSV with the wrong header (refused).
# Passes with or without gnuplot: with it, a PNG must be written; without, the note is checked.
set -euo pipefail
script="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
py=python3
fail() { echo "test_results: $*" >&2; exit 1; }
# has FILE TEXT: FILE holds TEXT as a fixed string (shows the file when not).
has() { grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "$1 lacks: $2"; }; }
lacks() { ! grep -qF -- "$2" "$1" || { cat "$1" >&2; fail "$1 should not hold: $2"; }; }

mkdir -p "$tmp/run" "$tmp/merge" "$tmp/sim" "$tmp/bad"
cat > "$tmp/run/bench.csv" <<'EOF'
section,row,metric,unit,baseline,x,rep,value,machine
alloc,"weft_alloc + weft_free, same size",ns per pair,ns,"PyTorch caching allocator, same size",,0,400,gpu
alloc,"PyTorch caching allocator, same size",ns per pair,ns,,,0,1000,gpu
alloc,"PyTorch caching allocator, same size",ns per pair,ns,,,0,9999,gpu
alloc,"weft_alloc + weft_free, same size",ns per pair,ns,"PyTorch caching allocator, same size",,1,450,gpu
alloc,"PyTorch caching allocator, same size",ns per pair,ns,,,1,1000,gpu
alloc,"weft_alloc + weft_free, same size",ns per pair,ns,"PyTorch caching allocator, same size",,2,500,gpu
alloc,"PyTorch caching allocator, same size",ns per pair,ns,,,2,1000,gpu
alloc,"weft_alloc + weft_free, same size",ns per pair,ns,"PyTorch caching allocator, same size",,3,550,gpu
alloc,"PyTorch caching allocator, same size",ns per pair,ns,,,3,1000,gpu
alloc,"weft_alloc + weft_free, same size",ns per pair,ns,"PyTorch caching allocator, same size",,4,600,gpu
alloc,"PyTorch caching allocator, same size",ns per pair,ns,,,4,1000,gpu
alloc,"weft_alloc + weft_free, mixed sizes",ns per pair,ns,"PyTorch caching allocator, mixed sizes",,0,300,gpu
alloc,"PyTorch caching allocator, mixed sizes",ns per pair,ns,,,0,1000,gpu
alloc,"weft_alloc + weft_free, mixed sizes",ns per pair,ns,"PyTorch caching allocator, mixed sizes",,1,350,gpu
alloc,"PyTorch caching allocator, mixed sizes",ns per pair,ns,,,1,1000,gpu
alloc,"weft_alloc + weft_free, mixed sizes",ns per pair,ns,"PyTorch caching allocator, mixed sizes",,2,400,gpu
alloc,"PyTorch caching allocator, mixed sizes",ns per pair,ns,,,2,1000,gpu
alloc,"pool resource, same size",ns per pair,ns,,,0,50,gpu
alloc,"pool resource, same size",ns per pair,ns,,,1,55,gpu
alloc,"pool resource, same size",ns per pair,ns,,,2,60,gpu
alloc,"pool resource, same size",ns per pair,ns,,,3,52,gpu
alloc,"pool resource, same size",ns per pair,ns,,,4,58,gpu
tracker,"no edge, 1 access",ns per use,ns,raw cuEventRecord,,0,120,gpu
tracker,raw cuEventRecord,ns per use,ns,,,0,100,gpu
tracker,"no edge, 4 accesses",ns per use,ns,raw cuEventRecord,,0,140,gpu
tracker,raw cuEventRecord,ns per use,ns,,,0,777,gpu
tracker,"no edge, 1 access",ns per use,ns,raw cuEventRecord,,1,130,gpu
tracker,raw cuEventRecord,ns per use,ns,,,1,100,gpu
tracker,"no edge, 4 accesses",ns per use,ns,raw cuEventRecord,,1,150,gpu
tracker,"no edge, 1 access",ns per use,ns,raw cuEventRecord,,2,125,gpu
tracker,raw cuEventRecord,ns per use,ns,,,2,100,gpu
tracker,"no edge, 4 accesses",ns per use,ns,raw cuEventRecord,,2,145,gpu
tracker,"one edge (2 streams)",ns per use,ns,raw cuStreamWaitEvent + cuEventRecord,,0,500,gpu
tracker,"one edge (2 streams)",ns per use,ns,raw cuStreamWaitEvent + cuEventRecord,,1,510,gpu
replay,weft replay,us per step,us,raw graph,,0,99,gpu
replay,weft replay,us per step,us,raw graph,,1,100.5,gpu
replay,weft replay,us per step,us,raw graph,,2,102,gpu
replay,raw graph,us per step,us,,,10,100,gpu
replay,raw graph,us per step,us,,,11,100,gpu
replay,raw graph,us per step,us,,,12,100,gpu
pipeline,"weft, automatic waits",us per chunk,us,hand-placed events,,0,90,gpu
pipeline,"weft, automatic waits",us per chunk,us,hand-placed events,,1,92,gpu
pipeline,"weft, automatic waits",us per chunk,us,hand-placed events,,2,94,gpu
pipeline,"weft, automatic waits",us per chunk,us,hand-placed events,,3,96,gpu
pipeline,hand-placed events,us per chunk,us,,,5,100,gpu
pipeline,hand-placed events,us per chunk,us,,,6,100,gpu
pipeline,hand-placed events,us per chunk,us,,,7,100,gpu
EOF
# A curve: x spans 1 to 1000 (log scale), two rows, three reps.
for x in 1 10 1000; do
  case $x in 1) w=10 r=5 ;; 10) w=20 r=10 ;; 1000) w=40 r=20 ;; esac
  for rep in 0 1 2; do
    echo "curve_streams,weft,ns per use,ns,raw,$x,$rep,$((w + rep)),gpu"
    echo "curve_streams,raw,ns per use,ns,,$x,$rep,$r,gpu"
  done
done >> "$tmp/run/bench.csv"

# ---- one CSV, explicit card/driver/commit/date, with gnuplot if there is one ---------------------
out="$tmp/run/RESULTS.md"
"$py" "$script" --csv "$tmp/run/bench.csv" --card "Test Card 80GB" --driver 123.45 --commit abc1234 \
  --date 2026-11-26 --command "fabricated" --out "$out" --img "$tmp/run/img"
has "$out" "Generated by \`bench/results.py\` from \`$tmp/run/bench.csv\`"
has "$out" "do not edit by hand"
has "$out" "- card: **Test Card 80GB**"
has "$out" "- driver: 123.45"
has "$out" "- commit: abc1234"
has "$out" "- date: 2026-11-26"
has "$out" "- command: \`fabricated\`"
has "$out" "- machine: gpu"
lacks "$out" "not performance numbers"
# Goals: ratio median 0.5 of 0.4..0.6 against 1/3: not met; 0.35 of 0.3..0.4 against 1/2: met.
has "$out" "## Goals"
has "$out" "same size: \`weft_alloc + weft_free, same size\` | 0.500 | 0.400–0.600 | **not met** |"
has "$out" "mixed sizes: \`weft_alloc + weft_free, mixed sizes\` | 0.350 | 0.300–0.400 | met |"
# value<=: median of 50,52,55,58,60 is 55 <= 60. diff<=: 20,30,25 over 100 (the repeated rep-0
# baseline line, 777, is ignored) -> 25 <= 30 met; 40,50,45 -> 45 not met.
has "$out" "\`pool resource, same size\` | 55 ns | 50 ns–60 ns | met |"
has "$out" "\`no edge, 1 access\` | 25 ns | 20 ns–30 ns | met |"
has "$out" "\`no edge, 4 accesses\` | 45 ns | 40 ns–50 ns | **not met** |"
# Baseline reps 10..12 for reps 0..2: paired in rep order; 99/100, 100.5/100, 102/100.
has "$out" "\`weft replay\` (reps paired in rep order) | 1.005 | 0.990–1.020 | met |"
# 4 reps against 3 of other numbers: median 93 / median 100.
has "$out" "\`weft, automatic waits\` (from the medians) | 0.930 | 0.930–0.930 | met |"
# The missing baseline, and goals with no series at all.
has "$out" "\`one edge (2 streams)\` (its baseline \`raw cuStreamWaitEvent + cuEventRecord\` is not in the CSV) |  |  | no data |"
has "$out" "weft_all_reduce: <= 1.02 x raw NCCL (issue 14) (no series in the CSV matches) |  |  | no data |"
# Section tables: median, baseline median (the repeated 9999 line is ignored), ratio min–max, n.
has "$out" "## Allocation: alloc + free pair, hot (\`alloc\`)"
has "$out" "| row | median | unit | baseline | baseline median | ratio median | ratio min–max | n samples |"
has "$out" "| \`weft_alloc + weft_free, same size\` | 500 | ns | \`PyTorch caching allocator, same size\` | 1000 | 0.500 | 0.400–0.600 | 5 |"
has "$out" "| \`PyTorch caching allocator, same size\` | 1000 | ns |  |  |  |  | 5 |"
has "$out" "| \`raw cuEventRecord\` | 100 | ns |  |  |  |  | 3 |"
has "$out" "| \`one edge (2 streams)\` | 505 | ns | \`raw cuStreamWaitEvent + cuEventRecord\` | (missing) [1] |"
has "$out" "[1] \`one edge (2 streams)\`: its baseline \`raw cuStreamWaitEvent + cuEventRecord\` is not in the CSV"
has "$out" "| \`weft replay\` | 100.5 | us | \`raw graph\` | 100 | 1.005 [1] | 0.990–1.020 | 3 |"
has "$out" "repetitions paired in rep order"
has "$out" "| \`weft, automatic waits\` | 93 | us | \`hand-placed events\` | 100 | 0.930 [1] | 0.930–0.930 | 4 |"
has "$out" "ratio of the medians"
# The curve: its section table (x column) and the Curves chapter's table of medians.
has "$out" "| \`weft\` | 1000 | 41 | ns | \`raw\` | 20 | 2.050 | 2.000–2.100 | 3 |"
has "$out" "## Curves"
has "$out" "### curve_streams"
has "$out" "| streams | weft | raw |"
has "$out" "| 1 | 11 | 5 |"
has "$out" "| 1000 | 41 | 20 |"
if command -v gnuplot >/dev/null 2>&1; then
  test -s "$tmp/run/img/curve_streams_ns_per_use.png" || fail "gnuplot is there but no PNG was written"
  head -c 8 "$tmp/run/img/curve_streams_ns_per_use.png" | od -c | grep -q "P   N   G" || fail "not a PNG"
  has "$out" "![curve_streams: ns per use](img/curve_streams_ns_per_use.png)"
  lacks "$out" "(plots need gnuplot"
  echo "test_results: gnuplot found: PNG checked"
else
  has "$out" "(plots need gnuplot: apt-get install gnuplot-nox)"
  echo "test_results: no gnuplot: the note checked"
fi

# ---- no gnuplot (forced): tables and the note ----------------------------------------------
"$py" "$script" --csv "$tmp/run/bench.csv" --card c --driver d --commit e --date f --gnuplot none \
  --out "$tmp/run/nogp.md" --img "$tmp/run/nogp_img"
has "$tmp/run/nogp.md" "(plots need gnuplot: apt-get install gnuplot-nox)"
has "$tmp/run/nogp.md" "| 1000 | 41 | 20 |"
test ! -e "$tmp/run/nogp_img" || fail "--gnuplot none made $tmp/run/nogp_img"

# ---- two CSVs merged (the later pipeline section wins), meta.txt, --extra -------------------------
cp "$tmp/run/bench.csv" "$tmp/merge/one.csv"
cat > "$tmp/merge/two.csv" <<'EOF'
section,row,metric,unit,baseline,x,rep,value,machine
pipeline,"weft, automatic waits",us per chunk,us,hand-placed events,,0,110,gpu
pipeline,hand-placed events,us per chunk,us,,,0,100,gpu
EOF
printf 'card: Meta Card\ndriver: 9.9\n# a comment\ncommit: fedcba9\ndate: 2026-01-02\ncommand: from meta\n' \
  > "$tmp/merge/meta.txt"
printf '## Something else\n\n| a | b |\n| --- | --- |\n| 1 | 2 |\n' > "$tmp/merge/extra.md"
"$py" "$script" --csv "$tmp/merge/one.csv" --csv "$tmp/merge/two.csv" --commit override1 \
  --extra "$tmp/merge/extra.md" --out "$tmp/merge/R.md" --img "$tmp/merge/img" --gnuplot none
m="$tmp/merge/R.md"
has "$m" "- card: **Meta Card**"
has "$m" "- driver: 9.9"
has "$m" "- commit: override1"
has "$m" "- date: 2026-01-02"
has "$m" "- command: \`from meta\`"
has "$m" "\`$tmp/merge/two.csv\` (sections: pipeline)"
has "$m" "\`weft, automatic waits\` | 1.100 | 1.100–1.100 | **not met** |"
lacks "$m" "0.930"
has "$m" "## Appended: \`extra.md\`"
has "$m" "| 1 | 2 |"

# ---- simulator rows: the warning -----------------------------------------------------------------
printf 'section,row,metric,unit,baseline,x,rep,value,machine\nalloc,a,ns,ns,,,0,1,simulator\n' > "$tmp/sim/bench.csv"
"$py" "$script" --csv "$tmp/sim/bench.csv" --card c --driver d --commit e --date f --gnuplot none \
  --out "$tmp/sim/R.md" --img "$tmp/sim/img"
has "$tmp/sim/R.md" "- machine: simulator"
has "$tmp/sim/R.md" "**Simulator figures (sections alloc): these are not performance numbers.**"

# ---- the simulator's own speed (curve_sim) is a performance number: no warning ------------------
mkdir -p "$tmp/simspeed"
printf 'section,row,metric,unit,baseline,x,rep,value,machine\ncurve_sim,simulator,ops,ops/s,,1000,0,5,simulator\ncurve_sim,simulator,ops,ops/s,,10000,0,6,simulator\nalloc,a,ns,ns,,,0,1,gpu\n' \
  > "$tmp/simspeed/bench.csv"
"$py" "$script" --csv "$tmp/simspeed/bench.csv" --card c --driver d --commit e --date f --gnuplot none \
  --out "$tmp/simspeed/R.md" --img "$tmp/simspeed/img"
has "$tmp/simspeed/R.md" "- machine: gpu, simulator"
lacks "$tmp/simspeed/R.md" "not performance numbers"

# ---- refusals: the old header, no card -----------------------------------------------------------
printf 'section,row,metric,value,unit,baseline,baseline_value,ratio,machine\nalloc,a,ns,1,ns,,,,gpu\n' \
  > "$tmp/bad/bench.csv"
rc=0
"$py" "$script" --csv "$tmp/bad/bench.csv" --card c --driver d --commit e --date f \
  --out "$tmp/bad/R.md" 2> "$tmp/bad/err.txt" || rc=$?
[ "$rc" -ne 0 ] || fail "a CSV with the wrong header was accepted"
has "$tmp/bad/err.txt" "wrong header"
has "$tmp/bad/err.txt" "expected:"
test ! -e "$tmp/bad/R.md" || fail "RESULTS.md written from a bad CSV"
rc=0
"$py" "$script" --csv "$tmp/sim/bench.csv" --out "$tmp/bad/R2.md" 2> "$tmp/bad/err2.txt" || rc=$?
[ "$rc" -ne 0 ] || fail "no card/driver/commit/date was accepted"
has "$tmp/bad/err2.txt" "card, driver, commit, date not given"
echo "test_results: OK"
