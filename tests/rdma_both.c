// SPDX-License-Identifier: MIT
/*
 * An agent that is producer and consumer at once (KVP_ROLE_BOTH), over
 * real verbs (soft-RoCE in the VM): a decode engine M that pulls its
 * requests from a prefill engine P and, with the same agent and one
 * registration of its memory, serves blocks of its own cache to another
 * decode engine C (a prefix cache shared between decode engines).
 *
 *   P (producer) --READ--> M (ROLE_BOTH) --READ--> C (consumer)
 *
 * M's memory is registered once, before it listens and adds P; a second
 * registration is refused (-EBUSY). Checked byte for byte: M's whole memory
 * (the blocks pulled from P hold P's identity patterns, the blocks C reads
 * are untouched) and C's whole memory.
 *
 *   rdma_both
 *
 * Needs KVP_ADDR0, as set by scripts/rxe-vm.sh. Exits 77 without an RDMA
 * device.
 */
#include "rdma/harness.h"

#define C_ENGINE 0x43324332ull
#define C_REQ 2
#define PORT_M 60 /* M listens at env.port + PORT_M */

/* P -> M: the harness's case (P is rt_producer(), M pulls rq[]). */
static const struct rt_case tc = {
	.name = "both", .model = "llama-3.1-8b", .layers = 2, .P = 1, .D = 1,
	.pblock = 16, .dblock = 16, .playout = KVP_KV_FLASH_NHD,
	.dlayout = KVP_KV_FLASH_HND, .pblocks = 48, .dblocks = 48, .nreq = 4,
	.tokens = 120, .kill_rank = -1,
};

static struct rt_env env;
static struct rt_req rq[RT_MAX_REQ];

/* M -> C: C's requests read blocks of M that rq[] does not write. */
static uint32_t c_rid[C_REQ][8], c_lid[C_REQ][8];
static struct kvp_ids c_ids[C_REQ];

static kvp_layout *layout_c(void)
{
	return rt_layout_engine(&tc, 0, 0, C_ENGINE);
}

static int make_c_requests(void)
{
	uint8_t used[64] = { 0 };
	uint32_t i, k, b = 0, nb = (tc.tokens + tc.dblock - 1) / tc.dblock;

	for (i = 0; i < tc.nreq; i++)
		for (k = 0; k < rq[i].ids[0].nlocal; k++)
			used[rq[i].lid[0][k]] = 1;
	for (i = 0; i < C_REQ; i++) {
		for (k = 0; k < nb; k++) {
			while (b < tc.dblocks && used[b])
				b++;
			if (b == tc.dblocks)
				return -1;
			c_rid[i][k] = b++;
			c_lid[i][k] = 40 - (i * nb + k);
		}
		c_ids[i].remote = c_rid[i];
		c_ids[i].local = c_lid[i];
		c_ids[i].nremote = c_ids[i].nlocal = nb;
		c_ids[i].tokens = tc.tokens;
	}
	return 0;
}

/* Polls until ENGINE_UP for handle h (or fails on ENGINE_DOWN). */
static int wait_up(kvp_agent *a, uint32_t h, const char *who)
{
	struct kvp_event ev[8];
	double end = rt_now() + 30;
	int n, i;

	while (rt_now() < end) {
		n = kvp_agent_poll(a, ev, 8);
		if (n < 0)
			return n;
		for (i = 0; i < n; i++) {
			if (ev[i].engine != h)
				continue;
			if (ev[i].type == KVP_EV_ENGINE_UP)
				return 0;
			if (ev[i].type == KVP_EV_ENGINE_DOWN) {
				fprintf(stderr, "  [%s] engine down: %s\n", who,
					kvp_strerror(ev[i].status));
				return ev[i].status;
			}
		}
		if (!n)
			usleep(100);
	}
	return -ETIMEDOUT;
}

/* The engine calls' errors on an engine that is up, then its removal
 * with pulls in flight: each pull is reported once, FAILED with its ids:
 * -ECANCELED, or -ESTALE (KVP_REASON_LEASE) when its lease READ came back
 * before the removal (the producer expects none of them: never DONE);
 * the handle is gone at once; no event of the engine itself follows. */
