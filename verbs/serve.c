// SPDX-License-Identifier: MIT
/*
 * The producer's side of requests: which consumer engines are connected,
 * which requests are expected, and the notifications that release them.
 *
 * A request is keyed by (consumer engine, req_id): one consumer engine's
 * notifications never count for another's request of the same id. Its
 * notification count is frozen when first known (at kvp_agent_expect() if
 * a rank of that engine is connected, else at its first notification) and
 * each consumer rank counts once (a bitmap over ranks < KVP_MAX_TP_SIZE).
 * Reported requests stay as GONE tombstones for KVP_LINGER: a notification
 * for them (late, or replayed) is dropped, and an expect() of the same key
 * is refused with -EALREADY until then. Notifications ahead of expect()
 * (EARLY) are capped per connection and in total.
 *
 * Everything here is bounded by sizes fixed at listen: the table holds at
 * most max_inflight EXPECTED, early_cap EARLY and gone_cap GONE entries at
 * load <= 1/2; tombstones leave in FIFO order (one linger for all); the
 * deadline scan walks the table once per deadline passed.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define LINGER_NS 30000000000ull /* EARLY and GONE entries */
#define NO_BM UINT32_MAX
/* A rank whose queue pairs took a READ this recently may still be sent
 * its responses: busy. Below KVP_RETRY_FULL_MS, so that a newcomer
 * refused while a rank was found reading finds it quiet at its retry. */
#define PSN_QUIET_NS 200000000ull
#define PSN_MASK 0xffffffu

/* The lease table (lease.h): KVP_LEASE_PER_REQ buckets per request held,
 * page-aligned, registered for remote READ once; a random incarnation. */
static int lease_alloc(kvp_agent *a)
{
	uint64_t nb = kvp__pow2_at_least(KVP_LEASE_PER_REQ *
					 (uint64_t)a->max_inflight);
	size_t len;
	int err;

	for (a->lease_log2 = 0; (1ull << a->lease_log2) < nb; a->lease_log2++)
		;
	len = ((size_t)nb * KVP_LEASE_READ + 4095) & ~(size_t)4095;
	if (posix_memalign((void **)&a->lease, 4096, len))
		return -ENOMEM;
	memset(a->lease, 0, len);
	do {
		err = kvp__random(&a->lease_inc, sizeof(a->lease_inc));
		if (err)
			return err;
	} while (!a->lease_inc);
	return kvp__reg_mr(a->pd, a->lease, len, IBV_ACCESS_REMOTE_READ,
			   &a->lease_mr);
}

int kvp__serve_alloc(kvp_agent *a)
{
	uint32_t nbm, i;

	a->early_cap = a->max_inflight;
	a->early_per_conn = a->max_inflight / 8 > 8 ? a->max_inflight / 8 : 8;
	a->gone_cap = a->max_inflight;
	a->tab_mask = kvp__pow2_at_least(2 * (a->max_inflight + a->early_cap +
					 a->gone_cap)) - 1;
	nbm = a->max_inflight + a->early_cap;
	a->tab = calloc((size_t)a->tab_mask + 1, sizeof(*a->tab));
	a->bm = calloc((size_t)nbm * KVP_BM_WORDS, sizeof(*a->bm));
	a->bm_free = calloc(nbm, sizeof(*a->bm_free));
	a->gone = calloc(a->gone_cap, sizeof(*a->gone));
	a->peng = calloc(a->prod_peers, sizeof(*a->peng));
	a->hint = calloc((size_t)a->tab_mask + 1, sizeof(*a->hint));
	/* Streaming: a follower record per request the producer can hold,
	 * per connection slot, and the records their WRITEs send. */
	a->fol_per = a->max_inflight;
	a->fol = calloc((size_t)a->nprod * a->fol_per, sizeof(*a->fol));
	a->fol_rec = calloc((size_t)a->nprod * a->fol_per, KVP_PROG_REC);
	a->fol_mr = calloc(a->nprod, sizeof(*a->fol_mr));
	if (!a->tab || !a->bm || !a->bm_free || !a->gone || !a->peng ||
	    !a->hint || !a->fol || !a->fol_rec || !a->fol_mr) {
		kvp__serve_free(a);
		return -ENOMEM;
	}
	for (i = 0; i < nbm; i++)
		a->bm_free[i] = nbm - 1 - i;
	a->bm_nfree = nbm;
	a->next_deadline = UINT64_MAX;
	return lease_alloc(a);
}

