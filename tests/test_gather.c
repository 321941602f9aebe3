// SPDX-License-Identifier: MIT
/*
 * Gathers: streams of one source and remote region whose pieces touch on the
 * remote side are emitted as one walk in remote order, one READ per maximal
 * remote run (split only by max_sge and max_len) with an SGE per local
 * piece. Two scenarios with exact READ lists:
 *
 *  A. a FlashInfer producer (one region per layer, page = K then V, HND)
 *     feeding an HND consumer (K and V in separate regions): 2 layers, 3
 *     blocks; per stream 12 READs, gathered 4 (max_sge 4) or 6 (remote ids
 *     apart);
 *  B. a producer region holding all layers of a block (page = L0 K, L0 V,
 *     L1 K, L1 V) feeding the same consumer: 6 blocks; per stream 24 READs,
 *     gathered 6 (max_sge 4, or remote ids apart), 2 (max_sge 16).
 *
 * For both, and for random requests on model-built gather pairs (FlashInfer
 * and packed producers against FLASH consumers, TP splits, block ratios,
 * hybrid), the identity contract (kvt_check_pull), the bound, and windows of
 * one WR equal to kvp_plan_emit() WR by WR.
 *
 * The hand model: 2 layers, 2 KV heads, head dim 4, 2-byte elements, 4-token
 * blocks: a K or V page is (2 heads, 4 tokens, 4 dims) = 64 bytes.
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
#define NB 16u
#define CAP 16384u

static const struct kvp_model hand = {
	.name = "hand", .layers = 2, .kv_heads = 2, .head_dim = 4,
	.dtype_bytes = 2,
};

/* Scenario B's producer: one region, a 256-byte page per block holding
 * layer 0 K, layer 0 V, layer 1 K, layer 1 V (64 bytes each, HND). */
static const char all_layers[] =
	"engine tp_size=1\n"
	"group kind=full block_tokens=4\n"
	"region size=4K\n"
	"view group=0 region=0 layer=0 num_blocks=16 offset=0 stride=256\n"
	"view group=0 region=0 layer=1 num_blocks=16 offset=128 stride=256\n"
	"field view=0 kind=k elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
	"field view=0 kind=v elem=2 offset=64 dims=head:2:32,token:4:8,dim:4:2\n"
	"field view=1 kind=k elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
	"field view=1 kind=v elem=2 offset=64 dims=head:2:32,token:4:8,dim:4:2\n";

static kvp_layout *parse(const char *spec)
{
	kvp_layout *l = NULL;
	char msg[160] = "";

	if (kvp_layout_parse(spec, strlen(spec), &l, msg, sizeof(msg)))
		fail_msg("parse: %s", msg);
	return l;
}

static kvp_plan *compile(const kvp_layout *loc, const kvp_layout *rem,
			 uint32_t max_sge)
{
	struct kvp_plan_attr a = { .max_sge = max_sge };
	kvp_plan *p = NULL;
	char msg[160] = "";

	if (kvp_plan_compile(loc, rem, &a, &p, msg, sizeof(msg)))
		fail_msg("compile: %s", msg);
	return p;
}

struct out {
	struct kvp_wr wr[CAP];
	struct kvp_sge sge[CAP];
	int n;
};

static void emit(const kvp_plan *p, const struct kvp_ids *ids, struct out *o)
{
	o->n = kvp_plan_emit(p, ids, o->wr, CAP, o->sge, CAP, NULL);
	assert_true(o->n >= 0);
}

/* WR i: remote (region, offset, len), then nsge (local region, offset)
 * pairs, each SGE 64 bytes long. */
