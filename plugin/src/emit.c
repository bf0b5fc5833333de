/* Background thread: reads the communicators' counters (never writes what NCCL's threads
 * write), sends one summary per communicator every interval and a `stalled` message as soon
 * as a communicator with an operation in flight has made no progress for the stall threshold.
 * Sends never block: with the agent absent, datagrams are dropped and counted; with its queue
 * full, this thread (not NCCL's) waits for room at most SEND_WAIT_NS per tick, then drops.
 *
 * NCCL's threads never wait for the agent: init and finalize only touch the registry under a
 * lock this thread holds for list operations, never across a send. Finalize marks the
 * communicator, cuts this thread's wait for the agent short (eventfd) and waits only for it to
 * hand the final summary to the socket without waiting (so that it is out before the process
 * may exit); the memory is freed FREE_GRACE_NS later (an event NCCL still delivers meanwhile
 * finds valid memory and is ignored). NCCL
 * dlcloses the plugin after the last finalize: the library pins itself (RTLD_NODELETE) when it
 * starts the thread, so the thread and the memory it frees later outlive that, and nothing
 * has to be joined on NCCL's thread. With no communicator left the thread sleeps. */
#include <errno.h>
#include <poll.h>
#include <dlfcn.h>
#include <stdlib.h>
#include <sys/eventfd.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "emit.h"

#define TICK_MAX_NS 100000000ull /* stall checks at least every 100 ms */
#define TICK_MIN_NS 10000000ull
/* The kernel queues few datagrams per Unix socket (net.unix.max_dgram_qlen, default 10):
 * when the agent's queue is full, wait for it to drain, at most this long per tick. */
#define SEND_WAIT_NS 20000000ull
#define FREE_GRACE_NS 30000000000ull /* a finalized communicator's memory outlives it this long */
#define CLOSE_WAIT_NS 100000000ull   /* finalize waits at most this for its final summary */

static struct {
  pthread_mutex_t life; /* serialises the thread's start (init only) */
  pthread_mutex_t reg;  /* the registry: comms; never held across a send */
  pthread_cond_t cv;
  pthread_cond_t closed_cv; /* a finalized communicator's final summary is out */
  pthread_once_t cv_once;
  struct c4_comm *comms; /* live, finalizing and closed (freed later) communicators */
  int running, finals; /* finals: finalized communicators whose final summary is not out */
  int wakefd; /* written by finalize: this thread stops waiting for the agent */
  /* The thread's own. */
  struct c4_comm **snap;
  size_t snap_cap;
  int fd, connected;
  uint64_t wait_left_ns; /* of SEND_WAIT_NS, this tick */
  struct sockaddr_un addr;
  socklen_t addr_len;
  uint32_t interval_ms;
  uint64_t interval_ns, stall_ns, tick_ns;
  uint64_t dgram_drops;
  unsigned char buf[C4W_MAX_DGRAM];
  struct c4w_coll colls[C4_MAX_KINDS];
  struct c4w_peer peers[C4_MAX_CONNS];
  struct c4w_waiting waiting[C4_MAX_PROXY_OPS];
  int32_t conn_slot[C4_MAX_CONNS];    /* conn index -> waiting index + 1 */
  int32_t oldest_step[C4_MAX_PROXY_OPS]; /* proxy op index -> step slot + 1 */
} G = {.life = PTHREAD_MUTEX_INITIALIZER, .reg = PTHREAD_MUTEX_INITIALIZER,
       .cv_once = PTHREAD_ONCE_INIT, .fd = -1, .wakefd = -1};

static void init_cv(void) {
  pthread_condattr_t a;
  pthread_condattr_init(&a);
  pthread_condattr_setclock(&a, CLOCK_MONOTONIC);
  pthread_cond_init(&G.cv, &a);
  pthread_cond_init(&G.closed_cv, &a);
  pthread_condattr_destroy(&a);
}

/* ---- sending ---- */

