// SPDX-License-Identifier: MIT
/* Layouts: building, validating and inspecting an engine rank's KV cache. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

int kvp_shard_range(uint32_t total, uint32_t tp_size, uint32_t rank,
		    uint32_t *start, uint32_t *len)
{
	if (!total || !tp_size || rank >= tp_size)
		return -EINVAL;
	if (total % tp_size == 0) {
		*start = total / tp_size * rank;
		*len = total / tp_size;
		return 0;
	}
	if (tp_size % total == 0) {
		*start = rank / (tp_size / total);
		*len = 1;
		return 0;
	}
	return -EINVAL;
}

int kvp_layout_create(const struct kvp_layout_attr *attr, kvp_layout **out)
{
	kvp_layout *l;

	if (!attr || !out || attr->comp_mask || !attr->tp_size ||
	    attr->tp_rank >= attr->tp_size || attr->tp_size > KVP_MAX_TP_SIZE)
		return -EINVAL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return -ENOMEM;
	l->attr = *attr;
	*out = l;
	return 0;
}

void kvp_layout_destroy(kvp_layout *l)
{
	if (!l)
		return;
	free(l->groups);
	free(l->regions);
	free(l->raddr);
	free(l->rkey);
	for (uint32_t i = 0; l->xkeys && i < l->nregions; i++)
		free(l->xkeys[i]);
	free(l->xkeys);
	free(l->mrshift);
	free(l->views);
	free(l->fields);
	free(l->fslots);
	free(l);
}

static int dup_array(void **dst, const void *src, size_t n, size_t size)
{
	*dst = NULL;
	if (!n)
		return 0;
	*dst = malloc(n * size);
	if (!*dst)
		return -ENOMEM;
	memcpy(*dst, src, n * size);
	return 0;
}

/* The extra keys of regions with several; on failure nothing of them
 * is left for the caller's destroy of the partial copy. */
static int dup_keys(kvp_layout *c, const kvp_layout *l)
{
	uint32_t i;

	c->xkeys = l->nregions ? calloc(l->nregions, sizeof(*c->xkeys)) : NULL;
	if (l->nregions && !c->xkeys)
		return -ENOMEM;
	for (i = 0; i < l->nregions; i++) {
		uint64_t n = kvp__region_nkeys(l->regions[i], l->mrshift[i]);

		if (n > 1 && dup_array((void **)&c->xkeys[i], l->xkeys[i],
				       n - 1, sizeof(**l->xkeys))) {
			while (i--)
				free(c->xkeys[i]);
			free(c->xkeys);
			c->xkeys = NULL;
			return -ENOMEM;
		}
	}
	return 0;
}

int kvp_layout_clone(const kvp_layout *l, kvp_layout **out)
{
	kvp_layout *c;

	if (!l || !out)
		return -EINVAL;
	c = calloc(1, sizeof(*c));
	if (!c)
		return -ENOMEM;
	c->attr = l->attr;
	c->nregions = l->nregions; /* for the destroy of a partial copy */
	if (dup_array((void **)&c->groups, l->groups, l->ngroups,
		      sizeof(*l->groups)) ||
	    dup_array((void **)&c->regions, l->regions, l->nregions,
		      sizeof(*l->regions)) ||
	    dup_array((void **)&c->raddr, l->raddr, l->nregions,
		      sizeof(*l->raddr)) ||
	    dup_array((void **)&c->rkey, l->rkey, l->nregions,
		      sizeof(*l->rkey)) ||
	    dup_array((void **)&c->mrshift, l->mrshift, l->nregions,
		      sizeof(*l->mrshift)) ||
	    dup_keys(c, l) ||
	    dup_array((void **)&c->views, l->views, l->nviews,
		      sizeof(*l->views)) ||
	    dup_array((void **)&c->fields, l->fields, l->nfields,
		      sizeof(*l->fields)) ||
	    dup_array((void **)&c->fslots, l->fslots, l->nslots,
		      sizeof(*l->fslots))) {
		kvp_layout_destroy(c);
		return -ENOMEM;
	}
	c->ngroups = c->cap_groups = l->ngroups;
	c->nregions = c->cap_regions = l->nregions;
	c->nviews = c->cap_views = l->nviews;
	c->nfields = c->cap_fields = l->nfields;
	c->nslots = l->nslots;
	*out = c;
	return 0;
}

