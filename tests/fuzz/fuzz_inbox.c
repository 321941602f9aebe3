// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for what connected consumers can make a producer do:
 * the messages of its receive queues (AUTH, notifications, TABLE, FOLLOW,
 * GIVE, BYE, anything else), the connect requests before them (the hello
 * and its proof), and the device's answers, interleaved with
 * kvp_agent_expect(), kvp_agent_publish(), kvp_agent_poll() and the
 * clock. Everything of the library runs as it does on a NIC: the agent is
 * opened, registered and listening with the public calls, and polled;
 * the device under it is a fake (below), so that no path is left out for
 * want of a queue pair.
 *
 * The fake device. The verbs and rdma_cm calls of verbs/wrap.c are
 * redirected at link time (-Wl,--wrap=SYM, the fuzz and replay builds of
 * this target only: the Makefile's FUZZ_INBOX_WRAP) to __wrap_SYM here;
 * the ones libibverbs inlines (ibv_post_send(), ibv_post_recv(),
 * ibv_post_srq_recv(), ibv_poll_cq(), ibv_req_notify_cq()) call through
 * the context's ops, which are ours. Queue pairs keep their send and
 * receive queues; a WR's slot frees when its completion is polled, as on a
 * NIC; an error completion or the error state flushes what is left; a
 * consumer's message takes the oldest buffer of the shared receive queue
 * (or of its queue pair's) and completes on the CQ of its queue pair; the
 * clock (clock_gettime(), poll()'s timeout) is virtual and moves only
 * when read (1 us a read) or when an input says so; getrandom() is a
 * counter. So a run depends on its input alone.
 *
 * The consumers. Up to NSIM simulated consumer connections (three
 * consumer engines of TP 1, 2 and 4 running the producer's model, built
 * from a preset, each rank's metadata blob encoded once, and an impostor
 * with engine 1's id and TP 4), each a queue pair of a rank: a connect
 * request with its hello (and the HMAC proof of it with a secret; fields
 * and proof broken when the input says), the AUTH (its MAC right,
 * mostly), its blob READ by the producer (as encoded, another rank's, the
 * hello's length short, bytes flipped, or another model's), then
 * messages. A consumer reads its credit counter where GO said (an
 * in-process read) and, when the input says it keeps to its credit,
 * sends only within it.
 *
 * Input: 6 bytes of configuration (shared receive queue, a device
 * without, or one refused by the attribute; secret; idle bound; the
 * device's last-WQE events; its max_srq_wr and max_cqe; max_inflight,
 * max_peers, max_qps, max_per_source, rq_depth, handshake bound), then
 * operations (at most MAX_OPS),
 * each a byte (operation) and its arguments: a message (kind, fields
 * from the input, the magic set unless a byte says otherwise), a connect
 * request, a whole handshake, one step of it, ESTABLISHED, a consumer's
 * disconnect, completions of the producer's WRs (an error among them),
 * kvp_agent_poll(), kvp_agent_expect(), kvp_agent_publish(), the clock, an
 * asynchronous event (last WQE, QP fatal, port error), kvp_agent_arm()
 * (then the clock to its wake time), a verbs call made to fail once
 * (registration, posts, QP creation, accept, queries), READs (a consumer
 * rank's PSN moves). The agent is closed at the end.
 * FUZZ_INBOX_TRACE=1 in the environment prints each operation and the
 * consumers' states.
 *
 * Checks (abort() on violation), after every operation:
 *  - the request table: tab_used is the entries in use, at most half the
 *    table; nearly the EARLY entries, at most early_cap; each connection's
 *    nearly the EARLY entries it created, at most early_per_conn; nheld
 *    the EXPECTED entries plus the RELEASED and EXPIRED events not yet
 *    delivered, at most max_inflight; a rank bitmap per EARLY and
 *    EXPECTED entry, none shared, the rest free; GONE entries within the
 *    gone FIFO and without followers;
 *  - events: RELEASED and EXPIRED only for a request expected (once per
 *    kvp_agent_expect() that returned 0: none reported twice), RELEASED
 *    only once the consumers delivered that many notifications of it
 *    (the engine's notification count each), DISCONNECTED only for a
 *    rank that was ready; the counts of each equal stats.released,
 *    stats.expired and stats.disconnects (none dropped);
 *  - connections: nhalf, ndraining, npending, nreserved, nevicting,
 *    nprepared, nfol and nfol_wait equal what the slots hold; each
 *    consumer engine record counts its connections;
 *  - credit (credit.h): for each live connection what it may fill
 *    (kvp__credit_hold()) is its own credits and its loans; the loans and
 *    the pool's free ones add up to the pool; the borrowers are the first
 *    queue pairs live; the queue has the buffers of the slots prepared and
 *    the pool; every buffer of the shared queue is posted or in a
 *    completion not yet polled (none posted twice, none lost); while every
 *    consumer kept to its credit, none was dropped for abuse and none met
 *    an empty queue (unless an unpolled completion held a buffer);
 *  - followers: each used one is in the chain of the request it names, in
 *    one chain only, on a connection slot in use;
 *  - leases (verbs/lease.h, when the library has them): an EXPECTED
 *    request's lease passes the consumer's check (kvp__lease_check()), a
 *    reported one's does not, and the table holds as many leases as
 *    requests EXPECTED;
 *  - the device: every SGE within a registered MR of its key (a READ's
 *    and a receive's with local write), no CQ overrun, GO's counter
 *    address inside an MR its rkey reads, a progress WRITE inside a TABLE
 *    its consumer sent, with that TABLE's rkey; after kvp_agent_close()
 *    every object the library made destroyed (the leak checker sees the
 *    memory).
 *
 *   make fuzz
 *   build/fuzz/fuzz_inbox -max_total_time=600 tests/fuzz/corpus/inbox
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "../../verbs/internal.h"
#include "kvpull.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define NSIM 16
#define NENG 3
#define MAX_OPS 1500
#define NREQ 8
#define REQ_BASE 0x100u
#define PROD_ENGINE 0x5000u
#define SQ_MAX 64
#define RQ_MAX 160

static void fail(const char *what, long v)
{
	fprintf(stderr, "fuzz_inbox: invariant broken: %s (%ld)\n", what, v);
	abort();
}

#define CHECK(cond, v)                                                        \
	do {                                                                  \
		if (!(cond))                                                  \
			fail(#cond, (long)(v));                               \
	} while (0)

/* FUZZ_INBOX_TRACE=1 in the environment: each operation and the
 * consumers' states on stderr (to read what an input does). */
static int trace;

/* ---- the input ----------------------------------------------------------- */

static const uint8_t *in_p;
static size_t in_n, in_i;

static uint8_t u8(void)
{
	return in_i < in_n ? in_p[in_i++] : 0;
}

static uint32_t u16(void)
{
	uint32_t v = u8();

	return v | (uint32_t)u8() << 8;
}

static uint32_t u32(void)
{
	uint32_t v = u16();

	return v | u16() << 16;
}

static uint64_t u64(void)
{
	uint64_t v = u32();

	return v | (uint64_t)u32() << 32;
}

/* ---- the clock and the random source ------------------------------------- */

static int fz_on;	/* inside an input: the clock is virtual */
static uint64_t vnow;	/* ns */
static uint64_t rnd_ctr;
#define WALL_BASE 1800000000ull /* seconds: the virtual epoch's wall clock */

int __real_clock_gettime(clockid_t clk, struct timespec *ts);
int __wrap_clock_gettime(clockid_t clk, struct timespec *ts);
ssize_t __wrap_getrandom(void *buf, size_t n, unsigned int flags);
int __wrap_poll(struct pollfd *fds, nfds_t n, int timeout);

int __wrap_clock_gettime(clockid_t clk, struct timespec *ts)
{
	uint64_t t;

	if (!fz_on)
		return __real_clock_gettime(clk, ts);
	t = vnow;
	vnow += 1000;
	if (clk == CLOCK_REALTIME)
		t += WALL_BASE * 1000000000ull;
	ts->tv_sec = (time_t)(t / 1000000000ull);
	ts->tv_nsec = (long)(t % 1000000000ull);
	return 0;
}

ssize_t __wrap_getrandom(void *buf, size_t n, unsigned int flags)
{
	uint8_t *p = buf;
	size_t i;

	for (i = 0; i < n; i++)
		p[i] = (uint8_t)kvp__mix64(++rnd_ctr);
	return (ssize_t)n;
}

int __wrap_poll(struct pollfd *fds, nfds_t n, int timeout)
{
	if (timeout > 0)
		vnow += (uint64_t)timeout * 1000000ull;
	return 0;
}

/* ---- the fake device ------------------------------------------------------ */

enum { F_REG = 1, F_POST_SEND = 2, F_POST_RECV = 4, F_POST_SRQ = 8,
       F_CREATE_QP = 16, F_ACCEPT = 32, F_QUERY_QP = 64, F_MODIFY_QP = 128 };

struct fk_mr {
	struct ibv_mr mr;
	int access;
	struct fk_mr *next;
};

struct fk_cq {
	struct ibv_cq cq;
	struct ibv_wc *q;
	uint32_t cap, head, n;
	struct fk_cq *next;
};

struct fk_rwr {
	uint64_t wr_id, addr;
	uint32_t len;
};

struct fk_srq {
	struct ibv_srq srq;
	uint32_t max_wr, head, n;
	struct fk_rwr *q;
};

struct fk_swr {
	uint64_t wr_id, addr, raddr;
	uint32_t len, rkey, num_sge;
	int opcode;
	uint8_t data[KVP_CTL_LEN]; /* a SEND's or WRITE's bytes at post */
};

struct fk_qp {
	struct ibv_qp qp;
	uint32_t sq_cap, sq_used; /* slots: freed when their CQE is polled */
	uint32_t rq_cap, rq_used;
	struct fk_swr sq[SQ_MAX]; /* WRs posted, not completed */
	uint32_t sq_head, sq_n;
	struct fk_rwr rq[RQ_MAX]; /* receives posted (no SRQ) */
	uint32_t rq_head, rq_n;
	int err;
	uint32_t psn;
	int sim;		  /* its consumer, or -1 */
	struct fk_qp *next;
};

struct fk_id {
	struct rdma_cm_id id;
	int sim;		/* its consumer, or -1 */
	int disc;		/* a DISCONNECTED is queued or was */
	int taken;		/* the library took its connect request */
	struct fk_id *next;
};

struct fk_ev {
	struct rdma_cm_event ev;
	uint8_t pdata[64];
	struct fk_ev *next;
};

struct fk_async {
	enum ibv_event_type type;
	struct ibv_qp *qp;
};

static struct ibv_device fk_dev;
static struct ibv_context fk_ctx;
static int devnull = -1;

static struct {
	struct fk_mr *mrs;
	struct fk_cq *cqs;
	struct fk_srq *srq;
	struct fk_qp *qps;
	struct fk_id *ids;
	struct fk_ev *evs, **evs_tail;
	struct fk_async async[64];
	uint32_t nasync;
	uint32_t key, qpn;
	uint32_t fail;		/* F_*: the next such call fails */
	int closing;		/* kvp_agent_close(): sends complete at once */
	int lastwqe;		/* 0: reported at the error, 1: never, 2: when an
				 * input says */
	/* live objects, for the check after close */
	int n_pd, n_cch, n_ech, n_devlist, n_cq, n_srq, n_qp, n_mr, n_id;
	uint32_t srq_lost;	/* SRQ buffers a failed post lost */
	int srq_fault;		/* an SRQ post failed: the queue may be short */
	/* inside kvp_agent_poll(): completions handed out */
	int in_poll;
	uint32_t poll_wcs;
} fk;

static kvp_agent *A; /* the agent under test */

static int take_fault(uint32_t f)
{
	if (!(fk.fail & f))
		return 0;
	fk.fail &= ~f;
	return 1;
}

static struct fk_mr *mr_of_key(uint32_t key)
{
	struct fk_mr *m;

	for (m = fk.mrs; m; m = m->next)
		if (m->mr.lkey == key)
			return m;
	return NULL;
}

/* The device checks every SGE against the MR of its key. */
static void check_sge(const struct ibv_sge *s, int need_write)
{
	struct fk_mr *m = mr_of_key(s->lkey);
	uint64_t base;

	CHECK(m, s->lkey);
	base = (uint64_t)(uintptr_t)m->mr.addr;
	CHECK(s->addr >= base && s->addr - base <= m->mr.length &&
		      s->length <= m->mr.length - (s->addr - base),
	      s->length);
	CHECK(!need_write || (m->access & IBV_ACCESS_LOCAL_WRITE), m->access);
}

static struct fk_qp *qp_of_num(uint32_t qpn)
{
	struct fk_qp *q;

	for (q = fk.qps; q; q = q->next)
		if (q->qp.qp_num == qpn)
			return q;
	return NULL;
}

/* Completions not yet polled that hold a buffer of the shared queue. */
static uint32_t srq_cqes(void)
{
	struct fk_cq *c;
	uint32_t i, n = 0;

	for (c = fk.cqs; c; c = c->next)
		for (i = 0; i < c->n; i++)
			n += WRID_KIND(c->q[(c->head + i) % c->cap].wr_id) ==
			     WK_SRQ_RECV;
	return n;
}

static void cq_push(struct ibv_cq *cq, const struct ibv_wc *wc)
{
	struct fk_cq *c = (struct fk_cq *)cq;

	/* The library sizes its CQs for everything that may complete. */
	CHECK(c->n < c->cap, c->cap);
	c->q[(c->head + c->n) % c->cap] = *wc;
	c->n++;
}

static void wc_of(struct ibv_wc *wc, struct fk_qp *q, uint64_t wr_id,
		  enum ibv_wc_status st, enum ibv_wc_opcode op, uint32_t len)
{
	memset(wc, 0, sizeof(*wc));
	wc->wr_id = wr_id;
	wc->status = st;
	wc->opcode = op;
	wc->byte_len = len;
	wc->qp_num = q->qp.qp_num;
}

static void async_push(enum ibv_event_type t, struct ibv_qp *qp)
{
	if (fk.nasync < sizeof(fk.async) / sizeof(fk.async[0])) {
		fk.async[fk.nasync].type = t;
		fk.async[fk.nasync].qp = qp;
		fk.nasync++;
	}
}

/* The queue pair goes to error: what it holds is flushed; one on the
 * shared receive queue reports its last WQE, if the device does. */
static void qp_error(struct fk_qp *q)
{
	struct ibv_wc wc;

	if (q->err)
		return;
	q->err = 1;
	while (q->sq_n) {
		const struct fk_swr *w = &q->sq[q->sq_head];

		wc_of(&wc, q, w->wr_id, IBV_WC_WR_FLUSH_ERR, IBV_WC_SEND, 0);
		cq_push(q->qp.send_cq, &wc);
		q->sq_head = (q->sq_head + 1) % SQ_MAX;
		q->sq_n--;
	}
	while (q->rq_n) {
		wc_of(&wc, q, q->rq[q->rq_head].wr_id, IBV_WC_WR_FLUSH_ERR,
		      IBV_WC_RECV, 0);
		cq_push(q->qp.recv_cq, &wc);
		q->rq_head = (q->rq_head + 1) % RQ_MAX;
		q->rq_n--;
	}
	if (q->qp.srq && fk.lastwqe == 0)
		async_push(IBV_EVENT_QP_LAST_WQE_REACHED, &q->qp);
}

/* ---- the consumers -------------------------------------------------------- */

enum sim_state {
	S_FREE = 0,
	S_REQ,	    /* connect request sent */
	S_ACCEPTED, /* the producer accepted: AUTH next */
	S_AUTHED,   /* AUTH sent */
	S_GO,	    /* GO came */
	S_READY,    /* the producer's blob came: messages */
	S_DONE,	    /* refused, rejected, disconnected */
};

struct table_sent {
	uint64_t addr;
	uint32_t rkey, n;
};

struct sim {
	int state;
	struct fk_id *id;
	struct fk_qp *qp;
	uint32_t eng, rank, qi, nq, src;
	uint64_t engine_id;	 /* as its hello says */
	uint32_t hello_rank;
	uint8_t hello_c[KVP_HELLO_LEN], hello_p[KVP_HELLO_LEN];
	int accepted;
	int est;		 /* ESTABLISHED queued */
	int blob_kind;		 /* which bytes its blob READ brings: 0 its
				  * own, 1 another rank's, 2 its own with
				  * the hello 8 bytes short, 3 its own with
				  * bytes flipped, 4 another model's */
	uint8_t flip[4];	 /* blob_kind 3: where */
	const uint8_t *blob;	 /* the blob in its memory */
	uint32_t blob_mem;	 /* its length there */
	uint32_t blob_len;	 /* as its hello says */
	int key_ok;		 /* its AUTH names its blob's key */
	uint64_t sent;		 /* credit taken since GO */
	uint64_t go;
	const uint64_t *ctr;	 /* its credit counter (GO's address) */
	int loans;
	int lib_ready;		 /* the producer posted its blob to it */
	struct table_sent tabs[4];
	uint32_t ntabs;
	uint32_t fol_tag[64];	 /* tag of its last FOLLOW per record < 64 */
};

static struct sim sims[NSIM];

/* The consumer engines: TP size, each rank's layout and blob (as encoded,
 * and the same engine and rank running another model). A fourth, an
 * impostor, claims engine 1's id with another TP size. */
#define NENG_ALL (NENG + 1)
static const uint32_t eng_tp[NENG_ALL] = { 1, 2, 4, 4 };
static const uint64_t eng_id[NENG_ALL] = { 0x1001, 0x1002, 0x1003, 0x1002 };
static uint8_t *eng_blob[NENG_ALL][4], *eng_foreign[NENG_ALL][4];
static size_t eng_blob_len[NENG_ALL][4], eng_foreign_len[NENG_ALL][4];
static uint32_t eng_expected[NENG];
static kvp_layout *prod_layout;
static int init_done, init_ok;

static struct {
	int hostile;	      /* a consumer ignored its credit or the
			       * handshake's order */
	uint64_t ev_seen;     /* events checked: [0, ev_seen) */
	uint64_t n_released, n_expired, n_disc;
	/* per engine (NENG + 1: another id) and request: expects that
	 * returned 0 not yet reported, notifications delivered, RELEASED */
	uint32_t outstanding[NENG + 1][NREQ];
	uint64_t notes[NENG][NREQ];
	uint64_t released[NENG][NREQ];
	int odd_blob[NENG];   /* a rank of it was admitted on a blob not
			       * as encoded: its count may differ */
	struct {
		uint64_t engine_id;
		uint32_t rank;
	} ready[64];	      /* consumer ranks that were ever ready */
	uint32_t nready;
} st;

static int eng_index(uint64_t id)
{
	int e;

	for (e = 0; e < NENG; e++)
		if (eng_id[e] == id)
			return e;
	return -1;
}

static struct sim *sim_of_qp(const struct fk_qp *q)
{
	return q && q->sim >= 0 ? &sims[q->sim] : NULL;
}

/* The library made the consumer's connection ready (it posts its blob). */
static void sim_ready(struct sim *s)
{
	int e = eng_index(s->engine_id);
	uint32_t i;

	s->lib_ready = 1;
	if (e >= 0 && (s->blob_kind || s->eng >= NENG))
		st.odd_blob[e] = 1;
	for (i = 0; i < st.nready; i++)
		if (st.ready[i].engine_id == s->engine_id &&
		    st.ready[i].rank == s->hello_rank)
			return;
	if (st.nready < sizeof(st.ready) / sizeof(st.ready[0])) {
		st.ready[st.nready].engine_id = s->engine_id;
		st.ready[st.nready].rank = s->hello_rank;
		st.nready++;
	}
}

/* ---- verbs ops (the context's) ------------------------------------------- */

static void complete_send(struct fk_qp *q, enum ibv_wc_status st);

static int op_post_send(struct ibv_qp *qp, struct ibv_send_wr *wr,
			struct ibv_send_wr **bad)
{
	struct fk_qp *q = (struct fk_qp *)qp;
	struct ibv_wc wc;

	for (; wr; wr = wr->next) {
		struct fk_swr *w;
		int i;

		if (take_fault(F_POST_SEND) || q->sq_used >= q->sq_cap) {
			*bad = wr;
			return ENOMEM;
		}
		for (i = 0; i < wr->num_sge; i++)
			check_sge(&wr->sg_list[i],
				  wr->opcode == IBV_WR_RDMA_READ);
		CHECK(wr->num_sge <= 1, wr->num_sge);
		/* The producer's blob: the connection is ready there. */
		if (wr->opcode == IBV_WR_SEND && A && A->blob &&
		    wr->num_sge &&
		    wr->sg_list[0].addr == (uint64_t)(uintptr_t)A->blob &&
		    sim_of_qp(q))
			sim_ready(sim_of_qp(q));
		q->sq_used++;
		if (q->err) {
			wc_of(&wc, q, wr->wr_id, IBV_WC_WR_FLUSH_ERR,
			      IBV_WC_SEND, 0);
			cq_push(qp->send_cq, &wc);
			continue;
		}
		CHECK(wr->send_flags & IBV_SEND_SIGNALED, wr->send_flags);
		CHECK(q->sq_n < SQ_MAX, q->sq_n);
		w = &q->sq[(q->sq_head + q->sq_n) % SQ_MAX];
		q->sq_n++;
		memset(w, 0, sizeof(*w));
		w->wr_id = wr->wr_id;
		w->opcode = wr->opcode;
		w->num_sge = (uint32_t)wr->num_sge;
		if (wr->num_sge) {
			w->addr = wr->sg_list[0].addr;
			w->len = wr->sg_list[0].length;
		}
		w->raddr = wr->wr.rdma.remote_addr;
		w->rkey = wr->wr.rdma.rkey;
		if (wr->opcode != IBV_WR_RDMA_READ && w->len)
			memcpy(w->data, (const void *)(uintptr_t)w->addr,
			       w->len < KVP_CTL_LEN ? w->len : KVP_CTL_LEN);
		if (fk.closing)
			complete_send(q, IBV_WC_SUCCESS);
	}
	return 0;
}

static int op_post_recv(struct ibv_qp *qp, struct ibv_recv_wr *wr,
			struct ibv_recv_wr **bad)
{
	struct fk_qp *q = (struct fk_qp *)qp;
	struct ibv_wc wc;

	CHECK(!qp->srq, 0);
	for (; wr; wr = wr->next) {
		if (take_fault(F_POST_RECV) || q->rq_used >= q->rq_cap) {
			*bad = wr;
			return ENOMEM;
		}
		if (wr->num_sge)
			check_sge(&wr->sg_list[0], 1);
		q->rq_used++;
		if (q->err) {
			wc_of(&wc, q, wr->wr_id, IBV_WC_WR_FLUSH_ERR,
			      IBV_WC_RECV, 0);
			cq_push(qp->recv_cq, &wc);
			continue;
		}
		CHECK(q->rq_n < RQ_MAX, q->rq_n);
		q->rq[(q->rq_head + q->rq_n) % RQ_MAX] = (struct fk_rwr){
			wr->wr_id, wr->num_sge ? wr->sg_list[0].addr : 0,
			wr->num_sge ? wr->sg_list[0].length : 0
		};
		q->rq_n++;
	}
	return 0;
}

static int op_post_srq_recv(struct ibv_srq *srq, struct ibv_recv_wr *wr,
			    struct ibv_recv_wr **bad)
{
	struct fk_srq *s = (struct fk_srq *)srq;
	uint32_t i;

	for (; wr; wr = wr->next) {
		if (take_fault(F_POST_SRQ) || s->n >= s->max_wr) {
			/* a buffer re-posted is lost; one the queue was
			 * growing by is not counted in srq_n */
			if (A && WRID_VALUE(wr->wr_id) < A->srq_n)
				fk.srq_lost++;
			fk.srq_fault = 1;
			*bad = wr;
			return ENOMEM;
		}
		CHECK(wr->num_sge == 1, wr->num_sge);
		check_sge(&wr->sg_list[0], 1);
		/* A buffer posted twice would take two messages at once. */
		for (i = 0; i < s->n; i++)
			CHECK(s->q[(s->head + i) % s->max_wr].addr !=
				      wr->sg_list[0].addr,
			      i);
		s->q[(s->head + s->n) % s->max_wr] = (struct fk_rwr){
			wr->wr_id, wr->sg_list[0].addr, wr->sg_list[0].length
		};
		s->n++;
	}
	return 0;
}

static int op_poll_cq(struct ibv_cq *cq, int n, struct ibv_wc *wc)
{
	struct fk_cq *c = (struct fk_cq *)cq;
	int k = 0;

	while (k < n && c->n) {
		struct fk_qp *q;

		wc[k] = c->q[c->head];
		c->head = (c->head + 1) % c->cap;
		c->n--;
		/* The WR's slot is free once its completion is polled. */
		q = qp_of_num(wc[k].qp_num);
		if (q && WRID_KIND(wc[k].wr_id) != WK_SRQ_RECV) {
			if (wc[k].opcode & IBV_WC_RECV) {
				if (q->rq_used)
					q->rq_used--;
			} else if (q->sq_used) {
				q->sq_used--;
			}
		}
		k++;
	}
	if (fk.in_poll)
		fk.poll_wcs += (uint32_t)k;
	return k;
}

static int op_req_notify_cq(struct ibv_cq *cq, int solicited)
{
	return 0;
}

static void fk_init_ctx(void)
{
	memset(&fk_dev, 0, sizeof(fk_dev));
	fk_dev.node_type = IBV_NODE_CA;
	fk_dev.transport_type = IBV_TRANSPORT_IB;
	strcpy(fk_dev.name, "fake0");
	memset(&fk_ctx, 0, sizeof(fk_ctx));
	fk_ctx.device = &fk_dev;
	fk_ctx.ops.post_send = op_post_send;
	fk_ctx.ops.post_recv = op_post_recv;
	fk_ctx.ops.post_srq_recv = op_post_srq_recv;
	fk_ctx.ops.poll_cq = op_poll_cq;
	fk_ctx.ops.req_notify_cq = op_req_notify_cq;
	fk_ctx.async_fd = devnull;
	fk_ctx.cmd_fd = devnull;
}

/* ---- verbs and rdma_cm calls (link-time) --------------------------------- */

static struct {
	int srq;		/* the device has SRQs */
	int max_srq_wr, max_cqe;
} dcfg;

struct ibv_context **__wrap_rdma_get_devices(int *n);
void __wrap_rdma_free_devices(struct ibv_context **list);
const char *__wrap_ibv_get_device_name(struct ibv_device *d);
int __wrap_ibv_query_device(struct ibv_context *c, struct ibv_device_attr *d);
int __wrap_ibv_query_port(struct ibv_context *c, uint8_t port,
			  struct _compat_ibv_port_attr *p);
struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *c);
int __wrap_ibv_dealloc_pd(struct ibv_pd *pd);
struct ibv_comp_channel *__wrap_ibv_create_comp_channel(struct ibv_context *c);
int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *ch);
struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *c, int cqe, void *ctx,
				    struct ibv_comp_channel *ch, int vec);
int __wrap_ibv_destroy_cq(struct ibv_cq *cq);
int __wrap_ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq,
			    void **ctx);
void __wrap_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n);
int __wrap_ibv_get_async_event(struct ibv_context *c,
			       struct ibv_async_event *ev);
void __wrap_ibv_ack_async_event(struct ibv_async_event *ev);
struct ibv_mr *__wrap_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
				 int access);
struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				       size_t len, uint64_t iova,
				       unsigned int access);
int __wrap_ibv_dereg_mr(struct ibv_mr *mr);
struct ibv_srq *__wrap_ibv_create_srq(struct ibv_pd *pd,
				      struct ibv_srq_init_attr *attr);
int __wrap_ibv_destroy_srq(struct ibv_srq *srq);
int __wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int mask);
int __wrap_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
			struct ibv_qp_init_attr *init);