static void header(struct c4w_header *h, const struct c4_comm *c, uint8_t type, uint8_t flags,
                   uint64_t msg_seq) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  memset(h, 0, sizeof *h);
  h->magic = C4W_MAGIC;
  h->version = C4W_VERSION;
  h->type = type;
  h->flags = flags;
  h->pid = (uint32_t)getpid();
  h->rank = (uint32_t)LD(c->rank);
  h->nranks = (uint32_t)LD(c->nranks);
  h->comm = LD(c->hash);
  h->msg_seq = msg_seq;
  h->wall_ns = (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
  h->interval_ms = G.interval_ms;
  h->nnodes = (uint32_t)c->nnodes;
}

/* Connected, a full agent queue is visible to poll(POLLOUT) and a restarted agent to send()
 * (ECONNREFUSED): then a fresh socket connects to the new one at the next message. */
static int agent_connected(void) {
  if (!G.connected && connect(G.fd, (struct sockaddr *)&G.addr, G.addr_len) == 0)
    G.connected = 1;
  return G.connected;
}

static void agent_disconnect(void) {
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return; /* keep the old one, retry later */
  close(G.fd);
  G.fd = fd;
  G.connected = 0;
}

static int send_wait(void) {
  if (G.wait_left_ns == 0) return 0;
  uint64_t t0 = c4_now_ns();
  struct pollfd p[2] = {{.fd = G.fd, .events = POLLOUT}, {.fd = G.wakefd, .events = POLLIN}};
  int ms = (int)((G.wait_left_ns + 999999) / 1000000);
  int ready = poll(p, 2, ms) > 0 && (p[0].revents & POLLOUT);
  if (p[1].revents & POLLIN) { /* a finalize waits: no more waiting this tick */
    uint64_t n;
    if (read(G.wakefd, &n, sizeof n) < 0) { /* drained by an earlier read */
    }
    G.wait_left_ns = 0;
    return ready;
  }
  uint64_t spent = c4_now_ns() - t0;
  G.wait_left_ns = spent < G.wait_left_ns ? G.wait_left_ns - spent : 0;
  return ready;
}

/* One datagram: header, fixed block, then up to two runs of records. */
static void send_part(struct c4w_header *h, const void *block, size_t block_len,
                      const void *a, size_t a_len, const void *b, size_t b_len) {
  size_t off = 0;
  h->dgram_drops = G.dgram_drops;
  memcpy(G.buf, h, sizeof *h);
  off += sizeof *h;
  memcpy(G.buf + off, block, block_len);
  off += block_len;
  if (a_len) memcpy(G.buf + off, a, a_len);
  off += a_len;
  if (b_len) memcpy(G.buf + off, b, b_len);
  off += b_len;
  while (agent_connected()) {
    if (send(G.fd, G.buf, off, MSG_DONTWAIT | MSG_NOSIGNAL) >= 0) return;
    int err = errno;
    if (err == EINTR || (err == EAGAIN && send_wait())) continue;
    if (err != EAGAIN) agent_disconnect();
    break;
  }
  G.dgram_drops++;
}

/* Splits n records of size rec over parts: the first part has first_room bytes for them. */
static uint16_t nparts(size_t n, size_t rec, size_t first_room, size_t room) {
  size_t first = first_room / rec, per = room / rec;
  return n <= first ? 1 : (uint16_t)(1 + (n - first + per - 1) / per);
}

/* ---- reading a communicator ---- */

static void name_of(const struct c4_comm *c, int32_t kind, char out[C4W_NAME]) {
  memset(out, 0, C4W_NAME);
  if (kind >= 0 && atomic_load_explicit(&c->kinds[kind].state, memory_order_acquire) ==
                       C4_KIND_READY)
    memcpy(out, c->kinds[kind].func, C4W_NAME);
  else
    memcpy(out, "Unknown", 8);
}

/* In flight: started and not completed, unless it was stopped and only waits for children it
 * has not got (nothing is known to run). Once it has a child it stays in flight until it
 * completes, so that an op never flickers out and back while its children come and go. */
