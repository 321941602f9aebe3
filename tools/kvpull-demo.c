// SPDX-License-Identifier: MIT
/*
 * kvpull-demo: a prefill engine and a decode engine, one process per rank,
 * moving a synthetic KV cache with RDMA READs. Public API only (plus the
 * identity patterns of tests/lib/kvtest.h to verify every byte).
 *
 *   kvpull-demo [--model NAME] [--layers N] [--prefill-tp P] [--decode-tp D]
 *               [--requests N] [--tokens T] [--block B] [--num-blocks N]
 *               [--prefill-layout L] [--decode-layout L] [--ids runs|random|
 *               contiguous] [--max-sge S] [--addr IP] [--port N] [--seed N]
 *
 * Defaults: llama-3.1-8b scaled to 4 layers and 192 blocks per region (so
 * that three engines' ranks fit a 512 MiB VM), prefill TP 2 -> decode TP 1,
 * 8 requests of 256 tokens, 16-token blocks, FLASH_HND on both sides,
 * decode block ids allocated in short runs. The address defaults to
 * $KVP_ADDR0 (set by scripts/rxe-vm.sh).
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kvpull.h"
#include "kvtest.h"
#include "names.h"
#include "rdma_tool.h"

#define MAX_TP TOOL_MAX_RANKS
#define MAX_REQ 64
#define PREFILL_ENGINE 0x7072656669ull /* "prefi" */
#define DECODE_ENGINE 0x6465636f64ull  /* "decod" */

struct opts {
	const char *model, *addr, *ids;
	uint32_t layers, P, D, nreq, tokens, block, nblocks, max_sge;
	uint32_t playout, dlayout;
	uint16_t port;
	uint32_t seed;
};

struct req {
	uint64_t id;
	struct kvp_ids ids; /* one group: the models here have one */
	uint32_t *lid, *rid;
};

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvpull-demo [options]\n"
		"A prefill engine (TP P) and a decode engine (TP D), one process per\n"
		"rank, on one RDMA device: every decode rank connects to the prefill\n"
		"engine, pulls a batch of requests with RDMA READs and checks every\n"
		"byte against the identity patterns the prefill ranks wrote.\n"
		"  --model NAME           model preset [llama-3.1-8b]\n"
		"  --layers N             layers kept (scaled down) [4]\n"
		"  --prefill-tp P         [2]\n"
		"  --decode-tp D          [1]\n"
		"  --requests N           requests in the batch (<= %d) [8]\n"
		"  --tokens T             tokens per request [256]\n"
		"  --block B              block size in tokens, both engines [16]\n"
		"  --num-blocks N         blocks per region [192]\n"
		"  --prefill-layout L     flash_nhd|flash_hnd|flashinfer|packed [flash_hnd]\n"
		"  --decode-layout L      same [flash_hnd]\n"
		"  --ids MODE             decode block ids: runs (a fragmented\n"
		"                         allocator), random or contiguous [runs]\n"
		"  --max-sge S            local SGEs per READ [4]\n"
		"  --addr IP              RDMA-capable address [$KVP_ADDR0]\n"
		"  --port N               first prefill rank's port [18700]\n"
		"  --seed N               [1]\n",
		MAX_REQ);
}

