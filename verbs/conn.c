// SPDX-License-Identifier: MIT
/*
 * Connections: listen and accept (producer), connect (consumer), the
 * metadata handshake, failure, draining and teardown.
 *
 * Handshake on one RC QP, after rdma_cm's own exchange of private data
 * (struct kvp_hello: role, engine, TP rank, blob length):
 *   producer: CONNECT_REQUEST -> QP, RECV(consumer blob), RECVs(notes), accept
 *   consumer: ESTABLISHED -> RECV(producer blob), SEND(consumer blob)
 *   producer: RECV done -> check, kvp_notify_expected(), SEND(producer blob)
 *   consumer: RECV done -> ready
 * Each side posts its RECV before anything can be sent to it, so no RNR
 * wait is ever part of the handshake. The blobs exceed what rdma_cm's
 * private data can carry, hence the SEND/RECV.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

#define ACK_TIMEOUT 17		       /* 4.096 us * 2^17 = 0.54 s */
#define DRAIN_NS 2000000000ull	       /* bound on waiting for flushes */
#define HANDSHAKE_NS 30000000000ull    /* producer: bound on a handshake */
#define RESOLVE_MS 5000
#define PROD_SQ 4

static void hello_fill(const kvp_agent *a, struct kvp_hello *h)
{
	memset(h, 0, sizeof(*h));
	h->version = KVP_HELLO_VERSION;
	h->role = (uint16_t)a->role;
	h->tp_size = a->li.tp_size;
	h->tp_rank = a->li.tp_rank;
	h->blob_len = (uint32_t)a->blob_len;
	h->engine_id = a->li.engine_id;
}

static int regions_ready(const kvp_agent *a)
{
	uint32_t i;

	for (i = 0; i < a->li.nregions; i++)
		if (!a->mrs[i])
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
	for (i = 0; a->role == KVP_ROLE_PRODUCER && i < a->li.nregions; i++) {
		err = kvp_layout_set_region_key(l, i, a->lbase[i],
						a->mrs[i]->rkey);
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
	if (!regions_ready(a))
		return -ENXIO;
	return meta_encode(a, buf, cap, len);
}

/* Encodes our blob into a registered buffer for the handshake's SEND. */
static int blob_make(kvp_agent *a)
{
	size_t len = 0;
	int err;

	err = meta_encode(a, NULL, 0, &len);
	if (err != -ENOSPC)
		return err ? err : -EPROTO;
	a->blob = malloc(len);
	if (!a->blob)
		return -ENOMEM;
	err = meta_encode(a, a->blob, len, &a->blob_len);
	if (err)
		goto err_blob;
	/* Only ever the source of a SEND: local read access suffices. */
	err = kvp__reg_mr(a->pd, a->blob, a->blob_len, 0, &a->blob_mr);
	if (err)
		goto err_blob;
	return 0;

err_blob:
	free(a->blob);
	a->blob = NULL;
	a->blob_len = 0;
	return err;
}

static void blob_free(kvp_agent *a)
{
	kvp__dereg_mr(a->blob_mr);
	free(a->blob);
	a->blob_mr = NULL;
	a->blob = NULL;
	a->blob_len = 0;
}

static int cq_make(kvp_agent *a, uint64_t want)
{
	if (want > (uint64_t)a->dattr.max_cqe)
		want = (uint64_t)a->dattr.max_cqe;
	a->cq_size = (uint32_t)want;
	return kvp__create_cq(a->ctx, (int)want, a->cch, &a->cq);
}

static struct kvp_conn *conns_alloc(uint32_t n)
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

static int post_send1(struct kvp_conn *c, uint64_t wr_id, void *buf,
		      uint32_t len, uint32_t lkey)
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
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return kvp__post_send(c->qp, &wr, &bad);
}

static int post_recv1(struct kvp_conn *c, uint64_t wr_id, void *buf,
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
	return post_recv1(c, kvp__wrid(WK_NOTE_RECV, c->gen, c->idx, i),
			  c->notes + (size_t)i * KVP_NOTE_LEN, KVP_NOTE_LEN,
			  c->notes_mr->lkey);
}

/* A buffer for the peer's blob, registered for our RECV. */
static int peer_blob_alloc(kvp_agent *a, struct kvp_conn *c, uint32_t len)
{
	int err;

	c->blob = malloc(len);
	if (!c->blob)
		return -ENOMEM;
	err = kvp__reg_mr(a->pd, c->blob, len, IBV_ACCESS_LOCAL_WRITE,
			  &c->blob_mr);
	if (err) {
		free(c->blob);
		c->blob = NULL;
		return err;
	}
	c->blob_len = len;
	return 0;
}

