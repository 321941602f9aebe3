// SPDX-License-Identifier: MIT
/*
 * bench_pull.c: the C side of python/bench_pull.py, built by the Makefile
 * into $(BUILD)/tools/libkvpull_pullbench.so and loaded with ctypes.
 *
 * kvpb_time_pulls() times n calls of kvp_agent_pull() made from C on an
 * agent the Python binding opened (its handle passed as an integer), each
 * call alone between two clock_gettime(CLOCK_MONOTONIC) readings; the work
 * around each call (the producer's kvp_agent_expect(), then polling both
 * agents until the consumer's DONE and the producer's RELEASED) is not
 * timed. kvpb_before() and kvpb_after() are that untimed work alone, for
 * the Python loop, so that both loops leave the agents in the same state
 * between calls.
 *
 * The library's functions come in as pointers (struct kvpb_ctx), not by
 * linking: ctypes loads libkvpull without RTLD_GLOBAL, and on the host the
 * same loops run against the stubs below instead (kvpb_stub_pull() and
 * kvpb_stub_poll(): the cost of a pull call minus the library), with the
 * binding's own code in front of them on the Python side.
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "kvpull.h"

#define KVPB_API __attribute__((visibility("default")))
#define KVPB_POLL_BATCH 16

typedef int (*kvpb_pull_fn)(kvp_agent *agent, uint64_t req_id,
			    const struct kvp_ids *ids);
typedef int (*kvpb_poll_fn)(kvp_agent *agent, struct kvp_event *ev, int max);
typedef int (*kvpb_expect_fn)(kvp_agent *agent, uint64_t consumer_engine,
			      uint64_t req_id, uint64_t deadline_ns);

/* What the loops call, and on what (filled in by bench_pull.py). */
struct kvpb_ctx {
	kvp_agent *cons;	/* the pulling agent */
	kvp_agent *prod;	/* NULL: no expect, no RELEASED to wait for */
	kvpb_pull_fn pull;	/* kvp_agent_pull or kvpb_stub_pull */
	kvpb_poll_fn poll;	/* kvp_agent_poll or kvpb_stub_poll */
	kvpb_expect_fn expect;	/* kvp_agent_expect (with prod) */
	uint64_t cons_engine;	/* the consumer's engine id, for expect */
	uint64_t timeout_ns;	/* bound on each kvpb_after() */
};

KVPB_API int kvpb_before(const struct kvpb_ctx *c, uint64_t req_id);
KVPB_API int kvpb_after(const struct kvpb_ctx *c, uint64_t req_id);
KVPB_API int kvpb_time_pulls(const struct kvpb_ctx *c, uint64_t req_id,
			     const struct kvp_ids *ids, uint32_t n,
			     uint64_t *ns);
KVPB_API void kvpb_stub_config(uint32_t ngroups, uint32_t max_ids,
			       uint32_t num_blocks);
KVPB_API int kvpb_stub_pull(kvp_agent *agent, uint64_t req_id,
			    const struct kvp_ids *ids);
KVPB_API int kvpb_stub_poll(kvp_agent *agent, struct kvp_event *ev, int max);

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Untimed, before a pull: the producer expects the request (a minute). */
int kvpb_before(const struct kvpb_ctx *c, uint64_t req_id)
{
	if (!c->prod)
		return 0;
	return c->expect(c->prod, c->cons_engine, req_id,
			 now_ns() + 60000000000ull);
}

/* Untimed, after a pull: poll both agents until the consumer reported
 * req_id (DONE; FAILED is -EIO) and the producer released it. */
int kvpb_after(const struct kvpb_ctx *c, uint64_t req_id)
{
	struct kvp_event ev[KVPB_POLL_BATCH];
	uint64_t end = now_ns() + c->timeout_ns;
	int done = 0, released = !c->prod, n, i;

	while (!done || !released) {
		n = c->poll(c->cons, ev, KVPB_POLL_BATCH);
		if (n < 0)
			return n;
		for (i = 0; i < n; i++) {
			if (ev[i].req_id != req_id)
				continue;
			if (ev[i].type == KVP_EV_FAILED)
				return -EIO;
			if (ev[i].type == KVP_EV_DONE)
				done = 1;
		}
		if (c->prod) {
			n = c->poll(c->prod, ev, KVPB_POLL_BATCH);
			if (n < 0)
				return n;
			for (i = 0; i < n; i++) {
				if (ev[i].req_id != req_id)
					continue;
				if (ev[i].type == KVP_EV_EXPIRED)
					return -ETIMEDOUT;
				if (ev[i].type == KVP_EV_RELEASED)
					released = 1;
			}
		}
		if ((!done || !released) && now_ns() > end)
			return -ETIMEDOUT;
	}
	return 0;
}

/* n pulls, requests req_id .. req_id + n - 1, each timed alone into ns[]. */
int kvpb_time_pulls(const struct kvpb_ctx *c, uint64_t req_id,
		    const struct kvp_ids *ids, uint32_t n, uint64_t *ns)
{
	uint64_t t0, t1;
	uint32_t i;
	int err;

	for (i = 0; i < n; i++) {
		err = kvpb_before(c, req_id + i);
		if (err)
			return err;
		t0 = now_ns();
		err = c->pull(c->cons, req_id + i, ids);
		t1 = now_ns();
		if (err)
			return err;
		ns[i] = t1 - t0;
		err = kvpb_after(c, req_id + i);
		if (err)
			return err;
	}
	return 0;
}

/* ---- the host's stand-in for kvp_agent_pull() and kvp_agent_poll() ----
 * What the real pull does with the ids before it posts anything: check
 * each group's lists against max_ids and every id against the region's
 * blocks, and copy the local lists into a request slot. The poll reports
 * the last pull DONE. Single-threaded, as the benchmark is. */
static uint32_t stub_ngroups = 1, stub_max_ids = 256, stub_blocks = 1024;
static uint32_t stub_slot[4096];
static uint64_t stub_req;
static int stub_pending;

void kvpb_stub_config(uint32_t ngroups, uint32_t max_ids, uint32_t num_blocks)
{
	stub_ngroups = ngroups;
	stub_max_ids = max_ids;
	stub_blocks = num_blocks;
}

int kvpb_stub_pull(kvp_agent *agent, uint64_t req_id,
		   const struct kvp_ids *ids)
{
	uint32_t g, i, used = 0, bad = 0;

	if (!agent || !ids)
		return -EINVAL;
	for (g = 0; g < stub_ngroups; g++) {
		const struct kvp_ids *e = &ids[g];

		if (e->nlocal > stub_max_ids || e->nremote > stub_max_ids ||
		    used + e->nlocal > sizeof(stub_slot) / sizeof(stub_slot[0]))
			return -EINVAL;
		for (i = 0; i < e->nlocal; i++)
			bad |= e->local[i] >= stub_blocks;
		for (i = 0; i < e->nremote; i++)
			bad |= e->remote[i] >= stub_blocks;
		if (bad)
			return -ERANGE;
		memcpy(stub_slot + used, e->local,
		       e->nlocal * sizeof(stub_slot[0]));
		used += e->nlocal;
	}
	stub_req = req_id;
	stub_pending = 1;
	return 0;
}

int kvpb_stub_poll(kvp_agent *agent, struct kvp_event *ev, int max)
{
	if (!agent || max < 0)
		return -EINVAL;
	if (!stub_pending || !max)
		return 0;
	memset(ev, 0, sizeof(*ev));
	ev->type = KVP_EV_DONE;
	ev->req_id = stub_req;
	stub_pending = 0;
	return 1;
}
