// SPDX-License-Identifier: MIT
/*
 * Device and port limits (see limits.h). No verbs call: the attributes
 * come from ibv_query_device() and ibv_query_port() in agent.c, or from a
 * test.
 */
#include <errno.h>

#include "limits.h"

#define MIN_SQ 4
#define MIN_RQ 8

static uint32_t min32(uint32_t a, uint32_t b)
{
	return a < b ? a : b;
}

/* A device attribute (an int) as a bound: negative reads as 0. */
static uint32_t dev(int v)
{
	return v > 0 ? (uint32_t)v : 0;
}

/* Completion entries one QP may need at once. Consumer QP: its send
 * queue, and receives for the handshake's control message, the blob and
 * the drain marker, one spare. Producer QP: its sends, the notification
 * buffers, the control receive and the drain marker. */
static uint32_t cons_need(uint32_t sq)
{
	return sq + 5;
}

static uint32_t prod_need(const struct kvp_want *w, uint32_t rq)
{
	return w->prod_sq + (w->srq_bufs ? 0 : rq) + 2;
}

/* CQs for n QPs of `need` entries each in CQs of `cqe`: 0 when none fits
 * one. *per: QPs per CQ. */
static uint32_t cqs_for(uint32_t n, uint64_t need, uint64_t cqe,
			uint32_t *per)
{
	uint64_t k = cqe > KVP_CQ_SPARE ? (cqe - KVP_CQ_SPARE) / need : 0;

	*per = k > n ? n : (uint32_t)k;
	if (!n)
		return 0;
	return *per ? (n + *per - 1) / *per : UINT32_MAX;
}

/* The CQs the queues need, or UINT32_MAX when they do not fit. */
static uint32_t cqs_need(const struct kvp_want *w, uint32_t sq, uint32_t rq,
			 uint64_t cqe, struct kvp_limits *out)
{
	uint32_t np = cqs_for(w->nprod, prod_need(w, rq),
			      cqe > w->srq_bufs ? cqe - w->srq_bufs : 0,
			      &out->prod_per_cq);
	uint32_t nc = cqs_for(w->ncons, cons_need(sq), cqe,
			      &out->cons_per_cq);

	out->ncq_prod = np;
	out->ncq_cons = nc;
	return np == UINT32_MAX || nc == UINT32_MAX ? UINT32_MAX : np + nc;
}

