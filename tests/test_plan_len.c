// SPDX-License-Identifier: MIT
/*
 * The READ length cap (kvp_plan_attr.max_len): exact WR lists for caps of
 * 4 KiB, 1 KiB and 100 bytes on whole-page pieces that span several caps and
 * on small pieces that coalesce up to a cap; the attribute's rejection paths
 * and its comp_mask gating; and, over layout pairs built from presets, the
 * identity contract executed with memcpy under caps of 100 bytes to 64 KiB
 * (no READ longer than the cap, every requested byte written once, the WR
 * and SGE counts within kvp_plan_emit_bound()). And the benchmark aid
 * KVP_PLAN_NO_COALESCE: one READ per piece template per period.
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

#define HND KVP_KV_FLASH_HND
#define NHD KVP_KV_FLASH_NHD
#define FI KVP_KV_FLASHINFER
#define PK KVP_KV_PACKED

static kvp_layout *parse(const char *spec)
{
	kvp_layout *l = NULL;
	char msg[160] = "";
	int err = kvp_layout_parse(spec, strlen(spec), &l, msg, sizeof(msg));

	if (err)
		fail_msg("parse: %d %s", err, msg);
	return l;
}

static kvp_plan *compile_len(const kvp_layout *loc, const kvp_layout *rem,
			     uint32_t max_sge, uint32_t max_len)
{
	struct kvp_plan_attr a = { .max_sge = max_sge };
	kvp_plan *p = NULL;
	char msg[160] = "";
	int err;

	if (max_len) {
		a.comp_mask = KVP_PLAN_ATTR_MAX_LEN;
		a.max_len = max_len;
	}
	err = kvp_plan_compile(loc, rem, &a, &p, msg, sizeof(msg));
	if (err)
		fail_msg("compile: %d %s", err, msg);
	return p;
}

/* One field of 16 tokens x 320 dims x 2 bytes: a 10 KiB page, one piece. */
static const char big_page[] =
	"engine tp_size=1\n"
	"group kind=full block_tokens=16\n"
	"region size=160K\n"
	"view group=0 region=0 layer=0 num_blocks=16 offset=0 stride=10K\n"
	"field view=0 kind=k elem=2 dims=token:16:640,dim:320:2\n";

/* 4 tokens x 125 dims x 2 bytes: a 1000-byte page. */
static const char small_page[] =
	"engine tp_size=1\n"
	"group kind=full block_tokens=4\n"
	"region size=16000\n"
	"view group=0 region=0 layer=0 num_blocks=16 offset=0 stride=1000\n"
	"field view=0 kind=k elem=2 dims=token:4:250,dim:125:2\n";

struct emitted {
	struct kvp_wr wr[512];
	struct kvp_sge sge[512];
	int n;
};

static void emit_all(const kvp_plan *p, const uint32_t *l, const uint32_t *r,
		     uint32_t n, struct emitted *e)
{
	struct kvp_ids ids = { l, r, n, n, 0 };

	e->n = kvp_plan_emit(p, &ids, e->wr, 512, e->sge, 512, NULL);
	assert_true(e->n >= 0);
}

/* WR i reads `len` bytes at remote `off` into nsge local SGEs whose
 * offsets follow; all lengths but the SGE count are checked. */
static void wr_is(const struct emitted *e, int i, uint64_t off, uint32_t len,
		  uint32_t nsge, ...)
{
	const struct kvp_wr *w = &e->wr[i];
	uint64_t sum = 0;
	uint32_t k;
	va_list ap;

	if (w->offset != off || w->len != len || w->nsge != nsge)
		fail_msg("wr %d: (%llu %u nsge %u), want (%llu %u %u)", i,
			 (unsigned long long)w->offset, w->len, w->nsge,
			 (unsigned long long)off, len, nsge);
	va_start(ap, nsge);
	for (k = 0; k < nsge; k++) {
		const struct kvp_sge *s = &e->sge[w->sge_first + k];
		uint64_t so = va_arg(ap, uint64_t);

		if (s->offset != so)
			fail_msg("wr %d sge %u: offset %llu, want %llu", i, k,
				 (unsigned long long)s->offset,
				 (unsigned long long)so);
		sum += s->len;
	}
	va_end(ap);
	assert_int_equal(sum, len);
}

