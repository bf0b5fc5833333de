/* Drives libnccl-profiler-c4.so exactly as NCCL does, from an application thread (Coll,
 * KernelCh) and a proxy thread (ProxyOp, ProxyStep), receives the plugin's datagrams on its
 * own Unix socket and checks them. Time is real: waits are sleeps of known length.
 *
 *   harness [--lib PATH] [--flood N] [--scenario NAME] [--capture DIR]
 *   harness --emit-only --seconds N [--ranks N] [--channels N] [--comm HEX]
 *           [--slow-link R] [--straggler R] [--stall-rank R] [--hang-rank R]
 *
 * Scenarios (all by default): normal, slow, straggler, stall, wide, exhaust, v4, flood.
 * --emit-only drives a ring AllReduce workload and sends to $C4_AGENT_SOCKET without
 * receiving (for end-to-end tests through a real agent): from 1 s on, --stall-rank R freezes
 * R's receive from R-1 (communication hang), --hang-rank R keeps R out of the op while its
 * neighbours wait (non-communication hang). --capture DIR writes datagrams for
 * tests/fixtures/plugin. Exit status 0 when every check passed. */
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

/* ------------------------------------------------------------------ plugin, as NCCL sees it */

static c4_profiler_v5_t *P5;
static c4_profiler_v4_t *P4;
static _Atomic int warn_lines;

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

struct hcomm {
  void *ctx;
  int mask;
  uint64_t hash;
  int rank, nranks;
  _Atomic int entered_it;         /* iteration whose Coll this rank started */
  _Atomic uint64_t entered_ns;
  _Atomic uint64_t last_event_ns; /* last proxy-step event the harness issued */
  uint64_t hops_done;             /* proxy ops finished, under PX.mu */
};

static void comm_init(struct hcomm *c, uint64_t hash, int rank, int nranks, int nnodes) {
  memset(c, 0, sizeof *c);
  c->hash = hash;
  c->rank = rank;
  c->nranks = nranks;
  atomic_store(&c->entered_it, -1);
  P5->init(&c->ctx, hash, &c->mask, "harness", nnodes, nranks, rank, nccl_logger);
  CHECK(c->ctx != NULL, "init failed for rank %d", rank);
  CHECK((c->mask & (C4_EV_COLL | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH)) ==
            (C4_EV_COLL | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH),
        "activation mask %#x", c->mask);
}

/* NCCL starts an event only when its type is in the activation mask. */
static void *ev_start(struct hcomm *c, c4_descr_v5_t *d) {
  void *h = NULL;
  if (c->mask & (int)d->type) P5->startEvent(c->ctx, &h, d);
  return h;
}

static void ev_state(void *h, c4_nccl_state_t st, size_t trans) {
  c4_nccl_state_args_t a;
  memset(&a, 0, sizeof a);
  a.proxyStep.transSize = trans;
  P5->recordEventState(h, st, &a);
}

static void *start_coll(struct hcomm *c, uint64_t seq, size_t count, int nchan) {
  c4_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_COLL;
  d.rank = c->rank;
  d.coll.seqNumber = seq;
  d.coll.func = "AllReduce";
  d.coll.count = count;
  d.coll.datatype = "ncclFloat32";
  d.coll.nChannels = (uint8_t)nchan;
  d.coll.algo = "Ring";
  d.coll.proto = "Simple";
  return ev_start(c, &d);
}

static void *start_proxy_op(struct hcomm *c, void *parent, int peer, int ch, int is_send,
                            int nsteps) {
  c4_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_PROXY_OP;
  d.parentObj = parent;
  d.rank = c->rank;
  d.proxyOp.pid = getpid();
  d.proxyOp.channelId = (uint8_t)ch;
  d.proxyOp.peer = peer;
  d.proxyOp.nSteps = nsteps;
  d.proxyOp.chunkSize = 1 << 19;
  d.proxyOp.isSend = is_send;
  return ev_start(c, &d);
}

static void *start_step(struct hcomm *c, void *parent, int step) {
  c4_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_PROXY_STEP;
  d.parentObj = parent;
  d.rank = c->rank;
  d.proxyStep.step = step;
  return ev_start(c, &d);
}