void kvp__conn_release(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t gen = c->gen;

	(void)a;
	kvp__destroy_qp(c->id);
	kvp__destroy_id(c->id);
	kvp__dereg_mr(c->blob_mr);
	free(c->blob);
	kvp__dereg_mr(c->notes_mr);
	free(c->notes);
	kvp_layout_destroy(c->peer);
	free(c->raddr);
	free(c->rkey);
	free(c->chunks);
	c->chunks = NULL;
	c->outstanding = c->c_head = c->c_post = c->c_tail = 0;
	c->status = 0;
	c->drains = 0;
	c->drain_deadline = 0;
	c->qp = NULL;
	c->id = NULL;
	c->raddr = NULL;
	c->rkey = NULL;
	c->rank = 0;
	c->engine_id = 0;
	c->reported = 0;
	c->blob = NULL;
	c->blob_len = 0;
	c->blob_got = 0;
	c->blob_mr = NULL;
	c->peer = NULL;
	c->meta_sent = c->meta_recv = 0;
	c->refused = 0;
	c->notes = NULL;
	c->notes_mr = NULL;
	c->expected = 0;
	/* Completions of this life still queued in the CQ carry the old
	 * generation and are dropped. */
	c->gen = gen + 1;
	c->state = CS_FREE;
}

void kvp__conn_fail(kvp_agent *a, struct kvp_conn *c, int err)
{
	struct ibv_send_wr swr, *sbad;
	struct ibv_recv_wr rwr, *rbad;

	if (c->state == CS_FREE || c->state >= CS_DRAINING)
		return;
	if (!c->status) /* a refusal's reason wins over the disconnect */
		c->status = err ? err : -ECONNRESET;
	if (a->role == KVP_ROLE_CONSUMER && !a->connected) {
		/* Inside kvp_agent_connect(): it tears everything down. */
		c->state = CS_DEAD;
		return;
	}
	if (a->role == KVP_ROLE_CONSUMER)
		a->ndead++;
	kvp__ev_disconnected(a, c);
	c->state = CS_DRAINING;
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
		memset(&rwr, 0, sizeof(rwr));
		rwr.wr_id = kvp__wrid(WK_DRAIN_RQ, c->gen, c->idx, 0);
		if (!kvp__post_recv(c->qp, &rwr, &rbad))
			c->drains++;
		(void)kvp__disconnect(c->id);
	}
	if (!c->drains)
		kvp__conn_drained(a, c);
}

void kvp__conn_drained(kvp_agent *a, struct kvp_conn *c)
{
	if (c->state != CS_DRAINING)
		return;
	a->ndraining--;
	c->drains = 0;
	if (a->role == KVP_ROLE_CONSUMER) {
		kvp__chunks_fail(a, c);
		c->state = CS_DEAD; /* the QP stays until close */
		return;
	}
	kvp__conn_release(a, c);
}

void kvp__conn_timers(kvp_agent *a, uint64_t now)
{
	uint32_t i;

	for (i = 0; i < a->nconns; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_DRAINING && now >= c->drain_deadline) {
			c->drains = 0;
			kvp__conn_drained(a, c);
		} else if (a->role == KVP_ROLE_PRODUCER &&
			   (c->state == CS_CONNECTING ||
			    c->state == CS_HANDSHAKE) &&
			   now >= c->drain_deadline) {
			kvp__conn_fail(a, c, -ETIMEDOUT);
		}
	}
}

/* ---- producer ----------------------------------------------------------- */

