/* Entry points NCCL looks up, newest first: ncclProfiler_v6 (NCCL 2.29, 2.30), _v5 (2.28),
 * _v4 (2.27), _v3 (2.26). All drive one core; they differ in init's arguments and in the
 * descriptor layouts (abi.h). Nothing here may fail training: any init problem disables the
 * plugin for that communicator (NULL context) with one log line. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "comm.h"
#include "emit.h"

#define C4_EXPORT __attribute__((visibility("default")))
#define DEFAULT_SOCKET "/run/c4/plugin.sock"
#define BASE_MASK (C4_EV_COLL | C4_EV_P2P | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH)
/* NCCL keeps one activation mask per process and hands its address to every init: it is
 * written with this value only, so that no communicator's events are ever switched off. */
#define MASK(version) ((version) >= 6 ? BASE_MASK | C4_EV_CE_COLL : BASE_MASK)

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static struct c4_config config;
static char config_warning[512]; /* logged once, through the first communicator's logger */
static _Atomic int config_warned;
/* NCCL puts the pid of the process that created a proxy op in its ProxyOp descriptor: with
 * PXN the op runs in another process's proxy thread, its parent and context are pointers of
 * the creating process and must not be touched. */
static _Atomic pid_t self_pid;

#define LOG(fn, level, ...) \
  do { if ((fn) != NULL) (fn)((level), C4_LOG_FLAG_INIT, __FILE__, __LINE__, __VA_ARGS__); } while (0)

__attribute__((format(printf, 1, 2))) static void warn_config(const char *fmt, ...) {
  size_t len = strlen(config_warning);
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(config_warning + len, sizeof config_warning - len, fmt, ap);
  va_end(ap);
}

static uint32_t env_ms(const char *name, uint32_t def, uint32_t lo, uint32_t hi) {
  const char *v = getenv(name);
  if (v == NULL || *v == '\0') return def;
  char *end;
  errno = 0;
  unsigned long n = strtoul(v, &end, 10);
  if (errno || *end != '\0' || *v == '-' || n < lo || n > hi) {
    warn_config("%s='%s' is not a number of milliseconds in [%u, %u], using %u; ", name, v, lo,
                hi, def);
    return def;
  }
  return (uint32_t)n;
}

static void load_config(void) {
  const char *sock = getenv("C4_AGENT_SOCKET");
  if (sock == NULL || *sock == '\0') sock = DEFAULT_SOCKET;
  if (strlen(sock) >= sizeof config.socket) {
    warn_config("C4_AGENT_SOCKET is longer than %zu bytes, using " DEFAULT_SOCKET "; ",
                sizeof config.socket - 1);
    sock = DEFAULT_SOCKET;
  }
  snprintf(config.socket, sizeof config.socket, "%s", sock);
  config.interval_ms = env_ms("C4_INTERVAL_MS", 1000, 10, 3600000);
  config.stall_ms = env_ms("C4_STALL_MS", 5000, 10, 86400000);
}

/* nranks 0: not known at init (v3), learned from the events. */
static c4_nccl_result_t c4_init(void **context, int *mask, uint64_t hash, int nnodes,
                                int nranks, int rank, c4_nccl_logger_t log, int version) {
  char err[256] = "";
  void *prev = *context;
  *context = NULL;
  atomic_store(&self_pid, getpid());
  pthread_once(&config_once, load_config);
  if (config_warning[0] != '\0' && !atomic_exchange(&config_warned, 1))
    LOG(log, C4_LOG_WARN, "c4 profiler: %s", config_warning);
  struct c4_comm *c = NULL, *old = c4_emitter_find(prev, context);
  if (old != NULL && (version == 3 || (atomic_load(&old->hash) == hash &&
                                       atomic_load(&old->rank) == rank))) {
    *context = old; /* the same communicator initialised again: keep its state */
  } else {
    if (old != NULL) c4_emitter_remove(old); /* its context is reused for another one */
    if (version > 3 && (nranks <= 0 || rank < 0 || rank >= nranks))
      snprintf(err, sizeof err, "invalid rank %d of %d", rank, nranks);
    else if ((c = c4_comm_new(hash, nnodes, version > 3 ? nranks : 1, version > 3 ? rank : 0,
                              version, log)) == NULL)
      snprintf(err, sizeof err, "out of memory");
    else {
      c->slot = context;
      if (c4_emitter_add(c, &config, err, sizeof err) != 0) {
        c4_comm_free(c);
        c = NULL;
      }
    }
    *context = c;
  }
  __atomic_store_n(mask, MASK(version), __ATOMIC_RELAXED);
  if (*context == NULL) {
    LOG(log, C4_LOG_WARN, "c4 profiler v%d disabled for comm %016llx rank %d: %s", version,
        (unsigned long long)hash, rank, err);
  } else if (c != NULL) {
    LOG(log, C4_LOG_INFO,
        "c4 profiler v%d: comm %016llx rank %d/%d reporting to %s every %u ms, stall after %u ms",
        version, (unsigned long long)hash, rank, nranks, config.socket, config.interval_ms,
        config.stall_ms);
  }
  return C4_NCCL_SUCCESS;
}

