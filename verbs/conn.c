// SPDX-License-Identifier: MIT
/*
 * Connections, what both sides share: our blob, control buffers, the
 * probes, failure, draining, teardown. listen.c holds the producer's side
 * of the handshake, connect.c the consumer's; agent.c hands each rdma_cm
 * event and completion to the side that owns the connection. This file
 * names neither side: what happens to a connection goes to its side
 * through the callbacks in c->ops (failed, drained).
 *
 * The handshake (version 4) on one RC QP, after rdma_cm's exchange of
 * private data:
 *   consumer: connect: hello (role, engine, TP rank and size, blob length,
 *             QP index and count, nonce: clock and random), and with a
 *             secret the hello's proof (KVP_HELLO_TAG_LEN)
 *   producer: checks the hello, its proof and clock (with a secret) and
 *             its limits (admit.c: length bounds, slots per source
 *             address, handshakes at once), makes the QP (on the shared
 *             receive queue, or with one RECV for a control message),
 *             accept: hello, nonce, MAC
 *   consumer: checks the producer's MAC when it holds a secret; RECVs for
 *             GO and the producer's blob, SEND(AUTH: its MAC, its blob's
 *             address and key)
 *   producer: checks the MAC when it holds a secret; only then registers
 *             a buffer for the consumer's blob and READs it, SEND(GO: the
 *             credits, the counter, the flags)
 *   producer: checks the blob (one per poll), SEND(its blob) or
 *             SEND(REFUSE: -errno)
 *   consumer: ready
 * The consumer posts its RECVs before anything can be sent to it, so no
 * RNR wait is part of the handshake; the producer only receives AUTH and
 * notification-sized messages (its blob it READs). Any message but AUTH
 * before the producer's GO drops the connection (inbox.c). Without a
 * secret the MACs are not checked (anyone who reaches the port is
 * trusted: see the header).
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#include "hmac.h"

#define DRAIN_NS 2000000000ull	       /* bound on waiting for flushes */

void kvp__hello_fill(const kvp_agent *a, uint32_t side, struct kvp_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->version = KVP_HELLO_VERSION;
	h->role = (uint16_t)side;
	h->tp_size = a->li.tp_size;
	h->tp_rank = a->li.tp_rank;
	h->blob_len = (uint32_t)a->blob_len;
	h->engine_id = a->li.engine_id;
	h->flags = a->secret ? KVP_HELLO_AUTH : 0;
	h->lib = kvp_version();
	if (side == KVP_ROLE_CONSUMER)
		h->flags |= a->qps << KVP_HELLO_QPS_SHIFT;
}

int kvp__regions_ready(const kvp_agent *a)
{
	uint32_t i;

	for (i = 0; i < a->li.nregions; i++)
		if (!a->lnkeys[i])
			return 0;
	return 1;
}

/* Encodes our blob as the handshake sends it: our layout, with the region
 * addresses and rkeys of registration on a producer (a consumer's memory is
 * not remotely accessible: its blob carries no keys). Returns 0 and the
 * length in *len; -ENOSPC with the length needed in *len when cap is too
 * small (buf untouched); -EMSGSIZE above KVP_META_MAX; -ENOMEM. Every
 * region must be registered. */
