// SPDX-License-Identifier: MIT
/*
 * A plan dump with default options shows the READs the agent posts. For
 * the engines of kvpull-plan's and kvpull-demo's defaults (FLASH_HND,
 * 16-token blocks; llama-3.1-8b cut to 2 layers, 64 blocks per region,
 * producer TP 2 -> consumer TP 1) and three requests of known ids, a
 * consumer agent opened with default attributes reports in each DONE
 * event (kvp_event.reads, .bytes) exactly:
 *   - the READs and bytes that
 *       kvpull-plan --model llama-3.1-8b --layers 2 --remote-tp 2 \
 *           --num-blocks 64 --remote-ids R --local-ids L [--tokens T]
 *     prints ("total: N READs ..., B bytes"): the same numbers are pinned
 *     in tests/test_tool.sh (dump_a, dump_b, dump_c) and here;
 *   - what kvp_plan_emit() writes for the request from a plan compiled
 *     the way kvpull-plan compiles it (tools/lib/defaults.h:
 *     tool_plan_attr() with no --max-sge, no --max-read), and from the
 *     agent's own plan (kvp_agent_plan(), whose max_sge must be the
 *     default: soft-RoCE allows 32 SGEs per READ, and its 8 MiB
 *     max_msg_sz is above every READ here, 256 KiB at most).
 * The producer ranks' layouts, fetched from the agent
 * (kvp_agent_engine_layout()), match what each rank built (compat hash),
 * and a plan compiled from rank 0's emits the same READs.
 * Every byte is then checked against the producers' patterns.
 *
 *   rdma_dump
 */
#include "rdma/harness.h"

#include "../tools/lib/defaults.h"

#define NREQ 3

static const struct rt_case dc = {
	.name = "default dump = DONE events", /* "who" holds 32 */
	.model = "llama-3.1-8b", .layers = 2, .P = 2, .D = 1,
	.pblock = TOOL_DEFAULT_BLOCK_TOKENS, .dblock = TOOL_DEFAULT_BLOCK_TOKENS,
	.playout = TOOL_DEFAULT_KV_LAYOUT, .dlayout = TOOL_DEFAULT_KV_LAYOUT,
	.pblocks = 64, .dblocks = 64, .nreq = NREQ, .kill_rank = -1,
};

/* The requests, as kvpull-plan's options spell them, and what it prints
 * for them with default options (tests/test_tool.sh pins the same). */
static const struct {
	const char *remote, *local;
	uint64_t tokens;
	uint32_t reads;
	uint64_t bytes;
} want[NREQ] = {
	{ "0-19", "10-17,30,32-39,50-52", 0, 16, 2621440 }, /* dump_a */
	{ "20-29", "40-47", 150, 8, 1048576 },		    /* dump_b */
	{ "30-39", "0-9", 0, 8, 1310720 },		    /* dump_c */
};

/* "a,b-c" into v[]; returns the count. The lists above are well formed. */
static uint32_t ids_of(const char *s, uint32_t *v)
{
	uint32_t n = 0;
	char *end;

	while (*s) {
		unsigned long a = strtoul(s, &end, 10), b = a;

		if (*end == '-')
			b = strtoul(end + 1, &end, 10);
		while (a <= b && n < RT_MAX_IDS)
			v[n++] = (uint32_t)a++;
		s = *end ? end + 1 : end;
	}
	return n;
}

static void make_requests(struct rt_req *rq)
{
	uint32_t i;

	memset(rq, 0, NREQ * sizeof(*rq));
	for (i = 0; i < NREQ; i++) {
		struct kvp_ids *id = &rq[i].ids[0];

		rq[i].id = 1000 + i; /* as rt_producer() expects */
		id->nremote = ids_of(want[i].remote, rq[i].rid[0]);
		id->nlocal = ids_of(want[i].local, rq[i].lid[0]);
		id->remote = rq[i].rid[0];
		id->local = rq[i].lid[0];
		id->tokens = want[i].tokens;
	}
}

/* The READs and bytes kvp_plan_emit() writes for ids; -1 on error. */
static int emit_count(const kvp_plan *plan, const struct kvp_ids *ids,
		      uint64_t *bytes)
{
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	uint32_t mw, ms;
	int n, i;

	kvp_plan_emit_bound(plan, RT_MAX_IDS, &mw, &ms);
	wr = calloc(mw ? mw : 1, sizeof(*wr));
	sge = calloc(ms ? ms : 1, sizeof(*sge));
	n = wr && sge ? kvp_plan_emit(plan, ids, wr, mw, sge, ms, NULL) : -1;
	for (i = 0, *bytes = 0; i < n; i++)
		*bytes += wr[i].len;
	free(wr);
	free(sge);
	return n < 0 ? -1 : n;
}

