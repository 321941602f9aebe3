// SPDX-License-Identifier: MIT
/*
 * The consumer's data path: posting and send completions. A pull (pull.c)
 * queues one chunk per connection of the engine's notify list; nothing is
 * emitted at pull time: kvp__conn_flush() emits each chunk's READs with
 * kvp_plan_emit_window() straight into the free room of that connection's
 * send queue, and resumes from the chunk's position when completions free
 * more. Memory is therefore bounded by the queue depths: one window of
 * sq_depth work requests per agent, whatever max_ids, the plan or the
 * number of engines.
 *
 * Chunks are posted in queue order, except that a streamed chunk waiting
 * for progress is passed (it holds no queue pair: the chunks after it
 * post meanwhile); chunks whose READs are all posted are "closed", and
 * their last READs complete in the order they were closed (the close
 * FIFO). Notifications go in queue order.
 *
 * Send queue accounting: a WR occupies the SQ until a later signalled WR of
 * the same QP completes (RC completes in order). A chunk's last READ is
 * signalled (WK_LAST: that rank's data is in), and one WR in every
 * sig_every inside long chains, so room comes back while a big request is
 * still streaming; every signalled wr_id carries how many WRs it retires.
 * One SQ slot stays free for the drain marker.
 *
 * The READ window (kvp_agent_attr.read_window, read_window_bytes): READs
 * are chained only while the queue pair has fewer than its engine's
 * kvp_eng.win WRs outstanding, the rest waiting in their chunks; across a
 * path, RC's go-back-N turns a longer burst's reordering or loss into
 * the resending of all of it (docs/read-window.md). Notifications,
 * lease and credit READs, FOLLOWs and markers need only send queue room
 * and are chained first, so the window never holds them back. The window
 * in READs follows the average READ of each doorbell (the bytes bound),
 * and signals come every half window so that room returns while READs
 * are out. A loopback queue pair (kvp_conn.loop) has none.
 *
 * DONE is reported when the last READ of every source completed: the data
 * is in. The notifications follow (fenced behind the READs on their QP),
 * each only into a receive buffer the producer rank has posted: the rank
 * gives credit at the handshake (its receive depth, or what it lends from
 * its shared receive queue) and counts the credits it gives back since in
 * a counter we READ when out of credit. A request
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


/* A queue pair's share of a request from one rank is in (its last READ
 * completed, or it had nothing to read): once every queue pair's share
 * of the stripe is, the rank's data is, and its lease check goes on the
 * rank's first queue pair (lease.h); once that is in, its notification
 * may go. */
static void chunk_in(kvp_agent *a, const struct kvp_conn *c,
		     struct kvp_chunk *ch, int err)
{
	struct kvp_eng *e = &a->engs[c->eng];
	struct kvp_stripe *st = &e->stripes[ch->stripe];
	struct kvp_conn *c0;

	ch->flags &= ~CH_READS;
	if (err && !st->status)
		st->status = err;
	if (--st->left)
		return;
	if (st->qmask & (st->qmask - 1))
		a->st.striped++;
	/* Its lease READ went right behind its READs (lease_behind()):
	 * in once that completes (lease_in()). */
	if (st->lease == SL_READING)
		return;
	if (!st->status && !a->lease_off && st->lease == SL_NONE) {
		c0 = &a->conns[kvp__src_conn(e, ch->stripe % e->pc->pi.nsrc)];
		/* A first queue pair that failed meanwhile fails the check
		 * when it drains (chunks_fail()); one gone already, now. */
		if (c0->lw && (c0->state == CS_READY ||
			       c0->state == CS_DRAINING)) {
			st->lease = SL_WAIT;
			c0->lw[c0->lw_tail++ & a->chunk_mask] = ch->stripe;
			return;
		}
		st->status = c0->status ? c0->status : -ENOTCONN;
	}
	kvp__req_data_in(a, &a->reqs[ch->slot], st->status);
}