static c4_nccl_result_t init_v3(void **context, int *mask) {
  return c4_init(context, mask, 0, 0, 0, 0, NULL, 3);
}

static c4_nccl_result_t init_v4(void **context, int *mask, const char *name, uint64_t hash,
                                int nnodes, int nranks, int rank, c4_nccl_logger_t log) {
  (void)name;
  return c4_init(context, mask, hash, nnodes, nranks, rank, log, 4);
}

static c4_nccl_result_t init_v5(void **context, uint64_t comm_id, int *mask, const char *name,
                                int nnodes, int nranks, int rank, c4_nccl_logger_t log) {
  (void)name;
  return c4_init(context, mask, comm_id, nnodes, nranks, rank, log, 5);
}

static c4_nccl_result_t init_v6(void **context, uint64_t comm_id, int *mask, const char *name,
                                int nnodes, int nranks, int rank, c4_nccl_logger_t log) {
  (void)name;
  return c4_init(context, mask, comm_id, nnodes, nranks, rank, log, 6);
}

/* The context of an event that belongs to this process, NULL if disabled or finalized. */
static inline struct c4_comm *live(void *context) {
  struct c4_comm *c = context;
  return c != NULL && !LD(c->finalizing) ? c : NULL;
}

/* Members every descriptor layout names identically. A ProxyStep never uses the context (with
 * PXN it is another process's): its communicator is its ProxyOp's. */
#define C4_COMMON_CASES(d, c)                                                                \
  case C4_EV_PROXY_STEP: *handle = c4_step_start(d->parentObj, d->proxyStep.step); break;   \
  case C4_EV_PROXY_OP:                                                                       \
    if (d->proxyOp.pid == atomic_load_explicit(&self_pid, memory_order_relaxed) &&           \
        (c = live(context)) != NULL)                                                         \
      *handle = c4_proxy_op_start(c, d->parentObj, d->proxyOp.peer, d->proxyOp.channelId,    \
                                  d->proxyOp.isSend);                                        \
    break;                                                                                   \
  case C4_EV_KERNEL_CH:                                                                      \
    if ((c = live(context)) != NULL) *handle = c4_kch_start(c, d->parentObj);                \
    break;

#define C4_START_FN(NAME, DESCR_T, EXTRA_CASES)                                              \
  static c4_nccl_result_t NAME(void *context, void **handle, DESCR_T *d) {                   \
    if (handle == NULL) return C4_NCCL_SUCCESS;                                              \
    *handle = NULL;                                                                          \
    if (d == NULL) return C4_NCCL_SUCCESS;                                                   \
    struct c4_comm *c;                                                                       \
    switch (d->type) {                                                                       \
      C4_COMMON_CASES(d, c)                                                                  \
      case C4_EV_COLL:                                                                       \
        if ((c = live(context)) != NULL)                                                     \
          *handle = c4_op_start(c, C4_OP_COLL, d->coll.func, d->coll.algo, d->coll.proto,    \
                                d->coll.datatype, d->coll.count);                            \
        break;                                                                               \
      case C4_EV_P2P:                                                                        \
        if ((c = live(context)) != NULL)                                                     \
          *handle = c4_op_start(c, C4_OP_P2P, d->p2p.func, NULL, NULL, d->p2p.datatype,      \
                                d->p2p.count);                                               \
        break;                                                                               \
      EXTRA_CASES                                                                            \
      default: break; /* Group, the API-level events, ProxyCtrl, NetPlugin: not subscribed */ \
    }                                                                                        \
    return C4_NCCL_SUCCESS;                                                                  \
  }

