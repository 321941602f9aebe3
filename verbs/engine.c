// SPDX-License-Identifier: MIT
/*
 * The consumer's producer engines: handles, the non-blocking handshake
 * that kvp_agent_poll() drives, the checks on what producer ranks send,
 * failure and reconnection. Their plans come from plans.c, their
 * connections' handshakes from connect.c.
 *
 * An engine's handshake, one step per poll at most:
 *   EP_FIRST  connect the rank at the start of our notify cover (always in
 *             the plan's notify list) to learn the layout, unless a blob
 *             was carried;
 *   (plan)    look the layout's geometry up in the plan cache, compile on
 *             a miss;
 *   EP_ROOM   wait for connection slots within max_qps, if an idle engine
 *             had to go to make room (make_room());
 *   EP_REST   connect every other rank the plan reads from or notifies,
 *             check each blob against the first (same engine, geometry)
 *             and against its carried bytes; then UP.
 * A rank lost at any point takes the whole engine down (FAILING while its
 * connections drain, then DOWN): its requests fail with their ids, other
 * engines are untouched, and the agent's memory stays registered for the
 * reconnect.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define ENG_IDX(h) (((h) & 0xffffu) - 1)
#define ENG_GEN(h) ((h) >> 16)
#define IP_MAX sizeof(((struct kvp_peer_addr *)0)->ip)

int kvp__engines_alloc(kvp_agent *a)
{
	uint32_t i;

	a->engs = calloc(a->max_peers, sizeof(*a->engs));
	a->pcache = calloc(a->max_peers, sizeof(*a->pcache));
	if (!a->engs || !a->pcache)
		return -ENOMEM;
	for (i = 0; i < a->max_peers; i++)
		a->engs[i].gen = 1;
	return 0;
}

static void carried_drop(struct kvp_eng *e)
{
	uint32_t i;

	for (i = 0; e->craw && i < e->n; i++)
		free(e->craw[i]);
	free(e->craw);
	free(e->craw_len);
	e->craw = NULL;
	e->craw_len = NULL;
}

/* What one handshake holds: the reference layout, the plan reference, the
 * rank maps. The addresses stay (reconnects). */
static void eng_detach(struct kvp_eng *e)
{
	kvp_layout_destroy(e->ref);
	e->ref = NULL;
	if (e->pc)
		e->pc->refs--;
	e->pc = NULL;
	free(e->rank_conn);
	e->rank_conn = NULL;
	free(e->retry_at);
	e->retry_at = NULL;
	e->nretry = 0;
	free(e->note_conn);
	e->note_conn = NULL;
	free(e->stripes);
	e->stripes = NULL;
	free(e->sprog);
	e->sprog = NULL;
	free(e->src_note);
	e->src_note = NULL;
	carried_drop(e);
}

static void eng_free(kvp_agent *a, struct kvp_eng *e)
{
	uint32_t gen = e->gen;

	eng_detach(e);
	free(e->addr);
	memset(e, 0, sizeof(*e));
	e->gen = (gen + 1) & 0xffff ? (gen + 1) & 0xffff : 1;
	a->nengs--;
}

void kvp__engines_free(kvp_agent *a)
{
	uint32_t i;

	for (i = 0; a->engs && i < a->max_peers; i++)
		if (a->engs[i].state)
			eng_free(a, &a->engs[i]);
	for (i = 0; a->pcache && i < a->max_peers; i++)
		kvp__pc_free(&a->pcache[i]);
	free(a->engs);
	free(a->pcache);
	a->engs = NULL;
	a->pcache = NULL;
}

uint32_t kvp__engine_handle(const kvp_agent *a, const struct kvp_eng *e)
{
	return e->gen << 16 | (uint32_t)(e - a->engs + 1);
}

struct kvp_eng *kvp__engine_get(const kvp_agent *a, uint32_t h)
{
	struct kvp_eng *e;

	if (!a || !a->consumer || !(h & 0xffff) || ENG_IDX(h) >= a->max_peers)
		return NULL;
	e = &a->engs[ENG_IDX(h)];
	if (!e->state || e->removing || e->gen != ENG_GEN(h))
		return NULL;
	return e;
}

static void eng_event(kvp_agent *a, struct kvp_eng *e, uint32_t type)
{
	struct kvp_event ev;

	if (e->quiet)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.type = type;
	ev.status = type == KVP_EV_ENGINE_DOWN ? e->status : 0;
	if (type == KVP_EV_ENGINE_DOWN) {
		ev.reason = e->why.reason;
		ev.peer_reason = e->why.peer_reason;
	}
	ev.engine_id = e->engine_id;
	ev.engine = kvp__engine_handle(a, e);
	kvp__ev_push(a, &ev);
}

/* ---- checks ------------------------------------------------------------- */

/* Checks producer rank `rank`'s layout against its slot (TP size, rank,
 * every region's address set) and, when ref is not NULL, against the
 * layout the plan is compiled from: the same engine and geometry. */
