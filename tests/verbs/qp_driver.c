/* qp_driver: a verbs application driven line by line from stdin, linked against
 * libibverbs-c4test.so. It calls the QP verbs the way NCCL's IB transport does (RESET -> INIT
 * with a port, INIT -> RTR with dest_qp_num and a global AV, RTR -> RTS) so the uprobe
 * collector can be checked against known QP numbers.
 * `qp_driver --dlopen LIB` resolves every verb as NCCL does before 2.30 and with
 * NCCL_IBVERBS_LIB: dlopen(LIB, RTLD_NOW) and dlvsym(handle, name, "IBVERBS_1.1").
 * Commands (numbers in C syntax):
 *   open <index>                            -> "ok <device name>"; later QPs are on its PD
 *   create <qpn> <RC|UC|UD>                 -> "ok <qpn>"
 *   modify <qpn> INIT                       -> "ok" | "err <errno>"
 *   modify <qpn> RTR <rqpn> <flow_label> <dgid IPv4>
 *   modify <qpn> <RTS|SQD|ERR|RESET>
 *   loop <qpn> <n>   (n RTS -> RTS modifies) -> "ok <ns per call>"
 *   destroy <qpn>                           -> "ok" | "err <errno>"
 * End of input exits without destroying what is left (a process that dies with QPs). */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <infiniband/verbs.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define MAX_QPS 4096

void c4test_set_next_qpn(uint32_t qpn);

static struct ibv_qp *qps[MAX_QPS];
static struct ibv_pd *pds[16]; /* every PD made, released at exit */
static int npds;

/* The verbs, bound at link time or resolved like NCCL (--dlopen). */
static struct {
	struct ibv_device **(*get_device_list)(int *);
	struct ibv_context *(*open_device)(struct ibv_device *);
	struct ibv_pd *(*alloc_pd)(struct ibv_context *);
	struct ibv_qp *(*create_qp)(struct ibv_pd *, struct ibv_qp_init_attr *);
	int (*modify_qp)(struct ibv_qp *, struct ibv_qp_attr *, int);
	int (*destroy_qp)(struct ibv_qp *);
} V = {
	(ibv_get_device_list), ibv_open_device, ibv_alloc_pd, ibv_create_qp, ibv_modify_qp,
	ibv_destroy_qp,
};

static int load(const char *lib)
{
	void *h = dlopen(lib, RTLD_NOW);

	if (!h) {
		fprintf(stderr, "dlopen %s: %s\n", lib, dlerror());
		return -1;
	}
#define SYM(field, name)                                                                    \
	if (!(*(void **)&V.field = dlvsym(h, name, "IBVERBS_1.1"))) {                       \
		fprintf(stderr, "dlvsym %s@IBVERBS_1.1: %s\n", name, dlerror());            \
		return -1;                                                                  \
	}
	SYM(get_device_list, "ibv_get_device_list")
	SYM(open_device, "ibv_open_device")
	SYM(alloc_pd, "ibv_alloc_pd")
	SYM(create_qp, "ibv_create_qp")
	SYM(modify_qp, "ibv_modify_qp")
	SYM(destroy_qp, "ibv_destroy_qp")
#undef SYM
	return 0;
}

static struct ibv_qp *find(uint32_t qpn)
{
	for (int i = 0; i < MAX_QPS; i++)
		if (qps[i] && qps[i]->qp_num == qpn)
			return qps[i];
	return NULL;
}

static int slot_of(struct ibv_qp *qp)
{
	for (int i = 0; i < MAX_QPS; i++)
		if (qps[i] == qp)
			return i;
	return -1;
}

static enum ibv_qp_type parse_type(const char *s)
{
	if (!strcmp(s, "UC"))
		return IBV_QPT_UC;
	if (!strcmp(s, "UD"))
		return IBV_QPT_UD;
	return IBV_QPT_RC;
}

