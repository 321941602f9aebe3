/* SPDX-License-Identifier: MIT */
/*
 * Multi-process RDMA test harness (header-only: the Makefile builds each
 * tests/rdma_*.c alone). A case is a producer engine of P processes and a
 * consumer engine of D processes, every rank its own process with its own
 * agent and QPs, forked from the test program:
 *
 *   parent ── fork P producers ── each: layout, memory filled with identity
 *      │                             patterns, agent, listen, "ready" byte,
 *      │                             expect every request, poll until each is
 *      │                             RELEASED (extras EXPIRED), then serve
 *      │                             until the parent says stop
 *      └───── fork D consumers ── each: layout, background memory and its
 *                                    expected copy (kvt_expect_consumer),
 *                                    agent, connect, pull every request, poll
 *                                    until DONE, compare the whole memory
 *
 * Requests are drawn in the parent before forking, so every process sees
 * the same ids. Every wait is bounded (alarm() in children, deadlines in
 * the parent). Addresses come from the soft-RoCE harness: KVP_ADDR0 (and
 * KVP_ADDR1 for cross-device cases).
 */
#ifndef KVP_RDMA_HARNESS_H
#define KVP_RDMA_HARNESS_H

#include <errno.h>
#include <execinfo.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <infiniband/verbs.h>

#include "kvpull.h"
#include "kvtest.h"
#include "vrules.h"

#define RT_MAX_RANKS 8
#define RT_MAX_REQ 16
#define RT_MAX_GROUPS 4
#define RT_MAX_IDS 256
#define RT_PROD_ENGINE 0x50524f44ull
#define RT_CONS_ENGINE 0x434f4e53ull

struct rt_case {
	const char *name;
	const char *model;
	uint32_t layers;
	uint32_t P, D;
	uint32_t pblock, dblock;   /* logical block tokens */
	uint32_t pkernel, dkernel; /* kernel block tokens, 0: same */
	uint32_t playout, dlayout; /* enum kvp_kv_layout */
	uint32_t pconv, dconv;	   /* enum kvp_conv_layout (state models) */
	uint32_t state_layers;	   /* state layers of a hybrid, 0: preset's */
	uint32_t pblocks, dblocks; /* blocks per region */
	uint32_t nreq;
	uint32_t tokens;	   /* sequence length of every request */
	uint32_t hit_tokens;	   /* consumer prefix hit (multiple of dblock) */
	uint32_t full_hit;	   /* no local block read at all */
	uint32_t cross;		   /* consumers on KVP_ADDR1 (second device) */
	uint32_t max_sge, sq_depth, max_inflight;
	uint32_t prq;		   /* producer receive depth (credits), 0:
				    * the default */
	uint32_t srq_off;	   /* producers: a receive queue per QP
				    * (kvp_agent_attr.srq KVP_SRQ_OFF) */
	uint32_t dmabuf;	   /* register through
				    * kvp_agent_register_dmabuf() */
	uint32_t tos;		   /* kvp_agent_attr.tos, both sides */
	uint32_t max_read;	   /* consumer: bytes per READ at most */
	uint32_t max_mr;	   /* kvp_agent_attr.max_mr, both sides: the
				    * regions registered as several MRs */
	uint32_t max_mr_odd;	   /* the same on odd producer ranks only */
	uint32_t read_window;	   /* consumer: kvp_agent_attr.read_window */
	uint32_t read_window_bytes; /* consumer: read_window_bytes */
	int connect_err;	   /* the consumers' connect must fail with
				    * this; nothing is pulled (nreq 0) */
	uint32_t striped;	   /* requests must go over 2 queue pairs */
	uint32_t max_ids;	   /* per group and request, 0: RT_MAX_IDS */
	uint32_t extra_expire;	   /* ids the producer expects, nobody pulls */
	uint32_t late_expect;	   /* expect request 0 after its notifications:
				    * its pulls read a request not held, and
				    * end FAILED -ESTALE (KVP_REASON_LEASE) */
	int kill_rank;		   /* producer rank killed mid-transfer, or -1 */
	uint32_t seed;
	uint32_t quick;		   /* in the subset run under ASan (rt_main) */
};

struct rt_req {
	uint64_t id;
	struct kvp_ids ids[RT_MAX_GROUPS];
	uint32_t lid[RT_MAX_GROUPS][RT_MAX_IDS];
	uint32_t rid[RT_MAX_GROUPS][RT_MAX_IDS];
};

struct rt_env {
	const char *addr0, *addr1;
	uint16_t port;
	int verbose;
	/* Optional hooks into rt_run() (rt_env_init() leaves them NULL; each
	 * returns 0 to go on, anything else fails the rank or the case):
	 * listened: a producer rank, after listen, before its ready byte;
	 * producers_ready: the parent, once every producer rank is ready and
	 * before the consumers are forked (what it stores, they inherit);
	 * connecting: a consumer rank, registered, before its connect: may
	 * try other connects on `a` and set the peers' other fields. */
	int (*listened)(const struct rt_env *env, const struct rt_case *tc,
			kvp_agent *a, const struct kvt_mem *mem, uint32_t rank);
	int (*producers_ready)(const struct rt_env *env,
			       const struct rt_case *tc);
	int (*connecting)(const struct rt_env *env, const struct rt_case *tc,
			  kvp_agent *a, struct kvp_peer *peers, uint32_t rank);
	void *arg; /* the hooks' */
};

static double rt_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static uint64_t rt_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Exit 77 (skip) when there is no RDMA device. Checked in a child so the
 * parent never initialises libibverbs before forking. */