static int check_meta(const kvp_layout *peer, uint32_t rank, uint32_t tp_size,
		      const kvp_layout *ref, struct kvp_why *w)
{
	struct kvp_layout_info pi, ri;
	uint32_t i;

	kvp_layout_get_info(peer, &pi);
	if (pi.tp_size != tp_size)
		return kvp__why(w, -EPROTO, KVP_REASON_TP_SIZE,
				"producer rank %u: its engine has TP size %u, %u ranks given",
				rank, pi.tp_size, tp_size);
	if (pi.tp_rank != rank)
		return kvp__why(w, -EPROTO, KVP_REASON_RANK,
				"producer rank %u: its blob is rank %u's",
				rank, pi.tp_rank);
	for (i = 0; i < pi.nregions; i++) {
		uint64_t addr;
		uint32_t key;

		if (kvp_layout_get_region_key(peer, i, &addr, &key) || !addr)
			return kvp__why(w, -EPROTO, KVP_REASON_MALFORMED,
					"producer rank %u: region %u has no address",
					rank, i);
	}
	if (!ref)
		return 0;
	kvp_layout_get_info(ref, &ri);
	if (pi.engine_id != ri.engine_id)
		return kvp__why(w, -EPROTO, KVP_REASON_ENGINE_ID,
				"producer rank %u: engine id %llu, its engine's is %llu",
				rank, (unsigned long long)pi.engine_id,
				(unsigned long long)ri.engine_id);
	if (!kvp__geo_equal(peer, ref))
		return kvp__why(w, -EPROTO, KVP_REASON_LAYOUT,
				"producer rank %u: geometry differs from its engine's",
				rank);
	return 0;
}

/* Decodes the blobs carried in ranks[] (the user's own channel), checks
 * each against its slot and the lowest rank's, and keeps that one as the
 * engine's reference and every blob's bytes for the in-band comparison.
 * Touches neither the device nor the network. 0, -EPROTO, -ENOMEM. */
static int carried_take(struct kvp_eng *e, const struct kvp_peer *ranks,
			uint32_t n, struct kvp_why *w)
{
	kvp_layout *l, *ref = NULL;
	uint32_t i, first = n;
	int err = 0;

	for (i = 0; i < n; i++)
		if (ranks[i].meta)
			break;
	if (i == n)
		return 0;
	e->craw = calloc(n, sizeof(*e->craw));
	e->craw_len = calloc(n, sizeof(*e->craw_len));
	if (!e->craw || !e->craw_len) {
		carried_drop(e);
		return -ENOMEM;
	}
	for (i = 0; i < n && !err; i++) {
		if (!ranks[i].meta)
			continue;
		if (ranks[i].meta_len > KVP_META_MAX) {
			err = kvp__why(w, -EPROTO, KVP_REASON_MALFORMED,
				       "carried blob of rank %u: %u bytes, over %u",
				       i, ranks[i].meta_len, KVP_META_MAX);
			break;
		}
		l = NULL;
		err = kvp_meta_decode(ranks[i].meta, ranks[i].meta_len, &l);
		if (err) {
			err = err == -ENOMEM ? err : -EPROTO;
			kvp__why(w, err, KVP_REASON_MALFORMED,
				 "carried blob of rank %u: %s", i,
				 kvp_strerror(err));
			break;
		}
		err = check_meta(l, i, n, ref, w);
		if (!err && !ref) {
			ref = l;
			first = i;
			l = NULL;
		}
		kvp_layout_destroy(l);
		if (err)
			break;
		e->craw[i] = malloc(ranks[i].meta_len);
		if (!e->craw[i]) {
			err = -ENOMEM;
			break;
		}
		memcpy(e->craw[i], ranks[i].meta, ranks[i].meta_len);
		e->craw_len[i] = ranks[i].meta_len;
	}
	if (err) {
		kvp_layout_destroy(ref);
		carried_drop(e);
		return err;
	}
	e->ref = ref;
	e->first = first;
	return 0;
}

/* ---- the handshake ------------------------------------------------------ */

static struct kvp_conn *free_cons_slot(kvp_agent *a)
{
	uint32_t i;

	for (i = a->nprod; i < a->cons_end; i++)
		if (a->conns[i].state == CS_FREE)
			return &a->conns[i];
	/* Never used yet: the next above the mark (prepared when taken). */
	return a->cons_end < a->nconns ? &a->conns[a->cons_end] : NULL;
}

/* ---- the QP budget (max_qps) ------------------------------------------- */

/* Whether engine e still owes a producer rank a notification: a pull's
 * DONE comes once its data is in, its notification goes out after
 * (behind the READs, or later when it waits for the rank's credit) and
 * counts until its send completes. A rank's first queue pair retires a
 * chunk only then (c_head), its others once their READs are in, so any
 * chunk left on a connection is owed. Closing the engine would drop it,
 * and the producer would hold those blocks until their deadline. Linear
 * in the engine's connections. */
static int eng_owes(const kvp_agent *a, const struct kvp_eng *e)
{
	uint32_t i;

	for (i = 0; e->rank_conn && i < e->n * e->nq; i++) {
		const struct kvp_conn *c;

		if (e->rank_conn[i] == NO_CONN)
			continue;
		c = &a->conns[e->rank_conn[i]];
		if (c->c_head != c->c_tail)
			return 1;
	}
	return 0;
}

