/* An RC queue pair between two processes on one RDMA device (soft-RoCE in the guest), for the
 * end-to-end tests of kernel/rxe/. The owner of the memory under test and the peer that reads
 * and writes it over the wire each make one with pair_create() on their protection domain,
 * exchange (qpn, psn, gid) and call pair_connect() with the other's values.
 *
 * The peer (rxe_peer.c) is driven over pipes by a line protocol, spoken by the C owners here
 * (pair_peer_*) and by the Rust one (crates/ummunotify-testkit/src/rdma.rs):
 *   peer -> "PEER <qpn> <psn> <gidx> <gid hex> <mtu> <sizeof qp_attr> <sizeof init_attr>
 *            <offsetof qp_num>"            once at start (the sizes let Rust check its layout)
 *   "CONNECT <qpn> <psn> <gid hex>"         -> "OK"
 *   "READ <addr> <len> <rkey>"              -> "DATA <len>" and len raw bytes, or "ERR <why>"
 *   "WRITE <addr> <len> <rkey> <byte>"      -> "OK" or "ERR <why>"  (len bytes of <byte>)
 *   "QUIT"
 * Addresses and keys are in hex (0x...), lengths in decimal.
 */
#ifndef UMN_RXE_PAIR_H
#define UMN_RXE_PAIR_H

#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <infiniband/verbs.h>

#define PAIR_PORT 1

struct pair {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	int gidx;
	union ibv_gid gid;
	enum ibv_mtu mtu;
	uint32_t psn;
};

static inline void pair_gid_hex(const union ibv_gid *g, char out[33])
{
	for (int i = 0; i < 16; i++)
		sprintf(out + 2 * i, "%02x", g->raw[i]);
}

static inline int pair_gid_parse(const char *s, union ibv_gid *g)
{
	if (strlen(s) != 32)
		return -1;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -1;
		g->raw[i] = (uint8_t)v;
	}
	return 0;
}

/* Opens the device named `name` (NULL: the first one). */
static inline struct ibv_context *pair_open(const char *name)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	struct ibv_context *ctx = NULL;
	if (!list) {
		fprintf(stderr, "ibv_get_device_list: %s\n", strerror(errno));
		return NULL;
	}
	for (int i = 0; i < n; i++)
		if (!name || !strcmp(ibv_get_device_name(list[i]), name)) {
			ctx = ibv_open_device(list[i]);
			if (!ctx)
				fprintf(stderr, "ibv_open_device(%s): %s\n", ibv_get_device_name(list[i]),
					strerror(errno));
			break;
		}
	if (!ctx && n == 0)
		fprintf(stderr, "no RDMA device\n");
	ibv_free_device_list(list);
	return ctx;
}

/* The RoCE v2 GID of an IPv4 address (::ffff:a.b.c.d) on the port, else its first GID. */
static inline int pair_find_gid(struct ibv_context *ctx, int *gidx, union ibv_gid *gid)
{
	struct ibv_gid_entry e[64];
	ssize_t n = ibv_query_gid_table(ctx, e, 64, 0);
	if (n < 0) {
		fprintf(stderr, "ibv_query_gid_table: %s\n", strerror((int)-n));
		return -1;
	}
	int best = -1;
	for (ssize_t i = 0; i < n; i++) {
		if (e[i].port_num != PAIR_PORT)
			continue;
		int v4 = e[i].gid.raw[10] == 0xff && e[i].gid.raw[11] == 0xff;
		if (e[i].gid_type == IBV_GID_TYPE_ROCE_V2 && v4) {
			best = (int)i;
			break;
		}
		if (best < 0)
			best = (int)i;
	}
	if (best < 0) {
		fprintf(stderr, "no GID on port %d\n", PAIR_PORT);
		return -1;
	}
	*gidx = (int)e[best].gid_index;
	*gid = e[best].gid;
	return 0;
}

/* A CQ and an RC QP on `pd`, taken to INIT with remote read and write allowed. */
static inline int pair_create(struct ibv_pd *pd, struct pair *p)
{
	memset(p, 0, sizeof *p);
	p->ctx = pd->context;
	p->pd = pd;
	struct ibv_port_attr pa;
	if (ibv_query_port(p->ctx, PAIR_PORT, &pa)) {
		fprintf(stderr, "ibv_query_port: %s\n", strerror(errno));
		return -1;
	}
	p->mtu = pa.active_mtu;
	if (pair_find_gid(p->ctx, &p->gidx, &p->gid))
		return -1;
	p->cq = ibv_create_cq(p->ctx, 64, NULL, NULL, 0);
	if (!p->cq) {
		fprintf(stderr, "ibv_create_cq: %s\n", strerror(errno));
		return -1;
	}
	struct ibv_qp_init_attr ia = {
		.send_cq = p->cq, .recv_cq = p->cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
		.cap = {.max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 1, .max_recv_sge = 1},
	};
	p->qp = ibv_create_qp(pd, &ia);
	if (!p->qp) {
		fprintf(stderr, "ibv_create_qp: %s\n", strerror(errno));
		return -1;
	}
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = PAIR_PORT,
		.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				   IBV_ACCESS_REMOTE_WRITE,
	};
	if (ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				      IBV_QP_ACCESS_FLAGS)) {
		fprintf(stderr, "ibv_modify_qp(INIT): %s\n", strerror(errno));
		return -1;
	}
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	p->psn = (uint32_t)(ts.tv_nsec ^ p->qp->qp_num) & 0xffffff;
	return 0;
}