static int op_pending(struct c4_op *op) {
  return !LD(op->awaiting) || LD(op->children) > 0;
}

/* Scans the op ring: the oldest op in flight (NULL if none), and how many collectives are
 * live (started and not completed, in flight or not). */
static struct c4_op *scan_ops(struct c4_comm *c, uint64_t *live_colls) {
  struct c4_op *best = NULL;
  uint64_t best_opn = UINT64_MAX, colls = 0;
  for (int i = 0; i < C4_MAX_OPS; i++) {
    struct c4_op *op = &c->ops[i];
    if (atomic_load_explicit(&op->state, memory_order_acquire) != C4_OP_LIVE) continue;
    colls += LD(op->is_coll);
    uint64_t opn = LD(op->opn);
    if (opn < best_opn && op_pending(op)) {
      best_opn = opn;
      best = op;
    }
  }
  *live_colls = colls;
  return best;
}

static struct c4_op *oldest_pending(struct c4_comm *c) {
  uint64_t colls;
  return LD(c->ops_live) == 0 ? NULL : scan_ops(c, &colls);
}

/* Consistent when the counters did not move across the scan and the ring held exactly
 * started - completed live collectives (each counted one was seen LIVE). Completed is read
 * first: a completion it counts happened after its start, which the later read then counts. */
int c4_read_progress(struct c4_comm *c, struct c4_progress *p) {
  for (int tries = 0; tries < C4_PROGRESS_TRIES; tries++) {
    memset(p, 0, sizeof *p);
    p->completed = atomic_load_explicit(&c->seq_completed, memory_order_acquire);
    p->started = atomic_load_explicit(&c->seq_started, memory_order_acquire);
    uint64_t live;
    struct c4_op *op = scan_ops(c, &live);
    if (op != NULL) { /* read now: its slot is reused once it completes */
      p->has_op = 1;
      p->seq = LD(op->seq);
      p->start_ns = LD(op->start_ns);
      p->kind = LD(op->kind);
    }
    atomic_thread_fence(memory_order_acquire);
    if (LD(c->seq_completed) == p->completed && LD(c->seq_started) == p->started &&
        p->started - p->completed == live)
      return 1;
  }
  p->has_op = 0; /* the op seen may belong to neither count */
  return 0;
}

static int any_live_proxy_op(struct c4_comm *c) {
  uint32_t n = c4_pool_used(&c->proxy_ops);
  for (uint32_t i = 0; i < n; i++)
    if (atomic_load_explicit(&c4_pool_at(&c->proxy_ops, i)->live, memory_order_acquire))
      return 1;
  return 0;
}

