// SPDX-License-Identifier: MIT
/*
 * The consumer's data path: pull, posting, send completions.
 *
 * A pull emits its READs with kvp_plan_emit() straight into a ring of
 * kvp_wr/kvp_sge (allocated at connect, two requests' worth at the bound),
 * then queues one chunk per connection: that producer rank's READs followed
 * by the fenced notification SEND. kvp__conn_flush() turns chunks into one
 * chain of ibv_send_wr per connection and posts it with one doorbell, as far
 * as the send queue has room; the rest stays in the ring and is posted from
 * poll when completions free room. Ring space is given back, in pull order,
 * once a request's chunks are all posted (the provider copies WRs at post
 * time), so the ring only ever holds what waits for room.
 *
 * Send queue accounting: a WR occupies the SQ until a later signalled WR of
 * the same QP completes (RC completes in order). Each chain's last WR is
 * signalled, and one in every sig_every inside long chains, so room comes
 * back while a big request is still streaming; every signalled wr_id
 * carries how many WRs it retires. One SQ slot stays free for the drain
 * marker.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define NO_REQ UINT32_MAX

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

/* Gives ring space back, oldest first, for requests fully posted. */
static void rec_done(kvp_agent *a, struct kvp_req *r)
{
	a->recs[r->rec & a->rec_mask].done = 1;
	while (a->rec_head != a->rec_tail &&
	       a->recs[a->rec_head & a->rec_mask].done)
		a->rec_head++;
	if (a->rec_head == a->rec_tail) {
		a->wr_head = a->wr_tail = 0;
		a->sge_head = a->sge_tail = 0;
	} else {
		const struct kvp_rec *h = &a->recs[a->rec_head & a->rec_mask];

		a->wr_head = h->wr_start;
		a->sge_head = h->sge_start;
	}
}

static void req_chunk_done(kvp_agent *a, struct kvp_req *r, int err)
{
	struct kvp_event ev;

	if (err && !r->status)
		r->status = err;
	if (--r->pending)
		return;
	r->state = RQ_FINISHED;
	memset(&ev, 0, sizeof(ev));
	ev.type = r->status ? KVP_EV_FAILED : KVP_EV_DONE;
	ev.status = r->status;
	ev.req_id = r->req_id;
	ev.rank = (uint32_t)(r - a->reqs); /* the slot, until delivered */
	kvp__ev_push(a, &ev);
	if (r->status)
		a->st.failed++;
	else
		a->st.done++;
}

/* FAILED slots live until the poll after the one that reported them. */
void kvp__req_reap(kvp_agent *a)
{
	uint32_t i;

	if (!a->nreq_reported)
		return;
	for (i = 0; i < a->max_inflight; i++) {
		struct kvp_req *r = &a->reqs[i];

		if (r->state != RQ_REPORTED)
			continue;
		r->state = RQ_FREE;
		r->next_free = a->free_req;
		a->free_req = i;
	}
	a->nreq_reported = 0;
}

void kvp__chunks_fail(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i;

	for (i = c->c_head; i != c->c_tail; i++) {
		struct kvp_req *r = &a->reqs[c->chunks[i & a->chunk_mask].slot];

		if (i - c->c_post < c->c_tail - c->c_post && !--r->unposted)
			rec_done(a, r);
		req_chunk_done(a, r, c->status);
	}
	c->c_head = c->c_post = c->c_tail;
}

/* ---- completions -------------------------------------------------------- */

void kvp__send_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	struct kvp_chunk *ch;

	if (kvp_unlikely(c->state != CS_READY && c->state != CS_DRAINING))
		return;
	if (kvp_unlikely(wc->status != IBV_WC_SUCCESS)) {
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		return;
	}
	c->outstanding -= WRID_VALUE(wc->wr_id);
	if (WRID_KIND(wc->wr_id) != WK_NOTE)
		return;
	/* A notification completed: by RC ordering and the fence, so did
	 * every READ of its chunk. */
	ch = &c->chunks[c->c_head & a->chunk_mask];
	c->c_head++;
	req_chunk_done(a, &a->reqs[ch->slot], 0);
}

/* ---- posting ------------------------------------------------------------ */

