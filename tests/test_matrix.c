// SPDX-License-Identifier: MIT
/*
 * The byte-identity matrix: real model geometries (heads, head dim, dtype
 * of each preset; layers cut to 2) x producer TP x consumer TP in
 * {1, 2, 4, 8} x KV layouts x prefix cases (no hit, a partial hit of a few
 * blocks with a partly filled last block, a full hit), plus mixed pairs:
 * HND on one side and NHD on the other, block sizes 16 vs 32 and 32 vs 16,
 * a kernel block of 16 inside a block of 32 on either side, and block sizes
 * that do not nest (16 vs 24 both ways, 16-token kernel pages in 48-token
 * blocks against 24-token blocks), and K and V in one view (PACKED,
 * FLASHINFER) against K and V in separate regions (FLASH). Every consumer
 * rank of every case is checked with the memcpy executor (kvt_check_pull):
 * all its requested bytes hold the producer's bytes of the same identity,
 * each is written exactly once, nothing else changes. Block ids are random.
 *
 * Sizing. make unit runs the programs one after the other, on one core;
 * ASan+UBSan make the executor 3-4x slower. kvt_check_pull() costs about
 * 50 ns per requested element on every producer rank and the consumer (a
 * llama-3.1-8b token is 4096 elements in 2 layers), and it is called once
 * per consumer rank, so:
 *  - the same-layout rows run every TP pair with 2-token blocks (the
 *    smallest size where HND, NHD, FLASHINFER and PACKED differ) and at
 *    most 3 remote blocks: 5 models x 16 TP pairs x 4 layouts (1 for MLA)
 *    x 3 prefix cases x every consumer rank = 4 x 720 + 180 = 3060 checks;
 *  - the mixed rows need 16- to 48-token blocks (32-48 tokens a
 *    request, ~10 ms a check), so they run 3 TP pairs: 1 -> 1, 2 -> 4
 *    (heads split; replicated on the consumer for qwen2.5-1.5b), 8 -> 2
 *    (four sources per consumer; replicas for the qwens and MLA), and skip
 *    llama-3.1-70b, whose geometry with 2 layers is llama-3.1-8b's byte
 *    for byte: 4 models x 10 mixed pairs x 3 prefix cases x 7 consumer
 *    ranks = 840 checks.
 * 3900 checks in all: about 5 s, 20 s with SANITIZE=1.
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

#define NBLK 4u /* blocks per region */

static const char *const models[] = {
	"llama-3.1-8b", "llama-3.1-70b", "qwen2.5-7b",
	"qwen2.5-1.5b", "deepseek-v3",
};

static const uint32_t tps[] = { 1, 2, 4, 8 };
/* TP pairs of the mixed rows, as (P, D) */
static const uint32_t mixed_tp[][2] = { { 1, 1 }, { 2, 4 }, { 8, 2 } };

/* One side of a pair: memory layout, block and kernel block sizes. */
struct side {
	uint32_t layout, block, kernel;
};

/* A pair and the request shape: `tokens` in the sequence, `hit` leading
 * consumer blocks already cached in the partial-hit case (whose sequence is
 * also a token shorter, leaving the last block partly filled), and the
 * sequence length of the full-hit case. */
struct pair {
	const char *name;
	struct side prod, cons;
	uint32_t tokens, hit, full_tokens;
};

#define PAIR(name, pl, pb, pk, cl, cb, ck, tokens, hit, full)                \
	{ name, { pl, pb, pk }, { cl, cb, ck }, tokens, hit, full }
#define SAME(lay, name) PAIR(name, lay, 2, 0, lay, 2, 0, 6, 2, 2)
#define NHD KVP_KV_FLASH_NHD
#define HND KVP_KV_FLASH_HND

