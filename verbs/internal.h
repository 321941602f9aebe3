/* SPDX-License-Identifier: MIT */
/*
 * Internal structures of verbs/: agents, connections, requests. Never
 * installed. Only verbs/ includes <infiniband/verbs.h> and <rdma/...>.
 */
#ifndef KVP_VERBS_INTERNAL_H
#define KVP_VERBS_INTERNAL_H

#include <errno.h>
#include <stdint.h>
#include <time.h>

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include "kvpull.h"
#include "credit.h"
#include "lease.h"
#include "limits.h"
#include "hist.h"
#include "../plan/le.h"

#define kvp_likely(x) __builtin_expect(!!(x), 1)
#define kvp_unlikely(x) __builtin_expect(!!(x), 0)
#define KVP_HIDDEN __attribute__((visibility("hidden")))
#define KVP_CACHELINE 64

/* ---- rdma-core boundary (wrap.c, and the hot ones inline here) ---------
 * libibverbs returns +errno, its constructors NULL with errno set, and
 * librdmacm -1 with errno set. Every call below returns 0 (or a count) or a
 * negative errno, and constructors return their object through an
 * out-parameter. Nothing outside these wrappers calls ibv_* or rdma_*. */

/* Maps a verbs return value (+errno, or -1 with errno, or a negative errno
 * from some providers) to -errno. */
static inline int kvp__vret(int ret)
{
	if (kvp_likely(ret == 0))
		return 0;
	if (ret > 0)
		return -ret;
	if (ret == -1)
		return errno ? -errno : -EIO;
	return ret;
}

static inline int kvp__post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
				 struct ibv_send_wr **bad)
{
	return kvp__vret(ibv_post_send(qp, wr, bad));
}

static inline int kvp__post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
				 struct ibv_recv_wr **bad)
{
	return kvp__vret(ibv_post_recv(qp, wr, bad));
}

static inline int kvp__post_srq_recv(struct ibv_srq *srq,
				     struct ibv_recv_wr *wr,
				     struct ibv_recv_wr **bad)
{
	return kvp__vret(ibv_post_srq_recv(srq, wr, bad));
}

/* Returns the number of completions (>= 0) or -EIO. */
static inline int kvp__poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	int ret = ibv_poll_cq(cq, n, wc);

	return kvp_likely(ret >= 0) ? ret : -EIO;
}

KVP_HIDDEN int kvp__get_devices(struct ibv_context ***list, int *n);
KVP_HIDDEN void kvp__free_devices(struct ibv_context **list);
KVP_HIDDEN const char *kvp__dev_name(struct ibv_context *ctx);
KVP_HIDDEN int kvp__query_device(struct ibv_context *ctx,
				 struct ibv_device_attr *attr);
KVP_HIDDEN int kvp__query_port(struct ibv_context *ctx, uint8_t port,
				struct ibv_port_attr *attr);
KVP_HIDDEN int kvp__alloc_pd(struct ibv_context *ctx, struct ibv_pd **out);
KVP_HIDDEN void kvp__dealloc_pd(struct ibv_pd *pd);
KVP_HIDDEN int kvp__reg_mr(struct ibv_pd *pd, void *addr, size_t len,
			   int access, struct ibv_mr **out);
KVP_HIDDEN void kvp__dereg_mr(struct ibv_mr *mr);
/* -ENOTSUP when the provider cannot register dma-bufs at all. */
KVP_HIDDEN int kvp__reg_dmabuf_mr(struct ibv_pd *pd, uint64_t offset,
				  size_t len, uint64_t iova, int fd,
				  int access, struct ibv_mr **out);
KVP_HIDDEN int kvp__create_comp_channel(struct ibv_context *ctx,
					struct ibv_comp_channel **out);
KVP_HIDDEN void kvp__destroy_comp_channel(struct ibv_comp_channel *ch);
KVP_HIDDEN int kvp__create_cq(struct ibv_context *ctx, int cqe,
			      struct ibv_comp_channel *ch, struct ibv_cq **out);
KVP_HIDDEN void kvp__destroy_cq(struct ibv_cq *cq);
KVP_HIDDEN int kvp__req_notify_cq(struct ibv_cq *cq);
/* Takes one completion-channel event without blocking: 1 if there was one
 * (acknowledged), 0 if none, or -errno. */
KVP_HIDDEN int kvp__get_cq_event(struct ibv_comp_channel *ch);
KVP_HIDDEN int kvp__qp_to_error(struct ibv_qp *qp);
/* The QP's next expected PSN (IBV_QP_RQ_PSN): a system call, and a
 * firmware command on some devices: cold paths only. */
KVP_HIDDEN int kvp__qp_rq_psn(struct ibv_qp *qp, uint32_t *psn);
/* The RNR NAK timer a QP in RTS asks its senders to wait (RTS to RTS). */
KVP_HIDDEN int kvp__set_min_rnr_timer(struct ibv_qp *qp, uint8_t t);
/* One asynchronous device event without blocking (the context's async fd
 * is non-blocking): 1 and *out (acknowledged), 0 if none, or -errno. */
struct kvp_async {
	enum ibv_event_type type;
	struct ibv_qp *qp; /* QP events */
	uint32_t port;	   /* port events */
};
KVP_HIDDEN int kvp__get_async_event(struct ibv_context *ctx,
				    struct kvp_async *out);

KVP_HIDDEN int kvp__create_event_channel(struct rdma_event_channel **out);
KVP_HIDDEN void kvp__destroy_event_channel(struct rdma_event_channel *ch);
KVP_HIDDEN int kvp__create_id(struct rdma_event_channel *ch, void *ctx,
			      struct rdma_cm_id **out);
KVP_HIDDEN void kvp__destroy_id(struct rdma_cm_id *id);
KVP_HIDDEN int kvp__bind_addr(struct rdma_cm_id *id, struct sockaddr *sa);
KVP_HIDDEN int kvp__listen(struct rdma_cm_id *id, int backlog);
KVP_HIDDEN int kvp__resolve_addr(struct rdma_cm_id *id, struct sockaddr *src,
				 struct sockaddr *dst, int timeout_ms);
KVP_HIDDEN int kvp__resolve_route(struct rdma_cm_id *id, int timeout_ms);
KVP_HIDDEN int kvp__set_ack_timeout(struct rdma_cm_id *id, uint8_t t);
/* The IP type of service of the connection (RoCE v2: its traffic class;
 * IB: the SA maps it to a service level). */
KVP_HIDDEN int kvp__set_tos(struct rdma_cm_id *id, uint8_t tos);
KVP_HIDDEN int kvp__create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			      struct ibv_qp_init_attr *attr);
KVP_HIDDEN void kvp__destroy_qp(struct rdma_cm_id *id);
/* A shared receive queue of max_wr single-SGE receives. */
KVP_HIDDEN int kvp__create_srq(struct ibv_pd *pd, uint32_t max_wr,
			       struct ibv_srq **out);
KVP_HIDDEN void kvp__destroy_srq(struct ibv_srq *srq);
KVP_HIDDEN int kvp__connect(struct rdma_cm_id *id,
			    struct rdma_conn_param *param);
KVP_HIDDEN int kvp__accept(struct rdma_cm_id *id,
			   struct rdma_conn_param *param);
/* Rejects a connection request; pdata (plen bytes, may be NULL) tells the
 * peer why. */
KVP_HIDDEN int kvp__reject(struct rdma_cm_id *id, const void *pdata,
			   uint8_t plen);
/* The peer's IP address as 16 bytes (IPv4 mapped into IPv6): the key of
 * the per-source connection limit. 0, or -EINVAL. */
KVP_HIDDEN int kvp__peer_addr(struct rdma_cm_id *id, uint8_t out[16]);
/* n bytes from the kernel's random source. 0 or -errno. */
KVP_HIDDEN int kvp__random(void *buf, size_t n);
KVP_HIDDEN int kvp__disconnect(struct rdma_cm_id *id);
/* Takes one rdma_cm event without blocking: 1 and *ev, 0 if none, or
 * -errno. Every event taken must be given back with kvp__ack_event(). */
KVP_HIDDEN int kvp__get_cm_event(struct rdma_event_channel *ch,
				 struct rdma_cm_event **ev);
KVP_HIDDEN void kvp__ack_event(struct rdma_cm_event *ev);
/* What a completion's status and a failing rdma_cm event mean, as
 * -errno. */
KVP_HIDDEN int kvp__wc_errno(enum ibv_wc_status st);
KVP_HIDDEN int kvp__cm_errno(enum rdma_cm_event_type t);
/* Parses a numeric address and port into *ss. 0 or -EINVAL. */
KVP_HIDDEN int kvp__parse_addr(const char *ip, uint16_t port,
			       struct sockaddr_storage *ss);
KVP_HIDDEN int kvp__set_nonblock(int fd);

/* ---- work request ids ---------------------------------------------------
 * wr_id = kind << 56 | generation << 48 | connection << 32 | value.
 * The generation tells a recycled producer connection slot from the one a
 * stale completion belongs to. value: WRs retired by a signalled send
 * completion, or a receive buffer index. */
enum wr_kind {
	WK_READ = 1,   /* unsignalled READ: completes only with an error */
	WK_SIGNAL,     /* signalled READ: retires `value` send queue WRs */
	WK_NOTE,       /* notification SEND: retires `value`, ends a chunk */
	WK_DRAIN_SQ,   /* marker after the QP went to error */
	WK_DRAIN_RQ,
	WK_META_SEND,  /* our metadata blob */
	WK_META_RECV,  /* the peer's metadata blob (producer: its READ) */
	WK_NOTE_RECV,  /* producer: a notification buffer */
	WK_CTL_SEND,   /* handshake control message (auth, go, refusal) */
	WK_CTL_RECV,
	WK_LAST,       /* a chunk's last READ: its data is in; retires */
	WK_CREDIT,     /* READ of the producer's credit counter; retires */
	WK_PROBE,      /* producer: zero-length READ, is the consumer there */
	WK_BYE,	       /* our BYE (kvp_agent_close()) */
	WK_PROGRESS,   /* producer: WRITE of a follower's progress record */
	WK_FOLLOW,     /* consumer: FOLLOW (or TABLE) message to a producer */
	WK_SMARK,      /* consumer: ends a flush's READs of a streamed
			* stripe (the mark FIFO); retires */
	WK_SRQ_RECV,   /* producer: a buffer of the shared receive queue
			* (value: its index; the QP names the slot) */
	WK_LEASE,      /* consumer: READ of a lease bucket (lease.h);
			* retires */
};
#define KVP_MAX_QPS 8 /* kvp_agent_attr.qps_per_peer at most */

