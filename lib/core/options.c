/* Options: defaults, WEFT_* environment overrides and validation, all generated from
 * WEFT_OPTIONS_MAP in weft.h so that a new option is one line there. */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "lib/core/error.h"

weft_options_t weft_options_default(void) {
  weft_options_t o;
  memset(&o, 0, sizeof o);
#define WEFT__OPTION_DEFAULT(field, type, env, def, lo, hi, doc) o.field = (type)(def);
  WEFT_OPTIONS_MAP(WEFT__OPTION_DEFAULT)
#undef WEFT__OPTION_DEFAULT
  o.budget_shared_key = NULL;
  o.log_path = NULL;
  return o;
}

/* How every numeric WEFT_* variable is written, as errors quote it. */
#define NUMBER_FORM "decimal digits, optionally followed by one K, M or G (binary multiples)"

typedef enum { NUMBER_OK, NUMBER_MALFORMED, NUMBER_OVERFLOW } number_t;

/* Parses NUMBER_FORM exactly. strtoull is not used: it skips leading whitespace, accepts a sign
 * (" -1" wraps to UINT64_MAX) and, in base 0, reads "010" as octal 8 and rejects "08". */
static number_t parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || !(*s >= '0' && *s <= '9')) return NUMBER_MALFORMED;
  uint64_t v = 0;
  for (; *s >= '0' && *s <= '9'; s++) {
    unsigned d = (unsigned)(*s - '0');
    if (v > (UINT64_MAX - d) / 10) return NUMBER_OVERFLOW;
    v = v * 10 + d;
  }
  unsigned shift = 0;
  if (*s == 'K' || *s == 'k') shift = 10, s++;
  else if (*s == 'M' || *s == 'm') shift = 20, s++;
  else if (*s == 'G' || *s == 'g') shift = 30, s++;
  if (*s != '\0') return NUMBER_MALFORMED;
  if (shift && v > (UINT64_MAX >> shift)) return NUMBER_OVERFLOW;
  *out = v << shift;
  return NUMBER_OK;
}

/* The characters of a shared budget key (lib/mem/budget.c names a shared-memory object by it). */
#define KEY_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-"

/* Power-of-two rule for the event ring, checked after the range. */
static int is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

weft_status_t weft_options_from_env(weft_options_t *opts) {
  if (opts == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_options_from_env: opts is NULL");
  weft_options_t o = *opts;
  const char *v;
#define WEFT__OPTION_ENV(field, type, env, def, lo, hi, doc)                                      \
  if ((v = getenv(env)) != NULL && *v != '\0') {                                                  \
    uint64_t x = 0;                                                                               \
    number_t n = parse_u64(v, &x);                                                                \
    if (n != NUMBER_OK)                                                                           \
      return weft__error(WEFT_ERR_INVALID_ARGUMENT,                                               \
                         "weft_options_from_env: %s='%s' %s; write " NUMBER_FORM ", in [%" PRIu64  \
                         ", %" PRIu64 "]",                                                         \
                         env, v, n == NUMBER_OVERFLOW ? "does not fit in 64 bits" : "is not a number", \
                         (uint64_t)(lo), (uint64_t)(hi));                                          \
    if (x < (uint64_t)(lo) || x > (uint64_t)(hi))                                                 \
      return weft__error(WEFT_ERR_INVALID_ARGUMENT,                                               \
                         "weft_options_from_env: %s='%s' is out of range [%" PRIu64 ", %" PRIu64  \
                         "] (" NUMBER_FORM ")",                                                   \
                         env, v, (uint64_t)(lo), (uint64_t)(hi));                                  \
    o.field = (type)x;                                                                            \
  }
  WEFT_OPTIONS_MAP(WEFT__OPTION_ENV)
#undef WEFT__OPTION_ENV
  if ((v = getenv("WEFT_BUDGET_SHARED")) != NULL) o.budget_shared_key = *v ? v : NULL;
  if ((v = getenv("WEFT_LOG")) != NULL) o.log_path = *v ? v : NULL;
  weft_status_t s = weft_options_validate(&o);
  if (s != WEFT_OK) return s;
  *opts = o;
  return WEFT_OK;
}

weft_status_t weft_options_validate(const weft_options_t *o) {
  if (o == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_options_validate: opts is NULL");
#define WEFT__OPTION_CHECK(field, type, env, def, lo, hi, doc)                                   \
  if ((uint64_t)o->field < (uint64_t)(lo) || (uint64_t)o->field > (uint64_t)(hi))                \
    return weft__error(WEFT_ERR_INVALID_ARGUMENT,                                                \
                       "options." #field " = %" PRIu64 " is out of range [%" PRIu64 ", %" PRIu64 "] (%s)", \
                       (uint64_t)o->field, (uint64_t)(lo), (uint64_t)(hi), doc);
  WEFT_OPTIONS_MAP(WEFT__OPTION_CHECK)
#undef WEFT__OPTION_CHECK
  if (o->high_priority_streams > o->stream_count)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT,
                       "options.high_priority_streams = %u exceeds options.stream_count = %u",
                       o->high_priority_streams, o->stream_count);
  if (!is_pow2(o->event_ring))
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "options.event_ring = %u is not a power of two",
                       o->event_ring);
  /* The runtime copies both strings into buffers of these sizes: longer ones are refused here
   * rather than cut short there. The key's characters are the ones weft_budget_create accepts,
   * so that a key validated here cannot fail the runtime's creation later. */
  if (o->log_path != NULL && strnlen(o->log_path, WEFT_LOG_PATH_MAX + 1) > WEFT_LOG_PATH_MAX)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "options.log_path (WEFT_LOG) is longer than %d bytes",
                       WEFT_LOG_PATH_MAX);
  if (o->budget_shared_key != NULL) {
    const char *k = o->budget_shared_key;
    if (strnlen(k, WEFT_BUDGET_KEY_MAX + 1) > WEFT_BUDGET_KEY_MAX)
      return weft__error(WEFT_ERR_INVALID_ARGUMENT,
                         "options.budget_shared_key (WEFT_BUDGET_SHARED) is longer than %d characters",
                         WEFT_BUDGET_KEY_MAX);
    if (k[strspn(k, KEY_CHARS)] != '\0')
      return weft__error(WEFT_ERR_INVALID_ARGUMENT,
                         "options.budget_shared_key (WEFT_BUDGET_SHARED) '%s' may only hold [A-Za-z0-9_.-]", k);
  }
  return WEFT_OK;
}

void weft_options_print(const weft_options_t *o, FILE *out) {
  if (o == NULL || out == NULL) return;
#define WEFT__OPTION_PRINT(field, type, env, def, lo, hi, doc) \
  fprintf(out, "%-22s %-14" PRIu64 " %-26s %s\n", #field, (uint64_t)o->field, env, doc);
  WEFT_OPTIONS_MAP(WEFT__OPTION_PRINT)
#undef WEFT__OPTION_PRINT
  fprintf(out, "%-22s %-14s %-26s %s\n", "budget_shared_key", o->budget_shared_key ? o->budget_shared_key : "(none)",
          "WEFT_BUDGET_SHARED", "key of a budget shared across processes");
  fprintf(out, "%-22s %-14s %-26s %s\n", "log_path", o->log_path ? o->log_path : "(none)", "WEFT_LOG",
          "CSV allocation log");
}
