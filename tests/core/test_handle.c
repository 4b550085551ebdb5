/* The live-handle set (lib/core/handle.h): answers, kinds, restores, and the per-thread memory of
 * positive answers, which a removal on any thread must make stale at once. */
#include <pthread.h>
#include <sched.h>
#include <stdbool.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "lib/core/handle.h"

static char objects[4][64]; /* addresses to register (never dereferenced) */

static void test_live_remove_restore_and_kinds(void **state) {
  (void)state;
  const void *p = objects[0];
  assert_false(weft__handle_live(p, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_add(p, WEFT__HANDLE_EXEC));
  for (int i = 0; i < 3; i++) assert_true(weft__handle_live(p, WEFT__HANDLE_EXEC)); /* remembered after the first */
  assert_false(weft__handle_live(p, WEFT__HANDLE_COMM)); /* another kind: never from the memory */
  assert_false(weft__handle_live(NULL, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_remove(p, WEFT__HANDLE_EXEC));
  assert_false(weft__handle_live(p, WEFT__HANDLE_EXEC)); /* this thread had it remembered */
  assert_true(weft__handle_dead(p, WEFT__HANDLE_EXEC));
  assert_false(weft__handle_remove(p, WEFT__HANDLE_EXEC)); /* a second destroy */
  weft__handle_restore(p, WEFT__HANDLE_EXEC);
  assert_true(weft__handle_live(p, WEFT__HANDLE_EXEC));
  assert_false(weft__handle_dead(p, WEFT__HANDLE_EXEC));
  /* A removal of another object also ends what this thread remembers, and p stays live. */
  assert_true(weft__handle_add(objects[1], WEFT__HANDLE_COMM));
  assert_true(weft__handle_remove(objects[1], WEFT__HANDLE_COMM));
  assert_true(weft__handle_live(p, WEFT__HANDLE_EXEC));
  /* The address taken by a new object of another kind (the old one destroyed). */
  assert_true(weft__handle_remove(p, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_add(p, WEFT__HANDLE_GRAPH));
  assert_false(weft__handle_live(p, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_live(p, WEFT__HANDLE_GRAPH));
  assert_true(weft__handle_remove(p, WEFT__HANDLE_GRAPH));
}

/* 8 threads ask about an object over and over; once each has asked many times (so each has it
 * remembered), the main thread removes it and then raises a flag. A thread that sees the flag and
 * still gets "live" has used a stale answer. */
#define THREADS 8
static atomic_int g_removed;
static atomic_uint g_asked;

typedef struct asker {
  unsigned live_before, stale, after;
} asker_t;

static void *ask(void *arg) {
  asker_t *a = arg;
  const void *p = objects[2];
  while (a->after < 1000) {
    int removed = atomic_load_explicit(&g_removed, memory_order_acquire);
    bool live = weft__handle_live(p, WEFT__HANDLE_COMM);
    if (!removed) {
      if (live) a->live_before++;
      atomic_fetch_add_explicit(&g_asked, 1, memory_order_relaxed);
    } else {
      a->after++;
      if (live) a->stale++;
    }
  }
  return NULL;
}

static void test_a_removal_ends_every_threads_remembered_answer(void **state) {
  (void)state;
  assert_true(weft__handle_add(objects[2], WEFT__HANDLE_COMM));
  pthread_t t[THREADS];
  asker_t a[THREADS] = {{0}};
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_create(&t[i], NULL, ask, &a[i]), 0);
  while (atomic_load_explicit(&g_asked, memory_order_relaxed) < THREADS * 2000u) sched_yield();
  assert_true(weft__handle_remove(objects[2], WEFT__HANDLE_COMM));
  atomic_store_explicit(&g_removed, 1, memory_order_release);
  for (int i = 0; i < THREADS; i++) assert_int_equal(pthread_join(t[i], NULL), 0);
  unsigned asked_live = 0;
  for (int i = 0; i < THREADS; i++) {
    if (a[i].stale != 0) fail_msg("thread %d: %u answers of live after the removal", i, a[i].stale);
    asked_live += a[i].live_before;
  }
  if (asked_live < THREADS * 2000u / 2) fail_msg("only %u live answers before the removal", asked_live);
}

/* A thread that uses a few objects in turn (a group's communicators, one per device, each kept
 * at its call; a step's execs) asks the set's lock about none of them twice while nothing is
 * removed, wherever they lie: eight objects 4 KiB apart (the spacing of one allocator size class,
 * where the remembered answers' slots once collided, so that two communicators of one group
 * took the lock at every call), asked in turn, then kept and left in turn. */
static void test_a_few_objects_used_in_turn_are_remembered(void **state) {
  (void)state;
  static _Alignas(4096) char area[8 * 4096];
  const void *p[8];
  for (int i = 0; i < 8; i++) {
    p[i] = area + i * 4096;
    assert_true(weft__handle_add(p[i], WEFT__HANDLE_COMM));
  }
  for (int i = 0; i < 8; i++) assert_true(weft__handle_live(p[i], WEFT__HANDLE_COMM));
  unsigned long before = weft__handle_lookups();
  for (int round = 0; round < 3; round++)
    for (int i = 0; i < 8; i++) assert_true(weft__handle_live(p[i], WEFT__HANDLE_COMM));
  for (int round = 0; round < 3; round++) {
    for (int i = 0; i < 8; i++) assert_true(weft__handle_keep(p[i], WEFT__HANDLE_COMM));
    for (int i = 8; i-- > 0;) weft__handle_unkeep(p[i]);
  }
  unsigned long looked = weft__handle_lookups() - before;
  if (looked != 0) fail_msg("%lu lookups under the set's lock for 48 questions about 8 objects asked before", looked);
  /* A removal makes every remembered answer stale: the next question looks again, once. */
  assert_true(weft__handle_add(area + 100, WEFT__HANDLE_COMM));
  assert_true(weft__handle_remove(area + 100, WEFT__HANDLE_COMM));
  before = weft__handle_lookups();
  for (int round = 0; round < 2; round++)
    for (int i = 0; i < 8; i++) assert_true(weft__handle_live(p[i], WEFT__HANDLE_COMM));
  assert_int_equal(weft__handle_lookups() - before, 8);
  for (int i = 0; i < 8; i++) assert_true(weft__handle_remove(p[i], WEFT__HANDLE_COMM));
  for (int i = 0; i < 8; i++) assert_false(weft__handle_live(p[i], WEFT__HANDLE_COMM));
}

/* A held handle (an object another draws from) is not removed until every holder lets go. */
static void test_a_held_handle_is_not_removed(void **state) {
  (void)state;
  const void *p = objects[3];
  assert_true(weft__handle_add(p, WEFT__HANDLE_RESOURCE));
  weft__handle_hold(p, WEFT__HANDLE_RESOURCE, +1);
  weft__handle_hold(p, WEFT__HANDLE_RESOURCE, +1);
  weft__handle_hold(p, WEFT__HANDLE_COMM, +1); /* another kind: nothing */
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_RESOURCE), WEFT__HANDLE_HELD);
  assert_false(weft__handle_remove(p, WEFT__HANDLE_RESOURCE));
  assert_true(weft__handle_live(p, WEFT__HANDLE_RESOURCE)); /* unchanged */
  weft__handle_hold(p, WEFT__HANDLE_RESOURCE, -1);
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_RESOURCE), WEFT__HANDLE_HELD);
  weft__handle_hold(p, WEFT__HANDLE_RESOURCE, -1);
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_RESOURCE), WEFT__HANDLE_REMOVED);
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_RESOURCE), WEFT__HANDLE_NOT_LIVE);
  assert_true(weft__handle_dead(p, WEFT__HANDLE_RESOURCE));
  weft__handle_hold(p, WEFT__HANDLE_RESOURCE, +1); /* a dead handle: nothing */
  weft__handle_restore(p, WEFT__HANDLE_RESOURCE);
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_RESOURCE), WEFT__HANDLE_REMOVED);
}


