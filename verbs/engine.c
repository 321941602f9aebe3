// SPDX-License-Identifier: MIT
/*
 * The consumer's producer engines: handles, the non-blocking handshake
 * that kvp_agent_poll() drives, the checks on what producer ranks send,
 * plans shared by geometry, failure and reconnection.
 *
 * An engine's handshake, one step per poll at most:
 *   EP_FIRST  connect the rank at the start of our notify cover (always in
 *             the plan's notify list) to learn the layout, unless a blob
 *             was carried;
 *   (plan)    look the layout's geometry up in the plan cache, compile on
 *             a miss;
 *   EP_REST   connect every other rank the plan reads from or notifies,
 *             check each blob against the first (same engine, geometry)
 *             and against its carried bytes; then UP.
 * A rank lost at any point takes the whole engine down (FAILING while its
 * connections drain, then DOWN): its requests fail with their ids, other
 * engines are untouched, and the agent's memory stays registered for the
 * reconnect.
 */
#include <poll.h>
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

static void pc_free(struct kvp_pcache *pc)
{
	kvp_plan_destroy(pc->plan);
	kvp_layout_destroy(pc->geo);
	free(pc->note_rank);
	free(pc->note_src);
	memset(pc, 0, sizeof(*pc));
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
	free(e->note_conn);
	e->note_conn = NULL;
	free(e->stripes);
	e->stripes = NULL;
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
		pc_free(&a->pcache[i]);
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

/* Whether two layouts have the same geometry: everything a plan depends
 * on, that is everything but the engine id, the rank and the region
 * keys (a shard's length is the same on every rank, so the field
 * descriptions are too). */
static int geo_equal(const kvp_layout *x, const kvp_layout *y)
{
	struct kvp_layout_info xi, yi;
	uint32_t i;

	kvp_layout_get_info(x, &xi);
	kvp_layout_get_info(y, &yi);
	if (xi.tp_size != yi.tp_size || xi.ngroups != yi.ngroups ||
	    xi.nregions != yi.nregions || xi.nviews != yi.nviews ||
	    xi.nfields != yi.nfields ||
	    kvp_layout_compat_hash(x) != kvp_layout_compat_hash(y))
		return 0;
	for (i = 0; i < xi.nregions; i++) {
		uint64_t p, q;

		if (kvp_layout_get_region(x, i, &p) ||
		    kvp_layout_get_region(y, i, &q) || p != q)
			return 0;
	}
	for (i = 0; i < xi.ngroups; i++) {
		struct kvp_group_desc p, q;

		if (kvp_layout_get_group(x, i, &p) ||
		    kvp_layout_get_group(y, i, &q) || p.kind != q.kind ||
		    p.block_tokens != q.block_tokens)
			return 0;
	}
	for (i = 0; i < xi.nviews; i++) {
		struct kvp_view_desc p, q;

		if (kvp_layout_get_view(x, i, &p) ||
		    kvp_layout_get_view(y, i, &q) || p.group != q.group ||
		    p.region != q.region || p.layer != q.layer ||
		    p.num_blocks != q.num_blocks || p.offset != q.offset ||
		    p.stride != q.stride)
			return 0;
	}
	for (i = 0; i < xi.nfields; i++) {
		struct kvp_field_desc p, q;
		uint32_t pv, qv;

		/* No padding in the struct: memcmp compares the fields. */
		memset(&p, 0, sizeof(p));
		memset(&q, 0, sizeof(q));
		if (kvp_layout_get_field(x, i, &pv, &p) ||
		    kvp_layout_get_field(y, i, &qv, &q) || pv != qv ||
		    memcmp(&p, &q, sizeof(p)))
			return 0;
	}
	return 1;
}

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
	if (!geo_equal(peer, ref))
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

/* ---- plans, shared by geometry ----------------------------------------- */

/* The longest access every region of layout l allows: the MR window of
 * those registered as several MRs (kvp_layout_set_region_keys()), else
 * UINT32_MAX. */
static uint32_t keys_window(const kvp_layout *l)
{
	struct kvp_layout_info li;
	uint32_t i, shift, w = UINT32_MAX;
	uint64_t addr;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nregions; i++)
		if (kvp_layout_get_region_keys(l, i, &addr, &shift, NULL, 0) >
			    0 &&
		    shift && KVP_MR_WINDOW(shift) < w)
			w = (uint32_t)KVP_MR_WINDOW(shift);
	return w;
}

