/* libibverbs-c4test.so: the QP verbs of libibverbs with the real prototypes, ABI and symbol
 * versions (IBVERBS_1.1 default, IBVERBS_1.0 compat, as rdma-core exports them), but no
 * device: QPs are real `struct ibv_qp` objects in memory with chosen qp_num values. The agent's
 * uprobes attach to it exactly as they attach to the real libibverbs.so.1.
 *
 * For the path-control library (plugin/pathctl) it also stands in for libmlx5 and a device:
 * - two devices, c4test_0 and c4test_1, whose ibdev_path is $C4TEST_SYSFS/class/infiniband/<dev>
 *   (a fixture tree holding gid_attrs/types/<index>);
 * - mlx5dv_modify_qp_udp_sport@MLX5_1.17 with the real rule (RC/UC QP in RTS, else EINVAL);
 *   $C4TEST_UDP_SPORT_ERRNO makes it fail with that errno (95: EOPNOTSUPP, old firmware);
 * - $C4TEST_VERBS_LOG names a file that gets one JSON line per ibv_modify_qp (every attribute
 *   the mask selects) and per mlx5dv_modify_qp_udp_sport call, so tests see what reached the
 *   "NIC". */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <infiniband/verbs.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default"), noinline, used))
#define SYMVER(impl, ver) __asm__(".symver " #impl ", " ver)

static uint32_t next_qpn = 0x100;
static pthread_mutex_t log_lock = PTHREAD_MUTEX_INITIALIZER;

/* One JSON line to $C4TEST_VERBS_LOG, written with one write() so lines never interleave. */
static void record(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void record(const char *fmt, ...)
{
	const char *path = getenv("C4TEST_VERBS_LOG");
	char line[512];
	va_list ap;
	int fd, n;

	if (!path || !*path)
		return;
	va_start(ap, fmt);
	n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	if (n < 0 || n >= (int)sizeof(line) - 1)
		return;
	line[n++] = '\n';
	pthread_mutex_lock(&log_lock);
	fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		if (write(fd, line, (size_t)n) != n)
			fprintf(stderr, "c4test: short write to %s\n", path);
		close(fd);
	}
	pthread_mutex_unlock(&log_lock);
}

#define NDEV 2
static struct ibv_device devices[NDEV];
static struct ibv_device *device_list[NDEV + 1];

EXPORT struct ibv_device **ibv_get_device_list(int *num)
{
	const char *sysfs = getenv("C4TEST_SYSFS");

	for (int i = 0; i < NDEV; i++) {
		struct ibv_device *d = &devices[i];

		memset(d, 0, sizeof(*d));
		d->node_type = IBV_NODE_CA;
		d->transport_type = IBV_TRANSPORT_IB;
		snprintf(d->name, sizeof(d->name), "c4test_%d", i);
		snprintf(d->dev_name, sizeof(d->dev_name), "uverbs%d", i);
		snprintf(d->ibdev_path, sizeof(d->ibdev_path), "%s/class/infiniband/c4test_%d",
			 sysfs ? sysfs : "/nonexistent", i);
		device_list[i] = d;
	}
	device_list[NDEV] = NULL;
	if (num)
		*num = NDEV;
	return device_list;
}

EXPORT void ibv_free_device_list(struct ibv_device **list)
{
	(void)list;
}

EXPORT const char *ibv_get_device_name(struct ibv_device *device)
{
	return device ? device->name : NULL;
}

EXPORT struct ibv_context *ibv_open_device(struct ibv_device *device)
{
	struct ibv_context *ctx = calloc(1, sizeof(*ctx));

	if (!ctx) {
		errno = ENOMEM;
		return NULL;
	}
	ctx->device = device;
	ctx->cmd_fd = ctx->async_fd = -1;
	return ctx;
}

EXPORT int ibv_close_device(struct ibv_context *context)
{
	free(context);
	return 0;
}

/* Test hook: the qp_num the next ibv_create_qp hands out. */
EXPORT void c4test_set_next_qpn(uint32_t qpn)
{
	next_qpn = qpn;
}

EXPORT struct ibv_pd *ibv_alloc_pd(struct ibv_context *context)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (!pd) {
		errno = ENOMEM;
		return NULL;
	}
	pd->context = context;
	return pd;
}

EXPORT int ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	return 0;
}

SYMVER(c4test_create_qp_1_1, "ibv_create_qp@@IBVERBS_1.1");
EXPORT struct ibv_qp *c4test_create_qp_1_1(struct ibv_pd *pd, struct ibv_qp_init_attr *init)
{
	struct ibv_qp *qp;

	if (!pd || !init) {
		errno = EINVAL;
		return NULL;
	}
	qp = calloc(1, sizeof(*qp));
	if (!qp) {
		errno = ENOMEM;
		return NULL;
	}
	qp->context = pd->context;
	qp->qp_context = init->qp_context;
	qp->pd = pd;
	qp->send_cq = init->send_cq;
	qp->recv_cq = init->recv_cq;
	qp->srq = init->srq;
	qp->qp_num = next_qpn++;
	qp->state = IBV_QPS_RESET;
	qp->qp_type = init->qp_type;
	return qp;
}

