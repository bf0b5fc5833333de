/* NCCL profiler plugin ABI, declared from NCCL's profiler headers (src/include/plugin/profiler/
 * profiler_v3.h .. profiler_v6.h of the release that introduced each version; no NCCL header is
 * included). NCCL looks up the newest symbol it knows first:
 *   v3: NCCL 2.26          (symbol "ncclProfiler_v3"; init knows nothing about the communicator)
 *   v4: NCCL 2.27          (symbol "ncclProfiler_v4")
 *   v5: NCCL 2.28          (symbol "ncclProfiler_v5"; API-level events, 64-bit type)
 *   v6: NCCL 2.29 and 2.30 (symbol "ncclProfiler_v6"; v5 plus copy-engine events)
 * v1 (2.23) and v2 (2.24, 2.25) are not implemented: those releases run without c4.
 * All versions share the event type bits, the state numbers and (v4-v6) the state arguments;
 * the descriptors differ in the type field's width and in the coll/p2p/kernelCh members. */
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
  C4_EV_GROUP_API = 1 << 8,      /* v5+ */
  C4_EV_COLL_API = 1 << 9,       /* v5+ */
  C4_EV_P2P_API = 1 << 10,       /* v5+ */
  C4_EV_KERNEL_LAUNCH = 1 << 11, /* v5+ */
  C4_EV_CE_COLL = 1 << 12,       /* v6 */
  C4_EV_CE_SYNC = 1 << 13,       /* v6 */
  C4_EV_CE_BATCH = 1 << 14       /* v6 */
};

/* Event states (ncclProfilerEventState_t). 0-7 are the ProxyOp states v3 reports (with the op's
 * cumulative transSize); v4 replaced them by ProxyOpInProgress. */
typedef enum {
  C4_ST_PROXY_OP_SEND_POSTED = 0,
  C4_ST_PROXY_OP_RECV_DONE = 7,
  C4_ST_SEND_GPU_WAIT = 8,
  C4_ST_SEND_WAIT = 9,
  C4_ST_RECV_WAIT = 10,
  C4_ST_RECV_FLUSH_WAIT = 11,
  C4_ST_RECV_GPU_WAIT = 12,
  C4_ST_PROXY_OP_IN_PROGRESS = 19, /* v4+ */
  C4_ST_SEND_PEER_WAIT = 20,       /* v4+ */
  C4_ST_KERNEL_CH_STOP = 22,       /* v4+ */
  C4_ST_FORCE_INT = 0x7fffffff
} c4_nccl_state_t;

/* v3: ProxyOp states carry the op's cumulative bytes; ProxySteps get NULL arguments. */
typedef union {
  struct { size_t transSize; int steps; } proxyOp;
  struct { int appendedProxyOps; } proxyCtrl;
} c4_nccl_state_args_v3_t;

/* v4, v5, v6: ProxyStep states carry NCCL's last transfer size of the op (sub->transSize),
 * set when the step is sent (SendWait) or received (RecvFlushWait). */
typedef union {
  struct { size_t transSize; } proxyStep;
  struct { int appendedProxyOps; } proxyCtrl;
  struct { void *data; } netPlugin;
  struct { uint64_t pTimer; } kernelCh;
} c4_nccl_state_args_t;

#define C4_PROXY_MEMBERS                                                                    \
  struct { pid_t pid; uint8_t channelId; int peer; int nSteps; int chunkSize; int isSend; } \
      proxyOp;                                                                              \
  struct { int step; } proxyStep;                                                           \
  struct { int64_t id; void *data; } netPlugin;

typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct { const char *name; uint64_t commHash; uint64_t seqNumber; const char *func;
             const void *sendBuff; void *recvBuff; size_t count; int root; const char *datatype;
             uint8_t nMaxChannels; uint8_t nWarps; const char *algo; const char *proto; } coll;
    struct { const char *name; uint64_t commHash; const char *func; void *buff;
             const char *datatype; size_t count; int peer; } p2p;
    struct { uint8_t channelId; } kernelCh;
    C4_PROXY_MEMBERS
  };
} c4_descr_v3_t;