int kvp_agent_listen(kvp_agent *a, const char *ip, uint16_t port)
{
	struct sockaddr_storage ss;
	uint64_t cqe;
	int err;

	if (!a || a->role != KVP_ROLE_PRODUCER)
		return -EINVAL;
	if (a->listening)
		return -EBUSY;
	if (!regions_ready(a))
		return -ENXIO;
	err = kvp__parse_addr(ip, port, &ss);
	if (err)
		return err;
	a->rq_depth = a->max_inflight < 128 ? 128 : a->max_inflight;
	if (a->rq_depth + 2 > (uint32_t)a->dattr.max_qp_wr)
		a->rq_depth = (uint32_t)a->dattr.max_qp_wr - 2;
	err = blob_make(a);
	if (err)
		return err;
	cqe = (uint64_t)a->max_peers * (PROD_SQ + a->rq_depth + 2);
	err = cq_make(a, cqe);
	if (err)
		goto err_blob;
	err = -ENOMEM;
	a->conns = conns_alloc(a->max_peers);
	if (!a->conns)
		goto err_cq;
	a->nconns = a->max_peers;
	err = kvp__create_id(a->ech, NULL, &a->listen_id);
	if (err)
		goto err_conns;
	err = kvp__bind_addr(a->listen_id, (struct sockaddr *)&ss);
	if (err)
		goto err_id;
	err = -EINVAL;
	if (a->listen_id->verbs && a->listen_id->verbs != a->ctx)
		goto err_id;
	err = kvp__listen(a->listen_id, (int)a->max_peers);
	if (err)
		goto err_id;
	a->listening = 1;
	return 0;

err_id:
	kvp__destroy_id(a->listen_id);
	a->listen_id = NULL;
err_conns:
	free(a->conns);
	a->conns = NULL;
	a->nconns = 0;
err_cq:
	kvp__destroy_cq(a->cq);
	a->cq = NULL;
err_blob:
	blob_free(a);
	return err;
}

/* The fields of an rdma_cm event we act on, copied so that the event can be
 * acknowledged first: destroying an id waits for its events' acks. */
struct cm_ev {
	enum rdma_cm_event_type type;
	int status;
	struct rdma_cm_id *id, *listen_id;
	uint8_t pdata[256];
	uint32_t plen;
	uint8_t initiator_depth, responder_resources;
};

static void accept_conn(kvp_agent *a, const struct cm_ev *e)
{
	struct rdma_conn_param param;
	struct ibv_qp_init_attr qa;
	struct kvp_hello h, mine;
	uint8_t pd[KVP_HELLO_LEN];
	struct kvp_conn *c = NULL;
	uint32_t i;
	int err;

	/* Refused while too many DISCONNECTED events wait to be polled:
	 * that bounds the event queue. */
	if (kvp__hello_get(e->pdata, e->plen, &h) ||
	    h.role != KVP_ROLE_CONSUMER || e->id->verbs != a->ctx ||
	    kvp__ev_room(a) <= (int)(a->max_inflight + a->max_peers))
		goto err_reject;
	for (i = 0; i < a->nconns; i++)
		if (a->conns[i].state == CS_FREE) {
			c = &a->conns[i];
			break;
		}
	if (!c)
		goto err_reject;
	c->id = e->id;
	c->rank = h.tp_rank;
	c->engine_id = h.engine_id;
	if (peer_blob_alloc(a, c, h.blob_len))
		goto err_conn;
	c->notes = calloc(a->rq_depth, KVP_NOTE_LEN);
	if (!c->notes)
		goto err_conn;
	if (kvp__reg_mr(a->pd, c->notes, (size_t)a->rq_depth * KVP_NOTE_LEN,
			IBV_ACCESS_LOCAL_WRITE, &c->notes_mr))
		goto err_conn;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = a->cq;
	qa.recv_cq = a->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = PROD_SQ;
	qa.cap.max_recv_wr = a->rq_depth + 2;
	qa.cap.max_send_sge = 1;
	qa.cap.max_recv_sge = 1;
	if (kvp__create_qp(e->id, a->pd, &qa))
		goto err_conn;
	c->qp = e->id->qp;
	e->id->context = c;
	/* The consumer's blob arrives first: its RECV goes first. */
	if (post_recv1(c, kvp__wrid(WK_META_RECV, c->gen, c->idx, 0), c->blob,
		       c->blob_len, c->blob_mr->lkey))
		goto err_conn;
	for (i = 0; i < a->rq_depth; i++)
		if (kvp__post_note_recv(a, c, i))
			goto err_conn;
	hello_fill(a, &mine);
	kvp__hello_put(pd, &mine);
	memset(&param, 0, sizeof(param));
	param.private_data = pd;
	param.private_data_len = KVP_HELLO_LEN;
	/* The event's values are from our side's point of view already:
	 * responder_resources is what the consumer wants to read at once. */
	param.responder_resources = e->responder_resources;
	if (param.responder_resources > a->dattr.max_qp_rd_atom)
		param.responder_resources = (uint8_t)a->dattr.max_qp_rd_atom;
	param.initiator_depth = 0;
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	err = kvp__accept(e->id, &param);
	if (err)
		goto err_conn;
	c->state = CS_CONNECTING;
	c->drain_deadline = kvp__now_ns() + HANDSHAKE_NS;
	return;

err_conn:
	/* kvp__conn_release() destroys e->id with the rest. */
	(void)kvp__reject(e->id);
	kvp__conn_release(a, c);
	return;
err_reject:
	(void)kvp__reject(e->id);
	kvp__destroy_id(e->id);
}

