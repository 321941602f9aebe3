// SPDX-License-Identifier: MIT
/*
 * The consumer's connections: connect to the producer ranks the plan
 * needs, the handshake's consumer side (see conn.c), checks of every
 * producer rank's blob, carried or in-band.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "hmac.h"
#include "internal.h"

#define ACK_TIMEOUT 17 /* 4.096 us * 2^17 = 0.54 s */
#define RESOLVE_MS 5000

/* The producer accepted: its hello (and, with a secret, its proof) in the
 * accept's private data. Sends our proof; the producer answers GO. */
static int consumer_established(kvp_agent *a, struct kvp_conn *c,
				const uint8_t *pdata, uint32_t plen)
{
	uint8_t mac[KVP_MAC_LEN], *m = kvp__ctl_tx(a, c);
	struct kvp_hello h;
	int err;

	if (plen < KVP_HELLO_ACCEPT_LEN || kvp__hello_get(pdata, plen, &h) ||
	    h.role != KVP_ROLE_PRODUCER || h.tp_rank != c->rank ||
	    h.tp_size != a->nconns || h.blob_len < KVP_META_MIN_LEN ||
	    h.blob_len > KVP_META_MAX)
		return -EPROTO;
	memcpy(c->hello_p, pdata, KVP_HELLO_LEN);
	if (a->secret) {
		/* The producer must prove the secret too: a stranger would
		 * otherwise serve us bytes of its choosing. */
		kvp__auth_mac(a, 'P', c->hello_c, c->hello_p, mac);
		if (!(h.flags & KVP_HELLO_AUTH) ||
		    !kvp__ct_equal(mac, pdata + KVP_HELLO_LEN, KVP_MAC_LEN))
			return -EPERM;
	}
	c->engine_id = h.engine_id;
	c->peer_blob = h.blob_len;
	err = kvp__post_ctl_recv(a, c);
	if (err)
		return err;
	kvp__put32(m, KVP_AUTH_MAGIC);
	kvp__put32(m + 4, 0);
	memset(m + 8, 0, KVP_MAC_LEN);
	if (a->secret)
		kvp__auth_mac(a, 'C', c->hello_c, c->hello_p, m + 8);
	err = kvp__post_ctl_send(a, c, KVP_AUTH_LEN);
	if (err)
		return err;
	c->state = CS_HANDSHAKE;
	return 0;
}

/* GO: our RECV for the producer's blob goes before our blob, which the
 * producer answers. */
static int consumer_go(kvp_agent *a, struct kvp_conn *c)
{
	int err;

	err = kvp__peer_blob_alloc(a, c);
	if (err)
		return err;
	err = kvp__post_recv1(c, kvp__wrid(WK_META_RECV, c->gen, c->idx, 0),
			      c->blob, c->blob_len, c->blob_mr->lkey);
	if (err)
		return err;
	return kvp__post_send1(c, kvp__wrid(WK_META_SEND, c->gen, c->idx, 0),
			       a->blob, (uint32_t)a->blob_len,
			       a->blob_mr->lkey);
}

/* A refusal's code, or 0 when m is not a refusal. */
static int refusal(const uint8_t *m, uint32_t len)
{
	if (len != KVP_REFUSE_LEN || kvp__get32(m) != KVP_REFUSE_MAGIC)
		return 0;
	return kvp__refusal_errno((int32_t)kvp__get32(m + 4));
}

