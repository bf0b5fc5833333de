/* Entry points NCCL looks up: ncclProfiler_v5 (NCCL 2.27+) and ncclProfiler_v4 (NCCL
 * 2.25-2.26). Both drive the same core; they differ only in init's argument order and in the
 * width of the descriptor's type field. Nothing here may fail training: any init problem
 * disables the plugin for that communicator (activation mask 0) with one log line. */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm.h"
#include "emit.h"

#define C4_EXPORT __attribute__((visibility("default")))
#define DEFAULT_SOCKET "/run/c4/plugin.sock"
#define ACTIVATION_MASK \
  (C4_EV_COLL | C4_EV_P2P | C4_EV_PROXY_OP | C4_EV_PROXY_STEP | C4_EV_KERNEL_CH)

static pthread_once_t config_once = PTHREAD_ONCE_INIT;
static struct c4_config config;
static char config_warning[512]; /* logged once, through the first communicator's logger */
static _Atomic int config_warned;

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

static c4_nccl_result_t c4_init(void **context, int *mask, uint64_t hash, int nnodes,
                                int nranks, int rank, c4_nccl_logger_t log, int version) {
  char err[256] = "";
  *context = NULL;
  *mask = 0;
  pthread_once(&config_once, load_config);
  if (config_warning[0] != '\0' && !atomic_exchange(&config_warned, 1))
    LOG(log, C4_LOG_WARN, "c4 profiler: %s", config_warning);
  struct c4_comm *c = NULL;
  if (nranks <= 0 || rank < 0 || rank >= nranks)
    snprintf(err, sizeof err, "invalid rank %d of %d", rank, nranks);
  else if ((c = c4_comm_new(hash, nnodes, nranks, rank, log)) == NULL)
    snprintf(err, sizeof err, "out of memory");
  else if (c4_emitter_add(c, &config, err, sizeof err) != 0) {
    c4_comm_free(c);
    c = NULL;
  }
  if (c == NULL) {
    LOG(log, C4_LOG_WARN, "c4 profiler v%d disabled for comm %016llx rank %d: %s", version,
        (unsigned long long)hash, rank, err);
    return C4_NCCL_SUCCESS;
  }
  *context = c;
  *mask = ACTIVATION_MASK;
  LOG(log, C4_LOG_INFO,
      "c4 profiler v%d: comm %016llx rank %d/%d reporting to %s every %u ms, stall after %u ms",
      version, (unsigned long long)hash, rank, nranks, config.socket, config.interval_ms,
      config.stall_ms);
  return C4_NCCL_SUCCESS;
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

/* The two descriptor layouts name their members identically. */
#define C4_START_FN(NAME, DESCR_T)                                                          \
  static c4_nccl_result_t NAME(void *context, void **handle, DESCR_T *d) {                   \
    if (handle == NULL) return C4_NCCL_SUCCESS;                                              \
    *handle = NULL;                                                                          \
    if (context == NULL || d == NULL) return C4_NCCL_SUCCESS;                                \
    struct c4_comm *c = context;                                                             \
    switch (d->type) {                                                                       \
      case C4_EV_COLL:                                                                       \
        *handle = c4_op_start(c, 1, d->coll.func, d->coll.algo, d->coll.proto,               \
                              d->coll.datatype, d->coll.count);                              \
        break;                                                                               \
      case C4_EV_P2P:                                                                        \
        *handle = c4_op_start(c, 0, d->p2p.func, NULL, NULL, d->p2p.datatype, d->p2p.count); \
        break;                                                                               \
      case C4_EV_PROXY_OP:                                                                   \
        *handle = c4_proxy_op_start(c, d->parentObj, d->proxyOp.peer, d->proxyOp.channelId,  \
                                    d->proxyOp.isSend);                                      \
        break;                                                                               \
      case C4_EV_PROXY_STEP: *handle = c4_step_start(c, d->parentObj, d->proxyStep.step); break; \
      case C4_EV_KERNEL_CH: *handle = c4_kch_start(c, d->parentObj); break;                   \
      default: break;                                                                        \
    }                                                                                        \
    return C4_NCCL_SUCCESS;                                                                  \
  }

C4_START_FN(start_v4, c4_descr_v4_t)
C4_START_FN(start_v5, c4_descr_v5_t)

static c4_nccl_result_t stop(void *handle) {
  c4_event_stop(handle);
  return C4_NCCL_SUCCESS;
}

static c4_nccl_result_t record(void *handle, c4_nccl_state_t state, c4_nccl_state_args_t *args) {
  c4_event_state(handle, (int)state, args);
  return C4_NCCL_SUCCESS;
}

static c4_nccl_result_t finalize(void *context) {
  if (context != NULL) {
    c4_emitter_remove(context);
    c4_comm_free(context);
  }
  return C4_NCCL_SUCCESS;
}

C4_EXPORT c4_profiler_v5_t ncclProfiler_v5 = {"c4", init_v5, start_v5, stop, record, finalize};
C4_EXPORT c4_profiler_v4_t ncclProfiler_v4 = {"c4", init_v4, start_v4, stop, record, finalize};
