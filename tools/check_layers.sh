#!/usr/bin/env bash
# Checks weft's layering, as tools/layers.txt describes it, at two levels:
#   BUILD    every direct dependency edge (bazel query) of a layer, sim or examples target
#   symbols  builds the layer libraries and reads their objects with nm: which package's
#            definitions each package's objects use (libc, jemalloc, CUDA: ignored). Prints that
#            graph; a use of a package of an equal or higher rank, or a cycle, is a violation.
# One line per violation, then "layers: OK" (exit 0) or "layers: N violations" (exit 1);
# exit 2 when bazel itself fails.
#   tools/check_layers.sh                      LAYERS=/tmp/table.txt tools/check_layers.sh
#   tools/check_layers.sh --no-symbols         (the BUILD graph only: no build)
#   BAZEL="bazel --output_base=/tmp/ob" tools/check_layers.sh
set -uo pipefail
table=$(realpath "${LAYERS:-$(dirname "$0")/layers.txt}") || exit 2
cd "$(dirname "$0")/.." || exit 2
# shellcheck disable=SC2206  # BAZEL is a command line: "bazel --output_base=..."
bazel=(${BAZEL:-bazel})
symbols=1
[ "${1:-}" = --no-symbols ] && symbols=0
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# The table without comments: "label rank [public]".
sed 's/#.*//' "$table" | awk 'NF >= 2 { print $1, $2, $3 }' > "$tmp/table"

# Shared awk: rank_of(label) per the table ("" when not listed), and allowed(src rank, dst rank,
# dst label): "" when the edge is allowed, else why not.
lib='
function load(   l, f) {
  while ((getline l < TABLE) > 0) { split(l, f, " "); rank[f[1]] = f[2]; if (f[3] == "public") pub[f[1]] = 1 }
}
function pkg(label,   i) { i = index(label, ":"); return i ? substr(label, 1, i - 1) : label }
function entry_of(label,   p, e, base, best, blen) {        # the table entry that holds label
  if (label in rank) return label
  p = pkg(label)
  if (p in rank) return p
  best = ""; blen = -1
  for (e in rank)
    if (e ~ /\/\.\.\.$/) {
      base = substr(e, 1, length(e) - 3)                  # "//examples/", "@local_cuda//"
      if (index(p "/", base) == 1 && length(base) > blen) { best = e; blen = length(base) }
    }
  return best
}
function rank_of(label,   e) { e = entry_of(label); return e == "" ? "" : rank[e] }
function public(label) { return entry_of(label) in pub }
function num(r) { return r ~ /^[0-9]+$/ }
function allowed(rs, rd, dst) {
  if (num(rs)) {
    if (num(rd)) return rd + 0 < rs + 0 || rd + rs == 0 ? "" : "not a lower layer"
    if (rd == "sim") return "layers never depend on //sim"
    return rd == "" ? "not in the layer table" : "outside the layers"
  }
  if (rs == "sim") return rd == "0" || rd == "sim" ? "" : "sim may depend only on rank 0 and sim"
  if (rs == "examples")
    return rd == "examples" || public(dst) ? "" : "examples may depend only on public targets"
  return ""
}
function show(label, r) { return label " [" (r == "" ? "unlisted" : r) "]" }
BEGIN { load() }
'

# --- BUILD level -------------------------------------------------------------------------------
# The checked targets: every rule of the table's own (non-external, non "-") entries.
pats=$(awk '$2 != "-" && $1 !~ /^@/ {
  l = $1; if (l !~ /\/\.\.\.$/ && !index(l, ":")) l = l ":all"; printf "%s%s", sep, l; sep = " + " }' "$tmp/table")
if ! "${bazel[@]}" query --noimplicit_deps --output=graph --nograph:factored \
    "deps(kind(rule, $pats), 1)" > "$tmp/graph" 2> "$tmp/err"; then
  cat "$tmp/err" >&2; echo "layers: bazel query failed" >&2; exit 2
