// SPDX-License-Identifier: MIT
/*
 * The consumer's data path: pull, posting, send completions, stalls.
 *
 * A pull checks its ids, copies them into its request slot and queues one
 * chunk on each connection of the engine's notify list: that producer
 * rank's READs (if it is a source) and then the notification. Nothing is
 * emitted at pull time: kvp__conn_flush() emits each chunk's READs with
 * kvp_plan_emit_window() straight into the free room of that connection's
 * send queue, and resumes from the chunk's position when completions free
 * more. Memory is therefore bounded by the queue depths: one window of
 * sq_depth work requests per agent, whatever max_ids, the plan or the
 * number of engines.
 *
 * Send queue accounting: a WR occupies the SQ until a later signalled WR of
 * the same QP completes (RC completes in order). A chunk's last READ is
 * signalled (WK_LAST: that rank's data is in), and one WR in every
 * sig_every inside long chains, so room comes back while a big request is
 * still streaming; every signalled wr_id carries how many WRs it retires.
 * One SQ slot stays free for the drain marker.
 *
 * DONE is reported when the last READ of every source completed: the data
 * is in. The notifications follow (fenced behind the READs on their QP),
 * each only into a receive buffer the producer rank has posted: the rank
 * gives its receive depth as credit at the handshake and counts the
 * buffers it re-posts in a counter we READ when out of credit. A request
 * slot is free again once its event is delivered and its notifications
 * completed (or were dropped with their connection).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Emission writes providers' scatter entries. */
_Static_assert(sizeof(struct kvp_emit_sge) == sizeof(struct ibv_sge) &&
		       offsetof(struct kvp_emit_sge, addr) ==
			       offsetof(struct ibv_sge, addr) &&
		       offsetof(struct kvp_emit_sge, length) ==
			       offsetof(struct ibv_sge, length) &&
		       offsetof(struct kvp_emit_sge, key) ==
			       offsetof(struct ibv_sge, lkey),
	       "struct kvp_emit_sge is struct ibv_sge");

#define NO_REQ UINT32_MAX
#define CREDIT_OFF (KVP_CTL_LEN - 8) /* the counter lands in the ctl rx
				      * buffer, idle after the handshake */

int kvp__wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -ETIMEDOUT;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR:
		return -EACCES;
	default:
		return -EIO;
	}
}

/* ---- request bookkeeping ------------------------------------------------ */

/* ---- requests in flight by (engine, req_id) ----------------------------- */

static inline uint32_t inflight_hash(uint64_t req_id, uint32_t eng)
{
	uint64_t h = (req_id ^ ((uint64_t)eng << 48)) * 0x9e3779b97f4a7c15ull;

	return (uint32_t)(h >> 32);
}

/* The table entry of (eng, req_id), or of the empty entry where it would
 * go. The table is never full: at most max_inflight of its at least
 * 2 * max_inflight entries are used. */
static uint32_t inflight_find(const kvp_agent *a, uint32_t eng,
			      uint64_t req_id)
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
	uint32_t i = inflight_find(a, r->eng, r->req_id), j = i, h, s;

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
	struct kvp_event ev;

	r->state = RQ_FINISHED;
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
		ev.elapsed_ns = kvp__now_ns() - r->t0;
		a->st.done++;
		e->st.done++;
	} else {
		struct kvp_why w = { 0 };

		/* The engine's reason when it went down for it; else the
		 * errno's. */
		kvp__why_errno(&w, r->status);
		ev.reason = e->why.reason ? e->why.reason : w.reason;
		ev.peer_reason = e->why.peer_reason;
		a->st.failed++;
		e->st.failed++;
	}
	kvp__ev_push(a, &ev);
}

static void req_data_in(kvp_agent *a, struct kvp_req *r, int err)
{
	if (err && !r->status)
		r->status = err;
	if (!--r->pending)
		req_finish(a, r);
}

static void req_note_done(kvp_agent *a, struct kvp_req *r)
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

/* A queue pair's share of a request from one rank is in (its last READ
 * completed, or it had nothing to read): once every queue pair's share
 * of the stripe is, the rank's data is, and its notification may go. */
static void chunk_in(kvp_agent *a, const struct kvp_conn *c,
		     struct kvp_chunk *ch, int err)
{
	struct kvp_stripe *st = &a->engs[c->eng].stripes[ch->stripe];

