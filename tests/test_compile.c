// SPDX-License-Identifier: MIT
/*
 * Plan compilation: -EPROTO with a message naming what differs, -EINVAL for
 * bad arguments, outputs untouched on failure; plan size independent of the
 * number of blocks; source and notify ranks for TP pairs; and the
 * exhaustive TP check: every (kv heads, producer TP, consumer TP, consumer
 * rank, layout pair) with kv heads and TP sizes in {1, 2, 4, 8, 16}, two
 * layers (the second reuses the first one's piece sets), each
 * consumer's plan checked byte for byte with the memcpy executor, compiled
 * against two producer ranks' layouts (same plan), and the notification
 * counts checked against the plans' notify lists; and block sizes that
 * nest or not, with kernel blocks on either side.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>

#include "kvassert.h"
#include "kvtest.h"
#include "compile.h" /* kvp__notify_count(): the producer's handshake */

#define PLAN_SENTINEL ((kvp_plan *)(uintptr_t)0x5a5a5a5a)

static struct kvp_model preset(const char *name, uint32_t layers)
{
	struct kvp_model m;

	assert_int_equal(kvp_model_preset(name, &m), 0);
	m.layers = layers;
	return m;
}

/* Compiling local from remote must fail with -EPROTO, leave *out alone,
 * and say something containing each substring of the NULL-terminated list;
 * the notification count refuses the pair too, for every producer rank. */
static void proto_rejected(const kvp_layout *l, const kvp_layout *r,
			   const char *what, ...)
{
	va_list ap;
	kvp_plan *p = PLAN_SENTINEL;
	struct kvp_layout_info ri;
	char msg[256];
	const char *sub;
	uint32_t i;
	int err;

	memset(msg, 0, sizeof(msg));
	err = kvp_plan_compile(l, r, NULL, &p, msg, sizeof(msg));
	if (err != -EPROTO)
		fail_msg("%s: got %d, want -EPROTO", what, err);
	assert_ptr_equal(p, PLAN_SENTINEL);
	print_message("%-28s %s\n", what, msg);
	va_start(ap, what);
	while ((sub = va_arg(ap, const char *)) != NULL)
		if (!strstr(msg, sub))
			fail_msg("%s: message \"%s\" lacks \"%s\"", what, msg,
				 sub);
	va_end(ap);
	/* without a message buffer: same error */
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, NULL, 0), -EPROTO);
	assert_ptr_equal(p, PLAN_SENTINEL);
	/* a short buffer is truncated and terminated, never overrun */
	memset(msg, 'x', sizeof(msg));
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, msg, 8), -EPROTO);
	assert_int_equal(strlen(msg), 7);
	assert_int_equal(msg[8], 'x');
	kvp_layout_get_info(r, &ri);
	for (i = 0; i < ri.tp_size; i++) {
		err = kvp_notify_expected(r, l, i);
		if (err != -EPROTO)
			fail_msg(
				"%s: kvp_notify_expected(producer %u) = %d, want -EPROTO",
				what, i, err);
		/* A field-level mismatch: the producer's handshake refuses
		 * it too, with no piece made. */
		err = kvp__notify_count(r, l, i, NULL, 0);
		if (err != -EPROTO)
			fail_msg("%s: kvp__notify_count(producer %u) = %d, want -EPROTO",
				 what, i, err);
	}
}

/* Models that differ in what must agree: different compat hashes, no
 * plan. */
static void proto_pair(const struct kvp_model *a, const struct kvp_model *b,
		       uint32_t tpa, uint32_t tpb, const char *what,
		       const char *s1, const char *s2)
{
	kvp_layout *l = kvt_build(a, tpa, 0, 16, 0, 8, KVP_KV_FLASH_HND);
	kvp_layout *r = kvt_build(b, tpb, 0, 16, 0, 8, KVP_KV_FLASH_HND);

	assert_non_null(l);
	assert_non_null(r);
	assert_true(kvp_layout_compat_hash(l) != kvp_layout_compat_hash(r));
	proto_rejected(l, r, what, s1, s2, NULL);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r);
}

/*
 * A hand-made layout: one group of `kind`, `layers` layers of 4-token
 * blocks, 2 heads (unsharded, TP 1) of 4 elements of 2 bytes, HND, one
 * region per layer holding the kinds in `kinds` (a bit mask) side by side.
 */
static kvp_layout *manual_at(uint32_t kind, uint32_t layers, uint32_t kinds,
			     uint32_t layer0)
{
	struct kvp_layout_attr a = { .tp_size = 1 };
	struct kvp_group_desc g = { .kind = kind, .block_tokens = 4 };
	struct kvp_view_desc v = { .num_blocks = 4, .stride = 128 };
	kvp_layout *l;
	uint32_t i, k, n, view;

	assert_int_equal(kvp_layout_create(&a, &l), 0);
	assert_int_equal(kvp_layout_add_group(l, &g, NULL), 0);
	for (i = 0; i < layers; i++) {
		assert_int_equal(kvp_layout_add_region(l, 512, &v.region), 0);
		v.layer = layer0 + i;
		assert_int_equal(kvp_layout_add_view(l, &v, &view), 0);
		for (k = 0, n = 0; k < 2; k++) {
			struct kvp_field_desc f = { 0 };

			if (!(kinds & (1u << k)))
				continue;
			f.kind = k;
			f.elem_size = 2;
			f.offset = 64 * n++;
			f.ndim = 3;
			f.shard_dim = KVP_NO_SHARD;
			f.dim[0] = (struct kvp_dim){ 32, 2, KVP_AXIS_HEAD };
			f.dim[1] = (struct kvp_dim){ 8, 4, KVP_AXIS_TOKEN };
			f.dim[2] = (struct kvp_dim){ 2, 4, KVP_AXIS_DIM };
			assert_int_equal(kvp_layout_add_field(l, view, &f), 0);
		}
	}
	return l;
}

static kvp_layout *manual(uint32_t kind, uint32_t layers, uint32_t kinds)
{
	return manual_at(kind, layers, kinds, 0);
}

/* A plan keeps a remote view's layer in 16 bits: a layout whose view
 * layers pass that is refused, with the view and the bound; 65535 is
 * planned. */