/* The transitions of the IB spec's QP state machine that an application requests. */
static int transition_ok(enum ibv_qp_state from, enum ibv_qp_state to)
{
	if (to == IBV_QPS_RESET || to == IBV_QPS_ERR)
		return 1;
	switch (from) {
	case IBV_QPS_RESET:
		return to == IBV_QPS_INIT;
	case IBV_QPS_INIT:
		return to == IBV_QPS_INIT || to == IBV_QPS_RTR;
	case IBV_QPS_RTR:
		return to == IBV_QPS_RTS;
	case IBV_QPS_RTS:
	case IBV_QPS_SQD:
	case IBV_QPS_SQE:
		return to == IBV_QPS_RTS || to == IBV_QPS_SQD;
	default:
		return 0;
	}
}

static void record_modify(const struct ibv_qp *qp, const struct ibv_qp_attr *a, int mask, int rc)
{
	char av[160] = "";

	if (mask & IBV_QP_AV)
		snprintf(av, sizeof(av),
			 ",\"is_global\":%u,\"flow_label\":%u,\"sgid_index\":%u,"
			 "\"hop_limit\":%u,\"av_port\":%u",
			 a->ah_attr.is_global, a->ah_attr.grh.flow_label, a->ah_attr.grh.sgid_index,
			 a->ah_attr.grh.hop_limit, a->ah_attr.port_num);
	record("{\"call\":\"modify\",\"qpn\":%u,\"mask\":%d,\"rc\":%d,\"state\":%d,"
	       "\"dest_qp_num\":%d,\"port_num\":%d%s}",
	       qp->qp_num, mask, rc, mask & IBV_QP_STATE ? (int)a->qp_state : -1,
	       mask & IBV_QP_DEST_QPN ? (int)a->dest_qp_num : -1,
	       mask & IBV_QP_PORT ? (int)a->port_num : -1, av);
}

SYMVER(c4test_modify_qp_1_1, "ibv_modify_qp@@IBVERBS_1.1");
EXPORT int c4test_modify_qp_1_1(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	int rc = 0;

	if (!qp || !attr)
		return EINVAL;
	if ((attr_mask & IBV_QP_STATE) && !transition_ok(qp->state, attr->qp_state))
		rc = EINVAL;
	else if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	record_modify(qp, attr, attr_mask, rc);
	return rc;
}

/* rdma-core's rule: RC or UC, in RTS. Returns 0 or an errno, as mlx5dv does. */
EXPORT int mlx5dv_modify_qp_udp_sport(struct ibv_qp *qp, uint16_t udp_sport)
{
	const char *force = getenv("C4TEST_UDP_SPORT_ERRNO");
	int rc = 0;

	if (!qp)
		return EINVAL;
	if (force && *force)
		rc = atoi(force);
	else if ((qp->qp_type != IBV_QPT_RC && qp->qp_type != IBV_QPT_UC) ||
		 qp->state != IBV_QPS_RTS)
		rc = EINVAL;
	record("{\"call\":\"udp_sport\",\"qpn\":%u,\"sport\":%u,\"rc\":%d}", qp->qp_num,
	       udp_sport, rc);
	return rc;
}

SYMVER(c4test_destroy_qp_1_1, "ibv_destroy_qp@@IBVERBS_1.1");
EXPORT int c4test_destroy_qp_1_1(struct ibv_qp *qp)
{
	if (!qp)
		return EINVAL;
	free(qp);
	return 0;
}

/* IBVERBS_1.0 compat entries take the 1.0 layout of struct ibv_qp; nothing built against a
 * current header calls them. They exist so that symbol resolution must pick the default
 * version, as it must in the real libibverbs.so.1 (whose ibv_create_qp@IBVERBS_1.0 comes
 * first in .dynsym). */
SYMVER(c4test_create_qp_1_0, "ibv_create_qp@IBVERBS_1.0");
EXPORT void *c4test_create_qp_1_0(void *pd, void *init)
{
	(void)pd;
	(void)init;
	fprintf(stderr, "c4test: IBVERBS_1.0 ibv_create_qp called\n");
	errno = ENOSYS;
	return NULL;
}

SYMVER(c4test_modify_qp_1_0, "ibv_modify_qp@IBVERBS_1.0");
EXPORT int c4test_modify_qp_1_0(void *qp, void *attr, int attr_mask)
{
	(void)qp;
	(void)attr;
	(void)attr_mask;
	return ENOSYS;
}

SYMVER(c4test_destroy_qp_1_0, "ibv_destroy_qp@IBVERBS_1.0");
EXPORT int c4test_destroy_qp_1_0(void *qp)
{
	(void)qp;
	return ENOSYS;
}