	ch->flags &= ~CH_READS;
	if (err && !st->status)
		st->status = err;
	if (--st->left)
		return;
	if (st->qmask & (st->qmask - 1))
		a->st.striped++;
	req_data_in(a, &a->reqs[ch->slot], st->status);
}

/* Moves c_data past the chunks whose data is in; on a queue pair without
 * notifications those are retired too. */
static void chunks_retire(kvp_agent *a, struct kvp_conn *c)
{
	while (c->c_data != c->c_post &&
	       !(c->chunks[c->c_data & a->chunk_mask].flags & CH_READS))
		c->c_data++;
	if (c->q)
		c->c_head = c->c_data;
}

void kvp__chunks_fail(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i;

	for (i = c->c_head; i != c->c_tail; i++) {
		struct kvp_chunk *ch = &c->chunks[i & a->chunk_mask];
		struct kvp_req *r = &a->reqs[ch->slot];

		if (ch->flags & CH_READS) /* its data is not in */
			chunk_in(a, c, ch, c->status);
		if (!c->q)
			req_note_done(a, r);
	}
	c->c_head = c->c_data = c->c_note = c->c_post = c->c_tail;
}

/* ---- completions -------------------------------------------------------- */

/* Chunk c_data onwards: the first that still has READs out is the one
 * whose last READ just completed (each posts its WK_LAST in order). */
static void chunk_data_in(kvp_agent *a, struct kvp_conn *c)
{
	chunks_retire(a, c);
	if (kvp_unlikely(c->c_data == c->c_post))
		return; /* unreachable: a WK_LAST per chunk with READs */
	chunk_in(a, c, &c->chunks[c->c_data & a->chunk_mask], 0);
	chunks_retire(a, c);
}

void kvp__send_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	uint32_t kind = WRID_KIND(wc->wr_id);
	uint64_t seen;

	if (kvp_unlikely(c->state != CS_READY && c->state != CS_DRAINING))
		return;
	if (kvp_unlikely(wc->status != IBV_WC_SUCCESS)) {
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		return;
	}
	c->outstanding -= WRID_VALUE(wc->wr_id);
	switch (kind) {
	case WK_LAST:
		chunk_data_in(a, c);
		return;
	case WK_NOTE:
		/* Notifications complete in order. */
		req_note_done(a, &a->reqs[c->chunks[c->c_head++ &
						    a->chunk_mask].slot]);
		return;
	case WK_CREDIT:
		c->credit_reading = 0;
		seen = kvp__get64(kvp__ctl_rx(a, c) + CREDIT_OFF);
		/* A producer cannot grant more than we sent. */
		if (seen > c->notes_posted)
			seen = c->notes_posted;
		/* Nothing new: read again at the next timer, not at once. */
		c->credit_hold = seen <= c->credit_seen;
		if (seen > c->credit_seen)
			c->credit_seen = seen;
		return;
	default:
		return;
	}
}

/* ---- posting ------------------------------------------------------------ */

static inline uint64_t credits(const struct kvp_conn *c)
{
	return c->credit_max + c->credit_seen - c->notes_posted;
}

/* Sets up WR s to signal `kind`, retiring `since` WRs. */
static inline void signal_wr(struct ibv_send_wr *s, const struct kvp_conn *c,
			     uint32_t kind, uint32_t since)
{
	s->send_flags |= IBV_SEND_SIGNALED;
	s->wr_id = kvp__wrid(kind, c->gen, c->idx, since);
}

/* A chain being built for one ibv_post_send(): WRs in a->swr, their SGEs
 * in a->ssge, `since` WRs since the last signalled one. Between flushes
 * every WR of a->swr links to the next, with opcode READ and no flags:
 * emission (kvp_plan_emit_window_into()) writes only a READ's own fields.
 * The indices of WRs given other opcodes or flags go to `dirty`, and
 * chain_reset() puts them back. */
struct chain {
	struct ibv_send_wr *w, *s;
	struct ibv_sge *g;
	uint32_t n, since, nd;
	uint32_t *dirty;
	uint64_t bytes, reads;
};

static inline void chain_dirty(struct chain *ch, const struct ibv_send_wr *s)
{
	ch->dirty[ch->nd++] = (uint32_t)(s - ch->w);
}

