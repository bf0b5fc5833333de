/* Communicator lifetime, the clock, NCCL datatype sizes. */
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "comm.h"

uint64_t c4_now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Names as NCCL's profiler passes them (ncclDatatypeToString). NCCL 2.26 - 2.30 (profiler
 * v3 - v6) have no case for ncclUint8 and pass "Unknown" for it, and for nothing else they
 * can send; "ncclUint8" is accepted for a release that adds it. Others: 0 (bytes unknown). */
size_t c4_dtype_size(const char *name, int version) {
  static const struct { const char *name; size_t size; } types[] = {
      {"ncclFloat32", 4}, {"ncclBfloat16", 2}, {"ncclFloat16", 2}, {"ncclInt32", 4},
      {"ncclUint32", 4},  {"ncclInt64", 8},    {"ncclUint64", 8},  {"ncclFloat64", 8},
      {"ncclInt8", 1},    {"ncclUint8", 1},    {"ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", 1},
  };
  if (name == NULL) return 0;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strcmp(name, types[i].name) == 0) return types[i].size;
  if (version >= 3 && version <= 6 && strcmp(name, "Unknown") == 0) return 1; /* ncclUint8 */
  return 0;
}

struct c4_comm *c4_comm_new(uint64_t hash, int nnodes, int nranks, int rank, int version,
                            c4_nccl_logger_t log) {
  struct c4_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  atomic_init(&c->hash, hash);
  c->nnodes = nnodes;
  c->version = version;
  atomic_init(&c->nranks, nranks);
  atomic_init(&c->rank, rank);
  atomic_init(&c->known, version > 3);
  c->log = log;
  /* Every Coll and P2p gets children: NCCL (2.26+) starts a KernelCh per channel from its proxy
   * thread when KernelCh is in the mask, which c4 always asks for, and ProxyOps where data
   * crosses the network. Both come after the op's stop ("enqueued"), so an op waits for them;
   * ops that never get any (symmetric or AllGatherV kernels) are completed by
   * c4_sweep_awaiting(). */
  atomic_init(&c->expect_children, 1);
  c->ops = c4_zalloc(C4_MAX_OPS * sizeof *c->ops);
  c->conns = c4_zalloc(C4_MAX_CONNS * sizeof *c->conns);
  c->conns_prev = c4_zalloc(C4_MAX_CONNS * sizeof *c->conns_prev);
  int err = c4_pool_init(&c->proxy_ops, C4_MAX_PROXY_OPS, sizeof(struct c4_proxy_op));
  err |= c4_pool_init(&c->steps, C4_MAX_STEPS, sizeof(struct c4_step));
  err |= c4_pool_init(&c->kchs, C4_MAX_KCH, sizeof(struct c4_kch));
  if (err || c->ops == NULL || c->conns == NULL || c->conns_prev == NULL) {
    c4_comm_free(c);
    return NULL;
  }
  return c;
}

void c4_comm_learn(struct c4_comm *c, uint64_t hash, int rank) {
  if (rank < 0 || rank >= (1 << 24)) return;
  c4_comm_saw_rank(c, rank);
  uint32_t no = 0; /* a plain load first: every later Coll/P2p skips the locked RMW */
  if (atomic_load_explicit(&c->known, memory_order_relaxed) != 0 ||
      !atomic_compare_exchange_strong(&c->known, &no, 2))
    return; /* known, or being learned */
  atomic_store_explicit(&c->hash, hash, memory_order_relaxed);
  atomic_store_explicit(&c->rank, rank, memory_order_relaxed);
  atomic_store_explicit(&c->known, 1, memory_order_release);
}

void c4_comm_free(struct c4_comm *c) {
  if (c == NULL) return;
  c4_pool_free(&c->proxy_ops);
  c4_pool_free(&c->steps);
  c4_pool_free(&c->kchs);
  c4_zfree(c->ops, C4_MAX_OPS * sizeof *c->ops);
  c4_zfree(c->conns, C4_MAX_CONNS * sizeof *c->conns);
  c4_zfree(c->conns_prev, C4_MAX_CONNS * sizeof *c->conns_prev);
  free(c);
}
