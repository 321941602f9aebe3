// SPDX-License-Identifier: MIT
/*
 * Streaming emission (kvp_progress_ranges, kvp_plan_emit_range_*): a
 * request read part by part while its producer still writes it.
 *
 *  - kvp_progress_ranges(): exact ranges for layer-wise, chunked and mixed
 *    steps, merging, and its errors (malformed, going backwards);
 *  - the range calls' rejections;
 *  - the simulation, over a matrix of layout pairs (dense, block sizes that
 *    nest and that do not, TP splits, MLA, sliding window, Mamba2 and GDN
 *    hybrids, a producer region holding all layers of a block, prefix
 *    hits) and progress schedules (layer by layer, chunk by chunk, chunks
 *    layer by layer, random; the consumer following every step or lagging):
 *    producer memory starts as poison; at each step the producer writes
 *    exactly the (layer, token) cells that step publishes, computed layer
 *    by layer from the progress definition (not from
 *    kvp_progress_ranges()); at the steps the consumer sees, it emits the
 *    new ranges in windows of 1 to 64 WRs and executes them at once with
 *    memcpy. At the end the consumer's memory equals the identity
 *    expectation byte for byte and every needed byte was written exactly
 *    once: a READ of a cell before its step would have landed poison that
 *    nothing overwrites, a range that missed a part would leave it unread,
 *    and two that overlap would write a byte twice.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtest.h"

#define END KVP_TOKENS_END
#define HND KVP_KV_FLASH_HND
#define NHD KVP_KV_FLASH_NHD
#define FI KVP_KV_FLASHINFER
#define PK KVP_KV_PACKED

static struct kvp_progress prog(uint64_t all, uint64_t cur, uint32_t layers)
{
	struct kvp_progress p = { all, cur, layers, 0 };

	return p;
}

static void range_is(const struct kvp_emit_range *r, uint32_t l0,
		     uint32_t l1, uint64_t t0, uint64_t t1)
{
	assert_int_equal(r->layer0, l0);
	assert_int_equal(r->layer1, l1);
	assert_true(r->tok0 == t0);
	assert_true(r->tok1 == t1);
	assert_int_equal(r->comp_mask, 0);
}

static void test_progress_ranges(void **state)
{
	struct kvp_progress a, b;
	struct kvp_emit_range r[3];

	(void)state;
	/* nothing, then layers 0-1 of a whole (one-chunk) prefill */
	a = prog(0, 0, 0);
	b = prog(0, END, 2);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 0, 2, 0, END);
	/* two more layers */
	a = b;
	b = prog(0, END, 4);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 2, 4, 0, END);
	/* the prefill done: every layer from 4 on */
	a = b;
	b = prog(END, END, 0);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 4, UINT32_MAX, 0, END);
	/* the same again: nothing */
	assert_int_equal(kvp_progress_ranges(&b, &b, r), 0);
	/* chunked, no layers: chunk 1 then 2 */
	a = prog(0, 0, 0);
	b = prog(100, 100, 7); /* layers_cur ignored without a step */
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 0, UINT32_MAX, 0, 100);
	a = b;
	b = prog(250, 250, 0);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 0, UINT32_MAX, 100, 250);
	/* chunk 2 layer by layer after chunk 1 was done */
	a = prog(100, 100, 0);
	b = prog(100, 250, 3);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 0, 3, 100, 250);
}

/* A lagging consumer: from layer 3 of chunk 2 straight to layer 1 of
 * chunk 3. */
static void test_progress_lag(void **state)
{
	struct kvp_progress a = prog(100, 250, 3), b = prog(250, 400, 1);
	struct kvp_emit_range r[3];

	(void)state;
	/* layer 0: 250 -> 400; layers 1-2: 250 -> 250 (nothing); layers 3+:
	 * 100 -> 250 */
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 2);
	range_is(&r[0], 0, 1, 250, 400);
	range_is(&r[1], 3, UINT32_MAX, 100, 250);
	/* the next layer of chunk 3 moves the new step: layers 1-2 */
	a = b;
	b = prog(250, 400, 3);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 1);
	range_is(&r[0], 1, 3, 250, 400);
	/* and the last chunk, published to the end, in 3 pieces at once */
	a = prog(100, 250, 3);
	b = prog(250, END, 5);
	assert_int_equal(kvp_progress_ranges(&a, &b, r), 3);
	range_is(&r[0], 0, 3, 250, END);
	range_is(&r[1], 3, 5, 100, END);
	range_is(&r[2], 5, UINT32_MAX, 100, 250);
}