static void rt_require_device(void)
{
	pid_t pid = fork();
	int st = 0;

	if (pid == 0) {
		int n = 0;
		struct ibv_device **l = ibv_get_device_list(&n);

		if (l)
			ibv_free_device_list(l);
		_exit(n > 0 ? 0 : 77);
	}
	if (pid < 0 || waitpid(pid, &st, 0) != pid || !WIFEXITED(st) ||
	    WEXITSTATUS(st) == 77) {
		printf("no RDMA device: skipped\n0 passed, 0 failed\n");
		exit(77);
	}
}

/* The READ scatter entries the first device allows: min(max_sge,
 * max_sge_rd), max_sge where max_sge_rd is not reported; 0 on error. */
static uint32_t rt_device_sge(void)
{
	struct ibv_device **l;
	struct ibv_context *c = NULL;
	struct ibv_device_attr d;
	uint32_t sge = 0;
	int n = 0;

	l = ibv_get_device_list(&n);
	if (l && n > 0)
		c = ibv_open_device(l[0]);
	if (c && !ibv_query_device(c, &d) && d.max_sge > 0) {
		sge = (uint32_t)d.max_sge;
		if (d.max_sge_rd > 0 && (uint32_t)d.max_sge_rd < sge)
			sge = (uint32_t)d.max_sge_rd;
	}
	if (c)
		ibv_close_device(c);
	if (l)
		ibv_free_device_list(l);
	return sge;
}

/* Rank `rank`'s layout of the case's producer or consumer engine, with
 * engine id `engine_id`. */
static kvp_layout *rt_layout_engine(const struct rt_case *tc, int producer,
				    uint32_t rank, uint64_t engine_id)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(tc->model, &m))
		return NULL;
	if (tc->layers)
		m.layers = tc->layers;
	if (tc->state_layers)
		m.state_layers = tc->state_layers;
	memset(&e, 0, sizeof(e));
	e.engine_id = engine_id;
	e.tp_size = producer ? tc->P : tc->D;
	e.tp_rank = rank;
	e.block_tokens = producer ? tc->pblock : tc->dblock;
	e.kernel_block_tokens = producer ? tc->pkernel : tc->dkernel;
	e.num_blocks = producer ? tc->pblocks : tc->dblocks;
	e.kv_layout = producer ? tc->playout : tc->dlayout;
	e.conv_layout = producer ? tc->pconv : tc->dconv;
	if (kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

static kvp_layout *rt_layout(const struct rt_case *tc, int producer,
			     uint32_t rank)
{
	return rt_layout_engine(tc, producer, rank,
				producer ? RT_PROD_ENGINE : RT_CONS_ENGINE);
}

/* Block ids valid in group g: the fewest pages of its views. */
static uint32_t rt_group_blocks(const kvp_layout *l, uint32_t g)
{
	struct kvp_layout_info li;
	uint32_t i, n = UINT32_MAX;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++) {
		struct kvp_view_desc v;

		if (!kvp_layout_get_view(l, i, &v) && v.group == g &&
		    v.num_blocks < n)
			n = v.num_blocks;
	}
	return n;
}

/* Attention pages one state page spans where a state group shares regions
 * with attention groups (hybrid models), else 0. */
static uint32_t rt_state_span(const kvp_layout *l)
{
	struct kvp_layout_info li;
	struct kvp_view_desc v;
	struct kvp_group_desc g;
	uint64_t state = 0, attn = 0;
	uint32_t i;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++) {
		if (kvp_layout_get_view(l, i, &v) ||
		    kvp_layout_get_group(l, v.group, &g))
			return 0;
		if (g.kind == KVP_GROUP_STATE && !state)
			state = v.stride;
		else if (g.kind != KVP_GROUP_STATE && !attn)
			attn = v.stride;
	}
	if (!state || !attn)
		return 0;
	return (uint32_t)((state + attn - 1) / attn);
}

/* Draws n distinct random ids in [lo, hi) into ids; -1 if they do not fit. */
static int rt_draw(uint64_t *seed, uint32_t *ids, uint32_t n, uint32_t lo,
		   uint32_t hi)
{
	uint32_t k;

	if (hi < lo || hi - lo < n)
		return -1;
	kvt_random_ids(seed, ids, n, hi - lo);
	for (k = 0; k < n; k++)
		ids[k] += lo;
	return 0;
}

/* Draws the case's requests: distinct remote blocks and distinct local
 * blocks across all requests (so that one producer fill and one consumer
 * expectation hold them all). In pooled regions state ids take the first
 * 2 * nreq state pages and token-group ids the pages above them, so no two
 * groups share bytes. */
