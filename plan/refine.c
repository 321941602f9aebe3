// SPDX-License-Identifier: MIT
/*
 * Plan compilation, one period: turn a (local field, remote field, segment)
 * into piece templates for one period of blocks, by refining both sides'
 * strides into a common index space; sort, merge and cut a set's pieces.
 * Calls match.c only (kvp__field_axes()).
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"

#define MAX_REFINED (2 * KVP_MAX_DIMS + 4)

/* One dim of the common index space of a field pair. */
struct rdim {
	uint32_t size;
	uint64_t ls, rs;   /* byte strides */
	uint32_t lb, rb;   /* block steps (token axis above the block size) */
};

/* One side's dims of one axis, most significant first; block dims have
 * blk = 1 and the step in `stride`. */
struct side {
	uint32_t n;
	uint32_t size[KVP_MAX_DIMS + 1];
	uint64_t stride[KVP_MAX_DIMS + 1];
	uint8_t blk[KVP_MAX_DIMS + 1];
};

/* Collects the dims of axis `ax`, narrowing a sub-range [lo, hi) of the
 * coordinate space (offset by the side's own start) on a single dim. */
static int side_axis(const struct kvp_field_desc *f, uint32_t ax,
		     uint32_t blocks, uint32_t start, uint32_t lo, uint32_t hi,
		     uint32_t held, struct side *s, uint64_t *base)
{
	uint32_t i;

	s->n = 0;
	if (blocks > 1) {
		s->size[0] = blocks;
		s->stride[0] = 1;
		s->blk[0] = 1;
		s->n = 1;
	}
	for (i = 0; i < f->ndim; i++) {
		if (f->dim[i].axis != ax || f->dim[i].size == 1)
			continue;
		s->size[s->n] = f->dim[i].size;
		s->stride[s->n] = f->dim[i].stride;
		s->blk[s->n] = 0;
		s->n++;
	}
	if (hi - lo == held)
		return 0;
	/* A sub-range: only a single-dim axis can be narrowed. */
	if (s->n != 1 || s->blk[0])
		return -EPROTO;
	*base += (uint64_t)(lo - start) * s->stride[0];
	s->size[0] = hi - lo;
	return 0;
}

/* Place value of each dim of a side (least significant is 1). */
static void places(const struct side *s, uint64_t *pl)
{
	uint64_t p = 1;
	int i;

	for (i = (int)s->n - 1; i >= 0; i--) {
		pl[i] = p;
		p *= s->size[i];
	}
}

/* Stride at place value u on a side: the dim holding u, scaled. */
static void side_at(const struct side *s, const uint64_t *pl, uint64_t u,
		    uint64_t *stride, uint32_t *blk)
{
	uint32_t i;

	for (i = 0; i < s->n; i++) {
		if (u >= pl[i] && u < pl[i] * s->size[i]) {
			if (s->blk[i]) {
				*blk = (uint32_t)(s->stride[i] * (u / pl[i]));
				*stride = 0;
			} else {
				*stride = s->stride[i] * (u / pl[i]);
				*blk = 0;
			}
			return;
		}
	}
	*stride = 0;
	*blk = 0;
}

/* Offset and block step of coordinate u (in units of the least significant
 * dim) on a side. */
static void side_point(const struct side *s, const uint64_t *pl, uint64_t u,
		       uint64_t *off, uint32_t *blk)
{
	uint32_t i;

	*off = 0;
	*blk = 0;
	for (i = 0; i < s->n; i++) {
		uint64_t x = u / pl[i] % s->size[i];

		if (s->blk[i])
			*blk += (uint32_t)(x * s->stride[i]);
		else
			*off += x * s->stride[i];
	}
}

/* Refines one axis of both sides into common dims appended to d[*n]; on
 * -EPROTO (the sides' dims do not nest) *n is left as it was. */
static int refine(const struct side *a, const struct side *b, uint64_t extent,
		  struct rdim *d, uint32_t *n)
{
	uint64_t pa[KVP_MAX_DIMS + 1], pb[KVP_MAX_DIMS + 1];
	uint64_t u[2 * KVP_MAX_DIMS + 4];
	uint32_t nu = 0, i, j;

