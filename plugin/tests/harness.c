/* Drives libnccl-profiler-c4.so the way NCCL 2.26 - 2.30 do, each release through its own
 * profiler ABI (plugin/src/abi.h: the descriptor layouts of NCCL's profiler_v3.h .. v6.h) and
 * in NCCL's own event order (src/plugin/profiler.cc, src/enqueue.cc, src/proxy.cc,
 * src/transport/net.cc and profiler.cc of each release):
 *  - the loader looks up the newest symbol the release knows first (2.26: v3, 2.27: v4,
 *    2.28: v5, 2.29 and 2.30: v6, then older ones);
 *  - one process-wide activation mask, whose address every init gets; each API call takes a
 *    snapshot of it for its task, and events are started according to that snapshot;
 *  - v5+: GroupApi and CollApi events around every call, whatever the mask subscribes;
 *    every release: a Group event around the plan;
 *  - the plan's host task starts the Coll and stops it ("enqueued") before the proxy thread
 *    starts its ProxyOps, and KernelCh events come from the proxy thread (the profiler proxy
 *    op polls the kernel's counters), stopped with KernelChStop (v4+) when the kernel ends;
 *  - ProxyStep states carry NCCL's last transfer size of the op (v4+), or no arguments (v3,
 *    where the ProxyOp states carry the op's cumulative size);
 *  - PXN: a ProxyOp created by another process carries that process's pid, parent and
 *    context, and so do its ProxySteps' context.
 * A ring of ranks runs in this process (one process per node driving its GPUs), the proxy
 * thread moves proxy steps through their states with real sleeps, and a step waiting for a
 * peer waits until that peer's rank entered the op. The harness receives the plugin's
 * datagrams on its own Unix socket and checks them.
 *
 *   harness [--lib PATH] [--flood N] [--scenario NAME[,NAME]] [--release R] [--capture DIR]
 *           [--list]
 *   harness --emit-only --seconds N [--ranks N] [--channels N] [--comm HEX]
 *           [--slow-link R] [--straggler R] [--stall-rank R] [--hang-rank R]
 *
 * --list prints the scenario names; --scenario runs those named (all by default); --release
 * picks the NCCL release of the scenarios that are not about a release (2.30 by default).
 * --emit-only drives a ring AllReduce into $C4_AGENT_SOCKET without receiving (end-to-end tests
 * through a real agent): from 1 s on, --stall-rank R freezes R's receive from R-1
 * (communication hang), --hang-rank R keeps R out of the op while its neighbours wait
 * (non-communication hang). --capture DIR writes datagrams for tests/fixtures/plugin.
 * Exit status 0 when every check passed. */
#include <dlfcn.h>
#include <errno.h>
#include <inttypes.h>
#include <libgen.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "../src/abi.h"
#include "../src/wire.h"

#define MS 1000000ull
#define US 1000ull
#define NEVER UINT64_MAX
#define MAX_RANKS 64
#define MAX_CHANNELS 8
#define WINDOW 2 /* proxy steps in flight per op, as NCCL pipelines them */
#define INTERVAL_MS 100
#define STALL_MS 300

static int failures;
#define CHECK(cond, ...) check((cond), __LINE__, #cond, __VA_ARGS__)
__attribute__((format(printf, 4, 5))) static int check(int ok, int line, const char *expr,
                                                      const char *fmt, ...) {
  if (ok) return 1;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "FAIL harness.c:%d (%s): ", line, expr);
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
  failures++;
  return 0;
}

static uint64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static void sleep_ns(uint64_t ns) {
  struct timespec ts = {(time_t)(ns / 1000000000u), (long)(ns % 1000000000u)};
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

static void abs_timespec(uint64_t t, struct timespec *ts) {
  ts->tv_sec = (time_t)(t / 1000000000u);
  ts->tv_nsec = (long)(t % 1000000000u);
}

/* --------------------------------------------------------------------- NCCL, per release */

struct release {
  const char *name;
  int api; /* newest profiler version it knows */
};
static const struct release RELEASES[] = {
    {"2.26", 3}, {"2.27", 4}, {"2.28", 5}, {"2.29", 6}, {"2.30", 6}};
#define NRELEASES (int)(sizeof RELEASES / sizeof RELEASES[0])
#define NEWEST (&RELEASES[NRELEASES - 1])
static const struct release *MAIN_REL = NEWEST; /* of the scenarios about one release (--release) */

static void *DL;                /* the plugin, dlopen'ed once */
static const struct release *REL;
static int API;                 /* the profiler version the loader found */
static const char *PNAME;       /* its name field */
static c4_profiler_v3_t *P3;
static c4_profiler_v4_t *P4;
static c4_profiler_v5_t *P5;
static c4_profiler_v6_t *P6;
static int nccl_mask;           /* NCCL's process-wide ncclProfilerEventMask */
static pid_t self_pid;
static _Atomic int warn_lines;

/* NCCL's loader: the newest version the release knows first, then older ones. */
static int nccl_load(const struct release *r) {
  REL = r;
  API = 0;
  P3 = NULL, P4 = NULL, P5 = NULL, P6 = NULL;
  for (int v = r->api; v >= 1 && API == 0; v--) {
    char sym[32];
    snprintf(sym, sizeof sym, "ncclProfiler_v%d", v);
    void *p = dlsym(DL, sym);
    if (p == NULL) continue;
    API = v;
    if (v == 3) P3 = p, PNAME = P3->name;
    if (v == 4) P4 = p, PNAME = P4->name;
    if (v == 5) P5 = p, PNAME = P5->name;
    if (v == 6) P6 = p, PNAME = P6->name;
  }
  return API >= 3 ? API : 0; /* v1/v2 are not what the plugin implements */
}

static void nccl_logger(int level, unsigned long flags, const char *file, int line,
                        const char *fmt, ...) {
  (void)flags;
  (void)file;
  (void)line;
  if (level == C4_LOG_WARN) warn_lines++;
  else if (getenv("C4_HARNESS_VERBOSE") == NULL) return;
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "[nccl %s] ", level == C4_LOG_WARN ? "WARN" : "INFO");
  vfprintf(stderr, fmt, ap);
  fputc('\n', stderr);
  va_end(ap);
}

static int mask_now(void) { return __atomic_load_n(&nccl_mask, __ATOMIC_RELAXED); }

static void nccl_init(void **ctx, uint64_t hash, int nnodes, int nranks, int rank) {
  switch (API) {
    case 3: P3->init(ctx, &nccl_mask); break;
    case 4: P4->init(ctx, &nccl_mask, "harness", hash, nnodes, nranks, rank, nccl_logger); break;
    case 5: P5->init(ctx, hash, &nccl_mask, "harness", nnodes, nranks, rank, nccl_logger); break;
    case 6: P6->init(ctx, hash, &nccl_mask, "harness", nnodes, nranks, rank, nccl_logger); break;
  }
}

static void nccl_finalize(void *ctx) {
  if (ctx == NULL) return; /* NCCL skips a NULL context */
  switch (API) {
    case 3: P3->finalize(ctx); break;
    case 4: P4->finalize(ctx); break;
    case 5: P5->finalize(ctx); break;
    case 6: P6->finalize(ctx); break;
  }
}

/* An event as NCCL fills it in, before it is laid out for the loaded version. */
struct ev {
  uint64_t type;
  void *parent;
  int rank;
  uint64_t hash;              /* v3 Coll/P2p */
  const char *func, *dtype, *algo, *proto, *sync;
  size_t count;
  int peer, channel, is_send, nsteps, step;
  pid_t pid;
  void *group;                /* v5+ coll/p2p parentGroup */
};

#define FILL_COMMON(D)                                             \
  do {                                                             \
    (D).type = e->type;                                            \
    (D).parentObj = e->parent;                                     \
    (D).rank = e->rank;                                            \
    switch (e->type) {                                             \
      case C4_EV_PROXY_OP:                                         \
        (D).proxyOp.pid = e->pid;                                  \
        (D).proxyOp.channelId = (uint8_t)e->channel;               \
        (D).proxyOp.peer = e->peer;                                \
        (D).proxyOp.nSteps = e->nsteps;                            \
        (D).proxyOp.chunkSize = 1 << 19;                           \
        (D).proxyOp.isSend = e->is_send;                           \
        break;                                                     \
      case C4_EV_PROXY_STEP: (D).proxyStep.step = e->step; break;  \
      case C4_EV_KERNEL_CH: (D).kernelCh.channelId = (uint8_t)e->channel; break; \
      case C4_EV_COLL:                                             \
        (D).coll.func = e->func;                                   \
        (D).coll.count = e->count;                                 \
        (D).coll.datatype = e->dtype;                              \
        (D).coll.algo = e->algo;                                   \
        (D).coll.proto = e->proto;                                 \
        break;                                                     \
      case C4_EV_P2P:                                              \
        (D).p2p.func = e->func;                                    \
        (D).p2p.count = e->count;                                  \
        (D).p2p.datatype = e->dtype;                               \
        (D).p2p.peer = e->peer;                                    \
        break;                                                     \
      default: break;                                              \
    }                                                              \
  } while (0)

#define FILL_V5(D)                                                                       \
  do {                                                                                   \
    FILL_COMMON(D);                                                                      \
    if (e->type == C4_EV_COLL) (D).coll.parentGroup = e->group, (D).coll.nChannels = 2;  \
    if (e->type == C4_EV_P2P) (D).p2p.parentGroup = e->group, (D).p2p.nChannels = 1;     \
    if (e->type == C4_EV_COLL_API) (D).collApi.func = e->func, (D).collApi.count = e->count, \
                                   (D).collApi.datatype = e->dtype;                      \
    if (e->type == C4_EV_GROUP_API) (D).groupApi.groupDepth = 1;                         \
    if (e->type == C4_EV_KERNEL_CH) (D).kernelCh.pTimer = now_ns();                      \
  } while (0)

/* startEvent with the loaded version's descriptor; NCCL's handle stays NULL if none. */
static void *nccl_start(void *ctx, const struct ev *e) {
  void *h = NULL;
  switch (API) {
    case 3: {
      c4_descr_v3_t d;
      memset(&d, 0, sizeof d);
      FILL_COMMON(d);
      if (e->type == C4_EV_COLL) d.coll.commHash = e->hash, d.coll.name = "harness";
      if (e->type == C4_EV_P2P) d.p2p.commHash = e->hash, d.p2p.name = "harness";
      P3->startEvent(ctx, &h, &d);
      break;
    }
    case 4: {
      c4_descr_v4_t d;
      memset(&d, 0, sizeof d);
      FILL_COMMON(d);
      if (e->type == C4_EV_KERNEL_CH) d.kernelCh.pTimer = now_ns();
      P4->startEvent(ctx, &h, &d);
      break;
    }
    case 5: {
      c4_descr_v5_t d;
      memset(&d, 0, sizeof d);
      FILL_V5(d);
      P5->startEvent(ctx, &h, &d);
      break;
    }
    case 6: {
      c4_descr_v6_t d;
      memset(&d, 0, sizeof d);
      FILL_V5(d);
      if (e->type == C4_EV_CE_COLL) {
        d.ceColl.func = e->func;
        d.ceColl.count = e->count;
        d.ceColl.datatype = e->dtype;
        d.ceColl.syncStrategy = e->sync;
      }
      if (e->type == C4_EV_CE_BATCH) d.ceCollBatch.numOps = 1, d.ceCollBatch.totalBytes = e->count;
      P6->startEvent(ctx, &h, &d);
      break;
    }
  }
  return h;
}

static void nccl_stop(void *h) {
  if (h == NULL) return; /* NCCL never stops a NULL handle */
  switch (API) {
    case 3: P3->stopEvent(h); break;
    case 4: P4->stopEvent(h); break;
    case 5: P5->stopEvent(h); break;
    case 6: P6->stopEvent(h); break;
  }
}

static void nccl_record(void *h, c4_nccl_state_t st, c4_nccl_state_args_t *a) {
  if (h == NULL) return;
  switch (API) {
    case 4: P4->recordEventState(h, st, a); break;
    case 5: P5->recordEventState(h, st, a); break;
    case 6: P6->recordEventState(h, st, a); break;
  }
}