/* Makes room for one more element; the array is unchanged on failure. */
static int grow(void **arr, uint32_t *cap, uint32_t n, size_t size)
{
	uint32_t ncap;
	void *p;

	if (n < *cap)
		return 0;
	if (n >= UINT32_MAX / 2)
		return -ENOMEM;
	ncap = *cap ? *cap * 2 : 8;
	p = realloc(*arr, (size_t)ncap * size);
	if (!p)
		return -ENOMEM;
	*arr = p;
	*cap = ncap;
	return 0;
}

int kvp_layout_add_group(kvp_layout *l, const struct kvp_group_desc *g,
			 uint32_t *id)
{
	if (!l || !g || g->comp_mask || g->kind >= KVP_GROUP_KIND_COUNT)
		return -EINVAL;
	if ((g->kind == KVP_GROUP_STATE) != (g->block_tokens == 0))
		return -EINVAL;
	if (l->ngroups >= UINT16_MAX)
		return -EINVAL;
	if (grow((void **)&l->groups, &l->cap_groups, l->ngroups,
		 sizeof(*g)))
		return -ENOMEM;
	l->groups[l->ngroups] = *g;
	if (id)
		*id = l->ngroups;
	l->ngroups++;
	return 0;
}

int kvp_layout_add_region(kvp_layout *l, uint64_t size, uint32_t *id)
{
	if (!l || !size)
		return -EINVAL;
	uint32_t cap = l->cap_regions;

	/* Three arrays share one capacity: grow all, then commit it. */
	if (l->nregions >= cap) {
		uint32_t c2 = cap, c3 = cap, c4 = cap, c5 = cap;

		if (grow((void **)&l->regions, &cap, l->nregions,
			 sizeof(*l->regions)) ||
		    grow((void **)&l->raddr, &c2, l->nregions,
			 sizeof(*l->raddr)) ||
		    grow((void **)&l->rkey, &c3, l->nregions,
			 sizeof(*l->rkey)) ||
		    grow((void **)&l->mrshift, &c4, l->nregions,
			 sizeof(*l->mrshift)) ||
		    grow((void **)&l->xkeys, &c5, l->nregions,
			 sizeof(*l->xkeys)))
			return -ENOMEM;
		l->cap_regions = cap;
	}
	l->regions[l->nregions] = size;
	l->raddr[l->nregions] = 0;
	l->rkey[l->nregions] = 0;
	l->mrshift[l->nregions] = 0;
	l->xkeys[l->nregions] = NULL;
	if (id)
		*id = l->nregions;
	l->nregions++;
	return 0;
}

int kvp_layout_add_view(kvp_layout *l, const struct kvp_view_desc *v,
			uint32_t *id)
{
	uint64_t end;

	if (!l || !v || v->comp_mask || v->group >= l->ngroups ||
	    v->region >= l->nregions || !v->num_blocks || !v->stride ||
	    v->stride > UINT32_MAX)
		return -EINVAL;
	/* Page 0 .. num_blocks-1 must start inside the region; the fields'
	 * extents are checked as they are added. */
	if (__builtin_mul_overflow((uint64_t)v->num_blocks - 1, v->stride,
				   &end) ||
	    __builtin_add_overflow(end, v->offset, &end) ||
	    end >= l->regions[v->region])
		return -EINVAL;
	if (grow((void **)&l->views, &l->cap_views, l->nviews, sizeof(*v)))
		return -ENOMEM;
	l->views[l->nviews] = *v;
	if (id)
		*id = l->nviews;
	l->nviews++;
	return 0;
}

