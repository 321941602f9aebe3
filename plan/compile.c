// SPDX-License-Identifier: MIT
/*
 * Plan compilation: match the consumer's fields with the producer's, split
 * each needed box between producer ranks (interval arithmetic on the sharded
 * axis), and turn every (local field, remote field, rank) into piece
 * templates for one period of blocks by refining both sides' strides into a
 * common index space. Pieces of identical geometry are shared by all layers.
 *
 * kvp_plan_compile() runs those steps (match.c, refine.c, streams.c, then
 * gather.c), checks the streams against both layouts' regions and lays the
 * plan out in one allocation; only notify.c stands above it (compile.h).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"

/* Block-id bounds of each group: the smallest view on each side. */
static void group_bounds(const kvp_layout *l, uint32_t g, uint32_t *nb)
{
	uint32_t v;
	int seen = 0;

	/* No sentinel: UINT32_MAX blocks is a legal view size. */
	*nb = 0;
	for (v = 0; v < l->nviews; v++) {
		if (l->views[v].group == g &&
		    (!seen || l->views[v].num_blocks < *nb)) {
			*nb = l->views[v].num_blocks;
			seen = 1;
		}
	}
}

/* Whether any block id < num_blocks keeps `end` bytes of its page inside the
 * region. */
static int view_fits(const struct kvp_view_desc *v, uint64_t region,
		     uint64_t end)
{
	return v->offset + (uint64_t)(v->num_blocks - 1) * v->stride + end <=
	       region;
}

/* Checks every stream's farthest piece against both regions: a piece lies
 * inside one page, so the last page bounds it whatever the block id. The
 * farthest piece of each set was found when the set was made, so this is
 * linear in the streams, not streams times pieces. */
static int check_bounds(struct work *w)
{
	uint32_t i;

	for (i = 0; i < w->nstreams; i++) {
		const struct kvp_pstream *s = &w->streams[i];
		const struct kvp_view_desc *lv = &w->l->views[s->lview];
		const struct kvp_view_desc *rv = &w->r->views[s->rview];

		if (!view_fits(lv, w->l->regions[lv->region],
			       w->ends[s->set].l)) {
			kvp__msg(w->msg, w->msglen,
				 "layer %u: a planned write runs past local region %u",
				 lv->layer, lv->region);
			return -EPROTO;
		}
		if (!view_fits(rv, w->r->regions[rv->region],
			       w->ends[s->set].r)) {
			kvp__msg(w->msg, w->msglen,
				 "layer %u: a planned read runs past remote region %u",
				 rv->layer, rv->region);
			return -EPROTO;
		}
	}
	return 0;
}

static void work_free(struct work *w)
{
	free(w->lshape);
	free(w->rshape);
	kvp__csr_free(&w->lcsr);
	kvp__csr_free(&w->rcsr);
	free(w->ridx);
	free(w->pieces.p);
	free(w->sets);
	free(w->keys);
	free(w->ends);
	free(w->streams);
	free(w->pairs);
	kvp__imap_free(&w->pmap);
	free(w->rs);
	free(w->entries);
	free(w->used);
	free(w->gused);
}

