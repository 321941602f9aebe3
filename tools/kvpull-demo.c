// SPDX-License-Identifier: MIT
/*
 * kvpull-demo: a prefill engine and a decode engine, one process per rank,
 * moving a synthetic KV cache with RDMA READs. Public API only (plus the
 * identity patterns of tests/lib/kvtest.h to verify every byte).
 *
 *   kvpull-demo [--model NAME] [--layers N] [--state-layers N]
 *               [--sliding-layers N] [--prefill-tp P] [--decode-tp D]
 *               [--requests N] [--tokens T] [--block B] [--num-blocks N]
 *               [--prefill-layout L] [--decode-layout L] [--ids runs|random|
 *               contiguous] [--max-sge S] [--addr IP] [--port N] [--seed N]
 *               [--dry-run] [--version]
 *
 * Defaults: llama-3.1-8b scaled to 4 layers and 192 blocks per region (so
 * that three engines' ranks fit a 512 MiB VM), prefill TP 2 -> decode TP 1,
 * 8 requests of 256 tokens, 16-token blocks, FLASH_HND on both sides,
 * decode block ids allocated in short runs, the consumer agent's default
 * max_sge (tools/lib/defaults.h: what kvpull-plan shows by default).
 * Hybrid models keep 2 attention and 2 state layers, sliding-window
 * models their share of sliding layers;
 * the blocks per region grow when the batch needs more (a pooled state page
 * spans tens of attention pages). The address defaults to $KVP_ADDR0 (set
 * by scripts/rxe-vm.sh).
 */
#include <errno.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "args.h"
#include "defaults.h"
#include "kvpull.h"
#include "kvtest.h"
#include "names.h"
#include "rdma_tool.h"

#define MAX_TP TOOL_MAX_RANKS
#define MAX_REQ 64
#define MAX_GROUPS 4
#define DEFAULT_BLOCKS 192
#define UNSET UINT32_MAX
#define PREFILL_ENGINE 0x7072656669ull /* "prefi" */
#define DECODE_ENGINE 0x6465636f64ull  /* "decod" */

struct opts {
	const char *model, *addr, *ids;
	uint32_t layers, state_layers, sliding_layers;
	uint32_t P, D, nreq, tokens, block, nblocks, max_sge;
	uint32_t playout, dlayout;
	uint16_t port;
	uint32_t seed, dry_run;
};

struct req {
	uint64_t id;
	struct kvp_ids ids[MAX_GROUPS]; /* one per group of the layouts */
	uint32_t *lid[MAX_GROUPS], *rid[MAX_GROUPS];
};

/* The groups as decode rank 0's plan sees them (local: decode, remote:
 * prefill; every rank of an engine has the same block geometry), and where
 * token-group ids start on each side so that they stay clear of the state
 * pages that share their regions. */
struct geom {
	uint32_t ngroups, slots; /* slots: state pages set aside */
	struct kvp_plan_group g[MAX_GROUPS];
	uint32_t plo, dlo;
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
		"  --layers N             attention layers kept (scaled down)\n"
		"                         [4; hybrid models 2]\n"
		"  --state-layers N       state layers kept, hybrid models (0: none)\n"
		"                         [the preset's, at most 2]\n"
		"  --sliding-layers N     of --layers, how many use a sliding window\n"
		"                         [the preset's share, at least 1 if any]\n"
		"  --prefill-tp P         [2]\n"
		"  --decode-tp D          [1]\n"
		"  --requests N           requests in the batch (<= %d) [8]\n"
		"  --tokens T             tokens per request [256]\n"
		"  --block B              block size in tokens, both engines [%u]\n"
		"  --num-blocks N         blocks per region [%d, or what the batch\n"
		"                         needs; hybrids set 2 state pages per\n"
		"                         request aside]\n"
		"  --prefill-layout L     flash_nhd|flash_hnd|flashinfer|packed [%s]\n"
		"  --decode-layout L      same [%s]\n"
		"  --ids MODE             decode block ids: runs (a fragmented\n"
		"                         allocator), random or contiguous [runs]\n"
		"  --max-sge S            local SGEs per READ [%u, an agent's default]\n"
		"  --addr IP              RDMA-capable address [$KVP_ADDR0]\n"
		"  --port N               first prefill rank's port [18700]\n"
		"  --seed N               [1]\n"
		"  --dry-run              check the options, print the engines and\n"
		"                         the batch, and exit (no RDMA; --addr\n"
		"                         not needed)\n"
		"  --version              print the version and exit\n"
		"Exit status: 0 every byte verified, 1 the transfer or the check\n"
		"failed, 2 bad options or a batch that does not fit.\n",
		MAX_REQ, TOOL_DEFAULT_BLOCK_TOKENS, DEFAULT_BLOCKS,
		tool_layout_names[TOOL_DEFAULT_KV_LAYOUT],
		tool_layout_names[TOOL_DEFAULT_KV_LAYOUT], KVP_DEFAULT_MAX_SGE);
}

