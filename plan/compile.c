// SPDX-License-Identifier: MIT
/*
 * Plan compilation: match the consumer's fields with the producer's, split
 * each needed box between producer ranks (interval arithmetic on the sharded
 * axis), and turn every (local field, remote field, rank) into piece
 * templates for one period of blocks by refining both sides' strides into a
 * common index space. Pieces of identical geometry are shared by all layers.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define MAX_GROUPS 64
#define MAX_PIECES_PER_SET (1u << 20)
#define MAX_REFINED (2 * KVP_MAX_DIMS + 4)

static const char *const kind_name[KVP_FIELD_KIND_COUNT] = {
	"K",	  "V",	    "latent", "conv_x", "conv_B",
	"conv_C", "ssm",    "conv_q", "conv_k", "conv_v",
};

static const char *const axis_name[KVP_AXIS_COUNT] = {
	"token", "head", "dim", "channel", "state", "aux",
};

/* Per-axis view of one field: the rank's range and the global extent. */
struct axes {
	uint32_t start[KVP_AXIS_COUNT], len[KVP_AXIS_COUNT];
	uint32_t total[KVP_AXIS_COUNT];
	int sharded; /* axis index or -1 */
};

static int field_axes(const struct kvp_field_desc *f, uint32_t tp,
		      uint32_t rank, struct axes *a)
{
	uint32_t i;

	for (i = 0; i < KVP_AXIS_COUNT; i++) {
		a->start[i] = 0;
		a->len[i] = 1;
	}
	a->sharded = -1;
	for (i = 0; i < f->ndim; i++)
		a->len[f->dim[i].axis] *= f->dim[i].size;
	memcpy(a->total, a->len, sizeof(a->total));
	if (f->shard_dim != KVP_NO_SHARD) {
		uint32_t ax = f->dim[f->shard_dim].axis;

		a->sharded = (int)ax;
		a->total[ax] = f->shard_total;
		if (kvp_shard_range(f->shard_total, tp, rank, &a->start[ax],
				    &a->len[ax]))
			return -EPROTO;
	}
	return 0;
}

/* A matched pair of fields and what the consumer needs of it. */
struct match {
	uint32_t lf, rf;
};

static int field_key_cmp(const kvp_layout *a, uint32_t fa, const kvp_layout *b,
			 uint32_t fb)
{
	const struct kvp_view_desc *va = &a->views[a->fields[fa].view];
	const struct kvp_view_desc *vb = &b->views[b->fields[fb].view];
	uint32_t ka = a->fields[fa].d.kind, kb = b->fields[fb].d.kind;

	if (va->group != vb->group)
		return va->group < vb->group ? -1 : 1;
	if (va->layer != vb->layer)
		return va->layer < vb->layer ? -1 : 1;
	if (ka != kb)
		return ka < kb ? -1 : 1;
	return 0;
}

/* A field's sort key with its index: the comparison needs no context, so
 * qsort() keeps compilation reentrant. */
struct fkey {
	uint32_t group, layer, kind, idx;
};

static int fkey_cmp(const void *x, const void *y)
{
	const struct fkey *a = x, *b = y;

	if (a->group != b->group)
		return a->group < b->group ? -1 : 1;
	if (a->layer != b->layer)
		return a->layer < b->layer ? -1 : 1;
	if (a->kind != b->kind)
		return a->kind < b->kind ? -1 : 1;
	return a->idx < b->idx ? -1 : a->idx > b->idx;
}

/* Field indices sorted by (group, layer, kind), in O(n log n) whatever the
 * order a peer sends its fields in. Builders add fields layer by layer, so
 * an insertion sort, linear on nearly sorted input, runs first; past a
 * budget of moves (input far from sorted) qsort() finishes the job. */
static uint32_t *sorted_fields(const kvp_layout *l)
{
	uint32_t *idx = malloc(((size_t)l->nfields + 1) * sizeof(*idx));
	uint64_t budget = 8 * (uint64_t)l->nfields;
	struct fkey *k;
	uint32_t i, j;

	if (!idx)
		return NULL;
	for (i = 0; i < l->nfields; i++)
		idx[i] = i;
	for (i = 1; i < l->nfields && budget; i++) {
		uint32_t v = idx[i];

		for (j = i; j > 0 && budget &&
			    field_key_cmp(l, idx[j - 1], l, v) > 0;
		     j--, budget--)
			idx[j] = idx[j - 1];
		idx[j] = v;
	}
	if (budget)
		return idx;
	k = malloc(((size_t)l->nfields + 1) * sizeof(*k));
	if (!k) {
		free(idx);
		return NULL;
	}
	for (i = 0; i < l->nfields; i++) {
		const struct kvp_field *f = &l->fields[idx[i]];

		k[i].group = l->views[f->view].group;
		k[i].layer = l->views[f->view].layer;
		k[i].kind = f->d.kind;
		k[i].idx = idx[i];
	}
	qsort(k, l->nfields, sizeof(*k), fkey_cmp);
	for (i = 0; i < l->nfields; i++)
		idx[i] = k[i].idx;
	free(k);
	return idx;
}