/* What NCCL does not do, and the plugin must survive anyway: NULL handles. */
static void nccl_null_handle(void) {
  c4_nccl_state_args_t a = {.proxyStep = {1000}};
  switch (API) {
    case 3: P3->recordEventState(NULL, C4_ST_SEND_WAIT, NULL), P3->stopEvent(NULL); break;
    case 4: P4->recordEventState(NULL, C4_ST_SEND_WAIT, &a), P4->stopEvent(NULL); break;
    case 5: P5->recordEventState(NULL, C4_ST_SEND_WAIT, &a), P5->stopEvent(NULL); break;
    case 6: P6->recordEventState(NULL, C4_ST_SEND_WAIT, &a), P6->stopEvent(NULL); break;
  }
}

/* A ProxyStep state: v4+ pass the op's last transfer size (sub->transSize), v3 nothing. */
static void nccl_step_state(void *h, c4_nccl_state_t st, size_t sub_trans) {
  if (h == NULL) return;
  if (API == 3) {
    P3->recordEventState(h, st, NULL);
    return;
  }
  c4_nccl_state_args_t a;
  memset(&a, 0, sizeof a);
  a.proxyStep.transSize = sub_trans;
  nccl_record(h, st, &a);
}

/* v3 only: a ProxyOp state with the op's cumulative size; v4+ record ProxyOpInProgress once. */
static void nccl_op_state(void *h, c4_nccl_state_t st, size_t cumulative, int steps) {
  if (h == NULL) return;
  if (API == 3) {
    c4_nccl_state_args_v3_t a;
    memset(&a, 0, sizeof a);
    a.proxyOp.transSize = cumulative;
    a.proxyOp.steps = steps;
    P3->recordEventState(h, st, &a);
  } else if (st == C4_ST_PROXY_OP_IN_PROGRESS) {
    c4_nccl_state_args_t a;
    memset(&a, 0, sizeof a);
    nccl_record(h, st, &a);
  }
}

/* The end of a kernel channel, seen by the proxy thread: KernelChStop (v4+), then stop. */
static void nccl_kch_end(void *h) {
  if (h == NULL) return;
  c4_nccl_state_args_t a = {.kernelCh = {now_ns()}};
  if (API >= 4) nccl_record(h, C4_ST_KERNEL_CH_STOP, &a);
  nccl_stop(h);
}

/* A communicator: NCCL's context, and the harness's view of its rank. */
struct hcomm {
  void *ctx;
  uint64_t hash;
  int rank, nranks, nnodes;
  _Atomic int entered_it;         /* iteration whose Coll this rank started */
  _Atomic uint64_t entered_ns;
  _Atomic uint64_t last_event_ns; /* last proxy-step event the harness issued */
  uint64_t hops_done, net_done, kern_done; /* proxy ops finished (all, network, kernel), under PX.mu */
};

/* A ProxyOp and a ProxyStep of communicator c, this process's own. */
static void *ev_proxy_op(struct hcomm *c, void *parent, int peer, int ch, int is_send,
                         int nsteps) {
  struct ev e = {.type = C4_EV_PROXY_OP, .parent = parent, .rank = c->rank, .pid = self_pid,
                 .peer = peer, .channel = ch, .is_send = is_send, .nsteps = nsteps};
  return nccl_start(c->ctx, &e);
}

static void *ev_step(struct hcomm *c, void *op, int step) {
  struct ev e = {.type = C4_EV_PROXY_STEP, .parent = op, .rank = c->rank, .step = step};
  return nccl_start(c->ctx, &e);
}

static void comm_init(struct hcomm *c, uint64_t hash, int rank, int nranks, int nnodes) {
  memset(c, 0, sizeof *c);
  c->hash = hash;
  c->rank = rank;
  c->nranks = nranks;
  c->nnodes = nnodes;
  atomic_store(&c->entered_it, -1);
  nccl_init(&c->ctx, hash, nnodes, nranks, rank);
  CHECK(c->ctx != NULL, "init failed for rank %d", rank);
  int want = C4_EV_COLL | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH;
  CHECK((mask_now() & want) == want, "activation mask %#x", mask_now());
}

/* Task masks, as enqueue.cc and profiler.cc test them. */
#define WANTS_COLL(m) ((m) & (C4_EV_COLL | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH | C4_EV_NET_PLUGIN))
#define WANTS_P2P(m) ((m) & (C4_EV_P2P | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH | C4_EV_NET_PLUGIN))
#define WANTS_OP(m) ((m) & (C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_NET_PLUGIN))
#define WANTS_STEP(m) ((m) & (C4_EV_PROXY_STEP | C4_EV_NET_PLUGIN))
#define WANTS_GROUP(m) ((m) & (C4_EV_GROUP | C4_EV_COLL | C4_EV_P2P | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH | C4_EV_NET_PLUGIN))

/* One collective call as the application thread makes it, up to the plan's host task:
 * [v5+ GroupApi, CollApi], Group, Coll start, Coll stop ("enqueued"), Group stop,
 * [GroupApi stop]. Returns the Coll handle (the parent of its ProxyOps and KernelChs) and the
 * task's snapshot of the mask. The Coll handle is only used as a parent after its stop, as
 * NCCL does (sub->taskEventHandle). */
struct call {
  void *coll;
  int mask;
  uint64_t t_start, t_stop;
};

static struct call nccl_call(struct hcomm *c, const char *func, const char *dtype, size_t count,
                             int is_p2p, int peer) {
  struct call k = {0};
  int m = mask_now(); /* ncclProfilerApiState.eActivationMask: one snapshot per call */
  void *gapi = NULL, *capi = NULL;
  struct ev e = {.rank = c->rank, .func = func, .dtype = dtype, .count = count};
  if (API >= 5) {
    e.type = C4_EV_GROUP_API;
    gapi = nccl_start(c->ctx, &e);
    nccl_record(gapi, (c4_nccl_state_t)23, NULL); /* GroupStartApiStop */
    e.type = is_p2p ? C4_EV_P2P_API : C4_EV_COLL_API;
    e.parent = gapi;
    capi = nccl_start(c->ctx, &e);
    nccl_stop(capi);
    nccl_record(gapi, (c4_nccl_state_t)24, NULL); /* GroupEndApiStart */
  }
  k.mask = m;
  void *group = NULL;
  if (WANTS_GROUP(m)) {
    struct ev g = {.type = C4_EV_GROUP};
    group = nccl_start(c->ctx, &g);
  }
  k.t_start = now_ns();
  if (is_p2p ? WANTS_P2P(m) : WANTS_COLL(m)) {
    e.type = is_p2p ? C4_EV_P2P : C4_EV_COLL;
    e.parent = API >= 5 ? capi : group;
    e.group = group;
    e.hash = c->hash;
    e.peer = peer;
    e.algo = "RING";
    e.proto = "SIMPLE";
    k.coll = nccl_start(c->ctx, &e);
  }
  atomic_store(&c->entered_ns, now_ns());
  nccl_stop(k.coll); /* hostStreamPlanTask: stopped before the proxy thread sees its ops */
  nccl_stop(group);
  k.t_stop = now_ns();
  nccl_stop(gapi);
  return k;
}

/* A copy-engine collective (v6, NCCL 2.29+): CeColl with CeSync/CeBatch children, all on the
 * application thread, started when the global mask asks for any CE event. */
static void nccl_ce_call(struct hcomm *c, const char *func, const char *dtype, size_t count) {
  if (API < 6 || !(mask_now() & (C4_EV_CE_COLL | C4_EV_CE_SYNC | C4_EV_CE_BATCH))) return;
  struct ev e = {.type = C4_EV_CE_COLL, .rank = c->rank, .func = func, .dtype = dtype,
                 .count = count, .sync = "MC"};
  void *ce = nccl_start(c->ctx, &e);
  if (ce != NULL) {
    struct ev s = {.type = C4_EV_CE_SYNC, .parent = ce, .rank = c->rank};
    if (mask_now() & C4_EV_CE_SYNC) nccl_stop(nccl_start(c->ctx, &s));
    s.type = C4_EV_CE_BATCH;
    s.count = count;
    if (mask_now() & C4_EV_CE_BATCH) nccl_stop(nccl_start(c->ctx, &s));
  }
  nccl_stop(ce);
}

/* ------------------------------------------------------------------------- the receiver */

struct rmsg {
  uint64_t t_ns;
  size_t len;
  unsigned char *data;
};

static struct {
  pthread_mutex_t mu;
  struct rmsg *v;
  size_t n, cap;
  int fd;
  pthread_t thread;
  _Atomic int quit;
  char dir[64], path[108];
} R = {.mu = PTHREAD_MUTEX_INITIALIZER, .fd = -1};

static void *rx_run(void *arg) {
  (void)arg;
  static unsigned char buf[65536];
  struct pollfd p = {.fd = R.fd, .events = POLLIN};
  while (!R.quit) {
    if (poll(&p, 1, 20) <= 0) continue;
    ssize_t n;
    while ((n = recv(R.fd, buf, sizeof buf, MSG_DONTWAIT)) > 0) {
      struct rmsg m = {now_ns(), (size_t)n, malloc((size_t)n)};
      memcpy(m.data, buf, (size_t)n);
      pthread_mutex_lock(&R.mu);
      if (R.n == R.cap) {
        R.cap = R.cap ? R.cap * 2 : 1024;
        R.v = realloc(R.v, R.cap * sizeof *R.v);
      }
      R.v[R.n++] = m;
      pthread_mutex_unlock(&R.mu);
    }
  }
  return NULL;
}

static void rx_start(void) {
  R.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un a = {.sun_family = AF_UNIX};
  snprintf(a.sun_path, sizeof a.sun_path, "%s", R.path);
  int rcvbuf = 8 << 20;
  setsockopt(R.fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof rcvbuf);
  if (bind(R.fd, (struct sockaddr *)&a, sizeof a) != 0) {
    perror("bind");
    exit(2);
  }
  R.quit = 0;
  pthread_create(&R.thread, NULL, rx_run, NULL);
}

static void rx_stop(void) {
  R.quit = 1;
  pthread_join(R.thread, NULL);
  close(R.fd);
  unlink(R.path);
}

static void rx_clear(void) {
  pthread_mutex_lock(&R.mu);
  for (size_t i = 0; i < R.n; i++) free(R.v[i].data);
  R.n = 0;
  pthread_mutex_unlock(&R.mu);
}

/* A parsed datagram; the checks here are the harness's own reading of wire.h. */
struct view {
  const struct c4w_header *h;
  const struct c4w_summary *sum;   /* type summary */
  const struct c4w_stalled *stall; /* type stalled */
  const struct c4w_coll *colls;
  const struct c4w_peer *peers;
  const struct c4w_waiting *waiting;
  uint64_t t_ns;
  size_t len;
  const unsigned char *data;
};

static int parse(const struct rmsg *m, struct view *v) {
  memset(v, 0, sizeof *v);
  v->t_ns = m->t_ns;
  v->len = m->len;
  v->data = m->data;
  if (!CHECK(m->len >= sizeof *v->h && m->len <= C4W_MAX_DGRAM, "datagram of %zu bytes", m->len))
    return 0;
  v->h = (const void *)m->data;
  if (!CHECK(v->h->magic == C4W_MAGIC && v->h->version == C4W_VERSION, "bad magic/version"))
    return 0;
  CHECK(v->h->part < v->h->nparts, "part %u of %u", v->h->part, v->h->nparts);
  const unsigned char *p = m->data + sizeof *v->h;
  size_t want;
  if (v->h->type == C4W_SUMMARY) {
    v->sum = (const void *)p;
    v->colls = (const void *)(p + sizeof *v->sum);
    v->peers = (const void *)(v->colls + v->sum->ncolls);
    want = sizeof *v->h + sizeof *v->sum + v->sum->ncolls * sizeof *v->colls +
           v->sum->npeers * sizeof *v->peers;
  } else {
    CHECK(v->h->type == C4W_STALLED, "type %u", v->h->type);
    v->stall = (const void *)p;
    v->waiting = (const void *)(p + sizeof *v->stall);
    want = sizeof *v->h + sizeof *v->stall + v->stall->nwaiting * sizeof *v->waiting;
  }
  return CHECK(want == m->len, "length %zu, layout says %zu", m->len, want);
}

