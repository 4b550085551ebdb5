/* Options: defaults, WEFT_* environment overrides and validation, all generated from
 * WEFT_OPTIONS_MAP in weft.h so that a new option is one line there. */
#include <errno.h>
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

/* Parses a whole unsigned decimal (or 0x hex) number with an optional K/M/G suffix (binary). */
static int parse_u64(const char *s, uint64_t *out) {
  if (s == NULL || *s == '\0' || *s == '-') return 0;
  char *end = NULL;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (errno != 0 || end == s) return 0;
  unsigned shift = 0;
  if (*end == 'K' || *end == 'k') shift = 10, end++;
  else if (*end == 'M' || *end == 'm') shift = 20, end++;
  else if (*end == 'G' || *end == 'g') shift = 30, end++;
  if (*end != '\0') return 0;
  if (shift && v > (UINT64_MAX >> shift)) return 0;
  *out = (uint64_t)v << shift;
  return 1;
}

/* Power-of-two rule for the event ring, checked after the range. */
static int is_pow2(uint64_t v) { return v != 0 && (v & (v - 1)) == 0; }

weft_status_t weft_options_from_env(weft_options_t *opts) {
  if (opts == NULL) return weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_options_from_env: opts is NULL");
  weft_options_t o = *opts;
  const char *v;
#define WEFT__OPTION_ENV(field, type, env, def, lo, hi, doc)                                      \
  if ((v = getenv(env)) != NULL && *v != '\0') {                                                  \
    uint64_t x;                                                                                   \
    if (!parse_u64(v, &x) || x < (uint64_t)(lo) || x > (uint64_t)(hi))                            \
      return weft__error(WEFT_ERR_INVALID_ARGUMENT,                                               \
                         "weft_options_from_env: %s='%s' is not a number in [%" PRIu64 ", %" PRIu64 "]", \
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
  if (o->budget_shared_key != NULL && strlen(o->budget_shared_key) > 200)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "options.budget_shared_key is longer than 200 bytes");
  if (o->budget_shared_key != NULL && strchr(o->budget_shared_key, '/') != NULL)
    return weft__error(WEFT_ERR_INVALID_ARGUMENT, "options.budget_shared_key must not contain '/'");
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