	places(a, pa);
	places(b, pb);
	for (i = 0; i < a->n; i++)
		u[nu++] = pa[i];
	for (i = 0; i < b->n; i++)
		u[nu++] = pb[i];
	u[nu++] = 1;
	u[nu++] = extent;
	/* sort, unique */
	for (i = 1; i < nu; i++) {
		uint64_t v = u[i];

		for (j = i; j > 0 && u[j - 1] > v; j--)
			u[j] = u[j - 1];
		u[j] = v;
	}
	for (i = 1, j = 1; i < nu; i++)
		if (u[i] != u[j - 1])
			u[j++] = u[i];
	nu = j;
	if (*n + nu - 1 > MAX_REFINED)
		return -EPROTO;
	for (i = 0; i + 1 < nu; i++)
		if (u[i + 1] % u[i])
			return -EPROTO;
	for (i = 0; i + 1 < nu; i++) {
		struct rdim *r = &d[(*n)++];

		r->size = (uint32_t)(u[i + 1] / u[i]);
		side_at(a, pa, u[i], &r->ls, &r->lb);
		side_at(b, pb, u[i], &r->rs, &r->rb);
	}
	return 0;
}

static int pvec_push(struct pvec *v, const struct kvp_piece *p)
{
	if (v->n == v->cap) {
		uint32_t cap = v->cap ? v->cap * 2 : 64;
		void *q;

		if (v->n >= MAX_PIECES_PER_SET)
			return -EPROTO;
		q = realloc(v->p, cap * sizeof(*v->p));
		if (!q)
			return -ENOMEM;
		v->p = q;
		v->cap = cap;
	}
	v->p[v->n++] = *p;
	return 0;
}

/* A token axis whose two sides do not nest (blocks of 16 and 24 tokens, or
 * kernel pages of one side crossing the other's blocks): walked in chunks
 * of `step` tokens, the gcd of both sides' innermost token dims, so that no
 * block or page boundary falls inside a chunk. Each chunk's start is placed
 * on both sides by side_point(); within it the tokens are one common dim. */
struct chunks {
	struct side l, r;
	uint64_t lpl[KVP_MAX_DIMS + 1], rpl[KVP_MAX_DIMS + 1];
	uint32_t n, step;
};

static int token_chunks(const struct side *a, const struct side *b,
			uint64_t extent, struct rdim *d, uint32_t *n,
			struct chunks *ch)
{
	uint64_t step;
	struct rdim *r;

	if (!a->n || !b->n || *n == MAX_REFINED)
		return -EPROTO;
	step = kvp__gcd(a->size[a->n - 1], b->size[b->n - 1]);
	if (extent % step)
		return -EPROTO;
	ch->l = *a;
	ch->r = *b;
	places(a, ch->lpl);
	places(b, ch->rpl);
	ch->step = (uint32_t)step;
	ch->n = (uint32_t)(extent / step);
	r = &d[(*n)++];
	r->size = (uint32_t)step;
	side_at(a, ch->lpl, 1, &r->ls, &r->lb);
	side_at(b, ch->rpl, 1, &r->rs, &r->rb);
	return 0;
}

/* Pushes one piece of `run` bytes per point of the dims d[nd]. */
static int odometer(const struct rdim *d, uint32_t nd, uint64_t lbase,
		    uint64_t rbase, uint32_t lbb, uint32_t rbb, uint64_t run,
		    struct pvec *out)
{
	uint32_t i, idx[MAX_REFINED];
	int err;

