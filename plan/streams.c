// SPDX-License-Identifier: MIT
/*
 * Plan compilation, streams: give views of the same group and fields one
 * shape, plan each (local shape, remote shape) pair once into one piece set
 * per producer rank, and push a stream per (local view, remote view, rank);
 * views of shapes already planned reuse their sets, so pieces of identical
 * geometry are shared by all layers. Calls match.c, refine.c and imap.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"

static int field_same(const struct kvp_field_desc *a,
		      const struct kvp_field_desc *b)
{
	uint32_t i;

	if (a->kind != b->kind || a->elem_size != b->elem_size ||
	    a->offset != b->offset || a->ndim != b->ndim ||
	    a->shard_dim != b->shard_dim || a->shard_total != b->shard_total)
		return 0;
	for (i = 0; i < a->ndim; i++)
		if (a->dim[i].size != b->dim[i].size ||
		    a->dim[i].stride != b->dim[i].stride ||
		    a->dim[i].axis != b->dim[i].axis)
			return 0;
	return 1;
}

int kvp__view_csr(const kvp_layout *l, struct csr *c)
{
	uint32_t i, v, *fill;

	c->first = calloc((size_t)l->nviews + 2, sizeof(*c->first));
	c->list = malloc(((size_t)l->nfields + 1) * sizeof(*c->list));
	fill = malloc(((size_t)l->nviews + 1) * sizeof(*fill));
	if (!c->first || !c->list || !fill) {
		free(fill);
		return -ENOMEM;
	}
	for (i = 0; i < l->nfields; i++)
		c->first[l->fields[i].view + 1]++;
	for (v = 0; v < l->nviews; v++) {
		c->first[v + 1] += c->first[v];
		fill[v] = c->first[v];
	}
	for (i = 0; i < l->nfields; i++)
		c->list[fill[l->fields[i].view]++] = i;
	free(fill);
	return 0;
}

void kvp__csr_free(struct csr *c)
{
	free(c->first);
	free(c->list);
}

static uint32_t field_hash(uint32_t h, const struct kvp_field_desc *f)
{
	uint32_t i;

	h = kvp__mix(h, f->kind | (uint64_t)f->elem_size << 32);
	h = kvp__mix(h, f->offset);
	h = kvp__mix(h, f->ndim | (uint64_t)f->shard_dim << 32);
	h = kvp__mix(h, f->shard_total);
	for (i = 0; i < f->ndim && i < KVP_MAX_DIMS; i++) {
		h = kvp__mix(h, f->dim[i].stride);
		h = kvp__mix(h,
			     f->dim[i].size | (uint64_t)f->dim[i].axis << 32);
	}
	return h;
}

/* A view being given its shape: compared with the shapes' representatives. */
struct shape_ctx {
	const kvp_layout *l;
	const struct csr *c;
	const uint32_t *rep;
	uint32_t v;
};

static int shape_eq(const void *ctx, uint32_t k)
{
	const struct shape_ctx *x = ctx;
	const kvp_layout *l = x->l;
	const struct csr *c = x->c;
	uint32_t v = x->v, w = x->rep[k], i;
	uint32_t nf = c->first[v + 1] - c->first[v];

	if (l->views[w].group != l->views[v].group ||
	    c->first[w + 1] - c->first[w] != nf)
		return 0;
	for (i = 0; i < nf; i++)
		if (!field_same(&l->fields[c->list[c->first[v] + i]].d,
				&l->fields[c->list[c->first[w] + i]].d))
			return 0;
	return 1;
}

/* Views with the same group and the same fields share a shape id, numbered
 * in order of first appearance. */
int kvp__view_shapes(const kvp_layout *l, const struct csr *c, uint32_t *shape)
{
	uint32_t *rep = malloc(((size_t)l->nviews + 1) * sizeof(*rep));
	struct shape_ctx x = { l, c, rep, 0 };
	struct imap m = { 0 };
	uint32_t v, i, h, s, nrep = 0, recent[4] = { 0 };
	int err = 0;

	if (!rep)
		return -ENOMEM;
	for (v = 0; v < l->nviews; v++) {
		/* Fast path: layers repeat the last few shapes (K and V views
		 * alternate); the map is for the rest. */
		x.v = v;
		for (i = 0; i < 4 && i < nrep; i++)
			if (shape_eq(&x, recent[i]))
				break;
		if (i < 4 && i < nrep) {
			shape[v] = recent[i];
			continue;
		}
		h = kvp__mix(0, l->views[v].group);
		for (i = c->first[v]; i < c->first[v + 1]; i++)
			h = field_hash(h, &l->fields[c->list[i]].d);
		err = kvp__imap_reserve(&m);
		if (err)
			break;
		s = kvp__imap_probe(&m, h, shape_eq, &x);
		if (!m.slot[s]) {
			kvp__imap_put(&m, s, h, nrep);
			rep[nrep++] = v;
		}
		shape[v] = m.slot[s] - 1;
		memmove(recent + 1, recent, sizeof(recent) - sizeof(*recent));
		recent[0] = shape[v];
	}
	kvp__imap_free(&m);
	free(rep);
	return err;
}