/* Calls fn on every received datagram of (type, comm, rank), in arrival order. */
static int each_msg(int type, uint64_t hash, int rank, int (*fn)(struct view *, void *),
                    void *arg) {
  int n = 0;
  pthread_mutex_lock(&R.mu);
  for (size_t i = 0; i < R.n; i++) {
    struct view v;
    const struct c4w_header *h = (const void *)R.v[i].data;
    if (R.v[i].len < sizeof *h || h->type != type || h->comm != hash ||
        (rank >= 0 && (int)h->rank != rank))
      continue;
    if (!parse(&R.v[i], &v)) continue;
    n++;
    if (fn != NULL && fn(&v, arg)) break;
  }
  pthread_mutex_unlock(&R.mu);
  return n;
}

static void save(const char *dir, const char *name, const struct view *v) {
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(v->data, 1, v->len, f) != v->len) perror(path);
  if (f) fclose(f);
}

/* Summaries of one rank, added up. */
struct agg_peer {
  uint32_t peer;
  uint16_t channel;
  uint8_t dir;
  uint64_t bytes, steps, net, peerw, gpu;
};
struct agg {
  int nmsgs, final_seen, after_final, last_has_inflight;
  uint32_t nranks, nnodes;
  uint64_t ce_count, ce_bytes;
  uint64_t seq_started, seq_completed, dropped, entry_wait, entry_ops, dgram_drops;
  uint64_t colls, coll_bytes, coll_time, last_msg_seq;
  char func[C4W_NAME], algo[C4W_NAME], proto[C4W_NAME];
  int npeers;
  struct agg_peer peers[4096];
};

static struct agg_peer *agg_peer(struct agg *a, uint32_t peer, uint16_t ch, uint8_t dir) {
  for (int i = 0; i < a->npeers; i++)
    if (a->peers[i].peer == peer && a->peers[i].channel == ch && a->peers[i].dir == dir)
      return &a->peers[i];
  struct agg_peer *p = &a->peers[a->npeers++];
  memset(p, 0, sizeof *p);
  p->peer = peer;
  p->channel = ch;
  p->dir = dir;
  return p;
}

static int agg_one(struct view *v, void *arg) {
  struct agg *a = arg;
  const struct c4w_summary *s = v->sum;
  if (v->h->part == 0) {
    a->nmsgs++;
    a->after_final += a->final_seen; /* a communicator says nothing after its final summary */
    CHECK(v->h->msg_seq > a->last_msg_seq, "msg_seq %" PRIu64 " after %" PRIu64, v->h->msg_seq,
          a->last_msg_seq);
    a->last_msg_seq = v->h->msg_seq;
    a->entry_wait += s->entry_wait_ns;
    a->entry_ops += s->entry_ops;
  }
  a->seq_started = s->seq_started;
  a->seq_completed = s->seq_completed;
  a->dropped = s->dropped_events;
  a->dgram_drops = v->h->dgram_drops;
  a->last_has_inflight = s->has_inflight;
  a->final_seen |= v->h->flags & C4W_FLAG_FINAL;
  a->nranks = v->h->nranks;
  a->nnodes = v->h->nnodes;
  for (int i = 0; i < s->ncolls; i++) {
    a->colls += v->colls[i].count;
    a->coll_bytes += v->colls[i].bytes;
    a->coll_time += v->colls[i].time_ns;
    memcpy(a->func, v->colls[i].func, C4W_NAME);
    memcpy(a->algo, v->colls[i].algo, C4W_NAME);
    memcpy(a->proto, v->colls[i].proto, C4W_NAME);
    if (!strcmp(v->colls[i].algo, "CE")) {
      a->ce_count += v->colls[i].count;
      a->ce_bytes += v->colls[i].bytes;
    }
  }
  for (int i = 0; i < s->npeers; i++) {
    const struct c4w_peer *r = &v->peers[i];
    struct agg_peer *p = agg_peer(a, r->peer, r->channel, r->dir);
    p->bytes += r->bytes;
    p->steps += r->steps;
    p->net += r->net_wait_ns;
    p->peerw += r->peer_wait_ns;
    p->gpu += r->gpu_wait_ns;
  }
  return 0;
}

static struct agg *aggregate(uint64_t hash, int rank) {
  static struct agg a;
  memset(&a, 0, sizeof a);
  each_msg(C4W_SUMMARY, hash, rank, agg_one, &a);
  return &a;
}

/* Waits until a message matching (type, hash, rank) satisfies fn, or the timeout passes. */
static int wait_msg(int type, uint64_t hash, int rank, int (*fn)(struct view *, void *),
                    void *arg, uint64_t timeout_ns) {
  uint64_t end = now_ns() + timeout_ns;
  do {
    int found = 0;
    pthread_mutex_lock(&R.mu);
    for (size_t i = 0; i < R.n && !found; i++) {
      const struct c4w_header *h = (const void *)R.v[i].data;
      struct view v;
      if (R.v[i].len >= sizeof *h && h->type == type && h->comm == hash &&
          (rank < 0 || (int)h->rank == rank) && parse(&R.v[i], &v))
        found = fn == NULL || fn(&v, arg);
    }
    pthread_mutex_unlock(&R.mu);
    if (found) return 1;
    sleep_ns(5 * MS);
  } while (now_ns() < end);
  return 0;
}

/* ------------------------------------------------------------------- the proxy thread */

struct phase {
  c4_nccl_state_t state;
  int sets_size; /* NCCL sets sub->transSize to this step's size as it enters this state */
  int gated;     /* waits for the peer to enter the op (credit or data from it) */
  int network;   /* the phase a frozen step never leaves */
  int op_state;  /* v3: the ProxyOp state NCCL records with it */
};
/* net.cc: send = GPU wait, (v4+) peer credit, network; recv = network, flush, GPU. */
static const struct phase SEND_V4[3] = {
    {C4_ST_SEND_GPU_WAIT, 0, 0, 0, 0}, {C4_ST_SEND_PEER_WAIT, 0, 1, 0, 1}, {C4_ST_SEND_WAIT, 1, 0, 1, 2}};
static const struct phase SEND_V3[2] = {
    {C4_ST_SEND_GPU_WAIT, 0, 1, 0, 0}, {C4_ST_SEND_WAIT, 1, 0, 1, 2}};
static const struct phase RECV[3] = {
    {C4_ST_RECV_WAIT, 0, 1, 1, 4}, {C4_ST_RECV_FLUSH_WAIT, 1, 0, 0, 5}, {C4_ST_RECV_GPU_WAIT, 0, 0, 0, 6}};

struct hstep {
  void *h;
  int phase;
  uint64_t phase_start, deadline;
};

enum { HOP_NET, HOP_KERNEL };

struct hop { /* a proxy op (network) or a profiler proxy op (kernel channel) */
  int kind;
  struct hcomm *comm;      /* whose counters it advances */
  struct hcomm *peer_comm; /* whose entry gates step 0; NULL: not gated */
  void *ctx, *parent;      /* what NCCL passes: sub->profilerContext, sub->taskEventHandle */
  pid_t pid;
  int mask;                /* the task's activation mask */
  void *h;
  int peer, channel, is_send, nsteps, iter;
  size_t chunk, sub_trans, cumulative;
  const struct phase *ph;
  int nph;
  uint64_t dur[3];
  int started, done, nwin;
  struct hstep win[WINDOW];
  int freeze_step;          /* -1: none */
  _Atomic int *freeze;      /* while nonzero, freeze_step stays in its network phase */
  /* kernel */
  uint64_t after;           /* kernels of this comm that end before this one starts */
  uint64_t run_ns, t0;
  uint64_t wait_net;        /* network ops of the comm that end before the kernel does */
  _Atomic int *hang;        /* while nonzero, the kernel does not end */
  struct hop *next;
};

static struct {
  pthread_mutex_t mu;
  pthread_cond_t cv;      /* new work */
  pthread_cond_t done_cv; /* a hop finished */
  struct hop *queue;
  int quit;
  pthread_t thread;
} PX = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* Size of step k of an op: alternating, so that a stale transSize shows. */
static size_t step_size(size_t chunk, int k) { return chunk - (size_t)(k % 2) * (chunk / 4); }

static uint64_t phase_deadline(struct hop *o, struct hstep *s, int stepno) {
  const struct phase *ph = &o->ph[s->phase];
  uint64_t from = s->phase_start;
  if (ph->network && stepno == o->freeze_step && o->freeze && atomic_load(o->freeze))
    return NEVER;
  if (ph->gated && o->peer_comm != NULL) {
    if (atomic_load(&o->peer_comm->entered_it) < o->iter) return NEVER;
    uint64_t entered = atomic_load(&o->peer_comm->entered_ns);
    if (entered > from) from = entered;
  }
  return from + o->dur[s->phase];
}

static void phase_begin(struct hop *o, struct hstep *s, int stepno, int phase) {
  const struct phase *ph = &o->ph[phase];
  s->phase = phase;
  if (ph->sets_size) {
    o->sub_trans = step_size(o->chunk, stepno);
    o->cumulative += o->sub_trans;
  }
  nccl_op_state(o->h, (c4_nccl_state_t)ph->op_state, o->cumulative, stepno);
  if (o->h != NULL) nccl_step_state(s->h, ph->state, o->sub_trans); /* needs opEventHandle */
  s->phase_start = now_ns(); /* after the plugin's timestamp: it sees at least the duration */
  s->deadline = phase_deadline(o, s, stepno);
}

static void *step_begin(struct hop *o, int stepno) {
  if (!WANTS_STEP(o->mask)) return NULL;
  struct ev e = {.type = C4_EV_PROXY_STEP, .parent = o->h, .rank = o->comm->rank, .step = stepno};
  return nccl_start(o->ctx, &e);
}

/* Advances one network hop; returns 1 when all its steps are done. */
static int net_progress(struct hop *o, uint64_t now, uint64_t *next) {
  while (o->nwin < WINDOW && o->started < o->nsteps) {
    struct hstep *s = &o->win[o->nwin++];
    s->h = step_begin(o, o->started);
    phase_begin(o, s, o->started, 0);
    o->started++;
    atomic_store(&o->comm->last_event_ns, now);
  }
  for (int i = 0; i < o->nwin; i++) {
    struct hstep *s = &o->win[i];
    int stepno = o->started - o->nwin + i;
    if (s->deadline == NEVER) s->deadline = phase_deadline(o, s, stepno);
    if (s->deadline > now) {
      if (s->deadline < *next) *next = s->deadline;
      continue;
    }
    if (s->phase < o->nph - 1) {
      phase_begin(o, s, stepno, s->phase + 1);
      if (s->deadline < *next) *next = s->deadline;
    } else if (i == 0) { /* steps complete in order */
      nccl_stop(s->h);
      nccl_op_state(o->h, o->is_send ? 3 : 7, o->cumulative, stepno); /* v3: Send/RecvDone */
      memmove(&o->win[0], &o->win[1], (size_t)(o->nwin - 1) * sizeof o->win[0]);
      o->nwin--;
      o->done++;
      i--;
      *next = now;
    } else {
      continue; /* done, waits for the steps before it */
    }
    atomic_store(&o->comm->last_event_ns, now);
  }
  return o->done == o->nsteps;
}

/* A kernel channel: starts when the kernels before it on the stream ended, ends after its
 * run time and its communicator's network ops (unless it hangs). */
static int kernel_progress(struct hop *o, uint64_t now, uint64_t *next) {
  if (!o->started) {
    if (o->comm->kern_done < o->after) return 0; /* read under PX.mu by the caller */
    o->started = 1;
    o->t0 = now;
    if (o->mask & C4_EV_KERNEL_CH) {
      struct ev e = {.type = C4_EV_KERNEL_CH, .parent = o->parent, .channel = o->channel};
      o->h = nccl_start(o->ctx, &e);
    }
  }
  if ((o->hang && atomic_load(o->hang)) || o->comm->net_done < o->wait_net) return 0;
  if (now < o->t0 + o->run_ns) {
    if (o->t0 + o->run_ns < *next) *next = o->t0 + o->run_ns;
    return 0;
  }
  nccl_kch_end(o->h);
  return 1;
}