/* Producer: the consumer's blob arrived. */
static int producer_meta(kvp_agent *a, struct kvp_conn *c, uint32_t len)
{
	struct kvp_layout_info pi;
	int n, err;

	err = kvp_meta_decode(c->blob, len, &c->peer);
	if (err)
		return err == -ENOMEM ? err : -EPROTO;
	kvp_layout_get_info(c->peer, &pi);
	if (pi.engine_id != c->engine_id || pi.tp_rank != c->rank ||
	    kvp_layout_compat_hash(c->peer) != kvp_layout_compat_hash(a->layout))
		return -EPROTO;
	n = kvp_notify_expected(a->layout, c->peer, a->li.tp_rank);
	if (n <= 0)
		return n == -ENOMEM ? n : -EPROTO;
	c->expected = (uint32_t)n;
	kvp_layout_destroy(c->peer);
	c->peer = NULL;
	err = post_send1(c, kvp__wrid(WK_META_SEND, c->gen, c->idx, 0), a->blob,
			 (uint32_t)a->blob_len, a->blob_mr->lkey);
	if (err)
		return err;
	c->state = CS_READY;
	a->st.connects++;
	return 0;
}

/* ---- consumer ----------------------------------------------------------- */

static int consumer_established(kvp_agent *a, struct kvp_conn *c,
				const struct cm_ev *e)
{
	struct kvp_hello h;
	int err;

	if (kvp__hello_get(e->pdata, e->plen, &h) ||
	    h.role != KVP_ROLE_PRODUCER || h.tp_rank != c->rank ||
	    h.tp_size != a->nconns)
		return -EPROTO;
	c->engine_id = h.engine_id;
	err = peer_blob_alloc(a, c, h.blob_len);
	if (err)
		return err;
	/* Our RECV is posted before our SEND: the producer answers only
	 * after receiving it. */
	err = post_recv1(c, kvp__wrid(WK_META_RECV, c->gen, c->idx, 0),
			 c->blob, c->blob_len, c->blob_mr->lkey);
	if (err)
		return err;
	err = post_send1(c, kvp__wrid(WK_META_SEND, c->gen, c->idx, 0), a->blob,
			 (uint32_t)a->blob_len, a->blob_mr->lkey);
	if (err)
		return err;
	c->state = CS_HANDSHAKE;
	return 0;
}

static int consumer_route(kvp_agent *a, struct kvp_conn *c)
{
	struct rdma_conn_param param;
	struct ibv_qp_init_attr qa;
	struct kvp_hello h;
	uint8_t pd[KVP_HELLO_LEN];
	int err;

	memset(&qa, 0, sizeof(qa));
	qa.send_cq = a->cq;
	qa.recv_cq = a->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = a->sq_depth;
	qa.cap.max_recv_wr = 2;
	qa.cap.max_send_sge = a->max_sge;
	qa.cap.max_recv_sge = 1;
	err = kvp__create_qp(c->id, a->pd, &qa);
	if (err)
		return err;
	c->qp = c->id->qp;
	hello_fill(a, &h);
	kvp__hello_put(pd, &h);
	memset(&param, 0, sizeof(param));
	param.private_data = pd;
	param.private_data_len = KVP_HELLO_LEN;
	/* READs in flight per QP: as many as the device allows. */
	param.initiator_depth = a->dattr.max_qp_init_rd_atom > 255 ?
					255 :
					(uint8_t)a->dattr.max_qp_init_rd_atom;
	param.responder_resources = 0;
	param.retry_count = 7;
	/* Notifications wait for the producer to re-post its RECVs. */
	param.rnr_retry_count = 7;
	err = kvp__connect(c->id, &param);
	if (err)
		return err;
	c->state = CS_CONNECTING;
	return 0;
}

