/* libc4-pathctl.so: the c4 path-control library. It sits in front of libibverbs inside a training
 * process and makes each planned RoCEv2 QP use the UDP source port the agent assigns, so that
 * ECMP puts the flow on the planned fabric path (docs/planning.md, "Applying plans: verbs").
 *
 * - It exports the verbs NCCL resolves with dlvsym(handle, name, "IBVERBS_1.1") (and the few it
 *   takes at later versions) and forwards each to the real libibverbs, opened by full path
 *   ($C4_PATHCTL_IBVERBS, else the path found at build time). NCCL 2.30+ loads it through
 *   NCCL_IBVERBS_LIB, older NCCL as `libibverbs.so` first on LD_LIBRARY_PATH, and a program
 *   linked against libibverbs through LD_PRELOAD.
 * - ibv_create_qp / ibv_modify_qp / ibv_destroy_qp keep a table of this process's QPs.
 * - A background thread connects to the agent's Unix socket ($C4_PATHCTL_SOCKET, default
 *   /run/c4/pathctl.sock) and receives assignments (pathctl_proto.h): QP in RTS: it calls
 *   mlx5dv_modify_qp_udp_sport (any port; EOPNOTSUPP without firmware support is reported);
 *   QP not yet at RTR: the GRH flow label of its INIT->RTR modify is set so that the kernel
 *   derives the planned port (0xC000-0xFFFF), other ports are set right after RTR->RTS.
 * Nothing on an application thread waits for the agent: results go to an outbox that the
 * background thread sends; the QP table's lock is held only for table updates and, on the
 * background thread, for the one modify call that must not race with ibv_destroy_qp (no socket
 * or file I/O under it). */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "pathctl_proto.h"

#ifndef C4_REAL_IBVERBS
#define C4_REAL_IBVERBS "/usr/lib/x86_64-linux-gnu/libibverbs.so.1"
#endif
#define DEFAULT_SOCKET "/run/c4/pathctl.sock"
#define OUTBOX_MAX 1024
#define SEND_BATCH 64 /* results the background thread takes from the outbox per lock */
#define QP_BUCKETS 4096
#define RETRY_MIN_MS 500
#define RETRY_MAX_MS 10000
#define SPORT_BASE 0xC000

#define EXPORT __attribute__((visibility("default")))
#define SYMVER(impl, ver) __asm__(".symver " #impl ", " ver)

/* ---------------------------------------------------------------------------------------- */
/* Logging: one line per distinct message kind, so a broken setup cannot flood stderr.       */