static int rt_make_requests(const struct rt_case *tc, struct rt_req *rq)
{
	kvp_layout *pl = rt_layout(tc, 1, 0), *dl = rt_layout(tc, 0, 0);
	struct kvp_layout_info li;
	uint64_t seed = tc->seed ? tc->seed : 1;
	uint32_t g, i, k, pspan, dspan, slots = 2 * tc->nreq;
	int ret = -1;

	if (!pl || !dl)
		goto out;
	kvp_layout_get_info(dl, &li);
	if (li.ngroups > RT_MAX_GROUPS || tc->nreq > RT_MAX_REQ)
		goto out;
	pspan = rt_state_span(pl);
	dspan = rt_state_span(dl);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc pg, dg;
		uint32_t pb = rt_group_blocks(pl, g), db = rt_group_blocks(dl, g);
		uint32_t *pperm = malloc(pb * sizeof(*pperm));
		uint32_t *dperm = malloc(db * sizeof(*dperm));
		uint32_t pu = 0, du = 0, plo = 0, dlo = 0;

		if (!pperm || !dperm || kvp_layout_get_group(pl, g, &pg) ||
		    kvp_layout_get_group(dl, g, &dg)) {
			free(pperm);
			free(dperm);
			goto out;
		}
		if (dg.kind == KVP_GROUP_STATE) {
			pb = pspan && slots < pb ? slots : pb;
			db = dspan && slots < db ? slots : db;
		} else {
			plo = pspan * slots;
			dlo = dspan * slots;
		}
		if (rt_draw(&seed, pperm, pb - plo, plo, pb) ||
		    rt_draw(&seed, dperm, db - dlo, dlo, db)) {
			fprintf(stderr, "case %s: no room for token blocks\n",
				tc->name);
			free(pperm);
			free(dperm);
			goto out;
		}
		pb -= plo;
		db -= dlo;
		for (i = 0; i < tc->nreq; i++) {
			struct kvp_ids *id = &rq[i].ids[g];
			uint32_t nr, nl;

			if (dg.kind == KVP_GROUP_STATE) {
				nr = nl = 1;
			} else {
				nr = (tc->tokens + pg.block_tokens - 1) /
				     pg.block_tokens;
				nl = (tc->tokens + dg.block_tokens - 1) /
				     dg.block_tokens;
				nl -= tc->hit_tokens / dg.block_tokens;
				if (tc->full_hit)
					nl = 0;
			}
			if (nr > RT_MAX_IDS || nl > RT_MAX_IDS ||
			    pu + nr > pb || du + nl > db) {
				fprintf(stderr, "case %s: blocks do not fit\n",
					tc->name);
				free(pperm);
				free(dperm);
				goto out;
			}
			for (k = 0; k < nr; k++)
				rq[i].rid[g][k] = pperm[pu++];
			for (k = 0; k < nl; k++)
				rq[i].lid[g][k] = dperm[du++];
			id->remote = rq[i].rid[g];
			id->local = rq[i].lid[g];
			id->nremote = nr;
			id->nlocal = nl;
			id->tokens = dg.kind == KVP_GROUP_STATE ? 0 : tc->tokens;
		}
		free(pperm);
		free(dperm);
	}
	for (i = 0; i < tc->nreq; i++)
		rq[i].id = 1000 + i;
	ret = 0;
out:
	kvp_layout_destroy(pl);
	kvp_layout_destroy(dl);
	return ret;
}

#define RT_FAIL(...)                                                     \
	do {                                                             \
		fprintf(stderr, "  [%s] ", who);                         \
		fprintf(stderr, __VA_ARGS__);                            \
		fprintf(stderr, "\n");                                   \
		goto out;                                                \
	} while (0)

static int rt_register_all(kvp_agent *a, struct kvt_mem *m)
{
	uint32_t r;
	int err;

	for (r = 0; r < m->nregions; r++) {
		err = kvp_agent_register(a, r, m->buf[r], m->size[r]);
		if (err)
			return err;
	}
	return 0;
}

/* Registers every region through the dma-buf path, with /dev/null for the
 * fd (no dma-buf exporter here). soft-RoCE has no dma-buf registration: without an address that is
 * -ENOTSUP; with one, kvpull falls back to ibv_reg_mr() on it (1). */
/* A producer whose MRs are capped at tc->max_mr: its blob carries, for
 * every region larger than the cap, one key per MR stride, the stride
 * the largest that fits (limits.h); 0 when so. */
static int rt_check_split(kvp_agent *a, const kvp_layout *l)
{
	struct kvp_layout_info li;
	uint8_t blob[65536];
	kvp_layout *got = NULL;
	uint64_t size, addr;
	uint32_t i, shift, split = 0;
	size_t len;
	int n, bad = 0;

	kvp_layout_get_info(l, &li);
	if (kvp_agent_get_meta(a, blob, sizeof(blob), &len) ||
	    kvp_meta_decode(blob, len, &got))
		return -1;
	for (i = 0; i < li.nregions; i++) {
		n = kvp_layout_get_region_keys(got, i, &addr, &shift, NULL, 0);
		if (kvp_layout_get_region(l, i, &size) || n < 1)
			bad = 1;
		else if (size > KVP_MR_MIN &&
			 (shift < KVP_MR_SHIFT_MIN ||
			  (uint64_t)n != (size + (1ull << shift) - 1) >> shift))
			bad = 1;
		split += shift != 0;
	}
	kvp_layout_destroy(got);
	return bad || !split ? -1 : 0;
}

static int rt_register_dmabuf(kvp_agent *a, struct kvt_mem *m)
{
	uint32_t r;
	int fd, err = 0;

	fd = open("/dev/null", O_RDONLY);
	if (fd < 0)
		return -errno;
	if (kvp_agent_register_dmabuf(a, 0, fd, 0, m->size[0], NULL) !=
	    -ENOTSUP)
		err = -EPROTO;
	for (r = 0; !err && r < m->nregions; r++)
		if (kvp_agent_register_dmabuf(a, r, fd, 0, m->size[r],
					      m->buf[r]) != 1)
			err = -EPROTO;
	close(fd);
	return err;
}

static int rt_register(const struct rt_case *tc, kvp_agent *a,
		       struct kvt_mem *m)
{
	return tc->dmabuf ? rt_register_dmabuf(a, m) : rt_register_all(a, m);
}

/* ---- producer rank ------------------------------------------------------ */

/* The parent's SIGUSR1 before it kills a stuck rank: report and exit. */
static volatile sig_atomic_t rt_usr1;