static int cm_errno(enum rdma_cm_event_type t)
{
	switch (t) {
	case RDMA_CM_EVENT_ADDR_ERROR:
		return -EADDRNOTAVAIL;
	case RDMA_CM_EVENT_ROUTE_ERROR:
		return -ENETUNREACH;
	case RDMA_CM_EVENT_UNREACHABLE:
		return -EHOSTUNREACH;
	case RDMA_CM_EVENT_REJECTED:
		return -ECONNREFUSED;
	case RDMA_CM_EVENT_CONNECT_ERROR:
		return -ECONNABORTED;
	case RDMA_CM_EVENT_DEVICE_REMOVAL:
		return -ENODEV;
	default:
		return -ECONNRESET;
	}
}

static void consumer_event(kvp_agent *a, struct kvp_conn *c,
			   const struct cm_ev *e)
{
	int err = 0;

	switch (e->type) {
	case RDMA_CM_EVENT_ADDR_RESOLVED:
		if (c->state != CS_ADDR)
			return;
		if (c->id->verbs != a->ctx) {
			err = -ENETUNREACH; /* routed through another device */
			break;
		}
		(void)kvp__set_ack_timeout(c->id, ACK_TIMEOUT);
		err = kvp__resolve_route(c->id, RESOLVE_MS);
		if (!err)
			c->state = CS_ROUTE;
		break;
	case RDMA_CM_EVENT_ROUTE_RESOLVED:
		if (c->state != CS_ROUTE)
			return;
		err = consumer_route(a, c);
		break;
	case RDMA_CM_EVENT_ESTABLISHED:
		if (c->state != CS_CONNECTING)
			return;
		err = consumer_established(a, c, e);
		break;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return;
	default:
		err = cm_errno(e->type);
		break;
	}
	if (err)
		kvp__conn_fail(a, c, err);
}

static void producer_event(kvp_agent *a, struct kvp_conn *c,
			   const struct cm_ev *e)
{
	switch (e->type) {
	case RDMA_CM_EVENT_ESTABLISHED:
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return;
	default:
		kvp__conn_fail(a, c, cm_errno(e->type));
		return;
	}
}

void kvp__cm_process(kvp_agent *a, int budget)
{
	struct rdma_cm_event *ev;
	struct cm_ev e;
	int i;

	for (i = 0; i < budget; i++) {
		/* Each event queues at most one DISCONNECTED; request events
		 * keep their reserve. */
		if ((a->connected || a->listening) &&
		    kvp__ev_room(a) <= (int)a->max_inflight)
			return;
		if (kvp__get_cm_event(a->ech, &ev) <= 0)
			return;
		memset(&e, 0, sizeof(e));
		e.type = ev->event;
		e.status = ev->status;
		e.id = ev->id;
		e.listen_id = ev->listen_id;
		if (ev->param.conn.private_data) {
			e.plen = ev->param.conn.private_data_len;
			if (e.plen > sizeof(e.pdata))
				e.plen = sizeof(e.pdata);
			memcpy(e.pdata, ev->param.conn.private_data, e.plen);
		}
		e.initiator_depth = ev->param.conn.initiator_depth;
		e.responder_resources = ev->param.conn.responder_resources;
		kvp__ack_event(ev);

		if (e.type == RDMA_CM_EVENT_CONNECT_REQUEST) {
			if (a->role == KVP_ROLE_PRODUCER && a->listening)
				accept_conn(a, &e);
			else
				kvp__destroy_id(e.id);
			continue;
		}
		if (!e.id || !e.id->context)
			continue; /* the listening id */
		if (a->role == KVP_ROLE_CONSUMER)
			consumer_event(a, e.id->context, &e);
		else
			producer_event(a, e.id->context, &e);
	}
}

/* Producer: answers a consumer whose metadata it cannot serve with a
 * refusal instead of its blob, so that the consumer learns why (rather than
 * seeing a bare disconnect), then waits for it to close (bounded by the
 * handshake deadline). The refusal is written over the consumer's blob,
 * which is no longer needed and already registered. */
static void refuse(kvp_agent *a, struct kvp_conn *c, int err)
{
	kvp__put32(c->blob, KVP_REFUSE_MAGIC);
	kvp__put32(c->blob + 4, (uint32_t)err);
	c->status = err;
	c->refused = 1;
	c->state = CS_HANDSHAKE;
	if (post_send1(c, kvp__wrid(WK_META_SEND, c->gen, c->idx, 0), c->blob,
		       KVP_REFUSE_LEN, c->blob_mr->lkey))
		kvp__conn_fail(a, c, err);
}

