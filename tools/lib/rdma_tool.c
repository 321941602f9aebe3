// SPDX-License-Identifier: MIT
#define _GNU_SOURCE /* strerrorname_np */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "defaults.h"
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

int tool_default_addr(const char *prog, const char **addr)
{
	if (!*addr)
		*addr = getenv("KVP_ADDR0");
	if (*addr)
		return 0;
	return tool_bad_arg(prog, "no --addr and no $KVP_ADDR0; run it under "
				  "scripts/rxe-vm.sh or give an RDMA-capable "
				  "address");
}

const char *tool_errname(int err)
{
	const char *s = err < 0 ? strerrorname_np(-err) : NULL;

	return s ? s : err ? "?" : "0";
}

int tool_cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

/* ---- layouts ------------------------------------------------------------ */

kvp_layout *tool_model_layout(const char *model, uint32_t layers, uint32_t tp,
			      uint32_t rank, uint64_t engine_id,
			      uint32_t nblocks)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(model, &m))
		return NULL;
	if (layers)
		m.layers = layers;
	memset(&e, 0, sizeof(e));
	e.engine_id = engine_id;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = TOOL_DEFAULT_BLOCK_TOKENS;
	e.num_blocks = nblocks;
	e.kv_layout = TOOL_DEFAULT_KV_LAYOUT;
	if (kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

/* From the views' offsets and strides alone. */
uint32_t tool_token_base(const kvp_layout *l, uint32_t slots)
{
	struct kvp_layout_info li;
	struct kvp_view_desc s, t;
	struct kvp_group_desc sg, tg;
	uint64_t end, lo = 0;
	uint32_t i, j;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++) {
		if (kvp_layout_get_view(l, i, &s) ||
		    kvp_layout_get_group(l, s.group, &sg) ||
		    sg.kind != KVP_GROUP_STATE)
			continue;
		end = s.offset + (uint64_t)slots * s.stride;
		for (j = 0; j < li.nviews; j++) {
			if (kvp_layout_get_view(l, j, &t) ||
			    t.region != s.region ||
			    kvp_layout_get_group(l, t.group, &tg) ||
			    tg.kind == KVP_GROUP_STATE || end <= t.offset)
				continue;
			if ((end - t.offset + t.stride - 1) / t.stride > lo)
				lo = (end - t.offset + t.stride - 1) / t.stride;
		}
	}
	return lo > UINT32_MAX ? UINT32_MAX : (uint32_t)lo;
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

int tool_add_engine(kvp_agent *a, const char *addr, uint16_t port, uint32_t n,
		    uint32_t *engine)
{
	struct kvp_peer peers[TOOL_MAX_RANKS];
	struct kvp_event ev[8];
	uint32_t i, h;
	int err, k;

	if (n > TOOL_MAX_RANKS)
		return -EINVAL;
	memset(peers, 0, sizeof(peers));
	for (i = 0; i < n; i++) {
		peers[i].addr = addr;
		peers[i].port = (uint16_t)(port + i);
	}
	err = kvp_agent_add_engine(a, peers, n, 60000, &h);
	if (err)
		return err;
	/* The handshake runs inside poll; its end is an event. */
	for (;;) {
		k = kvp_agent_poll(a, ev, 8);
		if (k < 0)
			return k;
		for (i = 0; i < (uint32_t)k; i++) {
			if (ev[i].engine != h)
				continue;
			if (ev[i].type == KVP_EV_ENGINE_UP) {
				*engine = h;
				return 0;
			}
			if (ev[i].type == KVP_EV_ENGINE_DOWN) {
				(void)kvp_agent_remove_engine(a, h);
				return ev[i].status ? ev[i].status : -EIO;
			}
		}
		if (!k) {
			err = tool_agent_sleep(a, -1, 10);
			if (err)
				return err;
		}
	}
}

int tool_agent_sleep(kvp_agent *a, int stop_fd, int max_ms)
{
	struct pollfd w[KVP_AGENT_FDS + 1];
	uint64_t wake, t;
	int fds[KVP_AGENT_FDS], ms = max_ms, err, i;

	err = kvp_agent_fds(a, fds, KVP_AGENT_FDS);
	if (err != KVP_AGENT_FDS)
		return err < 0 ? err : -EPROTO;
	err = kvp_agent_arm(a, &wake);
	if (err)
		return err < 0 ? err : 0;
	t = tool_now_ns();
	if (wake != UINT64_MAX && wake < t + (uint64_t)max_ms * 1000000)
		ms = wake <= t ? 0 : (int)((wake - t) / 1000000 + 1);
	for (i = 0; i < KVP_AGENT_FDS; i++)
		w[i].fd = fds[i];
	w[KVP_AGENT_FDS].fd = stop_fd;
	for (i = 0; i <= KVP_AGENT_FDS; i++) {
		w[i].events = POLLIN;
		w[i].revents = 0;
	}
	(void)poll(w, KVP_AGENT_FDS + 1, ms);
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
