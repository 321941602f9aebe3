// SPDX-License-Identifier: MIT
/*
 * Windowed emission (kvp_plan_emit_check/start/window/done): exact windows
 * and positions for small hand-checked cases (1:1 periods and filtered
 * periods of mismatched block sizes), the rejection paths, and, over a
 * matrix of layout pairs and random requests, the equivalence with
 * kvp_plan_emit(): per source, the windows' byte mapping (remote region,
 * offset) -> (local region, offset) is exactly kvp_plan_emit()'s, for
 * window caps 1, 2, 3, 7 (with room for max_sge SGEs a WR, or one SGE a
 * WR) and unbounded, where one window is exactly kvp_plan_emit()'s WRs of
 * the source.
 *
 * The hand-checked model is tests/test_emit.c's: 1 layer, 2 KV heads, head
 * dim 4, 2-byte elements, FLASH_HND; region 0 holds K and region 1 V; a
 * 4-token page is 64 bytes, head h of block b at 64 * b + 32 * h.
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
#include <infiniband/verbs.h>

#include "kvtest.h"


#define HND KVP_KV_FLASH_HND
#define NHD KVP_KV_FLASH_NHD
#define FI KVP_KV_FLASHINFER
#define PK KVP_KV_PACKED

/* One request's ids of one group. */
#define IDS(l, nl, r, nr, tok)                                              \
	((struct kvp_ids){ .local = (l), .remote = (r), .nlocal = (nl),     \
			   .nremote = (nr), .tokens = (tok) })

/* The hand-checked model: see the top of the file. */
static const struct kvp_model hand_model = {
	.name = "hand", .layers = 1, .kv_heads = 2, .head_dim = 4,
	.dtype_bytes = 2,
};

/* Hybrid and MLA models small enough to check fast. */
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

static const struct kvp_model mla_tiny = {
	.name = "mla-tiny", .layers = 3, .kv_heads = 1, .head_dim = 24,
	.dtype_bytes = 2, .mla_latent = 24,
};

static const struct kvp_model sliding_tiny = {
	.name = "sliding-tiny", .layers = 4, .kv_heads = 4, .head_dim = 4,
	.dtype_bytes = 2, .sliding_layers = 3,
};

static const struct kvp_model dense8 = {
	.name = "dense8", .layers = 2, .kv_heads = 8, .head_dim = 4,
	.dtype_bytes = 2,
};

/* A producer engine of TP P and a consumer engine of TP D: block size,
 * kernel block size, KV layout and conv layout on each side, max_sge. */
struct wcase {
	const struct kvp_model *m;
	uint32_t P, D;
	uint32_t rblock, rkernel, rkv, rconv;
	uint32_t lblock, lkernel, lkv, lconv;
	uint32_t max_sge;
	uint32_t max_len; /* kvp_plan_attr.max_len; 0: not set */
};

#define NWCASE (sizeof(wcases) / sizeof(wcases[0]))
#define NBLOCKS 256u
#define MAXN 16u /* ids a side per group */
#define NREQ 6u	 /* requests per consumer rank */
#define MAXG 3u

static kvp_layout *wbuild(const struct wcase *c, int remote, uint32_t rank)
{
	struct kvp_engine_desc e = { 0 };
	kvp_layout *l = NULL;

	e.engine_id = remote ? 1 : 2;
	e.tp_size = remote ? c->P : c->D;
	e.tp_rank = rank;
	e.block_tokens = remote ? c->rblock : c->lblock;
	e.kernel_block_tokens = remote ? c->rkernel : c->lkernel;
	e.num_blocks = NBLOCKS;
	e.kv_layout = remote ? c->rkv : c->lkv;
	e.conv_layout = remote ? c->rconv : c->lconv;
	assert_int_equal(kvp_layout_build(c->m, &e, &l), 0);
	return l;
}

/* A consumer rank's plan against its producer engine. */
struct pair {
	kvp_layout *loc, *rem;
	kvp_plan *plan;
};

static void pair_open(struct pair *x, const struct wcase *c, uint32_t rank)
{
	struct kvp_plan_attr attr = { .max_sge = c->max_sge };
	char msg[160] = "";
	int err;

	if (c->max_len) {
		attr.comp_mask = KVP_PLAN_ATTR_MAX_LEN;
		attr.max_len = c->max_len;
	}
	x->rem = wbuild(c, 1, 0);
	x->loc = wbuild(c, 0, rank);
	err = kvp_plan_compile(x->loc, x->rem, &attr, &x->plan, msg,
			       sizeof(msg));
	if (err)
		fail_msg("compile: %d %s", err, msg);
}

static void pair_close(struct pair *x)
{
	kvp_plan_destroy(x->plan);
	kvp_layout_destroy(x->loc);
	kvp_layout_destroy(x->rem);
}

/* A hand-checked plan: producer TP P, remote blocks of rblock tokens,
 * local ones of 4, and one request's windows. */
struct hand {
	struct pair x;
	struct kvp_ids ids;
	struct kvp_emit_pos pos;
	struct kvp_wr wr[8];
	struct kvp_sge sge[8];
};

static void hand_open(struct hand *h, uint32_t P, uint32_t rblock,
		      uint32_t max_sge)
{
	const struct wcase c = { &hand_model, P, 1, rblock, 0, HND, 0,
				 4, 0, HND, 0, max_sge, 0 };

	pair_open(&h->x, &c, 0);
}

static void pos_is(const struct kvp_emit_pos *p, uint32_t stream,
		   uint32_t end, uint32_t period, uint32_t piece, uint32_t src)
{
	if (p->stream != stream || p->end != end || p->period != period ||
	    p->piece != piece || p->src != src)
		fail_msg("pos (%u %u %u %u %u), want (%u %u %u %u %u)",
			 p->stream, p->end, p->period, p->piece, p->src, stream,
			 end, period, piece, src);
}

/* WR i of a window: remote (offset, len, region), then nsge (offset, len)
 * SGEs in the same local region; sge_first is checked against the running
 * count. */
static void wr_is(const struct hand *h, uint32_t i, uint64_t off,
		  uint32_t len, uint32_t region, uint32_t nsge, ...)
{
	const struct kvp_wr *wr = h->wr, *w = &wr[i];
	uint32_t k, first = 0;
	va_list ap;

	for (k = 0; k < i; k++)
		first += wr[k].nsge;
	if (w->offset != off || w->len != len || w->region != region ||
	    w->src != 0 || w->group != 0 || w->nsge != nsge ||
	    w->sge_first != first)
		fail_msg("wr %u: (%llu %u %u src %u group %u nsge %u first %u), want (%llu %u %u 0 0 %u %u)",
			 i, (unsigned long long)w->offset, w->len, w->region,
			 w->src, w->group, w->nsge, w->sge_first,
			 (unsigned long long)off, len, region, nsge, first);
	va_start(ap, nsge);
	for (k = 0; k < nsge; k++) {
		const struct kvp_sge *s = &h->sge[first + k];
		uint64_t so = va_arg(ap, uint64_t);
		uint32_t sl = va_arg(ap, uint32_t);

		if (s->offset != so || s->len != sl || s->region != region)
			fail_msg("wr %u sge %u: (%llu %u %u), want (%llu %u %u)",
				 i, k, (unsigned long long)s->offset, s->len,
				 s->region, (unsigned long long)so, sl, region);
	}
	va_end(ap);
}

