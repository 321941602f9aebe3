// SPDX-License-Identifier: MIT
/*
 * The consumer's pulls: the public calls, the checks of a pull's ids and
 * the reason each refusal gives, stalls, and the request slots and
 * posting scratch allocated once per agent.
 *
 * A pull checks its ids, copies them into its request slot and queues one
 * chunk on each connection of the engine's notify list: that producer
 * rank's READs (if it is a source) and then the notification; post.c
 * emits and posts them as send queue room allows.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NO_REQ UINT32_MAX

/* Drops the stall FIFO's entries of requests no longer in flight. */
static void pq_compact(kvp_agent *a)
{
	uint32_t i, t = a->pq_head;

	for (i = a->pq_head; i != a->pq_tail; i++) {
		uint32_t slot = a->pq[i & a->pq_mask];
		uint32_t seq = a->pq_seq[i & a->pq_mask];
		const struct kvp_req *r = &a->reqs[slot];

		if (r->state != RQ_ACTIVE || r->seq != seq)
			continue;
		a->pq[t & a->pq_mask] = slot;
		a->pq_seq[t & a->pq_mask] = seq;
		t++;
	}
	a->pq_tail = t;
}

/* Why the plan refused ids (kvp_plan_emit_check()'s err): off the hot
 * path, group by group, the first rule broken. */
static int ids_why(kvp_agent *a, const kvp_plan *plan,
		   const struct kvp_ids *ids, int err)
{
	struct kvp_plan_group pg;
	uint32_t g;

	for (g = 0; g < a->li.ngroups; g++) {
		const struct kvp_ids *id = &ids[g];
		uint64_t cover;

		if (kvp_plan_get_group(plan, g, &pg))
			break;
		if ((id->nlocal && !id->local) || (id->nremote && !id->remote))
			return kvp__why(&a->last, err, KVP_REASON_ARGS,
					"group %u: a NULL id list of non-zero length",
					g);
		if (pg.kind == KVP_GROUP_STATE) {
			if (id->nlocal != id->nremote)
				return kvp__why(&a->last, err,
						KVP_REASON_IDS_UNEVEN,
						"group %u (state): %u local ids, %u remote",
						g, id->nlocal, id->nremote);
		} else {
			cover = (uint64_t)id->nremote * pg.remote_tokens;
			if (id->tokens > cover)
				return kvp__why(&a->last, err,
						KVP_REASON_IDS_TOKENS,
						"group %u: %llu tokens, %u remote blocks hold %llu",
						g, (unsigned long long)id->tokens,
						id->nremote,
						(unsigned long long)cover);
			cover = id->tokens ? id->tokens : cover;
			if ((uint64_t)id->nlocal * pg.local_tokens >=
			    cover + pg.local_tokens)
				return kvp__why(&a->last, err,
						KVP_REASON_IDS_UNEVEN,
						"group %u: %u local ids for %llu tokens of %u remote ids",
						g, id->nlocal,
						(unsigned long long)cover,
						id->nremote);
		}
		if (err == -ERANGE) {
			uint32_t i;

			for (i = 0; i < id->nlocal; i++)
				if (id->local[i] >= pg.local_blocks)
					return kvp__why(&a->last, err,
							KVP_REASON_IDS_RANGE,
							"group %u: local id %u, %u blocks",
							g, id->local[i],
							pg.local_blocks);
			for (i = 0; i < id->nremote; i++)
				if (id->remote[i] >= pg.remote_blocks)
					return kvp__why(&a->last, err,
							KVP_REASON_IDS_RANGE,
							"group %u: remote id %u, the producer has %u blocks",
							g, id->remote[i],
							pg.remote_blocks);
		}
	}
	return kvp__call_err(&a->last, err);
}

/* Streaming: source s's chunk of request slot `slot` starts with its
 * FOLLOW, its stripe waits for progress, and the record the producer
 * rank will write is cleared. */
static void stream_source(kvp_agent *a, struct kvp_eng *e, struct kvp_req *r,
			  uint32_t slot, uint32_t s, uint32_t nsrc)
{
	struct kvp_sprog *sp = &e->sprog[slot * nsrc + s];
	uint32_t ci = kvp__src_conn(e, s) - a->nprod;
	uint8_t *rec = a->ptab + ((size_t)ci * 2 * a->max_inflight + 2 * slot +
				  (r->uses & 1)) * KVP_PROG_REC;

	memset(sp, 0, sizeof(*sp));
	sp->t_last = r->t0;
	sp->active = 1;
	memset(&e->stripes[slot * nsrc + s].pos, 0,
	       sizeof(struct kvp_emit_pos));
	memset(rec, 0, KVP_PROG_REC);
}

