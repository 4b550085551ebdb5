#!/usr/bin/env bash
# tools/weft_view.html in a real browser (issue 16): headless Chromium loads the viewer with a
# snapshot and a trace made on the simulator (make_samples) and dumps the DOM; the drawn segments,
# blocks and wait rows must match the data; a screenshot is taken and must not be blank.
#   test_viewer.sh VIEWER_HTML MAKE_SAMPLES
set -uo pipefail
viewer="$1"; make_samples="$2"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "FAIL: no chromium (tools/setup.sh installs it)"; exit 1
fi
"$make_samples" "$dir" || { echo "FAIL: make_samples"; exit 1; }
expect_blocks=$(awk '/^blocks/{print $2}' "$dir/expect.txt")
expect_waits=$(awk '/^waits/{print $2}' "$dir/expect.txt")
segments=$(python3 -c "import json; print(len(json.load(open('$dir/snapshot.json'))['segments']))" 2>/dev/null || echo 1)
# The page: the viewer with window.WEFT_DATA set before its script.
{
  sed -n '1,/<body>/p' "$viewer"
  printf '<script>window.WEFT_DATA = ['; cat "$dir/snapshot.json"; printf ','; cat "$dir/trace.json"; printf '];</script>\n'
  sed -n '/<body>/,$p' "$viewer" | tail -n +2
} > "$dir/view.html"
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --user-data-dir="$dir/profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$dir/view.html" > "$dir/dom.html" 2> "$dir/browser.log"
drawn_segments=$(grep -o 'class="segment"' "$dir/dom.html" | wc -l)
drawn_blocks=$(grep -o 'class="block"' "$dir/dom.html" | wc -l)
wait_rows=$(python3 - "$dir/dom.html" <<'PY' 2>/dev/null || echo -1
import re, sys
dom = open(sys.argv[1]).read()
t = re.search(r'<table class="waits">(.*?)</table>', dom, re.S)
print(sum(int(n) for n in re.findall(r'<tr><td>\d+ -&gt; \d+</td><td>(\d+)</td></tr>', t.group(1))) if t else -1)
PY
)
fail=0
check() { if [ "$2" = "$3" ]; then echo "PASS: $1 ($2)"; else echo "FAIL: $1: drawn $2, expected $3"; fail=1; fi; }
check "segments drawn" "$drawn_segments" "$segments"
check "blocks drawn" "$drawn_blocks" "$expect_blocks"
check "waits in the trace table" "$wait_rows" "$expect_waits"
timeout 120 "$browser" "${flags[@]}" --window-size=1000,700 --screenshot="$dir/view.png" "file://$dir/view.html" \
  >> "$dir/browser.log" 2>&1
size=$(stat -c %s "$dir/view.png" 2>/dev/null || echo 0)
if [ "$size" -gt 2000 ]; then echo "PASS: screenshot ($size bytes)"; else echo "FAIL: screenshot ($size bytes)"; fail=1; fi
[ "$fail" = 0 ] || { echo "--- browser log"; tail -20 "$dir/browser.log"; }
[ -n "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ] && cp "$dir/view.png" "$dir/view.html" "$TEST_UNDECLARED_OUTPUTS_DIR/" 2>/dev/null
exit $fail