struct rdma_event_channel *__wrap_rdma_create_event_channel(void);
void __wrap_rdma_destroy_event_channel(struct rdma_event_channel *ch);
int __wrap_rdma_create_id(struct rdma_event_channel *ch,
			  struct rdma_cm_id **id, void *ctx,
			  enum rdma_port_space ps);
int __wrap_rdma_destroy_id(struct rdma_cm_id *id);
int __wrap_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *sa);
int __wrap_rdma_listen(struct rdma_cm_id *id, int backlog);
int __wrap_rdma_set_option(struct rdma_cm_id *id, int level, int name,
			   void *val, size_t len);
int __wrap_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *attr);
void __wrap_rdma_destroy_qp(struct rdma_cm_id *id);
int __wrap_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p);
int __wrap_rdma_reject(struct rdma_cm_id *id, const void *pdata,
		       uint8_t len);
int __wrap_rdma_disconnect(struct rdma_cm_id *id);
int __wrap_rdma_get_cm_event(struct rdma_event_channel *ch,
			     struct rdma_cm_event **ev);
int __wrap_rdma_ack_cm_event(struct rdma_cm_event *ev);

struct ibv_context **__wrap_rdma_get_devices(int *n)
{
	struct ibv_context **l = calloc(2, sizeof(*l));