/* An engine up whose every pull was delivered (DONE or FAILED), not
 * kvp_agent_connect()'s, and not already going: 1 when it is idle (it
 * owes nothing, see eng_owes()), 2 when it still owes a notification
 * (it will be idle once that is sent), else 0. */
static int eng_idle(const kvp_agent *a, const struct kvp_eng *e)
{
	if (e->state != KVP_ENGINE_UP || e->evicted || e->removing ||
	    e->st.pulls != e->st.done + e->st.failed ||
	    kvp__engine_handle(a, e) == a->def_eng)
		return 0;
	return eng_owes(a, e) ? 2 : 1;
}

/* Room for `need` more connections within max_qps, for engine self: 0
 * when the free slots suffice; -EAGAIN when room is coming (an engine
 * that went to make it drains, or the idle engines' slots will do once
 * those that only owe notifications have sent them: the handshake waits,
 * within its deadline); -ENOSPC when even those would not do. The least
 * recently used idle engine (up, nothing in flight, no notification
 * owed, not kvp_agent_connect()'s) goes down, ENGINE_DOWN -ENOSPC with
 * KVP_REASON_EVICTED; its next kvp_agent_pull_from() reconnects it, the
 * memory registered once. One at a time: the next only once the slots of
 * the last are free. Linear in max_peers and the consumer's connections,
 * and only when slots lack. */
static int make_room(kvp_agent *a, const struct kvp_eng *self, uint32_t need)
{
	struct kvp_eng *lru = NULL;
	uint64_t could = a->ncons_free, soon = 0;
	uint32_t i;
	int idle;

	if (need <= a->ncons_free)
		return 0;
	if (a->cons_evicting)
		return -EAGAIN;
	for (i = 0; i < a->max_peers; i++) {
		struct kvp_eng *e = &a->engs[i];

		idle = e == self ? 0 : eng_idle(a, e);
		if (idle == 2)
			soon += e->nconn;
		if (idle != 1)
			continue;
		could += e->nconn;
		if (!lru || e->last_used < lru->last_used)
			lru = e;
	}
	if (!lru || could < need)
		return could + soon >= need ? -EAGAIN : -ENOSPC;
	kvp__why_clear(&lru->why);
	kvp__why(&lru->why, -ENOSPC, KVP_REASON_EVICTED,
		 "closed to make room within max_qps (%u queue pairs): reconnected on demand",
		 a->nconns - a->nprod);
	lru->evicted = 1;
	a->cons_evicting++;
	a->st.evictions++;
	kvp__engine_fail(a, lru, -ENOSPC);
	return -EAGAIN;
}

/* Whether an engine's first connection can have a slot, now or once an
 * idle engine made room (or one that owes notifications sent them). */
static int room_possible(const kvp_agent *a)
{
	uint32_t i;

	if (a->ncons_free || a->cons_evicting)
		return 1;
	for (i = 0; i < a->max_peers; i++)
		if (eng_idle(a, &a->engs[i]))
			return 1;
	return 0;
}

/* Queue pair q of producer rank r. */
static int connect_rank(kvp_agent *a, struct kvp_eng *e, uint32_t r,
			uint32_t q)
{
	struct kvp_conn *c = free_cons_slot(a);
	int err;

	if (!c)
		return -ENOSPC;
	err = kvp__conn_start(a, c, e, r, &e->addr[r]);
	if (err)
		return err;
	c->q = q;
	e->rank_conn[r * e->nq + q] = c->idx;
	return 0;
}

/* Queue pairs to producer rank of notify index k: nq for a rank the plan
 * reads from (its READs are striped over them), 1 for a rank only
 * notified. */
static uint32_t rank_qps(const struct kvp_eng *e, uint32_t k)
{
	return e->pc->note_src[k] != NO_SRC ? e->nq : 1;
}

static int rest_connect(kvp_agent *a, struct kvp_eng *e);

/* The plan is known: connect the rest of its notify list. */
static int start_rest(kvp_agent *a, struct kvp_eng *e)
{
	const struct kvp_pcache *pc;
	int err;

	err = kvp__plan_resolve(a, e);
	if (err)
		return err;
	pc = e->pc;
	if (pc->pi.remote_tp != e->n)
		return -EPROTO;
	e->note_conn = malloc(((size_t)pc->pi.nnotify * e->nq + 1) *
			      sizeof(*e->note_conn));
	if (!e->note_conn)
		return -ENOMEM;
	e->phase = EP_ROOM;
	return rest_connect(a, e);
}

/* EP_ROOM: the rest of the notify list connected once max_qps has room
 * for all of it (0 and still EP_ROOM while room is coming). */
static int rest_connect(kvp_agent *a, struct kvp_eng *e)
{
	const struct kvp_pcache *pc = e->pc;
	uint32_t k, q, need = 0;
	int err;

	for (k = 0; k < pc->pi.nnotify; k++)
		for (q = 0; q < rank_qps(e, k); q++)
			need += e->rank_conn[pc->note_rank[k] * e->nq + q] ==
				NO_CONN;
	err = make_room(a, e, need);
	if (err)
		return err == -EAGAIN ? 0 : err;
	for (k = 0; k < pc->pi.nnotify; k++) {
		uint32_t r = pc->note_rank[k];

		for (q = 0; q < e->nq; q++) {
			uint32_t *slot = &e->rank_conn[r * e->nq + q];

			if (q < rank_qps(e, k) && *slot == NO_CONN) {
				err = connect_rank(a, e, r, q);
				if (err)
					return err;
			}
			e->note_conn[k * e->nq + q] = *slot;
		}
	}
	e->phase = EP_REST;
	return 0;
}

