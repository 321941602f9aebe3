// SPDX-License-Identifier: MIT
/*
 * Hybrid models and mismatched layouts, proven byte for byte: Mamba2 and
 * GDN state groups pooled with attention, per-group source ranks, conv DS
 * and SD on either side, block sizes that differ both ways (ratios 1, 2, 4,
 * and 8 vs 12, which do not nest), kernel blocks, HND on one side and NHD
 * on the other, sliding windows, prefix and full hits. Every consumer rank of every case is checked with
 * the memcpy executor (tests/lib/kvtest.h).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "kvtest.h"

static kvp_layout *build(const struct kvp_model *m, uint32_t tp, uint32_t rank,
			 uint32_t block, uint32_t kernel, uint32_t nblocks,
			 uint32_t kv_layout, uint32_t conv_layout)
{
	struct kvp_engine_desc e = { 0 };
	kvp_layout *l = NULL;

	e.engine_id = 9;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = block;
	e.kernel_block_tokens = kernel;
	e.num_blocks = nblocks;
	e.kv_layout = kv_layout;
	e.conv_layout = conv_layout;
	if (kvp_layout_build(m, &e, &l))
		return NULL;
	return l;
}

/* Attention pages a state page spans on this side (1 without state). */
static uint32_t state_ratio(const kvp_layout *l)
{
	struct kvp_layout_info li;
	struct kvp_view_desc v, a = { 0 }, s = { 0 };
	struct kvp_group_desc g;
	uint32_t i;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++) {
		assert_int_equal(kvp_layout_get_view(l, i, &v), 0);
		assert_int_equal(kvp_layout_get_group(l, v.group, &g), 0);
		if (g.kind == KVP_GROUP_STATE && !s.stride)
			s = v;
		else if (g.kind != KVP_GROUP_STATE && !a.stride)
			a = v;
	}
	if (!s.stride || !a.stride)
		return 1;
	assert_int_equal(s.stride % a.stride, 0);
	return (uint32_t)(s.stride / a.stride);
}

struct req {
	struct kvp_ids ids[3];
	uint32_t lid[3][64], rid[3][64];
};

/*
 * One request: `nr` remote token blocks, the local tail minus `hit` blocks,
 * `window` local blocks for sliding groups (0: all), `nstate` states. State
 * ids come first in each pool (their pages span `ratio` attention pages),
 * attention ids above them, so groups never share memory.
 */
static void make_req(struct req *q, const kvp_layout *loc, const kvp_layout *rem,
		     uint32_t nr, uint32_t hit, uint32_t window,
		     uint32_t nstate, uint32_t nblocks, uint64_t *seed)
{
	struct kvp_layout_info li;
	uint32_t lr = state_ratio(loc), rr = state_ratio(rem), g, i;

	memset(q, 0, sizeof(*q));
	kvp_layout_get_info(loc, &li);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc lg, rg;
		struct kvp_ids *id = &q->ids[g];

		assert_int_equal(kvp_layout_get_group(loc, g, &lg), 0);
		assert_int_equal(kvp_layout_get_group(rem, g, &rg), 0);
		id->local = q->lid[g];
		id->remote = q->rid[g];
		if (lg.kind == KVP_GROUP_STATE) {
			id->nlocal = id->nremote = nstate;
			kvt_random_ids(seed, q->lid[g], nstate, nblocks / lr / 4);
			kvt_random_ids(seed, q->rid[g], nstate, nblocks / rr / 4);
			continue;
		}
		uint32_t nl = (nr * rg.block_tokens + lg.block_tokens - 1) /
			      lg.block_tokens;

		id->nremote = nr;
		id->nlocal = nl - hit;
		if (lg.kind == KVP_GROUP_SLIDING && window && window < id->nlocal)
			id->nlocal = window;
		kvt_random_ids(seed, q->rid[g], nr, nblocks - nblocks / 4);
		kvt_random_ids(seed, q->lid[g], id->nlocal, nblocks - nblocks / 4);
		for (i = 0; i < nr; i++)
			q->rid[g][i] += nblocks / 4;
		for (i = 0; i < id->nlocal; i++)
			q->lid[g][i] += nblocks / 4;
	}
}

