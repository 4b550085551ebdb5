/* The harness's plumbing: counts, medians, failures, and the two outputs.
 *
 * CSV columns: section,row,metric,value,unit,baseline,baseline_value,ratio,machine
 *   row       the table row ("pool, same size"), metric what was measured ("ns per pair");
 *   baseline  the raw-driver figure it is compared with, and ratio = value / baseline_value;
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

void bench_csv(const bench_t *b, const char *section, const char *row, const char *metric, double value,
               const char *unit, const char *baseline, double baseline_value) {
  const char *fields[] = {section, row, metric};
  for (int i = 0; i < 3; i++) {
    csv_field(b->csv, fields[i]);
    fputc(',', b->csv);
  }
  fprintf(b->csv, "%.6g,", value);
  csv_field(b->csv, unit);
  fputc(',', b->csv);
  csv_field(b->csv, baseline ? baseline : "");
  if (baseline_value != 0)
    fprintf(b->csv, ",%.6g,%.4f", baseline_value, value / baseline_value);
  else
    fprintf(b->csv, ",,");
  fprintf(b->csv, ",%s\n", b->sim ? "simulator" : "gpu");
}