static int pull(kvp_agent *a, struct kvp_eng *e, uint64_t req_id,
		const struct kvp_ids *ids, const int stream)
{
	const struct kvp_pcache *pc = e->pc;
	const uint32_t ngroups = a->li.ngroups, mi = a->max_ids;
	const uint32_t nc = pc->pi.nnotify * e->nq, nsrc = pc->pi.nsrc;
	const uint32_t eng = (uint32_t)(e - a->engs);
	uint32_t slot, g, k, q, at;
	struct kvp_req *r;
	uint8_t *note;
	int err;

	for (g = 0; g < ngroups; g++)
		if (ids[g].nlocal > mi || ids[g].nremote > mi)
			return kvp__why(&a->last, -EINVAL, KVP_REASON_IDS_MAX,
					"group %u: %u local and %u remote ids, max_ids %u",
					g, ids[g].nlocal, ids[g].nremote, mi);
	/* The same request twice while in flight would be released by the
	 * producer after one of them: the other could read reused blocks. */
	at = kvp__inflight_find(a, eng, req_id);
	if (kvp_unlikely(a->inflight[at]))
		return kvp__why(&a->last, -EALREADY, KVP_REASON_IN_FLIGHT,
				"request %llu is being pulled from this engine",
				(unsigned long long)req_id);
	if (kvp_unlikely(a->free_req == NO_REQ))
		return kvp__why_static(&a->last, -EBUSY, KVP_REASON_BUSY,
				       "max_inflight requests held");
	for (k = 0; k < nc; k++) {
		const struct kvp_conn *c;

		if (e->note_conn[k] == NO_CONN)
			continue;
		c = &a->conns[e->note_conn[k]];
		if (kvp_unlikely(c->c_tail - c->c_head > a->chunk_mask))
			return kvp__why_static(&a->last, -EBUSY,
					       KVP_REASON_BUSY,
					       "a producer rank's request queue is full");
	}
	if (kvp_unlikely(a->pq_tail - a->pq_head > a->pq_mask)) {
		pq_compact(a);
		if (a->pq_tail - a->pq_head > a->pq_mask)
			return kvp__why_static(&a->last, -EBUSY,
					       KVP_REASON_BUSY,
					       "stall queue full");
	}
	err = kvp_plan_emit_check(pc->plan, ids);
	if (kvp_unlikely(err))
		return ids_why(a, pc->plan, ids, err);

	slot = a->free_req;
	r = &a->reqs[slot];
	a->free_req = r->next_free;
	for (g = 0; g < ngroups; g++) {
		struct kvp_ids *d = &r->gids[g];
		uint32_t *l = r->ids + (size_t)g * mi;
		uint32_t *rm = r->ids + ((size_t)ngroups + g) * mi;

		/* A full hit may pass local NULL. */
		if (ids[g].nlocal)
			memcpy(l, ids[g].local,
			       (size_t)ids[g].nlocal * sizeof(uint32_t));
		if (ids[g].nremote)
			memcpy(rm, ids[g].remote,
			       (size_t)ids[g].nremote * sizeof(uint32_t));
		d->local = l;
		d->remote = rm;
		d->nlocal = ids[g].nlocal;
		d->nremote = ids[g].nremote;
		d->tokens = ids[g].tokens;
	}
	note = a->note_buf + (size_t)slot * KVP_NOTE_LEN;
	kvp__put32(note, KVP_NOTE_MAGIC);
	kvp__put32(note + 4, a->li.tp_rank);
	kvp__put64(note + 8, req_id);
	kvp__put64(note + 16, a->li.engine_id);
	kvp__put64(note + 24, 0);
	/* The same, for a producer rank whose lease check failed. */
	memcpy(note + (size_t)2 * a->max_inflight * KVP_NOTE_LEN, note,
	       KVP_NOTE_LEN);
	kvp__put64(note + (size_t)2 * a->max_inflight * KVP_NOTE_LEN + 24,
		   KVP_NOTE_UNHELD);

	r->req_id = req_id;
	r->eng = eng;
	a->inflight[at] = slot + 1;
	r->t0 = kvp__now_ns();
	e->last_used = r->t0; /* the QP budget's LRU key */
	r->bytes = 0;
	r->reads = 0;
	r->state = RQ_ACTIVE;
	r->status = 0;
	r->delivered = 0;
	r->seq = ++a->seq;
	r->notes = pc->pi.nnotify;
	r->pending = 1; /* held until every chunk is queued */
	r->stream = (uint32_t)stream;
	r->uses++;
	r->reason = 0;
	r->arrived = 0;
	r->t_end = 0;
	if (kvp_likely(!stream)) {
		/* the stall FIFO: a streamed pull's bound is its progress */
		a->pq[a->pq_tail & a->pq_mask] = slot;
		a->pq_seq[a->pq_tail & a->pq_mask] = r->seq;
		a->pq_tail++;
	} else {
		for (k = 0; k < nsrc; k++)
			e->sprog[slot * nsrc + k].active = 0;
		/* Once per slot: one that finished and was pulled again
		 * before the scan dropped it is still on the list (so the
		 * list never holds more than max_inflight). */
		if (!r->in_sreq) {
			r->in_sreq = 1;
			a->sreq[a->nsreq++] = slot;
		}
		note = a->note_buf + ((size_t)a->max_inflight + slot) *
					     KVP_NOTE_LEN;
		kvp__put32(note, KVP_FOLLOW_MAGIC);
		kvp__put32(note + 4, a->li.tp_rank);
		kvp__put64(note + 8, req_id);
		kvp__put64(note + 16, a->li.engine_id);
		kvp__put32(note + 24, 2 * slot + (r->uses & 1));
		kvp__put32(note + 28, r->seq);
	}
	for (k = 0; k < pc->pi.nnotify; k++) {
		uint32_t s = pc->note_src[k], sidx = NO_STRIPE;

		/* A rank read from: its READs striped over its queue pairs,
		 * from one cursor. */
		if (s != NO_SRC) {
			struct kvp_stripe *st = &e->stripes[slot * nsrc + s];

			if (!kvp_plan_emit_start(pc->plan, r->gids, s,
						 &st->pos) &&
			    !kvp_plan_emit_done(&st->pos)) {
				sidx = slot * nsrc + s;
				st->left = e->nq;
				st->status = 0;
				st->qmask = 0;
				st->lease = SL_NONE;
				r->pending++;
				if (stream)
					stream_source(a, e, r, slot, s, nsrc);
			}
		}
		/* The first queue pair always (the notification, and a
		 * streamed pull's FOLLOW); the others only when there is
		 * something to read. */
		for (q = 0; q < (sidx != NO_STRIPE ? e->nq : 1); q++) {
			struct kvp_conn *c;
			struct kvp_chunk *ch;

			if (e->note_conn[k * e->nq + q] == NO_CONN)
				continue;
			c = &a->conns[e->note_conn[k * e->nq + q]];
			ch = &c->chunks[c->c_tail++ & a->chunk_mask];
			ch->slot = slot;
			ch->posted = 0;
			ch->stripe = sidx;
			ch->flags = sidx != NO_STRIPE ? CH_READS : 0;
			if (stream && sidx != NO_STRIPE && !q)
				ch->flags |= CH_FOLLOW;
		}
	}
	a->st.pulls++;
	e->st.pulls++;
	if (kvp__log_on(a, KVP_LOG_DEBUG))
		kvp__log_pull(a, r, e->engine_id, kvp__engine_handle(a, e));
	for (k = 0; k < nc; k++)
		if (e->note_conn[k] != NO_CONN)
			kvp__conn_flush(a, &a->conns[e->note_conn[k]]);
	/* Every chunk is queued: the request may finish (at once when no
	 * rank has anything to read: a full prefix hit). */
	kvp__req_data_in(a, r, 0);
	return 0;
}

