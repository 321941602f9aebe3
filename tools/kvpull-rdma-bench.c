// SPDX-License-Identifier: MIT
/*
 * kvpull-rdma-bench: RDMA READ throughput of kvp_agent_pull() and the CPU
 * cost of its post path, in a form comparable with perftest's ib_read_bw
 * and UCX's ucx_perftest (same message size, same device). Public API only.
 *
 *   kvpull-rdma-bench [--pair NAME] [--addr IP] [--src IP] [--port N]
 *                     [--page-kib K] [--block T] [--blocks B]
 *                     [--requests N] [--inflight F] [--layers L] [--sq N]
 *                     [--qps N] [--max-sge S] [--no-coalesce]
 *                     [--window N] [--window-bytes N]
 *                     [--ids random|contiguous]
 *
 * One consumer process, rank 0 of its engine, pulls from every producer
 * rank it needs; each producer rank is a child process. --pair picks the
 * engines (KV-shaped workloads of real model pairs):
 *
 *   llama-3.1-8b-tp1to1-hnd (default): TP 1 -> 1, FLASH_HND, the block
 *     size chosen so that one K or V page is --page-kib KiB (default 64:
 *     32 tokens), --layers layers (default 1, two regions each).
 *   llama-3.1-70b-tp8to2-hnd: TP 8 -> 2, FLASH_HND both sides; consumer
 *     rank 0 reads one 4 KiB head page per block per region from each of
 *     producer ranks 0..3.
 *   llama-3.1-70b-tp4to8-nhd: TP 4 -> 8, FLASH_NHD both sides; consumer
 *     rank 0 reads its one head, 256 B per token, from producer rank 0.
 *   nemotron-h-8b-tp2to1-hnd: hybrid, TP 2 -> 1: attention (FLASH_HND)
 *     and Mamba2 state sharing regions; one whole state per request.
 *
 * The new pairs use 16-token blocks (--block) and keep 2 layers (2
 * attention and 2 state layers for the hybrid); they say so when they run.
 * A request pulls --blocks blocks (default 128) per token group with
 * random ids (one READ per piece) or contiguous ids (coalesced); the state
 * group of the hybrid reads state page 0. Prints throughput and, for the
 * post path (kvp_agent_pull(): emission, conversion to ibv_send_wr,
 * ibv_post_send), wall and CPU ns per WR, next to the cost of emission
 * alone; the last line is machine-readable:
 *   result: bytes=N secs=S mbps=X reads=R avg_read=B
 * The producers sleep on the agent's fds by default (--producer-spin 1
 * busy-polls), like perftest's server: on a two-vCPU soft-RoCE VM a
 * spinning peer takes CPU from the transfer.
 */
#define _GNU_SOURCE /* RUSAGE_THREAD */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include "kvpull.h"
#include "kvtest.h"
#include "rdma_tool.h"

#define PRODUCER_ENGINE 0x62656e6370ull
#define CONSUMER_ENGINE 0x62656e6363ull
#define MAX_GROUPS 4
#define UNSET UINT32_MAX

/* A workload: the model, both engines' TP and layout, the cuts. */
struct pair {
	const char *name, *model;
	uint32_t P, D, layout;
	uint32_t layers, state_layers; /* kept of the preset's */
};

static const struct pair pairs[] = {
	{ "llama-3.1-8b-tp1to1-hnd", "llama-3.1-8b", 1, 1, KVP_KV_FLASH_HND,
	  1, 0 },
	{ "llama-3.1-70b-tp8to2-hnd", "llama-3.1-70b", 8, 2, KVP_KV_FLASH_HND,
	  2, 0 },
	{ "llama-3.1-70b-tp4to8-nhd", "llama-3.1-70b", 4, 8, KVP_KV_FLASH_NHD,
	  2, 0 },
	{ "nemotron-h-8b-tp2to1-hnd", "nemotron-h-8b", 2, 1, KVP_KV_FLASH_HND,
	  2, 2 },
};

#define NPAIRS (sizeof(pairs) / sizeof(pairs[0]))

