/* rxe_peer DEVICE: the far end of the wire for the hazard tests. It owns an RC queue pair on
 * DEVICE and does, on command, RDMA READs of the owner's memory (answering with the bytes that
 * came over the wire) and RDMA WRITEs into it. Protocol: pair.h. Exits 0 on QUIT, 1 on a setup
 * failure; a failed work request is answered "ERR ..." (the QP is then in error: the owner
 * stops).
 */
#include <inttypes.h>
#include <stddef.h>
#include <sys/mman.h>
#include <unistd.h>
#include "pair.h"

#define SCRATCH (8u << 20)

static int poll_one(struct pair *p, const char *what)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(p->cq, 1, &wc);
		if (n < 0) {
			printf("ERR %s: ibv_poll_cq %d\n", what, n);
			return -1;
		}
		if (n == 1)
			break;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (t.tv_sec - t0.tv_sec > 30) {
			printf("ERR %s: no completion in 30 s\n", what);
			return -1;
		}
	}
	if (wc.status != IBV_WC_SUCCESS) {
		printf("ERR %s: %s (vendor_err %#x)\n", what, ibv_wc_status_str(wc.status),
		       wc.vendor_err);
		return -1;
	}
	return 0;
}

static int post(struct pair *p, enum ibv_wr_opcode op, struct ibv_mr *mr, size_t len,
		uint64_t addr, uint32_t rkey)
{
	struct ibv_sge sge = {.addr = (uintptr_t)mr->addr, .length = (uint32_t)len,
			      .lkey = mr->lkey};
	struct ibv_send_wr wr = {.sg_list = &sge, .num_sge = 1, .opcode = op,
				 .send_flags = IBV_SEND_SIGNALED,
				 .wr.rdma = {.remote_addr = addr, .rkey = rkey}};
	struct ibv_send_wr *bad;
	int rc = ibv_post_send(p->qp, &wr, &bad);
	if (rc) {
		printf("ERR ibv_post_send: %s\n", strerror(rc));
		return -1;
	}
	return poll_one(p, op == IBV_WR_RDMA_READ ? "RDMA READ" : "RDMA WRITE");
}

int main(int argc, char **argv)
{
	setvbuf(stdout, NULL, _IOFBF, 1 << 16);
	struct ibv_context *ctx = pair_open(argc > 1 ? argv[1] : NULL);
	if (!ctx)
		return 1;
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd) {
		fprintf(stderr, "ibv_alloc_pd: %s\n", strerror(errno));
		return 1;
	}
	char *scratch = mmap(NULL, SCRATCH, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			     -1, 0);
	if (scratch == MAP_FAILED)
		return 1;
	struct ibv_mr *mr = ibv_reg_mr(pd, scratch, SCRATCH, IBV_ACCESS_LOCAL_WRITE);
	if (!mr) {
		fprintf(stderr, "ibv_reg_mr(scratch): %s\n", strerror(errno));
		return 1;
	}
	struct pair p;
	if (pair_create(pd, &p))
		return 1;
	char gid[33];
	pair_gid_hex(&p.gid, gid);
	printf("PEER %u %u %d %s %d %zu %zu %zu\n", p.qp->qp_num, p.psn, p.gidx, gid, (int)p.mtu,
	       sizeof(struct ibv_qp_attr), sizeof(struct ibv_qp_init_attr),
	       offsetof(struct ibv_qp, qp_num));
	fflush(stdout);
	char line[256];
	while (fgets(line, sizeof line, stdin)) {
		char hex[64];
		unsigned qpn, psn, byte;
		uint64_t addr;
		size_t len;
		uint32_t rkey;
		if (sscanf(line, "CONNECT %u %u %63s", &qpn, &psn, hex) == 3) {
			union ibv_gid g;
			if (pair_gid_parse(hex, &g) || pair_connect(&p, qpn, psn, &g))
				printf("ERR connect\n");
			else
				printf("OK\n");
		} else if (sscanf(line, "READ %" SCNx64 " %zu %" SCNx32, &addr, &len, &rkey) == 3) {
			if (len > SCRATCH) {
				printf("ERR READ of %zu bytes: more than the peer's %u\n", len, SCRATCH);
			} else if (post(&p, IBV_WR_RDMA_READ, mr, len, addr, rkey) == 0) {
				printf("DATA %zu\n", len);
				fwrite(scratch, 1, len, stdout);
			}
		} else if (sscanf(line, "WRITE %" SCNx64 " %zu %" SCNx32 " %x", &addr, &len, &rkey,
				  &byte) == 4) {
			if (len > SCRATCH) {
				printf("ERR WRITE of %zu bytes: more than the peer's %u\n", len, SCRATCH);
			} else {
				memset(scratch, (int)byte, len);
				if (post(&p, IBV_WR_RDMA_WRITE, mr, len, addr, rkey) == 0)
					printf("OK\n");
			}
		} else if (!strncmp(line, "QUIT", 4)) {
			break;
		} else {
			printf("ERR unknown command: %s", line);
		}
		fflush(stdout);
	}
	pair_destroy(&p);
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	return 0;
}
