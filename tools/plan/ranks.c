// SPDX-License-Identifier: MIT
/*
 * kvpull-plan: the other consumer ranks of the local engine, for the
 * picture (--svg): their plans, and which producer bytes several consumer
 * ranks read (KV heads replicated because the consumer's TP is above the
 * KV heads, or MLA's latents: every rank reads the same bytes).
 *
 * A rank's layout is the engine's layout at another rank: the same groups,
 * regions, views and fields (a rank's shard lengths are every rank's, as
 * kvp_shard_range() allows only TP sizes dividing or divided by an axis),
 * as kvp_notify_expected() takes it. What a rank reads of a producer is
 * its plan's pieces: (producer rank, remote view, block of the period,
 * byte range in the page); two ranks read the same bytes where those meet.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump.h"

/* One piece of a plan, on the producer's side. */
struct ival {
	uint32_t p, view, block; /* producer rank, remote view, block */
	uint64_t lo, hi;	 /* bytes [lo, hi) of that page */
	uint32_t arrow;		 /* g * nsrc + s of the plan it is from */
};

/* A plan's pieces, sorted by where they are on the producer. */
struct reads {
	struct ival *iv;
	size_t n;
};

/* l at consumer rank `rank`: l's groups, regions, views and fields. */
static kvp_layout *layout_at_rank(const kvp_layout *l, uint32_t rank)
{
	struct kvp_layout_attr attr;
	struct kvp_layout_info li;
	struct kvp_group_desc g;
	struct kvp_view_desc v;
	struct kvp_field_desc f;
	kvp_layout *c;
	uint64_t size;
	uint32_t i, id, view;

	kvp_layout_get_info(l, &li);
	memset(&attr, 0, sizeof(attr));
	attr.engine_id = li.engine_id;
	attr.tp_size = li.tp_size;
	attr.tp_rank = rank;
	checked(kvp_layout_create(&attr, &c), "consumer rank", rank);
	for (i = 0; i < li.ngroups; i++) {
		checked(kvp_layout_get_group(l, i, &g), "group", i);
		checked(kvp_layout_add_group(c, &g, &id), "group", i);
	}
	for (i = 0; i < li.nregions; i++) {
		checked(kvp_layout_get_region(l, i, &size), "region", i);
		checked(kvp_layout_add_region(c, size, &id), "region", i);
	}
	for (i = 0; i < li.nviews; i++) {
		checked(kvp_layout_get_view(l, i, &v), "view", i);
		checked(kvp_layout_add_view(c, &v, &id), "view", i);
	}
	for (i = 0; i < li.nfields; i++) {
		checked(kvp_layout_get_field(l, i, &view, &f), "field", i);
		checked(kvp_layout_add_field(c, view, &f), "field", i);
	}
	return c;
}

void plan_at_rank(struct opts *o, uint32_t rank, struct dump *d)
{
	kvp_layout *l = layout_at_rank(o->loc.l, rank);

	compile_plan(o, l, d);
	kvp_layout_destroy(l);
}

/* The producer page a piece lies in, compared. */
static int page_cmp(const struct ival *x, const struct ival *y)
{
	if (x->p != y->p)
		return x->p < y->p ? -1 : 1;
	if (x->view != y->view)
		return x->view < y->view ? -1 : 1;
	return (x->block > y->block) - (x->block < y->block);
}

static int ival_cmp(const void *a, const void *b)
{
	const struct ival *x = a, *y = b;
	int c = page_cmp(x, y);

	if (c)
		return c;
	if (x->lo != y->lo)
		return x->lo < y->lo ? -1 : 1;
	return (x->hi > y->hi) - (x->hi < y->hi);
}

/* Every piece of every stream of d's plan, sorted. */
static void plan_reads(const struct dump *d, struct reads *r)
{
	struct kvp_plan_stream st;
	struct kvp_plan_piece pc;
	uint32_t i, k;
	size_t n = 0;

	for (i = 0; i < d->info.nstreams; i++) {
		checked(kvp_plan_get_stream(d->plan, i, &st), "stream", i);
		n += st.npieces;
	}
	r->iv = xcalloc(n, sizeof(*r->iv));
	r->n = n;
	n = 0;
	for (i = 0; i < d->info.nstreams; i++) {
		checked(kvp_plan_get_stream(d->plan, i, &st), "stream", i);
		for (k = 0; k < st.npieces; k++) {
			struct ival *x = &r->iv[n++];

			checked(kvp_plan_get_piece(d->plan, st.piece_first + k,
						   &pc),
				"piece", st.piece_first + k);
			x->p = (uint32_t)d->src_rank[st.src];
			x->view = st.remote_view;
			x->block = pc.remote_block;
			x->lo = pc.remote_offset;
			x->hi = pc.remote_offset + pc.len;
			x->arrow = st.group * d->info.nsrc + st.src;
		}
	}
	qsort(r->iv, r->n, sizeof(*r->iv), ival_cmp);
}

