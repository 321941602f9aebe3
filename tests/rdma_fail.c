// SPDX-License-Identifier: MIT
/*
 * Failure paths over real verbs (soft-RoCE in the VM):
 *  - a producer rank killed with READs in flight: the consumer reports
 *    FAILED with the request's local ids, every other byte intact, no hang;
 *  - requests nobody pulls expire on the producer;
 *  - handshakes that must fail (another model, a wrong TP size, nobody
 *    listening) return the exact error, leave the agent as it was, and the
 *    producer keeps serving; argument errors of register, listen and pull;
 *  - a consumer killed mid-transfer: its requests expire on the producer,
 *    which then serves a new consumer.
 *
 *   rdma_fail [NAME-FILTER]
 */
#include "rdma/harness.h"

#ifdef __clang__
#pragma clang diagnostic ignored "-Winitializer-overrides"
#else
#pragma GCC diagnostic ignored "-Woverride-init"
#endif

static const struct rt_case kill_case = {
	.name = "producer killed mid-transfer", .model = "llama-3.1-8b",
	.layers = 2, .P = 2, .D = 1, .pblock = 16, .dblock = 16,
	.playout = KVP_KV_FLASH_HND, .dlayout = KVP_KV_FLASH_HND,
	.pblocks = 160, .dblocks = 160, .nreq = 8, .tokens = 320,
	.max_inflight = 8, .kill_rank = 1, .seed = 3,
	/* soft-RoCE moves a READ's data inside ibv_post_send(): with a deep
	 * send queue every READ may be done by the time the pulls are all
	 * accepted (seen under ASan). Eight entries keep most of the 640
	 * READs per producer rank waiting in the agent's queue when the
	 * producer dies, however fast the machine. */
	.sq_depth = 8,
};

static const struct rt_case expire_case = {
	.name = "requests nobody pulls expire", .model = "llama-3.1-8b",
	.layers = 2, .P = 1, .D = 1, .pblock = 16, .dblock = 16,
	.pblocks = 16, .dblocks = 16, .nreq = 1, .tokens = 32,
	.extra_expire = 3, .kill_rank = -1,
};

/* The reference engine of the handshake cases: llama, TP 1. */
static const struct rt_case ref = {
	.name = "handshake", .model = "llama-3.1-8b", .layers = 2, .P = 1,
	.D = 1, .pblock = 16, .dblock = 16, .pblocks = 16, .dblocks = 16,
	.nreq = 2, .tokens = 48, .kill_rank = -1,
};

static int open_consumer(const kvp_layout *l, const char *addr,
			 uint32_t max_ids, uint32_t inflight,
			 struct kvt_mem *mem, kvp_agent **out)
{
	struct kvp_agent_attr at;
	int err;

	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = addr;
	at.max_ids = max_ids;
	at.max_inflight = inflight;
	err = kvp_agent_open(&at, out);
	if (err)
		return err;
	if (mem) {
		err = rt_register_all(*out, mem);
		if (err) {
			kvp_agent_close(*out);
			*out = NULL;
		}
	}
	return err;
}

/* Polls until request `id` is reported; returns its event type or -1.
 * Events of other requests are remembered in seen[] (ids 1000..1015). */
static int wait_req(kvp_agent *a, uint64_t id, double secs)
{
	static int seen[RT_MAX_REQ];
	struct kvp_event ev[8];
	double end = rt_now() + secs;
	int n, i;

	if (id < 1000 || id >= 1000 + RT_MAX_REQ)
		return -1;
	while (!seen[id - 1000] && rt_now() < end) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			return -1;
		for (i = 0; i < n; i++)
			if ((ev[i].type == KVP_EV_DONE ||
			     ev[i].type == KVP_EV_FAILED) &&
			    ev[i].req_id >= 1000 &&
			    ev[i].req_id < 1000 + RT_MAX_REQ)
				seen[ev[i].req_id - 1000] = (int)ev[i].type;
		if (!n)
			usleep(50);
	}
	return seen[id - 1000] ? seen[id - 1000] : -1;
}

/* Consumer side of the handshake case: every rejection, then a good
 * connection and the pull argument errors. */
