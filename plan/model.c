// SPDX-License-Identifier: MIT
/* Model presets and the layouts of the engines that run them. */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* Public configuration numbers (config.json of each model on its hub page):
 * num_hidden_layers, num_key_value_heads, head_dim (or hidden_size /
 * num_attention_heads), bf16 caches; MLA: kv_lora_rank + qk_rope_head_dim. */
static const struct kvp_model presets[] = {
	{ .name = "llama-3.1-8b", .layers = 32, .kv_heads = 8, .head_dim = 128,
	  .dtype_bytes = 2 },
	{ .name = "llama-3.1-70b", .layers = 80, .kv_heads = 8, .head_dim = 128,
	  .dtype_bytes = 2 },
	{ .name = "llama-3.1-405b", .layers = 126, .kv_heads = 8,
	  .head_dim = 128, .dtype_bytes = 2 },
	{ .name = "mistral-7b", .layers = 32, .kv_heads = 8, .head_dim = 128,
	  .dtype_bytes = 2 },
	{ .name = "qwen3-8b", .layers = 36, .kv_heads = 8, .head_dim = 128,
	  .dtype_bytes = 2 },
	{ .name = "qwen2.5-7b", .layers = 28, .kv_heads = 4, .head_dim = 128,
	  .dtype_bytes = 2 },
	{ .name = "qwen2.5-1.5b", .layers = 28, .kv_heads = 2, .head_dim = 128,
	  .dtype_bytes = 2 },
	{ .name = "deepseek-v3", .layers = 61, .kv_heads = 1, .head_dim = 576,
	  .dtype_bytes = 2, .mla_latent = 576 },
	{ .name = "deepseek-v2-lite", .layers = 27, .kv_heads = 1,
	  .head_dim = 576, .dtype_bytes = 2, .mla_latent = 576 },
	/* 48 layers, every 6th global: 40 sliding-window layers. */
	{ .name = "gemma-3-12b", .layers = 48, .kv_heads = 8, .head_dim = 256,
	  .dtype_bytes = 2, .sliding_layers = 40 },
	/* 42 layers alternating local/global. */
	{ .name = "gemma-2-9b", .layers = 42, .kv_heads = 8, .head_dim = 256,
	  .dtype_bytes = 2, .sliding_layers = 21 },
	/* hybrid_override_pattern: 24 Mamba2 layers, 4 attention layers;
	 * conv dim 128 * 64 + 2 * 8 * 128 = 10240. */
	{ .name = "nemotron-h-8b", .layers = 4, .kv_heads = 8, .head_dim = 128,
	  .dtype_bytes = 2, .state_kind = KVP_STATE_MAMBA2, .state_layers = 24,
	  .conv_kernel = 4, .ssm_heads = 128, .ssm_head_dim = 64,
	  .ssm_state = 128, .ssm_groups = 8, .state_dtype_bytes = 2 },
	/* 48 layers, full_attention_interval 4: 12 gated attention layers,
	 * 36 gated delta net layers (16 key heads, 32 value heads, 128 x 128). */
	{ .name = "qwen3-next-80b-a3b", .layers = 12, .kv_heads = 2,
	  .head_dim = 256, .dtype_bytes = 2, .state_kind = KVP_STATE_GDN,
	  .state_layers = 36, .conv_kernel = 4, .ssm_heads = 32,
	  .ssm_head_dim = 128, .ssm_state = 128, .ssm_groups = 16,
	  .state_dtype_bytes = 2 },
};

#define NPRESETS (sizeof(presets) / sizeof(presets[0]))

int kvp_model_preset(const char *name, struct kvp_model *m)
{
	size_t i;

	if (!name || !m)
		return -EINVAL;
	for (i = 0; i < NPRESETS; i++) {
		if (!strcasecmp(name, presets[i].name)) {
			*m = presets[i];
			return 0;
		}
	}
	return -ENOENT;
}