static void test_layer_bound(void **state)
{
	kvp_layout *l = manual_at(KVP_GROUP_FULL, 1, 3, 65535);
	kvp_layout *r = manual_at(KVP_GROUP_FULL, 1, 3, 65535);
	kvp_plan *p = NULL;
	char msg[256];

	(void)state;
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, msg, sizeof(msg)),
			 0);
	kvp_plan_destroy(p);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r);
	l = manual_at(KVP_GROUP_FULL, 1, 3, 70000);
	r = manual_at(KVP_GROUP_FULL, 1, 3, 70000);
	p = NULL;
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, msg, sizeof(msg)),
			 -EINVAL);
	assert_null(p);
	assert_string_equal(msg, "remote view 0: layer 70000, above 65535");
	kvp_layout_destroy(l);
	kvp_layout_destroy(r);
}

static void test_proto(void **state)
{
	struct kvp_model m = preset("llama-3.1-8b", 2), x;
	struct kvp_model mla = preset("deepseek-v3", 2);
	kvp_layout *a, *b;

	(void)state;
	/* layer counts, both ways */
	x = m, x.layers = 3;
	proto_pair(&x, &m, 1, 1, "more local layers", "layer 2", "no K");
	proto_pair(&x, &m, 2, 4, "more local layers, TP 2/4", "layer", NULL);
	proto_pair(&m, &x, 1, 1, "more remote layers", "layer 2", "no K");
	proto_pair(&m, &x, 8, 2, "more remote layers, TP 8/2", "layer", NULL);
	/* kv heads, head dim, dtype */
	x = m, x.kv_heads = 4;
	proto_pair(&m, &x, 1, 1, "kv heads 8 vs 4", "head", "extent");
	proto_pair(&x, &m, 2, 8, "kv heads 4 vs 8, TP 2/8", "head", "extent");
	x = m, x.head_dim = 64;
	proto_pair(&m, &x, 1, 1, "head dim 128 vs 64", "dim", "extent");
	proto_pair(&x, &m, 4, 2, "head dim 64 vs 128, TP 4/2", "dim", "extent");
	x = m, x.dtype_bytes = 1;
	proto_pair(&m, &x, 1, 1, "dtype 2 vs 1", "element size", NULL);
	proto_pair(&x, &m, 8, 8, "dtype 1 vs 2, TP 8/8", "element size", NULL);
	x = mla, x.mla_latent = 512;
	proto_pair(&mla, &x, 1, 2, "MLA latent 576 vs 512", "dim", "extent");
	/* groups: count and kinds */
	x = m, x.sliding_layers = 1;
	proto_pair(&m, &x, 1, 1, "1 vs 2 groups", "group count", NULL);
	proto_pair(&x, &m, 1, 1, "2 vs 1 groups", "group count", NULL);
	proto_pair(&m, &mla, 1, 1, "FULL vs MLA", "group 0", "kind");
	x = m, x.sliding_layers = 2;
	proto_pair(&m, &x, 1, 1, "FULL vs SLIDING", "group 0", "kind");
	/* a field missing on either side */
	a = manual(KVP_GROUP_FULL, 2, 3);
	b = manual(KVP_GROUP_FULL, 2, 1);
	proto_rejected(a, b, "remote without V", "no V field", "layer 0", NULL);
	proto_rejected(b, a, "local without V", "no V field", "layer 0", NULL);
	kvp_layout_destroy(b);
	b = manual(KVP_GROUP_FULL, 2, 2);
	proto_rejected(a, b, "remote without K", "no K field", NULL);
	proto_rejected(b, a, "local without K", "no K field", NULL);
	kvp_layout_destroy(b);
	b = manual(KVP_GROUP_SLIDING, 2, 3);
	proto_rejected(a, b, "manual FULL vs SLIDING", "kind", NULL);
	kvp_layout_destroy(b);
	kvp_layout_destroy(a);
	/* block sizes without a usable common period (65535 blocks max) */
	x = m, x.kv_heads = 1, x.head_dim = 1, x.dtype_bytes = 1;
	a = kvt_build(&x, 1, 0, 1, 0, 2, KVP_KV_FLASH_NHD);
	b = kvt_build(&x, 1, 0, 65537, 0, 2, KVP_KV_FLASH_NHD);
	assert_non_null(a);
	assert_non_null(b);
	proto_rejected(a, b, "block 1 vs 65537", "block sizes", NULL);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);
}

