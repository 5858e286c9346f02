/* SPDX-License-Identifier: GPL-2.0-only OR MIT */
/*
 * The guest suite's runner: each test runs in its own child (a failed CHECK exits the child,
 * not the suite), with its stderr captured, and prints one line
 *     UMN-RESULT <impl> <program>/<test> PASS|FAIL|SKIP [<what failed>]
 * where <impl> is $UMN_IMPL ("module" or "preload") and <what failed> is the failed check's
 * expression (stable across line-number changes), "exit N" or "signal N".
 */
#ifndef UMN_GUEST_HARNESS_H
#define UMN_GUEST_HARNESS_H

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static int harness_failed;

static void harness_run(const char *program, const char *name, void (*fn)(void), unsigned secs)
{
	const char *impl = getenv("UMN_IMPL") ? getenv("UMN_IMPL") : "unknown";
	char out[8192];
	size_t len = 0;
	int pfd[2], status;

	fflush(stdout);
	if (pipe(pfd) != 0) {
		perror("pipe");
		exit(2);
	}
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		exit(2);
	}
	if (pid == 0) {
		close(pfd[0]);
		dup2(pfd[1], 2);
		close(pfd[1]);
		alarm(secs);
		fn();
		fflush(stdout);
		_exit(0);
	}
	close(pfd[1]);
	for (;;) {
		ssize_t r = read(pfd[0], out + len, sizeof out - 1 - len);
		if (r <= 0)
			break;
		len += (size_t)r;
		if (len == sizeof out - 1)
			break;
	}
	out[len] = 0;
	close(pfd[0]);
	while (waitpid(pid, &status, 0) < 0)
		;
	char detail[512] = "";
	const char *verdict = "PASS";
	if (WIFEXITED(status) && WEXITSTATUS(status) == 77) {
		verdict = "SKIP";
	} else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		const char *c = strstr(out, "CHECK failed: ");
		verdict = "FAIL";
		if (c) {
			c += strlen("CHECK failed: ");
			const char *e = strstr(c, " (errno");
			size_t n = e ? (size_t)(e - c) : strcspn(c, "\n");
			if (n >= sizeof detail)
				n = sizeof detail - 1;
			memcpy(detail, c, n);
			detail[n] = 0;
		} else if (WIFSIGNALED(status)) {
			snprintf(detail, sizeof detail, "signal %d", WTERMSIG(status));
		} else {
			snprintf(detail, sizeof detail, "exit %d", WEXITSTATUS(status));
		}
		harness_failed = 1;
		/* The full message goes to the console for the log, not into the result. */
		fprintf(stderr, "--- %s %s/%s stderr:\n%s", impl, program, name, out);
	}
	printf("UMN-RESULT %s %s/%s %s%s%s\n", impl, program, name, verdict, *detail ? " " : "",
	       detail);
	fflush(stdout);
}

#endif