const char *kvp_model_preset_name(uint32_t i)
{
	return i < NPRESETS ? presets[i].name : NULL;
}

/* Appends a dim unless it has size 1 and is not the sharded one. */
static void push_dim(struct kvp_field_desc *f, uint32_t axis, uint32_t size,
		     uint64_t stride, int sharded)
{
	if (size == 1 && !sharded)
		return;
	if (sharded)
		f->shard_dim = f->ndim;
	f->dim[f->ndim].axis = axis;
	f->dim[f->ndim].size = size;
	f->dim[f->ndim].stride = stride;
	f->ndim++;
}

struct geom {
	uint32_t H, Htot, D, e, kb, r;
	uint64_t kpage; /* kernel page bytes */
};

/* Token dims: the kernel page index inside the logical block, then the token
 * inside the kernel page. */
static void push_tokens(struct kvp_field_desc *f, const struct geom *g,
			uint64_t tok_stride)
{
	push_dim(f, KVP_AXIS_TOKEN, g->r, g->kpage, 0);
	push_dim(f, KVP_AXIS_TOKEN, g->kb, tok_stride, 0);
}

static void init_field(struct kvp_field_desc *f, uint32_t kind,
		       const struct geom *g, uint64_t offset)
{
	memset(f, 0, sizeof(*f));
	f->kind = kind;
	f->elem_size = g->e;
	f->offset = offset;
	f->shard_dim = KVP_NO_SHARD;
}

/* One attention field of a page: `hs` head stride, `ts` token stride; HND
 * when hs > ts. */
static void attn_field(struct kvp_field_desc *f, uint32_t kind,
		       const struct geom *g, uint64_t offset, uint64_t hs,
		       uint64_t ts)
{
	init_field(f, kind, g, offset);
	if (hs > ts) {
		push_dim(f, KVP_AXIS_HEAD, g->H, hs, 1);
		push_tokens(f, g, ts);
	} else {
		push_tokens(f, g, ts);
		push_dim(f, KVP_AXIS_HEAD, g->H, hs, 1);
	}
	push_dim(f, KVP_AXIS_DIM, g->D, g->e, 0);
	f->shard_total = g->Htot;
}

/* Adds a view of `region` with fields f[0..nf). */
static int add_view(kvp_layout *l, uint32_t group, uint32_t region,
		    uint32_t layer, uint64_t page, uint32_t nblocks,
		    const struct kvp_field_desc *f, uint32_t nf)
{
	struct kvp_view_desc v = { 0 };
	uint32_t view, i;
	int err;

	v.group = group;
	v.region = region;
	v.layer = layer;
	v.num_blocks = nblocks;
	v.stride = page;
	err = kvp_layout_add_view(l, &v, &view);
	for (i = 0; !err && i < nf; i++)
		err = kvp_layout_add_field(l, view, &f[i]);
	return err;
}

static int add_region_view(kvp_layout *l, uint32_t group, uint32_t layer,
			   uint64_t page, uint32_t nblocks,
			   const struct kvp_field_desc *f, uint32_t nf)
{
	uint32_t region;
	int err;

	err = kvp_layout_add_region(l, page * nblocks, &region);
	return err ?: add_view(l, group, region, layer, page, nblocks, f, nf);
}

/* The K and V fields of an attention page holding both (FLASHINFER,
 * PACKED, and the FLASH layouts inside a pooled hybrid page). */
static void kv_page_fields(uint32_t kv_layout, const struct geom *g,
			   struct kvp_field_desc *f)
{
	uint64_t hd = (uint64_t)g->D * g->e, half = g->kpage / 2;