static void test_einval(void **state)
{
	struct kvp_model m = preset("llama-3.1-8b", 2);
	struct kvp_plan_attr attr = { .max_sge = 4 };
	kvp_layout *l = kvt_build(&m, 2, 1, 16, 0, 8, KVP_KV_FLASH_NHD);
	kvp_layout *r = kvt_build(&m, 4, 0, 32, 0, 8, KVP_KV_FLASHINFER);
	struct kvp_plan_info pi;
	kvp_plan *p = PLAN_SENTINEL;
	char msg[64];

	(void)state;
	assert_non_null(l);
	assert_non_null(r);
	strcpy(msg, "unchanged");
	assert_int_equal(kvp_plan_compile(NULL, r, &attr, &p, msg, 64),
			 -EINVAL);
	assert_int_equal(kvp_plan_compile(l, NULL, &attr, &p, msg, 64),
			 -EINVAL);
	assert_int_equal(kvp_plan_compile(l, r, &attr, NULL, msg, 64), -EINVAL);
	/* bits 0 and 1 are KVP_PLAN_ATTR_MAX_LEN and _FLAGS; the next one is
	 * unknown (tests/test_plan_len.c drives those two) */
	attr.comp_mask = 1u << 2;
	assert_int_equal(kvp_plan_compile(l, r, &attr, &p, msg, 64), -EINVAL);
	attr.comp_mask = 0x80000000u;
	assert_int_equal(kvp_plan_compile(l, r, &attr, &p, msg, 64), -EINVAL);
	assert_ptr_equal(p, PLAN_SENTINEL);
	assert_int_equal(kvp_notify_expected(NULL, l, 0), -EINVAL);
	assert_int_equal(kvp_notify_expected(r, NULL, 0), -EINVAL);
	assert_int_equal(kvp_notify_expected(r, l, 4), -EINVAL);
	assert_int_equal(kvp_notify_expected(r, l, UINT32_MAX), -EINVAL);

	/* attr may be NULL; max_sge 0 means 1 */
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.max_sge, 1);
	assert_int_equal(pi.local_tp, 2);
	assert_int_equal(pi.local_rank, 1);
	assert_int_equal(pi.remote_tp, 4);
	assert_int_equal(pi.ngroups, 1);
	kvp_plan_destroy(p);
	attr.comp_mask = 0, attr.max_sge = 0;
	assert_int_equal(kvp_plan_compile(l, r, &attr, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.max_sge, 1);
	kvp_plan_destroy(p);
	attr.max_sge = 7;
	assert_int_equal(kvp_plan_compile(l, r, &attr, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.max_sge, 7);

	/* inspection out of range */
	{
		struct kvp_plan_group g, gc;
		struct kvp_plan_stream s, sc;
		struct kvp_plan_piece q, qc;

		memset(&g, 0x3c, sizeof(g)), gc = g;
		memset(&s, 0x3c, sizeof(s)), sc = s;
		memset(&q, 0x3c, sizeof(q)), qc = q;
		assert_int_equal(kvp_plan_source(p, pi.nsrc), -EINVAL);
		assert_int_equal(kvp_plan_source(NULL, 0), -EINVAL);
		assert_int_equal(kvp_plan_notify(p, pi.nnotify), -EINVAL);
		assert_int_equal(kvp_plan_notify(NULL, 0), -EINVAL);
		assert_int_equal(kvp_plan_get_group(p, 1, &g), -EINVAL);
		assert_int_equal(kvp_plan_get_group(p, 0, NULL), -EINVAL);
		assert_int_equal(kvp_plan_get_stream(p, pi.nstreams, &s),
				 -EINVAL);
		assert_int_equal(kvp_plan_get_piece(p, pi.npieces, &q),
				 -EINVAL);
		assert_memory_equal(&g, &gc, sizeof(g));
		assert_memory_equal(&s, &sc, sizeof(s));
		assert_memory_equal(&q, &qc, sizeof(q));
		assert_int_equal(kvp_plan_get_group(p, 0, &g), 0);
		assert_int_equal(g.kind, KVP_GROUP_FULL);
		assert_int_equal(g.local_tokens, 16);
		assert_int_equal(g.remote_tokens, 32);
		assert_int_equal(g.period_tokens, 32);
		assert_int_equal(g.local_per_period, 2);
		assert_int_equal(g.remote_per_period, 1);
		assert_int_equal(g.local_blocks, 8);
		assert_int_equal(g.remote_blocks, 8);
	}
	kvp_plan_destroy(p);
	kvp_plan_destroy(NULL);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r);
}

/* ---- plan properties ---------------------------------------------------- */

static void test_size_independent_of_blocks(void **state)
{
	const char *names[] = { "llama-3.1-8b", "deepseek-v3", "qwen2.5-1.5b" };
	static const uint32_t tp[][2] = {
		{ 1, 1 }, { 8, 2 }, { 2, 8 }, { 4, 4 }
	};
	uint32_t n, t, lay;

	(void)state;
	for (n = 0; n < 3; n++)
		for (t = 0; t < 4; t++)
			for (lay = 0; lay < KVP_KV_LAYOUT_COUNT; lay++) {
				struct kvp_model m = preset(names[n], 4);
				struct kvp_plan_info a, b;
				kvp_layout *l, *r;
				kvp_plan *p;
				uint32_t nb;

				for (nb = 1000; nb <= 100000; nb *= 100) {
					l = kvt_build(&m, tp[t][1], 0, 16, 0,
						      nb, lay);
					r = kvt_build(
						&m, tp[t][0], 0, 32, 16, nb / 2,
						KVP_KV_LAYOUT_COUNT - 1 - lay);
					assert_non_null(l);
					assert_non_null(r);
					assert_int_equal(
						kvp_plan_compile(l, r, NULL, &p,
								 NULL, 0),
						0);
					kvp_plan_get_info(p,
							  nb == 1000 ? &a : &b);
					kvp_plan_destroy(p);
					kvp_layout_destroy(l);
					kvp_layout_destroy(r);
				}
				assert_true(a.bytes == b.bytes);
				assert_int_equal(a.nstreams, b.nstreams);
				assert_int_equal(a.npieces, b.npieces);
				assert_int_equal(a.nsrc, b.nsrc);
			}
}

/* The sources (or notify ranks) of consumer rank c of D pulling from P. */
static uint32_t plan_ranks(const struct kvp_model *m, uint32_t P, uint32_t D,
			   uint32_t c, int notify, uint32_t *out)
{
	kvp_layout *l = kvt_build(m, D, c, 16, 0, 4, KVP_KV_FLASH_HND);
	kvp_layout *r = kvt_build(m, P, P - 1, 16, 0, 4, KVP_KV_FLASH_NHD);
	struct kvp_plan_info pi;
	kvp_plan *p;
	uint32_t i, n;

	assert_non_null(l);
	assert_non_null(r);
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	n = notify ? pi.nnotify : pi.nsrc;
	for (i = 0; i < n; i++) {
		int k = notify ? kvp_plan_notify(p, i) : kvp_plan_source(p, i);

		assert_true(k >= 0);
		out[i] = (uint32_t)k;
	}
	kvp_plan_destroy(p);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r);
	return n;
}

