/* scen_transfer.c — scenarios that move rows between two processes. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define ROWS 64
#define ROW_LEN (64 * 1024)

static hnode node; /* this process's node (large: static) */

/* ---- shared steps ---- */

static void keys_for(uint8_t *keys, char tag, size_t first, size_t n) {
  for (size_t i = 0; i < n; i++) make_key(keys + i * KEY_LEN, tag, first + i);
}

static void fill_rows(hnode *p, const uint8_t *keys, const int64_t *slots, size_t n) {
  for (size_t i = 0; i < n; i++) fill_row(node_row(p, slots[i]), p->row_len, keys + i * KEY_LEN);
}

static void verify_rows(hnode *p, const uint8_t *keys, const int64_t *slots, size_t n) {
  for (size_t i = 0; i < n; i++) {
    uint64_t bad = check_row(node_row(p, slots[i]), p->row_len, keys + i * KEY_LEN);
    CHECK(bad == 0, "row %lld (key %zu): byte %llu differs from the producer's pattern", (long long)slots[i], i,
          (unsigned long long)(bad - 1));
  }
}

static int32_t start(hnode *p, const char *req, const char *params_json) {
  int32_t policy = -1;
  int32_t rc = peerkv_request_start(p->h, req, params_json, &policy, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  return policy;
}

static void finish(hnode *p, const char *req) {
  int32_t rc = peerkv_request_finish(p->h, req, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
}

static int64_t submit(hnode *p, int is_load, const char *req, const uint8_t *keys, const int64_t *slots, size_t n) {
  int64_t job = node_new_job(p, is_load, 0, n);
  int32_t rc = is_load ? peerkv_submit_load(p->h, req, job, keys, KEY_LEN, n, slots, p->err, ERRLEN)
                       : peerkv_submit_store(p->h, req, job, keys, KEY_LEN, n, slots, p->err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, p->err);
  return job;
}

static void expect_success(job_t *j, uint64_t row_len) {
  CHECK(j->success == 1, "job %lld (%s) failed", (long long)j->id, j->is_load ? "load" : "store");
  CHECK(j->bytes == (int64_t)(j->rows * row_len), "job %lld reported %lld bytes, want %llu", (long long)j->id,
        (long long)j->bytes, (unsigned long long)(j->rows * row_len));
}

static void expect_all(const int32_t *results, size_t n, int32_t want, const char *what) {
  for (size_t i = 0; i < n; i++) CHECK(results[i] == want, "%s: result[%zu]=%d, want %d", what, i, results[i], want);
}

static char *pd_source(char *buf, size_t cap, const char *key, const char *kv, int port) {
  snprintf(buf, cap, "{\"%s\":{\"kv_request_id\":\"%s\",\"remote_host\":\"127.0.0.1\",\"remote_port\":%d}}", key, kv,
           port);
  return buf;
}

/* Side b reports its port, then the sides exchange lines. */
child_t start_side_b(int *port_b) {
  const char *args[] = {"--scenario", g_current->name, "b", NULL};
  child_t c = spawn_self(args, NULL, false, NULL);
  char line[128];
  step("wait for side b");
  CHECK(read_line(c.from, line, sizeof line, 20000) == 1, "side b did not start");
  CHECK(sscanf(line, "ready %d", port_b) == 1, "side b said %s", line);
  return c;
}

void join_side_b(child_t *c) {
  step("join side b");
  int status = wait_child(c, 20000);
  CHECK(status == 0, "side b exited with status %d", status);
}

/* a: wait for a line from b while serving; returns it in line. */
static void expect_line(hnode *p, int fd, const char *want, char *line, size_t cap) {
  CHECK(node_wait_line(p, fd, line, cap, 20) == 1, "side b closed its pipe before saying %s", want);
  CHECK(strncmp(line, want, strlen(want)) == 0, "side b said '%s', want '%s'", line, want);
}

/* b: the scenario side's lines arrive on stdin. */
static void b_expect(hnode *p, const char *want, char *line, size_t cap) {
  int r = p ? node_wait_line(p, 0, line, cap, 20) : read_line(0, line, cap, 20000);
  CHECK(r == 1, "side a went away before saying %s", want);
  CHECK(strncmp(line, want, strlen(want)) == 0, "side a said '%s', want '%s'", line, want);
}

/* b: serves like an idle engine woken by the library: it calls in only when
 * the notification fd (peerkv_notify_fd) is readable, reading it first and
 * then collecting until empty (the header's order), until side a says want.
 * *wakes counts the wake-ups. Every wait is bounded. */
static void b_serve_on_notify(hnode *p, int nfd, const char *want, char *line, size_t cap, int *wakes) {
  double deadline = now_s() + 20;
  for (;;) {
    int left = (int)((deadline - now_s()) * 1000);
    CHECK(left > 0, "neither the notification fd nor side a ('%s') woke the producer within 20 s", want);
    struct pollfd pfd[2] = {{.fd = nfd, .events = POLLIN}, {.fd = 0, .events = POLLIN}};
    int r = poll(pfd, 2, left);
    if (r < 0 && errno == EINTR) continue;
    CHECK(r >= 0, "poll: %s", strerror(errno));
    if (r == 0) continue;
    CHECK(!(pfd[0].revents & (POLLERR | POLLNVAL)), "notification fd revents %#x", pfd[0].revents);
    if (pfd[0].revents & POLLIN) {
      uint64_t count = 0;
      ssize_t n = read(nfd, &count, sizeof count);
      CHECK(n == (ssize_t)sizeof count && count > 0, "read of the notification fd: %zd (%s), count %llu", n,
            n < 0 ? strerror(errno) : "short", (unsigned long long)count);
      (*wakes)++;
      node_pump(p); /* get_finished until empty, then next_inbound until 1 */
    }
    if (pfd[1].revents & (POLLIN | POLLHUP)) {
      CHECK(read_line(0, line, cap, 1000) == 1, "side a went away before saying %s", want);
      CHECK(strncmp(line, want, strlen(want)) == 0, "side a said '%s', want '%s'", line, want);
      return;
    }
  }
}

/* ---- PD, prefiller first ---- */

#define PD_N 32

static void pd_prefiller_first_b(void) {
  step("open prefiller");
  node_open(&node, ROWS, ROW_LEN, "");
  uint8_t keys[PD_N * KEY_LEN];
  int64_t slots[PD_N];
  keys_for(keys, 'P', 0, PD_N);
  for (int i = 0; i < PD_N; i++) slots[i] = i;
  fill_rows(&node, keys, slots, PD_N);
  step("store before the decoder asks");
  int32_t policy = start(&node, "prefill-1", "{\"remote_decoder\":{\"kv_request_id\":\"kv-pd-1\"}}");
  CHECK(policy == PEERKV_POLICY_REQUEST_LEVEL, "prefiller policy %d, want REQUEST_LEVEL", policy);
  int64_t job = submit(&node, 0, "prefill-1", keys, slots, PD_N);
  finish(&node, "prefill-1"); /* the prefill ends; its rows stay parked for the decoder */
  send_line(1, "ready %d", node.port);
  char line[128];
  step("serve the decoder");
  b_expect(&node, "done", line, sizeof line);
  expect_success(node_wait_job(&node, job, 10), ROW_LEN);
  step("leak check");
  node_check_clean(&node, 5);
  send_line(1, "clean");
  b_expect(NULL, "bye", line, sizeof line);
  node_close(&node);
}

static void pd_prefiller_first_a(void) {
  step("open decoder");
  node_open(&node, ROWS, ROW_LEN, "");
  int port_b;
  child_t b = start_side_b(&port_b);
  uint8_t keys[PD_N * KEY_LEN];
  int64_t slots[PD_N];
  int32_t results[PD_N];
  keys_for(keys, 'P', 0, PD_N);
  for (int i = 0; i < PD_N; i++) slots[i] = ROWS - 1 - i; /* a different row mapping than the producer's */
  step("decoder lookup");
  char params[256];
  int32_t policy = start(&node, "decode-1", pd_source(params, sizeof params, "remote_prefiller", "kv-pd-1", port_b));
  CHECK(policy == PEERKV_POLICY_BLOCK_LEVEL, "decoder policy %d", policy);
  int32_t rc = peerkv_lookup(node.h, "decode-1", keys, KEY_LEN, PD_N, results, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  expect_all(results, PD_N, PEERKV_LOOKUP_HIT, "PD decoder lookup");
  step("decoder load");
  int64_t job = submit(&node, 1, "decode-1", keys, slots, PD_N);
  expect_success(node_wait_job(&node, job, 15), ROW_LEN);
  verify_rows(&node, keys, slots, PD_N);
  finish(&node, "decode-1");
  step("leak check");
  node_check_clean(&node, 5);
  send_line(b.to, "done");
  char line[128];
  expect_line(&node, b.from, "clean", line, sizeof line);
  send_line(b.to, "bye");
  join_side_b(&b);
  node_close(&node);
}

/* ---- PD, decoder first ---- */

static void pd_decoder_first_b(void) {
  step("open prefiller");
  node_open(&node, ROWS, ROW_LEN, "");
  send_line(1, "ready %d", node.port);
  char line[128];
  step("wait for the decoder's load");
  b_expect(&node, "loading", line, sizeof line);
  /* Keep serving a moment so the decoder's fetch arrives before any store. */
  double until = now_s() + 0.2;
  while (now_s() < until) {
    node_pump(&node);
    sleep_ms(2);
  }
  step("store after the decoder asked, in two batches");
  uint8_t keys[PD_N * KEY_LEN];
  int64_t slots[PD_N];
  keys_for(keys, 'D', 0, PD_N);
  for (int i = 0; i < PD_N; i++) slots[i] = 2 * i;
  fill_rows(&node, keys, slots, PD_N);
  start(&node, "prefill-2", "{\"remote_decoder\":{\"kv_request_id\":\"kv-pd-2\"}}");
  int64_t j1 = submit(&node, 0, "prefill-2", keys, slots, PD_N / 2);
  int64_t j2 = submit(&node, 0, "prefill-2", keys + (PD_N / 2) * KEY_LEN, slots + PD_N / 2, PD_N / 2);
  expect_success(node_wait_job(&node, j1, 10), ROW_LEN);
  expect_success(node_wait_job(&node, j2, 10), ROW_LEN);
  finish(&node, "prefill-2");
  send_line(1, "stored");
  b_expect(&node, "done", line, sizeof line);
  step("leak check");
  node_check_clean(&node, 5);
  send_line(1, "clean");
  b_expect(NULL, "bye", line, sizeof line);
  node_close(&node);
}

static void pd_decoder_first_a(void) {
  step("open decoder");
  node_open(&node, ROWS, ROW_LEN, "");
  int port_b;
  child_t b = start_side_b(&port_b);
  uint8_t keys[PD_N * KEY_LEN];
  int64_t slots[PD_N];
  int32_t results[PD_N];
  keys_for(keys, 'D', 0, PD_N);
  for (int i = 0; i < PD_N; i++) slots[i] = 10 + i;
  step("decoder loads before anything is stored");
  char params[256];
  start(&node, "decode-2", pd_source(params, sizeof params, "remote_prefiller", "kv-pd-2", port_b));
  int32_t rc = peerkv_lookup(node.h, "decode-2", keys, KEY_LEN, PD_N, results, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  expect_all(results, PD_N, PEERKV_LOOKUP_HIT, "PD decoder lookup");
  int64_t job = submit(&node, 1, "decode-2", keys, slots, PD_N);
  send_line(b.to, "loading");
  step("decoder load completes once the prefiller stores");
  expect_success(node_wait_job(&node, job, 15), ROW_LEN);
  verify_rows(&node, keys, slots, PD_N);
  char line[128];
  expect_line(&node, b.from, "stored", line, sizeof line);
  finish(&node, "decode-2");
  step("leak check");
  node_check_clean(&node, 5);
  send_line(b.to, "done");
  expect_line(&node, b.from, "clean", line, sizeof line);
  send_line(b.to, "bye");
  join_side_b(&b);
  node_close(&node);
}

/* ---- P2P with partial hits ---- */

#define P2P_N 24
#define P2P_PENDING_KEY 1 /* answered HIT_PENDING on its first evaluation */

static int p2p_held(size_t i) { return i % 4 != 3; }

/* HIT: the key and every key before it are held (vLLM loads a prefix; key
 * 3 ends it, so the keys held after it are MISS and not pulled). */
static int p2p_hit(size_t i) {
  for (size_t j = 0; j <= i; j++)
    if (!p2p_held(j)) return 0;
  return 1;
}

/* The end of a P2P pull of P2P_N keys: the answers are as p2p_hit says,
 * the hits load intact, nothing is left on either side. */
static void p2p_load_hits_and_end(child_t *b, const char *req, const uint8_t *keys, const int32_t *results) {
  uint8_t hit_keys[P2P_N * KEY_LEN];
  int64_t hit_slots[P2P_N];
  size_t n_hits = 0;
  for (size_t i = 0; i < P2P_N; i++) {
    int32_t want = p2p_hit(i) ? PEERKV_LOOKUP_HIT : PEERKV_LOOKUP_MISS;
    CHECK(results[i] == want, "key %zu: %d, want %d", i, results[i], want);
    if (results[i] == PEERKV_LOOKUP_HIT) {
      memcpy(hit_keys + n_hits * KEY_LEN, keys + i * KEY_LEN, KEY_LEN);
      hit_slots[n_hits] = 32 + (int64_t)n_hits;
      n_hits++;
    }
  }
  step("load the hits only");
  int64_t job = submit(&node, 1, req, hit_keys, hit_slots, n_hits);
  expect_success(node_wait_job(&node, job, 15), ROW_LEN);
  verify_rows(&node, hit_keys, hit_slots, n_hits);
  finish(&node, req);
  step("leak check");
  node_check_clean(&node, 5);
  send_line(b->to, "done");
  char line[128];
  expect_line(&node, b->from, "clean", line, sizeof line);
  send_line(b->to, "bye");
  join_side_b(b);
  node_close(&node);
}

static void p2p_partial_b(void) {
  step("open source");
  node_open(&node, ROWS, ROW_LEN, "");
  for (size_t i = 0; i < P2P_N; i++) {
    if (!p2p_held(i)) continue;
    uint8_t key[KEY_LEN];
    make_key(key, 'Q', i);
    fill_row(node_row(&node, (int64_t)i), ROW_LEN, key);
    node_hold(&node, key, (int64_t)i, i == P2P_PENDING_KEY);
  }
  node.probe_small_buffers = 1;
  step("open the notification fd");
  int nfd = peerkv_notify_fd(node.h, node.err, ERRLEN);
  CHECK(nfd >= 0, "peerkv_notify_fd: %d (%s)", nfd, node.err);
  CHECK(node.err[0] == '\0', "err not cleared on success: %s", node.err);
  int again = peerkv_notify_fd(node.h, node.err, ERRLEN);
  CHECK(again == nfd, "peerkv_notify_fd returned %d, then %d", nfd, again);
  struct pollfd quiet = {.fd = nfd, .events = POLLIN};
  CHECK(poll(&quiet, 1, 0) == 0, "the notification fd is readable before anything happened");
  send_line(1, "ready %d", node.port);
  char line[128];
  step("serve lookups and fetches when the notification fd says so");
  int wakes = 0;
  b_serve_on_notify(&node, nfd, "done", line, sizeof line, &wakes);
  /* The lookup, the re-offer of the HIT_PENDING key and the pin job's result
   * each woke us: without them a key would have ended MISS and side a failed. */
  CHECK(wakes >= 2, "the notification fd woke the producer %d time(s)", wakes);
  step("leak check");
  node_check_clean(&node, 5);
  CHECK(node.lookups_started >= 1 && node.lookups_started == node.lookups_ended,
        "inbound lookups started %llu, ended %llu", (unsigned long long)node.lookups_started,
        (unsigned long long)node.lookups_ended);
  CHECK(node.evaluations >= 2, "HIT_PENDING key was never re-evaluated (%llu evaluations)",
        (unsigned long long)node.evaluations);
  CHECK(node.small_buffer_probes == 1, "the too-small-buffer probe never met an inbound item");
  send_line(1, "clean");
  b_expect(NULL, "bye", line, sizeof line);
  node_close(&node);
}

static void p2p_partial_a(void) {
  step("open consumer");
  node_open(&node, ROWS, ROW_LEN, "");
  int port_b;
  child_t b = start_side_b(&port_b);
  uint8_t keys[P2P_N * KEY_LEN];
  int32_t results[P2P_N];
  keys_for(keys, 'Q', 0, P2P_N);
  char params[256];
  step("first lookup answers RETRY");
  int32_t policy = start(&node, "p2p-1", pd_source(params, sizeof params, "remote_kv_source", "kv-p2p-1", port_b));
  CHECK(policy == PEERKV_POLICY_BLOCK_LEVEL, "P2P consumer policy %d", policy);
  int32_t rc = peerkv_lookup(node.h, "p2p-1", keys, KEY_LEN, P2P_N, results, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  expect_all(results, P2P_N, PEERKV_LOOKUP_RETRY, "first P2P lookup");
  step("lookups settle into HIT and MISS");
  node_lookup_settled(&node, "p2p-1", keys, P2P_N, results, 10);
  p2p_load_hits_and_end(&b, "p2p-1", keys, results);
}

/* ---- the same pull by a host that caches answers (ABI 1.1) ---- */

static uint32_t le32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* Applies peerkv_take_answers' records for request req to told. */
static void apply_answers(const uint8_t *buf, size_t n, const char *req, int32_t *told, size_t n_told) {
  size_t at = 0;
  while (at < n) {
    CHECK(n - at >= 12, "answer record truncated at %zu of %zu", at, n);
    uint32_t id_len = le32(buf + at);
    CHECK(id_len == strlen(req) && memcmp(buf + at + 4, req, id_len) == 0, "answers for another request");
    at += (4 + id_len + 3) & ~(size_t)3;
    uint32_t flags = le32(buf + at), count = le32(buf + at + 4);
    at += 8;
    CHECK(flags == 0, "request reported failed (flags %u)", flags);
    for (uint32_t i = 0; i < count; i++) {
      uint32_t pos = le32(buf + at + 4 * i);
      CHECK(pos < n_told, "position %u beyond the %zu keys asked", pos, n_told);
      told[pos] = buf[at + 4 * count + i];
    }
    at += (5 * (size_t)count + 3) & ~(size_t)3;
  }
}

static void p2p_cached_a(void) {
  step("open consumer");
  node_open(&node, ROWS, ROW_LEN, "");
  int port_b;
  child_t b = start_side_b(&port_b);
  uint8_t keys[P2P_N * KEY_LEN];
  int32_t told[P2P_N];
  keys_for(keys, 'Q', 0, P2P_N);
  char params[256];
  start(&node, "p2p-c", pd_source(params, sizeof params, "remote_kv_source", "kv-p2p-c", port_b));
  step("lookup mode and news counts");
  int32_t mode = -1;
  int32_t rc = peerkv_request_lookup_mode(node.h, "p2p-c", &mode, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  CHECK(mode == PEERKV_LOOKUPS_ASK, "lookup mode %d, want ASK", mode);
  const volatile uint64_t *news = NULL;
  rc = peerkv_news(node.h, &news, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  uint64_t seen = news[PEERKV_NEWS_ANSWERS];
  step("one call asks every key");
  const char *ids[1] = {"p2p-c"};
  size_t counts[1] = {P2P_N};
  rc = peerkv_lookup_many(node.h, 1, ids, counts, keys, KEY_LEN, told, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  expect_all(told, P2P_N, PEERKV_LOOKUP_RETRY, "first cached lookup");
  step("answers arrive as news; no key is asked again");
  uint8_t small[8], buf[4096];
  int probed_small = 0;
  double deadline = now_s() + 10;
  for (;;) {
    int waiting = 0;
    for (size_t i = 0; i < P2P_N; i++) waiting += told[i] == PEERKV_LOOKUP_RETRY;
    if (!waiting) break;
    CHECK(now_s() < deadline, "%d keys still RETRY after 10 s", waiting);
    if (news[PEERKV_NEWS_ANSWERS] == seen) {
      sleep_ms(2);
      continue;
    }
    seen = news[PEERKV_NEWS_ANSWERS];
    size_t n = 0;
    if (!probed_small) {
      probed_small = 1;
      rc = peerkv_take_answers(node.h, small, sizeof small, &n, node.err, ERRLEN);
      CHECK_RC(rc, PEERKV_ERR_BUFFER_TOO_SMALL, node.err);
      CHECK(n > sizeof small && n <= sizeof buf, "needed %zu", n);
    }
    do {
      rc = peerkv_take_answers(node.h, buf, sizeof buf, &n, node.err, ERRLEN);
      CHECK_RC(rc, PEERKV_OK, node.err);
      apply_answers(buf, n, "p2p-c", told, P2P_N);
    } while (n > 0);
  }
  p2p_load_hits_and_end(&b, "p2p-c", keys, told);
}

/* ---- remote_decoder + remote_kv_source on one request ---- */

#define COMBO_N 16
#define COMBO_HELD 8 /* the source holds the first 8 keys */

static void combo_b(void) {
  step("open prefiller");
  node_open(&node, ROWS, ROW_LEN, "");
  send_line(1, "ready %d", node.port);
  char line[128];
  b_expect(&node, "go", line, sizeof line);
  int port_a;
  CHECK(sscanf(line, "go %d", &port_a) == 1, "bad line %s", line);
  uint8_t keys[COMBO_N * KEY_LEN];
  int64_t slots[COMBO_N];
  int32_t results[COMBO_N];
  keys_for(keys, 'R', 0, COMBO_N);
  for (int i = 0; i < COMBO_N; i++) slots[i] = i;
  step("prefill request pulls its prefix from the source");
  char params[512];
  snprintf(params, sizeof params,
           "{\"remote_decoder\":{\"kv_request_id\":\"kv-pd-3\"},"
           "\"remote_kv_source\":{\"kv_request_id\":\"kv-src-3\",\"remote_host\":\"127.0.0.1\",\"remote_port\":%d}}",
           port_a);
  int32_t policy = start(&node, "prefill-3", params);
  CHECK(policy == PEERKV_POLICY_REQUEST_LEVEL, "combined policy %d, want REQUEST_LEVEL", policy);
  node_lookup_settled(&node, "prefill-3", keys, COMBO_N, results, 10);
  for (int i = 0; i < COMBO_N; i++)
    CHECK(results[i] == (i < COMBO_HELD ? PEERKV_LOOKUP_HIT : PEERKV_LOOKUP_MISS), "key %d: %d", i, results[i]);
  int64_t load = submit(&node, 1, "prefill-3", keys, slots, COMBO_HELD);
  expect_success(node_wait_job(&node, load, 15), ROW_LEN);
  verify_rows(&node, keys, slots, COMBO_HELD);
  step("compute the misses, store everything for the decoder");
  fill_rows(&node, keys + COMBO_HELD * KEY_LEN, slots + COMBO_HELD, COMBO_N - COMBO_HELD);
  int64_t store = submit(&node, 0, "prefill-3", keys, slots, COMBO_N);
  finish(&node, "prefill-3");
  send_line(1, "stored");
  b_expect(&node, "done", line, sizeof line);
  expect_success(node_wait_job(&node, store, 10), ROW_LEN);
  step("leak check");
  node_check_clean(&node, 5);
  send_line(1, "clean");
  b_expect(NULL, "bye", line, sizeof line);
  node_close(&node);
}

static void combo_a(void) {
  step("open source + decoder");
  node_open(&node, ROWS, ROW_LEN, "");
  for (int i = 0; i < COMBO_HELD; i++) {
    uint8_t key[KEY_LEN];
    make_key(key, 'R', (uint64_t)i);
    fill_row(node_row(&node, 48 + i), ROW_LEN, key);
    node_hold(&node, key, 48 + i, 0);
  }
  int port_b;
  child_t b = start_side_b(&port_b);
  send_line(b.to, "go %d", node.port);
  char line[128];
  step("serve the prefiller's lookup");
  expect_line(&node, b.from, "stored", line, sizeof line);
  step("decode everything from the prefiller");
  uint8_t keys[COMBO_N * KEY_LEN];
  int64_t slots[COMBO_N];
  int32_t results[COMBO_N];
  keys_for(keys, 'R', 0, COMBO_N);
  for (int i = 0; i < COMBO_N; i++) slots[i] = 16 + i;
  char params[256];
  start(&node, "decode-3", pd_source(params, sizeof params, "remote_prefiller", "kv-pd-3", port_b));
  int32_t rc = peerkv_lookup(node.h, "decode-3", keys, KEY_LEN, COMBO_N, results, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  expect_all(results, COMBO_N, PEERKV_LOOKUP_HIT, "decoder lookup");
  int64_t job = submit(&node, 1, "decode-3", keys, slots, COMBO_N);
  expect_success(node_wait_job(&node, job, 15), ROW_LEN);
  verify_rows(&node, keys, slots, COMBO_N); /* rows 0..7 went source -> prefiller -> decoder */
  finish(&node, "decode-3");
  step("leak check");
  node_check_clean(&node, 5);
  CHECK(node.lookups_started >= 1 && node.lookups_started == node.lookups_ended, "source lookups %llu/%llu",
        (unsigned long long)node.lookups_started, (unsigned long long)node.lookups_ended);
  send_line(b.to, "done");
  expect_line(&node, b.from, "clean", line, sizeof line);
  send_line(b.to, "bye");
  join_side_b(&b);
  node_close(&node);
}

/* ---- the producer is killed mid-transfer ---- */

#define KILL_ROWS 256
#define KILL_ROW_LEN (1024 * 1024)
#define KILL_OPTS "\"load_timeout_s\":3,\"abort_ack_timeout_s\":1,\"handshake_timeout_s\":2"

static void killed_producer_b(void) {
  step("open prefiller");
  node_open(&node, KILL_ROWS, KILL_ROW_LEN, KILL_OPTS);
  static uint8_t keys[KILL_ROWS * KEY_LEN];
  static int64_t slots[KILL_ROWS];
  keys_for(keys, 'K', 0, KILL_ROWS);
  for (int i = 0; i < KILL_ROWS; i++) slots[i] = i;
  fill_rows(&node, keys, slots, KILL_ROWS);
  start(&node, "prefill-k", "{\"remote_decoder\":{\"kv_request_id\":\"kv-kill\"}}");
  submit(&node, 0, "prefill-k", keys, slots, KILL_ROWS);
  send_line(1, "ready %d", node.port);
  step("serve until killed");
  char line[128];
  b_expect(&node, "never", line, sizeof line);
  failf("side a should have killed this process");
}

static void killed_producer_a(void) {
  step("open decoder");
  node_open(&node, KILL_ROWS, KILL_ROW_LEN, KILL_OPTS);
  int port_b;
  child_t b = start_side_b(&port_b);
  static uint8_t keys[KILL_ROWS * KEY_LEN];
  static int64_t slots[KILL_ROWS];
  keys_for(keys, 'K', 0, KILL_ROWS);
  for (int i = 0; i < KILL_ROWS; i++) slots[i] = i;
  char params[256];
  start(&node, "decode-k", pd_source(params, sizeof params, "remote_prefiller", "kv-kill", port_b));
  int64_t job = submit(&node, 1, "decode-k", keys, slots, KILL_ROWS);
  step("kill the producer once rows start landing");
  /* The first 8 bytes of a row flip to the producer's pattern when that row
   * starts arriving. */
  double deadline = now_s() + 10;
  int arrived = 0;
  while (!arrived) {
    CHECK(now_s() < deadline, "no row arrived within 10s");
    for (int i = 0; i < KILL_ROWS && !arrived; i++) {
      uint8_t head[8];
      fill_row(head, 8, keys + i * KEY_LEN);
      arrived = memcmp(node_row(&node, i), head, 8) == 0;
    }
  }
  double killed_at = now_s();
  kill(b.pid, SIGKILL);
  step("the load is reported failed within its deadline");
  job_t *j = node_wait_job(&node, job, 3 + 1 + 2);
  int complete = 0;
  for (int i = 0; i < KILL_ROWS; i++) complete += check_row(node_row(&node, i), KILL_ROW_LEN, keys + i * KEY_LEN) == 0;
  CHECK(j->success == 0, "load succeeded although the producer was killed (%d of %d rows complete)", complete, KILL_ROWS);
  CHECK(complete < KILL_ROWS, "all rows complete, yet the load failed");
  fprintf(stderr, "  killed_producer: load failed %.2fs after the kill with %d of %d rows complete\n",
          j->reported_at - killed_at, complete, KILL_ROWS);
  int status = wait_child(&b, 5000);
  CHECK(status == 128 + SIGKILL, "producer exit status %d, want killed", status);
  finish(&node, "decode-k");
  step("leak check");
  node_check_clean(&node, 5);
  node_close(&node);
}

/* ---- one prompt from two producers (three processes) ---- */

#define TWO_N 64
#define TWO_FIRST_END 48    /* the first producer holds keys 0..47 */
#define TWO_SECOND_BEGIN 16 /* the second holds keys 16..63 */

/* b (started twice): a producer holding the keys side a names. */
static void two_sources_b(void) {
  step("open producer");
  node_open(&node, ROWS, ROW_LEN, "");
  send_line(1, "ready %d", node.port);
  char line[128];
  unsigned first, end;
  b_expect(&node, "hold", line, sizeof line);
  CHECK(sscanf(line, "hold %u %u", &first, &end) == 2 && first < end && end <= ROWS, "bad line %s", line);
  for (unsigned i = first; i < end; i++) {
    uint8_t key[KEY_LEN];
    make_key(key, 'M', i);
    fill_row(node_row(&node, (int64_t)i), ROW_LEN, key);
    node_hold(&node, key, (int64_t)i, 0);
  }
  send_line(1, "held");
  step("serve the consumer's lookups and fetches");
  b_expect(&node, "done", line, sizeof line);
  step("leak check");
  node_check_clean(&node, 5);
  CHECK(node.lookups_started >= 1 && node.lookups_started == node.lookups_ended, "inbound lookups %llu/%llu",
        (unsigned long long)node.lookups_started, (unsigned long long)node.lookups_ended);
  send_line(1, "clean %lld", node_stat(&node, "bytes_out"));
  b_expect(NULL, "bye", line, sizeof line);
  node_close(&node);
}

static void two_sources_a(void) {
  step("open consumer");
  node_open(&node, ROWS, ROW_LEN, "");
  int port[2];
  child_t b[2] = {start_side_b(&port[0]), start_side_b(&port[1])};
  char line[128];
  send_line(b[0].to, "hold 0 %d", TWO_FIRST_END);
  send_line(b[1].to, "hold %d %d", TWO_SECOND_BEGIN, TWO_N);
  for (int i = 0; i < 2; i++) expect_line(&node, b[i].from, "held", line, sizeof line);
  step("one request, two sources, ids left to the consumer");
  char params[256];
  snprintf(params, sizeof params,
           "{\"remote_kv_source\":[\"tcp://127.0.0.1:%d\",{\"remote_url\":\"tcp://127.0.0.1:%d\"}]}", port[0],
           port[1]);
  int32_t policy = start(&node, "two-1", params);
  CHECK(policy == PEERKV_POLICY_BLOCK_LEVEL, "P2P consumer policy %d", policy);
  CHECK(node_stat(&node, "kv_ids_minted") == 2, "kv_ids_minted %lld, want 2", node_stat(&node, "kv_ids_minted"));
  uint8_t keys[TWO_N * KEY_LEN];
  int64_t slots[TWO_N];
  int32_t results[TWO_N];
  keys_for(keys, 'M', 0, TWO_N);
  for (int i = 0; i < TWO_N; i++) slots[i] = i;
  step("the sources' holdings make one prefix");
  node_lookup_settled(&node, "two-1", keys, TWO_N, results, 10);
  expect_all(results, TWO_N, PEERKV_LOOKUP_HIT, "two-source lookup");
  step("load the prefix from both");
  int64_t job = submit(&node, 1, "two-1", keys, slots, TWO_N);
  expect_success(node_wait_job(&node, job, 15), ROW_LEN);
  verify_rows(&node, keys, slots, TWO_N);
  finish(&node, "two-1");
  step("leak check");
  node_check_clean(&node, 5);
  long long served[2];
  for (int i = 0; i < 2; i++) {
    send_line(b[i].to, "done");
    expect_line(&node, b[i].from, "clean", line, sizeof line);
    CHECK(sscanf(line, "clean %lld", &served[i]) == 1, "side b said %s", line);
  }
  CHECK(served[0] > 0 && served[1] > 0, "one producer served nothing: %lld and %lld bytes", served[0], served[1]);
  CHECK(served[0] + served[1] == (long long)TWO_N * ROW_LEN, "producers sent %lld + %lld bytes for %d rows of %d",
        served[0], served[1], TWO_N, ROW_LEN);
  CHECK(node_stat(&node, "bytes_in") == (long long)TWO_N * ROW_LEN, "bytes_in %lld", node_stat(&node, "bytes_in"));
  fprintf(stderr, "  two_sources: %lld rows from the first producer, %lld from the second\n", served[0] / ROW_LEN,
          served[1] / ROW_LEN);
  for (int i = 0; i < 2; i++) {
    send_line(b[i].to, "bye");
    join_side_b(&b[i]);
  }
  node_close(&node);
}

const scenario_t transfer_scenarios[] = {
    {"pd_prefiller_first", pd_prefiller_first_a, pd_prefiller_first_b, 60},
    {"pd_decoder_first", pd_decoder_first_a, pd_decoder_first_b, 60},
    {"p2p_partial_hits", p2p_partial_a, p2p_partial_b, 60},
    {"p2p_cached_answers", p2p_cached_a, p2p_partial_b, 60},
    {"decoder_plus_kv_source", combo_a, combo_b, 60},
    {"producer_killed", killed_producer_a, killed_producer_b, 60},
    {"two_sources", two_sources_a, two_sources_b, 60},
};
const size_t n_transfer_scenarios = sizeof transfer_scenarios / sizeof transfer_scenarios[0];