static uint64_t ncases, nchecks;

/* Checks every consumer rank of a TP P -> D pair. */
static void check_pair(const struct kvp_model *m, uint32_t P, uint32_t D,
		       uint32_t bl, uint32_t kl, uint32_t br, uint32_t lkv,
		       uint32_t rkv, uint32_t lconv, uint32_t rconv,
		       uint32_t hit, uint32_t window, uint32_t nstate,
		       uint32_t nblocks, uint32_t max_sge, uint64_t *seed)
{
	kvp_layout *rem[8] = { 0 }, *loc;
	uint32_t r, c;
	struct req q;

	for (r = 0; r < P; r++) {
		rem[r] = build(m, P, r, br, 0, nblocks, rkv, rconv);
		assert_non_null(rem[r]);
	}
	for (c = 0; c < D; c++) {
		loc = build(m, D, c, bl, kl, nblocks, lkv, lconv);
		assert_non_null(loc);
		make_req(&q, loc, rem[0], 6, hit, window, nstate, nblocks, seed);
		if (kvt_check_pull(loc, rem, max_sge, q.ids, NULL, NULL)) {
			fprintf(stderr,
				"FAIL %s P=%u D=%u c=%u block %u(k%u)<-%u kv %u<-%u conv %u<-%u hit %u window %u\n",
				m->name, P, D, c, bl, kl, br, lkv, rkv, lconv,
				rconv, hit, window);
			fail();
		}
		nchecks++;
		kvp_layout_destroy(loc);
	}
	ncases++;
	for (r = 0; r < P; r++)
		kvp_layout_destroy(rem[r]);
}

/* Small models with the structure of the real ones (fast to check). */
static const struct kvp_model mamba_small = {
	.name = "mamba2-small", .layers = 1, .kv_heads = 2, .head_dim = 8,
	.dtype_bytes = 2, .state_kind = KVP_STATE_MAMBA2, .state_layers = 2,
	.conv_kernel = 4, .ssm_heads = 8, .ssm_head_dim = 4, .ssm_state = 8,
	.ssm_groups = 8, .state_dtype_bytes = 4,
};

/* n_groups < TP: B and C replicated while x and SSM heads are sharded;
 * KV heads 8 sharded. */
static const struct kvp_model mamba_rep = {
	.name = "mamba2-replicated-groups", .layers = 1, .kv_heads = 8,
	.head_dim = 4, .dtype_bytes = 2, .state_kind = KVP_STATE_MAMBA2,
	.state_layers = 1, .conv_kernel = 4, .ssm_heads = 8,
	.ssm_head_dim = 2, .ssm_state = 4, .ssm_groups = 1,
	.state_dtype_bytes = 2,
};

static const struct kvp_model gdn_small = {
	.name = "gdn-small", .layers = 1, .kv_heads = 1, .head_dim = 8,
	.dtype_bytes = 2, .state_kind = KVP_STATE_GDN, .state_layers = 2,
	.conv_kernel = 4, .ssm_heads = 8, .ssm_head_dim = 4, .ssm_state = 4,
	.ssm_groups = 2, .state_dtype_bytes = 2,
};