static int engine_calls(kvp_agent *a, uint32_t h, const struct rt_req *r,
			const char *who)
{
	struct kvp_peer bad = { .addr = "not-an-address", .port = 1 };
	struct kvp_engine_info ei;
	struct kvp_event ev[16];
	uint32_t i, k, got = 0, cancelled = 0, h2;
	uint8_t seen[RT_MAX_REQ] = { 0 };
	double end = rt_now() + 30;
	int n;

	if (kvp_agent_add_engine(a, &bad, 0, 1000, &h2) != -EINVAL ||
	    kvp_agent_add_engine(a, &bad, 1, 1000, &h2) != -EINVAL ||
	    kvp_agent_add_engine(a, &bad, 1, 0, &h2) != -EINVAL)
		RT_FAIL("add_engine with bad ranks was not -EINVAL");
	if (kvp_agent_reconnect_engine(a, h, NULL, 0, 1000) != -EBUSY)
		RT_FAIL("reconnect of an engine up was not -EBUSY");
	if (kvp_agent_pull_from(a, h ^ 0x10000u, 1, r[0].ids) != -ENOENT ||
	    kvp_agent_engine_info(a, 0, &ei) != -ENOENT ||
	    kvp_agent_remove_engine(a, h + 1) != -ENOENT)
		RT_FAIL("a stale or unknown handle was not -ENOENT");
	if (kvp_agent_engine_info(a, h, &ei) || ei.state != KVP_ENGINE_UP ||
	    ei.pulls != tc.nreq || ei.done != tc.nreq || !ei.plan)
		RT_FAIL("engine info: state %u pulls %llu done %llu",
			ei.state, (unsigned long long)ei.pulls,
			(unsigned long long)ei.done);
	for (i = 0; i < tc.nreq; i++)
		if (kvp_agent_pull_from(a, h, 3000 + i, r[i].ids))
			RT_FAIL("pull %u before the removal", i);
	if (kvp_agent_remove_engine(a, h))
		RT_FAIL("remove");
	if (kvp_agent_pull_from(a, h, 3100, r[0].ids) != -ENOENT ||
	    kvp_agent_engine_info(a, h, &ei) != -ENOENT)
		RT_FAIL("the handle outlived its removal");
	while (got < tc.nreq || rt_now() < end - 29) {
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (k = 0; k < (uint32_t)n; k++) {
			uint32_t j = (uint32_t)(ev[k].req_id - 3000);

			if (ev[k].type == KVP_EV_RELEASED ||
			    ev[k].type == KVP_EV_DISCONNECTED)
				continue; /* the producer side, C's rank */
			if ((ev[k].type != KVP_EV_DONE &&
			     ev[k].type != KVP_EV_FAILED) ||
			    j >= tc.nreq || seen[j]++)
				RT_FAIL("event %u for %llu after the removal",
					ev[k].type,
					(unsigned long long)ev[k].req_id);
			got++;
			if (ev[k].type == KVP_EV_DONE)
				RT_FAIL("DONE %llu: the producer never held it",
					(unsigned long long)ev[k].req_id);
			cancelled += ev[k].status == -ECANCELED;
			if ((ev[k].status != -ECANCELED &&
			     (ev[k].status != -ESTALE ||
			      ev[k].reason != KVP_REASON_LEASE)) ||
			    !ev[k].ids ||
			    ev[k].ids[0].nlocal != r[j].ids[0].nlocal ||
			    memcmp(ev[k].ids[0].local, r[j].ids[0].local,
				   r[j].ids[0].nlocal * sizeof(uint32_t)))
				RT_FAIL("FAILED %llu: %s, or not its ids",
					(unsigned long long)ev[k].req_id,
					kvp_strerror(ev[k].status));
		}
		if (rt_now() > end)
			RT_FAIL("%u of %u pulls reported after the removal",
				got, tc.nreq);
		if (!n)
			usleep(100);
	}
	printf("    engine removed with %u pulls in flight: %u FAILED "
	       "-ECANCELED, %u FAILED -ESTALE (never expected), all with "
	       "their ids\n", tc.nreq, cancelled, got - cancelled);
	return 0;
out:
	return -1;
}

