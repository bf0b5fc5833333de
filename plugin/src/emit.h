/* The per-process background thread: summaries every interval, stall checks every tick. */
#ifndef C4_PLUGIN_EMIT_H
#define C4_PLUGIN_EMIT_H

#include <stddef.h>
#include <stdint.h>
#include <sys/un.h>

#include "comm.h"

struct c4_config {
  char socket[sizeof(((struct sockaddr_un *)0)->sun_path)];
  uint32_t interval_ms;
  uint32_t stall_ms;
};

/* Registers a communicator, starting the thread and the socket with the first one.
 * Returns 0, or -1 with a reason in err (also when the process already profiles the same
 * (communicator, rank)). */
int c4_emitter_add(struct c4_comm *c, const struct c4_config *cfg, char *err, size_t errlen);
/* `context` if it is a registered live communicator, else NULL. With `slot`, only if init put
 * it there: freed memory is reused, so an address alone may name a newer communicator. */
struct c4_comm *c4_emitter_find(void *context, void **slot);
/* Finalizes: events are ignored from now on, the thread sends the final summary (without
 * waiting for the agent) and frees the state later. Waits for that hand-off only, at most
 * CLOSE_WAIT_NS (emit.c), never for the agent. */
void c4_emitter_remove(struct c4_comm *c);

/* A summary's progress as of one instant: the collectives started and completed and the op in
 * flight. Counters and op ring change apart (a collective is counted as started before its op
 * is LIVE and as completed after it is DONE) and ops start and end while the ring is scanned,
 * so a read in one pass can say 272 started, 271 completed and nothing in flight, or name an
 * op the counters do not count. Re-read until consistent (returns 1), at most
 * C4_PROGRESS_TRIES times (an op's events take microseconds, its run milliseconds); past that
 * (returns 0) the last counters stand, with no op in flight. */
#define C4_PROGRESS_TRIES 64
struct c4_progress {
  uint64_t started, completed;
  int has_op; /* the oldest op in flight: */
  uint64_t seq, start_ns;
  int32_t kind;
};
int c4_read_progress(struct c4_comm *c, struct c4_progress *p);

#endif
