// SPDX-License-Identifier: MIT
/*
 * Emission: the hot path. Indexes the plan with a request's block ids and
 * writes coalesced READs. No allocation, no locks; the only branches that
 * vary per piece are the period-edge filter and the merge test.
 */
#include <errno.h>
#include <limits.h>
#include <string.h>

#include "internal.h"


/* The WR being built. Records are kvp_wr and kvp_sge, or (`into`, a
 * constant the emission functions take like `bounded`) a sink's: its WR
 * records through their field offsets, its scatter entries, addresses and
 * keys resolved through its maps. */
struct cursor {
	struct kvp_wr *wr, *w;
	struct kvp_sge *sge, *s;
	char *xwr, *xw;			/* into: the sink's records */
	struct kvp_emit_sge *xsge, *xs; /* into: its scatter entries */
	/* into: the sink's fields, copied here (a local the records'
	 * stores cannot alias, so they stay in registers). */
	const struct kvp_emit_map *lmap, *rmap;
	uint64_t wr_id;
	uint32_t stride, o_wr_id, o_sg, o_nsge, o_raddr, o_rkey;
	uint64_t xbytes;		/* into: bytes of the pieces put */
	uint32_t nwr, nsge, max_sge, merge_len;
	uint32_t wr_cap, sge_cap; /* a window's room (bounded emission only) */
	uint64_t rend, lend; /* next contiguous remote and local offsets */
	uint32_t rreg, lreg, src, group;
	uint32_t wn, wlen, slen; /* the open WR: SGEs, bytes, last SGE's */
	int open;
};

/* A field of a sink's record. */
#define REC(w, off, type) (*(type *)(void *)((w) + (off)))

/*
 * The open WR while one stream is emitted. A stream's regions are fixed, so
 * only offsets decide whether a piece continues the open WR; its length,
 * SGE count and last SGE length live here (in registers) and are stored
 * only when the WR closes or the stream ends.
 */
struct live {
	struct kvp_wr *w;
	struct kvp_sge *s;
	uint64_t rend, lend; /* next contiguous offsets; UINT64_MAX: none */
	uint32_t nwr, nsge, wn, wlen, slen;
	uint32_t wmax; /* with both caps (bounded 2): SGEs the open WR may hold */
	uint32_t lreg; /* gathers: the open SGE's local region */
	char *xw;		  /* into: the open WR's record */
	struct kvp_emit_sge *xs;  /* into: its last scatter entry */
	uint64_t bytes;		  /* into: bytes of the pieces put here */
};

/* Where bounded emission stopped: the first piece not written, as the
 * period of the stream (absolute, k) and the piece within it. */
struct at {
	uint32_t k, q;
};

/* SGEs a WR whose list starts at sge_first may hold: max_sge, or fewer
 * where a window's SGE room ends first. Folding the window's SGE cap into
 * this limit keeps its test off the path that adds an SGE: a WR that
 * reaches it goes to the path that opens a WR, which stops there. */
static inline uint32_t wr_sge_limit(const struct cursor *c,
				    uint32_t sge_first)
{
	uint32_t room = c->sge_cap - sge_first;

	return room < c->max_sge ? room : c->max_sge;
}

/* Takes over the cursor's open WR if it reads the same remote region (and
 * continues its last SGE only on the same local region). `gather`: the
 * local region varies per piece (a gather) and is tested with the offset;
 * a constant, as `bounded`. */
static inline __attribute__((always_inline)) struct live
live_begin(const struct cursor *c, uint32_t rreg, uint32_t lreg,
	   const int bounded, const int gather)
{
	struct live v = { c->w, c->s, UINT64_MAX, UINT64_MAX,
			  c->nwr, c->nsge, 0, 0, 0, 0, 0, c->xw, c->xs, 0 };

	if (c->open && c->rreg == rreg) {
		v.rend = c->rend;
		v.wn = c->wn;
		v.wlen = c->wlen;
		v.slen = c->slen;
		if (bounded == 2)
			v.wmax = wr_sge_limit(c, c->nsge - c->wn);
		if (gather) {
			v.lend = c->lend;
			v.lreg = c->lreg;
		} else if (c->lreg == lreg) {
			v.lend = c->lend;
		}
	}
	return v;
}

/* Stores the open WR's length and SGE count and its last SGE's length
 * (into: the record's num_sge and the scatter entry's length). */
static inline __attribute__((always_inline)) void
wr_store(const struct cursor *c, const struct live *v, const int into)
{
	if (into) {
		REC(v->xw, c->o_nsge, int) = (int)v->wn;
		v->xs->length = v->slen;
	} else {
		v->w->len = v->wlen;
		v->w->nsge = v->wn;
		v->s->len = v->slen;
	}
}

