// SPDX-License-Identifier: MIT
/*
 * The rdma-core boundary. libibverbs returns +errno, its constructors NULL
 * with errno, librdmacm -1 with errno: every wrapper here returns 0 or a
 * negative errno and hands objects back through out-parameters. errno is
 * read right after the failing call and never left for the caller.
 */
#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "internal.h"

/* errno after a failed constructor or librdmacm call; a library that
 * forgot to set it still yields an error. */
static int err_now(int fallback)
{
	int e = errno;

	return e > 0 ? -e : -fallback;
}

static int cm_ret(int ret)
{
	return ret ? err_now(EIO) : 0;
}

int kvp__get_devices(struct ibv_context ***list, int *n)
{
	struct ibv_context **l;
	int cnt = 0;

	errno = 0;
	l = rdma_get_devices(&cnt);
	if (!l)
		return err_now(ENODEV);
	*list = l;
	*n = cnt;
	return 0;
}

void kvp__free_devices(struct ibv_context **list)
{
	if (list)
		rdma_free_devices(list);
}

const char *kvp__dev_name(struct ibv_context *ctx)
{
	const char *s = ibv_get_device_name(ctx->device);

	return s ? s : "";
}

int kvp__query_device(struct ibv_context *ctx, struct ibv_device_attr *attr)
{
	return kvp__vret(ibv_query_device(ctx, attr));
}

int kvp__query_port(struct ibv_context *ctx, uint8_t port,
		    struct ibv_port_attr *attr)
{
	return kvp__vret(ibv_query_port(ctx, port, attr));
}

int kvp__alloc_pd(struct ibv_context *ctx, struct ibv_pd **out)
{
	struct ibv_pd *pd;

	errno = 0;
	pd = ibv_alloc_pd(ctx);
	if (!pd)
		return err_now(ENOMEM);
	*out = pd;
	return 0;
}

void kvp__dealloc_pd(struct ibv_pd *pd)
{
	if (pd)
		(void)ibv_dealloc_pd(pd);
}

int kvp__reg_mr(struct ibv_pd *pd, void *addr, size_t len, int access,
		struct ibv_mr **out)
{
	struct ibv_mr *mr;

	errno = 0;
	mr = ibv_reg_mr(pd, addr, len, access);
	if (!mr)
		return err_now(ENOMEM);
	*out = mr;
	return 0;
}

int kvp__reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset, size_t len,
		       uint64_t iova, int fd, int access, struct ibv_mr **out)
{
	struct ibv_mr *mr;
	int err;

	errno = 0;
	mr = ibv_reg_dmabuf_mr(pd, offset, len, iova, fd, access);
	if (!mr) {
		err = err_now(ENOMEM);
		/* The provider has no dma-buf registration (soft-RoCE, older
		 * kernels): one code for all its spellings. */
		if (-err == EOPNOTSUPP || -err == ENOSYS ||
		    -err == EPROTONOSUPPORT)
			err = -ENOTSUP;
		return err;
	}
	*out = mr;
	return 0;
}

void kvp__dereg_mr(struct ibv_mr *mr)
{
	if (mr)
		(void)ibv_dereg_mr(mr);
}

int kvp__create_comp_channel(struct ibv_context *ctx,
			     struct ibv_comp_channel **out)
{
	struct ibv_comp_channel *ch;

	errno = 0;
	ch = ibv_create_comp_channel(ctx);
	if (!ch)
		return err_now(ENOMEM);
	*out = ch;
	return 0;
}

void kvp__destroy_comp_channel(struct ibv_comp_channel *ch)
{
	if (ch)
		(void)ibv_destroy_comp_channel(ch);
}

int kvp__create_cq(struct ibv_context *ctx, int cqe,
		   struct ibv_comp_channel *ch, struct ibv_cq **out)
{
	struct ibv_cq *cq;

	errno = 0;
	cq = ibv_create_cq(ctx, cqe, NULL, ch, 0);
	if (!cq)
		return err_now(ENOMEM);
	*out = cq;
	return 0;
}

void kvp__destroy_cq(struct ibv_cq *cq)
{
	if (cq)
		(void)ibv_destroy_cq(cq);
}

int kvp__req_notify_cq(struct ibv_cq *cq)
{
	return kvp__vret(ibv_req_notify_cq(cq, 0));
}