static void emit_summary(struct c4_comm *c, uint64_t now, uint8_t flags) {
  struct c4w_summary s;
  memset(&s, 0, sizeof s);
  struct c4_progress pr;
  c4_read_progress(c, &pr);
  s.seq_started = pr.started;
  s.seq_completed = pr.completed;
  s.dropped_events = LD(c->dropped_events);
  s.span_ns = now - c->last_emit_ns;
  c->last_emit_ns = now;
  uint64_t ew = LD(c->entry_wait_ns), eo = LD(c->entry_ops);
  s.entry_wait_ns = ew - c->entry_wait_prev;
  s.entry_ops = (uint32_t)(eo - c->entry_ops_prev);
  c->entry_wait_prev = ew;
  c->entry_ops_prev = eo;

  if (pr.has_op) {
    uint64_t start = pr.start_ns, progress = LD(c->last_progress_ns);
    s.has_inflight = 1;
    s.inflight_seq = pr.seq;
    s.inflight_age_ns = now > start ? now - start : 0;
    if (progress < start) progress = start;
    s.progress_age_ns = now > progress ? now - progress : 0;
    name_of(c, pr.kind, s.inflight_func);
  }

  size_t ncolls = 0, npeers = 0;
  for (int i = 0; i < C4_MAX_KINDS; i++) {
    struct c4_kind *k = &c->kinds[i];
    if (atomic_load_explicit(&k->state, memory_order_acquire) != C4_KIND_READY) continue;
    struct c4_kind_prev *p = &c->kinds_prev[i];
    uint64_t count = LD(k->count), bytes = LD(k->bytes), time_ns = LD(k->time_ns);
    if (count != p->count) {
      struct c4w_coll *r = &G.colls[ncolls++];
      memcpy(r->func, k->func, C4W_NAME);
      memcpy(r->algo, k->algo, C4W_NAME);
      memcpy(r->proto, k->proto, C4W_NAME);
      r->count = count - p->count;
      r->bytes = bytes - p->bytes;
      r->time_ns = time_ns - p->time_ns;
    }
    *p = (struct c4_kind_prev){count, bytes, time_ns};
  }
  for (int i = 0; i < C4_MAX_CONNS; i++) {
    struct c4_conn *e = &c->conns[i];
    uint64_t key = atomic_load_explicit(&e->key, memory_order_acquire);
    if (key == 0) continue;
    struct c4_conn_prev *p = &c->conns_prev[i], cur;
    cur.bytes = LD(e->bytes);
    cur.steps = LD(e->steps);
    for (int w = 0; w < C4_NWAIT; w++) cur.wait_ns[w] = LD(e->wait_ns[w]);
    if (memcmp(&cur, p, sizeof cur) == 0) continue;
    struct c4w_peer *r = &G.peers[npeers++];
    memset(r, 0, sizeof *r);
    r->peer = (uint32_t)c4_key_peer(key);
    r->channel = (uint16_t)c4_key_channel(key);
    r->dir = (uint8_t)c4_key_dir(key);
    r->bytes = cur.bytes - p->bytes;
    r->steps = cur.steps - p->steps;
    r->net_wait_ns = cur.wait_ns[C4_WAIT_NET] - p->wait_ns[C4_WAIT_NET];
    r->peer_wait_ns = cur.wait_ns[C4_WAIT_PEER] - p->wait_ns[C4_WAIT_PEER];
    r->gpu_wait_ns = cur.wait_ns[C4_WAIT_GPU] - p->wait_ns[C4_WAIT_GPU];
    *p = cur;
  }

  struct c4w_header h;
  size_t room = C4W_MAX_DGRAM - sizeof h - sizeof s;
  size_t first_room = room - ncolls * sizeof(struct c4w_coll);
  header(&h, c, C4W_SUMMARY, flags, ++c->msg_seq);
  h.nparts = nparts(npeers, sizeof(struct c4w_peer), first_room, room);
  size_t off = 0;
  for (uint16_t part = 0; part < h.nparts; part++) {
    size_t cap = (part == 0 ? first_room : room) / sizeof(struct c4w_peer);
    size_t n = npeers - off < cap ? npeers - off : cap;
    h.part = part;
    s.ncolls = (uint16_t)(part == 0 ? ncolls : 0);
    s.npeers = (uint16_t)n;
    send_part(&h, &s, sizeof s, G.colls, s.ncolls * sizeof(struct c4w_coll), G.peers + off,
              n * sizeof(struct c4w_peer));
    off += n;
  }
}