/* Rank `rank` of the prefill or decode engine at TP `tp`; NULL on failure,
 * with the library's reason in why[len] when why is not NULL. */
static kvp_layout *build_tp(const struct opts *o, int prefill, uint32_t rank,
			    uint32_t tp, char *why, size_t len)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset(o->model, &m))
		return NULL;
	m.layers = o->layers;
	m.state_layers = o->state_layers;
	if (!m.state_layers)
		m.state_kind = KVP_STATE_NONE;
	m.sliding_layers = o->sliding_layers;
	memset(&e, 0, sizeof(e));
	e.engine_id = prefill ? PREFILL_ENGINE : DECODE_ENGINE;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = o->block;
	e.num_blocks = o->nblocks;
	e.kv_layout = prefill ? o->playout : o->dlayout;
	if (kvp_layout_build_msg(&m, &e, &l, why, why ? len : 0))
		return NULL;
	return l;
}

static kvp_layout *build(const struct opts *o, int prefill, uint32_t rank)
{
	return build_tp(o, prefill, rank, prefill ? o->P : o->D, NULL, 0);
}

/* Why rank 0 of an engine does not build: "--decode-tp 3: <the library's
 * rule>" when the same engine builds at TP 1 (the TP is to blame), else
 * "decode engine: <reason>". */
static void build_why(const struct opts *o, int prefill, char *why,
		      size_t len)
{
	const char *name = prefill ? "prefill" : "decode";
	uint32_t tp = prefill ? o->P : o->D;
	char msg[256] = "";
	kvp_layout *l;

	if (build_tp(o, prefill, 0, tp, msg, sizeof(msg)))
		return; /* unreachable: it did not build before */
	l = tp > 1 ? build_tp(o, prefill, 0, 1, NULL, 0) : NULL;
	if (l)
		snprintf(why, len, "--%s-tp %u: %s", name, tp, msg);
	else
		snprintf(why, len, "%s engine: %s", name,
			 msg[0] ? msg : "out of memory");
	kvp_layout_destroy(l);
}

/* The layer counts the demo keeps of preset `m` (options not given are
 * UNSET). Returns 0, or 2 after saying which option is wrong. */
static int scale_model(struct opts *o, const struct kvp_model *m)
{
	uint32_t s;

	if (o->layers == UNSET)
		o->layers = m->state_layers ? (m->layers < 2 ? m->layers : 2) : 4;
	if (o->state_layers == UNSET) {
		o->state_layers = m->state_layers < 2 ? m->state_layers : 2;
	} else if (o->state_layers && !m->state_layers) {
		fprintf(stderr, "kvpull-demo: %s has no state layers "
				"(--state-layers)\n", o->model);
		return 2;
	}
	if (o->sliding_layers == UNSET) {
		/* The preset's share, rounded, keeping at least one layer of
		 * each kind when there are two. */
		s = m->sliding_layers && m->layers ?
			    (uint32_t)(((uint64_t)m->sliding_layers * o->layers +
					m->layers / 2) / m->layers) : 0;
		if (m->sliding_layers && !s)
			s = 1;
		if (s && s >= o->layers && o->layers > 1 &&
		    m->sliding_layers < m->layers)
			s = o->layers - 1;
		o->sliding_layers = s;
	}
	if (o->sliding_layers > o->layers) {
		fprintf(stderr, "kvpull-demo: --sliding-layers %u is more than "
				"--layers %u\n", o->sliding_layers, o->layers);
		return 2;
	}
	return 0;
}

/* Fills *gm from the layouts of prefill rank 0 and decode rank 0. Returns
 * 0, or -1 with the reason in why[len]. */
static int get_geom(const struct opts *o, struct geom *gm, char *why,
		    size_t len)
{
	kvp_layout *pl = build(o, 1, 0), *dl = build(o, 0, 0);
	kvp_plan *plan = NULL;
	struct kvp_plan_info pi;
	uint32_t g;
	int ret = -1;

	if (!pl || !dl) {
		build_why(o, !pl, why, len);
		goto out;
	}
	if (kvp_plan_compile(dl, pl, NULL, &plan, why, len))
		goto out;
	kvp_plan_get_info(plan, &pi);
	if (pi.ngroups > MAX_GROUPS) {
		snprintf(why, len, "%u groups, the demo drives up to %d",
			 pi.ngroups, MAX_GROUPS);
		goto out;
	}
	gm->ngroups = pi.ngroups;
	for (g = 0; g < pi.ngroups; g++)
		if (kvp_plan_get_group(plan, g, &gm->g[g]))
			goto out;
	/* As the RDMA tests do: two state pages per request set aside, so
	 * that decode state ids can be drawn too. */
	gm->slots = 2 * o->nreq;
	gm->plo = tool_token_base(pl, gm->slots);
	gm->dlo = tool_token_base(dl, gm->slots);
	ret = 0;
out:
	kvp_plan_destroy(plan);
	kvp_layout_destroy(pl);
	kvp_layout_destroy(dl);
	return ret;
}

