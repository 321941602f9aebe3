// SPDX-License-Identifier: MIT
/*
 * Emission: exact WR lists for small hand-checked cases, the rejection paths
 * (-ERANGE, -EINVAL, -ENOSPC, all with nothing written), prefix hits and
 * short sequences, src_end, the coalescing bound as a property over random
 * id lists, and kvp_plan_emit_bound() as an upper bound over random
 * requests.
 *
 * The hand-checked model: 1 layer, 2 KV heads, head dim 4, 2-byte elements,
 * 4-token blocks, 16 blocks per region, FLASH_HND: region 0 holds K and
 * region 1 holds V, a page is (2 heads, 4 tokens, 4 dims) = 64 bytes, so
 * block b starts at 64 * b and head h of it at 64 * b + 32 * h.
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

#define NB 16u
#define CAP 64u
#define HND KVP_KV_FLASH_HND

static struct kvp_model tiny(uint32_t heads)
{
	struct kvp_model m = { 0 };

	m.layers = 1;
	m.kv_heads = heads;
	m.head_dim = 4;
	m.dtype_bytes = 2;
	return m;
}

struct fix {
	kvp_layout *loc, *rem;
	kvp_plan *plan;
};

/* Consumer rank c of D pulling from P, with the given block sizes. */
static void fix_open_nb(struct fix *f, uint32_t heads, uint32_t P, uint32_t D,
			uint32_t c, uint32_t play, uint32_t clay,
			uint32_t pblock, uint32_t pkernel, uint32_t cblock,
			uint32_t max_sge, uint32_t nb)
{
	struct kvp_model m = tiny(heads);
	struct kvp_plan_attr attr = { .max_sge = max_sge };
	char msg[128] = "";
	int err;

	f->rem = kvt_build(&m, P, 0, pblock, pkernel, nb, play);
	f->loc = kvt_build(&m, D, c, cblock, 0, nb, clay);
	assert_non_null(f->rem);
	assert_non_null(f->loc);
	err = kvp_plan_compile(f->loc, f->rem, &attr, &f->plan, msg,
			       sizeof(msg));
	if (err)
		fail_msg("compile: %d %s", err, msg);
}

static void fix_open(struct fix *f, uint32_t heads, uint32_t P, uint32_t D,
		     uint32_t c, uint32_t play, uint32_t clay, uint32_t pblock,
		     uint32_t pkernel, uint32_t cblock, uint32_t max_sge)
{
	fix_open_nb(f, heads, P, D, c, play, clay, pblock, pkernel, cblock,
		    max_sge, NB);
}

static void fix_close(struct fix *f)
{
	kvp_plan_destroy(f->plan);
	kvp_layout_destroy(f->loc);
	kvp_layout_destroy(f->rem);
}

static struct kvp_ids mkids(const uint32_t *l, uint32_t nl, const uint32_t *r,
			    uint32_t nr, uint64_t tokens)
{
	struct kvp_ids ids;

	ids.local = l;
	ids.remote = r;
	ids.nlocal = nl;
	ids.nremote = nr;
	ids.tokens = tokens;
	return ids;
}

/* Output arrays prefilled with a canary. */
struct out {
	struct kvp_wr wr[CAP];
	struct kvp_sge sge[CAP];
	uint32_t src_end[16];
};

static void out_canary(struct out *o)
{
	memset(o, 0xa5, sizeof(*o));
}

static void out_untouched(const struct out *o)
{
	struct out c;

	out_canary(&c);
	assert_memory_equal(o, &c, sizeof(c));
}

static int emit(const struct fix *f, const struct kvp_ids *ids, struct out *o)
{
	out_canary(o);
	return kvp_plan_emit(f->plan, ids, o->wr, CAP, o->sge, CAP, o->src_end);
}

/* One expected WR: remote (offset, len, region, src) and its SGEs as
 * (offset, len) pairs in `region`'s local twin. */
static void expect_wr(const struct out *o, uint32_t i, uint64_t off,
		      uint32_t len, uint32_t region, uint32_t src,
		      uint32_t nsge, ...)
{
	const struct kvp_wr *w = &o->wr[i];
	uint32_t k, total = 0;
	va_list ap;

	if (w->offset != off || w->len != len || w->region != region ||
	    w->src != src || w->nsge != nsge || w->group != 0)
		fail_msg(
			"wr %u: got (off %llu len %u region %u src %u nsge %u group %u), want (%llu %u %u %u %u 0)",
			i, (unsigned long long)w->offset, w->len, w->region,
			w->src, w->nsge, w->group, (unsigned long long)off, len,
			region, src, nsge);
	va_start(ap, nsge);
	for (k = 0; k < nsge; k++) {
		const struct kvp_sge *s = &o->sge[w->sge_first + k];
		uint64_t so = va_arg(ap, uint64_t);
		uint32_t sl = va_arg(ap, uint32_t);

		if (s->offset != so || s->len != sl || s->region != region)
			fail_msg(
				"wr %u sge %u: got (off %llu len %u region %u), want (%llu %u %u)",
				i, k, (unsigned long long)s->offset, s->len,
				s->region, (unsigned long long)so, sl, region);
		total += s->len;
	}
	va_end(ap);
	assert_int_equal(total, w->len);
}

/* SGE lists are handed out in order: WR i's follow WR i-1's. */
static void sges_in_order(const struct out *o, int n)
{
	uint32_t next = 0;
	int i;

	for (i = 0; i < n; i++) {
		assert_int_equal(o->wr[i].sge_first, next);
		next += o->wr[i].nsge;
	}
}

#define S(off, len) (uint64_t)(off), (uint32_t)(len)

/* ---- exact WR lists ----------------------------------------------------- */