/* For every live proxy op, the state of its oldest live step: the one the op waits on. */
static size_t waiting_list(struct c4_comm *c, uint64_t now) {
  uint32_t nops = c4_pool_used(&c->proxy_ops), nsteps = c4_pool_used(&c->steps);
  memset(G.oldest_step, 0, nops * sizeof G.oldest_step[0]);
  for (uint32_t i = 0; i < nsteps; i++) {
    struct c4_step *s = (struct c4_step *)c4_pool_at(&c->steps, i);
    if (!atomic_load_explicit(&s->h.live, memory_order_acquire)) continue;
    struct c4_proxy_op *p = LD(s->pop);
    if (p == NULL) continue;
    uint32_t pi = c4_pool_index(&c->proxy_ops, p);
    int32_t cur = G.oldest_step[pi];
    if (cur == 0 || LD(s->stepno) <
                        LD(((struct c4_step *)c4_pool_at(&c->steps, (uint32_t)cur - 1))->stepno))
      G.oldest_step[pi] = (int32_t)i + 1;
  }
  size_t n = 0;
  for (uint32_t i = 0; i < nops; i++) {
    struct c4_proxy_op *p = (struct c4_proxy_op *)c4_pool_at(&c->proxy_ops, i);
    if (!atomic_load_explicit(&p->h.live, memory_order_acquire)) continue;
    struct c4_conn *conn = LD(p->conn);
    if (conn == NULL) continue;
    uint64_t key = atomic_load_explicit(&conn->key, memory_order_acquire);
    uint32_t ci = (uint32_t)(conn - c->conns);
    uint64_t last = LD(p->last_ns), idle = now > last ? now - last : 0;
    int32_t st = G.oldest_step[i];
    int state = st ? LD(((struct c4_step *)c4_pool_at(&c->steps, (uint32_t)st - 1))->state) : 0;
    struct c4w_waiting *w;
    if (G.conn_slot[ci]) { /* several ops on one connection: keep the longest idle */
      w = &G.waiting[G.conn_slot[ci] - 1];
      if (idle <= w->idle_ns) continue;
    } else {
      w = &G.waiting[n++];
      G.conn_slot[ci] = (int32_t)n;
    }
    w->peer = (uint32_t)c4_key_peer(key);
    w->channel = (uint16_t)c4_key_channel(key);
    w->dir = (uint8_t)c4_key_dir(key);
    w->state = (uint8_t)(state > 0 && state < 256 ? state : C4W_STATE_NONE);
    w->idle_ns = idle;
  }
  memset(G.conn_slot, 0, sizeof G.conn_slot);
  return n;
}

/* A stall episode is identified by the time of the last progress it follows: one message per
 * episode; progress (or a newer op becoming the oldest) starts a new one. */
static void check_stall(struct c4_comm *c, uint64_t now) {
  struct c4_op *op = oldest_pending(c);
  if (op == NULL && !any_live_proxy_op(c)) return;
  uint64_t start = op ? LD(op->start_ns) : 0, last = LD(c->last_progress_ns);
  if (last < start) last = start;
  if (now < last + G.stall_ns || last == c->stall_mark) return;
  c->stall_mark = last;

  struct c4w_stalled s;
  memset(&s, 0, sizeof s);
  s.seq = op ? LD(op->seq) : LD(c->seq_started);
  s.seq_completed = LD(c->seq_completed);
  s.age_ns = now - last;
  s.op_age_ns = op && now > start ? now - start : 0;
  if (op)
    name_of(c, LD(op->kind), s.func);
  else
    memcpy(s.func, "Unknown", 8);
  size_t n = waiting_list(c, now);

  struct c4w_header h;
  size_t room = C4W_MAX_DGRAM - sizeof h - sizeof s;
  header(&h, c, C4W_STALLED, 0, ++c->msg_seq);
  h.nparts = nparts(n, sizeof(struct c4w_waiting), room, room);
  size_t off = 0, cap = room / sizeof(struct c4w_waiting);
  for (uint16_t part = 0; part < h.nparts; part++) {
    size_t k = n - off < cap ? n - off : cap;
    h.part = part;
    s.nwaiting = (uint32_t)k;
    send_part(&h, &s, sizeof s, G.waiting + off, k * sizeof(struct c4w_waiting), NULL, 0);
    off += k;
  }
}

/* A communicator's first report: v3 learns (hash, rank) from events; a second live one with
 * the same (hash, rank) would interleave its msg_seq with the first's, so it stays silent. */
static int reportable(struct c4_comm *c) {
  if (atomic_load_explicit(&c->known, memory_order_acquire) != 1) return 0;
  if (!c->checked) {
    pthread_mutex_lock(&G.reg);
    for (struct c4_comm *o = G.comms; o != NULL; o = o->next)
      if (o != c && o->checked && LD(o->state) == C4_COMM_LIVE && LD(o->hash) == LD(c->hash) &&
          LD(o->rank) == LD(c->rank))
        ST(c->muted, 1);
    c->checked = 1;
    pthread_mutex_unlock(&G.reg);
  }
  return !LD(c->muted);
}

