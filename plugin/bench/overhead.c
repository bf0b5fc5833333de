/* Cost of the plugin on NCCL's threads, through ncclProfiler_v6 (NCCL 2.29, 2.30): ns per
 * startEvent+stopEvent pair and per recordEventState, on one thread and on two (separate
 * communicators, then one shared), next to what a no-op plugin costs NCCL in the same run (the
 * same indirect calls into functions that do nothing) and one clock read; and the
 * resident memory a communicator costs once it has carried traffic.
 * Usage: bench_overhead [--lib PATH] [--iters N]. Prints numbers; asserts nothing. */
#include <dlfcn.h>
#include <libgen.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "../src/abi.h"

#define REPEAT 5
static c4_profiler_v6_t *P;
static long iters = 2000000;

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int mask; /* NCCL's process-wide activation mask */

static void *comm(int rank) {
  static uint64_t hash = 0xbe4c4000ull; /* one (communicator, rank) per process */
  void *ctx = NULL;
  P->init(&ctx, hash++, &mask, "bench", 2, 2, rank, NULL);
  if (ctx == NULL) {
    fprintf(stderr, "plugin init failed\n");
    exit(1);
  }
  return ctx;
}

static void *start(void *ctx, uint64_t type, void *parent) {
  c4_descr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = type;
  d.parentObj = parent;
  d.coll.func = "AllReduce"; /* read for Coll only */
  d.coll.algo = "Ring";
  d.coll.proto = "Simple";
  d.coll.datatype = "ncclFloat32";
  d.coll.count = 1024;
  if (type == C4_EV_PROXY_OP) {
    memset(&d.proxyOp, 0, sizeof d.proxyOp);
    d.proxyOp.pid = getpid(); /* this process's op: PXN ops of others are ignored */
    d.proxyOp.peer = 1;
    d.proxyOp.isSend = 1;
  }
  void *h = NULL;
  P->startEvent(ctx, &h, &d);
  return h;
}

enum kind { STEP_PAIR, STATE, STEP_LIFECYCLE, COLL_PAIR };
struct job {
  void *ctx;
  enum kind kind;
  double ns;
};

/* One measurement: ns per operation of `kind` on `ctx`. */
static void *measure(void *arg) {
  struct job *j = arg;
  void *coll = start(j->ctx, C4_EV_COLL, NULL);
  void *op = start(j->ctx, C4_EV_PROXY_OP, coll);
  c4_descr_v6_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_PROXY_STEP;
  d.parentObj = op;
  c4_nccl_state_args_t a = {.proxyStep = {4096}};
  void *step = start(j->ctx, C4_EV_PROXY_STEP, op);
  double t0 = now();
  for (long i = 0; i < iters; i++) {
    void *h;
    switch (j->kind) {
      case STEP_PAIR:
        d.proxyStep.step = (int)i;
        P->startEvent(j->ctx, &h, &d);
        P->stopEvent(h);
        break;
      case STATE:
        P->recordEventState(step, (i & 1) ? C4_ST_SEND_WAIT : C4_ST_SEND_GPU_WAIT, &a);
        break;
      case STEP_LIFECYCLE:
        d.proxyStep.step = (int)i;
        P->startEvent(j->ctx, &h, &d);
        P->recordEventState(h, C4_ST_SEND_GPU_WAIT, &a);
        P->recordEventState(h, C4_ST_SEND_PEER_WAIT, &a);
        P->recordEventState(h, C4_ST_SEND_WAIT, &a);
        P->stopEvent(h);
        break;
      case COLL_PAIR:
        P->stopEvent(start(j->ctx, C4_EV_COLL, NULL));
        break;
    }
  }
  j->ns = (now() - t0) / (double)iters;
  P->stopEvent(step);
  P->stopEvent(op);
  P->stopEvent(coll);
  return NULL;
}

/* Best of REPEAT runs on nthreads threads; ctx[i] is thread i's communicator. */
static double best(enum kind kind, void **ctx, int nthreads) {
  double b = 1e300;
  for (int r = 0; r < REPEAT; r++) {
    struct job j[2];
    pthread_t t[2];
    double worst = 0;
    for (int i = 0; i < nthreads; i++) {
      j[i] = (struct job){ctx[i], kind, 0};
      pthread_create(&t[i], NULL, measure, &j[i]);
    }
    for (int i = 0; i < nthreads; i++) {
      pthread_join(t[i], NULL);
      if (j[i].ns > worst) worst = j[i].ns;
    }
    if (worst < b) b = worst;
  }
  return b;
}

static c4_nccl_result_t noop_start(void *c, void **h, c4_descr_v6_t *d) {
  (void)c, (void)d;
  *h = NULL;
  return 0;
}
static c4_nccl_result_t noop_stop(void *h) {
  (void)h;
  return 0;
}

static double baseline(void) {
  c4_profiler_v6_t noop = {"noop", NULL, noop_start, noop_stop, NULL, NULL};
  c4_profiler_v6_t *volatile np = &noop; /* an indirect call, as NCCL makes */
  c4_descr_v6_t d = {.type = C4_EV_PROXY_STEP};
  double b = 1e300;
  for (int r = 0; r < REPEAT; r++) {
    double t0 = now();
    for (long i = 0; i < iters; i++) {
      void *h;
      np->startEvent(NULL, &h, &d);
      np->stopEvent(h);
    }
    double ns = (now() - t0) / (double)iters;
    if (ns < b) b = ns;
  }
  return b;
}