#define S(off, len) (uint64_t)(off), (uint32_t)(len)

/* One window of at most wcap WRs and scap SGEs: returns its count, checks
 * *bytes. */
static int window(const kvp_plan *plan, const struct kvp_ids *ids,
		  struct kvp_emit_pos *pos, struct kvp_wr *wr, uint32_t wcap,
		  struct kvp_sge *sge, uint32_t scap, uint64_t want_bytes)
{
	uint64_t bytes = ~0ull;
	int n = kvp_plan_emit_window(plan, ids, pos, wr, wcap, sge, scap,
				     &bytes);

	assert_true(n >= 0);
	assert_int_equal(bytes, want_bytes);
	return n;
}

/* The next window of h's request. */
static int win(struct hand *h, uint32_t wcap, uint32_t scap,
	       uint64_t want_bytes)
{
	return window(h->x.plan, &h->ids, &h->pos, h->wr, wcap, h->sge, scap,
		      want_bytes);
}

/* ---- exact windows ------------------------------------------------------ */

/*
 * Remote blocks 7 8 9 contiguous, local 3 5 7 not, max_sge 4:
 * kvp_plan_emit() writes one WR of three SGEs per region. Windows of one
 * WR and two SGEs cut each into a WR of two SGEs and a WR of one, and the
 * position says where: stream (K 0, V 1), period (block of the request),
 * piece 0 (whole pages: one piece per period).
 */
static void test_exact_simple(void **state)
{
	static const uint32_t l[] = { 3, 5, 7 }, r[] = { 7, 8, 9 };
	struct kvp_emit_pos zero = { 0 };
	struct hand h;

	(void)state;
	hand_open(&h, 1, 4, 4);
	h.ids = IDS(l, 3, r, 3, 0);
	assert_int_equal(kvp_plan_emit_check(h.x.plan, &h.ids), 0);
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &h.ids, 0, &h.pos), 0);
	pos_is(&h.pos, 0, 2, 0, 0, 0);
	assert_int_equal(kvp_plan_emit_done(&h.pos), 0);

	assert_int_equal(win(&h, 1, 2, 128), 1);
	wr_is(&h, 0, 448, 128, 0, 2, S(192, 64), S(320, 64));
	pos_is(&h.pos, 0, 2, 2, 0, 0);
	/* the rest of K; V's first piece would open a second WR */
	assert_int_equal(win(&h, 1, 2, 64), 1);
	wr_is(&h, 0, 576, 64, 0, 1, S(448, 64));
	pos_is(&h.pos, 1, 2, 0, 0, 0);
	/* two WRs' room, two SGEs: V's first two blocks, in one WR */
	assert_int_equal(win(&h, 2, 2, 128), 1);
	wr_is(&h, 0, 448, 128, 1, 2, S(192, 64), S(320, 64));
	pos_is(&h.pos, 1, 2, 2, 0, 0);
	assert_int_equal(kvp_plan_emit_done(&h.pos), 0);
	assert_int_equal(win(&h, 8, 8, 64), 1);
	wr_is(&h, 0, 576, 64, 1, 1, S(448, 64));
	pos_is(&h.pos, 2, 2, 0, 0, 0);
	assert_int_equal(kvp_plan_emit_done(&h.pos), 1);
	assert_int_equal(win(&h, 8, 8, 0), 0);
	pos_is(&h.pos, 2, 2, 0, 0, 0);

	/* unbounded: kvp_plan_emit()'s two WRs, across both streams */
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &h.ids, 0, &h.pos), 0);
	assert_int_equal(win(&h, 8, 8, 384), 2);
	wr_is(&h, 0, 448, 192, 0, 3, S(192, 64), S(320, 64), S(448, 64));
	wr_is(&h, 1, 448, 192, 1, 3, S(192, 64), S(320, 64), S(448, 64));
	assert_int_equal(kvp_plan_emit_done(&h.pos), 1);

	/* one SGE a window, two WRs of room: one block at a time */
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &h.ids, 0, &h.pos), 0);
	assert_int_equal(win(&h, 2, 1, 64), 1);
	wr_is(&h, 0, 448, 64, 0, 1, S(192, 64));
	pos_is(&h.pos, 0, 2, 1, 0, 0);

	/* a zeroed position is finished */
	assert_int_equal(kvp_plan_emit_done(&zero), 1);
	assert_int_equal(window(h.x.plan, &h.ids, &zero, h.wr, 8, h.sge, 8, 0), 0);
	pair_close(&h.x);
}

/*
 * Remote 8-token blocks, local 4-token ones: a period is one remote block
 * and two local ones, four pieces in remote order: (L0 head 0), (L1 head
 * 0), (L0 head 1), (L1 head 1), at remote 0, 32, 64, 96 of the page.
 * kvp_plan_emit() writes one WR of four SGEs per region; with a prefix hit
 * of one local block the L0 pieces are filtered out.
 */
static void test_exact_periods(void **state)
{
	static const uint32_t l[] = { 2, 3 }, r[] = { 5 };
	/* where the hit's windows stop: (stream, piece) */
	static const uint32_t stop[4][2] = { { 0, 3 }, { 1, 1 }, { 1, 3 },
					     { 2, 0 } };
	struct hand h;
	uint32_t i;

	(void)state;
	hand_open(&h, 1, 8, 4);
	h.ids = IDS(l, 2, r, 1, 0);
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &h.ids, 0, &h.pos), 0);
	assert_int_equal(win(&h, 1, 3, 96), 1);
	wr_is(&h, 0, 640, 96, 0, 3, S(128, 32), S(192, 32), S(160, 32));
	pos_is(&h.pos, 0, 2, 0, 3, 0);
	assert_int_equal(win(&h, 1, 3, 32), 1);
	wr_is(&h, 0, 736, 32, 0, 1, S(224, 32));
	pos_is(&h.pos, 1, 2, 0, 0, 0);
	assert_int_equal(win(&h, 7, 7, 128), 1);
	wr_is(&h, 0, 640, 128, 1, 4, S(128, 32), S(192, 32), S(160, 32),
	      S(224, 32));
	assert_int_equal(kvp_plan_emit_done(&h.pos), 1);

	/* the hit: pieces 0 and 2 filtered, each window stops at the next
	 * piece it cannot take, never at a filtered one */
	h.ids = IDS(l + 1, 1, r, 1, 0);
	assert_int_equal(kvp_plan_emit_check(h.x.plan, &h.ids), 0);
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &h.ids, 0, &h.pos), 0);
	pos_is(&h.pos, 0, 2, 0, 0, 0);
	for (i = 0; i < 4; i++) {
		/* (K, V) x (block 3 head 0, block 3 head 1), one a window */
		assert_int_equal(win(&h, 1, 4, 32), 1);
		wr_is(&h, 0, 672 + 64 * (i & 1), 32, i / 2, 1,
		      S(192 + 32 * (i & 1), 32));
		pos_is(&h.pos, stop[i][0], 2, 0, stop[i][1], 0);
	}
	assert_int_equal(kvp_plan_emit_done(&h.pos), 1);

	/* a full hit: done at once */
	h.ids = IDS(NULL, 0, r, 1, 0);
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &h.ids, 0, &h.pos), 0);
	pos_is(&h.pos, 2, 2, 0, 0, 0);
	assert_int_equal(kvp_plan_emit_done(&h.pos), 1);
	assert_int_equal(win(&h, 8, 8, 0), 0);
	pair_close(&h.x);
}

