// SPDX-License-Identifier: MIT
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvtest.h"

static uint64_t mix(uint64_t h, uint64_t v)
{
	h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
	h *= 0xbf58476d1ce4e5b9ull;
	return h ^ (h >> 31);
}

uint64_t kvt_rand(uint64_t *s)
{
	uint64_t z = (*s += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

int kvt_short_key_table(const kvp_layout *l, uint8_t **blob, size_t *len)
{
	struct kvp_layout_info li;
	kvp_layout *c = NULL;
	uint32_t *keys = NULL, n, i, ng;
	uint64_t size, addr;
	uint8_t *p = NULL, *r1;
	size_t full = 0;
	int ret = -1;

	kvp_layout_get_info(l, &li);
	if (li.nregions < 2 || kvp_layout_get_region(l, 0, &size) ||
	    size <= 65536 || kvp_layout_clone(l, &c))
		return -1;
	n = (uint32_t)((size + 32767) >> 15);
	keys = calloc(n, sizeof(*keys));
	addr = 0x7f0000000000ull;
	if (!keys)
		goto out;
	for (i = 0; i < n; i++)
		keys[i] = 0xc0de0000u + i;
	if (kvp_layout_set_region_keys(c, 0, addr, 15, keys, n) ||
	    kvp_meta_encode(c, NULL, 0, &full) != -EMSGSIZE)
		goto out;
	p = malloc(full);
	if (!p || kvp_meta_encode(c, p, full, &full))
		goto out;
	/* header: ngroups at 40; records: 8-byte groups, 24-byte regions */
	ng = (uint32_t)p[40] | (uint32_t)p[41] << 8 | (uint32_t)p[42] << 16 |
	     (uint32_t)p[43] << 24;
	r1 = p + 56 + 8 * (size_t)ng + 24;
	memset(r1, 0, 8);		  /* size 0: no key at all */
	r1[20] = 20;			  /* mr_shift 20 */
	r1[21] = r1[22] = r1[23] = 0;
	full -= 4;			  /* total_len: the short count */
	p[8] = (uint8_t)full;
	p[9] = (uint8_t)(full >> 8);
	p[10] = (uint8_t)(full >> 16);
	p[11] = (uint8_t)(full >> 24);
	*blob = p;
	*len = full;
	p = NULL;
	ret = 0;
out:
	free(p);
	free(keys);
	kvp_layout_destroy(c);
	return ret;
}

void kvt_random_ids(uint64_t *s, uint32_t *ids, uint32_t n, uint32_t bound)
{
	uint32_t i, j;

	for (i = 0; i < n; i++) {
again:
		ids[i] = (uint32_t)(kvt_rand(s) % bound);
		for (j = 0; j < i; j++)
			if (ids[j] == ids[i])
				goto again;
	}
}

int kvt_mem_alloc(const kvp_layout *l, struct kvt_mem *m)
{
	struct kvp_layout_info li;
	uint32_t i;

	kvp_layout_get_info(l, &li);
	m->nregions = li.nregions;
	m->buf = calloc(li.nregions + 1, sizeof(*m->buf));
	m->size = calloc(li.nregions + 1, sizeof(*m->size));
	if (!m->buf || !m->size)
		return -1;
	for (i = 0; i < li.nregions; i++) {
		if (kvp_layout_get_region(l, i, &m->size[i]))
			return -1;
		m->buf[i] = calloc(1, m->size[i]);
		if (!m->buf[i])
			return -1;
	}
	return 0;
}

int kvt_mem_like(struct kvt_mem *dst, const struct kvt_mem *src, int copy)
{
	uint32_t i;

	dst->nregions = src->nregions;
	dst->buf = calloc(src->nregions + 1, sizeof(*dst->buf));
	dst->size = calloc(src->nregions + 1, sizeof(*dst->size));
	if (!dst->buf || !dst->size)
		return -1;
	for (i = 0; i < src->nregions; i++) {
		dst->size[i] = src->size[i];
		dst->buf[i] = calloc(1, src->size[i] ? src->size[i] : 1);
		if (!dst->buf[i])
			return -1;
		if (copy)
			memcpy(dst->buf[i], src->buf[i], src->size[i]);
	}
	return 0;
}

int kvt_mem_copy(struct kvt_mem *dst, const struct kvt_mem *src)
{
	return kvt_mem_like(dst, src, 1);
}

void kvt_mem_free(struct kvt_mem *m)
{
	uint32_t i;

	if (!m->buf)
		return;
	for (i = 0; i < m->nregions; i++)
		free(m->buf[i]);
	free(m->buf);
	free(m->size);
	memset(m, 0, sizeof(*m));
}

void kvt_fill_background(struct kvt_mem *m, uint32_t salt)
{
	uint32_t r;
	uint64_t o;

	for (r = 0; r < m->nregions; r++)
		for (o = 0; o < m->size[r]; o++)
			m->buf[r][o] =
				(uint8_t)(mix(mix(salt, r), o >> 3) >> (8 * (o & 7)));
}

static int mem_zero_like(struct kvt_mem *dst, const struct kvt_mem *src)
{
	return kvt_mem_like(dst, src, 0);
}

/* Visits every element of field `f` (of view `v`, group `g`, layer) in the
 * page of block `id`; tok0 is the sequence position of the page's first
 * token (or the state's list index). `limit` is the first token position
 * not to visit. */
struct visit {
	const kvp_layout *l;
	struct kvt_mem *m, *need;
	uint32_t group, layer, kind;
	uint64_t from; /* the first token position to visit */
};

static void visit_field(const struct visit *vi, const struct kvp_view_desc *v,
			const struct kvp_field_desc *f, uint32_t id,
			uint64_t tok0, uint64_t limit, int state)
{
	struct kvp_layout_info li;
	uint32_t idx[KVP_MAX_DIMS] = { 0 }, place[KVP_MAX_DIMS];
	uint32_t start[KVP_AXIS_COUNT] = { 0 };
	uint64_t page = v->offset + (uint64_t)id * v->stride;
	int i, j;

	kvp_layout_get_info(vi->l, &li);
	if (f->shard_dim != KVP_NO_SHARD) {
		uint32_t s, n;

		if (!kvp_shard_range(f->shard_total, li.tp_size, li.tp_rank,
				     &s, &n))
			start[f->dim[f->shard_dim].axis] = s;
	}
	for (i = 0; i < (int)f->ndim; i++) {
		place[i] = 1;
		for (j = i + 1; j < (int)f->ndim; j++)
			if (f->dim[j].axis == f->dim[i].axis)
				place[i] *= f->dim[j].size;
	}
	for (;;) {
		uint64_t c[KVP_AXIS_COUNT] = { 0 }, off = f->offset, h;
		uint32_t e;

		for (i = 0; i < (int)f->ndim; i++) {
			c[f->dim[i].axis] += (uint64_t)idx[i] * place[i];
			off += idx[i] * f->dim[i].stride;
		}
		for (i = 0; i < KVP_AXIS_COUNT; i++)
			c[i] += start[i];
		if (!state)
			c[KVP_AXIS_TOKEN] += tok0;
		if (state || (c[KVP_AXIS_TOKEN] >= vi->from &&
			      c[KVP_AXIS_TOKEN] < limit)) {
			h = mix(mix(mix(vi->group + 1, vi->layer), vi->kind),
				state ? tok0 : 0xffff);
			for (i = 0; i < KVP_AXIS_COUNT; i++)
				h = mix(h, c[i]);
			for (e = 0; e < f->elem_size; e++) {
				uint8_t *b = &vi->m->buf[v->region][page + off + e];

				*b = (uint8_t)(mix(h, e / 8) >> (8 * (e & 7)));
				if (vi->need)
					vi->need->buf[v->region][page + off + e]++;
			}
		}
		for (i = (int)f->ndim - 1; i >= 0; i--) {
			if (++idx[i] < f->dim[i].size)
				break;
			idx[i] = 0;
		}
		if (i < 0)
			break;
	}
}

/* Visits the fields of every view of group g in block `id` whose layer is
 * in [layer0, layer1), token positions [from, limit). */
static void visit_layers(const kvp_layout *l, struct kvt_mem *m,
			 struct kvt_mem *need, uint32_t g, uint32_t id,
			 uint64_t tok0, uint64_t from, uint64_t limit,
			 int state, uint32_t layer0, uint32_t layer1)
{
	struct kvp_layout_info li;
	uint32_t i, view;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;
		struct kvp_view_desc v;
		struct visit vi;

		if (kvp_layout_get_field(l, i, &view, &f) ||
		    kvp_layout_get_view(l, view, &v) || v.group != g ||
		    v.layer < layer0 || v.layer >= layer1)
			continue;
		vi.l = l;
		vi.m = m;
		vi.need = need;
		vi.group = g;
		vi.layer = v.layer;
		vi.kind = f.kind;
		vi.from = from;
		visit_field(&vi, &v, &f, id, tok0, limit, state);
	}
}

/* Visits the fields of every view of group g in block `id`. */
static void visit_block(const kvp_layout *l, struct kvt_mem *m,
			struct kvt_mem *need, uint32_t g, uint32_t id,
			uint64_t tok0, uint64_t limit, int state)
{
	visit_layers(l, m, need, g, id, tok0, 0, limit, state, 0,
		     UINT32_MAX);
}

void kvt_fill_producer(const kvp_layout *l, struct kvt_mem *m,
		       const struct kvp_ids *ids)
{
	struct kvp_layout_info li;
	uint32_t g, i;

	kvp_layout_get_info(l, &li);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc gd;
		int state;

		if (kvp_layout_get_group(l, g, &gd))
			continue;
		state = gd.kind == KVP_GROUP_STATE;
		for (i = 0; i < ids[g].nremote; i++)
			visit_block(l, m, NULL, g, ids[g].remote[i],
				    state ? i : (uint64_t)i * gd.block_tokens,
				    UINT64_MAX, state);
	}
}