/* v3 (NCCL 2.26) tells a communicator who it is only in its Coll and P2p descriptors. */
static c4_nccl_result_t start_v3(void *context, void **handle, c4_descr_v3_t *d) {
  if (handle == NULL) return C4_NCCL_SUCCESS;
  *handle = NULL;
  if (d == NULL) return C4_NCCL_SUCCESS;
  struct c4_comm *c;
  switch (d->type) {
    C4_COMMON_CASES(d, c)
    case C4_EV_COLL:
      if ((c = live(context)) == NULL) break;
      c4_comm_learn(c, d->coll.commHash, d->rank);
      *handle = c4_op_start(c, C4_OP_COLL, d->coll.func, d->coll.algo, d->coll.proto,
                            d->coll.datatype, d->coll.count);
      break;
    case C4_EV_P2P:
      if ((c = live(context)) == NULL) break;
      c4_comm_learn(c, d->p2p.commHash, d->rank);
      c4_comm_saw_rank(c, d->p2p.peer);
      *handle = c4_op_start(c, C4_OP_P2P, d->p2p.func, NULL, NULL, d->p2p.datatype,
                            d->p2p.count);
      break;
    default: break;
  }
  return C4_NCCL_SUCCESS;
}

C4_START_FN(start_v4, c4_descr_v4_t, )
C4_START_FN(start_v5, c4_descr_v5_t, )
/* A copy-engine collective has no Coll event: it is counted as a collective that completes
 * when enqueued (NCCL gives it no children) and is not taken as progress. Its CeSync and
 * CeBatch children are not subscribed. */
C4_START_FN(start_v6, c4_descr_v6_t,
            case C4_EV_CE_COLL:
              if ((c = live(context)) != NULL)
                *handle = c4_op_start(c, C4_OP_CE, d->ceColl.func, "CE", d->ceColl.syncStrategy,
                                      d->ceColl.datatype, d->ceColl.count);
              break;)

static c4_nccl_result_t stop(void *handle) {
  c4_event_stop(handle);
  return C4_NCCL_SUCCESS;
}

static c4_nccl_result_t record_v3(void *handle, c4_nccl_state_t state,
                                  c4_nccl_state_args_v3_t *args) {
  c4_event_state(handle, (int)state, args != NULL ? args->proxyOp.transSize : 0);
  return C4_NCCL_SUCCESS;
}

static c4_nccl_result_t record(void *handle, c4_nccl_state_t state, c4_nccl_state_args_t *args) {
  c4_event_state(handle, (int)state, args != NULL ? args->proxyStep.transSize : 0);
  return C4_NCCL_SUCCESS;
}

/* Never waits for the agent: the background thread sends the final summary and frees the
 * state later (c4_emitter_remove). */
static c4_nccl_result_t finalize(void *context) {
  struct c4_comm *c = c4_emitter_find(context, NULL); /* NCCL finalizes what it was given */
  if (c != NULL) c4_emitter_remove(c);
  return C4_NCCL_SUCCESS;
}

C4_EXPORT c4_profiler_v6_t ncclProfiler_v6 = {"c4", init_v6, start_v6, stop, record, finalize};
C4_EXPORT c4_profiler_v5_t ncclProfiler_v5 = {"c4", init_v5, start_v5, stop, record, finalize};
C4_EXPORT c4_profiler_v4_t ncclProfiler_v4 = {"c4", init_v4, start_v4, stop, record, finalize};
C4_EXPORT c4_profiler_v3_t ncclProfiler_v3 = {"c4", init_v3, start_v3, stop, record_v3, finalize};