/* ---- rejections ---------------------------------------------------------- */

/* kvp_plan_emit_check() answers as kvp_plan_emit() does; start and window
 * refuse bad arguments with -EINVAL and leave pos and the arrays alone; a
 * rank only notified has no source index. */
static void test_rejects(void **state)
{
	static const uint32_t l[] = { 3, 4, 5, 6 }, r[] = { 7, 8, 9, 10 };
	static const uint32_t big[] = { 3, NBLOCKS }, rbig[] = { NBLOCKS, 8 };
	const struct kvp_ids bad[] = {
		IDS(big, 2, r, 2, 0),	   /* local id NBLOCKS: -ERANGE */
		IDS(l, 2, rbig, 2, 0),   /* remote id NBLOCKS */
		IDS(l, 4, r, 4, 9),	   /* 9 tokens span 3 local blocks */
		IDS(l, 3, r, 2, 0),	   /* more local than remote */
		IDS(l, 2, r, 4, 17),	   /* tokens past the remote blocks */
		IDS(NULL, 2, r, 4, 0),   /* NULL with a length */
		IDS(l, 2, NULL, 4, 0),
	};
	const struct kvp_ids good = IDS(l, 2, r, 4, 0);
	struct kvp_plan_info pi;
	struct kvp_emit_pos pos, canary;
	struct kvp_wr wr[4], wc[4];
	struct kvp_sge sge[4], sc[4];
	uint64_t bytes;
	struct hand h;
	kvp_plan *plan;
	uint32_t i;

	(void)state;
	hand_open(&h, 4, 4, 2);
	plan = h.x.plan;
	/* 2 KV heads on 4 producers: the consumer reads one replica of each
	 * head (2 sources) and notifies all 4 */
	kvp_plan_get_info(plan, &pi);
	assert_int_equal(pi.nsrc, 2);
	assert_int_equal(pi.nnotify, 4);
	assert_int_equal(pi.nstreams, 4);
	memset(&canary, 0xa5, sizeof(canary));
	memset(wc, 0xa5, sizeof(wc));
	memset(sc, 0xa5, sizeof(sc));

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int want = i < 2 ? -ERANGE : -EINVAL;

		assert_int_equal(kvp_plan_emit(plan, &bad[i], wr, 4, sge, 4,
					       NULL),
				 want);
		assert_int_equal(kvp_plan_emit_check(plan, &bad[i]), want);
		/* start reads no id: only the length rules */
		pos = canary;
		assert_int_equal(kvp_plan_emit_start(plan, &bad[i], 0, &pos),
				 i < 2 ? 0 : -EINVAL);
		if (i >= 2)
			assert_memory_equal(&pos, &canary, sizeof(pos));
	}
	assert_int_equal(kvp_plan_emit_check(plan, &good), 0);
	assert_int_equal(kvp_plan_emit_check(NULL, &good), -EINVAL);
	assert_int_equal(kvp_plan_emit_check(plan, NULL), -EINVAL);

	pos = canary;
	assert_int_equal(kvp_plan_emit_start(plan, &good, 2, &pos), -EINVAL);
	assert_int_equal(kvp_plan_emit_start(plan, &good, 3, &pos), -EINVAL);
	assert_int_equal(kvp_plan_emit_start(NULL, &good, 0, &pos), -EINVAL);
	assert_int_equal(kvp_plan_emit_start(plan, NULL, 0, &pos), -EINVAL);
	assert_memory_equal(&pos, &canary, sizeof(pos));
	assert_int_equal(kvp_plan_emit_start(plan, &good, 0, NULL), -EINVAL);
	assert_int_equal(kvp_plan_emit_start(plan, &good, 1, &pos), 0);
	pos_is(&pos, 2, 4, 0, 0, 1);

	/* window: NULLs and a position past the plan's streams */
	canary = pos;
	memcpy(wr, wc, sizeof(wr));
	memcpy(sge, sc, sizeof(sge));
	bytes = 7;
	assert_int_equal(kvp_plan_emit_window(NULL, &good, &pos, wr, 4, sge,
					      4, &bytes),
			 -EINVAL);
	assert_int_equal(kvp_plan_emit_window(plan, NULL, &pos, wr, 4, sge, 4,
					      &bytes),
			 -EINVAL);
	assert_int_equal(kvp_plan_emit_window(plan, &good, NULL, wr, 4, sge,
					      4, &bytes),
			 -EINVAL);
	assert_int_equal(kvp_plan_emit_window(plan, &good, &pos, NULL, 4, sge,
					      4, &bytes),
			 -EINVAL);
	assert_int_equal(kvp_plan_emit_window(plan, &good, &pos, wr, 4, NULL,
					      4, &bytes),
			 -EINVAL);
	pos.end = 5;
	assert_int_equal(kvp_plan_emit_window(plan, &good, &pos, wr, 4, sge,
					      4, &bytes),
			 -EINVAL);
	pos.end = 4;
	/* ids whose lengths no longer fit: -EINVAL before anything */
	assert_int_equal(kvp_plan_emit_window(plan, &bad[3], &pos, wr, 4, sge,
					      4, &bytes),
			 -EINVAL);
	/* no room: 0, nothing written */
	assert_int_equal(kvp_plan_emit_window(plan, &good, &pos, wr, 0, sge,
					      4, &bytes),
			 0);
	assert_int_equal(bytes, 0);
	bytes = 7;
	assert_int_equal(kvp_plan_emit_window(plan, &good, &pos, NULL, 0, NULL,
					      0, &bytes),
			 0);
	assert_int_equal(bytes, 0);
	assert_int_equal(kvp_plan_emit_window(plan, &good, &pos, wr, 4, sge,
					      0, NULL),
			 0);
	assert_memory_equal(&pos, &canary, sizeof(pos));
	assert_memory_equal(wr, wc, sizeof(wr));
	assert_memory_equal(sge, sc, sizeof(sge));

	/* the inspection calls on NULLs: no crash, documented answers */
	assert_int_equal(kvp_plan_emit_done(NULL), -EINVAL);
	memset(&pi, 0xa5, sizeof(pi));
	kvp_plan_get_info(NULL, &pi);
	assert_int_equal(pi.nsrc, 0);
	assert_int_equal(pi.bytes, 0);
	kvp_plan_get_info(plan, NULL);
	i = 7;
	kvp_plan_emit_bound(NULL, 4, &i, NULL);
	assert_int_equal(i, 0);
	{
		uint32_t w = 0, s = 0;

		kvp_plan_emit_bound(plan, 4, &w, &s);
		assert_true(w > 0);
		kvp_plan_emit_bound(plan, 4, NULL, &i);
		assert_int_equal(i, s);
	}
	pair_close(&h.x);
}

