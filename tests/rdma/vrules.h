/* SPDX-License-Identifier: MIT */
/*
 * Verbs rules soft-RoCE does not enforce, checked in the VM: a process
 * (a consumer rank of the harness) puts these wrappers under the verbs
 * calls rdma-core inlines through each device context's ops
 * (ibv_post_send(), ibv_post_recv(), ibv_poll_cq(): ctx->ops.*), for every
 * context librdmacm hands out, before it opens its agent. They pass every
 * call through and check:
 *
 *  - R1: an RDMA READ never lands in a receive buffer that is posted and
 *    not yet completed (on a NIC the two DMA writes race: the message or
 *    the READ's bytes are lost, silently; rxe happens to serialize them).
 *    A receive buffer is posted from its ibv_post_recv() until a
 *    completion with its (QP, wr_id) is polled, a flush included.
 *
 * vr_install() before the agent opens; vr_report() at the end: 0, or -1
 * with the first broken rule printed. One process, one thread: the
 * wrappers keep plain static tables.
 */
#ifndef KVP_TEST_VRULES_H
#define KVP_TEST_VRULES_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#define VR_MAX_CTX 8
#define VR_MAX_RECV 4096

struct vr_recv {
	uint32_t qp_num;
	uint64_t wr_id, addr;
	uint32_t len;
};

static struct {
	struct ibv_context *ctx[VR_MAX_CTX];
	struct ibv_context_ops orig[VR_MAX_CTX];
	uint32_t nctx;
	struct vr_recv recv[VR_MAX_RECV];
	uint32_t nrecv;
	uint64_t reads, recvs, broken;
	int overflow;
	char first[192];
} vr;

static inline const struct ibv_context_ops *vr_orig(struct ibv_context *ctx)
{
	uint32_t i;

	for (i = 0; i < vr.nctx; i++)
		if (vr.ctx[i] == ctx)
			return &vr.orig[i];
	return NULL; /* unreachable: only our contexts call in */
}

static inline int vr_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad)
{
	const struct ibv_context_ops *o = vr_orig(qp->context);
	struct ibv_recv_wr *w;
	int err = o->post_recv(qp, wr, bad);

	for (w = wr; w; w = w->next) {
		if (err && bad && w == *bad)
			break; /* this one and those after it: not posted */
		if (w->num_sge < 1)
			continue;
		if (vr.nrecv == VR_MAX_RECV) {
			vr.overflow = 1;
			break;
		}
		vr.recv[vr.nrecv++] = (struct vr_recv){
			qp->qp_num, w->wr_id, w->sg_list[0].addr,
			w->sg_list[0].length
		};
		vr.recvs++;
	}
	return err;
}

static inline int vr_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			struct ibv_send_wr **bad)
{
	const struct ibv_context_ops *o = vr_orig(qp->context);
	struct ibv_send_wr *w;
	uint32_t i;
	int g;

	for (w = wr; w; w = w->next) {
		if (w->opcode != IBV_WR_RDMA_READ)
			continue;
		vr.reads++;
		for (g = 0; g < w->num_sge; g++) {
			uint64_t lo = w->sg_list[g].addr;
			uint64_t hi = lo + w->sg_list[g].length;

			for (i = 0; i < vr.nrecv; i++)
				if (lo < vr.recv[i].addr + vr.recv[i].len &&
				    vr.recv[i].addr < hi) {
					if (vr.broken++)
						continue;
					snprintf(vr.first, sizeof(vr.first),
						 "R1: a READ of %llu bytes "
						 "lands at %#llx, inside a "
						 "receive buffer posted on "
						 "QP %u (%u bytes)",
						 (unsigned long long)(hi - lo),
						 (unsigned long long)lo,
						 vr.recv[i].qp_num,
						 vr.recv[i].len);
				}
		}
	}
	return o->post_send(qp, wr, bad);
}

static inline int vr_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	const struct ibv_context_ops *o = vr_orig(cq->context);
	int k = o->poll_cq(cq, n, wc), j;
	uint32_t i;

	for (j = 0; j < k; j++)
		for (i = 0; i < vr.nrecv; i++)
			if (vr.recv[i].qp_num == wc[j].qp_num &&
			    vr.recv[i].wr_id == wc[j].wr_id) {
				vr.recv[i] = vr.recv[--vr.nrecv];
				break;
			}
	return k;
}

/* Wraps the ops of every context librdmacm knows (those its ids use). */
static inline int vr_install(void)
{
	struct ibv_context **list;
	int n = 0, i;

	list = rdma_get_devices(&n);
	if (!list)
		return -1;
	for (i = 0; i < n && vr.nctx < VR_MAX_CTX; i++) {
		struct ibv_context *ctx = list[i];

		vr.ctx[vr.nctx] = ctx;
		vr.orig[vr.nctx++] = ctx->ops;
		ctx->ops.post_recv = vr_post_recv;
		ctx->ops.post_send = vr_post_send;
		ctx->ops.poll_cq = vr_poll_cq;
	}
	/* Only the array goes: librdmacm keeps the contexts open. */
	rdma_free_devices(list);
	return 0;
}

/* 0 when no rule broke; else -1, the first broken rule printed. */
static inline int vr_report(const char *who)
{
	if (vr.overflow) {
		printf("  [%s] verbs rules: more than %u receive buffers "
		       "posted at once\n", who, VR_MAX_RECV);
		return -1;
	}
	if (vr.broken) {
		printf("  [%s] verbs rules broken %llu times (%llu READs, "
		       "%llu receives): %s\n", who,
		       (unsigned long long)vr.broken,
		       (unsigned long long)vr.reads,
		       (unsigned long long)vr.recvs, vr.first);
		return -1;
	}
	return 0;
}

#endif
