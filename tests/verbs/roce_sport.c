/* The kernel's RoCE UDP source port functions, copied from include/rdma/ib_verbs.h, as an
 * oracle for c4/roce.py: reads "lqpn rqpn flow_label" lines, prints the port of each. */
#include <stdint.h>
#include <stdio.h>

typedef uint16_t u16;
typedef uint32_t u32;
typedef uint64_t u64;

#define IB_GRH_FLOWLABEL_MASK (0x000FFFFF)

static inline u32 rdma_calc_flow_label(u32 lqpn, u32 rqpn)
{
	u64 v = (u64)lqpn * rqpn;

	v ^= v >> 20;
	v ^= v >> 40;

	return (u32)(v & IB_GRH_FLOWLABEL_MASK);
}

static inline u16 rdma_flow_label_to_udp_sport(u32 fl)
{
	u32 fl_low = fl & 0x03fff, fl_high = fl & 0xFC000;

	fl_low ^= fl_high >> 14;
	return (u16)(fl_low | 0xC000);
}

static inline u16 rdma_get_udp_sport(u32 fl, u32 lqpn, u32 rqpn)
{
	if (!fl)
		fl = rdma_calc_flow_label(lqpn, rqpn);

	return rdma_flow_label_to_udp_sport(fl);
}

int main(void)
{
	unsigned long lqpn, rqpn, fl;

	while (scanf("%lu %lu %lu", &lqpn, &rqpn, &fl) == 3)
		printf("%u\n", rdma_get_udp_sport((u32)fl, (u32)lqpn, (u32)rqpn));
	return 0;
}