void kvp__serve_free(kvp_agent *a)
{
	uint32_t i;

	for (i = 0; a->fol_mr && i < a->nprod; i++)
		kvp__dereg_mr(a->fol_mr[i]);
	free(a->fol_mr);
	a->fol_mr = NULL;
	free(a->fol);
	free(a->fol_rec);
	a->fol = NULL;
	a->fol_rec = NULL;
	kvp__dereg_mr(a->lease_mr);
	a->lease_mr = NULL;
	free(a->lease);
	a->lease = NULL;
	free(a->tab);
	free(a->bm);
	free(a->bm_free);
	free(a->gone);
	free(a->peng);
	free(a->hint);
	a->hint = NULL;
	a->tab = NULL;
	a->bm = NULL;
	a->bm_free = NULL;
	a->gone = NULL;
	a->peng = NULL;
}

/* ---- consumer engines ---------------------------------------------------- */

/* The PSN connection c's QP expects next, as the baseline that
 * rank_reading() compares with: no READ seen yet. */
static void psn_base(struct kvp_conn *c)
{
	c->psn_msgs = 0;
	c->psn_at = 0;
	c->psn_gen = kvp__qp_rq_psn(c->qp, &c->psn) ? c->gen + 1 : c->gen;
}

/* Whether consumer rank `rank` of engine `engine` READ lately: a pull
 * before kvp_agent_expect() leaves nothing in the table (its
 * notification comes after the READs), and a one-sided READ raises no
 * completion here. What shows it is the responder's PSN: each message
 * the rank sends takes one (counted in psn_msgs), each READ as many as
 * its response packets; so the QP's next expected PSN moving by more
 * than the messages taken since the last look is READs (or the rank
 * reading its credit counter: it has notifications to send). Busy then,
 * and for PSN_QUIET_NS after (responses may still flow); a look that
 * cannot tell (no baseline for this life, the query failed) is busy too
 * and takes one. A rank that sent nothing for idle_ns is not looked at:
 * the idle sweep decides on its messages and the table alone (a rank
 * that READs for idle_ns without a notification is taken for idle, as
 * before). */
static int rank_reading(const kvp_agent *a, uint64_t engine, uint32_t rank)
{
	const uint64_t now = kvp__now_ns();
	uint64_t last = 0;
	uint32_t i, psn;
	int busy = 0;

	for (i = 0; i < a->prod_hw; i++) {
		const struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_READY && c->engine_id == engine &&
		    c->rank == rank && c->last_used > last)
			last = c->last_used;
	}
	if (!last || now - last >= a->idle_ns)
		return 0;
	for (i = 0; i < a->prod_hw; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state != CS_READY || c->engine_id != engine ||
		    c->rank != rank)
			continue;
		if (c->psn_gen != c->gen || kvp__qp_rq_psn(c->qp, &psn)) {
			psn_base(c);
			c->psn_at = now;
			busy = 1;
			continue;
		}
		if (((psn - c->psn) & PSN_MASK) > c->psn_msgs)
			c->psn_at = now;
		c->psn = psn;
		c->psn_msgs = 0;
		if (c->psn_at && now - c->psn_at < PSN_QUIET_NS)
			busy = 1;
	}
	return busy;
}

int kvp__rank_busy(const kvp_agent *a, uint64_t engine, uint32_t rank)
{
	const struct kvp_ent *e;
	uint32_t i;

	for (i = 0; i <= a->tab_mask; i++) {
		e = &a->tab[i];
		if ((e->state != EN_EXPECTED && e->state != EN_EARLY) ||
		    e->engine_id != engine)
			continue;
		/* Not yet notified by this rank: it may be reading it. */
		if (e->bm == NO_BM || rank >= KVP_MAX_TP_SIZE ||
		    !(a->bm[(size_t)e->bm * KVP_BM_WORDS + rank / 64] &
		      1ull << (rank % 64)))
			return 1;
	}
	return rank_reading(a, engine, rank);
}

static struct kvp_peng *engine_find(kvp_agent *a, uint64_t engine_id)
{
	uint32_t i;

	for (i = 0; i < a->prod_peers; i++)
		if (a->peng[i].nconns && a->peng[i].engine_id == engine_id)
			return &a->peng[i];
	return NULL;
}