/* ---- equivalence with kvp_plan_emit() over a matrix ----------------------- */

static const struct wcase wcases[] = {
	/* dense, same TP; TP 8 -> 2 and 2 -> 8 */
	{ &dense8, 2, 2, 16, 0, NHD, 0, 16, 0, NHD, 0, 4, 0 },
	{ &dense8, 8, 2, 16, 0, HND, 0, 16, 0, HND, 0, 16, 0 },
	{ &dense8, 2, 8, 16, 0, HND, 0, 16, 0, HND, 0, 4, 0 },
	{ &dense8, 8, 2, 16, 0, HND, 0, 16, 0, HND, 0, 1, 0 },
	/* NHD vs HND, FlashInfer, packed */
	{ &dense8, 2, 4, 16, 0, NHD, 0, 16, 0, HND, 0, 4, 0 },
	{ &dense8, 1, 1, 16, 0, HND, 0, 16, 0, NHD, 0, 1, 0 },
	{ &dense8, 4, 2, 16, 0, FI, 0, 16, 0, FI, 0, 2, 0 },
	{ &dense8, 2, 1, 16, 0, FI, 0, 16, 0, PK, 0, 3, 0 },
	/* block sizes that do not nest (16 vs 24), kernel blocks */
	{ &dense8, 1, 1, 24, 0, HND, 0, 16, 0, HND, 0, 4, 0 },
	{ &dense8, 2, 1, 16, 0, NHD, 0, 24, 0, HND, 0, 2, 0 },
	{ &dense8, 2, 2, 16, 4, NHD, 0, 8, 0, HND, 0, 8, 0 },
	{ &dense8, 1, 2, 8, 0, HND, 0, 32, 8, NHD, 0, 3, 0 },
	/* MLA (replicated) */
	{ &mla_tiny, 4, 2, 16, 0, 0, 0, 16, 0, 0, 0, 4, 0 },
	{ &mla_tiny, 1, 2, 16, 0, 0, 0, 32, 0, 0, 0, 1, 0 },
	/* hybrid state groups, conv DS and SD */
	{ &mamba_tiny, 2, 1, 16, 0, HND, KVP_CONV_DS, 8, 0, HND, KVP_CONV_SD,
	  4, 0 },
	{ &mamba_tiny, 1, 2, 8, 0, NHD, KVP_CONV_SD, 8, 0, HND, KVP_CONV_DS,
	  1, 0 },
	{ &gdn_tiny, 2, 4, 8, 0, HND, KVP_CONV_DS, 16, 4, HND, KVP_CONV_DS,
	  4, 0 },
	/* sliding window beside full attention */
	{ &sliding_tiny, 2, 1, 8, 0, HND, 0, 16, 0, NHD, 0, 2, 0 },
};

/* `n` distinct ids in [lo, hi): consecutive from a random start, or
 * random. */
static void some_ids(uint64_t *seed, uint32_t *ids, uint32_t n, uint32_t lo,
		     uint32_t hi, int consecutive)
{
	uint32_t i, start;

	assert_true(n <= hi - lo);
	if (consecutive) {
		start = lo + (uint32_t)(kvt_rand(seed) % (hi - lo - n + 1));
		for (i = 0; i < n; i++)
			ids[i] = start + i;
		return;
	}
	kvt_random_ids(seed, ids, n, hi - lo);
	for (i = 0; i < n; i++)
		ids[i] += lo;
}

struct wreq {
	struct kvp_ids ids[MAXG];
	uint32_t lid[MAXG][MAXN], rid[MAXG][MAXN];
};

/*
 * Request t of a series: in token groups a sequence of 1.. remote blocks,
 * ending mid-block on odd t, the local tail read after a prefix hit of 0
 * (t % 3 == 0), some or all (t == 5) local blocks; one or two states.
 * State ids lie in the lowest quarter of their pages, token ids above a
 * quarter of theirs, so that groups pooled in one region (hybrid models)
 * never share a byte and every remote byte is read at most once.
 */
static void make_wreq(struct wreq *q, const kvp_plan *plan, uint32_t t,
		      uint64_t *seed)
{
	struct kvp_plan_info pi;
	uint32_t g;

	memset(q, 0, sizeof(*q));
	kvp_plan_get_info(plan, &pi);
	assert_true(pi.ngroups <= MAXG);
	for (g = 0; g < pi.ngroups; g++) {
		struct kvp_plan_group pg;
		struct kvp_ids *id = &q->ids[g];
		uint32_t nr, nl, hit, maxr;
		uint64_t tokens;
		int cons = (int)(kvt_rand(seed) % 3 != 0);

		assert_int_equal(kvp_plan_get_group(plan, g, &pg), 0);
		id->local = q->lid[g];
		id->remote = q->rid[g];
		if (pg.kind == KVP_GROUP_STATE) {
			id->nlocal = id->nremote =
				1 + (uint32_t)(kvt_rand(seed) % 2);
			some_ids(seed, q->lid[g], id->nlocal, 0,
				 pg.local_blocks / 4, cons);
			some_ids(seed, q->rid[g], id->nremote, 0,
				 pg.remote_blocks / 4, cons);
			continue;
		}
		maxr = MAXN;
		if (pg.remote_tokens > pg.local_tokens)
			maxr = MAXN * pg.local_tokens / pg.remote_tokens;
		nr = 1 + (uint32_t)(kvt_rand(seed) % maxr);
		tokens = (uint64_t)nr * pg.remote_tokens;
		if (t & 1)
			tokens -= 1 + kvt_rand(seed) % (pg.remote_tokens - 1);
		nl = (uint32_t)((tokens + pg.local_tokens - 1) /
				pg.local_tokens);
		assert_true(nl <= MAXN);
		hit = t % 3 == 0 ? 0 : (uint32_t)(kvt_rand(seed) % nl);
		if (t == 5)
			hit = nl;
		id->nremote = nr;
		id->nlocal = nl - hit;
		id->tokens = t & 1 ? tokens : 0;
		some_ids(seed, q->rid[g], nr, pg.remote_blocks / 4,
			 pg.remote_blocks, cons);
		some_ids(seed, q->lid[g], id->nlocal, pg.local_blocks / 4,
			 pg.local_blocks, kvt_rand(seed) & 1);
	}
}