/* A WR that is not an emitted READ: the caller sets its opcode, SGEs and
 * remote fields. */
static inline struct ibv_send_wr *chain_add(struct chain *ch)
{
	struct ibv_send_wr *s = &ch->w[ch->n++];

	s->sg_list = ch->g;
	chain_dirty(ch, s);
	ch->s = s;
	ch->since++;
	return s;
}

/* Marks WR s signalled with `kind`, retiring `since` WRs. */
static inline void chain_signal_at(struct chain *ch, struct ibv_send_wr *s,
				   const struct kvp_conn *c, uint32_t kind,
				   uint32_t since)
{
	signal_wr(s, c, kind, since);
	chain_dirty(ch, s);
}

/* Marks the chain's last WR signalled with `kind`, retiring the WRs since
 * the last signalled one. */
static inline void chain_signal(struct chain *ch, const struct kvp_conn *c,
				uint32_t kind)
{
	/* Already signalled (the periodic signal fell on it): it retires
	 * those WRs too. */
	uint32_t prev = ch->s->send_flags & IBV_SEND_SIGNALED ?
				WRID_VALUE(ch->s->wr_id) : 0;

	chain_signal_at(ch, ch->s, c, kind, ch->since + prev);
	ch->since = 0;
}

/* Back to the state between flushes (see struct chain), whether the chain
 * was posted or not. */
static void chain_reset(struct chain *ch)
{
	uint32_t i;

	if (ch->n)
		ch->w[ch->n - 1].next = &ch->w[ch->n];
	for (i = 0; i < ch->nd; i++) {
		ch->w[ch->dirty[i]].opcode = IBV_WR_RDMA_READ;
		ch->w[ch->dirty[i]].send_flags = 0;
	}
	ch->nd = 0;
}

/* Whether the notification of chunk `ch` may go: every queue pair's READs
 * of its rank are in (or the rank is only notified). */
static inline int note_ready(const kvp_agent *a, const struct kvp_conn *c,
			     const struct kvp_chunk *ch)
{
	return ch->stripe == NO_STRIPE ||
	       !a->engs[c->eng].stripes[ch->stripe].left;
}

static void post_note(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		      uint32_t slot)
{
	struct ibv_send_wr *s = chain_add(ch);

	/* After the data is in: no fence needed. Inline when the QP
	 * allows: no DMA read of the note. */
	s->num_sge = 1;
	ch->g->addr = (uint64_t)(uintptr_t)(a->note_buf +
					    (size_t)slot * KVP_NOTE_LEN);
	ch->g->length = KVP_NOTE_LEN;
	ch->g->lkey = a->note_mr->lkey;
	ch->g++;
	s->opcode = IBV_WR_SEND;
	s->send_flags = c->inline_notes ? IBV_SEND_INLINE : 0;
	chain_signal(ch, c, WK_NOTE);
	c->notes_posted++;
	c->wait_since = 0;
	c->starved = 0;
	a->st.notes_sent++;
}

int kvp__bye_consumer(kvp_agent *a, struct kvp_conn *c)
{
	uint8_t *m = kvp__ctl_tx(a, c);

	/* A receive buffer of the producer's, and room in our send queue
	 * beyond the slot kept for the drain marker. */
	if (c->state != CS_READY || !credits(c) ||
	    c->outstanding >= c->sq_cap)
		return 0;
	memset(m, 0, KVP_NOTE_LEN);
	kvp__put32(m, KVP_BYE_MAGIC);
	kvp__put32(m + 4, a->li.tp_rank);
	kvp__put64(m + 16, a->li.engine_id);
	if (kvp__post_send1(c, kvp__wrid(WK_BYE, c->gen, c->idx, 0), m,
			    KVP_NOTE_LEN, a->ctl_mr->lkey))
		return 0;
	c->notes_posted++;
	c->bye_sent = 1;
	return 1;
}

/* Out of credit: read the producer's count of re-posted buffers. */
static void post_credit_read(kvp_agent *a, struct kvp_conn *c,
			     struct chain *ch)
{
	struct ibv_send_wr *s = chain_add(ch);