static int meta_encode(const kvp_agent *a, void *buf, size_t cap, size_t *len)
{
	kvp_layout *l = NULL;
	size_t need = 0;
	uint32_t i;
	int err;

	err = kvp_layout_clone(a->layout, &l);
	if (err)
		return err;
	for (i = 0; a->producer && i < a->li.nregions; i++) {
		const struct kvp_emit_map *lr = &a->lreg[i];
		uint32_t k, n = a->lnkeys[i], *rkey = calloc(n, sizeof(*rkey));

		err = -ENOMEM;
		if (!rkey)
			goto out;
		for (k = 0; k < n; k++)
			rkey[k] = a->mr[i][k]->rkey;
		err = kvp_layout_set_region_keys(
			l, i, lr->addr, lr->shift == KVP_ONE_MR ? 0 : lr->shift,
			rkey, n);
		free(rkey);
		if (err)
			goto out;
	}
	err = kvp_meta_encode(l, NULL, 0, &need);
	if (err != -EMSGSIZE && err)
		goto out;
	err = -EMSGSIZE;
	if (!need || need > KVP_META_MAX)
		goto out;
	if (need > cap) {
		*len = need;
		err = -ENOSPC;
		goto out;
	}
	err = kvp_meta_encode(l, buf, cap, len);
out:
	kvp_layout_destroy(l);
	return err;
}

int kvp_agent_get_meta(const kvp_agent *a, void *buf, size_t cap, size_t *len)
{
	if (!a || !len || (cap && !buf))
		return -EINVAL;
	if (!kvp__regions_ready(a))
		return -ENXIO;
	return meta_encode(a, buf, cap, len);
}

/* Encodes our blob into a registered buffer for the handshake's SEND,
 * once: registration is closed from here on. */
int kvp__blob_make(kvp_agent *a)
{
	size_t len = 0;
	int err;

	if (a->blob)
		return 0;
	err = meta_encode(a, NULL, 0, &len);
	if (err != -ENOSPC)
		return err ? err : -EPROTO;
	a->blob = malloc(len);
	if (!a->blob)
		return -ENOMEM;
	err = meta_encode(a, a->blob, len, &a->blob_len);
	if (err)
		goto err_blob;
	/* A producer's is the source of a SEND; a consumer's is READ by
	 * each producer rank it connects to, after our AUTH (it holds our
	 * layout and no key: nothing a peer may not see). */
	err = kvp__reg_mr(a->pd, a->blob, a->blob_len,
			  a->consumer ? IBV_ACCESS_REMOTE_READ : 0,
			  &a->blob_mr);
	if (err)
		goto err_blob;
	a->started = 1;
	return 0;

err_blob:
	free(a->blob);
	a->blob = NULL;
	a->blob_len = 0;
	return err;
}

void kvp__blob_free(kvp_agent *a)
{
	kvp__dereg_mr(a->blob_mr);
	free(a->blob);
	a->blob_mr = NULL;
	a->blob = NULL;
	a->blob_len = 0;
}

struct kvp_conn *kvp__conns_alloc(uint32_t n)
{
	struct kvp_conn *c;
	uint32_t i;

	c = aligned_alloc(KVP_CACHELINE, (size_t)n * sizeof(*c));
	if (!c)
		return NULL;
	memset(c, 0, (size_t)n * sizeof(*c));
	for (i = 0; i < n; i++)
		c[i].idx = i;
	return c;
}

/* CQ k of the runs limits.c chose (see kvp__cq_idx()). */
int kvp__cq_make(kvp_agent *a, uint32_t k)
{
	const struct kvp_limits *l = &a->lim;
	int prod = k < l->ncq_prod, err;
	uint32_t per, need, nside, first, n;

	if (a->cqs[k])
		return 0;
	per = prod ? l->prod_per_cq : l->cons_per_cq;
	need = prod ? l->prod_cqe : l->cons_cqe;
	nside = prod ? a->nprod : a->nconns - a->nprod;
	first = (prod ? k : k - l->ncq_prod) * per;
	n = nside - first < per ? nside - first : per;
	err = kvp__create_cq(a->ctx,
			     (int)(KVP_CQ_SPARE + n * need +
				   (prod ? l->prod_cq_extra : 0)),
			     a->cch, &a->cqs[k]);
	if (err)
		return err;
	/* An armed agent sleeps on every CQ: this one too. */
	if (a->armed)
		(void)kvp__req_notify_cq(a->cqs[k]);
	return 0;
}