void kvt_fill_producer_part(const kvp_layout *l, struct kvt_mem *m,
			    const struct kvp_ids *ids, uint32_t layer0,
			    uint32_t layer1, uint64_t from, uint64_t to)
{
	struct kvp_layout_info li;
	uint32_t g, i;

	if (from >= to)
		return;
	kvp_layout_get_info(l, &li);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc gd;
		int state;

		if (kvp_layout_get_group(l, g, &gd))
			continue;
		state = gd.kind == KVP_GROUP_STATE;
		/* a recurrent state: whole once the last chunk is through */
		if (state && to != KVP_TOKENS_END)
			continue;
		for (i = 0; i < ids[g].nremote; i++)
			visit_layers(l, m, NULL, g, ids[g].remote[i],
				     state ? i : (uint64_t)i * gd.block_tokens,
				     from, to, state, layer0, layer1);
	}
}

void kvt_expect_consumer(const kvp_layout *local, const kvp_layout *remote,
			 struct kvt_mem *m, struct kvt_mem *need,
			 const struct kvp_ids *ids)
{
	struct kvp_layout_info li;
	uint32_t g, i;

	kvp_layout_get_info(local, &li);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc lg, rg;
		uint64_t tokens, nl, rend, skip;

		if (kvp_layout_get_group(local, g, &lg) ||
		    kvp_layout_get_group(remote, g, &rg))
			continue;
		if (lg.kind == KVP_GROUP_STATE) {
			for (i = 0; i < ids[g].nlocal; i++)
				visit_block(local, m, need, g, ids[g].local[i],
					    i, 0, 1);
			continue;
		}
		tokens = ids[g].tokens ? ids[g].tokens :
					 (uint64_t)ids[g].nremote * rg.block_tokens;
		nl = (tokens + lg.block_tokens - 1) / lg.block_tokens;
		rend = (tokens + rg.block_tokens - 1) / rg.block_tokens;
		skip = nl - ids[g].nlocal;
		for (i = 0; i < ids[g].nlocal; i++)
			visit_block(local, m, need, g, ids[g].local[i],
				    (skip + i) * lg.block_tokens,
				    rend * rg.block_tokens, 0);
	}
}