struct opts {
	const char *addr, *src, *ids, *pair_name;
	const struct pair *pair;
	uint32_t page_kib, block, blocks, nreq, inflight, layers, sq, spin;
	uint32_t qps, max_sge, no_coalesce, max_peers;
	uint32_t sleep; /* the consumer sleeps on the agent's fds */
	uint32_t window, window_bytes; /* kvp_agent_attr.read_window... */
	uint32_t nblocks; /* blocks per region, from plan_ids() */
	uint16_t port;
};

/* One request's ids, every group. */
struct req_ids {
	struct kvp_ids ids[MAX_GROUPS];
	uint32_t *lid[MAX_GROUPS], *rid[MAX_GROUPS];
	uint32_t ngroups, max_ids;
};

/* What the rank processes share (copied into each by fork). */
struct bench {
	struct opts *o;
	struct req_ids r;
};

static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* This thread's user and kernel CPU time. rxe (soft-RoCE) runs its
 * requester inside the doorbell system call, so kernel time on the post
 * path is the software NIC's, not kvpull's; a hardware NIC's doorbell is a
 * store to mapped device memory. */
static void thread_cpu(uint64_t *user, uint64_t *sys)
{
	struct rusage ru;

	getrusage(RUSAGE_THREAD, &ru);
	*user = (uint64_t)ru.ru_utime.tv_sec * 1000000000ull +
		(uint64_t)ru.ru_utime.tv_usec * 1000ull;
	*sys = (uint64_t)ru.ru_stime.tv_sec * 1000000000ull +
	       (uint64_t)ru.ru_stime.tv_usec * 1000ull;
}

static void usage(FILE *f)
{
	size_t i;

	fprintf(f,
		"usage: kvpull-rdma-bench [options]\n"
		"  --pair NAME       the engines (producer TP -> consumer TP,\n"
		"                    layout); consumer rank 0 runs:\n");
	for (i = 0; i < NPAIRS; i++)
		fprintf(f, "                      %s%s\n", pairs[i].name,
			i ? "" : " (default)");
	fprintf(f,
		"  --addr IP         producer address [$KVP_ADDR0]\n"
		"  --src IP          consumer source address (another device)\n"
		"                    [the producer's]\n"
		"  --port N          first producer rank's port [18800]\n"
		"  --page-kib K      default pair: bytes per K/V page, KiB, power\n"
		"                    of two >= 4 [64]\n"
		"  --block T         tokens per block [other pairs: 16]\n"
		"  --blocks B        blocks per request and token group [128]\n"
		"  --requests N      requests timed [32]\n"
		"  --inflight F      pulls in flight [8]\n"
		"  --layers L        attention layers kept [default pair: 1, two\n"
		"                    regions each; others: 2]\n"
		"  --sq N            send queue depth [4096]\n"
		"  --max-peers N     the consumer's max_peers, producer ranks\n"
		"                    [0: the library's default, 64]\n"
		"  --qps N           queue pairs per producer rank, 1-8\n"
		"                    [0: the library's default, 2]\n"
		"  --max-sge S       local SGEs per READ [default pair: 1, one\n"
		"                    page per READ as ib_read_bw; others: 0, the\n"
		"                    library's default, 4]\n"
		"  --window N        READs in flight per queue pair\n"
		"                    (kvp_agent_attr.read_window) [0: the\n"
		"                    library's default]\n"
		"  --window-bytes N  bytes of READs in flight per queue pair\n"
		"                    (read_window_bytes) [0: the library's]\n"
		"  --no-coalesce     one READ per piece (KVP_PLAN_NO_COALESCE),\n"
		"                    as connectors that post one descriptor per\n"
		"                    block per region do\n"
		"  --ids MODE        random (one READ per piece) or contiguous\n"
		"                    (coalesced) [random]\n"
		"  --producer-spin 0|1  1: the producers busy-poll; 0: they sleep\n"
		"                    on the agent's fds (kvp_agent_arm) [0]\n"
		"  --consumer-sleep 0|1  1: the consumer sleeps on the agent's\n"
		"                    fds when a poll found nothing and nothing\n"
		"                    more can be pulled; 0: it busy-polls, as\n"
		"                    ib_read_bw without -e [0]\n"
		"  --version         print the version and exit\n"
		"The last line: result: bytes=N secs=S mbps=X reads=R avg_read=B\n"
		"(MB/s = 10^6 bytes/s; avg_read: bytes per READ).\n"
		"Compare with: ib_read_bw -d DEV -x GIDX -s AVG_READ -n N [server]\n"
		"(scripts/rdma-bench.sh runs them side by side).\n");
}