	s->num_sge = 1;
	ch->g->addr = (uint64_t)(uintptr_t)(kvp__ctl_rx(a, c) + CREDIT_OFF);
	ch->g->length = 8;
	ch->g->lkey = a->ctl_mr->lkey;
	ch->g++;
	s->opcode = IBV_WR_RDMA_READ;
	s->wr.rdma.remote_addr = c->ctr_raddr;
	s->wr.rdma.rkey = c->ctr_rkey;
	chain_signal(ch, c, WK_CREDIT);
	c->credit_reading = 1;
}

/* Appends up to `room` READs of the stripe's next window to the chain,
 * emitted straight into its WRs and SGEs; every sig_every-th WR of the
 * chain signalled. Returns how many, or -EPROTO. */
static int post_window(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		       const kvp_plan *plan, struct kvp_req *r,
		       struct kvp_stripe *st, uint32_t room)
{
	struct kvp_emit_sink *sk = &a->sink;
	struct ibv_send_wr *w0 = ch->w + ch->n;
	uint32_t nsge, j;
	uint64_t bytes;
	int k;

	sk->wr = w0;
	sk->sge = (struct kvp_emit_sge *)ch->g;
	sk->remote = c->rreg;
	sk->wr_id = kvp__wrid(WK_READ, c->gen, c->idx, 0);
	k = kvp_plan_emit_window_into(plan, r->gids, &st->pos, sk, room,
				      room * a->max_sge, &nsge, &bytes);
	if (kvp_unlikely(k <= 0))
		return k < 0 ? -EPROTO : 0; /* -EPROTO unreachable: the ids
					     * passed the check */
	ch->n += (uint32_t)k;
	ch->g += nsge;
	ch->s = &ch->w[ch->n - 1];
	/* The periodic signals, so that room comes back during long
	 * chains: the WRs where `since` reaches sig_every. */
	for (j = a->sig_every - ch->since - 1; j < (uint32_t)k;
	     j += a->sig_every)
		chain_signal_at(ch, &w0[j], c, WK_SIGNAL, a->sig_every);
	ch->since = (ch->since + (uint32_t)k) % a->sig_every;
	r->reads += (uint32_t)k;
	r->bytes += bytes;
	ch->bytes += bytes;
	ch->reads += (uint32_t)k;
	return k;
}

/* A zero-length READ: its completion marks the end of this queue pair's
 * share when its last READ went out without the mark. */
static void post_marker(struct kvp_conn *c, struct chain *ch)
{
	struct ibv_send_wr *s = chain_add(ch);

	s->num_sge = 0;
	s->opcode = IBV_WR_RDMA_READ;
	s->wr.rdma.remote_addr = c->rreg[0].addr;
	s->wr.rdma.rkey = c->rreg[0].key[0];
	chain_signal(ch, c, WK_LAST);
}