/* A 10 KiB page piece is cut into max_len chunks; a READ never continues
 * across the page edge once it would pass the cap. */
static void test_exact_big_pieces(void **state)
{
	static const uint32_t ids[] = { 0, 1 };
	static const struct {
		uint32_t cap, per_page, last;
	} c[] = { { 4096, 3, 2048 }, { 1024, 10, 1024 }, { 100, 103, 40 } };
	kvp_layout *lay = parse(big_page);
	struct kvp_plan_info pi;
	struct emitted e;
	uint32_t i, b, k;

	(void)state;
	for (i = 0; i < 3; i++) {
		kvp_plan *p = compile_len(lay, lay, 4, c[i].cap);

		kvp_plan_get_info(p, &pi);
		assert_int_equal(pi.max_len, c[i].cap);
		assert_int_equal(pi.npieces, c[i].per_page);
		emit_all(p, ids, ids, 2, &e);
		assert_int_equal(e.n, 2 * c[i].per_page);
		for (b = 0; b < 2; b++) {
			for (k = 0; k < c[i].per_page; k++) {
				uint64_t off = b * 10240ull + k * c[i].cap;
				uint32_t len = k + 1 < c[i].per_page ?
						       c[i].cap :
						       c[i].last;

				wr_is(&e, (int)(b * c[i].per_page + k), off,
				      len, 1, off);
			}
		}
		kvp_plan_destroy(p);
	}
	/* no cap: one READ of both pages */
	{
		kvp_plan *p = compile_len(lay, lay, 4, 0);

		kvp_plan_get_info(p, &pi);
		assert_int_equal(pi.max_len, 1u << 31);
		emit_all(p, ids, ids, 2, &e);
		assert_int_equal(e.n, 1);
		wr_is(&e, 0, 0, 20480, 1, (uint64_t)0);
		kvp_plan_destroy(p);
	}
	kvp_layout_destroy(lay);
}

/* 1000-byte pages, remote blocks 0-4 contiguous, local 0 2 4 6 8 not: a
 * READ gathers pages until the next would pass the cap. */
static void test_exact_small_pieces(void **state)
{
	static const uint32_t l[] = { 0, 2, 4, 6, 8 }, r[] = { 0, 1, 2, 3, 4 };
	kvp_layout *lay = parse(small_page);
	struct emitted e;
	kvp_plan *p;
	uint32_t k;

	(void)state;
	p = compile_len(lay, lay, 16, 4096);
	emit_all(p, l, r, 5, &e);
	assert_int_equal(e.n, 2);
	wr_is(&e, 0, 0, 4000, 4, (uint64_t)0, (uint64_t)2000, (uint64_t)4000,
	      (uint64_t)6000);
	wr_is(&e, 1, 4000, 1000, 1, (uint64_t)8000);
	kvp_plan_destroy(p);

	/* a cap of exactly one page: one READ a page */
	p = compile_len(lay, lay, 16, 1000);
	emit_all(p, l, r, 5, &e);
	assert_int_equal(e.n, 5);
	for (k = 0; k < 5; k++)
		wr_is(&e, (int)k, k * 1000ull, 1000, 1, l[k] * 1000ull);
	kvp_plan_destroy(p);

	/* max_sge binds before the cap */
	p = compile_len(lay, lay, 2, 4096);
	emit_all(p, l, r, 5, &e);
	assert_int_equal(e.n, 3);
	wr_is(&e, 0, 0, 2000, 2, (uint64_t)0, (uint64_t)2000);
	wr_is(&e, 1, 2000, 2000, 2, (uint64_t)4000, (uint64_t)6000);
	wr_is(&e, 2, 4000, 1000, 1, (uint64_t)8000);
	kvp_plan_destroy(p);

	/* 100 bytes: ten READs a page, local contiguity inside each */
	p = compile_len(lay, lay, 16, 100);
	emit_all(p, l, r, 5, &e);
	assert_int_equal(e.n, 50);
	for (k = 0; k < 50; k++)
		wr_is(&e, (int)k, k * 100ull, 100, 1,
		      l[k / 10] * 1000ull + (k % 10) * 100ull);
	kvp_plan_destroy(p);
	kvp_layout_destroy(lay);
}

