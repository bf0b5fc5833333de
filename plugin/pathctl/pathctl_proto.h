/* Messages between the c4 agent and the path-control library inside a training process, over
 * the agent's Unix SOCK_SEQPACKET socket (default /run/c4/pathctl.sock). One message per
 * packet, fixed size, host byte order (both ends run on one host). Mirrored by
 * agent/pathctl.py; docs/planning.md describes the exchange.
 *
 * agent -> library  C4PC_ASSIGN: make QP `lqpn` on `dev` use UDP source port `sport`.
 * library -> agent  C4PC_RESULT: the outcome for `token`; err 0 (applied, `sport` in use,
 *                   `how` says by which mechanism) or an errno with `detail`.
 * A result may come long after its assignment (a QP not yet at RTR is changed when it gets
 * there); the agent reports what arrived by its deadline. */
#ifndef C4_PATHCTL_PROTO_H
#define C4_PATHCTL_PROTO_H

#include <stdint.h>

#define C4PC_MAGIC 0x43503443u /* "C4PC" */
#define C4PC_VERSION 1
#define C4PC_ASSIGN 1
#define C4PC_RESULT 2

#define C4PC_HOW_FLOW_LABEL 1 /* GRH flow label set at INIT->RTR */
#define C4PC_HOW_UDP_SPORT 2  /* mlx5dv_modify_qp_udp_sport on an RTS QP */

#define C4PC_DEV_LEN 64
#define C4PC_DETAIL_LEN 96

struct c4pc_msg {
	uint32_t magic;
	uint16_t version;
	uint16_t type;
	uint64_t token; /* the agent's reference for one assignment, echoed in its result */
	uint32_t lqpn;
	uint32_t rqpn; /* result: the QP's remote QP number (0 before RTR) */
	uint16_t sport;
	uint16_t how;
	int32_t err;
	char dev[C4PC_DEV_LEN];	      /* NUL-terminated; assign: "" matches any device */
	char detail[C4PC_DETAIL_LEN]; /* result: NUL-terminated reason or note */
};

_Static_assert(sizeof(struct c4pc_msg) == 192, "c4pc_msg is 192 bytes on every ABI");

#endif