	if (!l)
		return NULL;
	l[0] = &fk_ctx;
	if (n)
		*n = 1;
	fk.n_devlist++;
	return l;
}

void __wrap_rdma_free_devices(struct ibv_context **list)
{
	free(list);
	fk.n_devlist--;
}

const char *__wrap_ibv_get_device_name(struct ibv_device *d)
{
	return d->name;
}

int __wrap_ibv_query_device(struct ibv_context *c, struct ibv_device_attr *d)
{
	memset(d, 0, sizeof(*d));
	d->max_mr_size = 1ull << 40;
	d->max_qp = 4096;
	d->max_qp_wr = 16384;
	d->max_sge = 30;
	d->max_sge_rd = 30;
	d->max_cq = 64;
	d->max_cqe = dcfg.max_cqe;
	d->max_mr = 1 << 20;
	d->max_pd = 16;
	d->max_qp_rd_atom = 16;
	d->max_qp_init_rd_atom = 16;
	d->max_srq = dcfg.srq ? 1024 : 0;
	d->max_srq_wr = dcfg.srq ? dcfg.max_srq_wr : 0;
	d->max_srq_sge = dcfg.srq ? 1 : 0;
	d->phys_port_cnt = 1;
	return 0;
}

int __wrap_ibv_query_port(struct ibv_context *c, uint8_t port,
			  struct _compat_ibv_port_attr *p)
{
	struct ibv_port_attr *pa = (struct ibv_port_attr *)p;

	pa->state = IBV_PORT_ACTIVE;
	pa->max_msg_sz = 1u << 30;
	pa->link_layer = IBV_LINK_LAYER_ETHERNET;
	return 0;
}

struct ibv_pd *__wrap_ibv_alloc_pd(struct ibv_context *c)
{
	struct ibv_pd *pd = calloc(1, sizeof(*pd));

	if (pd) {
		pd->context = c;
		fk.n_pd++;
	}
	return pd;
}

int __wrap_ibv_dealloc_pd(struct ibv_pd *pd)
{
	free(pd);
	fk.n_pd--;
	return 0;
}

struct ibv_comp_channel *__wrap_ibv_create_comp_channel(struct ibv_context *c)
{
	struct ibv_comp_channel *ch = calloc(1, sizeof(*ch));

	if (ch) {
		ch->context = c;
		ch->fd = devnull;
		fk.n_cch++;
	}
	return ch;
}

int __wrap_ibv_destroy_comp_channel(struct ibv_comp_channel *ch)
{
	free(ch);
	fk.n_cch--;
	return 0;
}

struct ibv_cq *__wrap_ibv_create_cq(struct ibv_context *c, int cqe, void *ctx,
				    struct ibv_comp_channel *ch, int vec)
{
	struct fk_cq *q;

	CHECK(cqe > 0 && cqe <= dcfg.max_cqe, cqe);
	q = calloc(1, sizeof(*q));
	if (!q)
		return NULL;
	q->q = calloc((size_t)cqe, sizeof(*q->q));
	if (!q->q) {
		free(q);
		return NULL;
	}
	q->cap = (uint32_t)cqe;
	q->cq.context = c;
	q->cq.channel = ch;
	q->cq.cq_context = ctx;
	q->cq.cqe = cqe;
	q->next = fk.cqs;
	fk.cqs = q;
	fk.n_cq++;
	return &q->cq;
}

int __wrap_ibv_destroy_cq(struct ibv_cq *cq)
{
	struct fk_cq **p;

	for (p = &fk.cqs; *p; p = &(*p)->next)
		if (&(*p)->cq == cq) {
			struct fk_cq *q = *p;

			*p = q->next;
			free(q->q);
			free(q);
			fk.n_cq--;
			return 0;
		}
	fail("destroy of an unknown CQ", 0);
	return EINVAL;
}

int __wrap_ibv_get_cq_event(struct ibv_comp_channel *ch, struct ibv_cq **cq,
			    void **ctx)
{
	errno = EAGAIN;
	return -1;
}