/* What both pull calls check first: 0, or the refusal. */
static inline int pull_args(kvp_agent *a, const struct kvp_ids *ids)
{
	if (kvp_unlikely(!a))
		return -EINVAL;
	a->last.reason = 0;
	if (kvp_unlikely(!ids || !a->consumer))
		return kvp__why(&a->last, -EINVAL, KVP_REASON_ARGS,
				!ids ? "ids is NULL" : "not a consumer");
	return 0;
}

/* kvp_agent_pull_from() and kvp_agent_pull_stream(). */
static inline int pull_engine(kvp_agent *a, uint32_t engine, uint64_t req_id,
			      const struct kvp_ids *ids, const int stream)
{
	struct kvp_eng *e;
	int err = pull_args(a, ids);

	if (kvp_unlikely(err))
		return err;
	e = kvp__engine_get(a, engine);
	if (kvp_unlikely(!e))
		return kvp__why(&a->last, -ENOENT, KVP_REASON_NO_ENGINE,
				"no engine with handle %u", engine);
	if (kvp_likely(e->state == KVP_ENGINE_UP))
		return pull(a, e, req_id, ids, stream);
	if (e->state == KVP_ENGINE_FAILING)
		return kvp__why(&a->last, -ENOTCONN, KVP_REASON_NOT_UP,
				"engine %u is going down", engine);
	if (e->state == KVP_ENGINE_DOWN) {
		/* On demand: with the addresses and the time it had. */
		err = kvp_agent_reconnect_engine(a, engine, NULL, 0,
						 e->timeout_ms);
		if (err)
			return err;
	}
	return kvp__why_static(&a->last, -EAGAIN, KVP_REASON_NOT_UP,
			       "the engine is connecting");
}