/* Stores the open WR and hands it back to the cursor. */
static inline __attribute__((always_inline)) void
live_end(struct cursor *c, const struct live *v, uint32_t rreg, uint32_t lreg,
	 const int gather, const int into)
{
	if (v->rend != UINT64_MAX) {
		wr_store(c, v, into);
		c->wn = v->wn;
		c->wlen = v->wlen;
		c->slen = v->slen;
		c->open = 1;
		c->rreg = rreg;
		c->lreg = gather ? v->lreg : lreg;
		c->rend = v->rend;
		c->lend = v->lend;
	}
	c->w = v->w;
	c->s = v->s;
	c->xw = v->xw;
	c->xs = v->xs;
	c->xbytes += v->bytes;
	c->nwr = v->nwr;
	c->nsge = v->nsge;
}

/* into: the scatter entry at xs reads local region lreg's offset lo. */
static inline __attribute__((always_inline)) void
sge_open(const struct cursor *c, struct kvp_emit_sge *xs, uint64_t lo,
	 uint32_t lreg)
{
	const struct kvp_emit_map *m = &c->lmap[lreg];

	xs->addr = m->addr + lo;
	xs->key = m->key[lo >> m->shift];
}

/*
 * Appends `len` bytes read at remote `ro` into local `lo`: extends the last
 * SGE, adds one to the open WR, or opens a WR. Unbounded (kvp_plan_emit),
 * room for one more WR and SGE per piece was checked before emission
 * started, and this returns 0. Bounded (a window), it returns 1 without
 * writing anything when the piece needs a WR or an SGE past the cursor's
 * caps; those tests sit on the path that opens a WR only (see
 * wr_sge_limit()). `bounded` is a constant, each caller gets its own copy:
 * 0 unbounded, 1 a cap on WRs only (SGE room for max_sge per WR), 2 caps
 * on WRs and SGEs.
 */
static inline __attribute__((always_inline)) int
live_put(struct live *v, const struct cursor *c, uint64_t ro, uint64_t lo,
	 uint32_t len, uint32_t rreg, uint32_t lreg, const int bounded,
	 const int gather, const int into)
{
	if (into)
		v->bytes += len; /* undone below if the window is full */
	if (ro == v->rend && v->wlen + (uint64_t)len <= c->merge_len) {
		if (lo == v->lend && (!gather || lreg == v->lreg)) {
			v->slen += len;
			v->wlen += len;
			v->rend += len;
			v->lend += len;
			return 0;
		}
		if (v->wn < (bounded == 2 ? v->wmax : c->max_sge)) {
			if (into) {
				v->xs->length = v->slen;
				v->xs = &c->xsge[v->nsge++];
				sge_open(c, v->xs, lo, lreg);
			} else {
				v->s->len = v->slen;
				v->s = &c->sge[v->nsge++];
				v->s->offset = lo;
				v->s->region = lreg;
			}
			if (gather)
				v->lreg = lreg;
			v->slen = len;
			v->wn++;
			v->wlen += len;
			v->rend += len;
			v->lend = lo + len;
			return 0;
		}
	}
	if (bounded && kvp_unlikely(v->nwr == c->wr_cap ||
				    (bounded == 2 && v->nsge == c->sge_cap))) {
		if (into)
			v->bytes -= len;
		return 1;
	}
	if (v->rend != UINT64_MAX) /* close the open WR */
		wr_store(c, v, into);
	if (into) {
		const struct kvp_emit_map *m = &c->rmap[rreg];

		v->xw = c->xwr + (size_t)v->nwr++ * c->stride;
		v->xs = &c->xsge[v->nsge];
		REC(v->xw, c->o_wr_id, uint64_t) = c->wr_id;
		REC(v->xw, c->o_sg, struct kvp_emit_sge *) = v->xs;
		REC(v->xw, c->o_raddr, uint64_t) = m->addr + ro;
		REC(v->xw, c->o_rkey, uint32_t) = m->key[ro >> m->shift];
		sge_open(c, v->xs, lo, lreg);
	} else {
		v->w = &c->wr[v->nwr++];
		v->s = &c->sge[v->nsge];
		v->w->offset = ro;
		v->w->region = rreg;
		v->w->src = c->src;
		v->w->group = c->group;
		v->w->sge_first = v->nsge;
		v->s->offset = lo;
		v->s->region = lreg;
	}
	if (bounded == 2)
		v->wmax = wr_sge_limit(c, v->nsge);
	v->nsge++;
	if (gather)
		v->lreg = lreg;
	v->wn = 1;
	v->wlen = v->slen = len;
	v->rend = ro + len;
	v->lend = lo + len;
	return 0;
}