/* A run of the byte mapping: len bytes at remote (src, rreg, roff) land at
 * local (lreg, loff). */
struct run {
	uint32_t src, rreg, lreg, len;
	uint64_t roff, loff;
};

/* Appends the runs of n WRs (sge_first relative to sge) to r[*nr]; checks
 * each WR's shape. Returns the bytes. */
static uint64_t expand(const struct kvp_wr *wr, uint32_t n,
		       const struct kvp_sge *sge, const struct kvp_plan_info *pi,
		       struct run *r, uint32_t *nr)
{
	uint64_t bytes = 0;
	uint32_t i, k;

	for (i = 0; i < n; i++) {
		const struct kvp_wr *w = &wr[i];
		uint64_t ro = w->offset, sum = 0;

		assert_true(w->nsge >= 1 && w->nsge <= pi->max_sge);
		assert_true(w->len <= pi->max_len);
		assert_true(w->group < pi->ngroups);
		for (k = 0; k < w->nsge; k++) {
			const struct kvp_sge *s = &sge[w->sge_first + k];
			struct run *x = &r[(*nr)++];

			assert_true(s->len > 0);
			x->src = w->src;
			x->rreg = w->region;
			x->roff = ro;
			x->lreg = s->region;
			x->loff = s->offset;
			x->len = s->len;
			ro += s->len;
			sum += s->len;
		}
		assert_int_equal(sum, w->len);
		bytes += w->len;
	}
	return bytes;
}

static int run_cmp(const void *a, const void *b)
{
	const struct run *x = a, *y = b;

	if (x->src != y->src)
		return x->src < y->src ? -1 : 1;
	if (x->rreg != y->rreg)
		return x->rreg < y->rreg ? -1 : 1;
	if (x->roff != y->roff)
		return x->roff < y->roff ? -1 : 1;
	return 0;
}

/* Sorts runs by remote byte and merges those that continue each other on
 * both sides: the canonical form of a byte mapping. No remote byte may
 * appear twice. Returns the new count. */
static uint32_t canon(struct run *r, uint32_t n)
{
	uint32_t i, m = 0;

	qsort(r, n, sizeof(*r), run_cmp);
	for (i = 0; i < n; i++) {
		struct run *p = m ? &r[m - 1] : NULL;

		if (p && p->src == r[i].src && p->rreg == r[i].rreg) {
			assert_true(p->roff + p->len <= r[i].roff);
			if (p->roff + p->len == r[i].roff &&
			    p->lreg == r[i].lreg &&
			    p->loff + p->len == r[i].loff) {
				p->len += r[i].len;
				continue;
			}
		}
		r[m++] = r[i];
	}
	return m;
}

/* Scratch shared by the matrix: kvp_plan_emit()'s arrays and the
 * windows'. */
struct scratch {
	uint32_t maxw, maxs;
	struct kvp_wr *ewr, *wr;
	struct kvp_sge *esge, *sge;
	struct run *er, *wrun;
	uint32_t src_end[16];
	struct ibv_send_wr *xwr; /* kvp_plan_emit_window_into()'s */
	struct kvp_emit_sge *xsge;
};

static uint64_t nwindows, nsources, nreqs, nmid, ninto;

/* Region maps for the sink: region r at (r + 1) << 40; even regions with
 * one key, odd ones with a key per MiB (a region registered in pieces). */
#define NMAP 64u
#define MAP_KEYS 4096u
#define INTO_WRID 0x77aa55ccdd11ull
static struct kvp_emit_map lmap[NMAP], rmap[NMAP];
static uint32_t lkeys[NMAP][MAP_KEYS], rkeys[NMAP][MAP_KEYS];

static void maps_init(void)
{
	uint32_t r, k;

	for (r = 0; r < NMAP; r++) {
		for (k = 0; k < MAP_KEYS; k++) {
			lkeys[r][k] = 0x10000000u | r << 16 | k;
			rkeys[r][k] = 0x20000000u | r << 16 | k;
		}
		lmap[r].addr = (uint64_t)(r + 1) << 40;
		rmap[r].addr = (uint64_t)(r + 9) << 40;
		lmap[r].key = lkeys[r];
		rmap[r].key = rkeys[r];
		lmap[r].shift = rmap[r].shift = r & 1 ? 20 : 63;
	}
}

/* A sink into struct ibv_send_wr and struct ibv_sge, through lmap and
 * rmap. */
static void sink_init(struct kvp_emit_sink *k, struct ibv_send_wr *wr,
		      struct kvp_emit_sge *sge)
{
	k->wr = wr;
	k->wr_stride = sizeof(struct ibv_send_wr);
	k->off_wr_id = offsetof(struct ibv_send_wr, wr_id);
	k->off_sg_list = offsetof(struct ibv_send_wr, sg_list);
	k->off_num_sge = offsetof(struct ibv_send_wr, num_sge);
	k->off_remote_addr = offsetof(struct ibv_send_wr, wr.rdma.remote_addr);
	k->off_rkey = offsetof(struct ibv_send_wr, wr.rdma.rkey);
	k->sge = sge;
	k->local = lmap;
	k->remote = rmap;
}

static uint32_t map_key(const struct kvp_emit_map *m, uint64_t off)
{
	assert_true((off >> m->shift) < MAP_KEYS);
	return m->key[off >> m->shift];
}

/*
 * The window that kvp_plan_emit_window() wrote from `from` (n WRs in sc,
 * `bytes`, ending at `to`), again straight into struct ibv_send_wr and
 * struct ibv_sge through the maps: the same count, position and bytes,
 * every record's fields those of the kvp_wr and kvp_sge resolved, and
 * nothing past them written.
 */