/* What a slot needs beyond its fixed part, set up the first time it is
 * taken and kept for the agent's life, so that an agent opened for many
 * peers costs little until they come (the arrays are reserved at open and
 * only these slots' pages touched): its run's CQ, if the first; producer:
 * the credit counter's MR (its follower records' MR waits for a
 * streaming consumer's TABLE: serve.c); consumer: the progress table's
 * MR. One MR each, for least privilege: a peer's keys reach its slot's
 * alone. */
int kvp__slot_prepare(kvp_agent *a, struct kvp_conn *c)
{
	int err;

	if (c->prepared)
		return 0;
	err = kvp__cq_make(a, kvp__cq_idx(a, c));
	if (err)
		return err;
	if (c->side == KVP_ROLE_PRODUCER) {
		err = kvp__reg_mr(a->pd, &a->ctr[c->idx], sizeof(*a->ctr),
				  IBV_ACCESS_REMOTE_READ, &a->ctr_mr[c->idx]);
		/* The slot's own buffer in the shared receive queue. */
		if (!err && a->srq)
			err = kvp__srq_grow(a, (uint32_t)kvp__credit_bufs(
						       a->nprepared[0] + 1,
						       a->srq_pool));
		if (err) {
			kvp__dereg_mr(a->ctr_mr[c->idx]);
			a->ctr_mr[c->idx] = NULL;
			return err;
		}
	} else {
		const uint32_t ci = c->idx - a->nprod;
		const size_t pl = 2 * (size_t)a->max_inflight * KVP_PROG_REC;

		/* Written by its producer rank alone. */
		err = kvp__reg_mr(a->pd, a->ptab + ci * pl, pl,
				  IBV_ACCESS_LOCAL_WRITE |
					  IBV_ACCESS_REMOTE_WRITE,
				  &a->ptab_mr[ci]);
		if (err)
			return err;
	}
	c->prepared = 1;
	a->nprepared[c->side == KVP_ROLE_CONSUMER]++;
	if (c->side == KVP_ROLE_PRODUCER && c->idx >= a->prod_hw)
		a->prod_hw = c->idx + 1;
	if (c->side == KVP_ROLE_CONSUMER && c->idx >= a->cons_end)
		a->cons_end = c->idx + 1;
	return 0;
}

void kvp__slots_free(kvp_agent *a)
{
	uint32_t i;

	for (i = 0; a->conns && i < a->nconns; i++) {
		kvp__dereg_mr(a->conns[i].notes_mr);
		free(a->conns[i].notes);
		a->conns[i].notes_mr = NULL;
		a->conns[i].notes = NULL;
		a->conns[i].notes_n = 0;
	}
}

/* One signalled WR of one SGE: a SEND, or a READ of raddr (rkey). */
static int post1(struct kvp_conn *c, uint64_t wr_id, enum ibv_wr_opcode op,
		 void *buf, uint32_t len, uint32_t lkey, uint64_t raddr,
		 uint32_t rkey)
{
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;

	memset(&wr, 0, sizeof(wr));
	sge.addr = (uint64_t)(uintptr_t)buf;
	sge.length = len;
	sge.lkey = lkey;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	return kvp__post_send(c->qp, &wr, &bad);
}

int kvp__post_send1(struct kvp_conn *c, uint64_t wr_id, void *buf,
		    uint32_t len, uint32_t lkey)
{
	return post1(c, wr_id, IBV_WR_SEND, buf, len, lkey, 0, 0);
}

int kvp__post_read1(struct kvp_conn *c, uint64_t wr_id, void *buf,
		    uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	return post1(c, wr_id, IBV_WR_RDMA_READ, buf, len, lkey, raddr, rkey);
}

int kvp__post_recv1(struct kvp_conn *c, uint64_t wr_id, void *buf,
		    uint32_t len, uint32_t lkey)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;

	memset(&wr, 0, sizeof(wr));
	sge.addr = (uint64_t)(uintptr_t)buf;
	sge.length = len;
	sge.lkey = lkey;
	wr.wr_id = wr_id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return kvp__post_recv(c->qp, &wr, &bad);
}