	switch (kv_layout) {
	case KVP_KV_FLASH_NHD:
		attn_field(&f[0], KVP_FIELD_K, g, 0, hd, hd * g->H);
		attn_field(&f[1], KVP_FIELD_V, g, half, hd, hd * g->H);
		break;
	case KVP_KV_PACKED:
		attn_field(&f[0], KVP_FIELD_K, g, 0, 2 * hd * g->kb, 2 * hd);
		attn_field(&f[1], KVP_FIELD_V, g, hd, 2 * hd * g->kb, 2 * hd);
		break;
	default: /* FLASH_HND, FLASHINFER */
		attn_field(&f[0], KVP_FIELD_K, g, 0, hd * g->kb, hd);
		attn_field(&f[1], KVP_FIELD_V, g, half, hd * g->kb, hd);
		break;
	}
}

/* Whether layer i is a sliding-window one: full layers are spread evenly,
 * layer i being full when floor((i + 1) * full / layers) steps up (Gemma 3:
 * every 6th; Gemma 2: every 2nd). O(1), so building stays linear in the
 * layers. */
static int is_sliding(const struct kvp_model *m, uint32_t i)
{
	uint32_t full = m->layers - m->sliding_layers;

	if (!m->sliding_layers || !full)
		return !full;
	return (uint64_t)(i + 1) * full / m->layers ==
	       (uint64_t)i * full / m->layers;
}

/* ---- state layers ---- */

/* *out = the product of n u32 factors; 0 (out unspecified) when it does
 * not fit 64 bits. */
static int mul_ok(uint64_t *out, int n, ...)
{
	uint64_t v = 1;
	va_list ap;
	int ok = 1;

	va_start(ap, n);
	while (n--)
		ok &= !__builtin_mul_overflow(v, (uint64_t)va_arg(ap, uint32_t),
					      &v);
	va_end(ap);
	*out = v;
	return ok;
}

struct sgeom {
	uint32_t kind, K, e, se, conv_layout;
	/* conv parts: channels per shard index, shard totals and lengths */
	uint32_t nparts;
	uint32_t part_kind[3], part_total[3], part_len[3], part_unit[3];
	uint32_t part_axis[3];
	uint32_t conv_local; /* conv channels on this rank */
	/* recurrent / SSM state: (heads, a, b) */
	uint32_t s_total, s_len, s_a, s_b;
	uint64_t conv_bytes, bytes;
};

/* Why a build failed: the message, and the name of the struct member most to
 * blame (a key of the spec's model form), for the caller to point at. */
struct why {
	char *msg;
	size_t msglen;
	const char *key;
};

__attribute__((format(printf, 3, 4))) static int bad(struct why *w,
						     const char *key,
						     const char *fmt, ...)
{
	va_list ap;

	w->key = key;
	if (w->msg && w->msglen) {
		va_start(ap, fmt);
		vsnprintf(w->msg, w->msglen, fmt, ap);
		va_end(ap);
	}
	return -EINVAL;
}

/* The TP sizes kvp_shard_range() takes for `total`, as "1, 2, 4, 8, 16,
 * 24, ...": its divisors (the first six, then "..." and the largest) and
 * its multiples (two, then "..."), up to KVP_MAX_TP_SIZE. */
static void tp_sizes(uint32_t total, char *buf, size_t n)
{
	uint32_t d, top = 0, shown = 0, lim = KVP_MAX_TP_SIZE;
	size_t k = 0;

	buf[0] = 0;
	for (d = 1; d <= total && d <= lim; d++)
		if (total % d == 0)
			top = d;
	for (d = 1; d <= top && k < n; d++) {
		if (total % d)
			continue;
		if (++shown > 6 && d != top) {
			if (shown == 7)
				k += (size_t)snprintf(buf + k, n - k, ", ...");
			continue;
		}
		k += (size_t)snprintf(buf + k, n - k, "%s%u", k ? ", " : "", d);
	}
	for (d = 2; d <= 3 && total <= lim / d && k < n; d++)
		k += (size_t)snprintf(buf + k, n - k, ", %u", total * d);
	if (total <= lim / 4 && k < n)
		snprintf(buf + k, n - k, ", ...");
}

