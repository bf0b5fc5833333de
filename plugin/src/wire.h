/* Datagrams from the plugin to the c4 agent (docs/plugin.md, "Datagram format").
 * Little-endian, fixed layout, no padding left to the compiler: agent/plugin_proto.py decodes
 * it with `struct`. A message is one or more datagrams ("parts") sharing `msg_seq`; each part
 * is self-describing (header + block + its own records) and stays below C4W_MAX_DGRAM. */
#ifndef C4_PLUGIN_WIRE_H
#define C4_PLUGIN_WIRE_H

#include <stdint.h>

#if __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "the datagram format is little-endian; add byte swapping for this target"
#endif

#define C4W_MAGIC 0x504e3443u /* bytes "C4NP" */
#define C4W_VERSION 1
#define C4W_MAX_DGRAM 61440
#define C4W_NAME 16 /* NUL-padded name fields */

enum { C4W_SUMMARY = 1, C4W_STALLED = 2 };
enum { C4W_FLAG_FINAL = 1 }; /* last summary of a finalized communicator */
enum { C4W_SEND = 0, C4W_RECV = 1 };
enum { C4W_STATE_NONE = 0 }; /* waiting record: op active, no step in a known state */

struct c4w_header {
  uint32_t magic;
  uint16_t version;
  uint8_t type;
  uint8_t flags;
  uint32_t pid;    /* getpid() in the sender's namespace */
  uint32_t rank;
  uint32_t nranks;
  uint16_t part;   /* 0 .. nparts-1 */
  uint16_t nparts;
  uint64_t comm;   /* communicator hash */
  uint64_t msg_seq;     /* per communicator, +1 per message */
  uint64_t wall_ns;     /* CLOCK_REALTIME at send, informational */
  uint32_t interval_ms; /* the plugin's summary interval */
  uint32_t nnodes;      /* 0: unknown (NCCL 2.26, profiler v3: nranks is then the highest rank
                           seen + 1, a lower bound) */
  uint64_t dgram_drops; /* datagrams this process could not send, cumulative */
};

struct c4w_summary {
  uint64_t seq_started;   /* collectives started, cumulative (a count) */
  uint64_t seq_completed; /* collectives completed, cumulative (a count) */
  uint64_t dropped_events;
  uint64_t span_ns;       /* time covered by the interval fields */
  uint64_t entry_wait_ns; /* interval */
  uint32_t entry_ops;     /* interval */
  uint16_t ncolls;        /* c4w_coll records in this part */
  uint16_t npeers;        /* c4w_peer records in this part, after the colls */
  uint64_t inflight_seq;  /* 0-based ordinal of the oldest incomplete op: the first collective is
                             0, so with k completed in order the one in flight is k */
  uint64_t inflight_age_ns;
  uint64_t progress_age_ns;
  char inflight_func[C4W_NAME];
  uint8_t has_inflight;
  uint8_t pad[7];
};

struct c4w_coll {
  char func[C4W_NAME];
  char algo[C4W_NAME];
  char proto[C4W_NAME];
  uint64_t count;
  uint64_t bytes;
  uint64_t time_ns;
};

struct c4w_peer {
  uint32_t peer;
  uint16_t channel;
  uint8_t dir; /* C4W_SEND / C4W_RECV */
  uint8_t pad;
  uint64_t bytes;
  uint64_t steps;
  uint64_t net_wait_ns;
  uint64_t peer_wait_ns;
  uint64_t gpu_wait_ns;
};

struct c4w_stalled {
  uint64_t seq;           /* 0-based collective ordinal of the oldest incomplete op */
  uint64_t seq_completed;
  uint64_t age_ns;        /* time without progress */
  uint64_t op_age_ns;     /* time since that op started */
  char func[C4W_NAME];
  uint32_t nwaiting;      /* c4w_waiting records in this part */
  uint32_t pad;
};

struct c4w_waiting {
  uint32_t peer;
  uint16_t channel;
  uint8_t dir;
  uint8_t state; /* NCCL proxy-step state of the connection's oldest step (abi.h), or 0 */
  uint64_t idle_ns;
};

_Static_assert(sizeof(struct c4w_header) == 64, "header layout");
_Static_assert(sizeof(struct c4w_summary) == 96, "summary layout");
_Static_assert(sizeof(struct c4w_coll) == 72, "coll layout");
_Static_assert(sizeof(struct c4w_peer) == 48, "peer layout");
_Static_assert(sizeof(struct c4w_stalled) == 56, "stalled layout");
_Static_assert(sizeof(struct c4w_waiting) == 16, "waiting layout");

#endif
