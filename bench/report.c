/* The harness's plumbing: counts, medians, failures, and the two outputs.
 *
 * CSV: one row per sample. Columns: section,row,metric,unit,baseline,x,rep,value,machine
 *   row       the series ("pool resource, same size"), metric what was measured ("ns per pair");
 *   baseline  the row of the same section and metric it is compared with: the ratio of a
 *             repetition is value / the baseline's value of the same rep (bench/results.py);
 *   x         a curve's parameter (streams, live blocks, nodes...), empty elsewhere;
 *   rep       the repetition (0 .. reps-1; interleaved with the baseline's: bench_measure);
 *   machine   "gpu" or "simulator" (simulator rows are not performance numbers).
 */
#include <stdlib.h>
#include <string.h>

#include "bench/bench.h"

unsigned bench_count(const bench_t *b, unsigned gpu, unsigned floor) {
  unsigned n = b->quick ? gpu / 100 : b->sim ? gpu / 10 : gpu;
  return n < floor ? floor : n;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double bench_median(double *v, unsigned n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

void bench_die_weft(weft_status_t st, const char *what) {
  fprintf(stderr, "weft_bench: %s: %s: %s\n", what, weft_status_name(st), weft_last_error());
  exit(1);
}

void bench_die_cu(CUresult r, const char *what) {
  fprintf(stderr, "weft_bench: %s: %s (%d)\n", what, weft_driver_error_name(r), (int)r);
  exit(1);
}

void bench_die(const char *what) {
  fprintf(stderr, "weft_bench: %s\n", what);
  exit(1);
}

weft_runtime_t *bench_runtime(const weft_options_t *opts) {
  weft_runtime_t *rt;
  BENCH_WEFT(weft_runtime_get(0, opts, &rt));
  return rt;
}

void bench_section(const bench_t *b, const char *title, const char *about) {
  printf("## %s%s\n\n%s\n\n", title, b->sim ? " (simulator: not performance numbers)" : "", about);
}

void bench_table(const char *const *cols, unsigned n) {
  for (unsigned i = 0; i < n; i++) printf("| %s ", cols[i]);
  printf("|\n");
  for (unsigned i = 0; i < n; i++) printf("| %s ", i == 0 ? "---" : "---:");
  printf("|\n");
}

/* Quotes a CSV field when it holds a comma or a quote. */
static void csv_field(FILE *f, const char *s) {
  if (strpbrk(s, ",\"") == NULL) {
    fputs(s, f);
    return;
  }
  fputc('"', f);
  for (; *s; s++) {
    if (*s == '"') fputc('"', f);
    fputc(*s, f);
  }
  fputc('"', f);
}

void bench_sample(const bench_t *b, const char *section, const char *row, const char *metric, const char *unit,
                  const char *baseline, const char *x, unsigned rep, double value) {
  const char *fields[] = {section, row, metric, unit, baseline ? baseline : "", x ? x : ""};
  for (int i = 0; i < 6; i++) {
    csv_field(b->csv, fields[i]);
    fputc(',', b->csv);
  }
  fprintf(b->csv, "%u,%.9g,%s\n", rep, value, b->sim ? "simulator" : "gpu");
}

void bench_measure(const bench_t *b, const char *section, const char *metric, const char *unit,
                   const bench_series_t *series, size_t n, double *medians) {
  unsigned reps = b->reps < BENCH_MAX_REPS ? b->reps : BENCH_MAX_REPS;
  double v[BENCH_MAX_REPS];
  double *all = calloc(n * reps + 1, sizeof *all);
  if (all == NULL) bench_die("bench_measure: no memory");
  for (size_t i = 0; i < n; i++) (void)series[i].sample(series[i].ctx); /* warm-up */
  for (unsigned r = 0; r < reps; r++)
    for (size_t i = 0; i < n; i++) {
      all[i * reps + r] = series[i].sample(series[i].ctx);
      bench_sample(b, section, series[i].row, metric, unit, series[i].baseline, series[i].x, r, all[i * reps + r]);
    }
  for (size_t i = 0; i < n && medians != NULL; i++) {
    memcpy(v, all + i * reps, reps * sizeof *v);
    medians[i] = bench_median(v, reps);
  }
  free(all);
}
