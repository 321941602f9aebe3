// SPDX-License-Identifier: MIT
/*
 * Hostile peers against a producer, over real verbs (soft-RoCE in the VM).
 *
 * Two producer processes (llama-3.1-8b, TP 1): P1 without a secret, P2 with
 * one. A raw consumer speaks the wire protocol itself with librdmacm (hello
 * in the connect's private data, control messages, blobs, notifications)
 * and misbehaves; after each attack a well-behaved consumer (public API)
 * pulls fresh requests from the same producer and compares its whole memory
 * with the expected bytes. The producer reports, per case, its worst
 * kvp_agent_poll() latency and its counters.
 *
 * Cases: short and oversized blob lengths; a slow consumer (no AUTH), a
 * huge garbage blob and a blob the producer cannot READ (a wrong key);
 * notification replay after expiry and after release;
 * cross-engine id collision; a flood of notifications with random ids;
 * idle connections holding every slot of a source address; wrong, missing
 * and unexpected secrets, and a forged proof.
 *
 *   rdma_hostile [NAME-FILTER]
 */
#include <arpa/inet.h>
#include <sys/socket.h>

#include <rdma/rdma_cma.h>

#include "rdma/harness.h"
#include "../verbs/hmac.c"
#include "../plan/le.h"

#define H_BLOCKS 64
#define H_NREQ 24	      /* request i reads remote blocks 2i, 2i+1 */
#define H_REQ0 7000
#define H_CONS 0x474f4f44ull  /* the good consumer engine, "GOOD" */
#define H_EVIL 0x4556494cull  /* the hostile engine, "EVIL" */
#define H_HANDSHAKE_MS 4000
#define H_PEERS 16
#define H_PER_SOURCE 4
#define H_FLOOD 16384 /* random notifications, a multiple of 4096 */

static const uint8_t secret[32] = "kvpull hostile test secret 0123";
static const uint8_t other_secret[32] = "not the secret of this producer";

static const struct rt_case eng = {
	.name = "hostile", .model = "llama-3.1-8b", .layers = 2, .P = 1,
	.D = 1, .pblock = 16, .dblock = 16, .pblocks = H_BLOCKS,
	.dblocks = H_BLOCKS, .kill_rank = -1,
};

struct h_req {
	uint32_t lid[2], rid[2];
	struct kvp_ids ids;
};

static struct h_req reqs[H_NREQ];

static void reqs_init(void)
{
	uint32_t i;

	for (i = 0; i < H_NREQ; i++) {
		struct h_req *r = &reqs[i];

		r->rid[0] = 2 * i;
		r->rid[1] = 2 * i + 1;
		/* Local blocks elsewhere than the remote ones. */
		r->lid[0] = H_BLOCKS - 1 - 2 * i;
		r->lid[1] = H_BLOCKS - 2 - 2 * i;
		r->ids.local = r->lid;
		r->ids.remote = r->rid;
		r->ids.nlocal = r->ids.nremote = 2;
		r->ids.tokens = 32;
	}
}

/* ---- the producer process: serves, and answers commands ----------------- */

enum { C_EXPECT = 1, C_WAIT, C_STATS, C_STOP, C_PAUSE, C_SLOW };

struct h_cmd {
	uint32_t op;
	uint32_t timeout_ms;
	uint64_t engine, req, deadline_ms;
};

struct h_reply {
	int32_t rc;
	uint32_t pad;
	uint64_t worst_ns; /* since the last C_STATS */
	uint64_t worst_cpu_ns; /* the most CPU time one poll took, since */
	struct kvp_agent_stats st;
};

#define H_MAX_EV 4096
struct h_seen {
	uint64_t engine, req;
	uint32_t type;
};

#define H_SECRET 1	 /* producer flag: with the shared secret */
#define H_IDLE_SHORT 2	 /* producer flag: idle_ms H_IDLE_MS */
#define H_IDLE_MS 1500

/* This thread's CPU time: what a poll costs whatever else the machine
 * runs (its wall time is the test's load's too). */
static uint64_t cpu_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int producer_main(const struct rt_env *env, uint16_t port,
			 int flags, int fd)
{
	static struct h_seen seen[H_MAX_EV];
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[16];
	struct h_cmd cmd, wait = { 0 };
	struct h_reply rep;
	kvp_layout *l = rt_layout(&eng, 1, 0);
	kvp_agent *a = NULL;
	uint64_t worst = 0, worst_cpu = 0, t0, c0, dt, wait_end = 0;
	uint64_t slow_end = 0;
	uint32_t nseen = 0, i;
	const char *who = flags & H_SECRET ? "P2" :
			  flags & H_IDLE_SHORT ? "P3" : "P1";
	int with_secret = flags & H_SECRET;
	int ret = 1, err, n, waiting = 0;

	if (!l || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout");
	for (i = 0; i < H_NREQ; i++)
		kvt_fill_producer(l, &mem, &reqs[i].ids);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = l;
	at.addr = env->addr0;
	at.max_inflight = 32;
	/* P2 takes the strangers and the ranks beside them from two
	 * addresses: room for all (a full producer would close an idle
	 * rank for a newcomer whose connect request proves the secret,
	 * a replayed one among them: see case_strangers). */
	at.max_peers = with_secret ? 2 * H_PEERS : H_PEERS;
	at.max_per_source = with_secret ? 2 * H_PEERS : H_PER_SOURCE;
	at.handshake_ms = H_HANDSHAKE_MS;
	if (flags & H_IDLE_SHORT)
		at.idle_ms = H_IDLE_MS;
	if (with_secret) {
		at.secret = secret;
		at.secret_len = sizeof(secret);
	}
	err = kvp_agent_open(&at, &a);
	if (!err)
		err = rt_register_all(a, &mem);
	if (!err)
		err = kvp_agent_listen(a, env->addr0, port);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	rep.rc = 0;
	if (write(fd, &rep, sizeof(rep)) != sizeof(rep))
		RT_FAIL("ready");
	for (;;) {
		struct pollfd p = { .fd = fd, .events = POLLIN };

		t0 = rt_now_ns();
		c0 = cpu_ns();
		n = kvp_agent_poll(a, ev, 16);
		dt = rt_now_ns() - t0;
		if (dt > worst)
			worst = dt;
		dt = cpu_ns() - c0;
		if (dt > worst_cpu)
			worst_cpu = dt;
		if (slow_end && rt_now_ns() < slow_end)
			usleep(5000);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type != KVP_EV_RELEASED &&
			    ev[i].type != KVP_EV_EXPIRED)
				continue;
			if (nseen == H_MAX_EV)
				RT_FAIL("too many events");
			seen[nseen].engine = ev[i].engine_id;
			seen[nseen].req = ev[i].req_id;
			/* the reason rides in the reply's high bits */
			seen[nseen++].type = ev[i].type | ev[i].reason << 8;
		}
		if (waiting) {
			for (i = 0; i < nseen; i++)
				if (seen[i].engine == wait.engine &&
				    seen[i].req == wait.req)
					break;
			if (i < nseen || rt_now_ns() >= wait_end) {
				memset(&rep, 0, sizeof(rep));
				rep.rc = i < nseen ? (int32_t)seen[i].type :
						     -ETIMEDOUT;
				if (write(fd, &rep, sizeof(rep)) != sizeof(rep))
					RT_FAIL("reply");
				waiting = 0;
			}
		}
		if (waiting || poll(&p, 1, n > 0 ? 0 : 1) <= 0)
			continue;
		if (read(fd, &cmd, sizeof(cmd)) != sizeof(cmd))
			RT_FAIL("command");
		memset(&rep, 0, sizeof(rep));
		switch (cmd.op) {
		case C_EXPECT:
			rep.rc = kvp_agent_expect(a, cmd.engine, cmd.req,
						  rt_now_ns() +
							  cmd.deadline_ms *
								  1000000ull);
			break;
		case C_WAIT:
			wait = cmd;
			wait_end = rt_now_ns() + cmd.timeout_ms * 1000000ull;
			waiting = 1;
			continue;
		case C_STATS:
			rep.worst_ns = worst;
			rep.worst_cpu_ns = worst_cpu;
			worst = worst_cpu = 0;
			kvp_agent_get_stats(a, &rep.st);
			break;
		case C_STOP:
			ret = 0;
			goto out;
		case C_SLOW: /* sleeps 5 ms after each poll for a while:
			      * its completions outlast its polls */
			slow_end = rt_now_ns() + cmd.timeout_ms * 1000000ull;
			break;
		case C_PAUSE: /* answers, then does not poll for a while */
			if (write(fd, &rep, sizeof(rep)) != sizeof(rep))
				RT_FAIL("reply");
			usleep(cmd.timeout_ms * 1000u);
			continue;
		default:
			RT_FAIL("bad command %u", cmd.op);
		}
		if (write(fd, &rep, sizeof(rep)) != sizeof(rep))
			RT_FAIL("reply");
	}
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

struct h_prod {
	pid_t pid;
	int fd;
	uint16_t port;
};

static int prod_cmd(struct h_prod *p, uint32_t op, uint64_t engine,
		    uint64_t req, uint64_t arg, struct h_reply *rep)
{
	struct h_cmd c = { .op = op, .engine = engine, .req = req };
	struct pollfd pf = { .fd = p->fd, .events = POLLIN };

	if (op == C_WAIT || op == C_PAUSE || op == C_SLOW)
		c.timeout_ms = (uint32_t)arg;
	else
		c.deadline_ms = arg;
	if (write(p->fd, &c, sizeof(c)) != sizeof(c) ||
	    poll(&pf, 1, 60000) != 1 ||
	    read(p->fd, rep, sizeof(*rep)) != sizeof(*rep))
		return -EIO;
	return rep->rc;
}

static int prod_start(const struct rt_env *env, uint16_t port, int flags,
		      struct h_prod *p)
{
	struct h_reply rep;
	struct pollfd pf;
	int sv[2];

	if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv))
		return -1;
	fflush(NULL);
	p->pid = fork();
	if (p->pid == 0) {
		close(sv[0]);
		alarm(600);
		RT_EXIT(producer_main(env, port, flags, sv[1]));
	}
	close(sv[1]);
	p->fd = sv[0];
	p->port = port;
	pf.fd = p->fd;
	pf.events = POLLIN;
	if (p->pid < 0 || poll(&pf, 1, 30000) != 1 ||
	    read(p->fd, &rep, sizeof(rep)) != sizeof(rep))
		return -1;
	return 0;
}

/* ---- child processes ---------------------------------------------------- */

/* Runs fn in a child and returns its exit status (0..255), or -1 when it
 * did not end within `secs`. */
static int run_child(int (*fn)(const struct rt_env *, void *),
		     const struct rt_env *env, void *arg, double secs)
{
	pid_t pid;

	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm((unsigned)secs + 5);
		RT_EXIT(fn(env, arg));
	}
	if (pid < 0)
		return -1;
	if (rt_wait(&pid, 1, rt_now() + secs, "child"))
		return -1;
	return 0;
}

/* A well-behaved consumer: connects, pulls requests [first, first + n),
 * checks its whole memory. */
struct good {
	uint64_t engine;
	const char *addr;	/* source address */
	uint16_t port;
	const uint8_t *secret;
	int want;		/* expected connect result (0: pull) */
	uint32_t first, n;
	int show_connect;	/* print how long the connect took (not
				 * bounded: the machine's load moves it) */
	int costly;		/* with costly_layout(): refused by itself */
	uint32_t timeout_ms;	/* the connect's (0: 20000) */
	const char *why;	/* failed: the reason's text has this */
	uint32_t idle_ms;	/* > 0: after the first pull, idle this long
				 * (the producer must drop us), connect again
				 * and pull the rest */
};

static kvp_layout *costly_layout(uint64_t engine);