static void *proxy_run(void *arg) {
  (void)arg;
  struct hop *active = NULL, **tail = &active;
  pthread_mutex_lock(&PX.mu);
  while (!PX.quit) {
    while (PX.queue) { /* in posting order; ProxyOps start when the proxy thread takes them */
      struct hop *o = PX.queue;
      PX.queue = o->next;
      o->next = NULL;
      *tail = o;
      tail = &o->next;
      if (o->kind == HOP_NET && WANTS_OP(o->mask)) {
        struct ev e = {.type = C4_EV_PROXY_OP, .parent = o->parent, .rank = o->comm->rank,
                       .pid = o->pid, .channel = o->channel, .peer = o->peer,
                       .nsteps = o->nsteps, .is_send = o->is_send};
        o->h = nccl_start(o->ctx, &e);
        nccl_op_state(o->h, C4_ST_PROXY_OP_IN_PROGRESS, 0, 0);
      }
    }
    uint64_t now = now_ns(), next = now + 5 * MS;
    struct hop *finished = NULL;
    for (struct hop **pp = &active; *pp;) {
      struct hop *o = *pp;
      int fin;
      if (o->kind == HOP_KERNEL) {
        fin = kernel_progress(o, now, &next);
      } else {
        pthread_mutex_unlock(&PX.mu);
        fin = net_progress(o, now, &next);
        if (fin) nccl_stop(o->h);
        pthread_mutex_lock(&PX.mu);
      }
      if (fin) {
        *pp = o->next;
        o->next = finished;
        finished = o;
      } else {
        pp = &o->next;
      }
    }
    for (tail = &active; *tail; tail = &(*tail)->next) {
    }
    while (finished) {
      struct hop *o = finished;
      finished = o->next;
      o->comm->hops_done++;
      if (o->kind == HOP_NET) o->comm->net_done++;
      else o->comm->kern_done++;
      free(o);
      next = now; /* a kernel may wait for it */
      pthread_cond_broadcast(&PX.done_cv);
    }
    if (!PX.queue && !PX.quit && next > now_ns()) {
      struct timespec ts;
      abs_timespec(next, &ts);
      pthread_cond_timedwait(&PX.cv, &PX.mu, &ts);
    }
  }
  pthread_mutex_unlock(&PX.mu);
  return NULL;
}

static void proxy_post(struct hop *o) {
  pthread_mutex_lock(&PX.mu);
  struct hop **pp = &PX.queue;
  while (*pp) pp = &(*pp)->next;
  o->next = NULL;
  *pp = o;
  pthread_cond_signal(&PX.cv);
  pthread_mutex_unlock(&PX.mu);
}

/* Waits until `c` has finished `target` proxy ops in all. */
static void proxy_wait(struct hcomm *c, uint64_t target) {
  pthread_mutex_lock(&PX.mu);
  while (c->hops_done < target) pthread_cond_wait(&PX.done_cv, &PX.mu);
  pthread_mutex_unlock(&PX.mu);
}

static void proxy_start(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&PX.cv, &a);
  pthread_cond_init(&PX.done_cv, NULL);
  pthread_create(&PX.thread, NULL, proxy_run, NULL);
}

static void proxy_stop(void) {
  pthread_mutex_lock(&PX.mu);
  PX.quit = 1;
  pthread_cond_signal(&PX.cv);
  pthread_mutex_unlock(&PX.mu);
  pthread_join(PX.thread, NULL);
}

/* A network proxy op of communicator c (sub->pid = this process). */
static struct hop *net_hop(struct hcomm *c, struct call *k, int peer, int ch, int is_send,
                           int nsteps, size_t chunk) {
  struct hop *o = calloc(1, sizeof *o);
  o->kind = HOP_NET;
  o->comm = c;
  o->ctx = c->ctx;
  o->parent = k->coll;
  o->mask = k->mask;
  o->pid = self_pid;
  o->peer = peer;
  o->channel = ch;
  o->is_send = is_send;
  o->nsteps = nsteps;
  o->chunk = chunk;
  o->ph = is_send ? (API == 3 ? SEND_V3 : SEND_V4) : RECV;
  o->nph = is_send && API == 3 ? 2 : 3;
  o->freeze_step = -1;
  return o;
}

static struct hop *kernel_hop(struct hcomm *c, struct call *k, int ch) {
  struct hop *o = calloc(1, sizeof *o);
  o->kind = HOP_KERNEL;
  o->comm = c;
  o->ctx = c->ctx;
  o->parent = k->coll;
  o->mask = k->mask;
  o->channel = ch;
  return o;
}

/* ------------------------------------------------------ a ring AllReduce over N ranks */

struct ring {
  uint64_t hash;
  int nranks, nnodes, nchan, nsteps;
  size_t chunk, count;
  uint64_t gpu_ns, peer_ns, net_ns, flush_ns;
  int slow_src, slow_factor; /* link slow_src -> slow_src+1 is slow_factor times slower */
  int straggler;             /* enters every op straggle_ns late */
  uint64_t straggle_ns;
  int stall_rank;            /* its recv from rank-1 on channel 0 can freeze */
  int hang_rank;             /* skipped by ring_begin: never enters the op */
  _Atomic int freeze;
  struct hcomm comms[MAX_RANKS];
  struct call calls[MAX_RANKS];
  uint64_t op_ns[MAX_RANKS];      /* harness-measured: before Coll start to after completion */
  uint64_t enqueue_ns[MAX_RANKS]; /* Coll start to Coll stop */
  uint64_t posted[MAX_RANKS];     /* proxy ops posted, kernel channels included */
  uint64_t net_posted[MAX_RANKS];
  int iters;
};

static void ring_init(struct ring *r) {
  for (int i = 0; i < r->nranks; i++)
    comm_init(&r->comms[i], r->hash, i, r->nranks, r->nnodes);
}

/* Bytes one connection of the ring carries per op. */
static uint64_t ring_op_bytes(const struct ring *r) {
  uint64_t b = 0;
  for (int k = 0; k < r->nsteps; k++) b += step_size(r->chunk, k);
  return b;
}

static struct hop *ring_hop(struct ring *r, int rank, int ch, int is_send, int it) {
  int n = r->nranks, peer = is_send ? (rank + 1) % n : (rank + n - 1) % n;
  struct hop *o = net_hop(&r->comms[rank], &r->calls[rank], peer, ch, is_send, r->nsteps, r->chunk);
  o->peer_comm = &r->comms[peer];
  o->iter = it;
  int src = is_send ? rank : peer;
  uint64_t net = r->net_ns * (src == r->slow_src ? (uint64_t)r->slow_factor : 1);
  if (!is_send) o->dur[0] = net, o->dur[1] = r->flush_ns, o->dur[2] = r->gpu_ns;
  else if (API == 3) o->dur[0] = r->gpu_ns + r->peer_ns, o->dur[1] = net;
  else o->dur[0] = r->gpu_ns, o->dur[1] = r->peer_ns, o->dur[2] = net;
  if (rank == r->stall_rank && !is_send && ch == 0) {
    o->freeze_step = 3 < r->nsteps ? 3 : 0;
    o->freeze = &r->freeze;
  }
  return o;
}

/* The application side of one op on rank i (Coll started and stopped: enqueued), then what
 * the proxy thread sees: a ProxyOp per channel and direction, a KernelCh per channel that
 * ends when the rank's proxy ops have. */
static void ring_begin_rank(struct ring *r, int i, int it) {
  struct hcomm *c = &r->comms[i];
  uint64_t t0 = now_ns();
  r->calls[i] = nccl_call(c, "AllReduce", "ncclFloat32", r->count, 0, -1);
  atomic_store(&c->entered_it, it);
  r->calls[i].t_start = t0;
  r->enqueue_ns[i] += r->calls[i].t_stop - t0;
  for (int ch = 0; ch < r->nchan; ch++) {
    proxy_post(ring_hop(r, i, ch, 1, it));
    proxy_post(ring_hop(r, i, ch, 0, it));
  }
  r->net_posted[i] += (uint64_t)(2 * r->nchan);
  for (int ch = 0; ch < r->nchan; ch++) {
    struct hop *k = kernel_hop(c, &r->calls[i], ch);
    k->wait_net = r->net_posted[i];
    proxy_post(k);
  }
  r->posted[i] += (uint64_t)(3 * r->nchan);
}

static void ring_begin(struct ring *r, int it) {
  for (int i = 0; i < r->nranks; i++)
    if (i != r->straggler && i != r->hang_rank) ring_begin_rank(r, i, it);
  if (r->straggler >= 0) {
    sleep_ns(r->straggle_ns);
    ring_begin_rank(r, r->straggler, it);
  }
}

/* The op of rank i is over when its kernel channels have ended. */
static void ring_end_rank(struct ring *r, int i) {
  proxy_wait(&r->comms[i], r->posted[i]);
  r->op_ns[i] += now_ns() - r->calls[i].t_start;
}

static void ring_end(struct ring *r) {
  for (int i = 0; i < r->nranks; i++) ring_end_rank(r, i);
  r->iters++;
}

static void ring_finalize(struct ring *r) {
  for (int i = 0; i < r->nranks; i++) nccl_finalize(r->comms[i].ctx);
}

static void ring_defaults(struct ring *r, uint64_t hash) {
  memset(r, 0, sizeof *r);
  r->hash = hash;
  r->nranks = 8;
  r->nnodes = 2;
  r->nchan = 2;
  r->nsteps = 8;
  r->chunk = 512 * 1024;
  r->count = r->chunk * (size_t)r->nsteps * 2 / 4; /* floats */
  r->gpu_ns = 100 * US;
  r->peer_ns = 50 * US;
  r->net_ns = 1000 * US;
  r->flush_ns = 50 * US;
  r->slow_src = -1;
  r->slow_factor = 1;
  r->straggler = -1;
  r->stall_rank = -1;
  r->hang_rank = -1;
}

static int is_final(struct view *v, void *arg) {
  (void)arg;
  return v->h->flags & C4W_FLAG_FINAL;
}

/* Waits for the final summary (sent after finalize) of ranks [first, first + n). */
static void wait_finals(uint64_t hash, int first, int n) {
  for (int i = first; i < first + n; i++)
    /* generous: on a loaded machine the plugin thread may run late (finalize never waits) */
    CHECK(wait_msg(C4W_SUMMARY, hash, i, is_final, NULL, 10000 * MS),
          "no final summary from rank %d", i);
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0; }

/* ------------------------------------------------------------------------- scenarios */

static const char *capture_dir;

/* Saves the first periodic summary with collectives and peers as `arg`. */
static int capture_first(struct view *v, void *arg) {
  if (v->sum->ncolls > 0 && v->sum->npeers > 0 && !(v->h->flags & C4W_FLAG_FINAL)) {
    save(capture_dir, arg, v);
    return 1;
  }
  return 0;
}

static int capture_final(struct view *v, void *arg) {
  if (v->h->flags & C4W_FLAG_FINAL) save(capture_dir, arg, v);
  return 0;
}

static const struct release *release_named(const char *name) {
  for (int i = 0; i < NRELEASES; i++)
    if (!strcmp(RELEASES[i].name, name)) return &RELEASES[i];
  return NULL;
}

/* Loads `r` as NCCL would; 0 (and a failure) if the plugin offers nothing it takes. */
static int use(const struct release *r) {
  int v = nccl_load(r);
  return CHECK(v == r->api, "NCCL %s loads ncclProfiler_v%d, wants v%d", r->name, API, r->api);
}

/* The loader of every release finds the version it knows best. */
static void scenario_loader(void) {
  for (int i = 0; i < NRELEASES; i++) {
    nccl_load(&RELEASES[i]);
    CHECK(API == RELEASES[i].api && PNAME != NULL && !strcmp(PNAME, "c4"),
          "NCCL %s: found ncclProfiler_v%d (wants v%d)", RELEASES[i].name, API, RELEASES[i].api);
    printf("loader: NCCL %s loads ncclProfiler_v%d\n", RELEASES[i].name, API);
  }
}

/* A ring AllReduce through one release: exact bytes and steps per connection, wait times,
 * ordinals, completion at the kernel's end and not at Coll stop. */