int kvp__post_note_recv(kvp_agent *a, struct kvp_conn *c, uint32_t i)
{
	return kvp__post_recv1(c, kvp__wrid(WK_NOTE_RECV, c->gen, c->idx, i),
			  c->notes + (size_t)i * KVP_NOTE_LEN, KVP_NOTE_LEN,
			  c->notes_mr->lkey);
}

/* A buffer for the peer's blob, registered for our RECV. */
int kvp__peer_blob_alloc(kvp_agent *a, struct kvp_conn *c)
{
	int err;

	c->blob = malloc(c->peer_blob);
	if (!c->blob)
		return -ENOMEM;
	err = kvp__reg_mr(a->pd, c->blob, c->peer_blob, IBV_ACCESS_LOCAL_WRITE,
			  &c->blob_mr);
	if (err) {
		free(c->blob);
		c->blob = NULL;
		return err;
	}
	c->blob_len = c->peer_blob;
	return 0;
}

void kvp__peer_blob_free(struct kvp_conn *c)
{
	kvp__dereg_mr(c->blob_mr);
	free(c->blob);
	c->blob_mr = NULL;
	c->blob = NULL;
	c->blob_len = 0;
}

int kvp__ctl_alloc(kvp_agent *a, uint32_t n)
{
	size_t len = (size_t)n * KVP_CTL_SLOT;
	int err;

	a->ctl = calloc(1, len);
	if (!a->ctl)
		return -ENOMEM;
	err = kvp__reg_mr(a->pd, a->ctl, len, IBV_ACCESS_LOCAL_WRITE,
			  &a->ctl_mr);
	if (err) {
		free(a->ctl);
		a->ctl = NULL;
	}
	return err;
}

void kvp__ctl_free(kvp_agent *a)
{
	kvp__dereg_mr(a->ctl_mr);
	free(a->ctl);
	a->ctl_mr = NULL;
	a->ctl = NULL;
}

uint8_t *kvp__ctl_rx(const kvp_agent *a, const struct kvp_conn *c)
{
	return a->ctl + (size_t)c->idx * KVP_CTL_SLOT;
}

uint8_t *kvp__ctl_aux(const kvp_agent *a, const struct kvp_conn *c)
{
	return kvp__ctl_rx(a, c) + 2 * KVP_CTL_LEN;
}

uint8_t *kvp__ctl_tx(const kvp_agent *a, const struct kvp_conn *c)
{
	return kvp__ctl_rx(a, c) + KVP_CTL_LEN;
}

int kvp__post_ctl_recv(kvp_agent *a, struct kvp_conn *c)
{
	return kvp__post_recv1(c, kvp__wrid(WK_CTL_RECV, c->gen, c->idx, 0),
			       kvp__ctl_rx(a, c), KVP_CTL_LEN,
			       a->ctl_mr->lkey);
}

int kvp__post_ctl_send(kvp_agent *a, struct kvp_conn *c, uint32_t len)
{
	return kvp__post_send1(c, kvp__wrid(WK_CTL_SEND, c->gen, c->idx, 0),
			       kvp__ctl_tx(a, c), len, a->ctl_mr->lkey);
}

void kvp__auth_mac(const kvp_agent *a, char label, const uint8_t *hello_c,
		   const uint8_t *hello_p, uint8_t mac[KVP_MAC_LEN])
{
	static const char tag[] = "kvpull handshake ";
	const void *m[4] = { tag, &label, hello_c, hello_p };
	const size_t l[4] = { sizeof(tag) - 1, 1, KVP_HELLO_LEN,
			      KVP_HELLO_LEN };

	kvp__hmac_sha256(a->secret, a->secret_len, m, l, 4, mac);
}