static inline uint64_t kvp__wrid(uint32_t kind, uint32_t gen, uint32_t conn,
				 uint32_t value)
{
	return (uint64_t)kind << 56 | (uint64_t)(gen & 0xff) << 48 |
	       (uint64_t)(conn & 0xffff) << 32 | value;
}
#define WRID_KIND(id) ((uint32_t)((id) >> 56))
#define WRID_GEN(id) ((uint32_t)((id) >> 48) & 0xff)
#define WRID_CONN(id) ((uint32_t)((id) >> 32) & 0xffff)
#define WRID_VALUE(id) ((uint32_t)(id))

/* ---- wire formats (little endian, byte by byte) ------------------------ */

#include "hello.h"
struct kvp_emit_pos;

/* Handshake control messages, SENT on the connection before any blob:
 *   consumer -> producer  AUTH  u32 magic, u32 0, MAC (KVP_MAC_LEN), u64
 *                         the address and u32 the rkey of the consumer's
 *                         blob, u32 0: the producer READs the blob
 *                         (the hello's blob_len bytes) once the MAC
 *                         checks out, so that nothing but AUTH and
 *                         notification-sized messages is ever received
 *                         on a producer's queue pair (a shared receive
 *                         queue of small buffers can serve them all)
 *   producer -> consumer  GO    u32 magic, u32 credits (notification
 *                         receive buffers, 1..KVP_CREDIT_MAX: rq_depth
 *                         on a rank's first queue pair, 1 on the others,
 *                         for their BYE; with a shared receive queue its
 *                         own and a loan, credit.h), u64 the address and
 *                         u32 the rkey of its credit counter, u32 flags
 *                         (KVP_GO_LOANS), then its lease table
 *                         (lease.h): u64 address, u32 rkey, u32 log2
 *                         of its buckets (<= KVP_LEASE_LOG2_MAX), u32
 *                         its incarnation (never 0), u32 0
 *   producer -> consumer  REFUSE u32 magic, i32 -errno, u32 reason (enum
 *                         kvp_reason; also the private data of a
 *                         rejected connect request)
 * Each side receives them into a fixed buffer of KVP_CTL_LEN bytes set up
 * once per connection slot: nothing is allocated for a peer before its
 * AUTH checks out. */
#define KVP_CTL_LEN 64
#define KVP_AUTH_MAGIC 0x4b565041u
#define KVP_AUTH_LEN (8 + KVP_MAC_LEN + 16)
#define KVP_AUTH_BLOB_OFF (8 + KVP_MAC_LEN)
#define KVP_GO_MAGIC 0x4b565047u
#define KVP_GO_LEN 48
#define KVP_GO_LOANS 1u /* GO's flags: a shared receive queue's loans,
			 * which a quiet consumer hands back with GIVE */
/* A producer's send queue: control, the consumer's blob's READ, our
 * blob, probe, drain marker, and PROG_SQ progress WRITEs (streaming) at
 * most. */
#define PROG_SQ 8
#define PROD_SQ (6 + PROG_SQ)
/* A producer probes each idle consumer rank this often with a zero-length
 * READ (no memory is touched, no rkey checked): a consumer host that
 * vanished without a disconnect fails the probe after the transport's
 * retries, and its slot is freed. */
#define KVP_PROBE_NS 1000000000ull
/* A probe not answered within this fails the connection, whatever the
 * transport's own timers do (a QP's ack timeout can be infinite). */
#define KVP_PROBE_WAIT_NS 5000000000ull
/* rdma_cm ack timeout, both sides: 4.096 us * 2^17 = 0.54 s, so a peer
 * that went silent fails a WR after about 7 retries, 4 s. */
#define KVP_ACK_TIMEOUT 17
/* RNR retries (7 would be for ever): with credits a notification never
 * meets an empty receive queue, so only a misbehaving peer hits this. */
#define KVP_RNR_RETRY 6
/* The producer's RNR NAK timer: 14 is 1.28 ms (rdma_cm leaves 0, which
 * means 655 ms per retry). */
#define KVP_MIN_RNR_TIMER 14
#define KVP_CREDIT_MAX 65536
/* A clean close: the closing side's last message on each connection, so
 * that the peer reports the disconnect that follows as a close (status
 * 0, KVP_REASON_CLOSED) rather than a reset. Producer -> consumer: a
 * control message (u32 magic, u32 0) into a receive the consumer posts
 * once its connection is ready. Consumer -> producer: a notification of
 * KVP_NOTE_LEN bytes whose magic is this one, sent with the last credit
 * it holds (none left: no BYE, and the close reads as a reset). */
/* GIVE (consumer -> producer, shared receive queue only): u32 magic, u32
 * n, in a notification-sized message: a first queue pair gone quiet
 * hands back n credits beyond the one this message takes (its loans;
 * credit.h), and counts them as sent. */
#define KVP_GIVE_MAGIC 0x4b565043u
#define KVP_GIVE_NS 50000000ull /* quiet this long: loans handed back */
#define KVP_BYE_MAGIC 0x4b565042u
#define KVP_BYE_LEN 8
/* notify.c: kvp_notify_expected() for a producer's handshake, with no
 * piece made: the layouts' field-level checks (groups, periods, every
 * field matched; the reason in msg), then each consumer rank's sources
 * from its segments. Equal to kvp_notify_expected() whenever every
 * consumer rank's plan compiles; a consumer rank whose plan cannot be
 * built (dims that do not refine, over KVP_PLAN_MAX_WORK) is counted as
 * its sources would be, and refuses itself. Linear in consumer ranks x
 * field kinds x segments: a peer's blob costs a producer no compilation.
 * The count (>= 1), -EPROTO, -EINVAL, -ENOMEM. */
KVP_HIDDEN int kvp__notify_count(const kvp_layout *prod,
				 const kvp_layout *cons, uint32_t producer,
				 char *msg, size_t msglen);

struct kvp_conn;
/* Posts connection c's BYE if it is ready (and, consumer, has credit):
 * 1 when posted (c->bye_sent until its completion), else 0. */
KVP_HIDDEN int kvp__bye_producer(kvp_agent *a, struct kvp_conn *c);
KVP_HIDDEN int kvp__bye_consumer(kvp_agent *a, struct kvp_conn *c);
/* How long kvp_agent_close() waits for its BYEs to be sent. */
#define KVP_BYE_NS 100000000ull
/* Streaming (kvp_agent_pull_stream(), kvp_agent_publish()). A consumer
 * rank that pulls a request in streaming mode tells each producer rank it
 * reads from, in a notification-sized message on the rank's first queue
 * pair (credit as for notifications):
 *   TABLE  (once per connection, before its first FOLLOW) u32 magic,
 *          u32 rank, u64 address, u32 rkey, u32 records, u64 engine: its
 *          progress records for this connection, remotely writable by
 *          this producer rank only (one MR per connection slot);
 *   FOLLOW u32 magic, u32 rank, u64 req_id, u64 engine, u32 record, u32
 *          tag: write request req_id's progress into that record.
 * The producer RDMA-WRITEs the request's progress there at each publish
 * (and at once when the FOLLOW finds some published): at most one WRITE
 * in flight per follower, a publish meanwhile only marks it dirty, so
 * that a lagging consumer costs no more messages than it can take and
 * sees the latest progress. A record (KVP_PROG_REC bytes): u64 tag, u64
 * tokens_all, u64 tokens_cur, u32 layers_cur, u32 0, u64 the request's
 * lease generation (lease.h), u64 check (kvp__prog_check(), keyed by the
 * connection's rec_key): a record read while a WRITE lands fails its
 * check and is read again at the next poll, and a record another
 * connection's peer wrote (the MR's key is per protection domain, so
 * anyone connected to this agent who learns it can WRITE there) never
 * passes. The consumer uses two records per
 * request slot, alternating with the slot's uses, so that a WRITE of a
 * request just finished cannot land on the next one's. */
#define KVP_FOLLOW_MAGIC 0x4b565046u
#define KVP_TABLE_MAGIC 0x4b565054u
#define KVP_PROG_REC 48
/* The most records a TABLE may announce (a bound on what a consumer's
 * claim can make a producer check, not on memory: nothing is allocated
 * for it). */
#define KVP_PROG_RECS_MAX (1u << 22)

static inline uint64_t kvp__prog_check(const uint64_t key[2], uint64_t tag,
				       uint64_t all, uint64_t cur,
				       uint32_t layers, uint64_t gen)
{
	const uint64_t w[5] = { tag, all, cur, layers, gen };

	return kvp__siphash(key, w, 5);
}

/* The hints: handshakes under way finish in milliseconds; a slot held by
 * a connected rank frees only when it goes. */
/* A connect request waiting for a handshake slot (listen.c). Its private
 * data: rdma_cm's over InfiniBand and RoCE is at most 56 bytes. */
#define KVP_WAIT_PDATA 64
struct kvp_wait {
	struct rdma_cm_id *id;
	uint64_t since;
	uint32_t plen;
	uint8_t rr;
	uint8_t src[16];
	uint8_t pdata[KVP_WAIT_PDATA];
};

#define KVP_RETRY_HALF_MS 20u
#define KVP_RETRY_FULL_MS 250u
#define KVP_RETRY_MAX_MS 60000u /* a larger hint is read as this */
#define KVP_RETRY_MIN_MS 10u	/* a smaller one as this: a producer
				 * cannot make us reconnect in a loop */

/* The proofs: HMAC-SHA-256 keyed by the secret over a label ('P' for the
 * producer's, 'C' for the consumer's, so neither can be reflected) and
 * both hellos, nonces included. */
KVP_HIDDEN void kvp__auth_mac(const kvp_agent *a, char label,
			      const uint8_t *hello_c, const uint8_t *hello_p,
			      uint8_t mac[KVP_MAC_LEN]);
/* The connect request's proof of the secret over a hello
 * (KVP_HELLO_TAG_LEN). */