int kvp__get_cq_event(struct ibv_comp_channel *ch)
{
	struct ibv_cq *cq;
	void *ctx;

	errno = 0;
	if (ibv_get_cq_event(ch, &cq, &ctx)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return err_now(EIO);
	}
	ibv_ack_cq_events(cq, 1);
	return 1;
}

int kvp__get_async_event(struct ibv_context *ctx, struct kvp_async *out)
{
	struct ibv_async_event ev;

	errno = 0;
	if (ibv_get_async_event(ctx, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return err_now(EIO);
	}
	memset(out, 0, sizeof(*out));
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp = ev.element.qp;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = (uint32_t)ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 1;
}

int kvp__set_min_rnr_timer(struct ibv_qp *qp, uint8_t t)
{
	struct ibv_qp_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.min_rnr_timer = t;
	return kvp__vret(ibv_modify_qp(qp, &attr, IBV_QP_MIN_RNR_TIMER));
}

int kvp__qp_to_error(struct ibv_qp *qp)
{
	struct ibv_qp_attr attr;

	memset(&attr, 0, sizeof(attr));
	attr.qp_state = IBV_QPS_ERR;
	return kvp__vret(ibv_modify_qp(qp, &attr, IBV_QP_STATE));
}

int kvp__qp_rq_psn(struct ibv_qp *qp, uint32_t *psn)
{
	struct ibv_qp_init_attr init;
	struct ibv_qp_attr attr;
	int err;

	memset(&attr, 0, sizeof(attr));
	err = kvp__vret(ibv_query_qp(qp, &attr, IBV_QP_RQ_PSN, &init));
	if (!err)
		*psn = attr.rq_psn;
	return err;
}

int kvp__create_event_channel(struct rdma_event_channel **out)
{
	struct rdma_event_channel *ch;

	errno = 0;
	ch = rdma_create_event_channel();
	if (!ch)
		return err_now(ENODEV);
	*out = ch;
	return 0;
}

void kvp__destroy_event_channel(struct rdma_event_channel *ch)
{
	if (ch)
		rdma_destroy_event_channel(ch);
}

int kvp__create_id(struct rdma_event_channel *ch, void *ctx,
		   struct rdma_cm_id **out)
{
	struct rdma_cm_id *id = NULL;

	errno = 0;
	if (rdma_create_id(ch, &id, ctx, RDMA_PS_TCP))
		return err_now(ENOMEM);
	*out = id;
	return 0;
}

void kvp__destroy_id(struct rdma_cm_id *id)
{
	if (id)
		(void)rdma_destroy_id(id);
}

int kvp__bind_addr(struct rdma_cm_id *id, struct sockaddr *sa)
{
	errno = 0;
	return cm_ret(rdma_bind_addr(id, sa));
}

int kvp__listen(struct rdma_cm_id *id, int backlog)
{
	errno = 0;
	return cm_ret(rdma_listen(id, backlog));
}

int kvp__resolve_addr(struct rdma_cm_id *id, struct sockaddr *src,
		      struct sockaddr *dst, int timeout_ms)
{
	errno = 0;
	return cm_ret(rdma_resolve_addr(id, src, dst, timeout_ms));
}

int kvp__resolve_route(struct rdma_cm_id *id, int timeout_ms)
{
	errno = 0;
	return cm_ret(rdma_resolve_route(id, timeout_ms));
}

int kvp__set_ack_timeout(struct rdma_cm_id *id, uint8_t t)
{
	errno = 0;
	return cm_ret(rdma_set_option(id, RDMA_OPTION_ID,
				      RDMA_OPTION_ID_ACK_TIMEOUT, &t,
				      sizeof(t)));
}

int kvp__set_tos(struct rdma_cm_id *id, uint8_t tos)
{
	errno = 0;
	return cm_ret(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_TOS,
				      &tos, sizeof(tos)));
}

int kvp__create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
		   struct ibv_qp_init_attr *attr)
{
	errno = 0;
	return cm_ret(rdma_create_qp(id, pd, attr));
}

void kvp__destroy_qp(struct rdma_cm_id *id)
{
	if (id && id->qp)
		rdma_destroy_qp(id);
}

int kvp__create_srq(struct ibv_pd *pd, uint32_t max_wr, struct ibv_srq **out)
{
	struct ibv_srq_init_attr sa;
	struct ibv_srq *srq;

	memset(&sa, 0, sizeof(sa));
	sa.attr.max_wr = max_wr;
	sa.attr.max_sge = 1;
	errno = 0;
	srq = ibv_create_srq(pd, &sa);
	if (!srq)
		return err_now(ENOMEM);
	*out = srq;
	return 0;
}

