// SPDX-License-Identifier: MIT
/*
 * The producer's admission policy: which connect request gets a slot, which
 * waits (the wait queue) and which is turned down, which idle consumer rank
 * makes room (eviction) and which goes for being idle. Nothing here has
 * proved anything yet: with a secret, a connect request has (its hello's
 * proof, listen.c) before it gets here; without one, every peer is as
 * trusted as any other, and the limits below keep one address or one
 * claim from holding what others need.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* Turns a connect request down, telling the consumer why; retry_ms: when
 * a full producer expects room again (0: no hint). */
void kvp__reject_req(kvp_agent *a, struct rdma_cm_id *id, int err,
		   uint32_t reason, uint32_t retry_ms)
{
	const struct kvp_refusal rf = { .err = err, .reason = reason,
					.retry_ms = retry_ms,
					.version = KVP_HELLO_VERSION,
					.lib = kvp_version() };
	uint8_t r[KVP_REFUSE_VER_LEN];

	(void)kvp__reject(id, r, kvp__refusal_put(r, &rf));
	kvp__obs_refused(a, id, NULL, err, reason, retry_ms);
	kvp__destroy_id(id);
	a->st.refused++;
}

/* A free slot for queue pair qi of consumer rank (src, engine, rank), or
 * NULL and the reason. max_per_source counts ranks, not queue pairs: a
 * rank that holds a slot has its next queue pairs admitted up to
 * KVP_MAX_QPS (then -EUSERS), a new rank only while its address has fewer
 * than max_per_source ranks (-EUSERS); max_half_open handshakes under way
 * or every slot taken: -EBUSY. A handshake claims what it has not proved
 * yet, so that no address holds them all: one address has at most
 * half_per_source() of them under way, and a queue pair of a rank that
 * another handshake under way claims already waits for it to end (-EBUSY;
 * a ready one may be replaced, by a consumer that restarted). *head: the
 * rank's first. *retry_ms: the hint for the refused. */
static uint32_t half_per_source(const kvp_agent *a)
{
	return a->max_half_open - a->max_half_open / 4;
}

struct kvp_conn *kvp__slot_for(kvp_agent *a, const uint8_t *src,
				 uint64_t engine, uint32_t rank, uint32_t nq,
				 uint32_t qi, struct kvp_conn **hd, int *err,
				 uint32_t *retry_ms, int *full)
{
	struct kvp_conn *free_slot = NULL;
	uint32_t i, ranks = 0, all = 0, qps = 0, half = a->nhalf;
	uint32_t nfree = a->nprod - a->prod_hw, room, src_half = 0, dup = 0;

	*hd = NULL;
	for (i = 0; i < a->prod_hw; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_FREE) {
			if (!free_slot)
				free_slot = c;
			nfree++;
			continue;
		}
		all += c->rank_head != 0;
		if (memcmp(c->src, src, sizeof(c->src)))
			continue;
		ranks += c->rank_head != 0;
		src_half += (uint32_t)kvp__half_open(c);
		if (c->engine_id == engine && c->rank == rank) {
			qps++;
			if (c->rank_head)
				*hd = c;
			dup |= kvp__half_open(c) && c->q == qi;
		}
	}
	/* Never used yet: the next above the mark (prepared when taken). */
	if (!free_slot && a->prod_hw < a->nprod)
		free_slot = &a->conns[a->prod_hw];
	/* A rank's queue pairs come in together: a new rank needs room for
	 * all of them beyond the slots held for others' (so that no rank
	 * holds some of its QPs and waits for the rest while others do the
	 * same); a rank's next QP takes one held for it. */
	room = nfree > a->nreserved ? nfree - a->nreserved : 0;
	if (qps && *hd && (*hd)->resv)
		room = nfree;
	*err = qps ? (qps >= KVP_MAX_QPS ? -EUSERS : 0) :
		     (ranks >= a->max_per_source ? -EUSERS : 0);
	*full = *err && !qps ? 1 : 0; /* a new rank, its address full */
	/* A new rank beyond max_peers, or a queue pair beyond max_qps. */
	if (!*err && (half >= a->max_half_open || !free_slot ||
		      room < (qps ? 1 : nq) ||
		      (!qps && all >= a->prod_peers)))
		*err = -EBUSY;
	if (*err == -EBUSY && half < a->max_half_open)
		*full = 2; /* every slot taken */
	/* Its address's handshakes, or this very queue pair's: it waits
	 * for them to end, and evicts no one. */
	if (!*err && (dup || src_half >= half_per_source(a))) {
		*err = -EBUSY;
		*full = 0;
		half = a->max_half_open; /* the hint: a handshake's time */
	}
	*retry_ms = *err != -EBUSY	      ? KVP_RETRY_FULL_MS :
		    half >= a->max_half_open ? KVP_RETRY_HALF_MS :
					       KVP_RETRY_FULL_MS;
	return *err ? NULL : free_slot;
}

/* Disconnects every READY queue pair of c's consumer rank (its address,
 * engine and rank) with err; evict: to make room (a newcomer waits for
 * the slots to drain). */
static void rank_drop(kvp_agent *a, const struct kvp_conn *r, int evict,
		      int err)
{
	uint64_t engine = r->engine_id;
	uint32_t i, rank = r->rank;
	uint8_t src[sizeof(r->src)];

	memcpy(src, r->src, sizeof(src)); /* r goes with the others */

	for (i = 0; i < a->prod_hw; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state != CS_READY || c->engine_id != engine ||
		    c->rank != rank || memcmp(c->src, src, sizeof(src)))
			continue;
		if (evict) {
			c->evicted = 1;
			a->nevicting++;
		}
		kvp__conn_fail(a, c, err);
	}
}