void kvp__rec_key(const kvp_agent *a, struct kvp_conn *c)
{
	uint8_t mac[KVP_MAC_LEN];

	/* Never sent: label 'R' is neither side's proof. */
	kvp__auth_mac(a, 'R', c->hello_c, c->hello_p, mac);
	memcpy(c->rec_key, mac, sizeof(c->rec_key));
}

void kvp__hello_tag(const kvp_agent *a, const uint8_t *hello,
		    uint8_t tag[KVP_HELLO_TAG_LEN])
{
	static const char label[] = "kvpull hello ";
	const void *m[2] = { label, hello };
	const size_t l[2] = { sizeof(label) - 1, KVP_HELLO_LEN };
	uint8_t mac[KVP_MAC_LEN];

	kvp__hmac_sha256(a->secret, a->secret_len, m, l, 2, mac);
	memcpy(tag, mac, KVP_HELLO_TAG_LEN);
}

uint64_t kvp__wall_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec;
}

int kvp__refusal_errno(int32_t err)
{
	switch (err) {
	case -EPROTO:
	case -EPROTONOSUPPORT:
	case -EPERM:
	case -EUSERS:
	case -EBUSY:
		return err;
	default:
		return -EPROTO;
	}
}

/* Producer: c, the first of its consumer rank's live connections, goes;
 * the rank's next live one (if any) now counts the rank against
 * max_per_source and holds its reserved slots; without one, they free. */
static void rank_head_pass(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i;

	for (i = 0; i < a->prod_hw; i++) {
		struct kvp_conn *o = &a->conns[i];

		if (o != c && o->state != CS_FREE &&
		    o->engine_id == c->engine_id && o->rank == c->rank &&
		    !memcmp(o->src, c->src, sizeof(c->src))) {
			o->rank_head = 1;
			o->resv = c->resv;
			c->resv = 0;
			return;
		}
	}
	a->nreserved -= c->resv;
	c->resv = 0;
}

void kvp__conn_release(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t gen = c->gen;

	if (c->rank_head)
		rank_head_pass(a, c);
	if (c->evicted)
		a->nevicting--;

	if (a->srq && c->side == KVP_ROLE_PRODUCER)
		kvp__srq_conn_gone(a, c);
	kvp__destroy_qp(c->id);
	kvp__destroy_id(c->id);
	kvp__peer_blob_free(c);
	/* c->notes stays with the slot (kvp__slots_free()). */
	kvp_layout_destroy(c->peer);
	if (c->blob_pending)
		a->npending--;
	if (c->auth_wait)
		a->nauth_wait--;
	free(c->rreg);
	free(c->rkeys);
	free(c->chunks);
	c->chunks = NULL;
	free(c->lw);
	c->lw = NULL;
	c->lw_tail = c->lw_post = c->lw_done = 0;
	free(c->marks);
	c->marks = NULL;
	c->m_head = c->m_tail = 0;
	c->outstanding = c->c_head = c->c_post = c->c_tail = 0;
	c->c_data = c->c_note = 0;
	c->l_head = c->l_tail = c->nlast = 0;
	c->notes_posted = c->credit_seen = c->ctr_raddr = 0;
	c->ctr_rkey = c->credit_max = 0;
	c->credit_reading = c->credit_hold = c->starved = 0;
	c->wait_since = 0;
	c->psrc = NO_SRC;
	c->q = 0;
	c->status = 0;
	c->drains = 0;
	c->drain_deadline = 0;
	c->lastwqe_wait = 0;
	c->qp = NULL;
	c->id = NULL;
	c->rreg = NULL;
	c->rkeys = NULL;
	c->rank = 0;
	c->engine_id = 0;
	c->reported = 0;
	c->bye = c->bye_sent = 0;
	c->blob_got = 0;
	c->blob_pending = 0;
	c->auth_wait = 0;
	c->auth_rkey = 0;
	c->auth_addr = 0;
	c->credits = 0;
	c->peer_blob = 0;
	c->peer_tp = 0;
	c->nearly = 0;
	c->peer = NULL;
	c->refused = 0;
	c->reason = 0;
	c->rank_head = 0;
	c->retry_ms = 0;
	c->retrying = 0;
	c->last_used = 0;
	c->evicted = 0;
	c->expected = 0;
	c->probing = 0;
	c->probe_at = 0;
	c->ptab_addr = 0;
	c->ptab_rkey = c->ptab_n = c->prog_out = 0;
	c->prog_dirty = c->table_sent = 0;
	/* Completions of this life still queued in the CQ carry the old
	 * generation and are dropped. */
	c->gen = gen + 1;
	kvp__set_state(a, c, CS_FREE);
}