static void run_release(const struct release *rel, uint64_t hash, int nranks, int iters) {
  if (!use(rel)) return;
  struct ring r;
  ring_defaults(&r, hash);
  r.nranks = nranks;
  ring_init(&r);
  for (int it = 0; it < iters; it++) {
    ring_begin(&r, it);
    ring_end(&r);
  }
  sleep_ns(2 * INTERVAL_MS * MS); /* at least one periodic summary before finalize */
  ring_finalize(&r);
  wait_finals(r.hash, 0, r.nranks);
  uint64_t steps = (uint64_t)iters * (uint64_t)r.nsteps, bytes = iters * ring_op_bytes(&r);
  for (int i = 0; i < r.nranks; i++) {
    struct agg *a = aggregate(r.hash, i);
    CHECK(a->nmsgs >= 2, "rank %d: %d summaries", i, a->nmsgs);
    /* v3 learns the size from the ranks it sees: a lower bound */
    CHECK(API == 3 ? a->nranks > (uint32_t)i && a->nranks <= (uint32_t)r.nranks && a->nnodes == 0
                   : a->nranks == (uint32_t)r.nranks && a->nnodes == (uint32_t)r.nnodes,
          "rank %d: nranks %u nnodes %u", i, a->nranks, a->nnodes);
    CHECK(a->seq_started == (uint64_t)iters && a->seq_completed == (uint64_t)iters,
          "rank %d: seq %" PRIu64 "/%" PRIu64, i, a->seq_started, a->seq_completed);
    CHECK(a->colls == (uint64_t)iters && a->coll_bytes == (uint64_t)iters * r.count * 4,
          "rank %d: %" PRIu64 " colls, %" PRIu64 " bytes", i, a->colls, a->coll_bytes);
    CHECK(!strcmp(a->func, "AllReduce") && !strcmp(a->algo, "RING") && !strcmp(a->proto, "SIMPLE"),
          "rank %d: %s/%s/%s", i, a->func, a->algo, a->proto);
    /* Completion is the kernel's end, not Coll stop (enqueue). */
    CHECK(a->coll_time <= r.op_ns[i] && a->coll_time >= r.op_ns[i] * 8 / 10,
          "rank %d: coll time %" PRIu64 " ns, harness measured %" PRIu64, i, a->coll_time,
          r.op_ns[i]);
    CHECK(a->coll_time > 20 * r.enqueue_ns[i], "rank %d: coll time %" PRIu64 " vs enqueue %" PRIu64,
          i, a->coll_time, r.enqueue_ns[i]);
    CHECK(a->entry_ops == (uint64_t)iters, "rank %d: entry_ops %" PRIu64, i, a->entry_ops);
    CHECK(a->dropped == 0 && !a->last_has_inflight && a->after_final == 0,
          "rank %d: dropped %" PRIu64 ", %d summaries after the final", i, a->dropped,
          a->after_final);
    CHECK(a->npeers == 2 * r.nchan, "rank %d: %d connections", i, a->npeers);
    for (int k = 0; k < a->npeers; k++) {
      struct agg_peer *p = &a->peers[k];
      int want = p->dir == C4W_SEND ? (i + 1) % r.nranks : (i + r.nranks - 1) % r.nranks;
      CHECK((int)p->peer == want && p->channel < r.nchan, "rank %d: unexpected peer %u ch %u",
            i, p->peer, p->channel);
      CHECK(p->bytes == bytes && p->steps == steps, "rank %d peer %u dir %u: %" PRIu64
            " bytes (want %" PRIu64 ") %" PRIu64 " steps", i, p->peer, p->dir, p->bytes, bytes,
            p->steps);
      double net = ratio(p->net, steps * r.net_ns);
      CHECK(net >= 0.99 && net < 5, "rank %d peer %u dir %u: net wait %.2fx nominal", i, p->peer,
            p->dir, net);
      /* v3 has no SendPeerWait: the credit wait is part of SendGPUWait */
      uint64_t gpu = p->dir == C4W_RECV ? r.gpu_ns + r.flush_ns
                                        : r.gpu_ns + (API == 3 ? r.peer_ns : 0);
      CHECK(p->gpu >= steps * gpu, "rank %d: gpu wait %" PRIu64, i, p->gpu);
      CHECK(p->dir == C4W_RECV || API == 3 ? p->peerw == 0 : p->peerw >= steps * r.peer_ns,
            "rank %d: peer wait %" PRIu64, i, p->peerw);
    }
  }
  if (capture_dir && rel == NEWEST) {
    each_msg(C4W_SUMMARY, r.hash, 3, capture_first, "summary.bin");
    each_msg(C4W_SUMMARY, r.hash, 3, capture_final, "summary_final.bin");
  }
  struct agg *a = aggregate(r.hash, 0);
  printf("NCCL %s (v%d): %d ranks x %d ops, rank 0: %.2f ms/op (harness %.2f), entry %.3f ms/op\n",
         rel->name, API, r.nranks, iters, a->coll_time / 1e6 / iters, r.op_ns[0] / 1e6 / iters,
         a->entry_wait / 1e6 / (a->entry_ops ? a->entry_ops : 1));
}

/* One op of a single-node communicator: Coll, then one kernel channel on the proxy thread
 * that starts when the stream's earlier kernels ended. */
static void kernel_op(struct hcomm *c, const char *func, const char *dtype, size_t count,
                      uint64_t run_ns, _Atomic int *hang, uint64_t *posted) {
  struct call k = nccl_call(c, func, dtype, count, 0, -1);
  struct hop *o = kernel_hop(c, &k, 0);
  o->after = (*posted)++;
  o->run_ns = run_ns;
  o->hang = hang;
  proxy_post(o);
}

/* Datatype names as each release's ncclDatatypeToString writes them: 2.26 - 2.30 write
 * "Unknown" for ncclUint8. */
static void scenario_datatypes(void) {
  for (int i = 0; i < NRELEASES; i++) {
    if (!use(&RELEASES[i])) continue;
    struct hcomm c;
    uint64_t posted = 0, hash = 0xc4a11ed0000d0000ull + (uint64_t)i;
    comm_init(&c, hash, 0, 2, 1);
    kernel_op(&c, "AllGather", "Unknown", 1000, 0, NULL, &posted);
    kernel_op(&c, "AllGather", "ncclFloat8e4m3", 10, 0, NULL, &posted);
    kernel_op(&c, "AllGather", "ncclBfloat16", 100, 0, NULL, &posted);
    proxy_wait(&c, posted);
    nccl_finalize(c.ctx);
    wait_finals(hash, 0, 1);
    struct agg *a = aggregate(hash, 0);
    CHECK(a->colls == 3 && a->coll_bytes == 1000 + 10 + 200,
          "NCCL %s: %" PRIu64 " ops, %" PRIu64 " bytes (ncclUint8 arrives as \"Unknown\")",
          RELEASES[i].name, a->colls, a->coll_bytes);
  }
  printf("datatypes: ncclUint8 (\"Unknown\") counts 1 byte per element on 2.26 - 2.30\n");
}

static int stall_after(struct view *v, void *arg) { return v->t_ns >= *(uint64_t *)arg; }

/* v6 copy-engine collectives count as collectives, complete when enqueued, and are not
 * progress: a stalled network op is still reported while they run. */
static void scenario_ce(void) {
  if (!use(NEWEST)) return; /* copy-engine events exist from v6 on */
  struct ring r;
  ring_defaults(&r, 0xc4a11ed0000ce000ull);
  r.nranks = 2;
  r.stall_rank = 1;
  ring_init(&r);
  int it = 0;
  for (; it < 5; it++) {
    ring_begin(&r, it);
    ring_end(&r);
    for (int i = 0; i < r.nranks; i++) nccl_ce_call(&r.comms[i], "AllGather", "ncclBfloat16", 4096);
  }
  uint64_t begin = now_ns();
  atomic_store(&r.freeze, 1);
  ring_begin(&r, it);
  while (now_ns() - begin < 3 * STALL_MS * MS) { /* CE collectives while rank 1 is stuck */
    nccl_ce_call(&r.comms[1], "AllGather", "ncclBfloat16", 4096);
    sleep_ns(20 * MS);
  }
  CHECK(wait_msg(C4W_STALLED, r.hash, 1, stall_after, &begin, 100 * MS),
        "no stalled message from rank 1 while copy-engine collectives completed");
  atomic_store(&r.freeze, 0);
  ring_end(&r);
  ring_finalize(&r);
  wait_finals(r.hash, 0, r.nranks);
  struct agg *a = aggregate(r.hash, 0);
  CHECK(a->ce_count == 5 && a->ce_bytes == 5 * 4096 * 2 && a->seq_started == 11 &&
            a->seq_completed == 11,
        "rank 0: %" PRIu64 " CE ops, %" PRIu64 " bytes, seq %" PRIu64 "/%" PRIu64, a->ce_count,
        a->ce_bytes, a->seq_started, a->seq_completed);
  a = aggregate(r.hash, 1);
  CHECK(a->ce_count >= 10 && a->seq_started == a->seq_completed, "rank 1: %" PRIu64 " CE ops",
        a->ce_count);
  printf("ce: copy-engine AllGathers counted (rank 1: %" PRIu64 "), a stall still reported\n",
         a->ce_count);
}

/* PXN: this process's proxy thread runs a proxy op another process created: its pid, parent
 * and context are the other process's. Unmapped, or mapped to something else of ours. */