static void test_sources(void **state)
{
	struct kvp_model m = preset("llama-3.1-8b", 2);
	struct kvp_model mla = preset("deepseek-v3", 2);
	uint32_t s[16], s2[16], c;
	kvp_layout *pl, *cl;

	(void)state;
	/* P=8 -> D=2: consumer 0 holds heads 0-3, one per producer */
	assert_int_equal(plan_ranks(&m, 8, 2, 0, 0, s), 4);
	for (c = 0; c < 4; c++)
		assert_int_equal(s[c], c);
	assert_int_equal(plan_ranks(&m, 8, 2, 1, 0, s), 4);
	for (c = 0; c < 4; c++)
		assert_int_equal(s[c], 4 + c);
	assert_int_equal(plan_ranks(&m, 8, 2, 0, 1, s), 4);
	for (c = 0; c < 4; c++)
		assert_int_equal(s[c], c);
	/* P=2 -> D=8: consumer c holds head c, on producer c / 4 */
	for (c = 0; c < 8; c++) {
		assert_int_equal(plan_ranks(&m, 2, 8, c, 0, s), 1);
		assert_int_equal(s[0], c / 4);
		assert_int_equal(plan_ranks(&m, 2, 8, c, 1, s), 1);
		assert_int_equal(s[0], c / 4);
	}
	pl = kvt_build(&m, 2, 1, 16, 0, 4, 0);
	cl = kvt_build(&m, 8, 3, 16, 0, 4, 0);
	assert_int_equal(kvp_notify_expected(pl, cl, 0), 4);
	assert_int_equal(kvp_notify_expected(pl, cl, 1), 4);
	kvp_layout_destroy(pl);
	kvp_layout_destroy(cl);
	/* MLA P=4 -> D=2: one replica each, not the same one */
	assert_int_equal(plan_ranks(&mla, 4, 2, 0, 0, s), 1);
	assert_int_equal(plan_ranks(&mla, 4, 2, 1, 0, s2), 1);
	assert_int_not_equal(s[0], s2[0]);
	assert_true(s[0] < 4 && s2[0] < 4);
	/* MLA P=2 -> D=8: every producer serves four consumers */
	{
		uint32_t load[2] = { 0, 0 };

		for (c = 0; c < 8; c++) {
			assert_int_equal(plan_ranks(&mla, 2, 8, c, 0, s), 1);
			load[s[0]]++;
		}
		assert_int_equal(load[0], 4);
		assert_int_equal(load[1], 4);
	}
}

/* ---- the exhaustive TP check ------------------------------------------- */

struct tally {
	uint32_t cases, mla_cases;
	uint64_t bytes;
};

/* Checks one consumer rank's plan: sources hold what it needs, each needed
 * head from exactly one source, sources are notified, and the notify range
 * of the rule is there. Adds to notify[] and load[]. */
static void check_ranks(const kvp_plan *p, uint32_t heads, int mla, uint32_t P,
			uint32_t D, uint32_t c, uint32_t *notify,
			uint32_t *load)
{
	struct kvp_plan_info pi;
	uint32_t i, j, cs = 0, cl = 1, lo, hi;
	uint8_t in_notify[16] = { 0 };
	uint32_t held_by[16] = { 0 };

	kvp_plan_get_info(p, &pi);
	assert_true(pi.nsrc >= 1 && pi.nsrc <= P);
	assert_true(pi.nnotify >= pi.nsrc && pi.nnotify <= P);
	for (i = 0; i < pi.nnotify; i++) {
		int r = kvp_plan_notify(p, i);

		assert_true(r >= 0 && (uint32_t)r < P);
		if (i)
			assert_true(r > kvp_plan_notify(p, i - 1));
		in_notify[r] = 1;
		notify[r]++;
	}
	/* every producer hears of the request: [c*P/D, ceil((c+1)*P/D)) */
	lo = (uint32_t)((uint64_t)c * P / D);
	hi = (uint32_t)(((uint64_t)(c + 1) * P + D - 1) / D);
	if (hi <= lo)
		hi = lo + 1;
	for (i = lo; i < hi && i < P; i++)
		assert_true(in_notify[i]);
	if (!mla)
		assert_int_equal(kvp_shard_range(heads, D, c, &cs, &cl), 0);
	for (i = 0; i < pi.nsrc; i++) {
		int r = kvp_plan_source(p, i);
		uint32_t ps = 0, pl = heads, any = 0;

		assert_true(r >= 0 && (uint32_t)r < P);
		if (i)
			assert_true(r > kvp_plan_source(p, i - 1));
		assert_true(in_notify[r]);
		load[r]++;
		if (!mla)
			assert_int_equal(kvp_shard_range(heads, P, (uint32_t)r,
							 &ps, &pl),
					 0);
		else
			ps = 0, pl = 1;
		for (j = ps; j < ps + pl; j++)
			if (j >= cs && j < cs + cl)
				held_by[j]++, any = 1;
		assert_true(any); /* no source without a needed head */
	}
	for (j = cs; j < cs + cl; j++)
		assert_int_equal(held_by[j], 1);
}

static void exhaustive_one(uint32_t heads, int mla, uint32_t P, uint32_t D,
			   uint32_t play, uint32_t clay, uint64_t *seed,
			   struct tally *t)
{
	struct kvp_model m = { 0 };
	kvp_layout *rem[16], *loc[16];
	uint32_t notify[16] = { 0 }, load[16] = { 0 };
	uint32_t lids[4], rids[4], c, r, links = 0, maxload = 0;
	struct kvp_ids ids;

	m.layers = 2; /* the second layer reuses the first one's piece sets */
	m.kv_heads = heads;
	m.head_dim = 4;
	m.dtype_bytes = 2;
	m.mla_latent = mla ? 8 : 0;
	for (r = 0; r < P; r++)
		assert_non_null(rem[r] = kvt_build(&m, P, r, 4, 0, 8, play));
	for (c = 0; c < D; c++)
		assert_non_null(loc[c] = kvt_build(&m, D, c, 4, 0, 8, clay));
	for (c = 0; c < D; c++) {
		struct kvp_plan_attr attr = { .max_sge = 1 + (c & 1) * 3 };
		uint64_t bytes = 0;
		kvp_plan *p;
		char msg[128] = "";
		int err;

		err = kvp_plan_compile(loc[c], rem[0], &attr, &p, msg,
				       sizeof(msg));
		if (err)
			fail_msg(
				"heads %u mla %d P %u D %u c %u layouts %u/%u: compile %d %s",
				heads, mla, P, D, c, play, clay, err, msg);
		check_ranks(p, heads, mla, P, D, c, notify, load);
		if (P > 1) {
			/* any producer rank's layout describes the engine */
			kvp_plan *q;

			assert_int_equal(kvp_plan_compile(loc[c], rem[P - 1],
							  &attr, &q, NULL, 0),
					 0);
			kva_plans_equal(p, q);
			kvp_plan_destroy(q);
		}
		kvp_plan_destroy(p);

		/* 3 remote blocks; the consumer misses 2 or all 3 */
		kvt_random_ids(seed, rids, 3, 8);
		kvt_random_ids(seed, lids, 3, 8);
		ids.local = lids;
		ids.remote = rids;
		ids.nremote = 3;
		ids.nlocal = 2 + (uint32_t)(kvt_rand(seed) & 1);
		ids.tokens = (kvt_rand(seed) & 1) ? 11 : 0;
		if (kvt_check_pull(loc[c], rem, attr.max_sge, &ids, NULL,
				   &bytes))
			fail_msg(
				"heads %u mla %d P %u D %u c %u layouts %u/%u: identity check failed",
				heads, mla, P, D, c, play, clay);
		t->bytes += bytes;
		if (mla)
			t->mla_cases++;
		else
			t->cases++;
	}
	/* each producer's count is the number of notify lists naming it */
	for (r = 0; r < P; r++) {
		assert_true(notify[r] >= 1);
		assert_int_equal(kvp_notify_expected(rem[r], loc[0], r),
				 notify[r]);
		assert_int_equal(kvp_notify_expected(rem[0], loc[D - 1], r),
				 notify[r]);
		links += load[r];
		if (load[r] > maxload)
			maxload = load[r];
	}
	/* replicas spread consumers evenly over producers */
	if (maxload > (links + P - 1) / P)
		fail_msg(
			"heads %u mla %d P %u D %u: a producer serves %u of %u reads",
			heads, mla, P, D, maxload, links);
	for (r = 0; r < P; r++)
		kvp_layout_destroy(rem[r]);
	for (c = 0; c < D; c++)
		kvp_layout_destroy(loc[c]);
}