/* ---- calls inside an object (weft__handle_enter) ---- */

static atomic_int g_left;     /* the thread inside has left */
static atomic_int g_returned; /* the removal returned */

static void *remove_it(void *arg) {
  (void)arg;
  assert_true(weft__handle_remove(objects[3], WEFT__HANDLE_EXEC));
  atomic_store(&g_returned, 1);
  /* The removal may return only once the thread inside has left. */
  return (void *)(intptr_t)(atomic_load(&g_left) == 1);
}

/* With the calling thread's innermost entry in objects[3]: another thread removes it, and the
 * removal returns only once this thread has left that entry. */
static void removal_waits_for_the_innermost_entry(void) {
  atomic_store(&g_left, 0);
  atomic_store(&g_returned, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, remove_it, NULL), 0);
  while (weft__handle_live(objects[3], WEFT__HANDLE_EXEC)) sched_yield(); /* marked dead: the removal runs */
  for (int i = 0; i < 1000; i++) sched_yield();                           /* (it must still be waiting) */
  assert_int_equal(atomic_load(&g_returned), 0);
  atomic_store(&g_left, 1);
  weft__handle_leave();
  void *ok;
  pthread_join(t, &ok);
  assert_true(ok != NULL);
}

static void test_a_removal_waits_for_the_thread_inside(void **state) {
  (void)state;
  assert_true(weft__handle_add(objects[3], WEFT__HANDLE_EXEC));
  assert_true(weft__handle_enter(objects[3], WEFT__HANDLE_EXEC));
  removal_waits_for_the_innermost_entry();
  assert_false(weft__handle_enter(objects[3], WEFT__HANDLE_EXEC)); /* dead: nothing to enter */
  assert_false(weft__handle_enter(NULL, WEFT__HANDLE_EXEC));
}