static void test_progress_errors(void **state)
{
	struct kvp_progress a = prog(0, 0, 0), b = prog(10, 20, 2), bad;
	struct kvp_emit_range r[3];

	(void)state;
	assert_int_equal(kvp_progress_ranges(NULL, &b, r), -EINVAL);
	assert_int_equal(kvp_progress_ranges(&a, NULL, r), -EINVAL);
	assert_int_equal(kvp_progress_ranges(&a, &b, NULL), -EINVAL);
	bad = prog(30, 20, 0);
	assert_int_equal(kvp_progress_ranges(&a, &bad, r), -EINVAL);
	bad = b;
	bad.comp_mask = 1;
	assert_int_equal(kvp_progress_ranges(&a, &bad, r), -EINVAL);
	/* backwards: fewer tokens everywhere, or in the layers past the
	 * step (20 in layers 0-1 against 10 then 15 in all) */
	assert_int_equal(kvp_progress_ranges(&b, &a, r), -ERANGE);
	bad = prog(15, 15, 0);
	assert_int_equal(kvp_progress_ranges(&b, &bad, r), -ERANGE);
	/* and out untouched on an error */
	memset(r, 0x5a, sizeof(r));
	assert_int_equal(kvp_progress_ranges(&b, &bad, r), -ERANGE);
	assert_int_equal(r[0].layer0, 0x5a5a5a5a);
}

/* ---- the simulation ------------------------------------------------------ */

static const struct kvp_model dense = {
	.name = "dense", .layers = 4, .kv_heads = 4, .head_dim = 4,
	.dtype_bytes = 2,
};

static const struct kvp_model mla_tiny = {
	.name = "mla-tiny", .layers = 3, .kv_heads = 1, .head_dim = 24,
	.dtype_bytes = 2, .mla_latent = 24,
};

static const struct kvp_model sliding_tiny = {
	.name = "sliding-tiny", .layers = 4, .kv_heads = 4, .head_dim = 4,
	.dtype_bytes = 2, .sliding_layers = 3,
};

static const struct kvp_model mamba_tiny = {
	.name = "mamba-tiny", .layers = 2, .kv_heads = 4, .head_dim = 4,
	.dtype_bytes = 2, .state_kind = KVP_STATE_MAMBA2, .state_layers = 2,
	.conv_kernel = 4, .ssm_heads = 8, .ssm_head_dim = 2, .ssm_state = 4,
	.ssm_groups = 2, .state_dtype_bytes = 2,
};

static const struct kvp_model gdn_tiny = {
	.name = "gdn-tiny", .layers = 1, .kv_heads = 2, .head_dim = 4,
	.dtype_bytes = 2, .state_kind = KVP_STATE_GDN, .state_layers = 3,
	.conv_kernel = 3, .ssm_heads = 8, .ssm_head_dim = 2, .ssm_state = 2,
	.ssm_groups = 4, .state_dtype_bytes = 4,
};

/* 2 layers, 2 KV heads of 4, 4-token blocks; the producer's one region
 * holds all layers of a block (tests/test_gather.c's scenario B): its
 * four streams form one gather across both layers. */
static const struct kvp_model hand = {
	.name = "hand", .layers = 2, .kv_heads = 2, .head_dim = 4,
	.dtype_bytes = 2,
};
static const char all_layers[] =
	"engine tp_size=1\n"
	"group kind=full block_tokens=4\n"
	"region size=8K\n"
	"view group=0 region=0 layer=0 num_blocks=32 offset=0 stride=256\n"
	"view group=0 region=0 layer=1 num_blocks=32 offset=128 stride=256\n"
	"field view=0 kind=k elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
	"field view=0 kind=v elem=2 offset=64 dims=head:2:32,token:4:8,dim:4:2\n"
	"field view=1 kind=k elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
	"field view=1 kind=v elem=2 offset=64 dims=head:2:32,token:4:8,dim:4:2\n";

struct scase {
	const char *name;
	const struct kvp_model *m;
	const char *rspec; /* a spec for the producer (TP 1) instead of m */
	uint32_t P, D;
	uint32_t rblock, rkv, lblock, lkv;
	uint32_t max_sge;
};

