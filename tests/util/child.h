/* A child process that may hang on a GPU (the conformance programs show such hangs this way):
 * waits for it a bounded time (header only). */
#pragma once

#include <signal.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>

/** Waits up to `seconds` for child `pid`: its exit status (128 + the signal if a signal ended
 * it), or -1 when it was still running then (it is killed and reaped). */
static inline int tu_wait_child(pid_t pid, int seconds) {
  struct timespec tick = {0, 10 * 1000 * 1000};
  for (int i = 0; i < seconds * 100; i++) {
    int status;
    if (waitpid(pid, &status, WNOHANG) == pid) return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    nanosleep(&tick, NULL);
  }
  kill(pid, SIGKILL);
  waitpid(pid, NULL, 0);
  return -1;
}