static void note(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void note(const char *fmt, ...)
{
	char buf[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(stderr, "c4-pathctl[%d]: %s\n", (int)getpid(), buf);
}

/* ---------------------------------------------------------------------------------------- */
/* The real libibverbs and libmlx5                                                           */

static void *real_handle;
static char real_error[256];
static pthread_once_t real_once = PTHREAD_ONCE_INIT;

static void real_open(void)
{
	const char *path = getenv("C4_PATHCTL_IBVERBS");
	Dl_info self, other;
	void *probe;

	if (!path || !*path)
		path = C4_REAL_IBVERBS;
	real_handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (!real_handle) {
		snprintf(real_error, sizeof(real_error), "cannot open the real libibverbs %s: %s",
			 path, dlerror());
		note("%s", real_error);
		return;
	}
	/* A libibverbs.so.1 symlink to this library would make us our own backend. */
	probe = dlvsym(real_handle, "ibv_modify_qp", "IBVERBS_1.1");
	if (probe && dladdr(probe, &other) && dladdr((void *)real_open, &self) &&
	    other.dli_fbase == self.dli_fbase) {
		snprintf(real_error, sizeof(real_error),
			 "%s resolves to the path-control library itself; set C4_PATHCTL_IBVERBS "
			 "to the real libibverbs.so.1",
			 path);
		note("%s", real_error);
		dlclose(real_handle);
		real_handle = NULL;
	}
}

static void *real_sym(const char *name, const char *version)
{
	void *p;

	pthread_once(&real_once, real_open);
	if (!real_handle)
		return NULL;
	p = dlvsym(real_handle, name, version);
	if (!p)
		note("the real libibverbs has no %s@%s", name, version);
	return p;
}

/* Each forwarder resolves its target once; a missing one fails the call with ENOSYS. */
#define RESOLVE(var, name, version)                                                         \
	static _Atomic(void *) var;                                                         \
	void *fn_ = atomic_load_explicit(&var, memory_order_acquire);                       \
	if (!fn_) {                                                                         \
		fn_ = real_sym(name, version);                                              \
		atomic_store_explicit(&var, fn_, memory_order_release);                     \
	}

#define FORWARD(ret, impl, name, version, fail, params, args)                               \
	SYMVER(impl, name "@@" version);                                                    \
	EXPORT ret impl params                                                              \
	{                                                                                   \
		RESOLVE(target_, name, version)                                             \
		if (!fn_) {                                                                 \
			errno = ENOSYS;                                                     \
			return fail;                                                        \
		}                                                                           \
		return ((ret(*) params)fn_)args;                                            \
	}

#define FORWARD_VOID(impl, name, version, params, args)                                     \
	SYMVER(impl, name "@@" version);                                                    \
	EXPORT void impl params                                                             \
	{                                                                                   \
		RESOLVE(target_, name, version)                                             \
		if (fn_)                                                                    \
			((void(*) params)fn_)args;                                          \
	}

/* What NCCL (every release since 2.4) and its forks resolve, at the versions they ask for. */
FORWARD(struct ibv_device **, c4_get_device_list, "ibv_get_device_list", "IBVERBS_1.1", NULL,
	(int *n), (n))
FORWARD_VOID(c4_free_device_list, "ibv_free_device_list", "IBVERBS_1.1",
	     (struct ibv_device **l), (l))
FORWARD(const char *, c4_get_device_name, "ibv_get_device_name", "IBVERBS_1.1", NULL,
	(struct ibv_device *d), (d))
FORWARD(__be64, c4_get_device_guid, "ibv_get_device_guid", "IBVERBS_1.1", 0,
	(struct ibv_device *d), (d))
FORWARD(struct ibv_context *, c4_open_device, "ibv_open_device", "IBVERBS_1.1", NULL,
	(struct ibv_device *d), (d))
FORWARD(int, c4_close_device, "ibv_close_device", "IBVERBS_1.1", -1,
	(struct ibv_context *c), (c))
FORWARD(int, c4_get_async_event, "ibv_get_async_event", "IBVERBS_1.1", -1,
	(struct ibv_context *c, struct ibv_async_event *e), (c, e))
FORWARD_VOID(c4_ack_async_event, "ibv_ack_async_event", "IBVERBS_1.1",
	     (struct ibv_async_event *e), (e))
FORWARD(int, c4_query_device, "ibv_query_device", "IBVERBS_1.1", ENOSYS,
	(struct ibv_context *c, struct ibv_device_attr *a), (c, a))
FORWARD(int, c4_query_port, "ibv_query_port", "IBVERBS_1.1", ENOSYS,
	(struct ibv_context *c, uint8_t p, struct _compat_ibv_port_attr *a), (c, p, a))
FORWARD(int, c4_query_gid, "ibv_query_gid", "IBVERBS_1.1", -1,
	(struct ibv_context *c, uint8_t p, int i, union ibv_gid *g), (c, p, i, g))
FORWARD(int, c4_query_pkey, "ibv_query_pkey", "IBVERBS_1.1", -1,
	(struct ibv_context *c, uint8_t p, int i, __be16 *k), (c, p, i, k))
FORWARD(int, c4_query_qp, "ibv_query_qp", "IBVERBS_1.1", ENOSYS,
	(struct ibv_qp *q, struct ibv_qp_attr *a, int m, struct ibv_qp_init_attr *i),
	(q, a, m, i))
FORWARD(struct ibv_pd *, c4_alloc_pd, "ibv_alloc_pd", "IBVERBS_1.1", NULL,
	(struct ibv_context *c), (c))
FORWARD(int, c4_dealloc_pd, "ibv_dealloc_pd", "IBVERBS_1.1", ENOSYS, (struct ibv_pd *p), (p))
FORWARD(struct ibv_mr *, c4_reg_mr, "ibv_reg_mr", "IBVERBS_1.1", NULL,
	(struct ibv_pd *p, void *a, size_t l, int f), (p, a, l, f))
FORWARD(struct ibv_mr *, c4_reg_mr_iova2, "ibv_reg_mr_iova2", "IBVERBS_1.8", NULL,
	(struct ibv_pd *p, void *a, size_t l, uint64_t i, unsigned int f), (p, a, l, i, f))
FORWARD(struct ibv_mr *, c4_reg_dmabuf_mr, "ibv_reg_dmabuf_mr", "IBVERBS_1.12", NULL,
	(struct ibv_pd *p, uint64_t o, size_t l, uint64_t i, int fd, int f), (p, o, l, i, fd, f))
FORWARD(int, c4_dereg_mr, "ibv_dereg_mr", "IBVERBS_1.1", ENOSYS, (struct ibv_mr *m), (m))
FORWARD(struct ibv_comp_channel *, c4_create_comp_channel, "ibv_create_comp_channel",
	"IBVERBS_1.0", NULL, (struct ibv_context *c), (c))
FORWARD(int, c4_destroy_comp_channel, "ibv_destroy_comp_channel", "IBVERBS_1.0", -1,
	(struct ibv_comp_channel *c), (c))
FORWARD(struct ibv_cq *, c4_create_cq, "ibv_create_cq", "IBVERBS_1.1", NULL,
	(struct ibv_context *c, int n, void *u, struct ibv_comp_channel *ch, int v),
	(c, n, u, ch, v))
FORWARD(int, c4_destroy_cq, "ibv_destroy_cq", "IBVERBS_1.1", ENOSYS, (struct ibv_cq *c), (c))
FORWARD(int, c4_get_cq_event, "ibv_get_cq_event", "IBVERBS_1.1", -1,
	(struct ibv_comp_channel *ch, struct ibv_cq **c, void **u), (ch, c, u))
FORWARD_VOID(c4_ack_cq_events, "ibv_ack_cq_events", "IBVERBS_1.1",
	     (struct ibv_cq *c, unsigned int n), (c, n))
FORWARD(struct ibv_srq *, c4_create_srq, "ibv_create_srq", "IBVERBS_1.1", NULL,
	(struct ibv_pd *p, struct ibv_srq_init_attr *a), (p, a))
FORWARD(int, c4_destroy_srq, "ibv_destroy_srq", "IBVERBS_1.1", ENOSYS, (struct ibv_srq *s), (s))
FORWARD(struct ibv_ah *, c4_create_ah, "ibv_create_ah", "IBVERBS_1.1", NULL,
	(struct ibv_pd *p, struct ibv_ah_attr *a), (p, a))
FORWARD(int, c4_destroy_ah, "ibv_destroy_ah", "IBVERBS_1.1", ENOSYS, (struct ibv_ah *a), (a))
FORWARD(int, c4_query_ece, "ibv_query_ece", "IBVERBS_1.10", EOPNOTSUPP,
	(struct ibv_qp *q, struct ibv_ece *e), (q, e))
FORWARD(int, c4_set_ece, "ibv_set_ece", "IBVERBS_1.10", EOPNOTSUPP,
	(struct ibv_qp *q, struct ibv_ece *e), (q, e))
FORWARD(int, c4_fork_init, "ibv_fork_init", "IBVERBS_1.1", ENOSYS, (void), ())
FORWARD(enum ibv_fork_status, c4_is_fork_initialized, "ibv_is_fork_initialized",
	"IBVERBS_1.13", IBV_FORK_DISABLED, (void), ())
FORWARD(const char *, c4_event_type_str, "ibv_event_type_str", "IBVERBS_1.1", "unknown",
	(enum ibv_event_type e), (e))
FORWARD(const char *, c4_wc_status_str, "ibv_wc_status_str", "IBVERBS_1.1", "unknown",
	(enum ibv_wc_status s), (s))

typedef struct ibv_qp *(*create_qp_fn)(struct ibv_pd *, struct ibv_qp_init_attr *);
typedef int (*modify_qp_fn)(struct ibv_qp *, struct ibv_qp_attr *, int);
typedef int (*destroy_qp_fn)(struct ibv_qp *);
typedef int (*udp_sport_fn)(struct ibv_qp *, uint16_t);

static udp_sport_fn udp_sport;
static const char *udp_sport_missing = "";
static pthread_once_t mlx5_once = PTHREAD_ONCE_INIT;

static void mlx5_open(void)
{
	const char *path = getenv("C4_PATHCTL_MLX5");
	void *h;

	/* The provider that libibverbs loaded for an mlx5 device; never load one ourselves. */
	h = path && *path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) :
			    dlopen("libmlx5.so.1", RTLD_NOW | RTLD_NOLOAD);
	if (!h) {
		udp_sport_missing = "libmlx5 is not loaded in this process (not an mlx5 NIC)";
		return;
	}
	udp_sport = (udp_sport_fn)dlsym(h, "mlx5dv_modify_qp_udp_sport");
	if (!udp_sport)
		udp_sport_missing = "this libmlx5 has no mlx5dv_modify_qp_udp_sport (rdma-core < 32)";
}

/* ---------------------------------------------------------------------------------------- */
/* QP table and outbox (one lock)                                                            */

struct qp_entry {
	struct ibv_qp *qp;
	struct qp_entry *next_qp;  /* hash chains: by `qp` and by `qpn` */
	struct qp_entry *next_qpn;
	uint32_t qpn;
	uint32_t rqpn;
	enum ibv_qp_state state;
	enum ibv_qp_type type;
	uint8_t port;
	int dying;	  /* ibv_destroy_qp in progress: hands off */
	int pending;	  /* an assignment waits for RTR/RTS */
	uint64_t token;	  /* its agent token (0: the agent that sent it is gone) */
	uint16_t want;	  /* its port */
	uint16_t sport;	  /* port in use when known, 0 otherwise */
	char dev[C4PC_DEV_LEN];
};

/* Every verb looks its QP up, so the table is hashed both ways (a process may hold thousands). */
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct qp_entry *by_qp[QP_BUCKETS], *by_qpn[QP_BUCKETS];
static struct c4pc_msg outbox[OUTBOX_MAX];
static size_t out_head, out_len;
static unsigned long out_dropped;
static int wake_fd = -1;
static int wake_owed; /* results queued since the agent thread last took the outbox */
static int thread_started;

/* Application threads: release the lock, then wake the agent thread for what they queued (the
 * eventfd write is a system call: not under the lock). */
static void unlock_and_wake(void)
{
	int fd = wake_owed ? wake_fd : -1;
	uint64_t one = 1;

	wake_owed = 0;
	pthread_mutex_unlock(&lock);
	if (fd >= 0 && write(fd, &one, sizeof(one)) < 0) {
		/* eventfd at its maximum: the thread is awake already */
	}
}

static size_t bucket(uint64_t key)
{
	return (size_t)((key * 0x9E3779B97F4A7C15ull) >> 52) % QP_BUCKETS;
}

static struct qp_entry **qp_slot(const struct ibv_qp *qp)
{
	return &by_qp[bucket((uintptr_t)qp)];
}

static struct qp_entry *find_qp(const struct ibv_qp *qp)
{
	struct qp_entry *e = *qp_slot(qp);

	while (e && e->qp != qp)
		e = e->next_qp;
	return e;
}

static struct qp_entry *find_qpn(const char *dev, uint32_t qpn)
{
	struct qp_entry *e = by_qpn[bucket(qpn)];

	while (e && (e->qpn != qpn || (*dev && strcmp(dev, e->dev))))
		e = e->next_qpn;
	return e;
}

static void table_add(struct qp_entry *e)
{
	struct qp_entry **a = qp_slot(e->qp), **b = &by_qpn[bucket(e->qpn)];

	e->next_qp = *a;
	*a = e;
	e->next_qpn = *b;
	*b = e;
}

static void table_remove(struct qp_entry *e)
{
	struct qp_entry **p = qp_slot(e->qp);

	while (*p != e)
		p = &(*p)->next_qp;
	*p = e->next_qp;
	for (p = &by_qpn[bucket(e->qpn)]; *p != e; p = &(*p)->next_qpn)
		;
	*p = e->next_qpn;
	free(e);
}

/* Queue a result for the agent (lock held); the background thread sends it (woken by
 * unlock_and_wake). */
static void post_result(uint64_t token, const struct qp_entry *e, uint32_t lqpn, int err,
			uint16_t sport, uint16_t how, const char *fmt, ...)
	__attribute__((format(printf, 7, 8)));
static void post_result(uint64_t token, const struct qp_entry *e, uint32_t lqpn, int err,
			uint16_t sport, uint16_t how, const char *fmt, ...)
{
	struct c4pc_msg *m;
	va_list ap;

	if (!token)
		return;
	if (out_len == OUTBOX_MAX) {
		out_head = (out_head + 1) % OUTBOX_MAX;
		out_len--;
		out_dropped++;
	}
	m = &outbox[(out_head + out_len++) % OUTBOX_MAX];
	memset(m, 0, sizeof(*m));
	m->magic = C4PC_MAGIC;
	m->version = C4PC_VERSION;
	m->type = C4PC_RESULT;
	m->token = token;
	m->lqpn = lqpn;
	m->rqpn = e ? e->rqpn : 0;
	m->err = err;
	m->sport = sport;
	m->how = how;
	if (e)
		memcpy(m->dev, e->dev, sizeof(m->dev));
	va_start(ap, fmt);
	vsnprintf(m->detail, sizeof(m->detail), fmt, ap);
	va_end(ap);
	wake_owed = 1;
}

/* Kernel rdma_flow_label_to_udp_sport and its inverse for ports 0xC000-0xFFFF. */
static uint16_t flow_label_to_sport(uint32_t fl)
{
	uint32_t lo = fl & 0x03FFF, hi = fl & 0xFC000;

	return (uint16_t)(((lo ^ (hi >> 14)) | SPORT_BASE) & 0xFFFF);
}

static uint32_t sport_to_flow_label(uint16_t sport)
{
	/* Flow label 0 means "derive from the QP numbers", so 0xC000 takes a high bit. */
	uint32_t lo = sport & 0x3FFF;

	return lo ? lo : (1u << 14) | 1u;
}

static uint32_t calc_flow_label(uint32_t lqpn, uint32_t rqpn)
{
	uint64_t v = (uint64_t)lqpn * rqpn;

	v ^= v >> 20;
	v ^= v >> 40;
	return (uint32_t)(v & 0xFFFFF);
}

/* The GID type of a QP's source GID: sysfs says "RoCE v2", "IB/RoCE v1" ...; 1 = RoCE v2,
 * 0 = another type, -1 = unknown (no sysfs entry). */
static int gid_is_roce_v2(const struct ibv_qp *qp, uint8_t port, unsigned sgid_index)
{
	char path[IBV_SYSFS_PATH_MAX + 64], buf[32] = "";
	ssize_t n;
	int fd;

	if (!qp->context || !qp->context->device)
		return -1;
	snprintf(path, sizeof(path), "%s/ports/%u/gid_attrs/types/%u",
		 qp->context->device->ibdev_path, port, sgid_index);
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -1;
	return strncmp(buf, "RoCE v2", 7) == 0;
}

/* Apply `e`'s port on an RTS QP now (lock held). */
static void apply_rts(struct qp_entry *e, uint64_t token, uint16_t sport)
{
	int rc;

	pthread_once(&mlx5_once, mlx5_open);
	if (e->type != IBV_QPT_RC && e->type != IBV_QPT_UC) {
		post_result(token, e, e->qpn, EOPNOTSUPP, e->sport, 0,
			    "only RC and UC QPs have a fixed UDP source port");
		return;
	}
	if (!udp_sport) {
		post_result(token, e, e->qpn, EOPNOTSUPP, e->sport, 0, "%s", udp_sport_missing);
		return;
	}
	rc = udp_sport(e->qp, sport);
	if (rc < 0)
		rc = errno ? errno : EIO;
	if (rc) {
		post_result(token, e, e->qpn, rc, e->sport, 0, "mlx5dv_modify_qp_udp_sport: %s",
			    rc == EOPNOTSUPP ? "NIC firmware cannot move a live QP" : strerror(rc));
		return;
	}
	e->sport = sport;
	post_result(token, e, e->qpn, 0, sport, C4PC_HOW_UDP_SPORT, "set on the RTS QP");
}

/* An assignment from the agent (background thread). */
static void assign(const struct c4pc_msg *m)
{
	char dev[C4PC_DEV_LEN];
	struct qp_entry *e;

	memcpy(dev, m->dev, sizeof(dev));
	dev[sizeof(dev) - 1] = 0;
	pthread_mutex_lock(&lock);
	e = find_qpn(dev, m->lqpn);
	if (!e || e->dying) {
		post_result(m->token, NULL, m->lqpn, ENOENT, 0, 0,
			    "no QP 0x%x%s%s in this process", m->lqpn, *dev ? " on " : "", dev);
	} else if (e->state == IBV_QPS_RTS) {
		apply_rts(e, m->token, m->sport);
	} else if (e->state == IBV_QPS_RESET || e->state == IBV_QPS_INIT ||
		   e->state == IBV_QPS_RTR) {
		if (e->pending)
			post_result(e->token, e, e->qpn, ECANCELED, e->sport, 0,
				    "replaced by a newer assignment");
		e->pending = 1;
		e->token = m->token;
		e->want = m->sport;
	} else {
		post_result(m->token, e, e->qpn, EINVAL, e->sport, 0,
			    "QP 0x%x is in state %d (SQD, SQE or ERR)", e->qpn, (int)e->state);
	}
	pthread_mutex_unlock(&lock);
}

/* ---------------------------------------------------------------------------------------- */
/* Background thread: agent connection                                                       */

static int agent_connect(void)
{
	const char *path = getenv("C4_PATHCTL_SOCKET");
	struct sockaddr_un sa;
	struct ucred cred;
	socklen_t len = sizeof(cred);
	int fd;

	if (!path || !*path)
		path = DEFAULT_SOCKET;
	if (strlen(path) >= sizeof(sa.sun_path))
		return -1;
	fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -1;
	memset(&sa, 0, sizeof(sa));
	sa.sun_family = AF_UNIX;
	strcpy(sa.sun_path, path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		close(fd);
		return -1;
	}
	/* Only root (the agent) or our own user may steer our QPs. */
	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) < 0 ||
	    (cred.uid != 0 && cred.uid != getuid())) {
		note("refusing agent socket %s owned by uid %u", path, (unsigned)cred.uid);
		close(fd);
		return -1;
	}
	return fd;
}