static const struct scase scases[] = {
	{ "dense 1->1", &dense, NULL, 1, 1, 16, HND, 16, HND, 4 },
	{ "dense 2->1 nhd->hnd", &dense, NULL, 2, 1, 16, NHD, 16, HND, 4 },
	{ "dense 1->2 blocks 16->32", &dense, NULL, 1, 2, 16, HND, 32, HND, 1 },
	{ "dense 2->2 blocks 24->16 (no nesting)", &dense, NULL, 2, 2, 24,
	  FI, 16, HND, 4 },
	{ "dense 1->1 flashinfer->packed", &dense, NULL, 1, 1, 16, FI, 16, PK,
	  16 },
	{ "mla 2->1 blocks 64->16", &mla_tiny, NULL, 2, 1, 64, HND, 16, HND,
	  4 },
	{ "sliding 1->1", &sliding_tiny, NULL, 1, 1, 16, HND, 16, HND, 4 },
	{ "mamba2 hybrid 2->1", &mamba_tiny, NULL, 2, 1, 16, HND, 16, HND, 4 },
	{ "gdn hybrid 1->2 blocks 32->16", &gdn_tiny, NULL, 1, 2, 32, HND, 16,
	  HND, 4 },
	{ "all layers in one producer region (a gather)", &hand, all_layers, 1,
	  1, 4, 0, 4, HND, 4 },
};

#define NBLOCKS 64u
#define MAXIDS 24u
#define MAXSTEPS 200u
#define WCAP 64u

static kvp_layout *sbuild(const struct scase *c, int remote, uint32_t rank)
{
	struct kvp_engine_desc e = { 0 };
	kvp_layout *l = NULL;
	char msg[160] = "";

	if (remote && c->rspec) {
		if (kvp_layout_parse(c->rspec, strlen(c->rspec), &l, msg,
				     sizeof(msg)))
			fail_msg("parse: %s", msg);
		return l;
	}
	e.engine_id = remote ? 1 : 2;
	e.tp_size = remote ? c->P : c->D;
	e.tp_rank = rank;
	e.block_tokens = remote ? c->rblock : c->lblock;
	e.num_blocks = NBLOCKS;
	e.kv_layout = remote ? c->rkv : c->lkv;
	assert_int_equal(kvp_layout_build(c->m, &e, &l), 0);
	return l;
}

/* A progress schedule ending with the finished prefill: mode 0 layer by
 * layer, 1 chunk by chunk, 2 chunks layer by layer, 3 random. */
static uint32_t schedule(uint64_t *seed, int mode, uint64_t tokens,
			 uint32_t layers, struct kvp_progress *s)
{
	uint64_t chunk = 1 + kvt_rand(seed) % (tokens / 2 + 1), t0, t1;
	uint32_t n = 0, l;

	switch (mode) {
	case 0:
		for (l = 1; l < layers; l++)
			s[n++] = prog(0, END, l);
		break;
	case 1:
		for (t0 = chunk; t0 < tokens; t0 += chunk)
			s[n++] = prog(t0, t0, 0);
		break;
	case 2:
		for (t0 = 0; t0 < tokens && n + layers < MAXSTEPS; t0 = t1) {
			t1 = t0 + chunk;
			for (l = 1; l < layers; l++)
				s[n++] = prog(t0, t1 >= tokens ? END : t1, l);
			if (t1 < tokens)
				s[n++] = prog(t1, t1, 0);
		}
		break;
	default:
		/* each step a layer or two of the chunk in progress, or the
		 * chunk done, or (once one is done) a new chunk */
		t0 = t1 = 0;
		l = 0;
		while (n < MAXSTEPS - 1 && t0 != END) {
			if (t1 == t0) {
				t1 = t0 + 1 + kvt_rand(seed) % (tokens / 3 + 1);
				if (t1 >= tokens)
					t1 = END;
				l = 1 + (uint32_t)(kvt_rand(seed) % 2);
			} else if (kvt_rand(seed) % 3 == 0) {
				t0 = t1;
			} else {
				l += 1 + (uint32_t)(kvt_rand(seed) % 2);
			}
			if (t1 > t0 && l >= layers)
				t0 = t1; /* every layer: the chunk is done */
			s[n++] = prog(t0, t1, t1 > t0 ? l : 0);
		}
		break;
	}
	s[n++] = prog(END, END, 0);
	return n;
}