/* EP_FIRST: the first connection, once max_qps has room for it. */
static int first_connect(kvp_agent *a, struct kvp_eng *e)
{
	int err = make_room(a, e, 1);

	e->wait_room = err == -EAGAIN;
	if (err)
		return e->wait_room ? 0 : err;
	return connect_rank(a, e, e->first, 0);
}

/* Starts (or restarts) engine e's handshake. */
static int eng_start(kvp_agent *a, struct kvp_eng *e, uint32_t timeout_ms)
{
	uint32_t r;

	e->status = 0;
	kvp__why_clear(&e->why);
	e->t0 = kvp__now_ns();
	e->deadline = e->t0 + (uint64_t)timeout_ms * 1000000ull;
	e->timeout_ms = timeout_ms;
	e->state = KVP_ENGINE_CONNECTING;
	a->nconnecting++;
	e->nq = a->qps;
	e->rank_conn = malloc((size_t)e->n * e->nq * sizeof(*e->rank_conn));
	e->retry_at = calloc((size_t)e->n * e->nq, sizeof(*e->retry_at));
	e->nretry = e->refusals = e->resets = 0;
	e->wait_room = 0;
	if (!e->rank_conn || !e->retry_at)
		return -ENOMEM;
	for (r = 0; r < e->n * e->nq; r++)
		e->rank_conn[r] = NO_CONN;
	if (e->ref) {
		/* A carried blob: the plan without a connection. */
		struct kvp_layout_info li;

		kvp_layout_get_info(e->ref, &li);
		e->engine_id = li.engine_id;
		return start_rest(a, e);
	}
	/* The producer rank at the start of our notify cover is always in
	 * the plan's notify list: meet it first, so that no connection is
	 * made only to be dropped. */
	e->first = (uint32_t)((uint64_t)a->li.tp_rank * e->n / a->li.tp_size);
	e->phase = EP_FIRST;
	return first_connect(a, e);
}

/* Producer rank c's blob, against its hello and the reference; and
 * against the bytes the user carried for it (a producer restarted since,
 * with new addresses or rkeys, fails here rather than serving READs
 * against stale keys). */
static int check_peer(struct kvp_eng *e, const struct kvp_conn *c)
{
	struct kvp_layout_info pi;
	uint32_t r = c->rank;

	kvp_layout_get_info(c->peer, &pi);
	if (pi.engine_id != c->engine_id)
		return kvp__why(&e->why, -EPROTO, KVP_REASON_ENGINE_ID,
				"producer rank %u: blob of engine %llu, hello of %llu",
				r, (unsigned long long)pi.engine_id,
				(unsigned long long)c->engine_id);
	/* The plan's READs must fit this rank's MRs too. */
	if (kvp__keys_window(c->peer) < e->pc->max_len)
		return kvp__why(&e->why, -EPROTO, KVP_REASON_MR_WINDOW,
				"producer rank %u: MR window %llu B, the plan reads up to %u B",
				r, (unsigned long long)kvp__keys_window(c->peer),
				e->pc->max_len);
	if (e->craw && e->craw[r] &&
	    (c->blob_got != e->craw_len[r] ||
	     memcmp(c->blob, e->craw[r], e->craw_len[r])))
		return kvp__why(&e->why, -EPROTO, KVP_REASON_CARRIED,
				"producer rank %u: its blob differs from the one carried",
				r);
	return check_meta(c->peer, r, e->n, e->ref, &e->why);
}

/* A connection of an engine coming up: its chunk FIFO and the remote
 * keys; the blob it came with is no longer needed. */
static int conn_data_alloc(kvp_agent *a, struct kvp_conn *c)
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
	c->lw = calloc(a->chunk_mask + 1, sizeof(*c->lw));
	c->rreg = calloc(pi.nregions + 1, sizeof(*c->rreg));
	c->rkeys = calloc(nkeys + 1, sizeof(*c->rkeys));
	/* A mark is a signalled WR: at most a send queue's worth. */
	if (a->stream_events)
		c->marks = calloc(a->sq_depth + 1, sizeof(*c->marks));
	if (!c->chunks || !c->lw || !c->rreg || !c->rkeys ||
	    (a->stream_events && !c->marks))
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
	c->l_head = c->l_tail = c->nlast = 0;
	c->m_head = c->m_tail = 0;
	c->notes_posted = c->credit_seen = 0;
	c->credit_reading = c->credit_hold = c->starved = 0;
	c->wait_since = 0;
	/* The rank's layout stays with its first queue pair, for
	 * kvp_agent_engine_layout() (a few KiB); the others let theirs go. */
	if (c->q) {
		kvp_layout_destroy(c->peer);
		c->peer = NULL;
	}
	kvp__peer_blob_free(c);
	return 0;
}