#define C4_COLL_FIELDS                                                                      \
  uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff; size_t count; \
  int root; const char *datatype; uint8_t nChannels; uint8_t nWarps; const char *algo;      \
  const char *proto;
#define C4_P2P_FIELDS \
  const char *func; void *buff; const char *datatype; size_t count; int peer; uint8_t nChannels;

typedef struct {
  uint8_t type;
  void *parentObj;
  int rank;
  union {
    struct { C4_COLL_FIELDS } coll;
    struct { C4_P2P_FIELDS } p2p;
    struct { uint8_t channelId; uint64_t pTimer; } kernelCh;
    C4_PROXY_MEMBERS
  };
} c4_descr_v4_t;

#define C4_V5_MEMBERS                                                                       \
  struct { bool graphCaptured; int groupDepth; } groupApi;                                  \
  struct { const char *func; size_t count; const char *datatype; int root; void *stream;    \
           bool graphCaptured; } collApi;                                                   \
  struct { const char *func; size_t count; const char *datatype; void *stream;              \
           bool graphCaptured; } p2pApi;                                                    \
  struct { void *stream; } kernelLaunch;                                                    \
  struct { C4_COLL_FIELDS void *parentGroup; } coll;                                        \
  struct { C4_P2P_FIELDS void *parentGroup; } p2p;                                          \
  struct { uint8_t channelId; uint64_t pTimer; } kernelCh;                                  \
  C4_PROXY_MEMBERS

typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union { C4_V5_MEMBERS };
} c4_descr_v5_t;

typedef struct {
  uint64_t type;
  void *parentObj;
  int rank;
  union {
    C4_V5_MEMBERS
    struct { uint64_t seqNumber; const char *func; const void *sendBuff; void *recvBuff;
             size_t count; int root; const char *datatype; const char *syncStrategy;
             bool intraBatchSync; uint32_t batchSize; uint32_t numBatches; uint32_t ceSeqNum;
             void *stream; } ceColl;
    struct { bool isComplete; int nRanks; } ceCollSync;
    struct { int numOps; size_t totalBytes; bool useIntraSync; } ceCollBatch;
  };
} c4_descr_v6_t;

#define C4_PROFILER_FNS(DESCR_T, ARGS_T)                                                      \
  c4_nccl_result_t (*startEvent)(void *context, void **eHandle, DESCR_T *eDescr);             \
  c4_nccl_result_t (*stopEvent)(void *eHandle);                                               \
  c4_nccl_result_t (*recordEventState)(void *eHandle, c4_nccl_state_t eState, ARGS_T *args); \
  c4_nccl_result_t (*finalize)(void *context);

typedef struct {
  const char *name;
  c4_nccl_result_t (*init)(void **context, int *eActivationMask);
  C4_PROFILER_FNS(c4_descr_v3_t, c4_nccl_state_args_v3_t)
} c4_profiler_v3_t;

typedef struct {
  const char *name;
  c4_nccl_result_t (*init)(void **context, int *eActivationMask, const char *commName,
                           uint64_t commHash, int nNodes, int nranks, int rank,
                           c4_nccl_logger_t logfn);
  C4_PROFILER_FNS(c4_descr_v4_t, c4_nccl_state_args_t)
} c4_profiler_v4_t;

#define C4_INIT_V5                                                                          \
  c4_nccl_result_t (*init)(void **context, uint64_t commId, int *eActivationMask,           \
                           const char *commName, int nNodes, int nranks, int rank,          \
                           c4_nccl_logger_t logfn);

typedef struct {
  const char *name;
  C4_INIT_V5
  C4_PROFILER_FNS(c4_descr_v5_t, c4_nccl_state_args_t)
} c4_profiler_v5_t;

typedef struct {
  const char *name;
  C4_INIT_V5
  C4_PROFILER_FNS(c4_descr_v6_t, c4_nccl_state_args_t)
} c4_profiler_v6_t;

#endif