/*
 * The common case, periods of one block on each side: block k pairs with
 * block k, no per-piece filter. A stream of one piece per block (whole
 * pages, or one head range) gets its own loop. Walks periods k0 .. k1 - 1,
 * the first from piece q0; local block k - base pairs with remote block k.
 * Returns 0, or 1 when a bounded cursor is full, with the piece not
 * written in *at.
 */
static inline __attribute__((always_inline)) int
emit_simple(struct live *v, const struct cursor *c, const struct kvp_pview *lv,
	    const struct kvp_pview *rv, const struct kvp_piece *pc,
	    const struct kvp_piece *pe, const uint32_t *lids,
	    const uint32_t *rids, uint32_t base, uint32_t k0, uint32_t q0,
	    uint32_t k1, struct at *at, const int bounded, const int into)
{
	const uint32_t rreg = rv->region, lreg = lv->region;
	const uint64_t rs = rv->stride, ls = lv->stride;
	const struct kvp_piece *q;
	uint32_t k;

	/* Index rather than move lids back by base: a pointer before the
	 * array is undefined. */
	if (pe - pc == 1) {
		const uint64_t ro0 = rv->offset + pc->roff;
		const uint64_t lo0 = lv->offset + pc->loff;
		const uint32_t len = pc->len;

		for (k = k0; k < k1; k++) {
			if (live_put(v, c, ro0 + (uint64_t)rids[k] * rs,
				     lo0 + (uint64_t)lids[k - base] * ls, len,
				     rreg, lreg, bounded, 0, into)) {
				at->k = k;
				at->q = 0;
				return 1;
			}
		}
		return 0;
	}
	for (k = k0, q = pc + q0; k < k1; k++, q = pc) {
		uint64_t rb = rv->offset + (uint64_t)rids[k] * rs;
		uint64_t lb = lv->offset + (uint64_t)lids[k - base] * ls;

		for (; q < pe; q++) {
			if (live_put(v, c, rb + q->roff, lb + q->loff, q->len,
				     rreg, lreg, bounded, 0, into)) {
				at->k = k;
				at->q = (uint32_t)(q - pc);
				return 1;
			}
		}
	}
	return 0;
}

/* Periods of several blocks on a side (block sizes that differ): each piece
 * names its blocks within the period, and pieces of blocks outside the
 * request (a prefix hit, the tail) are skipped. Walks periods k0 ..
 * k1 - 1, the first from piece q0; returns as emit_simple(). */
static inline __attribute__((always_inline)) int
emit_periods(struct live *v, const struct cursor *c,
	     const struct kvp_pgroup *pg, const struct kvp_pview *lv,
	     const struct kvp_pview *rv, const struct kvp_piece *pc,
	     const struct kvp_piece *pe, const struct need *n,
	     const uint32_t *lids, const uint32_t *rids, uint32_t k0,
	     uint32_t q0, uint32_t k1, struct at *at, const int bounded,
	     const int into)
{
	const uint32_t rreg = rv->region, lreg = lv->region;
	const struct kvp_piece *q;
	uint32_t k;

	for (k = k0, q = pc + q0; k < k1; k++, q = pc) {
		uint32_t lb0 = k * pg->lper, rb0 = k * pg->rper;

		for (; q < pe; q++) {
			uint32_t L = lb0 + q->lbi, R = rb0 + q->rbi;

			if (L < n->skip || L >= n->lend || R >= n->rend)
				continue;
			if (live_put(v, c,
				     rv->offset +
					     (uint64_t)rids[R] * rv->stride +
					     q->roff,
				     lv->offset +
					     (uint64_t)lids[L - n->skip] *
						     lv->stride +
					     q->loff,
				     q->len, rreg, lreg, bounded, 0, into)) {
				at->k = k;
				at->q = (uint32_t)(q - pc);
				return 1;
			}
		}
	}
	return 0;
}

/* Whether a stream's periods are 1:1 (emit_simple), and the first period
 * and one past the last that a request walks in it. */
static inline int stream_range(const struct kvp_pgroup *pg,
			       const struct need *n, uint32_t *k0,
			       uint32_t *k1)
{
	if (kvp_likely(pg->lper == 1 && pg->rper == 1)) {
		*k0 = n->skip;
		*k1 = n->lend < n->rend ? n->lend : n->rend;
		return 1;
	}
	*k0 = n->k0;
	*k1 = n->k1;
	return 0;
}

/* stream_range() within the need's range: *base is the unclipped first
 * period (local block `base` is the first of the id list, in the 1:1
 * case), [*k0, *k1) the periods walked. */