static kvp_layout *build(const struct opts *o, int producer, uint32_t rank)
{
	const struct pair *p = o->pair;
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(p->model, &m))
		return NULL;
	m.layers = o->layers;
	m.state_layers = p->state_layers;
	if (!m.state_layers)
		m.state_kind = KVP_STATE_NONE;
	memset(&e, 0, sizeof(e));
	e.engine_id = producer ? PRODUCER_ENGINE : CONSUMER_ENGINE;
	e.tp_size = producer ? p->P : p->D;
	e.tp_rank = rank;
	e.block_tokens = o->block;
	e.num_blocks = o->nblocks;
	e.kv_layout = p->layout;
	if (!e.block_tokens || kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

/* Ids in [lo, lo + 2n): n random distinct ones, or n consecutive. */
static void draw_ids(const struct opts *o, uint64_t *seed, uint32_t *ids,
		     uint32_t n, uint32_t lo)
{
	uint32_t i;

	if (!strcmp(o->ids, "contiguous")) {
		for (i = 0; i < n; i++)
			ids[i] = lo + i;
		return;
	}
	kvt_random_ids(seed, ids, n, 2 * n);
	for (i = 0; i < n; i++)
		ids[i] += lo;
}

static void free_ids(struct req_ids *r)
{
	uint32_t g;

	for (g = 0; g < MAX_GROUPS; g++) {
		free(r->lid[g]);
		free(r->rid[g]);
		r->lid[g] = r->rid[g] = NULL;
	}
}

/* Sizes o->nblocks so that every group has room for its ids (above state
 * page 0 where states and tokens share regions) and, with r, draws them:
 * token groups --blocks local blocks (and the remote blocks holding the
 * same tokens), state groups state page 0 on both sides. Returns 0, or -1
 * after saying why on stderr. */
static int plan_ids(struct opts *o, struct req_ids *r)
{
	kvp_layout *pl = NULL, *dl = NULL;
	kvp_plan *plan = NULL;
	struct kvp_plan_info pi;
	struct kvp_plan_group pg;
	uint64_t seed = 9;
	uint32_t g, try, plo = 0, dlo = 0, nl, nr, need;
	char why[256] = "the engines do not build";
	int ret = -1, fits = 0;

	o->nblocks = 2 * o->blocks;
	for (try = 0; try < 24; try++) {
		kvp_plan_destroy(plan);
		kvp_layout_destroy(pl);
		kvp_layout_destroy(dl);
		plan = NULL;
		pl = build(o, 1, 0);
		dl = build(o, 0, 0);
		if (!pl || !dl) {
			/* A pooled state page spans more pages than that. */
			o->nblocks *= 2;
			continue;
		}
		if (kvp_plan_compile(dl, pl, NULL, &plan, why, sizeof(why)))
			goto out;
		kvp_plan_get_info(plan, &pi);
		if (pi.ngroups > MAX_GROUPS) {
			snprintf(why, sizeof(why), "%u groups, at most %d",
				 pi.ngroups, MAX_GROUPS);
			goto out;
		}
		plo = tool_token_base(pl, 1);
		dlo = tool_token_base(dl, 1);
		need = o->nblocks;
		for (g = 0, fits = 1; g < pi.ngroups; g++) {
			if (kvp_plan_get_group(plan, g, &pg))
				goto out;
			if (pg.kind == KVP_GROUP_STATE)
				continue;
			nl = o->blocks;
			nr = (uint32_t)(((uint64_t)nl * pg.local_tokens +
					 pg.remote_tokens - 1) / pg.remote_tokens);
			if (dlo + 2ull * nl > pg.local_blocks ||
			    plo + 2ull * nr > pg.remote_blocks) {
				fits = 0;
				nl = (dlo > plo ? dlo : plo) +
				     2 * (nl > nr ? nl : nr);
				need = nl > need ? nl : need;
			}
		}
		if (fits)
			break;
		o->nblocks = need > o->nblocks ? need : 2 * o->nblocks;
	}
	if (!fits)
		goto out;
	r->ngroups = pi.ngroups;
	for (g = 0; g < pi.ngroups; g++) {
		struct kvp_ids *id = &r->ids[g];

		if (kvp_plan_get_group(plan, g, &pg))
			goto out;
		if (pg.kind == KVP_GROUP_STATE) {
			nl = nr = 1;
		} else {
			nl = o->blocks;
			nr = (uint32_t)(((uint64_t)nl * pg.local_tokens +
					 pg.remote_tokens - 1) / pg.remote_tokens);
		}
		r->lid[g] = calloc(nl, sizeof(uint32_t));
		r->rid[g] = calloc(nr, sizeof(uint32_t));
		if (!r->lid[g] || !r->rid[g]) {
			snprintf(why, sizeof(why), "out of memory");
			goto out;
		}
		if (pg.kind != KVP_GROUP_STATE) {
			draw_ids(o, &seed, r->lid[g], nl, dlo);
			draw_ids(o, &seed, r->rid[g], nr, plo);
		}
		id->local = r->lid[g];
		id->remote = r->rid[g];
		id->nlocal = nl;
		id->nremote = nr;
		id->tokens = 0;
	}
	ret = 0;
out:
	if (ret)
		fprintf(stderr, "kvpull-rdma-bench: %s: %s\n", o->pair->name,
			why);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(pl);
	kvp_layout_destroy(dl);
	return ret;
}

/* Bytes of all regions of layout l, and the page of its view 0. */
static uint64_t layout_bytes(const kvp_layout *l, uint64_t *page)
{
	struct kvp_layout_info li;
	struct kvp_view_desc v;
	uint64_t sz, total = 0;
	uint32_t i;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nregions; i++)
		if (!kvp_layout_get_region(l, i, &sz))
			total += sz;
	*page = kvp_layout_get_view(l, 0, &v) ? 0 : v.stride;
	return total;
}