/*
 * kv heads {1,2,4,8,16} x P {1,2,4,8,16} x D {1,2,4,8,16} x every consumer
 * rank x 4 producer layouts x 4 consumer layouts: 5 * 5 * 31 * 16 = 12400
 * identity-checked consumer plans, plus 5 * 31 = 155 for MLA (every pair of
 * the five sizes is valid: powers of two always divide one way). One layer,
 * head dim 4, 4-token blocks, 8 blocks per region keep each check in the
 * tens of microseconds (about 1 s in all; 3-4 s with ASan+UBSan).
 */
static void test_exhaustive_tp(void **state)
{
	static const uint32_t sizes[] = { 1, 2, 4, 8, 16 };
	struct tally t = { 0 };
	uint64_t seed = 42;
	uint32_t h, pi, di, pl, cl, skipped = 0;

	(void)state;
	for (h = 0; h < 5; h++)
		for (pi = 0; pi < 5; pi++)
			for (di = 0; di < 5; di++) {
				uint32_t s, n;

				/* valid only when the TP sizes and the heads
				 * divide one way or the other */
				if (kvp_shard_range(sizes[h], sizes[pi], 0, &s,
						    &n) ||
				    kvp_shard_range(sizes[h], sizes[di], 0, &s,
						    &n)) {
					skipped++;
					continue;
				}
				for (pl = 0; pl < KVP_KV_LAYOUT_COUNT; pl++)
					for (cl = 0; cl < KVP_KV_LAYOUT_COUNT;
					     cl++)
						exhaustive_one(sizes[h], 0,
							       sizes[pi],
							       sizes[di], pl,
							       cl, &seed, &t);
			}
	for (pi = 0; pi < 5; pi++)
		for (di = 0; di < 5; di++)
			exhaustive_one(1, 1, sizes[pi], sizes[di], 0, 0, &seed,
				       &t);
	print_message(
		"exhaustive TP check: %u consumer plans (GQA) + %u (MLA) identity-checked, %u invalid combinations skipped, %llu bytes read\n",
		t.cases, t.mla_cases, skipped, (unsigned long long)t.bytes);
	assert_int_equal(t.cases, 12400);
	assert_int_equal(t.mla_cases, 155);
}
/*
 * Block sizes on the token axis, nesting or not: every pair of blocks
 * {8, 16, 24, 32, 48, 64, 96} x kernel blocks {0, 8, 16} (kernel dividing
 * block) on each side, e.g. 16 vs 24, kernel pages of 16 inside blocks of
 * 48 against blocks of 24, plus 32 vs 528 with 16-token kernel pages (the
 * kind of block size vLLM picks to align attention pages with Mamba state
 * pages). A small model (1 layer, 2 KV heads of 4 two-byte elements), HND
 * producer of TP 1 and 2 into an NHD consumer of TP 1, a request of 2.5
 * producer blocks of tokens (or 1.5 consumer blocks, if more), the tail
 * block partly read: each pair compiles, its bytes pass the
 * identity check with no hit and with the first consumer block cached, and
 * kvp_notify_expected() counts the one consumer on every producer rank.
 */
static void block_pair(uint32_t cb, uint32_t ck, uint32_t pb, uint32_t pk,
		       uint64_t *seed, uint32_t *checks)
{
	struct kvp_model m = { 0 };
	kvp_layout *rem[2], *loc;
	uint32_t lids[64], rids[32], P, r, hit;
	uint64_t tokens = pb * 2 + pb / 2 > cb ? pb * 2 + pb / 2 : cb + cb / 2;
	uint32_t nl = (uint32_t)((tokens + cb - 1) / cb);
	uint32_t nr = (uint32_t)((tokens + pb - 1) / pb);
	struct kvp_ids ids;
	kvp_plan *plan;
	char msg[256] = "";
	int err;

	m.layers = 1;
	m.kv_heads = 2;
	m.head_dim = 4;
	m.dtype_bytes = 2;
	assert_true(nl >= 2 && nl <= 64 && nr <= 32);
	for (P = 1; P <= 2; P++) {
		for (r = 0; r < P; r++)
			assert_non_null(rem[r] = kvt_build(&m, P, r, pb, pk, 32,
							   KVP_KV_FLASH_HND));
		assert_non_null(loc = kvt_build(&m, 1, 0, cb, ck, 64,
						KVP_KV_FLASH_NHD));
		err = kvp_plan_compile(loc, rem[0], NULL, &plan, msg,
				       sizeof(msg));
		if (err)
			fail_msg("consumer %u/k%u <- producer %u/k%u, TP %u: %d %s",
				 cb, ck, pb, pk, P, err, msg);
		kvp_plan_destroy(plan);
		for (r = 0; r < P; r++)
			assert_int_equal(kvp_notify_expected(rem[r], loc, r), 1);
		for (hit = 0; hit <= 1; hit++) {
			kvt_random_ids(seed, rids, nr, 32);
			kvt_random_ids(seed, lids, nl - hit, 64);
			ids.local = lids;
			ids.remote = rids;
			ids.nremote = nr;
			ids.nlocal = nl - hit;
			ids.tokens = tokens;
			if (kvt_check_pull(loc, rem, 4, &ids, NULL, NULL))
				fail_msg("consumer %u/k%u <- producer %u/k%u, TP %u, %u blocks cached: identity check failed",
					 cb, ck, pb, pk, P, hit);
			(*checks)++;
		}
		kvp_layout_destroy(loc);
		for (r = 0; r < P; r++)
			kvp_layout_destroy(rem[r]);
	}
}