KVP_HIDDEN void kvp__hello_tag(const kvp_agent *a, const uint8_t *hello,
			       uint8_t tag[KVP_HELLO_TAG_LEN]);
/* The key of connection c's progress records' check: the same MAC over
 * both hellos (label 'R', never sent), so both ends derive it and no
 * other peer of this agent knows it (with a secret, not even one that
 * saw the hellos). */
KVP_HIDDEN void kvp__rec_key(const kvp_agent *a, struct kvp_conn *c);
/* Seconds since the epoch (CLOCK_REALTIME): a hello's clock. */
KVP_HIDDEN uint64_t kvp__wall_s(void);

/* A notification: the consumer's SEND after its reads (and its lease
 * check): u32 magic, u32 rank, u64 req_id, u64 engine, u64 flags. */
#define KVP_NOTE_MAGIC 0x4b56504eu
/* flags: this producer rank did not hold the request when we read it
 * (lease.h): counted in the producer's stats.unheld. */
#define KVP_NOTE_UNHELD 1u
#define KVP_NOTE_LEN 32
/* A producer also caps a consumer's blob (at most KVP_META_MAX, hello.h)
 * at KVP_PEER_BLOB_SLACK times its own blob, at least KVP_PEER_BLOB_FLOOR
 * bytes: both engines run one model, so their blobs differ by the memory
 * layout only. */
#define KVP_PEER_BLOB_SLACK 8u
#define KVP_PEER_BLOB_FLOOR (64u << 10)
/* A request's rank bitmap: one bit per consumer rank a peer may declare. */
#define KVP_BM_WORDS (KVP_MAX_TP_SIZE / 64)

static inline uint32_t kvp__pow2_at_least(uint32_t v)
{
	uint32_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

static inline uint64_t kvp__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- connections -------------------------------------------------------- */

enum conn_state {
	CS_FREE = 0,
	CS_ADDR,	/* consumer: resolving the address */
	CS_ROUTE,	/* consumer: resolving the route */
	CS_CONNECTING,	/* consumer: connect sent; producer: accept sent */
	CS_HANDSHAKE,	/* established, waiting for the peer's blob */
	CS_READY,
	CS_DRAINING,	/* QP in error, waiting for the drain markers */
	CS_DEAD,	/* drained (consumer: kept until close) */
};

/* One in-flight request's share of one connection: the READs this queue
 * pair takes of that producer rank's (windows from the request's stripe,
 * shared by the rank's queue pairs), then, on the rank's first queue pair
 * only, the notification once all of the rank's data is in. */
#define CH_READS 1u  /* has READs whose data is not in yet */
#define CH_FOLLOW 2u /* streaming: its FOLLOW is not posted yet */
#define CH_CLOSED 4u /* its READs are all posted (chunks after c_post:
		      * passed a streamed chunk that waits for progress) */
struct kvp_chunk {
	uint32_t slot;	   /* request slot */
	uint32_t flags;
	uint32_t posted;   /* READs posted */
	uint32_t stripe;   /* index in the engine's stripes, or NO_STRIPE */
	uint32_t lnext;	   /* the chunk closed after it (the close FIFO) */
};
#define NO_STRIPE UINT32_MAX

/* A request's READs from one producer rank, striped over the rank's queue
 * pairs: the emission cursor they share, and how many of their chunks
 * still have data out. */
struct kvp_stripe {
	struct kvp_emit_pos pos;
	uint32_t left;
	int32_t status;
	uint32_t qmask;	/* queue pairs that carried some of its READs */
	uint32_t lease;	/* enum stripe_lease */
};
/* A stripe's lease check (lease.h): none needed (nothing read, or it
 * failed), its data in and the check to post on the rank's first queue
 * pair (on that connection's lease FIFO), posted, done. Its notification
 * waits for the check: the producer may let go once it has it. */
enum stripe_lease { SL_NONE = 0, SL_WAIT, SL_READING, SL_DONE };

/* A streamed request's progress from one source (kvp_agent_pull_stream()):
 * what the producer rank published (as last read from its record), what
 * the stripe's ranges cover, and the ranges left to emit. */
struct kvp_sprog {
	struct kvp_progress seen, posted;
	struct kvp_emit_range rr[3];
	uint32_t nr, ri;   /* ranges; the next to start (pos walks ri - 1) */
	uint64_t t_last;   /* when seen last grew (the stall bound) */
	uint32_t active;   /* the request streams from this source */
	/* Arrival (stream_events): leading layers whose READs are all
	 * posted (KVP_LC_ALL: every layer), and per queue pair the marks
	 * (signalled WRs ending a flush's READs of this stripe, or its
	 * close) in flight and the value of the last one completed. */
	uint32_t emitted_lc;
	uint32_t mout[KVP_MAX_QPS], mdone[KVP_MAX_QPS];
	uint64_t gen;	   /* the lease generation its records carry, 0:
			    * none read yet */
};
#define KVP_LC_ALL UINT32_MAX

/* A region's memory as work requests address it: struct kvp_emit_map
 * (kvpull.h), byte `off` at addr + off under key[off >> shift]. One MR:
 * shift KVP_ONE_MR and one key. Several (the device caps an MR below the
 * region's size): the MRs overlap so that an access of at most
 * KVP_MR_WINDOW(shift) bytes lies in the MR of the piece it starts in. */
#define KVP_ONE_MR 63

/* A reason and its line (enum kvp_reason): the first recorded wins until
 * cleared, so the check that failed first is the one reported. */
struct kvp_why {
	uint32_t reason;
	uint32_t peer_reason; /* KVP_REASON_PEER_REFUSED: the producer's */
	const char *line;     /* a static line (kvp__why_static()), or NULL:
			       * msg holds it */
	char msg[KVP_WHY_LEN];
};
/* Records (reason, the formatted line) in w unless it holds one; returns
 * err, so that a check reads `return kvp__why(w, -EPROTO, ...)`. */