static int producer(const struct opts *o, uint32_t rank, int ready_fd,
		    int stop_fd)
{
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[32];
	kvp_layout *l = build(o, 1, rank);
	kvp_agent *a = NULL;
	uint64_t next = 0, total = (uint64_t)o->nreq + 1;
	int err, n, ret = 1;

	alarm(900);
	if (!l || kvt_mem_alloc(l, &mem))
		goto out;
	kvt_fill_background(&mem, 5);
	err = tool_producer_open(l, o->addr, (uint16_t)(o->port + rank), 256,
				 &mem, &a);
	if (err) {
		fprintf(stderr, "producer %u: %s\n", rank, kvp_strerror(err));
		goto out;
	}
	if (write(ready_fd, "r", 1) != 1)
		goto out;
	for (;;) {
		struct pollfd p = { .fd = stop_fd, .events = POLLIN };

		/* A window of expected requests; notifications that come
		 * early are kept by the agent. */
		while (next < total &&
		       !kvp_agent_expect(a, CONSUMER_ENGINE, next,
					 tool_now_ns() + 600000000000ull))
			next++;
		n = kvp_agent_poll(a, ev, 32);
		if (n < 0)
			goto out;
		if (poll(&p, 1, 0) > 0)
			break;
		if (!n && o->spin) {
			usleep(20);
		} else if (!n) {
			/* Sleep on the agent's fds, as perftest's server
			 * sleeps: no CPU taken from the transfer. */
			if (tool_agent_sleep(a, stop_fd, 100) < 0)
				goto out;
		}
	}
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

/* Why engine `eng` is not up, on stderr (a pull refused or FAILED). */
static void say_why(const kvp_agent *a, uint32_t eng)
{
	struct kvp_engine_info ei;

	if (!kvp_agent_engine_info(a, eng, &ei))
		fprintf(stderr, "  engine state %u, status %s, reason %s%s%s\n",
			ei.state, kvp_strerror(ei.status),
			kvp_reason_str(ei.reason), ei.why[0] ? ": " : "",
			ei.why);
}

static int consumer(const struct opts *o, const struct req_ids *r)
{
	struct kvp_agent_attr at;
	struct kvp_agent_stats s0, s1;
	struct kvp_engine_info ei;
	struct kvp_layout_info li;
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[32];
	kvp_layout *l = build(o, 0, 0);
	kvp_agent *a = NULL;
	const struct kvp_ids *ids = r->ids;
	uint32_t i, maxw, maxs, eng = 0;
	uint64_t next, done = 0, t0, t1, pull_ns = 0, pull_user = 0;
	uint64_t pull_sys = 0, pull_cpu = 0;
	uint64_t emit_ns, emit_wrs = 0, poll_ns = 0, wrs, bytes, page;
	uint64_t polls = 0, empty = 0, sleeps = 0;
	struct kvp_wr *wr = NULL;
	struct kvp_sge *sge = NULL;
	double secs;
	int err, n, ret = 1;

	alarm(900);
	if (!l || kvt_mem_alloc(l, &mem))
		goto out;
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = o->src ? o->src : o->addr;
	at.max_ids = r->max_ids;
	at.max_inflight = o->inflight;
	at.sq_depth = o->sq;
	at.max_sge = o->max_sge;
	at.max_peers = o->max_peers;
	at.qps_per_peer = o->qps;
	at.read_window = o->window;
	at.read_window_bytes = o->window_bytes;
	at.plan_flags = o->no_coalesce ? KVP_PLAN_NO_COALESCE : 0;
	err = tool_agent_open(&at, &mem, &a);
	if (!err)
		err = tool_add_engine(a, o->addr, o->port, o->pair->P, &eng);
	if (err) {
		fprintf(stderr, "consumer: %s\n", kvp_strerror(err));
		goto out;
	}
	/* Warm-up request 0, not timed. */
	if (kvp_agent_pull_from(a, eng, 0, ids))
		goto out;
	while (!done) {
		n = kvp_agent_poll(a, ev, 32);
		if (n < 0)
			goto out;
		for (i = 0; i < (uint32_t)n; i++)
			if (ev[i].type == KVP_EV_FAILED) {
				fprintf(stderr, "warm-up request failed: %s\n",
					kvp_strerror(ev[i].status));
				say_why(a, eng);
				goto out;
			} else if (ev[i].type == KVP_EV_DONE) {
				done = 1;
			}
	}
	kvp_agent_get_stats(a, &s0);
	done = 0;
	next = 1;
	t0 = tool_now_ns();
	while (done < o->nreq) {
		while (next <= o->nreq) {
			uint64_t a0 = tool_now_ns(), u0, s0_, u1, s1_;

			uint64_t c0 = cpu_ns();

			thread_cpu(&u0, &s0_);
			err = kvp_agent_pull_from(a, eng, next, ids);
			thread_cpu(&u1, &s1_);
			c0 = cpu_ns() - c0;
			if (err == -EBUSY)
				break;
			if (err) {
				fprintf(stderr, "pull: %s\n", kvp_strerror(err));
				say_why(a, eng);
				goto out;
			}
			pull_ns += tool_now_ns() - a0;
			pull_cpu += c0;
			pull_user += u1 - u0;
			pull_sys += s1_ - s0_;
			next++;
		}
		{
			uint64_t p0 = tool_now_ns();

			n = kvp_agent_poll(a, ev, 32);
			poll_ns += tool_now_ns() - p0;
		}
		if (n < 0)
			goto out;
		polls++;
		/* Nothing came and nothing more can be pulled (all asked, or
		 * -EBUSY): with --consumer-sleep, sleep until a completion
		 * (kvp_agent_arm: the CQs' channel) instead of spinning. */
		if (!n) {
			empty++;
			if (o->sleep) {
				sleeps++;
				if (tool_agent_sleep(a, -1, 100) < 0)
					goto out;
			}
		}
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_FAILED) {
				fprintf(stderr, "request failed: %s\n",
					kvp_strerror(ev[i].status));
				say_why(a, eng);
				goto out;
			}
			if (ev[i].type == KVP_EV_DONE)
				done++;
		}
	}
	t1 = tool_now_ns();
	kvp_agent_get_stats(a, &s1);
	wrs = s1.reads - s0.reads;
	bytes = s1.read_bytes - s0.read_bytes;
	secs = (t1 - t0) * 1e-9;

	/* Emission alone, same ids, into arrays of the same bound. */
	if (kvp_agent_engine_info(a, eng, &ei))
		goto out;
	kvp_plan_emit_bound(ei.plan, r->max_ids, &maxw, &maxs);
	wr = calloc(maxw, sizeof(*wr));
	sge = calloc(maxs, sizeof(*sge));
	if (!wr || !sge)
		goto out;
	{
		uint64_t e0 = tool_now_ns();

		/* Wall time over many runs: pure CPU work, and the guest's
		 * thread CPU clock can be tick-granular under emulation. */
		for (i = 0; i < 2000; i++) {
			n = kvp_plan_emit(ei.plan, ids, wr, maxw, sge,
					  maxs, NULL);
			if (n < 0)
				goto out;
			emit_wrs += (uint64_t)n;
		}
		emit_ns = tool_now_ns() - e0;
	}

	kvp_layout_get_info(l, &li);
	layout_bytes(l, &page);
	printf("kvpull-rdma-bench: %u requests x %u blocks x %u regions, "
	       "%llu KiB pages, %s ids, %u in flight, sq %u\n",
	       o->nreq, o->blocks, li.nregions,
	       (unsigned long long)(page / 1024), o->ids, o->inflight, o->sq);
	printf("  queue pairs per producer rank %u (%s), coalescing %s, "
	       "max_sge %u\n", ei.qps, o->qps ? "--qps" : "default",
	       o->no_coalesce ? "off (KVP_PLAN_NO_COALESCE: one READ per "
				"piece)" : "on", o->max_sge);
	printf("  READ window per queue pair: %u READs (%s), %u bytes (%s)\n",
	       o->window ? o->window : KVP_READ_WINDOW,
	       o->window ? "--window" : "default", o->window_bytes,
	       o->window_bytes ? "--window-bytes" : "default: 0 means "
	       "KVP_READ_WINDOW_PKTS x the port's MTU");
	printf("  READs %llu (%.1f KiB each), doorbells %llu, notifications "
	       "%llu, WRs that waited for SQ room %llu\n",
	       (unsigned long long)wrs,
	       wrs ? (double)bytes / wrs / 1024 : 0,
	       (unsigned long long)(s1.doorbells - s0.doorbells),
	       (unsigned long long)(s1.notes_sent - s0.notes_sent),
	       (unsigned long long)(s1.queued - s0.queued));
	printf("  warm-up request (not timed): READs %llu, %llu bytes\n",
	       (unsigned long long)s0.reads,
	       (unsigned long long)s0.read_bytes);
	printf("  throughput: %llu bytes in %.3f s = %.2f MB/s (%.3f Gb/s), "
	       "%.0f READs/s\n",
	       (unsigned long long)bytes, secs, bytes / secs / 1e6,
	       bytes * 8 / secs / 1e9, wrs / secs);
	printf("  post path (kvp_agent_pull: emission, ibv_send_wr chains, "
	       "ibv_post_send), per WR:\n");
	printf("    wall %.1f ns, thread CPU %.1f ns (user %.1f, kernel %.1f; "
	       "split sampled at the scheduler tick)\n",
	       wrs ? (double)pull_ns / wrs : 0,
	       wrs ? (double)pull_cpu / wrs : 0,
	       wrs ? (double)pull_user / wrs : 0,
	       wrs ? (double)pull_sys / wrs : 0);
	printf("    emission alone: %.1f ns per WR; poll: %.1f us per request\n",
	       emit_wrs ? (double)emit_ns / emit_wrs : 0,
	       poll_ns / 1e3 / o->nreq);
	printf("  consumer loop (%s): polls %.3f per READ, %.3f found "
	       "nothing, sleeps %.3f; doorbells %.3f per READ\n",
	       o->sleep ? "--consumer-sleep 1: sleeps on the agent's fds when "
			  "a poll found nothing" : "busy polling",
	       wrs ? (double)polls / wrs : 0, wrs ? (double)empty / wrs : 0,
	       wrs ? (double)sleeps / wrs : 0,
	       wrs ? (double)(s1.doorbells - s0.doorbells) / wrs : 0);
	printf("    (rxe runs its transmit path inside ibv_post_send, so on "
	       "soft-RoCE kernel time dominates; a hardware doorbell is a "
	       "store)\n");
	printf("result: bytes=%llu secs=%.6f mbps=%.2f reads=%llu "
	       "avg_read=%.0f\n",
	       (unsigned long long)bytes, secs, bytes / secs / 1e6,
	       (unsigned long long)wrs, wrs ? (double)bytes / wrs : 0);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	free(wr);
	free(sge);
	return ret;
}

