// SPDX-License-Identifier: MIT
/*
 * Agents: the top floor of verbs/. Opening (device, limits, the sides'
 * tables), closing, the poll loop and arming, statistics; it owns the CQ
 * and the rdma_cm channel and hands each completion and event to the side
 * that owns its connection (consumer: connect.c, post.c; producer:
 * listen.c, serve.c; both: conn.c). Registration is reg.c's.
 */
#include <poll.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* 8192 ids: a 128k-token prompt at 16-token blocks in one pull. The cost
 * is the request slots' copies of their ids, max_inflight x groups x 2 x
 * max_ids x 4 bytes: 4 MiB per group at the default 64 in flight (was
 * 128 KiB at 256, which refused any prompt past 4,096 tokens). */
#define DEF_MAX_IDS 8192
#define DEF_INFLIGHT 64
#define DEF_PEERS_PROD 1024 /* consumer ranks on a producer */
#define DEF_PEERS_CONS 64   /* producer ranks on a consumer */
#define DEF_IDLE_MS 300000
#define MIN_IDLE_MS 1000
#define DEF_SQ 512
#define DEF_SGE KVP_DEFAULT_MAX_SGE /* see kvp_agent_attr.max_sge */
/* max_read 0: limits.c's cap, which kvpull.h publishes. */
_Static_assert(KVP_MAX_WR_LEN == KVP_DEFAULT_MAX_READ, "READ cap");
#define DEF_HANDSHAKE_MS 10000
#define DEF_STALL_MS 10000
#define DEF_QPS 2
#define MAX_QPS KVP_MAX_QPS
#define CM_INTERVAL_NS 1000000ull    /* rdma_cm channel check, busy polling */
#define CQ_BATCHES 8
#define CM_BUDGET 16 /* rdma_cm events per poll */
#define MAX_HALF_OPEN 64 /* producer: handshakes under way at most */
/* Costly verbs steps a poll takes: each is a syscall or more, on soft-RoCE
 * under emulation 5-30 ms of CPU (a QP's creation and accept, its
 * destruction, a slot's first CQ and MRs); the next waits for the next
 * poll, in arrival order. */
#define COSTLY_BUDGET 1
#define TIMER_INTERVAL_NS 10000000ull /* connection timers, busy polling */
/* The time after which a poll takes no further rdma_cm event (it takes
 * one at least): each costs a syscall or more, and on soft-RoCE under
 * emulation a QP's creation or teardown tens of ms. */
#define POLL_BUDGET_NS 10000000ull
#define CLOSE_FLUSH_NS 1000000000ull

/* ---- open / close ------------------------------------------------------- */

static void secret_free(kvp_agent *a)
{
	if (!a->secret)
		return;
	explicit_bzero(a->secret, a->secret_len);
	free(a->secret);
	a->secret = NULL;
}

/* Picks the device: by name, by the address it owns, or the first. */
static int pick_device(kvp_agent *a, const struct kvp_agent_attr *attr)
{
	struct ibv_context *by_addr = NULL;
	int n = 0, i, err;

	err = kvp__get_devices(&a->devs, &n);
	if (err)
		return err == -ENOMEM ? err : -ENODEV;
	if (n <= 0)
		return -ENODEV;
	if (attr->addr) {
		struct sockaddr_storage ss;
		struct rdma_cm_id *id;

		err = kvp__parse_addr(attr->addr, 0, &ss);
		if (err)
			return err;
		err = kvp__create_id(a->ech, NULL, &id);
		if (err)
			return err;
		err = kvp__bind_addr(id, (struct sockaddr *)&ss);
		by_addr = err ? NULL : id->verbs;
		kvp__destroy_id(id);
		if (!by_addr)
			return -ENODEV;
	}
	if (attr->device) {
		for (i = 0; i < n; i++)
			if (!strcmp(kvp__dev_name(a->devs[i]), attr->device))
				break;
		if (i == n)
			return -ENODEV;
		if (by_addr && by_addr != a->devs[i])
			return -EINVAL;
		a->ctx = a->devs[i];
	} else {
		a->ctx = by_addr ? by_addr : a->devs[0];
	}
	return 0;
}

/* The device's and its first port's limits: every queue depth, SGE
 * count, READ length and access flag the agent uses comes from here. */
static int device_limits(kvp_agent *a)
{
	struct ibv_port_attr pa;
	struct kvp_want w;
	int err, iwarp;

	err = kvp__query_device(a->ctx, &a->dattr);
	if (err)
		return err;
	/* Ports of one device share their message size limit in practice;
	 * the first one's is taken (rdma_cm picks the port per route). */
	memset(&pa, 0, sizeof(pa));
	if (kvp__query_port(a->ctx, 1, &pa))
		memset(&pa, 0, sizeof(pa));
	iwarp = a->ctx->device->transport_type == IBV_TRANSPORT_IWARP;
	memset(&w, 0, sizeof(w));
	a->nprod = a->producer ? a->prod_qps : 0;
	a->nconns = a->nprod + (a->consumer ? a->cons_qps : 0);
	w.nprod = a->nprod;
	w.ncons = a->nconns - a->nprod;
	w.sq_depth = a->sq_depth;
	w.rq_depth = a->rq_depth ? a->rq_depth :
		     a->max_inflight < 128 ? 128 : a->max_inflight;
	if (w.rq_depth > KVP_CREDIT_MAX)
		w.rq_depth = KVP_CREDIT_MAX;
	w.prod_sq = PROD_SQ;
	w.max_sge = a->max_sge;
	w.max_read = a->max_read;
	w.max_mr = a->max_mr;
	w.producer = a->producer;
	w.consumer = a->consumer;
	w.srq_bufs = a->srq_cap = kvp__srq_want(a, w.rq_depth);
	err = kvp__limits(&a->dattr, &pa, iwarp, &w, &a->lim);
	if (err)
		return err;
	a->sq_depth = a->lim.sq_depth;
	a->rq_depth = a->producer ? a->lim.rq_depth : 0;
	/* The default READ window: never more than the QP may have in
	 * flight (a value asked for is the caller's: above it, the device
	 * queues READs in its send queue, as with no window); its bytes
	 * default to packets of the port's MTU (IBV_MTU_256 is 1). */
	if (!a->rd_win_asked && a->rd_win > a->lim.rd_atom)
		a->rd_win = a->lim.rd_atom ? a->lim.rd_atom : 1;
	if (!a->rd_win_bytes)
		a->rd_win_bytes = KVP_READ_WINDOW_PKTS *
				  (pa.active_mtu >= IBV_MTU_256 &&
						   pa.active_mtu <= IBV_MTU_4096 ?
					   128u << pa.active_mtu :
					   1024u);
	a->max_sge = a->consumer ? a->lim.max_sge : 1;
	return 0;
}

