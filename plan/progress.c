// SPDX-License-Identifier: MIT
/*
 * Streaming progress: which parts of a request became readable between two
 * progresses of a producer rank (kvp_progress_ranges()). Pure arithmetic:
 * a progress is a step function of the layer, tokens_cur below layers_cur
 * and tokens_all from there on, so two of them differ on at most three
 * layer intervals.
 */
#include <errno.h>
#include <string.h>

#include "internal.h"

/* The tokens written in layer l. */
static uint64_t ready(const struct kvp_progress *p, uint32_t l)
{
	return l < p->layers_cur ? p->tokens_cur : p->tokens_all;
}

/* Where a progress steps: its layers_cur, or 0 when it has no step. */
static uint32_t step(const struct kvp_progress *p)
{
	return p->tokens_cur > p->tokens_all ? p->layers_cur : 0;
}

static int progress_ok(const struct kvp_progress *p)
{
	return p && !p->comp_mask && p->tokens_all <= p->tokens_cur;
}

int kvp_progress_ranges(const struct kvp_progress *prev,
			const struct kvp_progress *next,
			struct kvp_emit_range out[3])
{
	struct kvp_progress a, b;
	uint32_t cut[4], i, n = 0;
	struct kvp_emit_range r[3];

	if (!out || !progress_ok(prev) || !progress_ok(next))
		return -EINVAL;
	/* Without a step, layers_cur says nothing: make it 0. */
	a = *prev;
	b = *next;
	a.layers_cur = step(prev);
	b.layers_cur = step(next);
	cut[0] = 0;
	cut[1] = a.layers_cur < b.layers_cur ? a.layers_cur : b.layers_cur;
	cut[2] = a.layers_cur < b.layers_cur ? b.layers_cur : a.layers_cur;
	cut[3] = UINT32_MAX;
	for (i = 0; i < 3; i++) {
		uint64_t from, to;

		if (cut[i] == cut[i + 1])
			continue;
		from = ready(&a, cut[i]);
		to = ready(&b, cut[i]);
		if (to < from)
			return -ERANGE;
		if (to == from)
			continue;
		/* The next interval grew by the same tokens: one range. */
		if (n && r[n - 1].layer1 == cut[i] && r[n - 1].tok0 == from &&
		    r[n - 1].tok1 == to) {
			r[n - 1].layer1 = cut[i + 1];
			continue;
		}
		memset(&r[n], 0, sizeof(r[n]));
		r[n].layer0 = cut[i];
		r[n].layer1 = cut[i + 1];
		r[n].tok0 = from;
		r[n].tok1 = to;
		n++;
	}
	memcpy(out, r, n * sizeof(*r));
	return (int)n;
}
