// SPDX-License-Identifier: MIT
/*
 * The producer's shared receive queue: where every message a consumer
 * sends (AUTH, notifications, FOLLOW, TABLE, GIVE, BYE: KVP_CTL_LEN bytes
 * at most, the blob being READ) lands, whatever the number of queue pairs.
 *
 * Credits keep it from ever running dry for consumers that keep to them
 * (the rules: credit.h, pure arithmetic, tests/test_credit.c). Each slot
 * taken brings KVP_CREDIT_OWN buffers (its AUTH, then its own credits: a
 * rank's first queue pair can always send TABLE and FOLLOW at once); a
 * pool of srq_pool more is lent to first queue pairs, a fair share each.
 * One that sends past its credit is dropped at the first message past it
 * (listen.c); until then it may empty the queue, and other consumers'
 * messages meet RNR NAKs and are retried (6 times, 1.28 ms apart) while
 * the next poll refills it. A connection that has not proved the secret
 * is dropped at any message but its AUTH.
 *
 * Completions name a queue pair, not a slot: qpn_tab maps QP numbers to
 * slots (linear probing, deletion by backward shift). Buffers are
 * registered SRQ_CHUNK at a time as slots are first taken, so that an
 * agent sized for a thousand peers pins the buffers of those it had.
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

uint32_t kvp__srq_want(const kvp_agent *a, uint32_t rq_depth)
{
	const struct ibv_device_attr *d = &a->dattr;
	const uint64_t own = kvp__credit_bufs(a->nprod, 0);
	uint64_t cap;

	if (!a->producer || a->srq_off || d->max_srq <= 0 ||
	    d->max_srq_wr <= 0 || d->max_srq_sge < 1)
		return 0;
	cap = kvp__credit_bufs(a->nprod, 4 * rq_depth);
	cap = (cap + SRQ_CHUNK - 1) / SRQ_CHUNK * SRQ_CHUNK;
	if (cap > (uint64_t)d->max_srq_wr) {
		cap = (uint64_t)d->max_srq_wr / SRQ_CHUNK * SRQ_CHUNK;
		if (cap < own + rq_depth)
			return 0;
	}
	/* Any producer CQ must hold every buffer's completion besides its
	 * QPs' sends: not when that is more than half a CQ. */
	if (d->max_cqe <= 0 ||
	    cap + KVP_CQ_SPARE + 2 * (PROD_SQ + 2) > (uint64_t)d->max_cqe / 2)
		return 0;
	return (uint32_t)cap;
}

static int srq_post(kvp_agent *a, uint32_t i)
{
	struct ibv_recv_wr wr, *bad;
	struct ibv_sge sge;

	sge.addr = (uint64_t)(uintptr_t)(a->srq_buf + (size_t)i * KVP_CTL_LEN);
	sge.length = KVP_CTL_LEN;
	sge.lkey = a->srq_mr[i / SRQ_CHUNK]->lkey;
	memset(&wr, 0, sizeof(wr));
	wr.wr_id = kvp__wrid(WK_SRQ_RECV, 0, 0, i);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return kvp__post_srq_recv(a->srq, &wr, &bad);
}

int kvp__srq_grow(kvp_agent *a, uint32_t n)
{
	while (a->srq_n < n) {
		const uint32_t k = a->srq_n / SRQ_CHUNK;
		uint32_t i;
		int err;

		if (a->srq_full || a->srq_n + SRQ_CHUNK > a->srq_cap)
			return -ENOMEM;
		err = kvp__reg_mr(a->pd,
				  a->srq_buf + (size_t)a->srq_n * KVP_CTL_LEN,
				  SRQ_CHUNK * KVP_CTL_LEN,
				  IBV_ACCESS_LOCAL_WRITE, &a->srq_mr[k]);
		if (err)
			return err;
		for (i = 0; i < SRQ_CHUNK; i++) {
			err = srq_post(a, a->srq_n + i);
			if (err) {
				/* The queue holds what it holds: no more
				 * (the chunk's MR stays, for the buffers
				 * posted; srq_cap keeps counting it). */
				a->srq_n += i;
				a->srq_full = 1;
				return err;
			}
		}
		a->srq_n += SRQ_CHUNK;
	}
	return 0;
}

int kvp__srq_open(kvp_agent *a)
{
	const uint32_t cap = a->srq_cap;
	int err;

	a->srq_pool = cap - (uint32_t)kvp__credit_bufs(a->nprod, 0);
	if (a->srq_pool > 4 * a->rq_depth)
		a->srq_pool = 4 * a->rq_depth;
	kvp__credit_pool_init(&a->crp, a->srq_pool, a->rq_depth);
	a->qpn_mask = kvp__pow2_at_least(2 * a->nprod) - 1;
	/* Reserved, touched a chunk at a time. */
	a->srq_buf = calloc(cap, KVP_CTL_LEN);
	a->srq_mr = calloc(cap / SRQ_CHUNK, sizeof(*a->srq_mr));
	a->qpn_tab = calloc((size_t)a->qpn_mask + 1, sizeof(*a->qpn_tab));
	a->cr_dirty = calloc(a->nprod, sizeof(*a->cr_dirty));
	a->ncr_dirty = 0;
	err = -ENOMEM;
	if (a->srq_buf && a->srq_mr && a->qpn_tab && a->cr_dirty)
		err = kvp__create_srq(a->pd, cap, &a->srq);
	if (!err)
		err = kvp__srq_grow(a, a->srq_pool);
	if (err)
		kvp__srq_close(a);
	return err;
}

