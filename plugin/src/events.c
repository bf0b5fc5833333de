/* The event path: called by NCCL's threads, never blocks, never allocates.
 *
 * Completion of an op is not its stop event (that only means "enqueued"): every ProxyOp and
 * KernelCh child holds a reference on its Coll/P2p, and the op completes when the last
 * reference goes, at the latest child stop. NCCL stops the op before its children start, so
 * an op stopped without children waits for them (`awaiting`); c4_sweep_awaiting() completes
 * it if a later op completes or gets children first (a communicator's ops run in order), or
 * if nothing of the communicator runs for a while (ops NCCL gives no children), and a whole
 * ring of later ops reuses its slot at the latest.
 *
 * op->refs: 1 until stop, plus one per attached child; -1 once the op is being completed, so
 * that a child can no longer attach to it (attach and completion race on the proxy thread,
 * the enqueuing thread and the background thread). */
#include <string.h>

#include "comm.h"

#define RELEASE memory_order_release
#define ACQUIRE memory_order_acquire
#define ACQ_REL memory_order_acq_rel

static inline void atomic_max(_Atomic uint64_t *a, uint64_t v) {
  uint64_t cur = atomic_load_explicit(a, memory_order_relaxed);
  while (cur < v && !atomic_compare_exchange_weak_explicit(a, &cur, v, memory_order_relaxed,
                                                           memory_order_relaxed)) {
  }
}

static inline void drop(struct c4_comm *c) { ADD(c->dropped_events, 1); }

static inline int wait_bucket(int state) {
  switch (state) {
    case C4_ST_SEND_WAIT:
    case C4_ST_RECV_WAIT: return C4_WAIT_NET;
    case C4_ST_SEND_PEER_WAIT: return C4_WAIT_PEER;
    case C4_ST_SEND_GPU_WAIT:
    case C4_ST_RECV_FLUSH_WAIT:
    case C4_ST_RECV_GPU_WAIT: return C4_WAIT_GPU;
    default: return -1;
  }
}

/* ---- (func, algo, proto) table ---- */

/* Names go out as short ASCII fields; a function name keeps letters only (the report schema
 * requires it), the others keep printable characters. */
static void copy_name(char *dst, const char *src, int letters_only) {
  size_t n = 0;
  for (; src != NULL && *src != '\0' && n < C4W_NAME - 1; src++) {
    char ch = *src;
    int ok = letters_only ? ((ch | 0x20) >= 'a' && (ch | 0x20) <= 'z') : (ch > ' ' && ch < 127);
    if (ok) dst[n++] = ch;
  }
  memset(dst + n, 0, C4W_NAME - n);
  if (letters_only && n == 0) memcpy(dst, "Unknown", 8);
}

static int kind_find(struct c4_comm *c, const char *f, const char *a, const char *p) {
  int i;
  for (i = 0; i < C4_MAX_KINDS; i++) { /* NCCL's strings are static: compare pointers */
    struct c4_kind *k = &c->kinds[i];
    uint32_t s = atomic_load_explicit(&k->state, ACQUIRE);
    if (s == C4_KIND_EMPTY) break;
    if (s == C4_KIND_READY && LD(k->func_p) == f && LD(k->algo_p) == a && LD(k->proto_p) == p)
      return i;
  }
  char fn[C4W_NAME], an[C4W_NAME], pn[C4W_NAME];
  copy_name(fn, f, 1);
  copy_name(an, a, 0);
  copy_name(pn, p, 0);
  for (i = 0; i < C4_MAX_KINDS; i++) {
    struct c4_kind *k = &c->kinds[i];
    uint32_t s = atomic_load_explicit(&k->state, ACQUIRE);
    if (s == C4_KIND_READY && !memcmp(k->func, fn, C4W_NAME) && !memcmp(k->algo, an, C4W_NAME) &&
        !memcmp(k->proto, pn, C4W_NAME))
      return i;
    if (s == C4_KIND_EMPTY) {
      uint32_t empty = C4_KIND_EMPTY;
      if (!atomic_compare_exchange_strong(&k->state, &empty, C4_KIND_FILLING)) continue;
      memcpy(k->func, fn, C4W_NAME);
      memcpy(k->algo, an, C4W_NAME);
      memcpy(k->proto, pn, C4W_NAME);
      ST(k->func_p, f);
      ST(k->algo_p, a);
      ST(k->proto_p, p);
      atomic_store_explicit(&k->state, C4_KIND_READY, RELEASE);
      return i;
    }
  }
  return -1;
}