int kvt_execute(const kvp_plan *plan, const struct kvp_wr *wr, uint32_t nwr,
		const struct kvp_sge *sge, struct kvt_mem *const *prod,
		struct kvt_mem *local, struct kvt_mem *seen, uint64_t *bytes)
{
	struct kvp_plan_info pi;
	uint32_t i, j;

	kvp_plan_get_info(plan, &pi);
	for (i = 0; i < nwr; i++) {
		const struct kvp_wr *w = &wr[i];
		struct kvt_mem *pm;
		int rank = kvp_plan_source(plan, w->src);
		uint64_t pos = 0, total = 0;

		if (rank < 0 || w->nsge == 0 || w->nsge > pi.max_sge) {
			fprintf(stderr, "wr %u: bad src %u or nsge %u\n", i,
				w->src, w->nsge);
			return -1;
		}
		pm = prod[rank];
		if (w->region >= pm->nregions ||
		    w->offset + w->len > pm->size[w->region]) {
			fprintf(stderr, "wr %u: remote range out of bounds\n", i);
			return -1;
		}
		for (j = 0; j < w->nsge; j++) {
			const struct kvp_sge *s = &sge[w->sge_first + j];
			uint64_t k;

			if (s->region >= local->nregions ||
			    s->offset + s->len > local->size[s->region]) {
				fprintf(stderr, "wr %u sge %u: local range out of bounds\n",
					i, j);
				return -1;
			}
			memcpy(local->buf[s->region] + s->offset,
			       pm->buf[w->region] + w->offset + pos, s->len);
			for (k = 0; k < s->len; k++)
				seen->buf[s->region][s->offset + k]++;
			pos += s->len;
			total += s->len;
		}
		if (total != w->len) {
			fprintf(stderr, "wr %u: sge lengths %llu != wr len %u\n",
				i, (unsigned long long)total, w->len);
			return -1;
		}
		*bytes += w->len;
	}
	return 0;
}