static kvp_layout *build(const struct opts *o, int prefill, uint32_t rank)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(o->model, &m))
		return NULL;
	m.layers = o->layers;
	memset(&e, 0, sizeof(e));
	e.engine_id = prefill ? PREFILL_ENGINE : DECODE_ENGINE;
	e.tp_size = prefill ? o->P : o->D;
	e.tp_rank = rank;
	e.block_tokens = o->block;
	e.num_blocks = o->nblocks;
	e.kv_layout = prefill ? o->playout : o->dlayout;
	if (kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

/* Prefill: each request's blocks are consecutive (a fresh prefill).
 * Decode: from a shuffled free list, or in runs of 1-8 consecutive ids (a
 * fragmented allocator), or consecutive. */
static int make_requests(const struct opts *o, struct req *rq)
{
	uint32_t nb = (o->tokens + o->block - 1) / o->block, i, k, j;
	uint32_t *perm, pos = 0, dnext = 0;
	uint64_t s = o->seed;

	if ((uint64_t)nb * o->nreq > o->nblocks)
		return -1;
	perm = malloc(o->nblocks * sizeof(*perm));
	if (!perm)
		return -1;
	kvt_random_ids(&s, perm, o->nblocks, o->nblocks);
	for (i = 0; i < o->nreq; i++) {
		rq[i].id = 100 + i;
		rq[i].rid = calloc(nb, sizeof(uint32_t));
		rq[i].lid = calloc(nb, sizeof(uint32_t));
		if (!rq[i].rid || !rq[i].lid) {
			free(perm);
			return -1;
		}
		for (k = 0; k < nb; k++)
			rq[i].rid[k] = i * nb + k;
		if (!strcmp(o->ids, "random")) {
			for (k = 0; k < nb; k++)
				rq[i].lid[k] = perm[pos++];
		} else if (!strcmp(o->ids, "contiguous")) {
			for (k = 0; k < nb; k++)
				rq[i].lid[k] = dnext++;
		} else {
			/* Runs of 1-8 consecutive ids with small gaps, as a
			 * fragmented allocator hands them out. */
			k = 0;
			while (k < nb) {
				uint32_t run = 1 + (uint32_t)(kvt_rand(&s) % 8);

				if (run > nb - k)
					run = nb - k;
				for (j = 0; j < run; j++)
					rq[i].lid[k + j] = dnext + j;
				dnext += run + (uint32_t)(kvt_rand(&s) % 2);
				k += run;
			}
		}
		rq[i].ids.remote = rq[i].rid;
		rq[i].ids.local = rq[i].lid;
		rq[i].ids.nremote = nb;
		rq[i].ids.nlocal = nb;
		rq[i].ids.tokens = o->tokens;
		for (k = 0; k < nb; k++)
			if (rq[i].lid[k] >= o->nblocks) {
				free(perm);
				return -1;
			}
	}
	free(perm);
	return 0;
}

/* ---- prefill rank ------------------------------------------------------- */

static int prefill_rank(const struct opts *o, struct req *rq, uint32_t rank,
			int ready_fd, int stop_fd)
{
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[16];
	kvp_layout *l = build(o, 1, rank);
	kvp_agent *a = NULL;
	uint32_t i, released = 0;
	double end = tool_now_s() + 300;
	int err, n, ret = 1;

	alarm(400);
	if (!l || kvt_mem_alloc(l, &mem)) {
		fprintf(stderr, "prefill %u: out of memory\n", rank);
		goto out;
	}
	for (i = 0; i < o->nreq; i++)
		kvt_fill_producer(l, &mem, &rq[i].ids);
	err = tool_producer_open(l, o->addr, (uint16_t)(o->port + rank),
				 MAX_REQ, &mem, &a);
	if (err) {
		fprintf(stderr, "prefill %u: %s\n", rank, kvp_strerror(err));
		goto out;
	}
	/* The scheduler hands these requests to the decode engine. */
	for (i = 0; i < o->nreq; i++) {
		err = kvp_agent_expect(a, rq[i].id,
				       tool_now_ns() + 200000000000ull);
		if (err) {
			fprintf(stderr, "prefill %u: expect: %s\n", rank,
				kvp_strerror(err));
			goto out;
		}
	}
	if (write(ready_fd, "r", 1) != 1)
		goto out;
	for (;;) {
		struct pollfd p = { .fd = stop_fd, .events = POLLIN };

		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			goto out;
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_RELEASED)
				released++;
			else if (ev[i].type == KVP_EV_EXPIRED)
				fprintf(stderr, "prefill %u: request %llu expired\n",
					rank, (unsigned long long)ev[i].req_id);
		}
		if (released == o->nreq && poll(&p, 1, 0) > 0)
			break;
		if (tool_now_s() > end) {
			fprintf(stderr, "prefill %u: timeout\n", rank);
			goto out;
		}
		/* Nothing to do: sleep on the agent's fds (and the parent's
		 * stop pipe) instead of spinning. */
		if (!n && tool_agent_sleep(a, stop_fd, 100) < 0)
			goto out;
	}
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

