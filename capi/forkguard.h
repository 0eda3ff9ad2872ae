/* forkguard.h — fork detection that never enters the Go runtime. */
#ifndef PEERKV_FORKGUARD_H
#define PEERKV_FORKGUARD_H

#include <stddef.h>

/* Returns 1 (and writes why into err) in a child forked after the library
 * was loaded, else 0. Pure C: a forked child's Go runtime has no scheduler
 * threads, so any call into Go there can hang forever. */
int pkv_in_forked_child(char *err, size_t errlen);

#endif