/* ---- (peer, channel, dir) table: open addressing, entries are never removed ---- */

static struct c4_conn *conn_find(struct c4_comm *c, int peer, int channel, int is_send) {
  if (peer < 0 || peer >= LD(c->nranks) || channel < 0 || channel > 0x7ff) return NULL;
  uint64_t key = c4_conn_key(peer, channel, is_send);
  uint32_t h = (uint32_t)((key * 0x9E3779B97F4A7C15ull) >> 40);
  for (uint32_t n = 0; n < C4_MAX_CONNS; n++) {
    struct c4_conn *e = &c->conns[(h + n) & (C4_MAX_CONNS - 1)];
    uint64_t k = atomic_load_explicit(&e->key, ACQUIRE);
    if (k == 0 && atomic_compare_exchange_strong_explicit(&e->key, &k, key, ACQ_REL, ACQUIRE))
      return e;
    if (k == key) return e;
  }
  return NULL;
}

/* ---- Coll / P2p ---- */

static void op_finalize(struct c4_op *op, uint64_t end, uint64_t now);

/* Completes an op that waits for children it has not got: only if none attaches meanwhile. */
static int op_close_awaiting(struct c4_op *op, uint64_t end, uint64_t now) {
  int32_t zero = 0;
  if (!LD(op->awaiting) ||
      !atomic_compare_exchange_strong_explicit(&op->refs, &zero, -1, ACQ_REL, ACQUIRE))
    return 0;
  op_finalize(op, end, now);
  return 1;
}

void *c4_op_start(struct c4_comm *c, int kind, const char *func, const char *algo,
                  const char *proto, const char *dtype, size_t count) {
  struct c4_op *op = &c->ops[ADD(c->op_next, 1) & (C4_MAX_OPS - 1)];
  uint64_t now = c4_now_ns();
  uint32_t s = atomic_load_explicit(&op->state, ACQUIRE);
  if (s == C4_OP_LIVE && op_close_awaiting(op, LD(op->stop_ns), now))
    s = atomic_load_explicit(&op->state, ACQUIRE); /* a whole ring later no child came */
  if ((s != C4_OP_FREE && s != C4_OP_DONE) ||
      !atomic_compare_exchange_strong_explicit(&op->state, &s, C4_OP_FILLING, ACQ_REL, ACQUIRE)) {
    drop(c); /* the ring is full of incomplete ops */
    return NULL;
  }
  int is_coll = kind != C4_OP_P2P;
  op->h.type = C4_OBJ_OP;
  op->comm = c;
  ST(op->is_coll, (uint32_t)is_coll);
  ST(op->is_ce, (uint32_t)(kind == C4_OP_CE));
  ST(op->kind, kind_find(c, func, algo, proto));
  /* Counted before the op is LIVE (the release below): a reader that sees the op LIVE sees it
   * counted; one that sees it counted and not yet LIVE retries (emit.c, c4_read_progress). */
  ST(op->seq, is_coll ? ADD(c->seq_started, 1) : LD(c->seq_started));
  ST(op->opn, ADD(c->opn_next, 1));
  ST(op->bytes, (uint64_t)count * c4_dtype_size(dtype, c->version));
  ST(op->start_ns, now);
  ST(op->stop_ns, 0);
  ST(op->children, 0);
  ST(op->moved, 0);
  ST(op->awaiting, 0);
  ST(op->end_ns, 0);
  ST(op->first_move_ns, 0);
  atomic_store_explicit(&op->refs, 1, RELEASE);
  ADD(c->ops_live, 1);
  atomic_store_explicit(&op->state, C4_OP_LIVE, RELEASE);
  return op;
}