static int eng_up(kvp_agent *a, struct kvp_eng *e)
{
	const uint32_t nc = e->pc->pi.nnotify * e->nq;
	uint32_t k, conns = 0;
	int err;

	for (k = 0; k < nc; k++) {
		if (e->note_conn[k] == NO_CONN)
			continue;
		err = check_peer(e, &a->conns[e->note_conn[k]]);
		if (err)
			return err;
	}
	for (k = 0; k < nc; k++) {
		struct kvp_conn *c;

		if (e->note_conn[k] == NO_CONN)
			continue;
		c = &a->conns[e->note_conn[k]];
		c->psrc = e->pc->note_src[k / e->nq];
		err = conn_data_alloc(a, c);
		if (err)
			return err;
		conns++;
	}
	/* A stripe per request slot and source, its streaming state, and
	 * each source's notify index (its queue pairs). */
	e->stripes = calloc((size_t)a->max_inflight *
				    (e->pc->pi.nsrc ? e->pc->pi.nsrc : 1),
			    sizeof(*e->stripes));
	e->sprog = calloc((size_t)a->max_inflight *
				  (e->pc->pi.nsrc ? e->pc->pi.nsrc : 1),
			  sizeof(*e->sprog));
	e->src_note = calloc(e->pc->pi.nsrc + 1, sizeof(*e->src_note));
	if (!e->stripes || !e->sprog || !e->src_note)
		return -ENOMEM;
	for (k = 0; k < e->pc->pi.nnotify; k++)
		if (e->pc->note_src[k] != NO_SRC)
			e->src_note[e->pc->note_src[k]] = k;
	carried_drop(e);
	a->nconnecting--;
	e->state = KVP_ENGINE_UP;
	if (e->ups++) {
		e->st.reconnects++;
		a->st.reconnects++;
	}
	e->last_used = kvp__now_ns();
	e->st.add_ns = e->last_used - e->t0;
	kvp__hist_add(&a->obs.handshake[OBS_HS_CONSUMER], e->st.add_ns);
	e->st.plan_cached = e->plan_cached;
	a->st.connects += conns;
	eng_event(a, e, KVP_EV_ENGINE_UP);
	return 0;
}

/* Why an engine that a full producer kept refusing failed: the last
 * refusal's code. */
static int full_why(struct kvp_eng *e)
{
	kvp__why_clear(&e->why);
	kvp__why(&e->why, e->retry_err, KVP_REASON_PEER_REFUSED,
		 "producer full: refused %u times before the handshake's deadline",
		 e->refusals);
	e->why.peer_reason = KVP_REASON_PEER_FULL;
	return e->retry_err;
}

/* The queue pairs a full producer refused whose retry time has come:
 * connected again, in the slots their notify indexes point to. */
static int retries_due(kvp_agent *a, struct kvp_eng *e, uint64_t now)
{
	uint32_t i, k, q;
	int err;

	for (i = 0; i < e->n * e->nq && e->nretry; i++) {
		if (!e->retry_at[i] || now < e->retry_at[i])
			continue;
		err = make_room(a, e, 1);
		if (err == -EAGAIN) {
			/* An evicted engine's slots drain: soon. */
			e->retry_at[i] = now + 1000000ull;
			continue;
		}
		if (err)
			return err;
		e->retry_at[i] = 0;
		e->nretry--;
		err = connect_rank(a, e, i / e->nq, i % e->nq);
		if (err)
			return err;
		if (e->phase != EP_REST)
			continue;
		for (k = 0; k < e->pc->pi.nnotify; k++)
			for (q = 0; q < rank_qps(e, k); q++)
				e->note_conn[k * e->nq + q] =
					e->rank_conn[e->pc->note_rank[k] *
							     e->nq + q];
	}
	return 0;
}

static int eng_step(kvp_agent *a, struct kvp_eng *e, uint64_t now)
{
	struct kvp_conn *c;
	uint32_t k;
	int err;

	if (e->nretry) {
		err = retries_due(a, e, now);
		if (err || e->nretry)
			return err; /* not all of them are back yet */
	}
	if (e->phase == EP_ROOM)
		return rest_connect(a, e);
	if (e->phase == EP_FIRST) {
		if (e->wait_room)
			return first_connect(a, e);
		if (e->rank_conn[e->first * e->nq] == NO_CONN)
			return 0;
		c = &a->conns[e->rank_conn[e->first * e->nq]];
		if (c->state != CS_READY)
			return 0;
		e->engine_id = c->engine_id;
		err = check_meta(c->peer, c->rank, e->n, NULL, &e->why);
		if (!err)
			err = kvp_layout_clone(c->peer, &e->ref);
		if (!err)
			err = start_rest(a, e);
		return err;
	}
	for (k = 0; k < e->pc->pi.nnotify * e->nq; k++)
		if (e->note_conn[k] != NO_CONN &&
		    a->conns[e->note_conn[k]].state != CS_READY)
			return 0;
	return eng_up(a, e);
}