static void rt_on_usr1(int sig)
{
	void *bt[32];
	int n;

	(void)sig;
	rt_usr1 = 1;
	/* Where a stuck rank is (addr2line -e BINARY +OFFSET). */
	n = backtrace(bt, 32);
	backtrace_symbols_fd(bt, n, 2);
}

static int rt_producer(const struct rt_case *tc, const struct rt_env *env,
		       const struct rt_req *rq, uint32_t rank, int ready_fd,
		       int stop_fd)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	kvp_agent *a = NULL;
	kvp_layout *l = rt_layout(tc, 1, rank);
	uint32_t i, released = 0, expired = 0, want_rel, want_exp;
	uint8_t got[RT_MAX_REQ + 8] = { 0 };
	uint64_t t_end;
	int late_go = 0;
	int late_done = !tc->late_expect, ret = 1, err, n;
	char who[32];
	struct kvp_event ev[16];

	snprintf(who, sizeof(who), "%s P%u", tc->name, rank);
	alarm(120);
	signal(SIGUSR1, rt_on_usr1);
	if (!l || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout or memory");
	kvt_fill_background(&mem, 100 + rank);
	for (i = 0; i < tc->nreq; i++)
		kvt_fill_producer(l, &mem, rq[i].ids);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = l;
	at.addr = env->addr0;
	at.max_inflight = 32;
	at.rq_depth = tc->prq;
	at.srq = tc->srq_off ? KVP_SRQ_OFF : 0;
	at.tos = tc->tos;
	at.max_mr = tc->max_mr ? tc->max_mr : rank & 1 ? tc->max_mr_odd : 0;
	err = kvp_agent_open(&at, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = rt_register(tc, a, &mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	if (tc->max_mr && rt_check_split(a, l))
		RT_FAIL("regions not split into MRs of at most %u bytes",
			tc->max_mr);
	err = kvp_agent_listen(a, env->addr0, (uint16_t)(env->port + rank));
	if (err)
		RT_FAIL("listen: %s", kvp_strerror(err));
	/* soft-RoCE has shared receive queues: the producer takes one
	 * unless told not to. */
	{
		struct kvp_agent_stats ps;

		kvp_agent_get_stats(a, &ps);
		if (!ps.srq_bufs != !!tc->srq_off)
			RT_FAIL("%llu shared receive queue buffers, srq %s",
				(unsigned long long)ps.srq_bufs,
				tc->srq_off ? "off" : "on");
	}
	if (env->listened && env->listened(env, tc, a, &mem, rank))
		RT_FAIL("listened hook");
	if (write(ready_fd, "r", 1) != 1)
		RT_FAIL("ready pipe");
	for (i = tc->late_expect ? 1 : 0; i < tc->nreq; i++) {
		err = kvp_agent_expect(a, RT_CONS_ENGINE, rq[i].id,
				       rt_now_ns() + (tc->kill_rank >= 0 ?
							      8 :
							      90) * 1000000000ull);
		if (err)
			RT_FAIL("expect: %s", kvp_strerror(err));
	}
	for (i = 0; i < tc->extra_expire; i++) {
		err = kvp_agent_expect(a, RT_CONS_ENGINE, 5000 + i, rt_now_ns() + 300000000ull);
		if (err)
			RT_FAIL("expect extra: %s", kvp_strerror(err));
	}
	/* -EEXIST on a second expect of the same id. */
	if (tc->nreq > 1 &&
	    kvp_agent_expect(a, RT_CONS_ENGINE, rq[1].id, rt_now_ns()) != -EEXIST)
		RT_FAIL("second expect was not -EEXIST");
	want_rel = tc->nreq;
	want_exp = tc->extra_expire;
	t_end = rt_now_ns() + 100000000000ull;
	while (released + expired < want_rel + want_exp) {
		if (!late_done) {
			struct kvp_agent_stats lst;

			kvp_agent_get_stats(a, &lst);
			late_go = lst.unheld > 0;
		}
		if (!late_done && late_go) {
			/* Request 0's notification (flagged: it was read
			 * while not held) arrived before this: the order the
			 * case is about, whatever the machine's speed. */
			err = kvp_agent_expect(a, RT_CONS_ENGINE, rq[0].id,
					       rt_now_ns() + 60000000000ull);
			if (err)
				RT_FAIL("late expect: %s", kvp_strerror(err));
			late_done = 1;
		}
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			uint64_t id = ev[i].req_id;
			uint32_t k;

			if (ev[i].type == KVP_EV_DISCONNECTED)
				continue;
			if (ev[i].type != KVP_EV_RELEASED &&
			    ev[i].type != KVP_EV_EXPIRED)
				RT_FAIL("unexpected event %u", ev[i].type);
			if (id >= 5000 && id < 5000 + tc->extra_expire) {
				if (ev[i].type != KVP_EV_EXPIRED)
					RT_FAIL("extra %llu released",
						(unsigned long long)id);
				expired++;
				continue;
			}
			k = (uint32_t)(id - 1000);
			if (id < 1000 || k >= tc->nreq || got[k]++)
				RT_FAIL("event for bad or repeated id %llu",
					(unsigned long long)id);
			if (ev[i].type == KVP_EV_EXPIRED) {
				if (tc->kill_rank < 0)
					RT_FAIL("request %llu expired",
						(unsigned long long)id);
				expired++;
				want_exp++;
				want_rel--;
			} else {
				if (ev[i].engine_id != RT_CONS_ENGINE)
					RT_FAIL("released by engine %llx",
						(unsigned long long)
							ev[i].engine_id);
				released++;
			}
		}
		if (rt_now_ns() > t_end || rt_usr1)
			RT_FAIL("timeout: %u released %u expired", released,
				expired);
		if (!n)
			usleep(50);
	}
	/* Request 0 expected late: every rank that read it said it was
	 * not held (its notification flagged, stats.unheld). */
	if (tc->late_expect) {
		struct kvp_agent_stats pst;

		kvp_agent_get_stats(a, &pst);
		if (!pst.unheld)
			RT_FAIL("request 0 read before expect(): unheld 0");
	}
	/* Keep the connections served until every consumer is done. */
	for (;;) {
		struct kvp_agent_stats pst;

		/* The RNR timer of every connection was set (RTS to RTS is
		 * in the IB spec: every provider takes it). */
		kvp_agent_get_stats(a, &pst);
		if (pst.rnr_timer_unset)
			RT_FAIL("RNR timer not set on %llu connections",
				(unsigned long long)pst.rnr_timer_unset);
		struct pollfd p = { .fd = stop_fd, .events = POLLIN };

		if (poll(&p, 1, 0) > 0)
			break;
		if (kvp_agent_poll(a, ev, 16) < 0)
			RT_FAIL("poll while serving");
		usleep(200);
		if (rt_now_ns() > t_end || rt_usr1)
			RT_FAIL("never told to stop");
	}
	if (env->verbose) {
		struct kvp_agent_stats st;

		kvp_agent_get_stats(a, &st);
		fprintf(stderr,
			"  [%s] released %llu expired %llu notes %llu dropped %llu\n",
			who, (unsigned long long)st.released,
			(unsigned long long)st.expired,
			(unsigned long long)st.notes_recv,
			(unsigned long long)st.notes_dropped);
	}
	ret = 0;
out:
	if (ret && a) {
		struct kvp_agent_stats st;

		kvp_agent_get_stats(a, &st);
		fprintf(stderr,
			"  [%s] FAILED with: released %llu expired %llu notes %llu dropped %llu connects %llu disconnects %llu; events: %u released %u expired\n",
			who, (unsigned long long)st.released,
			(unsigned long long)st.expired,
			(unsigned long long)st.notes_recv,
			(unsigned long long)st.notes_dropped,
			(unsigned long long)st.connects,
			(unsigned long long)st.disconnects, released, expired);
	}
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

/* ---- consumer rank ------------------------------------------------------ */

static int rt_consumer(const struct rt_case *tc, const struct rt_env *env,
		       const struct rt_req *rq, uint32_t rank, int posted_fd)
{
	struct kvp_peer peers[RT_MAX_RANKS] = { { 0 } };
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 }, exp = { 0 }, need = { 0 };
	struct kvp_agent_stats st;
	struct kvp_event ev[16];
	kvp_agent *a = NULL;
	kvp_layout *l = rt_layout(tc, 0, rank), *r0 = rt_layout(tc, 1, 0);
	uint32_t i, g, r, done = 0, failed = 0, reported = 0, next = 0;
	uint8_t got[RT_MAX_REQ] = { 0 }, bad[RT_MAX_REQ] = { 0 };
	struct kvp_layout_info li;
	uint64_t o;
	double t0, t1, t2 = 0;
	int ret = 1, err, n;
	char who[32];

	snprintf(who, sizeof(who), "%s D%u", tc->name, rank);
	alarm(120);
	if (!l || !r0 || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout or memory");
	kvp_layout_get_info(l, &li);
	kvt_fill_background(&mem, 7 + rank);
	/* The expectation is computed after the transfer (it is slow under
	 * TCG, and producers' deadlines run meanwhile) from this copy. */
	if (kvt_mem_copy(&exp, &mem))
		RT_FAIL("memory");
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = tc->cross ? env->addr1 : env->addr0;
	at.max_ids = tc->max_ids ? tc->max_ids : RT_MAX_IDS;
	at.max_inflight = tc->max_inflight ? tc->max_inflight : 8;
	at.sq_depth = tc->sq_depth;
	at.max_sge = tc->max_sge;
	at.tos = tc->tos;
	at.max_read = tc->max_read;
	at.max_mr = tc->max_mr;
	at.read_window = tc->read_window;
	at.read_window_bytes = tc->read_window_bytes;
	/* What soft-RoCE forgives, checked under the agent (vrules.h). */
	if (vr_install())
		RT_FAIL("verbs rules: no RDMA device");
	err = kvp_agent_open(&at, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	/* Pulling before connect is refused. */
	if (kvp_agent_pull(a, 1, rq[0].ids) != -ENOTCONN)
		RT_FAIL("pull before connect was not -ENOTCONN");
	err = rt_register(tc, a, &mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	for (r = 0; r < tc->P; r++) {
		peers[r].addr = env->addr0;
		peers[r].port = (uint16_t)(env->port + r);
	}
	if (env->connecting && env->connecting(env, tc, a, peers, rank))
		RT_FAIL("connecting hook");
	t0 = rt_now();
	err = kvp_agent_connect(a, peers, tc->P, 30000);
	if (tc->connect_err) {
		if (err != tc->connect_err)
			RT_FAIL("connect: %s, want %s", kvp_strerror(err),
				kvp_strerror(tc->connect_err));
		if (kvp_agent_plan(a))
			RT_FAIL("a plan survived a refused connect");
		ret = 0;
		goto out;
	}
	if (err)
		RT_FAIL("connect: %s", kvp_strerror(err));
	if (kvp_agent_connect(a, peers, tc->P, 1000) != -EISCONN)
		RT_FAIL("second connect was not -EISCONN");
	/* The plan's READs scatter into max_sge local pieces (16 by
	 * default), never more than the device allows. */
	{
		struct kvp_plan_info pi;
		uint32_t want = tc->max_sge ? tc->max_sge : 16,
			 dev = rt_device_sge();

		if (!kvp_agent_plan(a) || !dev)
			RT_FAIL("no plan or no device limits");
		kvp_plan_get_info(kvp_agent_plan(a), &pi);
		if (want > dev)
			want = dev;
		if (pi.max_sge != want)
			RT_FAIL("plan max_sge %u, want %u (asked %u, device "
				"%u)", pi.max_sge, want, tc->max_sge, dev);
	}
	t1 = rt_now();
	while (reported < tc->nreq) {
		while (next < tc->nreq) {
			err = kvp_agent_pull(a, rq[next].id, rq[next].ids);
			if (err == -EBUSY)
				break;
			if (err)
				RT_FAIL("pull %u: %s", next, kvp_strerror(err));
			next++;
			if (next == tc->nreq && posted_fd >= 0 &&
			    write(posted_fd, "p", 1) != 1)
				RT_FAIL("posted pipe");
		}
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			uint32_t k = (uint32_t)(ev[i].req_id - 1000);

			if (ev[i].type == KVP_EV_DISCONNECTED) {
				if (tc->kill_rank < 0)
					RT_FAIL("producer %u disconnected: %s",
						ev[i].rank,
						kvp_strerror(ev[i].status));
				continue;
			}
			if (ev[i].type == KVP_EV_ENGINE_DOWN) {
				/* The engine goes down with its lost rank. */
				if (tc->kill_rank < 0 || !ev[i].status)
					RT_FAIL("engine down: %s",
						kvp_strerror(ev[i].status));
				continue;
			}
			if (k >= tc->nreq || got[k]++)
				RT_FAIL("event %u for bad or repeated id %llu",
					ev[i].type,
					(unsigned long long)ev[i].req_id);
			reported++;
			if (ev[i].type == KVP_EV_DONE) {
				done++;
				continue;
			}
			if (ev[i].type != KVP_EV_FAILED)
				RT_FAIL("unexpected event %u", ev[i].type);
			if (tc->late_expect && !k) {
				/* Pulled before the producer held it: the
				 * bytes may be right, nothing vouches. */
				if (ev[i].status != -ESTALE ||
				    ev[i].reason != KVP_REASON_LEASE)
					RT_FAIL("request 0, pulled before expect(): %s (reason %u), want -ESTALE, KVP_REASON_LEASE",
						kvp_strerror(ev[i].status),
						ev[i].reason);
			} else if (tc->kill_rank < 0) {
				RT_FAIL("request %u failed: %s", k,
					kvp_strerror(ev[i].status));
			}
			failed++;
			bad[k] = 1;
			/* The ids to recompute are exactly the request's. */
			if (ev[i].ngroups != li.ngroups || !ev[i].ids)
				RT_FAIL("FAILED without ids");
			for (g = 0; g < li.ngroups; g++) {
				const struct kvp_ids *x = &ev[i].ids[g];

				if (x->nlocal != rq[k].ids[g].nlocal ||
				    memcmp(x->local, rq[k].ids[g].local,
					   x->nlocal * sizeof(uint32_t)))
					RT_FAIL("FAILED ids differ (group %u)",
						g);
			}
		}
		if (!n)
			usleep(20);
	}
	/* Every request's notifications posted before the slow checks
	 * below: with a producer's credit of 2 the last ones wait for
	 * credit READs, which only polls move (left to close()'s bounded
	 * flush, a loaded host lost them). Bounded: a missing one fails
	 * the producer's side, not this wait. */
	if (tc->kill_rank < 0 && kvp_agent_plan(a)) {
		struct kvp_plan_info npi;
		double nend = rt_now() + 60;

		kvp_plan_get_info(kvp_agent_plan(a), &npi);
		for (;;) {
			kvp_agent_get_stats(a, &st);
			if (st.notes_sent >= (uint64_t)tc->nreq * npi.nnotify ||
			    rt_now() > nend)
				break;
			n = kvp_agent_poll(a, ev, 16);
			if (n < 0)
				RT_FAIL("poll: %s", kvp_strerror(n));
			if (!n)
				usleep(20);
		}
	}
	kvp_agent_get_stats(a, &st);
	t2 = rt_now();
	/* More notifications than a producer rank's receive buffers: the
	 * consumer must have read its credit counter. */
	/* Requests longer than a send queue: their READs from a rank
	 * striped over its queue pairs. */
	if (tc->striped && !st.striped)
		RT_FAIL("no request striped over the queue pairs");
	/* A READ slice: no READ moves more (at least bytes / slice READs;
	 * the pages are larger than the slice). */
	if (tc->max_read &&
	    st.reads < (st.read_bytes + tc->max_read - 1) / tc->max_read)
		RT_FAIL("%llu READs for %llu bytes in %u-byte slices",
			(unsigned long long)st.reads,
			(unsigned long long)st.read_bytes, tc->max_read);
	/* Regions split into MRs: no READ longer than their window, which
	 * the plan obeys (KVP_MR_WINDOW of the stride the cap allows). */
	if (tc->max_mr) {
		struct kvp_plan_info pi;
		const kvp_plan *pl = kvp_agent_plan(a);
		uint32_t s = KVP_MR_SHIFT_MIN;

		while ((2ull << s) + KVP_MR_WINDOW(s + 1) <= tc->max_mr)
			s++;
		if (!pl)
			RT_FAIL("no plan");
		kvp_plan_get_info(pl, &pi);
		if (pi.max_len != KVP_MR_WINDOW(s))
			RT_FAIL("plan READ cap is not the MR window %llu",
				(unsigned long long)KVP_MR_WINDOW(s));
		if (st.reads < (st.read_bytes + pi.max_len - 1) / pi.max_len)
			RT_FAIL("%llu READs for %llu bytes in %u-byte MR "
				"windows", (unsigned long long)st.reads,
				(unsigned long long)st.read_bytes, pi.max_len);
	}
	if (tc->prq && tc->prq < tc->nreq && !st.credit_waits)
		RT_FAIL("%u notifications into %u buffers without a credit read",
			tc->nreq, tc->prq);
	for (i = 0; i < tc->nreq; i++)
		kvt_expect_consumer(l, r0, &exp, NULL, rq[i].ids);
	if (tc->kill_rank >= 0 && !failed)
		RT_FAIL("no request failed although a producer died");
	if (tc->late_expect && !bad[0])
		RT_FAIL("request 0, pulled before expect(), not FAILED");
	if (failed) {
		/* Bytes of failed requests may hold anything; every other
		 * byte must be exact. */
		if (kvt_mem_copy(&need, &mem))
			RT_FAIL("memory");
		for (r = 0; r < need.nregions; r++)
			memset(need.buf[r], 0, need.size[r]);
		for (i = 0; i < tc->nreq; i++)
			if (bad[i])
				kvt_expect_consumer(l, r0, &exp, &need,
						    rq[i].ids);
		for (r = 0; r < need.nregions; r++)
			for (o = 0; o < need.size[r]; o++)
				if (need.buf[r][o])
					exp.buf[r][o] = mem.buf[r][o];
	}
	if (kvt_mem_compare(&mem, &exp, who))
		RT_FAIL("consumer memory differs from the expectation");
	if (env->verbose)
		fprintf(stderr,
			"  [%s] connect %.3f s, %u done %u failed, %llu READs %llu bytes %llu doorbells %llu queued, %.3f s\n",
			who, t1 - t0, done, failed,
			(unsigned long long)st.reads,
			(unsigned long long)st.read_bytes,
			(unsigned long long)st.doorbells,
			(unsigned long long)st.queued, t2 - t1);
	if (vr_report(who))
		goto out;
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvt_mem_free(&need);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r0);
	return ret;
}

/* ---- one case ----------------------------------------------------------- */

static void rt_kill_all(pid_t *pids, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (pids[i] > 0)
			kill(pids[i], SIGKILL);
}

/* Waits for pids[0..n) to exit until `deadline`; 0 if every one exited 0
 * (entries <= 0 are skipped). Each pid is waited for by itself, so that a
 * child of another group exiting meanwhile is not reaped here. After the
 * deadline the rest get SIGUSR1 (report), then SIGKILL, and 10 s more. */
static int rt_wait(pid_t *pids, uint32_t n, double deadline, const char *what)
{
	uint32_t left = 0, i;
	int bad = 0, st, killed = 0;

	for (i = 0; i < n; i++)
		left += pids[i] > 0;
	while (left) {
		int reaped = 0;

		for (i = 0; i < n; i++) {
			pid_t p;

			if (pids[i] <= 0)
				continue;
			p = waitpid(pids[i], &st, WNOHANG);
			if (p == 0)
				continue;
			reaped = 1;
			pids[i] = 0;
			left--;
			if (p < 0) {
				fprintf(stderr, "  %s %u: lost\n", what, i);
				bad = 1;
			} else if (!WIFEXITED(st) || WEXITSTATUS(st)) {
				fprintf(stderr, "  %s %u: %s %d\n", what, i,
					WIFEXITED(st) ? "exit" : "signal",
					WIFEXITED(st) ? WEXITSTATUS(st) :
							WTERMSIG(st));
				bad = 1;
			}
		}
		if (reaped || !left)
			continue;
		if (rt_now() > deadline) {
			if (killed) {
				fprintf(stderr, "  %s: %u unkillable, giving up\n",
					what, left);
				return -1;
			}
			fprintf(stderr, "  %s: timeout, killing\n", what);
			for (i = 0; i < n; i++)
				if (pids[i] > 0)
					kill(pids[i], SIGUSR1);
			usleep(500000);
			rt_kill_all(pids, n);
			killed = 1;
			bad = 1;
			deadline = rt_now() + 10;
		}
		usleep(5000);
	}
	return bad ? -1 : 0;
}

/* RT_SANITIZED: built with AddressSanitizer (gcc says so in a macro,
 * clang in __has_feature). Its code runs several times slower: bounds on
 * time that the issue states for a release build are checked as stated
 * in the plain build only. */
#if defined(__SANITIZE_ADDRESS__)
#define RT_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RT_SANITIZED 1
#endif
#endif
#ifndef RT_SANITIZED
#define RT_SANITIZED 0
#endif

/* How a rank process ends: exit() under gcc's sanitizer so that
 * LeakSanitizer checks it, _exit() otherwise (nothing of the parent's to
 * run; clang's ASan stage leaves leak checks to gcc's). */
#if defined(__SANITIZE_ADDRESS__)
#define RT_EXIT(x) exit(x)
#else
#define RT_EXIT(x) _exit(x)
#endif

static int rt_run(const struct rt_case *tc, const struct rt_env *env)
{
	static struct rt_req rq[RT_MAX_REQ];
	pid_t prod[RT_MAX_RANKS] = { 0 }, cons[RT_MAX_RANKS] = { 0 };
	int ready[2] = { -1, -1 }, stop[2] = { -1, -1 }, posted[2] = { -1, -1 };
	uint32_t i, nready = 0;
	double deadline;
	int ret = -1;
	char c;

	memset(rq, 0, sizeof(rq));
	if (tc->P > RT_MAX_RANKS || tc->D > RT_MAX_RANKS ||
	    rt_make_requests(tc, rq))
		return -1;
	if (tc->cross && !env->addr1) {
		fprintf(stderr, "  %s: needs KVP_ADDR1 (--devices 2)\n",
			tc->name);
		return -1;
	}
	if (pipe(ready) || pipe(stop) || pipe(posted))
		goto out;
	fflush(NULL);
	for (i = 0; i < tc->P; i++) {
		prod[i] = fork();
		if (prod[i] == 0) {
			close(ready[0]);
			close(stop[1]);
			RT_EXIT(rt_producer(tc, env, rq, i, ready[1], stop[0]));
		}
		if (prod[i] < 0)
			goto out_kill;
	}
	close(ready[1]);
	ready[1] = -1;
	close(stop[0]);
	stop[0] = -1;
	deadline = rt_now() + 30;
	while (nready < tc->P) {
		struct pollfd p = { .fd = ready[0], .events = POLLIN };

		if (poll(&p, 1, 100) > 0) {
			if (read(ready[0], &c, 1) != 1)
				goto out_kill; /* a producer died early */
			nready++;
		}
		if (rt_now() > deadline)
			goto out_kill;
	}
	if (env->producers_ready && env->producers_ready(env, tc))
		goto out_kill;
	for (i = 0; i < tc->D; i++) {
		cons[i] = fork();
		if (cons[i] == 0) {
			close(stop[1]);
			close(posted[0]);
			RT_EXIT(rt_consumer(tc, env, rq, i,
					    i == 0 ? posted[1] : -1));
		}
		if (cons[i] < 0)
			goto out_kill;
	}
	close(posted[1]);
	posted[1] = -1;
	if (tc->kill_rank >= 0) {
		struct pollfd p = { .fd = posted[0], .events = POLLIN };

		/* Consumer 0 posted every pull: kill the producer now, with
		 * READs in flight. */
		if (poll(&p, 1, 30000) <= 0 || read(posted[0], &c, 1) != 1)
			goto out_kill;
		kill(prod[tc->kill_rank], SIGKILL);
		for (i = 0; i < 2000; i++) /* 10 s */
			if (waitpid(prod[tc->kill_rank], NULL, WNOHANG))
				break;
			else
				usleep(5000);
		prod[tc->kill_rank] = -1;
	}
	ret = rt_wait(cons, tc->D, rt_now() + 100, "consumer");
	close(stop[1]);
	stop[1] = -1;
	if (rt_wait(prod, tc->P, rt_now() + 20, "producer"))
		ret = -1;
	goto out;
out_kill:
	rt_kill_all(prod, tc->P);
	rt_kill_all(cons, tc->D);
	while (waitpid(-1, NULL, 0) > 0)
		;
	ret = -1;
out:
	for (i = 0; i < 2; i++) {
		if (ready[i] >= 0)
			close(ready[i]);
		if (stop[i] >= 0)
			close(stop[i]);
		if (posted[i] >= 0)
			close(posted[i]);
	}
	return ret;
}

static void rt_env_init(struct rt_env *env, uint16_t port)
{
	memset(env, 0, sizeof(*env));
	env->addr0 = getenv("KVP_ADDR0");
	env->addr1 = getenv("KVP_ADDR1");
	if (env->addr1 && !*env->addr1)
		env->addr1 = NULL;
	env->port = port;
	env->verbose = getenv("KVP_TEST_VERBOSE") != NULL;
}

/* The start of an RDMA test program: exits 77 without an RDMA device;
 * fills *env (first port `port`); returns 0, or 1 after printing the
 * closing count when KVP_ADDR0 is not set. */
static __attribute__((unused)) int rt_start(struct rt_env *env, uint16_t port)
{
	rt_require_device();
	rt_env_init(env, port);
	if (!env->addr0) {
		printf("KVP_ADDR0 is not set (run under scripts/rxe-vm.sh)\n");
		printf("0 passed, 1 failed\n");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	return 0;
}

/* Prints a case's line (started at t0, rt_now()) and counts it. */
static __attribute__((unused)) void rt_report(const char *name, int ok,
					      double t0, uint32_t *pass,
					      uint32_t *fail)
{
	printf("%s %s (%.2f s)\n", ok ? "ok  " : "FAIL", name, rt_now() - t0);
	if (ok)
		(*pass)++;
	else
		(*fail)++;
}

/* Runs the cases whose name contains `filter` (NULL: all), only those
 * marked `quick` when $KVP_QUICK_CASES is 1 (scripts/test.sh runs the
 * whole matrix plain and the quick ones, which still reach every code
 * path, under ASan); prints one line per case and the closing count;
 * returns the exit status. */
static __attribute__((unused)) int rt_main(const struct rt_case *cases, uint32_t n, const char *filter,
		   uint16_t port)
{
	struct rt_env env;
	uint32_t i, pass = 0, fail = 0;
	const char *q = getenv("KVP_QUICK_CASES");
	int quick = q && !strcmp(q, "1");

	if (rt_start(&env, port))
		return 1;
	for (i = 0; i < n; i++) {
		double t0 = rt_now();
		int ok;

		if ((filter && !strstr(cases[i].name, filter)) ||
		    (quick && !cases[i].quick))
			continue;
		if (cases[i].cross && !env.addr1) {
			printf("skip %s (needs a second device)\n",
			       cases[i].name);
			continue;
		}
		ok = !rt_run(&cases[i], &env);
		env.port = (uint16_t)(env.port + RT_MAX_RANKS);
		rt_report(cases[i].name, ok, t0, &pass, &fail);
	}
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}

#endif