/* Queue pairs for `peers` ranks of `per` each, at most `max`. */
static uint32_t qps_of(uint32_t peers, uint32_t per, uint32_t max)
{
	uint64_t n = (uint64_t)peers * per;

	return n > max ? max : (uint32_t)n;
}

/* The CQs: runs of slots share one, each within the device's max_cqe
 * (limits.c chose how many and their QPs). Each is created when the
 * first slot of its run is taken (kvp__cq_make()): an agent sized for a
 * thousand peers has the CQs of the peers it has. */
static int cqs_make(kvp_agent *a)
{
	a->ncq = a->lim.ncq_prod + a->lim.ncq_cons;
	a->cqs = calloc(a->ncq + 1, sizeof(*a->cqs));
	if (!a->cqs)
		return -ENOMEM;
	return 0;
}

static void cqs_destroy(kvp_agent *a)
{
	uint32_t k;

	for (k = 0; a->cqs && k < a->ncq; k++)
		kvp__destroy_cq(a->cqs[k]);
	free(a->cqs);
	a->cqs = NULL;
	a->ncq = 0;
}

/* Everything both sides need for any number of peers, sized once from the
 * attributes: connection slots with their control buffers (registered
 * once), the completion queue, the event queue; the producer's request
 * table and credit counters; the consumer's engines, request slots and
 * notification buffers. Nothing is allocated per peer engine but its
 * plan (shared by geometry), its tables and its connections' queues. */
static int open_sides(kvp_agent *a)
{
	uint32_t i, ncons = a->nconns - a->nprod;
	int err;

	a->ncons_free = ncons;
	a->prod_hw = 0;
	a->cons_end = a->nprod; /* no slot used yet */
	a->idle_at = UINT64_MAX;
	if (a->producer)
		a->ev_cap += a->max_inflight + 2 * a->nprod + 8;
	if (a->consumer)
		a->ev_cap += a->max_inflight + 4 * ncons + 8 +
			     (a->stream_events ? 2 * a->max_inflight : 0);
	a->evq = calloc(a->ev_cap, sizeof(*a->evq));
	a->conns = kvp__conns_alloc(a->nconns);
	if (!a->evq || !a->conns)
		return -ENOMEM;
	/* Each slot serves one side for the agent's life: what happens to
	 * its connections goes to that side's callbacks. */
	for (i = 0; i < a->nconns; i++) {
		struct kvp_conn *c = &a->conns[i];

		c->side = i < a->nprod ? KVP_ROLE_PRODUCER : KVP_ROLE_CONSUMER;
		c->ops = i < a->nprod ? &kvp__producer_ops : &kvp__consumer_ops;
	}
	err = kvp__ctl_alloc(a, a->nconns);
	if (err)
		return err;
	/* Before the CQs: a device that cannot make the shared receive
	 * queue it announced gets queues per QP, and CQs sized for them. */
	if (a->srq_cap && kvp__srq_open(a)) {
		a->srq_off = 1;
		err = device_limits(a);
		if (err)
			return err;
	}
	err = cqs_make(a);
	if (err)
		return err;
	if (a->producer) {
		err = kvp__serve_alloc(a);
		if (!err)
			err = kvp__wait_alloc(a);
		if (err)
			return err;
		/* Consumers READ their slot's counter for credit, each
		 * through an MR of that counter alone (least privilege: a
		 * peer's key reveals no other peer's progress), registered
		 * when the slot is first taken (kvp__slot_prepare()). */
		a->ctr = calloc(a->nprod, sizeof(*a->ctr));
		a->ctr_mr = calloc(a->nprod, sizeof(*a->ctr_mr));
		if (!a->ctr || !a->ctr_mr)
			return -ENOMEM;
	}
	if (a->consumer) {
		err = kvp__engines_alloc(a);
		if (err)
			return err;
		err = kvp__data_alloc(a);
		if (err)
			return err;
	}
	return 0;
}

/* Undoes open_sides(), whatever part of it was done. MRs before their
 * PD; the CQ after the QPs. */