KVP_HIDDEN int kvp__why(struct kvp_why *w, int err, uint32_t reason,
			const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* kvp__why() with a constant line: three stores, no formatting, for the
 * refusals an engine's loop may meet on every call (a full queue). */
static inline int kvp__why_static(struct kvp_why *w, int err, uint32_t reason,
				  const char *line)
{
	if (!w->reason) {
		w->reason = reason;
		w->line = line;
	}
	return err;
}
/* The reason an errno implies when no check recorded one (a transport
 * failure, a timeout...), recorded as kvp__why() does. */
KVP_HIDDEN void kvp__why_errno(struct kvp_why *w, int err);
/* A public call's error: its reason as recorded, or the one its errno
 * implies in a call (-EINVAL: arguments, -ENOENT: no such engine...).
 * Returns err. */
KVP_HIDDEN int kvp__call_err(struct kvp_why *w, int err);
/* The reason line for a peer of another handshake version: -EPROTONOSUPPORT,
 * KVP_REASON_VERSION, both versions named (lib 0: an agent before 0.2). */
KVP_HIDDEN int kvp__why_version(struct kvp_why *w, const char *who,
				uint32_t rank, uint32_t version, uint32_t lib);
static inline void kvp__why_clear(struct kvp_why *w)
{
	w->reason = w->peer_reason = 0;
	w->line = NULL;
	w->msg[0] = 0;
}

struct kvp_conn;
/* What a connection tells the side that owns it: conn.c names neither
 * side. Each connection slot's are set once, at open (agent.c). */
struct kvp_conn_ops {
	/* c failed (c->status says why) and drains now; was_ready: it was
	 * CS_READY. The side reports it (kvp__conn_report()) and fails what
	 * depended on it. */
	void (*failed)(kvp_agent *a, struct kvp_conn *c, int was_ready);
	/* Every WR posted on c has completed or been flushed: the side lets
	 * go of what it holds of c and releases it (kvp__conn_release()). */
	void (*drained)(kvp_agent *a, struct kvp_conn *c);
};

struct kvp_conn {
	/* Mutable counters, written on every post and completion of this QP.
	 * The agent is single-threaded, so this is not about contention: the
	 * alignment keeps one QP's counters in exactly one line (one miss per
	 * completion, never two for a straddling struct) and keeps those
	 * writes off the lines of the read-only posting data below and of the
	 * neighbouring connections, which the post loop streams through. */
	struct {
		uint32_t outstanding; /* SQ WRs posted, not yet retired */
		uint32_t c_head;      /* oldest chunk, notification pending */
		uint32_t c_data;      /* oldest chunk whose data may be out */
		uint32_t c_note;      /* first chunk, notification unposted */
		uint32_t c_post;      /* first chunk, READs not all posted */
		uint32_t c_tail;      /* next free chunk */
		uint32_t side;	      /* the side we play: enum kvp_role */
		uint32_t state;	      /* enum conn_state */
		int32_t status;	      /* why it died */
		uint32_t drains;      /* drain markers still expected */
		uint32_t gen;
		/* Chunks closed by a signalled last READ (or marker) whose
		 * completion is still out, in posting order, linked through
		 * kvp_chunk.lnext: completions arrive in that order. */
		uint32_t l_head, l_tail, nlast;
		uint64_t drain_deadline;
	} __attribute__((aligned(KVP_CACHELINE)));

	/* Read-mostly after setup. */
	struct ibv_qp *qp;
	struct rdma_cm_id *id;
	const struct kvp_conn_ops *ops; /* its side's */
	struct kvp_chunk *chunks; /* consumer: FIFO, chunk_mask + 1 entries */
	struct kvp_emit_map *rreg; /* consumer: per remote region */
	uint32_t *rkeys;	  /* their keys, every region's in one array */
	uint32_t nrkeys;
	uint32_t idx;		  /* index in agent->conns */
	uint32_t rank;		  /* peer rank */
	uint64_t engine_id;	  /* peer engine */
	int reported;		  /* DISCONNECTED event queued */
	int bye;		  /* the peer said BYE: its close is clean */
	int bye_sent;		  /* ours is posted, not yet completed */
	uint32_t sq_cap;	  /* consumer: usable send queue entries, one
				   * kept for the drain marker */
	int inline_notes;	  /* consumer: notifications sent inline */
	uint32_t eng;		  /* consumer: engine index */
	uint32_t psrc;		  /* consumer: plan source index, or NO_SRC */
	uint32_t q;		  /* consumer: queue pair of its rank, 0: the
				   * one that carries notifications */
	uint32_t loop;		  /* consumer: the peer is this device's own
				   * port (same GID) and the READ window is
				   * the default: no window (nothing of a
				   * loopback is on a wire, nothing is lost) */

	/* Consumer: notification credits. The producer rank re-posts a
	 * receive buffer per notification it took and counts them in a
	 * counter we READ when out of credit: a notification is only sent
	 * into a posted buffer, so no RNR wait ever holds the send queue. */
	uint64_t notes_posted;	  /* notifications posted */
	uint64_t credit_seen;	  /* the counter, as last read */
	uint64_t ctr_raddr;
	uint32_t ctr_rkey;
	uint32_t credit_max;	  /* the producer's receive depth */
	int credit_reading;	  /* a counter READ is posted */
	int credit_hold;	  /* the last read brought nothing: the next
				   * waits for the timer (one a millisecond) */
	int starved;		  /* notifications wait for credit */
	uint64_t wait_since;	  /* a notification waits for credit since */
	int loans;		  /* its credit holds loans it hands back
				   * when quiet (GO's KVP_GO_LOANS) */
	uint64_t quiet_mark;	  /* notes_posted when it went quiet */
	uint64_t quiet_since;
	int give_step;		  /* quiet: 0, counter READ posted 1, done 2 */

	/* Handshake. */
	uint8_t hello_c[KVP_HELLO_LEN]; /* both hellos, as sent: the MACs */
	uint8_t hello_p[KVP_HELLO_LEN]; /* cover them */
	uint8_t src[16];	  /* producer: the consumer's address */
	uint32_t peer_blob;	  /* the length the peer's hello announced */
	uint8_t *blob;		  /* the peer's blob */
	uint32_t blob_len;	  /* its buffer's size */
	uint32_t blob_got;	  /* bytes received */
	int blob_pending;	  /* producer: received, not yet checked */
	struct ibv_mr *blob_mr;
	kvp_layout *peer;	  /* decoded peer layout */
	int refused;		  /* producer: refusal sent, awaiting close */
	uint32_t reason;	  /* producer: the refusal's reason; consumer:
				   * the reason a producer's refusal gave */
	int counted;		  /* producer: in its engine's count */
	int rank_head;		  /* producer: the first live connection of
				   * its (address, engine, rank): counted
				   * against max_per_source */
	uint32_t retry_ms;	  /* consumer: the producer refused us as
				   * full and hinted a retry after this */
	int retrying;		  /* consumer: released for a retry, not a
				   * failure of its engine */
	uint64_t last_used;	  /* producer: ready, or its last note or
				   * FOLLOW (the eviction order) */
	int evicted;		  /* producer: disconnected to make room */
	uint32_t evict_mark;	  /* producer: skipped in search evict_gen */
	/* Producer, kvp__rank_busy(): the QP's next expected PSN as last
	 * read (in life psn_gen), the messages taken since (one PSN each),
	 * and when a READ was last seen to move it (0: never). */
	uint32_t psn, psn_gen, psn_msgs;
	uint64_t psn_at;
	int prepared;		  /* its memory set up (kvp__slot_prepare()) */
	uint32_t resv;		  /* producer, rank head: slots held for the
				   * rank's queue pairs still to come */

	/* Producer: notification receive buffers and the request count. */
	uint8_t *notes;		  /* producer: notification buffers, kept */
	struct ibv_mr *notes_mr;  /* with the slot; notes_n of them */
	uint32_t notes_n;
	uint32_t credits;	  /* producer: its GO's credits (per-QP
				   * receive queues: the buffers posted) */
	struct kvp_credit cr;	  /* producer, shared receive queue: its
				   * credit (credit.h) */
	int cr_dirty;		  /* ... given this poll: in a->cr_dirty */
	int auth_seen;		  /* producer, shared receive queue */
	int lastwqe_wait;	  /* ... draining: its last WQE event due */
	int fol_wait;		  /* producer: its TABLE came, the slot's
				   * follower records to register */
	int auth_wait;		  /* producer: its AUTH checked out; its
				   * blob's buffer to register, READ and GO
				   * (kvp__auth_step()) */
	uint32_t auth_rkey;	  /* ... the blob's key and address, as the
				   * AUTH said */
	uint64_t auth_addr;
	uint64_t lastwqe_by;	  /* ... and when it is given up on */
	uint32_t expected;	  /* notifications that free a request */
	uint32_t peer_tp;	  /* the consumer engine's TP size */
	uint32_t nearly;	  /* early entries this connection created */
	uint32_t probing;	  /* a probe is posted */
	uint64_t ptab_addr;	  /* producer: the consumer's progress */
	uint32_t ptab_rkey;	  /* records (TABLE), ptab_n of them; 0: */
	uint32_t ptab_n;	  /* none announced */
	uint32_t prog_out;	  /* progress WRITEs in flight */
	int prog_dirty;		  /* a follower waits for send queue room */
	int table_sent;		  /* consumer: our TABLE is posted */
	uint64_t *marks;	  /* consumer, stream_events: the mark FIFO,
				   * sq_cap entries: stripe << 32 | value */
	uint32_t m_head, m_tail;
	uint64_t probe_at;	  /* the next probe; probing: its deadline */
	/* Both sides: the key of this connection's progress records'
	 * check (kvp__rec_key()), so that no other connection's peer can
	 * make one that passes. */
	uint64_t rec_key[2];
	/* Consumer: the producer rank's lease table (GO), and the lease
	 * FIFO of a rank's first queue pair: stripes whose check waits to
	 * be posted [lw_post, lw_tail), posted [lw_done, lw_post) (at most
	 * KVP_LEASE_RING: their landing buffers), chunk_mask + 1 entries. */
	uint64_t lease_raddr;
	uint32_t lease_rkey, lease_log2, lease_inc;
	uint32_t *lw;
	uint32_t lw_tail, lw_post, lw_done;
} __attribute__((aligned(KVP_CACHELINE)));
/* Lease READs in flight per connection (their landing buffers). */
#define KVP_LEASE_RING 8
#define NO_SRC UINT32_MAX
#define NO_CONN UINT32_MAX

/* ---- requests ----------------------------------------------------------- */

/* ACTIVE: data on the way; FINISHED: DONE or FAILED queued or delivered
 * (the slot lives on while notifications are posted or queued);
 * REPORTED: FAILED delivered, ids lent to the user until the next poll. */
enum req_state { RQ_FREE = 0, RQ_ACTIVE, RQ_FINISHED, RQ_REPORTED };

struct kvp_req {
	uint64_t req_id;
	uint64_t t0;	   /* pull time */
	uint64_t bytes;	   /* READ bytes posted */
	uint32_t reads;	   /* READs posted */
	uint32_t state;
	uint32_t pending;  /* chunks whose data is not in */
	uint32_t notes;	   /* notifications not completed nor dropped */
	int32_t status;	   /* first failure, 0 */
	uint32_t eng;	   /* engine index */
	uint32_t seq;	   /* pull sequence number (the stall FIFO) */
	uint32_t delivered; /* its event was handed to the user */
	uint32_t next_free;
	uint32_t stream;   /* pulled in streaming mode */
	uint32_t uses;	   /* the slot's pulls: picks its progress record */
	uint32_t in_sreq;  /* on a->sreq, the streamed pulls' list */
	uint32_t reason;   /* FAILED: enum kvp_reason when the request
			    * failed alone (a streamed pull's stall) */
	uint32_t arrived;  /* ARRIVED: layers reported */
	uint64_t t_end;	   /* streamed: when the last source's final
			    * progress was seen (0: not yet) */
	uint32_t *ids;		/* ngroups * max_ids local, then remote ids */
	struct kvp_ids *gids;	/* per group, lists into ids */
};

/* Consumer: a producer engine (engine.c). */
enum eng_phase { EP_FIRST = 1, EP_ROOM, EP_REST };
struct kvp_peer_addr {
	char ip[64];
	uint16_t port;
};
/* A compiled plan, shared by the engines of one geometry. */
struct kvp_pcache {
	kvp_layout *geo;	/* a layout of that geometry (any rank's) */
	uint64_t hash;		/* its compat hash */
	kvp_plan *plan;		/* NULL: free entry */
	struct kvp_plan_info pi;
	uint32_t max_len;	/* its READs' cap (part of the cache key) */
	uint32_t *note_rank;	/* per notify index: producer rank */
	uint32_t *note_src;	/* per notify index: source index or NO_SRC */
	uint32_t refs;
	uint64_t used;		/* last use, for eviction */
	uint64_t rd_est;	/* bytes of its usual READ: the largest
				 * stream's bytes per piece (the READ window's
				 * first estimate, before any is posted) */
};
struct kvp_eng {
	uint32_t state;		/* 0: free; enum kvp_engine_state */
	uint32_t gen;		/* handle: gen << 16 | (index + 1) */
	int32_t status;
	uint32_t n;		/* producer TP size */
	uint32_t phase;
	uint32_t first;		/* rank met first, or whose blob was carried */
	uint32_t nconn;		/* connection slots held */
	uint32_t quiet;		/* kvp_agent_connect(): no engine events */
	uint32_t removing;
	uint32_t ups;		/* handshakes that succeeded */
	uint64_t engine_id;
	uint64_t t0, deadline;	/* the handshake's */
	uint32_t timeout_ms;	/* its last handshake's bound: on demand's */
	struct kvp_peer_addr *addr;	/* n */
	uint8_t **craw;		/* carried blobs as given, or NULL */
	uint32_t *craw_len;
	kvp_layout *ref;	/* the layout checks hold every rank to */
	struct kvp_pcache *pc;
	uint32_t nq;		/* queue pairs per producer rank */
	uint32_t *rank_conn;	/* n x nq: connection index or NO_CONN */
	uint64_t *retry_at;	/* n x nq: a refused queue pair's next
				 * attempt (ns), or 0 */
	uint32_t nretry;	/* entries of retry_at set */
	uint32_t refusals;	/* this handshake's: the backoff's exponent */
	uint32_t resets;	/* this handshake's resets tried again */
	int32_t retry_err;	/* the last refusal's (-EBUSY or -EUSERS) */
	uint32_t *note_conn;	/* per notify index: its rank's nq
				 * connections, nq entries each */
	struct kvp_stripe *stripes; /* max_inflight x nsrc, once up */
	struct kvp_sprog *sprog;    /* the same, for streamed requests */
	uint32_t *src_note;	    /* per source: its notify index (its
				     * queue pairs: note_conn[k * nq + q]) */
	uint32_t plan_cached;
	uint32_t wait_room;	/* EP_FIRST: its first connection waits for
				 * a slot (an evicted engine's drain) */
	uint32_t evicted;	/* going down to make room (max_qps) */
	uint64_t last_used;	/* its last pull, or UP: the LRU's key */
	struct kvp_why why;	/* why it went down (cleared at each start) */
	struct kvp_engine_info st;
	/* READs in flight per queue pair (the window: agent rd_win, fewer
	 * as rd_win_bytes allows for READs of its plan's size, then of the
	 * last doorbell's average), and the signalling period that goes
	 * with it (half the window: room comes back while READs are out). */
	uint32_t win, sig_every;
};

/* The connection index of source s's queue pair 0 (where its FOLLOWs,
 * notifications and progress records go). */
static inline uint32_t kvp__src_conn(const struct kvp_eng *e, uint32_t s)
{
	return e->note_conn[(size_t)e->src_note[s] * e->nq];
}

/* Producer: one request in the table, keyed by (consumer engine, req_id).
 * EARLY: notifications arrived before kvp_agent_expect(); EXPECTED: held
 * for the user; GONE: reported (RELEASED or EXPIRED) and remembered for
 * KVP_LINGER so that late or replayed notifications of it are dropped
 * rather than counted for a later request of the same id. */
enum ent_state { EN_FREE = 0, EN_EARLY, EN_EXPECTED, EN_GONE };
/* Producer: a consumer rank that follows a request (streaming): its
 * progress record there. Pool entry conn * fol_per + i. */
struct kvp_fol {
	uint64_t engine_id, req_id; /* the entry followed */
	uint32_t rec;	   /* the record's index in the connection's table */
	uint32_t tag;	   /* echoed in the record */
	uint32_t next;	   /* the entry's next follower, or NO_FOL */
	uint8_t used, writing, dirty, pad;
};
#define NO_FOL UINT32_MAX

struct kvp_ent {
	uint64_t req_id;
	uint64_t engine_id;
	uint64_t deadline; /* EXPECTED: the user's; EARLY, GONE: forgotten */
	uint32_t state;
	uint32_t count;	   /* distinct consumer ranks heard from */
	uint32_t expected; /* frozen once known; 0: not yet */
	uint32_t bm;	   /* EARLY, EXPECTED: its rank bitmap */
	uint32_t owner;	   /* EARLY: creating connection, gen << 16 | idx */
	uint32_t fol;	   /* first follower (streaming), or NO_FOL */
	uint32_t lease;	   /* EXPECTED: its lease's entry in the table
			    * (bucket * KVP_LEASE_BUCKET + i) */
	uint64_t gen;	   /* ... and generation */
	struct kvp_progress prog; /* published so far */
};

/* Producer: a consumer engine with connected ranks. Every rank of one
 * engine must declare the same TP size and yield the same notification
 * count. */
struct kvp_peng {
	uint64_t engine_id;
	uint32_t tp_size, expected;
	uint32_t nconns; /* 0: free */
};

/* Producer: a GONE entry's key, in the FIFO that forgets them. */
struct kvp_gone {
	uint64_t engine_id, req_id, deadline;
};

/* Metrics and the log (log.c, metrics.c): what the agent keeps for
 * kvp_agent_metrics() beyond its stats, at constant cost per event, and
 * the user's log callback. */
enum { OBS_BULK, OBS_STREAM };
enum { OBS_DONE, OBS_FAILED };
enum { OBS_HS_PRODUCER, OBS_HS_CONSUMER };
struct kvp_obs {
	kvp_log_fn log_fn;
	void *log_user;
	uint32_t log_level;	/* records at most this level; 0: none */
	struct kvp_hist pull[2][2];	/* [OBS_BULK/STREAM][OBS_DONE/FAILED] */
	struct kvp_hist handshake[2];	/* [OBS_HS_*] */
	struct kvp_hist exposed;	/* streamed: last progress seen to DONE */
	struct kvp_hist poll;		/* producer polls that did work */
	uint64_t refusals[KVP_REASON_COUNT]; /* producer, by reason */
};

/* ---- the agent ---------------------------------------------------------- */

struct kvp_agent {
	struct kvp_why last;	/* the last call that failed with a reason */
	uint32_t role;
	uint32_t producer, consumer; /* the sides this agent plays */
	uint32_t started, listening; /* blob made (registration closed) */
	char *src_addr; /* consumer: source address of connections */
	kvp_layout *layout;
	struct kvp_layout_info li;
	uint32_t max_ids, max_inflight, max_peers, sq_depth, max_sge;
	uint32_t max_read;	 /* the attribute: bytes per READ, 0: none */
	uint32_t plan_flags;	 /* the attribute: kvp_plan_attr.flags */
	uint32_t stream_events;	 /* the attribute */
	uint64_t max_mr;	 /* the attribute: bytes per MR, 0: device's */
	uint32_t tos;		 /* the attribute: 0, or the ToS + 1 */
	uint32_t qps;		 /* consumer: queue pairs per producer rank */
	struct kvp_limits lim;	 /* what the device grants (limits.c) */
	uint8_t *secret; /* NULL: none */
	uint32_t secret_len;
	uint32_t max_per_source, max_half_open;
	uint32_t prod_peers;	/* producer: consumer ranks at once */
	uint32_t prod_qps, cons_qps; /* each side's queue pair slots */
	uint64_t idle_ns;	/* producer: idle bound; UINT64_MAX: none */
	uint64_t next_timer_ns;	/* next kvp__conn_timers() while busy */
	uint32_t nhalf;		/* producer connections handshaking */
	uint32_t nreserved;	/* producer slots held for ranks' next QPs */
	uint32_t costly_left;	/* costly verbs steps a poll may still take:
				 * a QP's release (kvp__conn_drained()), a
				 * slot's first setup, a QP's creation and
				 * accept (listen.c) */
	struct kvp_wait *wq;	/* producer: connect requests waiting */
	uint32_t wq_cap, wq_head, wq_n;
	uint64_t idle_at;	/* producer: the next idle check (the earliest
				 * bound of a READY rank), UINT64_MAX: none */
	uint32_t nfol;		/* producer slots whose follower records are
				 * registered (a TABLE came) */
	uint32_t nprepared[2];	/* slots whose memory is set up, per side
				 * (producer, consumer) */
	/* Slots are taken lowest first and prepared once: those at or
	 * above each side's high-water mark were never used, and loops
	 * over the slots stop there (kvp__slot_next()). */
	uint32_t prod_hw;	/* producer slots [0, prod_hw) */
	uint32_t cons_end;	/* consumer slots [nprod, cons_end) */
	uint32_t nevicting;	/* producer: evicted connections draining */
	uint32_t evict_gen;	/* producer: marks one eviction's search */
	uint64_t handshake_ns;

	struct ibv_context **devs;
	struct ibv_context *ctx;
	struct ibv_device_attr dattr;
	struct ibv_pd *pd;
	struct ibv_comp_channel *cch;
	struct ibv_cq **cqs;	/* lim.ncq_prod + lim.ncq_cons (kvp__cq_of()) */
	uint32_t ncq;
	struct rdma_event_channel *ech;
	struct rdma_cm_id *listen_id;

	/* Regions: lreg[i] is region i's registration, its memory one MR or
	 * several (limits.h: kvp__mr_shift()), mr[i] its MRs. */
	struct kvp_emit_map *lreg;
	uint32_t *lnkeys;	/* per region: its MRs, 0: not registered */
	struct ibv_mr ***mr;
	/* Bytes an access may span in every region registered as several
	 * MRs (KVP_MR_WINDOW): READs are cut to it. UINT32_MAX: none. */
	uint32_t mr_window;

	/* Handshake control buffers: KVP_CTL_LEN to receive and to send per
	 * connection slot, registered once. */
	uint8_t *ctl;
	struct ibv_mr *ctl_mr;
	uint32_t npending; /* producer: blobs received, not yet checked */
	uint32_t peer_blob_cap; /* producer: largest consumer blob */
	uint32_t next_pending;

	/* Our metadata blob. */
	uint8_t *blob;
	size_t blob_len;
	struct ibv_mr *blob_mr;

	/* Connections: producer slots [0, nprod), consumer slots [nprod,
	 * nconns). */
	struct kvp_conn *conns;
	uint32_t nconns, nprod;
	uint32_t ndraining; /* connections waiting for drain markers */
	uint32_t ncons_free; /* consumer slots free */
	/* producer: per slot, credits given back since GO (per-QP receive
	 * queues: notification buffers re-posted) */
	uint64_t *ctr;
	/* One MR per slot's counter, of its 8 bytes only: a consumer's key
	 * reads its own counter and no other peer's. */
	struct ibv_mr **ctr_mr;
	/* Producer: followers of streaming requests, fol_per per connection
	 * slot, and the records their WRITEs send (registered once). */
	struct kvp_fol *fol;
	uint32_t fol_per;
	uint8_t *fol_rec;
	struct ibv_mr **fol_mr;	/* one a slot: its records alone */
	/* Producer: the lease table (lease.h), 2^lease_log2 buckets,
	 * registered for remote READ once; its incarnation (random, never
	 * 0) and the grants so far. */
	uint8_t *lease;
	struct ibv_mr *lease_mr;
	uint32_t lease_log2, lease_inc, lease_ctr;

	/* Consumer: engines, plans, requests (engine.c, post.c). */
	struct kvp_eng *engs;	/* max_peers */
	uint32_t nengs;		/* held */
	uint32_t nconnecting;	/* engines handshaking */
	uint32_t cons_evicting;	/* engines going down to make room */
	uint32_t def_eng;	/* kvp_agent_connect()'s handle, 0: none */
	struct kvp_pcache *pcache; /* max_peers */
	uint64_t pc_clock;
	uint64_t stall_ns;
	struct kvp_req *reqs;
	uint32_t free_req, nreq_reported;
	uint32_t *pq;		/* stall FIFO: slots in pull order */
	uint32_t *pq_seq;
	/* Requests in flight by (engine, req_id): slot + 1 per entry, 0
	 * empty; linear probing in pq_mask + 1 entries (at least twice
	 * max_inflight). */
	uint32_t *inflight;
	uint32_t pq_head, pq_tail, pq_mask, seq;
	uint32_t chunk_mask;
	uint8_t *note_buf;     /* per request slot: KVP_NOTE_LEN bytes, then
				* as many for its FOLLOW, then its note
				* flagged KVP_NOTE_UNHELD */
	struct ibv_mr *note_mr;
	/* Leases: KVP_LEASE_RING landing buffers of KVP_LEASE_READ bytes
	 * per consumer connection slot (one MR); lease_off: the check is
	 * off (KVP_LEASE_OFF=1 in the environment at open: for measuring
	 * its cost only). */
	uint8_t *lease_buf;
	struct ibv_mr *lease_mr_c;
	int lease_off;
	/* Streaming: per consumer connection slot, 2 * max_inflight progress
	 * records its producer rank WRITEs (one MR each: a producer writes
	 * its own connection's records only); the requests streamed. */
	uint8_t *ptab;
	struct ibv_mr **ptab_mr;
	uint32_t *sreq, nsreq;
	uint32_t sq_cap, sig_every;
	/* The READ window per queue pair (kvp_agent_attr.read_window and
	 * read_window_bytes, clamped): each engine's READs per window
	 * (kvp_eng.win) come from them. rd_win_default: neither was set
	 * (a loopback queue pair then has no window: kvp_conn.loop). */
	uint32_t rd_win, rd_win_bytes, rd_win_asked, rd_win_default;
	/* One posting chain: sq_cap WRs, each linked to the next, opcode
	 * READ and no flags between flushes (post.c restores what a flush
	 * changed), and their SGEs; the sink that emission writes them
	 * through (kvp_plan_emit_window_into()). */
	struct ibv_send_wr *swr;
	struct ibv_sge *ssge;
	uint32_t *dirty;	/* a flush's WRs other than plain READs */
	struct kvp_emit_sink sink;
	int bulk_now;

	/* Producer requests (serve.c). */
	struct kvp_ent *tab;
	/* tab_mask + 1 hints, by req_id alone: the last early notification
	 * of that req_id (its engine), so that an EXPIRED request can say
	 * another consumer engine notified it (KVP_REASON_OTHER_ENGINE). A
	 * hint is overwritten by a later req_id of the same slot: the reason
	 * may then be missing, never wrong. */
	struct kvp_hint {
		uint64_t req_id, engine_id;
	} *hint;
	uint32_t tab_mask, tab_used, nheld;
	uint64_t next_deadline; /* of EXPECTED and EARLY entries */
	uint32_t rq_depth;
	/* The shared receive queue (serve.c), NULL: one per queue pair. Its
	 * srq_n buffers of KVP_CTL_LEN bytes (registered SRQ_CHUNK at a
	 * time, as slots are first taken): KVP_CREDIT_OWN per slot taken,
	 * for its AUTH and then its own credits, and a pool of srq_pool
	 * credits lent to first queue pairs, a fair share each (crp). Its
	 * completions name a queue pair, not a slot: qpn_tab maps QP
	 * numbers to slot + 1 (linear probing, qpn_mask + 1 entries). */
	struct ibv_srq *srq;
	int srq_off;		/* kvp_agent_attr.srq: KVP_SRQ_OFF */
	int srq_full;		/* a post failed: it grows no more */
	uint8_t *srq_buf;
	struct ibv_mr **srq_mr;
	uint32_t srq_n, srq_cap, srq_pool;
	struct kvp_credit_pool crp; /* its loans (credit.h) */
	uint32_t cq_next;	/* the CQ the next drain starts with */
	uint32_t nfol_wait;	/* slots whose follower records wait to be
				 * registered (kvp__fol_register()) */
	uint32_t nauth_wait;	/* connections whose AUTH waits for its
				 * costly step (kvp__auth_step()) */
	uint32_t in_drain;	/* inside the completion drain, where
				 * nothing registers memory (fuzz_inbox
				 * checks) */
	uint32_t srq_last_wqe;	/* SRQ_LAST_WQE_*: does the device report a
				 * QP's last WQE (stats.srq_last_wqe) */
	uint32_t *cr_dirty, ncr_dirty; /* connections given credit this
					* poll, published when it ends */
	uint32_t *qpn_tab, qpn_mask;
	uint64_t *bm;		/* rank bitmaps, KVP_BM_WORDS each */
	uint32_t *bm_free, bm_nfree;
	uint32_t nearly, early_cap, early_per_conn;
	struct kvp_gone *gone;	/* FIFO, gone_cap entries */
	uint32_t gone_head, gone_tail, gone_cap;
	struct kvp_peng *peng;	/* max_peers entries */

	/* Events waiting for poll. */
	struct kvp_event *evq;
	uint32_t ev_head, ev_tail, ev_cap;

	uint64_t next_cm_ns;
	int armed;
	struct ibv_wc wc[32];
	struct kvp_agent_stats st;
	struct kvp_obs obs;
};

/* The READ window of engine e for READs of about `avg` bytes (0:
 * unknown): a->rd_win READs, fewer when they would pass rd_win_bytes,
 * one at least; a signal every half window. Per doorbell, never per
 * READ. */
static inline void kvp__eng_window(const kvp_agent *a, struct kvp_eng *e,
				   uint64_t avg)
{
	uint64_t n = avg ? a->rd_win_bytes / avg : a->rd_win;

	e->win = n < 1 ? 1 : n > a->rd_win ? a->rd_win : (uint32_t)n;
	e->sig_every = e->win / 2 ? e->win / 2 : 1;
	if (e->sig_every > a->sig_every)
		e->sig_every = a->sig_every;
}

/* The floors of verbs/ (docs/internals.md, "Floors of verbs/"): each file calls
 * only the files of the floors below its own.
 *   agent.c                 the public agent calls, the poll loop; hands
 *                           each completion and rdma_cm event to its side
 *   pull.c > post.c > engine.c > plans.c, connect.c
 *                           the consumer side      (never the producer's)
 *   listen.c > serve.c      the producer side      (never the consumer's)
 *   reg.c, conn.c           memory registration; connections
 *   event.c, wrap.c, limits.c, hmac.c, why.c
 *                           the event queue, rdma-core, device limits,
 *                           HMAC, reasons: they call nothing of verbs/ */

/* log.c: the log callback's records, and the counts metrics keep of
 * what they report (a floor of its own: it calls nothing above it) */
static inline int kvp__log_on(const kvp_agent *a, uint32_t level)
{
	return kvp_unlikely(a->obs.log_level >= level);
}
/* Every event queued (kvp__ev_push()): its record, when the level allows. */
KVP_HIDDEN void kvp__log_event(kvp_agent *a, const struct kvp_event *ev);
/* Consumer: request q accepted from engine `engine` (KVP_LOG_DEBUG). */
KVP_HIDDEN void kvp__log_pull(kvp_agent *a, const struct kvp_req *q,
			      uint64_t engine_id, uint32_t engine);
/* A reason's short name ("auth", "peer_full"...; "other" past the
 * list): metric labels. */
KVP_HIDDEN const char *kvp__reason_name(uint32_t r);
/* Producer: a connect request refused (id, before it is destroyed) or a
 * connection's handshake (c): counted by reason, and its record. */
KVP_HIDDEN void kvp__obs_refused(kvp_agent *a, struct rdma_cm_id *id,
				 const struct kvp_conn *c, int err,
				 uint32_t reason, uint32_t retry_ms);
/* Producer: consumer rank c disconnected to make room (kind
 * KVP_LOG_EVICTED) or for idleness (KVP_LOG_IDLE_CLOSED). */
KVP_HIDDEN void kvp__obs_closed(kvp_agent *a, const struct kvp_conn *c,
				uint32_t kind);

/* event.c: events waiting for kvp_agent_poll() */
KVP_HIDDEN int kvp__ev_room(const kvp_agent *a);
KVP_HIDDEN void kvp__ev_push(kvp_agent *a, const struct kvp_event *ev);

/* reg.c: memory registration (kvp_agent_register*()) */
/* Deregisters region `region`'s MRs, if any. */
KVP_HIDDEN void kvp__reg_drop(kvp_agent *a, uint32_t region);

/* serve.c: the producer's requests and consumer engines */
/* A progress WRITE to a follower completed (WK_PROGRESS). */
KVP_HIDDEN void kvp__progress_wc(kvp_agent *a, struct kvp_conn *c,
				 const struct ibv_wc *wc);
/* Connection c is going: its followers stop following. */
KVP_HIDDEN void kvp__follow_conn_gone(kvp_agent *a, struct kvp_conn *c);
/* A notification receive buffer completed (WK_NOTE_RECV). */
KVP_HIDDEN void kvp__note_wc(kvp_agent *a, struct kvp_conn *c,
			     const struct ibv_wc *wc);
/* A message a consumer rank sent (m, len bytes, received in one of the
 * connection's buffers or the shared queue's): a notification, FOLLOW,
 * TABLE or BYE, or dropped. */
KVP_HIDDEN void kvp__note_msg(kvp_agent *a, struct kvp_conn *c,
			      const uint8_t *m, uint32_t len);
KVP_HIDDEN int kvp__serve_alloc(kvp_agent *a);
KVP_HIDDEN void kvp__serve_free(kvp_agent *a);

/* srq.c: the producer's shared receive queue (see there). */
#define SRQ_CHUNK 64 /* buffers registered at a time: 4 KiB */
#define SRQ_W0 8     /* credits a rank's first QP may borrow at GO */
/* Its buffers for an agent of a->nprod slots and rq_depth (0: a receive
 * queue per QP: none asked, the device has none, or too few). */
KVP_HIDDEN uint32_t kvp__srq_want(const kvp_agent *a, uint32_t rq_depth);
/* Creates it (a->srq_cap buffers at most) with the pool's buffers
 * posted; 0 or -errno, nothing kept then. */
KVP_HIDDEN int kvp__srq_open(kvp_agent *a);
KVP_HIDDEN void kvp__srq_close(kvp_agent *a);
/* At least n buffers posted (a slot first taken: its own). */
KVP_HIDDEN int kvp__srq_grow(kvp_agent *a, uint32_t n);
KVP_HIDDEN void kvp__srq_repost(kvp_agent *a, uint32_t i);
KVP_HIDDEN void kvp__qpn_add(kvp_agent *a, struct kvp_conn *c);
KVP_HIDDEN void kvp__qpn_del(kvp_agent *a, struct kvp_conn *c);
KVP_HIDDEN struct kvp_conn *kvp__qpn_find(kvp_agent *a, uint32_t qpn);
/* GO's credits for c, its qi-th QP of its rank: its own buffers, and a
 * loan from the pool for a first QP. */
KVP_HIDDEN uint32_t kvp__srq_credits(kvp_agent *a, struct kvp_conn *c,
				     uint32_t qi);
/* A message of c's was taken (give: a GIVE of n credits beyond its own)
 * and its buffer re-posted: its credit back, a loan more or one taken
 * back, published at the poll's end. 0, or -EPROTO: c sent past its
 * credit (credit.h; the caller drops it). */
KVP_HIDDEN int kvp__srq_took(kvp_agent *a, struct kvp_conn *c, int give,
			     uint32_t n);
/* The poll ends: the credit given during it, written to the counters the
 * consumers READ. */
KVP_HIDDEN void kvp__srq_publish(kvp_agent *a);
/* c is released: its loans back, its QP number forgotten. */
KVP_HIDDEN void kvp__srq_conn_gone(kvp_agent *a, struct kvp_conn *c);
/* inbox.c: a completion of the shared receive queue. */
KVP_HIDDEN void kvp__srq_wc(kvp_agent *a, const struct ibv_wc *wc);
/* Registers the follower records of slots whose first TABLE came, as the
 * poll's costly steps allow (never in the completion drain); their
 * followers' progress goes out then. */
KVP_HIDDEN void kvp__fol_register(kvp_agent *a);
/* Producer, a costly step after the completion drain: the AUTHs that
 * checked out, each its blob's buffer registered, its READ and GO posted
 * (never inside the drain: a registration pins pages). */
KVP_HIDDEN void kvp__auth_step(kvp_agent *a);
/* Expires requests, forgets early and gone entries whose time is up. */
KVP_HIDDEN void kvp__serve_timers(kvp_agent *a, uint64_t now);
/* A consumer rank of engine `engine_id` with TP size tp_size and
 * notification count `expected` joins (0; -EPROTO when it disagrees with
 * the engine's other ranks; -EBUSY when no record is free) or leaves. */
KVP_HIDDEN int kvp__engine_join(kvp_agent *a, struct kvp_conn *c);
KVP_HIDDEN void kvp__engine_leave(kvp_agent *a, struct kvp_conn *c);
/* Whether consumer rank `rank` of engine `engine` has a request in flight
 * here: one of its engine's expected or early that it has not notified
 * yet (so possibly followed, or being read), or, when it sent a message
 * within idle_ns, READs its queue pairs took lately (a pull before
 * kvp_agent_expect(): nothing in the table shows it). A rank that
 * notified every one is done with them, whatever its engine's other
 * ranks do. One pass over the table and the slots; reads each of the
 * rank's queue pairs' PSN (kvp__qp_rq_psn()): cold paths only. */
KVP_HIDDEN int kvp__rank_busy(const kvp_agent *a, uint64_t engine,
			      uint32_t rank);
/* Producer: disconnects each consumer rank (-ETIMEDOUT) READY and unused
 * for idle_ns with nothing of its engine in flight here (one that has
 * something is checked again idle_ns later). */
KVP_HIDDEN void kvp__idle_sweep(kvp_agent *a, uint64_t now);

/* conn.c: what both sides' connections share */
KVP_HIDDEN void kvp__conn_fail(kvp_agent *a, struct kvp_conn *c, int err);
KVP_HIDDEN void kvp__conn_release(kvp_agent *a, struct kvp_conn *c);
KVP_HIDDEN void kvp__conn_drained(kvp_agent *a, struct kvp_conn *c);
/* Queues c's DISCONNECTED event, once per connection life, and only when
 * `last` (no other connection of its peer rank is still to be reported):
 * status 0 and KVP_REASON_CLOSED after the peer's BYE, else c->status
 * with w's reason when it holds one (w may be NULL), or its errno's. */
KVP_HIDDEN void kvp__conn_report(kvp_agent *a, struct kvp_conn *c, int last,
				 const struct kvp_why *w, uint32_t engine);
KVP_HIDDEN void kvp__probe_wc(kvp_agent *a, struct kvp_conn *c,
			      const struct ibv_wc *wc);
/* Drain and handshake deadlines; called about once a millisecond. */
KVP_HIDDEN void kvp__conn_timers(kvp_agent *a, uint64_t now);
KVP_HIDDEN int kvp__post_note_recv(kvp_agent *a, struct kvp_conn *c,
				   uint32_t i);
KVP_HIDDEN int kvp__regions_ready(const kvp_agent *a);
KVP_HIDDEN void kvp__hello_fill(const kvp_agent *a, uint32_t side,
				 struct kvp_hello *h);
/* Makes our blob once (registration closes): listen and the first
 * engine. */
KVP_HIDDEN int kvp__blob_make(kvp_agent *a);
KVP_HIDDEN void kvp__blob_free(kvp_agent *a);
KVP_HIDDEN struct kvp_conn *kvp__conns_alloc(uint32_t n);
int kvp__slot_prepare(kvp_agent *a, struct kvp_conn *c);
/* Frees what slots keep between peers (a producer slot's notification
 * buffers, registered with its first handshake). At close. */
void kvp__slots_free(kvp_agent *a);

/* The CQ index of connection slot c: slots share CQs in runs (limits.h);
 * kvp__cq_make() creates it with the run's first slot. */
static inline uint32_t kvp__cq_idx(const kvp_agent *a,
				   const struct kvp_conn *c)
{
	if (c->idx < a->nprod)
		return c->idx / a->lim.prod_per_cq;
	return a->lim.ncq_prod + (c->idx - a->nprod) / a->lim.cons_per_cq;
}

static inline struct ibv_cq *kvp__cq_of(const kvp_agent *a,
					const struct kvp_conn *c)
{
	return a->cqs[kvp__cq_idx(a, c)];
}

int kvp__cq_make(kvp_agent *a, uint32_t k);

/* A producer connection handshaking (counted in a->nhalf). */
static inline int kvp__half_open(const struct kvp_conn *c)
{
	return c->side == KVP_ROLE_PRODUCER &&
	       (c->state == CS_CONNECTING || c->state == CS_HANDSHAKE);
}

/* Every change of a connection's state goes through here: the count of
 * handshakes under way stays exact without a walk of the slots. */
static inline void kvp__set_state(kvp_agent *a, struct kvp_conn *c,
				  uint32_t state)
{
	a->nhalf -= (uint32_t)kvp__half_open(c);
	c->state = state;
	a->nhalf += (uint32_t)kvp__half_open(c);
}

/* Walks the slots ever used, both sides:
 *   for (i = kvp__slot_next(a, 0); i < a->nconns; i = kvp__slot_next(a, i + 1))
 */
static inline uint32_t kvp__slot_next(const kvp_agent *a, uint32_t i)
{
	if (i >= a->prod_hw && i < a->nprod)
		i = a->nprod;
	return i >= a->cons_end ? a->nconns : i;
}
/* The control buffers of n connection slots, registered. */
KVP_HIDDEN int kvp__ctl_alloc(kvp_agent *a, uint32_t n);
KVP_HIDDEN void kvp__ctl_free(kvp_agent *a);
KVP_HIDDEN uint8_t *kvp__ctl_rx(const kvp_agent *a, const struct kvp_conn *c);
KVP_HIDDEN uint8_t *kvp__ctl_tx(const kvp_agent *a, const struct kvp_conn *c);
/* A slot's third control buffer, never posted as a receive: the
 * consumer's credit counter READ lands at its start (CTL_AUX_CREDIT), its
 * GIVE is sent from its second half (CTL_AUX_GIVE). */
KVP_HIDDEN uint8_t *kvp__ctl_aux(const kvp_agent *a, const struct kvp_conn *c);
#define KVP_CTL_SLOT (3 * KVP_CTL_LEN) /* rx, tx, aux */
#define CTL_AUX_CREDIT 0
#define CTL_AUX_GIVE (KVP_CTL_LEN / 2)
KVP_HIDDEN int kvp__post_ctl_recv(kvp_agent *a, struct kvp_conn *c);
/* SENDs the first len bytes of c's control send buffer. */
KVP_HIDDEN int kvp__post_ctl_send(kvp_agent *a, struct kvp_conn *c,
				  uint32_t len);
KVP_HIDDEN int kvp__post_send1(struct kvp_conn *c, uint64_t wr_id,
			       void *buf, uint32_t len, uint32_t lkey);
KVP_HIDDEN int kvp__post_recv1(struct kvp_conn *c, uint64_t wr_id,
			       void *buf, uint32_t len, uint32_t lkey);
/* A signalled READ of len bytes at raddr (rkey) into buf. */
KVP_HIDDEN int kvp__post_read1(struct kvp_conn *c, uint64_t wr_id,
			       void *buf, uint32_t len, uint32_t lkey,
			       uint64_t raddr, uint32_t rkey);
/* A registered buffer for the peer's blob of c->peer_blob bytes. */
KVP_HIDDEN int kvp__peer_blob_alloc(kvp_agent *a, struct kvp_conn *c);
/* Its release (none: nothing). */
KVP_HIDDEN void kvp__peer_blob_free(struct kvp_conn *c);
/* Maps a refusal's code to the documented set (-EPROTO otherwise). */
KVP_HIDDEN int kvp__refusal_errno(int32_t err);

/* listen.c: the producer's connections */
KVP_HIDDEN extern const struct kvp_conn_ops kvp__producer_ops;
/* Returns 1 when it set up a connection slot (a QP), 0 when it refused
 * the request outright or queued it (max_half_open handshakes under way,
 * or others waiting before it). */
KVP_HIDDEN int kvp__accept_conn(kvp_agent *a, struct rdma_cm_id *id,
				const uint8_t *pdata, uint32_t plen,
				uint8_t responder_resources);
/* The connect requests waiting for a handshake to end, in arrival order:
 * the first is taken once fewer than max_half_open are under way (1: a
 * QP was set up); one waiting longer than handshake_ms is refused with a
 * retry hint. */
KVP_HIDDEN int kvp__accept_waiting(kvp_agent *a, uint64_t now);
/* An AUTH from the shared receive queue (inbox.c): checked, GO or a
 * refusal sent. */
KVP_HIDDEN void kvp__auth_in(kvp_agent *a, struct kvp_conn *c,
			     const uint8_t *m, uint32_t len);

/* admit.c: the producer's admission policy */
/* Turns a connect request down (its id destroyed), telling the consumer
 * why; retry_ms: when a full producer expects room again (0: no hint). */
KVP_HIDDEN void kvp__reject_req(kvp_agent *a, struct rdma_cm_id *id, int err,
				uint32_t reason, uint32_t retry_ms);
/* A free slot for queue pair qi (of nq) of consumer rank (src, engine,
 * rank), or NULL with *err (-EUSERS: its address or rank is full;
 * -EBUSY: handshakes or slots), the retry hint and *full (1: its
 * address's ranks, 2: every slot; an eviction may make room). *hd: the
 * rank's first connection. */
KVP_HIDDEN struct kvp_conn *kvp__slot_for(kvp_agent *a, const uint8_t *src,
					  uint64_t engine, uint32_t rank,
					  uint32_t nq, uint32_t qi,
					  struct kvp_conn **hd, int *err,
					  uint32_t *retry_ms, int *full);
/* Room for a newcomer from src (NULL: any address): the least recently
 * used idle consumer rank is disconnected. 1 when room is coming. */
KVP_HIDDEN int kvp__evict_idle(kvp_agent *a, const uint8_t *src);
KVP_HIDDEN int kvp__wait_alloc(kvp_agent *a);
KVP_HIDDEN void kvp__wait_free(kvp_agent *a);
/* Queues a connect request (0), or -ENOSPC: the queue, or its address's
 * three quarters of it, full. front: one that had waited already. */
KVP_HIDDEN int kvp__wait_push(kvp_agent *a, struct rdma_cm_id *id,
			      const uint8_t *src, const uint8_t *pdata,
			      uint32_t plen, uint8_t rr, uint64_t since,
			      int front);
KVP_HIDDEN int kvp__wait_take(kvp_agent *a, uint64_t now,
			      struct kvp_wait *w);
KVP_HIDDEN void kvp__producer_event(kvp_agent *a, struct kvp_conn *c,
				    enum rdma_cm_event_type type);
KVP_HIDDEN void kvp__producer_wc(kvp_agent *a, struct kvp_conn *c,
				 const struct ibv_wc *wc);
/* Checks one received consumer blob (at most one per poll: a blob's
 * decode and checks are the largest work a peer can ask of a poll). */
KVP_HIDDEN void kvp__blob_check_one(kvp_agent *a);

/* connect.c: the consumer's connections */
KVP_HIDDEN void kvp__consumer_event(kvp_agent *a, struct kvp_conn *c,
				    enum rdma_cm_event_type type,
				    const uint8_t *pdata, uint32_t plen);
KVP_HIDDEN void kvp__consumer_wc(kvp_agent *a, struct kvp_conn *c,
				 const struct ibv_wc *wc);
/* Starts connecting consumer slot c to producer rank `rank` of engine e
 * at p. 0 or -errno (c left free). */
KVP_HIDDEN int kvp__conn_start(kvp_agent *a, struct kvp_conn *c,
			       struct kvp_eng *e, uint32_t rank,
			       const struct kvp_peer_addr *p);

/* plans.c: plans shared by geometry */
/* Whether two layouts have the same geometry: all a plan depends on. */
KVP_HIDDEN int kvp__geo_equal(const kvp_layout *x, const kvp_layout *y);
/* The longest access every region of l allows: the MR window of those
 * registered as several MRs, else UINT32_MAX. */
KVP_HIDDEN uint32_t kvp__keys_window(const kvp_layout *l);
/* Engine e's plan (e->pc, referenced) for its reference layout: from the
 * cache, or compiled and cached. 0, -EPROTO (the reason in e->why),
 * -ENOMEM. */
KVP_HIDDEN int kvp__plan_resolve(kvp_agent *a, struct kvp_eng *e);
KVP_HIDDEN void kvp__pc_free(struct kvp_pcache *pc);

/* engine.c: the consumer's producer engines */
/* The consumer side's conn_ops.failed: c's DISCONNECTED event (unless
 * its engine is quiet or being removed), then the rest of its engine. */
KVP_HIDDEN void kvp__consumer_failed(kvp_agent *a, struct kvp_conn *c,
				     int was_ready);
/* kvp_agent_add_engine()'s checks of ranks[]: 0 or -EINVAL. */
KVP_HIDDEN int kvp__engine_check_ranks(const kvp_agent *a,
				       const struct kvp_peer *ranks,
				       uint32_t n);
/* Takes an engine record and starts its handshake: 0 and its handle in
 * *engine (a start that fails takes the engine down with an event), or
 * -errno with nothing held. quiet: no engine events (kvp_agent_connect()). */
KVP_HIDDEN int kvp__engine_add(kvp_agent *a, const struct kvp_peer *ranks,
			       uint32_t n, uint32_t timeout_ms, uint32_t quiet,
			       uint32_t *engine);
/* Frees a DOWN engine's record. */
KVP_HIDDEN void kvp__engine_drop(kvp_agent *a, struct kvp_eng *e);
KVP_HIDDEN int kvp__engines_alloc(kvp_agent *a);
KVP_HIDDEN void kvp__engines_free(kvp_agent *a);
/* Moves handshaking engines on (after completions and rdma_cm events). */
KVP_HIDDEN void kvp__engines_step(kvp_agent *a, uint64_t now);
/* When kvp__engines_step() must run next for a handshaking engine: its
 * deadline, or a refused queue pair's retry time if earlier. */
KVP_HIDDEN uint64_t kvp__engine_wake(const struct kvp_eng *e);
/* A consumer connection of engine e was released (drained, failed). */
KVP_HIDDEN void kvp__engine_conn_gone(kvp_agent *a, struct kvp_eng *e,
				      uint32_t idx, int err);
/* Connection idx of engine e, refused by a full producer, drained: its
 * slot is free and its queue pair waits for e->retry_at. */
KVP_HIDDEN void kvp__engine_conn_retry(struct kvp_eng *e, uint32_t idx);
/* Fails engine e: every connection to error, requests not DONE fail. */
KVP_HIDDEN void kvp__engine_fail(kvp_agent *a, struct kvp_eng *e, int err);
KVP_HIDDEN struct kvp_eng *kvp__engine_get(const kvp_agent *a, uint32_t h);
KVP_HIDDEN uint32_t kvp__engine_handle(const kvp_agent *a,
				       const struct kvp_eng *e);

/* req.c: the consumer's requests */
/* The inflight table's entry of (eng, req_id), or of the empty entry
 * where it would go: a->inflight[i] is the slot + 1, or 0. */
KVP_HIDDEN uint32_t kvp__inflight_find(const kvp_agent *a, uint32_t eng,
				       uint64_t req_id);
/* One of the request's pending parts is in (err: it failed): the last
 * one queues its DONE or FAILED event. */
KVP_HIDDEN void kvp__req_data_in(kvp_agent *a, struct kvp_req *r, int err);
/* One of its notifications completed or was dropped. */
KVP_HIDDEN void kvp__req_note_done(kvp_agent *a, struct kvp_req *r);
/* A streamed request's layers [0, layers) landed: KVP_EV_ARRIVED (when
 * the event queue has room to spare: a later one says more). */
KVP_HIDDEN void kvp__req_arrived(kvp_agent *a, struct kvp_req *r,
				 uint32_t layers);
/* Hands a DONE or FAILED event to the user: what its slot becomes. */
KVP_HIDDEN void kvp__req_delivered(kvp_agent *a, struct kvp_event *ev);
/* FAILED slots lend their ids until the next poll: then they go. */
KVP_HIDDEN void kvp__req_reap(kvp_agent *a);

/* post.c: the consumer's posting and send completions */
/* The consumer side's conn_ops: failed (engine.c), drained (fails the
 * chunks the connection still holds, releases it, tells its engine). */
KVP_HIDDEN extern const struct kvp_conn_ops kvp__consumer_ops;
/* Emits and posts what c's chunks have waiting, as its room allows. */
KVP_HIDDEN void kvp__conn_flush(kvp_agent *a, struct kvp_conn *c);
/* A draining QP of the shared receive queue: the device reported its last
 * WQE (seen), or LASTWQE_NS passed without it. */
KVP_HIDDEN void kvp__conn_last_wqe(kvp_agent *a, struct kvp_conn *c,
				   int seen);
/* How long a QP of the shared receive queue waits for its last WQE event
 * while the device's habit is unknown (on a NIC it comes within
 * microseconds of the QP's error). */
#define LASTWQE_NS 200000000ull
enum { SRQ_LAST_WQE_UNKNOWN, SRQ_LAST_WQE_SEEN, SRQ_LAST_WQE_ABSENT };
/* Consumer timers: a first queue pair quiet for KVP_GIVE_NS hands its
 * loans back (GIVE). */
KVP_HIDDEN void kvp__conn_give(kvp_agent *a, struct kvp_conn *c,
			       uint64_t now);
KVP_HIDDEN void kvp__send_wc(kvp_agent *a, struct kvp_conn *c,
			     const struct ibv_wc *wc);

/* pull.c: the consumer's pulls */
/* Request slots, notification buffers, posting scratch: at open. */
KVP_HIDDEN int kvp__data_alloc(kvp_agent *a);
KVP_HIDDEN void kvp__data_free(kvp_agent *a);
/* Streamed requests: new progress in their records (then their queue
 * pairs are flushed), and the stall bound of each. Every poll while any
 * is streamed. */
KVP_HIDDEN void kvp__stream_scan(kvp_agent *a, uint64_t now);
/* Stalls: pulls not in and notifications starved past stall_ns;
 * credit counter re-reads. About once a millisecond. */
KVP_HIDDEN void kvp__pull_timers(kvp_agent *a, uint64_t now);

#endif
