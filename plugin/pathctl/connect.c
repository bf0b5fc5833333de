/* libc4-connect.so: LD_PRELOAD interposer on connect() that gives a TCP connection the source
 * port C4P planned for its destination (docs/planning.md, "Applying plans: TCP").
 *
 * The agent keeps a table of planned ports in a file ($C4_TCP_PORTS, default
 * /run/c4/tcp-ports; agent/tcp_ports.py writes it atomically), one rule per line:
 *     <destination address> <destination port> <source port>
 * Several lines for one destination are several ports, taken in order by successive
 * connections. On connect() of an unbound TCP socket to a destination with rules, the socket is
 * bound to the first planned port that gives a unique 4-tuple; when none does (ports held by
 * live connections or TIME_WAIT) the connection is made exactly as without the interposer.
 * The file is re-read when it changes, so a re-plan reaches the next connect(): re-pathing a
 * TCP flow means reconnecting it. Errors never reach the application: every failure falls back
 * to the connect() it asked for. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))
#define DEFAULT_PORTS "/run/c4/tcp-ports"
#define MAX_RULES 65536
#define MAX_CANDIDATES 64

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

struct rule {
	struct in6_addr dst; /* IPv4 as ::ffff:a.b.c.d */
	uint16_t dport, sport;
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static struct rule *rules;
static size_t nrules;
static struct stat seen;
static int have_seen;

static void to_v6(const struct sockaddr *sa, struct in6_addr *out, uint16_t *port)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;

		memset(out, 0, sizeof(*out));
		out->s6_addr[10] = out->s6_addr[11] = 0xff;
		memcpy(&out->s6_addr[12], &in->sin_addr, 4);
		*port = ntohs(in->sin_port);
	} else {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;

		*out = in6->sin6_addr;
		*port = ntohs(in6->sin6_port);
	}
}

static int parse_line(const char *line, struct rule *r)
{
	char addr[64];
	unsigned dport, sport;
	struct in_addr v4;
	char tail;

	if (sscanf(line, "%63s %u %u %c", addr, &dport, &sport, &tail) != 3 || dport > 65535 ||
	    sport == 0 || sport > 65535)
		return -1;
	if (inet_pton(AF_INET, addr, &v4) == 1) {
		memset(&r->dst, 0, sizeof(r->dst));
		r->dst.s6_addr[10] = r->dst.s6_addr[11] = 0xff;
		memcpy(&r->dst.s6_addr[12], &v4, 4);
	} else if (inet_pton(AF_INET6, addr, &r->dst) != 1) {
		return -1;
	}
	r->dport = (uint16_t)dport;
	r->sport = (uint16_t)sport;
	return 0;
}

/* Re-read the file when it changed (lock held). A missing file means no rules. */
static void reload(void)
{
	const char *path = getenv("C4_TCP_PORTS");
	struct rule *fresh = NULL;
	size_t n = 0, cap = 0;
	struct stat st;
	char line[256];
	FILE *f;

	if (!path || !*path)
		path = DEFAULT_PORTS;
	if (stat(path, &st) < 0) {
		nrules = 0;
		have_seen = 0;
		return;
	}
	if (have_seen && st.st_ino == seen.st_ino && st.st_size == seen.st_size &&
	    st.st_mtim.tv_sec == seen.st_mtim.tv_sec && st.st_mtim.tv_nsec == seen.st_mtim.tv_nsec)
		return;
	f = fopen(path, "re");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f) && n < MAX_RULES) {
		struct rule r;

		if (line[0] == '#' || parse_line(line, &r))
			continue;
		if (n == cap) {
			size_t c = cap ? cap * 2 : 64;
			struct rule *g = realloc(fresh, c * sizeof(*g));

			if (!g)
				break;
			fresh = g;
			cap = c;
		}
		fresh[n++] = r;
	}
	fclose(f);
	free(rules);
	rules = fresh;
	nrules = n;
	seen = st;
	have_seen = 1;
}

static size_t candidates(const struct in6_addr *dst, uint16_t dport, uint16_t *out)
{
	size_t k = 0;

	pthread_mutex_lock(&lock);
	reload();
	for (size_t i = 0; i < nrules && k < MAX_CANDIDATES; i++)
		if (rules[i].dport == dport && !memcmp(&rules[i].dst, dst, sizeof(*dst)))
			out[k++] = rules[i].sport;
	pthread_mutex_unlock(&lock);
	return k;
}

