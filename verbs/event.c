// SPDX-License-Identifier: MIT
/*
 * The event queue kvp_agent_poll() hands out: every floor above queues
 * into it, it calls nothing.
 *
 * The queue never overflows by construction: request events are bounded by
 * max_inflight (a consumer slot or a producer's held count is only given
 * back when its event is delivered), DISCONNECTED events by the connection
 * slots (producers refuse new connections while too many are queued).
 */
#include "internal.h"

int kvp__ev_room(const kvp_agent *a)
{
	return (int)(a->ev_cap - (a->ev_tail - a->ev_head));
}

void kvp__ev_push(kvp_agent *a, const struct kvp_event *ev)
{
	if (kvp_unlikely(!kvp__ev_room(a)))
		return; /* unreachable: see above */
	a->evq[a->ev_tail % a->ev_cap] = *ev;
	a->ev_tail++;
	if (kvp_unlikely(a->obs.log_level))
		kvp__log_event(a, ev);
}