/* Consumer: the producer's answer arrived: its blob or a refusal. */
static int consumer_meta(struct kvp_conn *c, uint32_t len)
{
	int err;

	if (len == KVP_REFUSE_LEN && kvp__get32(c->blob) == KVP_REFUSE_MAGIC) {
		err = (int)kvp__get32(c->blob + 4);
		return err < 0 && err > -4096 ? err : -EPROTO;
	}
	err = kvp_meta_decode(c->blob, len, &c->peer);
	if (err)
		return err == -ENOMEM ? err : -EPROTO;
	c->blob_got = len;
	return 0;
}

int kvp__handshake_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	int err;

	if (c->state >= CS_DRAINING)
		return 0;
	if (wc->status != IBV_WC_SUCCESS) {
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		return 0;
	}
	if (WRID_KIND(wc->wr_id) == WK_META_SEND) {
		c->meta_sent = 1;
	} else if (a->role == KVP_ROLE_PRODUCER) {
		if (c->refused || c->state != CS_CONNECTING)
			return 0;
		err = producer_meta(a, c, wc->byte_len);
		if (err)
			refuse(a, c, err);
		return 0;
	} else {
		err = consumer_meta(c, wc->byte_len);
		if (err) {
			kvp__conn_fail(a, c, err);
			return 0;
		}
		c->meta_recv = 1;
	}
	if (a->role == KVP_ROLE_CONSUMER && c->state == CS_HANDSHAKE &&
	    c->meta_sent && c->meta_recv)
		c->state = CS_READY;
	return 0;
}

/* Consumer: starts connecting to producer rank r. */
static int start_conn(kvp_agent *a, uint32_t r, const struct kvp_peer *p,
		      int timeout_ms)
{
	struct sockaddr_storage dst, src;
	struct kvp_conn *c = &a->conns[r];
	int err;

	if (!p->addr)
		return -EINVAL;
	err = kvp__parse_addr(p->addr, p->port, &dst);
	if (err)
		return err;
	if (a->src_addr) {
		err = kvp__parse_addr(a->src_addr, 0, &src);
		if (err)
			return err;
	}
	c->rank = r;
	err = kvp__create_id(a->ech, c, &c->id);
	if (err)
		return err;
	c->state = CS_ADDR;
	err = kvp__resolve_addr(c->id,
				a->src_addr ? (struct sockaddr *)&src : NULL,
				(struct sockaddr *)&dst,
				timeout_ms < RESOLVE_MS ? timeout_ms : RESOLVE_MS);
	if (err) {
		kvp__destroy_id(c->id);
		c->id = NULL;
		c->state = CS_FREE;
	}
	return err;
}

/* Consumer: drives rdma_cm events and handshake completions until every
 * started connection is ready, one failed, or the deadline passes. */
static int wait_conns(kvp_agent *a, uint64_t deadline)
{
	struct pollfd pfd;
	uint64_t now;
	uint32_t i;
	int busy;

	for (;;) {
		busy = 0;
		for (i = 0; i < a->nconns; i++) {
			struct kvp_conn *c = &a->conns[i];

			if (c->state == CS_DEAD)
				return c->status;
			if (c->state != CS_FREE && c->state != CS_READY)
				busy = 1;
		}
		if (!busy)
			return 0;
		now = kvp__now_ns();
		if (now >= deadline)
			return -ETIMEDOUT;
		/* Handshake completions have no fd of their own here: wake
		 * at least every millisecond to poll the CQ. */
		pfd.fd = a->ech->fd;
		pfd.events = POLLIN;
		pfd.revents = 0;
		(void)poll(&pfd, 1, 1);
		kvp__cm_process(a, 64);
		(void)kvp__cq_drain(a);
	}
}

/* Checks producer rank `rank`'s layout against its slot (TP size, rank,
 * registered regions) and, when ref is not NULL, against the layout the
 * plan is compiled from: the same engine and geometry. */