int kvt_mem_compare(const struct kvt_mem *a, const struct kvt_mem *b,
		    const char *what)
{
	uint32_t r;
	uint64_t o;

	for (r = 0; r < a->nregions; r++) {
		if (!memcmp(a->buf[r], b->buf[r], a->size[r]))
			continue;
		for (o = 0; o < a->size[r]; o++)
			if (a->buf[r][o] != b->buf[r][o])
				break;
		fprintf(stderr, "%s: region %u offset %llu: %u != %u\n", what,
			r, (unsigned long long)o, a->buf[r][o], b->buf[r][o]);
		return -1;
	}
	return 0;
}

kvp_layout *kvt_build(const struct kvp_model *m, uint32_t tp, uint32_t rank,
		      uint32_t block_tokens, uint32_t kernel_tokens,
		      uint32_t num_blocks, uint32_t kv_layout)
{
	struct kvp_engine_desc e = { 0 };
	kvp_layout *l = NULL;

	e.engine_id = 1;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = block_tokens;
	e.kernel_block_tokens = kernel_tokens;
	e.num_blocks = num_blocks;
	e.kv_layout = kv_layout;
	if (kvp_layout_build(m, &e, &l))
		return NULL;
	return l;
}

int kvt_check_pull(const kvp_layout *local, kvp_layout *const *remote,
		   uint32_t max_sge, const struct kvp_ids *ids,
		   uint32_t *nwr_out, uint64_t *bytes_out)
{
	struct kvp_layout_info ri;
	struct kvp_plan_attr attr = { 0 };
	struct kvt_mem *prod = NULL, **pp = NULL, mem = { 0 }, exp = { 0 };
	struct kvt_mem need = { 0 }, seen = { 0 };
	struct kvp_wr *wr = NULL;
	struct kvp_sge *sge = NULL;
	kvp_plan *plan = NULL;
	uint32_t P, i, maxw, maxs, maxids = 0;
	uint64_t bytes = 0;
	char msg[256] = "";
	int ret = -1, n;

	kvp_layout_get_info(remote[0], &ri);
	P = ri.tp_size;
	attr.max_sge = max_sge;
	n = kvp_plan_compile(local, remote[0], &attr, &plan, msg, sizeof(msg));
	if (n) {
		fprintf(stderr, "compile: %s: %s\n", kvp_strerror(n), msg);
		return -1;
	}
	prod = calloc(P, sizeof(*prod));
	pp = calloc(P, sizeof(*pp));
	if (!prod || !pp)
		goto out;
	for (i = 0; i < P; i++) {
		pp[i] = &prod[i];
		if (kvt_mem_alloc(remote[i], &prod[i]))
			goto out;
		kvt_fill_background(&prod[i], 100 + i);
		kvt_fill_producer(remote[i], &prod[i], ids);
	}
	if (kvt_mem_alloc(local, &mem))
		goto out;
	kvt_fill_background(&mem, 7);
	if (kvt_mem_copy(&exp, &mem) || mem_zero_like(&need, &mem) ||
	    mem_zero_like(&seen, &mem))
		goto out;
	kvt_expect_consumer(local, remote[0], &exp, &need, ids);
	for (i = 0; i < 64 && i < ri.ngroups; i++) {
		if (ids[i].nlocal > maxids)
			maxids = ids[i].nlocal;
		if (ids[i].nremote > maxids)
			maxids = ids[i].nremote;
	}
	kvp_plan_emit_bound(plan, maxids, &maxw, &maxs);
	wr = calloc(maxw + 1, sizeof(*wr));
	sge = calloc(maxs + 1, sizeof(*sge));
	if (!wr || !sge)
		goto out;
	n = kvp_plan_emit(plan, ids, wr, maxw, sge, maxs, NULL);
	if (n < 0) {
		fprintf(stderr, "emit: %s\n", kvp_strerror(n));
		goto out;
	}
	if (kvt_execute(plan, wr, (uint32_t)n, sge, pp, &mem, &seen, &bytes))
		goto out;
	if (kvt_mem_compare(&mem, &exp, "consumer bytes") ||
	    kvt_mem_compare(&seen, &need, "written-once map"))
		goto out;
	if (nwr_out)
		*nwr_out = (uint32_t)n;
	if (bytes_out)
		*bytes_out = bytes;
	ret = 0;
out:
	for (i = 0; prod && i < P; i++)
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
	return ret;
}

uint32_t kvt_layers(const kvp_layout *l)
{
	struct kvp_layout_info li;
	struct kvp_view_desc v;
	uint32_t i, n = 0;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++)
		if (!kvp_layout_get_view(l, i, &v) && v.layer + 1 > n)
			n = v.layer + 1;
	return n;
}

uint64_t kvt_ready(const struct kvp_progress *p, uint32_t l)
{
	if (p->tokens_cur > p->tokens_all && l < p->layers_cur)
		return p->tokens_cur;
	return p->tokens_all;
}