/* Lays the plan out in one allocation. */
static int build_plan(struct work *w, kvp_plan **out)
{
	const kvp_layout *l = w->l, *r = w->r;
	uint32_t P = r->attr.tp_size, nsrc = 0, nnot = 0, i, g, lo, hi;
	uint16_t *srcidx;
	size_t off, sz[11];
	kvp_plan *p;
	char *base;

	srcidx = malloc(P * sizeof(*srcidx));
	if (!srcidx)
		return -ENOMEM;
	memset(w->used, 0, P);
	for (i = 0; i < w->nstreams; i++)
		w->used[w->streams[i].src] = 1;
	for (i = 0; i < P; i++)
		if (w->used[i])
			srcidx[i] = (uint16_t)nsrc++;
	kvp__notify_cover(l->attr.tp_rank, l->attr.tp_size, P, &lo, &hi);
	for (i = 0; i < P; i++)
		if (w->used[i] || (i >= lo && i < hi))
			nnot++;

	sz[0] = sizeof(*p);
	sz[1] = l->ngroups * sizeof(struct kvp_pgroup);
	sz[2] = w->nstreams * sizeof(struct kvp_pstream);
	sz[3] = w->nsets * sizeof(struct kvp_pset);
	sz[4] = w->pieces.n * sizeof(struct kvp_piece);
	sz[5] = (l->nviews + r->nviews) * sizeof(struct kvp_pview);
	sz[6] = (nsrc + nnot) * sizeof(uint16_t);
	sz[7] = w->gw->ng * sizeof(struct kvp_pgather);
	sz[8] = w->gw->nsets * sizeof(struct kvp_gset);
	sz[9] = w->gw->np * sizeof(struct kvp_gpiece);
	sz[10] = r->nviews * sizeof(uint16_t);
	for (off = 0, i = 0; i < 11; i++)
		off += (sz[i] + 7) & ~(size_t)7;
	base = calloc(1, off);
	if (!base) {
		free(srcidx);
		return -ENOMEM;
	}
	p = (kvp_plan *)base;
	off = (sz[0] + 7) & ~(size_t)7;
#define CARVE(field, k)                          \
	do {                                     \
		p->field = (void *)(base + off); \
		off += (sz[k] + 7) & ~(size_t)7; \
	} while (0)
	CARVE(groups, 1);
	CARVE(streams, 2);
	CARVE(sets, 3);
	CARVE(pieces, 4);
	CARVE(lviews, 5);
	p->rviews = p->lviews + l->nviews;
	CARVE(src, 6);
	p->notify = p->src + nsrc;
	CARVE(gathers, 7);
	CARVE(gsets, 8);
	CARVE(gpieces, 9);
	CARVE(rlayer, 10);
#undef CARVE
	p->bytes = off;
	p->ngroups = l->ngroups;
	p->nsrc = nsrc;
	p->nnotify = nnot;
	p->nstreams = w->nstreams;
	p->nsets = w->nsets;
	p->npieces = w->pieces.n;
	p->nlviews = l->nviews;
	p->nrviews = r->nviews;
	p->ngathers = w->gw->ng;
	p->ngsets = w->gw->nsets;
	p->ngpieces = w->gw->np;
	p->local_tp = l->attr.tp_size;
	p->local_rank = l->attr.tp_rank;
	p->remote_tp = P;
	p->max_sge = w->max_sge;
	p->max_len = w->max_len;
	/* No coalescing: no piece continues a READ (emission's merge test
	 * wants the READ's length plus the piece's to be at most this). */
	p->merge_len = w->flags & KVP_PLAN_NO_COALESCE ? 0 : w->max_len;

	for (i = 0, nnot = 0; i < P; i++) {
		if (w->used[i])
			p->src[srcidx[i]] = (uint16_t)i;
		if (w->used[i] || (i >= lo && i < hi))
			p->notify[nnot++] = (uint16_t)i;
	}
	for (g = 0; g < l->ngroups; g++) {
		struct kvp_pgroup *pg = &p->groups[g];

		pg->kind = l->groups[g].kind;
		pg->ltok = l->groups[g].block_tokens;
		pg->rtok = r->groups[g].block_tokens;
		pg->period = w->per[g].tokens;
		pg->lper = w->per[g].lper;
		pg->rper = w->per[g].rper;
		group_bounds(l, g, &pg->lblocks);
		group_bounds(r, g, &pg->rblocks);
		for (i = 0; i < P; i++)
			if (w->gused[(size_t)g * P + i])
				pg->src_mask |= srcidx[i] < 64 ?
							1ull << srcidx[i] :
							0;
	}
	for (i = 0; i < w->nstreams; i++) {
		p->streams[i] = w->streams[i];
		p->streams[i].src = srcidx[w->streams[i].src];
		p->groups[w->sets[w->streams[i].set].group].pieces +=
			w->sets[w->streams[i].set].count;
	}
	for (i = 0; i < r->nviews; i++)
		p->rlayer[i] = (uint16_t)r->views[i].layer;
	/* Empty arrays were never allocated: memcpy() from NULL is undefined
	 * even for 0 bytes. */
	if (w->nsets)
		memcpy(p->sets, w->sets, w->nsets * sizeof(*w->sets));
	if (w->pieces.n)
		memcpy(p->pieces, w->pieces.p,
		       w->pieces.n * sizeof(*w->pieces.p));
	if (w->gw->ng) {
		memcpy(p->gathers, w->gw->g, sz[7]);
		memcpy(p->gsets, w->gw->sets, sz[8]);
		memcpy(p->gpieces, w->gw->p, sz[9]);
	}
	for (i = 0; i < l->nviews; i++) {
		p->lviews[i].offset = l->views[i].offset;
		p->lviews[i].region = l->views[i].region;
		p->lviews[i].stride = (uint32_t)l->views[i].stride;
	}
	for (i = 0; i < r->nviews; i++) {
		p->rviews[i].offset = r->views[i].offset;
		p->rviews[i].region = r->views[i].region;
		p->rviews[i].stride = (uint32_t)r->views[i].stride;
	}
	free(srcidx);
	*out = p;
	return 0;
}

