// SPDX-License-Identifier: MIT
/*
 * Plans shared by geometry: a consumer's producer engines of one layout
 * geometry (everything but engine id, rank and region keys) share one
 * compiled plan, from a cache of max_peers entries that evicts the least
 * recently used plan no engine holds.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

void kvp__pc_free(struct kvp_pcache *pc)
{
	kvp_plan_destroy(pc->plan);
	kvp_layout_destroy(pc->geo);
	free(pc->note_rank);
	free(pc->note_src);
	memset(pc, 0, sizeof(*pc));
}

/* Whether two layouts have the same geometry: everything a plan depends
 * on, that is everything but the engine id, the rank and the region
 * keys (a shard's length is the same on every rank, so the field
 * descriptions are too). */
int kvp__geo_equal(const kvp_layout *x, const kvp_layout *y)
{
	struct kvp_layout_info xi, yi;
	uint32_t i;

	kvp_layout_get_info(x, &xi);
	kvp_layout_get_info(y, &yi);
	if (xi.tp_size != yi.tp_size || xi.ngroups != yi.ngroups ||
	    xi.nregions != yi.nregions || xi.nviews != yi.nviews ||
	    xi.nfields != yi.nfields ||
	    kvp_layout_compat_hash(x) != kvp_layout_compat_hash(y))
		return 0;
	for (i = 0; i < xi.nregions; i++) {
		uint64_t p, q;

		if (kvp_layout_get_region(x, i, &p) ||
		    kvp_layout_get_region(y, i, &q) || p != q)
			return 0;
	}
	for (i = 0; i < xi.ngroups; i++) {
		struct kvp_group_desc p, q;

		if (kvp_layout_get_group(x, i, &p) ||
		    kvp_layout_get_group(y, i, &q) || p.kind != q.kind ||
		    p.block_tokens != q.block_tokens)
			return 0;
	}
	for (i = 0; i < xi.nviews; i++) {
		struct kvp_view_desc p, q;

		if (kvp_layout_get_view(x, i, &p) ||
		    kvp_layout_get_view(y, i, &q) || p.group != q.group ||
		    p.region != q.region || p.layer != q.layer ||
		    p.num_blocks != q.num_blocks || p.offset != q.offset ||
		    p.stride != q.stride)
			return 0;
	}
	for (i = 0; i < xi.nfields; i++) {
		struct kvp_field_desc p, q;
		uint32_t pv, qv;

		/* No padding in the struct: memcmp compares the fields. */
		memset(&p, 0, sizeof(p));
		memset(&q, 0, sizeof(q));
		if (kvp_layout_get_field(x, i, &pv, &p) ||
		    kvp_layout_get_field(y, i, &qv, &q) || pv != qv ||
		    memcmp(&p, &q, sizeof(p)))
			return 0;
	}
	return 1;
}

/* The longest access every region of layout l allows: the MR window of
 * those registered as several MRs (kvp_layout_set_region_keys()), else
 * UINT32_MAX. */
uint32_t kvp__keys_window(const kvp_layout *l)
{
	struct kvp_layout_info li;
	uint32_t i, shift, w = UINT32_MAX;
	uint64_t addr;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nregions; i++)
		if (kvp_layout_get_region_keys(l, i, &addr, &shift, NULL, 0) >
			    0 &&
		    shift && KVP_MR_WINDOW(shift) < w)
			w = (uint32_t)KVP_MR_WINDOW(shift);
	return w;
}

/* The plan for engines of ref's geometry: from the cache, or compiled and
 * cached (evicting the least recently used plan no engine holds). Its
 * READs are no longer than the port allows, the slice asked for, and the
 * MR window of any region on either side registered as several MRs. */
