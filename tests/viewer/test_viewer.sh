#!/usr/bin/env bash
# tools/weft_view.html in a real browser (issue 16): headless Chromium loads the viewer with a
# snapshot and a trace made on the simulator (make_samples) and dumps the DOM; the drawn segments,
# blocks and wait rows must match the data; a screenshot is taken and must not be blank.
#   test_viewer.sh VIEWER_HTML MAKE_SAMPLES RENDER_SH (tools/weft_view_render.sh)
set -uo pipefail
viewer="$1"; make_samples="$2"; render="$3"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "FAIL: no chromium (tools/setup.sh installs it)"; exit 1
fi
"$make_samples" "$dir" || { echo "FAIL: make_samples"; exit 1; }
expect_blocks=$(awk '/^blocks/{print $2}' "$dir/expect.txt")
expect_waits=$(awk '/^waits/{print $2}' "$dir/expect.txt")
segments=$(python3 -c "import json; print(len(json.load(open('$dir/snapshot.json'))['segments']))" 2>/dev/null || echo 1)
WEFT_VIEWER="$viewer" "$render" "$dir/view" "$dir/snapshot.json" "$dir/trace.json" || { echo "FAIL: render"; exit 1; }
drawn_segments=$(grep -o 'class="segment"' "$dir/view.dom.html" | wc -l)
drawn_blocks=$(grep -o 'class="block"' "$dir/view.dom.html" | wc -l)
wait_rows=$(python3 - "$dir/view.dom.html" <<'PY' 2>/dev/null || echo -1
import re, sys
dom = open(sys.argv[1]).read()
t = re.search(r'<table class="waits">(.*?)</table>', dom, re.S)
print(sum(int(n) for n in re.findall(r'<tr><td>\d+ -&gt; \d+</td><td>(\d+)</td></tr>', t.group(1))) if t else -1)
PY
)
# The timeline: one bar per slice event of the trace (the window is the device slices' span, which
# every slice of this short program overlaps or not: count those inside), and the overlap line.
expect_slices=$(python3 -c "
import json
ev = json.load(open('$dir/trace.json'))
x = [e for e in ev if e['ph'] == 'X']
d = [e for e in x if e.get('cat') == 'device']
lo = min(e['ts'] for e in d); hi = max(e['ts'] + e['dur'] for e in d)
print(sum(1 for e in x if not (e['ts'] + e['dur'] < lo or e['ts'] > hi)))" 2>/dev/null || echo -1)
drawn_slices=$(grep -o 'class="slice"' "$dir/view.dom.html" | wc -l)
overlap_line=$(grep -c 'class="overlap"' "$dir/view.dom.html")
fail=0
check() { if [ "$2" = "$3" ]; then echo "PASS: $1 ($2)"; else echo "FAIL: $1: drawn $2, expected $3"; fail=1; fi; }
check "segments drawn" "$drawn_segments" "$segments"
check "blocks drawn" "$drawn_blocks" "$expect_blocks"
check "waits in the trace table" "$wait_rows" "$expect_waits"
check "timeline bars" "$drawn_slices" "$expect_slices"
check "device overlap line" "$overlap_line" 1
size=$(stat -c %s "$dir/view.png" 2>/dev/null || echo 0)
if [ "$size" -gt 2000 ]; then echo "PASS: screenshot ($size bytes)"; else echo "FAIL: screenshot ($size bytes)"; fail=1; fi
[ "$fail" = 0 ] || { echo "--- browser log"; tail -20 "$dir/view.browser.log"; }
[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && cp "$dir/view.png" "$dir/view.html" "$TEST_UNDECLARED_OUTPUTS_DIR/" 2>/dev/null
exit $fail