/* Results taken from the outbox, sent without the lock; kept here while the socket is full. */
static struct c4pc_msg sending[SEND_BATCH];
static size_t send_head, send_len;

/* The agent went away: its tokens mean nothing to the next one (which numbers its own from 1
 * again). Pending ports still apply. */
static void forget_agent(int *fd)
{
	close(*fd);
	*fd = -1;
	send_len = 0;
	pthread_mutex_lock(&lock);
	out_len = 0;
	for (size_t i = 0; i < QP_BUCKETS; i++)
		for (struct qp_entry *e = by_qp[i]; e; e = e->next_qp)
			e->token = 0;
	pthread_mutex_unlock(&lock);
}

/* Send what the socket takes; returns whether results are left for when it has room. */
static int flush_outbox(int *fd)
{
	while (*fd >= 0) {
		if (!send_len) {
			send_head = 0;
			pthread_mutex_lock(&lock);
			wake_owed = 0; /* this thread is at the outbox already */
			while (out_len && send_len < SEND_BATCH) {
				sending[send_len++] = outbox[out_head];
				out_head = (out_head + 1) % OUTBOX_MAX;
				out_len--;
			}
			pthread_mutex_unlock(&lock);
			if (!send_len)
				return 0;
		}
		for (; send_len; send_head++, send_len--) {
			if (send(*fd, &sending[send_head], sizeof(struct c4pc_msg),
				 MSG_DONTWAIT | MSG_NOSIGNAL) >= 0)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 1; /* POLLOUT brings us back */
			forget_agent(fd);
			return 0;
		}
	}
	return 0;
}