static void test_exact_p1_d1(void **state)
{
	static const uint32_t l345[] = { 3, 4, 5 }, r789[] = { 7, 8, 9 };
	static const uint32_t l357[] = { 3, 5, 7 }, r7911[] = { 7, 9, 11 };
	static const uint32_t r987[] = { 9, 8, 7 };
	struct kvp_ids ids;
	struct fix f;
	struct out o;
	int n;

	(void)state;
	fix_open(&f, 2, 1, 1, 0, HND, HND, 4, 0, 4, 1);
	/* contiguous on both sides: one WR per region */
	ids = mkids(l345, 3, r789, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 2);
	expect_wr(&o, 0, 448, 192, 0, 0, 1, S(192, 192));
	expect_wr(&o, 1, 448, 192, 1, 0, 1, S(192, 192));
	sges_in_order(&o, n);
	assert_int_equal(o.src_end[0], 2);
	assert_int_equal(o.src_end[1], 0xa5a5a5a5); /* nsrc entries only */
	/* contiguous on neither side: one WR per block and region */
	ids = mkids(l357, 3, r7911, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 6);
	expect_wr(&o, 0, 448, 64, 0, 0, 1, S(192, 64));
	expect_wr(&o, 1, 576, 64, 0, 0, 1, S(320, 64));
	expect_wr(&o, 2, 704, 64, 0, 0, 1, S(448, 64));
	expect_wr(&o, 3, 448, 64, 1, 0, 1, S(192, 64));
	expect_wr(&o, 4, 576, 64, 1, 0, 1, S(320, 64));
	expect_wr(&o, 5, 704, 64, 1, 0, 1, S(448, 64));
	sges_in_order(&o, n);
	/* remote contiguous, local not, max_sge 1: one WR per block */
	ids = mkids(l357, 3, r789, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 6);
	expect_wr(&o, 0, 448, 64, 0, 0, 1, S(192, 64));
	expect_wr(&o, 1, 512, 64, 0, 0, 1, S(320, 64));
	expect_wr(&o, 2, 576, 64, 0, 0, 1, S(448, 64));
	expect_wr(&o, 5, 576, 64, 1, 0, 1, S(448, 64));
	/* local contiguous, remote descending: nothing to coalesce */
	ids = mkids(l345, 3, r987, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 6);
	expect_wr(&o, 0, 576, 64, 0, 0, 1, S(192, 64));
	expect_wr(&o, 1, 512, 64, 0, 0, 1, S(256, 64));
	expect_wr(&o, 2, 448, 64, 0, 0, 1, S(320, 64));
	fix_close(&f);

	/* remote contiguous, local not, max_sge 4: one WR with 3 SGEs */
	fix_open(&f, 2, 1, 1, 0, HND, HND, 4, 0, 4, 4);
	ids = mkids(l357, 3, r789, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 2);
	expect_wr(&o, 0, 448, 192, 0, 0, 3, S(192, 64), S(320, 64), S(448, 64));
	expect_wr(&o, 1, 448, 192, 1, 0, 3, S(192, 64), S(320, 64), S(448, 64));
	sges_in_order(&o, n);
	/* both contiguous: still one SGE */
	ids = mkids(l345, 3, r789, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 2);
	expect_wr(&o, 0, 448, 192, 0, 0, 1, S(192, 192));
	ids = mkids(l345, 3, r987, 3, 0);
	assert_int_equal(emit(&f, &ids, &o), 6);
	fix_close(&f);

	/* max_sge 2: SGEs fill up, the third block opens a WR */
	fix_open(&f, 2, 1, 1, 0, HND, HND, 4, 0, 4, 2);
	ids = mkids(l357, 3, r789, 3, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 4);
	expect_wr(&o, 0, 448, 128, 0, 0, 2, S(192, 64), S(320, 64));
	expect_wr(&o, 1, 576, 64, 0, 0, 1, S(448, 64));
	expect_wr(&o, 2, 448, 128, 1, 0, 2, S(192, 64), S(320, 64));
	expect_wr(&o, 3, 576, 64, 1, 0, 1, S(448, 64));
	sges_in_order(&o, n);
	fix_close(&f);
}

static void test_exact_tp(void **state)
{
	static const uint32_t l34[] = { 3, 4 }, r78[] = { 7, 8 };
	struct kvp_ids ids = mkids(l34, 2, r78, 2, 0);
	struct fix f;
	struct out o;
	int n;

	(void)state;
	/* P=1 -> D=2: consumer 1 holds head 1, the upper half of each
	 * remote page; consecutive blocks are not contiguous remotely */
	fix_open(&f, 2, 1, 2, 1, HND, HND, 4, 0, 4, 4);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 4);
	expect_wr(&o, 0, 480, 32, 0, 0, 1, S(96, 32));
	expect_wr(&o, 1, 544, 32, 0, 0, 1, S(128, 32));
	expect_wr(&o, 2, 480, 32, 1, 0, 1, S(96, 32));
	expect_wr(&o, 3, 544, 32, 1, 0, 1, S(128, 32));
	assert_int_equal(kvp_plan_source(f.plan, 0), 0);
	fix_close(&f);
	fix_open(&f, 2, 1, 2, 0, HND, HND, 4, 0, 4, 4);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 4);
	expect_wr(&o, 0, 448, 32, 0, 0, 1, S(96, 32));
	expect_wr(&o, 1, 512, 32, 0, 0, 1, S(128, 32));
	fix_close(&f);

	/* P=2 -> D=1: producer r holds head r in 32-byte pages; WRs come
	 * out by source, K before V, src_end marks the boundary */
	fix_open(&f, 2, 2, 1, 0, HND, HND, 4, 0, 4, 1);
	assert_int_equal(kvp_plan_source(f.plan, 0), 0);
	assert_int_equal(kvp_plan_source(f.plan, 1), 1);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 8);
	expect_wr(&o, 0, 224, 32, 0, 0, 1, S(192, 32));
	expect_wr(&o, 1, 256, 32, 0, 0, 1, S(256, 32));
	expect_wr(&o, 2, 224, 32, 1, 0, 1, S(192, 32));
	expect_wr(&o, 3, 256, 32, 1, 0, 1, S(256, 32));
	expect_wr(&o, 4, 224, 32, 0, 1, 1, S(224, 32));
	expect_wr(&o, 5, 256, 32, 0, 1, 1, S(288, 32));
	expect_wr(&o, 6, 224, 32, 1, 1, 1, S(224, 32));
	expect_wr(&o, 7, 256, 32, 1, 1, 1, S(288, 32));
	assert_int_equal(o.src_end[0], 4);
	assert_int_equal(o.src_end[1], 8);
	assert_int_equal(o.src_end[2], 0xa5a5a5a5);
	/* a full hit: both sources end at 0 */
	ids.nlocal = 0;
	assert_int_equal(emit(&f, &ids, &o), 0);
	assert_int_equal(o.src_end[0], 0);
	assert_int_equal(o.src_end[1], 0);
	ids.nlocal = 2;
	fix_close(&f);
	fix_open(&f, 2, 2, 1, 0, HND, HND, 4, 0, 4, 2);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 4);
	expect_wr(&o, 0, 224, 64, 0, 0, 2, S(192, 32), S(256, 32));
	expect_wr(&o, 1, 224, 64, 1, 0, 2, S(192, 32), S(256, 32));
	expect_wr(&o, 2, 224, 64, 0, 1, 2, S(224, 32), S(288, 32));
	expect_wr(&o, 3, 224, 64, 1, 1, 2, S(224, 32), S(288, 32));
	sges_in_order(&o, n);
	assert_int_equal(o.src_end[0], 2);
	assert_int_equal(o.src_end[1], 4);
	fix_close(&f);
}

/*
 * Remote 8-token blocks (128-byte pages, head h at 64 h, token t at 8 t),
 * local 4-token blocks: remote block 5 feeds local blocks 2 and 3, head by
 * head. The remote range is one run; locally it is four pieces, so one READ
 * with four SGEs, in remote order.
 */
