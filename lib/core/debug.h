/* Assertions tiered by cost, as in mimalloc (mi_assert < mi_assert_internal < mi_assert_expensive).
 *
 *   WEFT_ASSERT(c)           always compiled; for cheap checks of weft's own invariants whose
 *                            failure means memory corruption is near (never for user input).
 *   WEFT_ASSERT_INTERNAL(c)  WEFT_DEBUG >= 1 (dbg, tsan, tests): O(1) internal consistency.
 *   WEFT_ASSERT_EXPENSIVE(c) WEFT_DEBUG >= 2 (dbg, asan): walks whole structures, typically a
 *                            call of an invariant checker.
 *
 * Invariant checkers follow one convention: `bool weft__<module>_is_valid(const T *x)` walks x,
 * returns false at the first broken invariant after printing which one via weft__debug_report(),
 * never allocates, never takes a lock the caller could hold in a different order, and is safe to
 * call from tests. A failed assertion prints file, line and expression, then aborts: it never
 * allocates either.
 */
#ifndef WEFT_CORE_DEBUG_H
#define WEFT_CORE_DEBUG_H

#include <stdbool.h>

#ifndef WEFT_DEBUG
#define WEFT_DEBUG 0
#endif

/** Prints "weft assertion failed: file:line: expr" to stderr with write(2) and aborts. */
_Noreturn void weft__assert_fail(const char *expr, const char *file, int line);
/** Prints a line that an invariant checker found broken (no allocation); returns false. */
bool weft__debug_report(const char *checker, const char *what);

#define WEFT_ASSERT(c) ((c) ? (void)0 : weft__assert_fail(#c, __FILE__, __LINE__))
#if WEFT_DEBUG >= 1
#define WEFT_ASSERT_INTERNAL(c) WEFT_ASSERT(c)
#else
#define WEFT_ASSERT_INTERNAL(c) ((void)0)
#endif
#if WEFT_DEBUG >= 2
#define WEFT_ASSERT_EXPENSIVE(c) WEFT_ASSERT(c)
#else
#define WEFT_ASSERT_EXPENSIVE(c) ((void)0)
#endif

#endif
