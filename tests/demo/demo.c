/* demo.c — two peerkv peers on loopback, in two processes, over the real
 * path (ZMQ control; NIXL data when the library finds it, else TCP):
 *   1. PD: a prefiller stores 256 rows of 2 MiB; a decoder pulls them all.
 *   2. P2P, symmetric: each peer holds half of the other's keys and pulls
 *      from the other at the same time (partial hits).
 * Every byte that lands is checked against the producer's pattern. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness/harness.h"

#define ROWS 256
#define ROW_LEN (2u * 1024 * 1024)
#define PD_ROUNDS 3
#define P2P_N 64
#define P2P_LOAD_BASE 128

static hnode node;
static uint8_t keys[ROWS * KEY_LEN];
static int64_t slots[ROWS];

static double mib(double bytes) { return bytes / (1024.0 * 1024.0); }
static double gbps(double bytes, double s) { return s > 0 ? bytes / 1e9 / s : 0; }

static void check(int32_t rc) { CHECK_RC(rc, PEERKV_OK, node.err); }

static void verify(const uint8_t *k, const int64_t *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    CHECK(check_row(node_row(&node, s[i]), ROW_LEN, k + i * KEY_LEN) == 0, "row %lld corrupt", (long long)s[i]);
}

/* P2P: hold the keys of tag mine whose index has parity held_parity, then
 * look up every key of tag theirs at the other peer and pull the hits. */
static void p2p_round(char mine, int held_parity, char theirs, int other_port, double *lookup_s, double *load_s,
                      size_t *hits, int64_t *bytes) {
  for (int i = 0; i < P2P_N; i++) {
    if (i % 2 != held_parity) continue;
    uint8_t k[KEY_LEN];
    make_key(k, mine, (uint64_t)i);
    fill_row(node_row(&node, i), ROW_LEN, k);
    node_hold(&node, k, i, 0);
  }
  uint8_t want[P2P_N * KEY_LEN];
  int32_t results[P2P_N];
  for (int i = 0; i < P2P_N; i++) make_key(want + i * KEY_LEN, theirs, (uint64_t)i);
  char params[256];
  snprintf(params, sizeof params,
           "{\"remote_kv_source\":{\"kv_request_id\":\"demo-p2p-%c\",\"remote_host\":\"127.0.0.1\",\"remote_port\":%d}}",
           theirs, other_port);
  char req[32];
  snprintf(req, sizeof req, "p2p-%c", theirs);
  int32_t policy;
  check(peerkv_request_start(node.h, req, params, &policy, node.err, ERRLEN));
  double t0 = now_s();
  node_lookup_settled(&node, req, want, P2P_N, results, 10);
  *lookup_s = now_s() - t0;
  uint8_t hit_keys[P2P_N * KEY_LEN];
  int64_t hit_slots[P2P_N];
  *hits = 0;
  for (int i = 0; i < P2P_N; i++) {
    if (results[i] != PEERKV_LOOKUP_HIT) continue;
    memcpy(hit_keys + *hits * KEY_LEN, want + i * KEY_LEN, KEY_LEN);
    hit_slots[*hits] = P2P_LOAD_BASE + (int64_t)*hits;
    (*hits)++;
  }
  int64_t job = node_new_job(&node, 1, 0, *hits);
  t0 = now_s();
  check(peerkv_submit_load(node.h, req, job, hit_keys, KEY_LEN, *hits, hit_slots, node.err, ERRLEN));
  job_t *j = node_wait_job(&node, job, 30);
  *load_s = now_s() - t0;
  CHECK(j->success, "P2P load failed");
  verify(hit_keys, hit_slots, *hits);
  *bytes = j->bytes;
  check(peerkv_request_finish(node.h, req, node.err, ERRLEN));
}

static int producer(void) {
  g_scenario = "demo";
  g_side = 'b';
  arm_watchdog(120);
  step("open prefiller");
  node_open(&node, ROWS, ROW_LEN, "");
  for (int i = 0; i < ROWS; i++) {
    make_key(keys + i * KEY_LEN, 'M', (uint64_t)i);
    slots[i] = i;
    fill_row(node_row(&node, i), ROW_LEN, keys + i * KEY_LEN);
  }
  send_line(1, "ready %d", node.port);
  char line[128];
  for (int r = 0; r < PD_ROUNDS; r++) {
    step("PD store");
    char req[32], params[128];
    snprintf(req, sizeof req, "prefill-%d", r);
    snprintf(params, sizeof params, "{\"remote_decoder\":{\"kv_request_id\":\"demo-pd-%d\"}}", r);
    int32_t policy;
    check(peerkv_request_start(node.h, req, params, &policy, node.err, ERRLEN));
    int64_t job = node_new_job(&node, 0, 0, ROWS);
    check(peerkv_submit_store(node.h, req, job, keys, KEY_LEN, ROWS, slots, node.err, ERRLEN));
    check(peerkv_request_finish(node.h, req, node.err, ERRLEN));
    send_line(1, "stored %d", r);
    CHECK(node_wait_line(&node, 0, line, sizeof line, 60) == 1, "decoder went away");
    CHECK(node_wait_job(&node, job, 30)->success, "store job failed");
  }
  step("P2P");
  int port_a;
  CHECK(node_wait_line(&node, 0, line, sizeof line, 30) == 1 && sscanf(line, "p2p %d", &port_a) == 1, "bad %s", line);
  double lookup_s, load_s;
  size_t hits;
  int64_t bytes;
  p2p_round('S', 0, 'T', port_a, &lookup_s, &load_s, &hits, &bytes);
  send_line(1, "p2p %zu %.6f %.6f %lld", hits, lookup_s, load_s, (long long)bytes);
  CHECK(node_wait_line(&node, 0, line, sizeof line, 30) == 1, "decoder went away");
  node_check_clean(&node, 10);
  send_line(1, "clean");
  CHECK(read_line(0, line, sizeof line, 30000) == 1, "decoder went away");
  node_close(&node);
  return 0;
}