static inline int stream_clip(const struct kvp_pgroup *pg,
			      const struct need *n, uint32_t *base,
			      uint32_t *k0, uint32_t *k1)
{
	int simple = stream_range(pg, n, k0, k1);

	*base = *k0;
	if (*k0 < n->ka)
		*k0 = n->ka;
	if (*k1 > n->kb)
		*k1 = n->kb;
	return simple;
}

/* Periods of one stream that a request walks. */
static uint32_t stream_periods(const struct kvp_pgroup *pg,
			       const struct need *n)
{
	uint32_t base, k0, k1;

	stream_clip(pg, n, &base, &k0, &k1);
	return k1 > k0 ? k1 - k0 : 0;
}

/* One stream over the request's periods, from period `period` (counted
 * from the first one the request walks) and piece `piece` of it. Returns
 * 0, or 1 when a bounded cursor is full: *at then holds the period
 * (counted the same way) and piece not written. */
static inline __attribute__((always_inline)) int
emit_stream(struct cursor *c, const kvp_plan *p, const struct kvp_pstream *st,
	    const struct need *n, const struct kvp_ids *id, uint32_t period,
	    uint32_t piece, struct at *at, const int bounded, const int into)
{
	const struct kvp_pset *set = &p->sets[st->set];
	const struct kvp_pgroup *pg = &p->groups[set->group];
	const struct kvp_pview *lv = &p->lviews[st->lview];
	const struct kvp_pview *rv = &p->rviews[st->rview];
	const struct kvp_piece *pc = p->pieces + set->first;
	const struct kvp_piece *pe = pc + set->count;
	uint32_t base, k0, k1;
	struct live v;
	int full = 0;

	if (c->src != st->src)
		c->open = 0;
	c->src = st->src;
	c->group = set->group;
	v = live_begin(c, rv->region, lv->region, bounded, 0);
	if (stream_clip(pg, n, &base, &k0, &k1)) {
		if (k0 < k1 && period < k1 - k0)
			full = emit_simple(&v, c, lv, rv, pc, pe, id->local,
					   id->remote, base, k0 + period, piece,
					   k1, at, bounded, into);
	} else if (k0 < k1 && period < k1 - k0) {
		full = emit_periods(&v, c, pg, lv, rv, pc, pe, n, id->local,
				    id->remote, k0 + period, piece, k1, at,
				    bounded, into);
	}
	live_end(c, &v, rv->region, lv->region, 0, into);
	if (full)
		at->k -= k0;
	return full;
}

/* Gathers of at most this many streams find a piece's local view in an
 * array on the stack, filled once a call, rather than through the plan's
 * streams. */
#define GATHER_VIEWS 32

/*
 * A gather's pieces over periods k0 .. k1 - 1, the first from piece q0:
 * as emit_simple() (`simple`, a constant: 1:1 periods, local block k -
 * base with remote block k) or emit_periods() (n's filter), each piece in
 * the local view of its stream st[q->m], or mv[q->m] when mv is not NULL.
 * Returns as emit_simple().
 */
static inline __attribute__((always_inline)) int
emit_gather(struct live *v, const struct cursor *c, const kvp_plan *p,
	    const struct kvp_pstream *st, const struct kvp_pgather *ga,
	    const struct kvp_pgroup *pg, const struct need *n,
	    const uint32_t *lids, const uint32_t *rids, uint32_t base,
	    uint32_t k0, uint32_t q0, uint32_t k1, struct at *at,
	    const struct kvp_pview *const *mv, const int simple,
	    const int bounded, const int into)
{
	const struct kvp_pview *rv = &p->rviews[ga->rview];
	const struct kvp_gset *gs = &p->gsets[ga->set];
	const struct kvp_gpiece *pc = p->gpieces + gs->first;
	const struct kvp_gpiece *pe = pc + gs->count, *q;
	const uint32_t rreg = rv->region;
	const uint64_t rs = rv->stride;
	uint64_t rb = 0, lid = 0;
	uint32_t k;

	for (k = k0, q = pc + q0; k < k1; k++, q = pc) {
		if (simple) {
			rb = rv->offset + (uint64_t)rids[k] * rs;
			lid = lids[k - base];
		}
		for (; q < pe; q++) {
			const struct kvp_pview *lv =
				mv ? mv[q->m] : &p->lviews[st[q->m].lview];

			if (!simple) {
				uint32_t L = k * pg->lper + q->lbi;
				uint32_t R = k * pg->rper + q->rbi;

				if (L < n->skip || L >= n->lend ||
				    R >= n->rend)
					continue;
				rb = rv->offset + (uint64_t)rids[R] * rs;
				lid = lids[L - n->skip];
			}
			if (live_put(v, c, rb + q->roff,
				     lv->offset + lid * lv->stride + q->loff,
				     q->len, rreg, lv->region, bounded, 1,
				     into)) {
				at->k = k;
				at->q = (uint32_t)(q - pc);
				return 1;
			}
		}
	}
	return 0;
}

