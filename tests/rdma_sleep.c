// SPDX-License-Identifier: MIT
/*
 * Engines that sleep instead of spinning: both sides wait on the agent's
 * file descriptors (kvp_agent_fds) after kvp_agent_arm(), with the timeout
 * it asks for. Checks that completions, connection requests and deadlines
 * all wake them: the consumer's pulls finish, the producer accepts while
 * asleep, releases the pulled requests and expires the unpulled one on
 * time, and notices the consumer leaving. Then a consumer whose handshake
 * a full producer refuses sleeps too: the retry time the producer hinted
 * must wake it (kvp_agent_arm()'s wake time), not its deadline.
 *
 *   rdma_sleep
 */
#include "rdma/harness.h"

static const struct rt_case sc = {
	.name = "sleeping engines", .model = "llama-3.1-8b", .layers = 2,
	.P = 1, .D = 1, .pblock = 16, .dblock = 16, .pblocks = 64,
	.dblocks = 64, .nreq = 6, .tokens = 160, .kill_rank = -1,
};

/* Sleeps until an fd is readable or the agent's wake time (at most
 * max_ms). Returns 1 when an fd woke it, 0 on timeout, 3 on a timeout the
 * agent's wake time set (below max_ms), 2 when arm said that something
 * already waits (no sleep), -1 on error. */
static int sleep_on(kvp_agent *a, int max_ms)
{
	struct pollfd p[KVP_AGENT_FDS];
	uint64_t wake, now;
	int fds[KVP_AGENT_FDS], n, ms, r, i;

	n = kvp_agent_fds(a, fds, KVP_AGENT_FDS);
	if (n != KVP_AGENT_FDS)
		return -1;
	r = kvp_agent_arm(a, &wake);
	if (r < 0)
		return -1;
	if (r > 0)
		return 2;
	now = rt_now_ns();
	ms = max_ms;
	if (wake != UINT64_MAX)
		ms = wake <= now ? 0 : (int)((wake - now) / 1000000 + 1);
	if (ms > max_ms)
		ms = max_ms;
	for (i = 0; i < n; i++) {
		p[i].fd = fds[i];
		p[i].events = POLLIN;
		p[i].revents = 0;
	}
	r = poll(p, (nfds_t)n, ms);
	return r < 0 ? -1 : r > 0 ? 1 : ms < max_ms ? 3 : 0;
}

/* Allocates l's memory, opens an agent of this role on addr0 with the
 * rest of *at as set, and registers the memory. */
static int open_agent(const struct rt_env *env, struct kvp_agent_attr *at,
		      int role, kvp_layout *l, struct kvt_mem *mem,
		      kvp_agent **a)
{
	int err;

	if (!l || kvt_mem_alloc(l, mem))
		return -ENOMEM;
	at->role = role;
	at->layout = l;
	at->addr = env->addr0;
	err = kvp_agent_open(at, a);
	return err ? err : rt_register_all(*a, mem);
}