void kvp__conn_flush(kvp_agent *a, struct kvp_conn *c)
{
	struct ibv_send_wr *w = a->swr, *s = NULL, *bad;
	struct ibv_sge *g = a->ssge;
	const uint32_t gen = c->gen, idx = c->idx, mask = a->chunk_mask;
	uint32_t room, n = 0, since = 0, j;
	uint64_t bytes = 0, reads = 0;
	int err;

	if (kvp_unlikely(c->state != CS_READY))
		return;
	room = a->sq_cap - c->outstanding;
	while (c->c_post != c->c_tail && n < room) {
		struct kvp_chunk *ch = &c->chunks[c->c_post & mask];
		struct kvp_req *r;

		while (ch->wr_pos < ch->wr_end && n < room) {
			const struct kvp_wr *rw = &a->ring_wr[ch->wr_pos++];
			const struct kvp_sge *rs =
				&a->ring_sge[ch->sge_base + rw->sge_first];

			s = &w[n++];
			s->next = s + 1;
			s->sg_list = g;
			s->num_sge = (int)rw->nsge;
			s->opcode = IBV_WR_RDMA_READ;
			s->wr.rdma.remote_addr = c->raddr[rw->region] + rw->offset;
			s->wr.rdma.rkey = c->rkey[rw->region];
			for (j = 0; j < rw->nsge; j++, g++) {
				g->addr = a->lbase[rs[j].region] + rs[j].offset;
				g->length = rs[j].len;
				g->lkey = a->lkey[rs[j].region];
			}
			if (kvp_unlikely(++since == a->sig_every)) {
				s->send_flags = IBV_SEND_SIGNALED;
				s->wr_id = kvp__wrid(WK_SIGNAL, gen, idx, since);
				since = 0;
			} else {
				s->send_flags = 0;
				s->wr_id = kvp__wrid(WK_READ, gen, idx, 0);
			}
			bytes += rw->len;
			reads++;
		}
		if (ch->wr_pos < ch->wr_end || n == room)
			break;
		/* The notification: fenced behind this QP's READs. */
		r = &a->reqs[ch->slot];
		s = &w[n++];
		s->next = s + 1;
		s->sg_list = g;
		s->num_sge = 1;
		g->addr = (uint64_t)(uintptr_t)(a->note_buf +
						(size_t)ch->slot * KVP_NOTE_LEN);
		g->length = KVP_NOTE_LEN;
		g->lkey = a->note_mr->lkey;
		g++;
		s->opcode = IBV_WR_SEND;
		s->send_flags = IBV_SEND_SIGNALED | IBV_SEND_FENCE;
		s->wr_id = kvp__wrid(WK_NOTE, gen, idx, since + 1);
		since = 0;
		c->c_post++;
		a->st.notes_sent++;
		if (!--r->unposted)
			rec_done(a, r);
	}
	if (!n)
		return;
	if (since) {
		s->send_flags |= IBV_SEND_SIGNALED;
		s->wr_id = kvp__wrid(WK_SIGNAL, gen, idx, since);
	}
	s->next = NULL;
	err = kvp__post_send(c->qp, w, &bad);
	a->st.doorbells++;
	if (kvp_unlikely(err)) {
		/* WRs before `bad` are posted; the drain marker flushes them
		 * and fails every chunk of this connection. */
		kvp__conn_fail(a, c, err);
		return;
	}
	c->outstanding += n;
	a->st.reads += reads;
	a->st.read_bytes += bytes;
}

/* Contiguous room for `need` entries in a ring whose live part runs from
 * head to tail (wrapping); `empty` when nothing is live. */
static int ring_take(uint32_t head, uint32_t tail, uint32_t cap, int empty,
		     uint32_t need, uint32_t *pos)
{
	if (empty) {
		*pos = 0;
		return need <= cap;
	}
	if (tail > head) {
		if (cap - tail >= need) {
			*pos = tail;
			return 1;
		}
		*pos = 0;
		return head >= need;
	}
	*pos = tail;
	return tail < head && head - tail >= need;
}