	memset(idx, 0, sizeof(idx));
	for (;;) {
		struct kvp_piece p;
		uint64_t lo = lbase, ro = rbase;
		uint32_t lb = lbb, rb = rbb;

		for (i = 0; i < nd; i++) {
			lo += idx[i] * d[i].ls;
			ro += idx[i] * d[i].rs;
			lb += idx[i] * d[i].lb;
			rb += idx[i] * d[i].rb;
		}
		if (lo + run > UINT32_MAX || ro + run > UINT32_MAX)
			return -EPROTO;
		p.loff = (uint32_t)lo;
		p.roff = (uint32_t)ro;
		p.len = (uint32_t)run;
		p.lbi = (uint16_t)lb;
		p.rbi = (uint16_t)rb;
		err = pvec_push(out, &p);
		if (err)
			return err;
		for (i = 0; i < nd && ++idx[i] == d[i].size; i++)
			idx[i] = 0;
		if (i == nd)
			break;
	}
	return 0;
}

/* Pieces of one field pair's segment, for one period. */
int kvp__field_pieces(const struct kvp_field_desc *lf, uint32_t ltp,
		      uint32_t lrank, const struct kvp_field_desc *rf,
		      uint32_t rtp, const struct seg *sg,
		      const struct period *per, struct pvec *out)
{
	struct axes la, ra;
	struct rdim d[MAX_REFINED];
	struct chunks ch;
	uint64_t lbase = lf->offset, rbase = rf->offset, run;
	uint32_t nd = 0, ax, i, c;
	int err;

	ch.n = 0;
	if (kvp__field_axes(lf, ltp, lrank, &la) ||
	    kvp__field_axes(rf, rtp, sg->rank, &ra))
		return -EPROTO;
	for (ax = 0; ax < KVP_AXIS_COUNT; ax++) {
		struct side ls, rs;
		uint32_t lo = la.start[ax], hi = la.start[ax] + la.len[ax];
		uint64_t ext;

		if (ax == sg->axis) {
			lo = sg->lo;
			hi = sg->hi;
		}
		if (ax == KVP_AXIS_TOKEN) {
			if (!per->tokens)
				continue;
			err = side_axis(lf, ax, per->lper, 0, 0, per->tokens,
					per->tokens, &ls, &lbase);
			err = err ?: side_axis(rf, ax, per->rper, 0, 0,
					       per->tokens, per->tokens, &rs,
					       &rbase);
			ext = per->tokens;
		} else {
			err = side_axis(lf, ax, 1, la.start[ax], lo, hi,
					la.len[ax], &ls, &lbase);
			err = err ?: side_axis(rf, ax, 1, ra.start[ax], lo, hi,
					       ra.len[ax], &rs, &rbase);
			ext = hi - lo;
		}
		if (err)
			return err;
		if (ext > 1) {
			err = refine(&ls, &rs, ext, d, &nd);
			if (err == -EPROTO && ax == KVP_AXIS_TOKEN)
				err = token_chunks(&ls, &rs, ext, d, &nd, &ch);
			if (err)
				return err;
		}
	}
	/* Absorb dims contiguous on both sides into the piece length. */
	run = lf->elem_size;
	for (;;) {
		for (i = 0; i < nd; i++)
			if (!d[i].lb && !d[i].rb && d[i].ls == run &&
			    d[i].rs == run)
				break;
		if (i == nd)
			break;
		run *= d[i].size;
		d[i] = d[--nd];
	}
	if (run > UINT32_MAX)
		return -EPROTO;
	/* The work this will do, before doing it: one piece per point of
	 * the remaining dims, per token chunk. A layout that asks for more
	 * than the budget (reversed dims and coprime block sizes make
	 * millions) is refused here, in time linear in its dims. */
	{
		uint64_t work = ch.n ? ch.n : 1;

		for (i = 0; i < nd; i++)
			if (__builtin_mul_overflow(work, (uint64_t)d[i].size,
						   &work))
				return -EFBIG;
		if (work > out->budget)
			return -EFBIG;
		out->budget -= work;
	}
	for (c = 0; c < (ch.n ? ch.n : 1); c++) {
		uint64_t lc = 0, rc = 0;
		uint32_t lbc = 0, rbc = 0;

		if (ch.n) {
			side_point(&ch.l, ch.lpl, (uint64_t)c * ch.step, &lc,
				   &lbc);
			side_point(&ch.r, ch.rpl, (uint64_t)c * ch.step, &rc,
				   &rbc);
		}
		err = odometer(d, nd, lbase + lc, rbase + rc, lbc, rbc, run,
			       out);
		if (err)
			return err;
	}
	return 0;
}