static int good_main(const struct rt_env *env, void *arg)
{
	const struct good *g = arg;
	struct kvp_peer peer = { .addr = env->addr0, .port = g->port };
	struct kvt_mem mem = { 0 }, want = { 0 };
	kvp_layout *l = g->costly ? costly_layout(g->engine) :
				    rt_layout_engine(&eng, 0, 0, g->engine);
	kvp_layout *pl = rt_layout(&eng, 1, 0);
	struct kvp_agent_attr at;
	struct kvp_event ev[8];
	kvp_agent *a = NULL;
	uint32_t i, done = 0;
	const char *who = "good consumer";
	double end;
	int ret = 1, err, n;

	if (!l || !pl || kvt_mem_alloc(l, &mem) || kvt_mem_alloc(l, &want))
		RT_FAIL("layout");
	kvt_fill_background(&mem, 5);
	for (i = 0; i < mem.nregions; i++)
		memcpy(want.buf[i], mem.buf[i], mem.size[i]);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = g->addr;
	if (g->secret) {
		at.secret = g->secret;
		at.secret_len = 32;
	}
	err = kvp_agent_open(&at, &a);
	if (!err)
		err = rt_register_all(a, &mem);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	end = rt_now();
	err = kvp_agent_connect(a, &peer, 1,
				g->timeout_ms ? g->timeout_ms : 20000);
	end = rt_now() - end;
	if (err != g->want)
		RT_FAIL("connect: %s, want %s", kvp_strerror(err),
			kvp_strerror(g->want));
	if (g->show_connect)
		printf("    good consumer connected in %.0f ms\n", end * 1e3);
	if (err && g->costly) {
		/* Its own plan: over KVP_PLAN_MAX_WORK, refused at once. */
		char why[KVP_WHY_LEN];
		uint32_t r = kvp_agent_last_error(a, why, sizeof(why));

		printf("    costly consumer refused in %.0f ms: %s\n",
		       end * 1e3, why);
		if (r != KVP_REASON_PLAN_COST)
			RT_FAIL("costly consumer: reason %u \"%s\"", r, why);
	}
	if (err && g->why) {
		char why[KVP_WHY_LEN];
		uint32_t r = kvp_agent_last_error(a, why, sizeof(why));

		printf("    consumer refused in %.0f ms: %s\n", end * 1e3, why);
		if (r != KVP_REASON_PEER_REFUSED || !strstr(why, g->why))
			RT_FAIL("reason %u \"%s\", want \"%s\"", r, why,
				g->why);
	}
	if (err) {
		ret = 0;
		goto out;
	}
	for (i = g->first; i < g->first + g->n; i++) {
		if (g->idle_ms && i == g->first + 1) {
			uint32_t k, downs = 0, handle = 0;

			/* Wait for the first, then idle: only the rank's
			 * DISCONNECTED and the engine's ENGINE_DOWN (the
			 * producer's idle close) may come. */
			end = rt_now() + 30;
			while (done < 1 && rt_now() < end) {
				n = kvp_agent_poll(a, ev, 8);
				for (k = 0; n > 0 && k < (uint32_t)n; k++)
					done += ev[k].type == KVP_EV_DONE;
			}
			end = rt_now() + g->idle_ms / 1e3;
			while (rt_now() < end) {
				n = kvp_agent_poll(a, ev, 8);
				if (n < 0)
					RT_FAIL("poll: %s", kvp_strerror(n));
				for (k = 0; k < (uint32_t)n; k++) {
					if (ev[k].type == KVP_EV_DISCONNECTED)
						continue; /* the rank */
					if (ev[k].type != KVP_EV_ENGINE_DOWN)
						RT_FAIL("idle: event %u %s",
							ev[k].type,
							kvp_strerror(
								ev[k].status));
					handle = ev[k].engine;
					downs++;
				}
				usleep(1000);
			}
			if (done != 1 || downs != 1)
				RT_FAIL("idle: %u DONE, %u ENGINE_DOWN", done,
					downs);
			/* The engine comes back on demand: -EAGAIN while
			 * it reconnects. */
			end = rt_now() + 20;
			while ((err = kvp_agent_pull_from(a, handle,
							  H_REQ0 + i,
							  &reqs[i].ids)) ==
				       -EAGAIN &&
			       rt_now() < end) {
				n = kvp_agent_poll(a, ev, 8);
				for (k = 0; n > 0 && k < (uint32_t)n; k++)
					if (ev[k].type != KVP_EV_ENGINE_UP)
						RT_FAIL("reconnect: event %u",
							ev[k].type);
				usleep(1000);
			}
			if (err)
				RT_FAIL("pull after the idle close: %s",
					kvp_strerror(err));
			printf("    idle consumer dropped by the producer, "
			       "its next pull reconnected\n");
			kvt_expect_consumer(l, pl, &want, NULL, &reqs[i].ids);
			continue;
		}
		err = kvp_agent_pull(a, H_REQ0 + i, &reqs[i].ids);
		if (err)
			RT_FAIL("pull %u: %s", i, kvp_strerror(err));
		kvt_expect_consumer(l, pl, &want, NULL, &reqs[i].ids);
	}
	end = rt_now() + 30;
	while (done < g->n && rt_now() < end) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			if (g->idle_ms && ev[i].type == KVP_EV_ENGINE_UP)
				continue; /* reconnected */
			/* Idling, the requests after the first are expected
			 * only once it is done: pulled before the producer
			 * held them, they fail closed (no lease). */
			if (g->idle_ms && ev[i].type == KVP_EV_FAILED &&
			    ev[i].req_id != H_REQ0 + g->first &&
			    ev[i].status == -ESTALE &&
			    ev[i].reason == KVP_REASON_LEASE) {
				done++;
				continue;
			}
			if (ev[i].type != KVP_EV_DONE)
				RT_FAIL("event %u status %s", ev[i].type,
					kvp_strerror(ev[i].status));
			done++;
		}
	}
	if (done < g->n)
		RT_FAIL("%u of %u done", done, g->n);
	if (kvt_mem_compare(&mem, &want, "consumer memory"))
		RT_FAIL("bytes differ");
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvt_mem_free(&want);
	kvp_layout_destroy(l);
	kvp_layout_destroy(pl);
	return ret;
}

/* ---- the raw consumer: the wire protocol by hand ------------------------ */

/* What verbs/internal.h defines; this test pins the wire format. */
#define W_HELLO_MAGIC 0x4b565048u
#define W_HELLO_VERSION 6
#define W_HELLO_LEN 48
#define W_TAG_LEN 8 /* with a secret: HMAC("kvpull hello " || hello) */
#define W_GO_LEN 48
#define W_GIVE_MAGIC 0x4b565043u
#define W_ACCEPT_LEN 80
#define W_AUTH_MAGIC 0x4b565041u
#define W_GO_MAGIC 0x4b565047u
#define W_REFUSE_MAGIC 0x4b565052u
#define W_REFUSE_LEN 12 /* magic, -errno, reason */

/* The key a raw client's connect request proves (a hello with
 * KVP_HELLO_AUTH): the producer's secret unless a case sets another. */
static const uint8_t *raw_tag_key;
/* The secret a raw client's full handshake proves (raw_join*(): its hello
 * and its AUTH); NULL: none. */
static const uint8_t *raw_join_key;
/* Seconds added to the clock in a raw client's hello (a stale request). */
static int64_t raw_clock_skew;

/* The reason of the last refusal a raw client read (enum kvp_reason). */
static uint32_t raw_reason;
static uint32_t raw_retry_ms; /* a full producer's hint in its reject */
/* The refuser's handshake and library versions in its reject (0: none). */
static uint32_t raw_refuse_version, raw_refuse_lib;
/* The handshake version a raw client's hello claims (0: W_HELLO_VERSION). */
static uint8_t raw_hello_version;
#define W_NOTE_MAGIC 0x4b56504eu

struct raw {
	struct rdma_event_channel *ch;
	struct rdma_cm_id *id;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	uint8_t *buf; /* [0,4K): receive, [4K,8K): send, 8K on: blobs,
		       * then RAW_ANS_LEN for the producer's answer */
	size_t len, ans;
	uint8_t hello_c[W_HELLO_LEN], hello_p[W_HELLO_LEN];
	int established, refused; /* refused: the -errno of a refusal */
	uint64_t engine;
	/* GO: our credit, and the producer's counter of credits given back
	 * (RDMA-READ when out of credit); notifications sent */
	uint32_t credits, ctr_rkey;
	uint64_t ctr_addr, ctr_seen, sent;
	/* Completions polled while waiting for the other kind: kept, not
	 * lost (a GO may complete before our AUTH's send is polled). */
	uint32_t sends_seen, recvs_seen, recv_len[8];
};

#define RAW_RX 0
#define RAW_TX 4096
#define RAW_BLOB 8192
#define RAW_ANS_LEN 4096
#define RAW_CTR (RAW_TX + 4032) /* the counter, as last READ */

static int raw_event(struct raw *r, enum rdma_cm_event_type want,
		     int timeout_ms, uint8_t *pdata, uint32_t *plen)
{
	struct rdma_cm_event *e;
	struct pollfd p = { .fd = r->ch->fd, .events = POLLIN };
	enum rdma_cm_event_type t;

	if (poll(&p, 1, timeout_ms) != 1 || rdma_get_cm_event(r->ch, &e))
		return -ETIMEDOUT;
	t = e->event;
	if (pdata && e->param.conn.private_data) {
		*plen = e->param.conn.private_data_len < 196 ?
				e->param.conn.private_data_len :
				196;
		memcpy(pdata, e->param.conn.private_data, *plen);
	}
	rdma_ack_cm_event(e);
	return t == want ? 0 : -(int)(1000 + t);
}

static void raw_close(struct raw *r)
{
	if (r->id && r->id->qp)
		rdma_destroy_qp(r->id);
	if (r->mr)
		ibv_dereg_mr(r->mr);
	if (r->cq)
		ibv_destroy_cq(r->cq);
	if (r->pd)
		ibv_dealloc_pd(r->pd);
	if (r->id)
		rdma_destroy_id(r->id);
	if (r->ch)
		rdma_destroy_event_channel(r->ch);
	free(r->buf);
	memset(r, 0, sizeof(*r));
}

/* Connects with a hand-made hello (blob_len, flags as given). Returns 0
 * when accepted (the producer's hello in r->hello_p), the refusal's -errno
 * when rejected with a reason, another negative code otherwise. */
static int raw_connect_as(struct raw *r, const char *src, const char *dst,
			  uint16_t port, uint64_t engine, uint32_t tp,
			  uint32_t rank, uint32_t blob_len, uint32_t flags,
			  size_t bloblen_alloc)
{
	struct sockaddr_in s = { .sin_family = AF_INET };
	struct sockaddr_in d = { .sin_family = AF_INET };
	struct rdma_conn_param cp;
	struct ibv_qp_init_attr qa;
	uint8_t pd[196], req[W_HELLO_LEN + W_TAG_LEN];
	uint32_t plen = 0;
	int err, i;

	memset(r, 0, sizeof(*r));
	r->engine = engine;
	r->ans = RAW_BLOB + bloblen_alloc;
	r->len = r->ans + RAW_ANS_LEN;
	r->buf = calloc(1, r->len);
	inet_pton(AF_INET, src, &s.sin_addr);
	inet_pton(AF_INET, dst, &d.sin_addr);
	d.sin_port = htons(port);
	r->ch = rdma_create_event_channel();
	if (!r->buf || !r->ch || rdma_create_id(r->ch, &r->id, NULL, RDMA_PS_TCP))
		return -ENOMEM;
	if (rdma_resolve_addr(r->id, (struct sockaddr *)&s,
			      (struct sockaddr *)&d, 5000) ||
	    raw_event(r, RDMA_CM_EVENT_ADDR_RESOLVED, 6000, NULL, NULL) ||
	    rdma_resolve_route(r->id, 5000) ||
	    raw_event(r, RDMA_CM_EVENT_ROUTE_RESOLVED, 6000, NULL, NULL))
		return -EHOSTUNREACH;
	r->pd = ibv_alloc_pd(r->id->verbs);
	r->cq = r->pd ? ibv_create_cq(r->id->verbs, 256, NULL, NULL, 0) : NULL;
	/* The producer READs our blob at RAW_BLOB. */
	r->mr = r->cq ? ibv_reg_mr(r->pd, r->buf, r->len,
				   IBV_ACCESS_LOCAL_WRITE |
					   IBV_ACCESS_REMOTE_READ) : NULL;
	if (!r->mr)
		return -ENOMEM;
	memset(&qa, 0, sizeof(qa));
	qa.send_cq = qa.recv_cq = r->cq;
	qa.qp_type = IBV_QPT_RC;
	qa.cap.max_send_wr = 64;
	qa.cap.max_recv_wr = 4;
	qa.cap.max_send_sge = qa.cap.max_recv_sge = 1;
	if (rdma_create_qp(r->id, r->pd, &qa))
		return -ENOMEM;
	kvp__put32(r->hello_c, W_HELLO_MAGIC);
	r->hello_c[4] = raw_hello_version ? raw_hello_version : W_HELLO_VERSION;
	r->hello_c[6] = KVP_ROLE_CONSUMER;
	kvp__put32(r->hello_c + 8, tp);
	kvp__put32(r->hello_c + 12, rank);
	kvp__put32(r->hello_c + 16, blob_len);
	kvp__put32(r->hello_c + 20, flags);
	kvp__put64(r->hello_c + 24, engine);
	/* The nonce: the clock (seconds), then 8 random bytes. */
	kvp__put64(r->hello_c + 32, (uint64_t)((int64_t)time(NULL) +
					       raw_clock_skew));
	for (i = 8; i < 16; i++)
		r->hello_c[32 + i] = (uint8_t)(rand() >> 7);
	memcpy(req, r->hello_c, W_HELLO_LEN);
	if (flags & 1) {
		static const char label[] = "kvpull hello ";
		const void *m[2] = { label, r->hello_c };
		const size_t l[2] = { sizeof(label) - 1, W_HELLO_LEN };
		uint8_t mac[32];

		kvp__hmac_sha256(raw_tag_key ? raw_tag_key : secret, 32, m, l,
				 2, mac);
		memcpy(req + W_HELLO_LEN, mac, W_TAG_LEN);
	}
	memset(&cp, 0, sizeof(cp));
	cp.private_data = req;
	cp.private_data_len = flags & 1 ? W_HELLO_LEN + W_TAG_LEN :
					  W_HELLO_LEN;
	cp.initiator_depth = 1;
	cp.responder_resources = 1; /* the producer's probe, as kvpull's */
	cp.retry_count = 7;
	cp.rnr_retry_count = 7;
	if (rdma_connect(r->id, &cp))
		return -ECONNABORTED;
	err = raw_event(r, RDMA_CM_EVENT_ESTABLISHED, 10000, pd, &plen);
	if (err == -(1000 + RDMA_CM_EVENT_REJECTED)) {
		if (plen >= W_REFUSE_LEN && kvp__get32(pd) == W_REFUSE_MAGIC) {
			raw_reason = kvp__get32(pd + 8);
			raw_retry_ms = plen >= W_REFUSE_LEN + 4 ?
					       kvp__get32(pd + 12) : 0;
			raw_refuse_version = plen >= W_REFUSE_LEN + 12 ?
						     kvp__get32(pd + 16) : 0;
			raw_refuse_lib = plen >= W_REFUSE_LEN + 12 ?
						 kvp__get32(pd + 20) : 0;
			return (int32_t)kvp__get32(pd + 4);
		}
		return -ECONNREFUSED;
	}
	if (err)
		return err;
	if (plen < W_ACCEPT_LEN)
		return -EPROTO;
	memcpy(r->hello_p, pd, W_HELLO_LEN);
	r->established = 1;
	return 0;
}

/* As rank 0 of TP 1. */
static int raw_connect(struct raw *r, const char *src, const char *dst,
		       uint16_t port, uint64_t engine, uint32_t blob_len,
		       uint32_t flags, size_t bloblen_alloc)
{
	return raw_connect_as(r, src, dst, port, engine, 1, 0, blob_len, flags,
			      bloblen_alloc);
}

static int raw_post_recv(struct raw *r, uint32_t off, uint32_t len)
{
	struct ibv_sge g = { .addr = (uintptr_t)(r->buf + off), .length = len,
			     .lkey = r->mr->lkey };
	struct ibv_recv_wr w = { .wr_id = off, .sg_list = &g, .num_sge = 1 };
	struct ibv_recv_wr *bad;

	return ibv_post_recv(r->id->qp, &w, &bad) ? -EIO : 0;
}

