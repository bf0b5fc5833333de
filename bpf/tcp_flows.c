/* c4 per-connection TCP monitor, compiled and loaded by BCC (agent/collectors/tcp_flows.py).
 *
 * Every value comes from tracepoint arguments (BCC builds their layout from tracefs) or from
 * helpers; no kernel struct is dereferenced, so the installed headers may be older than the
 * running kernel. Counters are aggregated here, per socket, and user space reads the maps
 * once per interval: no per-packet event reaches user space. The ring (or perf) buffer carries
 * only discrete events: retransmit bursts and resets.
 *
 * A flow is keyed by its socket address (`skaddr`, the one value every tracepoint shares) and
 * identified by (skaddr, first_ns): when a socket address is reused by a new connection the
 * old entry is retired first. The address never leaves the agent.
 *
 * Feature flags, set by user space from the tracefs format files of this kernel:
 *   C4_MAX_FLOWS, C4_RING_PAGES     map sizes
 *   C4_RINGBUF                      BPF ring buffer (else perf buffer)
 *   C4_CGROUP_FILTER                the `cgroup` option is set
 *   C4_HAVE_PROBE_COOKIE            tcp:tcp_probe has sock_cookie
 *   C4_HAVE_PROBE_SND_WND           tcp:tcp_probe has snd_wnd (zero-window intervals)
 *   C4_HAVE_RETRANS_ERR             tcp:tcp_retransmit_skb has err (6.x: fires on failures too)
 *   C4_HAVE_CONG_STATE              tcp:tcp_cong_state_set (6.2+): retransmission timeouts
 *   C4_HAVE_KFREE_REASON            skb:kfree_skb has reason (5.17+)
 *   C4_HAVE_RX_SK                   skb:kfree_skb has rx_sk (drops attributable to a socket)
 *   C4_HAVE_SEND_RESET              tcp:tcp_send_reset with sockaddr-style saddr/daddr
 *   C4_HAVE_RST_REASON              ... and its reason field
 *   C4_HAVE_RECEIVE_RESET           tcp:tcp_receive_reset
 *   C4_HAVE_RECEIVE_RESET_COOKIE    ... and its sock_cookie
 *   C4_HAVE_SOCK_LENGTH             sock:sock_send_length / sock_recv_length: owner of
 *                                   accepted connections (process context), bytes read
 */

/* tracefs types some fields with enums that headers older than the kernel may lack; only
 * their 4-byte layout matters here (names are read from tracefs by user space). */
#ifdef C4_HAVE_KFREE_REASON
#if __has_include(<net/dropreason.h>)
#include <net/dropreason.h>
#else
#include <linux/skbuff.h>
#endif
#endif
#ifdef C4_HAVE_RST_REASON
#if __has_include(<net/rstreason.h>)
#include <net/rstreason.h>
#else
enum sk_rst_reason { C4_SK_RST_REASON_PLACEHOLDER };
#endif
#endif

#define C4_AF_INET 2
#define C4_AF_INET6 10
#define C4_IPPROTO_TCP 6
#define C4_ETH_P_IP 0x0800
#define C4_ETH_P_IPV6 0x86DD
#define C4_EEXIST 17

/* uapi TCP states (netinet/tcp.h) */
#define C4_TCP_ESTABLISHED 1
#define C4_TCP_SYN_SENT 2
#define C4_TCP_SYN_RECV 3
#define C4_TCP_CLOSE 7
#define C4_TCP_LISTEN 10

#define C4_DROP_SLOTS 256 /* reasons >= 255 (subsystem-coded) share the last slot */
#define C4_MAX_PIDS 1024

/* config.flags */
#define CFG_PORTS 1
#define CFG_PIDS 2
#define CFG_CGROUP 4

/* stats indexes, mirrored in agent/collectors/tcp_flows.py STATS */
enum {
	S_MAP_FULL,
	S_CLOSED_FULL,
	S_EVENTS_LOST,
	S_HIT_PROBE,
	S_HIT_RETRANS,
	S_HIT_STATE,
	S_HIT_DROP,
	S_HIT_RESET,
	S_HIT_OWNER,
	S_HIT_CONG,
	S_NSTATS,
};