static void *start_kch(struct hcomm *c, void *parent, int ch) {
  c4_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_KERNEL_CH;
  d.parentObj = parent;
  d.rank = c->rank;
  d.kernelCh.channelId = (uint8_t)ch;
  d.kernelCh.pTimer = now_ns();
  return ev_start(c, &d);
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
  int nmsgs, final_seen, last_has_inflight;
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
  for (int i = 0; i < s->ncolls; i++) {
    a->colls += v->colls[i].count;
    a->coll_bytes += v->colls[i].bytes;
    a->coll_time += v->colls[i].time_ns;
    memcpy(a->func, v->colls[i].func, C4W_NAME);
    memcpy(a->algo, v->colls[i].algo, C4W_NAME);
    memcpy(a->proto, v->colls[i].proto, C4W_NAME);
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
  int carries_size; /* transSize is reported with this state */
  int gated;        /* waits for the peer to enter the op (credit or data from it) */
  int network;      /* the phase a frozen step never leaves */
};
static const struct phase SEND_PHASES[3] = {
    {C4_ST_SEND_GPU_WAIT, 0, 0, 0}, {C4_ST_SEND_PEER_WAIT, 0, 1, 0}, {C4_ST_SEND_WAIT, 1, 0, 1}};
static const struct phase RECV_PHASES[3] = {
    {C4_ST_RECV_WAIT, 0, 1, 1}, {C4_ST_RECV_FLUSH_WAIT, 1, 0, 0}, {C4_ST_RECV_GPU_WAIT, 0, 0, 0}};

struct hstep {
  void *h;
  int phase;
  uint64_t phase_start, deadline;
};

struct hop { /* one proxy op, as NCCL's proxy thread progresses it */
  struct hcomm *comm;
  struct hcomm *peer_comm; /* whose entry gates step 0 */
  void *parent;
  void *h;
  int peer, channel, is_send, nsteps, iter;
  size_t chunk;
  uint64_t dur[3];
  int started, done, nwin;
  struct hstep win[WINDOW];
  int freeze_step;          /* -1: none */
  _Atomic int *freeze;      /* while nonzero, freeze_step stays in its network phase */
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

static const struct phase *phases(const struct hop *o) {
  return o->is_send ? SEND_PHASES : RECV_PHASES;
}

static uint64_t phase_deadline(struct hop *o, struct hstep *s, int stepno) {
  const struct phase *ph = &phases(o)[s->phase];
  uint64_t from = s->phase_start;
  if (ph->network && stepno == o->freeze_step && o->freeze && atomic_load(o->freeze))
    return NEVER;
  if (ph->gated) {
    if (atomic_load(&o->peer_comm->entered_it) < o->iter) return NEVER;
    uint64_t entered = atomic_load(&o->peer_comm->entered_ns);
    if (entered > from) from = entered;
  }
  return from + o->dur[s->phase];
}

static void phase_begin(struct hop *o, struct hstep *s, int stepno, int phase) {
  const struct phase *ph = &phases(o)[phase];
  s->phase = phase;
  ev_state(s->h, ph->state, ph->carries_size ? o->chunk : 0);
  s->phase_start = now_ns(); /* after the plugin's timestamp: it sees at least the duration */
  s->deadline = phase_deadline(o, s, stepno);
}

/* Advances one hop; returns 1 when all its steps are done. */
static int hop_progress(struct hop *o, uint64_t now, uint64_t *next) {
  while (o->nwin < WINDOW && o->started < o->nsteps) {
    struct hstep *s = &o->win[o->nwin++];
    s->h = start_step(o->comm, o->h, o->started);
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
    if (s->phase < 2) {
      phase_begin(o, s, stepno, s->phase + 1);
      if (s->deadline < *next) *next = s->deadline;
    } else if (i == 0) { /* steps complete in order */
      P5->stopEvent(s->h);
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

static void *proxy_run(void *arg) {
  (void)arg;
  struct hop *active = NULL;
  pthread_mutex_lock(&PX.mu);
  while (!PX.quit) {
    while (PX.queue) { /* ProxyOps start when the proxy thread picks them up */
      struct hop *o = PX.queue;
      PX.queue = o->next;
      o->h = start_proxy_op(o->comm, o->parent, o->peer, o->channel, o->is_send, o->nsteps);
      o->next = active;
      active = o;
    }
    pthread_mutex_unlock(&PX.mu);
    uint64_t now = now_ns(), next = now + 50 * MS;
    struct hop *finished = NULL;
    for (struct hop **pp = &active; *pp;) {
      struct hop *o = *pp;
      if (hop_progress(o, now, &next)) {
        P5->stopEvent(o->h);
        *pp = o->next;
        o->next = finished;
        finished = o;
      } else {
        pp = &o->next;
      }
    }
    pthread_mutex_lock(&PX.mu);
    while (finished) {
      struct hop *o = finished;
      finished = o->next;
      o->comm->hops_done++;
      free(o);
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
  o->next = PX.queue;
  PX.queue = o;
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

/* ------------------------------------------------------ a ring AllReduce over N ranks */

struct ring {
  uint64_t hash;
  int nranks, nchan, nsteps;
  size_t chunk, count;
  uint64_t gpu_ns, peer_ns, net_ns, flush_ns;
  int slow_src, slow_factor; /* link slow_src -> slow_src+1 is slow_factor times slower */
  int straggler;             /* enters every op straggle_ns late */
  uint64_t straggle_ns;
  int stall_rank;            /* its recv from rank-1 on channel 0 can freeze */
  int hang_rank;             /* skipped by ring_begin: never enters the op */
  _Atomic int freeze;
  struct hcomm comms[MAX_RANKS];
  void *colls[MAX_RANKS], *kch[MAX_RANKS][MAX_CHANNELS];
  uint64_t coll_t0[MAX_RANKS];
  uint64_t op_ns[MAX_RANKS];      /* harness-measured: before Coll start to after completion */
  uint64_t enqueue_ns[MAX_RANKS]; /* Coll start to Coll stop */
  uint64_t posted[MAX_RANKS];     /* proxy ops posted */
  int iters;
};

static void ring_init(struct ring *r) {
  for (int i = 0; i < r->nranks; i++) comm_init(&r->comms[i], r->hash, i, r->nranks, 2);
}

static struct hop *ring_hop(struct ring *r, int rank, int ch, int is_send, int it) {
  struct hop *o = calloc(1, sizeof *o);
  int n = r->nranks;
  o->comm = &r->comms[rank];
  o->peer = is_send ? (rank + 1) % n : (rank + n - 1) % n;
  o->peer_comm = &r->comms[o->peer];
  o->parent = r->colls[rank];
  o->channel = ch;
  o->is_send = is_send;
  o->nsteps = r->nsteps;
  o->iter = it;
  o->chunk = r->chunk;
  int src = is_send ? rank : o->peer;
  uint64_t net = r->net_ns * (src == r->slow_src ? (uint64_t)r->slow_factor : 1);
  if (is_send) {
    o->dur[0] = r->gpu_ns, o->dur[1] = r->peer_ns, o->dur[2] = net;
  } else {
    o->dur[0] = net, o->dur[1] = r->flush_ns, o->dur[2] = r->gpu_ns;
  }
  o->freeze_step = -1;
  if (rank == r->stall_rank && !is_send && ch == 0) {
    o->freeze_step = 3 < r->nsteps ? 3 : 0;
    o->freeze = &r->freeze;
  }
  return o;
}

/* The application side of one op on rank i: Coll start, proxy ops posted, KernelCh per
 * channel, Coll stop ("enqueued"). Completion comes later, from the proxy thread. */
static void ring_begin_rank(struct ring *r, int i, int it) {
  struct hcomm *c = &r->comms[i];
  r->coll_t0[i] = now_ns();
  r->colls[i] = start_coll(c, (uint64_t)it, r->count, r->nchan);
  atomic_store(&c->entered_ns, now_ns());
  atomic_store(&c->entered_it, it);
  for (int ch = 0; ch < r->nchan; ch++) {
    proxy_post(ring_hop(r, i, ch, 1, it));
    proxy_post(ring_hop(r, i, ch, 0, it));
    r->kch[i][ch] = start_kch(c, r->colls[i], ch);
  }
  r->posted[i] += (uint64_t)(2 * r->nchan);
  P5->stopEvent(r->colls[i]);
  r->enqueue_ns[i] += now_ns() - r->coll_t0[i];
}

static void ring_begin(struct ring *r, int it) {
  for (int i = 0; i < r->nranks; i++)
    if (i != r->straggler && i != r->hang_rank) ring_begin_rank(r, i, it);
  if (r->straggler >= 0) {
    sleep_ns(r->straggle_ns);
    ring_begin_rank(r, r->straggler, it);
  }
}

/* The kernel of rank i ends when its proxy ops have. */
static void ring_end_rank(struct ring *r, int i) {
  proxy_wait(&r->comms[i], r->posted[i]);
  for (int ch = 0; ch < r->nchan; ch++) {
    c4_nccl_state_args_t a = {.kernelCh = {now_ns()}};
    P5->recordEventState(r->kch[i][ch], C4_ST_KERNEL_CH_STOP, &a);
    P5->stopEvent(r->kch[i][ch]);
  }
  r->op_ns[i] += now_ns() - r->coll_t0[i];
}

static void ring_end(struct ring *r) {
  for (int i = 0; i < r->nranks; i++) ring_end_rank(r, i);
  r->iters++;
}

static void ring_finalize(struct ring *r) {
  for (int i = 0; i < r->nranks; i++) P5->finalize(r->comms[i].ctx);
}

static void ring_defaults(struct ring *r, uint64_t hash) {
  memset(r, 0, sizeof *r);
  r->hash = hash;
  r->nranks = 8;
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

/* Waits for the final summary (sent by finalize) of ranks [first, first + n). */
static void wait_finals(uint64_t hash, int first, int n) {
  for (int i = first; i < first + n; i++)
    CHECK(wait_msg(C4W_SUMMARY, hash, i, is_final, NULL, 1000 * MS),
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

static void scenario_normal(void) {
  struct ring r;
  ring_defaults(&r, 0xc4a11ed000000001ull);
  int iters = 40;
  ring_init(&r);
  for (int it = 0; it < iters; it++) {
    ring_begin(&r, it);
    ring_end(&r);
  }
  sleep_ns(2 * INTERVAL_MS * MS); /* at least one periodic summary before finalize */
  ring_finalize(&r);
  wait_finals(r.hash, 0, r.nranks);
  uint64_t steps = (uint64_t)iters * (uint64_t)r.nsteps, bytes = steps * r.chunk;
  for (int i = 0; i < r.nranks; i++) {
    struct agg *a = aggregate(r.hash, i);
    CHECK(a->nmsgs >= 2, "rank %d: %d summaries", i, a->nmsgs);
    CHECK(a->seq_started == (uint64_t)iters && a->seq_completed == (uint64_t)iters,
          "rank %d: seq %" PRIu64 "/%" PRIu64, i, a->seq_started, a->seq_completed);
    CHECK(a->colls == (uint64_t)iters && a->coll_bytes == (uint64_t)iters * r.count * 4,
          "rank %d: %" PRIu64 " colls, %" PRIu64 " bytes", i, a->colls, a->coll_bytes);
    CHECK(!strcmp(a->func, "AllReduce") && !strcmp(a->algo, "Ring") && !strcmp(a->proto, "Simple"),
          "rank %d: %s/%s/%s", i, a->func, a->algo, a->proto);
    /* Completion is the last child's stop, not Coll stop (enqueue). */
    CHECK(a->coll_time <= r.op_ns[i] && a->coll_time >= r.op_ns[i] * 8 / 10,
          "rank %d: coll time %" PRIu64 " ns, harness measured %" PRIu64, i, a->coll_time,
          r.op_ns[i]);
    CHECK(a->coll_time > 20 * r.enqueue_ns[i], "rank %d: coll time %" PRIu64 " vs enqueue %" PRIu64,
          i, a->coll_time, r.enqueue_ns[i]);
    CHECK(a->entry_ops == (uint64_t)iters, "rank %d: entry_ops %" PRIu64, i, a->entry_ops);
    CHECK(a->dropped == 0 && !a->last_has_inflight, "rank %d: dropped %" PRIu64, i, a->dropped);
    CHECK(a->npeers == 2 * r.nchan, "rank %d: %d connections", i, a->npeers);
    for (int k = 0; k < a->npeers; k++) {
      struct agg_peer *p = &a->peers[k];
      int want = p->dir == C4W_SEND ? (i + 1) % r.nranks : (i + r.nranks - 1) % r.nranks;
      CHECK((int)p->peer == want && p->channel < r.nchan, "rank %d: unexpected peer %u ch %u",
            i, p->peer, p->channel);
      CHECK(p->bytes == bytes && p->steps == steps, "rank %d peer %u: %" PRIu64 " bytes %" PRIu64
            " steps", i, p->peer, p->bytes, p->steps);
      double net = ratio(p->net, steps * r.net_ns);
      CHECK(net >= 0.99 && net < 5, "rank %d peer %u dir %u: net wait %.2fx nominal", i, p->peer,
            p->dir, net);
      uint64_t gpu = p->dir == C4W_SEND ? r.gpu_ns : r.gpu_ns + r.flush_ns;
      CHECK(p->gpu >= steps * gpu, "rank %d: gpu wait %" PRIu64, i, p->gpu);
      CHECK(p->dir == C4W_RECV ? p->peerw == 0 : p->peerw >= steps * r.peer_ns,
            "rank %d: peer wait %" PRIu64, i, p->peerw);
    }
  }
  if (capture_dir) {
    each_msg(C4W_SUMMARY, r.hash, 3, capture_first, "summary.bin");
    each_msg(C4W_SUMMARY, r.hash, 3, capture_final, "summary_final.bin");
  }
  struct agg *a = aggregate(r.hash, 3);
  printf("normal: %d ranks x %d ops, rank 3: %.2f ms/op (harness %.2f), net %.3f ms/step, "
         "entry %.3f ms/op\n", r.nranks, iters, a->coll_time / 1e6 / iters, r.op_ns[3] / 1e6 / iters,
         a->peers[0].net / 1e6 / steps, a->entry_wait / 1e6 / (a->entry_ops ? a->entry_ops : 1));
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static void scenario_slow(void) {
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

static int stall_after(struct view *v, void *arg) { return v->t_ns >= *(uint64_t *)arg; }

static void stall_episode(struct ring *r, int it, int save_it) {
  int victim = r->stall_rank, upstream = (victim + r->nranks - 1) % r->nranks;
  uint64_t begin = now_ns();
  atomic_store(&r->freeze, 1);
  ring_begin(r, it);
  /* everything but the frozen recv completes */
  for (int i = 0; i < r->nranks; i++)
    if (i != victim) ring_end_rank(r, i);
  proxy_wait(&r->comms[victim], r->posted[victim] - 1);
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
  struct hcomm c;
  const int npeers = 1500;
  comm_init(&c, 0xc4a11ed000000005ull, 0, 2048, 256);
  /* start right after a summary: all the traffic falls in the next one */
  CHECK(wait_msg(C4W_SUMMARY, c.hash, 0, NULL, NULL, 3 * INTERVAL_MS * MS), "no summary");
  c4_descr_v5_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_P2P;
  d.p2p.func = "Send";
  d.p2p.datatype = "ncclBfloat16";
  d.p2p.count = 2048;
  d.p2p.peer = 1;
  void *p2p = ev_start(&c, &d);
  for (int peer = 1; peer <= npeers; peer++) {
    void *op = start_proxy_op(&c, p2p, peer, 0, 1, 1);
    void *s = start_step(&c, op, 0);
    ev_state(s, C4_ST_SEND_WAIT, 4096);
    P5->stopEvent(s);
    P5->stopEvent(op);
  }
  P5->stopEvent(p2p);
  struct parts p = {0};
  wait_msg(C4W_SUMMARY, c.hash, 0, has_peers, NULL, 3 * INTERVAL_MS * MS);
  sleep_ns(10 * MS); /* the other parts follow at once */
  each_msg(C4W_SUMMARY, c.hash, 0, count_parts, &p);
  CHECK(p.nparts > 1 && p.parts == p.nparts && p.peers == npeers,
        "%d peers in %d of %u parts", p.peers, p.parts, p.nparts);
  struct agg *a = aggregate(c.hash, 0);
  CHECK(a->colls == 1 && !strcmp(a->func, "Send") && a->coll_bytes == 2048 * 2,
        "p2p: %" PRIu64 " ops %s %" PRIu64 " bytes", a->colls, a->func, a->coll_bytes);
  P5->finalize(c.ctx);
  printf("wide: %d peers in %u datagrams\n", p.peers, p.nparts);
}

/* More live steps than the pool holds: NULL handles, counted drops, nothing else breaks. */
static void scenario_exhaust(void) {
  struct hcomm c;
  enum { N = 20000 };
  static void *steps[N];
  comm_init(&c, 0xc4a11ed000000006ull, 0, 2, 2);
  void *coll = start_coll(&c, 0, 1024, 1);
  void *op = start_proxy_op(&c, coll, 1, 0, 1, N);
  int nulls = 0;
  for (int i = 0; i < N; i++) {
    steps[i] = start_step(&c, op, i);
    nulls += steps[i] == NULL;
    ev_state(steps[i], C4_ST_SEND_WAIT, 1000); /* NULL handles must be accepted */
  }
  for (int i = 0; i < N; i++) P5->stopEvent(steps[i]);
  for (int i = 0; i < 100; i++) { /* the pool is whole again */
    void *s = start_step(&c, op, N + i);
    CHECK(s != NULL, "step %d after the pool drained", i);
    P5->stopEvent(s);
  }
  P5->stopEvent(op);
  P5->stopEvent(coll);
  P5->stopEvent(NULL);
  P5->finalize(c.ctx);
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

/* NCCL 2.25/2.26 load ncclProfiler_v4: other init order, 8-bit type. Bad init: disabled. */
static void scenario_v4(void) {
  void *ctx = NULL;
  int mask = -1, warns = warn_lines;
  P4->init(&ctx, &mask, "bad", 0xbadull, 1, 4, 9, nccl_logger);
  CHECK(ctx == NULL && mask == 0 && warn_lines == warns + 1, "bad init: ctx %p mask %d", ctx, mask);
  void *h = (void *)1;
  c4_descr_v4_t d;
  memset(&d, 0, sizeof d);
  d.type = C4_EV_COLL;
  P4->startEvent(NULL, &h, &d);
  CHECK(h == NULL, "event on a disabled communicator got a handle");

  uint64_t hash = 0xc4a11ed000000007ull;
  P4->init(&ctx, &mask, "v4", hash, 2, 2, 1, nccl_logger);
  CHECK(ctx != NULL && (mask & C4_EV_PROXY_STEP), "v4 init: mask %#x", mask);
  for (int it = 0; it < 5; it++) {
    void *coll = NULL, *op = NULL, *s = NULL;
    memset(&d, 0, sizeof d);
    d.type = C4_EV_COLL;
    d.rank = 1;
    d.coll.seqNumber = (uint64_t)it;
    d.coll.func = "AllGather";
    d.coll.count = 1000;
    d.coll.datatype = "ncclInt64";
    d.coll.nChannels = 1;
    d.coll.algo = "Ring";
    d.coll.proto = "LL128";
    P4->startEvent(ctx, &coll, &d);
    memset(&d, 0, sizeof d);
    d.type = C4_EV_PROXY_OP;
    d.parentObj = coll;
    d.proxyOp.peer = 0;
    d.proxyOp.isSend = 0;
    d.proxyOp.nSteps = 1;
    P4->startEvent(ctx, &op, &d);
    memset(&d, 0, sizeof d);
    d.type = C4_EV_PROXY_STEP;
    d.parentObj = op;
    P4->startEvent(ctx, &s, &d);
    c4_nccl_state_args_t a = {.proxyStep = {0}};
    P4->recordEventState(s, C4_ST_RECV_WAIT, &a);
    sleep_ns(200 * US);
    a.proxyStep.transSize = 8000;
    P4->recordEventState(s, C4_ST_RECV_FLUSH_WAIT, &a);
    P4->stopEvent(s);
    P4->stopEvent(op);
    P4->stopEvent(coll);
  }
  sleep_ns(2 * INTERVAL_MS * MS);
  if (capture_dir) each_msg(C4W_SUMMARY, hash, 1, capture_first, "summary_v4.bin");
  P4->finalize(ctx);
  wait_finals(hash, 1, 1);
  struct agg *a = aggregate(hash, 1);
  CHECK(a->seq_completed == 5 && a->colls == 5 && a->coll_bytes == 5 * 8000 &&
            !strcmp(a->proto, "LL128"),
        "v4: %" PRIu64 " completed, %" PRIu64 " bytes, proto %s", a->seq_completed, a->coll_bytes,
        a->proto);
  CHECK(a->npeers == 1 && a->peers[0].dir == C4W_RECV && a->peers[0].bytes == 5 * 8000 &&
            a->peers[0].net >= 5 * 200 * US,
        "v4 peer: %" PRIu64 " bytes, net %" PRIu64, a->peers[0].bytes, a->peers[0].net);
  printf("v4: 5 ops through ncclProfiler_v4\n");
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
    void *coll = start_coll(c, f->colls, 4096, 1);
    void *op = start_proxy_op(c, coll, (c->rank + 1) % c->nranks, 0, 1, 8);
    for (int i = 0; i < 8; i++) {
      void *s = start_step(c, op, i);
      ev_state(s, C4_ST_SEND_GPU_WAIT, 0);
      ev_state(s, C4_ST_SEND_PEER_WAIT, 0);
      ev_state(s, C4_ST_SEND_WAIT, 2048);
      P5->stopEvent(s);
    }
    P5->stopEvent(op);
    P5->stopEvent(coll);
    f->events += 4 + 8 * 5;
    f->colls++;
  }
  return NULL;
}

static int drops_seen(struct view *v, void *arg) {
  (void)arg;
  return v->h->dgram_drops > 0;
}

static void scenario_flood(uint64_t events) {
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
  for (int i = 0; i < 2; i++) P5->finalize(f[i].c.ctx);
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
          "usage: harness [--lib PATH] [--flood N] [--scenario NAME] [--capture DIR]\n"
          "       harness --emit-only --seconds N [--ranks N] [--channels N] [--comm HEX]\n"
          "               [--slow-link R] [--straggler R] [--stall-rank R] [--hang-rank R]\n");
  exit(2);
}

static void *load(const char *lib, const char *sym) {
  void *dl = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
  if (dl == NULL) {
    fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
    exit(2);
  }
  void *p = dlsym(dl, sym);
  if (p == NULL) {
    fprintf(stderr, "dlsym %s: %s\n", sym, dlerror());
    exit(2);
  }
  return p;
}

int main(int argc, char **argv) {
  char lib[PATH_MAX], self[PATH_MAX];
  snprintf(self, sizeof self, "%s", argv[0]);
  snprintf(lib, sizeof lib, "%s/libnccl-profiler-c4.so", dirname(self));
  const char *scenario = "all";
  uint64_t flood = 10000000;
  int emit = 0;
  double seconds = 5;
  struct ring er;
  ring_defaults(&er, 0xc4e2e00000000001ull);
  for (int i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(a, "--emit-only")) { emit = 1; continue; }
    if (v == NULL) usage();
    i++;
    if (!strcmp(a, "--lib")) snprintf(lib, sizeof lib, "%s", v);
    else if (!strcmp(a, "--flood")) flood = strtoull(v, NULL, 10);
    else if (!strcmp(a, "--scenario")) scenario = v;
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
  P5 = load(lib, "ncclProfiler_v5");
  P4 = load(lib, "ncclProfiler_v4");
  proxy_start();
  if (emit) {
    emit_only(seconds, &er);
  } else {
    uint64_t t0 = now_ns();
    int all = !strcmp(scenario, "all");
    if (all || !strcmp(scenario, "normal")) scenario_normal();
    if (all || !strcmp(scenario, "slow")) scenario_slow();
    if (all || !strcmp(scenario, "straggler")) scenario_straggler();
    if (all || !strcmp(scenario, "stall")) scenario_stall();
    if (all || !strcmp(scenario, "wide")) scenario_wide();
    if (all || !strcmp(scenario, "exhaust")) scenario_exhaust();
    if (all || !strcmp(scenario, "v4")) scenario_v4();
    if ((all && !capture_dir) || !strcmp(scenario, "flood")) scenario_flood(flood);
    rx_stop();
    rx_clear();
    rmdir(R.dir);
    printf("harness: %s in %.1f s\n", failures ? "FAILED" : "all checks passed",
           (now_ns() - t0) / 1e9);
  }
  proxy_stop();
  return failures ? 1 : 0;
}