int kvp__engine_join(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_peng *e = engine_find(a, c->engine_id);
	uint32_t i;

	if (e) {
		if (e->tp_size != c->peer_tp || e->expected != c->expected) {
			/* Another rank of that engine said otherwise. */
			c->reason = e->tp_size != c->peer_tp ?
					    KVP_REASON_TP_SIZE :
					    KVP_REASON_LAYOUT;
			return -EPROTO;
		}
	} else {
		for (i = 0; i < a->prod_peers && a->peng[i].nconns; i++)
			;
		if (i == a->prod_peers)
			return -EBUSY; /* unreachable: a record per slot */
		e = &a->peng[i];
		e->engine_id = c->engine_id;
		e->tp_size = c->peer_tp;
		e->expected = c->expected;
	}
	e->nconns++;
	c->counted = 1;
	/* Before the rank can READ: our blob (the keys) is not sent yet. */
	psn_base(c);
	return 0;
}

void kvp__engine_leave(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_peng *e;

	if (!c->counted)
		return;
	c->counted = 0;
	e = engine_find(a, c->engine_id);
	if (e)
		e->nconns--;
}

/* ---- the table: open addressing, linear probing -------------------------- */

static uint32_t hint_slot(const kvp_agent *a, uint64_t id)
{
	return (uint32_t)((id * 0x9e3779b97f4a7c15ull) >> 32) & a->tab_mask;
}

static uint32_t tab_hash(const kvp_agent *a, uint64_t engine, uint64_t id)
{
	uint64_t h = (id ^ (engine * 0xbf58476d1ce4e5b9ull)) *
		     0x9e3779b97f4a7c15ull;

	return (uint32_t)(h >> 32) & a->tab_mask;
}

static struct kvp_ent *tab_find(kvp_agent *a, uint64_t engine, uint64_t id)
{
	uint32_t i = tab_hash(a, engine, id);

	for (;; i = (i + 1) & a->tab_mask) {
		struct kvp_ent *e = &a->tab[i];

		if (e->state == EN_FREE)
			return NULL;
		if (e->req_id == id && e->engine_id == engine)
			return e;
	}
}

/* The caller has checked that the key is absent and that its kind of
 * entry has room (so the table is at most half full). */
static struct kvp_ent *tab_insert(kvp_agent *a, uint64_t engine, uint64_t id,
				  uint32_t state)
{
	uint32_t i = tab_hash(a, engine, id);
	struct kvp_ent *e;

	while (a->tab[i].state != EN_FREE)
		i = (i + 1) & a->tab_mask;
	e = &a->tab[i];
	memset(e, 0, sizeof(*e));
	e->req_id = id;
	e->engine_id = engine;
	e->state = state;
	e->bm = NO_BM;
	e->fol = NO_FOL;
	a->tab_used++;
	return e;
}

/* Backward-shift deletion keeps every probe chain unbroken. */
static void tab_remove(kvp_agent *a, struct kvp_ent *e)
{
	uint32_t i = (uint32_t)(e - a->tab), j = i, k;

	a->tab[i].state = EN_FREE;
	a->tab_used--;
	for (;;) {
		j = (j + 1) & a->tab_mask;
		if (a->tab[j].state == EN_FREE)
			return;
		k = tab_hash(a, a->tab[j].engine_id, a->tab[j].req_id);
		/* Move j back to i unless its home k lies cyclically in
		 * (i, j]. */
		if (i <= j ? (i < k && k <= j) : (i < k || k <= j))
			continue;
		a->tab[i] = a->tab[j];
		a->tab[j].state = EN_FREE;
		i = j;
	}
}

static int bm_take(kvp_agent *a, struct kvp_ent *e)
{
	if (!a->bm_nfree)
		return -EBUSY; /* unreachable: one per EXPECTED or EARLY */
	e->bm = a->bm_free[--a->bm_nfree];
	memset(a->bm + (size_t)e->bm * KVP_BM_WORDS, 0,
	       KVP_BM_WORDS * sizeof(*a->bm));
	return 0;
}

static void bm_give(kvp_agent *a, struct kvp_ent *e)
{
	if (e->bm == NO_BM)
		return;
	a->bm_free[a->bm_nfree++] = e->bm;
	e->bm = NO_BM;
}

/* An EARLY entry stops being early: its creator's count goes down if the
 * creating connection is still the one it was. */
static void early_end(kvp_agent *a, struct kvp_ent *e)
{
	struct kvp_conn *c;

	a->nearly--;
	if ((e->owner & 0xffff) >= a->nconns)
		return;
	c = &a->conns[e->owner & 0xffff];
	if (c->state != CS_FREE && (c->gen & 0xffff) == e->owner >> 16 &&
	    c->nearly)
		c->nearly--;
}

