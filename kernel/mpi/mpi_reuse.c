/* mpi_reuse: an MPI job that moves checked data between two ranks on two nodes while the ranks
 * reuse their buffers the x == y way (kernel/mpi/run.sh runs it in the two guests).
 *
 *   mpi_reuse hazard ROUNDS SIZE   for each way of replacing memory below, ROUNDS rounds: both
 *                                  ranks replace the memory behind their buffer (same address),
 *                                  fill it, rank 0 sends SIZE bytes to rank 1 and rank 1 sends
 *                                  them back; each receiver counts the bytes that differ from
 *                                  what the sender wrote in this round.
 *   mpi_reuse sweep SECONDS        ping-pong 8 B..4 MiB (x8 steps, and 1 MiB) with one
 *                                  buffer per size (the registration cache's hits), each
 *                                  size's loop SECONDS long; seconds per round trip, MB/s.
 *
 * Ways (the kinds of kernel/rxe/kinds.h an application does with its own buffers):
 *   free-malloc     free(x); y = malloc(SIZE)       (glibc: munmap + mmap, counted if y == x)
 *   munmap-mmap     munmap(x); mmap(x, MAP_FIXED)   (libc calls)
 *   madv-dontneed   madvise(x, MADV_DONTNEED)       (libc call)
 *   mmap-fixed      mmap(x, MAP_FIXED) over x       (libc call)
 *   raw-munmap-mmap, raw-madv-dontneed, raw-mmap-fixed: the same with syscall(2), which no
 *                   hook in libc sees
 *
 * Output, one line each on rank 0's stdout (kernel/mpi/verdict.py reads them):
 *   MPI-HAZARD way=W rounds=N replaced=R same_address=S wrong_bytes=B bytes=T
 *     (R replacements, both ranks; S of them gave the old address; B of T bytes received)
 *   MPI-SWEEP size=S iters=N seconds=F usec_per_rt=F mbps=F wrong_bytes=B
 *   MPI-MONITOR rank=R <ummunotify_fabric_report()>   (when libummunotify-fabric.so is loaded)
 *   MPI-RANK rank=R node=HOST done                      (each rank, at the very end)
 * Exits non-zero on an MPI error; wrong bytes are results, not errors.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <malloc.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

static int rank;

static void die(const char *what)
{
	fprintf(stderr, "mpi_reuse rank %d: %s failed\n", rank, what);
	MPI_Abort(MPI_COMM_WORLD, 2);
}

/* The byte at offset i of round r of way w, written by rank s: differs between rounds. */
static inline unsigned char pat(int w, int r, int s, size_t i)
{
	return (unsigned char)((i * 131u + (size_t)r * 29u + (size_t)w * 7u + (size_t)s * 101u +
				(i >> 12)) | 1u);
}

static void fill(unsigned char *b, size_t n, int w, int r, int s)
{
	for (size_t i = 0; i < n; i++)
		b[i] = pat(w, r, s, i);
}

static uint64_t wrong(const unsigned char *b, size_t n, int w, int r, int s)
{
	uint64_t bad = 0;
	for (size_t i = 0; i < n; i++)
		bad += b[i] != pat(w, r, s, i);
	return bad;
}

enum way { FREE_MALLOC, MUNMAP_MMAP, MADV_DONTNEED_, MMAP_FIXED, RAW_MUNMAP_MMAP, RAW_MADV,
	   RAW_MMAP_FIXED, WAYS };
static const char *const way_name[WAYS] = {"free-malloc", "munmap-mmap", "madv-dontneed",
					    "mmap-fixed", "raw-munmap-mmap", "raw-madv-dontneed",
					    "raw-mmap-fixed"};

#define PROT (PROT_READ | PROT_WRITE)
#define ANON (MAP_PRIVATE | MAP_ANONYMOUS)

static void *map_at(void *x, size_t n, int raw)
{
	void *p = raw ? (void *)syscall(SYS_mmap, x, n, PROT, ANON | MAP_FIXED, -1, 0)
		      : mmap(x, n, PROT, ANON | MAP_FIXED, -1, 0);
	if (p != x)
		die("mmap at the same address");
	return p;
}

/* Replaces the memory behind x by way w; returns the buffer to use (x, or malloc's answer). */
static unsigned char *replace(unsigned char *x, size_t n, enum way w)
{
	switch (w) {
	case FREE_MALLOC:
		free(x);
		x = malloc(n);
		if (!x)
			die("malloc");
		return x;
	case MUNMAP_MMAP:
		if (munmap(x, n))
			die("munmap");
		return map_at(x, n, 0);
	case RAW_MUNMAP_MMAP:
		if (syscall(SYS_munmap, x, n))
			die("munmap(2)");
		return map_at(x, n, 1);
	case MADV_DONTNEED_:
		if (madvise(x, n, MADV_DONTNEED))
			die("madvise");
		return x;
	case RAW_MADV:
		if (syscall(SYS_madvise, x, n, MADV_DONTNEED))
			die("madvise(2)");
		return x;
	case MMAP_FIXED:
		return map_at(x, n, 0);
	case RAW_MMAP_FIXED:
		return map_at(x, n, 1);
	default:
		abort();
	}
}