static void pxn(int mapped) {
  long page = sysconf(_SC_PAGESIZE);
  char *hole = mmap(NULL, (size_t)page * 4, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  for (int i = 0; i < NRELEASES; i++) {
    if (!use(&RELEASES[i])) continue;
    struct hcomm a, other;
    uint64_t hash = 0xc4a11ed000d00000ull + (uint64_t)(mapped << 8 | i);
    comm_init(&a, hash, 0, 2, 2);
    memset(&other, 0, sizeof other);
    struct call k = nccl_call(&a, "AllReduce", "ncclFloat32", 4096, 0, -1);
    struct hop *x = net_hop(&other, &k, 1, 7, 1, 4, 4096);
    x->pid = self_pid + 1; /* the process that created it */
    x->ctx = mapped ? a.ctx : hole + page;
    x->parent = mapped ? k.coll : hole + 2 * page;
    x->dur[0] = x->dur[1] = x->dur[2] = 20 * US;
    proxy_post(x);
    struct hop *own = net_hop(&a, &k, 1, 0, 1, 4, 4096);
    own->dur[0] = own->dur[1] = own->dur[2] = 20 * US;
    proxy_post(own);
    struct hop *kern = kernel_hop(&a, &k, 0);
    kern->wait_net = 1;
    proxy_post(kern);
    proxy_wait(&a, 2);
    proxy_wait(&other, 1);
    nccl_finalize(a.ctx);
    wait_finals(hash, 0, 1);
    struct agg *g = aggregate(hash, 0);
    CHECK(g->npeers == 1 && g->peers[0].channel == 0 && g->peers[0].steps == 4 &&
              g->seq_completed == 1 && g->dropped == 0,
          "NCCL %s: %d connections (channel %u, %" PRIu64 " steps), %" PRIu64 " completed: "
          "another process's proxy op was counted", RELEASES[i].name, g->npeers,
          g->npeers ? g->peers[0].channel : 0, g->npeers ? g->peers[0].steps : 0,
          g->seq_completed);
  }
  munmap(hole, (size_t)page * 4);
  printf("pxn-%s: proxy ops of another process ignored\n", mapped ? "mapped" : "unmapped");
}

static void scenario_pxn_unmapped(void) { pxn(0); }
static void scenario_pxn_mapped(void) { pxn(1); }

/* nnodes == 1: no network, only kernel channels, which start after the Coll stopped; kernels
 * of 2 ms, then one that hangs. */
static void scenario_single_node(void) {
  const struct release *rels[2] = {&RELEASES[0], MAIN_REL};
  for (int ri = 0; ri < 2; ri++) {
    if (!use(rels[ri])) continue;
    struct hcomm c;
    uint64_t hash = 0xc4a11ed0005e0000ull + (uint64_t)ri, posted = 0;
    const int n = 50;
    comm_init(&c, hash, 0, 2, 1);
    for (int b = 0; b < n; b += 5) { /* the host runs ahead of the GPU by 5 ops */
      for (int i = 0; i < 5; i++) kernel_op(&c, "AllReduce", "ncclFloat32", 1 << 20, 2 * MS, NULL, &posted);
      proxy_wait(&c, posted);
    }
    sleep_ns(2 * INTERVAL_MS * MS);
    struct agg *a = aggregate(hash, 0);
    CHECK(a->seq_started == (uint64_t)n && a->seq_completed == (uint64_t)n && a->colls == (uint64_t)n,
          "NCCL %s: %" PRIu64 " started, %" PRIu64 " completed, %" PRIu64 " in colls of %d",
          rels[ri]->name, a->seq_started, a->seq_completed, a->colls, n);
    CHECK(a->coll_time / (uint64_t)n >= 19 * MS / 10, "NCCL %s: mean duration %.3f ms, kernels 2 ms",
          rels[ri]->name, a->coll_time / 1e6 / n);
    _Atomic int hang = 1;
    uint64_t begin = now_ns();
    kernel_op(&c, "AllReduce", "ncclFloat32", 1 << 20, 2 * MS, &hang, &posted);
    CHECK(wait_msg(C4W_STALLED, hash, 0, stall_after, &begin, 3000 * MS),
          "NCCL %s: a kernel that hangs on a single node is not reported", rels[ri]->name);
    atomic_store(&hang, 0);
    proxy_wait(&c, posted);
    nccl_finalize(c.ctx);
    wait_finals(hash, 0, 1);
    a = aggregate(hash, 0);
    CHECK(a->seq_completed == (uint64_t)n + 1, "NCCL %s: %" PRIu64 " completed after the hang",
          rels[ri]->name, a->seq_completed);
  }
  printf("single-node: 50 kernels of 2 ms complete at their end; a hung kernel is reported\n");
}

/* The activation mask is NCCL's one process-wide variable: while communicator A enqueues
 * collectives, B initialises again and again, and one init fails. */
struct mask_run {
  struct hcomm *a;
  _Atomic int stop;
  int calls, lost;
  uint64_t posted;
};

static void *mask_caller(void *arg) {
  struct mask_run *m = arg;
  while (!atomic_load(&m->stop)) {
    struct call k = nccl_call(m->a, "AllReduce", "ncclFloat32", 256, 0, -1);
    m->calls++;
    m->lost += k.coll == NULL;
    struct hop *o = kernel_hop(m->a, &k, 0);
    proxy_post(o);
    m->posted++;
    sleep_ns(20 * US);
  }
  return NULL;
}

static void scenario_mask(void) {
  if (!use(MAIN_REL)) return;
  struct hcomm a;
  uint64_t hash = 0xc4a11ed000a50000ull;
  comm_init(&a, hash, 0, 2, 1);
  int final_mask = mask_now();
  struct mask_run m = {.a = &a};
  pthread_t t;
  pthread_create(&t, NULL, mask_caller, &m);
  for (int i = 0; i < 200; i++) {
    void *b = NULL;
    nccl_init(&b, hash + 1, 1, 4, i % 4);
    nccl_finalize(b);
  }
  void *bad = NULL;
  int warns = warn_lines;
  nccl_init(&bad, hash + 2, 1, 4, 9); /* rank 9 of 4: refused */
  CHECK(bad == NULL && warn_lines == warns + 1, "bad init: context %p", bad);
  sleep_ns(30 * MS); /* A keeps enqueuing after the failed init */
  atomic_store(&m.stop, 1);
  pthread_join(t, NULL);
  CHECK(m.lost == 0, "%d of %d collectives of A not seen while other communicators initialised",
        m.lost, m.calls);
  CHECK(mask_now() == final_mask, "mask %#x after a failed init, was %#x", mask_now(), final_mask);
  proxy_wait(&a, m.posted);
  nccl_finalize(a.ctx);
  wait_finals(hash, 0, 1);
  struct agg *g = aggregate(hash, 0);
  CHECK(g->seq_started == (uint64_t)m.calls, "A: %" PRIu64 " started of %d", g->seq_started,
        m.calls);
  printf("mask: %d collectives of A during 200 inits of B and a failed one, none lost\n", m.calls);
}

/* A context initialised twice, two live contexts for one (comm, rank), a context reused for
 * another communicator: one stream of summaries per (comm, rank), nothing leaks. */
static void scenario_init_twice(void) {
  if (!use(MAIN_REL)) return;
  uint64_t h1 = 0xc4a11ed000170001ull, h2 = h1 + 1, h3 = h1 + 2, h4 = h1 + 3;
  struct hcomm c;
  memset(&c, 0, sizeof c);
  c.hash = h1;
  c.nranks = 2;
  nccl_init(&c.ctx, h1, 1, 2, 0);
  void *first = c.ctx;
  nccl_init(&c.ctx, h1, 1, 2, 0);
  CHECK(c.ctx == first, "init into the same context made a new one");
  uint64_t posted = 0;
  for (int i = 0; i < 3; i++) kernel_op(&c, "AllReduce", "ncclFloat32", 256, 0, NULL, &posted);
  proxy_wait(&c, posted);
  sleep_ns(2 * INTERVAL_MS * MS);
  nccl_finalize(c.ctx);
  wait_finals(h1, 0, 1);
  sleep_ns(3 * INTERVAL_MS * MS); /* a leaked communicator would keep sending */
  struct agg *a = aggregate(h1, 0);
  CHECK(a->after_final == 0 && a->seq_completed == 3, "h1: %d summaries after the final, %" PRIu64
        " completed", a->after_final, a->seq_completed);

  void *x = NULL, *y = NULL;
  int warns = warn_lines;
  nccl_init(&x, h2, 1, 2, 0);
  nccl_init(&y, h2, 1, 2, 0); /* another communicator object, same (comm, rank) */
  CHECK(x != NULL && y == NULL && warn_lines == warns + 1,
        "second live context for one (comm, rank): %p %p", x, y);
  sleep_ns(3 * INTERVAL_MS * MS);
  nccl_finalize(y);
  nccl_finalize(x);
  wait_finals(h2, 0, 1);
  a = aggregate(h2, 0); /* agg_one checks that msg_seq only grows */
  CHECK(a->nmsgs >= 3 && a->after_final == 0, "h2: %d summaries, %d after the final", a->nmsgs,
        a->after_final);

  void *z = NULL;
  nccl_init(&z, h3, 1, 2, 0);
  nccl_init(&z, h4, 1, 2, 1); /* the slot now holds another communicator */
  wait_finals(h3, 0, 1);      /* the first one was finalized, not leaked */
  nccl_finalize(z);
  wait_finals(h4, 1, 1);

  /* A slot holding another slot's live context (a finalized communicator's address, freed and
   * reused by a new one): that communicator is not this slot's to replace. */
  uint64_t h5 = h1 + 4, h6 = h1 + 5;
  void *w = NULL;
  nccl_init(&w, h5, 1, 2, 0);
  void *stale = w;
  nccl_init(&stale, h6, 1, 2, 1);
  CHECK(stale != NULL && stale != w, "init into a slot holding another's context: %p", stale);
  sleep_ns(3 * INTERVAL_MS * MS);
  CHECK(aggregate(h5, 0)->final_seen == 0, "an init into another slot finalized h5");
  nccl_finalize(stale);
  nccl_finalize(w);
  wait_finals(h5, 0, 1);
  wait_finals(h6, 1, 1);
  printf("init-twice: re-init keeps one state, a duplicate (comm, rank) is refused, another "
         "slot's context is left alone\n");
}

/* Events after finalize, on a communicator's context and on handles it gave out. */
static void scenario_after_finalize(void) {
  if (!use(MAIN_REL)) return;
  struct hcomm a, b;
  uint64_t ha = 0xc4a11ed000af0001ull, hb = ha + 1, posted = 0;
  comm_init(&b, hb, 0, 2, 2); /* alive throughout: NCCL keeps the plugin loaded */
  comm_init(&a, ha, 0, 2, 2);
  struct call k = nccl_call(&a, "AllReduce", "ncclFloat32", 1024, 0, -1);
  void *op = ev_proxy_op(&a, k.coll, 1, 0, 1, 2);
  void *step = ev_step(&a, op, 0);
  struct ev kc = {.type = C4_EV_KERNEL_CH, .parent = k.coll};
  void *kch = nccl_start(a.ctx, &kc);
  CHECK(k.coll && op && step && kch, "handles %p %p %p %p", k.coll, op, step, kch);
  nccl_finalize(a.ctx);
  nccl_step_state(step, C4_ST_SEND_WAIT, 4096);
  nccl_stop(step);
  nccl_stop(op);
  nccl_kch_end(kch);
  struct call late = nccl_call(&a, "AllReduce", "ncclFloat32", 1024, 0, -1);
  void *op2 = ev_proxy_op(&a, k.coll, 1, 0, 1, 2);
  void *step2 = ev_step(&a, op, 1);
  CHECK(late.coll == NULL && op2 == NULL && step2 == NULL,
        "events after finalize got handles %p %p %p", late.coll, op2, step2);
  nccl_finalize(a.ctx); /* twice */
  wait_finals(ha, 0, 1);
  kernel_op(&b, "AllReduce", "ncclFloat32", 1024, 0, NULL, &posted);
  proxy_wait(&b, posted);
  sleep_ns(2 * INTERVAL_MS * MS);
  nccl_finalize(b.ctx);
  wait_finals(hb, 0, 1);
  CHECK(aggregate(ha, 0)->after_final == 0 && aggregate(hb, 0)->seq_completed == 1,
        "summaries after the final, or b disturbed");
  printf("after-finalize: late events ignored\n");
}

/* Finalize while the proxy thread still moves the communicator's steps. */
static void scenario_finalize_inflight(void) {
  if (!use(MAIN_REL)) return;
  struct hcomm b;
  uint64_t hb = 0xc4a11ed000f10001ull, posted = 0;
  comm_init(&b, hb, 0, 2, 2);
  struct ring r;
  ring_defaults(&r, hb + 1);
  r.nranks = 2;
  r.nsteps = 64;
  r.net_ns = 200 * US;
  ring_init(&r);
  ring_begin(&r, 0);
  sleep_ns(5 * MS);
  ring_finalize(&r); /* the proxy thread is in the middle of the op */
  ring_end(&r);
  wait_finals(r.hash, 0, r.nranks);
  kernel_op(&b, "AllReduce", "ncclFloat32", 1024, 0, NULL, &posted);
  proxy_wait(&b, posted);
  nccl_finalize(b.ctx);
  wait_finals(hb, 0, 1);
  printf("finalize-inflight: finalize during an op, the proxy thread went on safely\n");
}

/* A bound socket nobody reads: the agent is stuck. NCCL's threads must not wait. */
static void scenario_agent_stuck(void) {
  if (!use(MAIN_REL)) return;
  enum { N = 32 };
  static struct hcomm c[N];
  rx_stop();
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  struct sockaddr_un addr = {.sun_family = AF_UNIX};
  snprintf(addr.sun_path, sizeof addr.sun_path, "%s", R.path);
  CHECK(bind(fd, (struct sockaddr *)&addr, sizeof addr) == 0, "bind: %s", strerror(errno));
  uint64_t init_ns = 0, fin_ns = 0, fin_max = 0, posted[N] = {0};
  for (int i = 0; i < N; i++) {
    uint64_t t0 = now_ns();
    comm_init(&c[i], 0xc4a11ed000570000ull + (uint64_t)i, 0, 2, 1);
    init_ns += now_ns() - t0;
    kernel_op(&c[i], "AllReduce", "ncclFloat32", 1024, 0, NULL, &posted[i]);
  }
  for (int i = 0; i < N; i++) proxy_wait(&c[i], posted[i]);
  sleep_ns(3 * INTERVAL_MS * MS); /* the socket's queue is full, sends wait and fail */
  for (int i = 0; i < N; i++) {
    uint64_t t0 = now_ns();
    nccl_finalize(c[i].ctx);
    uint64_t t = now_ns() - t0;
    fin_ns += t;
    if (t > fin_max) fin_max = t;
  }
  /* A bound of what blocking would cost (one 20 ms send wait per finalize: 640 ms), far
   * above what an unblocked finalize takes (microseconds). */
  CHECK(fin_ns < 200 * MS && init_ns < 200 * MS,
        "%d finalizes took %.1f ms (longest %.1f ms), %d inits %.1f ms", N, fin_ns / 1e6,
        fin_max / 1e6, N, init_ns / 1e6);
  close(fd);
  unlink(R.path);
  rx_clear();
  rx_start();
  printf("agent-stuck: %d finalizes in %.2f ms, %d inits in %.2f ms\n", N, fin_ns / 1e6, N,
         init_ns / 1e6);
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void scenario_slow(void) {
  if (!use(MAIN_REL)) return;
  struct ring r;
  ring_defaults(&r, 0xc4a11ed000000002ull);
  r.slow_src = 5;
  r.slow_factor = 5;
  int iters = 20;
  ring_init(&r);
  for (int it = 0; it < iters; it++) {
    ring_begin(&r, it);
    ring_end(&r);
  }
  ring_finalize(&r);
  wait_finals(r.hash, 0, r.nranks);
  /* net wait per byte of every connection, by direction; the slow link's two ends stand out */
  for (int dir = 0; dir < 2; dir++) {
    double others[MAX_RANKS * MAX_CHANNELS], slow = 0;
    int n = 0, nslow = 0;
    for (int i = 0; i < r.nranks; i++) {
      struct agg *a = aggregate(r.hash, i);
      for (int k = 0; k < a->npeers; k++) {
        struct agg_peer *p = &a->peers[k];
        if (p->dir != dir || !p->bytes) continue;
        double per_byte = (double)p->net / (double)p->bytes;
        int src = dir == C4W_SEND ? i : (int)p->peer;
        if (src == r.slow_src) slow += per_byte, nslow++;
        else others[n++] = per_byte;
      }
    }
    qsort(others, (size_t)n, sizeof others[0], cmp_double);
    double median = others[n / 2], max_other = others[n - 1];
    slow /= nslow ? nslow : 1;
    CHECK(nslow == r.nchan, "%d slow connections", nslow);
    /* 5x nominal; scheduling delays add to every phase alike and pull the ratio down */
    CHECK(slow / median > 2.5 && slow / median < 7.5, "%s: slow link %.2fx the median",
          dir ? "recv" : "send", slow / median);
    CHECK(slow > 1.5 * max_other, "%s: slow %.3g, slowest other %.3g", dir ? "recv" : "send",
          slow, max_other);
    printf("slow: %s net wait per byte of link 5->6 is %.2fx the median connection\n",
           dir ? "recv" : "send", slow / median);
  }
}

static void scenario_straggler(void) {
  if (!use(MAIN_REL)) return;
  struct ring r;
  ring_defaults(&r, 0xc4a11ed000000003ull);
  r.straggler = 4;
  r.straggle_ns = 10 * MS;
  int iters = 20;
  ring_init(&r);
  for (int it = 0; it < iters; it++) {
    ring_begin(&r, it);
    ring_end(&r);
  }
  ring_finalize(&r);
  wait_finals(r.hash, 0, r.nranks);
  double entry[MAX_RANKS];
  for (int i = 0; i < r.nranks; i++) {
    struct agg *a = aggregate(r.hash, i);
    CHECK(a->entry_ops == (uint64_t)iters, "rank %d: entry_ops %" PRIu64, i, a->entry_ops);
    entry[i] = (double)a->entry_wait / (double)(a->entry_ops ? a->entry_ops : 1);
  }
  for (int i = 0; i < r.nranks; i++) {
    int neighbour = i == 3 || i == 5;
    if (neighbour)
      CHECK(entry[i] > 0.9 * (double)r.straggle_ns, "rank %d waits %.2f ms per op", i,
            entry[i] / 1e6);
    else
      CHECK(entry[i] < 0.5 * (double)r.straggle_ns, "rank %d waits %.2f ms per op", i,
            entry[i] / 1e6);
  }
  printf("straggler: rank 4 enters %.1f ms late; entry wait per op: rank 3 %.2f ms, rank 4 "
         "%.2f ms, rank 5 %.2f ms, rank 0 %.2f ms\n", r.straggle_ns / 1e6, entry[3] / 1e6,
         entry[4] / 1e6, entry[5] / 1e6, entry[0] / 1e6);
}

struct stall_probe {
  uint64_t after;  /* only messages received after this time */
  int count;
  struct view first;
};

static int stall_seen(struct view *v, void *arg) {
  struct stall_probe *p = arg;
  if (v->t_ns < p->after) return 0;
  if (p->count++ == 0) p->first = *v;
  return 0;
}

static int count_stalls(uint64_t hash, int rank, uint64_t after, struct stall_probe *p) {
  memset(p, 0, sizeof *p);
  p->after = after;
  each_msg(C4W_STALLED, hash, rank, stall_seen, p);
  return p->count;
}

static void stall_episode(struct ring *r, int it, int save_it) {
  int victim = r->stall_rank, upstream = (victim + r->nranks - 1) % r->nranks;
  uint64_t begin = now_ns();
  atomic_store(&r->freeze, 1);
  ring_begin(r, it);
  /* everything but the frozen recv completes */
  for (int i = 0; i < r->nranks; i++)
    if (i != victim) ring_end_rank(r, i);
  proxy_wait(&r->comms[victim], r->posted[victim] - 1 - (uint64_t)r->nchan); /* all but the frozen recv and the kernel */
  CHECK(wait_msg(C4W_STALLED, r->hash, victim, stall_after, &begin, 3000 * MS),
        "no stalled message from rank %d", victim);
  struct stall_probe p;
  count_stalls(r->hash, victim, begin, &p);
  uint64_t quiet = atomic_load(&r->comms[victim].last_event_ns);
  if (p.count) {
    const struct c4w_stalled *s = p.first.stall;
    double delay = ((double)p.first.t_ns - (double)quiet) / 1e6;
    CHECK(delay >= STALL_MS - 20 && delay <= STALL_MS + 400, "stalled %.0f ms after the last "
          "progress, threshold %d ms", delay, STALL_MS);
    CHECK(s->seq == (uint64_t)it && !strcmp(s->func, "AllReduce"), "stalled op %" PRIu64 " %s",
          s->seq, s->func);
    CHECK(s->seq_completed == (uint64_t)it, "seq_completed %" PRIu64, s->seq_completed);
    CHECK(s->age_ns >= STALL_MS * MS, "age %" PRIu64, s->age_ns);
    CHECK(s->nwaiting == 1, "%u waiting connections", s->nwaiting);
    if (s->nwaiting >= 1) {
      const struct c4w_waiting *w = &p.first.waiting[0];
      CHECK(w->peer == (uint32_t)upstream && w->channel == 0 && w->dir == C4W_RECV &&
                w->state == C4_ST_RECV_WAIT,
            "waiting on peer %u ch %u dir %u state %u", w->peer, w->channel, w->dir, w->state);
    }
    if (save_it && capture_dir) save(capture_dir, "stalled.bin", &p.first);
    printf("stall: rank %d reported %.0f ms after its last progress (threshold %d ms), waiting "
           "on rank %u in state %u\n", victim, delay, STALL_MS, p.first.waiting[0].peer,
           p.first.waiting[0].state);
  }
  sleep_ns(3 * STALL_MS * MS); /* one message per episode */
  CHECK(count_stalls(r->hash, victim, begin, &p) == 1, "%d stalled messages in one episode",
        p.count);
  for (int i = 0; i < r->nranks; i++)
    if (i != victim)
      CHECK(count_stalls(r->hash, i, begin, &p) == 0, "rank %d without ops in flight stalled", i);
  /* the summary shows the op in flight without progress */
  struct agg *a = aggregate(r->hash, victim);
  CHECK(a->last_has_inflight, "no inflight op in rank %d's summary", victim);
  atomic_store(&r->freeze, 0);
  ring_end_rank(r, victim);
  r->iters++;
}

static void scenario_stall(void) {
  if (!use(MAIN_REL)) return;
  struct ring r;
  ring_defaults(&r, 0xc4a11ed000000004ull);
  r.stall_rank = 2;
  ring_init(&r);
  int it = 0;
  for (; it < 3; it++) {
    ring_begin(&r, it);
    ring_end(&r);
  }
  stall_episode(&r, it++, 1);
  ring_begin(&r, it);
  ring_end(&r);
  it++;
  stall_episode(&r, it++, 0); /* progress resumed in between: a new episode, a new message */
  ring_finalize(&r);
  wait_finals(r.hash, 0, r.nranks);
  struct agg *a = aggregate(r.hash, r.stall_rank);
  CHECK(a->seq_completed == (uint64_t)it, "seq_completed %" PRIu64 " after %d ops",
        a->seq_completed, it);
}

/* Point-to-point to more peers than one datagram holds: the summary comes in parts. */
struct parts {
  uint64_t msg_seq;
  int parts, peers;
  uint16_t nparts;
};

static int count_parts(struct view *v, void *arg) {
  struct parts *p = arg;
  if (v->sum->npeers == 0 || (p->msg_seq && v->h->msg_seq != p->msg_seq)) return 0;
  p->msg_seq = v->h->msg_seq;
  p->nparts = v->h->nparts;
  p->parts++;
  p->peers += v->sum->npeers;
  if (capture_dir) {
    char name[32];
    snprintf(name, sizeof name, "multipart_%u.bin", v->h->part);
    save(capture_dir, name, v);
  }
  return 0;
}

static int has_peers(struct view *v, void *arg) {
  (void)arg;
  return v->sum->npeers > 0;
}

static void scenario_wide(void) {
  if (!use(MAIN_REL)) return;
  struct hcomm c;
  const int npeers = 1500;
  comm_init(&c, 0xc4a11ed000000005ull, 0, 2048, 256);
  /* start right after a summary: all the traffic falls in the next one */
  CHECK(wait_msg(C4W_SUMMARY, c.hash, 0, NULL, NULL, 3 * INTERVAL_MS * MS), "no summary");
  struct call k = nccl_call(&c, "Send", "ncclBfloat16", 2048, 1, 1);
  for (int peer = 1; peer <= npeers; peer++) {
    void *op = ev_proxy_op(&c, k.coll, peer, 0, 1, 1);
    void *s = ev_step(&c, op, 0);
    nccl_step_state(s, C4_ST_SEND_WAIT, 4096);
    nccl_stop(s);
    nccl_stop(op);
  }
  struct parts p = {0};
  wait_msg(C4W_SUMMARY, c.hash, 0, has_peers, NULL, 3 * INTERVAL_MS * MS);
  sleep_ns(10 * MS); /* the other parts follow at once */
  each_msg(C4W_SUMMARY, c.hash, 0, count_parts, &p);
  CHECK(p.nparts > 1 && p.parts == p.nparts && p.peers == npeers,
        "%d peers in %d of %u parts", p.peers, p.parts, p.nparts);
  struct agg *a = aggregate(c.hash, 0);
  CHECK(a->colls == 1 && !strcmp(a->func, "Send") && a->coll_bytes == 2048 * 2,
        "p2p: %" PRIu64 " ops %s %" PRIu64 " bytes", a->colls, a->func, a->coll_bytes);
  nccl_finalize(c.ctx);
  printf("wide: %d peers in %u datagrams\n", p.peers, p.nparts);
}

/* More live steps than the pool holds: NULL handles, counted drops, nothing else breaks. */
static void scenario_exhaust(void) {
  if (!use(MAIN_REL)) return;
  struct hcomm c;
  enum { N = 20000 };
  static void *steps[N];
  comm_init(&c, 0xc4a11ed000000006ull, 0, 2, 2);
  struct call k = nccl_call(&c, "AllReduce", "ncclFloat32", 1024, 0, -1);
  void *op = ev_proxy_op(&c, k.coll, 1, 0, 1, N);
  int nulls = 0;
  for (int i = 0; i < N; i++) {
    steps[i] = ev_step(&c, op, i);
    nulls += steps[i] == NULL;
    if (steps[i] == NULL) nccl_null_handle();
    nccl_step_state(steps[i], C4_ST_SEND_WAIT, 1000);
  }
  for (int i = 0; i < N; i++) nccl_stop(steps[i]);
  for (int i = 0; i < 100; i++) { /* the pool is whole again */
    void *s = ev_step(&c, op, N + i);
    CHECK(s != NULL, "step %d after the pool drained", i);
    nccl_stop(s);
  }
  nccl_stop(op);
  nccl_finalize(c.ctx);
  wait_finals(c.hash, 0, 1);
  struct agg *a = aggregate(c.hash, 0);
  CHECK(nulls > 0 && nulls < N, "%d NULL handles", nulls);
  CHECK(a->dropped == (uint64_t)nulls, "dropped %" PRIu64 ", NULL handles %d", a->dropped, nulls);
  CHECK(a->npeers == 1 && a->peers[0].steps == (uint64_t)(N - nulls + 100) &&
            a->peers[0].bytes == (uint64_t)(N - nulls) * 1000,
        "steps %" PRIu64 " bytes %" PRIu64, a->peers[0].steps, a->peers[0].bytes);
  CHECK(a->seq_completed == 1, "seq_completed %" PRIu64, a->seq_completed);
  printf("exhaust: %d of %d steps refused and counted\n", nulls, N);
}

/* No agent listening: millions of events, two threads, nothing may block. */
struct flood {
  struct hcomm c;
  uint64_t target, events, colls;
};

static void *flood_run(void *arg) {
  struct flood *f = arg;
  struct hcomm *c = &f->c;
  while (f->events < f->target) {
    struct call k = nccl_call(c, "AllReduce", "ncclFloat32", 4096, 0, -1);
    void *op = ev_proxy_op(c, k.coll, (c->rank + 1) % c->nranks, 0, 1, 8);
    for (int i = 0; i < 8; i++) {
      void *s = ev_step(c, op, i);
      nccl_step_state(s, C4_ST_SEND_GPU_WAIT, 2048);
      nccl_step_state(s, C4_ST_SEND_PEER_WAIT, 2048);
      nccl_step_state(s, C4_ST_SEND_WAIT, 2048);
      nccl_stop(s);
    }
    nccl_stop(op);
    f->events += 12 + 8 * 5; /* API, Group and Coll events, the proxy op, its steps */
    f->colls++;
  }
  return NULL;
}

static int drops_seen(struct view *v, void *arg) {
  (void)arg;
  return v->h->dgram_drops > 0;
}

static void scenario_flood(uint64_t events) {
  if (!use(MAIN_REL)) return;
  static struct flood f[2];
  pthread_t t[2];
  uint64_t hash = 0xc4a11ed000000008ull;
  rx_stop(); /* the agent is gone: sends fail */
  for (int i = 0; i < 2; i++) {
    comm_init(&f[i].c, hash, i, 2, 2);
    f[i].target = events / 2;
  }
  uint64_t t0 = now_ns();
  for (int i = 0; i < 2; i++) pthread_create(&t[i], NULL, flood_run, &f[i]);
  for (int i = 0; i < 2; i++) pthread_join(t[i], NULL);
  double secs = (double)(now_ns() - t0) / 1e9;
  uint64_t total = f[0].events + f[1].events;
  printf("flood: %" PRIu64 " events from 2 threads with no agent in %.2f s (%.0f ns/event)\n",
         total, secs, secs * 1e9 / (double)total);
  CHECK(secs < 60, "%" PRIu64 " events took %.1f s: something blocks", total, secs);
  sleep_ns(3 * INTERVAL_MS * MS); /* summaries meanwhile are lost, and counted */
  rx_clear();
  rx_start(); /* the agent is back: the next summaries arrive and count what was lost */
  CHECK(wait_msg(C4W_SUMMARY, hash, 0, drops_seen, NULL, 5 * INTERVAL_MS * MS),
        "no summary reporting dropped datagrams after the agent came back");
  for (int i = 0; i < 2; i++) nccl_finalize(f[i].c.ctx);
  wait_finals(hash, 0, 2);
  for (int i = 0; i < 2; i++) {
    struct agg *a = aggregate(hash, i);
    CHECK(a->seq_started == f[i].colls && a->seq_completed == f[i].colls && a->dropped == 0,
          "flood rank %d: %" PRIu64 "/%" PRIu64 " of %" PRIu64 " colls, %" PRIu64 " dropped", i,
          a->seq_started, a->seq_completed, f[i].colls, a->dropped);
  }
}

/* Ranks that cannot finish the op of a stall (--stall-rank) or hang (--hang-rank). */
static int stuck(const struct ring *r, int i) {
  int n = r->nranks, h = r->hang_rank;
  return i == r->stall_rank || (h >= 0 && (i == h || i == (h + 1) % n || i == (h + n - 1) % n));
}

static int emit_only(double seconds, struct ring *r) {
  if (!use(MAIN_REL)) return 1;
  int faulty = r->stall_rank >= 0 || r->hang_rank >= 0, hang = r->hang_rank;
  ring_init(r);
  r->hang_rank = -1; /* everyone enters until the fault starts */
  uint64_t t0 = now_ns(), end = t0 + (uint64_t)(seconds * 1e9);
  int it = 0;
  while (now_ns() < end) {
    if (faulty && now_ns() - t0 > 1000 * MS) { /* from 1 s to the end */
      r->hang_rank = hang;
      atomic_store(&r->freeze, 1);
      ring_begin(r, it);
      for (int i = 0; i < r->nranks; i++)
        if (!stuck(r, i)) ring_end_rank(r, i);
      while (now_ns() < end) sleep_ns(10 * MS);
      atomic_store(&r->freeze, 0);
      if (hang >= 0) ring_begin_rank(r, hang, it);
      for (int i = 0; i < r->nranks; i++)
        if (stuck(r, i)) ring_end_rank(r, i);
      it++;
      break;
    }
    ring_begin(r, it);
    ring_end(r);
    it++;
  }
  ring_finalize(r);
  printf("emit-only: %d ops on %d ranks in %.1f s\n", it, r->nranks, (now_ns() - t0) / 1e9);
  return 0;
}

static void usage(void) {
  fprintf(stderr,
          "usage: harness [--lib PATH] [--flood N] [--scenario NAME[,NAME]] [--release R]\n"
          "               [--capture DIR] [--list]\n"
          "       harness --emit-only --seconds N [--ranks N] [--channels N] [--comm HEX]\n"
          "               [--slow-link R] [--straggler R] [--stall-rank R] [--hang-rank R]\n");
  exit(2);
}

static uint64_t flood_events = 10000000;
static void scenario_flood_default(void) { scenario_flood(flood_events); }
static void release_226(void) { run_release(release_named("2.26"), 0xc4a11ed000002260ull, 4, 10); }
static void release_227(void) { run_release(release_named("2.27"), 0xc4a11ed000002270ull, 4, 10); }
static void release_228(void) { run_release(release_named("2.28"), 0xc4a11ed000002280ull, 4, 10); }
static void release_229(void) { run_release(release_named("2.29"), 0xc4a11ed000002290ull, 4, 10); }
static void release_230(void) { run_release(release_named("2.30"), 0xc4a11ed000000001ull, 8, 40); }

static const struct scenario {
  const char *name;
  void (*run)(void);
} SCENARIOS[] = {
    {"loader", scenario_loader},
    {"release-2.26", release_226},
    {"release-2.27", release_227},
    {"release-2.28", release_228},
    {"release-2.29", release_229},
    {"release-2.30", release_230},
    {"datatypes", scenario_datatypes},
    {"ce", scenario_ce},
    {"pxn-unmapped", scenario_pxn_unmapped},
    {"pxn-mapped", scenario_pxn_mapped},
    {"single-node", scenario_single_node},
    {"mask", scenario_mask},
    {"init-twice", scenario_init_twice},
    {"after-finalize", scenario_after_finalize},
    {"finalize-inflight", scenario_finalize_inflight},
    {"agent-stuck", scenario_agent_stuck},
    {"slow", scenario_slow},
    {"straggler", scenario_straggler},
    {"stall", scenario_stall},
    {"wide", scenario_wide},
    {"exhaust", scenario_exhaust},
    {"flood", scenario_flood_default},
};

/* Is `name` one of the comma-separated names in `list`? */
static int listed(const char *list, const char *name) {
  size_t n = strlen(name);
  for (const char *p = list; p != NULL; p = strchr(p, ','), p = p ? p + 1 : NULL)
    if (!strncmp(p, name, n) && (p[n] == ',' || p[n] == '\0')) return 1;
  return 0;
}

int main(int argc, char **argv) {
  char lib[PATH_MAX], self[PATH_MAX];
  snprintf(self, sizeof self, "%s", argv[0]);
  snprintf(lib, sizeof lib, "%s/libnccl-profiler-c4.so", dirname(self));
  const char *scenario = "all";
  int emit = 0;
  double seconds = 5;
  struct ring er;
  ring_defaults(&er, 0xc4e2e00000000001ull);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--emit-only")) { emit = 1; continue; }
    if (!strcmp(a, "--list")) {
      for (size_t k = 0; k < sizeof SCENARIOS / sizeof SCENARIOS[0]; k++) puts(SCENARIOS[k].name);
      return 0;
    }
    if (v == NULL) usage();
    i++;
    if (!strcmp(a, "--lib")) snprintf(lib, sizeof lib, "%s", v);
    else if (!strcmp(a, "--flood")) flood_events = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--scenario")) scenario = v;
    else if (!strcmp(a, "--release") && release_named(v)) MAIN_REL = release_named(v);
    else if (!strcmp(a, "--capture")) capture_dir = v;
    else if (!strcmp(a, "--seconds")) seconds = atof(v);
    else if (!strcmp(a, "--ranks")) er.nranks = atoi(v);
    else if (!strcmp(a, "--channels")) er.nchan = atoi(v);
    else if (!strcmp(a, "--comm")) er.hash = strtoull(v, NULL, 16);
    else if (!strcmp(a, "--slow-link")) er.slow_src = atoi(v), er.slow_factor = 5;
    else if (!strcmp(a, "--straggler")) er.straggler = atoi(v), er.straggle_ns = 5 * MS;
    else if (!strcmp(a, "--stall-rank")) er.stall_rank = atoi(v);
    else if (!strcmp(a, "--hang-rank")) er.hang_rank = atoi(v);
    else usage();
  }
  if (er.nranks < 2 || er.nranks > MAX_RANKS || er.nchan < 1 || er.nchan > MAX_CHANNELS ||
      er.slow_src >= er.nranks || er.straggler >= er.nranks || er.stall_rank >= er.nranks ||
      er.hang_rank >= er.nranks)
    usage();
  prctl(PR_SET_TIMERSLACK, 1UL); /* sleeps of known length */
  self_pid = getpid();
  if (!emit) {
    snprintf(R.dir, sizeof R.dir, "/tmp/c4-harness.XXXXXX");
    if (mkdtemp(R.dir) == NULL) {
      perror("mkdtemp");
      return 2;
    }
    snprintf(R.path, sizeof R.path, "%s/agent.sock", R.dir);
    setenv("C4_AGENT_SOCKET", R.path, 1);
    char ms[16];
    snprintf(ms, sizeof ms, "%d", INTERVAL_MS);
    setenv("C4_INTERVAL_MS", ms, 1);
    snprintf(ms, sizeof ms, "%d", STALL_MS);
    setenv("C4_STALL_MS", ms, 1);
    rx_start();
  }
  DL = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (DL == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
    return 2;
  }
  proxy_start();
  int rc = 0;
  if (emit) {
    rc = emit_only(seconds, &er);
  } else {
    uint64_t t0 = now_ns();
    int all = !strcmp(scenario, "all"), ran = 0;
    for (size_t k = 0; k < sizeof SCENARIOS / sizeof SCENARIOS[0]; k++) {
      if (!all && !listed(scenario, SCENARIOS[k].name)) continue;
      if (all && capture_dir && SCENARIOS[k].run == scenario_flood_default) continue;
      int before = failures;
      SCENARIOS[k].run();
      ran++;
      printf("scenario %s: %s\n", SCENARIOS[k].name, failures == before ? "passed" : "FAILED");
      fflush(stdout);
    }
    if (ran == 0) usage();
    rx_stop();
    rx_clear();
    rmdir(R.dir);
    printf("harness: %s in %.1f s\n", failures ? "FAILED" : "all checks passed",
           (now_ns() - t0) / 1e9);
    rc = failures ? 1 : 0;
  }
  proxy_stop();
  return rc;
}