/* emit_stream() for the gather that stream st (its first) begins. */
static inline __attribute__((always_inline)) int
emit_gathered(struct cursor *c, const kvp_plan *p,
	      const struct kvp_pstream *st, const struct need *n,
	      const struct kvp_ids *id, uint32_t period, uint32_t piece,
	      struct at *at, const int bounded, const int into)
{
	const struct kvp_pgather *ga = &p->gathers[st->gather - 1];
	const uint32_t group = p->sets[st->set].group;
	const struct kvp_pgroup *pg = &p->groups[group];
	const uint32_t rreg = p->rviews[ga->rview].region;
	const struct kvp_pview *mv[GATHER_VIEWS];
	uint32_t base, k0, k1, m;
	struct live v;
	int full = 0;

	if (c->src != st->src)
		c->open = 0;
	c->src = st->src;
	c->group = group;
	v = live_begin(c, rreg, 0, bounded, 1);
	if (ga->n <= GATHER_VIEWS) {
		for (m = 0; m < ga->n; m++)
			mv[m] = &p->lviews[st[m].lview];
	}
	if (stream_clip(pg, n, &base, &k0, &k1)) {
		if (k0 < k1 && period < k1 - k0 && ga->n <= GATHER_VIEWS)
			full = emit_gather(&v, c, p, st, ga, pg, n, id->local,
					   id->remote, base, k0 + period, piece,
					   k1, at, mv, 1, bounded, into);
		else if (k0 < k1 && period < k1 - k0)
			full = emit_gather(&v, c, p, st, ga, pg, n, id->local,
					   id->remote, base, k0 + period, piece,
					   k1, at, NULL, 1, bounded, into);
	} else if (k0 < k1 && period < k1 - k0) {
		full = emit_gather(&v, c, p, st, ga, pg, n, id->local,
				   id->remote, 0, k0 + period, piece, k1, at,
				   ga->n <= GATHER_VIEWS ? mv : NULL, 0,
				   bounded, into);
	}
	live_end(c, &v, rreg, 0, 1, into);
	if (full)
		at->k -= k0;
	return full;
}

/* The streams that emission reads as one from stream st: a gather's, or
 * st alone. */
static inline uint32_t unit_streams(const kvp_plan *p,
				    const struct kvp_pstream *st)
{
	return st->gather ? p->gathers[st->gather - 1].n : 1;
}

/* Whether the stream or gather at st belongs to range r's layers (all
 * of them when r is NULL): by its last layer, since a gather's streams
 * may span layers and its pieces are ready once the last one is. */
static inline int unit_in(const kvp_plan *p, const struct kvp_pstream *st,
			  const struct kvp_emit_range *r)
{
	uint32_t m, n, l;

	if (!r)
		return 1;
	n = unit_streams(p, st);
	for (m = 1, l = p->rlayer[st->rview]; m < n; m++)
		if (p->rlayer[st[m].rview] > l)
			l = p->rlayer[st[m].rview];
	return l >= r->layer0 && l < r->layer1;
}

/* The stream or gather that begins at st. */
static inline __attribute__((always_inline)) int
emit_unit(struct cursor *c, const kvp_plan *p, const struct kvp_pstream *st,
	  const struct need *n, const struct kvp_ids *id, uint32_t period,
	  uint32_t piece, struct at *at, const int bounded, const int into)
{
	if (st->gather)
		return emit_gathered(c, p, st, n, id, period, piece, at,
				     bounded, into);
	return emit_stream(c, p, st, n, id, period, piece, at, bounded,
			   into);
}

