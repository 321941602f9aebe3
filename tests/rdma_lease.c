// SPDX-License-Identifier: MIT
/*
 * Fail closed (verbs/lease.h): a pull ends DONE only over bytes the
 * producer held for that request while they were read. One process holds
 * both agents (a producer rank and a consumer rank, TP 1 each, llama cut
 * to 2 layers), so each case decides exactly when each side polls: the
 * producer lets go (EXPIRED, its blocks reused: another request's bytes
 * written into them) before, between or after the consumer's READs.
 *
 *  - expired and reused, then pulled: FAILED -ESTALE, KVP_REASON_LEASE,
 *    the local ids listed; the producer counts the pull in stats.unheld;
 *  - never expected: FAILED the same way;
 *  - a clean pull: DONE, every byte exact, one lease READ;
 *  - released, then pulled again by a restarted consumer: FAILED;
 *  - withdrawn between two READ windows: FAILED;
 *  - a pull whose READs were all in before the deadline, checked after
 *    it: FAILED (nothing vouches for the bytes, right as they are);
 *  - another request's lease in the same bucket: FAILED for the one the
 *    producer let go, DONE for the other;
 *  - streamed: withdrawn before the last range: FAILED;
 *  - streamed: the same key granted again while the stream reads (its
 *    tombstone pushed out): FAILED, another generation;
 *  - another producer engine, connected to the same consumer agent,
 *    WRITEs a progress record (with the right key, which it is given
 *    here: the worst case) into the record of a streamed pull from the
 *    first: ignored, and the pull ends DONE with the first's bytes; the
 *    same WRITE with the connection's own record key is taken (the
 *    control: only the key stops it);
 *  - the producer restarted at the same address: the old engine's
 *    pull fails, the re-handshake works, and a request the new process
 *    never expected fails.
 *
 *   rdma_lease [NAME-FILTER]
 */
#include "rdma/harness.h"
/* The agents' insides: where a key's lease sits, and (the forged record)
 * what a peer that guessed a key would WRITE where. */
#include "../verbs/internal.h"

#define L_PORT 19300
#define L_INFLIGHT 32 /* producer: 64 lease buckets (log2 6) */
#define L_LOG2 6
#define CHECK(c, ...)                                                      \
	do {                                                               \
		if (!(c)) {                                                \
			printf("  [%s] ", who);                            \
			printf(__VA_ARGS__);                               \
			printf("\n");                                      \
			goto out;                                          \
		}                                                          \
	} while (0)

static const struct rt_case L_CASE = {
	.name = "lease", .model = "llama-3.1-8b", .layers = 2, .P = 1,
	.D = 1, .pblock = 16, .dblock = 16, .pblocks = 64, .dblocks = 64,
	.nreq = 4, .tokens = 128, .kill_rank = -1, .seed = 7,
};

/* Both agents and their memories; the events each side reported. */
struct pair {
	const struct rt_env *env;
	uint16_t port;
	kvp_layout *pl, *cl;
	struct kvt_mem pm, cm, cm0;
	kvp_agent *p, *c;
	uint32_t eng;
	struct rt_req rq[4];
	uint64_t deadline; /* request 0's (pair_expect()) */
	struct kvp_event pev[64], cev[64];
	uint32_t npev, ncev;
	/* FAILED ids, copied (the event's are the agent's until the next
	 * poll) */
	uint32_t fail_ok[64];
};

struct opts {
	uint32_t sq_depth, max_read, stall_ms, max_inflight;
};

/* The producer's memory holds request k's blocks. */
static void p_fill(struct pair *x, uint32_t k)
{
	kvt_fill_producer(x->pl, &x->pm, x->rq[k].ids);
}

/* Another request's bytes in every producer block (a reuse). */
static void p_reuse(struct pair *x, uint32_t salt)
{
	kvt_fill_background(&x->pm, salt);
}

static int p_open(struct pair *x, uint32_t inflight)
{
	struct kvp_agent_attr at;
	int err;

	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = x->pl;
	at.addr = x->env->addr0;
	at.max_inflight = inflight ? inflight : L_INFLIGHT;
	err = kvp_agent_open(&at, &x->p);
	if (!err)
		err = rt_register_all(x->p, &x->pm);
	if (!err)
		err = kvp_agent_listen(x->p, x->env->addr0, x->port);
	return err;
}

/* Polls both agents (the producer when p, the consumer when c) once,
 * recording their events. */