struct set_key {
	uint32_t lshape, rshape, rank;
};

/* A segment of the i-th field pair of a sub-list; `pos` orders the
 * segments of one rank as they were generated. */
struct rseg {
	struct seg s;
	uint32_t i, pos;
};

static int rseg_cmp(const void *x, const void *y)
{
	const struct rseg *a = x, *b = y;

	if (a->s.rank != b->s.rank)
		return a->s.rank < b->s.rank ? -1 : 1;
	return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* Makes the piece set of one (local shape, remote shape, rank): the
 * segments rs[n] of that rank. Each shape pair is planned once (find_pair()),
 * so the set is new. */
static int make_set(struct work *w, uint32_t lv, uint32_t rv, uint32_t group,
		    const struct match *m, const struct rseg *rs, uint32_t n,
		    uint32_t *set)
{
	const kvp_layout *l = w->l, *r = w->r;
	struct set_key key = { w->lshape[lv], w->rshape[rv], rs[0].s.rank };
	uint32_t i, k, first = w->pieces.n, bytes = 0;
	int err;

	for (k = 0; k < n; k++) {
		const struct kvp_field_desc *lf = &l->fields[m[rs[k].i].lf].d;
		const struct kvp_field_desc *rf = &r->fields[m[rs[k].i].rf].d;

		err = kvp__field_pieces(lf, l->attr.tp_size, l->attr.tp_rank,
					rf, r->attr.tp_size, &rs[k].s,
					&w->per[group], &w->pieces);
		if (err == -EFBIG)
			kvp__msg(w->msg, w->msglen,
				 "group %u layer %u %s: plan too costly: over %u piece templates (KVP_PLAN_MAX_WORK)",
				 group, l->views[lv].layer,
				 kvp__kind_name[lf->kind], KVP_PLAN_MAX_WORK);
		if (err == -EPROTO)
			kvp__msg(w->msg, w->msglen,
				 "group %u layer %u %s: the two layouts have no common refinement (dims do not nest, or a piece exceeds the plan's limits)",
				 group, l->views[lv].layer,
				 kvp__kind_name[lf->kind]);
		if (err)
			return err;
	}
	if (w->nsets == w->cap_sets) {
		uint32_t cap = w->cap_sets ? w->cap_sets * 2 : 16;
		void *a = realloc(w->sets, cap * sizeof(*w->sets));

		if (!a)
			return -ENOMEM;
		w->sets = a;
		a = realloc(w->keys, cap * sizeof(*w->keys));
		if (!a)
			return -ENOMEM;
		w->keys = a;
		a = realloc(w->ends, cap * sizeof(*w->ends));
		if (!a)
			return -ENOMEM;
		w->ends = a;
		w->cap_sets = cap;
	}
	if (w->nsets >= UINT16_MAX) {
		kvp__msg(w->msg, w->msglen, "too many distinct view shapes");
		return -EPROTO;
	}
	w->pieces.n = first + kvp__merge_pieces(w->pieces.p + first,
						w->pieces.n - first);
	err = kvp__split_pieces(&w->pieces, first, w->max_len);
	if (err == -EPROTO)
		kvp__msg(w->msg, w->msglen,
			 "max_len %u cuts the pieces into more than %u templates",
			 w->max_len, MAX_PIECES_PER_SET);
	if (err == -EFBIG)
		kvp__msg(w->msg, w->msglen,
			 "max_len %u: plan too costly: over %u piece templates (KVP_PLAN_MAX_WORK)",
			 w->max_len, KVP_PLAN_MAX_WORK);
	if (err)
		return err;
	w->ends[w->nsets].l = w->ends[w->nsets].r = 0;
	for (i = first; i < w->pieces.n; i++) {
		const struct kvp_piece *p = &w->pieces.p[i];

		bytes += p->len;
		if (p->loff + (uint64_t)p->len > w->ends[w->nsets].l)
			w->ends[w->nsets].l = p->loff + (uint64_t)p->len;
		if (p->roff + (uint64_t)p->len > w->ends[w->nsets].r)
			w->ends[w->nsets].r = p->roff + (uint64_t)p->len;
	}
	w->sets[w->nsets].first = first;
	w->sets[w->nsets].count = w->pieces.n - first;
	w->sets[w->nsets].group = group;
	w->sets[w->nsets].bytes = bytes;
	w->keys[w->nsets] = key;
	*set = w->nsets++;
	return 0;
}

static int push_stream(struct work *w, uint32_t lv, uint32_t rv, uint32_t rank,
		       uint32_t set)
{
	struct kvp_pstream *s;

	if (w->nstreams == w->cap_streams) {
		uint32_t cap = w->cap_streams ? w->cap_streams * 2 : 64;
		void *a = realloc(w->streams, cap * sizeof(*w->streams));

		if (!a)
			return -ENOMEM;
		w->streams = a;
		w->cap_streams = cap;
	}
	s = &w->streams[w->nstreams++];
	s->lview = lv;
	s->rview = rv;
	s->src = (uint16_t)rank;
	s->set = (uint16_t)set;
	s->gather = 0;
	return 0;
}

/* A (local shape, remote shape) pair planned once: its sets in order. */
struct pair {
	uint32_t lshape, rshape, first, n;
};

struct pair_ctx {
	const struct pair *pairs;
	uint32_t lshape, rshape;
};

static int pair_eq(const void *ctx, uint32_t i)
{
	const struct pair_ctx *x = ctx;

	return x->pairs[i].lshape == x->lshape &&
	       x->pairs[i].rshape == x->rshape;
}

/* Pushes the streams of an already planned shape pair: returns 0 when it
 * did, 1 when the pair is new (then it is begun: its sets follow with
 * pair_entry()), or a negative errno. */
static int find_pair(struct work *w, uint32_t lv, uint32_t rv, uint32_t group)
{
	struct pair_ctx x = { w->pairs, w->lshape[lv], w->rshape[rv] };
	uint32_t h = kvp__mix(kvp__mix(0, x.lshape), x.rshape);
	uint32_t k, s, P = w->r->attr.tp_size;
	const struct pair *pr;
	int err;

	err = kvp__imap_reserve(&w->pmap);
	if (err)
		return err;
	s = kvp__imap_probe(&w->pmap, h, pair_eq, &x);
	if (!w->pmap.slot[s]) {
		if (w->npairs == w->cap_pairs) {
			uint32_t cap = w->cap_pairs ? w->cap_pairs * 2 : 16;
			void *a = realloc(w->pairs, cap * sizeof(*w->pairs));

			if (!a)
				return -ENOMEM;
			w->pairs = a;
			w->cap_pairs = cap;
		}
		w->pairs[w->npairs].lshape = x.lshape;
		w->pairs[w->npairs].rshape = x.rshape;
		w->pairs[w->npairs].first = w->nentries;
		w->pairs[w->npairs].n = 0;
		kvp__imap_put(&w->pmap, s, h, w->npairs++);
		return 1;
	}
	pr = &w->pairs[w->pmap.slot[s] - 1];
	for (k = 0; k < pr->n; k++) {
		uint32_t set = w->entries[pr->first + k];
		uint32_t rank = w->keys[set].rank;

		err = push_stream(w, lv, rv, rank, set);
		if (err)
			return err;
		w->gused[(size_t)group * P + rank] = 1;
	}
	return 0;
}

static int pair_entry(struct work *w, uint32_t set)
{
	if (w->nentries == w->cap_entries) {
		uint32_t cap = w->cap_entries ? w->cap_entries * 2 : 64;
		void *a = realloc(w->entries, cap * sizeof(*w->entries));

		if (!a)
			return -ENOMEM;
		w->entries = a;
		w->cap_entries = cap;
	}
	w->entries[w->nentries++] = set;
	return 0;
}

/* Segments of every field pair of a sub-list, sorted by rank (ties in
 * generation order), into w->rs[w->nrs]. */
static int sub_segments(struct work *w, const struct match *sub, uint32_t nsub)
{
	const kvp_layout *l = w->l, *r = w->r;
	struct seg segs[256];
	uint32_t i;
	int n, k;

	w->nrs = 0;
	for (i = 0; i < nsub; i++) {
		n = kvp__segments(&l->fields[sub[i].lf].d, l->attr.tp_size,
				  l->attr.tp_rank, &r->fields[sub[i].rf].d,
				  r->attr.tp_size, segs, 256);
		if (n < 0)
			return n;
		if (w->nrs + (uint32_t)n > w->cap_rs) {
			uint32_t cap = (w->nrs + (uint32_t)n) * 2;
			void *a = realloc(w->rs, cap * sizeof(*w->rs));

			if (!a)
				return -ENOMEM;
			w->rs = a;
			w->cap_rs = cap;
		}
		for (k = 0; k < n; k++, w->nrs++) {
			w->rs[w->nrs].s = segs[k];
			w->rs[w->nrs].i = i;
			w->rs[w->nrs].pos = w->nrs;
		}
	}
	qsort(w->rs, w->nrs, sizeof(*w->rs), rseg_cmp);
	return 0;
}

/* Plans one local view: its fields grouped by remote view, then by rank. */
int kvp__plan_view(struct work *w, uint32_t lv, struct match *m)
{
	const kvp_layout *l = w->l, *r = w->r;
	uint32_t group = l->views[lv].group, nm = 0, i, j, f, done = 0;
	int err;

	for (f = w->lcsr.first[lv]; f < w->lcsr.first[lv + 1]; f++) {
		int rf;

		i = w->lcsr.list[f];
		rf = kvp__find_field(r, w->ridx, l, i);
		if (rf < 0) {
			kvp__msg(w->msg, w->msglen,
				 "remote has no %s field for group %u layer %u",
				 kvp__kind_name[l->fields[i].d.kind], group,
				 l->views[lv].layer);
			return -EPROTO;
		}
		m[nm].lf = i;
		m[nm].rf = (uint32_t)rf;
		nm++;
	}
	/* Each distinct remote view in turn, fields matched into it. */
	while (done < nm) {
		uint32_t rv = UINT32_MAX, nsub = 0;
		struct match *sub = m + nm;

		for (i = 0; i < nm; i++) {
			uint32_t v = r->fields[m[i].rf].view;

			if (m[i].lf == UINT32_MAX)
				continue;
			if (rv == UINT32_MAX)
				rv = v;
			if (v == rv) {
				sub[nsub++] = m[i];
				m[i].lf = UINT32_MAX;
				done++;
			}
		}
		/* Views of the same shapes were planned already: same sets. */
		err = find_pair(w, lv, rv, group);
		if (err < 0)
			return err;
		if (!err)
			continue;
		/* The ranks this sub-list reads from, ascending: one set each,
		 * from that rank's segments only (linear in the segments, not
		 * in the remote TP size). */
		err = sub_segments(w, sub, nsub);
		if (err)
			return err;
		for (i = 0; i < w->nrs; i = j) {
			uint32_t set, rank = w->rs[i].s.rank;

			for (j = i; j < w->nrs && w->rs[j].s.rank == rank; j++)
				;
			err = make_set(w, lv, rv, group, sub, w->rs + i, j - i,
				       &set);
			if (err)
				return err;
			if (!w->sets[set].count)
				continue;
			w->pairs[w->npairs - 1].n++;
			err = pair_entry(w, set);
			err = err ?: push_stream(w, lv, rv, rank, set);
			if (err)
				return err;
			w->gused[(size_t)group * r->attr.tp_size + rank] = 1;
		}
	}
	return 0;
}

/* Orders streams by source rank, keeping the local view order within one
 * (a stable counting sort: they were generated in view order). */
int kvp__sort_streams(struct work *w)
{
	uint32_t P = w->r->attr.tp_size, i;
	uint32_t *pos = calloc((size_t)P + 1, sizeof(*pos));
	struct kvp_pstream *out = malloc(((size_t)w->nstreams + 1) *
					 sizeof(*out));

	if (!pos || !out) {
		free(pos);
		free(out);
		return -ENOMEM;
	}
	for (i = 0; i < w->nstreams; i++)
		pos[w->streams[i].src + 1]++;
	for (i = 0; i < P; i++)
		pos[i + 1] += pos[i];
	for (i = 0; i < w->nstreams; i++)
		out[pos[w->streams[i].src]++] = w->streams[i];
	free(w->streams);
	free(pos);
	w->streams = out;
	w->cap_streams = w->nstreams + 1;
	return 0;
}