static int raw_send(struct raw *r, uint32_t off, uint32_t len)
{
	struct ibv_sge g = { .addr = (uintptr_t)(r->buf + off), .length = len,
			     .lkey = r->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 1, .sg_list = &g, .num_sge = 1,
				 .opcode = IBV_WR_SEND,
				 .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	return ibv_post_send(r->id->qp, &w, &bad) ? -EIO : 0;
}

/* Waits for one completion of `recv` (1) or a send (0); returns its
 * byte_len, or a negative code. One of the other kind polled meanwhile is
 * kept for the wait that wants it. */
static int raw_wait(struct raw *r, int recv, int timeout_ms)
{
	double end = rt_now() + timeout_ms / 1000.0;
	struct ibv_wc wc;

	if (recv && r->recvs_seen) {
		int len = (int)r->recv_len[0];

		memmove(r->recv_len, r->recv_len + 1,
			--r->recvs_seen * sizeof(r->recv_len[0]));
		return len;
	}
	if (!recv && r->sends_seen) {
		r->sends_seen--;
		return 0;
	}
	while (rt_now() < end) {
		int n = ibv_poll_cq(r->cq, 1, &wc);

		if (n < 0)
			return -EIO;
		if (!n) {
			usleep(200);
			continue;
		}
		if (wc.status != IBV_WC_SUCCESS)
			return -ECONNRESET;
		if (!!(wc.opcode & IBV_WC_RECV) == recv)
			return (int)wc.byte_len;
		if (recv)
			r->sends_seen++; /* a send's */
		else if (r->recvs_seen < 8)
			r->recv_len[r->recvs_seen++] = wc.byte_len;
	}
	return -ETIMEDOUT;
}

/* AUTH with the proof under `key` (NULL: zeros) and our blob's address
 * (r->buf + RAW_BLOB, where the caller put it) and key, the key XORed with
 * key_xor; then waits for GO. Its RECV, and the one for the producer's
 * answer to our blob (raw_answer()), are posted first. Returns 0, the
 * refusal's -errno, or another negative code. */
static int raw_auth_key(struct raw *r, const uint8_t *key, uint32_t key_xor)
{
	static const char tag[] = "kvpull handshake ";
	const char label = 'C';
	const void *m[4] = { tag, &label, r->hello_c, r->hello_p };
	const size_t l[4] = { sizeof(tag) - 1, 1, W_HELLO_LEN, W_HELLO_LEN };
	uint8_t *tx = r->buf + RAW_TX, *rx = r->buf + RAW_RX;
	int n;

	if (raw_post_recv(r, RAW_RX, 64) ||
	    raw_post_recv(r, (uint32_t)r->ans, RAW_ANS_LEN))
		return -EIO;
	kvp__put32(tx, W_AUTH_MAGIC);
	kvp__put32(tx + 4, 0);
	memset(tx + 8, 0, 32);
	if (key)
		kvp__hmac_sha256(key, 32, m, l, 4, tx + 8);
	kvp__put64(tx + 40, (uint64_t)(uintptr_t)(r->buf + RAW_BLOB));
	kvp__put32(tx + 48, r->mr->rkey ^ key_xor);
	kvp__put32(tx + 52, 0);
	if (raw_send(r, RAW_TX, 56) || raw_wait(r, 0, 5000) < 0)
		return -EIO;
	n = raw_wait(r, 1, 5000);
	if (n < 0)
		return n;
	if (n == W_REFUSE_LEN && kvp__get32(rx) == W_REFUSE_MAGIC) {
		raw_reason = kvp__get32(rx + 8);
		return (int32_t)kvp__get32(rx + 4);
	}
	if (n != W_GO_LEN || kvp__get32(rx) != W_GO_MAGIC)
		return -EPROTO;
	r->credits = kvp__get32(rx + 4);
	r->ctr_addr = kvp__get64(rx + 8);
	r->ctr_rkey = kvp__get32(rx + 16);
	return 0;
}

static int raw_auth(struct raw *r, const uint8_t *key)
{
	return raw_auth_key(r, key, 0);
}

/* After GO: the producer's answer to our blob, which it READ: 0 for its
 * blob, the refusal's -errno, or another negative code. */
static int raw_answer(struct raw *r)
{
	uint8_t *rx = r->buf + r->ans;
	int n;

	n = raw_wait(r, 1, 10000);
	if (n < 0)
		return n;
	if (n == W_REFUSE_LEN && kvp__get32(rx) == W_REFUSE_MAGIC) {
		raw_reason = kvp__get32(rx + 8);
		return (int32_t)kvp__get32(rx + 4);
	}
	return 0;
}

/* A full handshake as rank `rank` of TP `tp` of consumer engine `engine`,
 * with that rank's true blob. */
static int raw_join_blob(struct raw *r, const char *src,
			 const struct rt_env *env, uint16_t port,
			 uint64_t engine, uint32_t tp, uint32_t rank,
			 const uint8_t *blob, size_t len)
{
	int err;

	err = raw_connect_as(r, src, env->addr0, port, engine, tp, rank,
			     (uint32_t)len, raw_join_key ? 1 : 0, 4096);
	if (!err && len > 4096)
		err = -EMSGSIZE;
	if (err)
		return err;
	memcpy(r->buf + RAW_BLOB, blob, len);
	err = raw_auth(r, raw_join_key);
	if (!err)
		err = raw_answer(r);
	return err;
}

static int raw_join_from(struct raw *r, const struct rt_env *env,
			 const char *src, uint16_t port, uint64_t engine,
			 uint32_t tp, uint32_t rank)
{
	struct rt_case c = eng;
	kvp_layout *l;
	uint8_t blob[4096];
	size_t len = 0;

	c.D = tp;
	l = rt_layout_engine(&c, 0, rank, engine);
	if (!l || kvp_meta_encode(l, blob, sizeof(blob), &len)) {
		kvp_layout_destroy(l);
		return -ENOMEM;
	}
	kvp_layout_destroy(l);
	return raw_join_blob(r, src, env, port, engine, tp, rank, blob, len);
}

static int raw_join(struct raw *r, const struct rt_env *env, uint16_t port,
		   uint64_t engine, uint32_t tp, uint32_t rank)
{
	return raw_join_from(r, env, env->addr0, port, engine, tp, rank);
}

/* The costliest valid consumer blob we know (issue 18): the same model,
 * 31-token blocks against the producer's 16 and every field's strides
 * reversed (the outermost dim innermost), so that no two elements are
 * contiguous on both sides and a period spans 496 tokens: a plan of tens
 * of thousands of pieces a layer. Valid: same compatibility hash. */
static kvp_layout *costly_layout(uint64_t engine)
{
	struct rt_case c = eng;
	struct kvp_layout_info li;
	struct kvp_layout_attr at = { 0 };
	kvp_layout *l, *o = NULL;
	uint32_t i, id, d, view;
	int err = -ENOMEM;

	c.dblock = 31;
	l = rt_layout_engine(&c, 0, 0, engine);
	if (!l)
		return NULL;
	kvp_layout_get_info(l, &li);
	at.engine_id = li.engine_id;
	at.tp_size = li.tp_size;
	at.tp_rank = li.tp_rank;
	if (kvp_layout_create(&at, &o))
		goto out;
	err = -EINVAL;
	for (i = 0; i < li.ngroups; i++) {
		struct kvp_group_desc g;

		if (kvp_layout_get_group(l, i, &g) ||
		    kvp_layout_add_group(o, &g, &id))
			goto out;
	}
	for (i = 0; i < li.nregions; i++) {
		uint64_t s, addr;
		uint32_t key;

		if (kvp_layout_get_region(l, i, &s) ||
		    kvp_layout_add_region(o, s, &id) ||
		    kvp_layout_get_region_key(l, i, &addr, &key) ||
		    kvp_layout_set_region_key(o, id, addr ? addr : 0x10000000,
					      key))
			goto out;
	}
	for (i = 0; i < li.nviews; i++) {
		struct kvp_view_desc v;

		if (kvp_layout_get_view(l, i, &v) ||
		    kvp_layout_add_view(o, &v, &id))
			goto out;
	}
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;
		uint64_t st;

		if (kvp_layout_get_field(l, i, &view, &f))
			goto out;
		for (d = 0, st = f.elem_size; d < f.ndim; d++) {
			f.dim[d].stride = st;
			st *= f.dim[d].size;
		}
		if (kvp_layout_add_field(o, view, &f))
			goto out;
	}
	err = 0;
out:
	kvp_layout_destroy(l);
	if (err) {
		kvp_layout_destroy(o);
		return NULL;
	}
	return o;
}

static int costly_blob(uint64_t engine, uint8_t *blob, size_t cap,
		       size_t *len)
{
	kvp_layout *o = costly_layout(engine);
	int err = o ? kvp_meta_encode(o, blob, cap, len) : -ENOMEM;

	kvp_layout_destroy(o);
	return err;
}

/* READs the producer's credit counter into r->ctr_seen (no send of ours
 * in flight). */
static int raw_read_ctr(struct raw *r)
{
	struct ibv_sge g = { .addr = (uintptr_t)(r->buf + RAW_CTR),
			     .length = 8, .lkey = r->mr->lkey };
	struct ibv_send_wr w = { .wr_id = 2, .sg_list = &g, .num_sge = 1,
				 .opcode = IBV_WR_RDMA_READ,
				 .send_flags = IBV_SEND_SIGNALED };
	struct ibv_send_wr *bad;

	w.wr.rdma.remote_addr = r->ctr_addr;
	w.wr.rdma.rkey = r->ctr_rkey;
	if (ibv_post_send(r->id->qp, &w, &bad) || raw_wait(r, 0, 5000) < 0)
		return -EIO;
	r->ctr_seen = kvp__get64(r->buf + RAW_CTR);
	return 0;
}

/* Sends n notifications {engine, rank, req[i]}, 32 at most before it
 * waits for their completions; within its credit (GO's and the counter's:
 * as kvpull's consumer) unless `blind`, and then the producer's receive
 * buffers throttle us by RNR, and a producer with a shared receive queue
 * may drop us. */
static int raw_notes_as(struct raw *r, uint64_t engine, uint32_t rank,
			const uint64_t *req, uint32_t n, int blind)
{
	double end = rt_now() + 50;
	uint32_t i, k, batch;

	for (i = 0; i < n; i += batch) {
		uint64_t room = r->credits + r->ctr_seen - r->sent;

		if (!blind && !room) {
			if (rt_now() > end || raw_read_ctr(r))
				return -ETIMEDOUT;
			if (r->credits + r->ctr_seen == r->sent)
				usleep(200);
			batch = 0;
			continue;
		}
		batch = n - i < 32 ? n - i : 32;
		if (!blind && batch > room)
			batch = (uint32_t)room;
		r->sent += batch;
		for (k = 0; k < batch; k++) {
			uint8_t *m = r->buf + RAW_TX + 64 * (k + 1);

			kvp__put32(m, W_NOTE_MAGIC);
			kvp__put32(m + 4, rank);
			kvp__put64(m + 8, req[i + k]);
			kvp__put64(m + 16, engine);
			kvp__put64(m + 24, 0);
			if (raw_send(r, RAW_TX + 64 * (k + 1), 32))
				return -EIO;
		}
		for (k = 0; k < batch; k++)
			if (raw_wait(r, 0, 20000) < 0)
				return -EIO;
	}
	return 0;
}

static int raw_notes(struct raw *r, uint64_t engine, uint32_t rank,
		     const uint64_t *req, uint32_t n)
{
	return raw_notes_as(r, engine, rank, req, n, 0);
}

/* ---- the cases ----------------------------------------------------------- */

struct ctx {
	struct h_prod p1, p2, p3;
	uint32_t next; /* next request index for the good consumer */
	double worst_ms;
};

/* Expects requests [next, next + n) of the good consumer on p, runs it
 * from `src` and waits until each is RELEASED. */
static int serve_good_idle(const struct rt_env *env, struct ctx *x,
			   struct h_prod *p, const char *src,
			   const uint8_t *key, uint32_t n, uint32_t idle_ms)
{
	struct good g = { .engine = H_CONS, .addr = src, .port = p->port,
			  .secret = key, .first = x->next, .n = n,
			  .idle_ms = idle_ms };
	struct h_reply rep;
	uint32_t i;

	if (x->next + n > H_NREQ)
		return -1;
	/* Idling: only the first is expected (an engine with a request
	 * expected is never idle); the rest once the consumer is done, their
	 * notifications waiting as early ones. */
	for (i = 0; i < (idle_ms ? 1 : n); i++)
		if (prod_cmd(p, C_EXPECT, H_CONS, H_REQ0 + x->next + i, 60000,
			     &rep))
			return -1;
	x->next += n;
	if (run_child(good_main, env, &g, 60))
		return -1;
	for (i = idle_ms ? 1 : n; i < n; i++)
		if (prod_cmd(p, C_EXPECT, H_CONS, H_REQ0 + g.first + i, 60000,
			     &rep))
			return -1;
	for (i = 0; i < n; i++)
		if (prod_cmd(p, C_WAIT, H_CONS, H_REQ0 + g.first + i, 10000,
			     &rep) != KVP_EV_RELEASED)
			return -1;
	return 0;
}

static int serve_good(const struct rt_env *env, struct ctx *x, struct h_prod *p,
		      const char *src, const uint8_t *key, uint32_t n)
{
	return serve_good_idle(env, x, p, src, key, n, 0);
}

static int case_stats(struct h_prod *p, struct h_reply *rep)
{
	return prod_cmd(p, C_STATS, 0, 0, 0, rep);
}

#define CHECK(cond, ...)                                                 \
	do {                                                             \
		if (!(cond)) {                                           \
			fprintf(stderr, "  [%s] ", who);                 \
			fprintf(stderr, __VA_ARGS__);                    \
			fprintf(stderr, "\n");                           \
			return 1;                                        \
		}                                                        \
	} while (0)

/* Blob lengths outside [KVP_META_MIN_LEN, cap]: refused in the hello. */
static int raw_lengths(const struct rt_env *env, void *arg)
{
	static const uint32_t bad[] = { 1, 8, KVP_META_MIN_LEN - 1,
					16u << 20, (16u << 20) + 1,
					0xffffffffu };
	const uint16_t *port = arg;
	const char *who = "lengths";
	struct raw r;
	uint32_t i;
	int err;

	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err = raw_connect(&r, env->addr0, env->addr0, *port, H_EVIL,
				  bad[i], 0, 64);
		raw_close(&r);
		CHECK(err == -EPROTO, "blob_len %u: %s, want -EPROTO", bad[i],
		      kvp_strerror(err));
	}
	return 0;
}