/* Where the lease READ number n of consumer connection c lands. */
static inline uint8_t *lease_land(const kvp_agent *a, const struct kvp_conn *c,
				  uint32_t n)
{
	return a->lease_buf +
	       ((size_t)(c->idx - a->nprod) * KVP_LEASE_RING +
		n % KVP_LEASE_RING) * KVP_LEASE_READ;
}

/* A lease READ completed (WK_LEASE): the oldest posted on c. The stripe
 * is in, or FAILED -ESTALE when the bucket holds no lease of ours (for a
 * streamed pull: of the generation its records carried). */
static void lease_in(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_eng *e = &a->engs[c->eng];
	const uint32_t stripe = c->lw[c->lw_done & a->chunk_mask];
	struct kvp_stripe *st = &e->stripes[stripe];
	struct kvp_req *r = &a->reqs[stripe / e->pc->pi.nsrc];
	uint64_t gen;

	if (kvp_unlikely(c->lw_done == c->lw_post))
		return; /* unreachable: a WK_LEASE per lease READ */
	/* The NIC wrote the bucket behind the compiler's back. */
	__asm__ volatile("" ::: "memory");
	if (kvp__lease_check(lease_land(a, c, c->lw_done), a->li.engine_id,
			     r->req_id, c->lease_inc,
			     r->stream ? e->sprog[stripe].gen : 0, &gen)) {
		st->status = -ESTALE;
		if (!r->status && !r->reason)
			r->reason = KVP_REASON_LEASE;
	}
	c->lw_done++;
	st->lease = SL_DONE;
	/* A lease READ posted behind the READs may complete before the
	 * other queue pairs' (empty) shares closed: their chunk_in() ends
	 * it then. */
	if (!st->left)
		kvp__req_data_in(a, r, st->status);
}

