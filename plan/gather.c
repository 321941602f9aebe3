// SPDX-License-Identifier: MIT
/*
 * Plan compilation, gathers: streams of one source, group and remote region
 * whose pieces are remote-adjacent, merged at compile time into one walk
 * (struct kvp_pgather, internal.h). Calls imap.c only.
 */
#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "compile.h"

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

void kvp__gwork_free(struct gwork *g)
{
	free(g->g);
	free(g->sets);
	free(g->keys);
	free(g->kfirst);
	free(g->kn);
	free(g->p);
	kvp__imap_free(&g->map);
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
	for (i = 0, h = kvp__mix(0, n); i < n; i++) {
		key[2 * i] = w->streams[e[i].i].set;
		key[2 * i + 1] = (uint32_t)(e[i].roff - base);
		h = kvp__mix(kvp__mix(h, key[2 * i]), key[2 * i + 1]);
	}
	err = kvp__imap_reserve(&g->map);
	if (err)
		return err;
	{
		struct gkey_ctx x = { g, key, n };

		s = kvp__imap_probe(&g->map, h, gset_eq, &x);
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
		kvp__imap_put(&g->map, s, h, set);
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
 * Finds the gathers of the plan (after kvp__sort_streams()) and moves each
 * gather's streams together, at the place of its first: streams stay
 * ordered by source, and within a source a stream keeps its order unless
 * it joins a gather that begins earlier. O(streams log streams + pieces).
 */
int kvp__gathers(struct work *w, struct gwork *g)
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