/* event types, mirrored in user space */
enum { EV_RETRANS_BURST = 1, EV_RESET_SENT = 2, EV_RESET_RECEIVED = 3 };

struct config {
	u32 flags;
	u32 epoch;     /* bumped by user space at each collect: a burst counts within one epoch;
	                * never 0 once configured (0: filters not filled yet, trace nothing) */
	u32 burst;     /* retransmits per flow per epoch that emit an event; 0: never */
	u32 cg_level;  /* level of the configured cgroup v2 in the hierarchy */
	u64 cg_id;     /* its id (inode number of the cgroup directory) */
};

/* Field order avoids implicit padding: user space decodes the raw bytes (size checked). */
struct flow {
	u64 first_ns;       /* when the entry was made: with skaddr, the flow's identity */
	u64 cookie;         /* socket cookie (tcp_probe), 0 until known */
	u64 cgroup;         /* cgroup v2 id of the owner */
	u64 bytes_acked;    /* snd_una advance */
	u64 bytes_received; /* read by the application (or segment payloads, see below) */
	u32 retrans;
	u32 retrans_fail;
	u32 drops;          /* kfree_skb attributed through rx_sk */
	u32 last_drop_reason;
	u32 state_changes;
	u32 snd_una;
	u32 srtt_us;
	u32 cwnd;
	u32 pid;            /* tgid of the owner, 0 if unknown */
	u32 burst_epoch;
	u32 burst_count;
	u32 zero_wnd;       /* epochs (intervals) in which a segment found the peer's window 0 */
	u32 zwnd_epoch;     /* the last of them */
	u32 rto;            /* retransmission timeouts (entries into TCP_CA_Loss) */
	u16 sport;
	u16 dport;
	u16 family;
	u8 state;
	u8 una_valid;       /* one byte per flag: no read-modify-write races between CPUs */
	u8 owner_known;
	u8 ignored;         /* owner known and rejected by the pid/cgroup filter */
	u8 closed;
	u8 saddr[16];
	u8 daddr[16];
	char comm[16];
	u8 accepted;        /* made by a passive open (SYN_RECV): its port is the listener's */
};

struct closed_key {
	u64 sk;
	u64 first_ns;
};

struct tuple {
	u8 saddr[16];
	u8 daddr[16];
	u16 sport;
	u16 dport;
	u16 family;
};

struct event {
	u64 cookie;
	u32 pid;
	u32 count;
	u32 reason;   /* reset reason (enum sk_rst_reason) or ~0 when the kernel has none */
	u16 sport;
	u16 dport;
	u16 family;
	u8 type;
	u8 state;
	u8 saddr[16];
	u8 daddr[16];
	char comm[16];
};

BPF_ARRAY(config, struct config, 1);
BPF_ARRAY(port_filter, u8, 65536);
BPF_HASH(pid_filter, u32, u8, C4_MAX_PIDS);
BPF_HASH(flows, u64, struct flow, C4_MAX_FLOWS);
BPF_HASH(closed, struct closed_key, struct flow, C4_MAX_FLOWS);
BPF_PERCPU_ARRAY(stats, u64, S_NSTATS);
BPF_PERCPU_ARRAY(drops_by_reason, u64, C4_DROP_SLOTS);

#ifdef C4_RINGBUF
BPF_RINGBUF_OUTPUT(events, C4_RING_PAGES);
#else
BPF_PERF_OUTPUT(events);
#endif

static __always_inline void stat_inc(int idx)
{
	u64 *v = stats.lookup(&idx);
	if (v)
		(*v)++;
}

static __always_inline void emit(void *ctx, struct event *e)
{
#ifdef C4_RINGBUF
	if (events.ringbuf_output(e, sizeof(*e), 0))
#else
	if (events.perf_submit(ctx, e, sizeof(*e)))
#endif
		stat_inc(S_EVENTS_LOST);
}

