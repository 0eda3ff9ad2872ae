/* util.c — failures, steps, time, processes and pipes for the harness. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

const char *g_scenario = "main";
char g_side = 'a';
const char *g_step = "start";

void step(const char *name) { g_step = name; }

void failf(const char *fmt, ...) {
  char msg[2048];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  fprintf(stderr, "FAIL [%s/%c:%s] %s\n", g_scenario, g_side, g_step, msg);
  static int failing;
  if (!failing++) dump_registered_logs();
  fflush(stderr);
  _exit(1);
}

static void on_watchdog(int sig) {
  (void)sig;
  /* Async-signal-safe: write(2) only. */
  const char *parts[] = {"FAIL [", g_scenario, "/", g_side == 'a' ? "a" : "b", ":", g_step,
                         "] watchdog: the step did not finish in time\n"};
  for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
    ssize_t w = write(2, parts[i], strlen(parts[i]));
    (void)w;
  }
  _exit(3);
}

void arm_watchdog(unsigned seconds) {
  signal(SIGALRM, on_watchdog);
  alarm(seconds);
}

double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
  }
}

const char *rc_name(int32_t rc) {
  switch (rc) {
    case PEERKV_OK: return "OK";
    case PEERKV_ERR_INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case PEERKV_ERR_UNKNOWN_HANDLE: return "UNKNOWN_HANDLE";
    case PEERKV_ERR_BAD_PARAMS: return "BAD_PARAMS";
    case PEERKV_ERR_UNKNOWN_REQUEST: return "UNKNOWN_REQUEST";
    case PEERKV_ERR_BUFFER_TOO_SMALL: return "BUFFER_TOO_SMALL";
    case PEERKV_ERR_TRANSPORT: return "TRANSPORT";
    case PEERKV_ERR_CLOSED: return "CLOSED";
    case PEERKV_ERR_FORKED: return "FORKED";
    case PEERKV_ERR_INTERNAL: return "INTERNAL";
    case PEERKV_ERR_TIMEOUT: return "TIMEOUT";
    case PEERKV_ERR_DUPLICATE: return "DUPLICATE";
    case PEERKV_ERR_UNAVAILABLE: return "UNAVAILABLE";
    case PEERKV_ERR_ABI_MISMATCH: return "ABI_MISMATCH";
  }
  return "?";
}

child_t spawn_self(const char *const args[], const char *const env_extra[], bool capture_stderr, int *stderr_fd) {
  int in[2], out[2], errp[2] = {-1, -1};
  CHECK(pipe2(in, O_CLOEXEC) == 0 && pipe2(out, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
  if (capture_stderr) CHECK(pipe2(errp, O_CLOEXEC) == 0, "pipe: %s", strerror(errno));
  const char *argv[32];
  size_t n = 0;
  argv[n++] = "/proc/self/exe";
  for (size_t i = 0; args[i] != NULL && n < 31; i++) argv[n++] = args[i];
  argv[n] = NULL;
  /* The environment is built before fork: the child may only make
   * async-signal-safe calls. */
  extern char **environ;
  size_t n_env = 0, n_extra = 0;
  while (environ[n_env] != NULL) n_env++;
  while (env_extra != NULL && env_extra[n_extra] != NULL) n_extra++;
  char **envp = calloc(n_env + n_extra + 1, sizeof *envp);
  CHECK(envp != NULL, "out of memory");
  size_t k = 0;
  for (size_t i = 0; i < n_extra; i++) envp[k++] = (char *)env_extra[i];
  for (size_t i = 0; i < n_env; i++) { /* extras replace inherited values */
    bool replaced = false;
    for (size_t j = 0; j < n_extra && !replaced; j++) {
      size_t name_len = strcspn(env_extra[j], "=") + 1;
      replaced = strncmp(environ[i], env_extra[j], name_len) == 0;
    }
    if (!replaced) envp[k++] = environ[i];
  }
  fflush(NULL);
  pid_t pid = fork();
  CHECK(pid >= 0, "fork: %s", strerror(errno));
  if (pid == 0) {
    /* Only async-signal-safe calls until exec: the library is loaded here
     * and must not be entered in this forked child. */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    dup2(in[0], 0);
    dup2(out[1], 1);
    if (capture_stderr) dup2(errp[1], 2);
    execve("/proc/self/exe", (char *const *)argv, envp);
    _exit(127);
  }
  free(envp);
  close(in[0]);
  close(out[1]);
  if (capture_stderr) {
    close(errp[1]);
    *stderr_fd = errp[0];
  }
  return (child_t){.pid = pid, .to = in[1], .from = out[0]};
}

void send_line(int fd, const char *fmt, ...) {
  char line[512];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(line, sizeof line - 1, fmt, ap);
  va_end(ap);
  CHECK(n > 0 && (size_t)n < sizeof line - 1, "line too long");
  line[n++] = '\n';
  CHECK(write(fd, line, (size_t)n) == n, "write to pipe: %s", strerror(errno));
}

int read_line(int fd, char *buf, size_t cap, int timeout_ms) {
  size_t len = 0;
  double deadline = now_s() + timeout_ms / 1000.0;
  while (len + 1 < cap) {
    int left = (int)((deadline - now_s()) * 1000);
    if (left < 0) left = 0;
    struct pollfd pfd = {.fd = fd, .events = POLLIN};
    int r = poll(&pfd, 1, left);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) return 0;
    char c;
    ssize_t got = read(fd, &c, 1); /* byte at a time: lines are rare and short */
    if (got == 0) return -1;
    if (got < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    if (c == '\n') break;
    buf[len++] = c;
  }
  buf[len] = '\0';
  return 1;
}

int wait_child(child_t *c, int timeout_ms) {
  double deadline = now_s() + timeout_ms / 1000.0;
  for (;;) {
    int status;
    pid_t r = waitpid(c->pid, &status, WNOHANG);
    if (r == c->pid) {
      if (c->to >= 0) close(c->to);
      if (c->from >= 0) close(c->from);
      c->to = c->from = -1;
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    if (now_s() > deadline) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &status, 0);
      return -1;
    }
    sleep_ms(2);
  }
}

void json_str(const char *json, const char *name, char *out, size_t cap) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":\"", name);
  const char *at = strstr(json, pat);
  CHECK(at != NULL, "string field %s missing from %s", name, json);
  at += strlen(pat);
  const char *end = strchr(at, '"');
  CHECK(end != NULL && (size_t)(end - at) < cap, "field %s too long in %s", name, json);
  memcpy(out, at, (size_t)(end - at));
  out[end - at] = '\0';
}

long long json_int(const char *json, const char *name) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", name);
  const char *at = strstr(json, pat);
  CHECK(at != NULL, "field %s missing from %s", name, json);
  return strtoll(at + strlen(pat), NULL, 10);
}