/* Room for a newcomer that found none (from address src, or NULL: any
 * slot): the least recently used connected consumer rank (all its queue
 * pairs) with nothing in flight here -- it notified every request of its
 * engine expected or early, so it reads or follows none -- is
 * disconnected; its slots free once they drain. Ranks found busy are
 * passed over, at most EVICT_TRIES of them a call. While one rank's slots drain no other goes.
 * 1 when room is coming. */
#define EVICT_TRIES 16
int kvp__evict_idle(kvp_agent *a, const uint8_t *src)
{
	struct kvp_conn *lru = NULL;
	uint32_t i, tries, gen;

	if (a->nevicting)
		return 1;
	gen = ++a->evict_gen;
	for (tries = 0; tries < EVICT_TRIES; tries++) {
		lru = NULL;
		for (i = 0; i < a->prod_hw; i++) {
			struct kvp_conn *c = &a->conns[i];

			if (c->state != CS_READY || c->evict_mark == gen ||
			    (src && memcmp(c->src, src, sizeof(c->src))))
				continue;
			if (!lru || c->last_used < lru->last_used)
				lru = c;
		}
		if (!lru || !kvp__rank_busy(a, lru->engine_id, lru->rank))
			break;
		for (i = 0; i < a->prod_hw; i++)
			if (a->conns[i].engine_id == lru->engine_id &&
			    a->conns[i].rank == lru->rank)
				a->conns[i].evict_mark = gen;
		lru = NULL;
	}
	if (!lru)
		return 0;
	a->st.evictions++;
	kvp__obs_closed(a, lru, KVP_LOG_EVICTED);
	rank_drop(a, lru, 1, -ECONNRESET);
	return 1;
}

#define IDLE_BUDGET 8 /* ranks closed for idleness a call, the rest next */
void kvp__idle_sweep(kvp_agent *a, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	uint32_t i, left = IDLE_BUDGET;

	for (i = 0; i < a->prod_hw; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (!c->rank_head || c->state != CS_READY)
			continue;
		if (now < c->last_used || now - c->last_used < a->idle_ns) {
			if (c->last_used + a->idle_ns < next)
				next = c->last_used + a->idle_ns;
			continue;
		}
		if (kvp__rank_busy(a, c->engine_id, c->rank)) {
			c->last_used = now; /* checked again idle_ns later */
			if (now + a->idle_ns < next)
				next = now + a->idle_ns;
			continue;
		}
		if (!left) {
			next = now; /* the next poll goes on */
			break;
		}
		left--;
		a->st.idle_closes++;
		kvp__obs_closed(a, c, KVP_LOG_IDLE_CLOSED);
		rank_drop(a, c, 0, -ETIMEDOUT);
	}
	a->idle_at = next;
}

int kvp__wait_alloc(kvp_agent *a)
{
	a->wq_cap = a->nprod;
	a->wq = calloc(a->wq_cap, sizeof(*a->wq));
	return a->wq ? 0 : -ENOMEM;
}

void kvp__wait_free(kvp_agent *a)
{
	for (; a->wq && a->wq_n; a->wq_n--) {
		kvp__destroy_id(a->wq[a->wq_head].id);
		a->wq_head = (a->wq_head + 1) % a->wq_cap;
	}
	free(a->wq);
	a->wq = NULL;
}

/* Queues a connect request from address src that arrived at `since`
 * behind the others, or ahead of them (front: one that had waited
 * already); 0, or -ENOSPC when as many wait as there are slots, or when
 * three quarters of them are its address's (a queue no address fills). */
int kvp__wait_push(kvp_agent *a, struct rdma_cm_id *id, const uint8_t *src,
		     const uint8_t *pdata, uint32_t plen, uint8_t rr,
		     uint64_t since, int front)
{
	struct kvp_wait *w;
	uint32_t i, mine = 0;

	if (a->wq_n == a->wq_cap || plen > KVP_WAIT_PDATA)
		return -ENOSPC;
	for (i = 0; i < a->wq_n; i++)
		mine += !memcmp(a->wq[(a->wq_head + i) % a->wq_cap].src, src,
				sizeof(w->src));
	if (mine >= a->wq_cap - a->wq_cap / 4)
		return -ENOSPC;
	if (front)
		a->wq_head = (a->wq_head + a->wq_cap - 1) % a->wq_cap;
	w = &a->wq[front ? a->wq_head : (a->wq_head + a->wq_n) % a->wq_cap];
	a->wq_n++;
	w->id = id;
	w->since = since;
	w->plen = plen;
	w->rr = rr;
	memcpy(w->src, src, sizeof(w->src));
	memcpy(w->pdata, pdata, plen);
	return 0;
}

/* The next connect request waiting, into *w, when a handshake may start
 * (a handshake slot and a costly step free); those that waited the
 * handshake's bound are turned down first (come back later). 1 when *w
 * was taken. */
int kvp__wait_take(kvp_agent *a, uint64_t now, struct kvp_wait *w)
{
	/* (since may be later than now: queued in this poll) */
	while (a->wq_n && now > a->wq[a->wq_head].since + a->handshake_ns) {
		kvp__reject_req(a, a->wq[a->wq_head].id, -EBUSY,
				KVP_REASON_PEER_FULL, KVP_RETRY_FULL_MS);
		a->wq_head = (a->wq_head + 1) % a->wq_cap;
		a->wq_n--;
	}
	if (!a->wq_n || a->nhalf >= a->max_half_open || !a->costly_left)
		return 0;
	*w = a->wq[a->wq_head];
	a->wq_head = (a->wq_head + 1) % a->wq_cap;
	a->wq_n--;
	return 1;
}