void kvp__conn_fail(kvp_agent *a, struct kvp_conn *c, int err)
{
	struct ibv_send_wr swr, *sbad;
	struct ibv_recv_wr rwr, *rbad;
	int was_ready = c->state == CS_READY;

	if (c->state == CS_FREE || c->state >= CS_DRAINING)
		return;
	if (!c->status) /* a refusal's reason wins over the disconnect */
		c->status = err ? err : -ECONNRESET;
	kvp__set_state(a, c, CS_DRAINING);
	c->drains = 0;
	c->drain_deadline = kvp__now_ns() + DRAIN_NS;
	a->ndraining++;
	if (c->id && c->qp) {
		/* Error state flushes every posted WR with a completion; a
		 * marker posted now completes after all of them (the kernel's
		 * ib_drain_qp() idea). One SQ slot is always kept free for
		 * it. The disconnect tells the peer. */
		(void)kvp__qp_to_error(c->qp);
		memset(&swr, 0, sizeof(swr));
		swr.wr_id = kvp__wrid(WK_DRAIN_SQ, c->gen, c->idx, 0);
		swr.opcode = IBV_WR_SEND;
		swr.send_flags = IBV_SEND_SIGNALED;
		if (!kvp__post_send(c->qp, &swr, &sbad))
			c->drains++;
		/* A QP of the shared receive queue has no receive queue
		 * of its own to drain. */
		memset(&rwr, 0, sizeof(rwr));
		rwr.wr_id = kvp__wrid(WK_DRAIN_RQ, c->gen, c->idx, 0);
		if (!c->qp->srq && !kvp__post_recv(c->qp, &rwr, &rbad))
			c->drains++;
		/* Its receives come from the shared queue: the device says
		 * when the last one it took is done (the QP's last WQE); a
		 * QP destroyed before may lose that buffer (mlx5). A device
		 * that never says so is found at the first such release. */
		if (c->qp->srq && a->srq_last_wqe != SRQ_LAST_WQE_ABSENT) {
			c->lastwqe_wait = 1;
			c->lastwqe_by = kvp__now_ns() + LASTWQE_NS;
			c->drains++;
		}
		(void)kvp__disconnect(c->id);
	}
	/* Its side reports it and fails what depended on it (a consumer:
	 * the rest of the engine). */
	c->ops->failed(a, c, was_ready);
	if (c->state == CS_DRAINING && !c->drains)
		kvp__conn_drained(a, c);
}

void kvp__conn_last_wqe(kvp_agent *a, struct kvp_conn *c, int seen)
{
	if (!c->lastwqe_wait)
		return;
	c->lastwqe_wait = 0;
	if (seen)
		a->srq_last_wqe = SRQ_LAST_WQE_SEEN;
	else if (a->srq_last_wqe == SRQ_LAST_WQE_UNKNOWN)
		a->srq_last_wqe = SRQ_LAST_WQE_ABSENT; /* never waited again */
	if (c->state == CS_DRAINING && c->drains && !--c->drains)
		kvp__conn_drained(a, c);
}