/* Entries nest; past WEFT__HANDLE_DEPTH a thread publishes them in another record of its own,
 * and a removal by another thread waits for those as well. Leaving goes in reverse order. */
static void test_entries_nest_past_the_records_depth(void **state) {
  (void)state;
  assert_true(weft__handle_add(objects[3], WEFT__HANDLE_EXEC));
  for (int i = 0; i < WEFT__HANDLE_DEPTH + 2; i++) assert_true(weft__handle_enter(objects[3], WEFT__HANDLE_EXEC));
  assert_false(weft__handle_enter(objects[3], WEFT__HANDLE_GRAPH)); /* another kind: not entered */
  atomic_store(&g_left, 0);
  atomic_store(&g_returned, 0);
  pthread_t t;
  assert_int_equal(pthread_create(&t, NULL, remove_it, NULL), 0);
  for (int i = 0; i < 1000; i++) sched_yield();
  assert_int_equal(atomic_load(&g_returned), 0);
  atomic_store(&g_left, 1);
  for (int i = 0; i < WEFT__HANDLE_DEPTH + 2; i++) weft__handle_leave();
  void *ok;
  pthread_join(t, &ok);
  assert_true(ok != NULL);
}

enum { ENTERERS = 8 };
static atomic_int g_inside_now[ENTERERS];
static atomic_int g_stop;
static atomic_uint g_entries;

static void *enter_loop(void *arg) {
  unsigned me = (unsigned)(uintptr_t)arg;
  while (!atomic_load(&g_stop)) {
    if (!weft__handle_enter(objects[2], WEFT__HANDLE_EXEC)) {
      sched_yield(); /* removed: give the remover the CPU (2-CPU machines run 9 threads here) */
      continue;
    }
    atomic_store(&g_inside_now[me], 1);
    atomic_fetch_add(&g_entries, 1);
    atomic_store(&g_inside_now[me], 0);
    weft__handle_leave();
  }
  return NULL;
}

/* 8 threads enter and leave while the object is removed and added again: once a removal returns,
 * no thread is inside (whoever destroys it may free it). */
static void test_no_thread_is_inside_once_a_removal_returns(void **state) {
  (void)state;
  atomic_store(&g_stop, 0);
  atomic_store(&g_entries, 0);
  assert_true(weft__handle_add(objects[2], WEFT__HANDLE_EXEC));
  pthread_t t[ENTERERS];
  for (uintptr_t i = 0; i < ENTERERS; i++) assert_int_equal(pthread_create(&t[i], NULL, enter_loop, (void *)i), 0);
  unsigned seen_inside = 0;
  for (int round = 0; round < 100; round++) {
    unsigned before = atomic_load(&g_entries);
    while (atomic_load(&g_entries) < before + 20) sched_yield(); /* the threads are entering */
    assert_true(weft__handle_remove(objects[2], WEFT__HANDLE_EXEC));
    for (unsigned i = 0; i < ENTERERS; i++)
      if (atomic_load(&g_inside_now[i]) != 0) seen_inside++;
    weft__handle_restore(objects[2], WEFT__HANDLE_EXEC);
  }
  atomic_store(&g_stop, 1);
  for (int i = 0; i < ENTERERS; i++) pthread_join(t[i], NULL);
  assert_int_equal(seen_inside, 0);
}

/* ---- entries kept across the program's code (weft__handle_keep) ---- */

static atomic_int g_unkept;

static void *remove_kept(void *arg) {
  assert_true(weft__handle_remove(arg, WEFT__HANDLE_COMM));
  atomic_store(&g_returned, 1);
  return (void *)(intptr_t)(atomic_load(&g_unkept) == 1); /* only once the keeper let go */
}