void kvp__conn_flush(kvp_agent *a, struct kvp_conn *c)
{
	struct chain ch = { a->swr, NULL, a->ssge, 0, 0, 0, a->dirty, 0, 0 };
	const struct kvp_eng *e = &a->engs[c->eng];
	const kvp_plan *plan = e->pc ? e->pc->plan : NULL;
	const uint32_t mask = a->chunk_mask;
	struct ibv_send_wr *bad;
	uint32_t room;
	int err, k;

	if (kvp_unlikely(c->state != CS_READY))
		return;
	room = c->sq_cap - c->outstanding;
	while (ch.n < room) {
		struct kvp_chunk *ck;
		struct kvp_stripe *st;

		/* Notifications, on a rank's first queue pair, in order. */
		if (!c->q && c->c_note != c->c_post &&
		    note_ready(a, c, &c->chunks[c->c_note & mask])) {
			if (credits(c)) {
				post_note(a, c, &ch,
					  c->chunks[c->c_note++ & mask].slot);
				continue;
			}
			if (!c->starved) {
				c->starved = 1;
				a->st.credit_waits++;
			}
			if (!c->credit_reading && !c->credit_hold) {
				post_credit_read(a, c, &ch);
				continue;
			}
		}
		if (c->c_post == c->c_tail)
			break;
		ck = &c->chunks[c->c_post & mask];
		if (!(ck->flags & CH_READS)) {
			c->c_post++;
			continue;
		}
		st = &e->stripes[ck->stripe];
		k = 0;
		if (!kvp_plan_emit_done(&st->pos)) {
			k = post_window(a, c, &ch, plan, &a->reqs[ck->slot], st,
					room - ch.n);
			if (kvp_unlikely(k < 0)) {
				/* What is chained is dropped with the QP. */
				chain_reset(&ch);
				kvp__conn_fail(a, c, k);
				return;
			}
			ck->posted += (uint32_t)k;
			if (k)
				st->qmask |= 1u << c->q;
			if (!kvp_plan_emit_done(&st->pos))
				break; /* the window is full */
		}
		/* The stripe is emitted (by this queue pair or another). */
		if (k) {
			chain_signal(&ch, c, WK_LAST);
		} else if (ck->posted) {
			if (ch.n == room)
				break; /* the marker needs room */
			post_marker(c, &ch);
		} else {
			/* Nothing went through this queue pair. */
			c->c_post++;
			chunk_in(a, c, ck, 0);
			chunks_retire(a, c);
			continue;
		}
		c->c_post++;
	}
	if (c->c_post != c->c_tail)
		a->st.queued++;
	if (!ch.n)
		return;
	if (ch.since)
		chain_signal(&ch, c, WK_SIGNAL);
	ch.s->next = NULL;
	err = kvp__post_send(c->qp, ch.w, &bad);
	chain_reset(&ch);
	a->st.doorbells++;
	if (kvp_unlikely(err)) {
		/* WRs before `bad` are posted; the drain marker flushes them
		 * and fails every chunk of this connection. */
		kvp__conn_fail(a, c, err);
		return;
	}
	c->outstanding += ch.n;
	a->st.reads += ch.reads;
	a->st.read_bytes += ch.bytes;
	a->engs[c->eng].st.reads += ch.reads;
	a->engs[c->eng].st.read_bytes += ch.bytes;
}

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

static int pull(kvp_agent *a, struct kvp_eng *e, uint64_t req_id,
		const struct kvp_ids *ids)
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
	at = inflight_find(a, eng, req_id);
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

	r->req_id = req_id;
	r->eng = eng;
	a->inflight[at] = slot + 1;
	r->t0 = kvp__now_ns();
	r->bytes = 0;
	r->reads = 0;
	r->state = RQ_ACTIVE;
	r->status = 0;
	r->delivered = 0;
	r->seq = ++a->seq;
	r->notes = pc->pi.nnotify;
	r->pending = 1; /* held until every chunk is queued */
	a->pq[a->pq_tail & a->pq_mask] = slot;
	a->pq_seq[a->pq_tail & a->pq_mask] = r->seq;
	a->pq_tail++;
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
				r->pending++;
			}
		}
		/* The first queue pair always (the notification); the
		 * others only when there is something to read. */
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
		}
	}
	a->st.pulls++;
	e->st.pulls++;
	for (k = 0; k < nc; k++)
		if (e->note_conn[k] != NO_CONN)
			kvp__conn_flush(a, &a->conns[e->note_conn[k]]);
	/* Every chunk is queued: the request may finish (at once when no
	 * rank has anything to read: a full prefix hit). */
	req_data_in(a, r, 0);
	return 0;
}

int kvp_agent_pull_from(kvp_agent *a, uint32_t engine, uint64_t req_id,
			const struct kvp_ids *ids)
{
	struct kvp_eng *e;

	if (kvp_unlikely(!a))
		return -EINVAL;
	a->last.reason = 0;
	if (kvp_unlikely(!ids || !a->consumer))
		return kvp__why(&a->last, -EINVAL, KVP_REASON_ARGS,
				!ids ? "ids is NULL" : "not a consumer");
	e = kvp__engine_get(a, engine);
	if (kvp_unlikely(!e))
		return kvp__why(&a->last, -ENOENT, KVP_REASON_NO_ENGINE,
				"no engine with handle %u", engine);
	if (kvp_likely(e->state == KVP_ENGINE_UP))
		return pull(a, e, req_id, ids);
	if (e->state == KVP_ENGINE_FAILING)
		return kvp__why(&a->last, -ENOTCONN, KVP_REASON_NOT_UP,
				"engine %u is going down", engine);
	if (e->state == KVP_ENGINE_DOWN) {
		/* On demand: with the addresses it had. */
		int err = kvp_agent_reconnect_engine(a, engine, NULL, 0,
						     (uint32_t)(a->handshake_ns /
								1000000ull));

		if (err)
			return err;
	}
	return kvp__why_static(&a->last, -EAGAIN, KVP_REASON_NOT_UP,
			       "the engine is connecting");
}