uint64_t kvp__engine_wake(const struct kvp_eng *e)
{
	uint64_t wake = e->deadline;
	uint32_t i;

	for (i = 0; e->nretry && i < e->n * e->nq; i++)
		if (e->retry_at[i] && e->retry_at[i] < wake)
			wake = e->retry_at[i];
	return wake;
}

void kvp__engines_step(kvp_agent *a, uint64_t now)
{
	uint32_t i;
	int err;

	for (i = 0; i < a->max_peers && a->nconnecting; i++) {
		struct kvp_eng *e = &a->engs[i];

		if (e->state != KVP_ENGINE_CONNECTING)
			continue;
		err = now >= e->deadline ? -ETIMEDOUT : eng_step(a, e, now);
		/* Refused before: the refusal is why, whether a retry was
		 * still waiting or already connecting again. */
		if (err == -ETIMEDOUT && e->refusals)
			err = full_why(e);
		if (err)
			kvp__engine_fail(a, e, err);
	}
}

/* ---- failure ------------------------------------------------------------ */

static void eng_down(kvp_agent *a, struct kvp_eng *e)
{
	if (e->evicted) {
		e->evicted = 0;
		a->cons_evicting--;
	}
	eng_detach(e);
	e->state = KVP_ENGINE_DOWN;
	if (e->removing) {
		eng_free(a, e);
		return;
	}
	eng_event(a, e, KVP_EV_ENGINE_DOWN);
}

void kvp__engine_fail(kvp_agent *a, struct kvp_eng *e, int err)
{
	uint32_t r;

	if (e->state != KVP_ENGINE_CONNECTING && e->state != KVP_ENGINE_UP)
		return;
	if (e->state == KVP_ENGINE_CONNECTING) {
		a->nconnecting--;
		e->st.handshake_failures++;
		a->st.handshake_failures++;
	}
	/* Up, a timeout is the transport's: its retries ran out. */
	if (e->state == KVP_ENGINE_UP && err == -ETIMEDOUT)
		kvp__why(&e->why, err, KVP_REASON_TRANSPORT,
			 "a producer rank stopped answering: the transport's retries ran out");
	e->state = KVP_ENGINE_FAILING;
	e->status = err ? err : -ECONNRESET;
	kvp__why_errno(&e->why, e->status);
	for (r = 0; e->rank_conn && r < e->n * e->nq; r++)
		if (e->rank_conn[r] != NO_CONN)
			kvp__conn_fail(a, &a->conns[e->rank_conn[r]],
				       e->status);
	if (!e->nconn && e->state == KVP_ENGINE_FAILING)
		eng_down(a, e);
}

void kvp__engine_conn_gone(kvp_agent *a, struct kvp_eng *e, uint32_t idx,
			   int err)
{
	uint32_t r;

	for (r = 0; e->rank_conn && r < e->n * e->nq; r++)
		if (e->rank_conn[r] == idx)
			e->rank_conn[r] = NO_CONN;
	e->nconn--;
	kvp__engine_fail(a, e, err);
	if (!e->nconn && e->state == KVP_ENGINE_FAILING)
		eng_down(a, e);
}

void kvp__engine_conn_retry(struct kvp_eng *e, uint32_t idx)
{
	uint32_t r;

	for (r = 0; e->rank_conn && r < e->n * e->nq; r++)
		if (e->rank_conn[r] == idx)
			e->rank_conn[r] = NO_CONN;
	e->nconn--;
}

void kvp__engine_drop(kvp_agent *a, struct kvp_eng *e)
{
	eng_free(a, e);
}

/* ---- the consumer side's connection callback ---------------------------- */

/* Whether c is the last of its producer rank's queue pairs (its engine's
 * rank_conn entries) to be reported gone: a rank's DISCONNECTED event is
 * one. */
static int last_of_rank(const kvp_agent *a, const struct kvp_conn *c)
{
	const struct kvp_eng *e = &a->engs[c->eng];
	uint32_t q;

	for (q = 0; e->rank_conn && c->rank < e->n && q < e->nq; q++) {
		uint32_t k = e->rank_conn[c->rank * e->nq + q];

		if (k != NO_CONN && k != c->idx && !a->conns[k].reported &&
		    a->conns[k].state != CS_FREE)
			return 0;
	}
	return 1;
}

/* Every producer rank of an engine is reported unless the engine is being
 * removed or connected by kvp_agent_connect(); then the rest of the engine
 * goes with it. */
/* Whether c, refused by a full producer during its engine's handshake,
 * is tried again instead of failing the engine: after the producer's hint,
 * doubled with each refusal of this handshake (up to 64x) and jittered to
 * 50-150 %, if that is before the handshake's deadline. The engine keeps
 * connecting meanwhile; the connection drains and lets its slot go. */
#define RESET_RETRIES 3 /* resets during one handshake tried again */