int kvp_plan_emit(const kvp_plan *p, const struct kvp_ids *ids,
		  struct kvp_wr *wr, uint32_t wr_cap, struct kvp_sge *sge,
		  uint32_t sge_cap, uint32_t *src_end)
{
	const struct kvp_pstream *st = NULL;
	struct need need[MAX_GROUPS];
	struct cursor c;
	struct at at;
	uint64_t bound = 0;
	uint32_t si, g, cur_src = 0;
	int err;

	if (!p || !ids || (wr_cap && !wr) || (sge_cap && !sge))
		return -EINVAL;
	err = kvp__plan_prepare(p, ids, need);
	if (err)
		return err;
	/* Each piece adds at most one WR and one SGE: check room for all of
	 * them first, so the loops below cannot fail half way. */
	for (g = 0; g < p->ngroups; g++)
		bound += p->groups[g].pieces *
			 stream_periods(&p->groups[g], &need[g]);
	/* The count is returned as an int: a caller whose caps allow more
	 * would read a wrapped, negative "error". */
	if (bound > INT_MAX)
		return -EOVERFLOW;
	if (bound > wr_cap || bound > sge_cap)
		return -ENOSPC;
	memset(&c, 0, sizeof(c));
	c.wr = wr;
	c.sge = sge;
	c.max_sge = p->max_sge;
	c.merge_len = p->merge_len;
	c.src = UINT32_MAX;
	for (si = 0; si < p->nstreams; si += unit_streams(p, st)) {
		st = &p->streams[si];
		g = p->sets[st->set].group;
		if (src_end) {
			while (cur_src < st->src)
				src_end[cur_src++] = c.nwr;
		}
		emit_unit(&c, p, st, &need[g], &ids[g], 0, 0, &at, 0, 0);
	}
	if (src_end) {
		while (cur_src < p->nsrc)
			src_end[cur_src++] = c.nwr;
	}
	return (int)c.nwr;
}

int kvp_plan_emit_check(const kvp_plan *p, const struct kvp_ids *ids)
{
	struct need need[MAX_GROUPS];

	if (!p || !ids)
		return -EINVAL;
	return kvp__plan_prepare(p, ids, need);
}

/*
 * The needs of a window's groups, computed when a stream of the group is
 * first met (O(1) each, no id read): a source's streams may alternate
 * between groups (pooled hybrid regions).
 */
struct needs {
	uint64_t have; /* bit g: n[g] is set (MAX_GROUPS is 64) */
	struct need n[MAX_GROUPS];
};

static inline int needs_get(struct needs *ns, const kvp_plan *p,
			    const struct kvp_ids *ids,
			    const struct kvp_emit_range *r, uint32_t g,
			    const struct need **out)
{
	uint64_t bit = 1ull << g;
	int err;

	if (kvp_unlikely(!(ns->have & bit))) {
		err = kvp__group_need(&p->groups[g], &ids[g], &ns->n[g]);
		if (err)
			return err;
		if (r)
			kvp__need_clip(&p->groups[g], &ns->n[g], r);
		ns->have |= bit;
	}
	*out = &ns->n[g];
	return 0;
}

/* A range's own checks: 0 or -EINVAL. */
static int range_ok(const struct kvp_emit_range *r)
{
	return r && !r->comp_mask && r->layer0 <= r->layer1 &&
	       r->tok0 <= r->tok1 ? 0 : -EINVAL;
}

