// SPDX-License-Identifier: MIT
/* Model presets and the layouts of the engines that run them. */
#include <errno.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

/* Public configuration numbers (config.json of each model on its hub page):
 * num_hidden_layers, num_key_value_heads, head_dim (or hidden_size /
 * num_attention_heads), bf16 caches; MLA: kv_lora_rank + qk_rope_head_dim. */
static const struct kvp_model presets[] = {
	{ "llama-3.1-8b", 32, 8, 128, 2, 0, 0 },
	{ "llama-3.1-70b", 80, 8, 128, 2, 0, 0 },
	{ "llama-3.1-405b", 126, 8, 128, 2, 0, 0 },
	{ "mistral-7b", 32, 8, 128, 2, 0, 0 },
	{ "qwen3-8b", 36, 8, 128, 2, 0, 0 },
	{ "qwen2.5-7b", 28, 4, 128, 2, 0, 0 },
	{ "qwen2.5-1.5b", 28, 2, 128, 2, 0, 0 },
	{ "deepseek-v3", 61, 1, 576, 2, 576, 0 },
	{ "deepseek-v2-lite", 27, 1, 576, 2, 576, 0 },
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

static int add_view_fields(kvp_layout *l, uint32_t group, uint32_t layer,
			   uint64_t page, uint32_t nblocks,
			   const struct kvp_field_desc *f, uint32_t nf)
{
	struct kvp_view_desc v = { 0 };
	uint32_t region, view, i;
	int err;

	err = kvp_layout_add_region(l, page * nblocks, &region);
	if (err)
		return err;
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

static int build_layers(kvp_layout *l, const struct kvp_model *m,
			const struct kvp_engine_desc *e, const struct geom *g)
{
	struct kvp_group_desc gd = { 0 };
	struct kvp_field_desc f[2];
	uint64_t page = g->kpage * g->r, hd = (uint64_t)g->D * g->e;
	uint32_t group, layer;
	int err;

	gd.kind = m->mla_latent ? KVP_GROUP_MLA : KVP_GROUP_FULL;
	gd.block_tokens = e->block_tokens;
	err = kvp_layout_add_group(l, &gd, &group);
	if (err)
		return err;
	for (layer = 0; layer < m->layers && !err; layer++) {
		if (m->mla_latent) {
			init_field(&f[0], KVP_FIELD_LATENT, g, 0);
			push_tokens(&f[0], g, hd);
			push_dim(&f[0], KVP_AXIS_DIM, g->D, g->e, 0);
			err = add_view_fields(l, group, layer, page,
					      e->num_blocks, f, 1);
			continue;
		}
		switch (e->kv_layout) {
		case KVP_KV_FLASH_NHD:
		case KVP_KV_FLASH_HND: {
			uint64_t hs = e->kv_layout == KVP_KV_FLASH_NHD ?
					      hd :
					      hd * g->kb;
			uint64_t ts = e->kv_layout == KVP_KV_FLASH_NHD ?
					      hd * g->H :
					      hd;

			attn_field(&f[0], KVP_FIELD_K, g, 0, hs, ts);
			attn_field(&f[1], KVP_FIELD_V, g, 0, hs, ts);
			err = add_view_fields(l, group, layer, page,
					      e->num_blocks, &f[0], 1);
			if (!err)
				err = add_view_fields(l, group, layer, page,
						      e->num_blocks, &f[1], 1);
			break;
		}
		case KVP_KV_FLASHINFER:
			attn_field(&f[0], KVP_FIELD_K, g, 0, hd * g->kb, hd);
			attn_field(&f[1], KVP_FIELD_V, g, g->kpage / 2,
				   hd * g->kb, hd);
			err = add_view_fields(l, group, layer, page,
					      e->num_blocks, f, 2);
			break;
		case KVP_KV_PACKED:
			attn_field(&f[0], KVP_FIELD_K, g, 0, 2 * hd * g->kb,
				   2 * hd);
			attn_field(&f[1], KVP_FIELD_V, g, hd, 2 * hd * g->kb,
				   2 * hd);
			err = add_view_fields(l, group, layer, page,
					      e->num_blocks, f, 2);
			break;
		default:
			err = -EINVAL;
		}
	}
	return err;
}

int kvp_layout_build(const struct kvp_model *m,
		     const struct kvp_engine_desc *e, kvp_layout **out)
{
	struct kvp_layout_attr attr = { 0 };
	struct geom g = { 0 };
	kvp_layout *l;
	uint32_t start;
	uint64_t page;
	int err;

	if (!m || !e || !out || m->comp_mask || e->comp_mask || !m->layers ||
	    !m->dtype_bytes || !e->block_tokens || !e->num_blocks ||
	    !e->tp_size || e->tp_rank >= e->tp_size)
		return -EINVAL;
	g.kb = e->kernel_block_tokens ? e->kernel_block_tokens :
					e->block_tokens;
	if (e->block_tokens % g.kb)
		return -EINVAL;
	g.r = e->block_tokens / g.kb;
	g.e = m->dtype_bytes;
	if (m->mla_latent) {
		g.H = g.Htot = 1;
		g.D = m->mla_latent;
	} else {
		if (!m->kv_heads || !m->head_dim ||
		    e->kv_layout >= KVP_KV_LAYOUT_COUNT)
			return -EINVAL;
		g.Htot = m->kv_heads;
		g.D = m->head_dim;
		if (kvp_shard_range(g.Htot, e->tp_size, e->tp_rank, &start,
				    &g.H))
			return -EINVAL;
	}
	page = (uint64_t)g.H * g.kb * g.D * g.e;
	if (!m->mla_latent && (e->kv_layout == KVP_KV_FLASHINFER ||
			       e->kv_layout == KVP_KV_PACKED))
		page *= 2;
	if (page * g.r > UINT32_MAX ||
	    page * g.r * e->num_blocks / e->num_blocks != page * g.r)
		return -EINVAL;
	g.kpage = page;

	attr.engine_id = e->engine_id;
	attr.tp_size = e->tp_size;
	attr.tp_rank = e->tp_rank;
	err = kvp_layout_create(&attr, &l);
	if (err)
		return err;
	err = build_layers(l, m, e, &g);
	if (err) {
		kvp_layout_destroy(l);
		return err;
	}
	*out = l;
	return 0;
}