static int consumer_route(kvp_agent *a, struct kvp_conn *c)
{
	struct rdma_conn_param param;
	struct ibv_qp_init_attr qa;
	struct kvp_hello h;
	int err;

	memset(&qa, 0, sizeof(qa));
	qa.send_cq = a->cq;
	qa.recv_cq = a->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = a->sq_depth;
	qa.cap.max_recv_wr = 3; /* control, blob, drain marker */
	qa.cap.max_send_sge = a->max_sge;
	qa.cap.max_recv_sge = 1;
	err = kvp__create_qp(c->id, a->pd, &qa);
	if (err)
		return err;
	c->qp = c->id->qp;
	kvp__hello_fill(a, &h);
	err = kvp__random(h.nonce, sizeof(h.nonce));
	if (err)
		return err;
	kvp__hello_put(c->hello_c, &h);
	memset(&param, 0, sizeof(param));
	param.private_data = c->hello_c;
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
		err = consumer_established(a, c, pdata, plen);
		break;
	case RDMA_CM_EVENT_TIMEWAIT_EXIT:
	case RDMA_CM_EVENT_ADDR_CHANGE:
		return;
	case RDMA_CM_EVENT_REJECTED:
		/* The producer's reason, if it gave one. The transport pads
		 * private data (IB CM: to 148 bytes in a reject). */
		err = refusal(pdata, plen < KVP_REFUSE_LEN ? plen :
							    KVP_REFUSE_LEN);
		if (!err)
			err = -ECONNREFUSED;
		break;
	default:
		err = kvp__cm_errno(type);
		break;
	}
	if (err)
		kvp__conn_fail(a, c, err);
}

/* The producer's answer to our blob: its own blob, or a refusal. */
static int consumer_meta(struct kvp_conn *c, uint32_t len)
{
	int err;

	err = refusal(c->blob, len);
	if (err)
		return err;
	err = kvp_meta_decode(c->blob, len, &c->peer);
	if (err)
		return err == -ENOMEM ? err : -EPROTO;
	c->blob_got = len;
	return 0;
}

void kvp__consumer_wc(kvp_agent *a, struct kvp_conn *c, const struct ibv_wc *wc)
{
	const uint8_t *m;
	int err = 0;

	switch (WRID_KIND(wc->wr_id)) {
	case WK_CTL_RECV:
		if (c->state != CS_HANDSHAKE || c->blob)
			return;
		m = kvp__ctl_rx(a, c);
		err = refusal(m, wc->byte_len);
		if (!err && (wc->byte_len != KVP_GO_LEN ||
			     kvp__get32(m) != KVP_GO_MAGIC))
			err = -EPROTO;
		if (!err)
			err = consumer_go(a, c);
		break;
	case WK_META_SEND:
		c->meta_sent = 1;
		break;
	case WK_META_RECV:
		err = consumer_meta(c, wc->byte_len);
		if (!err)
			c->meta_recv = 1;
		break;
	default:
		return;
	}
	if (err) {
		kvp__conn_fail(a, c, err);
		return;
	}
	if (c->state == CS_HANDSHAKE && c->meta_sent && c->meta_recv)
		c->state = CS_READY;
}

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
		/* Completions first: a producer disconnects once its refusal
		 * is delivered, and the refusal must win over the
		 * disconnect. */
		(void)kvp__cq_drain(a);
		kvp__cm_process(a, 64);
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
	kvp__ctl_free(a);
	kvp__destroy_cq(a->cq);
	a->cq = NULL;
	kvp__blob_free(a);
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
	    n > KVP_MAX_TP_SIZE || timeout_ms <= 0)
		return -EINVAL;
	if (a->connected)
		return -EISCONN;
	if (!kvp__regions_ready(a))
		return -ENXIO;
	for (i = 0; i < n; i++)
		if (!ranks[i].addr || !ranks[i].meta != !ranks[i].meta_len)
			return -EINVAL;
	deadline = kvp__now_ns() + (uint64_t)timeout_ms * 1000000ull;
	/* Carried blobs are checked before anything is set up. */
	err = carried_decode(ranks, n, &carried, &first);
	if (err)
		return err;
	err = kvp__blob_make(a);
	if (err)
		goto err_carried;
	err = kvp__cq_make(a, (uint64_t)n * (a->sq_depth + 5) + 16);
	if (err)
		goto err_undo;
	err = -ENOMEM;
	a->conns = kvp__conns_alloc(n);
	if (!a->conns)
		goto err_undo;
	a->nconns = n;
	err = kvp__ctl_alloc(a, n);
	if (err)
		goto err_undo;
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