static int sleepy_producer(const struct rt_env *env, const struct rt_req *rq,
			   int ready_fd)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[8];
	kvp_layout *l = rt_layout(&sc, 1, 0);
	kvp_agent *a = NULL;
	uint32_t i, released = 0, busy = 0, wakes = 0, disc = 0, timed = 0;
	uint64_t exp_deadline = 0, expired_at = 0;
	double end = rt_now() + 60;
	const char *who = "sleepy producer";
	int ret = 1, err, n;

	alarm(80);
	memset(&at, 0, sizeof(at));
	err = open_agent(env, &at, KVP_ROLE_PRODUCER, l, &mem, &a);
	for (i = 0; !err && i < sc.nreq; i++)
		kvt_fill_producer(l, &mem, rq[i].ids);
	if (!err)
		err = kvp_agent_listen(a, env->addr0, env->port);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	for (i = 0; i < sc.nreq; i++)
		if (kvp_agent_expect(a, RT_CONS_ENGINE, rq[i].id, rt_now_ns() + 50000000000ull))
			RT_FAIL("expect");
	if (write(ready_fd, "r", 1) != 1)
		RT_FAIL("pipe");
	/* Never pulled: its deadline must wake the sleeper. */
	exp_deadline = rt_now_ns() + 2500000000ull;
	if (kvp_agent_expect(a, RT_CONS_ENGINE, 77, exp_deadline))
		RT_FAIL("expect 77");
	/* Until the consumer has gone, too: its disconnect must wake us. */
	while (released < sc.nreq || !expired_at || !disc) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll");
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_RELEASED)
				released++;
			else if (ev[i].type == KVP_EV_EXPIRED &&
				 ev[i].req_id == 77)
				expired_at = rt_now_ns();
			else if (ev[i].type == KVP_EV_DISCONNECTED)
				disc++;
			else
				RT_FAIL("event %u for %llu", ev[i].type,
					(unsigned long long)ev[i].req_id);
		}
		if (n)
			continue;
		err = sleep_on(a, 5000);
		if (err < 0)
			RT_FAIL("sleep");
		wakes += err == 1;
		busy += err == 2;
		/* A sleep the deadline ended, before the expiry: the agent
		 * told when to wake. */
		timed += err == 3 && !expired_at;
		if (rt_now() > end)
			RT_FAIL("timeout: %u released", released);
	}
	/* Woken by the deadline (the agent's wake time bounded a sleep
	 * before the expiry), never before it; how late depends on the
	 * machine's load, so it is printed, not bounded. */
	if (expired_at < exp_deadline)
		RT_FAIL("expired %.1f ms before its deadline",
			(exp_deadline - expired_at) / 1e6);
	if (!timed)
		RT_FAIL("no sleep ended at the agent's wake time before the expiry");
	printf("    sleepy producer: expired %.1f ms after its deadline, woken by it\n",
	       (expired_at - exp_deadline) / 1e6);
	if (env->verbose)
		fprintf(stderr, "  [%s] fd wake-ups %u, arm said busy %u, "
				"expiry late by %.2f ms\n",
			who, wakes, busy, (expired_at - exp_deadline) / 1e6);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

static int sleepy_consumer(const struct rt_env *env, const struct rt_req *rq)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 }, exp = { 0 };
	struct kvp_peer peer = { .addr = env->addr0, .port = env->port };
	struct kvp_event ev[8];
	kvp_layout *l = rt_layout(&sc, 0, 0), *r0 = rt_layout(&sc, 1, 0);
	kvp_agent *a = NULL;
	uint32_t i, done = 0, next = 0, busy = 0, wakes = 0;
	double end = rt_now() + 60;
	const char *who = "sleepy consumer";
	int ret = 1, err, n;

	alarm(80);
	memset(&at, 0, sizeof(at));
	at.max_ids = 16;
	at.sq_depth = 16; /* requests also wait for send queue room */
	at.max_inflight = 2; /* so that pulls wait for completions */
	err = r0 ? open_agent(env, &at, KVP_ROLE_CONSUMER, l, &mem, &a) :
		   -ENOMEM;
	if (!err) {
		kvt_fill_background(&mem, 3);
		err = kvt_mem_copy(&exp, &mem) ? -ENOMEM : 0;
	}
	if (!err)
		err = kvp_agent_connect(a, &peer, 1, 20000);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	while (done < sc.nreq) {
		while (next < sc.nreq) {
			err = kvp_agent_pull(a, rq[next].id, rq[next].ids);
			if (err == -EBUSY)
				break;
			if (err)
				RT_FAIL("pull: %s", kvp_strerror(err));
			next++;
		}
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll");
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type != KVP_EV_DONE)
				RT_FAIL("event %u", ev[i].type);
			done++;
		}
		if (n)
			continue;
		/* Pulls are in flight: only a completion may end the sleep;
		 * the 3 s bound must never be reached. */
		err = sleep_on(a, 3000);
		if (err < 0)
			RT_FAIL("sleep");
		if (!err)
			RT_FAIL("slept 3 s with %u pulls in flight", next - done);
		wakes += err == 1;
		busy += err == 2;
		if (rt_now() > end)
			RT_FAIL("timeout: %u done", done);
	}
	for (i = 0; i < sc.nreq; i++)
		kvt_expect_consumer(l, r0, &exp, NULL, rq[i].ids);
	if (kvt_mem_compare(&mem, &exp, who))
		RT_FAIL("memory differs");
	if (env->verbose)
		fprintf(stderr, "  [%s] fd wake-ups %u, arm said busy %u\n",
			who, wakes, busy);
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r0);
	return ret;
}