static int producer_main(void *arg, uint32_t rank, int ready_fd,
			 int stop_fd)
{
	const struct bench *b = arg;

	return producer(b->o, rank, ready_fd, stop_fd);
}

static int consumer_main(void *arg, uint32_t rank)
{
	const struct bench *b = arg;

	(void)rank;
	return consumer(b->o, &b->r);
}

int main(int argc, char **argv)
{
	static const char P[] = "kvpull-rdma-bench";
	struct opts o = { .ids = "random", .pair_name = pairs[0].name,
			  .page_kib = 64, .block = UNSET, .blocks = 128,
			  .nreq = 32, .inflight = 8, .layers = UNSET,
			  .max_sge = UNSET,
			  .sq = 4096, .port = 18800 };
	const struct tool_opt opts[] = {
		{ "--pair", TOOL_STR, &o.pair_name, 0 },
		{ "--addr", TOOL_STR, &o.addr, 0 },
		{ "--src", TOOL_STR, &o.src, 0 },
		{ "--ids", TOOL_STR, &o.ids, 0 },
		{ "--port", TOOL_PORT, &o.port, 65535 - TOOL_MAX_RANKS },
		{ "--page-kib", TOOL_U32, &o.page_kib, 0 },
		{ "--block", TOOL_COUNT, &o.block, 65535 },
		{ "--blocks", TOOL_COUNT, &o.blocks, 1u << 20 },
		{ "--requests", TOOL_COUNT, &o.nreq, 0 },
		{ "--inflight", TOOL_COUNT, &o.inflight, 0 },
		{ "--layers", TOOL_COUNT, &o.layers, 0 },
		{ "--sq", TOOL_U32, &o.sq, 0 },
		{ "--qps", TOOL_U32, &o.qps, 0 },
		{ "--max-sge", TOOL_U32, &o.max_sge, 0 },
		{ "--max-peers", TOOL_U32, &o.max_peers, 0 },
		{ "--window", TOOL_U32, &o.window, 0 },
		{ "--window-bytes", TOOL_U32, &o.window_bytes, 0 },
		{ "--no-coalesce", TOOL_FLAG, &o.no_coalesce, 0 },
		{ "--producer-spin", TOOL_U32, &o.spin, 0 },
		{ "--consumer-sleep", TOOL_U32, &o.sleep, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	struct bench b = { .o = &o };
	struct tool_ranks prod;
	struct kvp_model m;
	kvp_layout *pl, *dl;
	uint64_t psz, dsz, ppage, dpage;
	uint32_t g;
	size_t i;
	int bad;

	bad = tool_parse_args(argc, argv, P, opts);
	if (bad == TOOL_ARGS_HELP)
		usage(stdout);
	if (bad)
		return bad == TOOL_ARGS_BAD ? 2 : 0;
	for (i = 0; i < NPAIRS; i++)
		if (!strcmp(o.pair_name, pairs[i].name))
			o.pair = &pairs[i];
	if (!o.pair)
		return tool_bad_arg(P, "--pair: unknown pair '%s'",
				    o.pair_name);
	if (tool_default_addr(P, &o.addr))
		return 2;
	if (o.page_kib < 4 || (o.page_kib & (o.page_kib - 1)))
		return tool_bad_arg(P, "--page-kib: %u is not a power of two "
				    ">= 4", o.page_kib);
	if (strcmp(o.ids, "random") && strcmp(o.ids, "contiguous"))
		return tool_bad_arg(P, "--ids: '%s' is not random or "
				    "contiguous", o.ids);
	if (o.qps > 8)
		return tool_bad_arg(P, "--qps: %u is out of range (0-8)",
				    o.qps);
	if (kvp_model_preset(o.pair->model, &m))
		return 1;
	if (o.layers == UNSET)
		o.layers = o.pair->layers;
	if (o.max_sge == UNSET)
		o.max_sge = o.pair == pairs ? 1 : 0;
	if (o.block == UNSET)
		/* The default pair: one K or V page of --page-kib KiB. */
		o.block = o.pair == pairs ? o.page_kib * 1024 /
			  (m.kv_heads * m.head_dim * m.dtype_bytes) : 16;
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (plan_ids(&o, &b.r))
		goto err_ids;
	for (g = 0; g < b.r.ngroups; g++) {
		if (b.r.ids[g].nlocal > b.r.max_ids)
			b.r.max_ids = b.r.ids[g].nlocal;
		if (b.r.ids[g].nremote > b.r.max_ids)
			b.r.max_ids = b.r.ids[g].nremote;
	}
	pl = build(&o, 1, 0);
	dl = build(&o, 0, 0);
	if (!pl || !dl) {
		kvp_layout_destroy(pl);
		goto err_ids;
	}
	psz = layout_bytes(pl, &ppage);
	dsz = layout_bytes(dl, &dpage);
	kvp_layout_destroy(pl);
	kvp_layout_destroy(dl);
	printf("pair %s: %s, producer TP %u -> consumer rank 0 of TP %u, "
	       "%s, %u-token blocks\n",
	       o.pair->name, o.pair->model, o.pair->P, o.pair->D,
	       o.pair->layout == KVP_KV_FLASH_NHD ? "flash_nhd" : "flash_hnd",
	       o.block);
	printf("  cut to fit VM memory: %u of %u %slayers", o.layers,
	       m.layers, m.state_layers ? "attention " : "");
	if (m.state_layers)
		printf(", %u of %u state layers (one whole state per "
		       "request)", o.pair->state_layers, m.state_layers);
	printf(", %u blocks per region; pages %llu B (producer), %llu B "
	       "(consumer); %.1f MiB per producer rank, %.1f MiB consumer\n",
	       o.nblocks, (unsigned long long)ppage,
	       (unsigned long long)dpage, psz / 1048576.0, dsz / 1048576.0);
	if (tool_start_producers(&prod, o.pair->P, producer_main, &b)) {
		fprintf(stderr, "kvpull-rdma-bench: a producer rank failed\n");
		tool_stop_producers(&prod, 0);
		free_ids(&b.r);
		return 1;
	}
	bad = tool_run_consumers(&prod, 1, consumer_main, &b) != 0;
	if (tool_stop_producers(&prod, 0))
		bad = 1;
	free_ids(&b.r);
	return bad;
err_ids:
	free_ids(&b.r);
	fprintf(stderr, "kvpull-rdma-bench: the engines do not build\n");
	return 2;
}