/* "TP 3 does not divide and is not divided by 8 KV heads; they allow TP 1,
 * 2, 4, 8, 16, 24, ...": the rule of kvp_shard_range(), checked by the
 * caller, and the sizes it takes. */
static int tp_bad(struct why *w, uint32_t tp, uint32_t total, const char *what)
{
	char sizes[96];

	tp_sizes(total, sizes, sizeof(sizes));
	return bad(w, "tp_size",
		   "TP %u does not divide and is not divided by %u %s; they allow TP %s",
		   tp, total, what, sizes);
}

static int state_geom(const struct kvp_model *m,
		      const struct kvp_engine_desc *e, struct sgeom *s,
		      struct why *w)
{
	static const char *const part_what[2][3] = {
		{ "SSM heads (ssm_heads)", "SSM groups (ssm_groups)",
		  "SSM groups (ssm_groups)" },
		{ "key heads (ssm_groups)", "key heads (ssm_groups)",
		  "value heads (ssm_heads)" },
	};
	/* the member giving each conv part's channels per head */
	static const char *const unit_key[2][3] = {
		{ "ssm_head_dim", "ssm_state", "ssm_state" },
		{ "ssm_state", "ssm_state", "ssm_head_dim" },
	};
	static const char *const nonzero_key[4] = { "ssm_heads",
						    "ssm_head_dim", "ssm_state",
						    "ssm_groups" };
	const uint32_t nonzero[4] = { m->ssm_heads, m->ssm_head_dim,
				      m->ssm_state, m->ssm_groups };
	uint64_t part, ssm;
	uint32_t i, start;

	memset(s, 0, sizeof(*s));
	s->kind = m->state_kind;
	s->K = m->conv_kernel - 1;
	s->e = m->dtype_bytes;
	s->se = m->state_dtype_bytes ? m->state_dtype_bytes : m->dtype_bytes;
	s->conv_layout = e->conv_layout;
	if (m->conv_kernel < 2)
		return bad(w, "conv_kernel",
			   "conv_kernel %u: a conv state needs a kernel of at least 2",
			   m->conv_kernel);
	for (i = 0; i < 4; i++)
		if (!nonzero[i])
			return bad(w, nonzero_key[i], "%s must be at least 1",
				   nonzero_key[i]);
	if (e->conv_layout >= KVP_CONV_LAYOUT_COUNT)
		return bad(w, "conv_layout",
			   "conv_layout %u is none of ds (0), sd (1)",
			   e->conv_layout);
	s->nparts = 3;
	if (m->state_kind == KVP_STATE_MAMBA2) {
		/* x: heads x head_dim; B, C: groups x d_state */
		s->part_kind[0] = KVP_FIELD_CONV_X;
		s->part_kind[1] = KVP_FIELD_CONV_B;
		s->part_kind[2] = KVP_FIELD_CONV_C;
		s->part_total[0] = m->ssm_heads;
		s->part_unit[0] = m->ssm_head_dim;
		s->part_total[1] = s->part_total[2] = m->ssm_groups;
		s->part_unit[1] = s->part_unit[2] = m->ssm_state;
		s->s_total = m->ssm_heads;
		s->s_a = m->ssm_head_dim;
		s->s_b = m->ssm_state;
	} else {
		/* q, k: key heads x key dim; v: value heads x value dim */
		s->part_kind[0] = KVP_FIELD_CONV_Q;
		s->part_kind[1] = KVP_FIELD_CONV_K;
		s->part_kind[2] = KVP_FIELD_CONV_V;
		s->part_total[0] = s->part_total[1] = m->ssm_groups;
		s->part_unit[0] = s->part_unit[1] = m->ssm_state;
		s->part_total[2] = m->ssm_heads;
		s->part_unit[2] = m->ssm_head_dim;
		s->s_total = m->ssm_heads;
		s->s_a = m->ssm_state;	  /* key dim */
		s->s_b = m->ssm_head_dim; /* value dim */
	}
	for (i = 0; i < 3; i++) {
		if (kvp_shard_range(s->part_total[i], e->tp_size, e->tp_rank,
				    &start, &s->part_len[i]))
			return tp_bad(w, e->tp_size, s->part_total[i],
				      part_what[m->state_kind != KVP_STATE_MAMBA2]
					       [i]);
		if (!mul_ok(&part, 2, s->part_len[i], s->part_unit[i]) ||
		    __builtin_add_overflow(s->conv_local, part,
					   &s->conv_local))
			return bad(w, unit_key[m->state_kind != KVP_STATE_MAMBA2]
					      [i],
				   "the conv state's channels (%u x %u and more) do not fit 32 bits",
				   s->part_len[i], s->part_unit[i]);
	}
	if (kvp_shard_range(s->s_total, e->tp_size, e->tp_rank, &start,
			    &s->s_len))
		return tp_bad(w, e->tp_size, s->s_total,
			      m->state_kind == KVP_STATE_MAMBA2 ?
				      "SSM heads (ssm_heads)" :
				      "value heads (ssm_heads)");
	/* Sizes come from the caller (or a spec): a product that wraps
	 * would pass the size checks with a wrong value. */
	if (!mul_ok(&s->conv_bytes, 3, s->conv_local, s->K, s->e) ||
	    !mul_ok(&ssm, 4, s->s_len, s->s_a, s->s_b, s->se) ||
	    __builtin_add_overflow(s->conv_bytes, ssm, &s->bytes))
		return bad(w, "ssm_state",
			   "the state page's size overflows 64 bits");
	return 0;
}