static void op_finalize(struct c4_op *op, uint64_t end, uint64_t now) {
  struct c4_comm *c = op->comm;
  uint64_t start = LD(op->start_ns), first_move = LD(op->first_move_ns), opn = LD(op->opn);
  uint64_t bytes = LD(op->bytes);
  int32_t kind = LD(op->kind), moved = LD(op->moved);
  uint32_t is_coll = LD(op->is_coll), is_ce = LD(op->is_ce), live = C4_OP_LIVE;
  if (!atomic_compare_exchange_strong_explicit(&op->state, &live, C4_OP_DONE, ACQ_REL, ACQUIRE))
    return; /* someone else completed it */
  if (atomic_exchange_explicit(&op->awaiting, 0, memory_order_relaxed))
    atomic_fetch_sub_explicit(&c->awaiting, 1, memory_order_relaxed);
  if (kind >= 0) {
    struct c4_kind *k = &c->kinds[kind];
    ADD(k->count, 1);
    ADD(k->bytes, bytes);
    ADD(k->time_ns, end > start ? end - start : 0);
  }
  if (moved > 0 && first_move > start) {
    ADD(c->entry_wait_ns, first_move - start);
    ADD(c->entry_ops, 1);
  }
  /* Release: a reader that counts this completion sees the op DONE (emit.c, c4_read_progress). */
  if (is_coll) atomic_fetch_add_explicit(&c->seq_completed, 1, RELEASE);
  if (!is_ce) { /* a copy-engine op "completes" when enqueued: neither order nor progress */
    atomic_max(&c->max_done_opn, opn + 1);
    ST(c->last_done_ns, end);
    ST(c->last_progress_ns, now);
  }
  atomic_fetch_sub_explicit(&c->ops_live, 1, memory_order_relaxed);
}

/* The last reference is gone (refs is 0). */
static void op_release(struct c4_op *op, uint64_t now) {
  struct c4_comm *c = op->comm;
  int32_t children = LD(op->children), zero = 0;
  if (children == 0 && LD(c->expect_children) && !LD(op->is_ce)) {
    if (!atomic_exchange_explicit(&op->awaiting, 1, memory_order_relaxed)) ADD(c->awaiting, 1);
    return;
  }
  if (!atomic_compare_exchange_strong_explicit(&op->refs, &zero, -1, ACQ_REL, ACQUIRE))
    return; /* a late child attached: its stop completes the op */
  op_finalize(op, children ? LD(op->end_ns) : LD(op->stop_ns), now);
}

static inline void op_unref(struct c4_op *op, uint64_t now) {
  if (atomic_fetch_sub_explicit(&op->refs, 1, ACQ_REL) == 1) op_release(op, now);
}

/* A child of `parent` starts on communicator c. The parent is a handle c4 returned for c
 * (NCCL's own), or NULL; NULL if it cannot be attached (completed: an orphan). */
static struct c4_op *op_attach(struct c4_comm *c, void *parent) {
  struct c4_op *op = parent;
  if (op == NULL || op->h.type != C4_OBJ_OP || op->comm != c) return NULL;
  if (!LD(c->expect_children)) ST(c->expect_children, 1);
  int32_t r = atomic_load_explicit(&op->refs, ACQUIRE);
  do {
    if (r < 0 || atomic_load_explicit(&op->state, ACQUIRE) != C4_OP_LIVE) return NULL;
  } while (!atomic_compare_exchange_weak_explicit(&op->refs, &r, r + 1, ACQ_REL, ACQUIRE));
  ADD(op->children, 1);
  atomic_max(&c->max_child_opn, LD(op->opn) + 1);
  return op;
}

static void child_done(struct c4_op *op, uint64_t end, uint64_t now) {
  atomic_max(&op->end_ns, end);
  op_unref(op, now);
}

/* Is anything of the communicator running: an op with attached children, a proxy op? */
static int comm_busy(struct c4_comm *c) {
  for (int i = 0; i < C4_MAX_OPS; i++) {
    struct c4_op *op = &c->ops[i];
    if (atomic_load_explicit(&op->state, ACQUIRE) == C4_OP_LIVE && LD(op->children) > 0 &&
        LD(op->refs) > 0)
      return 1;
  }
  uint32_t n = c4_pool_used(&c->proxy_ops);
  for (uint32_t i = 0; i < n; i++)
    if (atomic_load_explicit(&c4_pool_at(&c->proxy_ops, i)->live, ACQUIRE)) return 1;
  return 0;
}