static int pump1(struct pair *x, int p, int c)
{
	struct kvp_event ev[16];
	int n, i;

	if (p && x->p) {
		n = kvp_agent_poll(x->p, ev, 16);
		if (n < 0)
			return n;
		for (i = 0; i < n; i++)
			if (ev[i].type != KVP_EV_DISCONNECTED &&
			    x->npev < 64)
				x->pev[x->npev++] = ev[i];
	}
	if (c && x->c) {
		n = kvp_agent_poll(x->c, ev, 16);
		if (n < 0)
			return n;
		for (i = 0; i < n; i++) {
			if (ev[i].type == KVP_EV_DISCONNECTED ||
			    x->ncev >= 64)
				continue;
			/* FAILED: its ids must be the request's local ones. */
			if (ev[i].type == KVP_EV_FAILED) {
				uint32_t k, ok = 0;

				for (k = 0; k < 4; k++)
					if (ev[i].ngroups == 1 && ev[i].ids &&
					    ev[i].ids[0].nlocal ==
						    x->rq[k].ids[0].nlocal &&
					    !memcmp(ev[i].ids[0].local,
						    x->rq[k].ids[0].local,
						    ev[i].ids[0].nlocal * 4))
						ok = 1;
				x->fail_ok[x->ncev] = ok;
			}
			x->cev[x->ncev++] = ev[i];
		}
	}
	return 0;
}

/* The index of side's event of `type` for req_id (any type: 0), or -1. */
static int find_ev(const struct kvp_event *ev, uint32_t n, uint32_t type,
		   uint64_t id)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if ((!type || ev[i].type == type) && ev[i].req_id == id)
			return (int)i;
	return -1;
}

/* Pumps until the consumer reported req_id (DONE or FAILED) or the
 * producer reported `ptype` for it (ptype != 0), at most 20 s. */
static int pump_until(struct pair *x, int p, int c, uint32_t ptype,
		      uint64_t id)
{
	double end = rt_now() + 20;

	while (rt_now() < end) {
		if (pump1(x, p, c))
			return -1;
		if (ptype ? find_ev(x->pev, x->npev, ptype, id) >= 0 :
			    find_ev(x->cev, x->ncev, KVP_EV_DONE, id) >= 0 ||
				    find_ev(x->cev, x->ncev, KVP_EV_FAILED,
					    id) >= 0)
			return 0;
		usleep(100);
	}
	return -1;
}

static int c_open(struct pair *x, const struct opts *o)
{
	struct kvp_agent_attr at;
	struct kvp_peer peer = { .addr = x->env->addr0, .port = x->port };
	double end;
	int err;

	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = x->cl;
	at.addr = x->env->addr1 ? x->env->addr1 : x->env->addr0;
	at.sq_depth = o ? o->sq_depth : 0;
	at.max_read = o ? o->max_read : 0;
	at.stall_ms = o ? o->stall_ms : 0;
	err = kvp_agent_open(&at, &x->c);
	if (!err)
		err = rt_register_all(x->c, &x->cm);
	if (!err)
		err = kvp_agent_add_engine(x->c, &peer, 1, 20000, &x->eng);
	if (err)
		return err;
	end = rt_now() + 20;
	while (rt_now() < end) {
		if (pump1(x, 1, 1))
			return -EIO;
		if (find_ev(x->cev, x->ncev, KVP_EV_ENGINE_UP, 0) >= 0)
			return 0;
		if (find_ev(x->cev, x->ncev, KVP_EV_ENGINE_DOWN, 0) >= 0)
			return -ECONNREFUSED;
		usleep(200);
	}
	return -ETIMEDOUT;
}

static void pair_close(struct pair *x)
{
	kvp_agent_close(x->c);
	kvp_agent_close(x->p);
	kvt_mem_free(&x->pm);
	kvt_mem_free(&x->cm);
	kvt_mem_free(&x->cm0);
	kvp_layout_destroy(x->pl);
	kvp_layout_destroy(x->cl);
	memset(x, 0, sizeof(*x));
}

