/* main.c — runs every scenario in its own process and counts the results.
 *
 *   peerkv_harness                 run all scenarios
 *   peerkv_harness NAME...         run the named ones
 *   peerkv_harness --list          list them
 * Internal: --scenario NAME a|b (one side of a scenario), --panic-child. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

const scenario_t *g_current;

static const scenario_t *find(const char *name) {
  for (size_t i = 0; i < n_transfer_scenarios; i++)
    if (strcmp(transfer_scenarios[i].name, name) == 0) return &transfer_scenarios[i];
  for (size_t i = 0; i < n_api_scenarios; i++)
    if (strcmp(api_scenarios[i].name, name) == 0) return &api_scenarios[i];
  return NULL;
}

static int run_side(const char *name, const char *side) {
  g_current = find(name);
  if (g_current == NULL) {
    fprintf(stderr, "unknown scenario %s\n", name);
    return 2;
  }
  g_scenario = g_current->name;
  g_side = side[0];
  arm_watchdog(g_current->timeout_s);
  if (g_side == 'b') {
    CHECK(g_current->run_b != NULL, "scenario has no side b");
    g_current->run_b();
  } else {
    g_current->run_a();
  }
  return 0;
}

/* Runs one scenario in a child process; 1 = passed. */
static int run_one(const scenario_t *s) {
  const char *args[] = {"--scenario", s->name, "a", NULL};
  double t0 = now_s();
  child_t c = spawn_self(args, NULL, false, NULL);
  int status = wait_child(&c, (int)(s->timeout_s + 10) * 1000);
  double took = now_s() - t0;
  if (status == 0) {
    printf("PASS %-24s %6.2fs\n", s->name, took);
  } else if (status == -1) {
    printf("FAIL %-24s %6.2fs (hung: killed by the runner)\n", s->name, took);
  } else {
    printf("FAIL %-24s %6.2fs (exit status %d)\n", s->name, took, status);
  }
  fflush(stdout);
  return status == 0;
}

int main(int argc, char **argv) {
  if (argc == 4 && strcmp(argv[1], "--scenario") == 0) return run_side(argv[2], argv[3]);
  if (argc == 2 && strcmp(argv[1], "--panic-child") == 0) {
    arm_watchdog(20);
    return panic_child_main();
  }
  const scenario_t *all[64];
  size_t n_all = 0;
  for (size_t i = 0; i < n_api_scenarios; i++) all[n_all++] = &api_scenarios[i];
  for (size_t i = 0; i < n_transfer_scenarios; i++) all[n_all++] = &transfer_scenarios[i];
  if (argc == 2 && strcmp(argv[1], "--list") == 0) {
    for (size_t i = 0; i < n_all; i++) printf("%s\n", all[i]->name);
    return 0;
  }
  const scenario_t *chosen[64];
  size_t n_chosen = 0;
  if (argc == 1) {
    memcpy(chosen, all, n_all * sizeof *all);
    n_chosen = n_all;
  }
  for (int i = 1; i < argc && n_chosen < 64; i++) {
    chosen[n_chosen] = find(argv[i]);
    if (chosen[n_chosen] == NULL) {
      fprintf(stderr, "unknown scenario %s (try --list)\n", argv[i]);
      return 2;
    }
    n_chosen++;
  }
  int passed = 0, failed = 0;
  for (size_t i = 0; i < n_chosen; i++) {
    if (run_one(chosen[i])) passed++;
    else failed++;
  }
  printf("%d passed, %d failed\n", passed, failed);
  return failed == 0 ? 0 : 1;
}