static long rss_kib(void) {
  FILE *f = fopen("/proc/self/status", "r");
  char line[256];
  long kib = -1;
  while (f && fgets(line, sizeof line, f))
    if (sscanf(line, "VmRSS: %ld", &kib) == 1) break;
  if (f) fclose(f);
  return kib;
}

/* Resident KiB per communicator after a ring op on 2 channels (8 steps per connection). */
static double kib_per_comm(int n) {
  void **ctx = calloc((size_t)n, sizeof *ctx);
  long before = rss_kib();
  for (int i = 0; i < n; i++) {
    ctx[i] = comm(0);
    void *coll = start(ctx[i], C4_EV_COLL, NULL);
    for (int ch = 0; ch < 2; ch++)
      for (int send = 0; send < 2; send++) {
        c4_descr_v6_t d;
        memset(&d, 0, sizeof d);
        d.type = C4_EV_PROXY_OP;
        d.parentObj = coll;
        d.proxyOp.pid = getpid();
        d.proxyOp.channelId = (uint8_t)ch;
        d.proxyOp.peer = 1;
        d.proxyOp.isSend = send;
        void *op = NULL, *s[8];
        P->startEvent(ctx[i], &op, &d);
        c4_nccl_state_args_t a = {.proxyStep = {4096}};
        for (int k = 0; k < 8; k++) {
          s[k] = start(ctx[i], C4_EV_PROXY_STEP, op);
          P->recordEventState(s[k], send ? C4_ST_SEND_WAIT : C4_ST_RECV_WAIT, &a);
        }
        for (int k = 0; k < 8; k++) P->stopEvent(s[k]);
        P->stopEvent(op);
      }
    P->stopEvent(coll);
  }
  double per = (double)(rss_kib() - before) / n;
  for (int i = 0; i < n; i++) P->finalize(ctx[i]);
  free(ctx);
  return per;
}

static double clock_cost(void) {
  double t0 = now();
  for (long i = 0; i < iters; i++) now();
  return (now() - t0) / (double)iters;
}

int main(int argc, char **argv) {
  char lib[PATH_MAX], self[PATH_MAX];
  snprintf(self, sizeof self, "%s", argv[0]);
  snprintf(lib, sizeof lib, "%s/libnccl-profiler-c4.so", dirname(self));
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--lib")) snprintf(lib, sizeof lib, "%s", argv[i + 1]);
    else if (!strcmp(argv[i], "--iters")) iters = atol(argv[i + 1]);
  }
  /* nobody listens: the background thread's sends fail fast, as with no agent */
  setenv("C4_AGENT_SOCKET", "/nonexistent/c4-bench.sock", 1);
  void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL || (P = dlsym(dl, "ncclProfiler_v6")) == NULL) {
    fprintf(stderr, "cannot load %s: %s\n", lib, dlerror());
    return 1;
  }
  void *c1[2] = {comm(0), comm(1)}, *shared[2] = {c1[0], c1[0]};
  double base = baseline(), clk = clock_cost();
  double pair1 = best(STEP_PAIR, c1, 1), state1 = best(STATE, c1, 1);
  double life1 = best(STEP_LIFECYCLE, c1, 1), coll1 = best(COLL_PAIR, c1, 1);
  double pair2 = best(STEP_PAIR, c1, 2), state2 = best(STATE, c1, 2);
  double pair2s = best(STEP_PAIR, shared, 2);
  double kib = kib_per_comm(64);
  printf("c4 NCCL profiler plugin overhead: %s, %ld iterations, best of %d, %ld CPUs\n", lib,
         iters, REPEAT, sysconf(_SC_NPROCESSORS_ONLN));
  printf("  %-52s %7.1f ns\n", "no-op plugin: ProxyStep startEvent+stopEvent", base);
  printf("  %-52s %7.1f ns\n", "clock_gettime(CLOCK_MONOTONIC)", clk);
  printf("  %-52s %7.1f ns  (%.1fx baseline)\n", "ProxyStep startEvent+stopEvent, 1 thread", pair1,
         pair1 / base);
  printf("  %-52s %7.1f ns\n", "recordEventState, 1 thread", state1);
  printf("  %-52s %7.1f ns\n", "ProxyStep start + 3 states + stop, 1 thread", life1);
  printf("  %-52s %7.1f ns\n", "Coll startEvent+stopEvent, 1 thread", coll1);
  printf("  %-52s %7.1f ns\n", "ProxyStep startEvent+stopEvent, 2 threads, 2 comms", pair2);
  printf("  %-52s %7.1f ns\n", "recordEventState, 2 threads, 2 comms", state2);
  printf("  %-52s %7.1f ns\n", "ProxyStep startEvent+stopEvent, 2 threads, 1 comm", pair2s);
  printf("  %-52s %7.0f KiB\n", "resident memory per communicator (64 comms)", kib);
  printf("  target <= 100 ns per pair: %s\n",
         pair1 <= 100 && pair2 <= 100 ? "met" : "NOT met");
  P->finalize(c1[0]);
  P->finalize(c1[1]);
  return 0;
}