static int dump_consumer(const struct rt_env *env, const struct rt_req *rq)
{
	struct kvp_peer peers[2] = { { 0 } };
	struct kvp_agent_attr at;
	struct kvp_plan_attr pa;
	struct kvp_plan_info pi, ri;
	struct kvt_mem mem = { 0 }, exp = { 0 };
	struct kvp_event ev[16];
	kvp_layout *l = rt_layout(&dc, 0, 0), *r0 = rt_layout(&dc, 1, 0);
	kvp_plan *ref = NULL, *fromagent = NULL;
	const kvp_plan *ap;
	kvp_agent *a = NULL;
	uint32_t i, k, r, dev;
	uint64_t b1, b2;
	double end;
	const char *who = "dump consumer";
	char msg[256] = "";
	int ret = 1, err, n1, n2, n, done;

	alarm(120);
	if (!l || !r0 || kvt_mem_alloc(l, &mem))
		RT_FAIL("layout or memory");
	kvt_fill_background(&mem, 5);
	if (kvt_mem_copy(&exp, &mem))
		RT_FAIL("memory");
	/* The plan kvpull-plan compiles with default options. */
	tool_plan_attr(&pa, 0, 0);
	err = kvp_plan_compile(l, r0, &pa, &ref, msg, sizeof(msg));
	if (err)
		RT_FAIL("default plan: %s: %s", kvp_strerror(err), msg);
	/* An agent with default attributes but for the layout and address. */
	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = env->addr0;
	err = kvp_agent_open(&at, &a);
	if (!err)
		err = rt_register_all(a, &mem);
	for (r = 0; r < dc.P; r++) {
		peers[r].addr = env->addr0;
		peers[r].port = (uint16_t)(env->port + r);
	}
	if (!err)
		err = kvp_agent_connect(a, peers, dc.P, 30000);
	if (err)
		RT_FAIL("setup: %s", kvp_strerror(err));
	ap = kvp_agent_plan(a);
	dev = rt_device_sge();
	kvp_plan_get_info(ap, &pi);
	kvp_plan_get_info(ref, &ri);
	if (!ap || dev < KVP_DEFAULT_MAX_SGE)
		RT_FAIL("no plan, or a device of %u SGEs per READ (the default "
			"is %u)", dev, KVP_DEFAULT_MAX_SGE);
	if (pi.max_sge != ri.max_sge || pi.nsrc != ri.nsrc ||
	    pi.nstreams != ri.nstreams || ri.max_len != KVP_DEFAULT_MAX_READ)
		RT_FAIL("agent plan: max_sge %u, %u sources, %u streams; "
			"default plan: max_sge %u, %u sources, %u streams, "
			"READ cap %u", pi.max_sge, pi.nsrc, pi.nstreams,
			ri.max_sge, ri.nsrc, ri.nstreams, ri.max_len);
	/* The producer ranks' layouts, from the agent (in-band metadata):
	 * what each rank built, and a plan compiled from rank 0's emits what
	 * the default plan emits. */
	for (r = 0; r < dc.P; r++) {
		kvp_layout *got = NULL, *built = rt_layout(&dc, 1, r);

		err = kvp_agent_engine_layout(a, 0, r, &got);
		if (err || !built ||
		    kvp_layout_compat_hash(got) != kvp_layout_compat_hash(built))
			RT_FAIL("rank %u's layout from the agent: %s", r,
				err ? kvp_strerror(err) : "differs");
		if (!r) {
			tool_plan_attr(&pa, 0, 0);
			err = kvp_plan_compile(l, got, &pa, &fromagent, msg,
					       sizeof(msg));
		}
		kvp_layout_destroy(got);
		kvp_layout_destroy(built);
		if (err)
			RT_FAIL("plan from the agent's layout: %s: %s",
				kvp_strerror(err), msg);
	}
	{
		kvp_layout *got = NULL;

		if (kvp_agent_engine_layout(a, 0, dc.P, &got) != -ERANGE ||
		    kvp_agent_engine_layout(a, 0x7777, 0, &got) != -ENOENT ||
		    got)
			RT_FAIL("kvp_agent_engine_layout(): a rank past the TP "
				"size or an unknown handle was not refused");
	}
	end = rt_now() + 60;
	for (i = 0; i < NREQ; i++) {
		const struct kvp_ids *ids = rq[i].ids;
		uint64_t b3 = 0;

		if (emit_count(fromagent, ids, &b3) != (int)want[i].reads ||
		    b3 != want[i].bytes)
			RT_FAIL("request %u: the plan from the agent's layout "
				"emits another READ list", i);

		b1 = b2 = 0;
		n1 = emit_count(ref, ids, &b1);
		n2 = emit_count(ap, ids, &b2);
		if (n1 != (int)want[i].reads || b1 != want[i].bytes ||
		    n2 != n1 || b2 != b1)
			RT_FAIL("request %u: kvpull-plan prints %u READs of %llu "
				"bytes; the default plan emits %d of %llu, the "
				"agent's plan %d of %llu", i, want[i].reads,
				(unsigned long long)want[i].bytes, n1,
				(unsigned long long)b1, n2,
				(unsigned long long)b2);
		err = kvp_agent_pull(a, rq[i].id, ids);
		if (err)
			RT_FAIL("pull %u: %s", i, kvp_strerror(err));
		for (done = 0; !done;) {
			n = kvp_agent_poll(a, ev, 16);
			if (n < 0)
				RT_FAIL("poll: %s", kvp_strerror(n));
			for (k = 0; k < (uint32_t)n; k++) {
				if (ev[k].type == KVP_EV_FAILED ||
				    ev[k].type == KVP_EV_DISCONNECTED ||
				    ev[k].type == KVP_EV_ENGINE_DOWN)
					RT_FAIL("request %u: event %u: %s", i,
						ev[k].type,
						kvp_strerror(ev[k].status));
				if (ev[k].type != KVP_EV_DONE)
					continue;
				if (ev[k].req_id != rq[i].id)
					RT_FAIL("DONE for %llu, pulled %llu",
						(unsigned long long)ev[k].req_id,
						(unsigned long long)rq[i].id);
				if (ev[k].reads != want[i].reads ||
				    ev[k].bytes != want[i].bytes)
					RT_FAIL("request %u (remote %s, local "
						"%s): DONE says %u READs of "
						"%llu bytes, kvpull-plan %u of "
						"%llu", i, want[i].remote,
						want[i].local, ev[k].reads,
						(unsigned long long)ev[k].bytes,
						want[i].reads,
						(unsigned long long)
							want[i].bytes);
				done = 1;
			}
			if (!done && rt_now() > end)
				RT_FAIL("request %u: no DONE in 60 s", i);
			if (!n)
				usleep(20);
		}
		snprintf(msg, sizeof(msg), " --tokens %llu",
			 (unsigned long long)want[i].tokens);
		printf("  request %u, --remote-ids %s --local-ids %s%s: DONE, "
		       "kvpull-plan and the default plan: %u READs, %llu "
		       "bytes\n", i, want[i].remote, want[i].local,
		       want[i].tokens ? msg : "", want[i].reads,
		       (unsigned long long)want[i].bytes);
	}
	for (i = 0; i < NREQ; i++)
		kvt_expect_consumer(l, r0, &exp, NULL, rq[i].ids);
	if (kvt_mem_compare(&mem, &exp, who))
		RT_FAIL("consumer memory differs from the expectation");
	ret = 0;
out:
	kvp_agent_close(a);
	kvp_plan_destroy(ref);
	kvp_plan_destroy(fromagent);
	kvt_mem_free(&mem);
	kvt_mem_free(&exp);
	kvp_layout_destroy(l);
	kvp_layout_destroy(r0);
	return ret;
}