static void *agent_thread(void *arg)
{
	int fd = -1, backoff = RETRY_MIN_MS, blocked = 0;

	(void)arg;
	for (;;) {
		struct pollfd p[2] = {{.fd = wake_fd, .events = POLLIN}, {.fd = -1}};
		uint64_t v;

		if (fd < 0) {
			fd = agent_connect();
			backoff = fd < 0 ? (backoff * 2 > RETRY_MAX_MS ? RETRY_MAX_MS : backoff * 2) :
					   RETRY_MIN_MS;
		}
		p[1].fd = fd;
		p[1].events = POLLIN | (blocked ? POLLOUT : 0);
		if (poll(p, 2, fd < 0 ? backoff : -1) < 0 && errno != EINTR)
			sleep(1);
		if (p[0].revents & POLLIN && read(wake_fd, &v, sizeof(v)) < 0) {
			/* nonblocking eventfd: nothing to read */
		}
		if (fd >= 0 && p[1].revents & POLLIN) {
			struct c4pc_msg m;
			ssize_t n;

			while ((n = recv(fd, &m, sizeof(m), MSG_DONTWAIT | MSG_TRUNC)) > 0) {
				if (n == (ssize_t)sizeof(m) && m.magic == C4PC_MAGIC &&
				    m.version == C4PC_VERSION && m.type == C4PC_ASSIGN)
					assign(&m);
				else
					note("ignoring a malformed message of %zd bytes from the agent",
					     n);
			}
			if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK))
				forget_agent(&fd);
		} else if (fd >= 0 && p[1].revents & (POLLHUP | POLLERR)) {
			forget_agent(&fd);
		}
		blocked = flush_outbox(&fd);
	}
	return NULL;
}