/* M: serves C and pulls from P with one agent, one registration. */
static int run_m(int ready_fd)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 }, exp = { 0 };
	struct kvp_agent_stats st;
	struct kvp_peer peer = { 0 };
	struct kvp_event ev[16];
	kvp_layout *l = rt_layout(&tc, 0, 0), *p0 = rt_layout(&tc, 1, 0);
	kvp_agent *a = NULL;
	uint32_t i, h, done = 0, released = 0;
	const char *who = "M (both)";
	double end = rt_now() + 60;
	int ret = 1, err, n;

	alarm(90);
	if (!l || !p0 || kvt_mem_alloc(l, &mem) || kvt_mem_alloc(l, &exp))
		RT_FAIL("layout or memory");
	kvt_fill_background(&mem, 5);
	for (i = 0; i < C_REQ; i++)
		kvt_fill_producer(l, &mem, &c_ids[i]);
	for (i = 0; i < mem.nregions; i++)
		memcpy(exp.buf[i], mem.buf[i], mem.size[i]);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_BOTH;
	at.layout = l;
	at.addr = env.addr0;
	at.max_ids = 16;
	at.max_inflight = 16;
	err = kvp_agent_open(&at, &a);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	err = rt_register_all(a, &mem);
	if (err)
		RT_FAIL("register: %s", kvp_strerror(err));
	err = kvp_agent_listen(a, env.addr0, (uint16_t)(env.port + PORT_M));
	if (err)
		RT_FAIL("listen: %s", kvp_strerror(err));
	/* One registration serves both sides: a region registered again is
	 * refused. */
	if (kvp_agent_register(a, 0, mem.buf[0], mem.size[0]) != -EINVAL ||
	    kvp_agent_register(a, 0, mem.buf[0] + 1, mem.size[0]) != -EINVAL)
		RT_FAIL("a region registered twice");
	for (i = 0; i < C_REQ; i++) {
		err = kvp_agent_expect(a, C_ENGINE, 700 + i,
				       rt_now_ns() + 60000000000ull);
		if (err)
			RT_FAIL("expect: %s", kvp_strerror(err));
	}
	if (write(ready_fd, "r", 1) != 1)
		RT_FAIL("ready pipe");
	peer.addr = env.addr0;
	peer.port = env.port;
	err = kvp_agent_add_engine(a, &peer, 1, 30000, &h);
	if (err)
		RT_FAIL("add engine: %s", kvp_strerror(err));
	err = wait_up(a, h, who);
	if (err)
		RT_FAIL("engine P: %s", kvp_strerror(err));
	for (i = 0; i < tc.nreq; i++) {
		err = kvp_agent_pull_from(a, h, rq[i].id, rq[i].ids);
		if (err)
			RT_FAIL("pull %u: %s", i, kvp_strerror(err));
	}
	while (done < tc.nreq || released < C_REQ) {
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_DONE && ev[i].engine == h)
				done++;
			else if (ev[i].type == KVP_EV_RELEASED &&
				 ev[i].engine_id == C_ENGINE)
				released++;
			else if (ev[i].type != KVP_EV_DISCONNECTED)
				RT_FAIL("event %u (%s) for %llu", ev[i].type,
					kvp_strerror(ev[i].status),
					(unsigned long long)ev[i].req_id);
		}
		if (rt_now() > end)
			RT_FAIL("timeout: %u done, %u released", done,
				released);
		if (!n)
			usleep(50);
	}
	kvp_agent_get_stats(a, &st);
	if (st.pulls != tc.nreq || st.done != tc.nreq ||
	    st.released != C_REQ)
		RT_FAIL("stats: %llu pulls %llu done %llu released",
			(unsigned long long)st.pulls,
			(unsigned long long)st.done,
			(unsigned long long)st.released);
	for (i = 0; i < tc.nreq; i++)
		kvt_expect_consumer(l, p0, &exp, NULL, rq[i].ids);
	if (kvt_mem_compare(&mem, &exp, who))
		RT_FAIL("M's memory differs from the expectation");
	if (engine_calls(a, h, rq, who))
		goto out;
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvp_layout_destroy(l);
	kvp_layout_destroy(p0);
	return ret;
}

