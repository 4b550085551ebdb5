/* Failure reporting: the thread's last error message and driver result.
 *
 * Every public function that fails calls weft__error() (or weft__driver_fail()) exactly once on
 * the way out, so weft_last_error() describes the failure the caller just saw. Formatting never
 * allocates: the message lives in a fixed thread-local buffer.
 */
#ifndef WEFT_CORE_ERROR_H
#define WEFT_CORE_ERROR_H

#include "weft/weft.h"

/** Records a printf-style message for weft_last_error() and returns `s` (for `return
 * weft__error(WEFT_ERR_INVALID_ARGUMENT, "weft_alloc: bytes is 0");`). */
weft_status_t weft__error(weft_status_t s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** Records `r` as the thread's last driver result. */
void weft__error_set_driver(CUresult r);

#endif