static int pair_open(struct pair *x, const struct rt_env *env, uint16_t port,
		     const struct opts *o)
{
	uint32_t k;

	memset(x, 0, sizeof(*x));
	x->env = env;
	x->port = port;
	x->pl = rt_layout(&L_CASE, 1, 0);
	x->cl = rt_layout(&L_CASE, 0, 0);
	if (!x->pl || !x->cl || kvt_mem_alloc(x->pl, &x->pm) ||
	    kvt_mem_alloc(x->cl, &x->cm) || rt_make_requests(&L_CASE, x->rq))
		return -ENOMEM;
	for (k = 0; k < 4; k++)
		x->rq[k].id = 100 + k;
	kvt_fill_background(&x->pm, 1);
	kvt_fill_background(&x->cm, 2);
	if (kvt_mem_like(&x->cm0, &x->cm, 1))
		return -ENOMEM;
	if (p_open(x, o ? o->max_inflight : 0))
		return -EIO;
	return c_open(x, o);
}

/* pair_open(), then request 0's blocks filled and expected for `ms`
 * milliseconds from then. */
static int pair_expect(struct pair *x, const struct rt_env *env, uint16_t port,
		       const struct opts *o, uint64_t ms)
{
	int err = pair_open(x, env, port, o);

	if (err)
		return err;
	p_fill(x, 0);
	x->deadline = rt_now_ns() + ms * 1000000ull;
	return kvp_agent_expect(x->p, RT_CONS_ENGINE, x->rq[0].id,
				x->deadline);
}

/* Sleeps (polling neither agent) until request 0's deadline passed, then
 * polls the producer until it reports it EXPIRED. */
static int expire(struct pair *x)
{
	uint64_t now = rt_now_ns();

	if (now <= x->deadline)
		usleep((useconds_t)((x->deadline - now) / 1000 + 1000));
	return pump_until(x, 1, 0, KVP_EV_EXPIRED, x->rq[0].id);
}

/* The consumer's event for request k: FAILED -ESTALE, KVP_REASON_LEASE,
 * the request's local ids listed. */
static int failed_stale(const struct pair *x, uint32_t k, const char **why)
{
	int i = find_ev(x->cev, x->ncev, 0, x->rq[k].id);

	*why = "no event";
	if (i < 0)
		return 0;
	*why = x->cev[i].type == KVP_EV_DONE ? "DONE" :
	       x->cev[i].status != -ESTALE    ? kvp_strerror(x->cev[i].status) :
	       x->cev[i].reason != KVP_REASON_LEASE ?
					       kvp_reason_str(x->cev[i].reason) :
	       !x->fail_ok[i] ? "FAILED without the request's ids" :
				"";
	return !**why;
}

/* Pumps both agents until the consumer reports request k, which must
 * end FAILED -ESTALE (failed_stale()); prints why not, as `what`. */
static int ends_stale(struct pair *x, uint32_t k, const char *what)
{
	const char *why = "no event";

	if (!pump_until(x, 1, 1, 0, x->rq[k].id) && failed_stale(x, k, &why))
		return 0;
	printf("  %s: %s\n", what, why);
	return -1;
}

/* DONE for request k, and the consumer's memory exactly as it must be
 * after it (the other requests' blocks untouched: background). */
static int done_exact(struct pair *x, uint32_t k, const char *who)
{
	struct kvt_mem want = { 0 };
	int i = find_ev(x->cev, x->ncev, 0, x->rq[k].id), ret = -1;

	if (i < 0 || x->cev[i].type != KVP_EV_DONE) {
		printf("  [%s] request %u: %s\n", who, k,
		       i < 0 ? "no event" : kvp_strerror(x->cev[i].status));
		return -1;
	}
	if (kvt_mem_copy(&want, &x->cm0))
		goto out;
	kvt_expect_consumer(x->cl, x->pl, &want, NULL, x->rq[k].ids);
	ret = kvt_mem_compare(&x->cm, &want, who) ? -1 : 0;
out:
	kvt_mem_free(&want);
	return ret;
}

static void stats(kvp_agent *a, struct kvp_agent_stats *st)
{
	memset(st, 0, sizeof(*st));
	kvp_agent_get_stats(a, st);
}

/* Pumps the producer until it took n unheld notifications. */
static int wait_unheld(struct pair *x, uint64_t n)
{
	struct kvp_agent_stats st;
	double end = rt_now() + 10;

	do {
		if (pump1(x, 1, 1))
			return -1;
		stats(x->p, &st);
		if (st.unheld >= n)
			return 0;
		usleep(200);
	} while (rt_now() < end);
	return -1;
}

/* ---- the cases ------------------------------------------------------------ */

