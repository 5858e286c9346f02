/* The library inside a host with signal handling of its own, as an MPI rank under a sampling
   profiler looks (issue 20): the library's own signal (the REMOVE window's acknowledgement) must
   never be the reason such a host crashes.

   - Every thread runs on an alternate signal stack sized for the host's own worst case and no
     more, relative to this CPU's AT_MINSIGSTKSZ (so the test means the same on AVX2, AVX-512 and
     AMX): two nested signal frames (SIGPROF inside the SIGALRM handler) plus the SIGALRM handler's
     3 KiB, plus 1 KiB, above a guard page. A third frame (ours, nested on theirs) overflows it.
   - SIGPROF on every thread from a per-thread CPU-time timer at 10 kHz; SIGALRM to the process at
     5 kHz, whose handler uses 3 KiB of stack and changes registered memory (madvise DONTNEED,
     or munmap and a new mapping at the same address) through the C cache's notifier.
   - Workers churn the C cache: each has buffers of its own (get, change, get again: the second
     get must register anew, so no stale registration is ever handed out), and all of them get
     and put a shared pool that a changer thread drops without pause (madvise DONTNEED, by libc
     and by raw syscall): registrations race REMOVEs in flight, the case the signal is sent for.

   UMN_HOST_MODE = "onstack" (the host's handlers use SA_ONSTACK, the default) or "normal" (they
   do not); UMN_HOST_SECS = seconds (default 3). Passes if nothing crashed, every check held, the host's handlers ran, and
   (with the library's signal on) the library's signal was sent and handled during the run. */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <sys/auxv.h>
#include <sys/syscall.h>
#include <time.h>

#include "check.h"

#ifndef AT_MINSIGSTKSZ
#define AT_MINSIGSTKSZ 51
#endif

#define WORKERS 3
#define OWN 4       /* buffers per worker */
#define POOL 8      /* shared buffers */
#define PAGES 2     /* pages per buffer */
#define HANDLER_STACK 3072

static ummunotify_cache *cache;
static const ummunotify_notifier *notifier;
static size_t page;
static char *pool;
static char *victims; /* the SIGALRM handler's pages, registered on the cache's notifier */
static _Atomic int stop;
static _Atomic uint64_t next_key = 1;
static _Atomic uint64_t prof_runs, alrm_runs, alrm_changes, gets, changes;
static int onstack;

static int reg(void *ctx, size_t start, size_t len, uint64_t *key) {
    (void)ctx;
    (void)start;
    (void)len;
    *key = atomic_fetch_add(&next_key, 1);
    return 0;
}
static int dereg(void *ctx, size_t start, size_t len, uint64_t key) {
    (void)ctx;
    (void)start;
    (void)len;
    (void)key;
    return 0;
}

static size_t altstack_size(void) {
    size_t min = (size_t)getauxval(AT_MINSIGSTKSZ);
    if (min < MINSIGSTKSZ)
        min = MINSIGSTKSZ;
    return 2 * min + HANDLER_STACK + 1024;
}

/* An alternate stack of exactly altstack_size() bytes right above a PROT_NONE guard page. */
static void *install_altstack(void) {
    size_t size = altstack_size();
    size_t len = (size + page - 1) / page * page + page;
    char *m = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    CHECK(m != MAP_FAILED);
    CHECK(mprotect(m, page, PROT_NONE) == 0);
    stack_t ss = {.ss_sp = m + len - size, .ss_size = size, .ss_flags = 0};
    CHECK(sigaltstack(&ss, NULL) == 0);
    return m;
}

static void on_prof(int sig) {
    (void)sig;
    atomic_fetch_add_explicit(&prof_runs, 1, memory_order_relaxed);
}