static int start(const kvp_plan *p, const struct kvp_ids *ids, uint32_t src,
		 const struct kvp_emit_range *r, struct kvp_emit_pos *pos)
{
	struct needs ns;
	const struct need *n;
	uint32_t lo, hi, mid, si;
	int err;

	if (!p || !ids || !pos || src >= p->nsrc)
		return -EINVAL;
	/* Streams are sorted by source: the first of src, then of src + 1. */
	for (lo = 0, hi = p->nstreams; lo < hi;) {
		mid = lo + (hi - lo) / 2;
		if (p->streams[mid].src < src)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (hi = p->nstreams, si = lo; si < hi;) {
		mid = si + (hi - si) / 2;
		if (p->streams[mid].src <= src)
			si = mid + 1;
		else
			hi = mid;
	}
	/* Skip the streams this request (or range) walks no period of, so
	 * that a source with nothing to read is done at once. */
	ns.have = 0;
	for (si = lo; si < hi; si += unit_streams(p, &p->streams[si])) {
		uint32_t g = p->sets[p->streams[si].set].group;

		err = needs_get(&ns, p, ids, r, g, &n);
		if (err)
			return err;
		if (unit_in(p, &p->streams[si], r) &&
		    stream_periods(&p->groups[g], n))
			break;
	}
	pos->stream = si;
	pos->end = hi;
	pos->period = 0;
	pos->piece = 0;
	pos->src = src;
	return 0;
}

int kvp_plan_emit_start(const kvp_plan *p, const struct kvp_ids *ids,
			uint32_t src, struct kvp_emit_pos *pos)
{
	return start(p, ids, src, NULL, pos);
}

int kvp_plan_emit_range_start(const kvp_plan *p, const struct kvp_ids *ids,
			      uint32_t src, const struct kvp_emit_range *r,
			      struct kvp_emit_pos *pos)
{
	int err = range_ok(r);

	return err ? err : start(p, ids, src, r, pos);
}

/* into: a map the emission may index, key[off >> shift], with no undefined
 * shift and no NULL table (the caller's key arrays themselves cannot be
 * checked). */
static inline int map_ok(const struct kvp_emit_map *m)
{
	return m->key && !m->comp_mask && m->shift < 64;
}

/* into: the maps of every region the stream or gather at st reads: its
 * remote region's and each member's local region's. Checked when the
 * unit is entered, a few loads per stream, so that a window into maps no
 * emission may use stops before writing anything through them. */
static inline int unit_maps_ok(const struct cursor *c, const kvp_plan *p,
			       const struct kvp_pstream *st)
{
	uint32_t m, n = 1, rview = st->rview;

	if (st->gather) {
		n = p->gathers[st->gather - 1].n;
		rview = p->gathers[st->gather - 1].rview;
	}
	if (!map_ok(&c->rmap[p->rviews[rview].region]))
		return 0;
	for (m = 0; m < n; m++)
		if (!map_ok(&c->lmap[p->lviews[st[m].lview].region]))
			return 0;
	return 1;
}

/*
 * A window's streams, from pos: stores where it stopped in *at and returns
 * the stream it stopped in (pos->end when the source is done), or a
 * negative errno with nothing written.
 */
static inline __attribute__((always_inline)) int64_t
window_streams(struct cursor *c, const kvp_plan *p, const struct kvp_ids *ids,
	       const struct kvp_emit_range *r, const struct kvp_emit_pos *pos,
	       struct at *at, const int bounded, const int into)
{
	uint32_t si, period = pos->period, piece = pos->piece;
	const struct need *n;
	struct needs ns;
	int err;

	ns.have = 0;
	for (si = pos->stream; si < pos->end;
	     si += unit_streams(p, &p->streams[si]), period = piece = 0) {
		const struct kvp_pstream *st = &p->streams[si];
		uint32_t g = p->sets[st->set].group;

		/* Only on ids changed since kvp_plan_emit_start(), or
		 * (into) maps no emission may use: stop before the unit, so
		 * that the error comes with nothing written (here, or on
		 * the next call). */
		if (r && !unit_in(p, st, r))
			continue; /* not in the range: nothing to write */
		err = needs_get(&ns, p, ids, r, g, &n);
		if (into && kvp_unlikely(!err && !unit_maps_ok(c, p, st)))
			err = -EINVAL;
		if (kvp_unlikely(err)) {
			if (!c->nwr)
				return err;
			at->k = at->q = 0;
			break;
		}
		if (emit_unit(c, p, st, n, &ids[g], period, piece, at,
			      bounded, into))
			break;
	}
	return si;
}

/* A window into cursor c, set up by the caller with its records and
 * caps: the streams from pos, then pos moved past what was written.
 * Returns the WRs written, or a negative errno with nothing written and
 * pos untouched. */
static inline __attribute__((always_inline)) int
window(struct cursor *c, const kvp_plan *p, const struct kvp_ids *ids,
       const struct kvp_emit_range *r, struct kvp_emit_pos *pos,
       const int into)
{
	struct at at = { 0, 0 };
	int64_t si;

	c->max_sge = p->max_sge;
	c->merge_len = p->merge_len;
	c->src = UINT32_MAX;
	/* With max_sge SGEs of room for each WR (a send queue's slots), the
	 * SGE cap cannot bind: a loop without its tests. */
	if ((uint64_t)c->wr_cap * c->max_sge <= c->sge_cap)
		si = window_streams(c, p, ids, r, pos, &at, 1, into);
	else
		si = window_streams(c, p, ids, r, pos, &at, 2, into);
	if (si < 0)
		return (int)si;
	if (si < pos->end) {
		pos->stream = (uint32_t)si;
		pos->period = at.k;
		pos->piece = at.q;
	} else {
		pos->stream = pos->end;
		pos->period = pos->piece = 0;
	}
	return (int)c->nwr;
}

static int emit_window(const kvp_plan *p, const struct kvp_ids *ids,
		       const struct kvp_emit_range *r,
		       struct kvp_emit_pos *pos, struct kvp_wr *wr,
		       uint32_t wr_cap, struct kvp_sge *sge, uint32_t sge_cap,
		       uint64_t *bytes)
{
	struct cursor c;
	uint64_t sum = 0;
	uint32_t i;
	int n;

	if (!p || !ids || !pos || (wr_cap && !wr) || (sge_cap && !sge) ||
	    pos->end > p->nstreams)
		return -EINVAL;
	if (!wr_cap || !sge_cap || pos->stream >= pos->end) {
		if (bytes)
			*bytes = 0;
		return 0;
	}
	memset(&c, 0, sizeof(c));
	c.wr = wr;
	c.sge = sge;
	c.wr_cap = wr_cap > INT_MAX ? INT_MAX : wr_cap; /* returned as int */
	c.sge_cap = sge_cap;
	n = window(&c, p, ids, r, pos, 0);
	if (n > 0 && bytes) {
		for (i = 0; i < c.nwr; i++)
			sum += wr[i].len;
		*bytes = sum;
	}
	return n;
}

/* A field of `size` bytes at `off` fits a record of `stride` bytes, and is
 * aligned for its type. */
static int field_ok(uint32_t off, uint32_t size, uint32_t stride)
{
	return off % size == 0 && off <= stride - size;
}

static int sink_ok(const struct kvp_emit_sink *k)
{
	return k && k->wr && k->sge && k->local && k->remote &&
	       !k->comp_mask && k->wr_stride >= 32 && k->wr_stride % 8 == 0 &&
	       field_ok(k->off_wr_id, 8, k->wr_stride) &&
	       field_ok(k->off_sg_list, sizeof(void *), k->wr_stride) &&
	       field_ok(k->off_num_sge, sizeof(int), k->wr_stride) &&
	       field_ok(k->off_remote_addr, 8, k->wr_stride) &&
	       field_ok(k->off_rkey, 4, k->wr_stride);
}

static int window_into(const kvp_plan *p, const struct kvp_ids *ids,
		       const struct kvp_emit_range *r,
		       struct kvp_emit_pos *pos,
		       const struct kvp_emit_sink *sink, uint32_t wr_cap,
		       uint32_t sge_cap, uint32_t *nsge, uint64_t *bytes)
{
	struct cursor c;
	int n;

	if (!p || !ids || !pos || !sink_ok(sink) || pos->end > p->nstreams)
		return -EINVAL;
	if (!wr_cap || !sge_cap || pos->stream >= pos->end) {
		if (nsge)
			*nsge = 0;
		if (bytes)
			*bytes = 0;
		return 0;
	}
	memset(&c, 0, sizeof(c));
	c.lmap = sink->local;
	c.rmap = sink->remote;
	c.wr_id = sink->wr_id;
	c.stride = sink->wr_stride;
	c.o_wr_id = sink->off_wr_id;
	c.o_sg = sink->off_sg_list;
	c.o_nsge = sink->off_num_sge;
	c.o_raddr = sink->off_remote_addr;
	c.o_rkey = sink->off_rkey;
	c.xwr = sink->wr;
	c.xsge = sink->sge;
	c.wr_cap = wr_cap > INT_MAX ? INT_MAX : wr_cap;
	c.sge_cap = sge_cap;
	n = window(&c, p, ids, r, pos, 1);
	if (n >= 0) { /* on an error, the outputs are untouched too */
		if (nsge)
			*nsge = c.nsge;
		if (bytes)
			*bytes = c.xbytes;
	}
	return n;
}

int kvp_plan_emit_window(const kvp_plan *p, const struct kvp_ids *ids,
			 struct kvp_emit_pos *pos, struct kvp_wr *wr,
			 uint32_t wr_cap, struct kvp_sge *sge,
			 uint32_t sge_cap, uint64_t *bytes)
{
	return emit_window(p, ids, NULL, pos, wr, wr_cap, sge, sge_cap,
			   bytes);
}

int kvp_plan_emit_range_window(const kvp_plan *p, const struct kvp_ids *ids,
			       const struct kvp_emit_range *r,
			       struct kvp_emit_pos *pos, struct kvp_wr *wr,
			       uint32_t wr_cap, struct kvp_sge *sge,
			       uint32_t sge_cap, uint64_t *bytes)
{
	int err = range_ok(r);

	return err ? err :
		     emit_window(p, ids, r, pos, wr, wr_cap, sge, sge_cap,
				 bytes);
}

int kvp_plan_emit_window_into(const kvp_plan *p, const struct kvp_ids *ids,
			      struct kvp_emit_pos *pos,
			      const struct kvp_emit_sink *sink,
			      uint32_t wr_cap, uint32_t sge_cap,
			      uint32_t *nsge, uint64_t *bytes)
{
	return window_into(p, ids, NULL, pos, sink, wr_cap, sge_cap, nsge,
			   bytes);
}

int kvp_plan_emit_range_window_into(const kvp_plan *p,
				    const struct kvp_ids *ids,
				    const struct kvp_emit_range *r,
				    struct kvp_emit_pos *pos,
				    const struct kvp_emit_sink *sink,
				    uint32_t wr_cap, uint32_t sge_cap,
				    uint32_t *nsge, uint64_t *bytes)
{
	int err = range_ok(r);

	return err ? err :
		     window_into(p, ids, r, pos, sink, wr_cap, sge_cap, nsge,
				 bytes);
}

int kvp_plan_emit_done(const struct kvp_emit_pos *pos)
{
	if (!pos)
		return -EINVAL;
	return pos->stream >= pos->end;
}