static int case_lengths(const struct rt_env *env, struct ctx *x)
{
	return run_child(raw_lengths, env, &x->p1.port, 60) ||
	       serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

/* A consumer that never sends its AUTH (so its blob is never READ):
 * dropped at the handshake bound; then a 64 KiB garbage blob: refused; then
 * a blob the producer cannot READ (a wrong key): dropped at once.
 * Meanwhile (the first) a good consumer is served. */
struct slow {
	uint16_t port;
	int ready_fd;
};

static int raw_slow(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "slow consumer";
	struct raw r;
	double t0;
	int err;

	err = raw_connect(&r, env->addr0, env->addr0, s->port, H_EVIL,
			  64 << 10, 0, 64 << 10);
	CHECK(!err, "connect: %s", kvp_strerror(err));
	t0 = rt_now();
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	err = raw_event(&r, RDMA_CM_EVENT_DISCONNECTED, H_HANDSHAKE_MS + 3000,
			NULL, NULL);
	CHECK(!err, "not dropped within %d ms: %d", H_HANDSHAKE_MS + 3000, err);
	printf("    consumer without AUTH dropped after %.0f ms (bound %d ms)\n",
	       (rt_now() - t0) * 1e3, H_HANDSHAKE_MS);
	raw_close(&r);

	/* A huge blob of garbage: decoded (one per poll), refused. */
	err = raw_connect(&r, env->addr0, env->addr0, s->port, H_EVIL,
			  64 << 10, 0, 64 << 10);
	CHECK(!err, "connect: %s", kvp_strerror(err));
	memset(r.buf + RAW_BLOB, 0xa5, 64 << 10);
	err = raw_auth(&r, NULL);
	CHECK(!err, "auth: %s", kvp_strerror(err));
	err = raw_answer(&r);
	raw_close(&r);
	CHECK(err == -EPROTO, "garbage blob: %s, want -EPROTO",
	      kvp_strerror(err));
	CHECK(raw_reason == KVP_REASON_MALFORMED, "garbage blob: reason %u",
	      raw_reason);

	/* A key that does not open our blob: the producer's READ fails, the
	 * connection goes (no GO: it was queued behind the READ). */
	err = raw_connect(&r, env->addr0, env->addr0, s->port, H_EVIL,
			  64 << 10, 0, 64 << 10);
	CHECK(!err, "connect: %s", kvp_strerror(err));
	t0 = rt_now();
	err = raw_auth_key(&r, NULL, 0x5a5a00u);
	CHECK(err, "wrong key: GO");
	err = raw_event(&r, RDMA_CM_EVENT_DISCONNECTED, H_HANDSHAKE_MS,
			NULL, NULL);
	CHECK(!err, "wrong key: not dropped within %d ms: %d", H_HANDSHAKE_MS,
	      err);
	printf("    blob behind a wrong key: dropped after %.0f ms\n",
	       (rt_now() - t0) * 1e3);
	raw_close(&r);
	return 0;
}

/* Starts fn (a raw child holding connections, 60 s at most) with a pipe
 * it writes to when ready: its pid, or -1; *rfd: the pipe's read end
 * (open even then). */
static pid_t raw_child(const struct rt_env *env, struct slow *s,
		       int (*fn)(const struct rt_env *, void *), int *rfd)
{
	int fds[2];
	pid_t pid;

	*rfd = -1;
	if (pipe(fds))
		return -1;
	s->ready_fd = fds[1];
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(60);
		RT_EXIT(fn(env, s));
	}
	close(fds[1]);
	*rfd = fds[0];
	return pid;
}

/* Runs fn (a raw child holding connections) and, once it says it is
 * ready, a good consumer from `src`; both must succeed. */
static int during_raw(const struct rt_env *env, struct ctx *x,
		      int (*fn)(const struct rt_env *, void *), const char *src)
{
	struct slow s = { .port = x->p1.port };
	int fd, ret = -1;
	pid_t pid = raw_child(env, &s, fn, &fd);
	char c;

	if (pid > 0 && read(fd, &c, 1) == 1 &&
	    !serve_good(env, x, &x->p1, src, NULL, 1))
		ret = 0;
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "raw child"))
		ret = -1;
	if (fd >= 0)
		close(fd);
	return ret;
}

static int case_slow(const struct rt_env *env, struct ctx *x)
{
	return during_raw(env, x, raw_slow, env->addr0);
}

/* A consumer rank that ignores its credit, against the producer's shared
 * receive queue: while the producer does not poll (C_PAUSE), it sends
 * H_OVERRUN notifications, far more than its credit (GO's, 9: it never
 * reads its counter) and than the queue holds (the rest wait in RNR
 * retries). The producer drops it at the first poll that sees it (one
 * credit abuse); every buffer goes back, and a good consumer is served. */
#define H_OVERRUN 1024
#define H_PAUSE_MS 1500
static int raw_overrun(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "past its credit";
	static uint64_t ids[H_OVERRUN];
	uint64_t seed = 17;
	struct raw r;
	double t0;
	uint32_t i;
	int err;

	for (i = 0; i < H_OVERRUN; i++)
		ids[i] = kvt_rand(&seed);
	err = raw_join(&r, env, s->port, H_EVIL, 1, 0);
	CHECK(!err, "join: %s", kvp_strerror(err));
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	usleep(200000); /* the producer pauses meanwhile */
	t0 = rt_now();
	err = raw_notes_as(&r, H_EVIL, 0, ids, H_OVERRUN, 1);
	CHECK(err, "all %u notifications went through", H_OVERRUN);
	err = raw_event(&r, RDMA_CM_EVENT_DISCONNECTED, 10000, NULL, NULL);
	CHECK(!err, "not disconnected: %d", err);
	printf("    %u notifications sent at once, credit 9: dropped %.0f ms "
	       "after the first (the producer paused %d ms)\n",
	       H_OVERRUN, (rt_now() - t0) * 1e3, H_PAUSE_MS);
	raw_close(&r);
	return 0;
}

/* p's stats into *st0; fn in a raw child and, once it is ready, p paused
 * for pause_ms (it answers, then does not poll), then slow for slow_ms (5
 * ms asleep after each poll); the child's end; p's stats into *st1. 0
 * when the child succeeded. */
static int paused_raw(const struct rt_env *env, struct h_prod *p,
		      struct slow *s, int (*fn)(const struct rt_env *, void *),
		      uint32_t pause_ms, uint32_t slow_ms, struct h_reply *st0,
		      struct h_reply *st1)
{
	struct h_reply rep;
	pid_t pid;
	int fd, ok;
	char c;

	if (case_stats(p, st0))
		return -1;
	pid = raw_child(env, s, fn, &fd);
	ok = pid > 0 && read(fd, &c, 1) == 1 &&
	     prod_cmd(p, C_PAUSE, 0, 0, pause_ms, &rep) == 0 &&
	     (!slow_ms || prod_cmd(p, C_SLOW, 0, 0, slow_ms, &rep) == 0);
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "raw child"))
		ok = 0;
	if (fd >= 0)
		close(fd);
	return ok && !case_stats(p, st1) ? 0 : -1;
}

static int case_overrun(const struct rt_env *env, struct ctx *x)
{
	const char *who = "past its credit";
	struct slow s = { .port = x->p1.port };
	struct h_reply st0, st1;

	CHECK(!paused_raw(env, &x->p1, &s, raw_overrun, H_PAUSE_MS, 0, &st0,
			  &st1),
	      "raw child");
	CHECK(st0.st.srq_bufs > 0, "P1 has no shared receive queue");
	CHECK(st1.st.credit_abuses == st0.st.credit_abuses + 1,
	      "credit abuses %llu -> %llu, want one more",
	      (unsigned long long)st0.st.credit_abuses,
	      (unsigned long long)st1.st.credit_abuses);
	CHECK(st1.st.srq_bufs == st0.st.srq_bufs,
	      "shared receive queue: %llu buffers, %llu before",
	      (unsigned long long)st1.st.srq_bufs,
	      (unsigned long long)st0.st.srq_bufs);
	printf("    shared receive queue: %llu buffers; %llu notifications "
	       "taken from the overrunning rank before it was dropped\n",
	       (unsigned long long)st1.st.srq_bufs,
	       (unsigned long long)(st1.st.notes_recv + st1.st.notes_dropped -
				    st0.st.notes_recv - st0.st.notes_dropped));
	return serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

/* The fuzz_meta crash (tests/fuzz/crashes/meta-short-key-table) as a
 * consumer's in-band blob: refused as malformed before any key is read
 * past it (this runs under ASan too), and the producer serves the next
 * consumer. */
static int raw_short_keys(const struct rt_env *env, void *arg)
{
	const uint16_t *port = arg;
	const char *who = "short key table";
	kvp_layout *l = rt_layout_engine(&eng, 0, 0, H_EVIL);
	uint8_t *sk = NULL;
	size_t len = 0;
	struct raw r;
	int err;

	CHECK(l && !kvt_short_key_table(l, &sk, &len), "blob");
	kvp_layout_destroy(l);
	raw_reason = 0;
	err = raw_join_blob(&r, env->addr0, env, *port, H_EVIL, 1, 0, sk,
			    len);
	raw_close(&r);
	free(sk);
	CHECK(err == -EPROTO && raw_reason == KVP_REASON_MALFORMED,
	      "short key table: %s reason %u, want -EPROTO MALFORMED",
	      kvp_strerror(err), raw_reason);
	return 0;
}

static int case_short_keys(const struct rt_env *env, struct ctx *x)
{
	const char *who = "short key table";

	CHECK(!run_child(raw_short_keys, env, &x->p1.port, 60), "raw child");
	return serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

/* Peers that send the costliest valid blob again and again for
 * H_COSTLY_S seconds: the producer checks a blob's fields and counts its
 * ranks' sources, and compiles no plan for it, so its polls stay short and
 * a good consumer still gets in (within its connect timeout; how long it
 * took is printed); a consumer agent with that layout is refused by its
 * own compilation (PLAN_COST). */
#define H_COSTLY H_PER_SOURCE /* all from the second address */
#define H_COSTLY_S 3.0
/* The bound is on a poll's own CPU time, so that the same tree gives the
 * same answer on a loaded machine (its wall time was seen at 131 ms in CI
 * under load, 17-54 ms on a quiet host); sanitized code is slower, by up
 * to 3x here. */
#define H_COSTLY_POLL_MS (RT_SANITIZED ? 300.0 : 100.0)
struct costly {
	uint16_t port;
	const char *src;
	uint64_t engine;
};

static int raw_costly(const struct rt_env *env, void *arg)
{
	const struct costly *k = arg;
	const char *who = "costly";
	double end = rt_now() + H_COSTLY_S;
	uint8_t blob[4096];
	uint32_t joins = 0, lost = 0;
	struct raw r;
	size_t len = 0;
	int err;

	CHECK(!costly_blob(k->engine, blob, sizeof(blob), &len), "blob");
	/* one more after a timeout (within the child's alarm) */
	while (rt_now() < end || (!joins && lost && lost < 2)) {
		raw_reason = 0;
		err = raw_join_blob(&r, k->src, env, k->port, k->engine, 1, 0,
				    blob, len);
		raw_close(&r);
		if (err == -EBUSY || err == -EUSERS) {
			usleep(10000); /* the producer's slots, not ours */
			continue;
		}
		/* No answer within our waits: under emulation, with the other
		 * peers' handshakes, ours may pass the producer's handshake
		 * bound, which drops it without a word (CI saw it once, 1 run
		 * in many). Not a refusal: tried again. */
		if (err == -ETIMEDOUT) {
			lost++;
			continue;
		}
		/* The producer makes no plan for it: served at once (the
		 * consumer's own compilation would refuse it). */
		CHECK(!err, "costly blob: %s reason %u, want it served",
		      kvp_strerror(err), raw_reason);
		joins++;
	}
	CHECK(joins > 0, "no costly handshake completed (%u timed out)", lost);
	if (lost)
		fprintf(stderr, "  [%s] %u handshakes timed out, %u served\n",
			who, lost, joins);
	return 0;
}

static int case_costly(const struct rt_env *env, struct ctx *x)
{
	struct good g = { .engine = H_CONS, .addr = env->addr0,
			  .port = x->p1.port, .first = x->next, .n = 1,
			  .show_connect = 1 };
	struct costly k[H_COSTLY];
	const char *who = "costly";
	struct h_reply rep;
	pid_t pid[H_COSTLY];
	uint32_t i, n = 0;
	int ret = -1;

	CHECK(env->addr1, "needs KVP_ADDR1 (--devices 2)");
	CHECK(x->next < H_NREQ, "requests");
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_CONS, H_REQ0 + x->next, 60000,
			&rep), "expect");
	x->next++;
	(void)case_stats(&x->p1, &rep);
	fflush(NULL);
	for (i = 0; i < H_COSTLY; i++, n++) {
		k[i].port = x->p1.port;
		/* the good consumer's address stays free for it */
		k[i].src = env->addr1;
		k[i].engine = 0x434f5354ull + i; /* "COST" */
		pid[i] = fork();
		if (pid[i] == 0) {
			alarm(60);
			RT_EXIT(raw_costly(env, &k[i]));
		}
		if (pid[i] < 0)
			goto out;
	}
	usleep(500000); /* their handshakes under way */
	if (run_child(good_main, env, &g, 60))
		goto out;
	/* A real consumer with that layout: refused by its own plan. */
	{
		struct good bad = { .engine = 0x42414443ull, .addr = env->addr0,
				    .port = x->p1.port, .want = -EPROTO,
				    .costly = 1 };

		if (run_child(good_main, env, &bad, 60))
			goto out;
	}
	if (prod_cmd(&x->p1, C_WAIT, H_CONS, H_REQ0 + g.first, 10000, &rep) !=
	    KVP_EV_RELEASED)
		goto out;
	ret = 0;
out:
	if (n && rt_wait(pid, n, rt_now() + 60, "costly child"))
		ret = -1;
	CHECK(!case_stats(&x->p1, &rep), "stats");
	printf("    %u costly peers for %.0f s: producer's worst poll %.2f ms "
	       "of CPU (bound %.0f ms; %.2f ms of wall time), %llu refused\n",
	       H_COSTLY, H_COSTLY_S, rep.worst_cpu_ns / 1e6, H_COSTLY_POLL_MS,
	       rep.worst_ns / 1e6, (unsigned long long)rep.st.refused);
	CHECK(rep.worst_cpu_ns < H_COSTLY_POLL_MS * 1e6,
	      "worst poll %.2f ms of CPU", rep.worst_cpu_ns / 1e6);
	return ret;
}

/* Notifications of the hostile engine: replayed after expiry and after
 * release, for another engine's id, and a flood of random ids. */
enum { R_EXPIRED, R_RELEASED, R_CROSS, R_FLOOD, R_DUP };
struct evil {
	uint16_t port;
	int what;
};

#define H_WIDE 0x57494445ull /* "WIDE": a TP 128 consumer engine */
#define H_OTHER 0x4f544852ull /* "OTHR": expected, never connects */

/* Rank 100 of a TP 128 engine notifies (WIDE, 502) twice: the second is a
 * duplicate (ranks past 64 are checked too). A second rank of that engine
 * claiming TP 1 is refused: an engine's ranks must agree. */
static int raw_dup(const struct rt_env *env, uint16_t port)
{
	const char *who = "duplicate rank";
	uint64_t ids[2] = { 502, 502 };
	struct raw r, r2;
	int err;

	err = raw_join(&r, env, port, H_WIDE, 128, 100);
	CHECK(!err, "join: %s", kvp_strerror(err));
	err = raw_notes(&r, H_WIDE, 100, ids, 2);
	CHECK(!err, "notes: %s", kvp_strerror(err));
	err = raw_join(&r2, env, port, H_WIDE, 1, 0);
	raw_close(&r2);
	CHECK(err == -EPROTO, "TP 1 rank of a TP 128 engine: %s, want -EPROTO",
	      kvp_strerror(err));
	CHECK(raw_reason == KVP_REASON_TP_SIZE,
	      "TP 1 rank of a TP 128 engine: reason %u", raw_reason);
	usleep(200000);
	raw_close(&r);
	return 0;
}

