/*
 * Forks from a busy multithreaded program (guarantee 6: a child never hangs), shared by the C
 * library's tests/c/fork_busy.c and the 2010 preload's tests/c/fork2010.c.
 *
 * The program starts its own busy threads (mapping, unmapping, registering), then calls
 * fork_busy_run(): the main thread forks again and again, each child runs the program's
 * `child` function and _exit(0)s, and the parent waits for it with a deadline (a pidfd polled
 * with a timeout; a waitpid(WNOHANG) loop where pidfd_open is missing). A child still alive at
 * the deadline fails the run naming its fork number (after printing its kernel stack and wchan
 * when readable) and is killed; a child that exits non-zero or by a signal fails it too.
 *
 * Environment: UMN_FORK_COUNT forks at most (default 2000), UMN_FORK_SECS seconds at most
 * (default 3: a CI run; 0 = no time bound), UMN_FORK_DEADLINE_SECS per child (default 20).
 */
#ifndef UMN_FORK_BUSY_H
#define UMN_FORK_BUSY_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SYS_pidfd_open
#define SYS_pidfd_open 434
#endif

/* Set when the busy threads must stop (after the fork loop). */
static atomic_int fork_busy_stop;

static long fork_busy_env(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

static double fork_busy_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Prints a file of /proc/PID (the hung child's kernel stack, wchan) when readable. */
static void fork_busy_dump(pid_t pid, const char *what) {
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%d/%s", (int)pid, what);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n > 0) {
        buf[n] = 0;
        fprintf(stderr, "  %s: %s%s", path, buf, buf[n - 1] == '\n' ? "" : "\n");
    }
}

/* Waits for `pid` at most `deadline` seconds: 1 exited (status in *status), 0 still running. */
static int fork_busy_wait(pid_t pid, double deadline, int *status) {
    int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
    double end = fork_busy_now() + deadline;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) {
            if (pfd >= 0)
                close(pfd);
            return 1;
        }
        if (r < 0 && errno != EINTR) {
            perror("waitpid");
            exit(1);
        }
        double left = end - fork_busy_now();
        if (left <= 0) {
            if (pfd >= 0)
                close(pfd);
            return 0;
        }
        if (pfd >= 0) {
            struct pollfd p = {.fd = pfd, .events = POLLIN};
            int ms = left > 1.0 ? 1000 : (int)(left * 1000) + 1;
            poll(&p, 1, ms);
        } else {
            struct timespec ts = {0, 200000};
            nanosleep(&ts, NULL);
        }
    }
}

/*
 * Forks until UMN_FORK_COUNT forks or UMN_FORK_SECS seconds; `child(i, ctx)` runs in child
 * number i (1-based) and returns its exit code. Returns the number of forks on success; on a
 * hang or a failed child prints why (with the fork number) and exits 1.
 */
static long fork_busy_run(const char *name, int (*child)(long i, void *ctx), void *ctx) {
    long count = fork_busy_env("UMN_FORK_COUNT", 2000);
    long secs = fork_busy_env("UMN_FORK_SECS", 3);
    long deadline = fork_busy_env("UMN_FORK_DEADLINE_SECS", 20);
    double start = fork_busy_now();
    long i;
    for (i = 1; i <= count; i++) {
        if (secs > 0 && fork_busy_now() - start >= (double)secs) {
            i--;
            break;
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            exit(1);
        }
        if (pid == 0)
            _exit(child(i, ctx));
        int status = 0;
        if (!fork_busy_wait(pid, (double)deadline, &status)) {
            fprintf(stderr, "%s: fork #%ld: child %d still running after %ld s (hung)\n", name,
                    i, (int)pid, deadline);
            fork_busy_dump(pid, "wchan");
            fork_busy_dump(pid, "stack");
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            exit(1);
        }
        if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
            fprintf(stderr, "%s: fork #%ld: child failed (%s %d)\n", name, i,
                    WIFEXITED(status) ? "exit" : "signal",
                    WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            exit(1);
        }
    }
    if (i > count)
        i = count;
    atomic_store(&fork_busy_stop, 1);
    printf("%s: %ld forks in %.1f s, every child exited\n", name, i, fork_busy_now() - start);
    return i;
}

#endif