static void close_sides(kvp_agent *a)
{
	uint32_t i;

	for (i = 0; a->conns && i < a->nconns; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_FREE)
			continue;
		if (c->id && c->state >= CS_CONNECTING)
			(void)kvp__disconnect(c->id);
		kvp__conn_release(a, c);
	}
	kvp__slots_free(a);
	kvp__srq_close(a); /* after its QPs */
	kvp__engines_free(a);
	kvp__data_free(a);
	for (i = 0; a->ctr_mr && i < a->nprod; i++)
		kvp__dereg_mr(a->ctr_mr[i]);
	free(a->ctr_mr);
	a->ctr_mr = NULL;
	free(a->ctr);
	a->ctr = NULL;
	kvp__wait_free(a);
	kvp__serve_free(a);
	kvp__ctl_free(a);
	cqs_destroy(a);
	free(a->conns);
	a->conns = NULL;
	a->nconns = 0;
	free(a->evq);
	a->evq = NULL;
}

int kvp_agent_open(const struct kvp_agent_attr *attr, kvp_agent **out)
{
	kvp_agent *a;
	uint32_t n, qp_max;
	int err;

	if (!attr || !out || !attr->layout || attr->role >= KVP_ROLE_COUNT ||
	    (attr->comp_mask & ~KVP_AGENT_ATTR_LOG) ||
	    ((attr->comp_mask & KVP_AGENT_ATTR_LOG) &&
	     attr->log_level > KVP_LOG_DEBUG))
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->role = attr->role;
	a->producer = attr->role != KVP_ROLE_CONSUMER;
	a->consumer = attr->role != KVP_ROLE_PRODUCER;
	a->max_ids = attr->max_ids ? attr->max_ids : DEF_MAX_IDS;
	a->max_inflight = attr->max_inflight ? attr->max_inflight : DEF_INFLIGHT;
	/* max_peers counts ranks, max_qps queue pairs, per side. */
	a->max_peers = attr->max_peers ? attr->max_peers : DEF_PEERS_CONS;
	a->prod_peers = attr->max_peers ? attr->max_peers : DEF_PEERS_PROD;
	a->sq_depth = attr->sq_depth ? attr->sq_depth : DEF_SQ;
	a->max_sge = attr->max_sge ? attr->max_sge : DEF_SGE;
	a->next_deadline = UINT64_MAX;
	a->handshake_ns = (uint64_t)(attr->handshake_ms ? attr->handshake_ms :
					       DEF_HANDSHAKE_MS) * 1000000ull;
	a->qps = attr->qps_per_peer ? attr->qps_per_peer : DEF_QPS;
	qp_max = a->producer && a->consumer ? 0x7fffu : 0xffffu;
	a->prod_qps = attr->max_qps ? attr->max_qps :
		      qps_of(a->prod_peers, DEF_QPS, qp_max);
	a->cons_qps = attr->max_qps ? attr->max_qps :
		      qps_of(a->max_peers, a->qps, qp_max);
	if (a->prod_peers > a->prod_qps) /* a rank takes one at least */
		a->prod_peers = a->prod_qps;
	a->max_per_source = attr->max_per_source;
	if (!a->max_per_source || a->max_per_source > a->prod_peers)
		a->max_per_source = a->prod_peers;
	a->max_half_open = (a->prod_qps + 1) / 2;
	if (a->max_half_open > MAX_HALF_OPEN)
		a->max_half_open = MAX_HALF_OPEN;
	a->idle_ns = attr->idle_ms == KVP_IDLE_NEVER ? UINT64_MAX :
		     (uint64_t)(attr->idle_ms ? attr->idle_ms : DEF_IDLE_MS) *
			     1000000ull;
	a->rq_depth = attr->rq_depth;
	a->max_read = attr->max_read;
	a->tos = attr->tos;
	a->plan_flags = attr->plan_flags;
	a->stream_events = attr->stream_events;
	a->srq_off = attr->srq == KVP_SRQ_OFF;
	a->max_mr = attr->max_mr;
	a->rd_win = attr->read_window ? attr->read_window : KVP_READ_WINDOW;
	a->rd_win_asked = attr->read_window != 0;
	a->rd_win_default = !attr->read_window && !attr->read_window_bytes;
	a->rd_win_bytes = attr->read_window_bytes;
	a->stall_ns = (uint64_t)(attr->stall_ms ? attr->stall_ms :
				 DEF_STALL_MS) * 1000000ull;
	/* Past the older struct's end: only when comp_mask says so. */
	if ((attr->comp_mask & KVP_AGENT_ATTR_LOG) && attr->log_fn) {
		a->obs.log_fn = attr->log_fn;
		a->obs.log_user = attr->log_user;
		a->obs.log_level = attr->log_level ? attr->log_level :
						     KVP_LOG_INFO;
	}
	/* wr_ids carry a connection index in 16 bits. */
	if (a->max_inflight > (1u << 20) ||
	    a->max_peers > qp_max || attr->max_qps > qp_max ||
	    (attr->idle_ms && attr->idle_ms < MIN_IDLE_MS) ||
	    a->max_ids > (1u << 24) || attr->handshake_ms > 3600000 ||
	    attr->stall_ms > 3600000 || attr->rq_depth > KVP_CREDIT_MAX ||
	    attr->tos > 256 || a->qps > MAX_QPS || attr->stream_events > 1 ||
	    attr->srq > KVP_SRQ_OFF || attr->read_window > 0xffff ||
	    (attr->read_window_bytes &&
	     attr->read_window_bytes < KVP_READ_WINDOW_BYTES_MIN) ||
	    (attr->plan_flags & ~(uint32_t)KVP_PLAN_NO_COALESCE) ||
	    (attr->max_mr && attr->max_mr < KVP_MR_MIN) ||
	    !attr->secret != !attr->secret_len ||
	    (attr->secret && (attr->secret_len < KVP_SECRET_MIN ||
			      attr->secret_len > KVP_SECRET_MAX))) {
		err = -EINVAL;
		goto err_free;
	}
	if (attr->secret) {
		a->secret = malloc(attr->secret_len);
		if (!a->secret) {
			err = -ENOMEM;
			goto err_free;
		}
		memcpy(a->secret, attr->secret, attr->secret_len);
		a->secret_len = attr->secret_len;
	}
	if (attr->addr) {
		a->src_addr = strdup(attr->addr);
		if (!a->src_addr) {
			err = -ENOMEM;
			goto err_free;
		}
	}
	err = kvp_layout_clone(attr->layout, &a->layout);
	if (err)
		goto err_free;
	kvp_layout_get_info(a->layout, &a->li);
	err = kvp__create_event_channel(&a->ech);
	if (err)
		goto err_layout;
	err = kvp__set_nonblock(a->ech->fd);
	if (err)
		goto err_ech;
	err = pick_device(a, attr);
	if (err)
		goto err_devs;
	err = device_limits(a);
	if (err)
		goto err_devs;
	err = kvp__alloc_pd(a->ctx, &a->pd);
	if (err)
		goto err_devs;
	err = kvp__set_nonblock(a->ctx->async_fd);
	if (err)
		goto err_pd;
	err = kvp__create_comp_channel(a->ctx, &a->cch);
	if (err)
		goto err_pd;
	err = kvp__set_nonblock(a->cch->fd);
	if (err)
		goto err_cch;
	n = a->li.nregions;
	a->lreg = calloc(n + 1, sizeof(*a->lreg));
	a->lnkeys = calloc(n + 1, sizeof(*a->lnkeys));
	a->mr = calloc(n + 1, sizeof(*a->mr));
	a->mr_window = UINT32_MAX;
	err = -ENOMEM;
	if (!a->lreg || !a->lnkeys || !a->mr)
		goto err_arrays;
	err = open_sides(a);
	if (err)
		goto err_arrays;
	*out = a;
	return 0;

err_arrays:
	close_sides(a);
	free(a->lreg);
	free(a->lnkeys);
	free(a->mr);
err_cch:
	kvp__destroy_comp_channel(a->cch);
err_pd:
	kvp__dealloc_pd(a->pd);
err_devs:
	kvp__free_devices(a->devs);
err_ech:
	kvp__destroy_event_channel(a->ech);
err_layout:
	kvp_layout_destroy(a->layout);
err_free:
	secret_free(a);
	free(a->src_addr);
	free(a);
	return err;
}

