/* Live handles of the heap objects weft gives out (graphs, execs, graph pools, builders, the
 * resources weft_*_create makes): a call with a destroyed one, or a second destroy, is told from
 * a live object (STALE_HANDLE) instead of touching freed memory. One set for the process, keyed
 * by address, with the object's kind, under a reader-writer lock that is a leaf (nothing else is
 * called while it is held, so it may be taken under any other lock).
 * Destroyed objects stay in the set, marked dead, until a new object takes their address. An
 * address reused by a new object of the same kind makes an old handle look live again: the set
 * catches use after destroy until then, not forever. */
#ifndef WEFT_CORE_HANDLE_H
#define WEFT_CORE_HANDLE_H

#include <stdbool.h>

#include "weft/weft.h"

typedef enum weft__handle_kind {
  WEFT__HANDLE_GRAPH = 1,
  WEFT__HANDLE_EXEC = 2,
  WEFT__HANDLE_GRAPH_POOL = 3,
  WEFT__HANDLE_BUILDER = 4,
  WEFT__HANDLE_RESOURCE = 5,
  WEFT__HANDLE_COMM = 6,
} weft__handle_kind_t;

/** Registers a new object; false when out of host memory, or while the calling thread holds the
 * set's lock as a reader (an entry with no record: the write lock would wait for ever). */
bool weft__handle_add(const void *p, weft__handle_kind_t kind);
/** True while p is a live object of that kind. Lock-free while the calling thread asked about p
 * before and no handle was removed since (a per-thread memory of positive answers). */
bool weft__handle_live(const void *p, weft__handle_kind_t kind);
/** How many times the calling thread has looked an object up in the set under its lock
 * (weft__handle_live's and an entry's slow path: no remembered answer); for tests and
 * diagnostics. */
unsigned long weft__handle_lookups(void);
/** Marks p destroyed; false when it was not a live object of that kind (destroyed already), is
 * held (weft__handle_hold) or the calling thread is inside it. */
bool weft__handle_remove(const void *p, weft__handle_kind_t kind);
/** A destroy's removal of p as the status it returns: weft__handle_remove_unheld, then WEFT_OK
 * (removed), STALE_HANDLE (destroyed already) or BUSY (held: `held` says by what; or the calling
 * thread is inside p, a capture handler that a call on p runs), each recorded for `fn` with
 * `what` naming p's kind ("exec", "communicator"). */
weft_status_t weft__handle_unlist(const void *p, weft__handle_kind_t kind, const char *fn, const char *what,
                                  const char *held);
/** What weft__handle_remove_unheld did. */
typedef enum weft__handle_removal {
  WEFT__HANDLE_REMOVED,  /* p is marked destroyed */
  WEFT__HANDLE_NOT_LIVE, /* not a live object of that kind (destroyed already): unchanged */
  WEFT__HANDLE_HELD,     /* live, but held by another object: unchanged */
  WEFT__HANDLE_INSIDE,   /* the calling thread is inside it (weft__handle_enter / _keep: a call
                            of its own that reads p runs the caller, e.g. a capture handler), or
                            holds the set's lock as a reader (an entry with no record): p is
                            live, or dead with another thread's removal waiting for this thread;
                            unchanged (a destroy says BUSY) */
} weft__handle_removal_t;
/** weft__handle_remove, telling a held handle, or one the calling thread is inside, from a dead
 * one. Every destroy of an object that calls enter uses it: a removal waits for other threads'
 * entries, never for the caller's own. */
weft__handle_removal_t weft__handle_remove_unheld(const void *p, weft__handle_kind_t kind);
/** One more (delta +1) or one fewer (-1) object holds live handle p (a resource another draws
 * from): a held handle is not removed. Nothing for a p that is not a live handle of that kind
 * (a resource weft did not make): returns whether p was one. A +1 while the calling thread holds
 * the set's lock as a reader does nothing and returns false (as weft__handle_add). */
bool weft__handle_hold(const void *p, weft__handle_kind_t kind, int delta);
/** Marks p live again after weft__handle_remove, for a destroy that failed and changed nothing
 * (no allocation: the entry stayed in the set). Meanwhile calls with p saw STALE_HANDLE. */
void weft__handle_restore(const void *p, weft__handle_kind_t kind);
/** Enters live object p for a call that reads it after this check (a launch of an exec): true,
 * and until weft__handle_leave p is not freed; or false (p is not a live object of that kind),
 * nothing to leave. A removal (weft__handle_remove*) marks p dead at once, then waits until no
 * other thread is inside p: whoever destroys p frees it only after every call that entered it has
 * left. Calls inside p must not wait for a destroy of p on another thread. Each thread publishes
 * what it is inside in a slot of its own (a hazard pointer: one store and a fence, no lock, no
 * shared line written). WEFT__HANDLE_THREADS records are static, more are made on demand (for
 * more threads inside at once), and a thread nested past WEFT__HANDLE_DEPTH takes one more record
 * per WEFT__HANDLE_DEPTH entries, up to WEFT__HANDLE_LEVELS records (32 entries deep at most). A
 * thread's entries end with it. Only a thread that can get no record (no host memory for more, or
 * no thread-exit destructor to give it back) holds the set's lock as a reader instead, until it
 * leaves (and makes and destroys no object meanwhile). */
bool weft__handle_enter(const void *p, weft__handle_kind_t kind);
/** Leaves the object the calling thread entered last (weft__handle_enter returned true). */
void weft__handle_leave(void);
/** Enters live object p, as weft__handle_enter, for longer than a call: the entry stays while
 * the thread runs the program's code, until weft__handle_unkeep(p) (a group stays inside its
 * communicators from its calls to its end). Kept entries are apart from the nested ones:
 * weft__handle_leave never leaves one, whatever was entered before or after it. False, nothing
 * entered, when p is not a live object of that kind or the thread has no free kept slot
 * (WEFT__HANDLE_KEPT, or no record: then enter for each call instead). */
bool weft__handle_keep(const void *p, weft__handle_kind_t kind);
/** Leaves one kept entry of p (weft__handle_keep); nothing when the thread keeps none (its
 * entries ended with a thread-exit destructor). */
void weft__handle_unkeep(const void *p);
/** The calling thread's entries now: nested (weft__handle_enter) and kept (for assertions and
 * tests: a call that returns has left what it entered). */
unsigned weft__handle_entries(void);
/** The calling thread's kept entries now (weft__handle_keep): fewer than it kept once the
 * thread's entries ended (a thread-exit destructor ran before the keeper's). */
unsigned weft__handle_kept(void);
/** Whether the calling thread is inside p (an entry, nested or kept, not yet left). */
bool weft__handle_inside(const void *p);
#define WEFT__HANDLE_THREADS 1024
/* Nested entries per record (weft's calls nest a few levels deep; past it, the thread's next
 * record), and entries kept at once (a group keeps up to COMM_HELD, comm/comm.c). */
#define WEFT__HANDLE_DEPTH 8
#define WEFT__HANDLE_KEPT 8
/* Records one thread nests through: WEFT__HANDLE_LEVELS * WEFT__HANDLE_DEPTH (32) nested entries
 * at most (a deeper one is a bug of weft's: its debug builds abort). */
#define WEFT__HANDLE_LEVELS 4

/** True when p was an object of that kind and was destroyed (and its address not reused since):
 * what tells a destroyed weft resource from a resource a user wrote, which weft never saw. */
bool weft__handle_dead(const void *p, weft__handle_kind_t kind);

#endif /* WEFT_CORE_HANDLE_H */