int kvp__plan_compile(const kvp_layout *l, const kvp_layout *r,
		      const struct kvp_plan_attr *attr, kvp_plan **out,
		      char *msg, size_t msglen, uint64_t *budget)
{
	const uint32_t known = KVP_PLAN_ATTR_MAX_LEN | KVP_PLAN_ATTR_FLAGS;
	uint32_t max_sge = 1, max_len = MAX_WR_LEN, flags = 0, g, v;
	struct match *m = NULL;
	struct gwork gw;
	struct work w;
	int err;

	if (!l || !r || !out || (attr && (attr->comp_mask & ~known)))
		return -EINVAL;
	if (attr && attr->max_sge)
		max_sge = attr->max_sge;
	/* Fields past comp_mask are read only when their bit says they are
	 * there: an older caller's struct ends at comp_mask. */
	if (attr && (attr->comp_mask & KVP_PLAN_ATTR_MAX_LEN) &&
	    attr->max_len) {
		if (attr->max_len > MAX_WR_LEN)
			return -EINVAL;
		max_len = attr->max_len;
	}
	if (attr && (attr->comp_mask & KVP_PLAN_ATTR_FLAGS)) {
		if (attr->flags & ~(uint32_t)KVP_PLAN_NO_COALESCE)
			return -EINVAL;
		flags = attr->flags;
	}
	memset(&w, 0, sizeof(w));
	memset(&gw, 0, sizeof(gw));
	w.gw = &gw;
	w.max_sge = max_sge;
	w.max_len = max_len;
	w.flags = flags;
	w.l = l;
	w.r = r;
	w.msg = msg;
	w.msglen = msglen;
	w.pieces.budget = *budget;
	/* The plan keeps a remote view's layer in 16 bits (kvp_plan.rlayer);
	 * a model has at most KVP_MAX_LAYERS. */
	for (v = 0; v < r->nviews; v++)
		if (r->views[v].layer > UINT16_MAX) {
			kvp__msg(msg, msglen,
				 "remote view %u: layer %u, above %u", v,
				 r->views[v].layer, UINT16_MAX);
			return -EINVAL;
		}
	err = kvp__check_groups(l, r, msg, msglen);
	if (err)
		return err;
	for (g = 0; g < l->ngroups; g++) {
		err = kvp__period_of(l, r, g, &w.per[g], msg, msglen);
		if (err)
			return err;
	}
	err = -ENOMEM;
	w.lshape = malloc(((size_t)l->nviews + 1) * sizeof(uint32_t));
	w.rshape = malloc(((size_t)r->nviews + 1) * sizeof(uint32_t));
	w.ridx = kvp__sorted_fields(r);
	w.used = malloc(r->attr.tp_size);
	w.gused = calloc((size_t)l->ngroups + 1, r->attr.tp_size);
	m = malloc(((size_t)l->nfields + 1) * 2 * sizeof(*m));
	if (!w.lshape || !w.rshape || !w.ridx || !w.used || !w.gused || !m)
		goto out;
	err = kvp__match_fields(l, r, w.ridx, msg, msglen);
	err = err ?: kvp__view_csr(l, &w.lcsr);
	err = err ?: kvp__view_csr(r, &w.rcsr);
	err = err ?: kvp__view_shapes(l, &w.lcsr, w.lshape);
	err = err ?: kvp__view_shapes(r, &w.rcsr, w.rshape);
	for (v = 0; !err && v < l->nviews; v++)
		err = kvp__plan_view(&w, v, m);
	err = err ?: check_bounds(&w);
	if (err)
		goto out;
	err = kvp__sort_streams(&w);
	err = err ?: kvp__gathers(&w, &gw);
	err = err ?: build_plan(&w, out);
out:
	if (err == -EPROTO && msg && msglen && !msg[0])
		kvp__msg(msg, msglen, "layouts cannot be matched");
	if (err == -EFBIG && msg && msglen && !msg[0])
		kvp__msg(msg, msglen,
			 "plan too costly: over %u piece templates (KVP_PLAN_MAX_WORK) for one period of the two layouts",
			 KVP_PLAN_MAX_WORK);
	*budget = w.pieces.budget;
	free(m);
	work_free(&w);
	kvp__gwork_free(&gw);
	return err;
}

int kvp_plan_compile(const kvp_layout *l, const kvp_layout *r,
		     const struct kvp_plan_attr *attr, kvp_plan **out,
		     char *msg, size_t msglen)
{
	uint64_t budget = KVP_PLAN_MAX_WORK;

	return kvp__plan_compile(l, r, attr, out, msg, msglen, &budget);
}

void kvp_plan_destroy(kvp_plan *p)
{
	free(p);
}
