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

/* Names as NCCL's profiler passes them (ncclDatatypeToString). Unknown: 0 (bytes unknown). */
size_t c4_dtype_size(const char *name) {
  static const struct { const char *name; size_t size; } types[] = {
      {"ncclFloat32", 4}, {"ncclBfloat16", 2}, {"ncclFloat16", 2}, {"ncclInt32", 4},
      {"ncclUint32", 4},  {"ncclInt64", 8},    {"ncclUint64", 8},  {"ncclFloat64", 8},
      {"ncclInt8", 1},    {"ncclUint8", 1},    {"ncclFloat8e4m3", 1}, {"ncclFloat8e5m2", 1},
  };
  if (name == NULL) return 0;
  for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
    if (strcmp(name, types[i].name) == 0) return types[i].size;
  return 0;
}

struct c4_comm *c4_comm_new(uint64_t hash, int nnodes, int nranks, int rank,
                            c4_nccl_logger_t log) {
  struct c4_comm *c = calloc(1, sizeof *c);
  if (c == NULL) return NULL;
  c->hash = hash;
  c->nnodes = nnodes;
  c->nranks = nranks;
  c->rank = rank;
  c->log = log;
  /* Multi-node communicators move data through proxy ops: an op stopped before any of its
   * proxy ops started must wait for them rather than complete at "enqueued". */
  atomic_init(&c->expect_children, nnodes > 1);
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