void __wrap_ibv_ack_cq_events(struct ibv_cq *cq, unsigned int n)
{
}

int __wrap_ibv_get_async_event(struct ibv_context *c,
			       struct ibv_async_event *ev)
{
	if (!fk.nasync) {
		errno = EAGAIN;
		return -1;
	}
	memset(ev, 0, sizeof(*ev));
	ev->event_type = fk.async[0].type;
	if (fk.async[0].qp)
		ev->element.qp = fk.async[0].qp;
	else
		ev->element.port_num = 1;
	memmove(fk.async, fk.async + 1, --fk.nasync * sizeof(fk.async[0]));
	return 0;
}

void __wrap_ibv_ack_async_event(struct ibv_async_event *ev)
{
}

static struct ibv_mr *mr_make(struct ibv_pd *pd, void *addr, size_t len,
			      int access)
{
	struct fk_mr *m;

	CHECK(pd && addr && len, len);
	if (take_fault(F_REG)) {
		errno = ENOMEM;
		return NULL;
	}
	m = calloc(1, sizeof(*m));
	if (!m) {
		errno = ENOMEM;
		return NULL;
	}
	m->mr.context = &fk_ctx;
	m->mr.pd = pd;
	m->mr.addr = addr;
	m->mr.length = len;
	m->mr.lkey = m->mr.rkey = ++fk.key;
	m->access = access;
	m->next = fk.mrs;
	fk.mrs = m;
	fk.n_mr++;
	return &m->mr;
}

struct ibv_mr *__wrap_ibv_reg_mr(struct ibv_pd *pd, void *addr, size_t len,
				 int access)
{
	/* A poll registers memory in its costly steps, never inside its
	 * completion drain (a registration pins pages). */
	CHECK(!A || !A->in_drain, fk.poll_wcs);
	return mr_make(pd, addr, len, access);
}

struct ibv_mr *__wrap_ibv_reg_mr_iova2(struct ibv_pd *pd, void *addr,
				       size_t len, uint64_t iova,
				       unsigned int access)
{
	CHECK(!A || !A->in_drain, fk.poll_wcs);
	return mr_make(pd, addr, len, (int)access);
}

int __wrap_ibv_dereg_mr(struct ibv_mr *mr)
{
	struct fk_mr **p;

	for (p = &fk.mrs; *p; p = &(*p)->next)
		if (&(*p)->mr == mr) {
			struct fk_mr *m = *p;

			*p = m->next;
			free(m);
			fk.n_mr--;
			return 0;
		}
	fail("deregistration of an unknown MR", 0);
	return EINVAL;
}

struct ibv_srq *__wrap_ibv_create_srq(struct ibv_pd *pd,
				      struct ibv_srq_init_attr *attr)
{
	struct fk_srq *s;

	CHECK(!fk.srq && dcfg.srq, 0);
	CHECK(attr->attr.max_wr > 0 &&
		      attr->attr.max_wr <= (uint32_t)dcfg.max_srq_wr,
	      attr->attr.max_wr);
	s = calloc(1, sizeof(*s));
	if (!s)
		return NULL;
	s->q = calloc(attr->attr.max_wr, sizeof(*s->q));
	if (!s->q) {
		free(s);
		return NULL;
	}
	s->max_wr = attr->attr.max_wr;
	s->srq.context = &fk_ctx;
	s->srq.pd = pd;
	fk.srq = s;
	fk.n_srq++;
	return &s->srq;
}

int __wrap_ibv_destroy_srq(struct ibv_srq *srq)
{
	struct fk_srq *s = (struct fk_srq *)srq;

	CHECK(s == fk.srq, 0);
	free(s->q);
	free(s);
	fk.srq = NULL;
	fk.n_srq--;
	return 0;
}

int __wrap_ibv_modify_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr,
			 int mask)
{
	if (take_fault(F_MODIFY_QP))
		return EINVAL;
	if ((mask & IBV_QP_STATE) && attr->qp_state == IBV_QPS_ERR)
		qp_error((struct fk_qp *)qp);
	return 0;
}

int __wrap_ibv_query_qp(struct ibv_qp *qp, struct ibv_qp_attr *attr, int mask,
			struct ibv_qp_init_attr *init)
{
	if (take_fault(F_QUERY_QP))
		return EIO;
	attr->rq_psn = ((struct fk_qp *)qp)->psn & 0xffffff;
	return 0;
}

struct rdma_event_channel *__wrap_rdma_create_event_channel(void)
{
	struct rdma_event_channel *ch = calloc(1, sizeof(*ch));

	if (ch) {
		ch->fd = devnull;
		fk.n_ech++;
	}
	return ch;
}

void __wrap_rdma_destroy_event_channel(struct rdma_event_channel *ch)
{
	free(ch);
	fk.n_ech--;
}

static struct fk_id *id_new(struct rdma_event_channel *ch, int sim)
{
	struct fk_id *f = calloc(1, sizeof(*f));

	if (!f)
		return NULL;
	f->id.channel = ch;
	f->id.ps = RDMA_PS_TCP;
	f->sim = sim;
	f->next = fk.ids;
	fk.ids = f;
	fk.n_id++;
	return f;
}

int __wrap_rdma_create_id(struct rdma_event_channel *ch,
			  struct rdma_cm_id **id, void *ctx,
			  enum rdma_port_space ps)
{
	struct fk_id *f = id_new(ch, -1);

	if (!f) {
		errno = ENOMEM;
		return -1;
	}
	f->id.context = ctx;
	*id = &f->id;
	return 0;
}

/* Events of a destroyed id are never delivered. */
static void evs_purge(const struct rdma_cm_id *id)
{
	struct fk_ev **p = &fk.evs;

	while (*p) {
		struct fk_ev *e = *p;

		if (e->ev.id == id) {
			*p = e->next;
			free(e);
			continue;
		}
		p = &e->next;
	}
	fk.evs_tail = &fk.evs;
	while (*fk.evs_tail)
		fk.evs_tail = &(*fk.evs_tail)->next;
}

static void qp_free(struct fk_qp *q)
{
	struct fk_qp **p;

	for (p = &fk.qps; *p; p = &(*p)->next)
		if (*p == q) {
			*p = q->next;
			break;
		}
	if (q->sim >= 0 && sims[q->sim].qp == q)
		sims[q->sim].qp = NULL;
	free(q);
	fk.n_qp--;
}

int __wrap_rdma_destroy_id(struct rdma_cm_id *id)
{
	struct fk_id **p, *f = (struct fk_id *)id;

	CHECK(!id->qp, 0); /* its QP first */
	for (p = &fk.ids; *p; p = &(*p)->next)
		if (*p == f) {
			*p = f->next;
			break;
		}
	evs_purge(id);
	if (f->sim >= 0 && sims[f->sim].id == f) {
		sims[f->sim].id = NULL;
		sims[f->sim].state = S_DONE;
	}
	free(f);
	fk.n_id--;
	return 0;
}

int __wrap_rdma_bind_addr(struct rdma_cm_id *id, struct sockaddr *sa)
{
	id->verbs = &fk_ctx;
	return 0;
}

int __wrap_rdma_listen(struct rdma_cm_id *id, int backlog)
{
	return 0;
}

int __wrap_rdma_set_option(struct rdma_cm_id *id, int level, int name,
			   void *val, size_t len)
{
	return 0;
}

int __wrap_rdma_create_qp(struct rdma_cm_id *id, struct ibv_pd *pd,
			  struct ibv_qp_init_attr *attr)
{
	struct fk_id *f = (struct fk_id *)id;
	struct fk_qp *q;

	CHECK(!id->qp, 0);
	CHECK(attr->send_cq && attr->recv_cq, 0);
	if (take_fault(F_CREATE_QP)) {
		errno = ENOMEM;
		return -1;
	}
	CHECK(attr->cap.max_send_wr <= SQ_MAX &&
		      attr->cap.max_recv_wr <= RQ_MAX,
	      attr->cap.max_recv_wr);
	q = calloc(1, sizeof(*q));
	if (!q) {
		errno = ENOMEM;
		return -1;
	}
	q->qp.context = &fk_ctx;
	q->qp.pd = pd;
	q->qp.send_cq = attr->send_cq;
	q->qp.recv_cq = attr->recv_cq;
	q->qp.srq = attr->srq;
	q->qp.qp_num = ++fk.qpn;
	q->qp.qp_type = attr->qp_type;
	q->qp.state = IBV_QPS_RTS;
	q->sq_cap = attr->cap.max_send_wr;
	q->rq_cap = attr->srq ? 0 : attr->cap.max_recv_wr;
	q->psn = (uint32_t)kvp__mix64(q->qp.qp_num);
	q->sim = f->sim;
	q->next = fk.qps;
	fk.qps = q;
	fk.n_qp++;
	id->qp = &q->qp;
	if (f->sim >= 0)
		sims[f->sim].qp = q;
	return 0;
}

void __wrap_rdma_destroy_qp(struct rdma_cm_id *id)
{
	qp_free((struct fk_qp *)id->qp);
	id->qp = NULL;
}

int __wrap_rdma_accept(struct rdma_cm_id *id, struct rdma_conn_param *p)
{
	struct fk_id *f = (struct fk_id *)id;
	struct sim *s = f->sim >= 0 ? &sims[f->sim] : NULL;

	if (take_fault(F_ACCEPT)) {
		errno = EINVAL;
		return -1;
	}
	CHECK(id->qp, 0);
	CHECK(p->private_data_len == KVP_HELLO_ACCEPT_LEN,
	      p->private_data_len);
	if (s && s->state == S_REQ) {
		memcpy(s->hello_p, p->private_data, KVP_HELLO_LEN);
		s->state = S_ACCEPTED;
	}
	return 0;
}

int __wrap_rdma_reject(struct rdma_cm_id *id, const void *pdata, uint8_t len)
{
	struct fk_id *f = (struct fk_id *)id;

	if (f->sim >= 0 && sims[f->sim].id == f)
		sims[f->sim].state = S_DONE;
	return 0;
}

static void ev_queue(struct fk_id *f, enum rdma_cm_event_type t,
		     const uint8_t *pdata, uint32_t plen, uint8_t rr)
{
	struct fk_ev *e = calloc(1, sizeof(*e));

	if (!e)
		abort();
	e->ev.id = &f->id;
	e->ev.event = t;
	if (plen > sizeof(e->pdata))
		plen = sizeof(e->pdata);
	if (pdata) {
		memcpy(e->pdata, pdata, plen);
		e->ev.param.conn.private_data = e->pdata;
		e->ev.param.conn.private_data_len = (uint8_t)plen;
	}
	e->ev.param.conn.responder_resources = rr;
	*fk.evs_tail = e;
	fk.evs_tail = &e->next;
}

int __wrap_rdma_disconnect(struct rdma_cm_id *id)
{
	struct fk_id *f = (struct fk_id *)id;

	/* Both sides see it: the consumer is gone, and the producer gets
	 * its own DISCONNECTED. */
	if (f->sim >= 0 && sims[f->sim].id == f)
		sims[f->sim].state = S_DONE;
	if (id->qp)
		qp_error((struct fk_qp *)id->qp);
	if (!f->disc) {
		f->disc = 1;
		ev_queue(f, RDMA_CM_EVENT_DISCONNECTED, NULL, 0, 0);
	}
	return 0;
}