int kvp_agent_pull(kvp_agent *a, uint64_t req_id, const struct kvp_ids *ids)
{
	uint32_t wpos, spos, nsge = 0, slot, g, k, queued = 0;
	const uint32_t ngroups = a ? a->li.ngroups : 0;
	struct kvp_req *r;
	struct kvp_rec *rec;
	uint8_t *note;
	int n, empty;

	if (kvp_unlikely(!a || !ids || a->role != KVP_ROLE_CONSUMER))
		return -EINVAL;
	if (kvp_unlikely(!a->connected || a->ndead))
		return -ENOTCONN;
	for (g = 0; g < ngroups; g++)
		if (ids[g].nlocal > a->max_ids || ids[g].nremote > a->max_ids)
			return -EINVAL;
	if (kvp_unlikely(a->free_req == NO_REQ ||
			 a->rec_tail - a->rec_head > a->rec_mask))
		return -EBUSY;
	empty = a->rec_head == a->rec_tail;
	if (kvp_unlikely(!ring_take(a->wr_head, a->wr_tail, a->ring_wr_cap,
				    empty, a->bound_wr, &wpos) ||
			 !ring_take(a->sge_head, a->sge_tail, a->ring_sge_cap,
				    empty, a->bound_sge, &spos)))
		return -EBUSY;
	n = kvp_plan_emit(a->plan, ids, a->ring_wr + wpos, a->bound_wr,
			  a->ring_sge + spos, a->bound_sge, a->src_end);
	if (kvp_unlikely(n < 0))
		return n;
	if (n)
		nsge = a->ring_wr[wpos + n - 1].sge_first +
		       a->ring_wr[wpos + n - 1].nsge;

	slot = a->free_req;
	r = &a->reqs[slot];
	a->free_req = r->next_free;
	for (g = 0; g < ngroups; g++) {
		struct kvp_ids *d = &r->gids[g];

		if (ids[g].nlocal) /* a full hit may pass local NULL */
			memcpy(r->ids + (size_t)g * a->max_ids, ids[g].local,
			       (size_t)ids[g].nlocal * sizeof(uint32_t));
		d->nlocal = ids[g].nlocal;
		d->tokens = ids[g].tokens;
	}
	note = a->note_buf + (size_t)slot * KVP_NOTE_LEN;
	kvp__put32(note, KVP_NOTE_MAGIC);
	kvp__put32(note + 4, a->li.tp_rank);
	kvp__put64(note + 8, req_id);
	kvp__put64(note + 16, a->li.engine_id);
	kvp__put64(note + 24, 0);

	rec = &a->recs[a->rec_tail & a->rec_mask];
	rec->wr_start = wpos;
	rec->wr_end = wpos + (uint32_t)n;
	rec->sge_start = spos;
	rec->sge_end = spos + nsge;
	rec->done = 0;
	r->rec = a->rec_tail++;
	a->wr_tail = rec->wr_end;
	a->sge_tail = rec->sge_end;

	r->req_id = req_id;
	r->state = RQ_ACTIVE;
	r->status = 0;
	r->pending = a->pi.nnotify;
	r->unposted = a->pi.nnotify;
	for (k = 0; k < a->pi.nnotify; k++) {
		struct kvp_conn *c = &a->conns[a->note_conn[k]];
		struct kvp_chunk *ch = &c->chunks[c->c_tail++ & a->chunk_mask];
		int32_t s = a->note_src[k];

		ch->slot = slot;
		ch->sge_base = spos;
		ch->wr_pos = wpos + (s > 0 ? a->src_end[s - 1] : 0);
		ch->wr_end = s >= 0 ? wpos + a->src_end[s] : ch->wr_pos;
	}
	for (k = 0; k < a->pi.nnotify; k++) {
		struct kvp_conn *c = &a->conns[a->note_conn[k]];

		kvp__conn_flush(a, c);
		if (kvp_unlikely(c->c_post != c->c_tail)) {
			const struct kvp_chunk *ch =
				&c->chunks[(c->c_tail - 1) & a->chunk_mask];

			queued += ch->wr_end - ch->wr_pos + 1;
		}
	}
	a->st.queued += queued;
	a->st.pulls++;
	return 0;
}

/* ---- allocation at connect ---------------------------------------------- */

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
	free(a->recs);
	a->recs = NULL;
	free(a->ring_wr);
	a->ring_wr = NULL;
	free(a->ring_sge);
	a->ring_sge = NULL;
	free(a->note_conn);
	a->note_conn = NULL;
	free(a->note_src);
	a->note_src = NULL;
	free(a->src_end);
	a->src_end = NULL;
	free(a->swr);
	a->swr = NULL;
	free(a->ssge);
	a->ssge = NULL;
	if (a->role == KVP_ROLE_CONSUMER) {
		free(a->evq);
		a->evq = NULL;
		a->ev_cap = 0;
	}
}