static void wr_is(const struct out *o, int i, uint32_t rreg, uint64_t off,
		  uint32_t len, uint32_t nsge, ...)
{
	const struct kvp_wr *w = &o->wr[i];
	uint32_t k;
	va_list ap;

	if (w->region != rreg || w->offset != off || w->len != len ||
	    w->nsge != nsge)
		fail_msg("wr %d: (r%u %llu %u nsge %u), want (r%u %llu %u %u)",
			 i, w->region, (unsigned long long)w->offset, w->len,
			 w->nsge, rreg, (unsigned long long)off, len, nsge);
	va_start(ap, nsge);
	for (k = 0; k < nsge; k++) {
		const struct kvp_sge *s = &o->sge[w->sge_first + k];
		uint32_t lreg = va_arg(ap, uint32_t);
		uint64_t lo = va_arg(ap, uint64_t);

		if (s->region != lreg || s->offset != lo || s->len != 64)
			fail_msg("wr %d sge %u: (l%u %llu %u), want (l%u %llu 64)",
				 i, k, s->region, (unsigned long long)s->offset,
				 s->len, lreg, (unsigned long long)lo);
	}
	va_end(ap);
}

#define L(reg, off) (uint32_t)(reg), (uint64_t)(off)

/* Windows of one WR (and max_sge SGEs of room) write exactly
 * kvp_plan_emit()'s WRs, source by source. */
static void windows_equal(const kvp_plan *p, const struct kvp_ids *ids,
			  const struct out *whole)
{
	struct kvp_plan_info pi;
	struct kvp_wr w;
	struct kvp_sge sge[64];
	uint32_t s, n = 0, k;

	kvp_plan_get_info(p, &pi);
	assert_true(pi.max_sge <= 64);
	for (s = 0; s < pi.nsrc; s++) {
		struct kvp_emit_pos pos;

		assert_int_equal(kvp_plan_emit_start(p, ids, s, &pos), 0);
		while (!kvp_plan_emit_done(&pos)) {
			const struct kvp_wr *x = &whole->wr[n];

			assert_int_equal(kvp_plan_emit_window(p, ids, &pos, &w,
							      1, sge,
							      pi.max_sge, NULL),
					 1);
			assert_true(n < (uint32_t)whole->n);
			assert_true(w.offset == x->offset && w.len == x->len &&
				    w.region == x->region && w.src == x->src &&
				    w.nsge == x->nsge && w.sge_first == 0);
			for (k = 0; k < w.nsge; k++)
				assert_memory_equal(&sge[k],
						    &whole->sge[x->sge_first + k],
						    sizeof(sge[k]));
			n++;
		}
	}
	assert_int_equal(n, whole->n);
}

static struct kvp_ids mkids(const uint32_t *l, const uint32_t *r, uint32_t n)
{
	struct kvp_ids ids = { l, r, n, n, 0 };

	return ids;
}

/* A: FlashInfer (K|V pages per layer region) into HND (K, V regions). */
static void test_flashinfer_to_hnd(void **state)
{
	static const uint32_t l[] = { 0, 1, 2 }, r[] = { 0, 1, 2 };
	static const uint32_t ra[] = { 0, 2, 4 };
	kvp_layout *rem = kvt_build(&hand, 1, 0, 4, 0, NB, FI);
	kvp_layout *loc = kvt_build(&hand, 1, 0, 4, 0, NB, HND);
	struct kvp_ids ids = mkids(l, r, 3);
	struct kvp_plan_info pi;
	static struct out o;
	kvp_plan *p;
	uint32_t i, maxw, maxs;

	(void)state;
	assert_non_null(rem);
	assert_non_null(loc);
	p = compile(loc, rem, 4);
	kvp_plan_get_info(p, &pi);
	/* streams (layer 0 K, layer 0 V, layer 1 K, layer 1 V): a gather of
	 * two per layer region */
	assert_int_equal(pi.nstreams, 4);
	assert_int_equal(kvp_plan_stream_gather(p, 0), 2);
	assert_int_equal(kvp_plan_stream_gather(p, 1), 0);
	assert_int_equal(kvp_plan_stream_gather(p, 2), 2);
	assert_int_equal(kvp_plan_stream_gather(p, 3), 0);
	assert_int_equal(kvp_plan_stream_gather(p, 4), -EINVAL);
	assert_int_equal(kvp_plan_stream_gather(NULL, 0), -EINVAL);

	/* remote 0-2 contiguous: a 384-byte run per layer, six SGEs
	 * alternating K and V regions: 4 + 2 (was 12 READs, one a page) */
	emit(p, &ids, &o);
	assert_int_equal(o.n, 4);
	for (i = 0; i < 2; i++) {
		uint32_t k = 2 * i, v = 2 * i + 1;

		wr_is(&o, (int)(2 * i), i, 0, 256, 4, L(k, 0), L(v, 0),
		      L(k, 64), L(v, 64));
		wr_is(&o, (int)(2 * i + 1), i, 256, 128, 2, L(k, 128),
		      L(v, 128));
	}
	kvp_plan_emit_bound(p, 3, &maxw, &maxs);
	assert_true(maxw >= 12 && maxs >= 12);
	windows_equal(p, &ids, &o);

	/* remote ids apart: one READ of K|V per block and layer */
	ids = mkids(l, ra, 3);
	emit(p, &ids, &o);
	assert_int_equal(o.n, 6);
	for (i = 0; i < 6; i++)
		wr_is(&o, (int)i, i / 3, ra[i % 3] * 128ull, 128, 2,
		      L(2 * (i / 3), l[i % 3] * 64ull),
		      L(2 * (i / 3) + 1, l[i % 3] * 64ull));
	windows_equal(p, &ids, &o);
	kvp_plan_destroy(p);

	/* max_sge 1: nothing to gather into, one READ a page as before */
	p = compile(loc, rem, 1);
	ids = mkids(l, r, 3);
	emit(p, &ids, &o);
	assert_int_equal(o.n, 12);
	windows_equal(p, &ids, &o);
	kvp_plan_destroy(p);
	assert_int_equal(kvt_check_pull(loc, &rem, 4, &ids, &i, NULL), 0);
	assert_int_equal(i, 4);
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem);
}