int kvp__plan_resolve(kvp_agent *a, struct kvp_eng *e)
{
	uint64_t h = kvp_layout_compat_hash(e->ref);
	struct kvp_pcache *pc, *victim = NULL;
	struct kvp_plan_attr pattr;
	uint32_t i, k, n, max_len = a->lim.max_len, w;
	char msg[KVP_WHY_LEN];
	int err, r;

	if (a->mr_window < max_len)
		max_len = a->mr_window;
	w = kvp__keys_window(e->ref);
	if (w < max_len)
		max_len = w;

	for (i = 0; i < a->max_peers; i++) {
		pc = &a->pcache[i];
		if (!pc->plan) {
			if (!victim || victim->plan)
				victim = pc;
			continue;
		}
		if (pc->hash == h && pc->max_len == max_len &&
		    kvp__geo_equal(pc->geo, e->ref))
			goto hit;
		if (!pc->refs && (!victim || (victim->plan &&
					      pc->used < victim->used)))
			victim = pc;
	}
	if (!victim)
		return -ENOSPC; /* unreachable: one plan per engine at most */
	pc = victim;
	kvp__pc_free(pc);
	memset(&pattr, 0, sizeof(pattr));
	pattr.max_sge = a->max_sge;
	/* No READ longer than the port's message size or the slice asked
	 * for (limits.c). */
	pattr.comp_mask = KVP_PLAN_ATTR_MAX_LEN | KVP_PLAN_ATTR_FLAGS;
	pattr.max_len = max_len;
	pc->max_len = max_len;
	pattr.flags = a->plan_flags;
	if (kvp_layout_compat_hash(e->ref) != kvp_layout_compat_hash(a->layout))
		return kvp__why(&e->why, -EPROTO, KVP_REASON_MODEL,
				"another model: compatibility hash %016llx, ours %016llx",
				(unsigned long long)kvp_layout_compat_hash(e->ref),
				(unsigned long long)kvp_layout_compat_hash(a->layout));
	msg[0] = 0;
	err = kvp_plan_compile(a->layout, e->ref, &pattr, &pc->plan, msg,
			       sizeof(msg));
	if (err == -ENOMEM)
		return err;
	if (err)
		return kvp__why(&e->why, -EPROTO,
				err == -EFBIG ? KVP_REASON_PLAN_COST :
						KVP_REASON_LAYOUT,
				"%s", msg[0] ? msg : kvp_strerror(err));
	kvp_plan_get_info(pc->plan, &pc->pi);
	n = pc->pi.nnotify;
	pc->note_rank = calloc(n + 1, sizeof(*pc->note_rank));
	pc->note_src = calloc(n + 1, sizeof(*pc->note_src));
	err = -ENOMEM;
	if (!pc->note_rank || !pc->note_src)
		goto err_pc;
	err = kvp_layout_clone(e->ref, &pc->geo);
	if (err)
		goto err_pc;
	err = -EPROTO;
	for (k = 0; k < n; k++) {
		r = kvp_plan_notify(pc->plan, k);
		if (r < 0 || (uint32_t)r >= pc->pi.remote_tp)
			goto err_pc;
		pc->note_rank[k] = (uint32_t)r;
		pc->note_src[k] = NO_SRC;
		for (i = 0; i < pc->pi.nsrc; i++)
			if (kvp_plan_source(pc->plan, i) == r)
				pc->note_src[k] = i;
	}
	/* A source outside the notify list would be a planner bug. */
	for (i = 0; i < pc->pi.nsrc; i++) {
		for (k = 0; k < n; k++)
			if (pc->note_src[k] == i)
				break;
		if (k == n)
			goto err_pc;
	}
	/* The READ window's first estimate: the largest bytes per piece of
	 * any stream (coalesced READs are longer; the doorbells' averages
	 * correct it). */
	pc->rd_est = 0;
	for (i = 0; i < pc->pi.nstreams; i++) {
		struct kvp_plan_stream ps;

		if (!kvp_plan_get_stream(pc->plan, i, &ps) && ps.npieces &&
		    ps.bytes_per_period / ps.npieces > pc->rd_est)
			pc->rd_est = ps.bytes_per_period / ps.npieces;
	}
	pc->hash = h;
	a->st.plan_compiles++;
	e->plan_cached = 0;
	goto take;
hit:
	a->st.plan_hits++;
	e->plan_cached = 1;
take:
	pc->refs++;
	pc->used = ++a->pc_clock;
	e->pc = pc;
	kvp__eng_window(a, e, pc->rd_est);
	return 0;

err_pc:
	kvp__pc_free(pc);
	return err;
}