static void test_block_sizes(void **state)
{
	static const uint32_t bs[] = { 8, 16, 24, 32, 48, 64, 96 };
	static const uint32_t ks[] = { 0, 8, 16 };
	uint32_t a, ka, b, kb, pairs = 0, checks = 0;
	uint64_t seed = 5;

	(void)state;
	for (a = 0; a < 7; a++)
		for (ka = 0; ka < 3; ka++)
			for (b = 0; b < 7; b++)
				for (kb = 0; kb < 3; kb++) {
					if ((ks[ka] && bs[a] % ks[ka]) ||
					    (ks[kb] && bs[b] % ks[kb]))
						continue;
					block_pair(bs[a], ks[ka], bs[b], ks[kb],
						   &seed, &checks);
					pairs++;
				}
	block_pair(32, 0, 528, 16, &seed, &checks);
	block_pair(528, 16, 32, 0, &seed, &checks);
	pairs += 2;
	print_message("block sizes: %u pairs compiled, %u pulls identity-checked\n",
		      pairs, checks);
	assert_int_equal(pairs, 363);
	assert_int_equal(checks, 4 * 363);
}

/* ---- kvp_notify_expected() against its definition ---------------------- */

/* A copy of layout `l` as rank `rank` of its engine (public API only). */
static kvp_layout *kvt_with_rank(const kvp_layout *l, uint32_t rank)
{
	struct kvp_layout_info li;
	struct kvp_layout_attr a = { 0 };
	struct kvp_group_desc g;
	struct kvp_view_desc v;
	struct kvp_field_desc f;
	kvp_layout *out;
	uint64_t size;
	uint32_t i, view;

	kvp_layout_get_info(l, &li);
	a.engine_id = li.engine_id;
	a.tp_size = li.tp_size;
	a.tp_rank = rank;
	assert_int_equal(kvp_layout_create(&a, &out), 0);
	for (i = 0; i < li.ngroups; i++) {
		assert_int_equal(kvp_layout_get_group(l, i, &g), 0);
		assert_int_equal(kvp_layout_add_group(out, &g, NULL), 0);
	}
	for (i = 0; i < li.nregions; i++) {
		assert_int_equal(kvp_layout_get_region(l, i, &size), 0);
		assert_int_equal(kvp_layout_add_region(out, size, NULL), 0);
	}
	for (i = 0; i < li.nviews; i++) {
		assert_int_equal(kvp_layout_get_view(l, i, &v), 0);
		assert_int_equal(kvp_layout_add_view(out, &v, NULL), 0);
	}
	for (i = 0; i < li.nfields; i++) {
		assert_int_equal(kvp_layout_get_field(l, i, &view, &f), 0);
		assert_int_equal(kvp_layout_add_field(out, view, &f), 0);
	}
	return out;
}

/*
 * The definition: compile every consumer rank's plan and count, for each
 * producer rank, the notify lists naming it (what kvp_notify_expected()
 * computed before it grouped ranks into classes). Fills count[P], or
 * returns the first failing rank's error.
 */
static int notify_reference(const kvp_layout *prod, const kvp_layout *cons,
			    uint32_t *count)
{
	struct kvp_layout_info pi, ci;
	kvp_layout *tmp;
	uint32_t c, i;
	int err = 0;

	kvp_layout_get_info(prod, &pi);
	kvp_layout_get_info(cons, &ci);
	memset(count, 0, pi.tp_size * sizeof(*count));
	for (c = 0; !err && c < ci.tp_size; c++) {
		struct kvp_plan_info info;
		kvp_plan *plan;

		tmp = kvt_with_rank(cons, c);
		err = kvp_plan_compile(tmp, prod, NULL, &plan, NULL, 0);
		kvp_layout_destroy(tmp);
		if (err)
			break;
		kvp_plan_get_info(plan, &info);
		for (i = 0; i < info.nnotify; i++)
			count[kvp_plan_notify(plan, i)]++;
		kvp_plan_destroy(plan);
	}
	return err;
}

/* Both definitions agree for every producer rank; returns 1 if the pair
 * compiles. */
static int notify_agree(const struct kvp_model *m, uint32_t P, uint32_t D,
			uint32_t play, uint32_t clay)
{
	kvp_layout *prod = kvt_build(m, P, P - 1, 4, 0, 8, play);
	kvp_layout *cons = kvt_build(m, D, 0, 4, 0, 8, clay);
	uint32_t *count = calloc(P, sizeof(*count)), p;
	int ref, got;

	assert_non_null(count);
	if (!prod || !cons) {
		ref = -1;
		goto out;
	}
	ref = notify_reference(prod, cons, count);
	for (p = 0; p < P; p++) {
		got = kvp_notify_expected(prod, cons, p);
		if (got != (ref ? ref : (int)count[p]))
			fail_msg("%s P %u D %u layouts %u/%u producer %u: %d, want %d",
				 m->name, P, D, play, clay, p, got,
				 ref ? ref : (int)count[p]);
		/* The producer's handshake count, without compiling: the
		 * same wherever every plan compiles. */
		got = kvp__notify_count(prod, cons, p, NULL, 0);
		if (!ref && got != (int)count[p])
			fail_msg("%s P %u D %u layouts %u/%u producer %u: kvp__notify_count %d, want %u",
				 m->name, P, D, play, clay, p, got, count[p]);
		if (ref && got != -EPROTO && got < 1)
			fail_msg("%s: kvp__notify_count %d after a refusal",
				 m->name, got);
	}
out:
	free(count);
	kvp_layout_destroy(prod);
	kvp_layout_destroy(cons);
	return ref == 0;
}