static int parse_state(const char *s, enum ibv_qp_state *out)
{
	static const char *names[] = {"RESET", "INIT", "RTR", "RTS", "SQD", "SQE", "ERR"};

	for (unsigned i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (!strcmp(s, names[i])) {
			*out = (enum ibv_qp_state)i;
			return 0;
		}
	return -1;
}

/* The attribute mask an application passes for each transition (as NCCL's net_ib does). */
static int modify(struct ibv_qp *qp, enum ibv_qp_state to, uint32_t rqpn, uint32_t flow_label,
		  const char *dgid_ipv4)
{
	struct ibv_qp_attr attr;
	int mask = IBV_QP_STATE;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = to;
	if (to == IBV_QPS_INIT) {
		attr.pkey_index = 0;
		attr.port_num = 1;
		attr.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	} else if (to == IBV_QPS_RTR) {
		struct in_addr v4;

		if (!dgid_ipv4 || inet_pton(AF_INET, dgid_ipv4, &v4) != 1)
			return EINVAL;
		attr.path_mtu = IBV_MTU_4096;
		attr.dest_qp_num = rqpn;
		attr.rq_psn = 0;
		attr.max_dest_rd_atomic = 1;
		attr.min_rnr_timer = 12;
		attr.ah_attr.is_global = 1;
		/* RoCEv2 GID of an IPv4 address: ::ffff:a.b.c.d */
		attr.ah_attr.grh.dgid.raw[10] = 0xff;
		attr.ah_attr.grh.dgid.raw[11] = 0xff;
		memcpy(&attr.ah_attr.grh.dgid.raw[12], &v4, 4);
		attr.ah_attr.grh.flow_label = flow_label;
		attr.ah_attr.grh.sgid_index = 3;
		attr.ah_attr.grh.hop_limit = 255;
		attr.ah_attr.port_num = 1;
		mask |= IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
			IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	} else if (to == IBV_QPS_RTS && qp->state == IBV_QPS_RTR) {
		attr.timeout = 20;
		attr.retry_cnt = 7;
		attr.rnr_retry = 7;
		attr.sq_psn = 0;
		attr.max_rd_atomic = 1;
		mask |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
			IBV_QP_MAX_QP_RD_ATOMIC;
	}
	return V.modify_qp(qp, &attr, mask);
}

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

int main(int argc, char **argv)
{
	struct ibv_pd *pd;
	char line[256];

	if (argc == 3 && !strcmp(argv[1], "--dlopen") && load(argv[2]))
		return 1;
	pd = pds[npds++] = V.alloc_pd(NULL);
	if (!pd) {
		perror("ibv_alloc_pd");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	while (fgets(line, sizeof(line), stdin)) {
		char cmd[16] = "", a2[16] = "", a5[64] = "";
		unsigned long a1 = 0, a3 = 0, a4 = 0;
		struct ibv_qp *qp;
		int n = sscanf(line, "%15s %li %15s %li %li %63s", cmd, (long *)&a1, a2,
			       (long *)&a3, (long *)&a4, a5);

		if (n < 2) {
			printf("err %d\n", EINVAL);
			continue;
		}
		qp = find((uint32_t)a1);
		if (!strcmp(cmd, "open")) {
			int n = 0;
			struct ibv_device **devs = V.get_device_list(&n);
			struct ibv_context *ctx = devs && (int)a1 < n ? V.open_device(devs[a1]) : NULL;
			struct ibv_pd *dpd = ctx && npds < 16 ? V.alloc_pd(ctx) : NULL;

			if (!dpd) {
				printf("err %d\n", ENODEV);
				continue;
			}
			pd = pds[npds++] = dpd;
			printf("ok %s\n", ctx->device->name);
		} else if (!strcmp(cmd, "create")) {
			int slot = slot_of(NULL);
			struct ibv_qp_init_attr init;

			memset(&init, 0, sizeof(init));
			init.qp_type = parse_type(a2);
			init.cap.max_send_wr = init.cap.max_recv_wr = 64;
			init.cap.max_send_sge = init.cap.max_recv_sge = 1;
			c4test_set_next_qpn((uint32_t)a1);
			qp = slot < 0 ? NULL : V.create_qp(pd, &init);
			if (!qp) {
				printf("err %d\n", slot < 0 ? ENOSPC : errno);
				continue;
			}
			qps[slot] = qp;
			printf("ok %u\n", qp->qp_num);
		} else if (!qp) {
			printf("err %d\n", ENOENT);
		} else if (!strcmp(cmd, "modify")) {
			enum ibv_qp_state to;
			int rc = parse_state(a2, &to) ? EINVAL :
				 modify(qp, to, (uint32_t)a3, (uint32_t)a4, a5);

			rc ? printf("err %d\n", rc) : printf("ok\n");
		} else if (!strcmp(cmd, "loop")) {
			long count = strtol(a2, NULL, 0);
			double t0 = now_ns();
			int rc = 0;

			for (long i = 0; i < count && !rc; i++)
				rc = modify(qp, IBV_QPS_RTS, 0, 0, NULL);
			if (rc || count <= 0)
				printf("err %d\n", rc ? rc : EINVAL);
			else
				printf("ok %.1f\n", (now_ns() - t0) / count);
		} else if (!strcmp(cmd, "destroy")) {
			int slot = slot_of(qp);
			int rc = V.destroy_qp(qp);

			if (!rc)
				qps[slot] = NULL;
			rc ? printf("err %d\n", rc) : printf("ok\n");
		} else {
			printf("err %d\n", EINVAL);
		}
	}
	while (npds)
		ibv_dealloc_pd(pds[--npds]);
	return 0;
}
