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

/* Test points, as jemalloc's test hooks: where a test must act inside a window between two of
 * weft's own atomic steps (a record handed out again between a free's checks and its claim), the
 * code names the point with WEFT__TEST_POINT and a test sets weft__test_hook to act there. Only
 * in builds with WEFT_DEBUG >= 1 (dbg, asan, tsan); elsewhere the points compile to nothing and
 * weft__test_points is false, so that a test that needs them reports a skip. */
#if WEFT_DEBUG >= 1
#include <stdatomic.h>
#define WEFT__TEST_POINTS 1
/** Called at every named point while set: `point` names it ("<function>: <step>"), `arg` is
 * the point's object (documented where the point is). Set and cleared by tests only. */
extern void (*_Atomic weft__test_hook)(const char *point, void *arg);
#define WEFT__TEST_POINT(point, arg)                                                        \
  do {                                                                                      \
    void (*h_)(const char *, void *) = atomic_load_explicit(&weft__test_hook, memory_order_acquire); \
    if (h_ != NULL) h_(point, arg);                                                         \
  } while (0)
#else
#define WEFT__TEST_POINTS 0
#define WEFT__TEST_POINT(point, arg) ((void)0)
#endif

#endif
