// SPDX-License-Identifier: MIT
/*
 * The consumer's connections: one producer rank's handshake, consumer side
 * (see conn.c). engine.c decides which ranks to connect and checks what
 * they send.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "hmac.h"
#include "internal.h"

#define RESOLVE_MS 5000

/* The producer accepted: its hello (and, with a secret, its proof) in the
 * accept's private data. Sends our proof; the producer answers GO. */
static int consumer_established(kvp_agent *a, struct kvp_conn *c,
				const uint8_t *pdata, uint32_t plen)
{
	uint8_t mac[KVP_MAC_LEN], *m = kvp__ctl_tx(a, c);
	struct kvp_hello h;
	int err;

	struct kvp_why *w = &a->engs[c->eng].why;

	err = kvp__hello_get(pdata, plen, &h);
	if (err == -EPROTONOSUPPORT)
		return kvp__why_version(w, "producer", c->rank, h.version,
					h.lib);
	if (plen < KVP_HELLO_ACCEPT_LEN || err ||
	    h.role != KVP_ROLE_PRODUCER || h.blob_len < KVP_META_MIN_LEN ||
	    h.blob_len > KVP_META_MAX)
		return kvp__why(w, -EPROTO, KVP_REASON_MALFORMED,
				"producer rank %u: malformed hello", c->rank);
	if (h.tp_size != a->engs[c->eng].n)
		return kvp__why(w, -EPROTO, KVP_REASON_TP_SIZE,
				"producer rank %u: its engine has TP size %u, %u ranks given",
				c->rank, h.tp_size, a->engs[c->eng].n);
	if (h.tp_rank != c->rank)
		return kvp__why(w, -EPROTO, KVP_REASON_RANK,
				"producer rank %u: the address answers as rank %u",
				c->rank, h.tp_rank);
	memcpy(c->hello_p, pdata, KVP_HELLO_LEN);
	if (a->secret) {
		/* The producer must prove the secret too: a stranger would
		 * otherwise serve us bytes of its choosing. */
		kvp__auth_mac(a, 'P', c->hello_c, c->hello_p, mac);
		if (!(h.flags & KVP_HELLO_AUTH) ||
		    !kvp__ct_equal(mac, pdata + KVP_HELLO_LEN, KVP_MAC_LEN))
			return kvp__why(w, -EPERM, KVP_REASON_AUTH,
					"producer rank %u: %s", c->rank,
					h.flags & KVP_HELLO_AUTH ?
						"its proof fails: the secrets differ" :
						"it has no shared secret, we have one");
	}
	c->engine_id = h.engine_id;
	c->peer_blob = h.blob_len;
	/* Both answers' buffers before our AUTH, in their order: GO (or a
	 * refusal), then the producer's blob (or a refusal), which it may
	 * send as soon as it has READ ours. */
	err = kvp__peer_blob_alloc(a, c);
	if (!err)
		err = kvp__post_ctl_recv(a, c);
	if (!err)
		err = kvp__post_recv1(c,
				      kvp__wrid(WK_META_RECV, c->gen, c->idx, 0),
				      c->blob, c->blob_len, c->blob_mr->lkey);
	if (err)
		return err;
	kvp__put32(m, KVP_AUTH_MAGIC);
	kvp__put32(m + 4, 0);
	memset(m + 8, 0, KVP_MAC_LEN);
	if (a->secret)
		kvp__auth_mac(a, 'C', c->hello_c, c->hello_p, m + 8);
	/* Where the producer READs our blob. */
	kvp__put64(m + KVP_AUTH_BLOB_OFF, (uint64_t)(uintptr_t)a->blob);
	kvp__put32(m + KVP_AUTH_BLOB_OFF + 8, a->blob_mr->rkey);
	kvp__put32(m + KVP_AUTH_BLOB_OFF + 12, 0);
	err = kvp__post_ctl_send(a, c, KVP_AUTH_LEN);
	if (err)
		return err;
	kvp__set_state(a, c, CS_HANDSHAKE);
	return 0;
}