/* The plan for engines of ref's geometry: from the cache, or compiled and
 * cached (evicting the least recently used plan no engine holds). Its
 * READs are no longer than the port allows, the slice asked for, and the
 * MR window of any region on either side registered as several MRs. */
static int plan_resolve(kvp_agent *a, struct kvp_eng *e)
{
	uint64_t h = kvp_layout_compat_hash(e->ref);
	struct kvp_pcache *pc, *victim = NULL;
	struct kvp_plan_attr pattr;
	uint32_t i, k, n, max_len = a->lim.max_len, w;
	char msg[KVP_WHY_LEN];
	int err, r;

	if (a->mr_window < max_len)
		max_len = a->mr_window;
	w = keys_window(e->ref);
	if (w < max_len)
		max_len = w;

	for (i = 0; i < a->max_peers; i++) {
		pc = &a->pcache[i];
		if (!pc->plan) {
			if (!victim || victim->plan)
				victim = pc;
			continue;
		}
		if (pc->hash == h && pc->max_len == max_len &&
		    geo_equal(pc->geo, e->ref))
			goto hit;
		if (!pc->refs && (!victim || (victim->plan &&
					      pc->used < victim->used)))
			victim = pc;
	}
	if (!victim)
		return -ENOSPC; /* unreachable: one plan per engine at most */
	pc = victim;
	pc_free(pc);
	memset(&pattr, 0, sizeof(pattr));
	pattr.max_sge = a->max_sge;
	/* No READ longer than the port's message size or the slice asked
	 * for (limits.c). */
	pattr.comp_mask = KVP_PLAN_ATTR_MAX_LEN | KVP_PLAN_ATTR_FLAGS;
	pattr.max_len = max_len;
	pc->max_len = max_len;
	pattr.flags = a->plan_flags;
	if (kvp_layout_compat_hash(e->ref) != kvp_layout_compat_hash(a->layout))
		return kvp__why(&e->why, -EPROTO, KVP_REASON_MODEL,
				"another model: compatibility hash %016llx, ours %016llx",
				(unsigned long long)kvp_layout_compat_hash(e->ref),
				(unsigned long long)kvp_layout_compat_hash(a->layout));
	msg[0] = 0;
	err = kvp_plan_compile(a->layout, e->ref, &pattr, &pc->plan, msg,
			       sizeof(msg));
	if (err == -ENOMEM)
		return err;
	if (err)
		return kvp__why(&e->why, -EPROTO,
				err == -EFBIG ? KVP_REASON_PLAN_COST :
						KVP_REASON_LAYOUT,
				"%s", msg[0] ? msg : kvp_strerror(err));
	kvp_plan_get_info(pc->plan, &pc->pi);
	n = pc->pi.nnotify;
	pc->note_rank = calloc(n + 1, sizeof(*pc->note_rank));
	pc->note_src = calloc(n + 1, sizeof(*pc->note_src));
	err = -ENOMEM;
	if (!pc->note_rank || !pc->note_src)
		goto err_pc;
	err = kvp_layout_clone(e->ref, &pc->geo);
	if (err)
		goto err_pc;
	err = -EPROTO;
	for (k = 0; k < n; k++) {
		r = kvp_plan_notify(pc->plan, k);
		if (r < 0 || (uint32_t)r >= pc->pi.remote_tp)
			goto err_pc;
		pc->note_rank[k] = (uint32_t)r;
		pc->note_src[k] = NO_SRC;
		for (i = 0; i < pc->pi.nsrc; i++)
			if (kvp_plan_source(pc->plan, i) == r)
				pc->note_src[k] = i;
	}
	/* A source outside the notify list would be a planner bug. */
	for (i = 0; i < pc->pi.nsrc; i++) {
		for (k = 0; k < n; k++)
			if (pc->note_src[k] == i)
				break;
		if (k == n)
			goto err_pc;
	}
	pc->hash = h;
	a->st.plan_compiles++;
	e->plan_cached = 0;
	goto take;
hit:
	a->st.plan_hits++;
	e->plan_cached = 1;
take:
	pc->refs++;
	pc->used = ++a->pc_clock;
	e->pc = pc;
	return 0;

err_pc:
	pc_free(pc);
	return err;
}