/* ---- decode rank -------------------------------------------------------- */

static void print_plan(const kvp_plan *plan, uint32_t rank)
{
	struct kvp_plan_info pi;
	struct kvp_plan_group pg;
	uint32_t i;
	int r;

	kvp_plan_get_info(plan, &pi);
	printf("decode rank %u plan: reads from %u prefill rank(s) [", rank,
	       pi.nsrc);
	for (i = 0; i < pi.nsrc; i++) {
		r = kvp_plan_source(plan, i);
		printf("%s%d", i ? " " : "", r);
	}
	printf("], notifies [");
	for (i = 0; i < pi.nnotify; i++) {
		r = kvp_plan_notify(plan, i);
		printf("%s%d", i ? " " : "", r);
	}
	printf("]\n  %u group(s), %u streams (source x region pairs), %u piece "
	       "templates, max_sge %u, plan %llu bytes\n",
	       pi.ngroups, pi.nstreams, pi.npieces, pi.max_sge,
	       (unsigned long long)pi.bytes);
	for (i = 0; i < pi.ngroups; i++)
		if (!kvp_plan_get_group(plan, i, &pg))
			printf("  group %u: block %u -> %u tokens, period %u\n",
			       i, pg.remote_tokens, pg.local_tokens,
			       pg.period_tokens);
}

/* A copy of `src`, the memory of layout `l`. */
static int copy_mem(const kvp_layout *l, struct kvt_mem *dst,
		    const struct kvt_mem *src)
{
	uint32_t i;

	if (kvt_mem_alloc(l, dst))
		return -1;
	for (i = 0; i < src->nregions; i++)
		memcpy(dst->buf[i], src->buf[i], src->size[i]);
	return 0;
}