static void free_requests(struct req *rq, uint32_t nreq)
{
	uint32_t i, g;

	for (i = 0; i < nreq; i++)
		for (g = 0; g < MAX_GROUPS; g++) {
			free(rq[i].lid[g]);
			free(rq[i].rid[g]);
			rq[i].lid[g] = rq[i].rid[g] = NULL;
		}
}

/* Local ids of one group, every request: `nl` each, from [lo, lo + n) where
 * n is the room the group has; from a shuffled free list, or in runs of 1-8
 * consecutive ids (a fragmented allocator), or consecutive. Returns one
 * past the highest id used (which may exceed lo + n in runs), or 0 when
 * out of memory. */
static uint64_t draw_local(const struct opts *o, uint64_t *s, struct req *rq,
			   uint32_t g, uint32_t nl, uint32_t lo, uint32_t n)
{
	uint32_t *perm = malloc(((size_t)n + 1) * sizeof(*perm));
	uint32_t i, k, j, pos = 0;
	uint64_t dnext = lo, top = lo;

	if (!perm)
		return 0;
	kvt_random_ids(s, perm, n, n ? n : 1);
	for (i = 0; i < o->nreq; i++) {
		uint32_t *lid = rq[i].lid[g];

		if (!strcmp(o->ids, "random")) {
			for (k = 0; k < nl; k++)
				lid[k] = pos < n ? lo + perm[pos++] : UINT32_MAX;
		} else if (!strcmp(o->ids, "contiguous")) {
			for (k = 0; k < nl; k++)
				lid[k] = (uint32_t)dnext++;
		} else {
			/* Runs of 1-8 consecutive ids with small gaps, as a
			 * fragmented allocator hands them out. */
			k = 0;
			while (k < nl) {
				uint32_t run = 1 + (uint32_t)(kvt_rand(s) % 8);

				if (run > nl - k)
					run = nl - k;
				for (j = 0; j < run; j++)
					lid[k + j] = (uint32_t)(dnext + j);
				dnext += run + (uint32_t)(kvt_rand(s) % 2);
				k += run;
			}
		}
		for (k = 0; k < nl; k++)
			if (lid[k] == UINT32_MAX)
				top = (uint64_t)lo + (uint64_t)o->nreq * nl;
			else if (lid[k] + 1ull > top)
				top = lid[k] + 1ull;
	}
	free(perm);
	return top > lo ? top : lo + 1;
}

/* Blocks per region that give a group of `bound` ids (with `nblocks` per
 * region) room for `ids` of them, or 0 when it has room: blocks per region
 * scale every group's ids alike (a pooled state group has nblocks / span). */
static uint64_t more_blocks(uint32_t nblocks, uint64_t ids, uint32_t bound)
{
	if (ids <= bound)
		return 0;
	if (!bound)
		return (uint64_t)nblocks * ids + 1;
	return ((uint64_t)nblocks * ids + bound - 1) / bound;
}

/* Draws the batch. Prefill: each request's blocks are consecutive (a fresh
 * prefill). Decode: as --ids says. Token groups get ceil(tokens / block)
 * blocks per request above the state pages; state groups one whole state,
 * among the first gm->slots state pages. Returns 0; or, when the ids do not
 * fit, the blocks per region that would make room (the caller frees the
 * lists); or -1 when out of memory. */
static int64_t make_requests(const struct opts *o, const struct geom *gm,
			     struct req *rq)
{
	uint64_t s = o->seed, need = 0, top, want;
	uint32_t g, i, k, nr, nl, plo, dlo, dn;

	for (g = 0; g < gm->ngroups; g++) {
		const struct kvp_plan_group *pg = &gm->g[g];
		int state = pg->kind == KVP_GROUP_STATE;

		nr = state ? 1 : (o->tokens + pg->remote_tokens - 1) /
					 pg->remote_tokens;
		nl = state ? 1 : (o->tokens + pg->local_tokens - 1) /
					 pg->local_tokens;
		plo = state ? 0 : gm->plo;
		dlo = state ? 0 : gm->dlo;
		dn = state ? gm->slots : pg->local_blocks > dlo ?
					 pg->local_blocks - dlo : 0;
		for (i = 0; i < o->nreq; i++) {
			rq[i].id = 100 + i;
			rq[i].rid[g] = calloc(nr, sizeof(uint32_t));
			rq[i].lid[g] = calloc(nl, sizeof(uint32_t));
			if (!rq[i].rid[g] || !rq[i].lid[g])
				return -1;
			for (k = 0; k < nr; k++)
				rq[i].rid[g][k] = plo + i * nr + k;
			rq[i].ids[g].remote = rq[i].rid[g];
			rq[i].ids[g].local = rq[i].lid[g];
			rq[i].ids[g].nremote = nr;
			rq[i].ids[g].nlocal = nl;
			rq[i].ids[g].tokens = state ? 0 : o->tokens;
		}
		top = draw_local(o, &s, rq, g, nl, dlo, dn);
		if (!top)
			return -1;
		want = more_blocks(o->nblocks,
				   plo + (uint64_t)o->nreq * nr,
				   pg->remote_blocks);
		need = want > need ? want : need;
		want = more_blocks(o->nblocks, top, pg->local_blocks);
		need = want > need ? want : need;
		if (state) {
			want = more_blocks(o->nblocks, gm->slots,
					   pg->local_blocks < pg->remote_blocks ?
						   pg->local_blocks :
						   pg->remote_blocks);
			need = want > need ? want : need;
		}
	}
	if (need > UINT32_MAX)
		need = UINT32_MAX;
	return need > o->nblocks ? (int64_t)need : 0;
}

