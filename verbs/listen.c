// SPDX-License-Identifier: MIT
/*
 * The producer's handshake: listen, the checks on a connect request, the
 * shared-secret proofs, the consumer's blob, refusals. Who gets a slot is
 * admit.c's; the messages of the shared receive queue are inbox.c's. See
 * conn.c for the handshake as a whole.
 *
 * What a consumer can make a producer spend before proving the secret (or,
 * without one, before its AUTH arrives): a connection slot among
 * max_per_source for its address and max_half_open handshaking at once, a
 * QP, and the slot's fixed control buffers; for at most the handshake
 * bound. The blob buffer (its length checked against KVP_META_MIN_LEN and
 * the cap set at listen) and the notification buffers come after.
 */
#include <stdlib.h>
#include <string.h>

#include "hmac.h"
#include "internal.h"

#define REFUSE_OFF 32 /* in the control send buffer, after GO */

int kvp_agent_listen(kvp_agent *a, const char *ip, uint16_t port)
{
	struct sockaddr_storage ss;
	uint64_t cap;
	int err;

	if (!a || !a->producer)
		return -EINVAL;
	if (a->listening)
		return -EBUSY;
	if (!kvp__regions_ready(a))
		return -ENXIO;
	err = kvp__parse_addr(ip, port, &ss);
	if (err)
		return err;
	err = kvp__blob_make(a);
	if (err)
		return err;
	cap = (uint64_t)a->blob_len * KVP_PEER_BLOB_SLACK;
	if (cap < KVP_PEER_BLOB_FLOOR)
		cap = KVP_PEER_BLOB_FLOOR;
	a->peer_blob_cap = cap > KVP_META_MAX ? KVP_META_MAX : (uint32_t)cap;
	err = kvp__create_id(a->ech, NULL, &a->listen_id);
	if (err)
		return err;
	err = a->tos ? kvp__set_tos(a->listen_id, (uint8_t)(a->tos - 1)) : 0;
	if (!err)
		err = kvp__bind_addr(a->listen_id, (struct sockaddr *)&ss);
	if (err)
		goto err_id;
	err = -EINVAL;
	if (a->listen_id->verbs && a->listen_id->verbs != a->ctx)
		goto err_id;
	err = kvp__listen(a->listen_id, (int)a->nprod);
	if (err)
		goto err_id;
	a->listening = 1;
	return 0;

err_id:
	kvp__destroy_id(a->listen_id);
	a->listen_id = NULL;
	return err;
}

static int accept_one(kvp_agent *a, struct rdma_cm_id *id,
		      const uint8_t *pdata, uint32_t plen, uint8_t rr,
		      uint64_t since);

int kvp__accept_waiting(kvp_agent *a, uint64_t now)
{
	struct kvp_wait w;

	if (!kvp__wait_take(a, now, &w))
		return 0;
	return accept_one(a, w.id, w.pdata, w.plen, w.rr, w.since);
}

int kvp__accept_conn(kvp_agent *a, struct rdma_cm_id *id,
		     const uint8_t *pdata, uint32_t plen, uint8_t rr)
{
	return accept_one(a, id, pdata, plen, rr, 0);
}

/* With a secret: the connect request proves it (KVP_HELLO_TAG_LEN after
 * the hello), and its clock is within KVP_HELLO_SKEW_S of ours. */
static int hello_proved(const kvp_agent *a, const uint8_t *pdata,
			uint32_t plen, const struct kvp_hello *h)
{
	uint8_t tag[KVP_HELLO_TAG_LEN];
	uint64_t t = kvp__get64(h->nonce), now = kvp__wall_s();

	if (plen < KVP_HELLO_REQ_LEN)
		return 0;
	kvp__hello_tag(a, pdata, tag);
	if (!kvp__ct_equal(tag, pdata + KVP_HELLO_LEN, KVP_HELLO_TAG_LEN))
		return 0;
	return t <= now + KVP_HELLO_SKEW_S && now <= t + KVP_HELLO_SKEW_S;
}

/* since: when a request taken from the waiting ones arrived (0: a new
 * one). */