static int decode_rank(const struct opts *o, struct req *rq, uint32_t rank)
{
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	struct kvp_plan_info pi;
	struct kvt_mem mem = { 0 }, exp = { 0 };
	struct kvp_event ev[16];
	kvp_layout *l = build(o, 0, rank), *r0 = build(o, 1, 0);
	kvp_agent *a = NULL;
	const kvp_plan *plan;
	uint32_t i, s, next = 0, done = 0;
	uint64_t naive = 0;
	double t0, t1, t2, t3;
	int err, n, ret = 1;

	alarm(400);
	if (!l || !r0 || kvt_mem_alloc(l, &mem)) {
		fprintf(stderr, "decode %u: out of memory\n", rank);
		goto out;
	}
	kvt_fill_background(&mem, 11 + rank);
	if (copy_mem(l, &exp, &mem)) {
		fprintf(stderr, "decode %u: out of memory\n", rank);
		goto out;
	}
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = o->addr;
	at.max_ids = (o->tokens + o->block - 1) / o->block;
	at.max_inflight = o->nreq;
	at.max_sge = o->max_sge;
	err = tool_agent_open(&at, &mem, &a);
	t0 = tool_now_s();
	if (!err)
		err = tool_connect(a, o->addr, o->port, o->P);
	if (err) {
		fprintf(stderr, "decode %u: %s\n", rank, kvp_strerror(err));
		goto out;
	}
	t1 = tool_now_s();
	plan = kvp_agent_plan(a);
	kvp_plan_get_info(plan, &pi);
	print_plan(plan, rank);
	/* One READ per local block per (source, region pair): what a
	 * per-block transfer list would post. */
	for (s = 0; s < pi.nstreams; s++) {
		struct kvp_plan_stream ps;

		if (!kvp_plan_get_stream(plan, s, &ps))
			for (i = 0; i < o->nreq; i++)
				naive += rq[i].ids.nlocal;
	}
	t2 = tool_now_s();
	while (done < o->nreq) {
		while (next < o->nreq) {
			err = kvp_agent_pull(a, rq[next].id, &rq[next].ids);
			if (err == -EBUSY)
				break;
			if (err) {
				fprintf(stderr, "decode %u: pull: %s\n", rank,
					kvp_strerror(err));
				goto out;
			}
			next++;
		}
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			goto out;
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_DONE) {
				done++;
			} else if (ev[i].type == KVP_EV_FAILED) {
				fprintf(stderr, "decode %u: request %llu failed: %s\n",
					rank, (unsigned long long)ev[i].req_id,
					kvp_strerror(ev[i].status));
				goto out;
			}
		}
		if (tool_now_s() - t2 > 300) {
			fprintf(stderr, "decode %u: timeout\n", rank);
			goto out;
		}
	}
	t3 = tool_now_s();
	kvp_agent_get_stats(a, &st);
	for (i = 0; i < o->nreq; i++)
		kvt_expect_consumer(l, r0, &exp, NULL, &rq[i].ids);
	if (kvt_mem_compare(&mem, &exp, "decode memory")) {
		printf("decode rank %u: VERIFY FAILED\n", rank);
		goto out;
	}
	printf("decode rank %u: connect + handshake %.1f ms\n", rank,
	       (t1 - t0) * 1e3);
	printf("decode rank %u: %u requests pulled, every byte verified "
	       "(%u local regions compared whole)\n",
	       rank, done, mem.nregions);
	printf("decode rank %u: WRs posted %llu, one per block per region "
	       "would be %llu (%.1fx fewer), doorbells %llu, notifications %llu\n",
	       rank, (unsigned long long)st.reads, (unsigned long long)naive,
	       st.reads ? (double)naive / (double)st.reads : 0.0,
	       (unsigned long long)st.doorbells,
	       (unsigned long long)st.notes_sent);
	printf("decode rank %u: %llu bytes in %.1f ms: %.1f MB/s (%.3f GB/s)\n",
	       rank, (unsigned long long)st.read_bytes, (t3 - t2) * 1e3,
	       st.read_bytes / (t3 - t2) / 1e6,
	       st.read_bytes / (t3 - t2) / 1e9);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r0);
	return ret;
}

/* ---- orchestration ------------------------------------------------------ */

/* What the rank processes share. */
struct demo {
	const struct opts *o;
	struct req *rq;
};

static int prefill_main(void *arg, uint32_t rank, int ready_fd, int stop_fd)
{
	const struct demo *d = arg;

	return prefill_rank(d->o, d->rq, rank, ready_fd, stop_fd);
}

static int decode_main(void *arg, uint32_t rank)
{
	const struct demo *d = arg;

	return decode_rank(d->o, d->rq, rank);
}