static void *remove_now(void *arg) { return (void *)(intptr_t)weft__handle_remove(arg, WEFT__HANDLE_EXEC); }

static void *keep_and_end(void *arg) {
  return (void *)(intptr_t)weft__handle_keep(arg, WEFT__HANDLE_COMM); /* never unkept: the thread ends */
}

/* A kept entry is apart from the nested ones: leaving the innermost entry never leaves a kept
 * one, whichever came first (a group keeps its communicators from a call made inside another
 * entry, e.g. a capture handler inside an exec's launch). A removal on another thread waits for
 * the kept entry until weft__handle_unkeep; a thread that ends with entries kept holds nothing;
 * weft__handle_entries counts them all. */
static void test_kept_entries_are_apart_from_nested_ones(void **state) {
  (void)state;
  const void *x = objects[0], *c = objects[1], *gone = objects[2];
  assert_true(weft__handle_add(x, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_add(c, WEFT__HANDLE_COMM));
  assert_int_equal(weft__handle_entries(), 0);
  assert_true(weft__handle_enter(x, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_keep(c, WEFT__HANDLE_COMM)); /* made inside x's entry */
  assert_false(weft__handle_keep(x, WEFT__HANDLE_COMM)); /* another kind: not kept */
  assert_int_equal(weft__handle_entries(), 2);
  weft__handle_leave(); /* leaves x, not c */
  assert_int_equal(weft__handle_entries(), 1);
  pthread_t t;
  void *ok;
  assert_int_equal(pthread_create(&t, NULL, remove_now, (void *)x), 0);
  assert_int_equal(pthread_join(t, &ok), 0); /* (x still entered: the removal would never return) */
  assert_true(ok != NULL);
  atomic_store(&g_unkept, 0);
  atomic_store(&g_returned, 0);
  assert_int_equal(pthread_create(&t, NULL, remove_kept, (void *)c), 0);
  while (weft__handle_live(c, WEFT__HANDLE_COMM)) sched_yield(); /* marked dead: the removal runs */
  for (int i = 0; i < 1000; i++) sched_yield();                  /* (it must still be waiting) */
  assert_int_equal(atomic_load(&g_returned), 0);
  atomic_store(&g_unkept, 1);
  weft__handle_unkeep(c);
  assert_int_equal(weft__handle_entries(), 0);
  assert_int_equal(pthread_join(t, &ok), 0);
  assert_true(ok != NULL);
  assert_false(weft__handle_keep(c, WEFT__HANDLE_COMM)); /* dead: nothing kept */
  weft__handle_unkeep(c);                                 /* not kept: nothing happens */
  assert_int_equal(weft__handle_entries(), 0);
  /* Up to WEFT__HANDLE_KEPT at once; then none, and nested entries still work. */
  assert_true(weft__handle_add(c, WEFT__HANDLE_COMM));
  for (int i = 0; i < WEFT__HANDLE_KEPT; i++) assert_true(weft__handle_keep(c, WEFT__HANDLE_COMM));
  assert_false(weft__handle_keep(c, WEFT__HANDLE_COMM));
  assert_true(weft__handle_enter(c, WEFT__HANDLE_COMM));
  assert_int_equal(weft__handle_entries(), WEFT__HANDLE_KEPT + 1);
  weft__handle_leave();
  for (int i = 0; i < WEFT__HANDLE_KEPT; i++) weft__handle_unkeep(c);
  assert_int_equal(weft__handle_entries(), 0);
  assert_true(weft__handle_remove(c, WEFT__HANDLE_COMM));
  /* A thread that ends keeping an entry: its entries end with it. */
  assert_true(weft__handle_add(gone, WEFT__HANDLE_COMM));
  assert_int_equal(pthread_create(&t, NULL, keep_and_end, (void *)gone), 0);
  assert_int_equal(pthread_join(t, &ok), 0);
  assert_true(ok != NULL);
  assert_true(weft__handle_remove(gone, WEFT__HANDLE_COMM)); /* (would wait for ever) */
}

/* A removal by a thread that is inside the object (a capture handler that a call on it runs,
 * destroying it) is refused, WEFT__HANDLE_INSIDE, nothing changed: nested, kept and past-depth
 * (locked) entries alike. Other threads' removals still wait for the thread. */
static void test_a_removal_from_inside_the_object_is_refused(void **state) {
  (void)state;
  const void *p = objects[3];
  assert_true(weft__handle_add(p, WEFT__HANDLE_EXEC));
  assert_false(weft__handle_inside(p));
  assert_true(weft__handle_enter(p, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_inside(p));
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_EXEC), WEFT__HANDLE_INSIDE);
  assert_false(weft__handle_remove(p, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_live(p, WEFT__HANDLE_EXEC)); /* unchanged */
  weft__handle_leave();
  assert_false(weft__handle_inside(p));
  /* Kept. */
  assert_true(weft__handle_keep(p, WEFT__HANDLE_EXEC));
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_EXEC), WEFT__HANDLE_INSIDE);
  weft__handle_unkeep(p);
  /* Past the record's depth: an entry in the thread's next record, refused as well. */
  const void *q = objects[1];
  assert_true(weft__handle_add(q, WEFT__HANDLE_GRAPH));
  for (int i = 0; i < WEFT__HANDLE_DEPTH; i++) assert_true(weft__handle_enter(q, WEFT__HANDLE_GRAPH));
  assert_true(weft__handle_enter(p, WEFT__HANDLE_EXEC));
  assert_true(weft__handle_inside(p));
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_EXEC), WEFT__HANDLE_INSIDE);
  weft__handle_leave();
  assert_false(weft__handle_inside(p));
  for (int i = 0; i < WEFT__HANDLE_DEPTH; i++) weft__handle_leave();
  assert_int_equal(weft__handle_entries(), 0);
  assert_int_equal(weft__handle_remove_unheld(p, WEFT__HANDLE_EXEC), WEFT__HANDLE_REMOVED);
  assert_true(weft__handle_remove(q, WEFT__HANDLE_GRAPH));
}