/* GO: the producer's receive depth, its credit counter and its lease
 * table. */
static int consumer_credit(kvp_agent *a, struct kvp_conn *c, uint32_t len)
{
	const uint8_t *m = kvp__ctl_rx(a, c);
	uint32_t credits;

	if (len != KVP_GO_LEN || kvp__get32(m) != KVP_GO_MAGIC)
		return -EPROTO;
	credits = kvp__get32(m + 4);
	if (!credits || credits > KVP_CREDIT_MAX)
		return -EPROTO;
	c->credit_max = credits;
	c->ctr_raddr = kvp__get64(m + 8);
	c->ctr_rkey = kvp__get32(m + 16);
	c->loans = (kvp__get32(m + 20) & KVP_GO_LOANS) && !c->q;
	c->lease_raddr = kvp__get64(m + 24);
	c->lease_rkey = kvp__get32(m + 32);
	c->lease_log2 = kvp__get32(m + 36);
	c->lease_inc = kvp__get32(m + 40);
	if (c->lease_log2 > KVP_LEASE_LOG2_MAX || !c->lease_inc ||
	    !c->lease_raddr)
		return -EPROTO;
	kvp__rec_key(a, c);
	return 0;
}

/* A refusal's code, or 0 when m is not a refusal; its reason recorded as
 * the engine's (KVP_REASON_PEER_REFUSED, the producer's in peer_reason).
 * A full producer's retry hint (KVP_REFUSE_HINT_LEN bytes) goes to
 * c->retry_ms. */
static int refusal(kvp_agent *a, struct kvp_conn *c, const uint8_t *m,
		   uint32_t len)
{
	struct kvp_why *w = &a->engs[c->eng].why;
	struct kvp_refusal rf;
	uint32_t r, hint;
	int err;

	if (kvp__refusal_get(m, len, &rf))
		return 0;
	err = kvp__refusal_errno(rf.err);
	r = rf.reason;
	hint = rf.retry_ms;
	if (r == KVP_REASON_VERSION) {
		/* The refuser's versions (0 when its reject was padded). */
		if (!w->reason)
			kvp__why_version(w, "producer", c->rank, rf.version,
					 rf.lib);
		return -EPROTONOSUPPORT;
	}
	if (r == KVP_REASON_PEER_FULL && (err == -EBUSY || err == -EUSERS) &&
	    hint)
		c->retry_ms = hint < KVP_RETRY_MIN_MS ? KVP_RETRY_MIN_MS :
			      hint < KVP_RETRY_MAX_MS ? hint :
							KVP_RETRY_MAX_MS;
	if (!w->reason) {
		kvp__why(w, err, KVP_REASON_PEER_REFUSED,
			 "producer rank %u refused us: %s", c->rank,
			 r ? kvp_reason_str(r) : kvp_strerror(err));
		w->peer_reason = r;
	}
	return err;
}

struct qp_on {
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
};

static int create_qp(void *arg, struct ibv_qp_init_attr *qa)
{
	const struct qp_on *on = arg;

	return kvp__create_qp(on->id, on->pd, qa);
}

