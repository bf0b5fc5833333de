/* libibverbs-c4test.so: the QP verbs of libibverbs with the real prototypes, ABI and symbol
 * versions (IBVERBS_1.1 default, IBVERBS_1.0 compat, as rdma-core exports them), but no
 * device: QPs are real `struct ibv_qp` objects in memory with chosen qp_num values. The agent's
 * uprobes attach to it exactly as they attach to the real libibverbs.so.1. */
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#define EXPORT __attribute__((visibility("default"), noinline, used))
#define SYMVER(impl, ver) __asm__(".symver " #impl ", " ver)

static uint32_t next_qpn = 0x100;

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

SYMVER(c4test_modify_qp_1_1, "ibv_modify_qp@@IBVERBS_1.1");
EXPORT int c4test_modify_qp_1_1(struct ibv_qp *qp, struct ibv_qp_attr *attr, int attr_mask)
{
	if (!qp || !attr)
		return EINVAL;
	if ((attr_mask & IBV_QP_STATE) && !transition_ok(qp->state, attr->qp_state))
		return EINVAL;
	if (attr_mask & IBV_QP_STATE)
		qp->state = attr->qp_state;
	return 0;
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