/* ---- past the records (weft__handle_enter deep, or on more threads than WEFT__HANDLE_THREADS) ---- */

/* A thread nested past WEFT__HANDLE_DEPTH (and past a second record's depth) makes, holds and
 * destroys other objects as at any depth. Before, its deeper entries held the set's lock as a
 * reader: every make, hold or destroy on that thread was refused (a capture handler run from
 * deep inside weft's calls could make no object). */
static void test_deep_entries_make_hold_and_destroy_objects(void **state) {
  (void)state;
  const void *q = objects[1], *made = objects[2];
  assert_true(weft__handle_add(q, WEFT__HANDLE_GRAPH));
  for (int i = 0; i < 2 * WEFT__HANDLE_DEPTH + 3; i++) assert_true(weft__handle_enter(q, WEFT__HANDLE_GRAPH));
  assert_int_equal(weft__handle_entries(), 2 * WEFT__HANDLE_DEPTH + 3);
  assert_true(weft__handle_add(made, WEFT__HANDLE_BUILDER));
  assert_true(weft__handle_hold(made, WEFT__HANDLE_BUILDER, +1));
  assert_int_equal(weft__handle_remove_unheld(made, WEFT__HANDLE_BUILDER), WEFT__HANDLE_HELD);
  assert_true(weft__handle_hold(made, WEFT__HANDLE_BUILDER, -1));
  assert_int_equal(weft__handle_remove_unheld(made, WEFT__HANDLE_BUILDER), WEFT__HANDLE_REMOVED);
  assert_int_equal(weft__handle_remove_unheld(q, WEFT__HANDLE_GRAPH), WEFT__HANDLE_INSIDE);
  assert_true(weft__handle_inside(q));
  for (int i = 0; i < 2 * WEFT__HANDLE_DEPTH + 3; i++) weft__handle_leave();
  assert_int_equal(weft__handle_entries(), 0);
  assert_false(weft__handle_inside(q));
  assert_true(weft__handle_remove(q, WEFT__HANDLE_GRAPH));
}

/* An entry only in a thread's second record (8 entries of another object below it) holds a
 * removal on another thread until it is left, as one in the first record does. */
static void test_a_removal_waits_for_an_entry_in_the_next_record(void **state) {
  (void)state;
  const void *q = objects[1];
  assert_true(weft__handle_add(q, WEFT__HANDLE_GRAPH));
  assert_true(weft__handle_add(objects[3], WEFT__HANDLE_EXEC));
  for (int i = 0; i < WEFT__HANDLE_DEPTH; i++) assert_true(weft__handle_enter(q, WEFT__HANDLE_GRAPH));
  assert_true(weft__handle_enter(objects[3], WEFT__HANDLE_EXEC)); /* entry 9: the next record */
  removal_waits_for_the_innermost_entry();
  for (int i = 0; i < WEFT__HANDLE_DEPTH; i++) weft__handle_leave();
  assert_true(weft__handle_remove(q, WEFT__HANDLE_GRAPH));
}