/* NULL until user space has filled the filters (epoch 0): the programs are attached before
 * the maps are filled, and a flow created in between would bypass the filters. */
static __always_inline struct config *cfg(void)
{
	int zero = 0;
	struct config *c = config.lookup(&zero);
	return c && c->epoch ? c : 0;
}

static __always_inline int port_ok(struct config *c, u16 sport, u16 dport)
{
	if (!(c->flags & CFG_PORTS))
		return 1;
	int k = sport;
	u8 *v = port_filter.lookup(&k);
	if (v && *v)
		return 1;
	k = dport;
	v = port_filter.lookup(&k);
	return v && *v;
}

/* Only in process context: the current task is the socket's user. */
static __always_inline int owner_ok(struct config *c, u32 tgid)
{
	if ((c->flags & CFG_PIDS) && !pid_filter.lookup(&tgid))
		return 0;
#ifdef C4_CGROUP_FILTER /* the helper needs Linux 5.7+: only compiled in when used */
	if ((c->flags & CFG_CGROUP) &&
	    bpf_get_current_ancestor_cgroup_id(c->cg_level) != c->cg_id)
		return 0;
#endif
	return 1;
}

static __always_inline void set_owner(struct config *c, struct flow *f)
{
	u32 tgid = bpf_get_current_pid_tgid() >> 32;
	f->pid = tgid;
	f->cgroup = bpf_get_current_cgroup_id();
	bpf_get_current_comm(&f->comm, sizeof(f->comm));
	if ((c->flags & (CFG_PIDS | CFG_CGROUP)) && !owner_ok(c, tgid))
		f->ignored = 1;
	f->owner_known = 1;
}

static __always_inline struct flow *flow_create(struct config *c, u64 sk, struct tuple *t,
						u8 state)
{
	if (!port_ok(c, t->sport, t->dport))
		return 0;
	struct flow z = {};
	__builtin_memcpy(z.saddr, t->saddr, 16);
	__builtin_memcpy(z.daddr, t->daddr, 16);
	z.sport = t->sport;
	z.dport = t->dport;
	z.family = t->family;
	z.state = state;
	z.accepted = state == C4_TCP_SYN_RECV;
	z.first_ns = bpf_ktime_get_ns();
	int err = flows.insert(&sk, &z);
	if (err && err != -C4_EEXIST) {
		stat_inc(S_MAP_FULL);
		return 0;
	}
	return flows.lookup(&sk);
}

/* Hand the flow to the `closed` map, where user space reports it once and deletes it. */
static __always_inline void flow_retire(u64 sk, struct flow *f)
{
	struct closed_key k = {.sk = sk, .first_ns = f->first_ns};
	f->closed = 1;
	if (!f->ignored && closed.update(&k, f))
		stat_inc(S_CLOSED_FULL);
	flows.delete(&sk);
}

/* Tracepoints with separate v4 / v6 address fields (set_state, retransmit, receive_reset).
 * The ctx buffer is read with byte copies: tracepoint ctx loads must be aligned. */
#define TUPLE_FROM_SPLIT(t, a)                                                \
	do {                                                                  \
		(t)->sport = (a)->sport;                                      \
		(t)->dport = (a)->dport;                                      \
		(t)->family = (a)->family;                                    \
		if ((a)->family == C4_AF_INET6) {                             \
			__builtin_memcpy((t)->saddr, (a)->saddr_v6, 16);      \
			__builtin_memcpy((t)->daddr, (a)->daddr_v6, 16);      \
		} else {                                                      \
			__builtin_memcpy((t)->saddr, (a)->saddr, 4);          \
			__builtin_memcpy((t)->daddr, (a)->daddr, 4);          \
		}                                                             \
	} while (0)

/* The flow of socket `sk`, made from tuple `t` when it is not tracked yet (NULL: filtered
 * out or the map is full). */
static __always_inline struct flow *flow_get(struct config *c, u64 sk, struct tuple *t,
					     u8 state)
{
	struct flow *f = flows.lookup(&sk);
	return f ? f : flow_create(c, sk, t, state);
}