static int case_expired_reused(const struct rt_env *env, uint16_t port)
{
	const char *who = "expired, reused";
	struct kvp_agent_stats cs, ps;
	struct pair x;
	int ret = 1;

	CHECK(!pair_expect(&x, env, port, NULL, 0), "setup");
	CHECK(!pump_until(&x, 1, 0, KVP_EV_EXPIRED, x.rq[0].id), "no EXPIRED");
	p_reuse(&x, 77); /* the engine writes another request there */
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!ends_stale(&x, 0, "pull of an expired request"), "not FAILED -ESTALE");
	CHECK(!wait_unheld(&x, 1), "the producer counted no unheld pull");
	stats(x.c, &cs);
	stats(x.p, &ps);
	CHECK(cs.lease_reads == 1 && cs.lease_fails == 1 && cs.done == 0,
	      "consumer: %llu lease READs, %llu lease fails, %llu DONE",
	      (unsigned long long)cs.lease_reads,
	      (unsigned long long)cs.lease_fails,
	      (unsigned long long)cs.done);
	printf("    expired, its blocks reused, pulled: FAILED -ESTALE (%s); producer unheld %llu\n",
	       kvp_reason_str(KVP_REASON_LEASE),
	       (unsigned long long)ps.unheld);
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

static int case_never_expected(const struct rt_env *env, uint16_t port)
{
	const char *who = "never expected", *why;
	struct pair x;
	int ret = 1;

	CHECK(!pair_open(&x, env, port, NULL), "setup");
	p_fill(&x, 1); /* another request's bytes, where 2 would read */
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[2].id, x.rq[1].ids),
	      "pull");
	CHECK(!pump_until(&x, 1, 1, 0, x.rq[2].id), "no event");
	x.rq[2] = x.rq[1], x.rq[2].id = 102; /* its ids are request 1's */
	CHECK(failed_stale(&x, 2, &why), "pull of a request never expected: %s",
	      why);
	CHECK(!wait_unheld(&x, 1), "the producer counted no unheld pull");
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* A clean pull, then the same id from a restarted consumer. */
static int case_clean_restart(const struct rt_env *env, uint16_t port)
{
	const char *who = "clean, restarted";
	struct kvp_agent_stats cs, ps;
	struct pair x;
	int ret = 1;

	CHECK(!pair_expect(&x, env, port, NULL, 60000),
	      "setup");
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!pump_until(&x, 1, 1, KVP_EV_RELEASED, x.rq[0].id),
	      "not released");
	CHECK(!done_exact(&x, 0, who), "clean pull");
	stats(x.c, &cs);
	stats(x.p, &ps);
	CHECK(cs.lease_reads == 1 && !cs.lease_fails && !ps.unheld,
	      "%llu lease READs, %llu lease fails, %llu unheld",
	      (unsigned long long)cs.lease_reads,
	      (unsigned long long)cs.lease_fails,
	      (unsigned long long)ps.unheld);
	/* A restarted consumer process (same engine id) remembers nothing:
	 * the producer has let go of the request. */
	kvp_agent_close(x.c);
	x.c = NULL;
	x.ncev = 0;
	CHECK(!c_open(&x, NULL), "the restarted consumer connects");
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull again");
	CHECK(!ends_stale(&x, 0,
			  "a released request pulled by a restarted consumer"),
	      "not FAILED -ESTALE");
	printf("    clean: DONE, every byte, 1 lease READ; the same id from a restarted consumer: FAILED -ESTALE\n");
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* The consumer READs 4 KiB at a time through a small send queue: a pull
 * (1 MiB: 256 READs) takes many windows, and only its polls post the
 * next. */
static const struct opts narrow = { .sq_depth = 8, .max_read = 4096 };