/* Socket options an application commonly sets before connect(), carried to a fresh socket. */
static const struct {
	int level, name;
} carried[] = {
	{SOL_SOCKET, SO_KEEPALIVE}, {SOL_SOCKET, SO_SNDBUF},  {SOL_SOCKET, SO_RCVBUF},
	{SOL_SOCKET, SO_PRIORITY},  {IPPROTO_TCP, TCP_NODELAY}, {IPPROTO_IP, IP_TOS},
};

/* Swap `fd` for a fresh unbound socket of the same kind: a socket cannot be unbound. */
static int fresh_socket(int fd, int domain, int type, int proto)
{
	int s, fl = fcntl(fd, F_GETFL), fdfl = fcntl(fd, F_GETFD);
	char cc[32];
	socklen_t cl = sizeof(cc);

	s = socket(domain, type, proto);
	if (s < 0)
		return -1;
	for (size_t i = 0; i < sizeof(carried) / sizeof(carried[0]); i++) {
		int v;
		socklen_t l = sizeof(v);

		if (!getsockopt(fd, carried[i].level, carried[i].name, &v, &l))
			setsockopt(s, carried[i].level, carried[i].name, &v, l);
	}
	if (!getsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, cc, &cl))
		setsockopt(s, IPPROTO_TCP, TCP_CONGESTION, cc, cl);
	if (fl >= 0)
		fcntl(s, F_SETFL, fl);
	if (dup3(s, fd, fdfl >= 0 && (fdfl & FD_CLOEXEC) ? O_CLOEXEC : 0) < 0) {
		close(s);
		return -1;
	}
	close(s);
	return 0;
}

EXPORT int connect(int fd, const struct sockaddr *sa, socklen_t len)
{
	static connect_fn real;
	uint16_t ports[MAX_CANDIDATES], dport;
	struct sockaddr_storage local;
	socklen_t ll = sizeof(local);
	int type, domain, proto, one = 1, saved;
	socklen_t ol = sizeof(int);
	struct in6_addr dst;
	size_t k;

	if (!real)
		real = (connect_fn)dlsym(RTLD_NEXT, "connect");
	if (!real) {
		errno = ENOSYS;
		return -1;
	}
	if (!sa || (sa->sa_family != AF_INET && sa->sa_family != AF_INET6) ||
	    len < (sa->sa_family == AF_INET ? sizeof(struct sockaddr_in) :
					      sizeof(struct sockaddr_in6)))
		return real(fd, sa, len);
	saved = errno;
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &ol) || type != SOCK_STREAM ||
	    getsockopt(fd, SOL_SOCKET, SO_DOMAIN, &domain, &ol) ||
	    getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &ol) ||
	    getsockname(fd, (struct sockaddr *)&local, &ll) ||
	    (local.ss_family == AF_INET ? ((struct sockaddr_in *)&local)->sin_port :
					  ((struct sockaddr_in6 *)&local)->sin6_port) != 0) {
		errno = saved;
		return real(fd, sa, len); /* not TCP, or the application bound it itself */
	}
	to_v6(sa, &dst, &dport);
	k = candidates(&dst, dport, ports);
	for (size_t i = 0; i < k; i++) {
		struct sockaddr_storage b;
		int rc;

		memset(&b, 0, sizeof(b));
		b.ss_family = (sa_family_t)domain;
		if (domain == AF_INET)
			((struct sockaddr_in *)&b)->sin_port = htons(ports[i]);
		else
			((struct sockaddr_in6 *)&b)->sin6_port = htons(ports[i]);
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(fd, (struct sockaddr *)&b,
			 domain == AF_INET ? sizeof(struct sockaddr_in) :
					     sizeof(struct sockaddr_in6))) {
			continue; /* port held by a listener or a non-reusable socket */
		}
		errno = saved;
		rc = real(fd, sa, len);
		if (rc == 0 || (errno != EADDRNOTAVAIL && errno != EADDRINUSE))
			return rc; /* connected, in progress, or an error the application must see */
		/* 4-tuple taken (a live connection or TIME_WAIT on this port): next port */
		if (fresh_socket(fd, domain, type, proto))
			break;
	}
	errno = saved;
	return real(fd, sa, len);
}