static void atfork_prepare(void)
{
	pthread_mutex_lock(&lock);
}

static void atfork_parent(void)
{
	pthread_mutex_unlock(&lock);
}

/* The child has no agent thread and no usable QPs: start clean if it makes its own. */
static void atfork_child(void)
{
	for (size_t i = 0; i < QP_BUCKETS; i++)
		while (by_qp[i])
			table_remove(by_qp[i]);
	out_len = 0;
	send_len = 0;
	thread_started = 0;
	if (wake_fd >= 0)
		close(wake_fd);
	wake_fd = -1;
	pthread_mutex_unlock(&lock);
}

/* Start the agent thread at the first QP (lock held): a process that never makes a QP, or an
 * LD_PRELOAD into every process, costs nothing. */
static void start_thread(void)
{
	static int atfork_registered;
	pthread_attr_t attr;
	pthread_t t;
	sigset_t all, old;

	if (thread_started)
		return;
	thread_started = 1;
	if (!atfork_registered) {
		pthread_atfork(atfork_prepare, atfork_parent, atfork_child);
		atfork_registered = 1;
	}
	wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (wake_fd < 0) {
		note("eventfd: %s; path control disabled", strerror(errno));
		return;
	}
	/* The application's signals are not ours to receive. */
	sigfillset(&all);
	pthread_sigmask(SIG_SETMASK, &all, &old);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&t, &attr, agent_thread, NULL))
		note("cannot start the agent thread; path control disabled");
	pthread_attr_destroy(&attr);
	pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ---------------------------------------------------------------------------------------- */
