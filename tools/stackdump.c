/* Diagnostic preload for machines without gdb: SIGUSR1 to the process prints the stack of every
 * thread (glibc backtrace, raw addresses: symbolise with addr2line against the same binaries) to
 * the file named by STACKDUMP_FILE (default stderr). Not async-signal-safe; for hung processes only.
 *   gcc -shared -fPIC -O1 -o libstackdump.so tools/stackdump.c
 *   LD_PRELOAD=./libstackdump.so STACKDUMP_FILE=stacks.txt prog & ... kill -USR1 $pid */
#define _GNU_SOURCE
#include <dirent.h>
#include <execinfo.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static int out_fd = 2;

static void dump_self(int sig) {
  (void)sig;
  void *b[64];
  int n = backtrace(b, 64);
  char hdr[96];
  int l = snprintf(hdr, sizeof hdr, "--- thread %ld\n", (long)syscall(SYS_gettid));
  if (write(out_fd, hdr, (size_t)l) < 0) return;
  backtrace_symbols_fd(b, n, out_fd);
}

static void dump_all(int sig) {
  long me = (long)syscall(SYS_gettid);
  DIR *d = opendir("/proc/self/task");
  if (d != NULL) {
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
      long tid = atol(e->d_name);
      if (tid > 0 && tid != me) syscall(SYS_tgkill, (long)getpid(), tid, SIGUSR2);
    }
    closedir(d);
  }
  dump_self(sig);
}

__attribute__((constructor)) static void stackdump_init(void) {
  const char *f = getenv("STACKDUMP_FILE");
  if (f != NULL && *f) {
    int fd = open(f, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd >= 0) out_fd = fd;
  }
  void *b[4];
  (void)backtrace(b, 4); /* loads libgcc before any signal */
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_flags = SA_RESTART;
  sa.sa_handler = dump_all;
  sigaction(SIGUSR1, &sa, NULL);
  sa.sa_handler = dump_self;
  sigaction(SIGUSR2, &sa, NULL);
}