static int case_between_windows(const struct rt_env *env, uint16_t port)
{
	const char *who = "between windows";
	struct kvp_agent_stats cs;
	struct pair x;
	int ret = 1;

	CHECK(!pair_expect(&x, env, port, &narrow, 1000),
	      "setup");
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	stats(x.c, &cs);
	CHECK(cs.reads && cs.reads < 64, "%llu READs posted by the pull",
	      (unsigned long long)cs.reads);
	/* The first window is out; the producer lets go and reuses the
	 * blocks before the next. */
	CHECK(!expire(&x), "no EXPIRED");
	p_reuse(&x, 78);
	CHECK(!ends_stale(&x, 0, "withdrawn between windows"), "not FAILED -ESTALE");
	stats(x.c, &cs);
	printf("    withdrawn after the first window of a pull of %llu READs: FAILED -ESTALE\n",
	       (unsigned long long)cs.reads);
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

static int case_straddle(const struct rt_env *env, uint16_t port)
{
	const char *who = "straddles the deadline";
	struct pair x;
	int ret = 1;

	CHECK(!pair_expect(&x, env, port, NULL, 1000),
	      "setup");
	/* Every READ posted now; their completions wait for a poll. */
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!expire(&x), "no EXPIRED");
	/* Not reused: the bytes are right, but the producer let go before
	 * the check. */
	CHECK(!ends_stale(&x, 0, "checked after the deadline"), "not FAILED -ESTALE");
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* Two keys of one bucket: request 0 expected, expired (its entry free),
 * request 3 (chosen for the bucket) granted into that entry. */
static int case_same_bucket(const struct rt_env *env, uint16_t port)
{
	const char *who = "same bucket";
	uint32_t b0 = kvp__lease_bucket(RT_CONS_ENGINE, 100, L_LOG2);
	uint64_t other = 1000;
	struct pair x;
	int ret = 1;

	while (kvp__lease_bucket(RT_CONS_ENGINE, other, L_LOG2) != b0)
		other++;
	CHECK(!pair_open(&x, env, port, NULL), "setup");
	x.rq[3].id = other;
	p_fill(&x, 0);
	CHECK(!kvp_agent_expect(x.p, RT_CONS_ENGINE, x.rq[0].id, rt_now_ns()),
	      "expect");
	CHECK(!pump_until(&x, 1, 0, KVP_EV_EXPIRED, x.rq[0].id), "no EXPIRED");
	p_fill(&x, 3);
	CHECK(!kvp_agent_expect(x.p, RT_CONS_ENGINE, other,
				rt_now_ns() + 60000000000ull),
	      "expect the other");
	CHECK(!kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!ends_stale(&x, 0, "the let-go request"), "not FAILED -ESTALE");
	CHECK(!kvp_agent_pull_from(x.c, x.eng, other, x.rq[3].ids),
	      "pull the other");
	CHECK(!pump_until(&x, 1, 1, 0, other), "no event for the other");
	/* Its blocks: request 3's, read after request 0's (which the
	 * failed pull left in its own blocks). */
	{
		int i = find_ev(x.cev, x.ncev, 0, other);

		CHECK(i >= 0 && x.cev[i].type == KVP_EV_DONE,
		      "the other request: %s",
		      i < 0 ? "no event" : kvp_strerror(x.cev[i].status));
	}
	printf("    requests %llu and %llu share lease bucket %u: the one let go FAILED, the other DONE\n",
	       (unsigned long long)x.rq[0].id, (unsigned long long)other, b0);
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* Pumps the producer until it took the consumer's FOLLOW. */
static int wait_follow(struct pair *x)
{
	struct kvp_agent_stats st;
	double end = rt_now() + 10;

	do {
		if (pump1(x, 1, 1))
			return -1;
		stats(x->p, &st);
		if (st.follows)
			return 0;
		usleep(200);
	} while (rt_now() < end);
	return -1;
}

static const struct kvp_progress all_of_it = {
	.tokens_all = KVP_TOKENS_END, .tokens_cur = KVP_TOKENS_END,
};

static int case_stream_withdrawn(const struct rt_env *env, uint16_t port)
{
	const char *who = "streamed, withdrawn";
	struct pair x;
	int ret = 1;

	CHECK(!pair_expect(&x, env, port, NULL, 2000),
	      "setup");
	CHECK(!kvp_agent_pull_stream(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!wait_follow(&x), "no FOLLOW");
	/* Published whole: its record WRITE lands while the consumer does
	 * not poll; then the producer lets go and reuses the blocks. */
	CHECK(!kvp_agent_publish(x.p, RT_CONS_ENGINE, x.rq[0].id, &all_of_it),
	      "publish");
	CHECK(!expire(&x), "no EXPIRED");
	p_reuse(&x, 79);
	CHECK(!ends_stale(&x, 0, "streamed, withdrawn"), "not FAILED -ESTALE");
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* The same key granted again while the stream reads: the producer's
 * tombstone of the first grant pushed out (4 reports more than its
 * max_inflight of 4 keeps), then expect() again, a new generation. The
 * consumer's last check finds a lease for its key, of another
 * generation than its records carried. */
static int case_stream_regrant(const struct rt_env *env, uint16_t port)
{
	const struct opts o = { .sq_depth = 8, .max_read = 4096,
				.max_inflight = 4 };
	const char *who = "streamed, granted again";
	struct kvp_agent_stats cs;
	struct pair x;
	uint32_t i;
	double end;
	int ret = 1;

	CHECK(!pair_expect(&x, env, port, &o, 2000),
	      "setup");
	CHECK(!kvp_agent_pull_stream(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!wait_follow(&x), "no FOLLOW");
	CHECK(!kvp_agent_publish(x.p, RT_CONS_ENGINE, x.rq[0].id, &all_of_it),
	      "publish");
	/* The consumer polls until it saw the record: its first window. */
	end = rt_now() + 10;
	do {
		CHECK(!pump1(&x, 0, 1), "poll");
		stats(x.c, &cs);
	} while (!cs.progress_seen && rt_now() < end);
	CHECK(cs.progress_seen && cs.reads < 64,
	      "record seen %llu, %llu READs", (unsigned long long)cs.progress_seen,
	      (unsigned long long)cs.reads);
	CHECK(!expire(&x), "no EXPIRED");
	for (i = 0; i < 4; i++) {
		CHECK(!kvp_agent_expect(x.p, RT_CONS_ENGINE, 500 + i,
					rt_now_ns()),
		      "expect %u", 500 + i);
		CHECK(!pump_until(&x, 1, 0, KVP_EV_EXPIRED, 500 + i),
		      "no EXPIRED");
	}
	CHECK(!kvp_agent_expect(x.p, RT_CONS_ENGINE, x.rq[0].id,
				rt_now_ns() + 60000000000ull),
	      "expect again (the tombstone pushed out)");
	CHECK(!ends_stale(&x, 0, "another generation"), "not FAILED -ESTALE");
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* The producer process restarts at the same address (its agent closed,
 * another opened on the same port, its memory holding other bytes). */
static int case_producer_restart(const struct rt_env *env, uint16_t port)
{
	const char *who = "producer restarted";
	struct pair x;
	double end;
	int ret = 1, err, i;

	CHECK(!pair_expect(&x, env, port, NULL, 60000),
	      "setup");
	kvp_agent_close(x.p);
	x.p = NULL;
	p_reuse(&x, 80);
	CHECK(!p_open(&x, 0), "the restarted producer listens");
	/* The old engine's pull: refused while it goes down, or FAILED. */
	err = kvp_agent_pull_from(x.c, x.eng, x.rq[0].id, x.rq[0].ids);
	if (!err) {
		CHECK(!pump_until(&x, 1, 1, 0, x.rq[0].id), "no event");
		i = find_ev(x.cev, x.ncev, 0, x.rq[0].id);
		CHECK(x.cev[i].type == KVP_EV_FAILED,
		      "the old engine's pull ended DONE");
	}
	/* Down, then back with the new process's keys. */
	end = rt_now() + 20;
	while ((err = kvp_agent_pull_from(x.c, x.eng, x.rq[1].id,
					  x.rq[1].ids)) != 0 &&
	       rt_now() < end) {
		CHECK(err == -EAGAIN || err == -ENOTCONN || err == -EALREADY,
		      "pull after the restart: %s", kvp_strerror(err));
		CHECK(!pump1(&x, 1, 1), "poll");
		usleep(1000);
	}
	CHECK(!err, "no reconnect");
	CHECK(!ends_stale(&x, 1, "a request the new process never expected"),
	      "not FAILED -ESTALE");
	printf("    restarted at the same address: the old engine's pull %s, the new process's unexpected request FAILED -ESTALE\n",
	       err ? "refused" : "FAILED");
	ret = 0;
out:
	pair_close(&x);
	return ret;
}

/* ---- a forged progress record ------------------------------------------ */

/* WRITEs a progress record from producer agent `from` (its first ready
 * connection) to the record of consumer `c`'s streamed request `id` from
 * engine handle `eng` (source 0): progress "all of it", its check keyed
 * by `key`. The target's address and rkey are read from the consumer's
 * insides: a peer that guessed them. */
static int forge(kvp_agent *from, kvp_agent *c, uint32_t eng, uint64_t id,
		 const uint64_t key[2], uint64_t gen)
{
	struct kvp_eng *e = kvp__engine_get(c, eng);
	struct kvp_conn *pc = NULL, *cc;
	struct ibv_send_wr wr, *bad;
	struct ibv_sge sge;
	struct ibv_wc wc;
	struct ibv_mr *mr;
	static uint8_t rec[KVP_PROG_REC];
	uint32_t i, slot, ci;
	double end;
	int n, err;

	if (!e)
		return -1;
	for (slot = 0; slot < c->max_inflight; slot++)
		if (c->reqs[slot].state == RQ_ACTIVE &&
		    c->reqs[slot].req_id == id &&
		    c->reqs[slot].eng == (uint32_t)(e - c->engs))
			break;
	if (slot == c->max_inflight)
		return -1;
	cc = &c->conns[kvp__src_conn(e, 0)];
	ci = cc->idx - c->nprod;
	for (i = 0; i < from->prod_hw && !pc; i++)
		if (from->conns[i].state == CS_READY)
			pc = &from->conns[i];
	if (!pc)
		return -1;
	kvp__put64(rec, c->reqs[slot].seq);
	kvp__put64(rec + 8, KVP_TOKENS_END);
	kvp__put64(rec + 16, KVP_TOKENS_END);
	kvp__put32(rec + 24, 0);
	kvp__put32(rec + 28, 0);
	kvp__put64(rec + 32, gen);
	kvp__put64(rec + 40, kvp__prog_check(key, c->reqs[slot].seq,
					     KVP_TOKENS_END, KVP_TOKENS_END, 0,
					     gen));
	mr = ibv_reg_mr(from->pd, rec, sizeof(rec), 0);
	if (!mr)
		return -1;
	memset(&wr, 0, sizeof(wr));
	sge.addr = (uintptr_t)rec;
	sge.length = sizeof(rec);
	sge.lkey = mr->lkey;
	wr.wr_id = 0xf0f0;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_RDMA_WRITE;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr =
		(uintptr_t)(c->ptab + ((size_t)ci * 2 * c->max_inflight +
				       2 * slot + (c->reqs[slot].uses & 1)) *
					      KVP_PROG_REC);
	wr.wr.rdma.rkey = c->ptab_mr[ci]->rkey;
	err = ibv_post_send(pc->qp, &wr, &bad);
	/* Its completion lands in the attacker agent's CQ: taken here,
	 * before that agent polls again. */
	for (end = rt_now() + 5; !err && rt_now() < end;) {
		n = ibv_poll_cq(pc->qp->send_cq, 1, &wc);
		if (n < 0 || (n == 1 && wc.wr_id == 0xf0f0)) {
			err = n < 0 || wc.status != IBV_WC_SUCCESS;
			break;
		}
	}
	ibv_dereg_mr(mr);
	return err ? -1 : 0;
}

/* Polls the consumer alone for 200 ms: the progress records it took. */
static uint64_t seen_after(struct pair *x)
{
	struct kvp_agent_stats st;
	double end = rt_now() + 0.2;

	while (rt_now() < end) {
		if (pump1(x, 0, 1))
			return UINT64_MAX;
		usleep(500);
	}
	stats(x->c, &st);
	return st.progress_seen;
}

static int case_forged_record(const struct rt_env *env, uint16_t port)
{
	const char *who = "forged record";
	struct kvp_peer peer = { .addr = env->addr0,
				 .port = (uint16_t)(port + 100) };
	struct kvp_agent_attr at;
	struct kvt_mem m2 = { 0 };
	kvp_layout *l2 = rt_layout_engine(&L_CASE, 1, 0, RT_PROD_ENGINE + 1);
	kvp_agent *p2 = NULL;
	struct kvp_event ev2[8];
	struct kvp_ent *ent;
	struct pair x;
	uint32_t eng2;
	uint64_t seen0, gen, wrong[2];
	double end;
	int ret = 1, up = 0, i;

	CHECK(!pair_expect(&x, env, port, NULL, 60000), "setup");
	/* The attacker: another producer engine the consumer also pulls
	 * from. */
	CHECK(l2 && !kvt_mem_alloc(l2, &m2), "layout");
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_PRODUCER;
	at.layout = l2;
	at.addr = env->addr0;
	CHECK(!kvp_agent_open(&at, &p2) && !rt_register_all(p2, &m2) &&
		      !kvp_agent_listen(p2, env->addr0, peer.port),
	      "the other producer");
	CHECK(!kvp_agent_add_engine(x.c, &peer, 1, 20000, &eng2), "add");
	for (end = rt_now() + 20; !up && rt_now() < end;) {
		CHECK(!pump1(&x, 1, 1) && kvp_agent_poll(p2, ev2, 8) >= 0,
		      "poll");
		for (i = 0; i < (int)x.ncev; i++)
			up += x.cev[i].type == KVP_EV_ENGINE_UP &&
			      x.cev[i].engine == eng2;
	}
	CHECK(up, "the other producer engine is not up");
	CHECK(!kvp_agent_pull_stream(x.c, x.eng, x.rq[0].id, x.rq[0].ids),
	      "pull");
	CHECK(!wait_follow(&x), "no FOLLOW");
	seen0 = seen_after(&x);
	/* The lease's true generation, the best a forger could hope for. */
	ent = NULL;
	for (i = 0; i <= (int)x.p->tab_mask && !ent; i++)
		if (x.p->tab[i].state == EN_EXPECTED &&
		    x.p->tab[i].req_id == x.rq[0].id)
			ent = &x.p->tab[i];
	CHECK(ent, "no entry");
	gen = ent->gen;
	/* Keyed by the attacker's own connection key: ignored. */
	for (i = 0; i < (int)p2->prod_hw; i++)
		if (p2->conns[i].state == CS_READY)
			break;
	CHECK(i < (int)p2->prod_hw, "the attacker's connection");
	wrong[0] = p2->conns[i].rec_key[0];
	wrong[1] = p2->conns[i].rec_key[1];
	CHECK(!forge(p2, x.c, x.eng, x.rq[0].id, wrong, gen), "forge");
	CHECK(seen_after(&x) == seen0,
	      "a record written by another engine was taken");
	/* The control: the same WRITE with the connection's key is taken
	 * (so only the key stopped the first). */
	CHECK(!forge(p2, x.c, x.eng, x.rq[0].id,
		     x.c->conns[kvp__src_conn(kvp__engine_get(x.c, x.eng), 0)]
			     .rec_key,
		     gen),
	      "forge with the key");
	CHECK(seen_after(&x) == seen0 + 1,
	      "the control record (the connection's own key) was not taken");
	/* The rest as the producer publishes it: DONE, its bytes. */
	CHECK(!kvp_agent_publish(x.p, RT_CONS_ENGINE, x.rq[0].id, &all_of_it),
	      "publish");
	CHECK(!pump_until(&x, 1, 1, 0, x.rq[0].id), "no event");
	CHECK(!done_exact(&x, 0, who), "the streamed pull");
	printf("    a record written by another producer engine with a guessed key: ignored; with the connection's key: taken\n");
	ret = 0;
out:
	pair_close(&x);
	kvp_agent_close(p2);
	kvt_mem_free(&m2);
	kvp_layout_destroy(l2);
	return ret;
}

int main(int argc, char **argv)
{
	static const struct {
		const char *name;
		int (*fn)(const struct rt_env *env, uint16_t port);
	} cases[] = {
		{ "expired, its blocks reused, then pulled: FAILED",
		  case_expired_reused },
		{ "never expected: FAILED", case_never_expected },
		{ "a clean pull DONE; a restarted consumer's pull of it FAILED",
		  case_clean_restart },
		{ "withdrawn between two READ windows: FAILED",
		  case_between_windows },
		{ "a pull that straddles the deadline: FAILED", case_straddle },
		{ "two requests in one lease bucket", case_same_bucket },
		{ "streamed, withdrawn before its last range: FAILED",
		  case_stream_withdrawn },
		{ "streamed, the same key granted again: FAILED",
		  case_stream_regrant },
		{ "a producer restarted at the same address",
		  case_producer_restart },
		{ "a progress record forged by another producer engine",
		  case_forged_record },
	};
	const char *filter = argc > 1 ? argv[1] : NULL;
	struct rt_env env;
	uint32_t i, pass = 0, fail = 0;

	if (rt_start(&env, L_PORT))
		return 1;
	alarm(600);
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		double t0 = rt_now();

		if (filter && !strstr(cases[i].name, filter))
			continue;
		rt_report(cases[i].name,
			  !cases[i].fn(&env, (uint16_t)(L_PORT + i)), t0, &pass,
			  &fail);
	}
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