int __wrap_rdma_get_cm_event(struct rdma_event_channel *ch,
			     struct rdma_cm_event **ev)
{
	struct fk_ev *e = fk.evs;

	if (!e) {
		errno = EAGAIN;
		return -1;
	}
	fk.evs = e->next;
	if (!fk.evs)
		fk.evs_tail = &fk.evs;
	e->next = NULL;
	if (e->ev.event == RDMA_CM_EVENT_CONNECT_REQUEST)
		((struct fk_id *)e->ev.id)->taken = 1; /* its to destroy */
	*ev = &e->ev;
	return 0;
}

int __wrap_rdma_ack_cm_event(struct rdma_cm_event *ev)
{
	free(ev);
	return 0;
}

/* ---- the consumers' side of the wire ------------------------------------ */

static uint64_t ctr_now(const struct sim *s)
{
	return s->ctr && s->qp ? *s->ctr : 0;
}

/* Credit a consumer knows it has: GO's and what the counter says. */
static int may_send(const struct sim *s, uint64_t k)
{
	return s->state == S_READY && s->sent + k <= s->go + ctr_now(s);
}

/* The consumer's message arrives, if its queue pair is up: into the
 * oldest buffer of its queue, completing on its queue pair's CQ. 1 when
 * delivered. compliant: it kept to its credit. */
static int deliver(struct sim *s, const uint8_t *m, uint32_t len,
		   int compliant, int bad)
{
	struct fk_qp *q = s->qp;
	struct fk_rwr r;
	struct ibv_wc wc;

	if (!q || q->err || s->state < S_ACCEPTED)
		return 0;
	if (!compliant)
		st.hostile = 1;
	q->psn++;
	if (q->qp.srq) {
		struct fk_srq *sq = fk.srq;

		if (!sq->n) {
			/* RNR: the consumer's NIC retries, in vain here. A
			 * queue that keeps to the credit rules never runs
			 * dry for consumers that keep to their credit,
			 * but for buffers whose completions the producer
			 * has not polled yet. */
			CHECK(st.hostile || fk.srq_fault || srq_cqes(), 0);
			return 0;
		}
		r = sq->q[sq->head];
		sq->head = (sq->head + 1) % sq->max_wr;
		sq->n--;
	} else {
		if (!q->rq_n) {
			/* the same, for its own queue */
			CHECK(st.hostile || q->rq_used, 0);
			return 0;
		}
		r = q->rq[q->rq_head];
		q->rq_head = (q->rq_head + 1) % RQ_MAX;
		q->rq_n--;
	}
	if (len > r.len || bad) {
		/* Too long for the buffer (or the transport failed it): an
		 * error completion, and the queue pair goes to error. */
		wc_of(&wc, q, r.wr_id,
		      bad ? IBV_WC_REM_INV_REQ_ERR : IBV_WC_LOC_LEN_ERR,
		      IBV_WC_RECV, 0);
		cq_push(q->qp.recv_cq, &wc);
		qp_error(q);
		return 0;
	}
	memcpy((void *)(uintptr_t)r.addr, m, len);
	wc_of(&wc, q, r.wr_id, IBV_WC_SUCCESS, IBV_WC_RECV, len);
	cq_push(q->qp.recv_cq, &wc);
	return 1;
}

static struct sim *sim_pick(int want_qp)
{
	uint32_t i, k = u8();

	for (i = 0; i < NSIM; i++) {
		struct sim *s = &sims[(k + i) % NSIM];

		if (s->state != S_FREE && (!want_qp || s->qp))
			return s;
	}
	return NULL;
}

static void hello_make(struct sim *s, uint8_t *p, uint32_t corrupt)
{
	struct kvp_hello h;
	uint64_t t = WALL_BASE + vnow / 1000000000ull;

	memset(&h, 0, sizeof(h));
	h.version = KVP_HELLO_VERSION;
	h.role = KVP_ROLE_CONSUMER;
	h.tp_size = eng_tp[s->eng];
	h.tp_rank = s->rank;
	h.blob_len = s->blob_len;
	h.flags = (A->secret ? KVP_HELLO_AUTH : 0) |
		  s->nq << KVP_HELLO_QPS_SHIFT | s->qi << KVP_HELLO_QI_SHIFT;
	h.engine_id = s->engine_id;
	/* its clock, off by a little (or by a lot when corrupted) */
	t += (corrupt & 0x100) ? (uint64_t)(int64_t)(int8_t)u8() * 3 : 0;
	kvp__put64(h.nonce, t);
	kvp__put64(h.nonce + 8, u64());
	switch (corrupt & 0xff) {
	case 1:
		h.version = (uint16_t)u8();
		break;
	case 2:
		h.role = (uint16_t)u8() % 3;
		break;
	case 3:
		h.tp_size = u8() % 6;
		break;
	case 4:
		h.tp_rank = u8() % 6;
		break;
	case 5:
		h.flags ^= 1u << (u8() % 32);
		break;
	case 6:
		h.blob_len = u32();
		break;
	default:
		break;
	}
	kvp__hello_put(p, &h);
	if ((corrupt & 0xff) == 7)
		p[u8() % KVP_HELLO_LEN] ^= (uint8_t)(1u << (u8() % 8));
	/* who it says it is */
	if (!kvp__hello_get(p, KVP_HELLO_LEN, &h)) {
		s->engine_id = h.engine_id;
		s->hello_rank = h.tp_rank;
	}
}

/* A new consumer queue pair asks to connect. */
static struct sim *op_connect(void)
{
	uint8_t pd[KVP_HELLO_REQ_LEN + 8];
	uint32_t i, b = u8(), c = u8(), plen;
	struct sim *s = NULL;
	struct sockaddr_in *sin;
	uint8_t rr;

	for (i = 0; i < NSIM; i++)
		if (sims[i].state == S_FREE || (sims[i].state == S_DONE &&
						!sims[i].id && !sims[i].qp)) {
			s = &sims[i];
			break;
		}
	if (!s)
		return NULL;
	memset(s, 0, sizeof(*s));
	s->eng = (c & 0x18) == 0x10 ? NENG : b % NENG;
	s->rank = (b >> 2) % eng_tp[s->eng];
	s->nq = 1 + (b >> 4) % 2;
	s->qi = (b >> 5) % s->nq;
	s->src = (b >> 6) % 3;
	s->engine_id = eng_id[s->eng];
	s->hello_rank = s->rank;
	s->key_ok = 1;
	/* the blob its READ brings: mostly its own */
	s->blob_kind = (c & 7) < 4 ? 0 : (c & 7) - 3;
	i = s->blob_kind == 1 ? (s->rank + 1) % eng_tp[s->eng] : s->rank;
	s->blob = s->blob_kind == 4 ? eng_foreign[s->eng][i] :
				      eng_blob[s->eng][i];
	s->blob_mem = (uint32_t)(s->blob_kind == 4 ? eng_foreign_len[s->eng][i] :
						     eng_blob_len[s->eng][i]);
	s->blob_len = s->blob_mem - (s->blob_kind == 2 ? 8 : 0);
	if (s->blob_kind == 3)
		for (i = 0; i < 4; i++)
			s->flip[i] = u8();
	if ((c & 0x18) == 0x18)
		s->blob_len += u8() % 3 ? -(uint32_t)(u8() % 16) : u8() % 16;
	s->state = S_REQ;
	s->id = id_new(A->ech, (int)(s - sims));
	if (!s->id)
		abort();
	s->id->id.verbs = &fk_ctx;
	sin = (struct sockaddr_in *)&s->id->id.route.addr.dst_addr;
	sin->sin_family = AF_INET;
	sin->sin_addr.s_addr = htonl(0x0a000001u + s->src);
	hello_make(s, pd, (c & 0xe0) == 0xe0 ? u16() : 0);
	memcpy(s->hello_c, pd, KVP_HELLO_LEN);
	plen = KVP_HELLO_LEN;
	if (A->secret) {
		kvp__hello_tag(A, pd, pd + KVP_HELLO_LEN);
		plen = KVP_HELLO_REQ_LEN;
		if ((c & 0xe0) == 0xc0)
			pd[KVP_HELLO_LEN + u8() % KVP_HELLO_TAG_LEN] ^= 1;
	}
	if ((c & 0xe0) == 0xa0)
		plen = u8() % sizeof(pd);
	rr = (uint8_t)(1 + u8() % 32);
	ev_queue(s->id, RDMA_CM_EVENT_CONNECT_REQUEST, pd, plen, rr);
	return s;
}

static void send_auth(struct sim *s, int good)
{
	uint8_t m[KVP_CTL_LEN];
	uint32_t len = KVP_AUTH_LEN;
	int first;

	memset(m, 0, sizeof(m));
	kvp__put32(m, KVP_AUTH_MAGIC);
	if (A->secret)
		kvp__auth_mac(A, 'C', s->hello_c, s->hello_p, m + 8);
	kvp__put64(m + KVP_AUTH_BLOB_OFF, 0x7e0000000000ull + (s - sims));
	kvp__put32(m + KVP_AUTH_BLOB_OFF + 8, 0x5000u + (uint32_t)(s - sims));
	if (!good) {
		uint32_t k = u8();

		switch (k % 5) {
		case 0:
			m[8 + u8() % KVP_MAC_LEN] ^= 1; /* the MAC */
			break;
		case 1:
			s->key_ok = 0; /* a key that does not read */
			break;
		case 2:
			len = u8() % KVP_CTL_LEN;
			break;
		case 3:
			m[u8() % KVP_AUTH_LEN] ^= (uint8_t)(1u << (k % 8));
			break;
		default:
			kvp__put32(m + KVP_AUTH_BLOB_OFF + 12, 1);
			break;
		}
	}
	first = s->state == S_ACCEPTED;
	if (first)
		s->state = S_AUTHED;
	deliver(s, m, len, good && first, 0);
}