static int consumer_route(kvp_agent *a, struct kvp_conn *c)
{
	uint8_t req[KVP_HELLO_REQ_LEN];
	struct rdma_conn_param param;
	struct ibv_qp_init_attr qa;
	struct qp_on on = { c->id, a->pd };
	struct kvp_hello h;
	uint32_t asked;
	int err;

	memset(&qa, 0, sizeof(qa));
	qa.send_cq = kvp__cq_of(a, c);
	qa.recv_cq = qa.send_cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = a->sq_depth;
	qa.cap.max_recv_wr = 3; /* control, blob, drain marker */
	qa.cap.max_send_sge = a->max_sge;
	qa.cap.max_recv_sge = 1;
	/* Notifications inline: no DMA read of the note on the request's
	 * critical path. A provider that cannot inline them, or has fewer
	 * WQE blocks than sq_depth WQEs of max_sge SGEs take, still gets a
	 * QP: without inline data, then with a shorter send queue. */
	qa.cap.max_inline_data = KVP_NOTE_LEN;
	err = kvp__create_qp_fit(create_qp, &on, &qa, &asked);
	if (err)
		return err;
	c->qp = c->id->qp;
	/* A peer on our own port: the READs never leave the device, so the
	 * default READ window (which keeps a path's bursts short) only
	 * costs posting rounds there (docs/read-window.md). */
	c->loop = a->rd_win_default && c->id->route.num_paths > 0 &&
		  c->id->route.path_rec &&
		  !memcmp(&c->id->route.path_rec->sgid,
			  &c->id->route.path_rec->dgid,
			  sizeof(c->id->route.path_rec->dgid));
	/* What the provider really gave (it may count WQE blocks). */
	if (qa.cap.max_send_sge < a->max_sge)
		return -ENOMEM;
	c->sq_cap = kvp__sq_usable(asked, &qa.cap) - 1;
	c->inline_notes = qa.cap.max_inline_data >= KVP_NOTE_LEN;
	kvp__hello_fill(a, KVP_ROLE_CONSUMER, &h);
	h.flags |= c->q << KVP_HELLO_QI_SHIFT;
	/* The nonce: our clock, then 8 random bytes (the producer's own
	 * nonce keeps the proofs fresh; the clock bounds a replayed
	 * connect request). */
	kvp__put64(h.nonce, kvp__wall_s());
	err = kvp__random(h.nonce + 8, sizeof(h.nonce) - 8);
	if (err)
		return err;
	kvp__hello_put(c->hello_c, &h);
	memcpy(req, c->hello_c, KVP_HELLO_LEN);
	if (a->secret)
		kvp__hello_tag(a, c->hello_c, req + KVP_HELLO_LEN);
	memset(&param, 0, sizeof(param));
	param.private_data = req;
	param.private_data_len = a->secret ? KVP_HELLO_REQ_LEN : KVP_HELLO_LEN;
	/* READs in flight per QP: as many as the device allows. */
	param.initiator_depth = (uint8_t)a->lim.rd_atom;
	/* The producer's liveness probe: one zero-length READ at a time. */
	param.responder_resources = 1;
	param.retry_count = 7;
	/* Notifications only go into posted buffers (credits): RNR is a
	 * producer's fault, and is not waited out for ever. */
	param.rnr_retry_count = KVP_RNR_RETRY;
	err = kvp__connect(c->id, &param);
	if (err)
		return err;
	kvp__set_state(a, c, CS_CONNECTING);
	return 0;
}

void kvp__consumer_event(kvp_agent *a, struct kvp_conn *c,
			 enum rdma_cm_event_type type, const uint8_t *pdata,
			 uint32_t plen)
{
	int err = 0;

	switch (type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (c->state != CS_ADDR)
			return;
		if (c->id->verbs != a->ctx) {
			err = -ENETUNREACH; /* routed through another device */
			break;
		}
		(void)kvp__set_ack_timeout(c->id, KVP_ACK_TIMEOUT);
		err = a->tos ? kvp__set_tos(c->id, (uint8_t)(a->tos - 1)) : 0;
		if (!err)
			err = kvp__resolve_route(c->id, RESOLVE_MS);
		if (!err)
			kvp__set_state(a, c, CS_ROUTE);
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (c->state != CS_ROUTE)
			return;
		err = consumer_route(a, c);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->state != CS_CONNECTING)
			return;
		err = consumer_established(a, c, pdata, plen);
		break;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return;
	case RDMA_CM_EVENT_REJECTED:
		/* The producer's reason, if it gave one. The transport pads
		 * private data (IB CM: to 148 bytes in a reject). */
		err = refusal(a, c, pdata,
			      plen < KVP_REFUSE_VER_LEN ? plen :
							  KVP_REFUSE_VER_LEN);
		if (!err)
			err = -ECONNREFUSED;
		break;
	case RDMA_CM_EVENT_DISCONNECTED:
		/* A producer disconnects once its refusal (or its BYE) is
		 * delivered: the agent took that completion from the CQ
		 * before this event, so that its reason wins. */
		err = kvp__cm_errno(type);
		if (c->bye)
			kvp__why(&a->engs[c->eng].why, err, KVP_REASON_CLOSED,
				 "producer rank %u closed its agent", c->rank);
		break;
	default:
		err = kvp__cm_errno(type);
		break;
	}
	if (err)
		kvp__conn_fail(a, c, err);
}