static void flush_backlog(kvp_agent *a);
static int cq_drain(kvp_agent *a);

/* Notifications already owed (DONE reported, or data on the way) go out
 * before the connections close, for at most CLOSE_FLUSH_NS: the producers
 * then release those requests rather than hold them until they expire. */
static void flush_notes(kvp_agent *a)
{
	uint64_t now = kvp__now_ns(), end = now + CLOSE_FLUSH_NS;
	uint32_t i, pending;

	for (;;) {
		pending = 0;
		for (i = a->nprod; i < a->cons_end; i++) {
			const struct kvp_conn *c = &a->conns[i];

			if (c->state == CS_READY && c->c_head != c->c_tail)
				pending = 1;
		}
		now = kvp__now_ns();
		if (!pending || now >= end)
			return;
		(void)poll(NULL, 0, 1);
		(void)cq_drain(a);
		flush_backlog(a);
		kvp__pull_timers(a, now);
	}
}

/* Tells every ready peer that this is a close, not a crash: a BYE on each
 * connection, waited for at most KVP_BYE_NS. */
static void say_bye(kvp_agent *a)
{
	uint64_t end = kvp__now_ns() + KVP_BYE_NS;
	uint32_t i, pending = 0;

	for (i = 0; a->conns && i < a->nconns; i++) {
		struct kvp_conn *c = &a->conns[i];

		pending += c->side == KVP_ROLE_PRODUCER ?
				   kvp__bye_producer(a, c) :
				   kvp__bye_consumer(a, c);
	}
	while (pending && kvp__now_ns() < end) {
		if (cq_drain(a) < 0)
			return;
		for (i = 0, pending = 0; i < a->nconns; i++)
			pending += a->conns[i].bye_sent;
		if (pending)
			(void)poll(NULL, 0, 1);
	}
}

void kvp_agent_close(kvp_agent *a)
{
	uint32_t i;

	if (!a)
		return;
	if (a->consumer && a->reqs)
		flush_notes(a);
	say_bye(a);
	kvp__destroy_id(a->listen_id);
	close_sides(a);
	kvp__blob_free(a);
	for (i = 0; i < a->li.nregions; i++)
		kvp__reg_drop(a, i);
	kvp__destroy_comp_channel(a->cch);
	kvp__dealloc_pd(a->pd);
	kvp__free_devices(a->devs);
	kvp__destroy_event_channel(a->ech);
	kvp_layout_destroy(a->layout);
	secret_free(a);
	free(a->lreg);
	free(a->lnkeys);
	free(a->mr);
	free(a->src_addr);
	free(a);
}

/* What the agent allocated besides the registered memory: sized at open,
 * plus what its peers hold now (connection queues, blobs, plans, engine
 * tables). */