/* The checks still owed on a drained first queue pair fail. */
static void leases_fail(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_eng *e = &a->engs[c->eng];

	for (; c->lw_done != c->lw_tail; c->lw_done++) {
		const uint32_t stripe = c->lw[c->lw_done & a->chunk_mask];
		struct kvp_stripe *st = &e->stripes[stripe];

		st->lease = SL_NONE;
		if (!st->status)
			st->status = c->status ? c->status : -ENOTCONN;
		/* (one behind READs still out elsewhere: their chunk_in()) */
		if (!st->left)
			kvp__req_data_in(a,
					 &a->reqs[stripe / e->pc->pi.nsrc],
					 st->status);
	}
	c->lw_post = c->lw_tail;
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

/* Fails every chunk a drained connection still holds. */
static void chunks_fail(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i;

	for (i = c->c_head; i != c->c_tail; i++) {
		struct kvp_chunk *ch = &c->chunks[i & a->chunk_mask];
		struct kvp_req *r = &a->reqs[ch->slot];

		if (ch->flags & CH_READS) /* its data is not in */
			chunk_in(a, c, ch, c->status);
		if (!c->q)
			kvp__req_note_done(a, r);
	}
	if (c->lw)
		leases_fail(a, c);
	c->c_head = c->c_data = c->c_note = c->c_post = c->c_tail;
	c->nlast = 0;
	c->m_head = c->m_tail;
}

/* The consumer side's conn_ops.drained: every WR posted on c has
 * completed or been flushed, no READ can land any more, and its requests
 * can be failed; then the slot is free and the engine hears of it. */
static void consumer_drained(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_eng *e = &a->engs[c->eng];
	int err = c->status, retrying = c->retrying;

	chunks_fail(a, c);
	kvp__conn_release(a, c);
	a->ncons_free++;
	if (retrying && e->state == KVP_ENGINE_CONNECTING) {
		/* A full producer's refusal: the engine tries again. */
		kvp__engine_conn_retry(e, c->idx);
		return;
	}
	kvp__engine_conn_gone(a, e, c->idx, err);
}

const struct kvp_conn_ops kvp__consumer_ops = {
	.failed = kvp__consumer_failed,
	.drained = consumer_drained,
};

/* ---- completions -------------------------------------------------------- */

/* The close FIFO (struct kvp_conn.l_head): chunk i's last READ (or
 * marker) is chained. */
static inline void close_push(kvp_agent *a, struct kvp_conn *c, uint32_t i)
{
	if (c->nlast++)
		c->chunks[c->l_tail & a->chunk_mask].lnext = i;
	else
		c->l_head = i;
	c->l_tail = i;
}

/* A WK_LAST completed: the oldest chunk in the close FIFO is in (a queue
 * pair completes in order). Chunks usually close in queue order; a
 * streamed one that waits for progress lets later ones pass it. */
static void chunk_data_in(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_chunk *ck;

	if (kvp_unlikely(!c->nlast))
		return; /* unreachable: a WK_LAST per closed chunk */
	ck = &c->chunks[c->l_head & a->chunk_mask];
	if (--c->nlast)
		c->l_head = ck->lnext;
	if (a->stream_events && a->reqs[ck->slot].stream) {
		struct kvp_sprog *sp = &a->engs[c->eng].sprog[ck->stripe];

		sp->mout[c->q]--;
		sp->mdone[c->q] = KVP_LC_ALL;
	}
	chunk_in(a, c, ck, 0);
	chunks_retire(a, c);
}

/* Layers [0, n) of a streamed request landed: the least, over its
 * sources, of what each queue pair's completed marks vouch for (a queue
 * pair with no mark in flight has nothing of the request in flight). */
static void stream_arrival(kvp_agent *a, struct kvp_eng *e, uint32_t slot)
{
	const uint32_t nsrc = e->pc->pi.nsrc;
	struct kvp_req *r = &a->reqs[slot];
	uint32_t s, q, n = KVP_LC_ALL;

	for (s = 0; s < nsrc; s++) {
		const struct kvp_sprog *sp = &e->sprog[slot * nsrc + s];

		if (!sp->active)
			continue;
		for (q = 0; q < e->nq; q++) {
			uint32_t v = sp->mout[q] ? sp->mdone[q] : sp->emitted_lc;

			if (v < n)
				n = v;
		}
	}
	if (n != KVP_LC_ALL && n > r->arrived)
		kvp__req_arrived(a, r, n);
}

/* A mark completed (WK_SMARK): the stripe's READs before it on this
 * queue pair landed. */
static void mark_in(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_eng *e = &a->engs[c->eng];
	uint64_t m = c->marks[c->m_head++ % (a->sq_depth + 1)];
	uint32_t stripe = (uint32_t)(m >> 32);
	struct kvp_sprog *sp = &e->sprog[stripe];

	sp->mout[c->q]--;
	sp->mdone[c->q] = (uint32_t)m;
	stream_arrival(a, e, stripe / e->pc->pi.nsrc);
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
	case WK_SMARK:
		mark_in(a, c);
		return;
	case WK_LEASE:
		lease_in(a, c);
		return;
	case WK_NOTE:
		/* Notifications complete in order. */
		kvp__req_note_done(a, &a->reqs[c->chunks[c->c_head++ &
						    a->chunk_mask].slot]);
		return;
	case WK_CREDIT:
		c->credit_reading = 0;
		seen = kvp__get64(kvp__ctl_aux(a, c) + CTL_AUX_CREDIT);
		/* A producer gives back what we sent and may lend more
		 * (its shared receive queue's pool), never past
		 * KVP_CREDIT_MAX at once. */
		if (seen > c->notes_posted + KVP_CREDIT_MAX)
			seen = c->notes_posted + KVP_CREDIT_MAX;
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
	uint32_t sig; /* a periodic signal every `sig` READs */
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
 * of its rank are in and its lease checked (or the rank is only
 * notified). */
static inline int note_ready(const kvp_agent *a, const struct kvp_conn *c,
			     const struct kvp_chunk *ch)
{
	const struct kvp_stripe *st;

	if (ch->stripe == NO_STRIPE)
		return 1;
	st = &a->engs[c->eng].stripes[ch->stripe];
	return !st->left && st->lease != SL_WAIT && st->lease != SL_READING;
}

/* A message of KVP_NOTE_LEN bytes at buf into one of the producer rank's
 * receive buffers (a credit), signalled as `kind`: a notification, a
 * TABLE or a FOLLOW. Inline when the QP allows: no DMA read of it. */
static void post_msg(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		     const uint8_t *buf, uint32_t lkey, uint32_t kind)
{
	struct ibv_send_wr *s = chain_add(ch);

	s->num_sge = 1;
	ch->g->addr = (uint64_t)(uintptr_t)buf;
	ch->g->length = KVP_NOTE_LEN;
	ch->g->lkey = lkey;
	ch->g++;
	s->opcode = IBV_WR_SEND;
	s->send_flags = c->inline_notes ? IBV_SEND_INLINE : 0;
	chain_signal(ch, c, kind);
	c->notes_posted++;
	c->wait_since = 0;
	c->starved = 0;
}

/* After the data is in and the lease checked: no fence needed. A rank
 * whose check failed is told (KVP_NOTE_UNHELD: the slot's third note). */
static void post_note(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		      const struct kvp_chunk *ck)
{
	const int unheld = ck->stripe != NO_STRIPE &&
			   a->engs[c->eng].stripes[ck->stripe].status ==
				   -ESTALE;

	post_msg(a, c, ch,
		 a->note_buf + ((size_t)(unheld ? 2 * a->max_inflight : 0) +
				ck->slot) * KVP_NOTE_LEN,
		 a->note_mr->lkey, WK_NOTE);
	a->st.notes_sent++;
}

/* The lease READs that wait on c (a rank's first queue pair), as many as
 * the landing buffers and the room allow: each READs the bucket of the
 * request's key (lease.h). */
static void post_leases(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
			uint32_t room)
{
	struct kvp_eng *e = &a->engs[c->eng];

	while (c->lw_post != c->lw_tail && ch->n < room &&
	       c->lw_post - c->lw_done < KVP_LEASE_RING) {
		const uint32_t stripe = c->lw[c->lw_post & a->chunk_mask];
		const struct kvp_req *r = &a->reqs[stripe / e->pc->pi.nsrc];
		struct ibv_send_wr *s = chain_add(ch);

		s->num_sge = 1;
		ch->g->addr = (uint64_t)(uintptr_t)lease_land(a, c, c->lw_post);
		ch->g->length = KVP_LEASE_READ;
		ch->g->lkey = a->lease_mr_c->lkey;
		ch->g++;
		s->opcode = IBV_WR_RDMA_READ;
		s->wr.rdma.remote_addr =
			c->lease_raddr +
			(uint64_t)kvp__lease_bucket(a->li.engine_id, r->req_id,
						    c->lease_log2) *
				KVP_LEASE_READ;
		s->wr.rdma.rkey = c->lease_rkey;
		chain_signal(ch, c, WK_LEASE);
		e->stripes[stripe].lease = SL_READING;
		c->lw_post++;
		a->st.lease_reads++;
	}
}

/* Stripe `stripe` is emitted, its last READ chained on c, a rank's
 * first queue pair, which carried all of its READs: its lease READ goes
 * right behind them (a queue pair executes its READs in order), not
 * after their completion behind every READ posted since. Only when no
 * deferred one waits (the FIFO stays in posting order) and a landing
 * buffer is free; else it waits for the data, as a striped one does. */
static void lease_behind(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
			 uint32_t stripe, uint32_t room)
{
	struct kvp_stripe *st = &a->engs[c->eng].stripes[stripe];

	if (a->lease_off || c->q || st->qmask != 1u || st->status ||
	    st->lease != SL_NONE || c->lw_post != c->lw_tail ||
	    c->lw_post - c->lw_done >= KVP_LEASE_RING || ch->n >= room)
		return;
	c->lw[c->lw_tail++ & a->chunk_mask] = stripe;
	post_leases(a, c, ch, room);
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
	ch->g->addr = (uint64_t)(uintptr_t)(kvp__ctl_aux(a, c) +
					  CTL_AUX_CREDIT);
	ch->g->length = 8;
	ch->g->lkey = a->ctl_mr->lkey;
	ch->g++;
	s->opcode = IBV_WR_RDMA_READ;
	s->wr.rdma.remote_addr = c->ctr_raddr;
	s->wr.rdma.rkey = c->ctr_rkey;
	chain_signal(ch, c, WK_CREDIT);
	c->credit_reading = 1;
}

/* A first queue pair gone quiet (nothing sent for KVP_GIVE_NS, nothing in
 * flight or waiting) hands its loans back: it READs its counter, so that
 * it knows every credit it holds, then sends GIVE with all but its own
 * (credit.h): loans do not stay with a rank that no longer uses them.
 * Once per quiet spell. */
void kvp__conn_give(kvp_agent *a, struct kvp_conn *c, uint64_t now)
{
	struct chain ch = { a->swr, NULL, a->ssge, 0, 0, 0, a->dirty, 0, 0,
			    a->sig_every };
	struct ibv_send_wr *bad;
	uint64_t v;
	uint8_t *m;
	int err;

	/* Only once its engine is up: coming up resets its counts. */
	if (c->state != CS_READY || !c->loans || c->credit_reading ||
	    a->engs[c->eng].state != KVP_ENGINE_UP)
		return;
	if (c->bye_sent || c->c_head != c->c_tail ||
	    c->notes_posted != c->quiet_mark) {
		c->quiet_mark = c->notes_posted;
		c->quiet_since = now;
		c->give_step = 0;
		return;
	}
	if (c->give_step == 2 || now - c->quiet_since < KVP_GIVE_NS ||
	    c->outstanding + 2 > c->sq_cap)
		return;
	if (!c->give_step) {
		post_credit_read(a, c, &ch);
		c->give_step = 1;
	} else {
		v = credits(c);
		c->give_step = 2;
		if (v < KVP_CREDIT_OWN + 2)
			return;
		v -= KVP_CREDIT_OWN + 1;
		m = kvp__ctl_aux(a, c) + CTL_AUX_GIVE;
		memset(m, 0, KVP_NOTE_LEN);
		kvp__put32(m, KVP_GIVE_MAGIC);
		kvp__put32(m + 4, (uint32_t)v);
		post_msg(a, c, &ch, m, a->ctl_mr->lkey, WK_FOLLOW);
		c->notes_posted += v; /* and the GIVE's own */
		c->quiet_mark = c->notes_posted;
		a->st.credit_gives++;
	}
	ch.s->next = NULL;
	err = kvp__post_send(c->qp, ch.w, &bad);
	chain_reset(&ch);
	if (kvp_unlikely(err)) {
		kvp__conn_fail(a, c, err);
		return;
	}
	c->outstanding += ch.n;
}

/* Appends up to `room` READs of the stripe's next window to the chain,
 * emitted straight into its WRs and SGEs; every sig_every-th WR of the
 * chain signalled. Returns how many, or -EPROTO. */
static int post_window(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		       const kvp_plan *plan, struct kvp_req *r,
		       struct kvp_stripe *st, const struct kvp_emit_range *rg,
		       uint32_t room)
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
	if (kvp_likely(!rg))
		k = kvp_plan_emit_window_into(plan, r->gids, &st->pos, sk,
					      room, room * a->max_sge, &nsge,
					      &bytes);
	else
		k = kvp_plan_emit_range_window_into(plan, r->gids, rg,
						    &st->pos, sk, room,
						    room * a->max_sge, &nsge,
						    &bytes);
	if (kvp_unlikely(k <= 0))
		return k < 0 ? -EPROTO : 0; /* -EPROTO unreachable: the ids
					     * passed the check */
	ch->n += (uint32_t)k;
	ch->g += nsge;
	ch->s = &ch->w[ch->n - 1];
	/* The periodic signals, so that room comes back during long
	 * chains: the WRs where `since` reaches sig_every. */
	for (j = ch->sig - ch->since - 1; j < (uint32_t)k; j += ch->sig)
		chain_signal_at(ch, &w0[j], c, WK_SIGNAL, ch->sig);
	ch->since = (ch->since + (uint32_t)k) % ch->sig;
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

/* ---- streaming ----------------------------------------------------------- */

/* A streamed chunk's first step: the connection's TABLE (once), then the
 * request's FOLLOW. 1 when posted; 0 when they wait for credit (a credit
 * read is under way) or for room. */
static int post_follow(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		       struct kvp_chunk *ck, uint32_t room)
{
	const uint32_t need = 1 + !c->table_sent;

	if (room < need + 1)
		return 0;
	if (credits(c) < need) {
		if (!c->starved) {
			c->starved = 1;
			a->st.credit_waits++;
		}
		if (!c->credit_reading && !c->credit_hold)
			post_credit_read(a, c, ch);
		return 0;
	}
	if (!c->table_sent) {
		uint8_t *m = kvp__ctl_tx(a, c) + KVP_CTL_LEN - KVP_NOTE_LEN;
		uint32_t ci = c->idx - a->nprod;

		kvp__put32(m, KVP_TABLE_MAGIC);
		kvp__put32(m + 4, a->li.tp_rank);
		kvp__put64(m + 8, (uint64_t)(uintptr_t)(a->ptab +
			   (size_t)ci * 2 * a->max_inflight * KVP_PROG_REC));
		kvp__put32(m + 16, a->ptab_mr[ci]->rkey);
		kvp__put32(m + 20, 2 * a->max_inflight);
		kvp__put64(m + 24, a->li.engine_id);
		post_msg(a, c, ch, m, a->ctl_mr->lkey, WK_FOLLOW);
		c->table_sent = 1;
	}
	post_msg(a, c, ch,
		 a->note_buf + ((size_t)a->max_inflight + ck->slot) *
				       KVP_NOTE_LEN,
		 a->note_mr->lkey, WK_FOLLOW);
	ck->flags &= ~CH_FOLLOW;
	return 1;
}

/* The leading model layers progress p completes at every token
 * (KVP_LC_ALL: all of them). */
static inline uint32_t lc_of(const struct kvp_progress *p)
{
	if (p->tokens_all == KVP_TOKENS_END)
		return KVP_LC_ALL;
	if (p->tokens_cur == KVP_TOKENS_END)
		return p->layers_cur;
	return 0;
}

/* stream_events: the chain's last WR, the stripe's last READ of this
 * flush, is signalled as a mark vouching for layers [0, lc). */
static void mark_push(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
		      uint32_t stripe, uint32_t lc)
{
	chain_signal(ch, c, WK_SMARK);
	c->marks[c->m_tail++ % (a->sq_depth + 1)] =
		(uint64_t)stripe << 32 | lc;
	a->engs[c->eng].sprog[stripe].mout[c->q]++;
}

/* A streamed stripe whose position is done: on to its next range, or the
 * ranges of progress seen since. 1 when pos has READs again; 0 when it
 * waits for progress, or (sp->posted at KVP_TOKENS_END and every range
 * walked) when the stream is emitted; -EPROTO. */
static int stream_next(const kvp_plan *plan, struct kvp_req *r,
		       struct kvp_stripe *st, struct kvp_sprog *sp, uint32_t s)
{
	int n;

	for (;;) {
		while (sp->ri < sp->nr) {
			if (kvp_plan_emit_range_start(plan, r->gids, s,
						      &sp->rr[sp->ri++],
						      &st->pos))
				return -EPROTO;
			if (!kvp_plan_emit_done(&st->pos))
				return 1;
		}
		if (!memcmp(&sp->posted, &sp->seen, sizeof(sp->seen))) {
			sp->emitted_lc = lc_of(&sp->posted);
			return 0;
		}
		n = kvp_progress_ranges(&sp->posted, &sp->seen, sp->rr);
		if (n < 0)
			return -EPROTO; /* unreachable: checked when read */
		sp->nr = (uint32_t)n;
		sp->ri = 0;
		sp->posted = sp->seen;
	}
}

/* A streamed chunk's READs: the ranges known now, window after window.
 * Returns the READs chained (the stream is emitted: close the chunk as a
 * bulk one), INT32_MAX when the window is full or the stream waits for
 * progress (the chunk stays), or -errno after failing the connection. */
static int stream_flush(kvp_agent *a, struct kvp_conn *c, struct chain *ch,
			const kvp_plan *plan, struct kvp_chunk *ck,
			struct kvp_stripe *st, uint32_t room)
{
	const struct kvp_eng *e = &a->engs[c->eng];
	const uint32_t nsrc = e->pc->pi.nsrc, s = ck->stripe % nsrc;
	struct kvp_sprog *sp = &e->sprog[ck->stripe];
	struct kvp_req *r = &a->reqs[ck->slot];
	int k = 0, n;

	for (;;) {
		if (!kvp_plan_emit_done(&st->pos)) {
			if (ch->n >= room)
				goto wait; /* the READ window is full */
			n = post_window(a, c, ch, plan, r, st,
					&sp->rr[sp->ri - 1], room - ch->n);
			if (kvp_unlikely(n < 0))
				goto fail;
			k += n;
			ck->posted += (uint32_t)n;
			if (n)
				st->qmask |= 1u << c->q;
			if (!kvp_plan_emit_done(&st->pos))
				goto wait; /* the window is full */
		}
		n = stream_next(plan, r, st, sp, s);
		if (n < 0)
			goto fail;
		if (!n)
			break;
	}
	if (sp->posted.tokens_all != KVP_TOKENS_END)
		goto wait; /* waits for progress */
	/* Emitted: the chunk closes as a bulk one (its last READ, or a
	 * marker when none went out in this flush). */
	return k;
wait:
	if (a->stream_events && k)
		mark_push(a, c, ch, ck->stripe, sp->emitted_lc);
	return INT32_MAX;
fail:
	chain_reset(ch);
	kvp__conn_fail(a, c, -EPROTO);
	return -EPROTO;
}

/* stream_events: a streamed chunk's close is a mark too (of every
 * layer), counted until its WK_LAST completes (chunk_data_in()). */
static inline void close_mark(kvp_agent *a, const struct kvp_conn *c,
			      const struct kvp_chunk *ck)
{
	if (a->stream_events && a->reqs[ck->slot].stream)
		a->engs[c->eng].sprog[ck->stripe].mout[c->q]++;
}

/* Whether chunk ck needs no more posting: its READs are all posted (or
 * in), or it had none. */
static inline int chunk_closed(const struct kvp_chunk *ck)
{
	return (ck->flags & (CH_READS | CH_CLOSED)) != CH_READS;
}

void kvp__conn_flush(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_eng *e = &a->engs[c->eng];
	struct chain ch = { a->swr, NULL, a->ssge, 0, 0, 0, a->dirty, 0, 0,
			    c->loop ? a->sig_every : e->sig_every };
	const kvp_plan *plan = e->pc ? e->pc->plan : NULL;
	const uint32_t mask = a->chunk_mask;
	struct ibv_send_wr *bad;
	uint32_t room, rlim, i;
	int err, k, again = 0;

	if (kvp_unlikely(c->state != CS_READY))
		return;
	room = c->sq_cap - c->outstanding;
	/* READs stop at the window (ch.n reaching rlim); notifications,
	 * lease and credit READs, FOLLOWs and markers only need SQ room,
	 * and go first: the window never starves them, and they count in
	 * it while in flight. */
	rlim = e->win > c->outstanding ? e->win - c->outstanding : 0;
	if (rlim > room || c->loop)
		rlim = room;
top:
	if (c->lw_post != c->lw_tail)
		post_leases(a, c, &ch, room);
	/* Chunks from c_post on, in order; one that cannot post now (a
	 * streamed chunk waiting for progress or credit) is passed, the
	 * ones after it go on. c_post: the first chunk not closed. */
	i = c->c_post;
	while (ch.n < room) {
		struct kvp_chunk *ck;
		struct kvp_stripe *st;

		/* Notifications, on a rank's first queue pair, in order. */
		if (!c->q && c->c_note != c->c_post &&
		    note_ready(a, c, &c->chunks[c->c_note & mask])) {
			if (credits(c)) {
				post_note(a, c, &ch,
					  &c->chunks[c->c_note++ & mask]);
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
		while (c->c_post != c->c_tail &&
		       chunk_closed(&c->chunks[c->c_post & mask]))
			c->c_post++;
		if (i - c->c_post > c->c_tail - c->c_post)
			i = c->c_post; /* c_post passed i */
		if (i == c->c_tail)
			break;
		ck = &c->chunks[i & mask];
		if (chunk_closed(ck)) {
			i++;
			continue;
		}
		st = &e->stripes[ck->stripe];
		k = 0;
		if (kvp_unlikely(a->reqs[ck->slot].stream)) {
			/* streamed: FOLLOW first, then its ranges as the
			 * producer rank publishes them */
			if (ck->flags & CH_FOLLOW) {
				if (!post_follow(a, c, &ch, ck, room - ch.n)) {
					if (room - ch.n < 3)
						break; /* no room */
					i++; /* waits for credit */
				}
				continue;
			}
			k = stream_flush(a, c, &ch, plan, ck, st, rlim);
			if (k < 0)
				return; /* the connection failed */
			if (k == INT32_MAX) {
				if (ch.n == room)
					break; /* the send queue is full */
				/* Waits for progress or READ window room: the
				 * chunks after it may still have FOLLOWs or
				 * markers to post. */
				i++;
				continue;
			}
		} else if (!kvp_plan_emit_done(&st->pos)) {
			if (ch.n >= rlim)
				break; /* the READ window is full */
			k = post_window(a, c, &ch, plan, &a->reqs[ck->slot], st,
					NULL, rlim - ch.n);
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
			close_push(a, c, i);
			close_mark(a, c, ck);
			lease_behind(a, c, &ch, ck->stripe, room);
		} else if (ck->posted) {
			if (ch.n == room)
				break; /* the marker needs room */
			post_marker(c, &ch);
			close_push(a, c, i);
			close_mark(a, c, ck);
			lease_behind(a, c, &ch, ck->stripe, room);
		} else {
			/* Nothing went through this queue pair. */
			ck->flags |= CH_CLOSED;
			chunk_in(a, c, ck, 0);
			chunks_retire(a, c);
			i++;
			continue;
		}
		ck->flags |= CH_CLOSED;
		i++;
	}
	while (c->c_post != c->c_tail &&
	       chunk_closed(&c->chunks[c->c_post & mask]))
		c->c_post++;
	/* A chunk that closed with nothing to read (a pull that reads
	 * nothing from this rank: a full prefix hit) has its notification
	 * go now, not at the connection's next flush, which an idle one
	 * never has. Once: the loop's top posts it, or reads credit. */
	if (!c->q && c->c_note != c->c_post && ch.n < room && !again) {
		again = 1;
		goto top;
	}
	/* Chunks passed while a streamed one waited may be in already. */
	if (c->c_data != c->c_post)
		chunks_retire(a, c);
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
	/* The window follows the READs this doorbell posted: one division
	 * per doorbell. */
	if (ch.reads)
		kvp__eng_window(a, e, ch.bytes / ch.reads);
	a->st.reads += ch.reads;
	a->st.read_bytes += ch.bytes;
	a->engs[c->eng].st.reads += ch.reads;
	a->engs[c->eng].st.read_bytes += ch.bytes;
}
