// SPDX-License-Identifier: MIT
/* kvpull-plan: the one request --request, --hit, --tokens and the id lists
 * describe: its ids, its READs, and the counts the outputs print. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump.h"

static void group_need(const struct kvp_plan_group *pg,
		       const struct kvp_ids *id, struct need *n)
{
	uint64_t nl;

	if (pg->kind == KVP_GROUP_STATE) {
		n->skip = 0;
		n->lend = n->rend = id->nlocal;
		n->tokens = 0;
		return;
	}
	n->tokens = id->tokens ? id->tokens :
				 (uint64_t)id->nremote * pg->remote_tokens;
	nl = (n->tokens + pg->local_tokens - 1) / pg->local_tokens;
	n->lend = (uint32_t)nl;
	n->skip = nl > id->nlocal ? (uint32_t)(nl - id->nlocal) : 0;
	n->rend = (uint32_t)((n->tokens + pg->remote_tokens - 1) /
			     pg->remote_tokens);
}

/*
 * The READs of a design that posts one descriptor per block per region: for
 * each stream, the local blocks of the request that it touches (a block is
 * touched when one of the stream's pieces lands in it from a remote block
 * the request holds), summed over streams.
 */
static uint64_t naive_wrs(const kvp_plan *plan, const struct kvp_plan_group *pg,
			  const struct kvp_ids *ids, uint64_t *per_group)
{
	struct kvp_plan_info info;
	uint64_t total = 0;
	uint32_t s, maxl = 1, g, *mark;

	kvp_plan_get_info(plan, &info);
	for (g = 0; g < info.ngroups; g++) {
		struct need n;

		group_need(&pg[g], &ids[g], &n);
		if (n.lend > maxl)
			maxl = n.lend;
		per_group[g] = 0;
	}
	mark = xcalloc(maxl, sizeof(*mark));
	for (s = 0; s < info.nstreams; s++) {
		struct kvp_plan_stream st;
		const struct kvp_plan_group *p;
		struct need n;
		uint32_t k, i, count = 0;

		checked(kvp_plan_get_stream(plan, s, &st), "stream", s);
		p = &pg[st.group];
		group_need(p, &ids[st.group], &n);
		if (n.skip >= n.lend)
			continue;
		for (k = n.skip / p->local_per_period;
		     k * p->local_per_period < n.lend; k++) {
			for (i = 0; i < st.npieces; i++) {
				struct kvp_plan_piece pc;
				uint32_t L, R, pi = st.piece_first + i;

				checked(kvp_plan_get_piece(plan, pi, &pc),
					"piece", pi);
				L = k * p->local_per_period + pc.local_block;
				R = k * p->remote_per_period + pc.remote_block;
				if (L < n.skip || L >= n.lend || R >= n.rend ||
				    mark[L] == s + 1)
					continue;
				mark[L] = s + 1;
				count++;
			}
		}
		per_group[st.group] += count;
		total += count;
	}
	free(mark);
	return total;
}

struct span {
	uint64_t offset;
	uint32_t len, region, group;
};

