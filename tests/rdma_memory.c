// SPDX-License-Identifier: MIT
/*
 * What a consumer agent allocates besides the KV cache, against max_ids and
 * against the WR/SGE rings the transport used to size at connect.
 *
 * Before windowed emission, a consumer agent kept a ring of two requests'
 * worth of kvp_wr and kvp_sge at the emission bound (kvp_plan_emit_bound()
 * at max_ids): for llama-3.1-70b, producer TP 8 -> consumer TP 2, NHD
 * (a piece per token), that is hundreds of MB, linear in max_ids. Now the
 * READs are emitted in windows of the send queue's free room: what grows
 * with max_ids is only the request slots' copies of their ids. This test
 * opens a consumer agent (rank 0 of TP 2) at max_ids 256 and 8192 and
 * checks, from kvp_agent_stats.mem_bytes:
 *  - the growth between the two is exactly the ids' copies
 *    (max_inflight x groups x 2 lists x 7936 ids x 4 bytes);
 *  - the rest is the same at both and bounded by the queue depths
 *    (independent of max_ids and of the plan);
 * and prints the old rings' size for the same pair at both max_ids. Needs
 * an RDMA device only to open the agent (no peer, no memory registered).
 */
#include "rdma/harness.h"

#define INFLIGHT 64
#define SQ 512
#define SGE 4

static kvp_layout *build70(uint32_t tp, uint32_t rank, uint64_t id)
{
	struct kvp_engine_desc e;
	struct kvp_model m;
	kvp_layout *l = NULL;

	if (kvp_model_preset("llama-3.1-70b", &m))
		return NULL;
	memset(&e, 0, sizeof(e));
	e.engine_id = id;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = 16;
	e.num_blocks = 16384;
	e.kv_layout = KVP_KV_FLASH_NHD;
	if (kvp_layout_build(&m, &e, &l))
		return NULL;
	return l;
}

/* The old transport's rings for max_ids: 2 x the emission bound. */
static uint64_t old_rings(const kvp_plan *p, uint32_t max_ids)
{
	uint32_t w, s;

	kvp_plan_emit_bound(p, max_ids, &w, &s);
	return 2ull * w * sizeof(struct kvp_wr) + 2ull * s * sizeof(struct kvp_sge);
}

static int agent_mem(const kvp_layout *l, const char *addr, uint32_t max_ids,
		     uint64_t *mem)
{
	struct kvp_agent_attr at;
	struct kvp_agent_stats st;
	kvp_agent *a = NULL;
	int err;

	memset(&at, 0, sizeof(at));
	at.role = KVP_ROLE_CONSUMER;
	at.layout = l;
	at.addr = addr;
	at.max_ids = max_ids;
	at.max_inflight = INFLIGHT;
	at.sq_depth = SQ;
	at.max_sge = SGE;
	err = kvp_agent_open(&at, &a);
	if (err)
		return err;
	kvp_agent_get_stats(a, &st);
	*mem = st.mem_bytes;
	kvp_agent_close(a);
	return 0;
}

int main(void)
{
	struct rt_env env;
	struct kvp_plan_attr pa = { .max_sge = SGE };
	struct kvp_layout_info li;
	kvp_layout *d = NULL, *p = NULL;
	kvp_plan *plan = NULL;
	uint64_t m256 = 0, m8k = 0, grow;
	uint32_t pass = 0, fail = 0;
	const char *who = "memory";
	double t0 = rt_now();
	int ok = 0, err;

	if (rt_start(&env, 19700))
		return 1;
	d = build70(2, 0, RT_CONS_ENGINE);
	p = build70(8, 0, RT_PROD_ENGINE);
	if (!d || !p || kvp_plan_compile(d, p, &pa, &plan, NULL, 0))
		RT_FAIL("layouts or plan");
	kvp_layout_get_info(d, &li);
	err = agent_mem(d, env.addr0, 256, &m256);
	if (!err)
		err = agent_mem(d, env.addr0, 8192, &m8k);
	if (err)
		RT_FAIL("open: %s", kvp_strerror(err));
	grow = (uint64_t)INFLIGHT * li.ngroups * 2 * (8192 - 256) *
	       sizeof(uint32_t);
	printf("  llama-3.1-70b TP 8 -> 2 NHD, max_inflight %u, sq_depth %u, "
	       "max_sge %u:\n", INFLIGHT, SQ, SGE);
	printf("  max_ids  256: agent %.2f MiB; the old WR+SGE rings alone "
	       "%.1f MiB\n", m256 / 1048576.0, old_rings(plan, 256) / 1048576.0);
	printf("  max_ids 8192: agent %.2f MiB; the old WR+SGE rings alone "
	       "%.1f MiB\n", m8k / 1048576.0, old_rings(plan, 8192) / 1048576.0);
	printf("  growth %.2f MiB = the request slots' id copies (%u x %u "
	       "groups x 2 x 7936 ids x 4 B); the rest, %.2f MiB, does not "
	       "depend on max_ids\n", (m8k - m256) / 1048576.0, INFLIGHT,
	       li.ngroups, (m256 - (uint64_t)INFLIGHT * li.ngroups * 2 * 256 *
					   sizeof(uint32_t)) / 1048576.0);
	if (m8k - m256 != grow)
		RT_FAIL("memory grew by %llu bytes, the ids account for %llu",
			(unsigned long long)(m8k - m256),
			(unsigned long long)grow);
	/* Bounded by the queue depths: far below one old ring at 256. */
	if (m256 >= old_rings(plan, 256) / 16)
		RT_FAIL("agent memory %llu not far below the old rings",
			(unsigned long long)m256);
	ok = 1;
out:
	rt_report("consumer agent memory against max_ids (llama-3.1-70b 8->2)",
		  ok, t0, &pass, &fail);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(d);
	kvp_layout_destroy(p);
	printf("%u passed, %u failed\n", pass, fail);
	return fail ? 1 : 0;
}