/* The three verbs that matter                                                               */

SYMVER(c4_create_qp, "ibv_create_qp@@IBVERBS_1.1");
EXPORT struct ibv_qp *c4_create_qp(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	RESOLVE(target_, "ibv_create_qp", "IBVERBS_1.1")
	struct qp_entry *e;
	struct ibv_qp *qp;

	if (!fn_) {
		errno = ENOSYS;
		return NULL;
	}
	qp = ((create_qp_fn)fn_)(pd, init);
	if (!qp)
		return NULL;
	e = calloc(1, sizeof(*e));
	if (!e)
		return qp; /* untracked, but the application's QP is fine */
	e->qp = qp;
	e->qpn = qp->qp_num;
	e->state = IBV_QPS_RESET;
	e->type = qp->qp_type;
	if (qp->context && qp->context->device)
		snprintf(e->dev, sizeof(e->dev), "%s", qp->context->device->name);
	pthread_mutex_lock(&lock);
	table_add(e);
	start_thread();
	pthread_mutex_unlock(&lock);
	return qp;
}

SYMVER(c4_modify_qp, "ibv_modify_qp@@IBVERBS_1.1");
EXPORT int c4_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask)
{
	RESOLVE(target_, "ibv_modify_qp", "IBVERBS_1.1")
	struct ibv_qp_attr planned;
	struct ibv_qp_attr *use = attr;
	struct qp_entry *e;
	uint16_t want = 0;
	uint8_t port = 0;
	int labelled = 0, rc;

	if (!fn_)
		return ENOSYS;
	if (!qp || !attr || !(mask & IBV_QP_STATE))
		return ((modify_qp_fn)fn_)(qp, attr, mask);
	pthread_mutex_lock(&lock);
	e = find_qp(qp);
	if (e && e->pending && attr->qp_state == IBV_QPS_RTR && (mask & IBV_QP_AV) &&
	    attr->ah_attr.is_global && e->want >= SPORT_BASE) {
		want = e->want;
		port = attr->ah_attr.port_num ? attr->ah_attr.port_num : e->port;
	}
	pthread_mutex_unlock(&lock);
	/* sysfs is read outside the lock */
	if (want && gid_is_roce_v2(qp, port, attr->ah_attr.grh.sgid_index) != 0) {
		/* The caller's attr is left untouched: the planned label goes in a copy. */
		planned = *attr;
		planned.ah_attr.grh.flow_label = sport_to_flow_label(want);
		use = &planned;
		labelled = 1;
	}

	rc = ((modify_qp_fn)fn_)(qp, use, mask);

	pthread_mutex_lock(&lock);
	e = find_qp(qp);
	if (e && !rc) {
		if (mask & IBV_QP_PORT)
			e->port = attr->port_num;
		if (attr->qp_state == IBV_QPS_RTR && (mask & IBV_QP_DEST_QPN))
			e->rqpn = attr->dest_qp_num;
		if (attr->qp_state == IBV_QPS_RTR && (mask & IBV_QP_AV) && attr->ah_attr.is_global) {
			uint32_t fl = use->ah_attr.grh.flow_label;

			e->sport = flow_label_to_sport(fl ? fl : calc_flow_label(e->qpn, e->rqpn));
		}
		e->state = attr->qp_state;
		/* An assignment that replaced this one meanwhile waits for RTS. */
		labelled = labelled && e->pending && e->want == want;
		if (labelled) {
			e->pending = 0;
			post_result(e->token, e, e->qpn, 0, e->sport, C4PC_HOW_FLOW_LABEL,
				    "flow label 0x%x at INIT->RTR",
				    (unsigned)use->ah_attr.grh.flow_label);
		} else if (e->pending && e->state == IBV_QPS_RTS) {
			/* Before the application posts its first send on the new QP. */
			e->pending = 0;
			apply_rts(e, e->token, e->want);
		} else if (e->pending && (e->state == IBV_QPS_ERR || e->state == IBV_QPS_RESET)) {
			e->pending = 0;
			post_result(e->token, e, e->qpn, ECANCELED, 0, 0,
				    "QP went to %s before its planned port took effect",
				    e->state == IBV_QPS_ERR ? "ERR" : "RESET");
		}
	} else if (e && labelled && e->pending && e->want == want) {
		e->pending = 0;
		post_result(e->token, e, e->qpn, rc, e->sport, 0,
			    "ibv_modify_qp INIT->RTR with the planned flow label failed: %s",
			    strerror(rc));
	}
	unlock_and_wake();
	return rc;
}

SYMVER(c4_destroy_qp, "ibv_destroy_qp@@IBVERBS_1.1");
EXPORT int c4_destroy_qp(struct ibv_qp *qp)
{
	RESOLVE(target_, "ibv_destroy_qp", "IBVERBS_1.1")
	struct qp_entry *e;
	int rc;

	if (!fn_)
		return ENOSYS;
	pthread_mutex_lock(&lock);
	e = find_qp(qp);
	if (e)
		e->dying = 1; /* the agent thread is not inside a modify of it: we hold the lock */
	pthread_mutex_unlock(&lock);

	rc = ((destroy_qp_fn)fn_)(qp);

	pthread_mutex_lock(&lock);
	e = find_qp(qp);
	if (e && !rc) {
		if (e->pending)
			post_result(e->token, e, e->qpn, ECANCELED, 0, 0,
				    "QP destroyed before its planned port took effect");
		table_remove(e);
	} else if (e) {
		e->dying = 0;
	}
	unlock_and_wake();
	return rc;
}