/* Byte just past the last element of a field, relative to the page start,
 * or 0 on overflow. */
static uint64_t field_extent(const struct kvp_field_desc *f)
{
	uint64_t end = f->offset, t;
	uint32_t i;

	for (i = 0; i < f->ndim; i++) {
		if (__builtin_mul_overflow((uint64_t)f->dim[i].size - 1,
					   f->dim[i].stride, &t) ||
		    __builtin_add_overflow(end, t, &end))
			return 0;
	}
	if (__builtin_add_overflow(end, f->elem_size, &end))
		return 0;
	return end;
}

/* ---- the (group, layer, kind) set of the fields ---- */

static uint32_t field_hash(uint32_t group, uint32_t layer, uint32_t kind)
{
	uint64_t k = (uint64_t)layer << 32 | group << 8 | kind;

	k ^= k >> 33;
	k *= 0xff51afd7ed558ccdull;
	k ^= k >> 33;
	return (uint32_t)k;
}

static uint32_t field_slot_hash(const kvp_layout *l, uint32_t i)
{
	const struct kvp_view_desc *v = &l->views[l->fields[i].view];

	return field_hash(v->group, v->layer, l->fields[i].d.kind);
}

/* Whether a field of (group, layer, kind) exists. Expected O(1). */
static int field_find(const kvp_layout *l, uint32_t group, uint32_t layer,
		      uint32_t kind)
{
	uint32_t mask = l->nslots - 1, h, s;

	if (!l->nslots)
		return 0;
	for (h = field_hash(group, layer, kind) & mask; (s = l->fslots[h]);
	     h = (h + 1) & mask) {
		const struct kvp_field *f = &l->fields[s - 1];
		const struct kvp_view_desc *v = &l->views[f->view];

		if (v->group == group && v->layer == layer && f->d.kind == kind)
			return 1;
	}
	return 0;
}

static void field_insert(uint32_t *slots, uint32_t nslots, uint32_t h,
			 uint32_t i)
{
	for (h &= nslots - 1; slots[h]; h = (h + 1) & (nslots - 1))
		;
	slots[h] = i + 1;
}

/* Makes room in the set for field index l->nfields, keeping the load at
 * most one half. Unchanged on failure. */
static int field_index_grow(kvp_layout *l)
{
	uint32_t n, i, *slots;

	if ((uint64_t)(l->nfields + 1) * 2 <= l->nslots)
		return 0;
	n = l->nslots ? l->nslots * 2 : 16;
	if (!n || n > UINT32_MAX / 4)
		return -ENOMEM;
	slots = calloc(n, sizeof(*slots));
	if (!slots)
		return -ENOMEM;
	for (i = 0; i < l->nfields; i++)
		field_insert(slots, n, field_slot_hash(l, i), i);
	free(l->fslots);
	l->fslots = slots;
	l->nslots = n;
	return 0;
}

