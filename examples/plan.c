/* SPDX-License-Identifier: MIT */
/*
 * plan.c: planning only, no RDMA. Builds the layouts of two engines running
 * Llama-3.1-70B (a producer at TP 8, a consumer at TP 2), compiles the plan
 * of consumer rank 0, sizes the work request arrays with
 * kvp_plan_emit_bound(), emits one request and prints its READs.
 *
 *   cc -std=c11 -Iinclude -o plan examples/plan.c build/libkvpull.a \
 *      -lrdmacm -libverbs -lpthread
 *   ./plan [BLOCKS]
 *
 * Exit status 0, or 1 when a call fails (the reason is printed).
 */
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <kvpull.h>

#define MAX_SGE 16
#define SHOW_WRS 8

static int fail(const char *what, int err)
{
	fprintf(stderr, "plan: %s: %s\n", what, kvp_strerror(err));
	return 1;
}

int main(int argc, char **argv)
{
	struct kvp_model m;
	struct kvp_engine_desc prod, cons;
	struct kvp_plan_attr pattr;
	struct kvp_plan_info info;
	struct kvp_layout_info linfo;
	struct kvp_ids ids;
	kvp_layout *remote = NULL, *local = NULL;
	kvp_plan *plan = NULL;
	struct kvp_wr *wr = NULL;
	struct kvp_sge *sge = NULL;
	uint32_t *lids = NULL, *rids = NULL;
	uint32_t nblocks = 8, max_wrs, max_sges, i, nsge = 0;
	char why[256];
	int err, nwr, ret = 1;

	if (argc > 1) {
		nblocks = (uint32_t)strtoul(argv[1], NULL, 0);
		if (nblocks == 0 || nblocks > 4096) {
			fprintf(stderr, "usage: plan [BLOCKS (1..4096)]\n");
			return 2;
		}
	}

	/* Both engines' layouts: from a preset here; in a deployment the
	 * producer's comes from its metadata blob (kvp_meta_decode()). */
	err = kvp_model_preset("llama-3.1-70b", &m);
	if (err)
		return fail("kvp_model_preset", err);
	memset(&prod, 0, sizeof(prod));
	prod.engine_id = 1;
	prod.tp_size = 8;
	prod.tp_rank = 0; /* any producer rank's layout describes the engine */
	prod.block_tokens = 16;
	prod.num_blocks = 100000;
	prod.kv_layout = KVP_KV_FLASH_HND;
	cons = prod;
	cons.engine_id = 2;
	cons.tp_size = 2;
	cons.tp_rank = 0;
	err = kvp_layout_build(&m, &prod, &remote);
	if (err) {
		fail("kvp_layout_build (producer)", err);
		goto out;
	}
	err = kvp_layout_build(&m, &cons, &local);
	if (err) {
		fail("kvp_layout_build (consumer)", err);
		goto out;
	}

	memset(&pattr, 0, sizeof(pattr));
	pattr.max_sge = MAX_SGE;
	err = kvp_plan_compile(local, remote, &pattr, &plan, why, sizeof(why));
	if (err) {
		fprintf(stderr, "plan: cannot plan: %s (%s)\n", why,
			kvp_strerror(err));
		goto out;
	}
	kvp_plan_get_info(plan, &info);
	kvp_layout_get_info(local, &linfo);
	printf("plan: consumer rank %" PRIu32 "/%" PRIu32
	       " <- producer TP %" PRIu32 ": %" PRIu32 " sources, %" PRIu32
	       " streams, %" PRIu64 " bytes\n",
	       info.local_rank, info.local_tp, info.remote_tp, info.nsrc,
	       info.nstreams, info.bytes);

	/* Size the arrays once for the longest request (in an engine: at
	 * startup, never per request). kvp_plan_emit() refuses arrays below
	 * the request's bound with -ENOSPC. */
	kvp_plan_emit_bound(plan, nblocks, &max_wrs, &max_sges);
	wr = (struct kvp_wr *)malloc(max_wrs * sizeof(*wr));
	sge = (struct kvp_sge *)malloc(max_sges * sizeof(*sge));
	lids = (uint32_t *)malloc(nblocks * sizeof(*lids));
	rids = (uint32_t *)malloc(nblocks * sizeof(*rids));
	if (!wr || !sge || !lids || !rids) {
		fprintf(stderr, "plan: out of memory\n");
		goto out;
	}
	printf("bound: %" PRIu32 " WRs, %" PRIu32 " SGEs for %" PRIu32
	       " blocks\n", max_wrs, max_sges, nblocks);

	/* One request: the producer's blocks 0..n-1 hold the sequence; they
	 * land in the consumer's blocks 1000..1000+n-1. One group (full
	 * attention): ids[0]. tokens 0: the remote blocks are full. */
	for (i = 0; i < nblocks; i++) {
		rids[i] = i;
		lids[i] = 1000 + i;
	}
	memset(&ids, 0, sizeof(ids));
	ids.local = lids;
	ids.nlocal = nblocks;
	ids.remote = rids;
	ids.nremote = nblocks;
	nwr = kvp_plan_emit(plan, &ids, wr, max_wrs, sge, max_sges, NULL);
	if (nwr < 0) {
		fail("kvp_plan_emit", nwr);
		goto out;
	}
	for (i = 0; i < (uint32_t)nwr; i++)
		nsge += wr[i].nsge;
	/* Without coalescing: one READ per block per region per source. */
	printf("request: %" PRIu32 " blocks -> %d WRs, %" PRIu32
	       " SGEs (one per block per region: %" PRIu64 ")\n",
	       nblocks, nwr, nsge,
	       (uint64_t)nblocks * linfo.nregions * info.nsrc);
	for (i = 0; i < (uint32_t)nwr && i < SHOW_WRS; i++) {
		int rank = kvp_plan_source(plan, wr[i].src);

		if (rank < 0) {
			fail("kvp_plan_source", rank);
			goto out;
		}
		printf("  WR %" PRIu32 ": producer rank %d region %" PRIu32
		       " +%" PRIu64 " len %" PRIu32 " -> %" PRIu32
		       " SGEs, first: region %" PRIu32 " +%" PRIu64
		       " len %" PRIu32 "\n",
		       i, rank, wr[i].region, wr[i].offset, wr[i].len,
		       wr[i].nsge, sge[wr[i].sge_first].region,
		       sge[wr[i].sge_first].offset, sge[wr[i].sge_first].len);
	}
	if ((uint32_t)nwr > SHOW_WRS)
		printf("  ... %d more\n", nwr - SHOW_WRS);
	ret = 0;
out:
	free(rids);
	free(lids);
	free(sge);
	free(wr);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(local);
	kvp_layout_destroy(remote);
	return ret;
}