static int check_meta(const kvp_layout *peer, uint32_t rank, uint32_t tp_size,
		      const kvp_layout *ref)
{
	struct kvp_layout_info pi, ri;
	uint32_t i;

	kvp_layout_get_info(peer, &pi);
	if (pi.tp_rank != rank || pi.tp_size != tp_size)
		return -EPROTO;
	for (i = 0; i < pi.nregions; i++) {
		uint64_t addr;
		uint32_t key;

		if (kvp_layout_get_region_key(peer, i, &addr, &key) || !addr)
			return -EPROTO;
	}
	if (!ref)
		return 0;
	kvp_layout_get_info(ref, &ri);
	if (pi.engine_id != ri.engine_id || pi.ngroups != ri.ngroups ||
	    pi.nregions != ri.nregions || pi.nviews != ri.nviews ||
	    pi.nfields != ri.nfields ||
	    kvp_layout_compat_hash(peer) != kvp_layout_compat_hash(ref))
		return -EPROTO;
	/* The plan was compiled against `ref`: every rank must share its
	 * geometry (shards aside: a shard's length is the same on every rank,
	 * so the field descriptions are too) for the plan's offsets to
	 * hold. */
	for (i = 0; i < pi.nregions; i++) {
		uint64_t x, y;

		if (kvp_layout_get_region(peer, i, &x) ||
		    kvp_layout_get_region(ref, i, &y) || x != y)
			return -EPROTO;
	}
	for (i = 0; i < pi.ngroups; i++) {
		struct kvp_group_desc x, y;

		if (kvp_layout_get_group(peer, i, &x) ||
		    kvp_layout_get_group(ref, i, &y) || x.kind != y.kind ||
		    x.block_tokens != y.block_tokens)
			return -EPROTO;
	}
	for (i = 0; i < pi.nviews; i++) {
		struct kvp_view_desc x, y;

		if (kvp_layout_get_view(peer, i, &x) ||
		    kvp_layout_get_view(ref, i, &y) || x.group != y.group ||
		    x.region != y.region || x.layer != y.layer ||
		    x.num_blocks != y.num_blocks || x.offset != y.offset ||
		    x.stride != y.stride)
			return -EPROTO;
	}
	for (i = 0; i < pi.nfields; i++) {
		struct kvp_field_desc x, y;
		uint32_t xv, yv;

		/* No padding in the struct: memcmp compares the fields. */
		memset(&x, 0, sizeof(x));
		memset(&y, 0, sizeof(y));
		if (kvp_layout_get_field(peer, i, &xv, &x) ||
		    kvp_layout_get_field(ref, i, &yv, &y) || xv != yv ||
		    memcmp(&x, &y, sizeof(x)))
			return -EPROTO;
	}
	return 0;
}

/* Checks producer rank c's blob against what it claimed in its hello, and
 * against `ref` (see check_meta()). */
static int check_peer(const kvp_agent *a, const struct kvp_conn *c,
		      const kvp_layout *ref)
{
	struct kvp_layout_info pi;

	kvp_layout_get_info(c->peer, &pi);
	if (pi.engine_id != c->engine_id)
		return -EPROTO;
	return check_meta(c->peer, c->rank, a->nconns, ref);
}

static void carried_free(kvp_layout **carried, uint32_t n)
{
	uint32_t i;

	for (i = 0; carried && i < n; i++)
		kvp_layout_destroy(carried[i]);
	free(carried);
}

/* Decodes the blobs carried in ranks[] (the user's own channel) into
 * (*out)[i], NULL where ranks[i] has none, and checks each against its
 * slot and against the lowest rank's, whose index goes to *ref (n when no
 * blob is carried). Touches neither the device nor the network. Returns 0,
 * -EPROTO for a malformed or mismatched blob, -ENOMEM. */
static int carried_decode(const struct kvp_peer *ranks, uint32_t n,
			  kvp_layout ***out, uint32_t *ref)
{
	kvp_layout **l;
	uint32_t i, first = n;
	int err = 0;

	l = calloc(n, sizeof(*l));
	if (!l)
		return -ENOMEM;
	for (i = 0; i < n && !err; i++) {
		if (!ranks[i].meta)
			continue;
		if (ranks[i].meta_len > KVP_META_MAX) {
			err = -EPROTO;
			break;
		}
		err = kvp_meta_decode(ranks[i].meta, ranks[i].meta_len, &l[i]);
		if (err) {
			err = err == -ENOMEM ? err : -EPROTO;
			break;
		}
		if (first == n)
			first = i;
		err = check_meta(l[i], i, n, l[first]);
	}
	if (err) {
		carried_free(l, n);
		return err;
	}
	*out = l;
	*ref = first;
	return 0;
}

static void connect_undo(kvp_agent *a)
{
	uint32_t i;

	for (i = 0; a->conns && i < a->nconns; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_FREE)
			continue;
		if (c->qp)
			(void)kvp__disconnect(c->id);
		kvp__conn_release(a, c);
	}
	kvp__data_free(a);
	kvp_plan_destroy(a->plan);
	a->plan = NULL;
	free(a->conns);
	a->conns = NULL;
	a->nconns = 0;
	kvp__destroy_cq(a->cq);
	a->cq = NULL;
	blob_free(a);
}