static uint64_t mem_bytes(const kvp_agent *a)
{
	uint64_t m = sizeof(*a), ng = a->li.ngroups;
	uint32_t i;

	m += (uint64_t)a->nconns * (sizeof(*a->conns) + KVP_CTL_SLOT);
	m += (uint64_t)a->ev_cap * sizeof(*a->evq);
	m += a->blob_len;
	/* Region maps and MR tables. */
	m += (uint64_t)a->li.nregions *
	     (sizeof(*a->lreg) + sizeof(*a->lnkeys) + sizeof(*a->mr));
	for (i = 0; i < a->li.nregions; i++)
		m += (uint64_t)a->lnkeys[i] *
		     (sizeof(uint32_t) + sizeof(struct ibv_mr *));
	if (a->producer) {
		m += (uint64_t)(a->tab_mask + 1) *
		     (sizeof(*a->tab) + sizeof(*a->hint));
		m += (uint64_t)(a->max_inflight + a->early_cap) *
		     (KVP_BM_WORDS * sizeof(*a->bm) + sizeof(*a->bm_free));
		m += (uint64_t)a->gone_cap * sizeof(*a->gone);
		m += (uint64_t)a->prod_peers * sizeof(*a->peng);
		m += (uint64_t)a->nprod * (sizeof(*a->ctr) +
					   sizeof(*a->ctr_mr) +
					   sizeof(*a->fol_mr));
		/* streaming followers and their records, of the slots
		 * that served a streaming consumer rank so far (the rest
		 * is reserved, never touched) */
		/* the shared receive queue's registered buffers, its MR
		 * table and the QP number map */
		if (a->srq)
			m += (uint64_t)a->srq_n * KVP_CTL_LEN +
			     (uint64_t)(a->srq_cap / SRQ_CHUNK) *
				     sizeof(*a->srq_mr) +
			     (uint64_t)(a->qpn_mask + 1) * sizeof(*a->qpn_tab);
		m += (uint64_t)a->nfol * a->fol_per *
		     (sizeof(*a->fol) + KVP_PROG_REC);
		/* the lease table (registered) */
		m += ((((uint64_t)KVP_LEASE_READ << a->lease_log2) + 4095) &
		      ~4095ull);
	}
	if (a->consumer) {
		/* notes (plain and flagged) and FOLLOWs, the streamed
		 * list; each connection slot's progress records */
		m += (uint64_t)a->max_inflight * (2 * KVP_NOTE_LEN +
						  sizeof(*a->sreq));
		/* lease buckets' landing buffers (registered) */
		m += (uint64_t)(a->nconns - a->nprod) * KVP_LEASE_RING *
		     KVP_LEASE_READ;
		m += (uint64_t)(a->nconns - a->nprod) * sizeof(*a->ptab_mr) +
		     (uint64_t)a->nprepared[1] * 2 * a->max_inflight *
			     KVP_PROG_REC;
		m += (uint64_t)a->max_inflight *
		     (sizeof(*a->reqs) + KVP_NOTE_LEN +
		      ng * (2 * a->max_ids * sizeof(uint32_t) +
			    sizeof(struct kvp_ids)));
		m += (uint64_t)(a->pq_mask + 1) * 3 * sizeof(uint32_t);
		m += (uint64_t)a->sq_cap *
		     (sizeof(*a->swr) + a->max_sge * sizeof(*a->ssge) +
		      2 * sizeof(*a->dirty));
		m += (uint64_t)a->max_peers *
		     (sizeof(*a->engs) + sizeof(*a->pcache));
		for (i = 0; i < a->max_peers; i++) {
			const struct kvp_eng *e = &a->engs[i];
			const struct kvp_pcache *pc = &a->pcache[i];

			if (pc->plan)
				m += pc->pi.bytes +
				     2ull * pc->pi.nnotify * sizeof(uint32_t);
			if (e->state)
				m += (uint64_t)e->n * (sizeof(*e->addr) +
						      sizeof(*e->rank_conn));
			if (e->sprog) /* streaming, once up */
				m += (uint64_t)e->pc->pi.nsrc *
				     (a->max_inflight * sizeof(*e->sprog) +
				      sizeof(*e->src_note));
		}
	}
	for (i = kvp__slot_next(a, 0); i < a->nconns;
	     i = kvp__slot_next(a, i + 1)) {
		const struct kvp_conn *c = &a->conns[i];

		m += c->blob_len;
		m += (uint64_t)c->notes_n * KVP_NOTE_LEN;
		if (c->chunks)
			m += (uint64_t)(a->chunk_mask + 1) *
			     (sizeof(*c->chunks) + sizeof(*c->lw));
		if (c->marks)
			m += (uint64_t)(a->sq_depth + 1) * sizeof(*c->marks);
	}
	return m;
}

/* Peer ranks connected and queue pairs open now: a walk of the slots
 * (stats are not the hot path). A producer's consumer rank counts once
 * (its first live QP); a consumer's producer rank when its first QP is
 * READY. */
static void live_counts(const kvp_agent *a, struct kvp_agent_stats *st)
{
	uint32_t i, r;

	st->peers = st->qps = 0;
	for (i = kvp__slot_next(a, 0); i < a->nconns;
	     i = kvp__slot_next(a, i + 1)) {
		const struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_FREE)
			continue;
		st->qps++;
		st->peers += c->side == KVP_ROLE_PRODUCER && c->rank_head &&
			     c->state == CS_READY;
	}
	for (i = 0; a->consumer && a->engs && i < a->max_peers; i++) {
		const struct kvp_eng *e = &a->engs[i];

		for (r = 0; e->state && e->rank_conn && r < e->n; r++) {
			uint32_t ci = e->rank_conn[r * e->nq];

			st->peers += ci != NO_CONN &&
				     a->conns[ci].state == CS_READY;
		}
	}
}