int main(int argc, char **argv) {
  if (argc == 2 && strcmp(argv[1], "--producer") == 0) return producer();
  g_scenario = "demo";
  arm_watchdog(150);
  char version[128];
  peerkv_version(version, sizeof version);
  step("open decoder");
  node_open(&node, ROWS, ROW_LEN, "");
  char stats[4096], paths[64];
  size_t needed = 0;
  check(peerkv_stats(node.h, stats, sizeof stats, &needed, node.err, ERRLEN));
  json_str(stats, "data_paths", paths, sizeof paths);
  printf("%s — two peers on 127.0.0.1, each in its own process: ZMQ control, data paths %s\n", version, paths);
  const char *args[] = {"--producer", NULL};
  child_t b = spawn_self(args, NULL, false, NULL);
  char line[128];
  int port_b;
  CHECK(read_line(b.from, line, sizeof line, 60000) == 1 && sscanf(line, "ready %d", &port_b) == 1,
        "producer did not start");
  for (int i = 0; i < ROWS; i++) {
    make_key(keys + i * KEY_LEN, 'M', (uint64_t)i);
    slots[i] = ROWS - 1 - i;
  }
  printf("\n1) PD: prefiller (port %d) -> decoder (port %d), %d rows x %u MiB per round\n", port_b, node.port, ROWS,
         ROW_LEN >> 20);
  for (int r = 0; r < PD_ROUNDS; r++) {
    step("PD load");
    CHECK(node_wait_line(&node, b.from, line, sizeof line, 60) == 1, "producer went away");
    memset(node.region, 0, (size_t)ROWS * ROW_LEN);
    char req[32], params[256];
    snprintf(req, sizeof req, "decode-%d", r);
    snprintf(params, sizeof params,
             "{\"remote_prefiller\":{\"kv_request_id\":\"demo-pd-%d\",\"remote_host\":\"127.0.0.1\",\"remote_port\":%d}}",
             r, port_b);
    int32_t policy, results[ROWS];
    check(peerkv_request_start(node.h, req, params, &policy, node.err, ERRLEN));
    check(peerkv_lookup(node.h, req, keys, KEY_LEN, ROWS, results, node.err, ERRLEN));
    int64_t job = node_new_job(&node, 1, 0, ROWS);
    double t0 = now_s();
    check(peerkv_submit_load(node.h, req, job, keys, KEY_LEN, ROWS, slots, node.err, ERRLEN));
    job_t *j = node_wait_job(&node, job, 60);
    double wall = now_s() - t0;
    CHECK(j->success, "PD load failed");
    verify(keys, slots, ROWS);
    check(peerkv_request_finish(node.h, req, node.err, ERRLEN));
    printf("   round %d: %d rows, %.0f MiB in %.3f s = %.2f GB/s (library-reported %.3f s)%s, every byte verified\n",
           r + 1, ROWS, mib((double)j->bytes), wall, gbps((double)j->bytes, wall), j->seconds,
           r == 0 ? " incl. connect" : "");
    send_line(b.to, "loaded %d", r);
  }

  printf("\n2) P2P, symmetric: each peer holds every other key of the %d the other asks for\n", P2P_N);
  step("P2P");
  send_line(b.to, "p2p %d", node.port);
  memset(node.region, 0, (size_t)ROWS * ROW_LEN);
  node.n_held = 0;
  double lookup_s, load_s;
  size_t hits;
  int64_t bytes;
  p2p_round('T', 1, 'S', port_b, &lookup_s, &load_s, &hits, &bytes);
  printf("   decoder <- prefiller: %zu HIT, %zu MISS (lookup settled in %.1f ms); pulled %.0f MiB in %.3f s = %.2f GB/s\n",
         hits, P2P_N - hits, lookup_s * 1e3, mib((double)bytes), load_s, gbps((double)bytes, load_s));
  CHECK(node_wait_line(&node, b.from, line, sizeof line, 60) == 1, "producer went away");
  size_t b_hits;
  double b_lookup, b_load;
  long long b_bytes;
  CHECK(sscanf(line, "p2p %zu %lf %lf %lld", &b_hits, &b_lookup, &b_load, &b_bytes) == 4, "bad line %s", line);
  printf("   prefiller <- decoder: %zu HIT, %zu MISS (lookup settled in %.1f ms); pulled %.0f MiB in %.3f s = %.2f GB/s\n",
         b_hits, P2P_N - b_hits, b_lookup * 1e3, mib((double)b_bytes), b_load, gbps((double)b_bytes, b_load));
  CHECK(hits == P2P_N / 2 && b_hits == P2P_N / 2, "expected %d hits each way", P2P_N / 2);
  send_line(b.to, "done");
  node_check_clean(&node, 10);
  CHECK(node_wait_line(&node, b.from, line, sizeof line, 30) == 1, "producer went away");
  send_line(b.to, "bye");
  CHECK(wait_child(&b, 20000) == 0, "producer failed");
  node_close(&node);
  printf("\ndemo: OK (no leaked jobs, pins or lookups on either peer)\n");
  return 0;
}