struct sim {
	const kvp_plan *plan;
	kvp_layout *loc, **rem;
	uint32_t P, nsrc, max_sge;
	struct kvt_mem *prod, **pp, mem, seen;
	struct kvp_wr wr[WCAP];
	struct kvp_sge sge[WCAP * 16];
	uint64_t *seed;
	uint64_t reads, ranges;
};

/* The producer ranks write what the step from a to b publishes. */
static void publish(struct sim *x, const struct kvp_ids *ids,
		    const struct kvp_progress *a, const struct kvp_progress *b,
		    uint32_t layers)
{
	uint32_t i, l;

	for (l = 0; l < layers; l++) {
		uint64_t from = kvt_ready(a, l), to = kvt_ready(b, l);

		for (i = 0; i < x->P && from < to; i++)
			kvt_fill_producer_part(x->rem[i], &x->prod[i], ids, l,
					       l + 1, from, to);
	}
}

/* The consumer reads range r of every source, in windows. */
static void read_range(struct sim *x, const struct kvp_ids *ids,
		       const struct kvp_emit_range *r)
{
	uint32_t s, cap;
	uint64_t bytes;
	int n;

	x->ranges++;
	for (s = 0; s < x->nsrc; s++) {
		struct kvp_emit_pos pos;

		assert_int_equal(kvp_plan_emit_range_start(x->plan, ids, s, r,
							   &pos), 0);
		while (!kvp_plan_emit_done(&pos)) {
			cap = 1 + (uint32_t)(kvt_rand(x->seed) % WCAP);
			n = kvp_plan_emit_range_window(x->plan, ids, r, &pos,
						       x->wr, cap, x->sge,
						       cap * x->max_sge,
						       &bytes);
			assert_true(n > 0);
			x->reads += (uint32_t)n;
			if (kvt_execute(x->plan, x->wr, (uint32_t)n, x->sge,
					x->pp, &x->mem, &x->seen, &bytes))
				fail_msg("execute");
		}
	}
}

/* One request pulled while it is written: schedule s, the consumer seeing
 * every `lag`-th step (and the last). */
static void simulate(const struct scase *c, kvp_layout *loc,
		     kvp_layout **rem, const kvp_plan *plan,
		     const struct kvp_ids *ids, const struct kvp_progress *s,
		     uint32_t nsteps, uint32_t lag, uint64_t *seed,
		     uint64_t *reads, uint64_t *ranges)
{
	struct kvt_mem exp = { 0 }, need = { 0 };
	struct kvp_plan_info pi;
	struct kvp_progress seen = prog(0, 0, 0), pub = prog(0, 0, 0);
	uint32_t layers = kvt_layers(rem[0]), i, k;
	struct sim *x = calloc(1, sizeof(*x));

	assert_non_null(x);
	kvp_plan_get_info(plan, &pi);
	x->plan = plan;
	x->loc = loc;
	x->rem = rem;
	x->P = c->P;
	x->nsrc = pi.nsrc;
	x->max_sge = pi.max_sge;
	x->seed = seed;
	x->prod = calloc(c->P, sizeof(*x->prod));
	x->pp = calloc(c->P, sizeof(*x->pp));
	assert_non_null(x->prod);
	assert_non_null(x->pp);
	for (i = 0; i < c->P; i++) {
		assert_int_equal(kvt_mem_alloc(rem[i], &x->prod[i]), 0);
		kvt_fill_background(&x->prod[i], 100 + i); /* the poison */
		x->pp[i] = &x->prod[i];
	}
	assert_int_equal(kvt_mem_alloc(loc, &x->mem), 0);
	kvt_fill_background(&x->mem, 7);
	assert_int_equal(kvt_mem_alloc(loc, &exp), 0);
	assert_int_equal(kvt_mem_alloc(loc, &need), 0);
	assert_int_equal(kvt_mem_alloc(loc, &x->seen), 0);
	kvt_fill_background(&exp, 7);
	for (i = 0; i < need.nregions; i++) {
		memset(need.buf[i], 0, need.size[i]);
		memset(x->seen.buf[i], 0, x->seen.size[i]);
	}
	kvt_expect_consumer(loc, rem[0], &exp, &need, ids);

	for (i = 0; i < nsteps; i++) {
		struct kvp_emit_range r[3];
		int n;

		publish(x, ids, &pub, &s[i], layers);
		pub = s[i];
		if (i + 1 < nsteps && (i + 1) % lag)
			continue;
		n = kvp_progress_ranges(&seen, &s[i], r);
		assert_true(n >= 0);
		for (k = 0; k < (uint32_t)n; k++)
			read_range(x, ids, &r[k]);
		seen = s[i];
	}
	if (kvt_mem_compare(&x->mem, &exp, "consumer bytes") ||
	    kvt_mem_compare(&x->seen, &need, "written-once map"))
		fail_msg("%s: streamed pull differs (lag %u, %u steps)",
			 c->name, lag, nsteps);
	*reads += x->reads;
	*ranges += x->ranges;
	for (i = 0; i < c->P; i++)
		kvt_mem_free(&x->prod[i]);
	free(x->prod);
	free(x->pp);
	kvt_mem_free(&x->mem);
	kvt_mem_free(&x->seen);
	kvt_mem_free(&exp);
	kvt_mem_free(&need);
	free(x);
}