static void hazard(int rounds, size_t n)
{
	/* A fixed mmap threshold: glibc serves SIZE with mmap and does not raise the threshold
	 * after a free, so free + malloc gives munmap + mmap, usually at the same address. */
	mallopt(M_MMAP_THRESHOLD, 64 * 1024);
	int peer = 1 - rank;
	for (int w = 0; w < WAYS; w++) {
		unsigned char *x = w == FREE_MALLOC ? malloc(n)
						    : mmap(NULL, n, PROT, ANON, -1, 0);
		if (!x || x == MAP_FAILED)
			die("buffer");
		uint64_t bad = 0, same = 0, total = 0;
		for (int r = 0; r < rounds; r++) {
			if (r > 0) {
				unsigned char *y = replace(x, n, (enum way)w);
				same += y == x;
				x = y;
			}
			/* rank 0 -> rank 1, then back: each rank's buffer is sent from and received
			 * into, so the caches of both sides see the replaced memory. */
			if (rank == 0) {
				fill(x, n, w, r, 0);
				if (MPI_Send(x, (int)n, MPI_BYTE, peer, w, MPI_COMM_WORLD))
					die("MPI_Send");
				if (MPI_Recv(x, (int)n, MPI_BYTE, peer, w, MPI_COMM_WORLD,
					     MPI_STATUS_IGNORE))
					die("MPI_Recv");
				bad += wrong(x, n, w, r, 1);
			} else {
				memset(x, 0, n);
				if (MPI_Recv(x, (int)n, MPI_BYTE, peer, w, MPI_COMM_WORLD,
					     MPI_STATUS_IGNORE))
					die("MPI_Recv");
				bad += wrong(x, n, w, r, 0);
				fill(x, n, w, r, 1);
				if (MPI_Send(x, (int)n, MPI_BYTE, peer, w, MPI_COMM_WORLD))
					die("MPI_Send");
			}
			total += n;
		}
		uint64_t mine[3] = {bad, same, total}, sum[3];
		if (MPI_Reduce(mine, sum, 3, MPI_UINT64_T, MPI_SUM, 0, MPI_COMM_WORLD))
			die("MPI_Reduce");
		if (rank == 0)
			printf("MPI-HAZARD way=%s rounds=%d replaced=%d same_address=%llu "
			       "wrong_bytes=%llu bytes=%llu\n",
			       way_name[w], rounds, 2 * (rounds - 1), (unsigned long long)sum[1],
			       (unsigned long long)sum[0], (unsigned long long)sum[2]);
		fflush(stdout);
		if (w == FREE_MALLOC)
			free(x);
		else
			munmap(x, n);
	}
}

static void sweep(double seconds)
{
	const size_t max = 4u << 20;
	unsigned char *b = mmap(NULL, max, PROT, ANON, -1, 0);
	if (b == MAP_FAILED)
		die("mmap");
	int peer = 1 - rank;
	static const size_t sizes[] = {8, 64, 512, 4096, 32768, 262144, 1u << 20, 4u << 20};
	for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
		size_t n = sizes[k];
		/* Calibrate (rank 0's clock decides, doubling until an eighth of SECONDS), then
		 * one loop of about SECONDS: the guest clock ticks in 4 ms. */
		long iters = 4;
		for (int pass = 0; pass < 2; pass++) {
			if (rank == 0)
				fill(b, n, 0, pass, 0);
			MPI_Barrier(MPI_COMM_WORLD);
			double t0 = MPI_Wtime();
			for (long i = 0; i < iters; i++) {
				if (rank == 0) {
					if (MPI_Send(b, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD) ||
					    MPI_Recv(b, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
						     MPI_STATUS_IGNORE))
						die("ping");
				} else {
					if (MPI_Recv(b, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD,
						     MPI_STATUS_IGNORE) ||
					    MPI_Send(b, (int)n, MPI_BYTE, peer, 1, MPI_COMM_WORLD))
						die("pong");
				}
			}
			double dt = MPI_Wtime() - t0;
			/* The data went there and back unchanged. */
			uint64_t bad = rank == 0 ? wrong(b, n, 0, pass, 0) : 0;
			if (pass == 0) {
				if (MPI_Bcast(&dt, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD))
					die("MPI_Bcast");
				if (dt < seconds / 8 && iters < (1L << 30)) {
					iters *= 2;
					pass = -1;
					continue;
				}
				long next = (long)(seconds / (dt / (double)iters));
				iters = next < 10 ? 10 : next;
			} else if (rank == 0) {
				printf("MPI-SWEEP size=%zu iters=%ld seconds=%.3f usec_per_rt=%.1f "
				       "mbps=%.2f wrong_bytes=%llu\n",
				       n, iters, dt, dt / (double)iters * 1e6,
				       2.0 * (double)n * (double)iters / dt / 1e6,
				       (unsigned long long)bad);
				fflush(stdout);
			}
		}
	}
	munmap(b, max);
}

int main(int argc, char **argv)
{
	if (MPI_Init(&argc, &argv))
		return 2;
	int size;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	if (size != 2 || argc < 3) {
		if (rank == 0)
			fprintf(stderr, "usage: mpirun -np 2 mpi_reuse hazard ROUNDS SIZE | sweep "
					"SECONDS\n");
		MPI_Finalize();
		return 2;
	}
	if (!strcmp(argv[1], "hazard") && argc == 4)
		hazard(atoi(argv[2]), strtoul(argv[3], NULL, 0));
	else if (!strcmp(argv[1], "sweep"))
		sweep(atof(argv[2]));
	else
		die("usage");
	/* The monitor's own account (the preload is in the global scope when LD_PRELOADed). */
	size_t (*report)(char *, size_t) =
		(size_t(*)(char *, size_t))dlsym(RTLD_DEFAULT, "ummunotify_fabric_report");
	char node[256] = "", line[512] = "";
	gethostname(node, sizeof node);
	if (report) {
		report(line, sizeof line);
		printf("MPI-MONITOR rank=%d %s\n", rank, line);
	}
	MPI_Barrier(MPI_COMM_WORLD);
	if (MPI_Finalize())
		return 2;
	printf("MPI-RANK rank=%d node=%s done\n", rank, node);
	fflush(stdout);
	return 0;
}
