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
 * Returns 0, or -1 with a reason in err. */
int c4_emitter_add(struct c4_comm *c, const struct c4_config *cfg, char *err, size_t errlen);
/* Sends the communicator's final summary and unregisters it; the last one stops the thread
 * (NCCL may dlclose the plugin after the last finalize). */
void c4_emitter_remove(struct c4_comm *c);

#endif