static const struct pair pairs[] = {
	SAME(NHD, "flash_nhd"),
	SAME(HND, "flash_hnd"),
	SAME(KVP_KV_FLASHINFER, "flashinfer"),
	SAME(KVP_KV_PACKED, "packed"),
	/* mixed: HND/NHD, 16 vs 32, 32 vs 16, kernel 16 in 32 */
	PAIR("nhd16->hnd32", NHD, 16, 0, HND, 32, 0, 48, 1, 32),
	PAIR("hnd32->nhd16", HND, 32, 0, NHD, 16, 0, 32, 1, 32),
	PAIR("hnd32k16->nhd16", HND, 32, 16, NHD, 16, 0, 32, 1, 32),
	PAIR("hnd16->nhd32k16", HND, 16, 0, NHD, 32, 16, 48, 1, 32),
	/* block sizes that do not nest: 16 vs 24, kernel 16 in 48 vs 24 */
	PAIR("nhd16->hnd24", NHD, 16, 0, HND, 24, 0, 48, 1, 48),
	PAIR("hnd24->nhd16", HND, 24, 0, NHD, 16, 0, 48, 1, 48),
	PAIR("hnd48k16->nhd24", HND, 48, 16, NHD, 24, 0, 48, 1, 48),
	/* K and V in one view on one side, in two regions on the other */
	PAIR("hnd16->packed16", HND, 16, 0, KVP_KV_PACKED, 16, 0, 48, 1, 32),
	PAIR("packed16->nhd32", KVP_KV_PACKED, 16, 0, NHD, 32, 0, 48, 1, 32),
	PAIR("flashinfer16->hnd16", KVP_KV_FLASHINFER, 16, 0, HND, 16, 0, 48, 1,
	     32),
};
#define NPAIRS (sizeof(pairs) / sizeof(pairs[0]))
#define NSAME 4u

enum { NO_HIT, PARTIAL_HIT, FULL_HIT, NPREFIX };
static const char *const prefix_name[] = { "no hit", "partial hit",
					   "full hit" };

struct tally {
	uint32_t checked, skipped_pairs, mla_checked, mixed_checked;
	uint32_t wrs;
	uint64_t bytes;
};

static int build(const struct kvp_model *m, uint32_t tp, uint32_t rank,
		 const struct side *s, kvp_layout **out)
{
	struct kvp_engine_desc e = { 0 };

	e.engine_id = 77;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = s->block;
	e.kernel_block_tokens = s->kernel;
	e.num_blocks = NBLK;
	e.kv_layout = s->layout;
	return kvp_layout_build(m, &e, out);
}

/* Whether the model can run at this TP: heads divide or are divided. */
static int runnable(const struct kvp_model *m, uint32_t tp)
{
	uint32_t s, n;

	return m->mla_latent || !kvp_shard_range(m->kv_heads, tp, 0, &s, &n);
}

/* All consumer ranks of one (model, pair, P, D, prefix) case. */
static void check_case(const char *model, const struct kvp_model *m,
		       const struct pair *pr, uint32_t P, uint32_t D,
		       uint32_t prefix, uint64_t *seed, struct tally *t)
{
	kvp_layout *rem[8], *loc;
	uint32_t lids[NBLK], rids[NBLK], r, c;
	uint64_t tokens = prefix == FULL_HIT ? pr->full_tokens : pr->tokens;
	uint32_t nr, nl;
	struct kvp_ids ids;

	if (prefix == PARTIAL_HIT)
		tokens--; /* a partly filled last block */
	nr = (uint32_t)((tokens + pr->prod.block - 1) / pr->prod.block);
	nl = (uint32_t)((tokens + pr->cons.block - 1) / pr->cons.block);
	assert_true(nr <= NBLK && nl <= NBLK);
	if (prefix == PARTIAL_HIT) {
		/* a few leading blocks cached: the tail is read */
		assert_true(nl > pr->hit);
		nl -= pr->hit;
	} else if (prefix == FULL_HIT) {
		nl = 0;
	}
	for (r = 0; r < P; r++)
		assert_int_equal(build(m, P, r, &pr->prod, &rem[r]), 0);
	for (c = 0; c < D; c++) {
		uint32_t nwr = 0;
		uint64_t bytes = 0;

		kvt_random_ids(seed, rids, nr, NBLK);
		kvt_random_ids(seed, lids, nl ? nl : 1, NBLK);
		ids.local = lids;
		ids.remote = rids;
		ids.nlocal = nl;
		ids.nremote = nr;
		ids.tokens = tokens;
		assert_int_equal(build(m, D, c, &pr->cons, &loc), 0);
		if (kvt_check_pull(loc, rem, 1 + (c % 3) * 3, &ids, &nwr,
				   &bytes))
			fail_msg(
				"%s %s P=%u D=%u consumer %u %s: identity check failed",
				model, pr->name, P, D, c, prefix_name[prefix]);
		if (prefix == FULL_HIT)
			assert_int_equal(nwr, 0);
		else
			assert_true(nwr > 0 && bytes > 0);
		kvp_layout_destroy(loc);
		t->checked++;
		t->wrs += nwr;
		t->bytes += bytes;
		if (m->mla_latent)
			t->mla_checked++;
		if (pr - pairs >= (long)NSAME)
			t->mixed_checked++;
	}
	for (r = 0; r < P; r++)
		kvp_layout_destroy(rem[r]);
}