static void test_exact_block_ratio(void **state)
{
	static const uint32_t l23[] = { 2, 3 }, r5[] = { 5 };
	struct kvp_ids ids = mkids(l23, 2, r5, 1, 0);
	struct kvp_plan_group g;
	struct fix f;
	struct out o;
	int n;

	(void)state;
	fix_open(&f, 2, 1, 1, 0, HND, HND, 8, 0, 4, 4);
	assert_int_equal(kvp_plan_get_group(f.plan, 0, &g), 0);
	assert_int_equal(g.period_tokens, 8);
	assert_int_equal(g.local_per_period, 2);
	assert_int_equal(g.remote_per_period, 1);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 2);
	expect_wr(&o, 0, 640, 128, 0, 0, 4, S(128, 32), S(192, 32), S(160, 32),
		  S(224, 32));
	expect_wr(&o, 1, 640, 128, 1, 0, 4, S(128, 32), S(192, 32), S(160, 32),
		  S(224, 32));
	/* a hit of one local block: only the second half of remote 5 */
	ids = mkids(l23 + 1, 1, r5, 1, 0);
	n = emit(&f, &ids, &o);
	assert_int_equal(n, 4);
	expect_wr(&o, 0, 672, 32, 0, 0, 1, S(192, 32));
	expect_wr(&o, 1, 736, 32, 0, 0, 1, S(224, 32));
	/* 6 tokens: two local blocks, the second one partly filled */
	ids = mkids(l23, 2, r5, 1, 6);
	assert_int_equal(emit(&f, &ids, &o), 2);
	fix_close(&f);
}

/* ---- prefix hits and short sequences ----------------------------------- */

struct tail_case {
	uint32_t nl, tokens; /* local blocks read, sequence length (0: all) */
	uint32_t off, len;   /* remote range of each WR */
};

static void test_hits_and_tokens(void **state)
{
	static const uint32_t l[] = { 3, 4, 5, 6 }, r[] = { 7, 8, 9, 10 };
	static const struct tail_case tail[] = {
		{ 2, 0, 576, 128 },  /* remote 9 and 10 */
		{ 1, 0, 640, 64 },   /* remote 10 */
		{ 3, 9, 448, 192 },  /* 9 tokens in 4 remote blocks: 3 hold them */
		{ 2, 9, 512, 128 },
		{ 1, 12, 576, 64 },
		{ 4, 16, 448, 256 },
	};
	struct kvp_ids ids;
	uint32_t i;
	struct fix f;
	struct out o;

	(void)state;
	fix_open(&f, 2, 1, 1, 0, HND, HND, 4, 0, 4, 1);
	/* full prefix hit: nothing to read, nothing written but src_end */
	ids = mkids(l, 0, r, 4, 0);
	out_canary(&o);
	assert_int_equal(
		kvp_plan_emit(f.plan, &ids, o.wr, CAP, o.sge, CAP, NULL), 0);
	out_untouched(&o);
	assert_int_equal(kvp_plan_emit(f.plan, &ids, NULL, 0, NULL, 0, NULL),
			 0);
	ids = mkids(NULL, 0, NULL, 0, 0);
	assert_int_equal(emit(&f, &ids, &o), 0);
	assert_int_equal(o.src_end[0], 0);
	/* (local blocks, tokens) -> two WRs, K then V: the local blocks are
	 * the tail of the sequence */
	for (i = 0; i < sizeof(tail) / sizeof(tail[0]); i++) {
		const struct tail_case *t = &tail[i];

		ids = mkids(l, t->nl, r, 4, t->tokens);
		assert_int_equal(emit(&f, &ids, &o), 2);
		expect_wr(&o, 0, t->off, t->len, 0, 0, 1, S(192, t->len));
		/* V: the same ranges in region 1 */
		expect_wr(&o, 1, t->off, t->len, 1, 0, 1, S(192, t->len));
	}
	ids = mkids(l, 0, r, 4, 9);
	assert_int_equal(emit(&f, &ids, &o), 0);
	/* more local blocks than the tokens fill, or tokens past the
	 * remote blocks: -EINVAL, nothing written */
	ids = mkids(l, 4, r, 4, 9);
	assert_int_equal(emit(&f, &ids, &o), -EINVAL);
	out_untouched(&o);
	ids = mkids(l, 3, r, 2, 0);
	assert_int_equal(emit(&f, &ids, &o), -EINVAL);
	out_untouched(&o);
	ids = mkids(l, 1, r, 0, 0);
	assert_int_equal(emit(&f, &ids, &o), -EINVAL);
	out_untouched(&o);
	ids = mkids(l, 2, r, 4, 17);
	assert_int_equal(emit(&f, &ids, &o), -EINVAL);
	out_untouched(&o);
	ids = mkids(NULL, 2, r, 4, 0);
	assert_int_equal(emit(&f, &ids, &o), -EINVAL);
	out_untouched(&o);
	ids = mkids(l, 2, NULL, 4, 0);
	assert_int_equal(emit(&f, &ids, &o), -EINVAL);
	out_untouched(&o);
	fix_close(&f);
}

/* A full prefix hit with no local list at all (NULL, 0), the way a caller
 * with nothing to fill passes it: nothing read, no pointer made from the
 * NULL list, src_end still written. Equal block sizes (one block a period)
 * and 4 remote per 8 local tokens (several blocks a period); then the tail
 * of a prefix hit, where local block 0 pairs with a later remote block. */
static void test_full_hit_null_local(void **state)
{
	static const uint32_t r[] = { 7, 8, 9, 10 }, l[] = { 5 };
	static const uint32_t shape[][2] = { { 4, 4 }, { 4, 8 } };
	struct kvp_ids ids;
	struct fix f;
	struct out o;
	uint32_t i;
	int err;

	(void)state;
	for (i = 0; i < 2; i++) {
		fix_open(&f, 2, 1, 1, 0, HND, HND, shape[i][0], 0,
			 shape[i][1], 1);
		ids = mkids(NULL, 0, r, 4, 0);
		assert_int_equal(emit(&f, &ids, &o), 0);
		assert_int_equal(o.src_end[0], 0);
		out_canary(&o);
		assert_int_equal(kvp_plan_emit(f.plan, &ids, o.wr, CAP, o.sge,
					       CAP, NULL),
				 0);
		out_untouched(&o);
		assert_int_equal(kvp_plan_emit(f.plan, &ids, NULL, 0, NULL, 0,
					       NULL),
				 0);
		ids = mkids(NULL, 0, r, 4, 13);
		assert_int_equal(emit(&f, &ids, &o), 0);
		/* the last local block only: remote 10 (and 9 with 8-token
		 * local blocks, a head at a time), K and V */
		ids = mkids(l, 1, r, 4, 0);
		err = emit(&f, &ids, &o);
		assert_int_equal(err, i ? 8 : 2);
		assert_int_equal(o.src_end[0], err);
		assert_int_equal(o.wr[0].offset, i ? 9 * 64 : 10 * 64);
		assert_int_equal(o.sge[0].offset, 5 * 64 * (i + 1));
		fix_close(&f);
	}
}