static int accept_one(kvp_agent *a, struct rdma_cm_id *id,
		      const uint8_t *pdata, uint32_t plen, uint8_t rr,
		      uint64_t since)
{
	const int queued = since != 0;
	uint8_t pd[KVP_HELLO_ACCEPT_LEN], src[16];
	struct rdma_conn_param param;
	struct ibv_qp_init_attr qa;
	struct kvp_hello h, mine;
	struct kvp_conn *c, *hd;
	uint32_t retry_ms, nq, qi;
	int err, full;

	/* Everything in the hello is checked before anything is set up;
	 * another version's hello only for its version. */
	err = kvp__hello_get(pdata, plen, &h);
	if (err == -EPROTONOSUPPORT) {
		kvp__reject_req(a, id, err, KVP_REASON_VERSION, 0);
		return 0;
	}
	if (err || h.role != KVP_ROLE_CONSUMER ||
	    id->verbs != a->ctx || h.tp_size > KVP_MAX_TP_SIZE ||
	    h.blob_len < KVP_META_MIN_LEN || h.blob_len > a->peer_blob_cap ||
	    kvp__peer_addr(id, src)) {
		kvp__reject_req(a, id, -EPROTO, KVP_REASON_MALFORMED, 0);
		return 0;
	}
	if (!a->secret != !(h.flags & KVP_HELLO_AUTH) ||
	    (a->secret && !hello_proved(a, pdata, plen, &h))) {
		kvp__reject_req(a, id, -EPERM, KVP_REASON_AUTH, 0);
		return 0;
	}
	/* Refused while too many DISCONNECTED events wait to be polled:
	 * that bounds the event queue. */
	if (kvp__ev_room(a) <= (int)(a->max_inflight + a->nprod)) {
		kvp__reject_req(a, id, -EBUSY, KVP_REASON_PEER_FULL,
		       KVP_RETRY_HALF_MS);
		return 0;
	}
	/* Others wait for a handshake slot: after them. */
	if (!queued && a->wq_n) {
		if (!kvp__wait_push(a, id, src, pdata, plen, rr, kvp__now_ns(), 0))
			return 0;
		kvp__reject_req(a, id, -EBUSY, KVP_REASON_PEER_FULL, KVP_RETRY_FULL_MS);
		return 0;
	}
	nq = (h.flags & KVP_HELLO_QPS_MASK) >> KVP_HELLO_QPS_SHIFT;
	nq = nq < 1 ? 1 : nq > KVP_MAX_QPS ? KVP_MAX_QPS : nq;
	qi = (h.flags & KVP_HELLO_QI_MASK) >> KVP_HELLO_QI_SHIFT;
	if (qi >= nq) {
		kvp__reject_req(a, id, -EPROTO, KVP_REASON_MALFORMED, 0);
		return 0;
	}
	c = kvp__slot_for(a, src, h.engine_id, h.tp_rank, nq, qi, &hd, &err,
		     &retry_ms, &full);
	/* Handshakes under way fill max_half_open: wait for one to end
	 * (rdma_cm told the consumer to expect a late answer). */
	if (!c && err == -EBUSY && !full && !queued &&
	    !kvp__wait_push(a, id, src, pdata, plen, rr, kvp__now_ns(), 0))
		return 0;
	if (!c) {
		/* No room: an idle rank makes some, the newcomer comes back
		 * as soon as it drains. */
		if (full && kvp__evict_idle(a, full == 1 ? src : NULL)) {
			err = -EBUSY;
			retry_ms = KVP_RETRY_HALF_MS;
		}
		kvp__reject_req(a, id, err, KVP_REASON_PEER_FULL, retry_ms);
		return 0;
	}
	/* A slot's first setup (its CQ if new, then its MRs), and a QP's
	 * creation with its accept, are costly steps (agent.c,
	 * COSTLY_BUDGET): past the poll's, or after a setup step, the request
	 * waits for the next poll, first in line. */
	if (!a->costly_left || !c->prepared) {
		if (a->costly_left) {
			/* A CQ the slot's run lacks is a step of its own. */
			const uint32_t k = kvp__cq_idx(a, c);

			a->costly_left--;
			if (a->cqs[k] ? kvp__slot_prepare(a, c) :
					kvp__cq_make(a, k)) {
				kvp__reject_req(a, id, -EBUSY, KVP_REASON_PEER_FULL,
				       KVP_RETRY_FULL_MS);
				return 0;
			}
		}
		if (!kvp__wait_push(a, id, src, pdata, plen, rr,
			       queued ? since : kvp__now_ns(), queued))
			return 0;
		kvp__reject_req(a, id, -EBUSY, KVP_REASON_PEER_FULL, KVP_RETRY_FULL_MS);
		return 0;
	}
	a->costly_left--;
	c->id = id;
	c->rank_head = !hd;
	if (!hd) {
		/* The rank's first: slots held for the rest. */
		c->resv = nq - 1;
		a->nreserved += nq - 1;
	} else if (hd->resv) {
		hd->resv--;
		a->nreserved--;
	}
	a->ctr[c->idx] = 0;
	c->rank = h.tp_rank;
	c->engine_id = h.engine_id;
	c->peer_tp = h.tp_size;
	c->peer_blob = h.blob_len;
	/* Notification buffers where notifications come: the rank's first
	 * queue pair; one on the others, for their BYE. With the shared
	 * receive queue, GO's credits are lent then (srq.c). */
	c->q = qi;
	c->credits = a->srq ? 0 : qi ? 1 : a->rq_depth;
	memcpy(c->src, src, sizeof(c->src));
	memcpy(c->hello_c, pdata, KVP_HELLO_LEN);
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = kvp__cq_of(a, c);
	qa.recv_cq = qa.send_cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = PROD_SQ;
	qa.cap.max_recv_wr = c->credits + 2; /* control, drain marker */
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	if (a->srq) {
		qa.srq = a->srq;
		qa.cap.max_recv_wr = 0;
		qa.cap.max_recv_sge = 0;
	}
	kvp__set_state(a, c, CS_CONNECTING); /* counted as half-open from here */
	if (kvp__create_qp(id, a->pd, &qa))
		goto err_conn;
	c->qp = id->qp;
	id->context = c;
	if (a->srq)
		kvp__qpn_add(a, c);
	else if (kvp__post_ctl_recv(a, c))
		goto err_conn;
	kvp__hello_fill(a, KVP_ROLE_PRODUCER, &mine);
	if (kvp__random(mine.nonce, sizeof(mine.nonce)))
		goto err_conn;
	kvp__hello_put(c->hello_p, &mine);
	memcpy(pd, c->hello_p, KVP_HELLO_LEN);
	memset(pd + KVP_HELLO_LEN, 0, KVP_MAC_LEN);
	if (a->secret)
		kvp__auth_mac(a, 'P', c->hello_c, c->hello_p,
			      pd + KVP_HELLO_LEN);
	memset(&param, 0, sizeof(param));
	param.private_data = pd;
	param.private_data_len = sizeof(pd);
	/* The event's values are from our side's point of view already:
	 * responder_resources is what the consumer wants to read at once. */
	param.responder_resources = rr;
	if (param.responder_resources > a->lim.resp_res)
		param.responder_resources = (uint8_t)a->lim.resp_res;
	param.initiator_depth = 1; /* its blob's READ, later the probe */
	param.retry_count = 7;
	/* Our sends are the handshake's, into posted buffers: an RNR would
	 * be a consumer's fault, and is not waited out for long. */
	param.rnr_retry_count = KVP_RNR_RETRY;
	(void)kvp__set_ack_timeout(id, KVP_ACK_TIMEOUT);
	if (kvp__accept(id, &param))
		goto err_conn;
	c->drain_deadline = kvp__now_ns() + a->handshake_ns;
	return 1;

err_conn:
	/* kvp__conn_release() destroys the id with the rest. */
	(void)kvp__reject(id, NULL, 0);
	a->st.refused++;
	kvp__obs_refused(a, NULL, c, -EBUSY, KVP_REASON_PEER_FULL, 0);
	kvp__conn_release(a, c);
	return 1;
}