/* A message from the input. */
static void op_msg(void)
{
	struct sim *s = sim_pick(1);
	uint32_t kind = u8(), mod = u8(), len = KVP_NOTE_LEN, k = 1, n, r;
	uint8_t m[KVP_CTL_LEN];
	int keep = !(mod & 0x80), ok, sent, bad;
	uint64_t id;

	if (!s)
		return;
	memset(m, 0, sizeof(m));
	switch (kind % 10) {
	case 0:
	case 1:
	case 2: /* a notification */
		r = (mod & 0x70) == 0x70 ? u8() % 5 : s->hello_rank;
		id = REQ_BASE + u8() % NREQ;
		kvp__put32(m, KVP_NOTE_MAGIC);
		kvp__put32(m + 4, r);
		kvp__put64(m + 8, id);
		kvp__put64(m + 16, (mod & 0x60) == 0x60 ? eng_id[u8() % NENG] :
							   s->engine_id);
		kvp__put64(m + 24, (mod & 8) ? u64() : 0); /* flags word */
		break;
	case 3: /* TABLE */
		n = (mod & 0x30) == 0x30 ? u32() : 1u + u8() % 48;
		kvp__put32(m, KVP_TABLE_MAGIC);
		kvp__put32(m + 4, (mod & 0x40) ? u8() % 5 : s->hello_rank);
		kvp__put64(m + 8, (mod & 4) ? u64() :
					      0x7d0000000000ull +
						      ((uint64_t)(s - sims)
						       << 20));
		kvp__put32(m + 16, 0x7000u + (uint32_t)(s - sims));
		kvp__put32(m + 20, n);
		kvp__put64(m + 24, s->engine_id);
		if (s->ntabs < 4)
			s->tabs[s->ntabs++] = (struct table_sent){
				kvp__get64(m + 8), kvp__get32(m + 16), n
			};
		break;
	case 4:
	case 5: /* FOLLOW */
		r = u8() % ((mod & 0x30) == 0x30 ? 255 : 50);
		kvp__put32(m, KVP_FOLLOW_MAGIC);
		kvp__put32(m + 4, (mod & 0x40) ? u8() % 5 : s->hello_rank);
		kvp__put64(m + 8, REQ_BASE + u8() % NREQ);
		kvp__put64(m + 16, s->engine_id);
		kvp__put32(m + 24, r);
		kvp__put32(m + 28, u32());
		if (r < 64)
			s->fol_tag[r] = kvp__get32(m + 28);
		break;
	case 6: /* GIVE */
		n = (mod & 0x30) == 0x30 ? u32() : u8() % 10;
		kvp__put32(m, KVP_GIVE_MAGIC);
		kvp__put32(m + 4, n);
		len = (mod & 4) ? 8 : KVP_NOTE_LEN;
		k = 1 + (uint64_t)n > 1000 ? 1000 : 1 + n;
		break;
	case 7: /* BYE */
		kvp__put32(m, KVP_BYE_MAGIC);
		break;
	case 8: /* AUTH, again or at last */
		send_auth(s, !(mod & 1));
		return;
	default: /* anything */
		len = u8() % (KVP_CTL_LEN + 1);
		for (n = 0; n < len; n++)
			m[n] = u8();
		break;
	}
	if ((mod & 0x0f) == 0x0f)
		kvp__put32(m, u32()); /* no magic */
	if ((mod & 0x0f) == 0x0e)
		len = u8() % (KVP_CTL_LEN + 1);
	bad = (mod & 0x0f) == 0x0d; /* its receive completes in error */
	/* A consumer that keeps to its credit waits for it; a GIVE returns
	 * no more than its loans could be. */
	ok = may_send(s, k) &&
	     (kind % 10 != 6 ||
	      (s->loans && k + (s->qi ? 1 : KVP_CREDIT_OWN) <=
				   s->go + ctr_now(s) - s->sent));
	if (keep && !ok)
		return;
	if (s->state >= S_GO)
		s->sent += k;
	sent = deliver(s, m, len, ok, bad);
	if (trace)
		fprintf(stderr, "  sim %d kind %u len %u magic %08x sent %d "
				"credit-kept %d\n",
			(int)(s - sims), kind % 10, len, kvp__get32(m), sent, ok);
	id = kvp__get64(m + 8) - REQ_BASE;
	if (sent && len == KVP_NOTE_LEN && kvp__get32(m) == KVP_NOTE_MAGIC &&
	    kvp__get32(m + 4) == s->hello_rank &&
	    kvp__get64(m + 16) == s->engine_id && id < NREQ) {
		/* a notification of its own that may count */
		int e = eng_index(s->engine_id);

		if (e >= 0)
			st.notes[e][id]++;
	}
}

/* The producer's oldest WR on q completes (st: its status). */
static void complete_send(struct fk_qp *q, enum ibv_wc_status wst)
{
	struct fk_swr *w;
	struct sim *s = sim_of_qp(q);
	struct ibv_wc wc;
	enum ibv_wc_opcode op = IBV_WC_SEND;

	if (!q->sq_n)
		return;
	w = &q->sq[q->sq_head];
	q->sq_head = (q->sq_head + 1) % SQ_MAX;
	q->sq_n--;
	if (w->opcode == IBV_WR_RDMA_READ) {
		op = IBV_WC_RDMA_READ;
		if (wst == IBV_WC_SUCCESS && w->num_sge && s) {
			/* The consumer's blob, as its kind says; a READ
			 * past its memory fails. */
			uint32_t r;

			if (!s->key_ok || w->len > s->blob_mem) {
				wst = IBV_WC_REM_ACCESS_ERR;
			} else {
				uint8_t *d = (uint8_t *)(uintptr_t)w->addr;

				memcpy(d, s->blob, w->len);
				if (s->blob_kind == 3 && w->len)
					for (r = 0; r < 4; r += 2)
						d[(s->flip[r] * 251u +
						   s->flip[r + 1]) %
						  w->len] ^= s->flip[r + 1] | 1;
			}
		}
	} else if (w->opcode == IBV_WR_RDMA_WRITE) {
		op = IBV_WC_RDMA_WRITE;
		if (wst == IBV_WC_SUCCESS && s) {
			/* A progress record: inside a TABLE its consumer
			 * sent, with that TABLE's key. */
			const uint8_t *rec = w->data;
			uint32_t i, inside = 0;

			CHECK(w->len == KVP_PROG_REC, w->len);
			for (i = 0; i < s->ntabs; i++) {
				const struct table_sent *t = &s->tabs[i];

				if (w->rkey == t->rkey && t->n &&
				    w->raddr >= t->addr &&
				    (w->raddr - t->addr) % KVP_PROG_REC == 0 &&
				    (w->raddr - t->addr) / KVP_PROG_REC < t->n)
					inside = 1;
			}
			CHECK(inside, s->ntabs);
			CHECK(kvp__get64(rec + 16) >= kvp__get64(rec + 8), 0);
		}
	} else if (wst == IBV_WC_SUCCESS && s && w->len >= 8) {
		/* A SEND: what the consumer learns. */
		uint32_t magic = kvp__get32(w->data);

		if (magic == KVP_GO_MAGIC && w->len == KVP_GO_LEN) {
			uint64_t raddr = kvp__get64(w->data + 8);
			struct fk_mr *m = mr_of_key(kvp__get32(w->data + 16));

			/* Its counter: 8 bytes an MR of that key reads. */
			CHECK(m && (m->access & IBV_ACCESS_REMOTE_READ) &&
				      raddr >= (uint64_t)(uintptr_t)m->mr.addr &&
				      raddr + 8 <= (uint64_t)(uintptr_t)
							       m->mr.addr +
							   m->mr.length,
			      0);
			if (s->state == S_AUTHED) {
				s->state = S_GO;
				s->go = kvp__get32(w->data + 4);
				s->ctr = (const uint64_t *)(uintptr_t)raddr;
				s->loans = kvp__get32(w->data + 20) &
					   KVP_GO_LOANS;
				s->sent = 0;
			}
		} else if (magic == KVP_REFUSE_MAGIC) {
			if (s->state < S_READY)
				s->state = S_DONE;
		} else if (A->blob && w->len == A->blob_len &&
			   !memcmp(w->data, A->blob,
				   w->len < KVP_CTL_LEN ? w->len :
							  KVP_CTL_LEN)) {
			if (s->state == S_GO)
				s->state = S_READY;
		}
	}
	wc_of(&wc, q, w->wr_id, wst, op, wst == IBV_WC_SUCCESS ? w->len : 0);
	cq_push(q->qp.send_cq, &wc);
	if (wst != IBV_WC_SUCCESS)
		qp_error(q); /* an error completion: the rest is flushed */
}

static void op_complete(void)
{
	struct sim *s = sim_pick(1);
	uint32_t n = 1 + u8() % 4, b = u8();

	if (!s)
		return;
	while (n-- && s->qp)
		complete_send(s->qp, (b & 0xf) == 0xf ? IBV_WC_RETRY_EXC_ERR :
				     (b & 0xf) == 0xe ? IBV_WC_REM_ACCESS_ERR :
							IBV_WC_SUCCESS);
}

static void complete_all(void)
{
	struct fk_qp *q;

	for (q = fk.qps; q; q = q->next)
		while (q->sq_n)
			complete_send(q, IBV_WC_SUCCESS);
}

/* ---- the checks ---------------------------------------------------------- */

static void track_events(void)
{
	kvp_agent *a = A;

	for (; st.ev_seen < a->ev_tail; st.ev_seen++) {
		const struct kvp_event *ev = &a->evq[st.ev_seen % a->ev_cap];
		int e = eng_index(ev->engine_id), k;
		uint64_t r = ev->req_id - REQ_BASE;

		switch (ev->type) {
		case KVP_EV_RELEASED:
		case KVP_EV_EXPIRED:
			k = e < 0 ? NENG : e;
			CHECK(r < NREQ, ev->req_id);
			/* reported once per expect() */
			CHECK(st.outstanding[k][r] > 0, ev->req_id);
			st.outstanding[k][r]--;
			if (ev->type == KVP_EV_EXPIRED) {
				st.n_expired++;
				break;
			}
			st.n_released++;
			if (e < 0)
				break;
			/* each release took the engine's count of
			 * notifications */
			st.released[e][r]++;
			CHECK(st.notes[e][r] >=
				      st.released[e][r] *
					      (st.odd_blob[e] ? 1 :
								eng_expected[e]),
			      (long)st.notes[e][r]);
			break;
		case KVP_EV_DISCONNECTED:
			/* only consumer ranks that were ready */
			st.n_disc++;
			for (k = 0; k < (int)st.nready; k++)
				if (st.ready[k].engine_id == ev->engine_id &&
				    st.ready[k].rank == ev->rank)
					break;
			CHECK(k < (int)st.nready, ev->rank);
			break;
		default:
			fail("an event a producer does not raise", ev->type);
		}
	}
	CHECK(st.n_released == a->st.released, a->st.released);
	CHECK(st.n_expired == a->st.expired, a->st.expired);
	CHECK(st.n_disc == a->st.disconnects, a->st.disconnects);
}

#ifdef KVP_LEASE_BUCKET
/* Every request held has its lease, and only those. */
static void check_leases(const kvp_agent *a, uint32_t n_exp)
{
	uint64_t b, live = 0, g;
	uint32_t i;

	for (i = 0; i <= a->tab_mask; i++) {
		const struct kvp_ent *e = &a->tab[i];
		const uint8_t *bk = a->lease +
				    (size_t)(e->lease / KVP_LEASE_BUCKET) *
					    KVP_LEASE_READ;

		if (e->state != EN_EXPECTED && e->state != EN_GONE)
			continue;
		CHECK(e->lease / KVP_LEASE_BUCKET ==
			      kvp__lease_bucket(e->engine_id, e->req_id,
						a->lease_log2),
		      e->lease);
		CHECK((kvp__lease_check(bk, e->engine_id, e->req_id,
					a->lease_inc, e->gen, &g) == 0) ==
			      (e->state == EN_EXPECTED),
		      e->state);
	}
	for (b = 0; b < (1ull << a->lease_log2) * KVP_LEASE_BUCKET; b++)
		live += kvp__get64(a->lease + b * KVP_LEASE_ENT) != 0;
	CHECK(live == n_exp, (long)live);
}
#else
static void check_leases(const kvp_agent *a, uint32_t n_exp)
{
}
#endif