static void test_hybrid_matrix(void **state)
{
	static const struct kvp_model *models[] = { &mamba_small, &mamba_rep,
						    &gdn_small };
	/* local block, local kernel block, remote block */
	static const uint32_t blocks[][3] = {
		{ 8, 0, 8 }, { 8, 0, 16 }, { 16, 0, 8 }, { 4, 0, 16 },
		{ 16, 0, 4 }, { 16, 4, 8 },
		/* not nesting: 8 vs 12; 4-token kernel pages in 12 vs 8 */
		{ 8, 0, 12 }, { 12, 4, 8 },
	};
	static const uint32_t kv[][2] = {
		{ KVP_KV_FLASH_HND, KVP_KV_FLASH_HND },
		{ KVP_KV_FLASH_NHD, KVP_KV_FLASH_HND },
		{ KVP_KV_PACKED, KVP_KV_FLASH_NHD },
	};
	uint64_t seed = 5;
	uint32_t mi, P, D, b, k, conv, hit;

	(void)state;
	ncases = nchecks = 0;
	for (mi = 0; mi < 3; mi++)
		for (P = 1; P <= 8; P *= 2)
			for (D = 1; D <= 8; D *= 2)
				for (b = 0; b < 8; b++)
					for (conv = 0; conv < 4; conv++)
						for (hit = 0; hit < 2; hit++) {
							k = (b + conv + hit) % 3;
							check_pair(models[mi], P, D,
								   blocks[b][0],
								   blocks[b][1],
								   blocks[b][2],
								   kv[k][0], kv[k][1],
								   conv & 1, conv >> 1,
								   hit * 2, 0, 2, 96,
								   4, &seed);
						}
	printf("hybrid matrix: %llu cases, %llu consumer ranks checked\n",
	       (unsigned long long)ncases, (unsigned long long)nchecks);
	/* 3 models x 16 TP pairs x 8 block pairs x 4 conv pairs x 2 hits;
	 * every consumer rank of each: 3 x 8 x 4 x 2 x (1+2+4+8) x 4 */
	assert_int_equal(ncases, 3072);
	assert_int_equal(nchecks, 11520);
}

/* Full hit: no attention reads, the state still moves. */
static void test_full_hit_moves_state(void **state)
{
	kvp_layout *rem[2], *loc;
	struct kvp_plan_attr attr = { .max_sge = 4 };
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	uint32_t maxw, maxs;
	kvp_plan *plan;
	uint64_t seed = 3;
	struct req q;
	int n, i;

	(void)state;
	rem[0] = build(&mamba_small, 2, 0, 8, 0, 96, 1, 0);
	rem[1] = build(&mamba_small, 2, 1, 8, 0, 96, 1, 0);
	loc = build(&mamba_small, 1, 0, 8, 0, 96, 1, 1);
	assert_non_null(rem[0]);
	assert_non_null(rem[1]);
	assert_non_null(loc);
	make_req(&q, loc, rem[0], 4, 4, 0, 1, 96, &seed);
	assert_int_equal(q.ids[0].nlocal, 0);
	assert_int_equal(kvt_check_pull(loc, rem, 4, q.ids, NULL, NULL), 0);
	assert_int_equal(kvp_plan_compile(loc, rem[0], &attr, &plan, NULL, 0), 0);
	kvp_plan_emit_bound(plan, 4, &maxw, &maxs);
	wr = calloc(maxw, sizeof(*wr));
	sge = calloc(maxs, sizeof(*sge));
	assert_non_null(wr);
	assert_non_null(sge);
	n = kvp_plan_emit(plan, q.ids, wr, maxw, sge, maxs, NULL);
	assert_true(n > 0);
	for (i = 0; i < n; i++)
		assert_int_equal(wr[i].group, 1);
	free(wr);
	free(sge);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem[0]);
	kvp_layout_destroy(rem[1]);
}

/* KV heads 2 replicated over TP 8 while the state is sharded: the attention
 * group reads from one replica, the state group from every rank. */
static void test_per_group_sources(void **state)
{
	struct kvp_model m = mamba_small;
	struct kvp_plan_group g0, g1;
	struct kvp_plan_info pi;
	kvp_layout *rem, *loc;
	kvp_plan *plan;

	(void)state;
	rem = build(&m, 8, 0, 8, 0, 96, 1, 0);
	loc = build(&m, 1, 0, 8, 0, 96, 1, 0);
	assert_int_equal(kvp_plan_compile(loc, rem, NULL, &plan, NULL, 0), 0);
	kvp_plan_get_info(plan, &pi);
	assert_int_equal(pi.nsrc, 8);
	assert_int_equal(pi.nnotify, 8);
	assert_int_equal(kvp_plan_get_group(plan, 0, &g0), 0);
	assert_int_equal(kvp_plan_get_group(plan, 1, &g1), 0);
	/* 2 KV heads on 8 ranks: head 0 on ranks 0-3, head 1 on 4-7; the
	 * consumer (rank 0) reads replica 0 of each: sources 0 and 4. */
	assert_int_equal(g0.src_mask, (1ull << 0) | (1ull << 4));
	assert_int_equal(g1.src_mask, 0xffull);
	assert_int_equal(g1.kind, KVP_GROUP_STATE);
	assert_int_equal(kvp_notify_expected(rem, loc, 3), 1);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem);
}