void kvp_agent_get_stats(const kvp_agent *a, struct kvp_agent_stats *st)
{
	if (!a || !st)
		return;
	*st = a->st;
	st->mem_bytes = mem_bytes(a);
	st->srq_bufs = a->srq_n;
	st->srq_last_wqe = a->srq_last_wqe;
	live_counts(a, st);
}

int kvp_agent_fds(const kvp_agent *a, int *fds, int max)
{
	const int all[KVP_AGENT_FDS] = { a ? a->cch->fd : -1,
					 a ? a->ech->fd : -1,
					 a ? a->ctx->async_fd : -1 };
	int i;

	if (!a || max < 0 || (max && !fds))
		return -EINVAL;
	for (i = 0; i < max && i < KVP_AGENT_FDS; i++)
		fds[i] = all[i];
	return KVP_AGENT_FDS;
}

/* The device's asynchronous events: a QP in error fails its connection
 * (its engine, on a consumer), a port or the device failing fails every
 * connection. At most 8 per call. */
static void async_events(kvp_agent *a)
{
	struct kvp_async ev;
	uint32_t i;
	int k, err;

	for (k = 0; k < 8 && kvp__get_async_event(a->ctx, &ev) > 0; k++) {
		switch (ev.type) {
		case IBV_EVENT_QP_FATAL:
		case IBV_EVENT_QP_REQ_ERR:
		case IBV_EVENT_QP_ACCESS_ERR:
		case IBV_EVENT_PATH_MIG_ERR:
			for (i = kvp__slot_next(a, 0); i < a->nconns;
			     i = kvp__slot_next(a, i + 1))
				if (a->conns[i].qp == ev.qp)
					kvp__conn_fail(a, &a->conns[i], -EIO);
			a->st.async_errors++;
			break;
		case IBV_EVENT_QP_LAST_WQE_REACHED:
			for (i = kvp__slot_next(a, 0); i < a->nconns;
			     i = kvp__slot_next(a, i + 1))
				if (a->conns[i].qp == ev.qp)
					kvp__conn_last_wqe(a, &a->conns[i], 1);
			break;
		case IBV_EVENT_PORT_ERR:
		case IBV_EVENT_DEVICE_FATAL:
			err = ev.type == IBV_EVENT_PORT_ERR ? -ENETDOWN :
							      -ENODEV;
			for (i = kvp__slot_next(a, 0); i < a->nconns;
			     i = kvp__slot_next(a, i + 1))
				kvp__conn_fail(a, &a->conns[i], err);
			a->st.async_errors++;
			break;
		default:
			break;
		}
	}
}

/* ---- completions -------------------------------------------------------- */

static void dispatch(kvp_agent *a, const struct ibv_wc *wc)
{
	uint32_t kind = WRID_KIND(wc->wr_id), ci = WRID_CONN(wc->wr_id);
	struct kvp_conn *c;

	if (kind == WK_SRQ_RECV) {
		kvp__srq_wc(a, wc); /* names no slot: its QP does */
		return;
	}
	if (kvp_unlikely(ci >= a->nconns))
		return;
	c = &a->conns[ci];
	if (kvp_unlikely(WRID_GEN(wc->wr_id) != (c->gen & 0xff) ||
			 c->state == CS_FREE))
		return; /* a completion of a connection slot's past life */
	switch (kind) {
	case WK_READ:
	case WK_SIGNAL:
	case WK_NOTE:
	case WK_LAST:
	case WK_CREDIT:
	case WK_FOLLOW:
	case WK_SMARK:
	case WK_LEASE:
		kvp__send_wc(a, c, wc);
		break;
	case WK_DRAIN_SQ:
	case WK_DRAIN_RQ:
		if (c->state == CS_DRAINING && c->drains && !--c->drains)
			kvp__conn_drained(a, c);
		break;
	case WK_META_SEND:
	case WK_META_RECV:
	case WK_CTL_SEND:
	case WK_CTL_RECV:
		if (c->state >= CS_DRAINING)
			break;
		if (wc->status != IBV_WC_SUCCESS)
			kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
		else if (c->side == KVP_ROLE_PRODUCER)
			kvp__producer_wc(a, c, wc);
		else
			kvp__consumer_wc(a, c, wc);
		break;
	case WK_PROBE:
		kvp__probe_wc(a, c, wc);
		break;
	case WK_BYE:
		c->bye_sent = 0;
		break;
	case WK_NOTE_RECV:
		kvp__note_wc(a, c, wc);
		break;
	case WK_PROGRESS:
		kvp__progress_wc(a, c, wc);
		break;
	default:
		break;
	}
}

/* Polls the CQs in arrays of 32, CQ_BATCHES x 32 completions a call in
 * all (the CQ it starts with turns, so that none waits for the others). */
static int cq_drain(kvp_agent *a)
{
	int b = 0, i, n, total = 0;
	uint32_t j, k;

	a->in_drain = 1;
	for (j = 0; j < a->ncq && b < CQ_BATCHES; j++) {
		k = (a->cq_next + j) % a->ncq;
		for (; a->cqs[k] && b < CQ_BATCHES; b++) {
			n = kvp__poll_cq(a->cqs[k], 32, a->wc);
			if (kvp_unlikely(n < 0)) {
				a->in_drain = 0;
				return n; /* the CQ failed: overrun,
					   * device error */
			}
			if (!n)
				break;
			for (i = 0; i < n; i++)
				dispatch(a, &a->wc[i]);
			total += n;
			if (n < 32) {
				b++;
				break;
			}
		}
	}
	a->in_drain = 0;
	if (a->ncq)
		a->cq_next = (a->cq_next + 1) % a->ncq;
	/* The credit given for the messages taken, published now: not
	 * during the drain, so that a message taken in it was sent knowing
	 * at most what was published before (credit.h's exact rule). */
	if (a->ncr_dirty)
		kvp__srq_publish(a);
	return total;
}