/* Sizes everything the data path touches, from the plan and the attrs. */
int kvp__data_alloc(kvp_agent *a)
{
	const uint32_t nn = a->pi.nnotify, ns = a->pi.nsrc;
	const uint32_t ng = a->li.ngroups, mi = a->max_inflight;
	uint32_t i, k, *ids;
	struct kvp_ids *gids;
	int err = -ENOMEM;

	kvp_plan_emit_bound(a->plan, a->max_ids, &a->bound_wr, &a->bound_sge);
	if (a->bound_wr >= UINT32_MAX / 2 || a->bound_sge >= UINT32_MAX / 2)
		return -ENOMEM;
	if (!a->bound_wr)
		a->bound_wr = 1;
	if (!a->bound_sge)
		a->bound_sge = 1;
	a->ring_wr_cap = 2 * a->bound_wr;
	a->ring_sge_cap = 2 * a->bound_sge;
	a->ring_wr = calloc(a->ring_wr_cap, sizeof(*a->ring_wr));
	a->ring_sge = calloc(a->ring_sge_cap, sizeof(*a->ring_sge));
	a->rec_mask = kvp__pow2_at_least(mi) - 1;
	a->recs = calloc(a->rec_mask + 1, sizeof(*a->recs));
	a->chunk_mask = kvp__pow2_at_least(mi) - 1;
	a->note_conn = calloc(nn + 1, sizeof(*a->note_conn));
	a->note_src = calloc(nn + 1, sizeof(*a->note_src));
	a->src_end = calloc(ns + 1, sizeof(*a->src_end));
	a->reqs = calloc(mi, sizeof(*a->reqs));
	ids = calloc((size_t)mi * ng * a->max_ids + 1, sizeof(*ids));
	gids = calloc((size_t)mi * ng + 1, sizeof(*gids));
	a->sq_cap = a->sq_depth - 1;
	a->sig_every = a->sq_cap / 4 ? a->sq_cap / 4 : 1;
	a->swr = calloc(a->sq_cap, sizeof(*a->swr));
	a->ssge = calloc((size_t)a->sq_cap * a->max_sge, sizeof(*a->ssge));
	a->note_buf = calloc(mi, KVP_NOTE_LEN);
	a->ev_cap = mi + a->nconns + 8;
	a->evq = calloc(a->ev_cap, sizeof(*a->evq));
	if (a->reqs) {
		a->reqs[0].ids = ids;
		a->reqs[0].gids = gids;
	}
	if (!a->ring_wr || !a->ring_sge || !a->recs || !a->note_conn ||
	    !a->note_src || !a->src_end || !a->reqs || !ids || !gids ||
	    !a->swr || !a->ssge || !a->note_buf || !a->evq) {
		if (!a->reqs) {
			free(ids);
			free(gids);
		}
		goto err_free;
	}
	for (i = 0; i < mi; i++) {
		struct kvp_req *r = &a->reqs[i];

		r->ids = ids + (size_t)i * ng * a->max_ids;
		r->gids = gids + (size_t)i * ng;
		for (k = 0; k < ng; k++)
			r->gids[k].local = r->ids + (size_t)k * a->max_ids;
		r->next_free = i + 1 < mi ? i + 1 : NO_REQ;
	}
	a->free_req = 0;
	for (k = 0; k < nn; k++) {
		int r = kvp_plan_notify(a->plan, k);

		a->note_conn[k] = (uint32_t)r;
		a->note_src[k] = -1;
		for (i = 0; i < ns; i++)
			if (kvp_plan_source(a->plan, i) == r)
				a->note_src[k] = (int32_t)i;
	}
	/* Only ever the source of SENDs: local read access suffices. */
	err = kvp__reg_mr(a->pd, a->note_buf, (size_t)mi * KVP_NOTE_LEN, 0,
			  &a->note_mr);
	if (err)
		goto err_free;
	for (k = 0; k < nn; k++) {
		struct kvp_conn *c = &a->conns[a->note_conn[k]];
		struct kvp_layout_info pi;

		kvp_layout_get_info(c->peer, &pi);
		err = -ENOMEM;
		c->chunks = calloc(a->chunk_mask + 1, sizeof(*c->chunks));
		c->raddr = calloc(pi.nregions + 1, sizeof(*c->raddr));
		c->rkey = calloc(pi.nregions + 1, sizeof(*c->rkey));
		if (!c->chunks || !c->raddr || !c->rkey)
			goto err_conns;
		err = -EPROTO;
		for (i = 0; i < pi.nregions; i++)
			if (kvp_layout_get_region_key(c->peer, i, &c->raddr[i],
						      &c->rkey[i]))
				goto err_conns;
		c->outstanding = 0;
		c->c_head = c->c_post = c->c_tail = 0;
	}
	a->ev_head = a->ev_tail = 0;
	return 0;

err_conns:
	for (k = 0; k < nn; k++) {
		struct kvp_conn *c = &a->conns[a->note_conn[k]];

		free(c->chunks);
		free(c->raddr);
		free(c->rkey);
		c->chunks = NULL;
		c->raddr = NULL;
		c->rkey = NULL;
	}
err_free:
	kvp__data_free(a);
	return err;
}