/* ---- the handshake ------------------------------------------------------ */

static struct kvp_conn *free_cons_slot(kvp_agent *a)
{
	uint32_t i;

	for (i = a->nprod; i < a->nconns; i++)
		if (a->conns[i].state == CS_FREE)
			return &a->conns[i];
	return NULL;
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

/* The plan is known: connect the rest of its notify list. */
static int start_rest(kvp_agent *a, struct kvp_eng *e)
{
	const struct kvp_pcache *pc;
	uint32_t k, q, need = 0;
	int err;

	err = plan_resolve(a, e);
	if (err)
		return err;
	pc = e->pc;
	if (pc->pi.remote_tp != e->n)
		return -EPROTO;
	for (k = 0; k < pc->pi.nnotify; k++)
		for (q = 0; q < rank_qps(e, k); q++)
			need += e->rank_conn[pc->note_rank[k] * e->nq + q] ==
				NO_CONN;
	if (need > a->ncons_free)
		return -ENOSPC;
	e->note_conn = malloc(((size_t)pc->pi.nnotify * e->nq + 1) *
			      sizeof(*e->note_conn));
	if (!e->note_conn)
		return -ENOMEM;
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

/* Starts (or restarts) engine e's handshake. */
static int eng_start(kvp_agent *a, struct kvp_eng *e, uint32_t timeout_ms)
{
	uint32_t r;

	e->status = 0;
	kvp__why_clear(&e->why);
	e->t0 = kvp__now_ns();
	e->deadline = e->t0 + (uint64_t)timeout_ms * 1000000ull;
	e->state = KVP_ENGINE_CONNECTING;
	a->nconnecting++;
	e->nq = a->qps;
	e->rank_conn = malloc((size_t)e->n * e->nq * sizeof(*e->rank_conn));
	if (!e->rank_conn)
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
	return connect_rank(a, e, e->first, 0);
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
	if (keys_window(c->peer) < e->pc->max_len)
		return kvp__why(&e->why, -EPROTO, KVP_REASON_MR_WINDOW,
				"producer rank %u: MR window %llu B, the plan reads up to %u B",
				r, (unsigned long long)keys_window(c->peer),
				e->pc->max_len);
	if (e->craw && e->craw[r] &&
	    (c->blob_got != e->craw_len[r] ||
	     memcmp(c->blob, e->craw[r], e->craw_len[r])))
		return kvp__why(&e->why, -EPROTO, KVP_REASON_CARRIED,
				"producer rank %u: its blob differs from the one carried",
				r);
	return check_meta(c->peer, r, e->n, e->ref, &e->why);
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
		err = kvp__conn_data_alloc(a, c);
		if (err)
			return err;
		conns++;
	}
	/* A stripe per request slot and source. */
	e->stripes = calloc((size_t)a->max_inflight *
				    (e->pc->pi.nsrc ? e->pc->pi.nsrc : 1),
			    sizeof(*e->stripes));
	if (!e->stripes)
		return -ENOMEM;
	carried_drop(e);
	a->nconnecting--;
	e->state = KVP_ENGINE_UP;
	if (e->ups++) {
		e->st.reconnects++;
		a->st.reconnects++;
	}
	e->st.add_ns = kvp__now_ns() - e->t0;
	e->st.plan_cached = e->plan_cached;
	a->st.connects += conns;
	eng_event(a, e, KVP_EV_ENGINE_UP);
	return 0;
}

static int eng_step(kvp_agent *a, struct kvp_eng *e)
{
	struct kvp_conn *c;
	uint32_t k;
	int err;

	if (e->phase == EP_FIRST) {
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

void kvp__engines_step(kvp_agent *a, uint64_t now)
{
	uint32_t i;
	int err;

	for (i = 0; i < a->max_peers && a->nconnecting; i++) {
		struct kvp_eng *e = &a->engs[i];

		if (e->state != KVP_ENGINE_CONNECTING)
			continue;
		err = now >= e->deadline ? -ETIMEDOUT : eng_step(a, e);
		if (err)
			kvp__engine_fail(a, e, err);
	}
}

/* ---- failure ------------------------------------------------------------ */

static void eng_down(kvp_agent *a, struct kvp_eng *e)
{
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

/* ---- the calls ---------------------------------------------------------- */

static int check_ranks(const kvp_agent *a, const struct kvp_peer *ranks,
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

static int add_engine(kvp_agent *a, const struct kvp_peer *ranks, uint32_t n,
		      uint32_t timeout_ms, uint32_t quiet, uint32_t *engine)
{
	struct kvp_eng *e = NULL;
	uint32_t i;
	int err;

	err = check_ranks(a, ranks, n);
	if (err || !timeout_ms || !engine)
		return err ? err : -EINVAL;
	if (!kvp__regions_ready(a))
		return -ENXIO;
	for (i = 0; i < a->max_peers && !e; i++)
		if (!a->engs[i].state)
			e = &a->engs[i];
	if (!e || !a->ncons_free || kvp__ev_room(a) <= (int)a->max_inflight + 8)
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
			     add_engine(a, ranks, n, timeout_ms, 0, engine));
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
		err = check_ranks(a, ranks, n);
		if (err)
			return err;
	}
	if (e->state != KVP_ENGINE_DOWN)
		return -EBUSY;
	if (!a->ncons_free || kvp__ev_room(a) <= (int)a->max_inflight + 8)
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
			 sizeof(*e->stripes);
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
		if (c->rreg && e->ref) {
			kvp_layout_get_info(e->ref, &li);
			table += (uint64_t)li.nregions * sizeof(*c->rreg) +
				 (uint64_t)c->nrkeys * sizeof(*c->rkeys);
		}
	}
	info->table_bytes = table;
	return 0;
}

/* ---- kvp_agent_connect(): one engine, blocking -------------------------- */

/* Drives the agent's connections until engine e is up or down, or the
 * deadline passes. Events of a quiet engine are not queued. */
static int wait_engine(kvp_agent *a, struct kvp_eng *e, uint64_t deadline)
{
	struct pollfd pfd;
	uint64_t now;

	for (;;) {
		now = kvp__now_ns();
		if (e->state == KVP_ENGINE_UP)
			return 0;
		if (e->state == KVP_ENGINE_DOWN)
			return e->status ? e->status : -ECONNRESET;
		if (e->state == KVP_ENGINE_CONNECTING && now >= deadline)
			kvp__engine_fail(a, e, -ETIMEDOUT);
		/* Handshake completions have no fd of their own here: wake
		 * at least every millisecond to poll the CQ. */
		pfd.fd = a->ech->fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		(void)poll(&pfd, 1, 1);
		/* Completions first: a producer disconnects once its refusal
		 * is delivered, and the refusal must win over the
		 * disconnect. */
		(void)kvp__cq_drain(a);
		kvp__cm_process(a, 64, UINT64_MAX);
		now = kvp__now_ns();
		kvp__conn_timers(a, now);
		if (e->state == KVP_ENGINE_CONNECTING)
			kvp__engines_step(a, now);
	}
}

int kvp_agent_connect(kvp_agent *a, const struct kvp_peer *ranks, uint32_t n,
		      int timeout_ms)
{
	struct kvp_eng *e;
	uint32_t h;
	int err;

	if (!a)
		return -EINVAL;
	kvp__why_clear(&a->last);
	err = check_ranks(a, ranks, n);
	if (err || timeout_ms <= 0)
		return kvp__call_err(&a->last, err ? err : -EINVAL);
	if (a->def_eng)
		return kvp__call_err(&a->last, -EISCONN);
	err = add_engine(a, ranks, n, (uint32_t)timeout_ms, 1, &h);
	if (err)
		return kvp__call_err(&a->last, err);
	e = kvp__engine_get(a, h);
	/* The drain after a failure is bounded too (2 s). */
	err = wait_engine(a, e, e->deadline);
	if (err) {
		a->last = e->why;
		eng_free(a, e);
		return kvp__call_err(&a->last, err);
	}
	e->quiet = 0;
	a->def_eng = h;
	return 0;
}

const kvp_plan *kvp_agent_plan(const kvp_agent *a)
{
	const struct kvp_eng *e = a ? kvp__engine_get(a, a->def_eng) : NULL;

	return e && e->pc ? e->pc->plan : NULL;
}