/* Posts what waits for send queue room on every live consumer
 * connection. */
static void flush_backlog(kvp_agent *a)
{
	uint32_t i;

	for (i = a->nprod; i < a->cons_end; i++) {
		struct kvp_conn *c = &a->conns[i];

		if (c->state == CS_READY &&
		    (c->c_post != c->c_tail || c->lw_post != c->lw_tail ||
		     (!c->q && c->c_note != c->c_post)))
			kvp__conn_flush(a, c);
	}
}

/* ---- rdma_cm events ------------------------------------------------------ */

/* Hands rdma_cm events to the side that owns their connection, at most
 * `budget`, and none past until_ns but the first. A connect request goes
 * to the producer side. A peer that disconnects once its last message is
 * delivered (a producer's refusal, either side's BYE) has that message in
 * the CQ before the event: the CQ is drained first, so that what the peer
 * said wins over the disconnect. */
static void cm_events(kvp_agent *a, int budget, uint64_t until_ns)
{
	struct rdma_cm_event *ev;
	enum rdma_cm_event_type type;
	struct rdma_cm_id *id;
	struct kvp_conn *c;
	uint8_t pdata[256], rr;
	uint32_t plen;
	int i;

	for (i = 0; i < budget; i++) {
		/* Past the poll's time budget: the rest waits for the next
		 * poll (one event at least per call). */
		if (i && kvp__now_ns() >= until_ns)
			return;
		/* Each event queues at most one DISCONNECTED; request events
		 * keep their reserve. */
		if (kvp__ev_room(a) <= (int)a->max_inflight + 2)
			return;
		if (kvp__get_cm_event(a->ech, &ev) <= 0)
			return;
		/* What we act on is copied, so that the event can be
		 * acknowledged first: destroying an id waits for its events'
		 * acks. */
		type = ev->event;
		id = ev->id;
		plen = 0;
		if (ev->param.conn.private_data) {
			plen = ev->param.conn.private_data_len;
			if (plen > sizeof(pdata))
				plen = sizeof(pdata);
			memcpy(pdata, ev->param.conn.private_data, plen);
		}
		rr = ev->param.conn.responder_resources;
		kvp__ack_event(ev);

		if (type == RDMA_CM_EVENT_CONNECT_REQUEST) {
			if (!a->producer || !a->listening) {
				kvp__destroy_id(id);
				continue;
			}
			/* A QP's creation is the dearest thing a peer can
			 * ask of a poll: one per call. Refusals are cheap. */
			if (kvp__accept_conn(a, id, pdata, plen, rr))
				return;
			continue;
		}
		if (!id || !id->context)
			continue; /* the listening id */
		c = id->context;
		if (type == RDMA_CM_EVENT_DISCONNECTED &&
		    (c->state == CS_READY ||
		     (c->side == KVP_ROLE_CONSUMER &&
		      c->state == CS_HANDSHAKE))) {
			(void)cq_drain(a);
			if (c->state != CS_READY && c->state != CS_HANDSHAKE)
				continue; /* failed or closed meanwhile */
		}
		if (c->side == KVP_ROLE_CONSUMER)
			kvp__consumer_event(a, c, type, pdata, plen);
		else
			kvp__producer_event(a, c, type);
	}
}

int kvp_agent_poll(kvp_agent *a, struct kvp_event *ev, int max)
{
	uint64_t now;
	int n = 0, worked;

	if (!a || max < 0 || (max && !ev))
		return -EINVAL;
	if (a->consumer)
		kvp__req_reap(a);
	a->costly_left = COSTLY_BUDGET;
	now = kvp__now_ns();
	if (a->armed) {
		while (kvp__get_cq_event(a->cch) > 0)
			;
		a->armed = 0;
		a->next_cm_ns = 0;
		a->next_timer_ns = 0;
	}
	n = cq_drain(a);
	if (kvp_unlikely(n < 0))
		return n;
	worked = n;
	if (a->nsreq)
		kvp__stream_scan(a, now);
	if (n && a->consumer)
		flush_backlog(a);
	n = 0;
	if (a->npending)
		kvp__blob_check_one(a);
	if (a->nauth_wait)
		kvp__auth_step(a);
	if (a->nfol_wait)
		kvp__fol_register(a);
	/* One rdma_cm event at least, more while the poll's time lasts. */
	if (now >= a->next_cm_ns) {
		async_events(a);
		cm_events(a, CM_BUDGET, now + POLL_BUDGET_NS);
		/* Every TIMER_INTERVAL_NS while busy polling (a walk of the
		 * slots), at once after a sleep (arm's wake is a deadline). */
		if (now >= a->next_timer_ns) {
			kvp__conn_timers(a, now);
			a->next_timer_ns = now + TIMER_INTERVAL_NS;
		}
		if (a->producer && now >= a->idle_at)
			kvp__idle_sweep(a, now);
		if (a->wq_n)
			(void)kvp__accept_waiting(a, now);
		if (a->consumer)
			kvp__pull_timers(a, now);
		a->next_cm_ns = now + CM_INTERVAL_NS;
	}
	if (a->consumer && a->nconnecting)
		kvp__engines_step(a, now);
	if (a->producer)
		kvp__serve_timers(a, now);
	while (n < max && a->ev_head != a->ev_tail) {
		struct kvp_event *e = &a->evq[a->ev_head % a->ev_cap];

		ev[n] = *e;
		a->ev_head++;
		if (e->type == KVP_EV_DONE || e->type == KVP_EV_FAILED)
			kvp__req_delivered(a, &ev[n]);
		else if (e->type == KVP_EV_RELEASED ||
			 e->type == KVP_EV_EXPIRED)
			a->nheld--;
		n++;
	}
	/* A producer's polls that took completions or hand out events. */
	if (a->producer && (worked || n))
		kvp__hist_add(&a->obs.poll, kvp__now_ns() - now);
	return n;
}