/* A request of more than INT_MAX WRs: 4096 layers, K and V regions, one
 * piece per block each (8192 a period), 2^18 blocks. Refused before
 * anything is written, even with caps that would allow it (the arrays
 * here are far smaller: a write would be caught by ASan). */
static void test_count_overflow(void **state)
{
	struct kvp_model m = tiny(1);
	struct kvp_plan_attr attr = { .max_sge = 1 };
	const uint32_t n = 1u << 18;
	kvp_layout *lay;
	kvp_plan *plan;
	struct kvp_ids ids;
	struct out o;
	uint32_t *zeros, end = 0xdeadbeefu;

	(void)state;
	m.layers = KVP_MAX_LAYERS;
	lay = kvt_build(&m, 1, 0, 4, 0, 2, HND);
	assert_non_null(lay);
	assert_int_equal(kvp_plan_compile(lay, lay, &attr, &plan, NULL, 0), 0);
	zeros = calloc(n, sizeof(*zeros));
	assert_non_null(zeros);
	/* 2^31 - 8192 WRs still fit an int: the caps decide */
	ids = mkids(zeros, n - 1, zeros, n - 1, 0);
	out_canary(&o);
	assert_int_equal(kvp_plan_emit(plan, &ids, o.wr, CAP, o.sge, CAP,
				       &end),
			 -ENOSPC);
	ids = mkids(zeros, n, zeros, n, 0);
	assert_int_equal(kvp_plan_emit(plan, &ids, o.wr, UINT32_MAX, o.sge,
				       UINT32_MAX, &end),
			 -EOVERFLOW);
	assert_int_equal(kvp_plan_emit(plan, &ids, o.wr, CAP, o.sge, CAP,
				       &end),
			 -EOVERFLOW);
	out_untouched(&o);
	assert_int_equal(end, 0xdeadbeefu);
	free(zeros);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(lay);
}

/* num_blocks = 4294967295 is a legal size: block 0 and block 2^32 - 2 are
 * in range, 2^32 - 1 is not (the planner once used UINT32_MAX as "no view
 * yet", which turned every id out of range). */
static void test_max_blocks(void **state)
{
	struct kvp_model m = tiny(1);
	kvp_layout *lay;
	kvp_plan *plan;
	struct kvp_plan_group pg;
	uint32_t ids0[1] = { 0 }, top[1] = { UINT32_MAX - 1 },
		 past[1] = { UINT32_MAX };
	struct kvp_ids ids;
	struct out o;

	(void)state;
	lay = kvt_build(&m, 1, 0, 4, 0, UINT32_MAX, HND);
	assert_non_null(lay);
	assert_int_equal(kvp_plan_compile(lay, lay, NULL, &plan, NULL, 0), 0);
	assert_int_equal(kvp_plan_get_group(plan, 0, &pg), 0);
	assert_int_equal(pg.local_blocks, UINT32_MAX);
	assert_int_equal(pg.remote_blocks, UINT32_MAX);
	ids = mkids(ids0, 1, ids0, 1, 0);
	assert_true(kvp_plan_emit(plan, &ids, o.wr, CAP, o.sge, CAP, NULL) > 0);
	ids = mkids(top, 1, top, 1, 0);
	assert_true(kvp_plan_emit(plan, &ids, o.wr, CAP, o.sge, CAP, NULL) > 0);
	ids = mkids(past, 1, past, 1, 0);
	out_canary(&o);
	assert_int_equal(kvp_plan_emit(plan, &ids, o.wr, CAP, o.sge, CAP,
				       NULL),
			 -ERANGE);
	out_untouched(&o);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(lay);
}

/* ---- rejections --------------------------------------------------------- */

/* P=2 -> D=1, HND, max_sge 2 (see test_exact_tp): 4 WRs of 2 SGEs. */
static void test_rejects(void **state)
{
	uint32_t l[] = { 3, 4, 5 }, r[] = { 7, 8, 9 };
	struct kvp_ids ids = mkids(l, 2, r, 2, 0);
	struct fix f;
	struct out o;

	(void)state;
	fix_open(&f, 2, 2, 1, 0, HND, HND, 4, 0, 4, 2);
	assert_int_equal(emit(&f, &ids, &o), 4);
	/* -ERANGE: any id at or past num_blocks, on either side */
	l[1] = NB;
	assert_int_equal(emit(&f, &ids, &o), -ERANGE);
	out_untouched(&o);
	l[1] = UINT32_MAX;
	assert_int_equal(emit(&f, &ids, &o), -ERANGE);
	out_untouched(&o);
	l[1] = NB - 1; /* locally scattered already: still 4 WRs */
	assert_int_equal(emit(&f, &ids, &o), 4);
	expect_wr(&o, 0, 224, 64, 0, 0, 2, S(192, 32), S(960, 32));
	r[0] = NB;
	assert_int_equal(emit(&f, &ids, &o), -ERANGE);
	out_untouched(&o);
	r[0] = 7;
	/* ... including a remote id past the sequence's last token */
	r[2] = NB + 5;
	ids = mkids(l, 2, r, 3, 8);
	assert_int_equal(emit(&f, &ids, &o), -ERANGE);
	out_untouched(&o);
	r[2] = 9;
	assert_int_equal(emit(&f, &ids, &o), 4);
	l[1] = 4;
	ids = mkids(l, 2, r, 2, 0);

	/* -EINVAL: arguments */
	out_canary(&o);
	assert_int_equal(
		kvp_plan_emit(NULL, &ids, o.wr, CAP, o.sge, CAP, o.src_end),
		-EINVAL);
	assert_int_equal(
		kvp_plan_emit(f.plan, NULL, o.wr, CAP, o.sge, CAP, o.src_end),
		-EINVAL);
	assert_int_equal(
		kvp_plan_emit(f.plan, &ids, NULL, CAP, o.sge, CAP, o.src_end),
		-EINVAL);
	assert_int_equal(
		kvp_plan_emit(f.plan, &ids, o.wr, CAP, NULL, CAP, o.src_end),
		-EINVAL);
	out_untouched(&o);

	/* -ENOSPC below the request's bound: one WR and one SGE per piece
	 * per period walked, before coalescing (here 2 sources x 2 regions x
	 * 2 blocks = 8), with nothing written, src_end included */
	{
		static const uint32_t caps[][2] = { { 7, 8 },  { 8, 7 },
						    { 4, 8 },  { 1, 16 },
						    { 3, 16 }, { 64, 1 },
						    { 64, 3 }, { 0, 0 } };
		uint32_t k;

		out_canary(&o);
		assert_int_equal(kvp_plan_emit(f.plan, &ids, o.wr, 8, o.sge, 8,
					       o.src_end),
				 4);
		assert_int_equal(o.src_end[1], 4);
		for (k = 0; k < sizeof(caps) / sizeof(caps[0]); k++) {
			out_canary(&o);
			if (kvp_plan_emit(f.plan, &ids, o.wr, caps[k][0], o.sge,
					  caps[k][1], o.src_end) != -ENOSPC)
				fail_msg("caps %u/%u: want -ENOSPC", caps[k][0],
					 caps[k][1]);
			out_untouched(&o);
		}
		assert_int_equal(
			kvp_plan_emit(f.plan, &ids, NULL, 0, NULL, 0, NULL),
			-ENOSPC);
	}
	fix_close(&f);
}