/* A request of `tokens` tokens, `hit` of them a prefix hit on the
 * consumer (token groups: the leading local blocks are not read). */
struct sreq {
	struct kvp_ids ids[4];
	uint32_t l[4][MAXIDS], r[4][MAXIDS];
};

static void make_req(struct sreq *q, const kvp_plan *plan, uint64_t *seed,
		     uint64_t tokens, uint64_t hit)
{
	uint32_t lall[4 * MAXIDS], rall[4 * MAXIDS], nl[4], nr[4];
	uint32_t g, ln = 0, rn = 0, lb = UINT32_MAX, rb = UINT32_MAX;
	struct kvp_plan_info pi;

	kvp_plan_get_info(plan, &pi);
	assert_true(pi.ngroups <= 4);
	memset(q, 0, sizeof(*q));
	for (g = 0; g < pi.ngroups; g++) {
		struct kvp_plan_group pg;
		uint32_t skip;

		assert_int_equal(kvp_plan_get_group(plan, g, &pg), 0);
		if (pg.kind == KVP_GROUP_STATE) {
			nr[g] = nl[g] = 1 + (uint32_t)(kvt_rand(seed) % 2);
		} else {
			nr[g] = (uint32_t)((tokens + pg.remote_tokens - 1) /
					   pg.remote_tokens);
			nl[g] = (uint32_t)((tokens + pg.local_tokens - 1) /
					   pg.local_tokens);
			skip = (uint32_t)(hit / pg.local_tokens);
			nl[g] -= skip < nl[g] ? skip : nl[g] - 1;
		}
		assert_true(nr[g] <= MAXIDS && nl[g] <= MAXIDS);
		ln += nl[g];
		rn += nr[g];
		lb = pg.local_blocks < lb ? pg.local_blocks : lb;
		rb = pg.remote_blocks < rb ? pg.remote_blocks : rb;
	}
	/* Distinct over all groups: hybrid groups may share a block pool
	 * (vLLM's), and one block serves one group of a request. */
	kvt_random_ids(seed, lall, ln, lb);
	kvt_random_ids(seed, rall, rn, rb);
	for (g = 0, ln = rn = 0; g < pi.ngroups; g++) {
		struct kvp_plan_group pg;

		assert_int_equal(kvp_plan_get_group(plan, g, &pg), 0);
		memcpy(q->l[g], lall + ln, nl[g] * sizeof(uint32_t));
		memcpy(q->r[g], rall + rn, nr[g] * sizeof(uint32_t));
		ln += nl[g];
		rn += nr[g];
		q->ids[g].remote = q->r[g];
		q->ids[g].local = q->l[g];
		q->ids[g].nremote = nr[g];
		q->ids[g].nlocal = nl[g];
		q->ids[g].tokens = pg.kind == KVP_GROUP_STATE ? 0 : tokens;
	}
}

