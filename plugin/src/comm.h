/* Per-communicator state: preallocated event objects and cumulative counters.
 *
 * Threads: NCCL starts/stops Coll and P2p events on the thread that runs the plan's host task
 * (the application thread or CUDA's host-callback thread), copy-engine collectives (v6) on the
 * application thread, and ProxyOp, ProxyStep and KernelCh on its proxy progress thread. None
 * of them ever waits for another or for the background thread (emit.c): objects come from
 * lock-free pools, counters are relaxed atomics, and the background thread only reads them and
 * diffs against its own snapshot (`*_prev`, touched by it alone).
 *
 * Lifetime: finalize only marks a communicator (`finalizing`); events that still arrive for it
 * are ignored, and its memory is freed later by the background thread (emit.c), so a late
 * event never touches freed memory. */
#ifndef C4_PLUGIN_COMM_H
#define C4_PLUGIN_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "abi.h"
#include "pool.h"
#include "wire.h"

#define C4_MAX_OPS 1024 /* Coll/P2p ring, power of two */
#define C4_MAX_PROXY_OPS 2048
#define C4_MAX_STEPS 8192
#define C4_MAX_KCH 1024
#define C4_MAX_CONNS 2048 /* (peer, channel, dir) table, power of two */
#define C4_MAX_KINDS 64   /* (func, algo, proto) combinations */

#define LD(x) atomic_load_explicit(&(x), memory_order_relaxed)
#define ST(x, v) atomic_store_explicit(&(x), (v), memory_order_relaxed)
#define ADD(x, v) atomic_fetch_add_explicit(&(x), (v), memory_order_relaxed)

enum c4_obj_type { C4_OBJ_OP = 1, C4_OBJ_PROXY_OP, C4_OBJ_STEP, C4_OBJ_KCH };
enum c4_op_state { C4_OP_FREE = 0, C4_OP_FILLING, C4_OP_LIVE, C4_OP_DONE };
enum c4_wait { C4_WAIT_NET, C4_WAIT_PEER, C4_WAIT_GPU, C4_NWAIT };

struct c4_comm;

/* A Coll or P2p operation. Slots are reused in ring order, so a late child that refers to a
 * completed op still finds valid memory (it sees C4_OP_DONE and counts as an orphan). */
struct c4_op {
  struct c4_obj h;
  struct c4_comm *comm;
  _Atomic uint32_t state; /* c4_op_state */
  _Atomic uint32_t is_coll;
  _Atomic uint32_t is_ce;  /* copy-engine collective (v6): complete at stop, not progress */
  _Atomic int32_t kind;   /* index in comm->kinds, -1 if the table is full */
  _Atomic uint64_t seq;   /* collective ordinal on this communicator */
  _Atomic uint64_t opn;   /* ordinal among all ops (Coll and P2p) */
  _Atomic uint64_t bytes;
  _Atomic uint64_t start_ns;
  _Atomic uint64_t stop_ns;  /* Coll/P2p stop: enqueued, not completed */
  _Atomic int32_t refs;      /* 1 until stop + one per live child */
  _Atomic int32_t children;  /* ProxyOp/KernelCh ever attached */
  _Atomic int32_t moved;     /* proxy ops that moved data */
  _Atomic uint32_t awaiting; /* stopped with no child yet while children are expected */
  _Atomic uint64_t end_ns;   /* latest child stop */
  _Atomic uint64_t first_move_ns; /* latest first data movement over its proxy ops */
};

struct c4_conn {
  _Atomic uint64_t key; /* 0 = empty, else c4_conn_key() */
  _Atomic uint64_t bytes;
  _Atomic uint64_t steps;
  _Atomic uint64_t wait_ns[C4_NWAIT];
};

struct c4_conn_prev {
  uint64_t bytes, steps, wait_ns[C4_NWAIT];
};

struct c4_proxy_op {
  struct c4_obj h;
  struct c4_comm *comm;
  struct c4_op *parent;       /* NULL when the op is untracked */
  _Atomic(struct c4_conn *) conn; /* NULL when the peer is invalid or the table is full */
  _Atomic uint64_t last_ns;   /* last step activity */
  uint64_t first_move_ns;     /* proxy thread only */
  uint64_t op_bytes;          /* v3: the op's cumulative transSize from its ProxyOp states */
};

struct c4_step {
  struct c4_obj h;
  _Atomic(struct c4_proxy_op *) pop;
  _Atomic int32_t state; /* current c4_nccl_state_t, 0 before the first */
  _Atomic int32_t stepno;
  _Atomic uint64_t state_ns;
  uint64_t trans;               /* bytes, from the state arguments */
  uint64_t wait_ns[C4_NWAIT];   /* accumulated, flushed to the conn at stop */
};

struct c4_kch {
  struct c4_obj h;
  struct c4_op *parent;
  uint64_t end_ns; /* KernelChStop state, if recorded */
};

enum { C4_KIND_EMPTY = 0, C4_KIND_FILLING, C4_KIND_READY };