/* ---- a refused handshake retried while asleep ---------------------------
 * The producer takes one consumer rank (max_peers 1). Consumer A holds it
 * with a request the producer expects for 2.5 s, so A is busy and may not
 * be evicted. Consumer B adds the engine with a 20 s deadline and sleeps
 * on its fds: the producer refuses it (full, a 250 ms hint), its agent
 * retries after 0.125-0.375 s, then twice that and so on; once A's
 * request expired, a retry evicts A and B is up, in 6-10 s. Had B's agent
 * hidden the retry times from kvp_agent_arm(), B would sleep to its
 * deadline and fail: B must be up before it, with no ENGINE_DOWN (how
 * long it took is printed, not bounded: the machine's load moves it). */
#define RETRY_A RT_CONS_ENGINE
#define RETRY_B (RT_CONS_ENGINE + 1)

static int retry_producer(const struct rt_env *env, int ready_fd, int stop_fd)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_event ev[8];
	kvp_layout *l = rt_layout(&sc, 1, 0);
	kvp_agent *a = NULL;
	struct pollfd p = { .fd = stop_fd, .events = POLLIN };
	double end = rt_now() + 60;
	const char *who = "producer, one rank";
	int ret = 1, err, n;

	alarm(80);
	memset(&at, 0, sizeof(at));
	at.max_peers = 1;
	err = open_agent(env, &at, KVP_ROLE_PRODUCER, l, &mem, &a);
	if (!err)
		err = kvp_agent_listen(a, env->addr0, env->port + 1);
	if (!err)
		err = kvp_agent_expect(a, RETRY_A, 1,
				       rt_now_ns() + 2500000000ull);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	if (write(ready_fd, "r", 1) != 1)
		RT_FAIL("pipe");
	while (poll(&p, 1, 0) == 0) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		if (!n && sleep_on(a, 100) < 0)
			RT_FAIL("sleep");
		if (rt_now() > end)
			RT_FAIL("not stopped in 60 s");
	}
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

/* Consumer A (engine RETRY_A) connects, says so, and polls until the
 * producer evicts it (ENGINE_DOWN) or 30 s. Consumer B (RETRY_B) adds the
 * engine and sleeps on its fds until ENGINE_UP; it prints how long that
 * took and how many refusals its agent retried. */
static int retry_consumer(const struct rt_env *env, uint64_t engine,
			  int ready_fd)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 };
	struct kvp_peer peer = { .addr = env->addr0, .port = env->port + 1 };
	struct kvp_event ev[8];
	struct kvp_agent_stats st;
	kvp_layout *l = rt_layout_engine(&sc, 0, 0, engine);
	kvp_agent *a = NULL;
	uint32_t h, i, up = 0, down = 0, wakes = 0;
	double t0, end;
	const char *who = engine == RETRY_A ? "consumer A" : "consumer B";
	int ret = 1, err, n;

	alarm(80);
	memset(&at, 0, sizeof(at));
	err = open_agent(env, &at, KVP_ROLE_CONSUMER, l, &mem, &a);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	t0 = rt_now();
	if (engine == RETRY_A) {
		err = kvp_agent_connect(a, &peer, 1, 20000);
		if (err)
			RT_FAIL("connect: %s", kvp_strerror(err));
		if (write(ready_fd, "a", 1) != 1)
			RT_FAIL("pipe");
	} else {
		err = kvp_agent_add_engine(a, &peer, 1, 20000, &h);
		if (err)
			RT_FAIL("add_engine: %s", kvp_strerror(err));
	}
	end = t0 + 30;
	while (engine == RETRY_A ? !down : !up) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_ENGINE_UP)
				up++;
			else if (ev[i].type == KVP_EV_ENGINE_DOWN)
				down++;
		}
		if (engine == RETRY_B && down)
			RT_FAIL("ENGINE_DOWN after %.2f s: %s", rt_now() - t0,
				kvp_strerror(ev[0].status));
		if (n)
			continue;
		/* B: no cap on the sleep but the agent's own wake time. */
		err = sleep_on(a, engine == RETRY_A ? 100 : 30000);
		if (err < 0)
			RT_FAIL("sleep");
		wakes += err == 1;
		if (rt_now() > end)
			RT_FAIL("%s not seen in 30 s",
				engine == RETRY_A ? "ENGINE_DOWN" :
						    "ENGINE_UP");
	}
	if (engine == RETRY_B) {
		kvp_agent_get_stats(a, &st);
		printf("    B up after %.2f s asleep, %u fd wake-ups, %llu "
		       "handshake failures (deadline 20 s)\n",
		       rt_now() - t0, wakes,
		       (unsigned long long)st.handshake_failures);
	}
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvp_layout_destroy(l);
	return ret;
}