void c4_sweep_awaiting(struct c4_comm *c, uint64_t await_ns) {
  if (LD(c->awaiting) == 0) return;
  uint64_t done = LD(c->max_done_opn), child = LD(c->max_child_opn), now = c4_now_ns();
  int busy = -1;
  for (int i = 0; i < C4_MAX_OPS; i++) {
    struct c4_op *op = &c->ops[i];
    if (atomic_load_explicit(&op->state, ACQUIRE) != C4_OP_LIVE || !LD(op->awaiting)) continue;
    uint64_t opn = LD(op->opn) + 1, stop = LD(op->stop_ns);
    if (opn < done) /* a later op completed */
      op_close_awaiting(op, LD(c->last_done_ns), now);
    else if (opn < child) /* a later op's kernel or proxy started: this one has ended */
      op_close_awaiting(op, stop, now);
    else if (now - stop > await_ns && (busy < 0 ? (busy = comm_busy(c)) : busy) == 0)
      op_close_awaiting(op, stop, now); /* nothing runs: NCCL gave it no children */
  }
}

/* ---- ProxyOp / ProxyStep / KernelCh ---- */

void *c4_proxy_op_start(struct c4_comm *c, void *parent, int peer, int channel, int is_send) {
  struct c4_proxy_op *p = c4_pool_get(&c->proxy_ops);
  if (p == NULL) {
    drop(c);
    return NULL;
  }
  c4_comm_saw_rank(c, peer);
  struct c4_conn *conn = conn_find(c, peer, channel, is_send);
  if (conn == NULL) drop(c); /* tracked for stalls, its traffic is not accounted */
  p->h.type = C4_OBJ_PROXY_OP;
  p->comm = c;
  p->parent = op_attach(c, parent);
  p->first_move_ns = 0;
  p->op_bytes = 0;
  ST(p->conn, conn);
  ST(p->last_ns, c4_now_ns());
  atomic_store_explicit(&p->h.live, 1, RELEASE);
  return p;
}

void *c4_step_start(void *parent, int step) {
  struct c4_proxy_op *p = parent;
  struct c4_step *s;
  if (p == NULL || p->h.type != C4_OBJ_PROXY_OP) return NULL;
  struct c4_comm *c = p->comm;
  if (LD(c->finalizing)) return NULL;
  if ((s = c4_pool_get(&c->steps)) == NULL) {
    drop(c);
    return NULL;
  }
  s->h.type = C4_OBJ_STEP;
  ST(s->pop, p);
  ST(s->state, 0);
  ST(s->stepno, step);
  s->trans = 0;
  memset(s->wait_ns, 0, sizeof s->wait_ns);
  atomic_store_explicit(&s->h.live, 1, RELEASE);
  return s;
}

void *c4_kch_start(struct c4_comm *c, void *parent) {
  struct c4_op *op = op_attach(c, parent);
  if (op == NULL) return NULL; /* nothing to complete: untracked */
  struct c4_kch *k = c4_pool_get(&c->kchs);
  if (k == NULL) {
    drop(c);
    op_unref(op, c4_now_ns());
    return NULL;
  }
  k->h.type = C4_OBJ_KCH;
  k->parent = op;
  k->end_ns = 0;
  ST(c->last_progress_ns, c4_now_ns()); /* the kernel started */
  atomic_store_explicit(&k->h.live, 1, RELEASE);
  return k;
}

/* Attribute the time spent in the step's current state. */
static inline void step_account(struct c4_step *s, struct c4_proxy_op *p, uint64_t now) {
  int b = wait_bucket(LD(s->state));
  if (b < 0) return;
  s->wait_ns[b] += now - LD(s->state_ns);
  if (b == C4_WAIT_NET && p->first_move_ns == 0) { /* first data through the network */
    p->first_move_ns = now;
    if (p->parent != NULL) {
      atomic_max(&p->parent->first_move_ns, now);
      ADD(p->parent->moved, 1);
    }
  }
}