static const struct kvp_model ne_models[] = {
	{ .name = "gqa-12", .layers = 2, .kv_heads = 12, .head_dim = 4,
	  .dtype_bytes = 2 },
	{ .name = "gqa-8", .layers = 2, .kv_heads = 8, .head_dim = 4,
	  .dtype_bytes = 2, .sliding_layers = 1 },
	{ .name = "mla", .layers = 2, .head_dim = 8, .dtype_bytes = 2,
	  .mla_latent = 8 },
	{ .name = "mamba2-12", .layers = 1, .kv_heads = 6, .head_dim = 4,
	  .dtype_bytes = 2, .state_kind = KVP_STATE_MAMBA2, .state_layers = 2,
	  .conv_kernel = 4, .ssm_heads = 12, .ssm_head_dim = 2, .ssm_state = 4,
	  .ssm_groups = 3, .state_dtype_bytes = 2 },
	{ .name = "gdn-8", .layers = 1, .kv_heads = 2, .head_dim = 4,
	  .dtype_bytes = 2, .state_kind = KVP_STATE_GDN, .state_layers = 2,
	  .conv_kernel = 4, .ssm_heads = 8, .ssm_head_dim = 2, .ssm_state = 2,
	  .ssm_groups = 4, .state_dtype_bytes = 2 },
};

/*
 * Every TP pair of {1, 2, 3, 4, 6, 8, 12, 16, 24, 48} for GQA, MLA and
 * hybrid models (pairs the model does not fit are skipped), and producer /
 * consumer layouts apart: the class-based count equals the per-rank
 * definition for every producer rank.
 */
static void test_notify_expected_matrix(void **state)
{
	static const uint32_t tp[] = { 1, 2, 3, 4, 6, 8, 12, 16, 24, 48 };
	uint32_t mi, a, b, pairs = 0, per_model;

	(void)state;
	for (mi = 0; mi < sizeof(ne_models) / sizeof(ne_models[0]); mi++) {
		per_model = 0;
		for (a = 0; a < 10; a++)
			for (b = 0; b < 10; b++)
				per_model += (uint32_t)notify_agree(
					&ne_models[mi], tp[a], tp[b],
					(a + b) % KVP_KV_LAYOUT_COUNT,
					(a * 3 + b) % KVP_KV_LAYOUT_COUNT);
		print_message("notify_expected: %s: %u TP pairs agree\n",
			      ne_models[mi].name, per_model);
		assert_true(per_model >= 16);
		pairs += per_model;
	}
	assert_true(pairs >= 200);
}

/*
 * The costliest valid consumer layout known (issue 18): llama-3.1-8b with
 * 31-token blocks against 16 and every field's strides reversed, so that
 * no two elements are contiguous on both sides: about a million piece
 * templates (0.4 s and 16 MB) before KVP_PLAN_MAX_WORK. The consumer's
 * compilation refuses it with -EFBIG after making at most the budget's
 * pieces; kvp_notify_expected() too (its compilations share one budget);
 * the producer's handshake count makes none and accepts it (the consumer
 * refuses itself). The same layout with 16-token blocks is within the
 * budget and compiles.
 */
static kvp_layout *strides_reversed(const kvp_layout *l)
{
	struct kvp_layout_info li;
	struct kvp_layout_attr at = { 0 };
	kvp_layout *o = NULL;
	uint32_t i, id, d, view;

	kvp_layout_get_info(l, &li);
	at.engine_id = li.engine_id;
	at.tp_size = li.tp_size;
	at.tp_rank = li.tp_rank;
	assert_int_equal(kvp_layout_create(&at, &o), 0);
	for (i = 0; i < li.ngroups; i++) {
		struct kvp_group_desc g;

		assert_int_equal(kvp_layout_get_group(l, i, &g), 0);
		assert_int_equal(kvp_layout_add_group(o, &g, &id), 0);
	}
	for (i = 0; i < li.nregions; i++) {
		uint64_t s;

		assert_int_equal(kvp_layout_get_region(l, i, &s), 0);
		assert_int_equal(kvp_layout_add_region(o, s, &id), 0);
	}
	for (i = 0; i < li.nviews; i++) {
		struct kvp_view_desc v;

		assert_int_equal(kvp_layout_get_view(l, i, &v), 0);
		assert_int_equal(kvp_layout_add_view(o, &v, &id), 0);
	}
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;
		uint64_t st;

		assert_int_equal(kvp_layout_get_field(l, i, &view, &f), 0);
		for (d = 0, st = f.elem_size; d < f.ndim; d++) {
			f.dim[d].stride = st;
			st *= f.dim[d].size;
		}
		assert_int_equal(kvp_layout_add_field(o, view, &f), 0);
	}
	return o;
}

/* Wall time of fn over n calls, in microseconds a call (printed, never
 * asserted: a figure, not a test). */