static void unlink_comm(struct c4_comm *c) {
  for (struct c4_comm **p = &G.comms; *p != NULL; p = &(*p)->next)
    if (*p == c) {
      *p = c->next;
      break;
    }
}

static void *run(void *arg) {
  (void)arg;
  uint64_t next_emit = c4_now_ns() + G.interval_ns;
  for (;;) {
    pthread_mutex_lock(&G.reg);
    if (G.comms == NULL) { /* nothing to do until the next init */
      pthread_cond_wait(&G.cv, &G.reg);
      next_emit = c4_now_ns() + G.interval_ns;
    } else if (G.finals == 0) {
      uint64_t wake = c4_now_ns() + G.tick_ns;
      if (wake > next_emit) wake = next_emit;
      struct timespec ts = {(time_t)(wake / 1000000000u), (long)(wake % 1000000000u)};
      pthread_cond_timedwait(&G.cv, &G.reg, &ts);
    }
    size_t n = 0;
    for (struct c4_comm *c = G.comms; c != NULL; c = c->next) {
      if (n == G.snap_cap) {
        size_t cap = G.snap_cap ? 2 * G.snap_cap : 64;
        struct c4_comm **v = realloc(G.snap, cap * sizeof *v);
        if (v == NULL) break; /* the rest waits for the next tick */
        G.snap = v;
        G.snap_cap = cap;
      }
      G.snap[n++] = c;
    }
    pthread_mutex_unlock(&G.reg);
    uint64_t now = c4_now_ns();
    int emit_now = now >= next_emit;
    G.wait_left_ns = SEND_WAIT_NS;
    for (size_t i = 0; i < n; i++) {
      struct c4_comm *c = G.snap[i];
      switch (LD(c->state)) {
        case C4_COMM_LIVE:
          c4_sweep_awaiting(c, G.stall_ns);
          if (!reportable(c)) break;
          check_stall(c, now);
          if (emit_now) emit_summary(c, now, 0);
          break;
        case C4_COMM_FINALIZING: { /* NCCL has synchronised: what waits for children is done */
          c4_sweep_awaiting(c, 0);
          uint64_t left = G.wait_left_ns;
          G.wait_left_ns = 0; /* finalize waits for this: never for the agent */
          if (reportable(c)) emit_summary(c, now, C4W_FLAG_FINAL);
          G.wait_left_ns = left;
          c->closed_ns = now;
          pthread_mutex_lock(&G.reg);
          ST(c->state, C4_COMM_CLOSED);
          G.finals--;
          pthread_cond_broadcast(&G.closed_cv);
          pthread_mutex_unlock(&G.reg);
          break;
        }
        default:
          if (now - c->closed_ns < FREE_GRACE_NS) break;
          pthread_mutex_lock(&G.reg);
          unlink_comm(c);
          pthread_mutex_unlock(&G.reg);
          c4_comm_free(c);
          break;
      }
    }
    if (emit_now) {
      next_emit += G.interval_ns;
      if (next_emit <= now) next_emit = now + G.interval_ns;
    }
  }
  return NULL;
}

/* Keeps the library loaded for good: the thread runs on after NCCL's dlclose. */
static int pin_library(char *err, size_t errlen) {
  Dl_info info;
  if (dladdr((void *)&G, &info) == 0 || info.dli_fname == NULL ||
      dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD | RTLD_NODELETE) == NULL) {
    snprintf(err, errlen, "cannot pin the library: %s", dlerror());
    return -1;
  }
  return 0;
}