static void gone_pop(kvp_agent *a)
{
	const struct kvp_gone *g = &a->gone[a->gone_head % a->gone_cap];
	struct kvp_ent *e = tab_find(a, g->engine_id, g->req_id);

	/* The entry may have been taken over by a new expect() since. */
	if (e && e->state == EN_GONE && e->deadline == g->deadline)
		tab_remove(a, e);
	a->gone_head++;
}

/* ---- streaming: followers and their progress WRITEs -------------------- */

/* Lets go of every follower of e: no more WRITEs for it (one in flight
 * completes on its own). */
static void fol_detach_all(kvp_agent *a, struct kvp_ent *e)
{
	uint32_t i = e->fol;

	while (i != NO_FOL) {
		struct kvp_fol *f = &a->fol[i];

		i = f->next;
		f->used = 0;
		f->dirty = 0;
		f->next = NO_FOL;
	}
	e->fol = NO_FOL;
}

/* WRITEs follower i's record: entry e's progress, into its record on
 * connection c. 0, or -EIO when the post failed: c has failed then, and
 * may have been released already, its followers gone from their chains
 * (kvp__follow_conn_gone()): a caller walking a chain or c's followers
 * must not go on from where it was. */
static int fol_write(kvp_agent *a, struct kvp_conn *c, uint32_t i,
		     const struct kvp_ent *e)
{
	struct kvp_fol *f = &a->fol[i];
	uint8_t *rec = a->fol_rec + (size_t)i * KVP_PROG_REC;
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	kvp__put64(rec, f->tag);
	kvp__put64(rec + 8, e->prog.tokens_all);
	kvp__put64(rec + 16, e->prog.tokens_cur);
	kvp__put32(rec + 24, e->prog.layers_cur);
	kvp__put32(rec + 28, 0);
	kvp__put64(rec + 32, e->gen);
	kvp__put64(rec + 40, kvp__prog_check(c->rec_key, f->tag,
					     e->prog.tokens_all,
					     e->prog.tokens_cur,
					     e->prog.layers_cur, e->gen));
	memset(&wr, 0, sizeof(wr));
	sge.addr = (uint64_t)(uintptr_t)rec;
	sge.length = KVP_PROG_REC;
	sge.lkey = a->fol_mr[i / a->fol_per]->lkey;
	wr.wr_id = kvp__wrid(WK_PROGRESS, c->gen, c->idx, i);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = c->ptab_addr + (uint64_t)f->rec * KVP_PROG_REC;
	wr.wr.rdma.rkey = c->ptab_rkey;
	if (kvp__post_send(c->qp, &wr, &bad)) {
		kvp__conn_fail(a, c, -EIO);
		return -EIO;
	}
	f->writing = 1;
	f->dirty = 0;
	c->prog_out++;
	a->st.progress_writes++;
	return 0;
}

/* Follower i should see entry e's progress: now, or once its WRITE in
 * flight (or the send queue's room) allows. 0, or -EIO as fol_write(). */
static int fol_kick(kvp_agent *a, uint32_t i, const struct kvp_ent *e)
{
	struct kvp_conn *c = &a->conns[i / a->fol_per];
	struct kvp_fol *f = &a->fol[i];

	if (c->state != CS_READY)
		return 0;
	/* (its slot's records not registered yet: kvp__fol_register()) */
	if (f->writing || c->prog_out >= PROG_SQ || !a->fol_mr[c->idx]) {
		f->dirty = 1;
		c->prog_dirty |= !f->writing;
		return 0;
	}
	return fol_write(a, c, i, e);
}

/* The entry a follower follows, if it still does. */
static struct kvp_ent *fol_entry(kvp_agent *a, const struct kvp_fol *f);

/* Followers of c that waited (for room, or for the slot's records to be
 * registered): at most the room there is. */
static void fol_flush_dirty(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t k, end = (c->idx + 1) * a->fol_per;

	if (!c->prog_dirty)
		return;
	c->prog_dirty = 0;
	for (k = c->idx * a->fol_per; k < end; k++) {
		struct kvp_fol *f = &a->fol[k];
		struct kvp_ent *e;

		if (!f->used || !f->dirty || f->writing)
			continue;
		if (c->prog_out >= PROG_SQ) {
			c->prog_dirty = 1;
			return;
		}
		e = fol_entry(a, f);
		if (!e)
			f->dirty = 0;
		else if (fol_write(a, c, k, e))
			return; /* c failed */
	}
}