static int raw_evil(const struct rt_env *env, void *arg)
{
	const struct evil *e = arg;
	const char *who = "hostile notes";
	uint64_t ids[4096], seed = 77;
	struct raw r;
	uint32_t i;
	int err;

	if (e->what == R_DUP)
		return raw_dup(env, e->port);
	err = raw_join(&r, env, e->port, H_EVIL, 1, 0);
	CHECK(!err, "join: %s", kvp_strerror(err));
	switch (e->what) {
	case R_EXPIRED:
		ids[0] = 500;
		err = raw_notes(&r, H_EVIL, 0, ids, 1);
		break;
	case R_RELEASED:
		/* Releases (EVIL, 501), then the same note replayed. */
		ids[0] = ids[1] = 501;
		err = raw_notes(&r, H_EVIL, 0, ids, 2);
		break;
	case R_CROSS:
		/* The good engine's id, under our engine and under its. */
		ids[0] = H_REQ0 + 23;
		err = raw_notes(&r, H_EVIL, 0, ids, 1);
		if (!err)
			err = raw_notes(&r, H_CONS, 0, ids, 1);
		break;
	case R_FLOOD:
		for (i = 0; i < 4096; i++)
			ids[i] = kvt_rand(&seed);
		for (i = 0; !err && i < H_FLOOD / 4096; i++)
			err = raw_notes(&r, H_EVIL, 0, ids, 4096);
		break;
	}
	usleep(200000);
	raw_close(&r);
	CHECK(!err, "notes: %s", kvp_strerror(err));
	return 0;
}

/* The producer's counters before and after a hostile child doing `what`
 * against P1. */
static int evil_round(const struct rt_env *env, struct ctx *x, int what,
		      struct h_reply *st0, struct h_reply *st1)
{
	struct evil e = { .port = x->p1.port, .what = what };

	return case_stats(&x->p1, st0) || run_child(raw_evil, env, &e, 120) ||
	       case_stats(&x->p1, st1);
}

static int case_replay(const struct rt_env *env, struct ctx *x)
{
	const char *who = "replay";
	struct h_reply rep, st0, st1;
	int err;

	/* (EVIL, 500) expires, then its notification arrives. */
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_EVIL, 500, 200, &rep), "expect");
	CHECK(prod_cmd(&x->p1, C_WAIT, H_EVIL, 500, 5000, &rep) ==
		      (KVP_EV_EXPIRED | KVP_REASON_TIMEOUT << 8),
	      "500 not expired, or not for its deadline");
	CHECK(!evil_round(env, x, R_EXPIRED, &st0, &st1), "hostile child");
	CHECK(st1.st.notes_dropped == st0.st.notes_dropped + 1,
	      "late note not dropped (%llu -> %llu)",
	      (unsigned long long)st0.st.notes_dropped,
	      (unsigned long long)st1.st.notes_dropped);
	/* Not kept as an early note for a reuse of the id: refused. */
	err = prod_cmd(&x->p1, C_EXPECT, H_EVIL, 500, 60000, &rep);
	CHECK(err == -EALREADY, "expect after expiry: %s, want -EALREADY",
	      kvp_strerror(err));
	/* A replay after RELEASED: (EVIL, 501) released by its note, then
	 * the same note again is dropped. */
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_EVIL, 501, 60000, &rep), "expect");
	CHECK(!evil_round(env, x, R_RELEASED, &st0, &st1), "hostile child");
	CHECK(prod_cmd(&x->p1, C_WAIT, H_EVIL, 501, 5000, &rep) ==
		      KVP_EV_RELEASED, "501 not released by its note");
	CHECK(st1.st.notes_dropped == st0.st.notes_dropped + 1,
	      "replayed note not dropped");
	err = prod_cmd(&x->p1, C_EXPECT, H_EVIL, 501, 60000, &rep);
	CHECK(err == -EALREADY, "expect after release: %s, want -EALREADY",
	      kvp_strerror(err));
	/* A duplicate from rank 100 of 128 is not counted twice. */
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_WIDE, 502, 60000, &rep), "expect");
	CHECK(!evil_round(env, x, R_DUP, &st0, &st1), "hostile child");
	CHECK(st1.st.notes_recv == st0.st.notes_recv + 1 &&
		      st1.st.notes_dropped == st0.st.notes_dropped + 1,
	      "rank 100's duplicate counted (%llu received, %llu dropped)",
	      (unsigned long long)(st1.st.notes_recv - st0.st.notes_recv),
	      (unsigned long long)(st1.st.notes_dropped -
				   st0.st.notes_dropped));
	CHECK(prod_cmd(&x->p1, C_WAIT, H_WIDE, 502, 300, &rep) == -ETIMEDOUT,
	      "(WIDE, 502) released by one rank of 128");
	return serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

static int case_cross(const struct rt_env *env, struct ctx *x)
{
	struct good g = { .engine = H_CONS, .addr = env->addr0,
			  .port = x->p1.port, .first = 23, .n = 1 };
	const char *who = "cross-engine";
	struct h_reply rep, st0, st1;

	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_CONS, H_REQ0 + 23, 60000, &rep),
	      "expect");
	CHECK(!evil_round(env, x, R_CROSS, &st0, &st1), "hostile child");
	CHECK(prod_cmd(&x->p1, C_WAIT, H_CONS, H_REQ0 + 23, 500, &rep) ==
		      -ETIMEDOUT, "the good engine's request was released by "
				  "the hostile engine's notification");
	/* One counted for (EVIL, id) as an early note, one foreign. */
	CHECK(st1.st.notes_dropped == st0.st.notes_dropped + 1,
	      "foreign note not dropped");
	CHECK(!run_child(good_main, env, &g, 60), "good consumer");
	CHECK(prod_cmd(&x->p1, C_WAIT, H_CONS, H_REQ0 + 23, 10000, &rep) ==
		      KVP_EV_RELEASED, "not released after the real pull");
	/* The same id expected for a third engine that never pulls: it
	 * expires saying another engine (EVIL) notified that id. */
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_OTHER, H_REQ0 + 23, 300, &rep),
	      "expect for a third engine");
	CHECK(prod_cmd(&x->p1, C_WAIT, H_OTHER, H_REQ0 + 23, 5000, &rep) ==
		      (KVP_EV_EXPIRED | KVP_REASON_OTHER_ENGINE << 8),
	      "third engine's request: not EXPIRED with OTHER_ENGINE");
	return 0;
}

static int case_flood(const struct rt_env *env, struct ctx *x)
{
	const char *who = "flood";
	struct h_reply st0, st1;
	uint64_t kept, dropped, cap;
	double t0 = rt_now(), secs;

	CHECK(!evil_round(env, x, R_FLOOD, &st0, &st1), "hostile child");
	secs = rt_now() - t0;
	kept = st1.st.notes_recv - st0.st.notes_recv;
	dropped = st1.st.notes_dropped - st0.st.notes_dropped;
	/* Early notes are capped per connection at a time (max_inflight /
	 * 8, at least 8) and forgotten after 30 s, when 8 more may come. */
	cap = 8 * (1 + (uint64_t)(secs / 30));
	printf("    %u notifications in %.1f s: %llu kept as early (at most "
	       "%llu), %llu dropped\n", H_FLOOD, secs,
	       (unsigned long long)kept, (unsigned long long)cap,
	       (unsigned long long)dropped);
	CHECK(kept <= cap, "%llu early notes kept from one connection",
	      (unsigned long long)kept);
	/* Every one arrived and was accounted for (an early note forgotten
	 * after 30 s counts once more as dropped). */
	CHECK(kept + dropped >= H_FLOOD, "%llu of %u notifications seen",
	      (unsigned long long)(kept + dropped), H_FLOOD);
	return serve_good(env, x, &x->p1, env->addr0, NULL, 2);
}

/* Idle connections from addr0, one per consumer rank, take every rank
 * slot allowed to that address (max_per_source counts ranks); more ranks
 * are refused with -EUSERS and a retry hint (KVP_RETRY_FULL_MS, 250 ms),
 * while a rank that holds a slot gets its next queue pair; a consumer from
 * another address is served meanwhile; the idle ones are dropped at the
 * handshake bound. */
#define H_IDLE (H_PER_SOURCE + 4)
static int raw_idle(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "idle";
	struct raw r[H_IDLE + 1];
	uint32_t i, ok = 0, users = 0;
	int err;

	for (i = 0; i < H_IDLE; i++) {
		raw_retry_ms = 0;
		err = raw_connect_as(&r[i], env->addr0, env->addr0, s->port,
				     H_EVIL, H_IDLE, i, 4096, 0, 64);
		if (!err)
			ok++;
		else if (err == -EUSERS && raw_retry_ms == 250)
			users++;
		else
			CHECK(0, "idle rank %u: %s, retry hint %u ms", i,
			      kvp_strerror(err), raw_retry_ms);
	}
	CHECK(ok == H_PER_SOURCE && users == 4,
	      "%u ranks accepted, %u refused with -EUSERS", ok, users);
	/* Rank 0's second queue pair (index 1 of 2) is not a new rank. */
	err = raw_connect_as(&r[H_IDLE], env->addr0, env->addr0, s->port,
			     H_EVIL, H_IDLE, 0, 4096, 2u << 8 | 1u << 12, 64);
	CHECK(!err, "rank 0's second queue pair: %s", kvp_strerror(err));
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	for (i = 0; i <= H_IDLE; i++) {
		if (r[i].established)
			CHECK(!raw_event(&r[i], RDMA_CM_EVENT_DISCONNECTED,
					 H_HANDSHAKE_MS + 5000, NULL, NULL),
			      "idle connection %u not dropped", i);
		raw_close(&r[i]);
	}
	return 0;
}

static int case_idle(const struct rt_env *env, struct ctx *x)
{
	const char *who = "idle";

	CHECK(env->addr1, "needs KVP_ADDR1 (--devices 2)");
	CHECK(!during_raw(env, x, raw_idle, env->addr1),
	      "served from another address");
	/* The address's slots are free again. */
	return serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

/* Every rank slot of addr0 held for a while: a consumer from addr0 whose
 * deadline comes first is refused as full, retries with backoff and fails
 * with -EUSERS and the reason; one with time, started while the slots are
 * still held (3 s: the first takes well under 1.5 s even under the
 * sanitizers), is refused, backs off, and gets in once a slot frees (its
 * connect does not fail). */
#define H_HOLD_MS 3000
static int raw_hold(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "hold";
	struct raw r[H_PER_SOURCE];
	uint32_t i;
	int err;

	for (i = 0; i < H_PER_SOURCE; i++) {
		err = raw_connect_as(&r[i], env->addr0, env->addr0, s->port,
				     H_EVIL, H_PER_SOURCE, i, 4096, 0, 64);
		CHECK(!err, "rank %u: %s", i, kvp_strerror(err));
	}
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	usleep(H_HOLD_MS * 1000);
	for (i = 0; i < H_PER_SOURCE; i++)
		raw_close(&r[i]);
	return 0;
}

static int case_full(const struct rt_env *env, struct ctx *x)
{
	const char *who = "full";
	struct slow s = { .port = x->p1.port };
	struct good hasty = { .engine = H_CONS, .addr = env->addr0,
			      .port = x->p1.port, .want = -EUSERS,
			      .timeout_ms = 400,
			      .why = "producer full: refused" };
	struct h_reply r0, r1, r2;
	double t0, t1 = 0;
	int fd, ok;
	pid_t pid;
	char c;

	CHECK(!case_stats(&x->p1, &r0), "stats");
	pid = raw_child(env, &s, raw_hold, &fd);
	ok = pid > 0 && read(fd, &c, 1) == 1;
	if (fd >= 0)
		close(fd);
	t0 = rt_now();
	ok = ok && !run_child(good_main, env, &hasty, 60) &&
	     !case_stats(&x->p1, &r1);
	if (ok)
		t1 = rt_now() - t0;
	ok = ok && !serve_good(env, x, &x->p1, env->addr0, NULL, 1);
	t0 = rt_now() - t0;
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "raw child"))
		ok = 0;
	CHECK(ok, "refused until its deadline, then served");
	CHECK(!case_stats(&x->p1, &r2), "stats");
	printf("    the first refused %llu times; the second started after "
	       "%.0f ms, refused %llu times, served after %.0f ms (slots "
	       "held %u ms)\n",
	       (unsigned long long)(r1.st.refused - r0.st.refused), t1 * 1e3,
	       (unsigned long long)(r2.st.refused - r1.st.refused), t0 * 1e3,
	       H_HOLD_MS);
	CHECK(r1.st.refused > r0.st.refused, "the first was never refused");
	CHECK(r2.st.refused > r1.st.refused,
	      "the second was never refused: it came after the slots freed");
	CHECK(t0 * 1e3 >= H_HOLD_MS, "served before a slot was free");
	return 0;
}

/* An idle connected rank makes room for a newcomer; one whose engine has
 * a request in flight never does. The 4 rank slots of addr0 are held by
 * ranks of one raw engine, connected (READY), joined oldest first. While a
 * request of that engine is expected, a consumer from addr0 is refused
 * until its deadline and nobody is disconnected; once that request
 * expired, a consumer from addr0 evicts the least recently used rank (the
 * first joined) and pulls. */
#define H_EVICTEE 0x45564943ull /* "EVIC" */
static int raw_evictee(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "evictee";
	struct raw r[H_PER_SOURCE];
	uint32_t i;
	int err;

	for (i = 0; i < H_PER_SOURCE; i++) {
		err = raw_join(&r[i], env, s->port, H_EVICTEE, H_PER_SOURCE,
			       i);
		CHECK(!err, "rank %u: %s", i, kvp_strerror(err));
		usleep(20000); /* the order of their last use */
	}
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	CHECK(!raw_event(&r[0], RDMA_CM_EVENT_DISCONNECTED, 30000, NULL, NULL),
	      "rank 0, the least recently used, not evicted");
	for (i = 0; i < H_PER_SOURCE; i++)
		raw_close(&r[i]);
	return 0;
}