int kvp_agent_arm(kvp_agent *a, uint64_t *wake_ns)
{
	uint64_t wake = UINT64_MAX, now = kvp__now_ns();
	uint32_t i, k;
	int err, n;

	if (!a || !wake_ns)
		return -EINVAL;
	if (a->producer)
		wake = a->next_deadline < a->idle_at ? a->next_deadline :
						       a->idle_at;
	/* Connect requests waiting: for a poll's costly step (at once, while
	 * handshakes have room), or for a handshake slot (each handshake's
	 * end raises an event; the oldest's bound does not). */
	if (a->wq_n && a->nhalf < a->max_half_open)
		wake = now;
	/* AUTHs and follower records to register: a poll's costly step, at
	 * once. */
	if (a->nfol_wait || a->nauth_wait)
		wake = now;
	if (a->wq_n && a->wq[a->wq_head].since + a->handshake_ns < wake)
		wake = a->wq[a->wq_head].since + a->handshake_ns;
	for (i = kvp__slot_next(a, 0); i < a->nconns;
	     i = kvp__slot_next(a, i + 1)) {
		const struct kvp_conn *c = &a->conns[i];

		/* Drain and handshake bounds (kvp__conn_timers()). */
		if ((c->state == CS_DRAINING || kvp__half_open(c)) &&
		    c->drain_deadline < wake)
			wake = c->drain_deadline;
		/* The liveness probe of a consumer rank. */
		if (c->side == KVP_ROLE_PRODUCER && c->state == CS_READY &&
		    c->rank_head && c->probe_at < wake)
			wake = c->probe_at;
		/* A notification waiting for credit: the counter is read
		 * again each millisecond. */
		if (c->side == KVP_ROLE_CONSUMER && c->state == CS_READY &&
		    c->starved && now + CM_INTERVAL_NS < wake)
			wake = now + CM_INTERVAL_NS;
	}
	for (i = 0; a->consumer && i < a->max_peers; i++) {
		const struct kvp_eng *e = &a->engs[i];

		/* Its deadline, and the retry times of queue pairs a full
		 * producer refused. */
		if (e->state == KVP_ENGINE_CONNECTING &&
		    kvp__engine_wake(e) < wake)
			wake = kvp__engine_wake(e);
	}
	/* A streamed request learns of progress from records the producer
	 * WRITEs, which raise no completion: poll again within 100 us. */
	if (a->nsreq && now + 100000 < wake)
		wake = now + 100000;
	/* The oldest pull's stall bound. */
	if (a->consumer && a->pq_head != a->pq_tail) {
		const struct kvp_req *r = &a->reqs[a->pq[a->pq_head & a->pq_mask]];

		if (r->t0 + a->stall_ns < wake)
			wake = r->t0 + a->stall_ns;
	}
	*wake_ns = wake;
	for (k = 0; k < a->ncq; k++) {
		err = a->cqs[k] ? kvp__req_notify_cq(a->cqs[k]) : 0;
		if (err)
			return err;
	}
	a->armed = 1;
	/* Completions that arrived before arming raise no event: drained
	 * here, they may have moved a handshake on (a connection READY, its
	 * engine not yet UP: kvp__engines_step() runs in the poll) or left
	 * more behind, so the caller polls again instead of sleeping. */
	n = cq_drain(a);
	if (n < 0)
		return n;
	if (n > 0 && a->consumer)
		flush_backlog(a);
	return n > 0 || a->ev_head != a->ev_tail || a->npending ? 1 : 0;
}

/* ---- kvp_agent_connect(): one engine, blocking ---------------------------- */

/* Runs the poll's steps for the connections until engine e is up or down,
 * or the deadline passes: completions before rdma_cm events, as in
 * kvp_agent_poll(). Events of a quiet engine are not queued. */
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
		a->costly_left = COSTLY_BUDGET;
		(void)cq_drain(a);
		cm_events(a, 64, UINT64_MAX);
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
	err = kvp__engine_check_ranks(a, ranks, n);
	if (err || timeout_ms <= 0)
		return kvp__call_err(&a->last, err ? err : -EINVAL);
	if (a->def_eng)
		return kvp__call_err(&a->last, -EISCONN);
	err = kvp__engine_add(a, ranks, n, (uint32_t)timeout_ms, 1, &h);
	if (err)
		return kvp__call_err(&a->last, err);
	e = kvp__engine_get(a, h);
	/* The drain after a failure is bounded too (2 s). */
	err = wait_engine(a, e, e->deadline);
	if (err) {
		a->last = e->why;
		kvp__engine_drop(a, e);
		return kvp__call_err(&a->last, err);
	}
	e->quiet = 0;
	a->def_eng = h;
	return 0;
}
