#!/usr/bin/env bash
# Renders snapshots and traces with tools/weft_view.html in headless Chromium, without a display:
#   tools/weft_view_render.sh OUT FILE.json... [--window FROM_US,TO_US] [--size W,H]
# writes OUT.html (the viewer with the data inside), OUT.dom.html (the DOM as drawn) and OUT.png
# (a screenshot). --window shows that part of a trace's timeline (microseconds, as in the trace).
# Exit status 1 when the browser is missing or drew nothing.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
viewer="${WEFT_VIEWER:-$here/weft_view.html}"
out="$1"; shift
files=(); window=""; size="1000,700"
while [ $# -gt 0 ]; do
  case "$1" in
    --window) window="$2"; shift 2 ;;
    --size) size="$2"; shift 2 ;;
    *) files+=("$1"); shift ;;
  esac
done
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
[ -n "$browser" ] || { echo "weft_view_render: no chromium (tools/setup.sh installs it)" >&2; exit 1; }
{
  sed -n '1,/<body>/p' "$viewer"
  printf '<script>'
  [ -n "$window" ] && printf 'window.WEFT_WINDOW = [%s];\n' "$window"
  printf 'window.WEFT_DATA = ['
  sep=""
  for f in "${files[@]}"; do printf '%s' "$sep"; cat "$f"; sep=","; done
  printf '];</script>\n'
  sed -n '/<body>/,$p' "$viewer" | tail -n +2
} > "$out.html"
profile="$(mktemp -d)"
flags=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run --user-data-dir="$profile")
timeout 120 "$browser" "${flags[@]}" --dump-dom "file://$(realpath "$out.html")" > "$out.dom.html" 2> "$out.browser.log"
timeout 120 "$browser" "${flags[@]}" --window-size="$size" --screenshot="$(realpath -m "$out.png")" \
  "file://$(realpath "$out.html")" >> "$out.browser.log" 2>&1
rm -rf "$profile"
[ -s "$out.dom.html" ] && [ -s "$out.png" ] || { echo "weft_view_render: nothing drawn (see $out.browser.log)" >&2; exit 1; }