static int case_evict(const struct rt_env *env, struct ctx *x)
{
	const char *who = "evict";
	struct slow s = { .port = x->p1.port };
	struct good hasty = { .engine = H_CONS, .addr = env->addr0,
			      .port = x->p1.port, .want = -EUSERS,
			      .timeout_ms = 400,
			      .why = "producer full: refused" };
	struct h_reply r0, r1, rep;
	const char *bad = NULL;
	int fd, rc;
	pid_t pid;
	char c;

	/* In flight for 5 s: time for the joins and the hasty consumer even
	 * under the sanitizers. */
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_EVICTEE, H_REQ0, 5000, &rep),
	      "expect");
	pid = raw_child(env, &s, raw_evictee, &fd);
	if (pid <= 0 || read(fd, &c, 1) != 1 || case_stats(&x->p1, &r0))
		bad = "the ranks did not join";
	else if (run_child(good_main, env, &hasty, 60))
		bad = "not refused while the ranks' engine has a request in flight";
	else if (case_stats(&x->p1, &r1) ||
		 r1.st.disconnects != r0.st.disconnects)
		bad = "a rank of an engine with a request in flight was evicted";
	else if (rc = prod_cmd(&x->p1, C_WAIT, H_EVICTEE, H_REQ0, 10000, &rep),
		 (rc & 0xff) != KVP_EV_EXPIRED)
		bad = "the request did not expire";
	else if (serve_good(env, x, &x->p1, env->addr0, NULL, 1))
		bad = "the newcomer was not served";
	if (fd >= 0)
		close(fd);
	if (bad && pid > 0)
		kill(pid, SIGKILL); /* its slots go with it */
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "raw child") && !bad)
		bad = "rank 0 was not evicted";
	CHECK(!bad, "%s", bad);
	return 0;
}

/* Idle ranks reclaimed, busy ones never (producer P3, idle_ms 1.5 s). A
 * raw engine's rank joins and stays silent: dropped after idle_ms. A rank
 * of another engine with a request expected for 4 s: kept while it is in
 * flight, dropped at the first check after it expired (checks every
 * idle_ms). Then a good consumer pulls,
 * idles, is dropped (ENGINE_DOWN), connects again and pulls verified
 * bytes. */
#define H_IDLER 0x49444c45ull /* "IDLE" */
#define H_BUSY 0x42555359ull  /* "BUSY" */
#define H_BUSY_MS 4000
static double h_t_expect;
static int raw_idler(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "idler";
	struct raw idle, busy;
	double t0, t_idle, t_busy;
	int err;

	err = raw_join(&idle, env, s->port, H_IDLER, 1, 0);
	CHECK(!err, "idle rank: %s", kvp_strerror(err));
	t0 = rt_now();
	err = raw_join(&busy, env, s->port, H_BUSY, 1, 0);
	CHECK(!err, "busy rank: %s", kvp_strerror(err));
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	CHECK(!raw_event(&idle, RDMA_CM_EVENT_DISCONNECTED, 15000, NULL, NULL),
	      "the idle rank was not dropped");
	t_idle = rt_now() - t0;
	CHECK(!raw_event(&busy, RDMA_CM_EVENT_DISCONNECTED, 20000, NULL, NULL),
	      "the busy rank was not dropped after its request expired");
	t_busy = rt_now() - h_t_expect;
	printf("    idle rank dropped %.2f s after it joined; busy rank "
	       "%.2f s after its request was expected (in flight %.1f s, "
	       "idle_ms %.1f s)\n", t_idle, t_busy, H_BUSY_MS / 1e3,
	       H_IDLE_MS / 1e3);
	CHECK(t_idle >= H_IDLE_MS / 1e3 - 0.05, "idle rank dropped early");
	/* Unused for idle_ms and nothing in flight when that is checked:
	 * a busy rank is checked again idle_ms later. */
	CHECK(t_busy >= H_BUSY_MS / 1e3,
	      "busy rank dropped while its request was in flight");
	CHECK(t_busy <= (H_BUSY_MS + 2 * H_IDLE_MS) / 1e3 + 2,
	      "busy rank kept long after its request expired");
	raw_close(&idle);
	raw_close(&busy);
	return 0;
}

static int case_idle_close(const struct rt_env *env, struct ctx *x)
{
	const char *who = "idle close";
	struct slow s = { .port = x->p3.port };
	struct h_reply r0, r1, rep;
	int fd, ok;
	pid_t pid;
	char c;

	CHECK(!case_stats(&x->p3, &r0), "stats");
	h_t_expect = rt_now();
	CHECK(!prod_cmd(&x->p3, C_EXPECT, H_BUSY, H_REQ0, H_BUSY_MS, &rep),
	      "expect");
	pid = raw_child(env, &s, raw_idler, &fd);
	ok = pid > 0 && read(fd, &c, 1) == 1;
	if (fd >= 0)
		close(fd);
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "raw child"))
		ok = 0;
	CHECK(ok, "the raw ranks");
	CHECK(!case_stats(&x->p3, &r1), "stats");
	CHECK(r1.st.idle_closes - r0.st.idle_closes == 2 &&
	      r1.st.evictions == r0.st.evictions,
	      "%llu idle closes, %llu evictions; want 2 and 0",
	      (unsigned long long)(r1.st.idle_closes - r0.st.idle_closes),
	      (unsigned long long)(r1.st.evictions - r0.st.evictions));
	CHECK(!serve_good_idle(env, x, &x->p3, env->addr0, NULL, 2,
			       H_IDLE_MS + 1500),
	      "a consumer dropped as idle pulls again");
	CHECK(!case_stats(&x->p3, &r0), "stats");
	CHECK(r0.st.idle_closes - r1.st.idle_closes == 1,
	      "the good consumer: %llu idle closes, want 1",
	      (unsigned long long)(r0.st.idle_closes - r1.st.idle_closes));
	return 0;
}

/* Early notes shared between engines: the 4 ranks of one engine send 64
 * notes ahead of expect() each (ids of their own), then another engine
 * (from addr1) 4. Each rank
 * keeps at most 8 (max_inflight / 8, at least 8) and, past half of the 32
 * early slots, an engine at most its share (32 over the 2 engines
 * connected): the flood keeps 16 (ranks 0 and 1), the other engine all of
 * its 4. */
#define H_FLOODER 0x464c4f4full /* "FLOO" */
#define H_FAIR 0x46414952ull	/* "FAIR" */
static int raw_fair(const struct rt_env *env, void *arg)
{
	const uint16_t *port = arg;
	const char *who = "fair";
	struct raw fl[4], fa;
	uint64_t ids[64], seed = 91;
	uint32_t i;
	int err;

	err = raw_join_from(&fa, env, env->addr1, *port, H_FAIR, 1, 0);
	CHECK(!err, "join the fair engine: %s", kvp_strerror(err));
	for (i = 0; i < 4; i++) {
		err = raw_join(&fl[i], env, *port, H_FLOODER, 4, i);
		CHECK(!err, "join rank %u: %s", i, kvp_strerror(err));
	}
	for (i = 0; i < 4 && !err; i++) {
		uint32_t k;

		for (k = 0; k < 64; k++) /* each rank its own ids */
			ids[k] = kvt_rand(&seed);
		err = raw_notes(&fl[i], H_FLOODER, i, ids, 64);
	}
	CHECK(!err, "flood: %s", kvp_strerror(err));
	for (i = 0; i < 4; i++)
		ids[i] = 900 + i;
	err = raw_notes(&fa, H_FAIR, 0, ids, 4);
	CHECK(!err, "fair notes: %s", kvp_strerror(err));
	usleep(200000);
	for (i = 0; i < 4; i++)
		raw_close(&fl[i]);
	raw_close(&fa);
	return 0;
}

static int case_fair(const struct rt_env *env, struct ctx *x)
{
	const char *who = "fair";
	struct h_reply st0, st1;
	uint64_t kept, dropped;

	CHECK(env->addr1, "needs KVP_ADDR1 (--devices 2)");
	CHECK(!case_stats(&x->p1, &st0), "stats");
	CHECK(!run_child(raw_fair, env, &x->p1.port, 60), "raw child");
	CHECK(!case_stats(&x->p1, &st1), "stats");
	kept = st1.st.notes_recv - st0.st.notes_recv;
	dropped = st1.st.notes_dropped - st0.st.notes_dropped;
	printf("    one engine's 4 ranks sent 256 early notes, another's 4: "
	       "%llu kept, %llu dropped\n", (unsigned long long)kept,
	       (unsigned long long)dropped);
	CHECK(kept == 16 + 4 && dropped == 256 - 16,
	      "%llu kept, %llu dropped: want 20 and 240",
	      (unsigned long long)kept, (unsigned long long)dropped);
	return 0;
}

/* Issue 33, item 1: peers that have not proved the secret never empty
 * the shared receive queue. 64 strangers whose connect request carries a
 * true proof (a request replayed within its window: the only way to a
 * queue pair without the secret) send a wrong AUTH and, without waiting
 * for the refusal (they post no receive: its delivery would wait on their
 * RNR), flood SENDs with an infinite RNR retry, 4 at a time. Each is
 * dropped at its first message after the AUTH (stats.credit_abuses),
 * while 8 ranks with the secret send notifications at their credit (none
 * sees a completion error, none is dropped) and a consumer with the
 * secret pulls and checks every byte. Before: the strangers' messages
 * were reposted and ignored, no abuse counted, each connection held
 * until the refusal's delivery or the handshake bound. */
#define H_STR_ROUNDS 16
/* notifying ranks: see case_comply */
#define H_COMPLY 10000
#define H_COMPLY_P2 4000 /* beside the strangers */
#define H_COMPLY_RANKS 8
#define H_COMPLY_PAUSE_MS 500
#define H_COMPLY_SLOW_MS 3000
#define H_STR_MSGS 48
static int raw_strangers(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "strangers";
	struct raw r[H_PER_SOURCE];
	uint32_t round, i, k, dropped = 0;
	int err;

	/* Strangers without the secret: refused in their connect request,
	 * no queue pair made. */
	raw_tag_key = other_secret;
	for (i = 0; i < H_STR_ROUNDS * H_PER_SOURCE; i++) {
		err = raw_connect_as(&r[0], env->addr0, env->addr0, s->port,
				     H_EVIL + i, 1, 0, 4096, 1, 4096);
		raw_close(&r[0]);
		CHECK(err == -EPERM, "stranger %u: %s, want -EPERM", i,
		      kvp_strerror(err));
	}
	raw_tag_key = NULL;
	for (round = 0; round < H_STR_ROUNDS; round++) {
		for (i = 0; i < H_PER_SOURCE; i++) {
			uint8_t *tx;

			/* The slots of the last round's may still drain:
			 * come back, as the refusal's hint says. */
			while ((err = raw_connect_as(&r[i], env->addr0,
						     env->addr0, s->port,
						     H_EVIL + round,
						     H_PER_SOURCE, i, 4096, 1,
						     4096)) == -EBUSY ||
			       err == -EUSERS) {
				raw_close(&r[i]);
				usleep(10000);
			}
			CHECK(!err, "round %u connect %u: %s", round, i,
			      kvp_strerror(err));
			tx = r[i].buf + RAW_TX;
			kvp__put32(tx, W_AUTH_MAGIC);
			memset(tx + 4, 0, 52); /* a proof of zeros */
			kvp__put64(tx + 40,
				   (uint64_t)(uintptr_t)(r[i].buf + RAW_BLOB));
			kvp__put32(tx + 48, r[i].mr->rkey);
			CHECK(!raw_send(&r[i], RAW_TX, 56), "auth");
			for (k = 0; k < H_STR_MSGS; k++) {
				uint8_t *m = tx + 64 * (1 + k % 32);

				kvp__put32(m, W_NOTE_MAGIC);
				kvp__put64(m + 8, H_REQ0 + k);
				kvp__put64(m + 16, H_EVIL);
				CHECK(!raw_send(&r[i], RAW_TX + 64 *
							       (1 + k % 32),
						32),
				      "send");
			}
		}
		if (!round)
			CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
		for (i = 0; i < H_PER_SOURCE; i++) {
			/* (dropped before the producer saw it established:
			 * a reject) */
			err = raw_event(&r[i], RDMA_CM_EVENT_DISCONNECTED,
					10000, NULL, NULL);
			CHECK(!err || err == -(1000 + RDMA_CM_EVENT_REJECTED),
			      "round %u: stranger %u not dropped: %d", round,
			      i, err);
			dropped++;
			raw_close(&r[i]);
		}
	}
	printf("    %u strangers without the secret refused in their connect "
	       "request; %u with a replayed one, each a wrong AUTH then %u "
	       "SENDs: all dropped\n", H_STR_ROUNDS * H_PER_SOURCE, dropped,
	       H_STR_MSGS);
	return 0;
}

static int raw_comply_p2(const struct rt_env *env, void *arg);

static int case_strangers(const struct rt_env *env, struct ctx *x)
{
	const char *who = "strangers";
	struct slow s = { .port = x->p2.port }, k = { .port = x->p2.port };
	struct h_reply st0, st1;
	int fd = -1, kfd = -1, ok;
	pid_t pid[2] = { -1, -1 };
	char c;

	CHECK(env->addr1, "needs KVP_ADDR1 (--devices 2)");
	CHECK(!case_stats(&x->p2, &st0), "stats");
	CHECK(st0.st.srq_bufs > 0, "P2 has no shared receive queue");
	pid[0] = raw_child(env, &k, raw_comply_p2, &kfd);
	ok = pid[0] > 0 && read(kfd, &c, 1) == 1;
	if (ok)
		pid[1] = raw_child(env, &s, raw_strangers, &fd);
	ok = ok && pid[1] > 0 && read(fd, &c, 1) == 1 &&
	     !serve_good(env, x, &x->p2, env->addr1, secret, 2);
	if (rt_wait(pid, pid[1] > 0 ? 2 : 1, rt_now() + 60, "raw children"))
		ok = 0;
	if (fd >= 0)
		close(fd);
	if (kfd >= 0)
		close(kfd);
	CHECK(ok, "strangers, the ranks notifying or the consumer beside "
		  "them");
	CHECK(!case_stats(&x->p2, &st1), "stats");
	CHECK(st1.st.credit_abuses - st0.st.credit_abuses ==
		      H_STR_ROUNDS * H_PER_SOURCE,
	      "%llu strangers dropped at their first message, want %u",
	      (unsigned long long)(st1.st.credit_abuses -
				   st0.st.credit_abuses),
	      H_STR_ROUNDS * H_PER_SOURCE);
	CHECK(st1.st.connects == st0.st.connects + 1 + H_COMPLY_RANKS,
	      "%llu ranks connected, want the good one and %u notifying",
	      (unsigned long long)(st1.st.connects - st0.st.connects),
	      H_COMPLY_RANKS);
	/* (more slots taken: more buffers; none lost) */
	CHECK(st1.st.srq_bufs >= st0.st.srq_bufs,
	      "shared receive queue: %llu buffers, %llu before",
	      (unsigned long long)st1.st.srq_bufs,
	      (unsigned long long)st0.st.srq_bufs);
	/* Item 10: whether the device reports a QP's last WQE, found at the
	 * first release (a NIC's 1; soft-RoCE's whichever it does). */
	CHECK(st1.st.srq_last_wqe == 1 || st1.st.srq_last_wqe == 2,
	      "last WQE events: %llu, want known (1 or 2)",
	      (unsigned long long)st1.st.srq_last_wqe);
	printf("    the device %s a QP's last WQE event\n",
	       st1.st.srq_last_wqe == 1 ? "reports" : "does not report");
	return 0;
}