void kvp__fol_register(kvp_agent *a)
{
	const size_t fl = (size_t)a->fol_per * KVP_PROG_REC;
	uint32_t i;

	for (i = 0; i < a->prod_hw && a->nfol_wait && a->costly_left; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (!c->fol_wait)
			continue;
		c->fol_wait = 0;
		a->nfol_wait--;
		a->costly_left--;
		/* Only ever the source of WRITEs: local read access. */
		if (kvp__reg_mr(a->pd, a->fol_rec + c->idx * fl, fl, 0,
				&a->fol_mr[c->idx])) {
			kvp__conn_fail(a, c, -ENOMEM);
			continue;
		}
		a->nfol++;
		if (c->state == CS_READY)
			fol_flush_dirty(a, c);
	}
}

void kvp__progress_wc(kvp_agent *a, struct kvp_conn *c,
		      const struct ibv_wc *wc)
{
	uint32_t i = WRID_VALUE(wc->wr_id);
	struct kvp_fol *f;

	if (c->state != CS_READY)
		return;
	if (wc->status != IBV_WC_SUCCESS) {
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		return;
	}
	if (i / a->fol_per != c->idx)
		return; /* unreachable: our own wr_id */
	f = &a->fol[i];
	f->writing = 0;
	c->prog_out--;
	if (f->used && f->dirty) {
		struct kvp_ent *e = fol_entry(a, f);

		if (e && fol_write(a, c, i, e))
			return; /* c failed */
	}
	fol_flush_dirty(a, c);
}

/* Follower k lets go: out of its entry's chain, and free. A WRITE of it
 * in flight completes on its own (kvp__progress_wc() finds it unused). */
static void fol_drop(kvp_agent *a, uint32_t k)
{
	struct kvp_fol *f = &a->fol[k];
	struct kvp_ent *e;
	uint32_t *p;

	if (f->used && (e = fol_entry(a, f)) != NULL) {
		for (p = &e->fol; *p != NO_FOL; p = &a->fol[*p].next)
			if (*p == k) {
				*p = f->next;
				break;
			}
	}
	memset(f, 0, sizeof(*f));
	f->next = NO_FOL;
}

/* Connection c's followers of entry e let go: the consumer rank on c
 * notified e, so it reads none of it any more, and its records (the
 * request's slot) are its own to reuse: a follower left attached would
 * WRITE a later request's progress record there. Linear in e's
 * followers. */
static void fol_drop_conn(kvp_agent *a, struct kvp_ent *e,
			  const struct kvp_conn *c)
{
	uint32_t *p = &e->fol, k;

	while (*p != NO_FOL) {
		k = *p;
		if (k / a->fol_per != c->idx) {
			p = &a->fol[k].next;
			continue;
		}
		*p = a->fol[k].next;
		memset(&a->fol[k], 0, sizeof(a->fol[k]));
		a->fol[k].next = NO_FOL;
	}
}

void kvp__follow_conn_gone(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t k, end = (c->idx + 1) * a->fol_per;

	/* No TABLE ever came on the slot: no follower was ever taken, and
	 * its records' pages stay untouched. One that waited for them
	 * waits no more. A TABLE taken (ptab_n) may have followers though
	 * the records' registration failed (kvp__fol_register() fails the
	 * connection then): they go, or the slot's next connection would
	 * inherit them (fuzz_inbox: inbox-stale-follower). */
	if (c->fol_wait) {
		c->fol_wait = 0;
		a->nfol_wait--;
	} else if (!c->ptab_n && (!a->fol_mr || !a->fol_mr[c->idx])) {
		return;
	}
	for (k = c->idx * a->fol_per; a->fol && k < end; k++)
		fol_drop(a, k);
}

/* Reports an EXPECTED entry and leaves it as a tombstone. */
static void ent_report(kvp_agent *a, struct kvp_ent *e, uint32_t type,
		       uint64_t now)
{
	struct kvp_event ev;
	struct kvp_gone *g;
	uint64_t engine = e->engine_id, id = e->req_id;

	memset(&ev, 0, sizeof(ev));
	ev.type = type;
	ev.req_id = id;
	ev.engine_id = engine;
	if (type == KVP_EV_EXPIRED) {
		const struct kvp_hint *h = &a->hint[hint_slot(a, id)];

		/* No rank of the engine expected notified, another engine
		 * did: a scheduler that told the two sides different
		 * consumer engines. */
		ev.reason = !e->count && h->req_id == id &&
					    h->engine_id != engine ?
				    KVP_REASON_OTHER_ENGINE :
				    KVP_REASON_TIMEOUT;
	}
	/* Before the engine can hear of it, so before it reuses a block:
	 * a consumer's lease READ from now on finds it gone. */
	kvp__lease_withdraw(a->lease + (size_t)(e->lease / KVP_LEASE_BUCKET) *
					       KVP_LEASE_READ,
			    e->lease % KVP_LEASE_BUCKET);
	kvp__ev_push(a, &ev);
	if (type == KVP_EV_RELEASED)
		a->st.released++;
	else
		a->st.expired++;
	bm_give(a, e);
	fol_detach_all(a, e);
	if (a->gone_tail - a->gone_head == a->gone_cap) {
		gone_pop(a); /* may move e: find it again */
		e = tab_find(a, engine, id);
	}
	e->state = EN_GONE;
	e->count = 0;
	e->deadline = now + LINGER_NS;
	g = &a->gone[a->gone_tail++ % a->gone_cap];
	g->engine_id = engine;
	g->req_id = id;
	g->deadline = e->deadline;
}