/* The fields of one state page: conv parts in channel order, then the
 * SSM / recurrent state. */
static void state_fields(const struct sgeom *s, struct kvp_field_desc *f)
{
	uint64_t ch = 0, e = s->e;
	uint32_t i;

	for (i = 0; i < 3; i++) {
		struct kvp_field_desc *x = &f[i];
		uint64_t cs, ws; /* channel stride, window stride */

		memset(x, 0, sizeof(*x));
		x->kind = s->part_kind[i];
		x->elem_size = s->e;
		x->shard_dim = 0;
		x->shard_total = s->part_total[i];
		if (s->conv_layout == KVP_CONV_DS) {
			cs = s->K * e;
			ws = e;
		} else {
			cs = e;
			ws = (uint64_t)s->conv_local * e;
		}
		x->offset = ch * cs;
		x->dim[0] = (struct kvp_dim){ s->part_unit[i] * cs,
					      s->part_len[i], KVP_AXIS_HEAD };
		x->dim[1] = (struct kvp_dim){ cs, s->part_unit[i],
					      KVP_AXIS_CHANNEL };
		/* DS: window innermost; SD: channel innermost. */
		x->dim[2] = (struct kvp_dim){ ws, s->K, KVP_AXIS_STATE };
		x->ndim = 3;
		ch += (uint64_t)s->part_len[i] * s->part_unit[i];
	}
	memset(&f[3], 0, sizeof(f[3]));
	f[3].kind = KVP_FIELD_SSM;
	f[3].elem_size = s->se;
	f[3].offset = s->conv_bytes;
	f[3].shard_dim = 0;
	f[3].shard_total = s->s_total;
	f[3].dim[0] = (struct kvp_dim){ (uint64_t)s->s_a * s->s_b * s->se,
					s->s_len, KVP_AXIS_HEAD };
	f[3].dim[1] = (struct kvp_dim){ (uint64_t)s->s_b * s->se, s->s_a,
					KVP_AXIS_CHANNEL };
	f[3].dim[2] = (struct kvp_dim){ s->se, s->s_b, KVP_AXIS_DIM };
	f[3].ndim = 3;
}