/* One (model, pair, P, D): all prefix cases, or a skip when the model
 * cannot run at one of the TP sizes (the builder must refuse it). */
static void check_tp(const char *model, const struct kvp_model *m,
		     const struct pair *pr, uint32_t P, uint32_t D,
		     uint64_t *seed, struct tally *t)
{
	kvp_layout *l = NULL;
	int ea = build(m, P, 0, &pr->prod, &l), eb;
	uint32_t prefix;

	kvp_layout_destroy(l);
	l = NULL;
	if (!runnable(m, P) || !runnable(m, D)) {
		eb = build(m, D, 0, &pr->cons, &l);
		kvp_layout_destroy(l);
		assert_true(ea == -EINVAL || eb == -EINVAL);
		t->skipped_pairs++;
		return;
	}
	assert_int_equal(ea, 0);
	for (prefix = 0; prefix < NPREFIX; prefix++)
		check_case(model, m, pr, P, D, prefix, seed, t);
}

static void run_model(uint32_t mi, struct tally *t)
{
	struct kvp_model m;
	uint64_t seed = 1000 + mi;
	uint32_t pi, a, b;

	assert_int_equal(kvp_model_preset(models[mi], &m), 0);
	m.layers = 2;
	for (pi = 0; pi < NSAME; pi++) {
		/* MLA has one layout: the same-layout rows collapse */
		if (m.mla_latent && pi > 0)
			continue;
		for (a = 0; a < 4; a++)
			for (b = 0; b < 4; b++)
				check_tp(models[mi], &m, &pairs[pi], tps[a],
					 tps[b], &seed, t);
	}
	if (!strcmp(models[mi], "llama-3.1-70b"))
		return; /* llama-3.1-8b's geometry, see the top */
	for (pi = NSAME; pi < NPAIRS; pi++)
		for (a = 0; a < sizeof(mixed_tp) / sizeof(mixed_tp[0]); a++)
			check_tp(models[mi], &m, &pairs[pi], mixed_tp[a][0],
				 mixed_tp[a][1], &seed, t);
}

static struct tally total;

static void test_model(void **state)
{
	uint32_t mi = (uint32_t)(uintptr_t)*state;
	struct tally t = { 0 };

	run_model(mi, &t);
	print_message(
		"%-14s %5u consumer ranks checked (%u mixed-pair), %u TP pairs skipped, %u WRs, %llu bytes\n",
		models[mi], t.checked, t.mixed_checked, t.skipped_pairs, t.wrs,
		(unsigned long long)t.bytes);
	total.checked += t.checked;
	total.mla_checked += t.mla_checked;
	total.mixed_checked += t.mixed_checked;
	total.skipped_pairs += t.skipped_pairs;
	total.wrs += t.wrs;
	total.bytes += t.bytes;
}

static void test_total(void **state)
{
	(void)state;
	print_message(
		"byte-identity matrix: %u consumer ranks checked (%u MLA, %u mixed-pair), %u (model, pair, P, D) combinations skipped as not runnable\n",
		total.checked, total.mla_checked, total.mixed_checked,
		total.skipped_pairs);
	/* every TP size divides or is divided by 8, 4, 2 kv heads */
	assert_int_equal(total.skipped_pairs, 0);
	assert_int_equal(total.checked, 3060 + 840);
	assert_int_equal(total.mixed_checked, 840);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		{ "llama-3.1-8b", test_model, NULL, NULL, (void *)0 },
		{ "llama-3.1-70b", test_model, NULL, NULL, (void *)1 },
		{ "qwen2.5-7b", test_model, NULL, NULL, (void *)2 },
		{ "qwen2.5-1.5b", test_model, NULL, NULL, (void *)3 },
		{ "deepseek-v3", test_model, NULL, NULL, (void *)4 },
		cmocka_unit_test(test_total),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