/* Whether consumer engine `engine` holds its share of the early entries:
 * once half of them are taken, an engine keeps at most early_cap over the
 * number of consumer engines connected, so that the ranks of one engine
 * cannot take the slots of another (each rank alone is held to
 * early_per_conn). One pass over the table, only then. */
static int early_share_full(const kvp_agent *a, uint64_t engine)
{
	uint32_t i, n = 0, engines = 0;

	if (a->nearly < a->early_cap / 2)
		return 0;
	for (i = 0; i < a->prod_peers; i++)
		engines += a->peng[i].nconns != 0;
	if (engines < 2)
		return 0;
	for (i = 0; i <= a->tab_mask; i++)
		n += a->tab[i].state == EN_EARLY &&
		     a->tab[i].engine_id == engine;
	return n >= a->early_cap / engines;
}

/* An entry for a notification (or a FOLLOW) ahead of kvp_agent_expect(),
 * within the early caps, or NULL. */
static struct kvp_ent *early_entry(kvp_agent *a, struct kvp_conn *c,
				   uint64_t engine, uint64_t id)
{
	struct kvp_ent *e;

	if (a->nearly >= a->early_cap || c->nearly >= a->early_per_conn ||
	    early_share_full(a, engine))
		return NULL;
	e = tab_insert(a, engine, id, EN_EARLY);
	if (bm_take(a, e)) {
		tab_remove(a, e);
		return NULL;
	}
	e->deadline = kvp__now_ns() + LINGER_NS;
	e->owner = (c->gen & 0xffff) << 16 | c->idx;
	a->hint[hint_slot(a, id)].req_id = id;
	a->hint[hint_slot(a, id)].engine_id = engine;
	a->nearly++;
	c->nearly++;
	if (e->deadline < a->next_deadline)
		a->next_deadline = e->deadline;
	return e;
}

static struct kvp_ent *fol_entry(kvp_agent *a, const struct kvp_fol *f)
{
	struct kvp_ent *e = tab_find(a, f->engine_id, f->req_id);

	return e && e->state != EN_GONE ? e : NULL;
}

/* TABLE: where this consumer rank's progress records are. Once per
 * connection. The slot's records, which our WRITEs send, are registered
 * after its first TABLE (by the poll, as a costly step: not in the
 * completion drain) and kept: a slot that never serves a streaming
 * consumer rank (most are not: only a rank's first queue pair carries
 * FOLLOWs) never pins their pages. Its followers wait for it. */
static int table_received(kvp_agent *a, struct kvp_conn *c, const uint8_t *m)
{
	uint32_t n = kvp__get32(m + 20);

	if (c->ptab_n || kvp__get32(m + 4) != c->rank ||
	    kvp__get64(m + 24) != c->engine_id || !n ||
	    n > KVP_PROG_RECS_MAX || !kvp__get64(m + 8))
		return -EPROTO;
	if (!a->fol_mr[c->idx] && !c->fol_wait) {
		c->fol_wait = 1;
		a->nfol_wait++;
	}
	c->ptab_addr = kvp__get64(m + 8);
	c->ptab_rkey = kvp__get32(m + 16);
	c->ptab_n = n;
	return 0;
}

/* FOLLOW: the consumer rank follows a request's progress (expected or
 * not yet: an early entry holds it), and gets what is published so far
 * at once. */
