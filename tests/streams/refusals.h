/* Refused calls compared between a fast path and its general path (test_fast_path,
 * test_alloc_fast_path): each call's status and weft_last_error() message. Include after
 * <cmocka.h>. */
#pragma once

#include <stdio.h>

#include "weft/weft.h"

typedef struct refusal {
  weft_status_t st;
  char message[512];
} refusal_t;

/** The status of a call just made and, when it failed, its message. */
static inline refusal_t refusal(weft_status_t st) {
  refusal_t r = {st, ""};
  snprintf(r.message, sizeof r.message, "%s", st == WEFT_OK ? "" : weft_last_error());
  return r;
}

/** Fails the test unless every call of `fast` was refused, with the status and message of the
 * same call in `slow`; prints them. */
static inline void same_refusals(const refusal_t *fast, const refusal_t *slow, size_t n) {
  for (size_t i = 0; i < n; i++) {
    printf("call %zu: %s: %s\n", i, weft_status_name(fast[i].st), fast[i].message);
    assert_int_not_equal(fast[i].st, WEFT_OK);
    assert_int_equal(fast[i].st, slow[i].st);
    assert_string_equal(fast[i].message, slow[i].message);
  }
}
