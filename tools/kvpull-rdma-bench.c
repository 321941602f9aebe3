// SPDX-License-Identifier: MIT
/*
 * kvpull-rdma-bench: RDMA READ throughput of kvp_agent_pull() and the CPU
 * cost of its post path, in a form comparable with perftest's ib_read_bw
 * (same message size, same device). Public API only.
 *
 *   kvpull-rdma-bench [--addr IP] [--src IP] [--port N] [--page-kib K]
 *                     [--blocks B] [--requests N] [--inflight F]
 *                     [--layers L] [--sq N] [--ids random|contiguous]
 *
 * One producer process and one consumer process (TP 1 -> 1). The layout
 * is llama-3.1-8b's FLASH_HND with the block size chosen so that one K or
 * V page is --page-kib KiB (default 64: 32 tokens), --layers layers (two
 * regions each). A request pulls --blocks blocks (default 128) with random
 * ids, so every READ moves exactly one page, as ib_read_bw -s 65536 does.
 * Prints throughput and, for the post path (kvp_agent_pull(): emission,
 * conversion to ibv_send_wr, ibv_post_send), wall and CPU ns per WR, next
 * to the cost of emission alone. The producer sleeps on the agent's fds by
 * default (--producer-spin 1 busy-polls), like perftest's server: on a
 * two-vCPU soft-RoCE VM a spinning peer takes CPU from the transfer.
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

struct opts {
	const char *addr, *src, *ids;
	uint32_t page_kib, blocks, nreq, inflight, layers, sq, spin;
	uint16_t port;
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
	fprintf(f,
		"usage: kvpull-rdma-bench [options]\n"
		"  --addr IP         producer address [$KVP_ADDR0]\n"
		"  --src IP          consumer source address (another device)\n"
		"                    [the producer's]\n"
		"  --port N          [18800]\n"
		"  --page-kib K      bytes per K/V page, KiB, power of two >= 4 [64]\n"
		"  --blocks B        blocks per request [128]\n"
		"  --requests N      requests timed [32]\n"
		"  --inflight F      pulls in flight [8]\n"
		"  --layers L        layers, two regions each [1]\n"
		"  --sq N            send queue depth [4096]\n"
		"  --ids MODE        random (one READ per page) or contiguous\n"
		"                    (coalesced) [random]\n"
		"  --producer-spin 0|1  1: the producer busy-polls; 0: it sleeps\n"
		"                    on the agent's fds (kvp_agent_arm) [0]\n"
		"  --version         print the version and exit\n"
		"Compare with: ib_read_bw -d DEV -x GIDX -s 65536 -n N [server]\n");
}

static kvp_layout *build(const struct opts *o, int producer)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;
	uint32_t per_token;

	if (kvp_model_preset("llama-3.1-8b", &m))
		return NULL;
	m.layers = o->layers;
	per_token = m.kv_heads * m.head_dim * m.dtype_bytes; /* 2 KiB */
	memset(&e, 0, sizeof(e));
	e.engine_id = producer ? PRODUCER_ENGINE : CONSUMER_ENGINE;
	e.tp_size = 1;
	e.block_tokens = o->page_kib * 1024 / per_token;
	e.num_blocks = 2 * o->blocks;
	e.kv_layout = KVP_KV_FLASH_HND;
	if (!e.block_tokens || kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

static int producer(const struct opts *o, int ready_fd, int stop_fd)
{
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[32];
	kvp_layout *l = build(o, 1);
	kvp_agent *a = NULL;
	uint64_t next = 0, total = (uint64_t)o->nreq + 1;
	int err, n, ret = 1;

	alarm(900);
	if (!l || kvt_mem_alloc(l, &mem))
		goto out;
	kvt_fill_background(&mem, 5);
	err = tool_producer_open(l, o->addr, o->port, 256, &mem, &a);
	if (err) {
		fprintf(stderr, "producer: %s\n", kvp_strerror(err));
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

static int consumer(const struct opts *o)
{
	struct kvp_agent_attr at;
	struct kvp_agent_stats s0, s1;
	struct kvp_engine_info ei;
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[32];
	kvp_layout *l = build(o, 0);
	kvp_agent *a = NULL;
	struct kvp_ids ids;
	uint32_t *lid, *rid, i, maxw, maxs, eng = 0;
	uint64_t seed = 9, next, done = 0, t0, t1, pull_ns = 0, pull_user = 0;
	uint64_t pull_sys = 0, pull_cpu = 0;
	uint64_t emit_ns, emit_wrs = 0, poll_ns = 0, wrs;
	struct kvp_wr *wr = NULL;
	struct kvp_sge *sge = NULL;
	double secs;
	int err, n, ret = 1;

	alarm(900);
	lid = calloc(o->blocks, sizeof(*lid));
	rid = calloc(o->blocks, sizeof(*rid));
	if (!l || !lid || !rid || kvt_mem_alloc(l, &mem))
		goto out;
	if (!strcmp(o->ids, "contiguous")) {
		for (i = 0; i < o->blocks; i++)
			lid[i] = rid[i] = i;
	} else {
		kvt_random_ids(&seed, lid, o->blocks, 2 * o->blocks);
		kvt_random_ids(&seed, rid, o->blocks, 2 * o->blocks);
	}
	ids.local = lid;
	ids.remote = rid;
	ids.nlocal = ids.nremote = o->blocks;
	ids.tokens = 0;
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = o->src ? o->src : o->addr;
	at.max_ids = o->blocks;
	at.max_inflight = o->inflight;
	at.sq_depth = o->sq;
	at.max_sge = 1;
	err = tool_agent_open(&at, &mem, &a);
	if (!err)
		err = tool_add_engine(a, o->addr, o->port, 1, &eng);
	if (err) {
		fprintf(stderr, "consumer: %s\n", kvp_strerror(err));
		goto out;
	}
	/* Warm-up request 0, not timed. */
	if (kvp_agent_pull_from(a, eng, 0, &ids))
		goto out;
	while (!done) {
		n = kvp_agent_poll(a, ev, 32);
		if (n < 0)
			goto out;
		for (i = 0; i < (uint32_t)n; i++)
			if (ev[i].type == KVP_EV_FAILED)
				goto out;
			else if (ev[i].type == KVP_EV_DONE)
				done = 1;
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
			err = kvp_agent_pull_from(a, eng, next, &ids);
			thread_cpu(&u1, &s1_);
			c0 = cpu_ns() - c0;
			if (err == -EBUSY)
				break;
			if (err) {
				fprintf(stderr, "pull: %s\n", kvp_strerror(err));
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
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_FAILED) {
				fprintf(stderr, "request failed: %s\n",
					kvp_strerror(ev[i].status));
				goto out;
			}
			if (ev[i].type == KVP_EV_DONE)
				done++;
		}
	}
	t1 = tool_now_ns();
	kvp_agent_get_stats(a, &s1);
	wrs = s1.reads - s0.reads;
	secs = (t1 - t0) * 1e-9;

	/* Emission alone, same ids, into arrays of the same bound. */
	if (kvp_agent_engine_info(a, eng, &ei))
		goto out;
	kvp_plan_emit_bound(ei.plan, o->blocks, &maxw, &maxs);
	wr = calloc(maxw, sizeof(*wr));
	sge = calloc(maxs, sizeof(*sge));
	if (!wr || !sge)
		goto out;
	{
		uint64_t e0 = tool_now_ns();

		/* Wall time over many runs: pure CPU work, and the guest's
		 * thread CPU clock can be tick-granular under emulation. */
		for (i = 0; i < 2000; i++) {
			n = kvp_plan_emit(ei.plan, &ids, wr, maxw, sge,
					  maxs, NULL);
			if (n < 0)
				goto out;
			emit_wrs += (uint64_t)n;
		}
		emit_ns = tool_now_ns() - e0;
	}

	printf("kvpull-rdma-bench: %u requests x %u blocks x %u regions, "
	       "%u KiB pages, %s ids, %u in flight, sq %u\n",
	       o->nreq, o->blocks, 2 * o->layers, o->page_kib, o->ids,
	       o->inflight, o->sq);
	printf("  READs %llu (%.1f KiB each), doorbells %llu, notifications "
	       "%llu, WRs that waited for SQ room %llu\n",
	       (unsigned long long)wrs,
	       wrs ? (double)(s1.read_bytes - s0.read_bytes) / wrs / 1024 : 0,
	       (unsigned long long)(s1.doorbells - s0.doorbells),
	       (unsigned long long)(s1.notes_sent - s0.notes_sent),
	       (unsigned long long)(s1.queued - s0.queued));
	printf("  throughput: %llu bytes in %.3f s = %.2f MB/s (%.3f Gb/s), "
	       "%.0f READs/s\n",
	       (unsigned long long)(s1.read_bytes - s0.read_bytes), secs,
	       (s1.read_bytes - s0.read_bytes) / secs / 1e6,
	       (s1.read_bytes - s0.read_bytes) * 8 / secs / 1e9, wrs / secs);
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
	printf("    (rxe runs its transmit path inside ibv_post_send, so on "
	       "soft-RoCE kernel time dominates; a hardware doorbell is a "
	       "store)\n");
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	free(lid);
	free(rid);
	free(wr);
	free(sge);
	return ret;
}

static int producer_main(void *o, uint32_t rank, int ready_fd, int stop_fd)
{
	return producer(o, ready_fd, stop_fd);
}

static int consumer_main(void *o, uint32_t rank)
{
	return consumer(o);
}

int main(int argc, char **argv)
{
	static const char P[] = "kvpull-rdma-bench";
	struct opts o = { .ids = "random", .page_kib = 64, .blocks = 128,
			  .nreq = 32, .inflight = 8, .layers = 1, .sq = 4096,
			  .port = 18800 };
	const struct tool_opt opts[] = {
		{ "--addr", TOOL_STR, &o.addr, 0 },
		{ "--src", TOOL_STR, &o.src, 0 },
		{ "--ids", TOOL_STR, &o.ids, 0 },
		{ "--port", TOOL_PORT, &o.port, 0 },
		{ "--page-kib", TOOL_U32, &o.page_kib, 0 },
		{ "--blocks", TOOL_COUNT, &o.blocks, 0 },
		{ "--requests", TOOL_COUNT, &o.nreq, 0 },
		{ "--inflight", TOOL_COUNT, &o.inflight, 0 },
		{ "--layers", TOOL_COUNT, &o.layers, 0 },
		{ "--sq", TOOL_U32, &o.sq, 0 },
		{ "--producer-spin", TOOL_U32, &o.spin, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	struct tool_ranks prod;
	int bad;

	bad = tool_parse_args(argc, argv, P, opts);
	if (bad == TOOL_ARGS_HELP)
		usage(stdout);
	if (bad)
		return bad == TOOL_ARGS_BAD ? 2 : 0;
	if (tool_default_addr(P, &o.addr))
		return 2;
	if (o.page_kib < 4 || (o.page_kib & (o.page_kib - 1)))
		return tool_bad_arg(P, "--page-kib: %u is not a power of two "
				    ">= 4", o.page_kib);
	if (strcmp(o.ids, "random") && strcmp(o.ids, "contiguous"))
		return tool_bad_arg(P, "--ids: '%s' is not random or "
				    "contiguous", o.ids);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (tool_start_producers(&prod, 1, producer_main, &o)) {
		fprintf(stderr, "kvpull-rdma-bench: the producer failed\n");
		tool_stop_producers(&prod, 0);
		return 1;
	}
	bad = tool_run_consumers(&prod, 1, consumer_main, &o) != 0;
	if (tool_stop_producers(&prod, 0))
		bad = 1;
	return bad;
}