static int follow_received(kvp_agent *a, struct kvp_conn *c,
			   const uint8_t *m)
{
	uint64_t id = kvp__get64(m + 8), engine = kvp__get64(m + 16);
	uint32_t rec = kvp__get32(m + 24), k, end;
	struct kvp_ent *e;
	struct kvp_fol *f;

	c->last_used = kvp__now_ns();

	if (kvp__get32(m + 4) != c->rank || engine != c->engine_id ||
	    !c->ptab_n || rec >= c->ptab_n)
		return -EPROTO;
	e = tab_find(a, engine, id);
	if (e && e->state == EN_GONE)
		return -EPROTO; /* stale */
	if (!e)
		e = early_entry(a, c, engine, id);
	if (!e)
		return -EBUSY;
	end = (c->idx + 1) * a->fol_per;
	/* A record is the consumer's again once it is done with the request
	 * it was lent to (it notified it, which let the follower go): one
	 * still attached to it (its notification was dropped) would write
	 * into the new request's record. */
	for (k = c->idx * a->fol_per; k < end; k++)
		if (a->fol[k].used && a->fol[k].rec == rec)
			fol_drop(a, k);
	for (k = c->idx * a->fol_per; k < end && a->fol[k].used; k++)
		;
	if (k == end)
		return -EBUSY;
	f = &a->fol[k]; /* fol_drop() moves nothing in the table: e stands */
	f->engine_id = engine;
	f->req_id = id;
	f->rec = rec;
	f->tag = kvp__get32(m + 28);
	f->used = 1;
	f->dirty = 0;
	f->next = e->fol;
	e->fol = k;
	/* A failed post fails c: nothing here walks on after it. */
	if (e->prog.tokens_cur)
		(void)fol_kick(a, k, e);
	return 0;
}

void kvp__note_msg(kvp_agent *a, struct kvp_conn *c, const uint8_t *m,
		   uint32_t len)
{
	struct kvp_ent *e;
	uint64_t id, engine, *w;
	uint32_t rank;

	c->psn_msgs++; /* one PSN: not a READ (rank_reading()) */
	if (len == KVP_NOTE_LEN && kvp__get32(m) == KVP_BYE_MAGIC) {
		c->bye = 1; /* the consumer rank closes: not a note */
		return;
	}
	c->last_used = kvp__now_ns();
	if (len == KVP_NOTE_LEN && kvp__get32(m) == KVP_TABLE_MAGIC) {
		if (table_received(a, c, m))
			goto drop;
		return;
	}
	if (len == KVP_NOTE_LEN && kvp__get32(m) == KVP_FOLLOW_MAGIC) {
		if (follow_received(a, c, m))
			goto drop;
		a->st.follows++;
		return;
	}
	if (len != KVP_NOTE_LEN || kvp__get32(m) != KVP_NOTE_MAGIC)
		goto drop;
	rank = kvp__get32(m + 4);
	id = kvp__get64(m + 8);
	engine = kvp__get64(m + 16);
	/* Foreign: another engine or rank than this connection's. */
	if (engine != c->engine_id || rank != c->rank ||
	    rank >= KVP_MAX_TP_SIZE)
		goto drop;
	/* The rank read it while we did not hold it (it ended FAILED
	 * there): whatever we know of it now, done with it. */
	if (kvp__get64(m + 24) & KVP_NOTE_UNHELD)
		a->st.unheld++;
	e = tab_find(a, engine, id);
	if (e && e->state == EN_GONE)
		goto drop; /* stale: reported already */
	if (!e) {
		e = early_entry(a, c, engine, id);
		if (!e)
			goto drop;
	}
	w = a->bm + (size_t)e->bm * KVP_BM_WORDS + rank / 64;
	if (*w & 1ull << (rank % 64))
		goto drop; /* duplicate */
	*w |= 1ull << (rank % 64);
	if (e->fol != NO_FOL)
		fol_drop_conn(a, e, c);
	if (!e->expected)
		e->expected = c->expected;
	e->count++;
	a->st.notes_recv++;
	if (e->state == EN_EXPECTED && e->count >= e->expected)
		ent_report(a, e, KVP_EV_RELEASED, kvp__now_ns());
	return;
drop:
	a->st.notes_dropped++;
}

void kvp__note_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	uint32_t i = WRID_VALUE(wc->wr_id);

	if (c->state != CS_READY) {
		/* Flushed buffers of a dying connection, or a note that
		 * arrived while it was going down. */
		if (wc->status == IBV_WC_SUCCESS)
			a->st.notes_dropped++;
		return;
	}
	if (wc->status != IBV_WC_SUCCESS) {
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		return;
	}
	if (i >= c->credits)
		return;
	kvp__note_msg(a, c, c->notes + (size_t)i * KVP_NOTE_LEN,
		      wc->byte_len);
	/* The buffer goes back, and with it the consumer's credit. */
	if (!kvp__post_note_recv(a, c, i))
		a->ctr[c->idx]++;
}