static int retry_later(kvp_agent *a, struct kvp_eng *e, struct kvp_conn *c)
{
	uint64_t now = kvp__now_ns(), wait;
	uint32_t i = c->rank * e->nq + c->q, j = 0;

	if (e->state != KVP_ENGINE_CONNECTING || e->removing ||
	    !e->retry_at || c->rank >= e->n || e->rank_conn[i] != c->idx)
		return 0;
	wait = (uint64_t)c->retry_ms * 1000000ull
	       << (e->refusals < 6 ? e->refusals : 6);
	(void)kvp__random(&j, sizeof(j));
	wait = wait / 2 + wait / 1024 * (j % 1024);
	e->refusals++;
	e->retry_err = c->status;
	if (now + wait >= e->deadline) {
		(void)full_why(e);
		return 0;
	}
	e->retry_at[i] = now + wait;
	e->nretry++;
	c->retrying = 1;
	kvp__why_clear(&e->why); /* the refusal is not the engine's end */
	return 1;
}

void kvp__consumer_failed(kvp_agent *a, struct kvp_conn *c, int was_ready)
{
	struct kvp_eng *e = &a->engs[c->eng];

	/* Reset during the handshake: the producer took us and dropped us
	 * (its handshake bound passed while it was swamped): tried again
	 * like a refusal, a few times. */
	if (!was_ready && !c->retry_ms && c->status == -ECONNRESET &&
	    e->resets < RESET_RETRIES) {
		e->resets++;
		c->retry_ms = KVP_RETRY_FULL_MS;
	}
	if (!was_ready && c->retry_ms && retry_later(a, e, c))
		return;

	/* Removed or evicted: the engine's own event says it all. */
	if (!e->quiet && !e->removing && !e->evicted)
		kvp__conn_report(a, c, last_of_rank(a, c), &e->why,
				 kvp__engine_handle(a, e));
	if (was_ready && !e->evicted) {
		e->st.transport_failures++;
		a->st.transport_failures++;
	}
	kvp__engine_fail(a, e, c->status);
}

/* ---- the calls ---------------------------------------------------------- */

int kvp__engine_check_ranks(const kvp_agent *a, const struct kvp_peer *ranks,
			    uint32_t n)
{
	uint32_t i;

	if (!a || !a->consumer || !ranks || !n || n > KVP_MAX_TP_SIZE)
		return -EINVAL;
	for (i = 0; i < n; i++) {
		struct sockaddr_storage ss;

		if (!ranks[i].addr || !ranks[i].meta != !ranks[i].meta_len ||
		    strnlen(ranks[i].addr, IP_MAX) >= IP_MAX ||
		    kvp__parse_addr(ranks[i].addr, ranks[i].port, &ss))
			return -EINVAL;
	}
	return 0;
}

/* Copies the addresses (and takes the carried blobs) of ranks into e. */
static int eng_set_ranks(kvp_agent *a, struct kvp_eng *e,
			 const struct kvp_peer *ranks, uint32_t n)
{
	struct kvp_peer_addr *addr;
	uint32_t i;
	int err;

	addr = calloc(n, sizeof(*addr));
	if (!addr)
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		memcpy(addr[i].ip, ranks[i].addr, strlen(ranks[i].addr) + 1);
		addr[i].port = ranks[i].port;
	}
	free(e->addr);
	e->addr = addr;
	e->n = n;
	err = carried_take(e, ranks, n, &a->last);
	return err;
}

static int eng_begin(kvp_agent *a, struct kvp_eng *e,
		     const struct kvp_peer *ranks, uint32_t n,
		     uint32_t timeout_ms)
{
	int err;

	if (ranks) {
		err = eng_set_ranks(a, e, ranks, n);
		if (err)
			return err;
	}
	err = eng_start(a, e, timeout_ms);
	if (err) {
		/* Whatever was started goes down through the usual path:
		 * one ENGINE_DOWN event, with this reason. */
		kvp__engine_fail(a, e, err);
		return 0;
	}
	return 0;
}

int kvp__engine_add(kvp_agent *a, const struct kvp_peer *ranks, uint32_t n,
		    uint32_t timeout_ms, uint32_t quiet, uint32_t *engine)
{
	struct kvp_eng *e = NULL;
	uint32_t i;
	int err;

	err = kvp__engine_check_ranks(a, ranks, n);
	if (err || !timeout_ms || !engine)
		return err ? err : -EINVAL;
	if (!kvp__regions_ready(a))
		return -ENXIO;
	for (i = 0; i < a->max_peers && !e; i++)
		if (!a->engs[i].state)
			e = &a->engs[i];
	if (!e || !room_possible(a) ||
	    kvp__ev_room(a) <= (int)a->max_inflight + 8)
		return -ENOSPC;
	err = kvp__blob_make(a);
	if (err)
		return err;
	e->state = KVP_ENGINE_DOWN; /* held */
	e->quiet = quiet;
	a->nengs++;
	err = eng_set_ranks(a, e, ranks, n);
	if (err) {
		eng_free(a, e);
		return err;
	}
	*engine = kvp__engine_handle(a, e);
	return eng_begin(a, e, NULL, n, timeout_ms);
}

int kvp_agent_add_engine(kvp_agent *a, const struct kvp_peer *ranks,
			 uint32_t n, uint32_t timeout_ms, uint32_t *engine)
{
	if (!a)
		return -EINVAL;
	kvp__why_clear(&a->last);
	return kvp__call_err(&a->last,
			     kvp__engine_add(a, ranks, n, timeout_ms, 0, engine));
}