/* More threads inside objects at once than WEFT__HANDLE_THREADS: each still makes and destroys
 * an object of its own while inside (before, the threads past the static records held the set's
 * lock as readers and every make was refused), and a removal of the object they are all inside
 * waits for every one of them, those in records beyond the static ones too. */
enum { CROWD = WEFT__HANDLE_THREADS + 64 };
static char g_own[CROWD][16];
static pthread_barrier_t g_crowd_in, g_crowd_out;
static atomic_int g_crowd_left, g_crowd_failed;

static void *crowd_member(void *arg) {
  uintptr_t i = (uintptr_t)arg;
  bool in = weft__handle_enter(objects[0], WEFT__HANDLE_EXEC);
  if (!in) atomic_fetch_add(&g_crowd_failed, 1);
  pthread_barrier_wait(&g_crowd_in); /* every thread inside at once */
  if (!weft__handle_add(g_own[i], WEFT__HANDLE_BUILDER) || !weft__handle_remove(g_own[i], WEFT__HANDLE_BUILDER))
    atomic_fetch_add(&g_crowd_failed, 1);
  pthread_barrier_wait(&g_crowd_out); /* the removal of objects[0] has begun */
  atomic_fetch_add(&g_crowd_left, 1);
  if (in) weft__handle_leave();
  return NULL;
}

static void *remove_crowded(void *arg) {
  (void)arg;
  bool removed = weft__handle_remove(objects[0], WEFT__HANDLE_EXEC);
  return (void *)(intptr_t)(removed && atomic_load(&g_crowd_left) == CROWD); /* only once all left */
}

static void test_more_threads_inside_than_records(void **state) {
  (void)state;
  assert_true(weft__handle_add(objects[0], WEFT__HANDLE_EXEC));
  atomic_store(&g_crowd_left, 0);
  atomic_store(&g_crowd_failed, 0);
  assert_int_equal(pthread_barrier_init(&g_crowd_in, NULL, CROWD + 1), 0);
  assert_int_equal(pthread_barrier_init(&g_crowd_out, NULL, CROWD + 1), 0);
  pthread_attr_t at;
  pthread_attr_init(&at);
  pthread_attr_setstacksize(&at, 256 * 1024);
  static pthread_t t[CROWD];
  for (uintptr_t i = 0; i < CROWD; i++) assert_int_equal(pthread_create(&t[i], &at, crowd_member, (void *)i), 0);
  pthread_attr_destroy(&at);
  pthread_barrier_wait(&g_crowd_in); /* every thread has entered */
  pthread_t r;
  assert_int_equal(pthread_create(&r, NULL, remove_crowded, NULL), 0);
  while (weft__handle_live(objects[0], WEFT__HANDLE_EXEC)) sched_yield(); /* marked dead: the removal waits */
  pthread_barrier_wait(&g_crowd_out);
  void *ok;
  assert_int_equal(pthread_join(r, &ok), 0);
  for (unsigned i = 0; i < CROWD; i++) pthread_join(t[i], NULL);
  pthread_barrier_destroy(&g_crowd_in);
  pthread_barrier_destroy(&g_crowd_out);
  assert_int_equal(atomic_load(&g_crowd_failed), 0);
  assert_true(ok != NULL);
}

int main(void) {
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_live_remove_restore_and_kinds),
      cmocka_unit_test(test_a_removal_ends_every_threads_remembered_answer),
      cmocka_unit_test(test_a_few_objects_used_in_turn_are_remembered),
      cmocka_unit_test(test_a_held_handle_is_not_removed),
      cmocka_unit_test(test_a_removal_waits_for_the_thread_inside),
      cmocka_unit_test(test_entries_nest_past_the_records_depth),
      cmocka_unit_test(test_no_thread_is_inside_once_a_removal_returns),
      cmocka_unit_test(test_kept_entries_are_apart_from_nested_ones),
      cmocka_unit_test(test_a_removal_from_inside_the_object_is_refused),
      cmocka_unit_test(test_deep_entries_make_hold_and_destroy_objects),
      cmocka_unit_test(test_a_removal_waits_for_an_entry_in_the_next_record),
      cmocka_unit_test(test_more_threads_inside_than_records),
  };
  return cmocka_run_group_tests(tests, NULL, NULL);
}
