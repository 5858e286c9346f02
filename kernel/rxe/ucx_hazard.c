/* ucx_hazard: what UCX's registration cache sends after x == y (measured, not integrated).
 *
 * One UCP context, two workers (the owner and the peer) connected over rc_verbs on the rxe
 * device (UCX_TLS/UCX_NET_DEVICES from the environment; ud_verbs does the wire-up). The peer's
 * buffer is mapped with ucp_mem_map and its rkey unpacked on the owner's endpoint. The owner:
 *
 *   x = mmap(64 KiB) filled 'A'; ucp_put_nbx(x -> peer); flush   (UCX registers x: a miss)
 *   unmap x (libc munmap, or the raw syscall UCX's hooks can not see)
 *   y = mmap at x's address (y == x) filled 'B'; ucp_put_nbx(y -> peer); flush
 *
 * and reads what arrived at the peer: 'B' everywhere is the new memory, 'A' is x's old pages
 * sent from a stale registration. One line per unmapping call:
 *   RXE-UCX kind=libc-munmap|syscall-munmap sent=new|old|mixed stale_bytes=N len=N
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <ucp/api/ucp.h>

#define LEN (64u << 10)

static ucp_worker_h workers[2];

static void die(const char *what, ucs_status_t st)
{
	fprintf(stderr, "ucx_hazard: %s: %s\n", what, ucs_status_string(st));
	exit(1);
}

static void wait(void *req, const char *what)
{
	if (req == NULL)
		return;
	if (UCS_PTR_IS_ERR(req))
		die(what, UCS_PTR_STATUS(req));
	ucs_status_t st;
	while ((st = ucp_request_check_status(req)) == UCS_INPROGRESS) {
		ucp_worker_progress(workers[0]);
		ucp_worker_progress(workers[1]);
	}
	ucp_request_free(req);
	if (st != UCS_OK)
		die(what, st);
}

static void put(ucp_ep_h ep, const void *src, void *dst, ucp_rkey_h rkey)
{
	ucp_request_param_t p = {0};
	wait(ucp_put_nbx(ep, src, LEN, (uint64_t)(uintptr_t)dst, rkey, &p), "ucp_put_nbx");
	wait(ucp_ep_flush_nbx(ep, &p), "ucp_ep_flush_nbx");
}

static char *map_at(void *at, int byte)
{
	int flags = MAP_PRIVATE | MAP_ANONYMOUS | (at ? MAP_FIXED_NOREPLACE : 0);
	char *p = mmap(at, LEN, PROT_READ | PROT_WRITE, flags, -1, 0);
	if (p == MAP_FAILED || (at && p != at)) {
		perror("mmap");
		exit(1);
	}
	memset(p, byte, LEN);
	return p;
}

int main(void)
{
	setvbuf(stdout, NULL, _IOLBF, 0);
	ucp_params_t params = {.field_mask = UCP_PARAM_FIELD_FEATURES,
			       .features = UCP_FEATURE_RMA};
	ucp_context_h ctx;
	ucs_status_t st = ucp_init(&params, NULL, &ctx);
	if (st != UCS_OK)
		die("ucp_init", st);
	ucp_worker_params_t wp = {.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE,
				  .thread_mode = UCS_THREAD_MODE_SINGLE};
	for (int i = 0; i < 2; i++)
		if ((st = ucp_worker_create(ctx, &wp, &workers[i])) != UCS_OK)
			die("ucp_worker_create", st);
	ucp_address_t *addr;
	size_t addr_len;
	if ((st = ucp_worker_get_address(workers[1], &addr, &addr_len)) != UCS_OK)
		die("ucp_worker_get_address", st);
	ucp_ep_params_t ep_params = {.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS,
				     .address = addr};
	ucp_ep_h ep;
	if ((st = ucp_ep_create(workers[0], &ep_params, &ep)) != UCS_OK)
		die("ucp_ep_create", st);
	/* The peer's buffer, mapped for remote access. */
	char *dst = map_at(NULL, 0);
	ucp_mem_map_params_t mp = {.field_mask = UCP_MEM_MAP_PARAM_FIELD_ADDRESS |
						 UCP_MEM_MAP_PARAM_FIELD_LENGTH,
				   .address = dst, .length = LEN};
	ucp_mem_h memh;
	if ((st = ucp_mem_map(ctx, &mp, &memh)) != UCS_OK)
		die("ucp_mem_map", st);
	void *rkey_buf;
	size_t rkey_len;
	if ((st = ucp_rkey_pack(ctx, memh, &rkey_buf, &rkey_len)) != UCS_OK)
		die("ucp_rkey_pack", st);
	ucp_rkey_h rkey;
	if ((st = ucp_ep_rkey_unpack(ep, rkey_buf, &rkey)) != UCS_OK)
		die("ucp_ep_rkey_unpack", st);

	const char *kinds[] = {"libc-munmap", "syscall-munmap"};
	for (int k = 0; k < 2; k++) {
		char *x = map_at(NULL, 'A');
		put(ep, x, dst, rkey);
		size_t olds = 0;
		for (size_t i = 0; i < LEN; i++)
			olds += dst[i] != 'A';
		if (olds) {
			fprintf(stderr, "ucx_hazard: the first put did not arrive (%zu bytes)\n", olds);
			return 1;
		}
		if (k == 0)
			munmap(x, LEN);
		else
			syscall(SYS_munmap, x, LEN);
		char *y = map_at(x, 'B');
		put(ep, y, dst, rkey);
		size_t stale = 0, fresh = 0;
		for (size_t i = 0; i < LEN; i++) {
			stale += dst[i] == 'A';
			fresh += dst[i] == 'B';
		}
		printf("RXE-UCX kind=%s sent=%s stale_bytes=%zu new_bytes=%zu len=%u\n", kinds[k],
		       stale == LEN ? "old" : fresh == LEN ? "new" : "mixed", stale, fresh, LEN);
		munmap(y, LEN);
	}
	ucp_rkey_destroy(rkey);
	ucp_rkey_buffer_release(rkey_buf);
	ucp_mem_unmap(ctx, memh);
	ucp_request_param_t p = {0};
	void *close = ucp_ep_close_nbx(ep, &p);
	if (close && !UCS_PTR_IS_ERR(close)) {
		while (ucp_request_check_status(close) == UCS_INPROGRESS) {
			ucp_worker_progress(workers[0]);
			ucp_worker_progress(workers[1]);
		}
		ucp_request_free(close);
	}
	ucp_worker_release_address(workers[1], addr);
	for (int i = 0; i < 2; i++)
		ucp_worker_destroy(workers[i]);
	ucp_cleanup(ctx);
	munmap(dst, LEN);
	return 0;
}