static int handshake_consumer(const struct rt_env *env, const struct rt_req *rq)
{
	struct kvp_peer peers[2] = { { 0 } };
	struct kvt_mem mem = { 0 };
	struct rt_case other = ref;
	kvp_layout *good = rt_layout(&ref, 0, 0), *bad = NULL;
	kvp_agent *a = NULL, *b = NULL;
	struct kvp_ids ids[1];
	struct kvp_event ev[8];
	uint32_t big[64], i, r;
	char why[KVP_WHY_LEN];
	const char *who = "handshake D0";
	double t0;
	int ret = 1, err;

	alarm(100);
	other.model = "qwen2.5-1.5b";
	bad = rt_layout(&other, 0, 0);
	if (!good || !bad || kvt_mem_alloc(good, &mem))
		RT_FAIL("layouts");
	peers[0].addr = env->addr0;
	peers[0].port = env->port;
	peers[1].addr = env->addr0;
	peers[1].port = (uint16_t)(env->port + 5);

	/* Another model: the producer's metadata does not match. */
	{
		struct kvt_mem bm = { 0 };

		if (kvt_mem_alloc(bad, &bm))
			RT_FAIL("memory");
		err = open_consumer(bad, env->addr0, 64, 4, &bm, &b);
		if (err)
			RT_FAIL("open: %s", kvp_strerror(err));
		err = kvp_agent_connect(b, peers, 1, 20000);
		if (err != -EPROTO)
			RT_FAIL("other model: %s, want -EPROTO",
				kvp_strerror(err));
		/* The producer refused our blob and said why. */
		r = kvp_agent_last_error(b, why, sizeof(why));
		if (r != KVP_REASON_PEER_REFUSED ||
		    strcmp(why, "producer rank 0 refused us: another model (compatibility hashes differ)"))
			RT_FAIL("other model: reason %u \"%s\"", r, why);
		if (kvp_agent_plan(b))
			RT_FAIL("a plan survived a failed connect");
		if (kvp_agent_pull(b, 1, rq[0].ids) != -ENOTCONN)
			RT_FAIL("pull after failed connect");
		/* Failing changed nothing: the same error again. */
		err = kvp_agent_connect(b, peers, 1, 20000);
		if (err != -EPROTO)
			RT_FAIL("other model again: %s", kvp_strerror(err));
		kvp_agent_close(b);
		b = NULL;
		kvt_mem_free(&bm);
	}

	/* Registration and connect argument errors. */
	err = open_consumer(good, env->addr0, 8, 1, NULL, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	if (kvp_agent_connect(a, peers, 1, 1000) != -ENXIO)
		RT_FAIL("connect before register was not -ENXIO");
	if (kvp_agent_register(a, mem.nregions, mem.buf[0], mem.size[0]) !=
	    -EINVAL)
		RT_FAIL("register of a bad region");
	if (kvp_agent_register(a, 0, mem.buf[0], mem.size[0] - 1) != -EINVAL)
		RT_FAIL("register of a short buffer");
	err = rt_register_all(a, &mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	if (kvp_agent_register(a, 0, mem.buf[0], mem.size[0]) != -EINVAL)
		RT_FAIL("second register of a region");
	if (kvp_agent_listen(a, env->addr0, env->port) != -EINVAL)
		RT_FAIL("listen on a consumer");
	if (kvp_agent_expect(a, RT_CONS_ENGINE, 1, 0) != -EINVAL)
		RT_FAIL("expect on a consumer");
	if (kvp_agent_connect(a, peers, 1, 0) != -EINVAL)
		RT_FAIL("connect with timeout 0");

	/* Nobody listens on port + 5. */
	err = kvp_agent_connect(a, &peers[1], 1, 20000);
	if (err != -ECONNREFUSED && err != -ETIMEDOUT)
		RT_FAIL("nobody listening: %s", kvp_strerror(err));
	/* Two ranks named, the producer engine has one. */
	err = kvp_agent_connect(a, peers, 2, 20000);
	if (err != -EPROTO)
		RT_FAIL("wrong TP size: %s, want -EPROTO", kvp_strerror(err));
	r = kvp_agent_last_error(a, why, sizeof(why));
	if (r != KVP_REASON_TP_SIZE ||
	    strcmp(why, "producer rank 0: its engine has TP size 1, 2 ranks given"))
		RT_FAIL("wrong TP size: reason %u \"%s\"", r, why);

	err = kvp_agent_connect(a, peers, 1, 20000);
	if (err)
		RT_FAIL("connect: %s", kvp_strerror(err));
	if (!kvp_agent_plan(a))
		RT_FAIL("no plan after connect");

	/* Pull argument errors change nothing and report nothing. */
	ids[0] = rq[0].ids[0];
	for (i = 0; i < 64; i++)
		big[i] = i;
	ids[0].local = big;
	ids[0].nlocal = 9; /* > max_ids */
	if (kvp_agent_pull(a, 7, ids) != -EINVAL)
		RT_FAIL("pull with too many ids");
	r = kvp_agent_last_error(a, why, sizeof(why));
	if (r != KVP_REASON_IDS_MAX)
		RT_FAIL("too many ids: reason %u \"%s\"", r, why);
	/* More local ids than the remote ones cover, then tokens past them:
	 * the same errno, their own reasons. */
	ids[0] = rq[0].ids[0];
	ids[0].nremote = 1;
	ids[0].tokens = 0;
	if (kvp_agent_pull(a, 7, ids) != -EINVAL ||
	    (r = kvp_agent_last_error(a, why, sizeof(why))) !=
		    KVP_REASON_IDS_UNEVEN)
		RT_FAIL("more local than remote: reason %u \"%s\"", r, why);
	ids[0] = rq[0].ids[0];
	ids[0].tokens = 100000;
	if (kvp_agent_pull(a, 7, ids) != -EINVAL ||
	    (r = kvp_agent_last_error(a, why, sizeof(why))) !=
		    KVP_REASON_IDS_TOKENS)
		RT_FAIL("tokens past the blocks: reason %u \"%s\"", r, why);
	if (kvp_agent_pull_from(a, 0x7777, 7, rq[0].ids) != -ENOENT ||
	    (r = kvp_agent_last_error(a, why, sizeof(why))) !=
		    KVP_REASON_NO_ENGINE ||
	    strcmp(why, "no engine with handle 30583"))
		RT_FAIL("unknown handle: reason %u \"%s\"", r, why);
	ids[0] = rq[0].ids[0];
	big[0] = 16; /* num_blocks is 16 */
	memcpy(big + 1, rq[0].ids[0].local + 1,
	       (rq[0].ids[0].nlocal - 1) * sizeof(uint32_t));
	ids[0].local = big;
	if (kvp_agent_pull(a, 7, ids) != -ERANGE)
		RT_FAIL("pull with an id out of range");
	r = kvp_agent_last_error(a, why, sizeof(why));
	if (r != KVP_REASON_IDS_RANGE ||
	    strcmp(why, "group 0: local id 16, 16 blocks"))
		RT_FAIL("id out of range: reason %u \"%s\"", r, why);
	if (kvp_agent_pull(a, rq[0].id, rq[0].ids))
		RT_FAIL("pull");
	if (kvp_agent_last_error(a, NULL, 0) != KVP_REASON_NONE)
		RT_FAIL("a pull that succeeded left a reason");
	/* The same request again while in flight: refused, nothing
	 * changed (one DONE follows, below). */
	if (kvp_agent_pull(a, rq[0].id, rq[0].ids) != -EALREADY ||
	    kvp_agent_last_error(a, NULL, 0) != KVP_REASON_IN_FLIGHT)
		RT_FAIL("the same request pulled twice in flight");
	if (kvp_agent_pull(a, rq[1].id, rq[1].ids) != -EBUSY)
		RT_FAIL("pull beyond max_inflight was not -EBUSY");
	if (wait_req(a, rq[0].id, 20) != KVP_EV_DONE)
		RT_FAIL("request 0 not done");
	/* DONE comes when the data is in; the slot is free again once the
	 * request's notifications completed too: -EBUSY until then. */
	t0 = rt_now();
	while ((err = kvp_agent_pull(a, rq[1].id, rq[1].ids)) == -EBUSY &&
	       rt_now() < t0 + 10)
		if (kvp_agent_poll(a, ev, 8) < 0)
			RT_FAIL("poll");
	if (err)
		RT_FAIL("pull 1: %s", kvp_strerror(err));
	if (wait_req(a, rq[1].id, 20) != KVP_EV_DONE)
		RT_FAIL("request 1 not done");
	ret = 0;
out:
	kvp_agent_close(a);
	kvp_agent_close(b);
	kvt_mem_free(&mem);
	kvp_layout_destroy(good);
	kvp_layout_destroy(bad);
	return ret;
}

/* Producer of the handshake and consumer-kill cases: serves until both
 * requests are RELEASED (`want_disc` DISCONNECTED events seen) and the
 * parent says stop. With `expire_first`, requests 0..1 are expected with a
 * short deadline and must EXPIRE (their consumer dies), after which 2..3
 * must be RELEASED. */
static int plain_producer(const struct rt_case *tc, const struct rt_env *env,
			  const struct rt_req *rq, int ready_fd, int stop_fd,
			  uint32_t want_disc, int expire_first)
{
	/* The DISCONNECTED events, in order: one per consumer rank (not per
	 * queue pair); the last consumer closes its agent (a clean close),
	 * a killed one before it is a reset. */
	int32_t disc_status[4];
	uint32_t disc_reason[4];
	double quiet_end = 0;
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[8];
	kvp_layout *l = rt_layout(tc, 1, 0);
	kvp_agent *a = NULL;
	uint32_t i, disc = 0, released = 0, expired = 0;
	uint32_t want_rel = expire_first ? 2 : tc->nreq;
	uint32_t want_exp = expire_first ? 2 : 0;
	double end = rt_now() + 90;
	const char *who = "producer";
	int ret = 1, err, n, stopped = 0;

	alarm(100);
	if (!l || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout");
	for (i = 0; i < tc->nreq; i++)
		kvt_fill_producer(l, &mem, rq[i].ids);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = l;
	at.addr = env->addr0;
	at.max_inflight = 4;
	err = kvp_agent_open(&at, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	if (kvp_agent_listen(a, env->addr0, env->port) != -ENXIO)
		RT_FAIL("listen before register was not -ENXIO");
	err = rt_register_all(a, &mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	err = kvp_agent_listen(a, env->addr0, env->port);
	if (err)
		RT_FAIL("listen: %s", kvp_strerror(err));
	if (kvp_agent_listen(a, env->addr0, env->port) != -EBUSY)
		RT_FAIL("second listen was not -EBUSY");
	if (kvp_agent_register(a, 0, mem.buf[0], mem.size[0]) != -EBUSY &&
	    kvp_agent_register(a, 0, mem.buf[0], mem.size[0]) != -EINVAL)
		RT_FAIL("register after listen");
	if (kvp_agent_pull(a, 1, rq[0].ids) != -EINVAL)
		RT_FAIL("pull on a producer");
	for (i = 0; i < tc->nreq; i++) {
		uint64_t dl = expire_first && i < 2 ? 4000000000ull :
						      80000000000ull;

		err = kvp_agent_expect(a, RT_CONS_ENGINE, rq[i].id, rt_now_ns() + dl);
		if (err)
			RT_FAIL("expect: %s", kvp_strerror(err));
	}
	for (i = tc->nreq; i < 4; i++)
		if (kvp_agent_expect(a, RT_CONS_ENGINE, 9000 + i, rt_now_ns() + 100000000ull))
			RT_FAIL("expect filler");
	if (kvp_agent_expect(a, RT_CONS_ENGINE, 9999, rt_now_ns()) != -EBUSY)
		RT_FAIL("expect beyond max_inflight was not -EBUSY");
	if (write(ready_fd, "r", 1) != 1)
		RT_FAIL("ready pipe");
	while (!stopped || released < want_rel || expired < want_exp ||
	       disc < want_disc) {
		struct pollfd p = { .fd = stop_fd, .events = POLLIN };

		if (!stopped && poll(&p, 1, 0) > 0)
			stopped = 1;
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			uint64_t id = ev[i].req_id;

			if (ev[i].type == KVP_EV_DISCONNECTED) {
				if (disc == 4)
					RT_FAIL("more than 4 DISCONNECTED");
				disc_status[disc] = ev[i].status;
				disc_reason[disc++] = ev[i].reason;
				continue;
			}
			if (id >= 9000)
				continue; /* fillers expire */
			if (ev[i].type == KVP_EV_RELEASED &&
			    (!expire_first || id >= rq[2].id))
				released++;
			else if (expire_first && id < rq[2].id)
				expired++; /* released if it finished first */
			else
				RT_FAIL("event %u for %llu", ev[i].type,
					(unsigned long long)id);
		}
		if (rt_now() > end)
			RT_FAIL("timeout: released %u expired %u disc %u",
				released, expired, disc);
		if (!n)
			usleep(100);
		/* Done: 300 ms more, for a DISCONNECTED too many. */
		if (stopped && released >= want_rel && expired >= want_exp &&
		    disc >= want_disc && !quiet_end)
			quiet_end = rt_now() + 0.3;
		if (quiet_end && rt_now() < quiet_end)
			continue;
		if (quiet_end)
			break;
	}
	if (disc != want_disc)
		RT_FAIL("%u DISCONNECTED, want %u (one per consumer rank)",
			disc, want_disc);
	for (i = 0; i < disc; i++) {
		int clean = i == disc - 1;

		if (clean && (disc_status[i] || disc_reason[i] != KVP_REASON_CLOSED))
			RT_FAIL("DISCONNECTED %u: status %d reason %u, want a clean close (0, CLOSED)",
				i, disc_status[i], disc_reason[i]);
		if (!clean && (disc_status[i] >= 0 ||
			       disc_reason[i] != KVP_REASON_TRANSPORT))
			RT_FAIL("DISCONNECTED %u: status %d reason %u, want a reset (TRANSPORT)",
				i, disc_status[i], disc_reason[i]);
	}
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

static int run_handshake(const struct rt_env *env)
{
	static struct rt_req rq[RT_MAX_REQ];
	int ready[2], stop[2], ret = -1;
	pid_t prod[1], cons[1];
	char c;

	memset(rq, 0, sizeof(rq));
	if (rt_make_requests(&ref, rq) || pipe(ready) || pipe(stop))
		return -1;
	fflush(NULL);
	prod[0] = fork();
	if (prod[0] == 0) {
		close(ready[0]);
		close(stop[1]);
		/* Only the good consumer's close ends in DISCONNECTED here:
		 * the -EPROTO handshakes (twice, refused) and the wrong TP
		 * size (dropped by the consumer) never connected, and a
		 * producer reports connected consumer ranks only. */
		RT_EXIT(plain_producer(&ref, env, rq, ready[1], stop[0], 1, 0));
	}
	close(ready[1]);
	close(stop[0]);
	if (read(ready[0], &c, 1) != 1)
		goto out;
	cons[0] = fork();
	if (cons[0] == 0)
		RT_EXIT(handshake_consumer(env, rq));
	ret = rt_wait(cons, 1, rt_now() + 100, "consumer");
	close(stop[1]);
	stop[1] = -1;
	if (rt_wait(prod, 1, rt_now() + 30, "producer"))
		ret = -1;
out:
	close(ready[0]);
	if (stop[1] >= 0)
		close(stop[1]);
	return ret;
}

/* A consumer that pulls requests 0 and 1 and is killed before they end;
 * then one that pulls 2 and 3. */
static int doomed_consumer(const struct rt_case *tc, const struct rt_env *env,
			   const struct rt_req *rq, uint32_t first,
			   int posted_fd)
{
	struct kvt_mem mem = { 0 };
	struct kvp_peer peer = { .addr = env->addr0, .port = env->port };
	kvp_layout *l = rt_layout(tc, 0, 0);
	kvp_agent *a = NULL;
	const char *who = "consumer";
	int ret = 1, err;

	alarm(100);
	if (!l || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout");
	err = open_consumer(l, env->addr0, RT_MAX_IDS, 4, &mem, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = kvp_agent_connect(a, &peer, 1, 20000);
	if (err)
		RT_FAIL("connect: %s", kvp_strerror(err));
	if (kvp_agent_pull(a, rq[first].id, rq[first].ids) ||
	    kvp_agent_pull(a, rq[first + 1].id, rq[first + 1].ids))
		RT_FAIL("pull");
	if (posted_fd >= 0) {
		if (write(posted_fd, "p", 1) != 1)
			RT_FAIL("pipe");
		for (;;) { /* killed while polling */
			struct kvp_event ev[4];

			if (kvp_agent_poll(a, ev, 4) < 0)
				break;
		}
		RT_FAIL("poll failed");
	}
	if (wait_req(a, rq[first].id, 30) != KVP_EV_DONE ||
	    wait_req(a, rq[first + 1].id, 30) != KVP_EV_DONE)
		RT_FAIL("requests not done");
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

/* Consumer of the clean-close case: pulls requests 0 and 1, says so on
 * done_fd, then must see its producer close cleanly: one DISCONNECTED
 * (status 0, CLOSED) for the one rank, whatever its queue pairs, and
 * ENGINE_DOWN with reason CLOSED. */
static int closing_consumer(const struct rt_env *env, const struct rt_req *rq,
			    int done_fd)
{
	struct kvt_mem mem = { 0 };
	struct kvp_peer peer = { .addr = env->addr0, .port = env->port };
	kvp_layout *l = rt_layout(&ref, 0, 0);
	uint32_t disc = 0, down = 0, i;
	struct kvp_engine_info ei;
	struct kvp_event ev[8];
	kvp_agent *a = NULL;
	const char *who = "closing consumer";
	double end;
	int ret = 1, err, n;

	alarm(100);
	if (!l || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout");
	err = open_consumer(l, env->addr0, RT_MAX_IDS, 4, &mem, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = kvp_agent_connect(a, &peer, 1, 20000);
	if (err)
		RT_FAIL("connect: %s", kvp_strerror(err));
	if (kvp_agent_pull(a, rq[0].id, rq[0].ids) ||
	    kvp_agent_pull(a, rq[1].id, rq[1].ids))
		RT_FAIL("pull");
	if (wait_req(a, rq[0].id, 30) != KVP_EV_DONE ||
	    wait_req(a, rq[1].id, 30) != KVP_EV_DONE)
		RT_FAIL("requests not done");
	if (write(done_fd, "d", 1) != 1)
		RT_FAIL("pipe");
	/* The producer closes: its ENGINE_DOWN, then 300 ms more for a
	 * second DISCONNECTED that must not come. */
	end = rt_now() + 30;
	while (rt_now() < end) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_DISCONNECTED) {
				if (ev[i].status || ev[i].reason !=
							    KVP_REASON_CLOSED)
					RT_FAIL("DISCONNECTED: status %d reason %u, want 0 CLOSED",
						ev[i].status, ev[i].reason);
				disc++;
			} else if (ev[i].type == KVP_EV_ENGINE_DOWN) {
				if (ev[i].reason != KVP_REASON_CLOSED)
					RT_FAIL("ENGINE_DOWN: reason %u, want CLOSED",
						ev[i].reason);
				down++;
				if (end > rt_now() + 0.3)
					end = rt_now() + 0.3;
			}
		}
		if (!n)
			usleep(100);
	}
	if (disc != 1 || down != 1)
		RT_FAIL("%u DISCONNECTED and %u ENGINE_DOWN, want 1 and 1",
			disc, down);
	if (kvp_agent_engine_info(a, 1, &ei) == 0 &&
	    (ei.reason != KVP_REASON_CLOSED ||
	     strcmp(ei.why, "producer rank 0 closed its agent")))
		RT_FAIL("engine info: reason %u \"%s\"", ei.reason, ei.why);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

/* Forks plain_producer() for tc (want_disc, expire_first as there) and
 * waits until it listens: 0 with its pid in *pid and the write end of its
 * stop pipe (close it to stop the producer) in *stop_w, or -1. */
static int start_producer(const struct rt_case *tc, const struct rt_env *env,
			  const struct rt_req *rq, uint32_t want_disc,
			  int expire_first, pid_t *pid, int *stop_w)
{
	int ready[2], stop[2], ret = -1;
	char c;

	if (pipe(ready))
		return -1;
	if (pipe(stop)) {
		close(ready[0]);
		close(ready[1]);
		return -1;
	}
	fflush(NULL);
	*pid = fork();
	if (*pid == 0) {
		close(ready[0]);
		close(stop[1]);
		RT_EXIT(plain_producer(tc, env, rq, ready[1], stop[0],
				       want_disc, expire_first));
	}
	close(ready[1]);
	close(stop[0]);
	if (*pid > 0 && read(ready[0], &c, 1) == 1)
		ret = 0;
	close(ready[0]);
	*stop_w = stop[1];
	return ret;
}

static int run_clean_close(const struct rt_env *env)
{
	static struct rt_req rq[RT_MAX_REQ];
	int done[2], stop_w = -1, ret = -1;
	pid_t prod[1], cons[1] = { -1 };
	char c;

	memset(rq, 0, sizeof(rq));
	if (rt_make_requests(&ref, rq) || pipe(done))
		return -1;
	/* It closes first: it sees no DISCONNECTED. */
	if (start_producer(&ref, env, rq, 0, 0, &prod[0], &stop_w))
		goto out;
	cons[0] = fork();
	if (cons[0] == 0) {
		/* The stop pipe's write end is the parent's alone: its
		 * close is what stops the producer. */
		close(stop_w);
		close(done[0]);
		RT_EXIT(closing_consumer(env, rq, done[1]));
	}
	close(done[1]);
	done[1] = -1;
	if (read(done[0], &c, 1) != 1)
		goto out;
	close(stop_w);
	stop_w = -1;
	ret = rt_wait(prod, 1, rt_now() + 30, "producer");
	if (rt_wait(cons, 1, rt_now() + 60, "consumer"))
		ret = -1;
out:
	close(done[0]);
	if (done[1] >= 0)
		close(done[1]);
	if (stop_w >= 0)
		close(stop_w);
	if (ret)
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	return ret;
}

static int run_consumer_kill(const struct rt_env *env)
{
	static struct rt_req rq[RT_MAX_REQ];
	struct rt_case tc = ref;
	int ready[2], stop[2], posted[2], ret = -1;
	pid_t prod[1], cons[1];
	char c;

	tc.name = "consumer killed";
	tc.nreq = 4;
	tc.tokens = 640;
	tc.pblocks = tc.dblocks = 160;
	memset(rq, 0, sizeof(rq));
	if (rt_make_requests(&tc, rq) || pipe(ready) || pipe(stop) ||
	    pipe(posted))
		return -1;
	fflush(NULL);
	prod[0] = fork();
	if (prod[0] == 0) {
		close(ready[0]);
		close(stop[1]);
		RT_EXIT(plain_producer(&tc, env, rq, ready[1], stop[0], 2, 1));
	}
	close(ready[1]);
	close(stop[0]);
	if (read(ready[0], &c, 1) != 1)
		goto out;
	cons[0] = fork();
	if (cons[0] == 0)
		RT_EXIT(doomed_consumer(&tc, env, rq, 0, posted[1]));
	close(posted[1]);
	if (read(posted[0], &c, 1) != 1)
		goto out;
	kill(cons[0], SIGKILL);
	for (c = 0; c < 100; c++) /* 10 s */
		if (waitpid(cons[0], NULL, WNOHANG))
			break;
		else
			usleep(100000);
	cons[0] = fork();
	if (cons[0] == 0)
		RT_EXIT(doomed_consumer(&tc, env, rq, 2, -1));
	ret = rt_wait(cons, 1, rt_now() + 60, "consumer");
	close(stop[1]);
	stop[1] = -1;
	if (rt_wait(prod, 1, rt_now() + 30, "producer"))
		ret = -1;
out:
	close(ready[0]);
	close(posted[0]);
	if (stop[1] >= 0)
		close(stop[1]);
	if (ret)
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
	return ret;
}

int main(int argc, char **argv)
{
	const char *filter = argc > 1 ? argv[1] : NULL;
	struct rt_env env;
	uint32_t pass = 0, fail = 0;
	struct {
		const char *name;
		const struct rt_case *tc;
		int (*fn)(const struct rt_env *);
	} t[] = {
		{ kill_case.name, &kill_case, NULL },
		{ expire_case.name, &expire_case, NULL },
		{ "handshake rejections and argument errors", NULL,
		  run_handshake },
		{ "consumer killed mid-transfer", NULL, run_consumer_kill },
		{ "clean close, each way: one DISCONNECTED a rank, CLOSED",
		  NULL, run_clean_close },
	};
	uint32_t i;

	rt_require_device();
	rt_env_init(&env, 19500);
	if (!env.addr0) {
		printf("KVP_ADDR0 is not set (run under scripts/rxe-vm.sh)\n");
		printf("0 passed, 1 failed\n");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	for (i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		double t0 = rt_now();
		int ok;

		if (filter && !strstr(t[i].name, filter))
			continue;
		ok = t[i].tc ? !rt_run(t[i].tc, &env) : !t[i].fn(&env);
		env.port = (uint16_t)(env.port + RT_MAX_RANKS);
		printf("%s %s (%.2f s)\n", ok ? "ok  " : "FAIL", t[i].name,
		       rt_now() - t0);
		if (ok)
			pass++;
		else
			fail++;
	}
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