/* sockaddr_in: family, port, addr at 4; sockaddr_in6: family, port, flowinfo, addr at 8 */
static __always_inline void addr_from_sockaddr(u8 *dst, const u8 *sa, u16 family)
{
	if (family == C4_AF_INET6)
		__builtin_memcpy(dst, sa + 8, 16);
	else
		__builtin_memcpy(dst, sa + 4, 4);
}

static __always_inline void event_from_flow(struct event *e, struct flow *f)
{
	__builtin_memcpy(e->saddr, f->saddr, 16);
	__builtin_memcpy(e->daddr, f->daddr, 16);
	__builtin_memcpy(e->comm, f->comm, 16);
	e->sport = f->sport;
	e->dport = f->dport;
	e->family = f->family;
	e->pid = f->pid;
	e->cookie = f->cookie;
	e->state = f->state;
}

TRACEPOINT_PROBE(tcp, tcp_probe)
{
	stat_inc(S_HIT_PROBE);
	struct config *c = cfg();
	if (!c)
		return 0;
	u64 sk = (u64)args->skaddr;
	struct flow *f = flows.lookup(&sk);
	if (!f) {
		struct tuple t = {};
		t.sport = args->sport;
		t.dport = args->dport;
		t.family = args->family;
		addr_from_sockaddr(t.saddr, args->saddr, t.family);
		addr_from_sockaddr(t.daddr, args->daddr, t.family);
		/* tcp_probe runs in tcp_rcv_established only */
		f = flow_create(c, sk, &t, C4_TCP_ESTABLISHED);
		if (!f)
			return 0;
	}
	if (f->ignored)
		return 0;
	/* snd_una before this segment is processed; wrap-safe u32 advance */
	u32 una = args->snd_una;
	if (f->una_valid) {
		u32 d = una - f->snd_una;
		if ((s32)d > 0) {
			f->bytes_acked += d;
			f->snd_una = una;
		}
	} else {
		f->snd_una = una;
		f->una_valid = 1;
	}
#ifndef C4_HAVE_SOCK_LENGTH
	/* fallback: payload of this segment (duplicates included; u16, so a coalesced segment
	 * over 64 KiB is undercounted). sock_recv_length counts what the application read. */
	f->bytes_received += args->data_len;
#endif
	f->srtt_us = args->srtt;
	f->cwnd = args->snd_cwnd;
#ifdef C4_HAVE_PROBE_SND_WND
	/* the window the peer advertised (before this segment): 0 while its application does
	 * not read (stopped, hung) and our data fills its buffer; counted once per epoch */
	if (args->snd_wnd == 0 && f->zwnd_epoch != c->epoch) {
		f->zwnd_epoch = c->epoch;
		f->zero_wnd++;
	}
#endif
#ifdef C4_HAVE_PROBE_COOKIE
	f->cookie = args->sock_cookie;
#endif
	return 0;
}

TRACEPOINT_PROBE(tcp, tcp_retransmit_skb)
{
	stat_inc(S_HIT_RETRANS);
	struct config *c = cfg();
	if (!c)
		return 0;
	struct tuple t = {};
	TUPLE_FROM_SPLIT(&t, args);
	struct flow *f = flow_get(c, (u64)args->skaddr, &t, args->state);
	if (!f || f->ignored)
		return 0;
#ifdef C4_HAVE_RETRANS_ERR
	if (args->err) {
		__sync_fetch_and_add(&f->retrans_fail, 1);
		return 0;
	}
#endif
	__sync_fetch_and_add(&f->retrans, 1);
	if (!c->burst)
		return 0;
	u32 epoch = c->epoch;
	if (f->burst_epoch != epoch) {
		f->burst_epoch = epoch;
		f->burst_count = 0;
	}
	if (++f->burst_count == c->burst) {
		struct event e = {};
		event_from_flow(&e, f);
		e.type = EV_RETRANS_BURST;
		e.count = f->burst_count;
		e.reason = ~0U;
		emit(args, &e);
	}
	return 0;
}