int kvp_agent_pull_from(kvp_agent *a, uint32_t engine, uint64_t req_id,
			const struct kvp_ids *ids)
{
	return pull_engine(a, engine, req_id, ids, 0);
}

int kvp_agent_pull(kvp_agent *a, uint64_t req_id, const struct kvp_ids *ids)
{
	struct kvp_eng *e;
	int err = pull_args(a, ids);

	if (kvp_unlikely(err))
		return err;
	e = kvp__engine_get(a, a->def_eng);
	if (kvp_unlikely(!e || e->state != KVP_ENGINE_UP))
		return kvp__why(&a->last, -ENOTCONN, KVP_REASON_NOT_UP,
				"no engine up (kvp_agent_connect())");
	return pull(a, e, req_id, ids, 0);
}

int kvp_agent_pull_stream(kvp_agent *a, uint32_t engine, uint64_t req_id,
			  const struct kvp_ids *ids)
{
	return pull_engine(a, engine, req_id, ids, 1);
}

/* ---- stalls ------------------------------------------------------------- */

static void stall(kvp_agent *a, struct kvp_eng *e)
{
	if (e->state != KVP_ENGINE_UP)
		return;
	e->st.stalls++;
	a->st.stalls++;
	kvp__why(&e->why, -ETIMEDOUT, KVP_REASON_STALL,
		 "no progress from the producer within stall_ms (%llu ms)",
		 (unsigned long long)(a->stall_ns / 1000000ull));
	kvp__engine_fail(a, e, -ETIMEDOUT);
}

/* ---- streaming: progress records ----------------------------------------- */

/* Source s of streamed request r (slot) on engine e: the producer rank's
 * record, if it holds a new progress; 1 then (sp->seen moved), 0 when not,
 * -EPROTO when it went backwards. */
static int stream_read(kvp_agent *a, struct kvp_eng *e, const struct kvp_req *r,
		       uint32_t slot, struct kvp_sprog *sp, uint32_t s)
{
	const struct kvp_conn *c = &a->conns[kvp__src_conn(e, s)];
	const uint32_t ci = c->idx - a->nprod;
	const uint8_t *rec = a->ptab + ((size_t)ci * 2 * a->max_inflight +
					2 * slot + (r->uses & 1)) *
					       KVP_PROG_REC;
	struct kvp_emit_range rr[3];
	struct kvp_progress p;
	uint8_t b[KVP_PROG_REC];
	uint64_t gen;

	/* The NIC writes the record behind the compiler's back. */
	__asm__ volatile("" ::: "memory");
	memcpy(b, rec, sizeof(b));
	if (kvp__get64(b) != r->seq)
		return 0; /* not written yet (or a torn first write) */
	memset(&p, 0, sizeof(p));
	p.tokens_all = kvp__get64(b + 8);
	p.tokens_cur = kvp__get64(b + 16);
	p.layers_cur = kvp__get32(b + 24);
	gen = kvp__get64(b + 32);
	if (kvp__get64(b + 40) != kvp__prog_check(c->rec_key, r->seq,
						  p.tokens_all, p.tokens_cur,
						  p.layers_cur, gen))
		return 0; /* read while a WRITE landed (or forged): next poll */
	/* Progress of another grant of the request's lease: what we read
	 * so far was held for another. */
	if (sp->gen && gen != sp->gen)
		return -ESTALE;
	sp->gen = gen;
	switch (kvp_progress_ranges(&sp->seen, &p, rr)) {
	case 0:
		return 0;
	case -EINVAL:
	case -ERANGE:
		return -EPROTO;
	default:
		sp->seen = p;
		return 1;
	}
}