/* Issue 33, item 3: consumers that keep to their credit are never
 * dropped, however long the producer takes to poll. 8 ranks (4 from each
 * address) send 10,000 notifications each within their credit, as fast
 * as it allows: up to 60 sends in flight per rank, the counter READ when
 * out of credit; the producer does not poll for 500 ms at the start, then
 * sleeps 5 ms after each poll for 3 s, so that its completions' backlog
 * (256 a poll) outlasts its polls. Before: a rank that kept to its credit
 * was dropped once one backlog held more than its credit at the start
 * and 2 x rq_depth. */
static int comply_step(struct raw *r, uint64_t engine, uint64_t *inflight,
		       int *reading, uint64_t total)
{
	struct ibv_send_wr *bad;
	struct ibv_wc wc[16];
	int n, i;

	/* Dropped by the producer: its QP may never tell (no ack
	 * timeout set on ours). */
	if (!raw_event(r, RDMA_CM_EVENT_DISCONNECTED, 0, NULL, NULL))
		return -ENOTCONN;
	n = ibv_poll_cq(r->cq, 16, wc);
	for (i = 0; i < n; i++) {
		if (wc[i].status != IBV_WC_SUCCESS)
			return -ECONNRESET;
		if (wc[i].wr_id == 2) {
			*reading = 0;
			r->ctr_seen = kvp__get64(r->buf + RAW_CTR);
		} else {
			(*inflight)--;
		}
	}
	while (r->sent < total && *inflight < 60 &&
	       r->credits + r->ctr_seen > r->sent) {
		uint8_t *m = r->buf + RAW_TX + 64 * (1 + r->sent % 60);

		kvp__put32(m, W_NOTE_MAGIC);
		kvp__put32(m + 4, 0);
		kvp__put64(m + 8, 900000 + r->sent);
		kvp__put64(m + 16, engine);
		kvp__put64(m + 24, 0);
		if (raw_send(r, RAW_TX + 64 * (1 + r->sent % 60), 32))
			return -EIO;
		r->sent++;
		(*inflight)++;
	}
	if (r->sent < total && !*reading &&
	    r->credits + r->ctr_seen == r->sent) {
		struct ibv_sge g = { .addr = (uintptr_t)(r->buf + RAW_CTR),
				     .length = 8, .lkey = r->mr->lkey };
		struct ibv_send_wr w = { .wr_id = 2, .sg_list = &g,
					 .num_sge = 1,
					 .opcode = IBV_WR_RDMA_READ,
					 .send_flags = IBV_SEND_SIGNALED };

		w.wr.rdma.remote_addr = r->ctr_addr;
		w.wr.rdma.rkey = r->ctr_rkey;
		if (ibv_post_send(r->id->qp, &w, &bad))
			return -EIO;
		*reading = 1;
	}
	return r->sent == total && !*inflight && !*reading;
}

static int comply_n(const struct rt_env *env, const struct slow *s,
		    uint64_t total)
{
	const char *who = "compliant";
	struct raw r[H_COMPLY_RANKS];
	uint64_t inflight[H_COMPLY_RANKS] = { 0 };
	int reading[H_COMPLY_RANKS] = { 0 };
	uint32_t k, left = H_COMPLY_RANKS;
	double end;
	int err;

	for (k = 0; k < H_COMPLY_RANKS; k++) {
		/* (slots another case's peers left may still drain) */
		while ((err = raw_join_from(&r[k], env,
					    k & 1 ? env->addr1 : env->addr0,
					    s->port, H_EVIL + 16 + k, 1, 0)) ==
			       -EBUSY ||
		       err == -EUSERS) {
			raw_close(&r[k]);
			usleep(10000);
		}
		CHECK(!err, "join %u: %s", k, kvp_strerror(err));
	}
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	end = rt_now() + 50;
	while (left && rt_now() < end) {
		left = 0;
		for (k = 0; k < H_COMPLY_RANKS; k++) {
			err = comply_step(&r[k], H_EVIL + 16 + k, &inflight[k],
					  &reading[k], total);
			CHECK(err >= 0, "rank %u at note %llu: %s", k,
			      (unsigned long long)r[k].sent,
			      kvp_strerror(err));
			left += !err;
		}
	}
	for (k = 0; left && k < H_COMPLY_RANKS; k++)
		fprintf(stderr, "  [%s] rank %u: %llu of %llu sent, credit %u "
			"+ %llu, %llu in flight, counter read %s\n", who, k,
			(unsigned long long)r[k].sent,
			(unsigned long long)total, r[k].credits,
			(unsigned long long)r[k].ctr_seen,
			(unsigned long long)inflight[k],
			reading[k] ? "posted" : "idle");
	CHECK(!left, "%u ranks not done", left);
	for (k = 0; k < H_COMPLY_RANKS; k++)
		raw_close(&r[k]);
	return 0;
}

static int raw_comply(const struct rt_env *env, void *arg)
{
	return comply_n(env, arg, H_COMPLY);
}

/* The same with the secret (P2), beside the strangers. */
static int raw_comply_p2(const struct rt_env *env, void *arg)
{
	raw_join_key = secret;
	return comply_n(env, arg, H_COMPLY_P2);
}

static int case_comply(const struct rt_env *env, struct ctx *x)
{
	const char *who = "compliant";
	struct slow s = { .port = x->p1.port };
	struct h_reply st0, st1;
	uint64_t seen;

	CHECK(env->addr1, "needs KVP_ADDR1 (--devices 2)");
	CHECK(!paused_raw(env, &x->p1, &s, raw_comply, H_COMPLY_PAUSE_MS,
			  H_COMPLY_SLOW_MS, &st0, &st1),
	      "raw child");
	seen = st1.st.notes_recv + st1.st.notes_dropped - st0.st.notes_recv -
	       st0.st.notes_dropped;
	printf("    %u ranks, %u notifications each at their credit, the "
	       "producer paused %d ms, then slow for %d ms: %llu seen, %llu "
	       "dropped as abusers\n",
	       H_COMPLY_RANKS, H_COMPLY, H_COMPLY_PAUSE_MS, H_COMPLY_SLOW_MS,
	       (unsigned long long)seen,
	       (unsigned long long)(st1.st.credit_abuses -
				    st0.st.credit_abuses));
	CHECK(st1.st.credit_abuses == st0.st.credit_abuses,
	      "%llu compliant ranks dropped",
	      (unsigned long long)(st1.st.credit_abuses -
				   st0.st.credit_abuses));
	CHECK(seen >= (uint64_t)H_COMPLY_RANKS * H_COMPLY,
	      "%llu of %u notifications seen", (unsigned long long)seen,
	      H_COMPLY_RANKS * H_COMPLY);
	return serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

/* Issue 33, item 5: a pull with nothing to read (a full prefix hit: no
 * local block) is DONE at once, and its notification goes out with it,
 * not at the connection's next flush, which an idle consumer never has:
 * the producer releases the request while the consumer stays connected
 * and idle. Before: RELEASED only when the consumer closed. */
struct nullhit {
	uint16_t port;
	int ready_fd;	/* written once DONE */
	int hold_fd;	/* the consumer stays up until this closes */
	uint64_t req;
};

static int nullhit_main(const struct rt_env *env, void *arg)
{
	const struct nullhit *h = arg;
	struct kvp_peer peer = { .addr = env->addr0, .port = h->port };
	kvp_layout *l = rt_layout_engine(&eng, 0, 0, H_CONS);
	struct kvt_mem mem = { 0 };
	struct kvp_agent_attr at;
	struct kvp_ids ids = reqs[0].ids;
	struct kvp_event ev[8];
	struct pollfd p;
	kvp_agent *a = NULL;
	const char *who = "null hit";
	uint32_t done = 0;
	double end;
	int ret = 1, err, n, i;
	char c;

	if (!l || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout");
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = env->addr0;
	err = kvp_agent_open(&at, &a);
	if (!err)
		err = rt_register_all(a, &mem);
	if (!err)
		err = kvp_agent_connect(a, &peer, 1, 20000);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	ids.nlocal = 0; /* every token a hit: nothing to read */
	err = kvp_agent_pull(a, h->req, &ids);
	if (err)
		RT_FAIL("pull: %s", kvp_strerror(err));
	end = rt_now() + 30;
	while (!done && rt_now() < end) {
		n = kvp_agent_poll(a, ev, 8);
		for (i = 0; i < n; i++) {
			if (ev[i].type != KVP_EV_DONE)
				RT_FAIL("event %u: %s", ev[i].type,
					kvp_strerror(ev[i].status));
			done++;
		}
	}
	if (!done)
		RT_FAIL("not done");
	/* Item 4: idle now, its first queue pair hands its loans back
	 * (GIVE: GO lent it 8, it keeps its own 2). */
	end = rt_now() + 10;
	for (;;) {
		struct kvp_agent_stats st;

		if (kvp_agent_poll(a, ev, 8) < 0)
			RT_FAIL("poll");
		kvp_agent_get_stats(a, &st);
		if (st.credit_gives)
			break;
		if (rt_now() > end)
			RT_FAIL("idle, and no GIVE sent");
		usleep(1000);
	}
	if (write(h->ready_fd, "d", 1) != 1)
		RT_FAIL("ready");
	/* Idle, connected, polling, until the parent has its answer. */
	p.fd = h->hold_fd;
	p.events = POLLIN;
	end = rt_now() + 40;
	while (poll(&p, 1, 1) == 0 && rt_now() < end)
		if (kvp_agent_poll(a, ev, 8) < 0)
			RT_FAIL("poll");
	(void)read(h->hold_fd, &c, 1);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

static int case_nullhit(const struct rt_env *env, struct ctx *x)
{
	const char *who = "null hit";
	struct nullhit h = { .port = x->p1.port, .req = H_REQ0 + 500 };
	struct h_reply rep, st0, st1;
	int rfd[2], hfd[2], got;
	pid_t pid;
	char c;

	CHECK(!pipe(rfd) && !pipe(hfd), "pipes");
	CHECK(!case_stats(&x->p1, &st0), "stats");
	CHECK(!prod_cmd(&x->p1, C_EXPECT, H_CONS, h.req, 60000, &rep),
	      "expect");
	h.ready_fd = rfd[1];
	h.hold_fd = hfd[0];
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(60);
		close(rfd[0]);
		close(hfd[1]);
		RT_EXIT(nullhit_main(env, &h));
	}
	close(rfd[1]);
	close(hfd[0]);
	got = pid > 0 && read(rfd[0], &c, 1) == 1;
	/* The consumer is connected and idle: the release must come. */
	rep.rc = got ? prod_cmd(&x->p1, C_WAIT, H_CONS, h.req, 10000, &rep) :
		       -EIO;
	close(hfd[1]);
	close(rfd[0]);
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "null-hit consumer"))
		got = 0;
	CHECK(got, "the null-hit consumer");
	CHECK(rep.rc == KVP_EV_RELEASED,
	      "request %llu: %s while its consumer is connected, want "
	      "RELEASED", (unsigned long long)h.req,
	      rep.rc < 0 ? kvp_strerror(rep.rc) : "EXPIRED");
	CHECK(!case_stats(&x->p1, &st1), "stats");
	CHECK(st1.st.credit_gives > st0.st.credit_gives,
	      "the idle consumer's GIVE not taken");
	printf("    a pull with nothing to read: DONE, released while its "
	       "consumer idles; idle, it handed its loans back (GIVE)\n");
	return 0;
}

/* Issue 33, item 6: a handshake claims a rank's queue pair before it has
 * proved anything; a second connect request that claims the same one
 * (rank 0 of 1, its only queue pair) while the first is still half-open
 * waits for it to end (the first sends no AUTH: dropped at the handshake
 * bound), or is refused. Before: both were admitted at once, each holding
 * slots (eight such were seen admitted together). */
static int raw_twice(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "claimed twice";
	struct raw r1, r2;
	int err, gone;

	err = raw_connect_as(&r1, env->addr0, env->addr0, s->port,
			     H_EVIL + 40, 1, 0, 4096, 0, 4096);
	CHECK(!err, "first: %s", kvp_strerror(err));
	CHECK(write(s->ready_fd, "r", 1) == 1, "ready");
	err = raw_connect_as(&r2, env->addr0, env->addr0, s->port,
			     H_EVIL + 40, 1, 0, 4096, 0, 4096);
	/* Admitted: only once the first was dropped (its event within
	 * moments of the second's; before, the first lived on for the
	 * handshake bound). */
	gone = !raw_event(&r1, RDMA_CM_EVENT_DISCONNECTED, 2000, NULL, NULL);
	raw_close(&r1);
	raw_close(&r2);
	CHECK(err == -EBUSY || (!err && gone),
	      "second claim: %s, the first %s", kvp_strerror(err),
	      gone ? "dropped" : "still half-open");
	printf("    the same queue pair claimed twice: the second %s\n",
	       err ? "refused (busy)" : "admitted after the first ended");
	return 0;
}