/* ---- prefill rank ------------------------------------------------------- */

/* What a decode rank reports: its figures and the lines it prints, in
 * memory shared with the parent (MAP_SHARED before the fork) so that the
 * parent prints the ranks in order, not interleaved. */
struct rank_out {
	int ok;
	uint64_t bytes, reads, naive;
	double secs;
	size_t len;
	char text[8192];
};

/* What the rank processes share. */
struct demo {
	const struct opts *o;
	struct req *rq;
	struct geom gm;
	uint32_t max_ids; /* the longest id list of any request and group */
	const char *where; /* what the throughput was measured on */
	struct rank_out *out; /* [o->D], shared */
};

static void __attribute__((format(printf, 2, 3)))
outf(struct rank_out *r, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (r->len >= sizeof(r->text) - 1)
		return;
	va_start(ap, fmt);
	n = vsnprintf(r->text + r->len, sizeof(r->text) - r->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		r->len += (size_t)n < sizeof(r->text) - r->len ?
				  (size_t)n :
				  sizeof(r->text) - 1 - r->len;
}

/* "4.0x fewer", "the same count", "1.25x more": READs against the naive
 * count, worded so that rounding never says "1.0x fewer". */
static const char *ratio_words(char *buf, size_t len, uint64_t naive,
			       uint64_t reads)
{
	double r;

	if (naive == reads || !reads || !naive) {
		snprintf(buf, len, "the same count");
		return buf;
	}
	r = naive > reads ? (double)naive / (double)reads :
			    (double)reads / (double)naive;
	snprintf(buf, len, r >= 10 ? "%.0fx %s" : r >= 1.1 ? "%.1fx %s" :
						   "%.2fx %s",
		 r, naive > reads ? "fewer" : "more");
	return buf;
}

static int prefill_rank(const struct demo *d, uint32_t rank, int ready_fd,
			int stop_fd)
{
	const struct opts *o = d->o;
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
		kvt_fill_producer(l, &mem, d->rq[i].ids);
	err = tool_producer_open(l, o->addr, (uint16_t)(o->port + rank),
				 MAX_REQ, &mem, &a);
	if (err) {
		fprintf(stderr, "prefill %u: %s\n", rank, kvp_strerror(err));
		goto out;
	}
	/* The scheduler hands these requests to the decode engine. */
	for (i = 0; i < o->nreq; i++) {
		err = kvp_agent_expect(a, DECODE_ENGINE, d->rq[i].id,
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

/* The producer ranks serving group g, from its src_mask. */
static void print_sources(struct rank_out *r, const kvp_plan *plan,
			  const struct kvp_plan_group *pg, uint32_t nsrc)
{
	uint32_t s, n = 0;

	for (s = 0; s < nsrc; s++)
		if (s >= 64 || (pg->src_mask >> s & 1))
			outf(r, "%s%d", n++ ? " " : "",
			     kvp_plan_source(plan, s));
}

/* The plan in a few lines: whom the rank reads from and notifies, its
 * size, and per group the block sizes it matches. */
static void print_plan(struct rank_out *r, const kvp_plan *plan,
		       uint32_t rank)
{
	struct kvp_plan_info pi;
	struct kvp_plan_group pg;
	uint32_t i;

	kvp_plan_get_info(plan, &pi);
	outf(r, "plan (decode rank %u): reads from prefill rank%s ", rank,
	     pi.nsrc == 1 ? "" : "s");
	for (i = 0; i < pi.nsrc; i++)
		outf(r, "%s%d", i ? " " : "", kvp_plan_source(plan, i));
	outf(r, ", notifies prefill rank%s ", pi.nnotify == 1 ? "" : "s");
	for (i = 0; i < pi.nnotify; i++)
		outf(r, "%s%d", i ? " " : "", kvp_plan_notify(plan, i));
	outf(r, "\n  %u group%s, %u streams (source x region pairs), %u piece "
		"templates, max_sge %u, compiled plan %llu bytes\n",
	     pi.ngroups, pi.ngroups == 1 ? "" : "s", pi.nstreams, pi.npieces,
	     pi.max_sge, (unsigned long long)pi.bytes);
	for (i = 0; i < pi.ngroups; i++) {
		if (kvp_plan_get_group(plan, i, &pg))
			continue;
		outf(r, "  group %u (%s): ", i,
		     TOOL_NAME(tool_group_names, pg.kind));
		if (pg.kind == KVP_GROUP_STATE)
			outf(r, "whole states (a block is one state page)");
		else if (pg.remote_tokens == pg.local_tokens)
			outf(r, "%u-token blocks on both sides",
			     pg.local_tokens);
		else
			outf(r, "%u-token prefill blocks -> %u-token decode "
				"blocks (period %u tokens)",
			     pg.remote_tokens, pg.local_tokens,
			     pg.period_tokens);
		if (pi.ngroups > 1) {
			outf(r, ", from prefill rank%s ",
			     pi.nsrc == 1 ? "" : "s");
			print_sources(r, plan, &pg, pi.nsrc);
		}
		outf(r, "\n");
	}
}

/* Per group: the READs the plan emits for the batch (what the agent posts),
 * and the naive count: one READ per local block per (source, region pair)
 * stream of the group, what a per-block transfer list would post. */
struct wr_count {
	uint64_t wrs[MAX_GROUPS], naive[MAX_GROUPS], blocks[MAX_GROUPS];
	uint32_t streams[MAX_GROUPS];
	uint64_t bytes; /* what the plan's READs move */
};

static int count_wrs(const struct demo *d, const kvp_plan *plan,
		     struct wr_count *c)
{
	struct kvp_plan_info pi;
	struct kvp_plan_stream ps;
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	uint32_t mw, ms, i, s, g;
	int n;

	memset(c, 0, sizeof(*c));
	kvp_plan_get_info(plan, &pi);
	for (i = 0; i < d->o->nreq; i++)
		for (g = 0; g < d->gm.ngroups; g++)
			c->blocks[g] += d->rq[i].ids[g].nlocal;
	for (s = 0; s < pi.nstreams; s++)
		if (!kvp_plan_get_stream(plan, s, &ps) &&
		    ps.group < MAX_GROUPS) {
			c->streams[ps.group]++;
			c->naive[ps.group] += c->blocks[ps.group];
		}
	kvp_plan_emit_bound(plan, d->max_ids, &mw, &ms);
	wr = calloc(mw ? mw : 1, sizeof(*wr));
	sge = calloc(ms ? ms : 1, sizeof(*sge));
	n = wr && sge ? 0 : -ENOMEM;
	for (i = 0; i < d->o->nreq && n >= 0; i++) {
		n = kvp_plan_emit(plan, d->rq[i].ids, wr, mw, sge, ms, NULL);
		for (s = 0; s < (uint32_t)(n > 0 ? n : 0); s++) {
			if (wr[s].group < MAX_GROUPS)
				c->wrs[wr[s].group]++;
			c->bytes += wr[s].len;
		}
	}
	free(wr);
	free(sge);
	return n < 0 ? n : 0;
}

static int decode_rank(const struct demo *d, uint32_t rank)
{
	const struct opts *o = d->o;
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	struct kvp_engine_info ei;
	struct kvt_mem mem = { 0 }, exp = { 0 };
	struct kvp_event ev[16];
	struct wr_count wc;
	kvp_layout *l = build(o, 0, rank), *r0 = build(o, 1, 0);
	kvp_agent *a = NULL;
	const kvp_plan *plan;
	struct rank_out *r = &d->out[rank];
	uint32_t i, g, next = 0, done = 0, eng = 0;
	uint64_t naive = 0, planned = 0;
	double t0, t1, t2, t3;
	char words[32];
	int err, n, ret = 1;

	alarm(400);
	if (!l || !r0 || kvt_mem_alloc(l, &mem)) {
		fprintf(stderr, "decode %u: out of memory\n", rank);
		goto out;
	}
	kvt_fill_background(&mem, 11 + rank);
	if (kvt_mem_copy(&exp, &mem)) {
		fprintf(stderr, "decode %u: out of memory\n", rank);
		goto out;
	}
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = o->addr;
	at.max_ids = d->max_ids;
	at.max_inflight = o->nreq;
	at.max_sge = o->max_sge;
	err = tool_agent_open(&at, &mem, &a);
	t0 = tool_now_s();
	if (!err)
		err = tool_add_engine(a, o->addr, o->port, o->P, &eng);
	if (!err)
		err = kvp_agent_engine_info(a, eng, &ei);
	if (err) {
		fprintf(stderr, "decode %u: %s\n", rank, kvp_strerror(err));
		goto out;
	}
	t1 = tool_now_s();
	plan = ei.plan;
	print_plan(r, plan, rank);
	err = count_wrs(d, plan, &wc);
	if (err) {
		fprintf(stderr, "decode %u: emit: %s\n", rank, kvp_strerror(err));
		goto out;
	}
	for (g = 0; g < d->gm.ngroups; g++) {
		naive += wc.naive[g];
		planned += wc.wrs[g];
	}
	t2 = tool_now_s();
	while (done < o->nreq) {
		while (next < o->nreq) {
			err = kvp_agent_pull_from(a, eng, d->rq[next].id,
						  d->rq[next].ids);
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
		kvt_expect_consumer(l, r0, &exp, NULL, d->rq[i].ids);
	if (kvt_mem_compare(&mem, &exp, "decode memory")) {
		fprintf(stderr, "decode rank %u: VERIFY FAILED\n", rank);
		goto out;
	}
	/* The agent reads exactly the plan's bytes, in at least its READs
	 * (a READ that a send queue window ends is split there). */
	if (st.read_bytes != wc.bytes || st.reads < planned) {
		fprintf(stderr, "decode rank %u: %llu READs of %llu bytes "
				"posted, the plan emits %llu of %llu\n", rank,
			(unsigned long long)st.reads,
			(unsigned long long)st.read_bytes,
			(unsigned long long)planned,
			(unsigned long long)wc.bytes);
		goto out;
	}
	outf(r, "transfer (decode rank %u): %llu bytes (%.1f MiB) in %llu "
		"RDMA READs; one READ per block per region would be %llu (%s)\n",
	     rank, (unsigned long long)st.read_bytes, st.read_bytes / 1048576.0,
	     (unsigned long long)st.reads, (unsigned long long)naive,
	     ratio_words(words, sizeof(words), naive, st.reads));
	for (g = 0; d->gm.ngroups > 1 && g < d->gm.ngroups; g++)
		outf(r, "  group %u (%s): %llu READs; one per block per region "
			"per source: %llu (%llu blocks x %u source x region "
			"streams, %s)\n",
		     g, TOOL_NAME(tool_group_names, d->gm.g[g].kind),
		     (unsigned long long)wc.wrs[g],
		     (unsigned long long)wc.naive[g],
		     (unsigned long long)wc.blocks[g], wc.streams[g],
		     ratio_words(words, sizeof(words), wc.naive[g], wc.wrs[g]));
	outf(r, "  %llu doorbells, %llu completion notifications to the "
		"prefill ranks; engine added and up (handshake, plan "
		"compiled) in %.0f ms\n",
	     (unsigned long long)st.doorbells,
	     (unsigned long long)st.notes_sent, (t1 - t0) * 1e3);
	outf(r, "  agent memory besides the KV cache: %.1f KiB (plan %.1f "
		"KiB, engine tables %.1f KiB)\n", st.mem_bytes / 1024.0,
	     ei.plan_bytes / 1024.0, ei.table_bytes / 1024.0);
	outf(r, "  %u requests in %.1f ms: %.1f MB/s (%s)\n", done,
	     (t3 - t2) * 1e3, st.read_bytes / (t3 - t2) / 1e6, d->where);
	outf(r, "verified (decode rank %u): every byte of the %u requests, "
		"%u local regions compared whole against the prefill "
		"patterns\n", rank, done, mem.nregions);
	r->bytes = st.read_bytes;
	r->reads = st.reads;
	r->naive = naive;
	r->secs = t3 - t2;
	r->ok = 1;
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

static int prefill_main(void *arg, uint32_t rank, int ready_fd, int stop_fd)
{
	return prefill_rank(arg, rank, ready_fd, stop_fd);
}

static int decode_main(void *arg, uint32_t rank)
{
	return decode_rank(arg, rank);
}

/* Draws the batch into d->rq and d->gm, growing o->nblocks until it fits
 * when `auto_blocks`. Returns 0, or 2 after saying what does not fit (with
 * a --num-blocks that does: a new size redraws the runs, so it is the size
 * the search settles on, not the first shortfall). */
static int plan_batch(struct opts *o, int auto_blocks, struct demo *d)
{
	uint32_t g, i, tries, given = o->nblocks;
	char why[256];
	int64_t need;

	for (tries = 0;; tries++) {
		if (get_geom(o, &d->gm, why, sizeof(why))) {
			fprintf(stderr, "kvpull-demo: cannot plan %s: %s\n",
				o->model, why);
			return 2;
		}
		need = make_requests(o, &d->gm, d->rq);
		if (!need)
			break;
		free_requests(d->rq, o->nreq);
		if (need < 0) {
			fprintf(stderr, "kvpull-demo: out of memory\n");
			return 2;
		}
		if (tries == 8 || need > UINT32_MAX - 64) {
			fprintf(stderr, "kvpull-demo: the batch does not fit "
					"%u blocks per region (fewer --requests "
					"or --tokens?)\n", o->nblocks);
			return 2;
		}
		o->nblocks = (uint32_t)((need + 63) / 64 * 64);
	}
	if (!auto_blocks && o->nblocks != given) {
		free_requests(d->rq, o->nreq);
		fprintf(stderr, "kvpull-demo: the batch needs more than "
				"--num-blocks %u: give --num-blocks %u (or fewer "
				"--requests or --tokens)\n", given, o->nblocks);
		return 2;
	}
	d->max_ids = 1;
	for (i = 0; i < o->nreq; i++)
		for (g = 0; g < d->gm.ngroups; g++) {
			if (d->rq[i].ids[g].nlocal > d->max_ids)
				d->max_ids = d->rq[i].ids[g].nlocal;
			if (d->rq[i].ids[g].nremote > d->max_ids)
				d->max_ids = d->rq[i].ids[g].nremote;
		}
	return 0;
}

/* The sliding-window and state layers kept, beside the model line (none
 * for single-group presets). */
static void print_layers(const struct opts *o, const struct kvp_model *m)
{
	if (o->sliding_layers)
		printf("  of which %u sliding-window (preset: %u of %u)\n",
		       o->sliding_layers, m->sliding_layers, m->layers);
	if (o->state_layers)
		printf("  plus %u of %u %s state layers, sharing regions with "
		       "the attention layers (region i: attention layer i and "
		       "state layer i)\n",
		       o->state_layers, m->state_layers,
		       TOOL_NAME(tool_state_names, m->state_kind));
}

/* A multi-group batch: the groups and where each side's ids lie. */
static void print_groups(const struct demo *d)
{
	uint32_t g;

	for (g = 0; g < d->gm.ngroups; g++) {
		const struct kvp_plan_group *pg = &d->gm.g[g];

		if (pg->kind == KVP_GROUP_STATE)
			printf("  group %u: state, 1 block (a whole state) per "
			       "request, ids below %u (2 per request) on both "
			       "sides\n",
			       g, d->gm.slots);
		else if (d->gm.plo || d->gm.dlo)
			printf("  group %u: %s, %u blocks per request, ids from "
			       "%u (prefill) and %u (decode), above the state "
			       "pages\n",
			       g, TOOL_NAME(tool_group_names, pg->kind),
			       d->rq[0].ids[g].nlocal, d->gm.plo, d->gm.dlo);
		else
			printf("  group %u: %s, %u blocks per request\n", g,
			       TOOL_NAME(tool_group_names, pg->kind),
			       d->rq[0].ids[g].nlocal);
	}
}

int main(int argc, char **argv)
{
	static const char P[] = "kvpull-demo";
	static struct req rq[MAX_REQ];
	struct opts o = { .model = "llama-3.1-8b", .ids = "runs",
			  .layers = UNSET, .state_layers = UNSET,
			  .sliding_layers = UNSET, .P = 2, .D = 1, .nreq = 8,
			  .tokens = 256, .block = TOOL_DEFAULT_BLOCK_TOKENS,
			  .nblocks = UNSET, .max_sge = KVP_DEFAULT_MAX_SGE,
			  .playout = TOOL_DEFAULT_KV_LAYOUT,
			  .dlayout = TOOL_DEFAULT_KV_LAYOUT, .port = 18700,
			  .seed = 1 };
	const struct tool_opt opts[] = {
		{ "--model", TOOL_STR, &o.model, 0 },
		{ "--addr", TOOL_STR, &o.addr, 0 },
		{ "--ids", TOOL_STR, &o.ids, 0 },
		{ "--prefill-layout", TOOL_LAYOUT, &o.playout, 0 },
		{ "--decode-layout", TOOL_LAYOUT, &o.dlayout, 0 },
		{ "--layers", TOOL_COUNT, &o.layers, 0 },
		{ "--state-layers", TOOL_U32, &o.state_layers, 0 },
		{ "--sliding-layers", TOOL_U32, &o.sliding_layers, 0 },
		{ "--prefill-tp", TOOL_COUNT, &o.P, MAX_TP },
		{ "--decode-tp", TOOL_COUNT, &o.D, MAX_TP },
		{ "--requests", TOOL_COUNT, &o.nreq, MAX_REQ },
		{ "--tokens", TOOL_COUNT, &o.tokens, 0 },
		{ "--block", TOOL_COUNT, &o.block, 0 },
		{ "--num-blocks", TOOL_COUNT, &o.nblocks, 0 },
		{ "--max-sge", TOOL_U32, &o.max_sge, 0 },
		{ "--port", TOOL_PORT, &o.port, 65535 - MAX_TP },
		{ "--seed", TOOL_U32, &o.seed, 0 },
		{ "--dry-run", TOOL_FLAG, &o.dry_run, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};
	struct demo d = { .o = &o, .rq = rq };
	struct tool_ranks prod;
	struct kvp_model m;
	kvp_layout *pl, *dl;
	struct kvp_layout_info pli, dli;
	uint32_t v;
	uint64_t psz = 0, dsz = 0, sz, bytes = 0, reads = 0, naive = 0;
	double t0, secs = 0;
	char where[128], words[32];
	const char *in_vm = getenv("KVP_IN_VM");
	int bad, auto_blocks;

	bad = tool_parse_args(argc, argv, P, opts);
	if (bad == TOOL_ARGS_HELP)
		usage(stdout);
	if (bad)
		return bad == TOOL_ARGS_BAD ? 2 : 0;
	if (o.dry_run && !o.addr && !getenv("KVP_ADDR0"))
		o.addr = "(none: --dry-run)";
	if (tool_default_addr(P, &o.addr))
		return 2;
	if (strcmp(o.ids, "runs") && strcmp(o.ids, "random") &&
	    strcmp(o.ids, "contiguous"))
		return tool_bad_arg(P, "--ids: '%s' is not runs, random or "
				    "contiguous", o.ids);
	if (kvp_model_preset(o.model, &m)) {
		char names[512] = "";
		const char *nm;
		size_t n = 0;

		for (v = 0; (nm = kvp_model_preset_name(v)) && n < sizeof(names);
		     v++)
			n += (size_t)snprintf(names + n, sizeof(names) - n,
					      "%s%s", v ? " " : "", nm);
		return tool_bad_arg(P, "--model: unknown model '%s' (presets: "
				    "%s)", o.model, names);
	}
	if (scale_model(&o, &m))
		return 2;
	setvbuf(stdout, NULL, _IOLBF, 0);
	/* The first line, before any work: the run's header. */
	if (in_vm && !strcmp(in_vm, "1"))
		snprintf(where, sizeof(where), "soft-RoCE under QEMU "
					       "emulation, not hardware");
	else
		snprintf(where, sizeof(where), "the RDMA device behind %s",
			 o.addr);
	d.where = where;
	printf("== kvpull-demo: %s, prefill TP %u (%s) -> decode TP %u (%s), "
	       "%u requests pulled with RDMA READs\n",
	       o.model, o.P, tool_layout_names[o.playout], o.D,
	       tool_layout_names[o.dlayout], o.nreq);
	auto_blocks = o.nblocks == UNSET;
	if (auto_blocks)
		o.nblocks = DEFAULT_BLOCKS;
	if (plan_batch(&o, auto_blocks, &d))
		return 2;
	pl = build(&o, 1, 0);
	dl = build(&o, 0, 0);
	if (!pl || !dl) {
		fprintf(stderr, "kvpull-demo: the engines do not fit (more "
				"--num-blocks?)\n");
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
	printf("model %s, scaled to fit VM memory: %u of %u %slayers, %u "
	       "blocks per region\n",
	       o.model, o.layers, m.layers, m.state_layers ? "attention " : "",
	       o.nblocks);
	print_layers(&o, &m);
	printf("prefill engine: TP %u, %u-token blocks, %s, %u regions, "
	       "%.1f MiB per rank\n",
	       o.P, o.block, tool_layout_names[o.playout], pli.nregions,
	       psz / 1048576.0);
	printf("decode engine:  TP %u, %u-token blocks, %s, %u regions, "
	       "%.1f MiB per rank\n",
	       o.D, o.block, tool_layout_names[o.dlayout], dli.nregions,
	       dsz / 1048576.0);
	printf("batch: %u requests of %u tokens (%u blocks each), decode "
	       "block ids %s, address %s\n",
	       o.nreq, o.tokens, rq[0].ids[0].nlocal,
	       !strcmp(o.ids, "runs") ? "in short runs (a fragmented "
					"allocator)" : o.ids, o.addr);
	if (d.gm.ngroups > 1)
		print_groups(&d);
	kvp_layout_destroy(pl);
	kvp_layout_destroy(dl);
	if (o.dry_run) {
		free_requests(rq, o.nreq);
		return 0;
	}

	d.out = mmap(NULL, sizeof(*d.out) * o.D, PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (d.out == MAP_FAILED) {
		fprintf(stderr, "kvpull-demo: out of memory\n");
		free_requests(rq, o.nreq);
		return 1;
	}
	memset(d.out, 0, sizeof(*d.out) * o.D);
	printf("... starting %u prefill rank%s (filling KV memory, listening)\n",
	       o.P, o.P == 1 ? "" : "s");
	t0 = tool_now_s();
	bad = tool_start_producers(&prod, o.P, prefill_main, &d) != 0;
	if (bad) {
		fprintf(stderr, "kvpull-demo: a prefill rank failed\n");
	} else {
		printf("... prefill ranks ready after %.1f s; %u decode rank%s "
		       "connecting and pulling\n", tool_now_s() - t0, o.D,
		       o.D == 1 ? "" : "s");
		bad = tool_run_consumers(&prod, o.D, decode_main, &d) != 0;
	}
	if (tool_stop_producers(&prod, bad))
		bad = 1;
	for (v = 0; v < o.D; v++) {
		fwrite(d.out[v].text, 1, d.out[v].len, stdout);
		if (!d.out[v].ok) {
			bad = 1;
			continue;
		}
		bytes += d.out[v].bytes;
		reads += d.out[v].reads;
		naive += d.out[v].naive;
		if (d.out[v].secs > secs)
			secs = d.out[v].secs;
	}
	if (!bad && o.D > 1)
		printf("total, %u decode ranks pulling at once: %llu bytes in %llu "
		       "READs (one per block per region: %llu, %s), slowest rank %.1f ms, "
		       "%.1f MB/s (%s)\n",
		       o.D, (unsigned long long)bytes,
		       (unsigned long long)reads, (unsigned long long)naive,
		       ratio_words(words, sizeof(words), naive, reads),
		       secs * 1e3, secs > 0 ? bytes / secs / 1e6 : 0.0, where);
	munmap(d.out, sizeof(*d.out) * o.D);
	free_requests(rq, o.nreq);
	printf("%s\n", bad ? "demo: FAILED" : "demo: OK, every byte verified");
	return bad;
}