static void check_into(const kvp_plan *plan, const struct kvp_ids *ids,
		       const struct kvp_emit_pos *from,
		       const struct kvp_emit_pos *to, uint32_t w, uint32_t g,
		       const struct scratch *sc, int n, uint64_t bytes)
{
	struct kvp_emit_sink k = { 0 };
	struct kvp_emit_pos pos = *from;
	uint64_t xb = 0;
	uint32_t ns = 0, i, q, sum = 0;
	int m;

	sink_init(&k, sc->xwr, sc->xsge);
	k.wr_id = INTO_WRID;
	/* The records the window may write and the one after them. */
	for (i = 0; i < (uint32_t)n; i++)
		sum += sc->wr[i].nsge;
	memset(sc->xwr, 0xa5,
	       (size_t)((uint32_t)n < sc->maxw ? n + 1 : n) *
		       sizeof(*sc->xwr));
	memset(sc->xsge, 0xa5,
	       (size_t)(sum < sc->maxs ? sum + 1 : sum) * sizeof(*sc->xsge));
	sum = 0;
	m = kvp_plan_emit_window_into(plan, ids, &pos, &k, w, g, &ns, &xb);
	assert_int_equal(m, n);
	assert_memory_equal(&pos, to, sizeof(pos));
	assert_int_equal(xb, bytes);
	for (i = 0; i < (uint32_t)n; i++) {
		const struct ibv_send_wr *x = &sc->xwr[i];
		const struct kvp_wr *y = &sc->wr[i];

		assert_true(y->region < NMAP);
		assert_int_equal(x->wr_id, INTO_WRID);
		assert_ptr_equal(x->sg_list, &sc->xsge[y->sge_first]);
		assert_int_equal(x->num_sge, y->nsge);
		assert_int_equal(x->wr.rdma.remote_addr,
				 rmap[y->region].addr + y->offset);
		assert_int_equal(x->wr.rdma.rkey,
				 map_key(&rmap[y->region], y->offset));
		/* The caller's fields are untouched. */
		assert_int_equal(x->send_flags, 0xa5a5a5a5u);
		for (q = 0; q < y->nsge; q++) {
			const struct kvp_emit_sge *e = &sc->xsge[y->sge_first + q];
			const struct kvp_sge *f = &sc->sge[y->sge_first + q];

			assert_true(f->region < NMAP);
			assert_int_equal(e->addr, lmap[f->region].addr + f->offset);
			assert_int_equal(e->length, f->len);
			assert_int_equal(e->key, map_key(&lmap[f->region],
							 f->offset));
		}
		sum += y->nsge;
	}
	assert_int_equal(ns, sum);
	if ((uint32_t)n < sc->maxw)
		assert_int_equal(sc->xwr[n].wr_id, 0xa5a5a5a5a5a5a5a5ull);
	if (ns < sc->maxs)
		assert_int_equal(sc->xsge[ns].length, 0xa5a5a5a5u);
	ninto++;
}

static void wipe(struct scratch *s)
{
	memset(s->wr, 0xa5, (size_t)s->maxw * sizeof(*s->wr));
	memset(s->sge, 0xa5, (size_t)s->maxs * sizeof(*s->sge));
}

/*
 * Source s of one request, in windows of wcap WRs and scap SGEs (0: no
 * cap) until done: every window makes progress and stays in its caps,
 * *bytes is its WRs' sum, done flips after the window that reads the
 * source's last byte and not before, a call without room changes nothing,
 * and the windows' mapping equals kvp_plan_emit()'s (e, ne canonical runs,
 * total bytes). Unbounded, one window is kvp_plan_emit()'s WRs [a, b).
 */
static void check_windows(const kvp_plan *plan, const struct kvp_ids *ids,
			  struct scratch *sc, uint32_t s, uint32_t wcap,
			  uint32_t scap, uint32_t ne, uint64_t total,
			  uint32_t a, uint32_t b)
{
	struct kvp_plan_info pi;
	struct kvp_emit_pos pos, before;
	uint64_t acc = 0, bytes;
	uint32_t nr = 0, calls = 0, i, k;
	int unbounded = !wcap;

	kvp_plan_get_info(plan, &pi);
	assert_int_equal(kvp_plan_emit_start(plan, ids, s, &pos), 0);
	assert_int_equal(pos.src, s);
	assert_int_equal(kvp_plan_emit_done(&pos), total == 0);
	while (!kvp_plan_emit_done(&pos)) {
		uint32_t w = unbounded ? UINT32_MAX : wcap;
		uint32_t g = unbounded ? UINT32_MAX : scap;
		uint32_t nsge = 0;
		int n;

		assert_true(++calls <= sc->maxs + 1);
		wipe(sc);
		before = pos;
		if (calls % 4 == 1) { /* no room: nothing changes */
			assert_int_equal(kvp_plan_emit_window(plan, ids, &pos,
							      sc->wr, 0, sc->sge,
							      g, &bytes),
					 0);
			assert_int_equal(kvp_plan_emit_window(plan, ids, &pos,
							      sc->wr, w, sc->sge,
							      0, &bytes),
					 0);
			assert_memory_equal(&pos, &before, sizeof(pos));
			assert_int_equal(sc->wr[0].len, 0xa5a5a5a5);
			assert_int_equal(sc->sge[0].len, 0xa5a5a5a5);
		}
		n = kvp_plan_emit_window(plan, ids, &pos, sc->wr, w, sc->sge, g,
					 &bytes);
		assert_true(n >= 1 && (uint32_t)n <= w);
		check_into(plan, ids, &before, &pos, w, g, sc, n, bytes);
		for (i = 0; i < (uint32_t)n; i++) {
			assert_int_equal(sc->wr[i].src, s);
			assert_int_equal(sc->wr[i].sge_first, nsge);
			nsge += sc->wr[i].nsge;
		}
		assert_true(nsge <= g);
		if ((uint32_t)n < sc->maxw)
			assert_int_equal(sc->wr[n].len, 0xa5a5a5a5);
		if (nsge < sc->maxs)
			assert_int_equal(sc->sge[nsge].len, 0xa5a5a5a5);
		assert_int_equal(expand(sc->wr, (uint32_t)n, sc->sge, &pi,
					sc->wrun, &nr),
				 bytes);
		acc += bytes;
		assert_int_equal(kvp_plan_emit_done(&pos), acc == total);
		nmid += acc < total && pos.piece > 0; /* stopped mid-period */
		if (unbounded) {
			/* kvp_plan_emit()'s WRs of the source, exactly */
			uint32_t base = sc->ewr[a].sge_first;

			assert_int_equal(n, b - a);
			for (i = 0; i < (uint32_t)n; i++) {
				const struct kvp_wr *x = &sc->wr[i];
				const struct kvp_wr *y = &sc->ewr[a + i];

				assert_true(x->offset == y->offset &&
					    x->len == y->len &&
					    x->region == y->region &&
					    x->src == y->src &&
					    x->group == y->group &&
					    x->nsge == y->nsge &&
					    x->sge_first + base ==
						    y->sge_first);
				for (k = 0; k < x->nsge; k++)
					assert_memory_equal(
						&sc->sge[x->sge_first + k],
						&sc->esge[y->sge_first + k],
						sizeof(struct kvp_sge));
			}
		}
		nwindows++;
	}
	assert_int_equal(acc, total);
	/* done: nothing more, pos stays */
	before = pos;
	bytes = 1;
	assert_int_equal(kvp_plan_emit_window(plan, ids, &pos, sc->wr, 4,
					      sc->sge, 4, &bytes),
			 0);
	assert_int_equal(bytes, 0);
	assert_memory_equal(&pos, &before, sizeof(pos));
	if (unbounded)
		assert_int_equal(calls, total ? 1 : 0);
	nr = canon(sc->wrun, nr);
	assert_int_equal(nr, ne);
	assert_memory_equal(sc->wrun, sc->er, (size_t)nr * sizeof(*sc->er));
}