/* Flushes source s's queue pairs, the first first: new progress, or a
 * stream stopped. */
static void stream_flush_src(kvp_agent *a, struct kvp_eng *e, uint32_t s)
{
	const uint32_t *nc = &e->note_conn[(size_t)e->src_note[s] * e->nq];
	uint32_t q;

	/* The first queue pair last: its notification waits for the
	 * others' parts of the chunk, which their flushes may close (a
	 * stalled request with nothing read), and an idle connection has
	 * no later flush to send it. */
	for (q = e->nq; q-- && e->state == KVP_ENGINE_UP;)
		if (nc[q] != NO_CONN)
			kvp__conn_flush(a, &a->conns[nc[q]]);
}

/* Streamed request r (slot) fails alone (the engine and its other
 * requests go on): a source published nothing for stall_ms (-ETIMEDOUT,
 * KVP_REASON_STALL), or its records went on with another generation of
 * the request's lease (-ESTALE, KVP_REASON_LEASE: the producer let go of
 * it and holds it again). No more of its READs go out from any source;
 * what is posted completes, then FAILED follows and the notifications,
 * as ever, so that the producer releases it. */
static void stream_stop(kvp_agent *a, struct kvp_eng *e, struct kvp_req *r,
			uint32_t slot, int err, uint32_t reason)
{
	const uint32_t nsrc = e->pc->pi.nsrc;
	uint32_t s;

	if (reason == KVP_REASON_STALL) {
		e->st.stalls++;
		a->st.stalls++;
	}
	r->reason = reason;
	for (s = 0; s < nsrc; s++) {
		struct kvp_sprog *sp = &e->sprog[slot * nsrc + s];
		struct kvp_stripe *st = &e->stripes[slot * nsrc + s];

		if (!sp->active || sp->posted.tokens_all == KVP_TOKENS_END)
			continue; /* nothing to read, or all of it is out */
		if (!st->status)
			st->status = err;
		sp->seen.tokens_all = sp->seen.tokens_cur = KVP_TOKENS_END;
		sp->seen.layers_cur = 0;
		sp->posted = sp->seen;
		sp->nr = sp->ri = 0;
		memset(&st->pos, 0, sizeof(st->pos)); /* zeroed: finished */
	}
	/* Every source is stopped before any flush can finish the
	 * request. */
	for (s = 0; s < nsrc && e->state == KVP_ENGINE_UP; s++)
		if (e->sprog[slot * nsrc + s].active)
			stream_flush_src(a, e, s);
}

void kvp__stream_scan(kvp_agent *a, uint64_t now)
{
	uint32_t i, n = 0, s;

	for (i = 0; i < a->nsreq; i++) {
		uint32_t slot = a->sreq[i];
		struct kvp_req *r = &a->reqs[slot];
		struct kvp_eng *e = &a->engs[r->eng];
		uint32_t nsrc;

		if (r->state != RQ_ACTIVE || !r->stream ||
		    e->state != KVP_ENGINE_UP) {
			r->in_sreq = 0;
			continue; /* finished: off the list */
		}
		a->sreq[n++] = slot;
		nsrc = e->pc->pi.nsrc;
		for (s = 0; s < nsrc && e->state == KVP_ENGINE_UP; s++) {
			struct kvp_sprog *sp = &e->sprog[slot * nsrc + s];
			int k;

			if (!sp->active ||
			    sp->posted.tokens_all == KVP_TOKENS_END)
				continue; /* nothing more to learn */
			k = stream_read(a, e, r, slot, sp, s);
			if (k > 0) {
				sp->t_last = now;
				a->st.progress_seen++;
				if (sp->seen.tokens_all == KVP_TOKENS_END)
					r->t_end = now; /* the exposed time's
							 * start */
				stream_flush_src(a, e, s);
			} else if (k == -ESTALE) {
				stream_stop(a, e, r, slot, -ESTALE,
					    KVP_REASON_LEASE);
				break;
			} else if (k < 0) {
				/* A producer rank that lies about its
				 * progress: its engine is not trusted. */
				kvp__why(&e->why, -EPROTO, KVP_REASON_MALFORMED,
					 "producer rank %u: its progress went backwards",
					 a->conns[kvp__src_conn(e, s)].rank);
				kvp__engine_fail(a, e, -EPROTO);
			} else if (sp->ri < sp->nr ||
				   memcmp(&sp->posted, &sp->seen,
					  sizeof(sp->seen)) ||
				   !kvp_plan_emit_done(
					   &e->stripes[slot * nsrc + s].pos)) {
				/* What it published is not all posted yet:
				 * we are behind, not the producer rank. */
				sp->t_last = now;
			} else if (now - sp->t_last >= a->stall_ns) {
				stream_stop(a, e, r, slot, -ETIMEDOUT,
					    KVP_REASON_STALL);
				break;
			}
		}
	}
	a->nsreq = n;
}