int main(void)
{
	static struct rt_req rq[RT_MAX_REQ];
	struct rt_env env;
	pid_t prod[2] = { 0 }, cons[1] = { 0 };
	int ready[2] = { -1, -1 }, stop[2] = { -1, -1 }, ok = 0;
	uint32_t i, nready = 0, pass = 0, fail = 0;
	double t0, deadline;
	char c;

	if (rt_start(&env, 22600))
		return 1;
	t0 = rt_now();
	make_requests(rq);
	if (pipe(ready) || pipe(stop))
		goto out;
	fflush(NULL);
	for (i = 0; i < dc.P; i++) {
		prod[i] = fork();
		if (prod[i] == 0) {
			close(ready[0]);
			close(stop[1]);
			RT_EXIT(rt_producer(&dc, &env, rq, i, ready[1],
					    stop[0]));
		}
		if (prod[i] < 0)
			goto out;
	}
	close(ready[1]);
	ready[1] = -1;
	close(stop[0]);
	stop[0] = -1;
	deadline = rt_now() + 30;
	while (nready < dc.P && rt_now() < deadline) {
		struct pollfd p = { .fd = ready[0], .events = POLLIN };

		if (poll(&p, 1, 100) > 0) {
			if (read(ready[0], &c, 1) != 1)
				goto out; /* a producer died before it was ready */
			nready++;
		}
	}
	if (nready < dc.P)
		goto out;
	cons[0] = fork();
	if (cons[0] == 0) {
		close(stop[1]);
		RT_EXIT(dump_consumer(&env, rq));
	}
	ok = cons[0] > 0 && !rt_wait(cons, 1, rt_now() + 100, "consumer");
out:
	if (stop[1] >= 0)
		close(stop[1]); /* the producers stop serving */
	if (rt_wait(prod, dc.P, rt_now() + 30, "producer"))
		ok = 0;
	if (ready[0] >= 0)
		close(ready[0]);
	rt_report(dc.name, ok, t0, &pass, &fail);
	printf("%u passed, %u failed\n", pass, fail);
	return ok ? 0 : 1;
}