void kvp__srq_close(kvp_agent *a)
{
	uint32_t k;

	kvp__destroy_srq(a->srq);
	/* Every chunk registered, a last one posted in part included. */
	for (k = 0; a->srq_mr && k < a->srq_cap / SRQ_CHUNK; k++)
		kvp__dereg_mr(a->srq_mr[k]);
	free(a->srq_mr);
	free(a->srq_buf);
	free(a->qpn_tab);
	free(a->cr_dirty);
	a->srq = NULL;
	a->srq_mr = NULL;
	a->srq_buf = NULL;
	a->qpn_tab = NULL;
	a->cr_dirty = NULL;
	a->srq_n = a->srq_cap = a->srq_pool = a->ncr_dirty = 0;
	kvp__credit_pool_init(&a->crp, 0, 0);
	a->srq_full = 0;
}

void kvp__srq_repost(kvp_agent *a, uint32_t i)
{
	/* A buffer lost (a device failure): the pool shrinks, so that
	 * credits stay within the buffers posted. */
	if (srq_post(a, i) && a->crp.free) {
		a->crp.free--;
		a->crp.pool--;
	}
}

/* ---- QP numbers to slots ------------------------------------------------- */

static uint32_t qpn_home(const kvp_agent *a, uint32_t qpn)
{
	return (uint32_t)kvp__mix64(qpn) & a->qpn_mask;
}

void kvp__qpn_add(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i = qpn_home(a, c->qp->qp_num);

	/* At most nprod entries in at least twice as many. */
	while (a->qpn_tab[i])
		i = (i + 1) & a->qpn_mask;
	a->qpn_tab[i] = c->idx + 1;
}

struct kvp_conn *kvp__qpn_find(kvp_agent *a, uint32_t qpn)
{
	uint32_t i = qpn_home(a, qpn), s;

	while ((s = a->qpn_tab[i]) != 0) {
		struct kvp_conn *c = &a->conns[s - 1];

		if (c->qp && c->qp->qp_num == qpn)
			return c;
		i = (i + 1) & a->qpn_mask;
	}
	return NULL;
}

void kvp__qpn_del(kvp_agent *a, struct kvp_conn *c)
{
	uint32_t i = qpn_home(a, c->qp->qp_num), j, h;

	while (a->qpn_tab[i] && a->qpn_tab[i] != c->idx + 1)
		i = (i + 1) & a->qpn_mask;
	if (!a->qpn_tab[i])
		return;
	/* Backward shift: entries after it that probed past i move up. */
	for (j = (i + 1) & a->qpn_mask; a->qpn_tab[j];
	     j = (j + 1) & a->qpn_mask) {
		h = qpn_home(a, a->conns[a->qpn_tab[j] - 1].qp->qp_num);
		if (((j - h) & a->qpn_mask) >= ((j - i) & a->qpn_mask)) {
			a->qpn_tab[i] = a->qpn_tab[j];
			i = j;
		}
	}
	a->qpn_tab[i] = 0;
}

/* ---- credits -------------------------------------------------------------- */

uint32_t kvp__srq_credits(kvp_agent *a, struct kvp_conn *c, uint32_t qi)
{
	/* (cr_dirty stays: set, c is in the list until the poll ends) */
	return kvp__credit_go(&a->crp, &c->cr, qi == 0);
}

int kvp__srq_took(kvp_agent *a, struct kvp_conn *c, int give, uint32_t n)
{
	int err = kvp__credit_msg(&a->crp, &c->cr, give, n);

	if (!err && c->cr.owed && !c->cr_dirty) {
		c->cr_dirty = 1;
		a->cr_dirty[a->ncr_dirty++] = c->idx;
	}
	return err;
}

void kvp__srq_publish(kvp_agent *a)
{
	uint32_t i;

	for (i = 0; i < a->ncr_dirty; i++) {
		struct kvp_conn *c = &a->conns[a->cr_dirty[i]];

		/* Gone since (its credit reset): nothing to publish. */
		if (c->cr_dirty && c->cr.live)
			a->ctr[c->idx] = kvp__credit_publish(&c->cr);
		c->cr_dirty = 0;
	}
	a->ncr_dirty = 0;
}

void kvp__srq_conn_gone(kvp_agent *a, struct kvp_conn *c)
{
	kvp__credit_gone(&a->crp, &c->cr);
	c->auth_seen = 0;
	if (c->qp)
		kvp__qpn_del(a, c);
}