fi
# Edges: "src dst", one a line.
sed -n 's/^ *"\([^"]*\)" -> "\([^"]*\)".*/\1 \2/p' "$tmp/graph" | sort -u > "$tmp/edges"
awk -v TABLE="$tmp/table" "$lib"'
  pkg($1) != pkg($2) {
    rs = rank_of($1); rd = rank_of($2); n++
    why = allowed(rs, rd, $2)
    if (why != "") print "layers: BUILD " show($1, rs) " -> " show($2, rd) ": " why
  }
  END { print n + 0 > "/dev/stderr" }' "$tmp/edges" > "$tmp/build_bad" 2> "$tmp/build_n"
cat "$tmp/build_bad"
bad=$(wc -l < "$tmp/build_bad")
echo "layers: BUILD: $(cat "$tmp/build_n") cross-package edges checked, $bad violations"

# --- symbol level ------------------------------------------------------------------------------
if [ "$symbols" = 1 ]; then
  # The cc_library targets of layers and sim ("label rank").
  if ! "${bazel[@]}" query "kind(cc_library, $pats)" > "$tmp/ccl" 2> "$tmp/err"; then
    cat "$tmp/err" >&2; echo "layers: bazel query failed" >&2; exit 2
  fi
  awk -v TABLE="$tmp/table" "$lib"'{ r = rank_of($1); if (num(r) || r == "sim") print $1, r }' \
    "$tmp/ccl" > "$tmp/libs"
  mapfile -t libs < <(cut -d' ' -f1 "$tmp/libs")
  # No bazel-* links: the caller's own (tools/test.sh's) stay as they are.
  if ! "${bazel[@]}" build --symlink_prefix=/ -- "${libs[@]}" > "$tmp/err" 2>&1; then
    grep -E '^ERROR|cycle|^ *[.`]-*|^ *\| ' "$tmp/err" | head -20 >&2
    echo "layers: BUILD FAILED: bazel build of the layer libraries failed (symbols not checked)"
    echo "layers: $((bad + 1)) violations"
    exit 1
  fi
  bin=$("${bazel[@]}" info bazel-bin 2> /dev/null)
  # Each library's objects: bazel-bin/<pkg>/_objs/<name>/**/<stem>{.pic.o,.o} for each source
  # file in its srcs (so a stale object of a deleted source is not read). A package is one node of
  # the graph, named by its folder, unless its libraries have different ranks (then pkg:name).
  while read -r label r; do
    p=${label%%:*}; name=${label#*:}
    [ -d "$bin/${p#//}/_objs/$name" ] && find "$bin/${p#//}/_objs/$name" -name '*.o' | sed "s|^|$label $r |"
  done < "$tmp/libs" > "$tmp/objs_all"
  awk '
    function pkg(l) { return substr(l, 1, index(l, ":") - 1) }
    BEGIN { split(".c .cc .cpp .S .s", ext, " ") }
    FNR == NR { if ($2 ~ /^[^"]+[.](c|cc|cpp|S|s)$/) src[$1, $2] = 1; next }
    {
      stem = $3; sub(/.*\//, "", stem); sub(/([.]pic)?[.]o$/, "", stem)
      label = $1; p = pkg(label); base = p ":" stem
      ok = 0; for (e in ext) if ((label, base ext[e]) in src) ok = 1
      if (!ok) next
      n++; obj[n] = $3; lab[n] = label; rk[n] = $2
      if ((p in prank) && prank[p] != $2) split_pkg[p] = 1
      prank[p] = $2
    }
    END {
      for (i = 1; i <= n; i++) {
        p = pkg(lab[i]); node = substr(p, 3)
        if (p in split_pkg) node = node ":" substr(lab[i], index(lab[i], ":") + 1)
        print obj[i], node, rk[i]
      }
    }' "$tmp/edges" "$tmp/objs_all" > "$tmp/objs"
  if [ ! -s "$tmp/objs" ]; then echo "layers: no object files under $bin" >&2; exit 2; fi
  # nm -A: "obj:addr T sym" for definitions, "obj:   U sym" for uses.
  cut -d' ' -f1 "$tmp/objs" | xargs nm -A -g > "$tmp/nm" 2> /dev/null
  # "user def sym": each use of a symbol that a different node defines.
  awk -v OBJS="$tmp/objs" '
    BEGIN { while ((getline l < OBJS) > 0) { split(l, f, " "); node[f[1]] = f[2] } }
    {
      i = index($0, ":"); o = substr($0, 1, i - 1); n = split(substr($0, i + 1), f, " ")
      t = f[n - 1]; s = f[n]
      if (t == "U" || t == "w" || t == "v") { nu++; un[nu] = node[o]; us[nu] = s }
      else def[s] = node[o]
    }
    END { for (k = 1; k <= nu; k++) if ((us[k] in def) && def[us[k]] != un[k]) print un[k], def[us[k]], us[k] }' \
    "$tmp/nm" | sort -u > "$tmp/uses"
  # Node ranks: "node rank".
  awk '{ print $2, $3 }' "$tmp/objs" | sort -u > "$tmp/nodes"
  # The folder graph: each node, then the nodes whose definitions it uses (highest rank first).
  echo "layers: symbol graph (package -> packages whose definitions it uses):"
  awk -v NODES="$tmp/nodes" '
    BEGIN { while ((getline l < NODES) > 0) { split(l, f, " "); r[f[1]] = f[2] } }
    { if (!(($1, $2) in seen)) { seen[$1, $2] = 1; print $1, r[$1], $2, r[$2] } }' "$tmp/uses" \
    | sort -k4,4nr -k3,3 > "$tmp/pairs"
  sort -k2,2nr -k1,1 "$tmp/nodes" | while read -r n r; do
    deps=$(awk -v n="$n" '$1 == n { printf "%s%s", sep, $3; sep = ", " }' "$tmp/pairs")
    printf '  %-12s -> %s\n' "$n [$r]" "${deps:--}"
  done
  # Upward (or sideways, or into/out of sim) uses: one line per package edge, with its symbols.
  awk -v TABLE="$tmp/table" -v NODES="$tmp/nodes" "$lib"'
    BEGIN { while ((getline l < NODES) > 0) { split(l, f, " "); r[f[1]] = f[2] } }
    {
      why = allowed(r[$1], r[$2], "")
      if (why == "") next
      k = $1 " " $2
      if (!(k in syms)) { order[++n] = k; why_of[k] = why; syms[k] = $3; cnt[k] = 1 }
      else { if (++cnt[k] <= 3) syms[k] = syms[k] ", " $3 }
    }
    END {
      for (i = 1; i <= n; i++) {
        k = order[i]; split(k, e, " "); more = cnt[k] > 3 ? " and " cnt[k] - 3 " more" : ""
        print "layers: SYMBOL " e[1] " [" r[e[1]] "] uses " e[2] " [" r[e[2]] "]: " syms[k] more " (" why_of[k] ")"
      }
    }' "$tmp/uses" > "$tmp/sym_bad"
  # Cycles of the folder graph: a depth-first search; each back edge closes one cycle.
  cut -d' ' -f1,3 "$tmp/pairs" | sort -u | awk -v NODES="$tmp/nodes" '
    function dfs(u,   i, v, k, s) {
      color[u] = 1; stack[++sp] = u
      for (i = 1; i <= deg[u]; i++) {
        v = adj[u, i]
        if (color[v] == 1) {
          for (k = sp; stack[k] != v; k--) ;
          s = ""; for (; k <= sp; k++) s = s stack[k] " -> "
          print "layers: CYCLE " s v
        } else if (!color[v]) dfs(v)
      }
      sp--; color[u] = 2
    }
    { adj[$1, ++deg[$1]] = $2 }
    END { while ((getline l < NODES) > 0) { split(l, f, " "); if (!color[f[1]]) dfs(f[1]) } }' >> "$tmp/sym_bad"
  cat "$tmp/sym_bad"
  sbad=$(wc -l < "$tmp/sym_bad")
  echo "layers: symbols: $(wc -l < "$tmp/objs") objects of $(wc -l < "$tmp/nodes") packages," \
    "$(wc -l < "$tmp/uses") cross-package symbol uses, $sbad violations"
  bad=$((bad + sbad))
fi

if [ "$bad" -eq 0 ]; then
  echo "layers: OK"
else
  echo "layers: $bad violations"
  exit 1
fi
