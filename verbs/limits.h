/* SPDX-License-Identifier: MIT */
/*
 * Device and port limits, obeyed by construction: what an agent asks for,
 * cut to what the device says it can do. Pure (the structs only, no verbs
 * call), so tests/test_limits.c checks it against faked attributes of
 * ConnectX, iWARP (cxgb4), hns, EFA-like and soft-RoCE devices.
 */
#ifndef KVP_VERBS_LIMITS_H
#define KVP_VERBS_LIMITS_H

#include <stdint.h>

#include <infiniband/verbs.h>

#include "kvpull.h"

/* What the agent asks for, its defaults applied. */
struct kvp_want {
	uint32_t nprod, ncons;	/* connection slots of each side */
	uint32_t sq_depth;	/* consumer: send queue entries per QP */
	uint32_t rq_depth;	/* producer: notification buffers per QP */
	uint32_t prod_sq;	/* producer: send queue entries per QP */
	uint32_t max_sge;	/* consumer: local SGEs per READ */
	uint32_t max_read;	/* consumer: bytes per READ, 0: no slice */
	uint64_t max_mr;	/* bytes per MR at most, 0: the device's */
	uint32_t producer, consumer;
	/* producer: buffers of its shared receive queue (0: a receive
	 * queue per QP). Any of them may complete on any producer CQ (a
	 * consumer that ignores its credit drains the queue through one
	 * QP): each producer CQ has room for all of them beyond its QPs'
	 * sends, and the QPs need none for receives. */
	uint32_t srq_bufs;
};

/* What it gets. */
struct kvp_limits {
	uint32_t sq_depth;	/* consumer QPs' send queue entries */
	uint32_t rq_depth;	/* producer QPs' notification buffers */
	uint32_t max_sge;	/* SGEs per READ: the device's max_sge and,
				 * for READs, max_sge_rd (cxgb4 and older
				 * hns report 1) */
	uint32_t max_len;	/* bytes per READ: the port's max_msg_sz,
				 * the slice asked for, at most 2^31 */
	uint32_t rd_atom;	/* READs in flight per QP (initiator depth) */
	uint32_t resp_res;	/* incoming READs per QP (responder) */
	uint32_t cqe;		/* completion queue entries over every CQ:
				 * what every QP can complete at once */
	/* The CQs: the producer's slots first, prod_per_cq QPs each (the
	 * last CQ may serve fewer), then the consumer's, cons_per_cq each;
	 * a CQ of n QPs has 16 + n x (its side's need per QP) entries, at
	 * most the device's max_cqe. */
	uint32_t ncq_prod, ncq_cons;
	uint32_t prod_per_cq, cons_per_cq;
	uint32_t prod_cqe, cons_cqe; /* entries per QP of each side */
	uint32_t prod_cq_extra;	/* entries each producer CQ has beyond
				 * 16 + n x prod_cqe: the SRQ's buffers */
	uint64_t max_mr;	/* bytes one MR may cover: the device's
				 * max_mr_size, or less if asked */
	int sink_access;	/* consumer memory: local write (and remote
				 * write on iWARP, where a READ's response
				 * lands as an RDMA WRITE) */
	int src_access;		/* producer memory: remote read */
};

#define KVP_MAX_WR_LEN (1u << 31) /* IB's largest message */

#define KVP_MAX_CQS 64 /* CQs of an agent at most */
#define KVP_CQ_SPARE 16 /* entries each CQ has beyond its QPs' */

/* Cuts *w down to device d's and port p's limits into *out. iwarp: the
 * device's transport is iWARP. The QPs are spread over as many CQs of
 * the device's max_cqe as their completions need, at most KVP_MAX_CQS
 * and the device's max_cq (0: not said); only when that many cannot hold
 * them do the queue depths shrink (to at least 4 send entries and 8
 * notification buffers). Returns 0, or -ENODEV for a device that cannot
 * serve at all (no READ in flight, no SGE, queues or CQs too small for
 * the slots asked: ask for fewer max_qps). */
int kvp__limits(const struct ibv_device_attr *d, const struct ibv_port_attr *p,
		int iwarp, const struct kvp_want *w, struct kvp_limits *out);

/* The send queue entries a QP really has: what was asked for, or less if
 * the provider returned less (it may count WQE blocks, not WRs). */
uint32_t kvp__sq_usable(uint32_t asked, const struct ibv_qp_cap *got);

/* Creates a QP of attributes *qa through create(arg, qa) (rdma_create_qp()
 * in the agent, a model of a provider in the tests), smaller until the
 * provider accepts: a refused attempt is retried without inline data
 * (notifications are then sent from registered memory), then with the send
 * queue halved and inline data asked again, down to 4 send entries. SGEs
 * and receive entries never shrink. mlx5 sizes each WQE for max_send_sge
 * and refuses a send queue of more WQE blocks than it has (EINVAL): 8,192
 * entries of 16 SGEs (320-byte WQEs) do not fit ConnectX's 32,768 blocks,
 * 4,096 do. Returns 0 with the QP's caps in qa->cap (as create() left them)
 * and the send entries asked for by the attempt that succeeded in *asked
 * (see kvp__sq_usable()); or the last attempt's error. At most
 * 2 * 30 attempts. */
int kvp__create_qp_fit(int (*create)(void *arg, struct ibv_qp_init_attr *qa),
		       void *arg, struct ibv_qp_init_attr *qa,
		       uint32_t *asked);

/* How many MRs of stride 2^shift a region of `size` bytes takes. */
static inline uint64_t kvp__mr_count(uint64_t size, uint32_t shift)
{
	return (size >> shift) + !!(size & ((1ull << shift) - 1));
}

/* How a region of `size` bytes is registered when one MR may cover at
 * most max_mr bytes: 0 when one MR does; else the log2 s of the MR
 * stride, the largest with 2^s + KVP_MR_WINDOW(s) <= max_mr (MR k covers
 * [k << s, (k + 1) << s + KVP_MR_WINDOW(s)), clipped at the region's
 * end, so any access of at most KVP_MR_WINDOW(s) bytes lies in the MR it
 * starts in); -EINVAL when no stride fits (max_mr below 36 KiB) or more
 * than KVP_MR_MAX_KEYS MRs would be needed. */
int kvp__mr_shift(uint64_t size, uint64_t max_mr);

#endif
