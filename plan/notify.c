// SPDX-License-Identifier: MIT
/*
 * kvp_notify_expected(): how many consumer ranks name `producer` in their
 * notify list, without a compilation per consumer rank.
 *
 * kvp_plan_compile() sees the consumer rank c only through kvp__segments(): for
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

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"

struct ne_pair {
	uint32_t lax, ltot, rax, rtot; /* sharded axis (or COUNT), total */
	uint32_t llen[KVP_AXIS_COUNT];  /* local shard extent per axis */
	uint32_t lf, rf;
};

#define NE_PAIR_KEY offsetof(struct ne_pair, lf)
#define NE_SEGS 256 /* kvp__segments()'s limit in kvp_plan_compile() */

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
	int *nseg;          /* per pair: kvp__segments()'s count or error */
	uint32_t *key, *key2;
	struct ne_class *cls;
	uint32_t ncls, cap_cls;
	uint32_t *slot, nslot; /* hash table of class indices + 1 */
	uint32_t *src, nsrc, cap_src;
	uint64_t budget; /* pieces left for the compilations (compile.h) */
};

static void ne_free(struct ne_work *w)
{
	free(w->pair);
	free(w->seg);
	free(w->nseg);
	free(w->key);
	free(w->key2);
	free(w->cls);
	free(w->slot);
	free(w->src);
}

static int ne_pair_cmp(const void *x, const void *y)
{
	return memcmp(x, y, NE_PAIR_KEY);
}

/* The distinct kinds of matched field pairs (the pair matches: rank 0's
 * plan compiled). */
static int ne_pairs(struct ne_work *w)
{
	const kvp_layout *l = w->cons, *r = w->prod;
	uint32_t *ridx = kvp__sorted_fields(r), i, n = 0;
	struct axes a;

	w->pair = malloc(((size_t)l->nfields + 1) * sizeof(*w->pair));
	if (!ridx || !w->pair) {
		free(ridx);
		return -ENOMEM;
	}
	for (i = 0; i < l->nfields; i++) {
		const struct kvp_field_desc *lf = &l->fields[i].d, *rf;
		struct ne_pair *p = &w->pair[n];
		int k = kvp__find_field(r, ridx, l, i);

		if (k < 0 || kvp__field_axes(lf, l->attr.tp_size, 0, &a)) {
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

		w->nseg[i] = kvp__segments(&l->fields[w->pair[i].lf].d, D, c,
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
		    kvp__field_axes(&l->fields[p->lf].d, D, c, &la))
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
	err = kvp__plan_compile(&tmp, w->prod, NULL, &plan, NULL, 0,
				&w->budget);
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
	/* Rank 0 first: a pair that cannot be matched at all fails here.
	 * All the compilations below share one budget: a costly consumer
	 * layout costs this call at most KVP_PLAN_MAX_WORK pieces, however
	 * many classes of ranks it has. */
	memset(&w, 0, sizeof(w));
	w.budget = KVP_PLAN_MAX_WORK;
	tmp = *cons;
	tmp.attr.tp_rank = 0;
	err = kvp__plan_compile(&tmp, prod, NULL, &plan, NULL, 0, &w.budget);
	if (err)
		return err;
	kvp_plan_destroy(plan);
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
	ne_free(&w);
	if (err)
		return err;
	return count > INT32_MAX ? -EPROTO : (int)count;
}

/* The layouts' field-level checks of kvp_plan_compile(), in the order it
 * makes them: groups, each group's period, every field matched. Linear in
 * the fields; no piece is made. */
static int ne_matches(const kvp_layout *cons, const kvp_layout *prod,
		      char *msg, size_t msglen)
{
	struct period per;
	uint32_t g, *ridx;
	int err;

	err = kvp__check_groups(cons, prod, msg, msglen);
	for (g = 0; !err && g < cons->ngroups; g++)
		err = kvp__period_of(cons, prod, g, &per, msg, msglen);
	if (err)
		return err;
	ridx = kvp__sorted_fields(prod);
	if (!ridx)
		return -ENOMEM;
	err = kvp__match_fields(cons, prod, ridx, msg, msglen);
	free(ridx);
	return err;
}

int kvp__notify_count(const kvp_layout *prod, const kvp_layout *cons,
		      uint32_t producer, char *msg, size_t msglen)
{
	struct ne_work w;
	uint32_t c, i, j, lo, hi, base, n, count = 0;
	int err;

	if (!prod || !cons || producer >= prod->attr.tp_size)
		return -EINVAL;
	if (msg && msglen)
		msg[0] = 0;
	err = ne_matches(cons, prod, msg, msglen);
	if (err)
		return err;
	memset(&w, 0, sizeof(w));
	w.prod = prod;
	w.cons = cons;
	err = ne_pairs(&w);
	for (c = 0; !err && c < cons->attr.tp_size; c++) {
		int reads = 0;

		/* c's segments, pair by pair: a rank it reads any box from
		 * is a source of its plan (a box is never empty). */
		(void)ne_key(&w, c, w.key, &n, &base);
		for (i = 0; i < w.npair && !err; i++) {
			const struct seg *sg = w.seg + (size_t)i * NE_SEGS;

			if (w.nseg[i] < 0) {
				err = w.nseg[i] == -ENOMEM ? -ENOMEM : -EPROTO;
				kvp__msg(msg, msglen,
					 "consumer rank %u: its ranges of a field cross more than %u producer ranks",
					 c, NE_SEGS);
				break;
			}
			for (j = 0; j < (uint32_t)w.nseg[i]; j++)
				if (sg[j].rank == producer)
					reads = 1;
		}
		if (err)
			break;
		kvp__notify_cover(c, cons->attr.tp_size, prod->attr.tp_size,
				  &lo, &hi);
		if (reads || (producer >= lo && producer < hi))
			count++;
	}
	ne_free(&w);
	if (err)
		return err;
	return count > INT32_MAX ? -EPROTO : (int)count;
}
