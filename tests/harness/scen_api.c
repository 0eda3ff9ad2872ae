/* scen_api.c — single-process scenarios: the API's contract at its edges. */
#include <errno.h>
#include <pthread.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "harness.h"

static hnode node;

#define EXPECT(call, want, errbuf)                                                                          \
  do {                                                                                                      \
    (errbuf)[0] = 'X';                                                                                      \
    int32_t rc_ = (call);                                                                                   \
    CHECK(rc_ == (want), "%s returned %s (%d), want %s: %s", #call, rc_name(rc_), rc_, rc_name(want), errbuf); \
    if ((want) < 0) CHECK((errbuf)[0] != '\0' && (errbuf)[0] != 'X', "%s: no error message", #call);        \
    if ((want) >= 0) CHECK((errbuf)[0] == '\0', "%s: err not cleared on success", #call);                 \
  } while (0)

#define CHECK_MSG(errbuf, needle) \
  CHECK(strstr((errbuf), (needle)) != NULL, "message '%s' does not mention '%s'", (errbuf), (needle))

/* ---- forbidden kv_transfer_params combinations ---- */

static void forbidden_params(void) {
  step("open");
  node_open(&node, 8, 4096, "\"handshake_timeout_s\":1");
  char *e = node.err;
  int32_t policy;
  static const struct {
    const char *json;
    const char *names[3];
  } cases[] = {
      {"{\"remote_prefiller\":{\"kv_request_id\":\"a\",\"remote_host\":\"127.0.0.1\",\"remote_port\":1},"
       "\"remote_decoder\":{\"kv_request_id\":\"a\"}}",
       {"remote_prefiller", "remote_decoder", NULL}},
      {"{\"remote_prefiller\":{\"kv_request_id\":\"a\",\"remote_host\":\"127.0.0.1\",\"remote_port\":1},"
       "\"remote_kv_source\":{\"kv_request_id\":\"b\",\"remote_host\":\"127.0.0.1\",\"remote_port\":2}}",
       {"remote_prefiller", "remote_kv_source", NULL}},
      {"{\"remote_prefiller\":{\"kv_request_id\":\"a\",\"remote_host\":\"127.0.0.1\",\"remote_port\":1},"
       "\"remote_decoder\":{\"kv_request_id\":\"a\"},"
       "\"remote_kv_source\":{\"kv_request_id\":\"b\",\"remote_host\":\"127.0.0.1\",\"remote_port\":2}}",
       {"remote_prefiller", "remote_decoder", "remote_kv_source"}},
  };
  uint8_t keys[2 * KEY_LEN];
  make_key(keys, 'F', 0);
  make_key(keys + KEY_LEN, 'F', 1);
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    step("forbidden combination");
    char req[32];
    snprintf(req, sizeof req, "forbidden-%zu", i);
    EXPECT(peerkv_request_start(node.h, req, cases[i].json, &policy, e, ERRLEN), PEERKV_ERR_BAD_PARAMS, e);
    for (int k = 0; k < 3 && cases[i].names[k]; k++) CHECK_MSG(e, cases[i].names[k]);
    step("a rejected request is unknown: lookups answer MISS");
    int32_t results[2] = {0, 0};
    EXPECT(peerkv_lookup(node.h, req, keys, KEY_LEN, 2, results, e, ERRLEN), PEERKV_OK, e);
    CHECK(results[0] == PEERKV_LOOKUP_MISS && results[1] == PEERKV_LOOKUP_MISS, "results %d %d", results[0],
          results[1]);
    /* Rejected means not started: the same id may start cleanly now. */
    EXPECT(peerkv_request_start(node.h, req, NULL, &policy, e, ERRLEN), PEERKV_OK, e);
    EXPECT(peerkv_request_finish(node.h, req, e, ERRLEN), PEERKV_OK, e);
  }
  step("malformed fields name the field");
  EXPECT(peerkv_request_start(node.h, "bad-port",
                              "{\"remote_kv_source\":{\"kv_request_id\":\"b\",\"remote_host\":\"h\",\"remote_port\":\"80\"}}",
                              &policy, e, ERRLEN),
         PEERKV_ERR_BAD_PARAMS, e);
  CHECK_MSG(e, "remote_kv_source.remote_port");
  EXPECT(peerkv_request_start(node.h, "no-id", "{\"remote_decoder\":{}}", &policy, e, ERRLEN), PEERKV_ERR_BAD_PARAMS,
         e);
  CHECK_MSG(e, "remote_decoder.kv_request_id");
  EXPECT(peerkv_request_start(node.h, "not-json", "{remote", &policy, e, ERRLEN), PEERKV_ERR_BAD_PARAMS, e);
  step("the one legal combination and the plain forms start");
  EXPECT(peerkv_request_start(node.h, "ok-combo",
                              "{\"remote_decoder\":{\"kv_request_id\":\"x\"},\"remote_kv_source\":{\"kv_request_id\":"
                              "\"y\",\"remote_host\":\"127.0.0.1\",\"remote_port\":1}}",
                              &policy, e, ERRLEN),
         PEERKV_OK, e);
  CHECK(policy == PEERKV_POLICY_REQUEST_LEVEL, "policy %d", policy);
  EXPECT(peerkv_request_start(node.h, "ok-combo", NULL, &policy, e, ERRLEN), PEERKV_ERR_DUPLICATE, e);
  EXPECT(peerkv_request_start(node.h, "plain", "null", &policy, e, ERRLEN), PEERKV_OK, e);
  CHECK(policy == PEERKV_POLICY_BLOCK_LEVEL, "policy %d", policy);
  EXPECT(peerkv_request_finish(node.h, "ok-combo", e, ERRLEN), PEERKV_OK, e);
  EXPECT(peerkv_request_finish(node.h, "plain", e, ERRLEN), PEERKV_OK, e);
  char stats[4096];
  size_t needed;
  EXPECT(peerkv_stats(node.h, stats, sizeof stats, &needed, e, ERRLEN), PEERKV_OK, e);
  CHECK(json_int(stats, "bad_params") == 6, "bad_params=%lld, want 6", json_int(stats, "bad_params"));
  step("leak check");
  node_check_clean(&node, 10);
  node_close(&node);
}

/* ---- fork safety ---- */

static void fork_safety(void) {
  step("open and use the library");
  node_open(&node, 8, 4096, "");
  uint8_t keys[KEY_LEN];
  int32_t result;
  make_key(keys, 'X', 0);
  int32_t rc = peerkv_lookup(node.h, "nobody", keys, KEY_LEN, 1, &result, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  step("fork: every call in the child returns FORKED promptly");
  pid_t parent = getpid();
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    alarm(5); /* a hang ends the child by SIGALRM */
    char e[ERRLEN];
    char want[128];
    snprintf(want, sizeof want, "loaded in pid %ld; this is forked child %ld", (long)parent, (long)getpid());
    int code = 0;
    double t0 = now_s();
    if (peerkv_lookup(node.h, "nobody", keys, KEY_LEN, 1, &result, e, sizeof e) != PEERKV_ERR_FORKED) code = 10;
    else if (strstr(e, want) == NULL || strstr(e, "load the library after fork/spawn") == NULL) code = 11;
    peerkv_handle h2;
    if (!code && peerkv_create(PEERKV_ABI_VERSION_MAJOR, node.region, 8, 4096, NULL, &h2, e, sizeof e) !=
                     PEERKV_ERR_FORKED)
      code = 12;
    if (!code && peerkv_has_pending_work(node.h) != PEERKV_ERR_FORKED) code = 13;
    char v[64];
    if (!code && peerkv_version(v, sizeof v) != PEERKV_ERR_FORKED) code = 14;
    if (!code && peerkv_destroy(node.h, e, sizeof e) != PEERKV_ERR_FORKED) code = 15;
    e[0] = '\0';
    if (!code && peerkv_notify_fd(node.h, e, sizeof e) != PEERKV_ERR_FORKED) code = 18;
    else if (!code && strstr(e, want) == NULL) code = 19;
    if (!code && peerkv_abi_version() != ((uint32_t)PEERKV_ABI_VERSION_MAJOR << 16 | PEERKV_ABI_VERSION_MINOR))
      code = 16;
    if (!code && now_s() - t0 > 1.0) code = 17;
    _exit(code);
  }
  child_t c = {.pid = pid, .to = -1, .from = -1};
  int status = wait_child(&c, 10000);
  CHECK(status != -1, "the forked child hung");
  CHECK(status != 128 + SIGALRM, "a call in the forked child hung (killed by its 5 s alarm)");
  CHECK(status == 0, "forked child check %d failed (see scen_api.c)", status);
  step("the parent is unaffected");
  rc = peerkv_lookup(node.h, "nobody", keys, KEY_LEN, 1, &result, node.err, ERRLEN);
  CHECK_RC(rc, PEERKV_OK, node.err);
  step("leak check");
  node_check_clean(&node, 5);
  node_close(&node);
}

/* ---- bad input ---- */

static void bad_input(void) {
  char e[ERRLEN];
  int32_t policy, results[4];
  uint8_t keys[4 * KEY_LEN];
  int64_t slots[4] = {0, 1, 2, 3};
  for (int i = 0; i < 4; i++) make_key(keys + i * KEY_LEN, 'B', (uint64_t)i);
  size_t n, needed;

  step("version, abi and info");
  CHECK(peerkv_abi_version() == (1u << 16 | 1u), "abi_version 0x%x", peerkv_abi_version());
  char v[128];
  CHECK(peerkv_version(v, sizeof v) == PEERKV_OK && strncmp(v, "peerkv ", 7) == 0, "version '%s'", v);
  CHECK(peerkv_version(v, 4) == PEERKV_ERR_BUFFER_TOO_SMALL && strcmp(v, "pee") == 0, "truncated version '%s'", v);
  char info[4096];
  EXPECT(peerkv_info(info, 8, &needed, e, ERRLEN), PEERKV_ERR_BUFFER_TOO_SMALL, e);
  CHECK(needed > 8, "info needed=%zu", needed);
  EXPECT(peerkv_info(info, needed, &needed, e, ERRLEN), PEERKV_OK, e);
  CHECK(strstr(info, "\"gpus\":[") && strstr(info, "\"nvml\":") && strstr(info, "\"abi\":\"1.1\""), "info %s", info);
  fprintf(stderr, "  info: %s\n", info);

  step("create rejects bad arguments");
  static uint8_t region[8 * 4096];
  peerkv_handle h = 0;
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR + 1, region, 8, 4096, NULL, &h, e, ERRLEN), PEERKV_ERR_ABI_MISMATCH, e);
  CHECK_MSG(e, "ABI");
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR, region, 8, 4096, NULL, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR, NULL, 8, 4096, NULL, &h, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR, region, 0, 4096, NULL, &h, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR, region, 8, 4096, "{\"bogus_option\":1}", &h, e, ERRLEN),
         PEERKV_ERR_INVALID_ARGUMENT, e);
  CHECK_MSG(e, "bogus_option");
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR, region, 8, 4096, "{\"load_timeout_s\":-1}", &h, e, ERRLEN),
         PEERKV_ERR_INVALID_ARGUMENT, e);
  CHECK_MSG(e, "load_timeout_s");
  CHECK(h == 0, "failed create wrote handle %lld", (long long)h);

  step("unknown handles");
  peerkv_handle unknown[] = {0, 1, -1, 12345, (peerkv_handle)1 << 40};
  for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
    EXPECT(peerkv_lookup(unknown[i], "r", keys, KEY_LEN, 1, results, e, ERRLEN), PEERKV_ERR_UNKNOWN_HANDLE, e);
    EXPECT(peerkv_destroy(unknown[i], e, ERRLEN), PEERKV_ERR_UNKNOWN_HANDLE, e);
    EXPECT(peerkv_shutdown(unknown[i], e, ERRLEN), PEERKV_ERR_UNKNOWN_HANDLE, e);
    CHECK(peerkv_has_pending_work(unknown[i]) == PEERKV_ERR_UNKNOWN_HANDLE, "has_pending_work(%lld)",
          (long long)unknown[i]);
  }

  step("open a node; a second one on its port is refused");
  node_open(&node, 8, 4096, "\"handshake_timeout_s\":1,\"load_timeout_s\":2,\"abort_ack_timeout_s\":1");
  char opts[128];
  snprintf(opts, sizeof opts, "{\"host\":\"127.0.0.1\",\"port\":%d}", node.port);
  EXPECT(peerkv_create(PEERKV_ABI_VERSION_MAJOR, region, 8, 4096, opts, &h, e, ERRLEN), PEERKV_ERR_TRANSPORT, e);

  step("NULL pointers");
  EXPECT(peerkv_request_start(node.h, NULL, NULL, &policy, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_request_start(node.h, "r", NULL, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_lookup(node.h, "r", NULL, KEY_LEN, 2, results, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_lookup(node.h, "r", keys, KEY_LEN, 2, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_lookup(node.h, NULL, keys, KEY_LEN, 2, results, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_submit_store(node.h, "r", 1, keys, KEY_LEN, 2, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_get_finished(node.h, NULL, 4, &n, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_get_finished(node.h, NULL, 0, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_stats(node.h, NULL, 0, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_request_finish(node.h, NULL, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  int64_t lookup_id;
  int32_t kind, first, finished;
  size_t req_needed;
  EXPECT(peerkv_next_inbound(node.h, NULL, &kind, &first, NULL, 0, &req_needed, NULL, 0, &n, e, ERRLEN),
         PEERKV_ERR_INVALID_ARGUMENT, e);
  CHECK(peerkv_take_logs(node.h, v, sizeof v, NULL) == PEERKV_ERR_INVALID_ARGUMENT, "take_logs NULL n_out");
  step("no inbound work is 1");
  EXPECT(peerkv_next_inbound(node.h, &lookup_id, &kind, &first, NULL, 0, &req_needed, NULL, 0, &n, e, ERRLEN), 1, e);

  step("wrong key lengths and out-of-range slots");
  EXPECT(peerkv_lookup(node.h, "r", keys, KEY_LEN / 2, 2, results, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  CHECK_MSG(e, "key_len");
  EXPECT(peerkv_lookup(node.h, "r", keys, 0, 2, results, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  int64_t bad_slots[2] = {0, 8};
  EXPECT(peerkv_submit_load(node.h, "r", 1, keys, KEY_LEN, 2, bad_slots, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  CHECK_MSG(e, "slots[1]=8");
  bad_slots[1] = -1;
  EXPECT(peerkv_submit_store(node.h, "r", 1, keys, KEY_LEN, 2, bad_slots, e, ERRLEN), PEERKV_ERR_INVALID_ARGUMENT, e);
  EXPECT(peerkv_answer_inbound(node.h, 1, results, 0, -1, bad_slots, 2, &finished, e, ERRLEN),
         PEERKV_ERR_INVALID_ARGUMENT, e);

  step("a load whose source never answers fails within its deadline; its id is busy until then");
  /* A listener that accepts TCP but never speaks: the load waits for the
   * handshake deadline, so its id is certainly still in flight below (a
   * closed port would fail it at once). */
  int silent = socket(AF_INET, SOCK_STREAM, 0);
  struct sockaddr_in silent_addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
  socklen_t silent_len = sizeof silent_addr;
  CHECK(silent >= 0 && bind(silent, (struct sockaddr *)&silent_addr, sizeof silent_addr) == 0 && listen(silent, 8) == 0 &&
            getsockname(silent, (struct sockaddr *)&silent_addr, &silent_len) == 0,
        "silent listener: %s", strerror(errno));
  char params[256];
  snprintf(params, sizeof params,
           "{\"remote_prefiller\":{\"kv_request_id\":\"kv-x\",\"remote_host\":\"127.0.0.1\",\"remote_port\":%d}}",
           ntohs(silent_addr.sin_port));
  EXPECT(peerkv_request_start(node.h, "dead-src", params, &policy, e, ERRLEN), PEERKV_OK, e);
  int64_t job = node_new_job(&node, 1, 0, 2);
  EXPECT(peerkv_submit_load(node.h, "dead-src", job, keys, KEY_LEN, 2, slots, e, ERRLEN), PEERKV_OK, e);
  EXPECT(peerkv_submit_load(node.h, "dead-src", job, keys, KEY_LEN, 2, slots, e, ERRLEN), PEERKV_ERR_DUPLICATE, e);
  job_t *j = node_wait_job(&node, job, 5 + 2 + 1 + 2); /* handshake + load + abort-ack deadlines, slack */
  CHECK(j->success == 0 && j->bytes == 0, "load from a dead source: success=%d bytes=%lld", j->success,
        (long long)j->bytes);
  close(silent);
  EXPECT(peerkv_request_finish(node.h, "dead-src", e, ERRLEN), PEERKV_OK, e);
  EXPECT(peerkv_request_finish(node.h, "never-started", e, ERRLEN), PEERKV_OK, e);

  step("stats size protocol; errors always NUL-terminated, truncated to fit");
  char stats[4096];
  EXPECT(peerkv_stats(node.h, stats, 4, &needed, e, ERRLEN), PEERKV_ERR_BUFFER_TOO_SMALL, e);
  CHECK(needed > 4, "stats needed=%zu", needed);
  EXPECT(peerkv_stats(node.h, stats, needed, &needed, e, ERRLEN), PEERKV_OK, e);
  char tiny[8];
  memset(tiny, 'X', sizeof tiny);
  CHECK(peerkv_lookup(node.h, "r", keys, 0, 2, results, tiny, sizeof tiny) == PEERKV_ERR_INVALID_ARGUMENT, "tiny");
  CHECK(tiny[7] == '\0' && strlen(tiny) == 7, "error not truncated to 7 chars + NUL: '%.8s'", tiny);

  step("leak check");
  node_check_clean(&node, 5);

  step("after shutdown: new work is refused, the handle stays until destroy");
  EXPECT(peerkv_shutdown(node.h, e, ERRLEN), PEERKV_OK, e);
  EXPECT(peerkv_shutdown(node.h, e, ERRLEN), PEERKV_OK, e);
  EXPECT(peerkv_request_start(node.h, "late", NULL, &policy, e, ERRLEN), PEERKV_ERR_CLOSED, e);
  EXPECT(peerkv_submit_store(node.h, "late", 77, keys, KEY_LEN, 1, slots, e, ERRLEN), PEERKV_ERR_CLOSED, e);
  EXPECT(peerkv_get_finished(node.h, NULL, 0, &n, e, ERRLEN), PEERKV_OK, e);
  peerkv_handle gone = node.h;
  node_close(&node); /* destroy twice + unknown-handle check inside */
  EXPECT(peerkv_stats(gone, stats, sizeof stats, &needed, e, ERRLEN), PEERKV_ERR_UNKNOWN_HANDLE, e);
  CHECK_MSG(e, "destroyed");
}

/* ---- panic recovery (needs the peerkv_panictest build of the library) ---- */

int panic_child_main(void) {
  g_scenario = "panic_recovery";
  g_side = 'b';
  step("create with the panic-test library");
  node_open(&node, 8, 4096, "");
  uint8_t keys[KEY_LEN];
  int32_t result;
  make_key(keys, 'Z', 0);
  char *e = node.err;
  step("the injected panic becomes INTERNAL");
  int32_t rc = peerkv_lookup(node.h, "r", keys, KEY_LEN, 1, &result, e, ERRLEN);
  CHECK(rc == PEERKV_ERR_INTERNAL, "lookup returned %s (is PEERKV_PANIC_IN=peerkv_lookup and the panictest build loaded?): %s",
        rc_name(rc), e);
  CHECK_MSG(e, "panic");
  CHECK_MSG(e, "poisoned");
  step("every later call fails fast");
  size_t needed;
  char buf[512];
  rc = peerkv_stats(node.h, buf, sizeof buf, &needed, e, ERRLEN);
  CHECK(rc == PEERKV_ERR_INTERNAL, "stats after panic: %s", rc_name(rc));
  CHECK_MSG(e, "poisoned");
  CHECK(peerkv_has_pending_work(node.h) == PEERKV_ERR_INTERNAL, "has_pending_work after panic");
  peerkv_handle h;
  rc = peerkv_create(PEERKV_ABI_VERSION_MAJOR, node.region, 8, 4096, NULL, &h, e, ERRLEN);
  CHECK(rc == PEERKV_ERR_INTERNAL, "create after panic: %s", rc_name(rc));
  rc = peerkv_lookup(node.h, "r", keys, KEY_LEN, 1, &result, e, ERRLEN);
  CHECK(rc == PEERKV_ERR_INTERNAL, "second lookup: %s", rc_name(rc));
  CHECK(peerkv_version(buf, sizeof buf) == PEERKV_ERR_INTERNAL, "version after panic");
  return 0;
}

static void panic_recovery(void) {
  step("locate the panic-test library");
  char dir[PATH_MAX];
  const char *env = getenv("PEERKV_PANIC_LIBDIR");
  if (env != NULL) {
    snprintf(dir, sizeof dir, "%s", env);
  } else { /* default: build/panictest next to this binary */
    char exe[PATH_MAX];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(len > 0, "readlink /proc/self/exe");
    exe[len] = '\0';
    snprintf(dir, sizeof dir, "%s/panictest", dirname(exe));
  }
  char probe[PATH_MAX + 32];
  snprintf(probe, sizeof probe, "%s/libpeerkv.so.0", dir);
  CHECK(access(probe, R_OK) == 0, "%s missing: build it with `make build/panictest/libpeerkv.so`", probe);
  char ld[PATH_MAX + 32];
  snprintf(ld, sizeof ld, "LD_LIBRARY_PATH=%s", dir);
  const char *env_extra[] = {ld, "PEERKV_PANIC_IN=peerkv_lookup", NULL};
  const char *args[] = {"--panic-child", NULL};
  int err_fd = -1;
  step("run the panicking child");
  child_t c = spawn_self(args, env_extra, true, &err_fd);
  static char out[1 << 20];
  size_t len = 0;
  double deadline = now_s() + 20;
  for (;;) { /* read its stderr to EOF, bounded */
    CHECK(now_s() < deadline, "panic child did not finish");
    struct pollfd pfd = {.fd = err_fd, .events = POLLIN};
    if (poll(&pfd, 1, 100) <= 0) continue;
    ssize_t got = read(err_fd, out + len, sizeof out - 1 - len);
    if (got <= 0) break;
    len += (size_t)got;
  }
  out[len] = '\0';
  close(err_fd);
  int status = wait_child(&c, 5000);
  if (status != 0) fprintf(stderr, "%s", out);
  CHECK(status == 0, "panic child exited %d (its stderr is above)", status);
  step("the stack went to stderr exactly once");
  int reports = 0;
  for (const char *at = out; (at = strstr(at, "libpeerkv: Go panic in peerkv_lookup")) != NULL; at++) reports++;
  CHECK(reports == 1, "%d panic reports on stderr, want 1:\n%s", reports, out);
  CHECK(strstr(out, "goroutine ") != NULL, "no goroutine stack on stderr:\n%s", out);
}

/* concurrent_teardown: shutdown and destroy from several threads at once.
 * Every call returns PEERKV_OK, and only after the one teardown finished:
 * right after its call returns, each thread finds new work refused (CLOSED
 * while the handle lives, UNKNOWN_HANDLE once destroyed). A shutdown that
 * enters only after a destroy returned is OK too (nothing is left to tear
 * down); other calls on the destroyed handle are UNKNOWN_HANDLE. */
typedef struct {
  peerkv_handle h;
  int destroy;
  int32_t rc, late_rc;
  char err[ERRLEN];
} teardown_arg;

static void *teardown_thread(void *arg) {
  teardown_arg *a = arg;
  a->rc = a->destroy ? peerkv_destroy(a->h, a->err, ERRLEN) : peerkv_shutdown(a->h, a->err, ERRLEN);
  char e[ERRLEN];
  int32_t policy;
  a->late_rc = peerkv_request_start(a->h, "after-teardown", NULL, &policy, e, ERRLEN);
  return NULL;
}

static void concurrent_teardown(void) {
  /* Three rounds, alternating which kind of call the first thread makes. */
  for (int round = 0; round < 3; round++) {
    step("open a node");
    node_open(&node, 8, 4096, "");
    step("six threads shut it down and destroy it at once");
    pthread_t th[6];
    teardown_arg args[6];
    for (int i = 0; i < 6; i++) {
      args[i] = (teardown_arg){.h = node.h, .destroy = (i + round) % 2};
      CHECK(pthread_create(&th[i], NULL, teardown_thread, &args[i]) == 0, "pthread_create");
    }
    for (int i = 0; i < 6; i++) CHECK(pthread_join(th[i], NULL) == 0, "pthread_join");
    for (int i = 0; i < 6; i++) {
      const char *what = args[i].destroy ? "destroy" : "shutdown";
      CHECK(args[i].rc == PEERKV_OK, "round %d: %s in thread %d returned %d: %s", round, what, i, args[i].rc,
            args[i].err);
      CHECK(args[i].late_rc == PEERKV_ERR_CLOSED || args[i].late_rc == PEERKV_ERR_UNKNOWN_HANDLE,
            "round %d: request_start after %s returned in thread %d got %d, want CLOSED or UNKNOWN_HANDLE", round,
            what, i, args[i].late_rc);
    }
    step("the handle is gone; shutdown and destroy of it stay OK");
    char e[ERRLEN];
    EXPECT(peerkv_on_schedule_end(node.h, e, ERRLEN), PEERKV_ERR_UNKNOWN_HANDLE, e);
    CHECK_MSG(e, "destroyed");
    EXPECT(peerkv_shutdown(node.h, e, ERRLEN), PEERKV_OK, e);
    EXPECT(peerkv_destroy(node.h, e, ERRLEN), PEERKV_OK, e);
    EXPECT(peerkv_shutdown(node.h, e, ERRLEN), PEERKV_OK, e);
    EXPECT(peerkv_on_schedule_end(node.h, e, ERRLEN), PEERKV_ERR_UNKNOWN_HANDLE, e);
    node_register(&node, 0);
    munmap(node.region, node.num_rows * node.row_len);
    node.region = NULL;
    close(node.region_fd);
    node.region_fd = -1;
  }
}

const scenario_t api_scenarios[] = {
    {"forbidden_params", forbidden_params, NULL, 30},
    {"fork_safety", fork_safety, NULL, 30},
    {"bad_input", bad_input, NULL, 60},
    {"panic_recovery", panic_recovery, NULL, 30},
    {"concurrent_teardown", concurrent_teardown, NULL, 30},
};
const size_t n_api_scenarios = sizeof api_scenarios / sizeof api_scenarios[0];