/* ---- the coalescing bound ----------------------------------------------- */

/*
 * What a READ can cover: one contiguous remote range of one region of one
 * source, scattered into at most max_sge local ranges. Walk the pieces a
 * request reads in emission order (streams in plan order, periods, the
 * stream's piece templates), each as (src, remote region, remote offset,
 * local region, local offset, len), computed from the plan's public
 * inspection and the layouts' views, not from kvp_plan_emit():
 *
 *  - a *remote run* is a maximal sequence of consecutive pieces that are
 *    contiguous on the remote side (same source and region, next offset);
 *  - inside it, a *fragment* is a maximal sequence that is contiguous on the
 *    local side too.
 *
 * No WR can span two remote runs, and a WR holds at most max_sge fragments
 * (a fragment split across SGEs only costs more), so a remote run of F
 * fragments needs ceil(F / max_sge) WRs and that many suffice. The bound:
 *
 *     nwr == sum over remote runs of ceil(F / max_sge)
 *
 * i.e. emission is optimal for the plan's pieces. It implies
 * R_remote <= nwr <= R_both, with R_both the number of fragments (= nwr at
 * max_sge 1) and R_remote the number of remote runs (= nwr once max_sge
 * reaches the largest F).
 *
 * At the block-id level, when every stream reads whole pages on both sides
 * (same layout, block size and shard on both sides: P == D), a piece is a
 * page and, with S streams and the read positions of the id lists:
 *
 *     nwr <= S * (maximal runs where local AND remote ids are consecutive)
 *     nwr == S * (maximal runs where remote ids are consecutive)
 *            when max_sge >= the longest such run.
 */
struct inst {
	uint32_t src, rreg, lreg, len;
	uint64_t roff, loff;
};

struct bound {
	uint32_t nwr, nsge, runs, frags;
};

/* A piece of a stream, placed: for walking a gather in remote order. */
struct gp {
	struct kvp_plan_piece p;
	struct kvp_view_desc lv, rv;
	uint32_t src, rreg, lreg;
};

static int gp_cmp(const void *x, const void *y)
{
	const struct gp *a = x, *b = y;
	uint64_t ra = a->rv.offset + a->p.remote_offset;
	uint64_t rb = b->rv.offset + b->p.remote_offset;

	if (a->p.remote_block != b->p.remote_block)
		return a->p.remote_block < b->p.remote_block ? -1 : 1;
	return ra < rb ? -1 : ra > rb;
}

/*
 * The pieces the request reads, in emission's order: stream by stream,
 * period by period, except that a gather (kvp_plan_stream_gather()) is
 * walked as one, each period's pieces of all its streams in remote order.
 */
static uint32_t instances(const struct fix *f, const struct kvp_ids *ids,
			  struct inst *out, uint32_t cap)
{
	struct kvp_plan_info pi;
	struct kvp_plan_group g;
	static struct gp gp[4096];
	uint32_t si, n = 0, ng;

	kvp_plan_get_info(f->plan, &pi);
	assert_int_equal(kvp_plan_get_group(f->plan, 0, &g), 0);
	for (si = 0; si < pi.nstreams; si += ng) {
		uint64_t tokens, nl, skip, rend, k, k0, k1;
		uint32_t q, m, np = 0;
		int gn = kvp_plan_stream_gather(f->plan, si);

		assert_true(gn >= 1 && si + (uint32_t)gn <= pi.nstreams);
		ng = (uint32_t)gn;
		for (m = 0; m < ng; m++) {
			struct kvp_plan_stream st;
			struct kvp_view_desc lv, rv;

			assert_int_equal(kvp_plan_get_stream(f->plan, si + m,
							     &st),
					 0);
			assert_int_equal(kvp_plan_stream_gather(f->plan,
								si + m),
					 m ? 0 : gn);
			assert_int_equal(kvp_layout_get_view(f->loc,
							     st.local_view, &lv),
					 0);
			assert_int_equal(kvp_layout_get_view(f->rem,
							     st.remote_view,
							     &rv),
					 0);
			assert_int_equal(lv.region, st.local_region);
			assert_int_equal(rv.region, st.remote_region);
			for (q = 0; q < st.npieces; q++, np++) {
				assert_true(np < 4096);
				assert_int_equal(
					kvp_plan_get_piece(f->plan,
							   st.piece_first + q,
							   &gp[np].p),
					0);
				gp[np].lv = lv;
				gp[np].rv = rv;
				gp[np].src = st.src;
				gp[np].rreg = st.remote_region;
				gp[np].lreg = st.local_region;
			}
		}
		if (ng > 1)
			qsort(gp, np, sizeof(*gp), gp_cmp);
		tokens = ids->tokens ? ids->tokens
				     : (uint64_t)ids->nremote * g.remote_tokens;
		nl = (tokens + g.local_tokens - 1) / g.local_tokens;
		rend = (tokens + g.remote_tokens - 1) / g.remote_tokens;
		skip = nl - ids->nlocal;
		k0 = skip / g.local_per_period;
		k1 = (nl + g.local_per_period - 1) / g.local_per_period;
		for (k = k0; ids->nlocal && k < k1; k++) {
			for (q = 0; q < np; q++) {
				const struct kvp_plan_piece *p = &gp[q].p;
				uint64_t L, R;

				L = k * g.local_per_period + p->local_block;
				R = k * g.remote_per_period + p->remote_block;
				if (L < skip || L >= nl || R >= rend)
					continue;
				assert_true(n < cap);
				out[n].src = gp[q].src;
				out[n].rreg = gp[q].rreg;
				out[n].lreg = gp[q].lreg;
				out[n].len = p->len;
				out[n].roff = gp[q].rv.offset +
					      (uint64_t)ids->remote[R] *
						      gp[q].rv.stride +
					      p->remote_offset;
				out[n].loff = gp[q].lv.offset +
					      (uint64_t)ids->local[L - skip] *
						      gp[q].lv.stride +
					      p->local_offset;
				n++;
			}
		}
	}
	return n;
}

static struct bound bound_of(const struct inst *x, uint32_t n, uint32_t max_sge)
{
	struct bound b = { 0 };
	uint32_t i, f = 0;

