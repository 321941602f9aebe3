// SPDX-License-Identifier: MIT
/*
 * Plan compilation, matching: pair the consumer's fields with the
 * producer's (same group, layer and kind), check that each pair holds the
 * same data, and split each box the consumer needs between producer ranks
 * (interval arithmetic on the sharded axis). The floor the other compile
 * files stand on: calls only layout.c and spec.c.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"

const char *const kvp__kind_name[KVP_FIELD_KIND_COUNT] = {
	"K",	  "V",	    "latent", "conv_x", "conv_B",
	"conv_C", "ssm",    "conv_q", "conv_k", "conv_v",
};

static const char *const axis_name[KVP_AXIS_COUNT] = {
	"token", "head", "dim", "channel", "state", "aux",
};

int kvp__field_axes(const struct kvp_field_desc *f, uint32_t tp, uint32_t rank,
		    struct axes *a)
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
uint32_t *kvp__sorted_fields(const kvp_layout *l)
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

int kvp__find_field(const kvp_layout *r, const uint32_t *idx,
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

int kvp__check_groups(const kvp_layout *l, const kvp_layout *r, char *msg,
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

	if (kvp__field_axes(a, l->attr.tp_size, l->attr.tp_rank, &la) ||
	    kvp__field_axes(b, r->attr.tp_size, r->attr.tp_rank, &ra))
		return -EPROTO;
	if (a->elem_size != b->elem_size) {
		kvp__msg(msg, msglen,
			 "group %u layer %u %s: element size differs: local %u, remote %u",
			 v->group, v->layer, kvp__kind_name[a->kind],
			 a->elem_size, b->elem_size);
		return -EPROTO;
	}
	for (i = 1; i < KVP_AXIS_COUNT; i++) {
		if (la.total[i] != ra.total[i]) {
			kvp__msg(msg, msglen,
				 "group %u layer %u %s: %s extent differs: local %u, remote %u",
				 v->group, v->layer, kvp__kind_name[a->kind],
				 axis_name[i], la.total[i], ra.total[i]);
			return -EPROTO;
		}
	}
	return 0;
}

/*
 * Splits what consumer rank `rank` needs of a field between producer ranks.
 * The needed range on the remote's sharded axis is walked from its low end;
 * each position is held by one rank (total divisible by P) or replicated on
 * P/total ranks, of which replica `rank % replicas` is read so consumers
 * spread over producers. An unsharded remote field is replicated on every
 * rank. Writes at most `max` segments; returns their count or -EPROTO.
 */
int kvp__segments(const struct kvp_field_desc *lfd, uint32_t ltp, uint32_t rank,
		  const struct kvp_field_desc *rfd, uint32_t rtp,
		  struct seg *out, uint32_t max)
{
	struct axes la;
	uint32_t ax, x, hi, n = 0;

	if (kvp__field_axes(lfd, ltp, rank, &la))
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
int kvp__match_fields(const kvp_layout *l, const kvp_layout *r,
		      const uint32_t *ridx, char *msg, size_t msglen)
{
	uint32_t i, *lidx;
	int err;

	for (i = 0; i < l->nfields; i++) {
		int rf = kvp__find_field(r, ridx, l, i);
		const struct kvp_view_desc *v = &l->views[l->fields[i].view];

		if (rf < 0) {
			kvp__msg(msg, msglen,
				 "remote has no %s field for group %u layer %u",
				 kvp__kind_name[l->fields[i].d.kind], v->group,
				 v->layer);
			return -EPROTO;
		}
		err = check_pair(l, i, r, (uint32_t)rf, msg, msglen);
		if (err)
			return err;
	}
	if (r->nfields == l->nfields)
		return 0;
	lidx = kvp__sorted_fields(l);
	if (!lidx)
		return -ENOMEM;
	for (i = 0; i < r->nfields; i++) {
		const struct kvp_view_desc *v = &r->views[r->fields[i].view];

		if (kvp__find_field(l, lidx, r, i) < 0) {
			kvp__msg(msg, msglen,
				 "local has no %s field for group %u layer %u (remote has more layers or fields)",
				 kvp__kind_name[r->fields[i].d.kind], v->group,
				 v->layer);
			break;
		}
	}
	free(lidx);
	return -EPROTO;
}
