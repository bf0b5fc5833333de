/* Stress test of c4_read_progress (emit.c), the progress a summary reports: caller threads
 * start and complete collectives on one communicator as NCCL's threads do (Coll start and stop,
 * then a KernelCh child that completes it; or a copy-engine collective, complete at its stop)
 * while this thread reads progress as fast as it can. Every read must be one instant's:
 *  - never more completed than started, never more started and not completed than callers
 *    (each has one op open at a time);
 *  - an op in flight only while a collective is started and not completed, and one of those
 *    started (its 0-based seq below the started count);
 *  - some settled reads saw an op in flight (the reads overlapped the callers' work).
 * How many reads give up (counters only, after C4_PROGRESS_TRIES) depends on the machine's
 * speed (under ThreadSanitizer half of them did in CI): printed, not asserted.
 * A read in one pass (C4_PROGRESS_TRIES 1, counting every read as settled) breaks this within
 * a second on two cores.
 *
 *   progress [--seconds S] [--callers N]      exit status 0 when every read was consistent */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../src/emit.h"

#define RUN_NS 5000

static _Atomic int stop;

/* An op runs a while between its events (NCCL's run microseconds to seconds): a reader can
 * then find a quiet moment, as in a real process; events still land in most reads. */
static void spin(uint64_t ns) {
  uint64_t end = c4_now_ns() + ns;
  while (c4_now_ns() < end) {
  }
}

static void *caller(void *arg) {
  struct c4_comm *c = arg;
  for (uint64_t i = 0; !atomic_load_explicit(&stop, memory_order_relaxed); i++) {
    if (i % 4 == 3) { /* copy-engine: complete at its stop, no children */
      void *ce = c4_op_start(c, C4_OP_CE, "AllGather", "CE", "MC", "ncclFloat32", 256);
      spin(RUN_NS);
      c4_event_stop(ce);
    } else {
      void *op = c4_op_start(c, C4_OP_COLL, "AllReduce", "RING", "SIMPLE", "ncclFloat32", 256);
      c4_event_stop(op); /* enqueued: waits for its kernel */
      void *k = c4_kch_start(c, op);
      spin(RUN_NS);
      c4_event_stop(k); /* the kernel ended: complete */
    }
    spin(RUN_NS);
  }
  return NULL;
}

int main(int argc, char **argv) {
  double seconds = 1;
  int ncallers = 2;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!strcmp(argv[i], "--seconds")) seconds = atof(argv[i + 1]);
    else if (!strcmp(argv[i], "--callers")) ncallers = atoi(argv[i + 1]);
  }
  if (ncallers < 1 || ncallers > 64) return 2;
  struct c4_comm *c = c4_comm_new(0xc4a11ed0000c0de1ull, 1, 2, 0, 6, NULL);
  if (c == NULL) return 2;
  pthread_t t[64];
  for (int i = 0; i < ncallers; i++) pthread_create(&t[i], NULL, caller, c);
  uint64_t end = c4_now_ns() + (uint64_t)(seconds * 1e9), reads = 0, bad = 0, busy = 0,
           unsettled = 0;
  while (c4_now_ns() < end) {
    struct c4_progress p;
    if (!c4_read_progress(c, &p)) { /* gave up: counters only, read apart */
      unsettled++;
      if (p.completed > p.started && bad++ < 5) fprintf(stderr, "FAIL: completed > started\n");
      continue;
    }
    reads++;
    busy += p.has_op;
    int ok = p.completed <= p.started && p.started - p.completed <= (uint64_t)ncallers &&
             (!p.has_op || (p.started > p.completed && p.seq < p.started));
    if (!ok && bad++ < 5)
      fprintf(stderr, "FAIL: %" PRIu64 " started, %" PRIu64 " completed, in flight: %s %" PRIu64
                      "\n", p.started, p.completed, p.has_op ? "seq" : "none", p.seq);
  }
  atomic_store(&stop, 1);
  for (int i = 0; i < ncallers; i++) pthread_join(t[i], NULL);
  struct c4_progress p;
  c4_read_progress(c, &p);
  uint64_t done = p.completed;
  c4_comm_free(c);
  printf("progress: %" PRIu64 " reads (%" PRIu64 " with an op in flight, %" PRIu64
         " unsettled) during %" PRIu64 " collectives on %d threads, %" PRIu64 " inconsistent\n",
         reads, busy, unsettled, done, ncallers, bad);
  if (busy == 0) fprintf(stderr, "FAIL: no settled read saw an op in flight\n");
  return bad == 0 && busy > 0 && p.started == p.completed && !p.has_op ? 0 : 1;
}
