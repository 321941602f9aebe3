// SPDX-License-Identifier: MIT
/*
 * A plan's accessors: its summary, sources and notifications, and each
 * group, stream and piece as the public structs describe them (what the
 * tools print and the Python binding mirrors).
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

void kvp_plan_get_info(const kvp_plan *p, struct kvp_plan_info *info)
{
	if (!info)
		return;
	if (!p) {
		memset(info, 0, sizeof(*info));
		return;
	}
	info->ngroups = p->ngroups;
	info->nsrc = p->nsrc;
	info->nnotify = p->nnotify;
	info->nstreams = p->nstreams;
	info->npieces = p->npieces;
	info->local_tp = p->local_tp;
	info->local_rank = p->local_rank;
	info->remote_tp = p->remote_tp;
	info->max_sge = p->max_sge;
	info->max_len = p->max_len;
	info->bytes = p->bytes;
}

int kvp_plan_source(const kvp_plan *p, uint32_t i)
{
	return p && i < p->nsrc ? p->src[i] : -EINVAL;
}

int kvp_plan_notify(const kvp_plan *p, uint32_t i)
{
	return p && i < p->nnotify ? p->notify[i] : -EINVAL;
}

int kvp_plan_get_group(const kvp_plan *p, uint32_t g, struct kvp_plan_group *o)
{
	const struct kvp_pgroup *pg;

	if (!p || !o || g >= p->ngroups)
		return -EINVAL;
	pg = &p->groups[g];
	o->kind = pg->kind;
	o->local_tokens = pg->ltok;
	o->remote_tokens = pg->rtok;
	o->period_tokens = pg->period;
	o->local_per_period = pg->lper;
	o->remote_per_period = pg->rper;
	o->local_blocks = pg->lblocks;
	o->remote_blocks = pg->rblocks;
	o->src_mask = p->nsrc > 64 ? ~0ull : pg->src_mask;
	return 0;
}

int kvp_plan_get_stream(const kvp_plan *p, uint32_t i,
			struct kvp_plan_stream *o)
{
	const struct kvp_pstream *s;

	if (!p || !o || i >= p->nstreams)
		return -EINVAL;
	s = &p->streams[i];
	o->src = s->src;
	o->group = p->sets[s->set].group;
	o->local_view = s->lview;
	o->remote_view = s->rview;
	o->local_region = p->lviews[s->lview].region;
	o->remote_region = p->rviews[s->rview].region;
	o->piece_first = p->sets[s->set].first;
	o->npieces = p->sets[s->set].count;
	o->bytes_per_period = p->sets[s->set].bytes;
	o->layer = p->rlayer[s->rview];
	o->pad = 0;
	return 0;
}

int kvp_plan_stream_gather(const kvp_plan *p, uint32_t i)
{
	uint32_t g;

	if (!p || i >= p->nstreams)
		return -EINVAL;
	g = p->streams[i].gather;
	if (g == GATHER_MEMBER)
		return 0;
	return g ? (int)p->gathers[g - 1].n : 1;
}

int kvp_plan_get_piece(const kvp_plan *p, uint32_t i,
		       struct kvp_plan_piece *o)
{
	const struct kvp_piece *q;

	if (!p || !o || i >= p->npieces)
		return -EINVAL;
	q = &p->pieces[i];
	o->remote_offset = q->roff;
	o->local_offset = q->loff;
	o->len = q->len;
	o->remote_block = q->rbi;
	o->local_block = q->lbi;
	return 0;
}