static int span_cmp(const void *x, const void *y)
{
	const struct span *a = x, *b = y;

	if (a->region != b->region)
		return a->region < b->region ? -1 : 1;
	return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Whether two local SGEs of the request overlap. Groups that pool memory
 * (hybrid models) do when given the same ids; the default ids are. */
static int local_overlap(struct request *rq)
{
	struct span *sp;
	uint32_t i, k, n = 0;
	int found = 0;

	for (i = 0; i < rq->nwr; i++)
		n += rq->wr[i].nsge;
	sp = xcalloc(n, sizeof(*sp));
	for (i = 0, n = 0; i < rq->nwr; i++) {
		const struct kvp_sge *s = &rq->sge[rq->wr[i].sge_first];

		for (k = 0; k < rq->wr[i].nsge; k++, n++, s++) {
			sp[n].offset = s->offset;
			sp[n].len = s->len;
			sp[n].region = s->region;
			sp[n].group = rq->wr[i].group;
		}
	}
	qsort(sp, n, sizeof(*sp), span_cmp);
	for (i = 1; i < n && !found; i++) {
		if (sp[i].region == sp[i - 1].region &&
		    sp[i - 1].offset + sp[i - 1].len > sp[i].offset) {
			found = 1;
			rq->overlap_g[0] = sp[i - 1].group < sp[i].group ?
						   sp[i - 1].group :
						   sp[i].group;
			rq->overlap_g[1] = sp[i - 1].group ^ sp[i].group ^
					   rq->overlap_g[0];
			rq->overlap_region = sp[i].region;
		}
	}
	free(sp);
	return found;
}

static uint32_t *iota(uint32_t first, uint32_t n)
{
	uint32_t *id = xcalloc(n, sizeof(*id)), i;

	for (i = 0; i < n; i++)
		id[i] = first + i;
	return id;
}

/* --range: "L0:L1" or "L0:L1:T0:T1" (T1 "end": KVP_TOKENS_END). */
static void parse_range(const char *s, struct kvp_emit_range *r)
{
	unsigned long long v[4] = { 0, 0, 0, KVP_TOKENS_END };
	char *end;
	const char *p = s;
	int i;

	memset(r, 0, sizeof(*r));
	for (i = 0; i < 4 && *p; i++) {
		if (i == 3 && !strncmp(p, "end", 3)) {
			end = (char *)p + 3;
		} else {
			if (*p < '0' || *p > '9')
				break;
			errno = 0;
			v[i] = strtoull(p, &end, 10);
			if (errno || (i < 2 && v[i] > UINT32_MAX))
				break;
		}
		p = end;
		if (*p == ':' && i < 3)
			p++;
		else if (*p)
			break;
	}
	if (*p || (i != 2 && i != 4))
		usage_error("--range %s: want L0:L1 or L0:L1:T0:T1 (numbers; T1 may be 'end')",
			    s);
	r->layer0 = (uint32_t)v[0];
	r->layer1 = (uint32_t)v[1];
	r->tok0 = v[2];
	r->tok1 = v[3];
	if (r->layer0 > r->layer1 || r->tok0 > r->tok1) {
		char t1[24] = "end";

		if (r->tok1 != KVP_TOKENS_END)
			snprintf(t1, sizeof(t1), "%llu", v[3]);
		usage_error("--range %s: layers [%u, %u) or tokens (%llu, %s] run backwards",
			    s, r->layer0, r->layer1, v[2], t1);
	}
}

/* The READs of range r, every source in turn: in windows of all the room
 * there is, so coalescing within each source is kvp_plan_emit()'s. */
static int emit_range(const char *spec, const kvp_plan *plan,
		      struct request *rq, uint32_t maxw, uint32_t maxs)
{
	struct kvp_plan_info info;
	uint32_t s, nwr = 0, nsge = 0, k;
	int n;

	parse_range(spec, &rq->range);
	rq->ranged = 1;
	kvp_plan_get_info(plan, &info);
	for (s = 0; s < info.nsrc; s++) {
		struct kvp_emit_pos pos;

		n = kvp_plan_emit_range_start(plan, rq->ids, s, &rq->range,
					      &pos);
		if (n)
			return n;
		while (!kvp_plan_emit_done(&pos)) {
			n = kvp_plan_emit_range_window(
				plan, rq->ids, &rq->range, &pos, rq->wr + nwr,
				maxw - nwr, rq->sge + nsge, maxs - nsge, NULL);
			if (n <= 0)
				return n ? n : -ENOSPC;
			/* sge_first counts from the window's first SGE */
			for (k = 0; k < (uint32_t)n; k++) {
				rq->wr[nwr + k].sge_first += nsge;
			}
			nsge = rq->wr[nwr + n - 1].sge_first +
			       rq->wr[nwr + n - 1].nsge;
			nwr += (uint32_t)n;
		}
	}
	return (int)nwr;
}

/* An id list's origin, for messages: "--remote-ids" (the g-th given),
 * "--request 8", "the default local ids". */
static const char *ids_origin(const struct opts *o, int local, uint32_t g,
			      char *buf, size_t n)
{
	if (local ? g < o->nlids : g < o->nrids)
		snprintf(buf, n, "--%s-ids", local ? "local" : "remote");
	else if (local)
		snprintf(buf, n, "the default local ids");
	else
		snprintf(buf, n, "--request %u", o->request);
	return buf;
}

/* kvp_plan_emit()'s -ERANGE, said before it: the first id of group g not
 * below the group's block count, where it is in its list, and the bound. */
static void check_range(const struct opts *o, const struct kvp_plan_group *pg,
			const struct kvp_ids *id, uint32_t g)
{
	char from[48];
	uint32_t i, k;

	for (k = 0; k < 2; k++) {
		const uint32_t *v = k ? id->remote : id->local;
		uint32_t n = k ? id->nremote : id->nlocal;
		uint32_t bound = k ? pg->remote_blocks : pg->local_blocks;

		for (i = 0; i < n; i++)
			if (v[i] >= bound)
				die("cannot emit the request: %s: group %u: %s id %u (entry %u of %s) is not below %u, the %s engine's %s in group %u",
				    kvp_strerror(-ERANGE), g,
				    k ? "remote" : "local", v[i], i + 1,
				    ids_origin(o, !k, g, from, sizeof(from)),
				    bound, k ? "remote" : "local",
				    pg->kind == KVP_GROUP_STATE ?
					    "state pages" :
					    "blocks",
				    g);
	}
}

void make_request(const struct opts *o, const kvp_plan *plan,
		  const struct kvp_plan_group *pg, uint32_t ngroups,
		  struct request *rq)
{
	uint32_t g, i, maxids = 1, maxw, maxs;
	int n;

	if (o->nlids > ngroups || o->nrids > ngroups)
		usage_error("--%s-ids given %u times; the plan has %u group%s",
			    o->nlids > ngroups ? "local" : "remote",
			    o->nlids > ngroups ? o->nlids : o->nrids, ngroups,
			    PLURAL(ngroups));
	for (g = 0; g < ngroups; g++) {
		struct kvp_ids *id = &rq->ids[g];

		id->tokens = o->tokens;
		if (g < o->nrids) {
			id->remote = o->rids[g].id;
			id->nremote = o->rids[g].n;
		} else if (o->have_request) {
			id->remote = iota(0, o->request);
			id->nremote = o->request;
		} else {
			usage_error("group %u has no remote ids: give --request N or --remote-ids",
				    g);
		}
		if (g < o->nlids) {
			id->local = o->lids[g].id;
			id->nlocal = o->lids[g].n;
		} else if (pg[g].kind == KVP_GROUP_STATE) {
			id->local = iota(0, id->nremote);
			id->nlocal = id->nremote;
		} else {
			uint64_t t = o->tokens ? o->tokens :
						 (uint64_t)id->nremote *
							 pg[g].remote_tokens;
			uint64_t nl = (t + pg[g].local_tokens - 1) /
				      pg[g].local_tokens;

			if (o->hit > nl)
				usage_error("--hit %u: group %u has only %" PRIu64
					    " local blocks",
					    o->hit, g, nl);
			if (nl > UINT32_MAX)
				usage_error("--tokens: too many blocks");
			id->local = iota(o->hit, (uint32_t)(nl - o->hit));
			id->nlocal = (uint32_t)(nl - o->hit);
		}
		group_need(&pg[g], id, &rq->need[g]);
		if (pg[g].kind != KVP_GROUP_STATE &&
		    rq->need[g].tokens >
			    (uint64_t)id->nremote * pg[g].remote_tokens)
			usage_error("--tokens %" PRIu64
				    ": group %u's %u remote blocks hold %" PRIu64
				    " tokens",
				    o->tokens, g, id->nremote,
				    (uint64_t)id->nremote *
					    pg[g].remote_tokens);
		if (pg[g].kind != KVP_GROUP_STATE &&
		    id->nlocal > rq->need[g].lend)
			usage_error("group %u: %u local ids, but the sequence spans %u local blocks",
				    g, id->nlocal, rq->need[g].lend);
		if (pg[g].kind == KVP_GROUP_STATE &&
		    id->nlocal != id->nremote)
			usage_error("group %u (state): %u local ids and %u remote ids: a state group pairs them one to one",
				    g, id->nlocal, id->nremote);
		check_range(o, &pg[g], id, g);
		if (id->nlocal > maxids)
			maxids = id->nlocal;
		if (id->nremote > maxids)
			maxids = id->nremote;
	}
	kvp_plan_emit_bound(plan, maxids, &maxw, &maxs);
	rq->wr = xcalloc(maxw, sizeof(*rq->wr));
	rq->sge = xcalloc(maxs, sizeof(*rq->sge));
	if (o->range)
		n = emit_range(o->range, plan, rq, maxw, maxs);
	else
		n = kvp_plan_emit(plan, rq->ids, rq->wr, maxw, rq->sge, maxs,
				  NULL);
	if (n < 0)
		die("cannot emit the request: %s%s", kvp_strerror(n),
		    n == -EINVAL ? " (more local ids than the remote blocks cover, more tokens than the remote blocks hold, or state lists of unequal length)" :
		    n == -ERANGE ? " (ids must be below --num-blocks; state groups count fewer, larger blocks)" :
				   "");
	rq->nwr = (uint32_t)n;
	for (i = 0; i < rq->nwr; i++) {
		rq->bytes += rq->wr[i].len;
		rq->bytes_group[rq->wr[i].group] += rq->wr[i].len;
		rq->wrs_group[rq->wr[i].group]++;
	}
	rq->naive = naive_wrs(plan, pg, rq->ids, rq->naive_group);
	rq->overlap = local_overlap(rq);
	if (rq->overlap)
		fprintf(stderr,
			PROG ": warning: the request writes some local bytes twice (groups %u and %u, local region %u): groups that pool memory need disjoint ids (--local-ids)\n",
			rq->overlap_g[0], rq->overlap_g[1], rq->overlap_region);
}

void free_request(struct request *rq, const struct opts *o, uint32_t ngroups)
{
	uint32_t g;

	/* The lists given on the command line belong to *o. */
	for (g = 0; g < ngroups; g++) {
		if (g >= o->nlids)
			free((void *)rq->ids[g].local);
		if (g >= o->nrids)
			free((void *)rq->ids[g].remote);
	}
	free(rq->wr);
	free(rq->sge);
}