static void check_request(const kvp_plan *plan, const struct kvp_ids *ids,
			  struct scratch *sc)
{
	static const uint32_t caps[] = { 1, 2, 3, 7 };
	struct kvp_plan_info pi;
	uint32_t s, ci, a = 0;
	int n;

	kvp_plan_get_info(plan, &pi);
	assert_true(pi.nsrc < 16);
	assert_int_equal(kvp_plan_emit_check(plan, ids), 0);
	n = kvp_plan_emit(plan, ids, sc->ewr, sc->maxw, sc->esge, sc->maxs,
			  sc->src_end);
	assert_true(n >= 0);
	for (s = 0; s < pi.nsrc; a = sc->src_end[s++]) {
		uint32_t b = sc->src_end[s], ne = 0;
		uint64_t total;

		total = expand(sc->ewr + a, b - a, sc->esge, &pi, sc->er, &ne);
		ne = canon(sc->er, ne);
		for (ci = 0; ci < 4; ci++) {
			/* room for max_sge SGEs a WR, then one SGE a WR */
			check_windows(plan, ids, sc, s, caps[ci],
				      caps[ci] * pi.max_sge, ne, total, a, b);
			check_windows(plan, ids, sc, s, caps[ci], caps[ci], ne,
				      total, a, b);
		}
		check_windows(plan, ids, sc, s, 0, 0, ne, total, a, b);
		nsources++;
	}
	nreqs++;
}

/* Every consumer rank of each case, NREQ requests each. */
static void run_matrix(const struct wcase *cases, uint32_t ncases,
		       uint64_t seed)
{
	uint32_t ci, c, t;

	nwindows = nsources = nreqs = nmid = ninto = 0;
	maps_init();
	for (ci = 0; ci < ncases; ci++) {
		const struct wcase *wc = &cases[ci];

		for (c = 0; c < wc->D; c++) {
			struct scratch sc;
			struct wreq q;
			struct pair x;
			kvp_plan *plan;

			pair_open(&x, wc, c);
			plan = x.plan;

			kvp_plan_emit_bound(plan, MAXN, &sc.maxw, &sc.maxs);
			sc.ewr = malloc(sc.maxw * sizeof(*sc.ewr));
			sc.wr = malloc(sc.maxw * sizeof(*sc.wr));
			sc.esge = malloc(sc.maxs * sizeof(*sc.esge));
			sc.sge = malloc(sc.maxs * sizeof(*sc.sge));
			sc.er = malloc(sc.maxs * sizeof(*sc.er));
			sc.wrun = malloc(sc.maxs * sizeof(*sc.wrun));
			sc.xwr = malloc(sc.maxw * sizeof(*sc.xwr));
			sc.xsge = malloc(sc.maxs * sizeof(*sc.xsge));
			assert_true(sc.ewr && sc.wr && sc.esge && sc.sge &&
				    sc.er && sc.wrun && sc.xwr && sc.xsge);
			for (t = 0; t < NREQ; t++) {
				make_wreq(&q, plan, t, &seed);
				check_request(plan, q.ids, &sc);
			}
			free(sc.ewr);
			free(sc.wr);
			free(sc.esge);
			free(sc.sge);
			free(sc.er);
			free(sc.wrun);
			free(sc.xwr);
			free(sc.xsge);
			pair_close(&x);
		}
	}
	print_message("emit windows: %llu requests, %llu sources, %llu windows (%llu ending mid-period), mapping equal to kvp_plan_emit(); %llu windows into ibv_send_wr equal\n",
		      (unsigned long long)nreqs, (unsigned long long)nsources,
		      (unsigned long long)nwindows, (unsigned long long)nmid,
		      (unsigned long long)ninto);
	assert_int_equal(ninto, nwindows);
}

/*
 * 18 layout pairs x every consumer rank x 6 requests, each source in
 * windows of 1, 2, 3, 7 WRs (with max_sge or 1 SGEs per WR of room) and
 * unbounded.
 */
static void test_matrix(void **state)
{
	(void)state;
	run_matrix(wcases, NWCASE, 17);
	/* 40 consumer ranks x 6 requests; the rest pins the seed's draw */
	assert_int_equal(nreqs, 240);
	assert_int_equal(nsources, 348);
	assert_int_equal(nwindows, 351166);
	assert_int_equal(nmid, 327937);
}

/* Pairs with a READ length cap (kvp_plan_attr.max_len) below their pages
 * and pieces: 32-byte head ranges, 256-byte pages (16 tokens x 4 dims x 2
 * bytes a head), MLA's 48-byte latent rows. */
static const struct wcase wcases_len[] = {
	{ &dense8, 2, 2, 16, 0, NHD, 0, 16, 0, NHD, 0, 4, 100 },
	{ &dense8, 8, 2, 16, 0, HND, 0, 16, 0, HND, 0, 16, 100 },
	{ &dense8, 8, 2, 16, 0, HND, 0, 16, 0, HND, 0, 16, 1000 },
	{ &dense8, 2, 8, 16, 0, HND, 0, 16, 0, HND, 0, 4, 48 },
	{ &dense8, 2, 4, 16, 0, NHD, 0, 16, 0, HND, 0, 4, 200 },
	{ &dense8, 4, 2, 16, 0, FI, 0, 16, 0, HND, 0, 4, 300 },
	{ &dense8, 2, 1, 16, 0, FI, 0, 16, 0, PK, 0, 3, 64 },
	{ &dense8, 1, 1, 24, 0, HND, 0, 16, 0, HND, 0, 4, 96 },
	{ &mla_tiny, 4, 2, 16, 0, 0, 0, 16, 0, 0, 0, 4, 100 },
	{ &mamba_tiny, 2, 1, 16, 0, HND, KVP_CONV_DS, 8, 0, HND, KVP_CONV_SD,
	  4, 40 },
	{ &sliding_tiny, 2, 1, 8, 0, HND, 0, 16, 0, NHD, 0, 2, 128 },
};

/* The matrix's checks with caps: no READ past the cap, windows equal to
 * kvp_plan_emit(). */
static void test_matrix_len(void **state)
{
	(void)state;
	run_matrix(wcases_len, sizeof(wcases_len) / sizeof(wcases_len[0]),
		   23);
	assert_int_equal(nreqs, 6 * (2 + 2 + 2 + 8 + 4 + 2 + 1 + 1 + 2 + 1 +
				     1));
}

/* Pairs whose plans hold gathers (a FlashInfer or packed producer page
 * read into separate K and V regions): windows cut inside a gather's
 * period and resume there. */
