/* Sweeps of faults at every call (include after <cmocka.h>): a fault fails one call, and a call
 * that failed changed nothing (weft.h), so the caller may make it again and it must succeed. */
#pragma once

#include "weft/weft.h"

/** Makes `call` (a weft_status_t expression, evaluated again on failure) once more if it failed:
 * counts the first failure in *(failures) and fails the test, naming the fault `after`, if the
 * second fails too. */
#define TU_AGAIN(failures, after, call)                                                            \
  do {                                                                                             \
    if ((call) != WEFT_OK) {                                                                       \
      (*(failures))++;                                                                             \
      if ((call) != WEFT_OK) fail_msg("after %s: %s made again: %s", (after), #call, weft_last_error()); \
    }                                                                                              \
  } while (0)