/* vLLM's conv split of Nemotron-H-8B: TP 1 conv dim 10240 = (8192, 1024,
 * 1024); TP 4 conv dim 2560 = (2048, 256, 256). */
static void conv_parts(uint32_t tp, const uint32_t *want)
{
	struct kvp_model m;
	struct kvp_field_desc f;
	struct kvp_layout_info li;
	kvp_layout *l;
	uint32_t i, view, got[3] = { 0 }, sum = 0;

	assert_int_equal(kvp_model_preset("nemotron-h-8b", &m), 0);
	l = build(&m, tp, 0, 16, 0, 64, KVP_KV_FLASH_HND, KVP_CONV_DS);
	assert_non_null(l);
	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nfields; i++) {
		assert_int_equal(kvp_layout_get_field(l, i, &view, &f), 0);
		if (f.kind >= KVP_FIELD_CONV_X && f.kind <= KVP_FIELD_CONV_C &&
		    !got[f.kind - KVP_FIELD_CONV_X])
			got[f.kind - KVP_FIELD_CONV_X] =
				f.dim[0].size * f.dim[1].size;
	}
	for (i = 0; i < 3; i++) {
		assert_int_equal(got[i], want[i]);
		sum += got[i];
	}
	assert_int_equal(sum, want[3]);
	kvp_layout_destroy(l);
}

static void test_nemotron_conv_split(void **state)
{
	static const uint32_t tp1[] = { 8192, 1024, 1024, 10240 };
	static const uint32_t tp4[] = { 2048, 256, 256, 2560 };

	(void)state;
	conv_parts(1, tp1);
	conv_parts(4, tp4);
}

/* The real presets, reduced to a few layers, TP 2 -> 1 and 1 -> 2. */
static void test_real_presets(void **state)
{
	static const char *const names[] = { "nemotron-h-8b",
					     "qwen3-next-80b-a3b" };
	uint64_t seed = 11;
	uint32_t i;

	(void)state;
	for (i = 0; i < 2; i++) {
		struct kvp_model m;

		assert_int_equal(kvp_model_preset(names[i], &m), 0);
		m.layers = 1;
		m.state_layers = 2;
		check_pair(&m, 2, 1, 16, 0, 16, KVP_KV_FLASH_HND,
			   KVP_KV_FLASH_HND, KVP_CONV_DS, KVP_CONV_DS, 0, 0, 1,
			   160, 16, &seed);
		check_pair(&m, 1, 2, 16, 0, 32, KVP_KV_FLASH_NHD,
			   KVP_KV_FLASH_HND, KVP_CONV_SD, KVP_CONV_DS, 1, 0, 1,
			   160, 16, &seed);
	}
}

/* Sliding-window layers beside full attention: the window needs only the
 * last blocks; the full group reads them all. */
static void test_sliding_window(void **state)
{
	struct kvp_model m;
	uint64_t seed = 13;
	uint32_t P, D, w;

	(void)state;
	assert_int_equal(kvp_model_preset("gemma-3-12b", &m), 0);
	m.layers = 6;
	m.sliding_layers = 5;
	m.head_dim = 8;
	for (P = 1; P <= 8; P *= 2)
		for (D = 1; D <= 8; D *= 2)
			for (w = 1; w <= 3; w++)
				check_pair(&m, P, D, 8, 0, 16 >> (w & 1),
					   KVP_KV_FLASH_HND, KVP_KV_FLASH_NHD,
					   0, 0, w == 3 ? 2 : 0, w, 0, 64, 8,
					   &seed);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_nemotron_conv_split),
		cmocka_unit_test(test_per_group_sources),
		cmocka_unit_test(test_full_hit_moves_state),
		cmocka_unit_test(test_sliding_window),
		cmocka_unit_test(test_real_presets),
		cmocka_unit_test(test_hybrid_matrix),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