static void check_agent(void)
{
	kvp_agent *a = A;
	const uint32_t nbm = a->max_inflight + a->early_cap;
	const uint32_t nfol = a->nprod * a->fol_per;
	uint32_t i, k, n_early = 0, n_exp = 0, n_gone = 0, undelivered = 0;
	uint32_t half = 0, draining = 0, pending = 0, resv = 0, evicting = 0;
	uint32_t prepared = 0, fols = 0, fol_wait = 0, counted = 0, nbor = 0;
	uint64_t extra = 0;
	static uint8_t bm_used[4096], fol_seen[1 << 16];
	static uint32_t own_early[NSIM];

	track_events();
	CHECK(a->ev_tail - a->ev_head <= a->ev_cap, a->ev_tail - a->ev_head);
	for (i = a->ev_head; i != a->ev_tail; i++) {
		uint32_t t = a->evq[i % a->ev_cap].type;

		undelivered += t == KVP_EV_RELEASED || t == KVP_EV_EXPIRED;
	}
	/* the table */
	CHECK(nbm <= sizeof(bm_used) && nfol <= sizeof(fol_seen), nbm);
	memset(bm_used, 0, nbm);
	memset(fol_seen, 0, nfol);
	memset(own_early, 0, sizeof(own_early));
	CHECK(a->nprod <= NSIM, a->nprod);
	for (i = 0; i <= a->tab_mask; i++) {
		const struct kvp_ent *e = &a->tab[i];

		switch (e->state) {
		case EN_FREE:
			continue;
		case EN_EARLY:
			n_early++;
			k = e->owner & 0xffff;
			if (k < a->nprod && a->conns[k].state != CS_FREE &&
			    (a->conns[k].gen & 0xffff) == e->owner >> 16)
				own_early[k]++;
			break;
		case EN_EXPECTED:
			n_exp++;
			break;
		case EN_GONE:
			n_gone++;
			CHECK(e->fol == NO_FOL, i);
			continue;
		default:
			fail("entry state", e->state);
		}
		CHECK(e->bm < nbm && !bm_used[e->bm], e->bm);
		bm_used[e->bm] = 1;
		/* its followers */
		for (k = e->fol, fols = 0; k != NO_FOL; k = a->fol[k].next) {
			CHECK(k < nfol && !fol_seen[k], k);
			fol_seen[k] = 1;
			CHECK(a->fol[k].used && a->fol[k].req_id == e->req_id &&
				      a->fol[k].engine_id == e->engine_id,
			      k);
			CHECK(++fols <= nfol, fols);
		}
	}
	CHECK(a->tab_used == n_early + n_exp + n_gone, a->tab_used);
	CHECK(2 * a->tab_used <= a->tab_mask + 1, a->tab_used);
	CHECK(a->nearly == n_early && n_early <= a->early_cap, a->nearly);
	CHECK(a->nheld == n_exp + undelivered, a->nheld);
	CHECK(a->nheld <= a->max_inflight, a->nheld);
	CHECK(a->bm_nfree + n_early + n_exp == nbm, a->bm_nfree);
	check_leases(a, n_exp);
	for (i = 0; i < a->bm_nfree; i++)
		CHECK(a->bm_free[i] < nbm && !bm_used[a->bm_free[i]]++,
		      a->bm_free[i]);
	CHECK(n_gone <= a->gone_tail - a->gone_head &&
		      a->gone_tail - a->gone_head <= a->gone_cap,
	      n_gone);
	for (k = 0; k < nfol; k++) {
		/* every follower in use is in its request's chain, on a
		 * slot in use (tests/fuzz/crashes/inbox-stale-follower) */
		CHECK(!a->fol[k].used || fol_seen[k], k);
		CHECK(!a->fol[k].used ||
			      a->conns[k / a->fol_per].state != CS_FREE,
		      k);
	}
	/* the connections */
	fols = 0;
	for (i = 0; i < a->nprod; i++) {
		const struct kvp_conn *c = &a->conns[i];

		CHECK(i < a->prod_hw || (c->state == CS_FREE && !c->prepared),
		      i);
		half += kvp__half_open(c);
		draining += c->state == CS_DRAINING;
		pending += c->blob_pending != 0;
		resv += c->resv;
		evicting += c->evicted != 0;
		prepared += c->prepared != 0;
		fols += a->fol_mr[i] != NULL;
		fol_wait += c->fol_wait != 0;
		counted += c->counted != 0;
		CHECK(c->state != CS_FREE || (!c->qp && !c->counted), i);
		CHECK(c->nearly <= a->early_per_conn, c->nearly);
		if (c->state != CS_FREE)
			CHECK(c->nearly == own_early[i], c->nearly);
		CHECK(c->prog_out <= PROG_SQ, c->prog_out);
		if (a->srq && c->cr.live) {
			CHECK(kvp__credit_hold(&c->cr) ==
				      (uint64_t)c->cr.own + c->cr.extra,
			      (long)kvp__credit_hold(&c->cr));
			extra += c->cr.extra;
			nbor += c->cr.first;
		}
		if (a->srq && c->qp)
			CHECK(kvp__qpn_find(a, c->qp->qp_num) == c, i);
	}
	CHECK(a->nhalf == half, a->nhalf);
	CHECK(a->ndraining == draining, a->ndraining);
	CHECK(a->npending == pending, a->npending);
	CHECK(a->nreserved == resv, a->nreserved);
	CHECK(a->nevicting == evicting, a->nevicting);
	CHECK(a->nprepared[0] == prepared, a->nprepared[0]);
	CHECK(a->nfol == fols, a->nfol);
	CHECK(a->nfol_wait == fol_wait, a->nfol_wait);
	for (i = 0, k = 0; i < a->prod_peers; i++) {
		const struct kvp_peng *p = &a->peng[i];
		uint32_t j, n = 0;

		if (!p->nconns)
			continue;
		for (j = 0; j < a->nprod; j++)
			n += a->conns[j].counted &&
			     a->conns[j].engine_id == p->engine_id;
		CHECK(p->nconns == n, p->nconns);
		k += n;
		for (j = i + 1; j < a->prod_peers; j++)
			CHECK(!a->peng[j].nconns ||
				      a->peng[j].engine_id != p->engine_id,
			      j);
	}
	CHECK(k == counted, counted);
	/* credit */
	if (a->srq) {
		struct fk_srq *s = fk.srq;

		CHECK(a->crp.free <= a->crp.pool, a->crp.free);
		CHECK(a->crp.free + extra == a->crp.pool, extra);
		CHECK(a->crp.nbor == nbor, a->crp.nbor);
		CHECK(a->srq_full ||
			      kvp__credit_bufs(a->nprepared[0], a->crp.pool) <=
				      a->srq_n,
		      a->srq_n);
		/* every buffer posted once, or in a completion */
		CHECK(s->n + srq_cqes() + fk.srq_lost == a->srq_n, s->n);
	}
	/* while every consumer kept to its credit, none was dropped */
	CHECK(st.hostile || !a->st.credit_abuses, a->st.credit_abuses);
}

/* ---- the operations ------------------------------------------------------- */

/* Work per poll is bounded (kvpull.h): at most POLL_WCS completions over
 * all CQs, at most POLL_IDLE ranks closed for idleness. */
#define POLL_WCS 256
#define POLL_IDLE 8

static void do_poll(uint32_t max)
{
	struct kvp_event ev[16];
	uint64_t idle = A->st.idle_closes;
	int n;

	fk.in_poll = 1;
	fk.poll_wcs = 0;
	n = kvp_agent_poll(A, ev, (int)(max % 16) + 1);
	fk.in_poll = 0;
	CHECK(n >= 0, n);
	CHECK(fk.poll_wcs <= POLL_WCS, fk.poll_wcs);
	CHECK(A->st.idle_closes - idle <= POLL_IDLE, A->st.idle_closes - idle);
	check_agent();
}

static void op_expect(void)
{
	uint32_t e = u8(), r = u8() % NREQ, d = u8();
	uint64_t engine = e % 8 < NENG ? eng_id[e % 8] : 0x7777;
	int k = e % 8 < NENG ? (int)(e % 8) : NENG, err;

	err = kvp_agent_expect(A, engine, REQ_BASE + r,
			       vnow + (uint64_t)d * 100000000ull);
	CHECK(err == 0 || err == -EEXIST || err == -EALREADY ||
		      err == -EBUSY || err == -ENOSPC,
	      err);
	if (!err)
		st.outstanding[k][r]++;
}

static void op_publish(void)
{
	uint32_t e = u8() % NENG, r = u8() % NREQ, b = u8();
	struct kvp_progress p;
	int err;

	memset(&p, 0, sizeof(p));
	p.tokens_all = b & 0x80 ? u32() : u8();
	p.tokens_cur = p.tokens_all + (b & 0x40 ? u8() : 0);
	p.layers_cur = u8() % 4;
	if ((b & 0x3f) == 0x3f)
		p.comp_mask = 1;
	err = kvp_agent_publish(A, eng_id[e], REQ_BASE + r, &p);
	CHECK(err <= 0, err);
}

static void op_clock(void)
{
	static const uint64_t step[16] = {
		1000ull, 100000ull, 1000000ull, 10000000ull, 50000000ull,
		100000000ull, 250000000ull, 1000000000ull, 2000000000ull,
		5000000000ull, 10000000000ull, 31000000000ull,
		60000000000ull, 301000000000ull, 3000000ull, 500000000ull
	};

	vnow += step[u8() % 16];
}

static void op_async(void)
{
	struct sim *s = sim_pick(1);
	uint32_t k = u8() % 8;

	if (k == 7) {
		async_push(IBV_EVENT_PORT_ERR, NULL);
		return;
	}
	if (!s)
		return;
	if (k < 4) {
		/* the last WQE of a queue pair in error (once) */
		if (s->qp->err && s->qp->qp.srq && fk.lastwqe == 2)
			async_push(IBV_EVENT_QP_LAST_WQE_REACHED, &s->qp->qp);
	} else if (k < 6) {
		qp_error(s->qp);
		async_push(IBV_EVENT_QP_FATAL, &s->qp->qp);
	} else {
		/* the consumer rank READs: its queue pair's PSN moves */
		s->qp->psn += 1 + u8();
	}
}

static void op_arm(void)
{
	uint64_t wake = 0;
	int r = kvp_agent_arm(A, &wake);

	CHECK(r >= 0, r);
	/* an event loop sleeping till then */
	if (!r && (u8() & 1) && wake > vnow && wake - vnow < 3600000000000ull)
		vnow = wake;
}

static void op_est(struct sim *s)
{
	if (!s || !s->id || s->est || s->state < S_ACCEPTED ||
	    s->state == S_DONE)
		return;
	s->est = 1;
	ev_queue(s->id, RDMA_CM_EVENT_ESTABLISHED, NULL, 0, 0);
}

/* The consumer's next step, as a compliant one takes it. */
static void step(struct sim *s)
{
	if (!s)
		return;
	if (s->state == S_ACCEPTED) {
		op_est(s);
		send_auth(s, 1);
	} else if (s->state == S_AUTHED || s->state == S_GO) {
		complete_all();
	}
}

