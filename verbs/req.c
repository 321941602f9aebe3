// SPDX-License-Identifier: MIT
/*
 * The consumer's requests, from pull to free: the table of requests in
 * flight by (engine, req_id), DONE or FAILED once every source's data is
 * in, and the slot's return once its event is delivered and its
 * notifications completed (or were dropped with their connection).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* ---- requests in flight by (engine, req_id) ----------------------------- */

static inline uint32_t inflight_hash(uint64_t req_id, uint32_t eng)
{
	uint64_t h = (req_id ^ ((uint64_t)eng << 48)) * 0x9e3779b97f4a7c15ull;

	return (uint32_t)(h >> 32);
}

/* The table entry of (eng, req_id), or of the empty entry where it would
 * go. The table is never full: at most max_inflight of its at least
 * 2 * max_inflight entries are used. */
uint32_t kvp__inflight_find(const kvp_agent *a, uint32_t eng, uint64_t req_id)
{
	uint32_t i = inflight_hash(req_id, eng) & a->pq_mask, s;

	while ((s = a->inflight[i]) != 0) {
		const struct kvp_req *r = &a->reqs[s - 1];

		if (r->req_id == req_id && r->eng == eng)
			break;
		i = (i + 1) & a->pq_mask;
	}
	return i;
}

/* Removes slot's entry, shifting back the entries of its probe run that
 * hashed before the hole. */
static void inflight_del(kvp_agent *a, const struct kvp_req *r)
{
	uint32_t i = kvp__inflight_find(a, r->eng, r->req_id), j = i, h, s;

	if (!a->inflight[i])
		return;
	for (;;) {
		a->inflight[i] = 0;
		for (;;) {
			j = (j + 1) & a->pq_mask;
			s = a->inflight[j];
			if (!s)
				return;
			h = inflight_hash(a->reqs[s - 1].req_id,
					  a->reqs[s - 1].eng) & a->pq_mask;
			/* Stays when its home lies cyclically in (i, j]. */
			if (i <= j ? (i < h && h <= j) : (i < h || h <= j))
				continue;
			break;
		}
		a->inflight[i] = s;
		i = j;
	}
}

static void req_free(kvp_agent *a, struct kvp_req *r)
{
	inflight_del(a, r);
	r->state = RQ_FREE;
	r->next_free = a->free_req;
	a->free_req = (uint32_t)(r - a->reqs);
}

static void req_maybe_free(kvp_agent *a, struct kvp_req *r)
{
	if (r->delivered && !r->notes && r->state == RQ_FINISHED)
		req_free(a, r);
}

/* The request's event: DONE once every source's data is in, FAILED when
 * one failed first (the others then completed or were flushed: no READ
 * of it can land any more). */
static void req_finish(kvp_agent *a, struct kvp_req *r)
{
	struct kvp_eng *e = &a->engs[r->eng];
	const uint64_t now = kvp__now_ns();
	struct kvp_event ev;

	r->state = RQ_FINISHED;
	/* Every pull once, when its event is queued (kvp_agent_metrics()). */
	kvp__hist_add(&a->obs.pull[r->stream ? OBS_STREAM : OBS_BULK]
				  [r->status ? OBS_FAILED : OBS_DONE],
		      now - r->t0);
	memset(&ev, 0, sizeof(ev));
	ev.type = r->status ? KVP_EV_FAILED : KVP_EV_DONE;
	ev.status = r->status;
	ev.req_id = r->req_id;
	ev.rank = (uint32_t)(r - a->reqs); /* the slot, until delivered */
	ev.engine = kvp__engine_handle(a, e);
	ev.engine_id = e->engine_id;
	if (!r->status) {
		ev.reads = r->reads;
		ev.bytes = r->bytes;
		ev.elapsed_ns = now - r->t0;
		if (r->stream && r->t_end)
			kvp__hist_add(&a->obs.exposed, now - r->t_end);
		a->st.done++;
		e->st.done++;
	} else {
		struct kvp_why w = { 0 };

		/* The engine's reason when it went down for it; else the
		 * errno's. */
		kvp__why_errno(&w, r->status);
		ev.reason = r->reason	      ? r->reason :
			    e->why.reason ? e->why.reason :
					    w.reason;
		ev.peer_reason = e->why.peer_reason;
		if (ev.reason == KVP_REASON_LEASE)
			a->st.lease_fails++;
		a->st.failed++;
		e->st.failed++;
	}
	kvp__ev_push(a, &ev);
}

void kvp__req_data_in(kvp_agent *a, struct kvp_req *r, int err)
{
	if (err && !r->status)
		r->status = err;
	if (!--r->pending)
		req_finish(a, r);
}

void kvp__req_arrived(kvp_agent *a, struct kvp_req *r, uint32_t layers)
{
	struct kvp_eng *e = &a->engs[r->eng];
	struct kvp_event ev;

	/* Never at the cost of DONE's room: a later one says more. */
	if (r->state != RQ_ACTIVE || r->reason || r->status ||
	    kvp__ev_room(a) <= (int)(a->ev_cap / 2))
		return; /* failing (a stall, an error), or no room */
	r->arrived = layers;
	memset(&ev, 0, sizeof(ev));
	ev.type = KVP_EV_ARRIVED;
	ev.req_id = r->req_id;
	ev.engine = kvp__engine_handle(a, e);
	ev.engine_id = e->engine_id;
	ev.layers = layers;
	a->st.arrivals++;
	kvp__ev_push(a, &ev);
}

void kvp__req_note_done(kvp_agent *a, struct kvp_req *r)
{
	r->notes--;
	req_maybe_free(a, r);
}

void kvp__req_delivered(kvp_agent *a, struct kvp_event *ev)
{
	struct kvp_req *r = &a->reqs[ev->rank];
	uint32_t g;

	ev->rank = 0;
	r->delivered = 1;
	if (ev->type == KVP_EV_FAILED) {
		/* Local lists only: nothing is emitted for it any more. */
		for (g = 0; g < a->li.ngroups; g++) {
			r->gids[g].remote = NULL;
			r->gids[g].nremote = 0;
		}
		ev->ids = r->gids;
		ev->ngroups = a->li.ngroups;
		r->state = RQ_REPORTED;
		a->nreq_reported++;
		return;
	}
	req_maybe_free(a, r);
}

/* FAILED slots lend their ids until the poll after the one that reported
 * them. */
void kvp__req_reap(kvp_agent *a)
{
	uint32_t i;

	if (!a->nreq_reported)
		return;
	for (i = 0; i < a->max_inflight; i++) {
		struct kvp_req *r = &a->reqs[i];

		if (r->state != RQ_REPORTED)
			continue;
		r->state = RQ_FINISHED;
		req_maybe_free(a, r);
	}
	a->nreq_reported = 0;
}