static int run_retry(const struct rt_env *env)
{
	int ready[2], stop[2], ok = 0;
	pid_t prod = -1, cons[2] = { -1, -1 };
	double t0 = rt_now();
	char c;

	if (pipe(ready) || pipe(stop))
		goto out;
	fflush(NULL);
	prod = fork();
	if (prod == 0) {
		close(ready[0]);
		close(stop[1]);
		RT_EXIT(retry_producer(env, ready[1], stop[0]));
	}
	close(stop[0]);
	if (prod < 0 || read(ready[0], &c, 1) != 1)
		goto out;
	cons[0] = fork();
	if (cons[0] == 0)
		RT_EXIT(retry_consumer(env, RETRY_A, ready[1]));
	if (cons[0] < 0 || read(ready[0], &c, 1) != 1)
		goto out;
	cons[1] = fork();
	if (cons[1] == 0)
		RT_EXIT(retry_consumer(env, RETRY_B, -1));
	ok = cons[1] > 0 && !rt_wait(cons, 2, rt_now() + 40, "consumers");
out:
	close(ready[0]);
	close(ready[1]);
	if (write(stop[1], "s", 1) != 1)
		ok = 0;
	close(stop[1]);
	if (prod > 0 && rt_wait(&prod, 1, rt_now() + 30, "producer"))
		ok = 0;
	printf("%s a refused handshake retried while asleep (%.2f s)\n",
	       ok ? "ok  " : "FAIL", rt_now() - t0);
	return ok;
}

int main(void)
{
	static struct rt_req rq[RT_MAX_REQ];
	struct rt_env env;
	pid_t prod[1], cons[1];
	int ready[2], ok = 0, ok2;
	double t0;
	char c;

	rt_require_device();
	rt_env_init(&env, 19700);
	if (!env.addr0) {
		printf("KVP_ADDR0 is not set (run under scripts/rxe-vm.sh)\n");
		printf("0 passed, 1 failed\n");
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	t0 = rt_now();
	if (rt_make_requests(&sc, rq) || pipe(ready))
		goto out;
	fflush(NULL);
	prod[0] = fork();
	if (prod[0] == 0) {
		close(ready[0]);
		RT_EXIT(sleepy_producer(&env, rq, ready[1]));
	}
	close(ready[1]);
	if (read(ready[0], &c, 1) != 1)
		goto out;
	cons[0] = fork();
	if (cons[0] == 0)
		RT_EXIT(sleepy_consumer(&env, rq));
	ok = !rt_wait(cons, 1, rt_now() + 70, "consumer");
	if (rt_wait(prod, 1, rt_now() + 30, "producer"))
		ok = 0;
out:
	printf("%s %s (%.2f s)\n", ok ? "ok  " : "FAIL", sc.name, rt_now() - t0);
	ok2 = run_retry(&env);
	printf("%d passed, %d failed\n", ok + ok2, !ok + !ok2);
	return ok && ok2 ? 0 : 1;
}