static void op_handshake(void)
{
	uint32_t b = u8(), i;
	struct sim *s = op_connect();

	/* a poll takes rdma_cm events once a millisecond */
	for (i = 0; s && i < 8 + b % 8 && s->state != S_READY &&
		    s->state != S_DONE; i++) {
		vnow += (b & 0x80) ? 10000000 : 1000000;
		do_poll(15);
		step(s);
	}
	do_poll(15);
	complete_all();
}

/* The consumer goes (DISCONNECTED, mostly), or rdma_cm says something
 * else of the connection. */
static void op_disconnect(void)
{
	static const enum rdma_cm_event_type other[4] = {
		RDMA_CM_EVENT_TIMEWAIT_EXIT, RDMA_CM_EVENT_ADDR_CHANGE,
		RDMA_CM_EVENT_CONNECT_ERROR, RDMA_CM_EVENT_DEVICE_REMOVAL
	};
	struct sim *s = sim_pick(0);
	uint32_t k = u8();

	if (!s || !s->id || s->id->disc || s->state < S_ACCEPTED)
		return;
	if (k % 8 < 4) {
		ev_queue(s->id, other[k % 4], NULL, 0, 0);
		return;
	}
	s->state = S_DONE;
	s->id->disc = 1;
	if (s->qp)
		qp_error(s->qp); /* its side is gone: nothing more lands */
	ev_queue(s->id, RDMA_CM_EVENT_DISCONNECTED, NULL, 0, 0);
}

static void op_fault(void)
{
	fk.fail |= 1u << (u8() % 8);
	if (trace)
		fprintf(stderr, "  faults %#x\n", fk.fail);
}

/* ---- setup and teardown --------------------------------------------------- */

static void trace_op(uint32_t op)
{
	static const char *const name[20] = {
		"msg", "msg", "msg", "msg", "connect", "handshake", "step",
		"established", "complete", "complete-all", "disconnect",
		"poll", "poll", "expect", "publish", "clock", "async", "arm",
		"fault", "poll+clock"
	};
	uint32_t i;

	fprintf(stderr, "%-12s t=%.6f held=%u early=%u used=%u abuses=%llu "
			"released=%llu sims:",
		op < 20 ? name[op] : "end", (double)vnow / 1e9, A->nheld,
		A->nearly, A->tab_used,
		(unsigned long long)A->st.credit_abuses,
		(unsigned long long)A->st.released);
	for (i = 0; i < NSIM; i++)
		if (sims[i].state)
			fprintf(stderr, " %u:%d%s", i, sims[i].state,
				sims[i].qp ? "" : "-");
	fprintf(stderr, "\n");
	if (op == UINT32_MAX)
		fprintf(stderr,
			"stats: srq %d notes %llu dropped %llu released %llu "
			"expired %llu disconnects %llu refused %llu gives %llu "
			"follows %llu writes %llu evictions %llu idle %llu "
			"abuses %llu connects %llu\n",
			A->srq != NULL,
			(unsigned long long)A->st.notes_recv,
			(unsigned long long)A->st.notes_dropped,
			(unsigned long long)A->st.released,
			(unsigned long long)A->st.expired,
			(unsigned long long)A->st.disconnects,
			(unsigned long long)A->st.refused,
			(unsigned long long)A->st.credit_gives,
			(unsigned long long)A->st.follows,
			(unsigned long long)A->st.progress_writes,
			(unsigned long long)A->st.evictions,
			(unsigned long long)A->st.idle_closes,
			(unsigned long long)A->st.credit_abuses,
			(unsigned long long)A->st.connects);
}

static int blob_of(const struct kvp_model *m, const struct kvp_engine_desc *d,
		   uint8_t **out, size_t *len, kvp_layout **keep)
{
	kvp_layout *l;

	*len = 0;
	if (kvp_layout_build(m, d, &l))
		return -1;
	if (kvp_meta_encode(l, NULL, 0, len) != -EMSGSIZE)
		return -1;
	*out = malloc(*len);
	if (!*out || kvp_meta_encode(l, *out, *len, len))
		return -1;
	if (keep)
		*keep = l;
	else
		kvp_layout_destroy(l);
	return 0;
}

static int build_engines(void)
{
	struct kvp_engine_desc d;
	struct kvp_model m, fm;
	kvp_layout *l;
	uint32_t e, r;

	if (kvp_model_preset("llama-3.1-8b", &m) ||
	    kvp_model_preset("gemma-2-9b", &fm))
		return -1;
	m.layers = 2;
	fm.layers = 2;
	fm.sliding_layers = 0;
	memset(&d, 0, sizeof(d));
	d.engine_id = PROD_ENGINE;
	d.tp_size = 2;
	d.tp_rank = 0;
	d.block_tokens = 16;
	d.num_blocks = 8;
	if (kvp_layout_build(&m, &d, &prod_layout))
		return -1;
	for (e = 0; e < NENG_ALL; e++) {
		for (r = 0; r < eng_tp[e]; r++) {
			d.engine_id = eng_id[e];
			d.tp_size = eng_tp[e];
			d.tp_rank = r;
			l = NULL;
			if (blob_of(&m, &d, &eng_blob[e][r], &eng_blob_len[e][r],
				    &l) ||
			    blob_of(&fm, &d, &eng_foreign[e][r],
				    &eng_foreign_len[e][r], NULL))
				return -1;
			if (r == 0 && e < NENG) {
				int n = kvp_notify_expected(prod_layout, l, 0);

				if (n <= 0)
					return -1;
				eng_expected[e] = (uint32_t)n;
			}
			kvp_layout_destroy(l);
		}
	}
	return 0;
}

static void teardown(void)
{
	struct fk_ev *e;
	struct fk_id *f;

	fk.closing = 1;
	complete_all();
	kvp_agent_close(A);
	A = NULL;
	/* Everything the library made, it destroyed. */
	CHECK(!fk.n_qp, fk.n_qp);
	CHECK(!fk.n_mr, fk.n_mr);
	CHECK(!fk.n_cq && !fk.n_srq && !fk.n_pd && !fk.n_cch && !fk.n_ech &&
		      !fk.n_devlist,
	      fk.n_cq);
	/* What it never took (connect requests still queued) is ours. */
	while ((e = fk.evs) != NULL) {
		fk.evs = e->next;
		free(e);
	}
	fk.evs_tail = &fk.evs;
	while ((f = fk.ids) != NULL) {
		fk.ids = f->next;
		/* the listening id and those it took were destroyed */
		CHECK(f->sim >= 0 && !f->taken, f->sim);
		free(f);
		fk.n_id--;
	}
	CHECK(!fk.n_id, fk.n_id);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const uint8_t secret[32] = "fuzz_inbox's shared secret.....";
	struct kvp_agent_attr attr;
	uint8_t c0, c1, c2, c3, c4, c5;
	uint32_t i, nops;
	uint64_t size_r;

	if (!init_done) {
		init_done = 1;
		trace = getenv("FUZZ_INBOX_TRACE") != NULL;
		devnull = open("/dev/null", O_RDWR);
		init_ok = devnull >= 0 && !build_engines();
	}
	if (!init_ok) {
		fprintf(stderr, "fuzz_inbox: cannot build the layouts\n");
		abort();
	}
	in_p = data;
	in_n = size;
	in_i = 0;
	memset(&fk, 0, sizeof(fk));
	fk.evs_tail = &fk.evs;
	memset(sims, 0, sizeof(sims));
	memset(&st, 0, sizeof(st));
	fk_init_ctx();
	vnow = 1000000000000ull;
	rnd_ctr = 0;
	fz_on = 1;

	c0 = u8();
	c1 = u8();
	c2 = u8();
	c3 = u8();
	c4 = u8();
	c5 = u8();
	dcfg.srq = (c0 & 3) != 3;
	dcfg.max_srq_wr = (c0 & 0x40) ? 128 + (c5 & 0x7f) * 8 : 16384;
	dcfg.max_cqe = (c0 & 0x80) ? 2048 + (c5 << 6) : 1 << 20;
	fk.lastwqe = (c0 >> 4) % 3;
	memset(&attr, 0, sizeof(attr));
	attr.role = KVP_ROLE_PRODUCER;
	attr.layout = prod_layout;
	attr.max_inflight = 1 + c1 % 32;
	attr.max_peers = 1 + c2 % 8;
	attr.max_qps = (c2 & 0x80) ? attr.max_peers + (c2 >> 3) % 8 : 0;
	if (attr.max_qps > NSIM)
		attr.max_qps = NSIM;
	if (!attr.max_qps && 2 * attr.max_peers > NSIM)
		attr.max_qps = NSIM;
	attr.max_per_source = c3 % 4;
	attr.rq_depth = (c3 & 0x80) ? 0 : 1 + (c3 >> 2) % 20;
	attr.idle_ms = (c0 & 8) ? 1000u + (c4 & 7) * 1000u : KVP_IDLE_NEVER;
	attr.handshake_ms = (c4 & 0x80) ? 50 + (c4 & 0x70) * 10 : 0;
	attr.srq = (c0 & 3) == 2 ? KVP_SRQ_OFF : 0;
	if (c0 & 4) {
		attr.secret = secret;
		attr.secret_len = sizeof(secret);
	}
	if (kvp_agent_open(&attr, &A)) {
		A = NULL;
		goto out;
	}
	/* Producer memory is only READ by the consumers' NICs: registered
	 * at addresses nothing here touches. */
	for (i = 0; i < A->li.nregions; i++) {
		size_r = 0;
		if (kvp_layout_get_region(prod_layout, i, &size_r) ||
		    kvp_agent_register(A, i,
				       (void *)(uintptr_t)(0x10000000000ull *
							   (i + 1)),
				       size_r))
			abort();
	}
	if (kvp_agent_listen(A, "10.0.0.100", 4791))
		abort();
	check_agent();
	for (nops = 0; in_i < in_n && nops < MAX_OPS; nops++) {
		uint32_t op = u8() % 20;

		if (trace)
			trace_op(op);
		switch (op) {
		case 0:
		case 1:
		case 2:
		case 3:
			op_msg();
			break;
		case 4:
			(void)op_connect();
			break;
		case 5:
			op_handshake();
			break;
		case 6:
			step(sim_pick(0));
			break;
		case 7:
			op_est(sim_pick(0));
			break;
		case 8:
			op_complete();
			break;
		case 9:
			complete_all();
			break;
		case 10:
			op_disconnect();
			break;
		case 11:
		case 12:
			do_poll(u8());
			break;
		case 13:
			op_expect();
			break;
		case 14:
			op_publish();
			break;
		case 15:
			op_clock();
			break;
		case 16:
			op_async();
			break;
		case 17:
			op_arm();
			break;
		case 18:
			op_fault();
			break;
		default:
			do_poll(u8());
			op_clock();
			break;
		}
		check_agent();
	}
	fk.fail = 0;
	do_poll(15);
	if (trace)
		trace_op(UINT32_MAX);
	teardown();
out:
	fz_on = 0;
	return 0;
}