static int case_twice(const struct rt_env *env, struct ctx *x)
{
	const char *who = "claimed twice";
	struct slow s = { .port = x->p1.port };
	pid_t pid;
	int fd, ok;
	char c;

	pid = raw_child(env, &s, raw_twice, &fd);
	ok = pid > 0 && read(fd, &c, 1) == 1;
	if (pid > 0 && rt_wait(&pid, 1, rt_now() + 60, "raw child"))
		ok = 0;
	if (fd >= 0)
		close(fd);
	CHECK(ok, "raw child");
	return serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

/* Secrets: P2 has one. */
static int raw_forged(const struct rt_env *env, void *arg)
{
	const uint16_t *port = arg;
	const char *who = "forged proof";
	struct raw r;
	int err;

	/* A connect request whose proof is under another key: refused
	 * before any queue pair is made. */
	raw_tag_key = other_secret;
	err = raw_connect(&r, env->addr0, env->addr0, *port, H_EVIL, 4096, 1,
			  64);
	raw_tag_key = NULL;
	raw_close(&r);
	CHECK(err == -EPERM, "forged hello proof: %s, want -EPERM",
	      kvp_strerror(err));
	CHECK(raw_reason == KVP_REASON_AUTH, "forged hello proof: reason %u",
	      raw_reason);
	/* A true proof from a clock 10 minutes off (a replay): refused. */
	raw_clock_skew = -600;
	err = raw_connect(&r, env->addr0, env->addr0, *port, H_EVIL, 4096, 1,
			  64);
	raw_clock_skew = 0;
	raw_close(&r);
	CHECK(err == -EPERM, "stale hello: %s, want -EPERM",
	      kvp_strerror(err));
	/* A true connect request (replayed within its window), then a
	 * proof under another key: refused before GO. */
	err = raw_connect(&r, env->addr0, env->addr0, *port, H_EVIL, 4096, 1,
			  64);
	CHECK(!err, "connect: %s", kvp_strerror(err));
	err = raw_auth(&r, other_secret);
	raw_close(&r);
	CHECK(err == -EPERM, "forged proof: %s, want -EPERM",
	      kvp_strerror(err));
	CHECK(raw_reason == KVP_REASON_AUTH, "forged proof: reason %u",
	      raw_reason);
	/* No secret claimed: refused in the hello. */
	err = raw_connect(&r, env->addr0, env->addr0, *port, H_EVIL, 4096, 0,
			  64);
	raw_close(&r);
	CHECK(err == -EPERM, "no secret: %s, want -EPERM", kvp_strerror(err));
	CHECK(raw_reason == KVP_REASON_AUTH, "no secret: reason %u",
	      raw_reason);
	return 0;
}

static int case_secret(const struct rt_env *env, struct ctx *x)
{
	struct good g = { .engine = H_CONS, .addr = env->addr0 };
	const char *who = "secret";
	struct h_reply st0, st1;

	CHECK(!case_stats(&x->p2, &st0), "stats");
	g.port = x->p2.port;
	g.secret = other_secret;
	g.want = -EPERM;
	CHECK(!run_child(good_main, env, &g, 60), "wrong secret");
	g.secret = NULL;
	CHECK(!run_child(good_main, env, &g, 60), "no secret");
	/* A consumer with a secret refuses a producer without one. */
	g.port = x->p1.port;
	g.secret = secret;
	CHECK(!run_child(good_main, env, &g, 60), "producer without secret");
	CHECK(!run_child(raw_forged, env, &x->p2.port, 60), "forged");
	CHECK(!case_stats(&x->p2, &st1), "stats");
	/* No secret (in the hello), a forged and a stale hello proof, a
	 * forged AUTH, no secret (raw). */
	CHECK(st1.st.refused >= st0.st.refused + 5, "refusals not counted");
	CHECK(st1.st.connects == st0.st.connects, "a stranger got connected");
	return serve_good(env, x, &x->p2, env->addr0, secret, 2);
}

/* A consumer rank whose host goes silent after its handshake (its QP
 * destroyed, no disconnect sent: a crash, a cut cable). The producer's
 * liveness probe fails after the transport's retries and frees the
 * slot; until then the probe is answered and nothing is dropped. */
#define H_SILENT 0x53494c4eull
#define H_SILENT_BOUND_S 12.0

static int raw_silent(const struct rt_env *env, void *arg)
{
	const struct slow *s = arg;
	const char *who = "silent";
	struct raw r;
	int err;

	err = raw_join(&r, env, s->port, H_SILENT, 1, 0);
	CHECK(!err, "join: %s", kvp_strerror(err));
	usleep(2500000); /* probes come and are answered */
	CHECK(write(s->ready_fd, "j", 1) == 1, "ready");
	rdma_destroy_qp(r.id); /* the cm_id stays: no disconnect */
	CHECK(write(s->ready_fd, "q", 1) == 1, "ready");
	sleep(30); /* killed before: an exit would disconnect */
	return 1;
}

static int case_silent(const struct rt_env *env, struct ctx *x)
{
	struct slow s = { .port = x->p1.port };
	struct h_reply st0, st1;
	const char *who = "silent";
	struct pollfd p;
	double t0 = 0, dt = -1;
	int fd, ok = 0;
	pid_t pid;
	char c;

	CHECK(!case_stats(&x->p1, &st0), "stats");
	pid = raw_child(env, &s, raw_silent, &fd);
	p.fd = fd;
	p.events = POLLIN;
	if (pid < 0 || poll(&p, 1, 20000) != 1 || read(fd, &c, 1) != 1 ||
	    case_stats(&x->p1, &st1))
		goto out;
	/* Joined and probed for 2.5 s: connected, answered, not dropped. */
	if (st1.st.connects != st0.st.connects + 1 ||
	    st1.st.disconnects != st0.st.disconnects ||
	    st1.st.probes < st0.st.probes + 1) {
		fprintf(stderr, "  [%s] before: connects +%llu disconnects "
				"+%llu probes +%llu\n", who,
			(unsigned long long)(st1.st.connects - st0.st.connects),
			(unsigned long long)(st1.st.disconnects -
					     st0.st.disconnects),
			(unsigned long long)(st1.st.probes - st0.st.probes));
		goto out;
	}
	if (read(fd, &c, 1) != 1)
		goto out;
	t0 = rt_now();
	while (rt_now() - t0 < H_SILENT_BOUND_S) {
		if (case_stats(&x->p1, &st1))
			goto out;
		if (st1.st.disconnects > st0.st.disconnects) {
			dt = rt_now() - t0;
			break;
		}
		usleep(100000);
	}
	ok = dt >= 0;
	if (ok)
		printf("    silent consumer dropped %.1f s after its QP went "
		       "(probed every 1 s, a probe unanswered for 5 s fails it)\n",
		       dt);
	else
		fprintf(stderr, "  [%s] still connected after %.0f s\n", who,
			H_SILENT_BOUND_S);
out:
	if (pid > 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
	}
	if (fd >= 0)
		close(fd);
	return ok ? 0 : 1;
}

/* Agents of another handshake version. A hello of version 5 (kvpull 0.1)
 * or 7 is refused before anything is set up, -EPROTONOSUPPORT with
 * KVP_REASON_VERSION and the producer's versions; a consumer refused so
 * by a producer of version 7 (a raw listener here) fails its connect with
 * the same code and a line naming both versions. */
static int raw_versions(const struct rt_env *env, void *arg)
{
	static const uint8_t v[] = { 5, 7, 255 };
	const uint16_t *port = arg;
	const char *who = "versions";
	struct raw r;
	uint32_t i;
	int err;

	for (i = 0; i < sizeof(v); i++) {
		raw_hello_version = v[i];
		raw_reason = raw_refuse_version = raw_refuse_lib = 0;
		err = raw_connect(&r, env->addr0, env->addr0, *port, H_EVIL,
				  4096, 0, 64);
		raw_close(&r);
		CHECK(err == -EPROTONOSUPPORT && raw_reason == KVP_REASON_VERSION,
		      "hello version %u: %s, reason %u; want -EPROTONOSUPPORT, "
		      "KVP_REASON_VERSION", v[i], kvp_strerror(err), raw_reason);
		CHECK(raw_refuse_version == W_HELLO_VERSION &&
			      raw_refuse_lib == kvp_version(),
		      "hello version %u: the refusal names version %u, "
		      "library %#x; want %u, %#x", v[i], raw_refuse_version,
		      raw_refuse_lib, W_HELLO_VERSION, kvp_version());
	}
	return 0;
}

/* A producer of handshake version 7, kvpull 0.9: rejects the first
 * connect request with its refusal. */
static int raw_newer_producer(const struct rt_env *env, void *arg)
{
	const uint16_t *port = arg;
	const char *who = "newer producer";
	struct sockaddr_in s = { .sin_family = AF_INET };
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id = NULL;
	struct rdma_cm_event *e;
	uint8_t r[24];
	int got = 0;

	inet_pton(AF_INET, env->addr0, &s.sin_addr);
	s.sin_port = htons(*port);
	CHECK(ch && !rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) &&
		      !rdma_bind_addr(id, (struct sockaddr *)&s) &&
		      !rdma_listen(id, 4),
	      "listen on port %u", *port);
	kvp__put32(r, W_REFUSE_MAGIC);
	kvp__put32(r + 4, (uint32_t)-EPROTONOSUPPORT);
	kvp__put32(r + 8, KVP_REASON_VERSION);
	kvp__put32(r + 12, 0);
	kvp__put32(r + 16, 7);
	kvp__put32(r + 20, 0x000900);
	while (!got && !rdma_get_cm_event(ch, &e)) {
		if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			CHECK(!rdma_reject(e->id, r, sizeof(r)), "reject");
			rdma_destroy_id(e->id);
			got = 1;
		}
		rdma_ack_cm_event(e);
	}
	/* the consumer's answer to the reject takes no event here */
	sleep(1);
	rdma_destroy_id(id);
	rdma_destroy_event_channel(ch);
	return !got;
}

/* A consumer against raw_newer_producer(): its connect fails with
 * -EPROTONOSUPPORT and a line naming both versions. */
static int newer_consumer(const struct rt_env *env, void *arg)
{
	const char *who = "consumer of a newer producer";
	const char *want =
		"producer rank 0 speaks handshake version 7 (kvpull 0.9), "
		"we 6 (kvpull 0.2)";
	const uint16_t *port = arg;
	struct kvp_peer peer = { .addr = env->addr0, .port = *port };
	kvp_layout *l = rt_layout_engine(&eng, 0, 0, H_CONS + 9);
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	char why[KVP_WHY_LEN];
	kvp_agent *a = NULL;
	uint32_t reason;
	int err;

	CHECK(l && !kvt_mem_alloc(l, &mem), "layout");
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = env->addr0;
	CHECK(!kvp_agent_open(&at, &a) && !rt_register_all(a, &mem), "open");
	/* The listener may not be up yet: refused by nobody, try again. */
	do {
		err = kvp_agent_connect(a, &peer, 1, 5000);
	} while (err == -ECONNREFUSED && usleep(50000) == 0);
	reason = kvp_agent_last_error(a, why, sizeof(why));
	printf("    consumer refused: %s (%s)\n", kvp_strerror(err), why);
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	CHECK(err == -EPROTONOSUPPORT && reason == KVP_REASON_VERSION &&
		      !strcmp(why, want),
	      "connect: %s, reason %u \"%s\"; want -EPROTONOSUPPORT, "
	      "KVP_REASON_VERSION \"%s\"", kvp_strerror(err), reason, why,
	      want);
	return 0;
}

static int case_version(const struct rt_env *env, struct ctx *x)
{
	const char *who = "version";
	uint16_t port = (uint16_t)(x->p1.port + 97);
	pid_t pid;
	int rc, st = -1;

	if (run_child(raw_versions, env, &x->p1.port, 60))
		return 1;
	fflush(NULL);
	pid = fork();
	if (pid == 0) {
		alarm(30);
		RT_EXIT(raw_newer_producer(env, &port));
	}
	CHECK(pid > 0, "fork");
	rc = run_child(newer_consumer, env, &port, 40);
	waitpid(pid, &st, 0);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
	      "the newer producer's listener failed");
	return rc || serve_good(env, x, &x->p1, env->addr0, NULL, 1);
}

struct h_case {
	const char *name;
	int (*fn)(const struct rt_env *env, struct ctx *x);
	struct h_prod *(*prod)(struct ctx *x);
};

static struct h_prod *on_p1(struct ctx *x)
{
	return &x->p1;
}

static struct h_prod *on_p2(struct ctx *x)
{
	return &x->p2;
}

static struct h_prod *on_p3(struct ctx *x)
{
	return &x->p3;
}

static const struct h_case cases[] = {
	/* first: no early note of another case lingers */
	{ "early notes: one engine's ranks keep its share, not all",
	  case_fair, on_p1 },
	{ "short and oversized blob lengths", case_lengths, on_p1 },
	{ "no AUTH, a huge garbage blob, a blob behind a wrong key",
	  case_slow, on_p1 },
	{ "a consumer past its credit: dropped, the shared queue refilled",
	  case_overrun, on_p1 },
	{ "costliest valid blobs: refused, polls short, others get in",
	  case_costly, on_p1 },
	{ "short key table (a fuzz_meta crash) in-band: refused, next served",
	  case_short_keys, on_p1 },
	{ "notification replay after expiry and release, duplicates",
	  case_replay, on_p1 },
	{ "cross-engine id collision", case_cross, on_p1 },
	{ "notification flood with random ids", case_flood, on_p1 },
	{ "idle connections holding every slot of an address", case_idle,
	  on_p1 },
	{ "a full address: refused with a hint, retried, served", case_full,
	  on_p1 },
	{ "an idle rank evicted for a newcomer, a busy one never",
	  case_evict, on_p1 },
	{ "idle ranks dropped after idle_ms, busy ones not; the dropped "
	  "pull again", case_idle_close, on_p3 },
	{ "wrong, missing and forged secrets", case_secret, on_p2 },
	{ "strangers flood the shared queue: each dropped at once",
	  case_strangers, on_p2 },
	{ "compliant ranks, the producer paused: none dropped",
	  case_comply, on_p1 },
	{ "nothing to read: released while connected; idle: loans given back",
	  case_nullhit, on_p1 },
	{ "a queue pair claimed twice while half-open: one at a time",
	  case_twice, on_p1 },
	{ "a consumer host gone silent: probed, dropped", case_silent,
	  on_p1 },
	{ "another handshake version: refused, both versions named",
	  case_version, on_p1 },
};

int main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	struct rt_env env;
	struct ctx x = { 0 };
	struct h_reply rep;
	uint32_t i, pass = 0, fail = 0;
	pid_t pids[3];

	if (rt_start(&env, 18600))
		return 1;
	reqs_init();
	srand(1);
	if (prod_start(&env, env.port, 0, &x.p1) ||
	    prod_start(&env, (uint16_t)(env.port + 1), H_SECRET, &x.p2) ||
	    prod_start(&env, (uint16_t)(env.port + 2), H_IDLE_SHORT, &x.p3)) {
		printf("producers did not start\n0 passed, 1 failed\n");
		return 1;
	}
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct h_case *c = &cases[i];
		double t0 = rt_now();
		int ok;

		if (filter && !strstr(c->name, filter))
			continue;
		(void)case_stats(c->prod(&x), &rep); /* resets the worst */
		ok = !c->fn(&env, &x);
		memset(&rep, 0, sizeof(rep));
		if (case_stats(c->prod(&x), &rep)) /* this case's worst */
			ok = 0;
		printf("%s %s (%.2f s; producer's worst poll %.2f ms)\n",
		       ok ? "ok  " : "FAIL", c->name, rt_now() - t0,
		       rep.worst_ns / 1e6);
		if (ok)
			pass++;
		else
			fail++;
	}
	(void)prod_cmd(&x.p1, C_STOP, 0, 0, 0, &rep);
	(void)prod_cmd(&x.p2, C_STOP, 0, 0, 0, &rep);
	(void)prod_cmd(&x.p3, C_STOP, 0, 0, 0, &rep);
	pids[0] = x.p1.pid;
	pids[1] = x.p2.pid;
	pids[2] = x.p3.pid;
	if (rt_wait(pids, 3, rt_now() + 30, "producer"))
		fail++;
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