/* Uses HANDLER_STACK bytes of stack (as an unwinder would) and changes registered memory. */
static void on_alrm(int sig) {
    (void)sig;
    volatile char work[HANDLER_STACK];
    for (size_t i = 0; i < sizeof work; i += 64)
        work[i] = (char)i;
    uint64_t n = atomic_fetch_add_explicit(&alrm_runs, 1, memory_order_relaxed);
    char *v = victims + (n % 4) * page;
    if (n % 2 == 0) {
        madvise(v, page, MADV_DONTNEED);
    } else {
        /* munmap and a new mapping at the same address (x == y), from the handler. */
        munmap(v, page);
        mmap(v, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
    }
    atomic_fetch_add_explicit(&alrm_changes, 1, memory_order_relaxed);
    (void)work[0];
}

static void handle(int sig, void (*fn)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = fn;
    sa.sa_flags = SA_RESTART | (onstack ? SA_ONSTACK : 0);
    sigemptyset(&sa.sa_mask);
    CHECK(sigaction(sig, &sa, NULL) == 0);
}

/* SIGPROF on this thread every 100 µs of its CPU time. */
static timer_t prof_timer(void) {
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_THREAD_ID;
    sev.sigev_signo = SIGPROF;
    sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);
    timer_t t;
    CHECK(timer_create(CLOCK_THREAD_CPUTIME_ID, &sev, &t) == 0);
    struct itimerspec it = {{0, 100000}, {0, 100000}};
    CHECK(timer_settime(t, 0, &it, NULL) == 0);
    return t;
}

static void drop_pages(char *p, size_t len, int how) {
    if (how % 2 == 0)
        CHECK(madvise(p, len, MADV_DONTNEED) == 0);
    else
        CHECK(syscall(SYS_madvise, p, len, MADV_DONTNEED) == 0);
}

static void *worker(void *arg) {
    uintptr_t id = (uintptr_t)arg;
    void *alt = install_altstack();
    timer_t t = prof_timer();
    size_t len = PAGES * page;
    char *own = map_pages(OWN * PAGES);
    unsigned seed = (unsigned)id * 2654435761u;
    for (uint64_t round = 0; !atomic_load(&stop); round++) {
        /* Own buffers: get, change, get again: the second get must register anew. */
        char *b = own + (round % OWN) * len;
        ummunotify_cache_handle h;
        CHECK_RC(ummunotify_cache_get(cache, (uintptr_t)b, len, &h), UMMUNOTIFY_OK);
        uint64_t before = ummunotify_cache_handle_key(&h);
        ummunotify_cache_put(&h);
        int how = (int)(round % 3);
        if (how == 2) {
            CHECK(munmap(b, len) == 0);
            CHECK(mmap(b, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED,
                       -1, 0) == b);
        } else {
            drop_pages(b, len, how);
        }
        b[0] = 1;
        CHECK_RC(ummunotify_cache_get(cache, (uintptr_t)b, len, &h), UMMUNOTIFY_OK);
        CHECK(ummunotify_cache_handle_key(&h) != before);
        ummunotify_cache_put(&h);
        atomic_fetch_add_explicit(&changes, 1, memory_order_relaxed);
        /* The shared pool, raced by the changer: registrations over REMOVEs in flight. */
        char *s = pool + (rand_r(&seed) % POOL) * len;
        ummunotify_result rc = ummunotify_cache_get(cache, (uintptr_t)s, len, &h);
        CHECK(rc == UMMUNOTIFY_OK || rc == UMMUNOTIFY_ERR_UNSTABLE);
        if (rc == UMMUNOTIFY_OK)
            ummunotify_cache_put(&h);
        atomic_fetch_add_explicit(&gets, 1, memory_order_relaxed);
    }
    timer_delete(t);
    stack_t off = {.ss_flags = SS_DISABLE};
    CHECK(sigaltstack(&off, NULL) == 0);
    munmap(alt, (altstack_size() + page - 1) / page * page + page);
    return NULL;
}

static void *changer(void *arg) {
    (void)arg;
    void *alt = install_altstack();
    timer_t t = prof_timer();
    size_t len = PAGES * page;
    for (uint64_t i = 0; !atomic_load(&stop); i++) {
        char *s = pool + (i % POOL) * len;
        drop_pages(s, len, (int)(i / POOL));
        s[0] = (char)i;
    }
    timer_delete(t);
    stack_t off = {.ss_flags = SS_DISABLE};
    CHECK(sigaltstack(&off, NULL) == 0);
    munmap(alt, (altstack_size() + page - 1) / page * page + page);
    return NULL;
}