int main(int argc, char **argv)
{
	static struct req rq[MAX_REQ];
	struct opts o = { .model = "llama-3.1-8b", .ids = "runs", .layers = 4,
			  .P = 2, .D = 1, .nreq = 8, .tokens = 256,
			  .block = 16, .nblocks = 192, .max_sge = 4,
			  .playout = KVP_KV_FLASH_HND,
			  .dlayout = KVP_KV_FLASH_HND, .port = 18700,
			  .seed = 1 };
	const struct tool_opt opts[] = {
		{ "--model", TOOL_STR, &o.model, 0 },
		{ "--addr", TOOL_STR, &o.addr, 0 },
		{ "--ids", TOOL_STR, &o.ids, 0 },
		{ "--prefill-layout", TOOL_LAYOUT, &o.playout, 0 },
		{ "--decode-layout", TOOL_LAYOUT, &o.dlayout, 0 },
		{ "--layers", TOOL_U32, &o.layers, 0 },
		{ "--prefill-tp", TOOL_U32, &o.P, 0 },
		{ "--decode-tp", TOOL_U32, &o.D, 0 },
		{ "--requests", TOOL_U32, &o.nreq, 0 },
		{ "--tokens", TOOL_U32, &o.tokens, 0 },
		{ "--block", TOOL_U32, &o.block, 0 },
		{ "--num-blocks", TOOL_U32, &o.nblocks, 0 },
		{ "--max-sge", TOOL_U32, &o.max_sge, 0 },
		{ "--port", TOOL_PORT, &o.port, 65535 - MAX_TP },
		{ "--seed", TOOL_U32, &o.seed, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	struct demo d = { &o, rq };
	struct tool_ranks prod;
	struct kvp_model m;
	kvp_layout *pl, *dl;
	struct kvp_layout_info pli, dli;
	uint32_t v;
	uint64_t psz = 0, dsz = 0, sz;
	double t0;
	int bad;

	bad = tool_parse_args(argc, argv, "kvpull-demo", opts);
	if (bad) {
		usage(bad == TOOL_ARGS_HELP ? stdout : stderr);
		return bad == TOOL_ARGS_HELP ? 0 : 2;
	}
	if (!o.addr)
		o.addr = getenv("KVP_ADDR0");
	if (!o.addr) {
		fprintf(stderr, "kvpull-demo: no --addr and no $KVP_ADDR0; run it "
				"under scripts/rxe-vm.sh or give an RDMA-capable "
				"address\n");
		return 2;
	}
	if (!o.P || o.P > MAX_TP || !o.D || o.D > MAX_TP || !o.nreq ||
	    o.nreq > MAX_REQ || !o.tokens || !o.block || !o.layers ||
	    (strcmp(o.ids, "runs") && strcmp(o.ids, "random") &&
	     strcmp(o.ids, "contiguous"))) {
		usage(stderr);
		return 2;
	}
	if (kvp_model_preset(o.model, &m)) {
		fprintf(stderr, "kvpull-demo: unknown model %s\n", o.model);
		return 2;
	}
	if (m.state_layers || m.sliding_layers) {
		fprintf(stderr, "kvpull-demo: %s has more than one KV-cache "
				"group; the demo drives single-group models\n",
			o.model);
		return 2;
	}
	pl = build(&o, 1, 0);
	dl = build(&o, 0, 0);
	if (!pl || !dl || make_requests(&o, rq)) {
		fprintf(stderr, "kvpull-demo: the engines or the requests do not "
				"fit (more --num-blocks?)\n");
		return 2;
	}
	kvp_layout_get_info(pl, &pli);
	kvp_layout_get_info(dl, &dli);
	for (v = 0; v < pli.nregions; v++)
		if (!kvp_layout_get_region(pl, v, &sz))
			psz += sz;
	for (v = 0; v < dli.nregions; v++)
		if (!kvp_layout_get_region(dl, v, &sz))
			dsz += sz;
	setvbuf(stdout, NULL, _IOLBF, 0);
	printf("model %s, scaled to fit VM memory: %u of %u layers, %u blocks "
	       "of %u tokens per region\n",
	       o.model, o.layers, m.layers, o.nblocks, o.block);
	printf("prefill engine: TP %u, %s, %u regions, %.1f MiB per rank\n", o.P,
	       tool_layout_names[o.playout], pli.nregions, psz / 1048576.0);
	printf("decode engine:  TP %u, %s, %u regions, %.1f MiB per rank\n", o.D,
	       tool_layout_names[o.dlayout], dli.nregions, dsz / 1048576.0);
	printf("batch: %u requests of %u tokens (%u blocks each), decode ids "
	       "%s, address %s\n",
	       o.nreq, o.tokens, rq[0].ids.nlocal, o.ids, o.addr);
	kvp_layout_destroy(pl);
	kvp_layout_destroy(dl);

	t0 = tool_now_s();
	bad = tool_start_producers(&prod, o.P, prefill_main, &d) != 0;
	if (bad) {
		fprintf(stderr, "kvpull-demo: a prefill rank failed\n");
	} else {
		printf("prefill ranks ready (memory filled) after %.2f s\n",
		       tool_now_s() - t0);
		bad = tool_run_consumers(&prod, o.D, decode_main, &d) != 0;
	}
	if (tool_stop_producers(&prod, bad))
		bad = 1;
	printf("%s\n", bad ? "demo: FAILED" : "demo: OK");
	return bad;
}