void kvp__conn_drained(kvp_agent *a, struct kvp_conn *c)
{
	if (c->state != CS_DRAINING)
		return;
	/* Destroying a QP is a costly step (agent.c, COSTLY_BUDGET): past
	 * the poll's, the rest at once in the next (kvp__conn_timers(): the
	 * deadline passed). */
	if (!a->costly_left) {
		c->drain_deadline = 0;
		a->next_timer_ns = 0;
		return;
	}
	a->costly_left--;
	a->ndraining--;
	c->drains = 0;
	/* Every WR posted on it has completed or been flushed: nothing of it
	 * can land any more. Its side lets go and releases it. */
	c->ops->drained(a, c);
}

void kvp__conn_report(kvp_agent *a, struct kvp_conn *c, int last,
		      const struct kvp_why *w, uint32_t engine)
{
	struct kvp_event ev;

	if (c->reported)
		return;
	c->reported = 1;
	if (!last)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.type = KVP_EV_DISCONNECTED;
	ev.status = c->status;
	if (c->bye) {
		ev.status = 0;
		ev.reason = KVP_REASON_CLOSED;
	} else if (w && w->reason) {
		ev.reason = w->reason;
		ev.peer_reason = w->peer_reason;
	} else {
		struct kvp_why e = { 0 };

		kvp__why_errno(&e, c->status);
		ev.reason = e.reason;
	}
	ev.engine_id = c->engine_id;
	ev.rank = c->rank;
	ev.engine = engine;
	kvp__ev_push(a, &ev);
	a->st.disconnects++;
}

/* Producer: a zero-length READ to the consumer rank: its NIC answers
 * without touching memory or checking a key, so only a consumer that is
 * gone (no answer: the transport's retries run out) fails it. */
#define PROBE_BUDGET 8 /* probes posted per kvp__conn_timers() */

static void probe(kvp_agent *a, struct kvp_conn *c, uint64_t now)
{
	struct ibv_send_wr wr, *bad;

	memset(&wr, 0, sizeof(wr));
	wr.wr_id = kvp__wrid(WK_PROBE, c->gen, c->idx, 0);
	wr.opcode = IBV_WR_RDMA_READ;
	wr.send_flags = IBV_SEND_SIGNALED;
	if (kvp__post_send(c->qp, &wr, &bad)) {
		kvp__conn_fail(a, c, -EIO);
		return;
	}
	c->probing = 1;
	c->probe_at = now + KVP_PROBE_WAIT_NS;
}

void kvp__probe_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	if (c->state != CS_READY)
		return;
	if (wc->status != IBV_WC_SUCCESS) {
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		return;
	}
	c->probing = 0;
	c->probe_at = kvp__now_ns() + KVP_PROBE_NS;
	a->st.probes++;
}

void kvp__conn_timers(kvp_agent *a, uint64_t now)
{
	uint32_t i, probes = PROBE_BUDGET;

	for (i = kvp__slot_next(a, 0); i < a->nconns;
	     i = kvp__slot_next(a, i + 1)) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_DRAINING && c->lastwqe_wait &&
		    now >= c->lastwqe_by) {
			kvp__conn_last_wqe(a, c, 0);
		} else if (c->state == CS_DRAINING &&
			   now >= c->drain_deadline) {
			c->drains = 0;
			kvp__conn_drained(a, c);
		} else if (kvp__half_open(c) && now >= c->drain_deadline) {
			kvp__conn_fail(a, c, -ETIMEDOUT);
		} else if (c->side == KVP_ROLE_PRODUCER &&
			   c->state == CS_READY && c->rank_head &&
			   now >= c->probe_at) {
			/* One QP a consumer rank tells whether its host
			 * answers (when it goes, the next QP of the rank
			 * takes its place); a bounded number a call, the
			 * rest in the next. */
			if (c->probing)
				kvp__conn_fail(a, c, -ETIMEDOUT);
			else if (probes && probes--)
				probe(a, c, now);
		}
	}
}

