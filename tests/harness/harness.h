/* harness.h — shared helpers of the C harness and the demo.
 *
 * The programs include only peerkv.h from the library and link only
 * libpeerkv.so. Every scenario runs in its own process; a peer it talks to
 * runs in another process (this binary, re-exec'd with a role), and the two
 * coordinate through text lines on pipes. Every wait is bounded. */
#ifndef PEERKV_HARNESS_H
#define PEERKV_HARNESS_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "peerkv.h"

#define KEY_LEN 16
#define ERRLEN 1024
#define MAX_JOBS 4096
#define MAX_HELD 4096
#define MAX_LOOKUPS 256

/* ---- failures and steps (util.c) ---- */

/* Name of this process's scenario and side ('a' runs the scenario, 'b' is
 * the remote peer), and the current step: failure messages carry all three. */
extern const char *g_scenario;
extern char g_side;
extern const char *g_step;

void step(const char *name);
__attribute__((noreturn, format(printf, 1, 2))) void failf(const char *fmt, ...);
#define CHECK(cond, ...)          \
  do {                            \
    if (!(cond)) failf(__VA_ARGS__); \
  } while (0)
/* Checks a peerkv status code and shows the library's message on failure. */
#define CHECK_RC(rc, want, err) \
  CHECK((rc) == (want), "%s:%d: rc=%d, want %d (%s)", __FILE__, __LINE__, (int)(rc), (int)(want), (err))

/* Fails the process after seconds with a message naming the current step. */
void arm_watchdog(unsigned seconds);
double now_s(void);
void sleep_ms(int ms);
const char *rc_name(int32_t rc);

/* ---- processes and pipes (util.c) ---- */

typedef struct child {
  pid_t pid;
  int to;   /* its stdin */
  int from; /* its stdout */
} child_t;

/* fork+exec of this very binary with args (NULL-terminated); env_extra is a
 * NULL-terminated list of NAME=VALUE set in the child only (may be NULL).
 * The child dies with its parent (PR_SET_PDEATHSIG). */
child_t spawn_self(const char *const args[], const char *const env_extra[], bool capture_stderr, int *stderr_fd);
__attribute__((format(printf, 2, 3))) void send_line(int fd, const char *fmt, ...);
/* 1 = a line was read (without '\n'), 0 = timeout, -1 = EOF. */
int read_line(int fd, char *buf, size_t cap, int timeout_ms);
/* Exit status (or 128+signal) of c; kills it and returns -1 after timeout. */
int wait_child(child_t *c, int timeout_ms);

/* ---- scenarios (scen_*.c) ---- */

typedef struct scenario {
  const char *name;
  void (*run_a)(void);     /* the scenario's own process */
  void (*run_b)(void);     /* the remote peer's process, or NULL */
  unsigned timeout_s;      /* watchdog of each process */
} scenario_t;

extern const scenario_t transfer_scenarios[];
extern const size_t n_transfer_scenarios;
extern const scenario_t api_scenarios[];
extern const size_t n_api_scenarios;
extern const scenario_t *g_current; /* the scenario this process runs */

/* Starts side b of the current scenario and reads its "ready <port>". */
child_t start_side_b(int *port_b);
/* Waits for side b to exit 0 (fails otherwise). */
void join_side_b(child_t *c);
/* Entry of the --panic-child process (scen_api.c). */
int panic_child_main(void);

/* ---- JSON ---- */

/* Value of an integer field "name" in a flat JSON object; fails if absent. */
long long json_int(const char *json, const char *name);
/* json_str copies string field name of a flat JSON object (no escapes). */
void json_str(const char *json, const char *name, char *out, size_t cap);

/* ---- rows and keys (node.c) ---- */

void make_key(uint8_t key[KEY_LEN], char tag, uint64_t index);
void fill_row(uint8_t *row, uint64_t row_len, const uint8_t key[KEY_LEN]);
/* 0 if row holds key's pattern, else the first differing byte offset + 1. */
uint64_t check_row(const uint8_t *row, uint64_t row_len, const uint8_t key[KEY_LEN]);

/* ---- a node as its host sees it (node.c) ---- */

typedef struct job {
  int64_t id;
  int is_load;
  int is_pin;
  uint64_t rows;
  int reported;
  int success;
  int64_t bytes;
  double seconds;
  double submitted_at, reported_at;
} job_t;

typedef struct hnode {
  peerkv_handle h;
  int port;
  uint8_t *region;
  int region_fd; /* the memfd behind region */
  uint64_t num_rows, row_len;
  char err[ERRLEN];

  job_t jobs[MAX_JOBS];
  size_t n_jobs;
  int64_t next_job_id;

  /* Rows this host holds for inbound lookups, and which answer
   * HIT_PENDING on their first evaluation. */
  uint8_t held_keys[MAX_HELD][KEY_LEN];
  int64_t held_slots[MAX_HELD];
  int held_pending_once[MAX_HELD];
  size_t n_held;

  /* Inbound lookups whose context is open (first EVALUATE seen). */
  int64_t open_lookups[MAX_LOOKUPS];
  size_t n_open_lookups;
  uint64_t lookups_started, lookups_ended, evaluations;
  /* When set, the next inbound item is first asked for with buffers that
   * are too small (checks PEERKV_ERR_BUFFER_TOO_SMALL leaves it queued). */
  int probe_small_buffers;
  int small_buffer_probes;
} hnode;

/* Creates a node on 127.0.0.1 at a free port (retrying ports in use).
 * extra_opts: more JSON members, e.g. "\"load_timeout_s\":3" (or ""). */
void node_open(hnode *p, uint64_t num_rows, uint64_t row_len, const char *extra_opts);
uint8_t *node_row(hnode *p, int64_t slot);
int64_t node_new_job(hnode *p, int is_load, int is_pin, uint64_t rows);
job_t *node_job(hnode *p, int64_t id);
void node_hold(hnode *p, const uint8_t key[KEY_LEN], int64_t slot, int pending_once);
/* One host step: collect finished jobs (each exactly once) and serve inbound
 * lookups (pinning held rows). */
void node_pump(hnode *p);
/* Pumps until job id is reported or timeout; returns it (fails on timeout). */
job_t *node_wait_job(hnode *p, int64_t id, double timeout_s);
/* Pumps while waiting for a line on fd. 1 = line, -1 = EOF, fails on timeout. */
int node_wait_line(hnode *p, int fd, char *buf, size_t cap, double timeout_s);
/* Looks keys up until no answer is RETRY (calling on_schedule_end and
 * pumping between tries); results land in out. */
void node_lookup_settled(hnode *p, const char *req, const uint8_t *keys, size_t n, int32_t *out, double timeout_s);
/* Leak check: pumps until no pending work, then asserts the library holds no
 * job, pinned row, parked store or inbound lookup, and the host tracked
 * every job exactly once. */
void node_check_clean(hnode *p, double timeout_s);
/* An integer field of peerkv_stats, e.g. "bytes_out". */
long long node_stat(hnode *p, const char *field);
void node_close(hnode *p);
/* Nodes whose library logs failf prints (node_open registers, node_close
 * unregisters). */
void node_register(hnode *p, int on);
void dump_registered_logs(void);
/* Prints the library's queued log lines to stderr. */
void node_dump_logs(hnode *p);

#endif