static int reconnect_engine(kvp_agent *a, uint32_t engine,
			    const struct kvp_peer *ranks, uint32_t n,
			    uint32_t timeout_ms)
{
	struct kvp_eng *e = kvp__engine_get(a, engine);
	int err;

	if (!a || !timeout_ms || (!ranks != !n))
		return -EINVAL;
	if (!e)
		return -ENOENT;
	if (ranks) {
		err = kvp__engine_check_ranks(a, ranks, n);
		if (err)
			return err;
	}
	if (e->state != KVP_ENGINE_DOWN)
		return -EBUSY;
	if (!room_possible(a) || kvp__ev_room(a) <= (int)a->max_inflight + 8)
		return -ENOSPC;
	return eng_begin(a, e, ranks, n, timeout_ms);
}

int kvp_agent_reconnect_engine(kvp_agent *a, uint32_t engine,
			       const struct kvp_peer *ranks, uint32_t n,
			       uint32_t timeout_ms)
{
	if (!a)
		return -EINVAL;
	kvp__why_clear(&a->last);
	return kvp__call_err(&a->last, reconnect_engine(a, engine, ranks, n,
							timeout_ms));
}

int kvp_agent_remove_engine(kvp_agent *a, uint32_t engine)
{
	struct kvp_eng *e = kvp__engine_get(a, engine);

	if (!a)
		return -EINVAL;
	kvp__why_clear(&a->last);
	if (!e)
		return kvp__call_err(&a->last, -ENOENT);
	if (a->def_eng == engine)
		a->def_eng = 0;
	e->removing = 1;
	if (e->state == KVP_ENGINE_DOWN) {
		eng_free(a, e);
		return 0;
	}
	/* Its requests fail with -ECANCELED as its connections drain; the
	 * record goes with the last of them. */
	kvp__engine_fail(a, e, -ECANCELED);
	return 0;
}

int kvp_agent_engine_layout(const kvp_agent *a, uint32_t engine,
			    uint32_t rank, kvp_layout **out)
{
	const struct kvp_eng *e;
	uint32_t ci;

	if (!a || !out || !a->consumer)
		return -EINVAL;
	e = kvp__engine_get(a, engine ? engine : a->def_eng);
	if (!e)
		return -ENOENT;
	if (rank >= e->n)
		return -ERANGE;
	if (e->state != KVP_ENGINE_UP || !e->rank_conn)
		return -EAGAIN;
	ci = e->rank_conn[(size_t)rank * e->nq];
	if (ci == NO_CONN || !a->conns[ci].peer)
		return -EAGAIN;
	return kvp_layout_clone(a->conns[ci].peer, out);
}

int kvp_agent_engine_info(const kvp_agent *a, uint32_t engine,
			  struct kvp_engine_info *info)
{
	const struct kvp_eng *e;
	uint64_t table;
	uint32_t r;

	if (!a || !info)
		return -EINVAL;
	e = kvp__engine_get(a, engine);
	if (!e)
		return -ENOENT;
	*info = e->st;
	info->state = e->state;
	info->status = e->status;
	info->engine_id = e->engine_id;
	info->tp_size = e->n;
	info->conns = e->nconn;
	info->plan = e->pc ? e->pc->plan : NULL;
	info->plan_bytes = e->pc ? e->pc->pi.bytes : 0;
	info->qps = e->nq;
	info->reason = e->why.reason;
	info->peer_reason = e->why.peer_reason;
	snprintf(info->why, sizeof(info->why), "%s",
		 e->why.line ? e->why.line : e->why.msg);
	table = sizeof(*e) + (uint64_t)e->n * (sizeof(*e->addr) +
					      e->nq * sizeof(*e->rank_conn));
	if (e->pc)
		table += (uint64_t)e->pc->pi.nnotify * e->nq *
			 sizeof(*e->note_conn);
	if (e->stripes)
		table += (uint64_t)a->max_inflight *
			 (e->pc->pi.nsrc ? e->pc->pi.nsrc : 1) *
			 (sizeof(*e->stripes) + sizeof(*e->sprog)) +
		         (uint64_t)e->pc->pi.nsrc * sizeof(*e->src_note);
	for (r = 0; e->rank_conn && r < e->n * e->nq; r++) {
		const struct kvp_conn *c;
		struct kvp_layout_info li;

		if (e->rank_conn[r] == NO_CONN)
			continue;
		c = &a->conns[e->rank_conn[r]];
		table += sizeof(*c);
		if (c->chunks)
			table += (uint64_t)(a->chunk_mask + 1) *
				 sizeof(*c->chunks);
		if (c->marks)
			table += (uint64_t)(a->sq_depth + 1) *
				 sizeof(*c->marks);
		if (c->rreg && e->ref) {
			kvp_layout_get_info(e->ref, &li);
			table += (uint64_t)li.nregions * sizeof(*c->rreg) +
				 (uint64_t)c->nrkeys * sizeof(*c->rkeys);
		}
	}
	info->table_bytes = table;
	return 0;
}

const kvp_plan *kvp_agent_plan(const kvp_agent *a)
{
	const struct kvp_eng *e = a ? kvp__engine_get(a, a->def_eng) : NULL;

	return e && e->pc ? e->pc->plan : NULL;
}
