/* NCCL profiler plugin ABI, declared from the documented facts of NCCL's ext-profiler
 * interface (no NCCL header is included or copied). Two versions are implemented:
 *   v4: NCCL 2.25 - 2.26   (symbol "ncclProfiler_v4")
 *   v5: NCCL 2.27 and later (symbol "ncclProfiler_v5"; NCCL >= 2.28 also knows v6, which adds
 *       copy-engine events that c4 does not use: such NCCL falls back to v5).
 * Both versions share the event state enum and the state-argument union; v5 widens the type
 * field, adds API-level events and reorders init's arguments. */
#ifndef C4_PLUGIN_ABI_H
#define C4_PLUGIN_ABI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

typedef int c4_nccl_result_t; /* ncclResult_t */
enum { C4_NCCL_SUCCESS = 0, C4_NCCL_SYSTEM_ERROR = 2, C4_NCCL_INTERNAL_ERROR = 3 };

enum { C4_LOG_WARN = 2, C4_LOG_INFO = 3 };
enum { C4_LOG_FLAG_INIT = 1 };
typedef void (*c4_nccl_logger_t)(int level, unsigned long flags, const char *file, int line,
                                 const char *fmt, ...);

/* Event type bits (activation mask and descriptor type). */
enum {
  C4_EV_GROUP = 1 << 0,
  C4_EV_COLL = 1 << 1,
  C4_EV_P2P = 1 << 2,
  C4_EV_PROXY_OP = 1 << 3,
  C4_EV_PROXY_STEP = 1 << 4,
  C4_EV_PROXY_CTRL = 1 << 5,
  C4_EV_KERNEL_CH = 1 << 6,
  C4_EV_NET_PLUGIN = 1 << 7,
  C4_EV_GROUP_API = 1 << 8,     /* v5 */
  C4_EV_COLL_API = 1 << 9,      /* v5 */
  C4_EV_P2P_API = 1 << 10,      /* v5 */
  C4_EV_KERNEL_LAUNCH = 1 << 11 /* v5 */
};

/* Event states (ncclProfilerEventState_t). Values 0-7 are deprecated proxy-op states. */
typedef enum {
  C4_ST_SEND_GPU_WAIT = 8,
  C4_ST_SEND_WAIT = 9,
  C4_ST_RECV_WAIT = 10,
  C4_ST_RECV_FLUSH_WAIT = 11,
  C4_ST_RECV_GPU_WAIT = 12,
  C4_ST_PROXY_OP_IN_PROGRESS = 19,
  C4_ST_SEND_PEER_WAIT = 20,
  C4_ST_KERNEL_CH_STOP = 22,
  C4_ST_FORCE_INT = 0x7fffffff
} c4_nccl_state_t;

typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void *data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} c4_nccl_state_args_t; /* identical in v4 and v5 */

/* Members shared by v4 and v5 (v5 appends a field to coll and p2p). */
#define C4_COLL_FIELDS                                                                      \
  uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff; size_t count; \
  int root; const char *datatype; uint8_t nChannels; uint8_t nWarps; const char *algo;      \
  const char *proto;
#define C4_P2P_FIELDS \
  const char *func; void *buff; const char *datatype; size_t count; int peer; uint8_t nChannels;
#define C4_PROXY_UNION_MEMBERS                                                              \
  struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } \
      proxyOp;                                                                              \
  struct { int step; } proxyStep;                                                           \
  struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                  \
  struct { int64_t id; void *data; } netPlugin;

typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct { C4_COLL_FIELDS } coll;
    struct { C4_P2P_FIELDS } p2p;
    C4_PROXY_UNION_MEMBERS
  };
} c4_descr_v4_t;

typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    struct { int graphCaptured; int groupDepth; } groupApi;
    struct { const char *func; size_t count; const char *datatype; int root; void *stream;
             bool graphCaptured; } collApi;
    struct { const char *func; size_t count; const char *datatype; void *stream;
             bool graphCaptured; } p2pApi;
    struct { void *stream; } kernelLaunch;
    struct { C4_COLL_FIELDS void *parentGroup; } coll;
    struct { C4_P2P_FIELDS void *parentGroup; } p2p;
    C4_PROXY_UNION_MEMBERS
  };
} c4_descr_v5_t;

typedef struct {
  const char *name;
  c4_nccl_result_t (*init)(void **context, int *eActivationMask, const char *commName,
                           uint64_t commHash, int nNodes, int nranks, int rank,
                           c4_nccl_logger_t logfn);
  c4_nccl_result_t (*startEvent)(void *context, void **eHandle, c4_descr_v4_t *eDescr);
  c4_nccl_result_t (*stopEvent)(void *eHandle);
  c4_nccl_result_t (*recordEventState)(void *eHandle, c4_nccl_state_t eState,
                                       c4_nccl_state_args_t *eStateArgs);
  c4_nccl_result_t (*finalize)(void *context);
} c4_profiler_v4_t;

typedef struct {
  const char *name;
  c4_nccl_result_t (*init)(void **context, uint64_t commId, int *eActivationMask,
                           const char *commName, int nNodes, int nranks, int rank,
                           c4_nccl_logger_t logfn);
  c4_nccl_result_t (*startEvent)(void *context, void **eHandle, c4_descr_v5_t *eDescr);
  c4_nccl_result_t (*stopEvent)(void *eHandle);
  c4_nccl_result_t (*recordEventState)(void *eHandle, c4_nccl_state_t eState,
                                       c4_nccl_state_args_t *eStateArgs);
  c4_nccl_result_t (*finalize)(void *context);
} c4_profiler_v5_t;

#endif