/* B: all layers of a block in one producer region. */
static void test_all_layers_region(void **state)
{
	static const uint32_t l[] = { 0, 1, 2, 3, 4, 5 };
	static const uint32_t r[] = { 0, 1, 2, 3, 4, 5 };
	static const uint32_t ra[] = { 0, 2, 4, 6, 8, 10 };
	kvp_layout *rem = parse(all_layers);
	kvp_layout *loc = kvt_build(&hand, 1, 0, 4, 0, NB, HND);
	struct kvp_ids ids = mkids(l, ra, 6);
	static struct out o;
	kvp_plan *p;
	uint32_t i, n;

	(void)state;
	assert_non_null(loc);
	p = compile(loc, rem, 4);
	assert_int_equal(kvp_plan_stream_gather(p, 0), 4);
	/* remote ids apart: one READ a block, its four pages (was 24) */
	emit(p, &ids, &o);
	assert_int_equal(o.n, 6);
	for (i = 0; i < 6; i++)
		wr_is(&o, (int)i, 0, ra[i] * 256ull, 256, 4, L(0, i * 64ull),
		      L(1, i * 64ull), L(2, i * 64ull), L(3, i * 64ull));
	windows_equal(p, &ids, &o);
	/* remote 0-5 contiguous: one 1536-byte run, 24 SGEs: 6 READs of 4 */
	ids = mkids(l, r, 6);
	emit(p, &ids, &o);
	assert_int_equal(o.n, 6);
	windows_equal(p, &ids, &o);
	kvp_plan_destroy(p);

	/* max_sge 16: 16 + 8 */
	p = compile(loc, rem, 16);
	emit(p, &ids, &o);
	assert_int_equal(o.n, 2);
	assert_int_equal(o.wr[0].len, 1024);
	assert_int_equal(o.wr[0].nsge, 16);
	assert_int_equal(o.wr[1].offset, 1024);
	assert_int_equal(o.wr[1].nsge, 8);
	windows_equal(p, &ids, &o);
	kvp_plan_destroy(p);
	for (i = 0; i < 3; i++) {
		static const uint32_t sg[] = { 1, 4, 16 };
		static const uint32_t want[] = { 24, 6, 2 };

		assert_int_equal(kvt_check_pull(loc, &rem, sg[i], &ids, &n,
						NULL),
				 0);
		assert_int_equal(n, want[i]);
	}
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem);
}

/* Consumer views out of the producer's order: the consumer lists every K
 * view before every V view, so each gather's streams are moved together
 * (local view order kept within it) and the READs are scenario B's. */