int main(void) {
    const char *mode = getenv("UMN_HOST_MODE");
    onstack = !(mode && strcmp(mode, "normal") == 0);
    const char *secs_env = getenv("UMN_HOST_SECS");
    int secs = secs_env ? atoi(secs_env) : 3;
    page = (size_t)sysconf(_SC_PAGESIZE);
    ummunotify_registrar dev = {.register_fn = reg, .deregister_fn = dereg};
    ummunotify_result rc = ummunotify_cache_new(&dev, NULL, &cache);
    if (rc == UMMUNOTIFY_ERR_UNSUPPORTED) {
        char why[1024];
        ummunotify_last_error(why, sizeof why);
        printf("SKIP: %s\n", why);
        return SKIP_EXIT;
    }
    CHECK_RC(rc, UMMUNOTIFY_OK);
    notifier = ummunotify_cache_notifier(cache);
    pool = map_pages(POOL * PAGES);
    victims = map_pages(4);
    ummunotify_region r;
    for (uint64_t i = 0; i < 4; i++)
        CHECK_RC(ummunotify_notifier_register(notifier, (uintptr_t)(victims + i * page),
                                              (uintptr_t)(victims + (i + 1) * page), 1000 + i, &r),
                 UMMUNOTIFY_OK);

    void *alt = install_altstack();
    handle(SIGPROF, on_prof);
    handle(SIGALRM, on_alrm);
    timer_t prof = prof_timer();
    struct sigevent sev;
    memset(&sev, 0, sizeof sev);
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGALRM;
    timer_t alrm;
    CHECK(timer_create(CLOCK_MONOTONIC, &sev, &alrm) == 0);
    struct itimerspec it = {{0, 200000}, {0, 200000}};
    CHECK(timer_settime(alrm, 0, &it, NULL) == 0);

    pthread_t th[WORKERS + 1];
    for (uintptr_t i = 0; i < WORKERS; i++)
        CHECK(pthread_create(&th[i], NULL, worker, (void *)(i + 1)) == 0);
    CHECK(pthread_create(&th[WORKERS], NULL, changer, NULL) == 0);
    struct timespec end;
    clock_gettime(CLOCK_MONOTONIC, &end);
    end.tv_sec += secs;
    for (;;) {
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec > end.tv_sec || (now.tv_sec == end.tv_sec && now.tv_nsec >= end.tv_nsec))
            break;
        /* The main thread reads events while the handlers change its victims. */
        ummunotify_event ev[16];
        size_t count;
        do
            CHECK_RC(ummunotify_cache_read_events(cache, ev, 16, &count), UMMUNOTIFY_OK);
        while (count == 16);
        struct timespec nap = {0, 1000000};
        nanosleep(&nap, NULL);
    }
    atomic_store(&stop, 1);
    for (int i = 0; i <= WORKERS; i++)
        CHECK(pthread_join(th[i], NULL) == 0);
    timer_delete(alrm);
    timer_delete(prof);

    /* The host's handlers must block the library's signal now (the library added it). */
    ummunotify_notifier_stats st = {.size = sizeof st};
    CHECK_RC(ummunotify_notifier_get_stats(notifier, &st), UMMUNOTIFY_OK);
    const char *signal_env = getenv("UMN_SIGNAL");
    int signal_on = !(signal_env && strcmp(signal_env, "0") == 0);
    if (signal_on) {
        struct sigaction cur;
        CHECK(sigaction(SIGALRM, NULL, &cur) == 0);
        CHECK(!onstack || sigismember(&cur.sa_mask, SIGRTMAX - 2) == 1);
    }
    printf("host_signals %s: altstack %zu bytes (AT_MINSIGSTKSZ %lu), %llu SIGPROF, %llu SIGALRM "
           "(%llu changes in the handler), %llu gets, %llu own changes, removes confirmed %llu "
           "by grace %llu, library signals sent %llu handled %llu\n",
           onstack ? "onstack" : "normal", altstack_size(), getauxval(AT_MINSIGSTKSZ),
           (unsigned long long)prof_runs, (unsigned long long)alrm_runs,
           (unsigned long long)alrm_changes, (unsigned long long)gets,
           (unsigned long long)changes, (unsigned long long)st.removes_confirmed,
           (unsigned long long)st.removes_by_grace, (unsigned long long)st.signals_sent,
           (unsigned long long)st.signals_handled);
    CHECK(prof_runs > 0 && alrm_runs > 0 && changes > 0 && gets > 0);
    /* The run meant something only if the library's signal went out and was handled. */
    CHECK(!signal_on || (st.signals_sent > 0 && st.signals_handled > 0));
    stack_t off = {.ss_flags = SS_DISABLE};
    CHECK(sigaltstack(&off, NULL) == 0);
    munmap(alt, (altstack_size() + page - 1) / page * page + page);
    ummunotify_cache_free(cache);
    done("host_signals");
    return 0;
}