void kvp__destroy_srq(struct ibv_srq *srq)
{
	if (srq)
		(void)ibv_destroy_srq(srq);
}

int kvp__connect(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	errno = 0;
	return cm_ret(rdma_connect(id, param));
}

int kvp__accept(struct rdma_cm_id *id, struct rdma_conn_param *param)
{
	errno = 0;
	return cm_ret(rdma_accept(id, param));
}

int kvp__reject(struct rdma_cm_id *id, const void *pdata, uint8_t plen)
{
	errno = 0;
	return cm_ret(rdma_reject(id, pdata, plen));
}

int kvp__peer_addr(struct rdma_cm_id *id, uint8_t out[16])
{
	struct sockaddr *sa = rdma_get_peer_addr(id);

	memset(out, 0, 16);
	if (sa && sa->sa_family == AF_INET) {
		out[10] = out[11] = 0xff;
		memcpy(out + 12, &((struct sockaddr_in *)sa)->sin_addr, 4);
		return 0;
	}
	if (sa && sa->sa_family == AF_INET6) {
		memcpy(out, &((struct sockaddr_in6 *)sa)->sin6_addr, 16);
		return 0;
	}
	return -EINVAL;
}

/* Does not block on Linux 5.6 and later: early after boot (a VM without a
 * hardware RNG: seen to take a second) the kernel's pool may not be
 * initialised, and getrandom(..., 0) would wait inside kvp_agent_poll() or
 * connect. The handshake's nonces must not repeat; they need not be
 * secret. Older kernels (no GRND_INSECURE) wait for the pool. */
#ifndef GRND_INSECURE
#define GRND_INSECURE 0x0004 /* Linux 5.6 */
#endif
int kvp__random(void *buf, size_t n)
{
	static const unsigned int flags[] = { GRND_NONBLOCK, GRND_INSECURE, 0 };
	uint8_t *p = buf;
	unsigned int f = 0;
	ssize_t got;

	while (n) {
		got = getrandom(p, n, flags[f]);
		if (got < 0) {
			if (errno == EINTR)
				continue;
			if ((errno == EAGAIN || errno == EINVAL) && ++f < 3)
				continue;
			return -errno;
		}
		p += got;
		n -= (size_t)got;
	}
	return 0;
}

int kvp__disconnect(struct rdma_cm_id *id)
{
	errno = 0;
	return cm_ret(rdma_disconnect(id));
}

int kvp__get_cm_event(struct rdma_event_channel *ch, struct rdma_cm_event **ev)
{
	errno = 0;
	if (rdma_get_cm_event(ch, ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 0;
		return err_now(EIO);
	}
	return 1;
}

void kvp__ack_event(struct rdma_cm_event *ev)
{
	(void)rdma_ack_cm_event(ev);
}

int kvp__parse_addr(const char *ip, uint16_t port, struct sockaddr_storage *ss)
{
	struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;

	memset(ss, 0, sizeof(*ss));
	if (!ip) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		s4->sin_addr.s_addr = htonl(INADDR_ANY);
		return 0;
	}
	if (inet_pton(AF_INET, ip, &s4->sin_addr) == 1) {
		s4->sin_family = AF_INET;
		s4->sin_port = htons(port);
		return 0;
	}
	memset(ss, 0, sizeof(*ss));
	if (inet_pton(AF_INET6, ip, &s6->sin6_addr) == 1) {
		s6->sin6_family = AF_INET6;
		s6->sin6_port = htons(port);
		return 0;
	}
	return -EINVAL;
}

int kvp__set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return err_now(EIO);
	return 0;
}

/* ---- what a completion's or an rdma_cm event's failure means --------- */

int kvp__wc_errno(enum ibv_wc_status st)
{
	switch (st) {
	case IBV_WC_SUCCESS:
		return 0;
	case IBV_WC_WR_FLUSH_ERR:
		return -ECONNRESET;
	case IBV_WC_RETRY_EXC_ERR:
	case IBV_WC_RNR_RETRY_EXC_ERR:
		return -ETIMEDOUT;
	case IBV_WC_REM_ACCESS_ERR:
	case IBV_WC_LOC_PROT_ERR:
		return -EACCES;
	default:
		return -EIO;
	}
}

int kvp__cm_errno(enum rdma_cm_event_type t)
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
