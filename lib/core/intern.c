/* A chained hash set of strings under one mutex; it only grows. Tags are few: weft_alloc interns
 * its tag on every call, so each thread remembers its last tag and asks the set only for a new
 * one. */
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "lib/core/intern.h"
#include "lib/core/meta.h"

typedef struct entry {
  struct entry *next;
  uint64_t hash;
  char s[];
} entry_t;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static entry_t **g_table;
static size_t g_cap, g_count;

static uint64_t fnv1a(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int grow(void) {
  size_t cap = g_cap ? g_cap * 2 : 64;
  entry_t **t = weft__meta_calloc(cap, sizeof *t);
  if (t == NULL) return 0;
  for (size_t i = 0; i < g_cap; i++)
    for (entry_t *e = g_table[i], *next; e != NULL; e = next) {
      next = e->next;
      e->next = t[e->hash & (cap - 1)];
      t[e->hash & (cap - 1)] = e;
    }
  weft__meta_free(g_table);
  g_table = t;
  g_cap = cap;
  return 1;
}

/* The calling thread's last tag: the string it was asked for and the interned copy. A caller
 * may reuse its buffer for another tag, so a hit also compares the text. */
static _Thread_local const char *last_asked, *last_found;

const char *weft__intern(const char *s) {
  if (s == NULL) s = "";
  if (s == last_asked && strcmp(s, last_found) == 0) return last_found;
  uint64_t h = fnv1a(s);
  const char *found = NULL;
  pthread_mutex_lock(&g_lock);
  if (g_cap != 0)
    for (entry_t *e = g_table[h & (g_cap - 1)]; e != NULL; e = e->next)
      if (e->hash == h && strcmp(e->s, s) == 0) {
        found = e->s;
        break;
      }
  if (found == NULL && (g_count < g_cap * 2 || grow())) {
    size_t n = strlen(s) + 1;
    entry_t *e = weft__meta_alloc(sizeof *e + n);
    if (e != NULL) {
      e->hash = h;
      memcpy(e->s, s, n);
      e->next = g_table[h & (g_cap - 1)];
      g_table[h & (g_cap - 1)] = e;
      g_count++;
      found = e->s;
    }
  }
  pthread_mutex_unlock(&g_lock);
  if (found != NULL) {
    last_asked = s;
    last_found = found;
  }
  return found;
}
