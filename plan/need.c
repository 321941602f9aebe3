// SPDX-License-Identifier: MIT
/*
 * What a request needs of each group of a plan (struct need, internal.h):
 * its id lists checked against the group (O(1), no id read) and then
 * every id against its bound, the periods a token range clips it to, and
 * the bound on the WRs and SGEs an emission may write. Called once per
 * emission call, never per piece: the hot loops stay in emit.c.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "internal.h"

static int check_ids(const uint32_t *ids, uint32_t n, uint32_t bound)
{
	uint32_t i, bad = 0;

	for (i = 0; i < n; i++)
		bad |= ids[i] >= bound;
	return bad ? -ERANGE : 0;
}

/* The need of one group: O(1), no id read. -EINVAL for lists that do not
 * fit the group (NULL with a length, unequal STATE lists, more local blocks
 * than the sequence spans, tokens past the remote blocks). */
int kvp__group_need(const struct kvp_pgroup *pg, const struct kvp_ids *id,
		    struct need *n)
{
	uint64_t tokens, nl;

	if ((id->nlocal && !id->local) || (id->nremote && !id->remote))
		return -EINVAL;
	if (pg->kind == KVP_GROUP_STATE) {
		if (id->nlocal != id->nremote)
			return -EINVAL;
		n->skip = 0;
		n->lend = n->rend = id->nlocal;
		n->tokens = 0;
	} else {
		tokens = id->tokens ? id->tokens :
				      (uint64_t)id->nremote * pg->rtok;
		if (tokens > (uint64_t)id->nremote * pg->rtok)
			return -EINVAL;
		nl = (tokens + pg->ltok - 1) / pg->ltok;
		if (id->nlocal > nl)
			return -EINVAL;
		n->skip = (uint32_t)(nl - id->nlocal);
		n->lend = (uint32_t)nl;
		n->rend = (uint32_t)((tokens + pg->rtok - 1) / pg->rtok);
		n->tokens = tokens;
	}
	n->k0 = n->skip / pg->lper;
	n->k1 = id->nlocal ? (n->lend + pg->lper - 1) / pg->lper : n->k0;
	n->ka = 0;
	n->kb = UINT32_MAX;
	return 0;
}

/* Clips a group's need to the periods of range r: those whose last token,
 * min((k + 1) * period, tokens), lies in (tok0, tok1]; a STATE group's
 * blocks all in the range that reaches KVP_TOKENS_END, none in others. */
void kvp__need_clip(const struct kvp_pgroup *pg, struct need *n,
		    const struct kvp_emit_range *r)
{
	uint64_t ka, kb;

	if (pg->kind == KVP_GROUP_STATE) {
		if (r->tok1 != KVP_TOKENS_END || r->tok0 == KVP_TOKENS_END)
			n->ka = n->kb = 0;
		return;
	}
	ka = !r->tok0 ? 0 : r->tok0 >= n->tokens ? UINT32_MAX :
						    r->tok0 / pg->period;
	kb = r->tok1 >= n->tokens ? UINT32_MAX : r->tok1 / pg->period;
	n->ka = ka > UINT32_MAX ? UINT32_MAX : (uint32_t)ka;
	n->kb = kb > UINT32_MAX ? UINT32_MAX : (uint32_t)kb;
}

/* Every group's need, then every id against its bound: all -EINVAL cases
 * before any -ERANGE one. */
int kvp__plan_prepare(const kvp_plan *p, const struct kvp_ids *ids,
		      struct need *nd)
{
	uint32_t g;
	int err;

	for (g = 0; g < p->ngroups; g++) {
		err = kvp__group_need(&p->groups[g], &ids[g], &nd[g]);
		if (err)
			return err;
	}
	for (g = 0; g < p->ngroups; g++) {
		const struct kvp_pgroup *pg = &p->groups[g];

		if (check_ids(ids[g].local, ids[g].nlocal, pg->lblocks) ||
		    check_ids(ids[g].remote, ids[g].nremote, pg->rblocks))
			return -ERANGE;
	}
	return 0;
}

void kvp_plan_emit_bound(const kvp_plan *p, uint32_t max_ids,
			 uint32_t *max_wrs, uint32_t *max_sges)
{
	uint64_t n = 0;
	uint32_t i;

	for (i = 0; p && i < p->nstreams; i++) {
		const struct kvp_pset *s = &p->sets[p->streams[i].set];
		uint32_t lper = p->groups[s->group].lper;
		uint64_t periods = (uint64_t)max_ids / lper + 2;

		n += periods * s->count;
	}
	if (n > UINT32_MAX)
		n = UINT32_MAX;
	if (max_wrs)
		*max_wrs = (uint32_t)n;
	if (max_sges)
		*max_sges = (uint32_t)n;
}