	for (i = 0; i <= n; i++) {
		int remote_next = i > 0 && i < n && x[i].src == x[i - 1].src &&
				  x[i].rreg == x[i - 1].rreg &&
				  x[i].roff == x[i - 1].roff + x[i - 1].len;
		int local_next = remote_next && x[i].lreg == x[i - 1].lreg &&
				 x[i].loff == x[i - 1].loff + x[i - 1].len;

		if (i > 0 && !remote_next) { /* a remote run ends */
			b.nwr += (f + max_sge - 1) / max_sge;
			b.runs++;
			f = 0;
		}
		if (i < n && !local_next) {
			f++;
			b.frags++;
		}
	}
	b.nsge = b.frags;
	return b;
}

/* Distinct random ids below `bound` (> 4 * n + bound / 4) with runs: most
 * steps continue both lists, some continue one side only, the rest jump;
 * a few adjacent remote ids are then swapped (descending pairs). */
static void run_ids(uint64_t *seed, uint32_t *l, uint32_t *r, uint32_t n,
		    uint32_t bound)
{
	uint32_t i, t;

	l[0] = (uint32_t)(kvt_rand(seed) % (bound / 4));
	r[0] = (uint32_t)(kvt_rand(seed) % (bound / 4));
	for (i = 1; i < n; i++) {
		uint32_t c = (uint32_t)(kvt_rand(seed) % 20);
		uint32_t jl = 2 + (uint32_t)(kvt_rand(seed) % 3);
		uint32_t jr = 2 + (uint32_t)(kvt_rand(seed) % 3);

		l[i] = l[i - 1] + (c < 14 ? 1 : jl);
		r[i] = r[i - 1] + (c < 12 || c >= 16 ? 1 : jr);
	}
	for (t = 0; n > 1 && t < 2; t++) {
		i = (uint32_t)(kvt_rand(seed) % (n - 1));
		if (kvt_rand(seed) & 1) {
			uint32_t x = r[i];

			r[i] = r[i + 1];
			r[i + 1] = x;
		}
	}
}

/* Runs of read positions where the remote (and local, if both) ids step
 * by one. */
static uint32_t id_runs(const struct kvp_ids *ids, uint32_t skip, uint32_t end,
			int both)
{
	uint32_t k, runs = 0;

	for (k = skip; k < end; k++) {
		int cont = k > skip &&
			   ids->remote[k] == ids->remote[k - 1] + 1 &&
			   (!both || ids->local[k - skip] ==
					     ids->local[k - skip - 1] + 1);

		runs += !cont;
	}
	return runs;
}

/* The bound is relative to the plan's pieces: check that no two pieces of
 * a stream that are adjacent in remote order could have been one. */
static void pieces_merged(const kvp_plan *p)
{
	struct kvp_plan_info pi;
	uint32_t i, k;

	kvp_plan_get_info(p, &pi);
	for (i = 0; i < pi.nstreams; i++) {
		struct kvp_plan_stream st;
		struct kvp_plan_piece a, b;

		assert_int_equal(kvp_plan_get_stream(p, i, &st), 0);
		assert_true(st.npieces >= 1);
		for (k = 1; k < st.npieces; k++) {
			assert_int_equal(kvp_plan_get_piece(
						 p, st.piece_first + k - 1, &a),
					 0);
			assert_int_equal(
				kvp_plan_get_piece(p, st.piece_first + k, &b),
				0);
			assert_false(a.remote_block == b.remote_block &&
				     a.local_block == b.local_block &&
				     a.remote_offset + a.len ==
					     b.remote_offset &&
				     a.local_offset + a.len == b.local_offset);
		}
	}
}

struct cfg {
	uint32_t heads, P, D, c, play, clay, pblock, pkernel, cblock;
	int whole_pages;
};

static const struct cfg cfgs[] = {
	/* whole pages on both sides */
	{ 2, 1, 1, 0, KVP_KV_FLASH_HND, KVP_KV_FLASH_HND, 4, 0, 4, 1 },
	{ 2, 1, 1, 0, KVP_KV_FLASH_NHD, KVP_KV_FLASH_NHD, 4, 0, 4, 1 },
	{ 2, 1, 1, 0, KVP_KV_FLASHINFER, KVP_KV_FLASHINFER, 4, 0, 4, 1 },
	{ 2, 1, 1, 0, KVP_KV_PACKED, KVP_KV_PACKED, 4, 0, 4, 1 },
	{ 4, 2, 2, 1, KVP_KV_FLASH_NHD, KVP_KV_FLASH_NHD, 4, 0, 4, 1 },
	{ 4, 4, 4, 2, KVP_KV_PACKED, KVP_KV_PACKED, 4, 0, 4, 1 },
	{ 1, 2, 2, 1, KVP_KV_FLASHINFER, KVP_KV_FLASHINFER, 4, 0, 4, 1 },
	/* sub-page pieces: TP splits, layout conversions, block ratios */
	{ 2, 1, 2, 1, KVP_KV_FLASH_HND, KVP_KV_FLASH_HND, 4, 0, 4, 0 },
	{ 2, 2, 1, 0, KVP_KV_FLASH_HND, KVP_KV_FLASH_HND, 4, 0, 4, 0 },
	{ 4, 4, 1, 0, KVP_KV_FLASH_NHD, KVP_KV_FLASHINFER, 4, 0, 4, 0 },
	{ 2, 1, 1, 0, KVP_KV_FLASH_NHD, KVP_KV_FLASH_HND, 4, 0, 4, 0 },
	{ 2, 1, 1, 0, KVP_KV_PACKED, KVP_KV_FLASH_NHD, 4, 0, 4, 0 },
	{ 2, 1, 1, 0, KVP_KV_FLASH_HND, KVP_KV_FLASH_HND, 8, 0, 4, 0 },
	{ 2, 1, 1, 0, KVP_KV_FLASH_HND, KVP_KV_FLASH_HND, 4, 0, 8, 0 },
	{ 2, 2, 1, 0, KVP_KV_FLASH_NHD, KVP_KV_FLASH_HND, 8, 4, 4, 0 },
	{ 8, 2, 4, 3, KVP_KV_FLASHINFER, KVP_KV_PACKED, 4, 0, 8, 0 },
	{ 2, 4, 8, 5, KVP_KV_FLASH_HND, KVP_KV_FLASH_NHD, 8, 4, 8, 0 },
};

#define NCFG (sizeof(cfgs) / sizeof(cfgs[0]))
#define MAXN 24u
#define NBP 128u /* blocks per region in the property tests */