static int attn_fields_separate(kvp_layout *l, const struct kvp_engine_desc *e,
				const struct geom *g, uint32_t group,
				uint32_t layer)
{
	uint64_t page = g->kpage * g->r, hd = (uint64_t)g->D * g->e;
	struct kvp_field_desc f[2];
	int err;

	if (e->kv_layout == KVP_KV_FLASH_NHD ||
	    e->kv_layout == KVP_KV_FLASH_HND) {
		int nhd = e->kv_layout == KVP_KV_FLASH_NHD;
		uint64_t hs = nhd ? hd : hd * g->kb;
		uint64_t ts = nhd ? hd * g->H : hd;

		attn_field(&f[0], KVP_FIELD_K, g, 0, hs, ts);
		attn_field(&f[1], KVP_FIELD_V, g, 0, hs, ts);
		err = add_region_view(l, group, layer, page, e->num_blocks,
				      &f[0], 1);
		return err ?: add_region_view(l, group, layer, page,
					      e->num_blocks, &f[1], 1);
	}
	kv_page_fields(e->kv_layout, g, f);
	return add_region_view(l, group, layer, page, e->num_blocks, f, 2);
}

static int build_layers(kvp_layout *l, const struct kvp_model *m,
			const struct kvp_engine_desc *e, const struct geom *g,
			const struct sgeom *sg, struct why *w)
{
	struct kvp_group_desc gd = { 0 };
	struct kvp_field_desc f[4];
	uint64_t page = g->kpage * g->r, hd = (uint64_t)g->D * g->e;
	uint32_t full = m->layers - m->sliding_layers, groups[3], ng = 0;
	uint32_t i, gi;
	int err = 0;

	/* Groups: full (or MLA), sliding, state. */
	if (full) {
		gd.kind = m->mla_latent ? KVP_GROUP_MLA : KVP_GROUP_FULL;
		gd.block_tokens = e->block_tokens;
		err = kvp_layout_add_group(l, &gd, &groups[ng++]);
	}
	if (!err && m->sliding_layers) {
		gd.kind = KVP_GROUP_SLIDING;
		gd.block_tokens = e->block_tokens;
		err = kvp_layout_add_group(l, &gd, &groups[ng++]);
	}
	if (!err && m->state_layers) {
		gd.kind = KVP_GROUP_STATE;
		gd.block_tokens = 0;
		err = kvp_layout_add_group(l, &gd, &groups[ng++]);
	}
	if (err)
		return err;

	if (m->state_layers) {
		/* Pooled regions shared by attention layer i and state layer
		 * i; a state page spans `ratio` attention pages. */
		uint32_t n = m->layers > m->state_layers ? m->layers :
							   m->state_layers;
		uint64_t ratio = (sg->bytes + page - 1) / page;
		uint32_t region, sgroup = groups[ng - 1];

		if (m->mla_latent)
			return bad(w, "mla_latent",
				   "a model with state layers cannot have MLA (mla_latent %u)",
				   m->mla_latent);
		if (m->sliding_layers)
			return bad(w, "sliding_layers",
				   "a model with state layers cannot have sliding layers (%u)",
				   m->sliding_layers);
		if (e->num_blocks < ratio)
			return bad(w, "num_blocks",
				   "num_blocks %u is below the %llu attention pages one state page spans",
				   e->num_blocks, (unsigned long long)ratio);
		kv_page_fields(e->kv_layout, g, f);
		for (i = 0; i < n && !err; i++) {
			err = kvp_layout_add_region(l, page * e->num_blocks,
						    &region);
			if (!err && i < m->layers)
				err = add_view(l, groups[0], region, i, page,
					       e->num_blocks, f, 2);
		}
		state_fields(sg, f);
		for (i = 0; i < m->state_layers && !err; i++)
			err = add_view(l, sgroup, i, m->layers + i,
				       page * ratio,
				       (uint32_t)(e->num_blocks / ratio), f, 4);
		return err;
	}
	/* One pass over the layers per group, in layer order. */
	for (gi = 0; gi < ng && !err; gi++) {
		int sliding = l->groups[groups[gi]].kind == KVP_GROUP_SLIDING;
		uint32_t layer;

		for (layer = 0; layer < m->layers && !err; layer++) {
			if (is_sliding(m, layer) != sliding)
				continue;
			if (m->mla_latent) {
				init_field(&f[0], KVP_FIELD_LATENT, g, 0);
				push_tokens(&f[0], g, hd);
				push_dim(&f[0], KVP_AXIS_DIM, g->D, g->e, 0);
				err = add_region_view(l, groups[gi], layer,
						      page, e->num_blocks, f,
						      1);
				continue;
			}
			err = attn_fields_separate(l, e, g, groups[gi], layer);
		}
	}
	return err;
}