int kvp__limits(const struct ibv_device_attr *d, const struct ibv_port_attr *p,
		int iwarp, const struct kvp_want *w, struct kvp_limits *out)
{
	uint32_t qp_wr = dev(d->max_qp_wr), sge, sge_rd, len;
	uint32_t sq, rq, maxcq = KVP_MAX_CQS;
	uint64_t cqe = dev(d->max_cqe);

	if (qp_wr < MIN_SQ || (w->producer && qp_wr < w->prod_sq + 2))
		return -ENODEV;
	if (d->max_cq > 0 && (uint32_t)d->max_cq < maxcq)
		maxcq = (uint32_t)d->max_cq;
	sq = min32(w->sq_depth, qp_wr);
	if (sq < MIN_SQ)
		sq = MIN_SQ;
	rq = w->rq_depth ? min32(w->rq_depth, qp_wr - 2) : 0;
	/* As many CQs as the QPs need; beyond the most allowed, shrink
	 * the queues rather than let a CQ overrun (an overrun is fatal to
	 * every connection on it). */
	while (cqs_need(w, w->ncons ? sq : 0, w->nprod ? rq : 0, cqe, out) >
	       maxcq) {
		if (w->ncons && sq > MIN_SQ && (sq >= rq || rq <= MIN_RQ))
			sq = sq / 2 > MIN_SQ ? sq / 2 : MIN_SQ;
		else if (w->nprod && rq > MIN_RQ)
			rq = rq / 2 > MIN_RQ ? rq / 2 : MIN_RQ;
		else
			return -ENODEV;
	}
	out->prod_cqe = w->nprod ? prod_need(w, rq) : 0;
	out->prod_cq_extra = w->nprod ? w->srq_bufs : 0;
	out->cons_cqe = w->ncons ? cons_need(sq) : 0;
	sge = dev(d->max_sge);
	/* max_sge_rd: 0 on providers that do not report it (the same as
	 * max_sge then). */
	sge_rd = d->max_sge_rd > 0 ? dev(d->max_sge_rd) : sge;
	sge = min32(min32(w->max_sge, sge), sge_rd);
	if (w->consumer && !sge)
		return -ENODEV;
	len = KVP_MAX_WR_LEN;
	if (p && p->max_msg_sz)
		len = min32(len, p->max_msg_sz);
	if (w->max_read)
		len = min32(len, w->max_read);
	/* 0: a provider that does not say; no cap then. */
	out->max_mr = d->max_mr_size ? d->max_mr_size : UINT64_MAX;
	if (w->max_mr && w->max_mr < out->max_mr)
		out->max_mr = w->max_mr;
	out->sq_depth = sq;
	out->rq_depth = rq;
	out->max_sge = sge;
	out->max_len = len;
	out->rd_atom = min32(dev(d->max_qp_init_rd_atom), 255);
	out->resp_res = min32(dev(d->max_qp_rd_atom), 255);
	if (w->consumer && !out->rd_atom)
		return -ENODEV; /* cannot READ */
	if (w->producer && !out->resp_res)
		return -ENODEV; /* cannot be READ from */
	out->cqe = (uint32_t)(KVP_CQ_SPARE * (out->ncq_prod + out->ncq_cons) +
			      (uint64_t)out->ncq_prod * out->prod_cq_extra +
			      (uint64_t)w->nprod * out->prod_cqe +
			      (uint64_t)w->ncons * out->cons_cqe);
	/* Relaxed ordering is an optional flag: providers that cannot do
	 * it ignore it; PCIe devices (and GPU memory behind them) gain
	 * from it. Completions stay ordered after the data. */
	out->sink_access = IBV_ACCESS_LOCAL_WRITE |
			   (iwarp ? IBV_ACCESS_REMOTE_WRITE : 0) |
			   IBV_ACCESS_RELAXED_ORDERING;
	out->src_access = IBV_ACCESS_REMOTE_READ | IBV_ACCESS_RELAXED_ORDERING;
	return 0;
}

uint32_t kvp__sq_usable(uint32_t asked, const struct ibv_qp_cap *got)
{
	return got->max_send_wr && got->max_send_wr < asked ?
		       got->max_send_wr : asked;
}

int kvp__create_qp_fit(int (*create)(void *arg, struct ibv_qp_init_attr *qa),
		       void *arg, struct ibv_qp_init_attr *qa,
		       uint32_t *asked)
{
	const struct ibv_qp_cap want = qa->cap;
	uint32_t wr = want.max_send_wr;
	int err, in = want.max_inline_data != 0;

	for (;;) {
		/* create() may have changed the caps of a refused attempt. */
		qa->cap = want;
		qa->cap.max_send_wr = wr;
		qa->cap.max_inline_data = in ? want.max_inline_data : 0;
		err = create(arg, qa);
		if (!err) {
			*asked = wr;
			return 0;
		}
		if (in) {
			in = 0;
		} else if (wr / 2 >= MIN_SQ) {
			wr /= 2;
			in = want.max_inline_data != 0;
		} else {
			return err;
		}
	}
}

int kvp__mr_shift(uint64_t size, uint64_t max_mr)
{
	uint32_t s;

	if (size <= max_mr)
		return 0;
	for (s = KVP_MR_SHIFT_MAX; s >= KVP_MR_SHIFT_MIN; s--)
		if ((1ull << s) + KVP_MR_WINDOW(s) <= max_mr)
			break;
	if (s < KVP_MR_SHIFT_MIN ||
	    kvp__mr_count(size, s) > KVP_MR_MAX_KEYS)
		return -EINVAL;
	return (int)s;
}