static int check_field(const kvp_layout *l, uint32_t view,
		       const struct kvp_field_desc *f)
{
	const struct kvp_view_desc *v = &l->views[view];
	const struct kvp_group_desc *g = &l->groups[v->group];
	uint64_t tokens = 1, ext, last;
	uint32_t i, start, len, ntok = 0;

	if (f->comp_mask || f->kind >= KVP_FIELD_KIND_COUNT ||
	    !f->elem_size || !f->ndim || f->ndim > KVP_MAX_DIMS)
		return -EINVAL;
	for (i = 0; i < f->ndim; i++) {
		if (!f->dim[i].size || f->dim[i].axis >= KVP_AXIS_COUNT)
			return -EINVAL;
		/* A product that wraps could land on block_tokens. */
		if (f->dim[i].axis == KVP_AXIS_TOKEN) {
			if (__builtin_mul_overflow(tokens, f->dim[i].size,
						   &tokens))
				return -EINVAL;
			ntok++;
		}
	}
	if (g->kind == KVP_GROUP_STATE ? ntok != 0 : tokens != g->block_tokens)
		return -EINVAL;
	if (f->shard_dim != KVP_NO_SHARD) {
		const struct kvp_dim *sd;

		if (f->shard_dim >= f->ndim)
			return -EINVAL;
		sd = &f->dim[f->shard_dim];
		if (sd->axis == KVP_AXIS_TOKEN || sd->axis == KVP_AXIS_AUX)
			return -EINVAL;
		if (kvp_shard_range(f->shard_total, l->attr.tp_size,
				    l->attr.tp_rank, &start, &len) ||
		    sd->size != len)
			return -EINVAL;
		for (i = 0; i < f->ndim; i++)
			if (i != f->shard_dim && f->dim[i].axis == sd->axis)
				return -EINVAL;
	} else if (f->shard_total) {
		return -EINVAL;
	}
	ext = field_extent(f);
	if (!ext || ext > UINT32_MAX)
		return -EINVAL;
	last = v->offset + (uint64_t)(v->num_blocks - 1) * v->stride;
	if (__builtin_add_overflow(last, ext, &last) ||
	    last > l->regions[v->region])
		return -EINVAL;
	if (field_find(l, v->group, v->layer, f->kind))
		return -EINVAL;
	return 0;
}

int kvp_layout_add_field(kvp_layout *l, uint32_t view,
			 const struct kvp_field_desc *f)
{
	int err;

	if (!l || !f || view >= l->nviews)
		return -EINVAL;
	err = check_field(l, view, f);
	if (err)
		return err;
	if (grow((void **)&l->fields, &l->cap_fields, l->nfields,
		 sizeof(*l->fields)) ||
	    field_index_grow(l))
		return -ENOMEM;
	l->fields[l->nfields].d = *f;
	l->fields[l->nfields].view = view;
	field_insert(l->fslots, l->nslots, field_slot_hash(l, l->nfields),
		     l->nfields);
	l->nfields++;
	return 0;
}

void kvp_layout_get_info(const kvp_layout *l, struct kvp_layout_info *info)
{
	if (!info)
		return;
	if (!l) {
		memset(info, 0, sizeof(*info));
		return;
	}
	info->engine_id = l->attr.engine_id;
	info->tp_size = l->attr.tp_size;
	info->tp_rank = l->attr.tp_rank;
	info->ngroups = l->ngroups;
	info->nregions = l->nregions;
	info->nviews = l->nviews;
	info->nfields = l->nfields;
}

int kvp_layout_get_group(const kvp_layout *l, uint32_t i,
			 struct kvp_group_desc *g)
{
	if (!l || !g || i >= l->ngroups)
		return -EINVAL;
	*g = l->groups[i];
	return 0;
}

int kvp_layout_get_region(const kvp_layout *l, uint32_t i, uint64_t *size)
{
	if (!l || !size || i >= l->nregions)
		return -EINVAL;
	*size = l->regions[i];
	return 0;
}

int kvp_layout_set_region_key(kvp_layout *l, uint32_t i, uint64_t addr,
			      uint32_t rkey)
{
	if (!l || i >= l->nregions)
		return -EINVAL;
	l->raddr[i] = addr;
	l->rkey[i] = rkey;
	l->mrshift[i] = 0;
	free(l->xkeys[i]);
	l->xkeys[i] = NULL;
	return 0;
}