static void test_simulate(void **state)
{
	uint64_t seed = 0x5eed5, reads = 0, ranges = 0, runs = 0;
	uint32_t ci, d, i;

	(void)state;
	for (ci = 0; ci < sizeof(scases) / sizeof(scases[0]); ci++) {
		const struct scase *c = &scases[ci];
		kvp_layout *rem[4];

		assert_true(c->P <= 4);
		for (i = 0; i < c->P; i++)
			rem[i] = sbuild(c, 1, i);
		for (d = 0; d < c->D; d++) {
			struct kvp_plan_attr a = { .max_sge = c->max_sge };
			kvp_layout *loc = sbuild(c, 0, d);
			kvp_plan *plan = NULL;
			char msg[160] = "";
			uint32_t layers = kvt_layers(rem[0]);
			uint32_t minb = c->rblock < c->lblock ? c->rblock :
								c->lblock;
			int mode, lag;

			if (kvp_plan_compile(loc, rem[0], &a, &plan, msg,
					     sizeof(msg)))
				fail_msg("%s: compile: %s", c->name, msg);
			for (mode = 0; mode < 4; mode++) {
				for (lag = 1; lag <= 3; lag += 2) {
					static struct kvp_progress s[MAXSTEPS];
					static struct sreq q;
					uint64_t tokens, hit;
					uint32_t n;

					/* up to 16 blocks of the smaller
					 * size */
					tokens = 1 + kvt_rand(&seed) %
							     (16ull * minb);
					hit = mode == 3 ? kvt_rand(&seed) %
								  tokens :
							  0;
					make_req(&q, plan, &seed, tokens, hit);
					n = schedule(&seed, mode, tokens,
						     layers, s);
					simulate(c, loc, rem, plan, q.ids, s,
						 n, (uint32_t)lag, &seed,
						 &reads, &ranges);
					runs++;
				}
			}
			kvp_plan_destroy(plan);
			kvp_layout_destroy(loc);
		}
		for (i = 0; i < c->P; i++)
			kvp_layout_destroy(rem[i]);
	}
	printf("    %llu streamed pulls, %llu ranges, %llu READs: every byte "
	       "once, none early\n",
	       (unsigned long long)runs, (unsigned long long)ranges,
	       (unsigned long long)reads);
}

static void test_range_rejects(void **state)
{
	kvp_layout *loc = sbuild(&scases[0], 0, 0), *rem = sbuild(&scases[0],
								  1, 0);
	struct kvp_emit_range r = { 0, UINT32_MAX, 0, END, 0, 0 }, bad;
	struct kvp_plan_attr a = { .max_sge = 4 };
	static const uint32_t l[] = { 1 }, rr[] = { 2 };
	struct kvp_ids ids = { l, rr, 1, 1, 16 };
	struct kvp_emit_pos pos, was;
	static struct kvp_wr wr[64];
	static struct kvp_sge sge[256];
	kvp_plan *plan = NULL;

	(void)state;
	assert_int_equal(kvp_plan_compile(loc, rem, &a, &plan, NULL, 0), 0);
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, NULL, &pos),
			 -EINVAL);
	bad = r;
	bad.comp_mask = 1;
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, &bad, &pos),
			 -EINVAL);
	bad = r;
	bad.layer0 = 3;
	bad.layer1 = 2;
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, &bad, &pos),
			 -EINVAL);
	bad = r;
	bad.tok0 = 20;
	bad.tok1 = 10;
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, &bad, &pos),
			 -EINVAL);
	/* a good start, then a bad range to its window: pos untouched */
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, &r, &pos),
			 0);
	was = pos;
	assert_int_equal(kvp_plan_emit_range_window(plan, &ids, &bad, &pos, wr,
						    4, sge, 16, NULL),
			 -EINVAL);
	assert_memory_equal(&pos, &was, sizeof(pos));
	/* an empty range: done at once */
	bad = r;
	bad.tok0 = bad.tok1 = 5;
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, &bad, &pos),
			 0);
	assert_int_equal(kvp_plan_emit_done(&pos), 1);
	/* the whole request as one range: kvp_plan_emit()'s READs */
	assert_int_equal(kvp_plan_emit_range_start(plan, &ids, 0, &r, &pos),
			 0);
	assert_int_equal(kvp_plan_emit_range_window(plan, &ids, &r, &pos, wr,
						    64, sge, 256, NULL),
			 kvp_plan_emit(plan, &ids, wr, 64, sge, 256, NULL));
	kvp_plan_destroy(plan);
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_progress_ranges),
		cmocka_unit_test(test_progress_lag),
		cmocka_unit_test(test_progress_errors),
		cmocka_unit_test(test_range_rejects),
		cmocka_unit_test(test_simulate),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