static void test_reordered_streams(void **state)
{
	static const char kv_apart[] =
		"engine tp_size=1\n"
		"group kind=full block_tokens=4\n"
		"region size=1K\nregion size=1K\nregion size=1K\nregion size=1K\n"
		"view group=0 region=0 layer=0 num_blocks=16 offset=0 stride=64\n"
		"view group=0 region=1 layer=1 num_blocks=16 offset=0 stride=64\n"
		"view group=0 region=2 layer=0 num_blocks=16 offset=0 stride=64\n"
		"view group=0 region=3 layer=1 num_blocks=16 offset=0 stride=64\n"
		"field view=0 kind=k elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
		"field view=1 kind=k elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
		"field view=2 kind=v elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n"
		"field view=3 kind=v elem=2 offset=0 dims=head:2:32,token:4:8,dim:4:2\n";
	static const uint32_t l[] = { 3, 4 }, r[] = { 7, 9 };
	kvp_layout *rem = parse(all_layers), *loc = parse(kv_apart);
	struct kvp_ids ids = mkids(l, r, 2);
	struct kvp_plan_stream st;
	static struct out o;
	kvp_plan *p = compile(loc, rem, 4);
	uint32_t i, n;

	(void)state;
	assert_int_equal(kvp_plan_stream_gather(p, 0), 4);
	for (i = 0; i < 4; i++) {
		assert_int_equal(kvp_plan_get_stream(p, i, &st), 0);
		assert_int_equal(st.local_view, i);
	}
	emit(p, &ids, &o);
	assert_int_equal(o.n, 2);
	/* page order L0 K, L0 V, L1 K, L1 V: regions 0, 2, 1, 3 */
	for (i = 0; i < 2; i++)
		wr_is(&o, (int)i, 0, r[i] * 256ull, 256, 4, L(0, l[i] * 64ull),
		      L(2, l[i] * 64ull), L(1, l[i] * 64ull),
		      L(3, l[i] * 64ull));
	windows_equal(p, &ids, &o);
	kvp_plan_destroy(p);
	assert_int_equal(kvt_check_pull(loc, &rem, 4, &ids, &n, NULL), 0);
	assert_int_equal(n, 2);
	kvp_layout_destroy(loc);
	kvp_layout_destroy(rem);
}

/* Model-built pairs with gathers: FlashInfer and packed producers against
 * FLASH consumers, TP splits both ways, block ratios, hybrid. */
struct gcase {
	const struct kvp_model *m;
	uint32_t P, D, pblock, cblock, play, clay, max_sge, gathered;
};

static const struct kvp_model dense8 = {
	.name = "dense8", .layers = 2, .kv_heads = 8, .head_dim = 4,
	.dtype_bytes = 2,
};

static const struct kvp_model mamba_tiny = {
	.name = "mamba-tiny", .layers = 2, .kv_heads = 4, .head_dim = 4,
	.dtype_bytes = 2, .state_kind = KVP_STATE_MAMBA2, .state_layers = 2,
	.conv_kernel = 4, .ssm_heads = 8, .ssm_head_dim = 2, .ssm_state = 4,
	.ssm_groups = 2, .state_dtype_bytes = 2,
};

static const struct gcase gcases[] = {
	{ &dense8, 1, 1, 16, 16, FI, HND, 4, 1 },
	{ &dense8, 4, 2, 16, 16, FI, HND, 16, 1 },
	/* one head of the producer's four: its K and V pages do not touch */
	{ &dense8, 2, 8, 16, 16, FI, NHD, 3, 0 },
	{ &dense8, 1, 1, 16, 16, PK, NHD, 8, 1 },
	{ &dense8, 2, 1, 16, 16, PK, HND, 2, 1 },
	{ &dense8, 1, 1, 16, 8, FI, HND, 4, 1 },
	{ &dense8, 1, 1, 8, 16, FI, HND, 4, 1 },
	{ &dense8, 1, 1, 24, 16, FI, NHD, 5, 1 },
	{ &dense8, 1, 1, 16, 16, FI, HND, 1, 1 },
	/* no gather: K and V regions on both sides */
	{ &dense8, 2, 2, 16, 16, HND, NHD, 4, 0 },
	/* hybrid: pooled pages on both sides, one stream a page */
	{ &mamba_tiny, 2, 1, 16, 16, FI, HND, 4, 0 },
};