/* Checks the numbers one rule at a time, so that the message names the
 * first rule broken and its numbers. */
static int check_numbers(const struct kvp_model *m,
			 const struct kvp_engine_desc *e, struct why *w)
{
	uint32_t kb;

	if (m->comp_mask)
		return bad(w, NULL, "model comp_mask is 0x%x, must be 0",
			   m->comp_mask);
	if (e->comp_mask)
		return bad(w, NULL, "engine comp_mask is 0x%x, must be 0",
			   e->comp_mask);
	if (!e->tp_size)
		return bad(w, "tp_size", "TP size must be at least 1");
	if (e->tp_size > KVP_MAX_TP_SIZE)
		return bad(w, "tp_size", "TP size %u is above the limit of %u",
			   e->tp_size, KVP_MAX_TP_SIZE);
	if (e->tp_rank >= e->tp_size)
		return bad(w, "tp_rank", "rank %u is not below the TP size %u",
			   e->tp_rank, e->tp_size);
	if (!e->block_tokens)
		return bad(w, "block_tokens",
			   "block size must be at least 1 token");
	kb = e->kernel_block_tokens ? e->kernel_block_tokens : e->block_tokens;
	if (e->block_tokens % kb)
		return bad(w, "kernel_block_tokens",
			   "kernel block %u does not divide the block size %u",
			   kb, e->block_tokens);
	if (!e->num_blocks)
		return bad(w, "num_blocks", "num_blocks must be at least 1");
	if (!m->dtype_bytes)
		return bad(w, "dtype_bytes", "dtype_bytes must be at least 1");
	if (m->state_kind >= KVP_STATE_KIND_COUNT)
		return bad(w, "state_kind",
			   "state_kind %u is none of none (0), mamba2 (1), gdn (2)",
			   m->state_kind);
	if (m->state_kind == KVP_STATE_NONE && m->state_layers)
		return bad(w, "state_layers",
			   "%u state layers need a state_kind (mamba2 or gdn)",
			   m->state_layers);
	if (m->state_kind != KVP_STATE_NONE && !m->state_layers)
		return bad(w, "state_kind",
			   "state_kind %s needs state_layers of at least 1",
			   m->state_kind == KVP_STATE_MAMBA2 ? "mamba2" : "gdn");
	if (!m->layers && !m->state_layers)
		return bad(w, "layers",
			   "the model has no layers (layers and state_layers are 0)");
	if (m->layers > KVP_MAX_LAYERS ||
	    m->state_layers > KVP_MAX_LAYERS - m->layers)
		return bad(w, m->layers > KVP_MAX_LAYERS ? "layers" :
							   "state_layers",
			   "layers + state_layers is %llu, above the limit of %u",
			   (unsigned long long)m->layers + m->state_layers,
			   KVP_MAX_LAYERS);
	if (m->sliding_layers > m->layers)
		return bad(w, "sliding_layers",
			   "sliding_layers %u is above layers %u",
			   m->sliding_layers, m->layers);
	if (m->mla_latent)
		return 0;
	if (!m->kv_heads)
		return bad(w, "kv_heads", "kv_heads must be at least 1");
	if (!m->head_dim)
		return bad(w, "head_dim", "head_dim must be at least 1");
	if (e->kv_layout >= KVP_KV_LAYOUT_COUNT)
		return bad(w, "kv_layout",
			   "kv_layout %u is none of flash_nhd (0), flash_hnd (1), flashinfer (2), packed (3)",
			   e->kv_layout);
	return 0;
}