/* One whole-page piece per stream: the block-level bound applies. */
static void whole_page_pieces(const struct fix *f)
{
	struct kvp_plan_info pi;
	uint32_t i;

	kvp_plan_get_info(f->plan, &pi);
	for (i = 0; i < pi.nstreams; i++) {
		struct kvp_plan_stream st;
		struct kvp_plan_piece p;
		struct kvp_view_desc lv, rv;

		assert_int_equal(kvp_plan_get_stream(f->plan, i, &st), 0);
		assert_int_equal(st.npieces, 1);
		assert_int_equal(
			kvp_plan_get_piece(f->plan, st.piece_first, &p), 0);
		assert_int_equal(
			kvp_layout_get_view(f->loc, st.local_view, &lv), 0);
		assert_int_equal(
			kvp_layout_get_view(f->rem, st.remote_view, &rv), 0);
		assert_true(p.remote_offset == 0 && p.local_offset == 0 &&
			    p.len == lv.stride && p.len == rv.stride);
	}
}

/* A random request of at most MAXN ids a side: a sequence of 1..MAXN
 * remote blocks (0.. when `empty`), the last one maybe partly filled, the
 * tail read locally (all of it when `no_hit`). Returns the local blocks
 * the sequence spans. */
static uint32_t random_request(uint64_t *seed, const struct kvp_plan_group *g,
			       int empty, int no_hit, uint32_t *l, uint32_t *r,
			       struct kvp_ids *ids)
{
	uint32_t nr = MAXN, nl, nread;
	uint64_t tokens;

	if (g->remote_tokens > g->local_tokens)
		nr = MAXN * g->local_tokens / g->remote_tokens;
	nr = empty ? (uint32_t)(kvt_rand(seed) % (nr + 1))
		   : 1 + (uint32_t)(kvt_rand(seed) % nr);
	tokens = (uint64_t)nr * g->remote_tokens;
	if (nr && (kvt_rand(seed) & 1))
		tokens -= kvt_rand(seed) % g->remote_tokens;
	nl = (uint32_t)((tokens + g->local_tokens - 1) / g->local_tokens);
	assert_true(nl <= MAXN);
	nread = no_hit ? nl : (uint32_t)(kvt_rand(seed) % (nl + 1));
	*ids = mkids(l, nread, r, nr, tokens);
	return nl;
}

/* The request's bound of the header: one WR and one SGE per piece
 * template per period the request walks. */
static uint32_t request_bound(const struct fix *f, const struct kvp_ids *ids)
{
	struct kvp_plan_info pi;
	struct kvp_plan_group g;
	uint64_t tokens, nl, rend, skip, periods;
	uint32_t i, n = 0;

	kvp_plan_get_info(f->plan, &pi);
	assert_int_equal(kvp_plan_get_group(f->plan, 0, &g), 0);
	tokens = ids->tokens ? ids->tokens
			     : (uint64_t)ids->nremote * g.remote_tokens;
	nl = (tokens + g.local_tokens - 1) / g.local_tokens;
	rend = (tokens + g.remote_tokens - 1) / g.remote_tokens;
	skip = nl - ids->nlocal;
	if (g.local_per_period == 1 && g.remote_per_period == 1)
		periods = (nl < rend ? nl : rend) - skip;
	else if (!ids->nlocal)
		periods = 0;
	else
		periods = (nl + g.local_per_period - 1) / g.local_per_period -
			  skip / g.local_per_period;
	for (i = 0; i < pi.nstreams; i++) {
		struct kvp_plan_stream st;

		assert_int_equal(kvp_plan_get_stream(f->plan, i, &st), 0);
		n += st.npieces * (uint32_t)periods;
	}
	return n;
}

static int all_a5(const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n--)
		if (*b++ != 0xa5)
			return 0;
	return 1;
}

/* Caps one below the request's bound, WRs or SGEs: -ENOSPC, and the first
 * entries and src_end untouched. */
static void below_bound(const struct fix *f, const struct kvp_ids *ids,
			uint32_t bound, struct kvp_wr *wr, struct kvp_sge *sge,
			uint32_t cap)
{
	uint32_t src_end[16], side;

	assert_true(bound >= 1);
	for (side = 0; side < 2; side++) {
		memset(wr, 0xa5, 4 * sizeof(*wr));
		memset(sge, 0xa5, 4 * sizeof(*sge));
		memset(src_end, 0xa5, sizeof(src_end));
		assert_int_equal(kvp_plan_emit(f->plan, ids, wr,
					       side ? cap : bound - 1, sge,
					       side ? bound - 1 : cap, src_end),
				 -ENOSPC);
		assert_true(all_a5(wr, 4 * sizeof(*wr)));
		assert_true(all_a5(sge, 4 * sizeof(*sge)));
		assert_true(all_a5(src_end, sizeof(src_end)));
	}
}

/* WRs come out by source; src_end[s] is one past source s's last WR;
 * nothing past nsrc entries is written; SGE lists follow WR order. */
static void check_order(const struct kvp_wr *wr, uint32_t n,
			const uint32_t *src_end, uint32_t nsrc)
{
	uint32_t k, next = 0;

	for (k = 0; k < n; k++) {
		uint32_t s = wr[k].src;

		assert_true(s < nsrc);
		assert_true(k < src_end[s]);
		assert_true(s == 0 || k >= src_end[s - 1]);
		assert_true(k == 0 || s >= wr[k - 1].src);
		assert_int_equal(wr[k].sge_first, next);
		next += wr[k].nsge;
	}
	for (k = 0; k < nsrc; k++)
		assert_true(src_end[k] <= n &&
			    (k == 0 || src_end[k] >= src_end[k - 1]));
	assert_true(nsrc == 0 || src_end[nsrc - 1] == n);
	assert_int_equal(src_end[nsrc], 0xffffffffu);
}

/* Runs the request through the memcpy executor; returns its WR count. */
static uint32_t execute(const struct fix *f, const struct cfg *c,
			uint32_t max_sge, const struct kvp_ids *ids)
{
	struct kvp_model m = tiny(c->heads);
	kvp_layout *rem[8];
	uint32_t r, n = 0;

	for (r = 0; r < c->P; r++)
		assert_non_null(rem[r] = kvt_build(&m, c->P, r, c->pblock,
						   c->pkernel, NBP, c->play));
	if (kvt_check_pull(f->loc, rem, max_sge, ids, &n, NULL))
		fail_msg("identity check failed");
	for (r = 0; r < c->P; r++)
		kvp_layout_destroy(rem[r]);
	return n;
}

#define WCAP (4 * MAXN * 16)

/*
 * 17 plans x 4 max_sge x 150 random id lists = 10200 emissions, each one
 * checked against the bound above, for source order, src_end and SGE
 * order, and against the header's per-request capacity rule (caps of one
 * WR and one SGE per piece per period walked suffice; one less in either
 * gives -ENOSPC with nothing written); one in ten (for P <= 4) also runs
 * through the memcpy executor, so the lists counted are right too.
 */