static void test_random(void **state)
{
	uint64_t seed = 11, checks = 0, wrs = 0;
	uint32_t ci, c, t, k;

	(void)state;
	for (ci = 0; ci < sizeof(gcases) / sizeof(gcases[0]); ci++) {
		const struct gcase *x = &gcases[ci];
		kvp_layout *rem[8];

		for (k = 0; k < x->P; k++)
			assert_non_null(rem[k] = kvt_build(x->m, x->P, k,
							   x->pblock, 0, 64,
							   x->play));
		for (c = 0; c < x->D; c++) {
			kvp_layout *loc = kvt_build(x->m, x->D, c, x->cblock,
						    0, 64, x->clay);
			struct kvp_plan_info pi;
			struct kvp_plan_group g;
			kvp_plan *p = compile(loc, rem[0], x->max_sge);
			uint32_t s, gathers = 0;

			kvp_plan_get_info(p, &pi);
			for (s = 0; s < pi.nstreams; s++)
				gathers += kvp_plan_stream_gather(p, s) >= 2;
			if ((gathers > 0) != (int)x->gathered)
				fail_msg("case %u rank %u: %u gathers", ci, c,
					 gathers);
			for (t = 0; t < 8; t++) {
				uint32_t lid[2][8], rid[2][8], g2, nr, nl;
				struct kvp_ids ids[2];
				static struct out o;
				uint32_t n;

				for (g2 = 0; g2 < pi.ngroups; g2++) {
					assert_int_equal(
						kvp_plan_get_group(p, g2, &g),
						0);
					ids[g2].local = lid[g2];
					ids[g2].remote = rid[g2];
					ids[g2].tokens = 0;
					if (g.kind == KVP_GROUP_STATE) {
						ids[g2].nlocal = 1;
						ids[g2].nremote = 1;
						lid[g2][0] = rid[g2][0] = 0;
						continue;
					}
					nr = 1 + (uint32_t)(kvt_rand(&seed) %
							    (8 * g.local_tokens /
							     (g.local_tokens >
									      g.remote_tokens ?
								      g.local_tokens :
								      g.remote_tokens)));
					nl = (uint32_t)(((uint64_t)nr *
								 g.remote_tokens +
							 g.local_tokens - 1) /
							g.local_tokens);
					assert_true(nl <= 8);
					ids[g2].nremote = nr;
					ids[g2].nlocal = nl;
					/* consecutive remote ids half the
					 * time; above the state pages */
					if (t & 1) {
						uint32_t b = 32 +
							     (uint32_t)(kvt_rand(
										&seed) %
									16);

						for (k = 0; k < nr; k++)
							rid[g2][k] = b + k;
					} else {
						kvt_random_ids(&seed, rid[g2],
							       nr, 32);
						for (k = 0; k < nr; k++)
							rid[g2][k] += 32;
					}
					kvt_random_ids(&seed, lid[g2], nl, 32);
					for (k = 0; k < nl; k++)
						lid[g2][k] += 32;
				}
				if (kvt_check_pull(loc, rem, x->max_sge, ids,
						   &n, NULL))
					fail_msg("case %u rank %u request %u",
						 ci, c, t);
				emit(p, ids, &o);
				assert_int_equal(o.n, n);
				windows_equal(p, ids, &o);
				wrs += n;
				checks++;
			}
			kvp_plan_destroy(p);
			kvp_layout_destroy(loc);
		}
		for (k = 0; k < x->P; k++)
			kvp_layout_destroy(rem[k]);
	}
	print_message("gathers: %llu requests checked, %llu READs\n",
		      (unsigned long long)checks, (unsigned long long)wrs);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_flashinfer_to_hnd),
		cmocka_unit_test(test_all_layers_region),
		cmocka_unit_test(test_reordered_streams),
		cmocka_unit_test(test_random),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