struct c4_kind {
  _Atomic uint32_t state;
  _Atomic(const char *) func_p, algo_p, proto_p; /* NCCL's (static) strings: fast path */
  char func[C4W_NAME], algo[C4W_NAME], proto[C4W_NAME];
  _Atomic uint64_t count, bytes, time_ns;
};

struct c4_kind_prev {
  uint64_t count, bytes, time_ns;
};

enum c4_comm_state { C4_COMM_LIVE = 0, C4_COMM_FINALIZING, C4_COMM_CLOSED };

struct c4_comm {
  /* Identity. v3 (NCCL 2.26) does not pass it to init: it is learned from the first Coll/P2p
   * (hash, rank) and grows with the peers seen (nranks), and reported only once `known`. */
  _Atomic uint64_t hash;
  _Atomic int32_t rank, nranks;
  int nnodes, version;
  _Atomic uint32_t known;
  c4_nccl_logger_t log;
  _Atomic uint32_t finalizing; /* set by finalize: events are ignored from then on */
  _Atomic uint32_t muted;      /* another live communicator has the same (hash, rank) */

  struct c4_op *ops;
  _Atomic uint64_t op_next;
  struct c4_pool proxy_ops, steps, kchs;
  struct c4_conn *conns;
  struct c4_kind kinds[C4_MAX_KINDS];

  _Atomic uint64_t seq_started, seq_completed, opn_next;
  _Atomic uint64_t max_done_opn, last_done_ns;
  _Atomic uint64_t entry_wait_ns, entry_ops;
  _Atomic uint64_t dropped_events;
  _Atomic uint64_t last_progress_ns;
  _Atomic uint64_t max_child_opn; /* 1 + the highest op ordinal a child attached to */
  _Atomic uint32_t ops_live, awaiting, expect_children;

  /* Registry (emit.c): `state` and `next` under its lock; the rest is the background
   * thread's alone. */
  _Atomic int state; /* enum c4_comm_state */
  uint64_t closed_ns;
  struct c4_conn_prev *conns_prev;
  struct c4_kind_prev kinds_prev[C4_MAX_KINDS];
  uint64_t entry_wait_prev, entry_ops_prev;
  uint64_t msg_seq, last_emit_ns, stall_mark;
  int checked; /* for another live communicator with the same (hash, rank) */
  void **slot;  /* where init put this context: a stale pointer elsewhere may equal a reused one */
  struct c4_comm *next;
};

uint64_t c4_now_ns(void);
/* Bytes per element of NCCL's datatype name, as profiler version `version` passes it. */
size_t c4_dtype_size(const char *name, int version);

struct c4_comm *c4_comm_new(uint64_t hash, int nnodes, int nranks, int rank, int version,
                            c4_nccl_logger_t log);
void c4_comm_free(struct c4_comm *c);
/* v3: learns the communicator from a Coll/P2p descriptor, and its size from the ranks seen. */
void c4_comm_learn(struct c4_comm *c, uint64_t hash, int rank);
static inline void c4_comm_saw_rank(struct c4_comm *c, int r) {
  int32_t n = atomic_load_explicit(&c->nranks, memory_order_relaxed);
  while (r >= n && r < (1 << 24) &&
         !atomic_compare_exchange_weak_explicit(&c->nranks, &n, r + 1, memory_order_relaxed,
                                                memory_order_relaxed)) {
  }
}

/* Event path (events.c). Start functions return the handle, NULL if untracked. */
enum { C4_OP_P2P = 0, C4_OP_COLL = 1, C4_OP_CE = 2 };
void *c4_op_start(struct c4_comm *c, int kind, const char *func, const char *algo,
                  const char *proto, const char *dtype, size_t count);
/* Only for proxy ops of this process: PXN ops of another one are filtered out before. */
void *c4_proxy_op_start(struct c4_comm *c, void *parent, int peer, int channel, int is_send);
/* The comm is the proxy op's, never the context NCCL passes with the step. */
void *c4_step_start(void *parent, int step);
void *c4_kch_start(struct c4_comm *c, void *parent);
void c4_event_stop(void *handle);
/* trans: the transfer size the state arguments carry (0 if none). */
void c4_event_state(void *handle, int state, size_t trans);
/* Completes ops left waiting for children once a later op completed or got children
 * (in-order streams), or once nothing of the communicator has run for await_ns. */
void c4_sweep_awaiting(struct c4_comm *c, uint64_t await_ns);

static inline uint64_t c4_conn_key(int peer, int channel, int is_send) {
  return 1 + ((uint64_t)(uint32_t)peer << 12 | (uint64_t)(channel & 0x7ff) << 1 | !is_send);
}
static inline int c4_key_peer(uint64_t k) { return (int)((k - 1) >> 12); }
static inline int c4_key_channel(uint64_t k) { return (int)(((k - 1) >> 1) & 0x7ff); }
static inline int c4_key_dir(uint64_t k) { return (int)((k - 1) & 1); } /* C4W_SEND/RECV */

#endif