static double us_per_call(double t0, double t1, uint32_t n)
{
	return (t1 - t0) / n * 1e6;
}

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void test_plan_cost(void **state)
{
	struct kvp_model m;
	kvp_layout *prod, *c31, *r31, *c16, *r16, *d;
	kvp_plan *p = PLAN_SENTINEL;
	char msg[256] = "";
	uint8_t blob[16384];
	size_t len = 0;
	double t0, t[4];
	uint32_t i;

	(void)state;
	assert_int_equal(kvp_model_preset("llama-3.1-8b", &m), 0);
	prod = kvt_build(&m, 1, 0, 16, 0, 64, KVP_KV_FLASH_HND);
	c31 = kvt_build(&m, 1, 0, 31, 0, 64, KVP_KV_FLASH_HND);
	c16 = kvt_build(&m, 1, 0, 16, 0, 64, KVP_KV_FLASH_HND);
	assert_true(prod && c31 && c16);
	r31 = strides_reversed(c31);
	r16 = strides_reversed(c16);
	assert_true(kvp_layout_compat_hash(r31) ==
		    kvp_layout_compat_hash(prod));
	assert_int_equal(kvp_plan_compile(r31, prod, NULL, &p, msg,
					  sizeof(msg)),
			 -EFBIG);
	assert_ptr_equal(p, PLAN_SENTINEL);
	assert_string_equal(msg,
			    "group 0 layer 0 K: plan too costly: over 65536 piece templates (KVP_PLAN_MAX_WORK)");
	assert_int_equal(kvp_notify_expected(prod, r31, 0), -EFBIG);
	assert_int_equal(kvp__notify_count(prod, r31, 0, NULL, 0), 1);
	/* within the budget: compiles (every element its own piece) */
	assert_int_equal(kvp_plan_compile(r16, prod, NULL, &p, NULL, 0), 0);
	kvp_plan_destroy(p);
	/* The figures the README quotes: what the costliest blob costs a
	 * producer's handshake (decode, then the compile-free count) and a
	 * consumer (the refusal), and the compilation of the same layout
	 * with 16-token blocks (32,768 templates, within the budget). */
	assert_int_equal(kvp_meta_encode(r31, blob, sizeof(blob), &len), 0);
	t0 = now_s();
	for (i = 0; i < 100; i++) {
		assert_int_equal(kvp_meta_decode(blob, len, &d), 0);
		kvp_layout_destroy(d);
	}
	t[0] = us_per_call(t0, now_s(), 100);
	t0 = now_s();
	for (i = 0; i < 100; i++)
		assert_int_equal(kvp__notify_count(prod, r31, 0, NULL, 0), 1);
	t[1] = us_per_call(t0, now_s(), 100);
	t0 = now_s();
	for (i = 0; i < 100; i++)
		assert_int_equal(kvp_plan_compile(r31, prod, NULL, &p, NULL,
						  0),
				 -EFBIG);
	t[2] = us_per_call(t0, now_s(), 100);
	t0 = now_s();
	assert_int_equal(kvp_plan_compile(r16, prod, NULL, &p, NULL, 0), 0);
	t[3] = us_per_call(t0, now_s(), 1);
	kvp_plan_destroy(p);
	print_message("costliest blob (%zu B): producer decode %.1f us + count %.1f us; consumer refusal %.1f us; 16-token twin compiles in %.0f us\n",
		      len, t[0], t[1], t[2], t[3]);
	assert_int_equal(kvp_notify_expected(prod, r16, 0), 1);
	kvp_layout_destroy(r16);
	kvp_layout_destroy(r31);
	kvp_layout_destroy(c16);
	kvp_layout_destroy(c31);
	kvp_layout_destroy(prod);
}

/*
 * Refusal that depends on the consumer rank: 2301 heads, producer TP 767
 * (3 heads each), consumer TP 3 (767 heads each). Consumer ranks 0 and 2
 * read from 256 producer ranks, rank 1 from 257, one more than a plan's
 * per-field limit: one compilation (of rank 0) would accept the pair.
 */
static void test_notify_expected_rank_refusal(void **state)
{
	struct kvp_model m = { .name = "wide", .layers = 1, .kv_heads = 2301,
			       .head_dim = 1, .dtype_bytes = 2 };
	kvp_layout *prod = kvt_build(&m, 767, 0, 4, 0, 2, KVP_KV_FLASH_HND);
	kvp_layout *cons = kvt_build(&m, 3, 0, 4, 0, 2, KVP_KV_FLASH_HND);
	kvp_layout *c1 = NULL;
	uint32_t count[767];
	kvp_plan *p;

	(void)state;
	assert_non_null(prod);
	assert_non_null(cons);
	assert_int_equal(kvp_plan_compile(cons, prod, NULL, &p, NULL, 0), 0);
	kvp_plan_destroy(p);
	c1 = kvt_with_rank(cons, 1);
	assert_int_equal(kvp_plan_compile(c1, prod, NULL, &p, NULL, 0), -EPROTO);
	assert_int_equal(notify_reference(prod, cons, count), -EPROTO);
	assert_int_equal(kvp_notify_expected(prod, cons, 0), -EPROTO);
	assert_int_equal(kvp_notify_expected(prod, c1, 766), -EPROTO);
	/* the segments' limit needs no plan: the producer refuses too */
	assert_int_equal(kvp__notify_count(prod, cons, 0, NULL, 0), -EPROTO);
	kvp_layout_destroy(c1);
	kvp_layout_destroy(cons);
	kvp_layout_destroy(prod);
}

/*
 * Layouts with a group and nothing in it (a peer may send one): the plan
 * compiles with no sets and no pieces, and a request emits no WR. Found by
 * fuzz_plan: the plan's empty arrays were copied from NULL (UBSan).
 */
static void test_empty_layouts(void **state)
{
	struct kvp_layout_attr a = { .tp_size = 2 };
	struct kvp_group_desc g = { .kind = KVP_GROUP_FULL, .block_tokens = 16 };
	struct kvp_ids ids = { 0 };
	struct kvp_plan_info pi;
	kvp_layout *l, *r;
	kvp_plan *p;
	uint32_t src_end[2];

	(void)state;
	assert_int_equal(kvp_layout_create(&a, &l), 0);
	a.tp_size = 1;
	assert_int_equal(kvp_layout_create(&a, &r), 0);
	assert_int_equal(kvp_layout_add_group(l, &g, NULL), 0);
	assert_int_equal(kvp_layout_add_group(r, &g, NULL), 0);
	assert_int_equal(kvp_plan_compile(l, r, NULL, &p, NULL, 0), 0);
	kvp_plan_get_info(p, &pi);
	assert_int_equal(pi.nstreams, 0);
	assert_int_equal(pi.npieces, 0);
	assert_int_equal(pi.nsrc, 0);
	assert_int_equal(pi.nnotify, 1);
	assert_int_equal(kvp_plan_emit(p, &ids, NULL, 0, NULL, 0, src_end), 0);
	kvp_plan_destroy(p);
	assert_int_equal(kvp_notify_expected(r, l, 0), 2);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_proto),
		cmocka_unit_test(test_einval),
		cmocka_unit_test(test_size_independent_of_blocks),
		cmocka_unit_test(test_sources),
		cmocka_unit_test(test_exhaustive_tp),
		cmocka_unit_test(test_block_sizes),
		cmocka_unit_test(test_notify_expected_matrix),
		cmocka_unit_test(test_notify_expected_rank_refusal),
		cmocka_unit_test(test_plan_cost),
		cmocka_unit_test(test_empty_layouts),
		cmocka_unit_test(test_layer_bound),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