/* Answers a consumer it will not serve with a refusal instead of its blob
 * (or of GO), so that the consumer learns why rather than seeing a bare
 * disconnect; the connection goes once the refusal is delivered, or at the
 * handshake bound. */
static void refuse(kvp_agent *a, struct kvp_conn *c, int err)
{
	uint8_t *m = kvp__ctl_tx(a, c) + REFUSE_OFF;
	struct kvp_why w = { 0 };

	/* A check that gave no reason: the errno's (EPERM: the proof). */
	if (!c->reason) {
		kvp__why_errno(&w, err);
		c->reason = w.reason;
	}
	kvp__put32(m, KVP_REFUSE_MAGIC);
	kvp__put32(m + 4, (uint32_t)err);
	kvp__put32(m + 8, c->reason);
	c->status = err;
	c->refused = 1;
	kvp__set_state(a, c, CS_HANDSHAKE);
	a->st.refused++;
	kvp__obs_refused(a, NULL, c, err, c->reason, 0);
	if (kvp__post_send1(c, kvp__wrid(WK_CTL_SEND, c->gen, c->idx, 0), m,
			    KVP_REFUSE_LEN, a->ctl_mr->lkey))
		kvp__conn_fail(a, c, err);
}

/* The slot's notification buffers: registered with its first handshake
 * that needs them, kept for the next peers (a registration each handshake
 * would cost two syscalls and page pinning); grown when a rank's first
 * queue pair takes a slot that held another's. */
