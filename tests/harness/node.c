/* node.c — a peerkv node as its host (vLLM's scheduler) drives it. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

/* ---- keys and row patterns ---- */

void make_key(uint8_t key[KEY_LEN], char tag, uint64_t index) {
  memset(key, 0, KEY_LEN);
  memcpy(key, "pkv", 3);
  key[3] = (uint8_t)tag;
  for (int i = 0; i < 8; i++) key[8 + i] = (uint8_t)(index >> (8 * i));
}

static uint64_t mix64(uint64_t x) { /* splitmix64 finalizer */
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

static uint64_t key_seed(const uint8_t key[KEY_LEN]) { /* FNV-1a */
  uint64_t h = 0xcbf29ce484222325ULL;
  for (int i = 0; i < KEY_LEN; i++) h = (h ^ key[i]) * 0x100000001b3ULL;
  return h;
}

/* Word w of key's row: every byte depends on the key and its offset. */
static uint64_t pattern_word(uint64_t seed, uint64_t w) { return mix64(seed + w * 0x9e3779b97f4a7c15ULL); }

void fill_row(uint8_t *row, uint64_t row_len, const uint8_t key[KEY_LEN]) {
  uint64_t seed = key_seed(key);
  for (uint64_t w = 0; w < row_len / 8; w++) {
    uint64_t v = pattern_word(seed, w);
    memcpy(row + w * 8, &v, 8);
  }
}

uint64_t check_row(const uint8_t *row, uint64_t row_len, const uint8_t key[KEY_LEN]) {
  uint64_t seed = key_seed(key);
  for (uint64_t w = 0; w < row_len / 8; w++) {
    uint64_t v = pattern_word(seed, w);
    if (memcmp(row + w * 8, &v, 8) != 0) {
      for (int b = 0; b < 8; b++)
        if (row[w * 8 + b] != ((const uint8_t *)&v)[b]) return w * 8 + b + 1;
    }
  }
  return 0;
}

/* ---- node lifecycle ---- */

static hnode *registered[8];

void node_register(hnode *p, int on) {
  for (size_t i = 0; i < 8; i++) {
    if (on && registered[i] == NULL) {
      registered[i] = p;
      return;
    }
    if (!on && registered[i] == p) registered[i] = NULL;
  }
}

void dump_registered_logs(void) {
  for (size_t i = 0; i < 8; i++) {
    if (registered[i] == NULL) continue;
    fprintf(stderr, "---- library log of %s/%c node on port %d ----\n", g_scenario, g_side, registered[i]->port);
    node_dump_logs(registered[i]);
  }
}

void node_open(hnode *p, uint64_t num_rows, uint64_t row_len, const char *extra_opts) {
  memset(p, 0, sizeof *p);
  CHECK(row_len % 8 == 0, "row_len must be a multiple of 8");
  p->num_rows = num_rows;
  p->row_len = row_len;
  p->next_job_id = 1000;
  /* Host-owned region, file-backed and shared as vLLM's /dev/shm region is,
   * so same-host peers can be granted it (the shm path). The fd stays open
   * while the region lives: it is how the library finds the file. */
  p->region_fd = memfd_create("peerkv-harness-region", MFD_CLOEXEC);
  CHECK(p->region_fd >= 0, "memfd_create: %s", strerror(errno));
  CHECK(ftruncate(p->region_fd, (off_t)(num_rows * row_len)) == 0, "ftruncate region: %s", strerror(errno));
  p->region = mmap(NULL, num_rows * row_len, PROT_READ | PROT_WRITE, MAP_SHARED, p->region_fd, 0);
  CHECK(p->region != MAP_FAILED, "mmap region: %s", strerror(errno));
  int base = 20000 + (int)((getpid() * 7919u + (unsigned)(now_s() * 1000)) % 30000u);
  for (int attempt = 0; attempt < 64; attempt++) {
    int port = base + attempt * 7;
    char opts[1024];
    snprintf(opts, sizeof opts,
             "{\"host\":\"127.0.0.1\",\"port\":%d,\"data_host\":\"127.0.0.1\",\"data_port\":0,"
             "\"key_len\":%d,\"handshake_timeout_s\":5,\"lookup_timeout_s\":5,"
             "\"shutdown_drain_timeout_s\":2,\"drain_timeout_s\":10%s%s}",
             port, KEY_LEN, extra_opts[0] ? "," : "", extra_opts);
    int32_t rc = peerkv_create(PEERKV_ABI_VERSION_MAJOR, p->region, num_rows, row_len, opts, &p->h, p->err, ERRLEN);
    if (rc == PEERKV_ERR_TRANSPORT) continue; /* port taken: try another */
    CHECK_RC(rc, PEERKV_OK, p->err);
    CHECK(p->h != 0, "peerkv_create returned handle 0");
    CHECK(p->err[0] == '\0', "err not cleared on success: %s", p->err);
    p->port = port;
    node_register(p, 1);
    return;
  }
  failf("no free port found near %d", base);
}

uint8_t *node_row(hnode *p, int64_t slot) {
  CHECK(slot >= 0 && (uint64_t)slot < p->num_rows, "slot %lld out of range", (long long)slot);
  return p->region + (uint64_t)slot * p->row_len;
}

int64_t node_new_job(hnode *p, int is_load, int is_pin, uint64_t rows) {
  CHECK(p->n_jobs < MAX_JOBS, "too many jobs");
  job_t *j = &p->jobs[p->n_jobs++];
  memset(j, 0, sizeof *j);
  j->id = p->next_job_id++;
  j->is_load = is_load;
  j->is_pin = is_pin;
  j->rows = rows;
  j->submitted_at = now_s();
  return j->id;
}

job_t *node_job(hnode *p, int64_t id) {
  for (size_t i = 0; i < p->n_jobs; i++)
    if (p->jobs[i].id == id) return &p->jobs[i];
  return NULL;
}

void node_hold(hnode *p, const uint8_t key[KEY_LEN], int64_t slot, int pending_once) {
  CHECK(p->n_held < MAX_HELD, "too many held rows");
  memcpy(p->held_keys[p->n_held], key, KEY_LEN);
  p->held_slots[p->n_held] = slot;
  p->held_pending_once[p->n_held] = pending_once;
  p->n_held++;
}

static long find_held(hnode *p, const uint8_t *key) {
  for (size_t i = 0; i < p->n_held; i++)
    if (memcmp(p->held_keys[i], key, KEY_LEN) == 0) return (long)i;
  return -1;
}

/* ---- the host's per-step work ---- */

static void collect_finished(hnode *p) {
  peerkv_job_result out[64];
  for (int round = 0; round < 1000; round++) {
    size_t n = 0;
    int32_t rc = peerkv_get_finished(p->h, out, 64, &n, p->err, ERRLEN);
    CHECK_RC(rc, PEERKV_OK, p->err);
    for (size_t i = 0; i < n; i++) {
      job_t *j = node_job(p, out[i].job_id);
      CHECK(j != NULL, "job %lld reported but never submitted", (long long)out[i].job_id);
      CHECK(!j->reported, "job %lld reported twice", (long long)j->id);
      CHECK(out[i].is_load == j->is_load, "job %lld reported is_load=%d, submitted as %d", (long long)j->id,
            out[i].is_load, j->is_load);
      CHECK(out[i].success == 0 || out[i].success == 1, "job %lld success=%d", (long long)j->id, out[i].success);
      CHECK(out[i].seconds >= 0, "job %lld seconds=%f", (long long)j->id, out[i].seconds);
      j->reported = 1;
      j->success = out[i].success;
      j->bytes = out[i].bytes;
      j->seconds = out[i].seconds;
      j->reported_at = now_s();
    }
    if (n < 64) return;
  }
  failf("get_finished never drained");
}

static void open_lookup(hnode *p, int64_t id) {
  for (size_t i = 0; i < p->n_open_lookups; i++)
    CHECK(p->open_lookups[i] != id, "inbound lookup %lld: first EVALUATE twice", (long long)id);
  CHECK(p->n_open_lookups < MAX_LOOKUPS, "too many open lookups");
  p->open_lookups[p->n_open_lookups++] = id;
  p->lookups_started++;
}

static int lookup_is_open(hnode *p, int64_t id) {
  for (size_t i = 0; i < p->n_open_lookups; i++)
    if (p->open_lookups[i] == id) return 1;
  return 0;
}

static void close_lookup(hnode *p, int64_t id) {
  for (size_t i = 0; i < p->n_open_lookups; i++) {
    if (p->open_lookups[i] == id) {
      p->open_lookups[i] = p->open_lookups[--p->n_open_lookups];
      p->lookups_ended++;
      return;
    }
  }
  failf("inbound lookup %lld ended but its context was not open", (long long)id);
}

/* Answers one EVALUATE the way vLLM's tier manager does: HIT for held rows
 * (pinned as one job), HIT_PENDING once for rows marked so, MISS otherwise. */
static void evaluate(hnode *p, int64_t lookup_id, const uint8_t *keys, size_t n) {
  int32_t *results = calloc(n ? n : 1, sizeof *results);
  int64_t *pins = calloc(n ? n : 1, sizeof *pins);
  CHECK(results && pins, "out of memory");
  size_t n_pins = 0;
  for (size_t i = 0; i < n; i++) {
    long at = find_held(p, keys + i * KEY_LEN);
    if (at < 0) {
      results[i] = PEERKV_LOOKUP_MISS;
    } else if (p->held_pending_once[at]) {
      p->held_pending_once[at] = 0;
      results[i] = PEERKV_LOOKUP_HIT_PENDING;
    } else {
      results[i] = PEERKV_LOOKUP_HIT;
      pins[n_pins++] = p->held_slots[at];
    }
  }
  int64_t pin_job = n_pins > 0 ? node_new_job(p, 0, 1, n_pins) : -1;
  int32_t finished = -1;
  int32_t rc = peerkv_answer_inbound(p->h, lookup_id, results, n, pin_job, pins, n_pins, &finished, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  CHECK(finished == 0 || finished == 1, "answer_inbound finished=%d", finished);
  if (finished) close_lookup(p, lookup_id);
  p->evaluations++;
  free(results);
  free(pins);
}

/* Asks for the next inbound item with a 4-byte req_id buffer and no key
 * buffer: it must be refused with the sizes it needs, and stay queued. */
static void probe_small_buffers(hnode *p) {
  int64_t lookup_id = -1;
  int32_t kind = 0, first = -1;
  char req_id[4];
  size_t req_needed = 0, n_keys = 0;
  int32_t rc = peerkv_next_inbound(p->h, &lookup_id, &kind, &first, req_id, sizeof req_id, &req_needed, NULL, 0,
                                   &n_keys, p->err, ERRLEN);
  if (rc == 1) return; /* nothing queued yet */
  CHECK_RC(rc, PEERKV_ERR_BUFFER_TOO_SMALL, p->err);
  CHECK(req_needed > sizeof req_id && n_keys > 0, "BUFFER_TOO_SMALL with req_id_needed=%zu n_keys=%zu", req_needed,
        n_keys);
  p->probe_small_buffers = 0;
  p->small_buffer_probes++;
}

static void serve_inbound(hnode *p) {
  static uint8_t keys[MAX_HELD * KEY_LEN];
  if (p->probe_small_buffers) probe_small_buffers(p);
  for (int round = 0; round < 1000; round++) {
    int64_t lookup_id = -1;
    int32_t kind = 0, first = -1;
    char req_id[256];
    size_t req_needed = 0, n_keys = 0;
    int32_t rc = peerkv_next_inbound(p->h, &lookup_id, &kind, &first, req_id, sizeof req_id, &req_needed, keys,
                                     sizeof keys, &n_keys, p->err, ERRLEN);
    if (rc == 1) return;
    CHECK_RC(rc, PEERKV_OK, p->err);
    CHECK(strncmp(req_id, "p2p:", 4) == 0, "inbound req_id %s does not start with p2p:", req_id);
    CHECK(req_needed == strlen(req_id) + 1, "req_id_needed=%zu for %s", req_needed, req_id);
    if (kind == PEERKV_INBOUND_FINISH) {
      close_lookup(p, lookup_id);
      continue;
    }
    CHECK(kind == PEERKV_INBOUND_EVALUATE, "inbound kind %d", kind);
    if (first) {
      open_lookup(p, lookup_id);
    } else {
      CHECK(lookup_is_open(p, lookup_id), "re-EVALUATE of lookup %lld that is not open", (long long)lookup_id);
    }
    evaluate(p, lookup_id, keys, n_keys);
  }
  failf("inbound queue never drained");
}

void node_pump(hnode *p) {
  collect_finished(p);
  serve_inbound(p);
}

job_t *node_wait_job(hnode *p, int64_t id, double timeout_s) {
  job_t *j = node_job(p, id);
  CHECK(j != NULL, "waiting for unknown job %lld", (long long)id);
  double deadline = now_s() + timeout_s;
  while (!j->reported) {
    CHECK(now_s() < deadline, "job %lld not reported within %.1fs", (long long)id, timeout_s);
    node_pump(p);
    sleep_ms(1);
  }
  return j;
}

int node_wait_line(hnode *p, int fd, char *buf, size_t cap, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    node_pump(p);
    int r = read_line(fd, buf, cap, 1);
    if (r != 0) return r;
    CHECK(now_s() < deadline, "no line from the other process within %.1fs", timeout_s);
  }
}

void node_lookup_settled(hnode *p, const char *req, const uint8_t *keys, size_t n, int32_t *out, double timeout_s) {
  double deadline = now_s() + timeout_s;
  for (;;) {
    int32_t rc = peerkv_lookup(p->h, req, keys, KEY_LEN, n, out, p->err, ERRLEN);
    CHECK_RC(rc, PEERKV_OK, p->err);
    size_t retry = 0;
    for (size_t i = 0; i < n; i++) {
      CHECK(out[i] == PEERKV_LOOKUP_HIT || out[i] == PEERKV_LOOKUP_MISS || out[i] == PEERKV_LOOKUP_RETRY,
            "lookup result[%zu]=%d", i, out[i]);
      retry += out[i] == PEERKV_LOOKUP_RETRY;
    }
    if (retry == 0) return;
    CHECK(now_s() < deadline, "%zu of %zu keys still RETRY after %.1fs", retry, n, timeout_s);
    rc = peerkv_on_schedule_end(p->h, p->err, ERRLEN);
    CHECK_RC(rc, PEERKV_OK, p->err);
    node_pump(p);
    sleep_ms(1);
  }
}

void node_check_clean(hnode *p, double timeout_s) {
  double deadline = now_s() + timeout_s;
  int32_t pending;
  for (;;) {
    node_pump(p);
    pending = peerkv_has_pending_work(p->h);
    CHECK(pending >= 0, "has_pending_work=%d", pending);
    if (pending == 0 || now_s() > deadline) break;
    sleep_ms(2);
  }
  node_pump(p);
  int32_t rc = peerkv_drain(p->h, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  char stats[4096];
  size_t needed = 0;
  rc = peerkv_stats(p->h, stats, sizeof stats, &needed, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  CHECK(needed == strlen(stats) + 1, "stats needed=%zu for %zu bytes", needed, strlen(stats));
  static const char *const zero_fields[] = {"jobs_in_flight", "jobs_unreported", "parked_stores",
                                            "inbound_queued", "inbound_active", "expected_rows"};
  for (size_t i = 0; i < sizeof zero_fields / sizeof zero_fields[0]; i++)
    CHECK(json_int(stats, zero_fields[i]) == 0, "leak: %s != 0 in %s", zero_fields[i], stats);
  for (size_t i = 0; i < p->n_jobs; i++)
    CHECK(p->jobs[i].reported, "job %lld (%s) never reported", (long long)p->jobs[i].id,
          p->jobs[i].is_pin ? "pin" : p->jobs[i].is_load ? "load" : "store");
  CHECK(p->n_open_lookups == 0, "%zu inbound lookup contexts never ended", p->n_open_lookups);
  CHECK(pending == 0, "has_pending_work still 1 after %.1fs: %s", timeout_s, stats);
}

void node_dump_logs(hnode *p) {
  char buf[8192];
  for (int i = 0; i < 64; i++) {
    size_t n = 0;
    if (peerkv_take_logs(p->h, buf, sizeof buf, &n) != PEERKV_OK || n == 0) return;
    fprintf(stderr, "%s", buf);
  }
}

void node_close(hnode *p) {
  if (getenv("PEERKV_HARNESS_LOGS") != NULL) node_dump_logs(p);
  node_register(p, 0);
  int32_t rc = peerkv_shutdown(p->h, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  rc = peerkv_destroy(p->h, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  /* Destroy is idempotent; other calls now name the handle unknown. */
  rc = peerkv_destroy(p->h, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  rc = peerkv_on_schedule_end(p->h, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_ERR_UNKNOWN_HANDLE, p->err);
  munmap(p->region, p->num_rows * p->row_len);
  p->region = NULL;
  close(p->region_fd);
  p->region_fd = -1;
}

long long node_stat(hnode *p, const char *field) {
  char stats[4096];
  size_t needed = 0;
  int32_t rc = peerkv_stats(p->h, stats, sizeof stats, &needed, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  return json_int(stats, field);
}