/* INIT -> RTR -> RTS towards the remote QP. */
static inline int pair_connect(struct pair *p, uint32_t qpn, uint32_t psn, const union ibv_gid *gid)
{
	struct ibv_qp_attr a = {
		.qp_state = IBV_QPS_RTR, .path_mtu = p->mtu, .dest_qp_num = qpn, .rq_psn = psn,
		.max_dest_rd_atomic = 4, .min_rnr_timer = 12,
		.ah_attr = {.is_global = 1, .port_num = PAIR_PORT,
			    .grh = {.dgid = *gid, .sgid_index = (uint8_t)p->gidx, .hop_limit = 64}},
	};
	if (ibv_modify_qp(p->qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
				      IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
				      IBV_QP_MIN_RNR_TIMER)) {
		fprintf(stderr, "ibv_modify_qp(RTR): %s\n", strerror(errno));
		return -1;
	}
	struct ibv_qp_attr r = {
		.qp_state = IBV_QPS_RTS, .timeout = 14, .retry_cnt = 7, .rnr_retry = 7,
		.sq_psn = p->psn, .max_rd_atomic = 4,
	};
	if (ibv_modify_qp(p->qp, &r, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC)) {
		fprintf(stderr, "ibv_modify_qp(RTS): %s\n", strerror(errno));
		return -1;
	}
	return 0;
}

static inline void pair_destroy(struct pair *p)
{
	if (p->qp)
		ibv_destroy_qp(p->qp);
	if (p->cq)
		ibv_destroy_cq(p->cq);
	p->qp = NULL;
	p->cq = NULL;
}

/* The owner's side of the wire: the peer process (rxe_peer) and this process's connected QP. */
struct wire {
	struct pair qp;
	pid_t pid;
	FILE *to, *from;
};

/* Starts `peer` on `dev`, makes this side's QP on `pd` and connects the two. */
static inline int wire_connect(struct wire *w, const char *peer, const char *dev, struct ibv_pd *pd)
{
	int in[2], out[2];
	if (pipe(in) || pipe(out))
		return -1;
	w->pid = fork();
	if (w->pid < 0)
		return -1;
	if (w->pid == 0) {
		dup2(in[0], 0);
		dup2(out[1], 1);
		close(in[1]);
		close(out[0]);
		execl(peer, peer, dev, (char *)NULL);
		_exit(127);
	}
	close(in[0]);
	close(out[1]);
	w->to = fdopen(in[1], "w");
	w->from = fdopen(out[0], "r");
	if (pair_create(pd, &w->qp))
		return -1;
	char line[256], gid_hex[64];
	unsigned qpn, psn, mtu;
	int gidx;
	if (!fgets(line, sizeof line, w->from) ||
	    sscanf(line, "PEER %u %u %d %63s %u", &qpn, &psn, &gidx, gid_hex, &mtu) != 5) {
		fprintf(stderr, "wire: the peer said: %s\n", line);
		return -1;
	}
	union ibv_gid gid;
	if (pair_gid_parse(gid_hex, &gid) || pair_connect(&w->qp, qpn, psn, &gid))
		return -1;
	char mine[33];
	pair_gid_hex(&w->qp.gid, mine);
	fprintf(w->to, "CONNECT %u %u %s\n", w->qp.qp->qp_num, w->qp.psn, mine);
	fflush(w->to);
	if (!fgets(line, sizeof line, w->from) || strncmp(line, "OK", 2)) {
		fprintf(stderr, "wire: CONNECT: %s\n", line);
		return -1;
	}
	return 0;
}

/* The peer RDMA-READs [addr, addr + len) through rkey into buf. */
static inline int wire_read(struct wire *w, uintptr_t addr, size_t len, uint32_t rkey, void *buf)
{
	char line[256];
	size_t n;
	fprintf(w->to, "READ %#" PRIxPTR " %zu %#" PRIx32 "\n", addr, len, rkey);
	fflush(w->to);
	if (!fgets(line, sizeof line, w->from) || sscanf(line, "DATA %zu", &n) != 1 || n != len) {
		fprintf(stderr, "wire: READ: %s\n", line);
		return -1;
	}
	return fread(buf, 1, len, w->from) == len ? 0 : -1;
}

/* The peer RDMA-WRITEs len bytes of `byte` to [addr, addr + len) through rkey. */
static inline int wire_write(struct wire *w, uintptr_t addr, size_t len, uint32_t rkey, int byte)
{
	char line[256];
	fprintf(w->to, "WRITE %#" PRIxPTR " %zu %#" PRIx32 " %x\n", addr, len, rkey, byte);
	fflush(w->to);
	if (!fgets(line, sizeof line, w->from) || strncmp(line, "OK", 2)) {
		fprintf(stderr, "wire: WRITE: %s\n", line);
		return -1;
	}
	return 0;
}

static inline void wire_close(struct wire *w)
{
	if (w->to) {
		fputs("QUIT\n", w->to);
		fclose(w->to);
	}
	if (w->from)
		fclose(w->from);
	if (w->pid > 0)
		waitpid(w->pid, NULL, 0);
	pair_destroy(&w->qp);
}

#endif