static int start_thread(const struct c4_config *cfg, char *err, size_t errlen) {
  memset(&G.addr, 0, sizeof G.addr);
  G.addr.sun_family = AF_UNIX;
  memcpy(G.addr.sun_path, cfg->socket, sizeof G.addr.sun_path);
  G.addr_len = (socklen_t)sizeof G.addr;
  G.interval_ms = cfg->interval_ms;
  G.interval_ns = (uint64_t)cfg->interval_ms * 1000000u;
  G.stall_ns = (uint64_t)cfg->stall_ms * 1000000u;
  G.tick_ns = G.stall_ns / 4 < TICK_MAX_NS ? G.stall_ns / 4 : TICK_MAX_NS;
  if (G.tick_ns < TICK_MIN_NS) G.tick_ns = TICK_MIN_NS;
  if (pin_library(err, errlen) != 0) return -1;
  G.fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  G.wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  if (G.fd < 0 || G.wakefd < 0) {
    snprintf(err, errlen, "%s: %s", G.fd < 0 ? "socket(AF_UNIX)" : "eventfd", strerror(errno));
    if (G.fd >= 0) close(G.fd);
    if (G.wakefd >= 0) close(G.wakefd);
    G.fd = G.wakefd = -1;
    return -1;
  }
  /* The thread must not take the application's signals. */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_t thread; /* detached: never joined */
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  int rc = pthread_create(&thread, &attr, run, NULL);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  if (rc != 0) {
    snprintf(err, errlen, "pthread_create: %s", strerror(rc));
    close(G.fd);
    close(G.wakefd);
    G.fd = G.wakefd = -1;
    return -1;
  }
  G.running = 1;
  return 0;
}

int c4_emitter_add(struct c4_comm *c, const struct c4_config *cfg, char *err, size_t errlen) {
  pthread_once(&G.cv_once, init_cv);
  pthread_mutex_lock(&G.life);
  int rc = G.running ? 0 : start_thread(cfg, err, errlen);
  if (rc == 0) {
    pthread_mutex_lock(&G.reg);
    int known = atomic_load_explicit(&c->known, memory_order_acquire) == 1;
    for (struct c4_comm *o = G.comms; known && o != NULL; o = o->next)
      if (LD(o->state) == C4_COMM_LIVE && LD(o->hash) == LD(c->hash) &&
          LD(o->rank) == LD(c->rank)) {
        snprintf(err, errlen, "this process already profiles rank %d of this communicator",
                 LD(c->rank));
        rc = -1;
        break;
      }
    if (rc == 0) {
      c->checked = known;
      c->last_emit_ns = c4_now_ns();
      c->next = G.comms;
      G.comms = c;
      pthread_cond_signal(&G.cv);
    }
    pthread_mutex_unlock(&G.reg);
  }
  pthread_mutex_unlock(&G.life);
  return rc;
}

struct c4_comm *c4_emitter_find(void *context, void **slot) {
  struct c4_comm *found = NULL;
  if (context == NULL) return NULL;
  pthread_mutex_lock(&G.reg);
  for (struct c4_comm *c = G.comms; c != NULL && found == NULL; c = c->next)
    if (c == context && LD(c->state) == C4_COMM_LIVE && (slot == NULL || c->slot == slot))
      found = c;
  pthread_mutex_unlock(&G.reg);
  return found;
}

void c4_emitter_remove(struct c4_comm *c) {
  pthread_mutex_lock(&G.reg);
  if (LD(c->state) == C4_COMM_LIVE) { /* not finalized twice */
    atomic_store_explicit(&c->finalizing, 1, memory_order_release);
    ST(c->state, C4_COMM_FINALIZING);
    G.finals++;
    pthread_cond_signal(&G.cv);
    uint64_t one = 1;
    if (write(G.wakefd, &one, sizeof one) < 0) { /* the counter is far from full */
    }
    /* Only as long as this thread computes summaries; the bound is a safety net. */
    uint64_t until = c4_now_ns() + CLOSE_WAIT_NS;
    struct timespec ts = {(time_t)(until / 1000000000u), (long)(until % 1000000000u)};
    while (LD(c->state) == C4_COMM_FINALIZING &&
           pthread_cond_timedwait(&G.closed_cv, &G.reg, &ts) == 0) {
    }
  }
  pthread_mutex_unlock(&G.reg);
}