/* C: a plain consumer of M. */
static int run_c(void)
{
	struct kvp_agent_attr at;
	struct kvt_mem mem = { 0 }, exp = { 0 };
	struct kvp_peer peer = { 0 };
	struct kvp_event ev[16];
	kvp_layout *l = layout_c(), *m0 = rt_layout(&tc, 0, 0);
	kvp_agent *a = NULL;
	uint32_t i, h, done = 0;
	const char *who = "C";
	double end = rt_now() + 60;
	int ret = 1, err, n;

	alarm(90);
	if (!l || !m0 || kvt_mem_alloc(l, &mem) || kvt_mem_alloc(l, &exp))
		RT_FAIL("layout or memory");
	kvt_fill_background(&mem, 9);
	for (i = 0; i < mem.nregions; i++)
		memcpy(exp.buf[i], mem.buf[i], mem.size[i]);
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = env.addr0;
	at.max_ids = 16;
	err = kvp_agent_open(&at, &a);
	if (!err)
		err = rt_register_all(a, &mem);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	peer.addr = env.addr0;
	peer.port = (uint16_t)(env.port + PORT_M);
	err = kvp_agent_add_engine(a, &peer, 1, 30000, &h);
	if (!err)
		err = wait_up(a, h, who);
	if (err)
		RT_FAIL("engine M: %s", kvp_strerror(err));
	for (i = 0; i < C_REQ; i++) {
		err = kvp_agent_pull_from(a, h, 700 + i, &c_ids[i]);
		if (err)
			RT_FAIL("pull %u: %s", i, kvp_strerror(err));
	}
	while (done < C_REQ) {
		n = kvp_agent_poll(a, ev, 16);
		if (n < 0)
			RT_FAIL("poll: %s", kvp_strerror(n));
		for (i = 0; i < (uint32_t)n; i++) {
			if (ev[i].type == KVP_EV_DONE)
				done++;
			else
				RT_FAIL("event %u (%s)", ev[i].type,
					kvp_strerror(ev[i].status));
		}
		if (rt_now() > end)
			RT_FAIL("timeout: %u done", done);
		if (!n)
			usleep(50);
	}
	for (i = 0; i < C_REQ; i++)
		kvt_expect_consumer(l, m0, &exp, NULL, &c_ids[i]);
	if (kvt_mem_compare(&mem, &exp, who))
		RT_FAIL("C's memory differs from the expectation");
	ret = 0;
out:
	kvp_agent_close(a);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvp_layout_destroy(l);
	kvp_layout_destroy(m0);
	return ret;
}

int main(void)
{
	int ready[2] = { -1, -1 }, stop[2] = { -1, -1 }, mready[2] = { -1, -1 };
	pid_t p = -1, m = -1, c = -1;
	uint32_t pass = 0, fail = 0;
	double t0 = rt_now();
	char ch;
	int ok = 0;

	if (rt_start(&env, 19800))
		return 1;
	if (rt_make_requests(&tc, rq) || make_c_requests() || pipe(ready) ||
	    pipe(stop) || pipe(mready)) {
		fprintf(stderr, "  set-up failed\n");
		goto out;
	}
	fflush(NULL);
	p = fork();
	if (p == 0) {
		close(ready[0]);
		close(stop[1]);
		_exit(rt_producer(&tc, &env, rq, 0, ready[1], stop[0]));
	}
	close(ready[1]);
	close(stop[0]);
	if (p < 0 || read(ready[0], &ch, 1) != 1)
		goto out;
	m = fork();
	if (m == 0) {
		close(mready[0]);
		_exit(run_m(mready[1]));
	}
	close(mready[1]);
	if (m < 0 || read(mready[0], &ch, 1) != 1)
		goto out;
	c = fork();
	if (c == 0)
		_exit(run_c());
	if (c < 0)
		goto out;
	ok = !rt_wait(&m, 1, rt_now() + 80, "M (both)");
	ok &= !rt_wait(&c, 1, rt_now() + (ok ? 80 : 1), "C");
	if (!ok)
		goto out;
	close(stop[1]);
	stop[1] = -1;
	ok = !rt_wait(&p, 1, rt_now() + 20, "P");
out:
	if (!ok) {
		pid_t all[3] = { p, m, c };

		rt_kill_all(all, 3);
		while (waitpid(-1, NULL, 0) > 0)
			;
	}
	rt_report("one agent both producer and consumer, one registration",
		  ok, t0, &pass, &fail);
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