static void test_rejects(void **state)
{
	kvp_layout *lay = parse(small_page);
	struct kvp_plan_attr a = { .max_sge = 1 };
	struct kvp_plan_info pi;
	kvp_plan *p = (kvp_plan *)&a, *keep = p;

	(void)state;
	/* above 2^31, unknown comp_mask and flags bits: -EINVAL, *out kept */
	a.comp_mask = KVP_PLAN_ATTR_MAX_LEN;
	a.max_len = (1u << 31) + 1;
	assert_int_equal(kvp_plan_compile(lay, lay, &a, &p, NULL, 0), -EINVAL);
	a.max_len = UINT32_MAX;
	assert_int_equal(kvp_plan_compile(lay, lay, &a, &p, NULL, 0), -EINVAL);
	a.max_len = 4096;
	a.comp_mask = KVP_PLAN_ATTR_MAX_LEN | (1u << 2);
	assert_int_equal(kvp_plan_compile(lay, lay, &a, &p, NULL, 0), -EINVAL);
	a.comp_mask = KVP_PLAN_ATTR_FLAGS;
	a.flags = 1u << 1;
	assert_int_equal(kvp_plan_compile(lay, lay, &a, &p, NULL, 0), -EINVAL);
	assert_ptr_equal(p, keep);

	/* 2^31 itself is the default */
	a.comp_mask = KVP_PLAN_ATTR_MAX_LEN;
	a.max_len = 1u << 31;
	assert_int_equal(kvp_plan_compile(lay, lay, &a, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.max_len, 1u << 31);
	kvp_plan_destroy(p);

	/* without its comp_mask bit, max_len is not read */
	a.comp_mask = 0;
	a.max_len = 10;
	assert_int_equal(kvp_plan_compile(lay, lay, &a, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.max_len, 1u << 31);
	assert_int_equal(pi.npieces, 1);
	kvp_plan_destroy(p);
	kvp_layout_destroy(lay);
}

/* A cap of one byte on a 10 KiB page makes 10240 templates, under the
 * limit; on a 2 MiB page it would make 2^21 and is refused (more than
 * 2^20 in one set); caps of 16 and 32 bytes make 2^17 and 2^16: over
 * KVP_PLAN_MAX_WORK (2^16 templates made in one compilation) and
 * exactly it. */
static void test_too_many_pieces(void **state)
{
	static const char huge[] =
		"engine tp_size=1\n"
		"group kind=full block_tokens=16\n"
		"region size=4M\n"
		"view group=0 region=0 layer=0 num_blocks=2 offset=0 stride=2M\n"
		"field view=0 kind=k elem=2 dims=token:16:131072,dim:65536:2\n";
	struct kvp_plan_attr a = { .max_sge = 1,
				   .comp_mask = KVP_PLAN_ATTR_MAX_LEN,
				   .max_len = 1 };
	kvp_layout *lay = parse(big_page), *big = parse(huge);
	struct kvp_plan_info pi;
	kvp_plan *p = NULL;
	char msg[160] = "";

	(void)state;
	if (kvp_plan_compile(lay, lay, &a, &p, msg, sizeof(msg)))
		fail_msg("%s", msg);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.npieces, 10240);
	kvp_plan_destroy(p);
	p = NULL;
	assert_int_equal(kvp_plan_compile(big, big, &a, &p, msg, sizeof(msg)),
			 -EPROTO);
	assert_null(p);
	assert_string_equal(msg,
			    "max_len 1 cuts the pieces into more than 1048576 templates");
	a.max_len = 16;
	assert_int_equal(kvp_plan_compile(big, big, &a, &p, msg, sizeof(msg)),
			 -EFBIG);
	assert_null(p);
	assert_string_equal(msg,
			    "max_len 16: plan too costly: over 65536 piece templates (KVP_PLAN_MAX_WORK)");
	/* 32 bytes: exactly KVP_PLAN_MAX_WORK */
	a.max_len = 32;
	assert_int_equal(kvp_plan_compile(big, big, &a, &p, msg, sizeof(msg)),
			 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.npieces, KVP_PLAN_MAX_WORK);
	kvp_plan_destroy(p);
	kvp_layout_destroy(big);
	kvp_layout_destroy(lay);
}

/* ---- the identity contract under caps ------------------------------------ */

/* kvt_check_pull() with a plan attribute: also checks that no READ is
 * longer than the plan's max_len nor has more than max_sge SGEs, and that
 * the counts stay within kvp_plan_emit_bound(). Returns the WR count. */
static int check_pull_attr(const kvp_layout *local, kvp_layout *const *remote,
			   const struct kvp_plan_attr *attr,
			   const struct kvp_ids *ids, uint32_t maxids)
{
	struct kvp_layout_info ri;
	struct kvp_plan_info pi;
	struct kvt_mem *prod, **pp, mem = { 0 }, exp = { 0 }, need = { 0 };
	struct kvt_mem seen = { 0 };
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	kvp_plan *plan = NULL;
	uint32_t i, maxw, maxs, nsge = 0;
	uint64_t bytes = 0;
	char msg[160] = "";
	int n;

	kvp_layout_get_info(remote[0], &ri);
	n = kvp_plan_compile(local, remote[0], attr, &plan, msg, sizeof(msg));
	if (n)
		fail_msg("compile: %d %s", n, msg);
	kvp_plan_get_info(plan, &pi);
	prod = calloc(ri.tp_size, sizeof(*prod));
	pp = calloc(ri.tp_size, sizeof(*pp));
	assert_true(prod && pp);
	for (i = 0; i < ri.tp_size; i++) {
		pp[i] = &prod[i];
		assert_int_equal(kvt_mem_alloc(remote[i], &prod[i]), 0);
		kvt_fill_background(&prod[i], 100 + i);
		kvt_fill_producer(remote[i], &prod[i], ids);
	}
	assert_int_equal(kvt_mem_alloc(local, &mem), 0);
	kvt_fill_background(&mem, 7);
	assert_int_equal(kvt_mem_like(&exp, &mem, 1), 0);
	assert_int_equal(kvt_mem_like(&need, &mem, 0), 0);
	assert_int_equal(kvt_mem_like(&seen, &mem, 0), 0);
	kvt_expect_consumer(local, remote[0], &exp, &need, ids);
	kvp_plan_emit_bound(plan, maxids, &maxw, &maxs);
	wr = calloc(maxw + 1, sizeof(*wr));
	sge = calloc(maxs + 1, sizeof(*sge));
	assert_true(wr && sge);
	n = kvp_plan_emit(plan, ids, wr, maxw, sge, maxs, NULL);
	assert_true(n >= 0);
	for (i = 0; i < (uint32_t)n; i++) {
		assert_true(wr[i].len <= pi.max_len);
		assert_true(wr[i].nsge >= 1 && wr[i].nsge <= pi.max_sge);
		nsge += wr[i].nsge;
	}
	assert_true(nsge <= maxs);
	assert_int_equal(kvt_execute(plan, wr, (uint32_t)n, sge, pp, &mem,
				     &seen, &bytes),
			 0);
	assert_int_equal(kvt_mem_compare(&mem, &exp, "consumer bytes"), 0);
	assert_int_equal(kvt_mem_compare(&seen, &need, "written-once map"), 0);
	for (i = 0; i < ri.tp_size; i++)
		kvt_mem_free(&prod[i]);
	free(prod);
	free(pp);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvt_mem_free(&need);
	kvt_mem_free(&seen);
	free(wr);
	free(sge);
	kvp_plan_destroy(plan);
	return n;
}

/* A layout pair: model, TP sizes, block sizes and KV layouts. */
struct lcase {
	const char *model;
	uint32_t P, D, pblock, cblock, play, clay;
};

static const struct lcase lcases[] = {
	{ "llama-3.1-8b", 1, 1, 16, 16, HND, HND },
	{ "llama-3.1-8b", 8, 2, 16, 16, HND, HND },
	{ "llama-3.1-8b", 2, 4, 16, 16, NHD, HND },
	{ "llama-3.1-8b", 2, 1, 16, 16, FI, HND },
	{ "llama-3.1-8b", 1, 2, 16, 16, PK, NHD },
	{ "llama-3.1-8b", 4, 2, 16, 16, FI, FI },
	{ "llama-3.1-8b", 1, 1, 24, 16, HND, NHD },
	{ "llama-3.1-8b", 2, 1, 16, 32, NHD, FI },
	{ "qwen2.5-1.5b", 8, 2, 16, 16, HND, PK },
	{ "deepseek-v3", 4, 2, 16, 32, 0, 0 },
	{ "nemotron-h-8b", 2, 1, 16, 16, HND, HND },
	{ "qwen3-next-80b-a3b", 1, 2, 16, 16, FI, NHD },
};

static const uint32_t caps[] = { 100, 1000, 4096, 65536 };

#define MAXIDS 4u
#define NBLK 16u

/* Every consumer rank of every pair, a request of random ids with a
 * prefix hit of one block, under each cap and max_sge 1 and 5. */
static void test_identity(void **state)
{
	uint64_t seed = 5, wrs = 0, checks = 0;
	uint32_t ci, c, k, g, cap;

	(void)state;
	for (ci = 0; ci < sizeof(lcases) / sizeof(lcases[0]); ci++) {
		const struct lcase *x = &lcases[ci];
		struct kvp_model m;
		kvp_layout **rem = calloc(x->P, sizeof(*rem));
		uint32_t nb;

		assert_int_equal(kvp_model_preset(x->model, &m), 0);
		if (m.layers > 2 && !m.state_layers)
			m.layers = 2;
		if (m.state_layers) {
			m.layers = 1;
			m.state_layers = 1;
		}
		nb = m.state_layers ? 128 : NBLK;
		for (k = 0; k < x->P; k++) {
			rem[k] = kvt_build(&m, x->P, k, x->pblock, 0,
					   nb, x->play);
			assert_non_null(rem[k]);
		}
		for (c = 0; c < x->D; c++) {
			kvp_layout *loc = kvt_build(&m, x->D, c, x->cblock, 0,
						    nb, x->clay);
			struct kvp_layout_info li;
			struct kvp_ids ids[3];
			uint32_t lid[3][MAXIDS], rid[3][MAXIDS];

			assert_non_null(loc);
			kvp_layout_get_info(loc, &li);
			assert_true(li.ngroups <= 3);
			for (g = 0; g < li.ngroups; g++) {
				struct kvp_group_desc lg, rg;
				uint32_t nr, nl, lo = nb / 2;
				uint64_t tok;

				assert_int_equal(kvp_layout_get_group(loc, g,
								      &lg),
						 0);
				assert_int_equal(kvp_layout_get_group(rem[0], g,
								      &rg),
						 0);
				ids[g].local = lid[g];
				ids[g].remote = rid[g];
				if (lg.kind == KVP_GROUP_STATE) {
					/* state page 0: below the token ids
					 * of the pooled regions */
					ids[g].nlocal = ids[g].nremote = 1;
					ids[g].tokens = 0;
					lid[g][0] = rid[g][0] = 0;
					continue;
				}
				nr = rg.block_tokens >= lg.block_tokens ?
					     2 :
					     lg.block_tokens / rg.block_tokens *
						     2;
				if (nr > MAXIDS)
					nr = MAXIDS;
				tok = (uint64_t)nr * rg.block_tokens - 1;
				nl = (uint32_t)((tok + lg.block_tokens - 1) /
						lg.block_tokens);
				assert_true(nl <= MAXIDS);
				ids[g].nremote = nr;
				ids[g].nlocal = nl > 1 ? nl - 1 : nl;
				ids[g].tokens = tok;
				kvt_random_ids(&seed, rid[g], nr, nb - lo);
				kvt_random_ids(&seed, lid[g], ids[g].nlocal,
					       nb - lo);
				for (k = 0; k < MAXIDS; k++) {
					rid[g][k] += lo;
					lid[g][k] += lo;
				}
			}
			for (cap = 0; cap < 4; cap++) {
				struct kvp_plan_attr a = {
					.max_sge = 1 + 4 * (cap & 1),
					.comp_mask = KVP_PLAN_ATTR_MAX_LEN,
					.max_len = caps[cap],
				};

				wrs += (uint64_t)check_pull_attr(loc, rem, &a,
								 ids, MAXIDS);
				checks++;
			}
			kvp_layout_destroy(loc);
		}
		for (k = 0; k < x->P; k++)
			kvp_layout_destroy(rem[k]);
		free(rem);
	}
	print_message("max_len identity: %llu checks, %llu READs\n",
		      (unsigned long long)checks, (unsigned long long)wrs);
}

/* KVP_PLAN_NO_COALESCE: one READ of one SGE per piece template per
 * period, no gathers; with max_len, per chunk. */
static void test_no_coalesce(void **state)
{
	static const struct kvp_model hand = {
		.name = "hand", .layers = 2, .kv_heads = 2, .head_dim = 4,
		.dtype_bytes = 2,
	};
	static const uint32_t l[] = { 0, 1, 2 }, r[] = { 0, 1, 2 };
	struct kvp_ids ids = { l, r, 3, 3, 0 };
	kvp_layout *rem = kvt_build(&hand, 1, 0, 4, 0, 16, FI);
	kvp_layout *loc = kvt_build(&hand, 1, 0, 4, 0, 16, HND);
	struct kvp_plan_attr a = { .max_sge = 4,
				   .comp_mask = KVP_PLAN_ATTR_FLAGS,
				   .flags = KVP_PLAN_NO_COALESCE };
	struct kvp_plan_info pi;
	struct emitted e;
	kvp_plan *p = NULL;
	uint32_t i;

	(void)state;
	assert_non_null(rem);
	assert_non_null(loc);
	assert_int_equal(kvp_plan_compile(loc, rem, &a, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	for (i = 0; i < pi.nstreams; i++)
		assert_int_equal(kvp_plan_stream_gather(p, i), 1);
	/* 4 streams x 3 blocks, whole 64-byte pages; coalesced: 4 READs */
	emit_all(p, l, r, 3, &e);
	assert_int_equal(e.n, 12);
	for (i = 0; i < 12; i++) {
		assert_int_equal(e.wr[i].len, 64);
		assert_int_equal(e.wr[i].nsge, 1);
	}
	kvp_plan_destroy(p);
	assert_int_equal(check_pull_attr(loc, &rem, &a, &ids, 3), 12);
	/* with a cap of 48 bytes: two READs a page */
	a.comp_mask |= KVP_PLAN_ATTR_MAX_LEN;
	a.max_len = 48;
	assert_int_equal(check_pull_attr(loc, &rem, &a, &ids, 3), 24);
	/* flags without their comp_mask bit are not read */
	a.comp_mask = 0;
	assert_int_equal(check_pull_attr(loc, &rem, &a, &ids, 3), 4);
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_exact_big_pieces),
		cmocka_unit_test(test_exact_small_pieces),
		cmocka_unit_test(test_rejects),
		cmocka_unit_test(test_too_many_pieces),
		cmocka_unit_test(test_identity),
		cmocka_unit_test(test_no_coalesce),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