static void test_coalescing_bound(void **state)
{
	static const uint32_t sges[] = { 1, 2, 3, 64 };
	static struct kvp_wr wr[WCAP];
	static struct kvp_sge sge[WCAP];
	static struct inst inst[WCAP];
	uint32_t l[MAXN], r[MAXN], src_end[16];
	uint64_t seed = 7;
	uint32_t ci, t, cases = 0, checked = 0, merged = 0;

	(void)state;
	for (ci = 0; ci < NCFG * 4; ci++) {
		const struct cfg *c = &cfgs[ci / 4];
		uint32_t ms = sges[ci % 4];
		struct kvp_plan_info pi;
		struct kvp_plan_group g;
		struct fix f;

		fix_open_nb(&f, c->heads, c->P, c->D, c->c, c->play, c->clay,
			    c->pblock, c->pkernel, c->cblock, ms, NBP);
		kvp_plan_get_info(f.plan, &pi);
		assert_int_equal(kvp_plan_get_group(f.plan, 0, &g), 0);
		pieces_merged(f.plan);
		if (c->whole_pages)
			whole_page_pieces(&f);
		for (t = 0; t < 150; t++) {
			struct kvp_ids ids;
			struct bound b;
			uint32_t n, nl, k, bound, nsge = 0;
			int got;

			nl = random_request(&seed, &g, 0, t % 3 == 0, l, r,
					    &ids);
			run_ids(&seed, l, r, MAXN, NBP);
			memset(src_end, 0xff, sizeof(src_end));
			got = kvp_plan_emit(f.plan, &ids, wr, WCAP, sge, WCAP,
					    src_end);
			assert_true(got >= 0);
			n = (uint32_t)got;
			b = bound_of(inst, instances(&f, &ids, inst, WCAP), ms);
			for (k = 0; k < n; k++)
				nsge += wr[k].nsge;
			if (n != b.nwr || nsge != b.nsge)
				fail_msg(
					"cfg %u max_sge %u ids %u/%u tokens %llu: %u WRs %u SGEs, optimal %u WRs %u SGEs (%u remote runs)",
					ci / 4, ms, ids.nlocal, ids.nremote,
					(unsigned long long)ids.tokens, n, nsge,
					b.nwr, b.nsge, b.runs);
			assert_true(b.runs <= n && n <= b.frags);
			assert_true(ms > 1 || n == b.frags);
			merged += b.frags - n;
			if (c->whole_pages && ids.nlocal) {
				uint32_t skip = nl - ids.nlocal;
				uint32_t both = id_runs(&ids, skip, nl, 1);
				uint32_t rem = id_runs(&ids, skip, nl, 0);

				assert_true(n <= pi.nstreams * both);
				assert_true(ms > 1 || n == pi.nstreams * both);
				assert_true(ms < ids.nlocal ||
					    n == pi.nstreams * rem);
			}
			check_order(wr, n, src_end, pi.nsrc);
			/* the request's bound: enough, and one less is not */
			bound = request_bound(&f, &ids);
			assert_true(b.frags <= bound);
			assert_int_equal(kvp_plan_emit(f.plan, &ids, wr, bound,
						       sge, bound, NULL),
					 (int)n);
			if (bound)
				below_bound(&f, &ids, bound, wr, sge, WCAP);
			cases++;
			if (t % 10 == 0 && c->P <= 4) {
				assert_int_equal(execute(&f, c, ms, &ids), n);
				checked++;
			}
		}
		fix_close(&f);
	}
	print_message(
		"coalescing bound: %u emissions at the optimum (%u pieces merged away), %u of them also executed byte for byte\n",
		cases, merged, checked);
	assert_int_equal(cases, NCFG * 4 * 150);
}

/* ---- kvp_plan_emit_bound ------------------------------------------------- */

/* 17 plans x 4 max_sge x 100 random requests (random or run-shaped ids,
 * random hits and sequence lengths, empty ones too): emitting into arrays
 * of exactly the bound's size never fails, and the bound holds. */
static void test_emit_bound(void **state)
{
	static const uint32_t sges[] = { 1, 2, 4, 64 };
	uint32_t l[MAXN], r[MAXN];
	uint64_t seed = 99;
	uint32_t ci, t, cases = 0, tight = 0;

	(void)state;
	for (ci = 0; ci < NCFG * 4; ci++) {
		const struct cfg *c = &cfgs[ci / 4];
		uint32_t ms = sges[ci % 4];
		struct kvp_plan_group g;
		struct fix f;

		fix_open_nb(&f, c->heads, c->P, c->D, c->c, c->play, c->clay,
			    c->pblock, c->pkernel, c->cblock, ms, NBP);
		assert_int_equal(kvp_plan_get_group(f.plan, 0, &g), 0);
		for (t = 0; t < 100; t++) {
			uint32_t maxw, maxs, k, nsge = 0;
			struct kvp_wr *wr;
			struct kvp_sge *sge;
			struct kvp_ids ids;
			int n;

			random_request(&seed, &g, 1, 0, l, r, &ids);
			if (t & 1) {
				run_ids(&seed, l, r, MAXN, NBP);
			} else {
				kvt_random_ids(&seed, l, MAXN, NBP);
				kvt_random_ids(&seed, r, MAXN, NBP);
			}
			kvp_plan_emit_bound(f.plan,
					    ids.nlocal > ids.nremote
						    ? ids.nlocal
						    : ids.nremote,
					    &maxw, &maxs);
			wr = malloc((maxw + 1) * sizeof(*wr));
			sge = malloc((maxs + 1) * sizeof(*sge));
			assert_non_null(wr);
			assert_non_null(sge);
			n = kvp_plan_emit(f.plan, &ids, wr, maxw, sge, maxs,
					  NULL);
			if (n < 0)
				fail_msg(
					"cfg %u max_sge %u ids %u/%u: %d with the bound's caps %u/%u",
					ci / 4, ms, ids.nlocal, ids.nremote, n,
					maxw, maxs);
			for (k = 0; k < (uint32_t)n; k++)
				nsge += wr[k].nsge;
			assert_true((uint32_t)n <= maxw && nsge <= maxs);
			assert_true(request_bound(&f, &ids) <= maxw &&
				    request_bound(&f, &ids) <= maxs);
			tight += (uint32_t)n == maxw;
			free(wr);
			free(sge);
			cases++;
		}
		fix_close(&f);
	}
	print_message(
		"emit bound: %u random requests within the bound (%u at it)\n",
		cases, tight);
	assert_int_equal(cases, NCFG * 4 * 100);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_exact_p1_d1),
		cmocka_unit_test(test_exact_tp),
		cmocka_unit_test(test_exact_block_ratio),
		cmocka_unit_test(test_hits_and_tokens),
		cmocka_unit_test(test_full_hit_null_local),
		cmocka_unit_test(test_count_overflow),
		cmocka_unit_test(test_max_blocks),
		cmocka_unit_test(test_rejects),
		cmocka_unit_test(test_coalescing_bound),
		cmocka_unit_test(test_emit_bound),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