static void step_state(struct c4_step *s, int state, size_t trans) {
  uint64_t now = c4_now_ns();
  struct c4_proxy_op *p = LD(s->pop);
  step_account(s, p, now);
  /* NCCL passes its last transfer size with every state; it is this step's when it is set:
   * at SendWait (sent) and RecvFlushWait (received). */
  if (trans != 0 && (state == C4_ST_SEND_WAIT || state == C4_ST_RECV_FLUSH_WAIT)) s->trans = trans;
  ST(s->state, state);
  ST(s->state_ns, now);
  ST(p->last_ns, now);
  ST(p->comm->last_progress_ns, now);
}

static void step_stop(struct c4_step *s) {
  uint64_t now = c4_now_ns();
  struct c4_proxy_op *p = LD(s->pop);
  struct c4_comm *c = p->comm;
  step_account(s, p, now);
  struct c4_conn *conn = LD(p->conn);
  if (conn != NULL) {
    if (s->trans) ADD(conn->bytes, s->trans);
    ADD(conn->steps, 1);
    for (int b = 0; b < C4_NWAIT; b++)
      if (s->wait_ns[b]) ADD(conn->wait_ns[b], s->wait_ns[b]);
  }
  ST(p->last_ns, now);
  ST(c->last_progress_ns, now);
  atomic_store_explicit(&s->h.live, 0, RELEASE);
  c4_pool_put(&c->steps, s);
}

static void proxy_op_stop(struct c4_proxy_op *p) {
  uint64_t now = c4_now_ns();
  struct c4_conn *conn = LD(p->conn);
  if (conn != NULL && p->op_bytes) ADD(conn->bytes, p->op_bytes); /* v3 */
  if (p->parent != NULL) child_done(p->parent, now, now);
  atomic_store_explicit(&p->h.live, 0, RELEASE);
  c4_pool_put(&p->comm->proxy_ops, p);
}

static void kch_stop(struct c4_kch *k) {
  struct c4_comm *c = k->parent->comm;
  uint64_t now = c4_now_ns();
  ST(c->last_progress_ns, now);
  child_done(k->parent, k->end_ns ? k->end_ns : now, now);
  atomic_store_explicit(&k->h.live, 0, RELEASE);
  c4_pool_put(&c->kchs, k);
}

/* The communicator of a handle c4 returned. */
static struct c4_comm *comm_of(struct c4_obj *o) {
  switch (o->type) {
    case C4_OBJ_OP: return ((struct c4_op *)o)->comm;
    case C4_OBJ_PROXY_OP: return ((struct c4_proxy_op *)o)->comm;
    case C4_OBJ_STEP: return LD(((struct c4_step *)o)->pop)->comm;
    case C4_OBJ_KCH: return ((struct c4_kch *)o)->parent->comm;
    default: return NULL;
  }
}

void c4_event_stop(void *handle) {
  struct c4_obj *o = handle;
  if (o == NULL) return;
  struct c4_comm *c = comm_of(o);
  if (c == NULL || LD(c->finalizing)) return; /* its final summary is out: leave it as is */
  switch (o->type) {
    case C4_OBJ_STEP: step_stop(handle); break;
    case C4_OBJ_PROXY_OP: proxy_op_stop(handle); break;
    case C4_OBJ_KCH: kch_stop(handle); break;
    case C4_OBJ_OP: {
      struct c4_op *op = handle;
      uint64_t now = c4_now_ns();
      ST(op->stop_ns, now);
      op_unref(op, now);
      break;
    }
    default: break;
  }
}

void c4_event_state(void *handle, int state, size_t trans) {
  struct c4_obj *o = handle;
  if (o == NULL) return;
  struct c4_comm *c = comm_of(o);
  if (c == NULL || LD(c->finalizing)) return;
  if (o->type == C4_OBJ_STEP) {
    step_state(handle, state, trans);
  } else if (o->type == C4_OBJ_KCH && state == C4_ST_KERNEL_CH_STOP) {
    ((struct c4_kch *)handle)->end_ns = c4_now_ns();
  } else if (o->type == C4_OBJ_PROXY_OP && state >= C4_ST_PROXY_OP_SEND_POSTED &&
             state <= C4_ST_PROXY_OP_RECV_DONE) { /* v3: the op's cumulative bytes */
    struct c4_proxy_op *p = handle;
    if (trans > p->op_bytes) p->op_bytes = trans;
    ST(p->last_ns, c4_now_ns());
  }
}