static int piece_cmp(const void *x, const void *y)
{
	const struct kvp_piece *a = x, *b = y;

	if (a->rbi != b->rbi)
		return a->rbi < b->rbi ? -1 : 1;
	if (a->roff != b->roff)
		return a->roff < b->roff ? -1 : 1;
	return 0;
}

/* Sorts pieces in remote order and merges those contiguous on both sides. */
uint32_t kvp__merge_pieces(struct kvp_piece *p, uint32_t n)
{
	uint32_t i, m = 0;

	qsort(p, n, sizeof(*p), piece_cmp);
	for (i = 0; i < n; i++) {
		struct kvp_piece *q = m ? &p[m - 1] : NULL;

		if (q && q->rbi == p[i].rbi && q->lbi == p[i].lbi &&
		    q->roff + q->len == p[i].roff &&
		    q->loff + q->len == p[i].loff &&
		    (uint64_t)q->len + p[i].len <= UINT32_MAX) {
			q->len += p[i].len;
			continue;
		}
		p[m++] = p[i];
	}
	return m;
}

/* Cuts the pieces p[n] longer than `cap` into cap-byte chunks (and a
 * remainder), in place in v from index `first`, so that emission, which
 * never lets a READ grow past the cap, need not split anything: a READ
 * boundary inside a piece is decided here, once. */
int kvp__split_pieces(struct pvec *v, uint32_t first, uint32_t cap)
{
	uint64_t extra = 0, n;
	uint32_t i, j, k, c;

	for (i = first; i < v->n; i++)
		if (v->p[i].len > cap)
			extra += (v->p[i].len - 1) / cap;
	if (!extra)
		return 0;
	n = v->n + extra;
	if (n > MAX_PIECES_PER_SET)
		return -EPROTO;
	if (extra > v->budget)
		return -EFBIG;
	v->budget -= extra;
	if (n > v->cap) {
		void *q = realloc(v->p, n * sizeof(*v->p));

		if (!q)
			return -ENOMEM;
		v->p = q;
		v->cap = (uint32_t)n;
	}
	/* From the end, so that every piece is read before it is overwritten:
	 * piece i moves to i + (chunks of the pieces before it) >= i. */
	for (i = v->n, j = (uint32_t)n; i-- > first;) {
		const struct kvp_piece q = v->p[i];

		c = q.len > cap ? (q.len - 1) / cap + 1 : 1;
		j -= c;
		for (k = 0; k < c; k++) {
			struct kvp_piece *o = &v->p[j + k];

			*o = q;
			o->roff = q.roff + k * cap;
			o->loff = q.loff + k * cap;
			o->len = k + 1 < c ? cap : q.len - k * cap;
		}
	}
	v->n = (uint32_t)n;
	return 0;
}

/* The period of group g: the fewest tokens that are whole blocks on both
 * sides (none for a state group). */
int kvp__period_of(const kvp_layout *l, const kvp_layout *r, uint32_t g,
		   struct period *p, char *msg, size_t msglen)
{
	uint64_t bl = l->groups[g].block_tokens, br = r->groups[g].block_tokens;
	uint64_t t;

	if (l->groups[g].kind == KVP_GROUP_STATE) {
		p->tokens = 0;
		p->lper = p->rper = 1;
		return 0;
	}
	t = bl / kvp__gcd(bl, br) * br;
	if (t / bl > UINT16_MAX || t / br > UINT16_MAX || t > UINT32_MAX) {
		kvp__msg(msg, msglen,
			 "group %u: block sizes %llu and %llu have no usable common period",
			 g, (unsigned long long)bl, (unsigned long long)br);
		return -EPROTO;
	}
	p->tokens = (uint32_t)t;
	p->lper = (uint32_t)(t / bl);
	p->rper = (uint32_t)(t / br);
	return 0;
}