/* The producer's answer to our blob: its own blob, or a refusal. */
static int consumer_meta(kvp_agent *a, struct kvp_conn *c, uint32_t len)
{
	int err;

	err = refusal(a, c, c->blob, len);
	if (err)
		return err;
	err = kvp_meta_decode(c->blob, len, &c->peer);
	if (err == -ENOMEM)
		return err;
	if (err)
		return kvp__why(&a->engs[c->eng].why, -EPROTO,
				KVP_REASON_MALFORMED,
				"producer rank %u: its blob: %s", c->rank,
				kvp_strerror(err));
	c->blob_got = len;
	return 0;
}

void kvp__consumer_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	const uint8_t *m;
	int err = 0;

	switch (WRID_KIND(wc->wr_id)) {
	case WK_CTL_RECV:
		if (c->state == CS_READY) {
			/* The one control message after the handshake. */
			m = kvp__ctl_rx(a, c);
			if (wc->status == IBV_WC_SUCCESS &&
			    wc->byte_len == KVP_BYE_LEN &&
			    kvp__get32(m) == KVP_BYE_MAGIC)
				c->bye = 1;
			return;
		}
		if (c->state != CS_HANDSHAKE || c->credit_max)
			return;
		m = kvp__ctl_rx(a, c);
		err = refusal(a, c, m, wc->byte_len);
		if (!err)
			err = consumer_credit(a, c, wc->byte_len);
		break;
	case WK_META_RECV:
		err = consumer_meta(a, c, wc->byte_len);
		break;
	default:
		return;
	}
	if (err) {
		kvp__conn_fail(a, c, err);
		return;
	}
	if (c->state == CS_HANDSHAKE && c->credit_max && c->blob_got) {
		kvp__set_state(a, c, CS_READY);
		/* For the producer's BYE when it closes; without one, its
		 * close reads as a reset. */
		(void)kvp__post_ctl_recv(a, c);
	}
}

int kvp__conn_start(kvp_agent *a, struct kvp_conn *c, struct kvp_eng *e,
		    uint32_t rank, const struct kvp_peer_addr *p)
{
	struct sockaddr_storage dst, src;
	uint64_t now = kvp__now_ns();
	int err, ms;

	err = kvp__parse_addr(p->ip, p->port, &dst);
	if (err)
		return err;
	if (a->src_addr) {
		err = kvp__parse_addr(a->src_addr, 0, &src);
		if (err)
			return err;
	}
	err = kvp__slot_prepare(a, c);
	if (err)
		return err;
	c->rank = rank;
	c->eng = (uint32_t)(e - a->engs);
	err = kvp__create_id(a->ech, c, &c->id);
	if (err)
		return err;
	kvp__set_state(a, c, CS_ADDR);
	ms = e->deadline > now ? (int)((e->deadline - now) / 1000000ull) : 1;
	err = kvp__resolve_addr(c->id,
				a->src_addr ? (struct sockaddr *)&src : NULL,
				(struct sockaddr *)&dst,
				ms < 1 ? 1 : ms < RESOLVE_MS ? ms : RESOLVE_MS);
	if (err) {
		kvp__destroy_id(c->id);
		c->id = NULL;
		kvp__set_state(a, c, CS_FREE);
		return err;
	}
	a->ncons_free--;
	e->nconn++;
	return 0;
}
