/* rsh: the two-node guests' remote shell, Open MPI's launcher agent (plm_rsh_agent).
 *
 *   rsh -d PORT           serve: each connection sends one command line ending in '\n'; it runs
 *                         as `sh -c LINE` with the connection as stdin, stdout and stderr.
 *   rsh HOST CMD...       run CMD on HOST (port 5222), print what it writes, return when it
 *                         ends; exit 0, or 255 if HOST can not be reached.
 *
 * The test's own link between two guests only (no authentication, no encryption): what ssh
 * would do between real nodes, without keys or a daemon to configure. mpirun starts `rsh node1
 * orted ...`; orted reports back to mpirun over TCP itself and mpirun notices a daemon that
 * does not, so the remote exit status is not carried.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <netdb.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define PORT "5222"

static int serve(const char *port)
{
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM,
				 .ai_flags = AI_PASSIVE};
	struct addrinfo *ai;
	if (getaddrinfo(NULL, port, &hints, &ai)) {
		perror("rsh: getaddrinfo");
		return 1;
	}
	int s = socket(ai->ai_family, ai->ai_socktype, 0), one = 1;
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (s < 0 || bind(s, ai->ai_addr, ai->ai_addrlen) || listen(s, 16)) {
		perror("rsh: listen");
		return 1;
	}
	signal(SIGCHLD, SIG_IGN); /* no zombies */
	for (;;) {
		int c = accept(s, NULL, NULL);
		if (c < 0) {
			if (errno == EINTR)
				continue;
			perror("rsh: accept");
			return 1;
		}
		if (fork() == 0) {
			close(s);
			static char line[65536];
			size_t n = 0;
			while (n < sizeof line - 1) {
				ssize_t r = read(c, line + n, 1);
				if (r <= 0 || line[n] == '\n')
					break;
				n++;
			}
			line[n] = 0;
			dup2(c, 0);
			dup2(c, 1);
			dup2(c, 2);
			if (c > 2)
				close(c);
			signal(SIGCHLD, SIG_DFL);
			execl("/bin/sh", "sh", "-c", line, (char *)NULL);
			_exit(127);
		}
		close(c);
	}
}

int main(int argc, char **argv)
{
	if (argc == 3 && !strcmp(argv[1], "-d"))
		return serve(argv[2]);
	if (argc < 3) {
		fprintf(stderr, "usage: rsh -d PORT | rsh HOST CMD...\n");
		return 2;
	}
	struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM};
	struct addrinfo *ai;
	int rc = getaddrinfo(argv[1], PORT, &hints, &ai);
	if (rc) {
		fprintf(stderr, "rsh: %s: %s\n", argv[1], gai_strerror(rc));
		return 255;
	}
	int s = socket(ai->ai_family, ai->ai_socktype, 0);
	if (s < 0 || connect(s, ai->ai_addr, ai->ai_addrlen)) {
		fprintf(stderr, "rsh: %s: %s\n", argv[1], strerror(errno));
		return 255;
	}
	size_t len = 2;
	for (int i = 2; i < argc; i++)
		len += strlen(argv[i]) + 1;
	char *cmd = calloc(1, len);
	for (int i = 2; i < argc; i++) {
		strcat(cmd, argv[i]);
		strcat(cmd, i + 1 < argc ? " " : "\n");
	}
	if (write(s, cmd, strlen(cmd)) != (ssize_t)strlen(cmd)) {
		perror("rsh: write");
		return 255;
	}
	shutdown(s, SHUT_WR); /* the remote command's stdin ends here */
	char buf[4096];
	ssize_t n;
	while ((n = read(s, buf, sizeof buf)) > 0)
		if (write(1, buf, n) != n)
			break;
	return 0;
}