static int notes_alloc(kvp_agent *a, struct kvp_conn *c)
{
	const uint32_t n = c->credits;

	if (c->notes_n >= n)
		return 0;
	kvp__dereg_mr(c->notes_mr);
	free(c->notes);
	c->notes_mr = NULL;
	c->notes_n = 0;
	c->notes = calloc(n, KVP_NOTE_LEN);
	if (!c->notes ||
	    kvp__reg_mr(a->pd, c->notes, (size_t)n * KVP_NOTE_LEN,
			IBV_ACCESS_LOCAL_WRITE, &c->notes_mr)) {
		free(c->notes);
		c->notes = NULL;
		return -ENOMEM;
	}
	c->notes_n = n;
	return 0;
}

/* The consumer's AUTH arrived (inside the completion drain): with a
 * secret, its MAC must prove it; then it waits for a costly step
 * (kvp__auth_step()), which registers and READs. */
static int producer_auth(kvp_agent *a, struct kvp_conn *c, uint32_t len)
{
	const uint8_t *m = kvp__ctl_rx(a, c);
	uint8_t mac[KVP_MAC_LEN];
	int ok = 1;

	if (len != KVP_AUTH_LEN || kvp__get32(m) != KVP_AUTH_MAGIC ||
	    kvp__get32(m + 4) || kvp__get32(m + KVP_AUTH_BLOB_OFF + 12))
		return -EPROTO;
	if (a->secret) {
		kvp__auth_mac(a, 'C', c->hello_c, c->hello_p, mac);
		ok = kvp__ct_equal(mac, m + 8, KVP_MAC_LEN);
	}
	if (!ok)
		return -EPERM;
	if (!c->auth_wait) {
		c->auth_addr = kvp__get64(m + KVP_AUTH_BLOB_OFF);
		c->auth_rkey = kvp__get32(m + KVP_AUTH_BLOB_OFF + 8);
		c->auth_wait = 1;
		a->nauth_wait++;
	}
	return 0;
}

/* A proved AUTH's costly step: the buffers for its blob and its
 * notifications are set up, its blob READ, and GO sent. */
static int auth_finish(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i;

	if (kvp__peer_blob_alloc(a, c) || (!a->srq && notes_alloc(a, c)))
		return -EBUSY;
	/* The consumer's blob, where its AUTH says: a READ of the length
	 * its hello announced (checked against our cap at the connect
	 * request). An address or key that does not hold it fails the READ,
	 * and with it the connection. */
	if (kvp__post_read1(c, kvp__wrid(WK_META_RECV, c->gen, c->idx, 0),
			    c->blob, c->blob_len, c->blob_mr->lkey,
			    c->auth_addr, c->auth_rkey))
		return -EBUSY;
	if (a->srq)
		c->credits = kvp__srq_credits(a, c, c->q);
	for (i = 0; !a->srq && i < c->credits; i++)
		if (kvp__post_note_recv(a, c, i))
			return -EBUSY;
	/* Credit: the buffers just posted; the counter of those re-posted
	 * since is this slot's, for the consumer to READ. */
	kvp__put32(kvp__ctl_tx(a, c), KVP_GO_MAGIC);
	kvp__put32(kvp__ctl_tx(a, c) + 4, c->credits);
	kvp__put64(kvp__ctl_tx(a, c) + 8,
		   (uint64_t)(uintptr_t)&a->ctr[c->idx]);
	kvp__put32(kvp__ctl_tx(a, c) + 16, a->ctr_mr[c->idx]->rkey);
	kvp__put32(kvp__ctl_tx(a, c) + 20, a->srq ? KVP_GO_LOANS : 0);
	/* Where the requests we hold have their leases (lease.h). */
	kvp__put64(kvp__ctl_tx(a, c) + 24, (uint64_t)(uintptr_t)a->lease);
	kvp__put32(kvp__ctl_tx(a, c) + 32, a->lease_mr->rkey);
	kvp__put32(kvp__ctl_tx(a, c) + 36, a->lease_log2);
	kvp__put32(kvp__ctl_tx(a, c) + 40, a->lease_inc);
	kvp__put32(kvp__ctl_tx(a, c) + 44, 0);
	kvp__rec_key(a, c);
	if (kvp__post_ctl_send(a, c, KVP_GO_LEN))
		return -EBUSY;
	kvp__set_state(a, c, CS_HANDSHAKE);
	return 0;
}