static const struct wcase wcases_gather[] = {
	{ &dense8, 1, 1, 16, 0, FI, 0, 16, 0, HND, 0, 4, 0 },
	{ &dense8, 4, 2, 16, 0, FI, 0, 16, 0, HND, 0, 16, 0 },
	{ &dense8, 1, 1, 16, 0, PK, 0, 16, 0, NHD, 0, 8, 0 },
	{ &dense8, 2, 1, 16, 0, PK, 0, 16, 0, HND, 0, 2, 0 },
	{ &dense8, 1, 1, 24, 0, FI, 0, 16, 0, NHD, 0, 5, 0 },
	{ &dense8, 1, 1, 16, 0, FI, 0, 8, 0, HND, 0, 3, 0 },
	{ &dense8, 1, 1, 16, 0, FI, 0, 16, 0, HND, 0, 4, 100 },
	{ &dense8, 2, 1, 16, 0, PK, 0, 16, 0, HND, 0, 4, 24 },
};

static void test_matrix_gather(void **state)
{
	(void)state;
	run_matrix(wcases_gather,
		   sizeof(wcases_gather) / sizeof(wcases_gather[0]), 29);
	assert_int_equal(nreqs, 6 * 9);
}

/*
 * Maps no emission may use: a NULL key table, a shift of 64 or more, a
 * non-zero comp_mask. On the first stream's region: -EINVAL, nothing
 * written, pos untouched. On the second stream's only: the first
 * stream's WRs, then -EINVAL with nothing written and pos at the second.
 */
static void test_into_maps(void **state)
{
	static const uint32_t l[] = { 3, 4, 5, 6 }, r[] = { 7, 8, 9, 10 };
	const struct kvp_ids good = IDS(l, 2, r, 4, 0);
	struct ibv_send_wr xwr[8], xwc[8];
	struct kvp_emit_sge xsge[8], xsc[8];
	struct kvp_emit_sink k = { 0 };
	struct kvp_emit_pos pos, start, mid;
	struct hand h;
	uint32_t i, ns;
	int n;

	(void)state;
	maps_init();
	hand_open(&h, 1, 4, 2);
	/* one source, a stream per region: 0 then 1 */
	assert_int_equal(kvp_plan_emit_start(h.x.plan, &good, 0, &start), 0);
	pos = start;
	assert_int_equal(kvp_plan_emit_window(h.x.plan, &good, &pos, h.wr, 8,
					      h.sge, 8, NULL),
			 2);
	assert_int_equal(h.wr[0].region, 0);
	assert_int_equal(h.wr[1].region, 1);
	sink_init(&k, xwr, xsge);
	memset(xwc, 0xa5, sizeof(xwc));
	memset(xsc, 0xa5, sizeof(xsc));
	for (i = 0; i < 8; i++) {
		struct kvp_emit_map *m = &(i & 1 ? rmap : lmap)[i / 4];
		struct kvp_emit_map save = *m;

		if (i % 4 / 2 == 0)
			m->key = NULL;
		else if (i % 8 < 4)
			m->shift = 64 + 100 * (i & 1);
		else
			m->comp_mask = 1;
		memcpy(xwr, xwc, sizeof(xwr));
		memcpy(xsge, xsc, sizeof(xsge));
		pos = start;
		n = kvp_plan_emit_window_into(h.x.plan, &good, &pos, &k, 8, 8,
					      &ns, NULL);
		if (i / 4 == 0) {
			/* region 0: the first stream's */
			assert_int_equal(n, -EINVAL);
			assert_memory_equal(&pos, &start, sizeof(pos));
			assert_memory_equal(xwr, xwc, sizeof(xwr));
			assert_memory_equal(xsge, xsc, sizeof(xsge));
		} else {
			/* region 1: the first stream's WR, then the error */
			assert_int_equal(n, 1);
			assert_int_equal(ns, 1);
			assert_int_equal(pos.stream, start.stream + 1);
			mid = pos;
			memcpy(xwr, xwc, sizeof(xwr));
			n = kvp_plan_emit_window_into(h.x.plan, &good, &pos,
						      &k, 8, 8, &ns, NULL);
			assert_int_equal(n, -EINVAL);
			assert_memory_equal(&pos, &mid, sizeof(pos));
			assert_memory_equal(xwr, xwc, sizeof(xwr));
		}
		*m = save;
	}
	/* the maps mended: both streams */
	pos = start;
	assert_int_equal(kvp_plan_emit_window_into(h.x.plan, &good, &pos, &k,
						   8, 8, &ns, NULL),
			 2);
	assert_int_equal(kvp_plan_emit_done(&pos), 1);
	pair_close(&h.x);
}

/* The bytes kvp_plan_emit() reads for ids. */
static uint64_t emit_bytes(const kvp_plan *plan, const struct kvp_ids *ids)
{
	struct kvp_wr wr[64];
	struct kvp_sge sge[64];
	uint64_t sum = 0;
	int i, n;

	n = kvp_plan_emit(plan, ids, wr, 64, sge, 64, NULL);
	assert_true(n > 0);
	for (i = 0; i < n; i++)
		sum += wr[i].len;
	return sum;
}

/*
 * The partial last block (kvp_ids.tokens, kvpull.h): whole local blocks
 * are read wherever the remote blocks given hold those positions, so the
 * bytes of positions at and past `tokens` in the last local block come
 * from the producer (whatever it holds there); positions that no remote
 * block given holds are not read. Hand model: 2 heads x 4 dims x 2 bytes,
 * K and V: 32 bytes a token; local blocks of 4 tokens.
 */
static void test_partial_last_block(void **state)
{
	static const uint32_t l[] = { 3, 4 }, r[] = { 7, 8, 9, 10 };
	struct kvp_ids ids;
	struct hand h;

	(void)state;
	/* remote blocks of 4: 5 tokens read as 8, the whole second block */
	hand_open(&h, 1, 4, 1);
	ids = IDS(l, 2, r, 2, 5);
	assert_int_equal(emit_bytes(h.x.plan, &ids), 8 * 32);
	ids = IDS(l, 2, r, 2, 8);
	assert_int_equal(emit_bytes(h.x.plan, &ids), 8 * 32);
	pair_close(&h.x);
	/* remote blocks of 2: 5 tokens need 3 of them (6 tokens); local
	 * positions 6 and 7 have no remote block given: not read */
	hand_open(&h, 1, 2, 1);
	ids = IDS(l, 2, r, 3, 5);
	assert_int_equal(emit_bytes(h.x.plan, &ids), 6 * 32);
	ids = IDS(l, 2, r, 4, 8);
	assert_int_equal(emit_bytes(h.x.plan, &ids), 8 * 32);
	pair_close(&h.x);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_exact_simple),
		cmocka_unit_test(test_exact_periods),
		cmocka_unit_test(test_rejects),
		cmocka_unit_test(test_into_maps),
		cmocka_unit_test(test_partial_last_block),
		cmocka_unit_test(test_matrix),
		cmocka_unit_test(test_matrix_len),
		cmocka_unit_test(test_matrix_gather),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