void kvp__pull_timers(kvp_agent *a, uint64_t now)
{
	uint32_t i;

	/* Pulls whose data is not in: the oldest first. */
	while (a->pq_head != a->pq_tail) {
		uint32_t slot = a->pq[a->pq_head & a->pq_mask];
		const struct kvp_req *r = &a->reqs[slot];

		if (r->state != RQ_ACTIVE ||
		    r->seq != a->pq_seq[a->pq_head & a->pq_mask]) {
			a->pq_head++;
			continue;
		}
		if (now < r->t0 + a->stall_ns)
			break;
		a->pq_head++;
		stall(a, &a->engs[r->eng]);
	}
	/* Notifications starved of credit: read the counter again, and give
	 * up on a rank that has not re-posted a buffer for stall_ns. */
	for (i = a->nprod; i < a->cons_end; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state != CS_READY || !c->starved)
			continue;
		if (!c->wait_since) {
			c->wait_since = now;
		} else if (now - c->wait_since >= a->stall_ns) {
			stall(a, &a->engs[c->eng]);
			continue;
		}
		c->credit_hold = 0;
		if (!c->credit_reading)
			kvp__conn_flush(a, c);
	}
	for (i = a->nprod; i < a->cons_end; i++)
		if (a->conns[i].loans)
			kvp__conn_give(a, &a->conns[i], now);
}

/* ---- allocation --------------------------------------------------------- */

void kvp__data_free(kvp_agent *a)
{
	uint32_t i;

	kvp__dereg_mr(a->note_mr);
	a->note_mr = NULL;
	free(a->note_buf);
	a->note_buf = NULL;
	kvp__dereg_mr(a->lease_mr_c);
	a->lease_mr_c = NULL;
	free(a->lease_buf);
	a->lease_buf = NULL;
	if (a->reqs) {
		free(a->reqs[0].ids);
		free(a->reqs[0].gids);
	}
	free(a->reqs);
	a->reqs = NULL;
	free(a->pq);
	a->pq = NULL;
	free(a->pq_seq);
	a->pq_seq = NULL;
	free(a->inflight);
	a->inflight = NULL;
	free(a->swr);
	a->swr = NULL;
	free(a->ssge);
	a->ssge = NULL;
	free(a->dirty);
	a->dirty = NULL;
	for (i = 0; a->ptab_mr && i < a->nconns - a->nprod; i++)
		kvp__dereg_mr(a->ptab_mr[i]);
	free(a->ptab_mr);
	a->ptab_mr = NULL;
	free(a->ptab);
	a->ptab = NULL;
	free(a->sreq);
	a->sreq = NULL;
}

/* Request slots (with room for their ids), the notification buffers and
 * one posting window: everything the data path touches, from the attrs,
 * once per agent. */