int kvp_agent_publish(kvp_agent *a, uint64_t engine_id, uint64_t req_id,
		      const struct kvp_progress *p)
{
	struct kvp_emit_range r[3];
	struct kvp_ent *e;
	uint32_t i, next;
	int n;

	if (!a || !a->producer || !p)
		return -EINVAL;
	e = tab_find(a, engine_id, req_id);
	if (!e || e->state != EN_EXPECTED)
		return -ENOENT;
	n = kvp_progress_ranges(&e->prog, p, r);
	if (n <= 0)
		return n; /* 0: nothing new; -EINVAL, -ERANGE */
	e->prog = *p;
	/* A failed post fails its connection, which may drop that
	 * connection's followers from this very chain (and zero them):
	 * the walk starts again from the head then. Each restart is a
	 * connection gone, whose followers are skipped or gone after it;
	 * one already written is marked dirty and written once more. */
	for (i = e->fol; i != NO_FOL; i = next) {
		next = a->fol[i].next;
		if (fol_kick(a, i, e))
			next = e->fol;
	}
	a->st.publishes++;
	return 0;
}

int kvp_agent_expect(kvp_agent *a, uint64_t engine_id, uint64_t req_id,
		     uint64_t deadline_ns)
{
	struct kvp_peng *pe;
	struct kvp_ent *e;
	uint8_t *bucket;
	uint64_t gen;
	uint32_t b;
	int i;

	if (!a || !a->producer)
		return -EINVAL;
	e = tab_find(a, engine_id, req_id);
	if (e && e->state == EN_EXPECTED)
		return -EEXIST;
	if (e && e->state == EN_GONE)
		return -EALREADY;
	if (a->nheld >= a->max_inflight)
		return -EBUSY;
	/* Its lease first: all that can fail before the table changes. */
	b = kvp__lease_bucket(engine_id, req_id, a->lease_log2);
	bucket = a->lease + (size_t)b * KVP_LEASE_READ;
	if (!++a->lease_ctr)
		a->lease_ctr = 1; /* 2^32 grants: gen 0 means free */
	gen = (uint64_t)a->lease_inc << 32 | a->lease_ctr;
	i = kvp__lease_grant(bucket, engine_id, req_id, gen);
	if (i < 0) {
		a->st.lease_full++;
		return -ENOSPC;
	}
	if (e) {
		early_end(a, e);
		e->state = EN_EXPECTED;
	} else {
		e = tab_insert(a, engine_id, req_id, EN_EXPECTED);
		if (bm_take(a, e)) { /* unreachable: one per EXPECTED */
			tab_remove(a, e);
			kvp__lease_withdraw(bucket, (uint32_t)i);
			return -EBUSY;
		}
	}
	e->lease = b * KVP_LEASE_BUCKET + (uint32_t)i;
	e->gen = gen;
	pe = engine_find(a, engine_id);
	if (!e->expected && pe)
		e->expected = pe->expected;
	e->deadline = deadline_ns;
	a->nheld++;
	if (e->expected && e->count >= e->expected) {
		ent_report(a, e, KVP_EV_RELEASED, kvp__now_ns());
		return 0;
	}
	if (deadline_ns < a->next_deadline)
		a->next_deadline = deadline_ns;
	return 0;
}

/* Expires requests and drops early notifications nobody expected. */
static void tab_scan(kvp_agent *a, uint64_t now)
{
	uint64_t next = UINT64_MAX;
	uint32_t i = 0;

	while (i <= a->tab_mask) {
		struct kvp_ent *e = &a->tab[i];

		if (e->state == EN_FREE || e->state == EN_GONE) {
			i++;
			continue;
		}
		if (e->deadline <= now) {
			if (e->state == EN_EXPECTED) {
				/* Slot i now holds a tombstone, or an entry
				 * shifted by one leaving: look again. */
				ent_report(a, e, KVP_EV_EXPIRED, now);
				continue;
			}
			a->st.notes_dropped += e->count;
			early_end(a, e);
			bm_give(a, e);
			fol_detach_all(a, e);
			tab_remove(a, e);
			continue; /* slot i may hold a shifted entry now */
		}
		if (e->deadline < next)
			next = e->deadline;
		i++;
	}
	a->next_deadline = next;
}

void kvp__serve_timers(kvp_agent *a, uint64_t now)
{
	while (a->gone_head != a->gone_tail &&
	       a->gone[a->gone_head % a->gone_cap].deadline <= now)
		gone_pop(a);
	if (now >= a->next_deadline)
		tab_scan(a, now);
}