int kvp_agent_pull(kvp_agent *a, uint64_t req_id, const struct kvp_ids *ids)
{
	struct kvp_eng *e;

	if (kvp_unlikely(!a))
		return -EINVAL;
	a->last.reason = 0;
	if (kvp_unlikely(!ids || !a->consumer))
		return kvp__why(&a->last, -EINVAL, KVP_REASON_ARGS,
				!ids ? "ids is NULL" : "not a consumer");
	e = kvp__engine_get(a, a->def_eng);
	if (kvp_unlikely(!e || e->state != KVP_ENGINE_UP))
		return kvp__why(&a->last, -ENOTCONN, KVP_REASON_NOT_UP,
				"no engine up (kvp_agent_connect())");
	return pull(a, e, req_id, ids);
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
	for (i = a->nprod; i < a->nconns; i++) {
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
}

/* ---- allocation --------------------------------------------------------- */

void kvp__data_free(kvp_agent *a)
{
	kvp__dereg_mr(a->note_mr);
	a->note_mr = NULL;
	free(a->note_buf);
	a->note_buf = NULL;
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
	a->swr = calloc(a->sq_cap, sizeof(*a->swr));
	a->ssge = calloc((size_t)a->sq_cap * a->max_sge, sizeof(*a->ssge));
	/* Each WR at most twice: added, then signalled. */
	a->dirty = calloc(2 * (size_t)a->sq_cap + 2, sizeof(*a->dirty));
	a->note_buf = calloc(mi, KVP_NOTE_LEN);
	if (a->reqs) {
		a->reqs[0].ids = ids;
		a->reqs[0].gids = gids;
	} else {
		free(ids);
		free(gids);
	}
	if (!a->reqs || !ids || !gids || !a->pq || !a->pq_seq ||
	    !a->inflight || !a->swr ||
	    !a->ssge || !a->dirty || !a->note_buf)
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
	/* Only ever the source of SENDs: local read access suffices. */
	err = kvp__reg_mr(a->pd, a->note_buf, (size_t)mi * KVP_NOTE_LEN, 0,
			  &a->note_mr);
	return err;
}

/* A connection of an engine coming up: its chunk FIFO and the remote
 * keys; the blob it came with is no longer needed. */
int kvp__conn_data_alloc(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_layout_info pi;
	uint64_t addr, nkeys = 0;
	uint32_t i, shift;
	int n;

	kvp_layout_get_info(c->peer, &pi);
	for (i = 0; i < pi.nregions; i++) {
		n = kvp_layout_get_region_keys(c->peer, i, &addr, &shift,
					       NULL, 0);
		if (n < 1)
			return -EPROTO;
		nkeys += (uint32_t)n; /* each at most KVP_MR_MAX_KEYS */
	}
	c->chunks = calloc(a->chunk_mask + 1, sizeof(*c->chunks));
	c->rreg = calloc(pi.nregions + 1, sizeof(*c->rreg));
	c->rkeys = calloc(nkeys + 1, sizeof(*c->rkeys));
	if (!c->chunks || !c->rreg || !c->rkeys)
		return -ENOMEM; /* freed with the connection */
	c->nrkeys = (uint32_t)nkeys;
	for (i = 0, nkeys = 0; i < pi.nregions; i++) {
		struct kvp_emit_map *rr = &c->rreg[i];

		rr->key = c->rkeys + nkeys;
		n = kvp_layout_get_region_keys(c->peer, i, &rr->addr, &shift,
					       c->rkeys + nkeys, UINT32_MAX);
		rr->shift = shift ? shift : KVP_ONE_MR;
		nkeys += (uint32_t)n;
	}
	c->outstanding = 0;
	c->c_head = c->c_data = c->c_note = c->c_post = c->c_tail = 0;
	c->notes_posted = c->credit_seen = 0;
	c->credit_reading = c->credit_hold = c->starved = 0;
	c->wait_since = 0;
	kvp_layout_destroy(c->peer);
	c->peer = NULL;
	kvp__dereg_mr(c->blob_mr);
	c->blob_mr = NULL;
	free(c->blob);
	c->blob = NULL;
	c->blob_len = 0;
	return 0;
}