#ifdef C4_HAVE_CONG_STATE
#define C4_TCP_CA_LOSS 4 /* enum tcp_ca_state */
/* A retransmission timeout puts the socket in Loss (tcp_enter_loss, once per expiry of the
 * timer, backoffs included): the TCP counterpart of an RDMA NIC's ACK timeouts, per flow, with
 * no NIC counter involved. (Loss is also entered when the path MTU shrinks: rare.) */
TRACEPOINT_PROBE(tcp, tcp_cong_state_set)
{
	if (args->cong_state != C4_TCP_CA_LOSS)
		return 0;
	stat_inc(S_HIT_CONG);
	struct config *c = cfg();
	if (!c)
		return 0;
	struct tuple t = {};
	TUPLE_FROM_SPLIT(&t, args);
	struct flow *f = flow_get(c, (u64)args->skaddr, &t, C4_TCP_ESTABLISHED);
	if (f && !f->ignored)
		__sync_fetch_and_add(&f->rto, 1);
	return 0;
}
#endif

TRACEPOINT_PROBE(sock, inet_sock_set_state)
{
	if (args->protocol != C4_IPPROTO_TCP)
		return 0;
	int os = args->oldstate, ns = args->newstate;
	/* listeners are not flows; a passive open's child is cloned from its listener, so it
	 * enters SYN_RECV from LISTEN */
	if (ns == C4_TCP_LISTEN || (os == C4_TCP_LISTEN && ns != C4_TCP_SYN_RECV))
		return 0;
	stat_inc(S_HIT_STATE);
	struct config *c = cfg();
	if (!c)
		return 0;
	u64 sk = (u64)args->skaddr;
	struct tuple t = {};
	TUPLE_FROM_SPLIT(&t, args);
	int connect = os == C4_TCP_CLOSE && ns == C4_TCP_SYN_SENT;
	struct flow *f = flows.lookup(&sk);
	if (f && (connect || ns == C4_TCP_SYN_RECV)) {
		/* a new connection on a reused socket address: the old entry missed its close */
		flow_retire(sk, f);
		f = 0;
	}
	if (!f) {
		if (ns == C4_TCP_CLOSE)
			return 0; /* never tracked (filtered, or before the program loaded) */
		f = flow_create(c, sk, &t, ns);
		if (!f)
			return 0;
		/* connect() is process context: the caller owns the socket (and the owner
		 * filter may mark the flow ignored). Passive opens (SYN_RECV) run in softirq,
		 * where the current task is unrelated. */
		if (connect)
			set_owner(c, f);
	}
	if (f->ignored) {
		if (ns == C4_TCP_CLOSE)
			flows.delete(&sk);
		return 0;
	}
	if (t.sport) { /* at SYN_SENT the source port (and maybe address) is not chosen yet */
		__builtin_memcpy(f->saddr, t.saddr, 16);
		__builtin_memcpy(f->daddr, t.daddr, 16);
		f->sport = t.sport;
		f->dport = t.dport;
		f->family = t.family;
	}
	f->state = ns;
	__sync_fetch_and_add(&f->state_changes, 1);
	if (ns == C4_TCP_CLOSE)
		flow_retire(sk, f);
	return 0;
}

TRACEPOINT_PROBE(skb, kfree_skb)
{
	u16 proto = args->protocol; /* host order in the tracepoint */
	if (proto != C4_ETH_P_IP && proto != C4_ETH_P_IPV6)
		return 0;
	stat_inc(S_HIT_DROP);
	u32 reason = 0;
#ifdef C4_HAVE_KFREE_REASON
	reason = args->reason;
#endif
	int slot = reason < C4_DROP_SLOTS - 1 ? reason : C4_DROP_SLOTS - 1;
	u64 *n = drops_by_reason.lookup(&slot);
	if (n)
		(*n)++;
#ifdef C4_HAVE_RX_SK
	u64 sk = (u64)args->rx_sk;
	if (!sk)
		return 0;
	struct flow *f = flows.lookup(&sk);
	if (f && !f->ignored) {
		__sync_fetch_and_add(&f->drops, 1);
		f->last_drop_reason = reason;
	}
#endif
	return 0;
}

