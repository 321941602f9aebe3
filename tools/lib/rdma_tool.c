// SPDX-License-Identifier: MIT
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "names.h"
#include "rdma_tool.h"

uint64_t tool_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

double tool_now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- arguments ---------------------------------------------------------- */

static int parse_u32(const char *s, uint32_t *v)
{
	char *e;
	unsigned long x;

	errno = 0;
	x = strtoul(s, &e, 10);
	if (errno || *e || e == s || x > UINT32_MAX)
		return -1;
	*v = (uint32_t)x;
	return 0;
}

static int set_opt(const struct tool_opt *o, const char *val)
{
	uint32_t v;
	int i;

	switch (o->arg) {
	case TOOL_STR:
		*(const char **)o->val = val;
		return 0;
	case TOOL_U32:
		return parse_u32(val, o->val);
	case TOOL_PORT:
		if (parse_u32(val, &v) || v > (o->max ? o->max : 65535))
			return -1;
		*(uint16_t *)o->val = (uint16_t)v;
		return 0;
	case TOOL_LAYOUT:
		i = TOOL_NAME_INDEX(tool_layout_names, val);
		if (i < 0)
			return -1;
		*(uint32_t *)o->val = (uint32_t)i;
		return 0;
	}
	return -1;
}

int tool_parse_args(int argc, char **argv, const char *prog,
		    const struct tool_opt *opts)
{
	int i;

	for (i = 1; i < argc; i++) {
		const char *a = argv[i], *val = argv[i + 1];
		const struct tool_opt *o;

		if (!strcmp(a, "--help") || !strcmp(a, "-h"))
			return TOOL_ARGS_HELP;
		if (!val)
			return TOOL_ARGS_NO_VALUE;
		i++;
		for (o = opts; o->name && strcmp(a, o->name); o++)
			;
		if (!o->name || set_opt(o, val)) {
			fprintf(stderr, "%s: bad option %s %s\n", prog, a, val);
			return TOOL_ARGS_BAD;
		}
	}
	return 0;
}

/* ---- agents ------------------------------------------------------------- */

int tool_agent_open(const struct kvp_agent_attr *at, struct kvt_mem *mem,
		    kvp_agent **a)
{
	kvp_agent *ag;
	uint32_t r;
	int err;

	err = kvp_agent_open(at, &ag);
	if (err)
		return err;
	for (r = 0; r < mem->nregions; r++) {
		err = kvp_agent_register(ag, r, mem->buf[r], mem->size[r]);
		if (err) {
			kvp_agent_close(ag);
			return err;
		}
	}
	*a = ag;
	return 0;
}

int tool_producer_open(const kvp_layout *l, const char *addr, uint16_t port,
		       uint32_t max_inflight, struct kvt_mem *mem,
		       kvp_agent **a)
{
	struct kvp_agent_attr at;
	kvp_agent *ag;
	int err;

	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = l;
	at.addr = addr;
	at.max_inflight = max_inflight;
	err = tool_agent_open(&at, mem, &ag);
	if (err)
		return err;
	err = kvp_agent_listen(ag, addr, port);
	if (err) {
		kvp_agent_close(ag);
		return err;
	}
	*a = ag;
	return 0;
}

int tool_connect(kvp_agent *a, const char *addr, uint16_t port, uint32_t n)
{
	struct kvp_peer peers[TOOL_MAX_RANKS];
	uint32_t i;

	if (n > TOOL_MAX_RANKS)
		return -EINVAL;
	memset(peers, 0, sizeof(peers));
	for (i = 0; i < n; i++) {
		peers[i].addr = addr;
		peers[i].port = (uint16_t)(port + i);
	}
	return kvp_agent_connect(a, peers, n, 60000);
}

int tool_agent_sleep(kvp_agent *a, int stop_fd, int max_ms)
{
	struct pollfd w[3];
	uint64_t wake, t;
	int fds[2], ms = max_ms, err;

	err = kvp_agent_fds(a, fds, 2);
	if (err != 2)
		return err < 0 ? err : -EPROTO;
	err = kvp_agent_arm(a, &wake);
	if (err)
		return err < 0 ? err : 0;
	t = tool_now_ns();
	if (wake != UINT64_MAX && wake < t + (uint64_t)max_ms * 1000000)
		ms = wake <= t ? 0 : (int)((wake - t) / 1000000 + 1);
	w[0].fd = fds[0];
	w[1].fd = fds[1];
	w[2].fd = stop_fd;
	w[0].events = w[1].events = w[2].events = POLLIN;
	(void)poll(w, 3, ms);
	return 0;
}

/* ---- ranks as processes ------------------------------------------------- */

static int exited_ok(pid_t pid)
{
	int st;

	return pid > 0 && waitpid(pid, &st, 0) == pid && WIFEXITED(st) &&
	       !WEXITSTATUS(st);
}

int tool_start_producers(struct tool_ranks *p, uint32_t n,
			 tool_producer_fn *fn, void *arg)
{
	int ready[2], stop[2];
	uint32_t r;
	char c;

	memset(p, 0, sizeof(*p));
	p->stop_fd = -1;
	if (n > TOOL_MAX_RANKS || pipe(ready))
		return -1;
	if (pipe(stop)) {
		close(ready[0]);
		close(ready[1]);
		return -1;
	}
	p->stop_fd = stop[1];
	fflush(NULL);
	for (r = 0; r < n; r++) {
		p->pid[r] = fork();
		if (p->pid[r] == 0) {
			close(ready[0]);
			close(stop[1]);
			_exit(fn(arg, r, ready[1], stop[0]));
		}
		if (p->pid[r] < 0)
			break;
		p->n++;
	}
	close(ready[1]);
	close(stop[0]);
	for (r = 0; r < p->n; r++)
		if (read(ready[0], &c, 1) != 1)
			break;
	close(ready[0]);
	return p->n == n && r == n ? 0 : -1;
}

int tool_run_consumers(const struct tool_ranks *p, uint32_t n,
		       tool_consumer_fn *fn, void *arg)
{
	pid_t pid[TOOL_MAX_RANKS];
	uint32_t r;
	int bad = n > TOOL_MAX_RANKS;

	fflush(NULL);
	for (r = 0; r < n && !bad; r++) {
		pid[r] = fork();
		if (pid[r] == 0) {
			close(p->stop_fd);
			_exit(fn(arg, r));
		}
		if (pid[r] < 0)
			bad = 1;
	}
	while (r--)
		if (!exited_ok(pid[r]))
			bad = 1;
	return bad ? -1 : 0;
}

uint32_t tool_stop_producers(struct tool_ranks *p, int term)
{
	uint32_t r, failed = 0;

	if (p->stop_fd >= 0)
		close(p->stop_fd);
	p->stop_fd = -1;
	for (r = 0; r < p->n; r++) {
		if (term)
			kill(p->pid[r], SIGTERM);
		if (!exited_ok(p->pid[r]))
			failed++;
	}
	p->n = 0;
	return failed;
}
