/* forkguard.c — marks forked children so every export can refuse them. */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <unistd.h>

#include "forkguard.h"

static volatile sig_atomic_t forked_child;
static pid_t loaded_in_pid;

static void mark_forked_child(void) { forked_child = 1; }

/* Runs at dlopen time, before any export can be called. */
__attribute__((constructor)) static void pkv_forkguard_init(void) {
  loaded_in_pid = getpid();
  pthread_atfork(NULL, NULL, mark_forked_child);
}

int pkv_in_forked_child(char *err, size_t errlen) {
  if (!forked_child) return 0;
  if (err != NULL && errlen > 0) {
    snprintf(err, errlen,
             "libpeerkv was loaded in pid %ld; this is forked child %ld; "
             "load the library after fork/spawn",
             (long)loaded_in_pid, (long)getpid());
  }
  return 1;
}