/* Resets: emitted when the ports match; with an owner filter, only for flows it admitted. */
static __always_inline void emit_reset(void *ctx, struct config *c, u64 sk, struct tuple *t,
				       u8 type, u8 state, u32 reason, u64 cookie)
{
	stat_inc(S_HIT_RESET);
	struct flow *f = sk ? flows.lookup(&sk) : 0;
	if (f && f->ignored)
		return;
	if (!f && ((c->flags & (CFG_PIDS | CFG_CGROUP)) || !port_ok(c, t->sport, t->dport)))
		return;
	struct event e = {};
	if (f) { /* owner and state from the flow; its tuple may predate the port choice */
		event_from_flow(&e, f);
		if (state)
			e.state = state;
	} else {
		e.state = state;
	}
	__builtin_memcpy(e.saddr, t->saddr, 16);
	__builtin_memcpy(e.daddr, t->daddr, 16);
	e.sport = t->sport;
	e.dport = t->dport;
	e.family = t->family;
	if (cookie)
		e.cookie = cookie;
	e.type = type;
	e.reason = reason;
	emit(ctx, &e);
}

#ifdef C4_HAVE_SEND_RESET
TRACEPOINT_PROBE(tcp, tcp_send_reset)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	struct tuple t = {};
	u16 family = 0;
	__builtin_memcpy(&family, args->saddr, 2);
	u16 sp = 0, dp = 0;
	__builtin_memcpy(&sp, args->saddr + 2, 2);
	__builtin_memcpy(&dp, args->daddr + 2, 2);
	t.family = family;
	t.sport = bpf_ntohs(sp);
	t.dport = bpf_ntohs(dp);
	addr_from_sockaddr(t.saddr, args->saddr, family);
	addr_from_sockaddr(t.daddr, args->daddr, family);
	u32 reason = ~0U;
#ifdef C4_HAVE_RST_REASON
	reason = args->reason;
#endif
	emit_reset(args, c, (u64)args->skaddr, &t, EV_RESET_SENT, args->state, reason, 0);
	return 0;
}
#endif

#ifdef C4_HAVE_RECEIVE_RESET
TRACEPOINT_PROBE(tcp, tcp_receive_reset)
{
	struct config *c = cfg();
	if (!c)
		return 0;
	struct tuple t = {};
	TUPLE_FROM_SPLIT(&t, args);
	u64 cookie = 0;
#ifdef C4_HAVE_RECEIVE_RESET_COOKIE
	cookie = args->sock_cookie;
#endif
	emit_reset(args, c, (u64)args->skaddr, &t, EV_RESET_RECEIVED, 0, ~0U, cookie);
	return 0;
}
#endif

#ifdef C4_HAVE_SOCK_LENGTH
#define C4_MSG_PEEK 2

/* send/recv syscalls run in the owner's context: learn the owner of flows first seen in
 * softirq (accepted connections, connections older than the program). */
static __always_inline struct flow *owned_flow(void *skp)
{
	u64 sk = (u64)skp;
	struct flow *f = flows.lookup(&sk);
	if (!f || f->owner_known)
		return f;
	struct config *c = cfg();
	if (!c)
		return 0;
	stat_inc(S_HIT_OWNER);
	set_owner(c, f);
	return f;
}

TRACEPOINT_PROBE(sock, sock_send_length)
{
	if (args->protocol == C4_IPPROTO_TCP)
		owned_flow(args->sk);
	return 0;
}

/* bytes the application read: exact, no duplicates, unlike segment payloads */
TRACEPOINT_PROBE(sock, sock_recv_length)
{
	if (args->protocol != C4_IPPROTO_TCP)
		return 0;
	struct flow *f = owned_flow(args->sk);
	if (f && !f->ignored && args->ret > 0 && !(args->flags & C4_MSG_PEEK))
		__sync_fetch_and_add(&f->bytes_received, (u64)args->ret);
	return 0;
}
#endif