static int build(const struct kvp_model *m, const struct kvp_engine_desc *e,
		 kvp_layout **out, struct why *w)
{
	struct kvp_layout_attr attr = { 0 };
	struct geom g = { 0 };
	struct sgeom sg = { 0 };
	kvp_layout *l;
	uint32_t start;
	uint64_t page, bytes;
	int err;

	if (!m || !e || !out)
		return bad(w, NULL, "a NULL model, engine or output");
	err = check_numbers(m, e, w);
	if (err)
		return err;
	g.kb = e->kernel_block_tokens ? e->kernel_block_tokens :
					e->block_tokens;
	g.r = e->block_tokens / g.kb;
	g.e = m->dtype_bytes;
	if (m->mla_latent) {
		g.H = g.Htot = 1;
		g.D = m->mla_latent;
	} else {
		g.Htot = m->kv_heads;
		g.D = m->head_dim;
		if (kvp_shard_range(g.Htot, e->tp_size, e->tp_rank, &start,
				    &g.H))
			return tp_bad(w, e->tp_size, g.Htot, "KV heads");
	}
	if (m->state_layers) {
		err = state_geom(m, e, &sg, w);
		if (err)
			return err;
	}
	if (!mul_ok(&page, 4, g.H, g.kb, g.D, g.e) || page > UINT32_MAX)
		return bad(w, "head_dim",
			   "a kernel page of %u heads x %u tokens x %u x %u bytes is 4 GiB or more",
			   g.H, g.kb, g.D, g.e);
	if (!m->mla_latent && (m->state_layers ||
			       e->kv_layout == KVP_KV_FLASHINFER ||
			       e->kv_layout == KVP_KV_PACKED))
		page *= 2;
	/* page * g.r < 2^32 and num_blocks < 2^32: the region size (their
	 * product) fits 64 bits. */
	if (__builtin_mul_overflow(page, g.r, &bytes) || bytes > UINT32_MAX)
		return bad(w, "block_tokens",
			   "a page of a %u-token block is 4 GiB or more",
			   e->block_tokens);
	if (sg.bytes > UINT32_MAX)
		return bad(w, "ssm_state",
			   "a state page of %llu bytes is 4 GiB or more",
			   (unsigned long long)sg.bytes);
	g.kpage = page;

	attr.engine_id = e->engine_id;
	attr.tp_size = e->tp_size;
	attr.tp_rank = e->tp_rank;
	err = kvp_layout_create(&attr, &l);
	if (err)
		return err == -ENOMEM ? err :
					bad(w, "tp_size",
					    "TP %u rank %u makes no layout",
					    e->tp_size, e->tp_rank);
	err = build_layers(l, m, e, &g, &sg, w);
	if (err) {
		kvp_layout_destroy(l);
		if (err == -EINVAL && !w->key)
			return bad(w, "num_blocks",
				   "the layout's sizes exceed the library's limits");
		return err;
	}
	*out = l;
	return 0;
}

int kvp__layout_build(const struct kvp_model *m,
		      const struct kvp_engine_desc *e, kvp_layout **out,
		      char *msg, size_t msglen, const char **key)
{
	struct why w = { msg, msglen, NULL };
	int err = build(m, e, out, &w);

	if (key)
		*key = w.key;
	return err;
}

int kvp_layout_build_msg(const struct kvp_model *m,
			 const struct kvp_engine_desc *e, kvp_layout **out,
			 char *msg, size_t msglen)
{
	struct why w = { msg, msglen, NULL };

	return build(m, e, out, &w);
}

int kvp_layout_build(const struct kvp_model *m,
		     const struct kvp_engine_desc *e, kvp_layout **out)
{
	struct why w = { NULL, 0, NULL };

	return build(m, e, out, &w);
}