int kvp__data_alloc(kvp_agent *a)
{
	const uint32_t ng = a->li.ngroups, mi = a->max_inflight;
	uint32_t i, *ids;
	struct kvp_ids *gids;
	int err;

	a->chunk_mask = kvp__pow2_at_least(mi) - 1;
	a->pq_mask = kvp__pow2_at_least(2 * mi) - 1;
	a->reqs = calloc(mi, sizeof(*a->reqs));
	ids = calloc((size_t)mi * ng * 2 * a->max_ids + 1, sizeof(*ids));
	gids = calloc((size_t)mi * ng + 1, sizeof(*gids));
	a->pq = calloc(a->pq_mask + 1, sizeof(*a->pq));
	a->pq_seq = calloc(a->pq_mask + 1, sizeof(*a->pq_seq));
	a->inflight = calloc(a->pq_mask + 1, sizeof(*a->inflight));
	a->sq_cap = a->sq_depth - 1;
	a->sig_every = a->sq_cap / 4 ? a->sq_cap / 4 : 1;
	if (a->rd_win > a->sq_cap)
		a->rd_win = a->sq_cap;
	a->swr = calloc(a->sq_cap, sizeof(*a->swr));
	a->ssge = calloc((size_t)a->sq_cap * a->max_sge, sizeof(*a->ssge));
	/* Each WR at most twice: added, then signalled. */
	a->dirty = calloc(2 * (size_t)a->sq_cap + 2, sizeof(*a->dirty));
	/* notes, FOLLOWs, notes flagged unheld */
	a->note_buf = calloc(3 * (size_t)mi, KVP_NOTE_LEN);
	a->lease_buf = calloc((size_t)(a->nconns - a->nprod) * KVP_LEASE_RING,
			      KVP_LEASE_READ);
	a->ptab = calloc((size_t)(a->nconns - a->nprod) * 2 * mi + 1,
			 KVP_PROG_REC);
	a->ptab_mr = calloc(a->nconns - a->nprod + 1, sizeof(*a->ptab_mr));
	a->sreq = calloc(mi, sizeof(*a->sreq));
	if (a->reqs) {
		a->reqs[0].ids = ids;
		a->reqs[0].gids = gids;
	} else {
		free(ids);
		free(gids);
	}
	if (!a->reqs || !ids || !gids || !a->pq || !a->pq_seq ||
	    !a->inflight || !a->swr || !a->ssge || !a->dirty ||
	    !a->note_buf || !a->ptab || !a->ptab_mr || !a->sreq ||
	    !a->lease_buf)
		return -ENOMEM;
	for (i = 0; i < a->sq_cap; i++) {
		a->swr[i].next = &a->swr[i + 1]; /* the last: never followed */
		a->swr[i].opcode = IBV_WR_RDMA_READ;
	}
	/* Emission's sink: struct ibv_send_wr's fields, the local regions'
	 * maps; the rest is set per window. */
	a->sink.wr_stride = sizeof(struct ibv_send_wr);
	a->sink.off_wr_id = offsetof(struct ibv_send_wr, wr_id);
	a->sink.off_sg_list = offsetof(struct ibv_send_wr, sg_list);
	a->sink.off_num_sge = offsetof(struct ibv_send_wr, num_sge);
	a->sink.off_remote_addr =
		offsetof(struct ibv_send_wr, wr.rdma.remote_addr);
	a->sink.off_rkey = offsetof(struct ibv_send_wr, wr.rdma.rkey);
	a->sink.local = a->lreg;
	for (i = 0; i < mi; i++) {
		struct kvp_req *r = &a->reqs[i];

		r->ids = ids + (size_t)i * ng * 2 * a->max_ids;
		r->gids = gids + (size_t)i * ng;
		r->next_free = i + 1 < mi ? i + 1 : NO_REQ;
	}
	a->free_req = 0;
	/* For measuring the lease check's cost only (lease.h). */
	a->lease_off = getenv("KVP_LEASE_OFF") &&
		       !strcmp(getenv("KVP_LEASE_OFF"), "1");
	/* Lease buckets land here: written by our READs alone. */
	err = kvp__reg_mr(a->pd, a->lease_buf,
			  (size_t)(a->nconns - a->nprod) * KVP_LEASE_RING *
				  KVP_LEASE_READ,
			  IBV_ACCESS_LOCAL_WRITE, &a->lease_mr_c);
	if (err)
		return err;
	/* Only ever the source of SENDs: local read access suffices. */
	/* Each connection's progress records (ptab) get their MR when
	 * the slot is first taken: kvp__slot_prepare(). */
	return kvp__reg_mr(a->pd, a->note_buf,
			   3 * (size_t)mi * KVP_NOTE_LEN, 0, &a->note_mr);
}