/* The consumer's blob: decoded and checked against its hello, and against
 * the other ranks of its engine; its notification count computed. */
static int producer_meta(kvp_agent *a, struct kvp_conn *c)
{
	struct kvp_layout_info pi;
	int n, err;

	err = kvp_meta_decode(c->blob, c->blob_got, &c->peer);
	/* Decoded or not, its bytes are done with: nothing of a consumer's
	 * blob stays with its connection but what the checks below keep. */
	kvp__peer_blob_free(c);
	if (err) {
		c->reason = err == -ENOMEM ? KVP_REASON_PEER_FULL :
					     KVP_REASON_MALFORMED;
		return err == -ENOMEM ? -EBUSY : -EPROTO;
	}
	kvp_layout_get_info(c->peer, &pi);
	c->reason = pi.engine_id != c->engine_id ? KVP_REASON_ENGINE_ID :
		    pi.tp_rank != c->rank	     ? KVP_REASON_RANK :
		    pi.tp_size != c->peer_tp	     ? KVP_REASON_TP_SIZE :
		    kvp_layout_compat_hash(c->peer) !=
				    kvp_layout_compat_hash(a->layout) ?
						     KVP_REASON_MODEL :
						     KVP_REASON_NONE;
	if (c->reason)
		return -EPROTO;
	/* No plan compiled for a peer's blob: its field-level checks and
	 * its ranks' sources, linear in its size (a costly layout is the
	 * consumer's own to refuse, when it compiles its plan). */
	n = kvp__notify_count(a->layout, c->peer, a->li.tp_rank, NULL, 0);
	if (n <= 0) {
		c->reason = n == -ENOMEM ? KVP_REASON_PEER_FULL :
					   KVP_REASON_LAYOUT;
		return n == -ENOMEM ? -EBUSY : -EPROTO;
	}
	c->expected = (uint32_t)n;
	kvp_layout_destroy(c->peer);
	c->peer = NULL;
	err = kvp__engine_join(a, c);
	if (err)
		return err;
	err = kvp__post_send1(c, kvp__wrid(WK_META_SEND, c->gen, c->idx, 0),
			      a->blob, (uint32_t)a->blob_len,
			      a->blob_mr->lkey);
	if (err)
		return -EBUSY;
	kvp__set_state(a, c, CS_READY);
	c->last_used = kvp__now_ns();
	/* From its accept: the handshake's bound was set then. */
	kvp__hist_add(&a->obs.handshake[OBS_HS_PRODUCER],
		      c->last_used + a->handshake_ns - c->drain_deadline);
	c->probe_at = c->last_used + KVP_PROBE_NS;
	/* Its idle bound; the others' come earlier or at the same time. */
	if (a->idle_ns != UINT64_MAX && a->idle_at == UINT64_MAX)
		a->idle_at = c->last_used + a->idle_ns;
	a->st.connects += c->rank_head; /* ranks, as disconnects */
	return 0;
}

void kvp__auth_step(kvp_agent *a)
{
	uint32_t i;
	int err;

	for (i = 0; i < a->prod_hw && a->nauth_wait && a->costly_left; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (!c->auth_wait)
			continue;
		c->auth_wait = 0;
		a->nauth_wait--;
		if (c->refused || c->state != CS_CONNECTING)
			continue; /* failed meanwhile */
		a->costly_left--;
		err = auth_finish(a, c);
		if (err)
			refuse(a, c, err);
	}
}

void kvp__auth_in(kvp_agent *a, struct kvp_conn *c, const uint8_t *m,
		  uint32_t len)
{
	int err;

	memcpy(kvp__ctl_rx(a, c), m, len);
	err = producer_auth(a, c, len);
	if (err)
		refuse(a, c, err);
}