int kvp_layout_set_region_keys(kvp_layout *l, uint32_t i, uint64_t addr,
			       uint32_t shift, const uint32_t *keys,
			       uint32_t nkeys)
{
	uint32_t *x = NULL;

	if (!l || i >= l->nregions || !keys ||
	    (shift && (shift < KVP_MR_SHIFT_MIN || shift > KVP_MR_SHIFT_MAX)) ||
	    nkeys > KVP_MR_MAX_KEYS ||
	    nkeys != kvp__region_nkeys(l->regions[i], shift))
		return -EINVAL;
	if (nkeys > 1) {
		x = malloc((size_t)(nkeys - 1) * sizeof(*x));
		if (!x)
			return -ENOMEM;
		memcpy(x, keys + 1, (size_t)(nkeys - 1) * sizeof(*x));
	}
	free(l->xkeys[i]);
	l->xkeys[i] = x;
	l->raddr[i] = addr;
	l->rkey[i] = keys[0];
	l->mrshift[i] = (uint8_t)shift;
	return 0;
}

int kvp_layout_get_region_keys(const kvp_layout *l, uint32_t i,
			       uint64_t *addr, uint32_t *shift, uint32_t *keys,
			       uint32_t cap)
{
	uint64_t n, k;

	if (!l || !addr || !shift || (!keys && cap) || i >= l->nregions)
		return -EINVAL;
	n = kvp__region_nkeys(l->regions[i], l->mrshift[i]);
	*addr = l->raddr[i];
	*shift = l->mrshift[i];
	for (k = 0; k < n && k < cap; k++)
		keys[k] = k ? l->xkeys[i][k - 1] : l->rkey[i];
	return (int)n;
}

int kvp_layout_get_region_key(const kvp_layout *l, uint32_t i, uint64_t *addr,
			      uint32_t *rkey)
{
	if (!l || !addr || !rkey || i >= l->nregions)
		return -EINVAL;
	*addr = l->raddr[i];
	*rkey = l->rkey[i];
	return 0;
}

int kvp_layout_get_view(const kvp_layout *l, uint32_t i,
			struct kvp_view_desc *v)
{
	if (!l || !v || i >= l->nviews)
		return -EINVAL;
	*v = l->views[i];
	return 0;
}

int kvp_layout_get_field(const kvp_layout *l, uint32_t i, uint32_t *view,
			 struct kvp_field_desc *f)
{
	if (!l || !f || i >= l->nfields)
		return -EINVAL;
	*f = l->fields[i].d;
	if (view)
		*view = l->fields[i].view;
	return 0;
}

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	return h * 0xff51afd7ed558ccdull;
}

uint64_t kvp_layout_compat_hash(const kvp_layout *l)
{
	uint64_t h = 0x6b7670756c6cull, fh = 0;
	uint32_t i, d;

	if (!l)
		return 0;
	h = mix(h, l->ngroups);
	for (i = 0; i < l->ngroups; i++)
		h = mix(h, l->groups[i].kind);
	/* Fields in any order: combine their hashes commutatively. */
	for (i = 0; i < l->nfields; i++) {
		const struct kvp_field_desc *f = &l->fields[i].d;
		const struct kvp_view_desc *v = &l->views[l->fields[i].view];
		uint64_t ext[KVP_AXIS_COUNT], x = 0;

		for (d = 0; d < KVP_AXIS_COUNT; d++)
			ext[d] = 1;
		for (d = 0; d < f->ndim; d++)
			ext[f->dim[d].axis] *= f->dim[d].size;
		if (f->shard_dim != KVP_NO_SHARD)
			ext[f->dim[f->shard_dim].axis] = f->shard_total;
		ext[KVP_AXIS_TOKEN] = 1; /* block size may differ */
		x = mix(x, v->group);
		x = mix(x, v->layer);
		x = mix(x, f->kind);
		x = mix(x, f->elem_size);
		for (d = 0; d < KVP_AXIS_COUNT; d++)
			x = mix(x, ext[d]);
		fh += x;
	}
	return mix(h, fh);
}

void kvp__msg(char *msg, size_t msglen, const char *fmt, ...)
{
	va_list ap;

	if (!msg || !msglen)
		return;
	va_start(ap, fmt);
	vsnprintf(msg, msglen, fmt, ap);
	va_end(ap);
}