/* Adds into got[arrow] the bytes of a's pieces that b's pieces read too
 * (both sorted; a plan reads each producer byte once). */
static void overlap(const struct reads *a, const struct reads *b,
		    uint64_t *got)
{
	size_t i = 0, j = 0;

	while (i < a->n && j < b->n) {
		const struct ival *x = &a->iv[i], *y = &b->iv[j];
		int c = page_cmp(x, y);
		uint64_t lo, hi;

		if (c) {
			i += c < 0;
			j += c > 0;
			continue;
		}
		lo = x->lo > y->lo ? x->lo : y->lo;
		hi = x->hi < y->hi ? x->hi : y->hi;
		if (lo < hi)
			got[x->arrow] += hi - lo;
		if (x->hi <= y->hi)
			i++;
		else
			j++;
	}
}

/* The global extents of the local engine's sharded axes (distinct), and
 * whether some field is not sharded (then every rank holds it). */
struct shards {
	uint32_t total[64], n;
	int whole;
};

static void local_shards(const kvp_layout *l, struct shards *sd)
{
	struct kvp_layout_info li;
	struct kvp_field_desc f;
	uint32_t i, k, view;

	memset(sd, 0, sizeof(*sd));
	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nfields; i++) {
		checked(kvp_layout_get_field(l, i, &view, &f), "field", i);
		if (f.shard_dim == KVP_NO_SHARD) {
			sd->whole = 1;
			continue;
		}
		for (k = 0; k < sd->n && sd->total[k] != f.shard_total; k++)
			;
		if (k < sd->n)
			continue;
		if (sd->n == 64) {
			sd->whole = 1; /* too many to tell: compare them all */
			continue;
		}
		sd->total[sd->n++] = f.shard_total;
	}
}

/* Whether consumer ranks a and b of TP tp hold some of the same bytes. */
static int shards_meet(const struct shards *sd, uint32_t tp, uint32_t a,
		       uint32_t b)
{
	uint32_t k, sa, la, sb, lb;

	if (sd->whole)
		return 1;
	for (k = 0; k < sd->n; k++)
		if (!kvp_shard_range(sd->total[k], tp, a, &sa, &la) &&
		    !kvp_shard_range(sd->total[k], tp, b, &sb, &lb) &&
		    sa < sb + lb && sb < sa + la)
			return 1;
	return 0;
}

void find_replicas(struct opts *o, const struct dump *const *pd, uint32_t n,
		   struct share **sh)
{
	struct reads *mine = xcalloc(n, sizeof(*mine)), other;
	uint64_t **bytes = xcalloc(n, sizeof(*bytes)), **got;
	struct kvp_layout_info li;
	struct shards sd;
	uint32_t i, c, k, narrows;

	kvp_layout_get_info(o->loc.l, &li);
	local_shards(o->loc.l, &sd);
	got = xcalloc(n, sizeof(*got));
	for (i = 0; i < n; i++) {
		narrows = pd[i]->info.ngroups * pd[i]->info.nsrc;
		sh[i] = xcalloc(narrows, sizeof(**sh));
		bytes[i] = xcalloc(narrows, sizeof(**bytes));
		got[i] = xcalloc(narrows, sizeof(**got));
		plan_reads(pd[i], &mine[i]);
		for (k = 0; k < mine[i].n; k++)
			bytes[i][mine[i].iv[k].arrow] +=
				mine[i].iv[k].hi - mine[i].iv[k].lo;
	}
	/* Every other rank in order, its plan compiled at most once. */
	for (c = 0; c < li.tp_size; c++) {
		struct dump od;
		const struct reads *r = NULL;
		int need = 0;

		for (i = 0; i < n; i++) {
			if (pd[i]->info.local_rank == c)
				r = &mine[i];
			else if (shards_meet(&sd, li.tp_size,
					     pd[i]->info.local_rank, c))
				need = 1;
		}
		if (!need)
			continue;
		memset(&od, 0, sizeof(od));
		if (!r) {
			plan_at_rank(o, c, &od);
			plan_reads(&od, &other);
			r = &other;
		}
		for (i = 0; i < n; i++) {
			if (pd[i]->info.local_rank == c ||
			    !shards_meet(&sd, li.tp_size,
					 pd[i]->info.local_rank, c))
				continue;
			narrows = pd[i]->info.ngroups * pd[i]->info.nsrc;
			memset(got[i], 0, narrows * sizeof(**got));
			overlap(&mine[i], r, got[i]);
			for (k = 0; k < narrows; k++) {
				struct share *s = &sh[i][k];

				if (!got[i][k])
					continue;
				if (!s->n++)
					s->lo = c;
				s->hi = c;
				if (got[i][k] < bytes[i][k])
					s->partial = 1;
			}
		}
		if (r == &other) {
			free(other.iv);
			free_dump(&od);
		}
	}
	for (i = 0; i < n; i++) {
		free(mine[i].iv);
		free(bytes[i]);
		free(got[i]);
	}
	free(mine);
	free(bytes);
	free(got);
}