void kvp__blob_check_one(kvp_agent *a)
{
	uint32_t i, k;
	int err;

	for (k = 0; k < a->prod_hw; k++) {
		i = (a->next_pending + k) % a->prod_hw;
		if (a->conns[i].blob_pending)
			break;
	}
	if (k == a->prod_hw) {
		a->npending = 0; /* unreachable */
		return;
	}
	a->next_pending = (i + 1) % a->prod_hw;
	a->conns[i].blob_pending = 0;
	a->npending--;
	/* A connection that failed (draining, or drained and awaiting its
	 * release) while its blob waited: nothing to check, and nothing
	 * may bring it back to ready. */
	if (a->conns[i].state != CS_HANDSHAKE || a->conns[i].refused)
		return;
	err = producer_meta(a, &a->conns[i]);
	if (err)
		refuse(a, &a->conns[i], err);
}

void kvp__producer_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	int err;

	switch (WRID_KIND(wc->wr_id)) {
	case WK_CTL_SEND:
	case WK_META_SEND:
		/* A delivered refusal: the consumer has read it. */
		if (c->refused)
			kvp__conn_fail(a, c, c->status);
		return;
	case WK_CTL_RECV:
		if (c->refused || c->state != CS_CONNECTING)
			return;
		err = producer_auth(a, c, wc->byte_len);
		if (err)
			refuse(a, c, err);
		return;
	case WK_META_RECV:
		/* Our READ of its blob: all of it is in. */
		if (c->refused || c->state != CS_HANDSHAKE || c->blob_pending)
			return;
		c->blob_got = c->blob_len;
		c->blob_pending = 1;
		a->npending++;
		return;
	default:
		return;
	}
}

void kvp__producer_event(kvp_agent *a, struct kvp_conn *c,
			 enum rdma_cm_event_type type)
{
	switch (type) {
	case RDMA_CM_EVENT_ESTABLISHED:
		/* A sender that finds no receive buffer (only a consumer that
		 * ignores its credit can) retries after 1.28 ms, not 655:
		 * with 6 retries, it fails in ms rather than seconds. */
		if (c->qp && kvp__set_min_rnr_timer(c->qp, KVP_MIN_RNR_TIMER))
			a->st.rnr_timer_unset++;
		return;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return;
	default:
		/* DISCONNECTED among them: the agent took the completions
		 * first, a consumer's BYE with them. */
		kvp__conn_fail(a, c, kvp__cm_errno(type));
		return;
	}
}

int kvp__bye_producer(kvp_agent *a, struct kvp_conn *c)
{
	uint8_t *m = kvp__ctl_tx(a, c);

	if (c->state != CS_READY)
		return 0;
	kvp__put32(m, KVP_BYE_MAGIC);
	kvp__put32(m + 4, 0);
	if (kvp__post_send1(c, kvp__wrid(WK_BYE, c->gen, c->idx, 0), m,
			    KVP_BYE_LEN, a->ctl_mr->lkey))
		return 0;
	c->bye_sent = 1;
	return 1;
}

/* ---- the producer side's connection callbacks ---------------------------- */

/* Whether c is the last connection of its consumer rank to be reported
 * gone: a rank has several queue pairs (kvp_agent_attr.qps), its
 * DISCONNECTED event is one. */
static int last_of_rank(const kvp_agent *a, const struct kvp_conn *c)
{
	uint32_t i;

	for (i = 0; i < a->prod_hw; i++) {
		const struct kvp_conn *o = &a->conns[i];

		if (o != c && o->state == CS_READY &&
		    o->engine_id == c->engine_id && o->rank == c->rank)
			return 0;
	}
	return 1;
}

/* Only consumer ranks that were connected are reported: a stranger's
 * failed handshakes are counted (stats.refused), never queued as
 * events. */
static void producer_failed(kvp_agent *a, struct kvp_conn *c, int was_ready)
{
	if (was_ready)
		kvp__conn_report(a, c, last_of_rank(a, c), NULL, 0);
}

static void producer_drained(kvp_agent *a, struct kvp_conn *c)
{
	kvp__follow_conn_gone(a, c);
	kvp__engine_leave(a, c);
	kvp__conn_release(a, c);
}

const struct kvp_conn_ops kvp__producer_ops = {
	.failed = producer_failed,
	.drained = producer_drained,
};
