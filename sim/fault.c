/* Fault injection: "NAME:N:CODE" fails the Nth call of NAME, "NAME:N+:CODE" the Nth and every
 * later one, with CUresult CODE (a number, or a name such as CUDA_ERROR_OUT_OF_MEMORY).
 * Specs are ';'-separated; calls are counted per function from the moment the spec is set.
 * WEFT_SIM_FAIL is applied at the first cuInit; weft_sim_api_t.fail() replaces it.
 */
#include <stdlib.h>
#include <string.h>

#include "sim/internal.h"

#define MAX_FAULTS 32

typedef struct fault {
  sim__fn_t fn;
  uint64_t n;   /* the call number (from 1) that fails first */
  int every;    /* and every later one */
  CUresult code;
} fault_t;

static fault_t g_faults[MAX_FAULTS];
static size_t g_nfaults;
static uint64_t g_calls[SIM_FN_COUNT]; /* calls since the spec was set */

static const char *const g_fn_names[] = {
#define SIM__FN_NAME(name) #name,
    SIM_FUNCS(SIM__FN_NAME)
#undef SIM__FN_NAME
};

const char *sim__fn_name(sim__fn_t fn) { return g_fn_names[fn]; }

CUresult sim__fault_check(sim__fn_t fn) {
  uint64_t call = ++g_calls[fn];
  for (size_t i = 0; i < g_nfaults; i++) {
    const fault_t *f = &g_faults[i];
    if (f->fn == fn && (call == f->n || (f->every && call > f->n))) return f->code;
  }
  return CUDA_SUCCESS;
}

static int parse_code(const char *s, size_t len, CUresult *out) {
  char buf[96];
  if (len == 0 || len >= sizeof buf) return -1;
  memcpy(buf, s, len);
  buf[len] = '\0';
  char *end;
  long v = strtol(buf, &end, 0);
  if (*end == '\0') {
    if (v <= 0) return -1;
    *out = (CUresult)v;
    return 0;
  }
  for (int code = 1; code < 1000; code++) {
    const char *name = sim__error_name((CUresult)code);
    if (name && strcmp(name, buf) == 0) {
      *out = (CUresult)code;
      return 0;
    }
  }
  return -1;
}

/* Parses one "NAME:N[+]:CODE" of length len. */
static int parse_one(const char *s, size_t len, fault_t *f) {
  const char *c1 = memchr(s, ':', len);
  if (c1 == NULL) return -1;
  const char *c2 = memchr(c1 + 1, ':', len - (size_t)(c1 + 1 - s));
  if (c2 == NULL) return -1;
  size_t nlen = (size_t)(c1 - s);
  int found = 0;
  for (int i = 0; i < SIM_FN_COUNT; i++) {
    if (strlen(g_fn_names[i]) == nlen && memcmp(g_fn_names[i], s, nlen) == 0) {
      f->fn = (sim__fn_t)i;
      found = 1;
    }
  }
  if (!found) return -1;
  const char *p = c1 + 1;
  char *end;
  unsigned long long n = strtoull(p, &end, 10);
  if (end == p || n == 0) return -1;
  f->every = 0;
  if (*end == '+') {
    f->every = 1;
    end++;
  }
  if (end != c2) return -1;
  f->n = n;
  return parse_code(c2 + 1, len - (size_t)(c2 + 1 - s), &f->code);
}

int sim__fault_set(const char *spec) {
  fault_t parsed[MAX_FAULTS];
  size_t n = 0;
  if (spec != NULL) {
    const char *p = spec;
    while (*p) {
      const char *semi = strchr(p, ';');
      size_t len = semi ? (size_t)(semi - p) : strlen(p);
      if (len > 0) {
        if (n == MAX_FAULTS || parse_one(p, len, &parsed[n]) != 0) return -1;
        n++;
      }
      p += len + (semi != NULL);
    }
  }
  memcpy(g_faults, parsed, n * sizeof *parsed);
  g_nfaults = n;
  memset(g_calls, 0, sizeof g_calls);
  return 0;
}