/* Producer rank c's in-band blob must be byte-identical to the one the
 * user carried for it: a producer restarted since (new addresses, new
 * rkeys) fails here rather than serving READs against stale keys. */
static int check_carried(const struct kvp_conn *c, const struct kvp_peer *p)
{
	if (c->blob_got != p->meta_len || memcmp(c->blob, p->meta, p->meta_len))
		return -EPROTO;
	return 0;
}

int kvp_agent_connect(kvp_agent *a, const struct kvp_peer *ranks, uint32_t n,
		      int timeout_ms)
{
	struct kvp_plan_attr pattr;
	kvp_layout **carried = NULL;
	const kvp_layout *ref;
	uint64_t deadline;
	uint32_t first, k, i;
	int err, r;

	if (!a || a->role != KVP_ROLE_CONSUMER || !ranks || !n ||
	    n > 0xffff || timeout_ms <= 0)
		return -EINVAL;
	if (a->connected)
		return -EISCONN;
	if (!regions_ready(a))
		return -ENXIO;
	for (i = 0; i < n; i++)
		if (!ranks[i].addr || !ranks[i].meta != !ranks[i].meta_len)
			return -EINVAL;
	deadline = kvp__now_ns() + (uint64_t)timeout_ms * 1000000ull;
	/* Carried blobs are checked before anything is set up. */
	err = carried_decode(ranks, n, &carried, &first);
	if (err)
		return err;
	err = blob_make(a);
	if (err)
		goto err_carried;
	err = cq_make(a, (uint64_t)n * (a->sq_depth + 4) + 16);
	if (err)
		goto err_undo;
	err = -ENOMEM;
	a->conns = conns_alloc(n);
	if (!a->conns)
		goto err_undo;
	a->nconns = n;
	if (first < n) {
		/* Any rank's layout compiles the plan (check_meta() holds the
		 * others to its geometry): no connection just to learn it. */
		ref = carried[first];
	} else {
		/* The producer rank at the start of this rank's notify cover
		 * is always in the plan's notify list: meet it first, so that
		 * no connection is made only to be dropped. */
		first = (uint32_t)((uint64_t)a->li.tp_rank * n / a->li.tp_size);
		err = start_conn(a, first, &ranks[first], timeout_ms);
		if (err)
			goto err_undo;
		err = wait_conns(a, deadline);
		if (err)
			goto err_undo;
		err = check_peer(a, &a->conns[first], NULL);
		if (err)
			goto err_undo;
		ref = a->conns[first].peer;
	}
	memset(&pattr, 0, sizeof(pattr));
	pattr.max_sge = a->max_sge;
	err = kvp_plan_compile(a->layout, ref, &pattr, &a->plan, NULL, 0);
	if (err) {
		err = err == -ENOMEM ? err : -EPROTO;
		goto err_undo;
	}
	kvp_plan_get_info(a->plan, &a->pi);
	for (k = 0; k < a->pi.nnotify; k++) {
		r = kvp_plan_notify(a->plan, k);
		if (r < 0 || (uint32_t)r >= n) {
			err = -EPROTO;
			goto err_undo;
		}
		if (a->conns[r].state != CS_FREE)
			continue;
		err = start_conn(a, (uint32_t)r, &ranks[r], timeout_ms);
		if (err)
			goto err_undo;
	}
	/* A source outside the notify list would be a planner bug. */
	for (k = 0; k < a->pi.nsrc; k++) {
		r = kvp_plan_source(a->plan, k);
		if (r < 0 || (uint32_t)r >= n || a->conns[r].state == CS_FREE) {
			err = -EPROTO;
			goto err_undo;
		}
	}
	err = wait_conns(a, deadline);
	if (err)
		goto err_undo;
	for (i = 0; i < n; i++) {
		if (a->conns[i].state == CS_FREE)
			continue;
		err = carried[i] ? check_carried(&a->conns[i], &ranks[i]) : 0;
		if (!err)
			err = check_peer(a, &a->conns[i], ref);
		if (err)
			goto err_undo;
	}
	err = kvp__data_alloc(a);
	if (err)
		goto err_undo;
	carried_free(carried, n);
	a->connected = 1;
	a->st.connects += a->pi.nnotify;
	return 0;

err_undo:
	connect_undo(a);
err_carried:
	carried_free(carried, n);
	return err;
}