static int find_field(const kvp_layout *r, const uint32_t *idx,
		      const kvp_layout *l, uint32_t lf)
{
	uint32_t lo = 0, hi = r->nfields;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;
		int c = field_key_cmp(r, idx[mid], l, lf);

		if (!c)
			return (int)idx[mid];
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

static int check_groups(const kvp_layout *l, const kvp_layout *r, char *msg,
			size_t msglen)
{
	uint32_t g;

	if (l->ngroups != r->ngroups) {
		kvp__msg(msg, msglen, "group count differs: local %u, remote %u",
			 l->ngroups, r->ngroups);
		return -EPROTO;
	}
	if (l->ngroups > MAX_GROUPS) {
		kvp__msg(msg, msglen, "more than %u groups", MAX_GROUPS);
		return -EPROTO;
	}
	for (g = 0; g < l->ngroups; g++) {
		if (l->groups[g].kind != r->groups[g].kind) {
			kvp__msg(msg, msglen,
				 "group %u kind differs: local %s, remote %s",
				 g, kvp__group_name(l->groups[g].kind),
				 kvp__group_name(r->groups[g].kind));
			return -EPROTO;
		}
	}
	return 0;
}

/* Checks that two matched fields hold the same data. */
static int check_pair(const kvp_layout *l, uint32_t lf, const kvp_layout *r,
		      uint32_t rf, char *msg, size_t msglen)
{
	const struct kvp_field_desc *a = &l->fields[lf].d, *b = &r->fields[rf].d;
	const struct kvp_view_desc *v = &l->views[l->fields[lf].view];
	struct axes la, ra;
	uint32_t i;

	if (field_axes(a, l->attr.tp_size, l->attr.tp_rank, &la) ||
	    field_axes(b, r->attr.tp_size, r->attr.tp_rank, &ra))
		return -EPROTO;
	if (a->elem_size != b->elem_size) {
		kvp__msg(msg, msglen,
			 "group %u layer %u %s: element size differs: local %u, remote %u",
			 v->group, v->layer, kind_name[a->kind], a->elem_size,
			 b->elem_size);
		return -EPROTO;
	}
	for (i = 1; i < KVP_AXIS_COUNT; i++) {
		if (la.total[i] != ra.total[i]) {
			kvp__msg(msg, msglen,
				 "group %u layer %u %s: %s extent differs: local %u, remote %u",
				 v->group, v->layer, kind_name[a->kind],
				 axis_name[i], la.total[i], ra.total[i]);
			return -EPROTO;
		}
	}
	return 0;
}

/* One box of a field pair read from one producer rank. */
struct seg {
	uint32_t rank;
	uint32_t axis; /* remote sharded axis, or KVP_AXIS_COUNT */
	uint32_t lo, hi;
};

/*
 * Splits what consumer rank `rank` needs of a field between producer ranks.
 * The needed range on the remote's sharded axis is walked from its low end;
 * each position is held by one rank (total divisible by P) or replicated on
 * P/total ranks, of which replica `rank % replicas` is read so consumers
 * spread over producers. An unsharded remote field is replicated on every
 * rank. Writes at most `max` segments; returns their count or -EPROTO.
 */
static int segments(const struct kvp_field_desc *lfd, uint32_t ltp,
		    uint32_t rank, const struct kvp_field_desc *rfd, uint32_t rtp,
		    struct seg *out, uint32_t max)
{
	struct axes la;
	uint32_t ax, x, hi, n = 0;

	if (field_axes(lfd, ltp, rank, &la))
		return -EPROTO;
	if (rfd->shard_dim == KVP_NO_SHARD) {
		out[0].rank = rank % rtp;
		out[0].axis = KVP_AXIS_COUNT;
		out[0].lo = out[0].hi = 0;
		return 1;
	}
	ax = rfd->dim[rfd->shard_dim].axis;
	x = la.start[ax];
	hi = la.start[ax] + la.len[ax];
	while (x < hi) {
		uint32_t total = rfd->shard_total, end, r;

		if (n == max)
			return -EPROTO;
		if (total % rtp == 0) {
			uint32_t per = total / rtp;

			r = x / per;
			end = (r + 1) * per;
		} else {
			uint32_t rep = rtp / total;

			r = x * rep + rank % rep;
			end = x + 1;
		}
		out[n].rank = r;
		out[n].axis = ax;
		out[n].lo = x;
		out[n].hi = end < hi ? end : hi;
		x = out[n].hi;
		n++;
	}
	return (int)n;
}

void kvp__notify_cover(uint32_t c, uint32_t D, uint32_t P, uint32_t *lo,
		       uint32_t *hi)
{
	uint64_t a = (uint64_t)c * P / D;
	uint64_t b = ((uint64_t)(c + 1) * P + D - 1) / D;

	*lo = (uint32_t)a;
	*hi = (uint32_t)(b > a ? b : a + 1);
	if (*hi > P)
		*hi = P;
}

/*
 * Matches every field of each side with the other's (same group, layer and
 * kind) and checks that matched fields hold the same data. Keys are unique
 * within a layout, so equal counts and every local field found make a
 * bijection; otherwise the reason names a field one side lacks.
 */
static int match_fields(const kvp_layout *l, const kvp_layout *r,
			const uint32_t *ridx, char *msg, size_t msglen)
{
	uint32_t i, *lidx;
	int err;

	for (i = 0; i < l->nfields; i++) {
		int rf = find_field(r, ridx, l, i);
		const struct kvp_view_desc *v = &l->views[l->fields[i].view];

		if (rf < 0) {
			kvp__msg(msg, msglen,
				 "remote has no %s field for group %u layer %u",
				 kind_name[l->fields[i].d.kind], v->group,
				 v->layer);
			return -EPROTO;
		}
		err = check_pair(l, i, r, (uint32_t)rf, msg, msglen);
		if (err)
			return err;
	}
	if (r->nfields == l->nfields)
		return 0;
	lidx = sorted_fields(l);
	if (!lidx)
		return -ENOMEM;
	for (i = 0; i < r->nfields; i++) {
		const struct kvp_view_desc *v = &r->views[r->fields[i].view];

		if (find_field(l, lidx, r, i) < 0) {
			kvp__msg(msg, msglen,
				 "local has no %s field for group %u layer %u (remote has more layers or fields)",
				 kind_name[r->fields[i].d.kind], v->group,
				 v->layer);
			break;
		}
	}
	free(lidx);
	return -EPROTO;
}

/* ---- piece generation ------------------------------------------------- */

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

struct pvec {
	struct kvp_piece *p;
	uint32_t n, cap;
};

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

struct period {
	uint32_t tokens, lper, rper;
};

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
static int field_pieces(const struct kvp_field_desc *lf, uint32_t ltp,
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
	if (field_axes(lf, ltp, lrank, &la) || field_axes(rf, rtp, sg->rank, &ra))
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
static uint32_t merge_pieces(struct kvp_piece *p, uint32_t n)
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
static int split_pieces(struct pvec *v, uint32_t first, uint32_t cap)
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

/* ---- view shapes ------------------------------------------------------ */

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

/* Fields of each view: view v holds list[first[v] .. first[v + 1]). */
struct csr {
	uint32_t *first, *list;
};

static int view_csr(const kvp_layout *l, struct csr *c)
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

static void csr_free(struct csr *c)
{
	free(c->first);
	free(c->list);
}

/* An open-addressing map from a 32-bit hash to indices, the caller's
 * callback deciding equality: lookups in O(1) where a linear search over
 * peer-declared views or shape pairs would make compilation quadratic. */
struct imap {
	uint32_t *slot; /* index + 1, 0 for empty */
	uint32_t *hash;
	uint32_t n, used;
};

/* Makes room for one more entry (load stays at most one half). */
static int imap_reserve(struct imap *m)
{
	uint32_t n = m->n ? m->n * 2 : 64, i, s;
	uint32_t *slot, *hash;

	if ((m->used + 1) * 2 <= m->n)
		return 0;
	slot = calloc(n, sizeof(*slot));
	hash = malloc(n * sizeof(*hash));
	if (!slot || !hash) {
		free(slot);
		free(hash);
		return -ENOMEM;
	}
	for (i = 0; i < m->n; i++) {
		if (!m->slot[i])
			continue;
		for (s = m->hash[i] & (n - 1); slot[s]; s = (s + 1) & (n - 1))
			;
		slot[s] = m->slot[i];
		hash[s] = m->hash[i];
	}
	free(m->slot);
	free(m->hash);
	m->slot = slot;
	m->hash = hash;
	m->n = n;
	return 0;
}

/* The slot holding an index equal (by eq) to the key of hash h, or the
 * empty slot where it goes. Call imap_reserve() first. */
static uint32_t imap_probe(const struct imap *m, uint32_t h,
			   int (*eq)(const void *ctx, uint32_t idx),
			   const void *ctx)
{
	uint32_t s;

	for (s = h & (m->n - 1); m->slot[s]; s = (s + 1) & (m->n - 1))
		if (m->hash[s] == h && eq(ctx, m->slot[s] - 1))
			break;
	return s;
}

static void imap_put(struct imap *m, uint32_t s, uint32_t h, uint32_t idx)
{
	m->slot[s] = idx + 1;
	m->hash[s] = h;
	m->used++;
}

static void imap_free(struct imap *m)
{
	free(m->slot);
	free(m->hash);
}

static uint32_t mix(uint32_t h, uint64_t v)
{
	h ^= (uint32_t)v + 0x9e3779b9u + (h << 6) + (h >> 2);
	v >>= 32;
	h ^= (uint32_t)v + 0x9e3779b9u + (h << 6) + (h >> 2);
	return h;
}

static uint32_t field_hash(uint32_t h, const struct kvp_field_desc *f)
{
	uint32_t i;

	h = mix(h, f->kind | (uint64_t)f->elem_size << 32);
	h = mix(h, f->offset);
	h = mix(h, f->ndim | (uint64_t)f->shard_dim << 32);
	h = mix(h, f->shard_total);
	for (i = 0; i < f->ndim && i < KVP_MAX_DIMS; i++) {
		h = mix(h, f->dim[i].stride);
		h = mix(h, f->dim[i].size | (uint64_t)f->dim[i].axis << 32);
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
static int view_shapes(const kvp_layout *l, const struct csr *c,
		       uint32_t *shape)
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
		h = mix(0, l->views[v].group);
		for (i = c->first[v]; i < c->first[v + 1]; i++)
			h = field_hash(h, &l->fields[c->list[i]].d);
		err = imap_reserve(&m);
		if (err)
			break;
		s = imap_probe(&m, h, shape_eq, &x);
		if (!m.slot[s]) {
			imap_put(&m, s, h, nrep);
			rep[nrep++] = v;
		}
		shape[v] = m.slot[s] - 1;
		memmove(recent + 1, recent, sizeof(recent) - sizeof(*recent));
		recent[0] = shape[v];
	}
	imap_free(&m);
	free(rep);
	return err;
}

/* ---- compile ---------------------------------------------------------- */

struct set_key {
	uint32_t lshape, rshape, rank;
};

/* Where a set's farthest piece ends in a page, on each side. */
struct set_end {
	uint64_t l, r;
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

struct work {
	const kvp_layout *l, *r;
	char *msg;
	size_t msglen;
	uint32_t max_sge, max_len, flags;
	uint32_t *lshape, *rshape, *ridx;
	struct csr lcsr, rcsr;
	struct pair *pairs;
	uint32_t npairs, cap_pairs;
	struct imap pmap; /* (lshape, rshape) -> pair */
	struct rseg *rs;  /* segments of the view being planned, by rank */
	uint32_t nrs, cap_rs;
	uint32_t *entries;
	uint32_t nentries, cap_entries;
	struct period per[MAX_GROUPS];
	struct pvec pieces;
	struct kvp_pset *sets;
	struct set_key *keys;
	struct set_end *ends;
	uint32_t nsets, cap_sets;
	struct kvp_pstream *streams; /* src holds the rank until the end */
	uint32_t nstreams, cap_streams;
	uint8_t *used;	 /* per remote rank: read from */
	uint64_t *gmask; /* per group: ranks (< 64) read from */
	uint8_t *gused;	 /* per group x remote rank */
	struct gwork *gw; /* the gathers, once found */
};

static int period_of(const kvp_layout *l, const kvp_layout *r, uint32_t g,
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

		err = field_pieces(lf, l->attr.tp_size, l->attr.tp_rank, rf,
				   r->attr.tp_size, &rs[k].s, &w->per[group],
				   &w->pieces);
		if (err == -EPROTO)
			kvp__msg(w->msg, w->msglen,
				 "group %u layer %u %s: the two layouts have no common refinement (dims do not nest, or a piece exceeds the plan's limits)",
				 group, l->views[lv].layer, kind_name[lf->kind]);
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
	w->pieces.n = first +
		      merge_pieces(w->pieces.p + first, w->pieces.n - first);
	err = split_pieces(&w->pieces, first, w->max_len);
	if (err == -EPROTO)
		kvp__msg(w->msg, w->msglen,
			 "max_len %u cuts the pieces into more than %u templates",
			 w->max_len, MAX_PIECES_PER_SET);
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
	uint32_t h = mix(mix(0, x.lshape), x.rshape);
	uint32_t k, s, P = w->r->attr.tp_size;
	const struct pair *pr;
	int err;

	err = imap_reserve(&w->pmap);
	if (err)
		return err;
	s = imap_probe(&w->pmap, h, pair_eq, &x);
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
		imap_put(&w->pmap, s, h, w->npairs++);
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
		n = segments(&l->fields[sub[i].lf].d, l->attr.tp_size,
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
static int plan_view(struct work *w, uint32_t lv, struct match *m)
{
	const kvp_layout *l = w->l, *r = w->r;
	uint32_t group = l->views[lv].group, nm = 0, i, j, f, done = 0;
	int err;

	for (f = w->lcsr.first[lv]; f < w->lcsr.first[lv + 1]; f++) {
		int rf;

		i = w->lcsr.list[f];
		rf = find_field(r, w->ridx, l, i);
		if (rf < 0) {
			kvp__msg(w->msg, w->msglen,
				 "remote has no %s field for group %u layer %u",
				 kind_name[l->fields[i].d.kind], group,
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
static int sort_streams(struct work *w)
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

/* ---- gathers --------------------------------------------------------- */

/* A stream's key for finding gathers: streams of one (source, group,
 * remote region, remote stride) sorted by view offset. */
struct gkey {
	uint32_t src, group, rreg, rstride;
	uint64_t roff;
	uint32_t i;
};

static int gkey_cmp(const void *x, const void *y)
{
	const struct gkey *a = x, *b = y;

	if (a->src != b->src)
		return a->src < b->src ? -1 : 1;
	if (a->group != b->group)
		return a->group < b->group ? -1 : 1;
	if (a->rreg != b->rreg)
		return a->rreg < b->rreg ? -1 : 1;
	if (a->rstride != b->rstride)
		return a->rstride < b->rstride ? -1 : 1;
	if (a->roff != b->roff)
		return a->roff < b->roff ? -1 : 1;
	return a->i < b->i ? -1 : a->i > b->i;
}

static int gkey_pos_cmp(const void *x, const void *y)
{
	const struct gkey *a = x, *b = y;

	return a->i < b->i ? -1 : a->i > b->i;
}

static int gpiece_cmp(const void *x, const void *y)
{
	const struct kvp_gpiece *a = x, *b = y;

	if (a->rbi != b->rbi)
		return a->rbi < b->rbi ? -1 : 1;
	if (a->roff != b->roff)
		return a->roff < b->roff ? -1 : 1;
	return 0;
}

/* What gathers() builds, then build_plan() copies. */
struct gwork {
	struct kvp_pgather *g;
	uint32_t ng, cap_g;
	struct kvp_gset *sets;
	uint32_t *keys;	 /* per set: 2n words, (member set, view distance) */
	uint32_t *kfirst, *kn; /* per set: where its key starts, n */
	uint32_t nsets, cap_sets;
	uint32_t nkeys, cap_keys;
	struct kvp_gpiece *p;
	uint32_t np, cap_p;
	struct imap map; /* key -> set */
};

static void gwork_free(struct gwork *g)
{
	free(g->g);
	free(g->sets);
	free(g->keys);
	free(g->kfirst);
	free(g->kn);
	free(g->p);
	imap_free(&g->map);
}

static int grow(void **a, uint32_t *cap, uint32_t need, size_t size)
{
	uint64_t c = *cap ? *cap : 16;
	void *q;

	if (need <= *cap)
		return 0;
	while (c < need)
		c *= 2;
	if (c > UINT32_MAX)
		return -ENOMEM;
	q = realloc(*a, (size_t)c * size);
	if (!q)
		return -ENOMEM;
	*a = q;
	*cap = (uint32_t)c;
	return 0;
}

struct gkey_ctx {
	const struct gwork *g;
	const uint32_t *key;
	uint32_t n;
};

static int gset_eq(const void *ctx, uint32_t k)
{
	const struct gkey_ctx *x = ctx;

	return x->g->kn[k] == x->n &&
	       !memcmp(x->g->keys + x->g->kfirst[k], x->key,
		       (size_t)x->n * 2 * sizeof(*x->key));
}

/*
 * Tries to gather the streams of one cluster: members e[n] (sorted by view
 * offset, e[0] the lowest), all of one source, group, remote region and
 * stride, less than a stride apart. Their pieces, merged in remote order,
 * become a gather when pieces of two different streams touch on the remote
 * side (otherwise nothing is won and the streams stay apart). Members keep
 * their order in the plan (local view order); the gather goes where the
 * first of them stands. Returns 0 (gathered or not) or -ENOMEM.
 */
static int gather_one(struct work *w, struct gwork *g, struct gkey *e,
		      uint32_t n, uint32_t *head, uint32_t *nxt)
{
	uint32_t i, k, np, first = g->np, set, h, s, nk, low = 0;
	uint64_t base = e[0].roff; /* the lowest view offset */
	uint64_t total = 0;
	uint32_t *key;
	int touch = 0, err;

	/* members in stream order: the gather's m indexes them */
	qsort(e, n, sizeof(*e), gkey_pos_cmp);
	for (i = 0; i < n; i++)
		if (e[i].roff == base) {
			low = i;
			break;
		}
	for (i = 0; i < n; i++)
		total += w->sets[w->streams[e[i].i].set].count;
	if (total > MAX_PIECES_PER_SET)
		return 0; /* left apart: correct, only less coalesced */
	np = (uint32_t)total;
	err = grow((void **)&g->p, &g->cap_p, g->np + np, sizeof(*g->p));
	if (err)
		return err;
	for (i = 0, k = first; i < n; i++) {
		const struct kvp_pstream *st = &w->streams[e[i].i];
		const struct kvp_pset *ps = &w->sets[st->set];
		uint64_t d = e[i].roff - base;
		uint32_t q;

		for (q = 0; q < ps->count; q++, k++) {
			const struct kvp_piece *pc = &w->pieces.p[ps->first + q];

			if (pc->roff + d + pc->len > UINT32_MAX)
				return 0;
			g->p[k].roff = (uint32_t)(pc->roff + d);
			g->p[k].loff = pc->loff;
			g->p[k].len = pc->len;
			g->p[k].rbi = pc->rbi;
			g->p[k].lbi = pc->lbi;
			g->p[k].m = i;
		}
	}
	qsort(g->p + first, np, sizeof(*g->p), gpiece_cmp);
	for (k = first + 1; k < first + np && !touch; k++)
		touch = g->p[k].m != g->p[k - 1].m &&
			g->p[k].rbi == g->p[k - 1].rbi &&
			g->p[k - 1].roff + g->p[k - 1].len == g->p[k].roff;
	if (!touch)
		return 0;
	/* the set's key: (member set, distance from the first view) */
	nk = 2 * n;
	err = grow((void **)&g->keys, &g->cap_keys, g->nkeys + nk,
		   sizeof(*g->keys));
	if (err)
		return err;
	key = g->keys + g->nkeys;
	for (i = 0, h = mix(0, n); i < n; i++) {
		key[2 * i] = w->streams[e[i].i].set;
		key[2 * i + 1] = (uint32_t)(e[i].roff - base);
		h = mix(mix(h, key[2 * i]), key[2 * i + 1]);
	}
	err = imap_reserve(&g->map);
	if (err)
		return err;
	{
		struct gkey_ctx x = { g, key, n };

		s = imap_probe(&g->map, h, gset_eq, &x);
	}
	if (g->map.slot[s]) {
		set = g->map.slot[s] - 1; /* same pieces: drop these */
	} else {
		uint32_t c = g->cap_sets;

		err = grow((void **)&g->sets, &c, g->nsets + 1,
			   sizeof(*g->sets));
		c = g->cap_sets;
		err = err ?: grow((void **)&g->kfirst, &c, g->nsets + 1,
				  sizeof(*g->kfirst));
		c = g->cap_sets;
		err = err ?: grow((void **)&g->kn, &c, g->nsets + 1,
				  sizeof(*g->kn));
		if (err)
			return err;
		g->cap_sets = c;
		set = g->nsets++;
		g->sets[set].first = first;
		g->sets[set].count = np;
		g->kfirst[set] = g->nkeys;
		g->kn[set] = n;
		g->nkeys += nk;
		g->np += np;
		imap_put(&g->map, s, h, set);
	}
	err = grow((void **)&g->g, &g->cap_g, g->ng + 1, sizeof(*g->g));
	if (err)
		return err;
	/* remote offsets count from the lowest view, whose stream is not
	 * necessarily the first */
	g->g[g->ng].set = set;
	g->g[g->ng].rview = w->streams[e[low].i].rview;
	g->g[g->ng].n = n;
	for (i = 0; i < n; i++) {
		head[e[i].i] = e[0].i;
		nxt[e[i].i] = i + 1 < n ? e[i + 1].i : UINT32_MAX;
	}
	w->streams[e[0].i].gather = ++g->ng;
	return 0;
}

/*
 * Finds the gathers of the plan (after sort_streams()) and moves each
 * gather's streams together, at the place of its first: streams stay
 * ordered by source, and within a source a stream keeps its order unless
 * it joins a gather that begins earlier. O(streams log streams + pieces).
 */
static int gathers(struct work *w, struct gwork *g)
{
	const kvp_layout *r = w->r;
	struct gkey *e;
	uint32_t *head, *nxt, i, j, k, n = w->nstreams;
	struct kvp_pstream *out;
	int err = 0;

	if (w->flags & KVP_PLAN_NO_COALESCE || n < 2)
		return 0;
	e = malloc((size_t)n * sizeof(*e));
	head = malloc((size_t)n * sizeof(*head));
	nxt = malloc((size_t)n * sizeof(*nxt));
	out = malloc(((size_t)n + 1) * sizeof(*out));
	if (!e || !head || !nxt || !out) {
		err = -ENOMEM;
		goto out;
	}
	for (i = 0; i < n; i++) {
		const struct kvp_pstream *st = &w->streams[i];
		const struct kvp_view_desc *rv = &r->views[st->rview];

		e[i].src = st->src;
		e[i].group = w->sets[st->set].group;
		e[i].rreg = rv->region;
		e[i].rstride = (uint32_t)rv->stride;
		e[i].roff = rv->offset;
		e[i].i = i;
		head[i] = i;
	}
	qsort(e, n, sizeof(*e), gkey_cmp);
	for (i = 0; i < n; i = j) {
		for (j = i + 1;
		     j < n && e[j].src == e[i].src && e[j].group == e[i].group &&
		     e[j].rreg == e[i].rreg && e[j].rstride == e[i].rstride &&
		     e[j].roff - e[i].roff < e[i].rstride;
		     j++)
			;
		if (j - i > 1) {
			err = gather_one(w, g, e + i, j - i, head, nxt);
			if (err)
				goto out;
		}
	}
	if (!g->ng)
		goto out;
	/* a gather's streams follow its first, in stream order */
	for (i = 0, k = 0; i < n; i++) {
		if (head[i] != i)
			continue;
		out[k++] = w->streams[i];
		if (!w->streams[i].gather)
			continue;
		for (j = nxt[i]; j != UINT32_MAX; j = nxt[j]) {
			out[k] = w->streams[j];
			out[k++].gather = GATHER_MEMBER;
		}
	}
	free(w->streams);
	w->streams = out;
	w->cap_streams = n + 1;
	out = NULL;
out:
	free(e);
	free(head);
	free(nxt);
	free(out);
	return err;
}

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
	csr_free(&w->lcsr);
	csr_free(&w->rcsr);
	free(w->ridx);
	free(w->pieces.p);
	free(w->sets);
	free(w->keys);
	free(w->ends);
	free(w->streams);
	free(w->pairs);
	imap_free(&w->pmap);
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
	size_t off, sz[10];
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
	for (off = 0, i = 0; i < 10; i++)
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

int kvp_plan_compile(const kvp_layout *l, const kvp_layout *r,
		     const struct kvp_plan_attr *attr, kvp_plan **out,
		     char *msg, size_t msglen)
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
	err = check_groups(l, r, msg, msglen);
	if (err)
		return err;
	for (g = 0; g < l->ngroups; g++) {
		err = period_of(l, r, g, &w.per[g], msg, msglen);
		if (err)
			return err;
	}
	err = -ENOMEM;
	w.lshape = malloc(((size_t)l->nviews + 1) * sizeof(uint32_t));
	w.rshape = malloc(((size_t)r->nviews + 1) * sizeof(uint32_t));
	w.ridx = sorted_fields(r);
	w.used = malloc(r->attr.tp_size);
	w.gused = calloc((size_t)l->ngroups + 1, r->attr.tp_size);
	m = malloc(((size_t)l->nfields + 1) * 2 * sizeof(*m));
	if (!w.lshape || !w.rshape || !w.ridx || !w.used || !w.gused || !m)
		goto out;
	err = match_fields(l, r, w.ridx, msg, msglen);
	err = err ?: view_csr(l, &w.lcsr);
	err = err ?: view_csr(r, &w.rcsr);
	err = err ?: view_shapes(l, &w.lcsr, w.lshape);
	err = err ?: view_shapes(r, &w.rcsr, w.rshape);
	for (v = 0; !err && v < l->nviews; v++)
		err = plan_view(&w, v, m);
	err = err ?: check_bounds(&w);
	if (err)
		goto out;
	err = sort_streams(&w);
	err = err ?: gathers(&w, &gw);
	err = err ?: build_plan(&w, out);
out:
	if (err == -EPROTO && msg && msglen && !msg[0])
		kvp__msg(msg, msglen, "layouts cannot be matched");
	free(m);
	work_free(&w);
	gwork_free(&gw);
	return err;
}

void kvp_plan_destroy(kvp_plan *p)
{
	free(p);
}

/*
 * kvp_notify_expected(): how many consumer ranks name `producer` in their
 * notify list, without a compilation per consumer rank.
 *
 * kvp_plan_compile() sees the consumer rank c only through segments(): for
 * each matched field pair, which producer ranks c reads which index ranges
 * of the sharded axis from, and through the start of c's shard on the
 * local sharded axis where the producer does not shard it. Pieces depend on
 * a segment's range relative to c's shard and to the producer rank's shard
 * (every producer rank has the same layout up to its shard), and on ranks
 * only through their order. So two consumer ranks whose segments are the
 * same relative ranges, from ranks that differ by one shift, compile the
 * same plan with its sources shifted, or fail alike; the notify cover is
 * added after planning. One compilation per class of such ranks decides
 * refusal (in rank order: the error is the first failing rank's) and which
 * producers each rank reads from. Classes are few: ranks spaced by D/P
 * (or by replica counts) look alike, e.g. 16 for a hybrid model of 128 SSM
 * heads at P 8 and any D. Refusal itself can depend on the rank (one rank's
 * range crosses one more producer boundary than its neighbours' and hits a
 * limit), which is why one compilation is not enough.
 */

/* A kind of field pair as segments() sees it; lf, rf: a representative. */
struct ne_pair {
	uint32_t lax, ltot, rax, rtot; /* sharded axis (or COUNT), total */
	uint32_t llen[KVP_AXIS_COUNT];  /* local shard extent per axis */
	uint32_t lf, rf;
};

#define NE_PAIR_KEY offsetof(struct ne_pair, lf)
#define NE_SEGS 256 /* segments()'s limit in kvp_plan_compile() */

struct ne_class {
	uint64_t hash;
	uint32_t rank, base; /* representative and its lowest source */
	uint32_t src, nsrc;  /* its plan's sources: w->src[src .. + nsrc) */
};

struct ne_work {
	const kvp_layout *prod, *cons;
	struct ne_pair *pair;
	uint32_t npair;
	struct seg *seg;    /* NE_SEGS per pair */
	int *nseg;          /* per pair: count, or < 0 when segments() fails */
	uint32_t *key, *key2;
	struct ne_class *cls;
	uint32_t ncls, cap_cls;
	uint32_t *slot, nslot; /* hash table of class indices + 1 */
	uint32_t *src, nsrc, cap_src;
};

static int ne_pair_cmp(const void *x, const void *y)
{
	return memcmp(x, y, NE_PAIR_KEY);
}

/* The distinct kinds of matched field pairs (the pair matches: rank 0's
 * plan compiled). */
static int ne_pairs(struct ne_work *w)
{
	const kvp_layout *l = w->cons, *r = w->prod;
	uint32_t *ridx = sorted_fields(r), i, n = 0;
	struct axes a;

	w->pair = malloc(((size_t)l->nfields + 1) * sizeof(*w->pair));
	if (!ridx || !w->pair) {
		free(ridx);
		return -ENOMEM;
	}
	for (i = 0; i < l->nfields; i++) {
		const struct kvp_field_desc *lf = &l->fields[i].d, *rf;
		struct ne_pair *p = &w->pair[n];
		int k = find_field(r, ridx, l, i);

		if (k < 0 || field_axes(lf, l->attr.tp_size, 0, &a)) {
			free(ridx);
			return -EPROTO; /* not after a compiled plan */
		}
		rf = &r->fields[k].d;
		memset(p, 0, sizeof(*p));
		p->lax = lf->shard_dim == KVP_NO_SHARD ?
				 KVP_AXIS_COUNT :
				 lf->dim[lf->shard_dim].axis;
		p->ltot = lf->shard_dim == KVP_NO_SHARD ? 0 : lf->shard_total;
		p->rax = rf->shard_dim == KVP_NO_SHARD ?
				 KVP_AXIS_COUNT :
				 rf->dim[rf->shard_dim].axis;
		p->rtot = rf->shard_dim == KVP_NO_SHARD ? 0 : rf->shard_total;
		memcpy(p->llen, a.len, sizeof(p->llen));
		p->lf = i;
		p->rf = (uint32_t)k;
		n++;
	}
	free(ridx);
	qsort(w->pair, n, sizeof(*w->pair), ne_pair_cmp);
	for (i = 0, w->npair = 0; i < n; i++)
		if (!w->npair || ne_pair_cmp(&w->pair[w->npair - 1],
					     &w->pair[i]))
			w->pair[w->npair++] = w->pair[i];
	w->seg = malloc(((size_t)w->npair * NE_SEGS + 1) * sizeof(*w->seg));
	w->nseg = malloc(((size_t)w->npair + 1) * sizeof(*w->nseg));
	w->key = malloc(((size_t)w->npair * (2 + 4 * NE_SEGS) + 1) *
			sizeof(*w->key));
	w->key2 = malloc(((size_t)w->npair * (2 + 4 * NE_SEGS) + 1) *
			 sizeof(*w->key2));
	return w->seg && w->nseg && w->key && w->key2 ? 0 : -ENOMEM;
}

/* Writes rank c's key (its segments relative to its shard, the producer
 * ranks' shards and its lowest source) into k[*n]; returns its hash and
 * the lowest source in *base. */
static uint64_t ne_key(struct ne_work *w, uint32_t c, uint32_t *k,
		       uint32_t *n, uint32_t *base)
{
	const kvp_layout *l = w->cons, *r = w->prod;
	uint32_t D = l->attr.tp_size, P = r->attr.tp_size, i, j, m = 0;
	uint64_t h = 0xcbf29ce484222325ull;
	struct axes la;

	*base = UINT32_MAX;
	for (i = 0; i < w->npair; i++) {
		struct seg *sg = w->seg + (size_t)i * NE_SEGS;

		w->nseg[i] = segments(&l->fields[w->pair[i].lf].d, D, c,
				      &r->fields[w->pair[i].rf].d, P, sg,
				      NE_SEGS);
		for (j = 0; w->nseg[i] > 0 && j < (uint32_t)w->nseg[i]; j++)
			if (sg[j].rank < *base)
				*base = sg[j].rank;
	}
	if (*base == UINT32_MAX)
		*base = 0;
	for (i = 0; i < w->npair; i++) {
		const struct ne_pair *p = &w->pair[i];
		const struct seg *sg = w->seg + (size_t)i * NE_SEGS;
		uint32_t start, len;

		k[m++] = (uint32_t)w->nseg[i]; /* < 0: refused, a class alone */
		if (w->nseg[i] < 0 ||
		    field_axes(&l->fields[p->lf].d, D, c, &la))
			continue;
		/* the producer does not shard c's sharded axis: c's range
		 * lands at its absolute place in the producer's field */
		if (p->lax != KVP_AXIS_COUNT && p->lax != p->rax)
			k[m++] = la.start[p->lax];
		for (j = 0; j < (uint32_t)w->nseg[i]; j++) {
			k[m++] = sg[j].rank - *base;
			if (sg[j].axis == KVP_AXIS_COUNT)
				continue;
			if (kvp_shard_range(p->rtot, P, sg[j].rank, &start,
					    &len))
				start = 0;
			k[m++] = sg[j].lo - la.start[sg[j].axis];
			k[m++] = sg[j].lo - start;
			k[m++] = sg[j].hi - sg[j].lo;
		}
	}
	for (i = 0; i < m; i++)
		h = (h ^ k[i]) * 0x100000001b3ull;
	*n = m;
	return h;
}

static int ne_grow(struct ne_work *w)
{
	uint32_t n = w->nslot ? w->nslot * 2 : 64, i, s;
	uint32_t *slot = calloc(n, sizeof(*slot));
	void *a;

	if (!slot)
		return -ENOMEM;
	for (i = 0; i < w->ncls; i++) {
		for (s = (uint32_t)w->cls[i].hash & (n - 1); slot[s];
		     s = (s + 1) & (n - 1))
			;
		slot[s] = i + 1;
	}
	free(w->slot);
	w->slot = slot;
	w->nslot = n;
	a = realloc(w->cls, (size_t)(n / 2) * sizeof(*w->cls));
	if (!a)
		return -ENOMEM;
	w->cls = a;
	w->cap_cls = n / 2;
	return 0;
}

/* Finds rank c's class, or compiles c's plan and makes one; *base receives
 * c's lowest source. */
static int ne_class_of(struct ne_work *w, uint32_t c,
		       const struct ne_class **out, uint32_t *base)
{
	uint32_t n, n2, b2, s, i;
	uint64_t h = ne_key(w, c, w->key, &n, base);
	struct kvp_layout tmp;
	struct ne_class *k;
	kvp_plan *plan;
	int err;

	if (w->ncls == w->cap_cls) {
		err = ne_grow(w);
		if (err)
			return err;
	}
	for (s = (uint32_t)h & (w->nslot - 1); w->slot[s];
	     s = (s + 1) & (w->nslot - 1)) {
		k = &w->cls[w->slot[s] - 1];
		if (k->hash != h)
			continue;
		ne_key(w, k->rank, w->key2, &n2, &b2);
		if (n == n2 && !memcmp(w->key, w->key2, n * sizeof(*w->key))) {
			*out = k;
			return 0;
		}
	}
	tmp = *w->cons; /* read only: a view of the same layout at rank c */
	tmp.attr.tp_rank = c;
	err = kvp_plan_compile(&tmp, w->prod, NULL, &plan, NULL, 0);
	if (err)
		return err;
	if (w->nsrc + plan->nsrc > w->cap_src) {
		uint32_t cap = (w->nsrc + plan->nsrc) * 2;
		void *a = realloc(w->src, cap * sizeof(*w->src));

		if (!a) {
			kvp_plan_destroy(plan);
			return -ENOMEM;
		}
		w->src = a;
		w->cap_src = cap;
	}
	k = &w->cls[w->ncls];
	k->hash = h;
	k->rank = c;
	k->base = *base;
	k->src = w->nsrc;
	k->nsrc = plan->nsrc;
	for (i = 0; i < plan->nsrc; i++)
		w->src[w->nsrc++] = plan->src[i];
	kvp_plan_destroy(plan);
	w->slot[s] = ++w->ncls;
	*out = k;
	return 0;
}

/* Whether a rank of class k with lowest source `base` reads from p: the
 * class's sources, shifted (they ascend). */
static int ne_reads(const struct ne_work *w, const struct ne_class *k,
		    uint32_t base, uint32_t p)
{
	int64_t want = (int64_t)p - base + k->base;
	uint32_t lo = k->src, hi = k->src + k->nsrc;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo) / 2;

		if (w->src[mid] == want)
			return 1;
		if (w->src[mid] < want)
			lo = mid + 1;
		else
			hi = mid;
	}
	return 0;
}

/* Counts the consumer ranks that read from `producer` or cover it. */
int kvp_notify_expected(const kvp_layout *prod, const kvp_layout *cons,
			uint32_t producer)
{
	struct ne_work w;
	struct kvp_layout tmp;
	const struct ne_class *k;
	uint32_t c, lo, hi, base, count = 0;
	kvp_plan *plan;
	int err;

	if (!prod || !cons || producer >= prod->attr.tp_size)
		return -EINVAL;
	/* Rank 0 first: a pair that cannot be matched at all fails here. */
	tmp = *cons;
	tmp.attr.tp_rank = 0;
	err = kvp_plan_compile(&tmp, prod, NULL, &plan, NULL, 0);
	if (err)
		return err;
	kvp_plan_destroy(plan);
	memset(&w, 0, sizeof(w));
	w.prod = prod;
	w.cons = cons;
	err = ne_pairs(&w);
	for (c = 0; !err && c < cons->attr.tp_size; c++) {
		err = ne_class_of(&w, c, &k, &base);
		if (err)
			break;
		kvp__notify_cover(c, cons->attr.tp_size, prod->attr.tp_size,
				  &lo, &hi);
		if ((producer >= lo && producer < hi) ||
		    ne_reads(&w, k, base, producer))
			count++;
	}
	free(w.pair);
	free(w.seg);
	free(w.nseg);
	free(w.key);
	free(w.key2);
	free(w.cls);
	free(w.slot);
	free(w.src);
	if (err)
		return err;
	return count > INT32_MAX ? -EPROTO : (int)count;
}
