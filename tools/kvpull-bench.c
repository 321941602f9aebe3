// SPDX-License-Identifier: MIT
/*
 * kvpull-bench: planner benchmark. Prints plan compile time, plan size and
 * emission cost per WR for a model pair, emitting each request whole
 * (kvp_plan_emit()) and in windows of WINDOW_WRS WRs per source, the way a
 * transport fills a send queue (kvp_plan_emit_window()). Public API only.
 *
 *   kvpull-bench [--model NAME] [--remote-tp P] [--local-tp D]
 *                [--num-blocks N] [--request B] [--max-sge S]
 *                [--layout flash_hnd|flash_nhd|flashinfer|packed]
 *                [--iters N] [--random] [--max-len BYTES] [--no-coalesce]
 *                [--version]
 *
 * Defaults: llama-3.1-70b (80 layers), TP 8 -> 2, 100000 blocks, 128-block
 * requests, FLASH_HND, max_sge 16, consecutive block ids.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "args.h"
#include "kvpull.h"
#include "names.h"

/* A send queue's free room in the windowed figure: WRs, and max_sge SGEs
 * for each. */
#define WINDOW_WRS 256u

static double now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e9 + ts.tv_nsec;
}

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvpull-bench [--model NAME] [--remote-tp P] [--local-tp D]\n"
		"                    [--num-blocks N] [--request B] [--max-sge S]\n"
		"                    [--layout flash_nhd|flash_hnd|flashinfer|packed]\n"
		"                    [--iters N] [--random] [--max-len BYTES]\n"
		"                    [--no-coalesce] [--version]\n"
		"Compiles the plan of consumer rank 0 (TP D) pulling from a producer\n"
		"engine (TP P) and emits requests of B blocks per group. Prints the\n"
		"median compile time, the plan size, and emission ns per WR and per\n"
		"block, whole (kvp_plan_emit) and in windows of %u WRs per source\n"
		"(kvp_plan_emit_window). --random draws block ids at random (no\n"
		"coalescing across blocks); the default uses consecutive ids.\n"
		"--max-len caps the bytes per READ (kvp_plan_attr.max_len);\n"
		"--no-coalesce posts one READ per piece per block, as connectors\n"
		"with one descriptor per block per region do (a comparison).\n",
		WINDOW_WRS);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	const char *model = "llama-3.1-70b";
	uint32_t P = 8, D = 2, nblocks = 100000, req = 128, max_sge = 16;
	uint32_t layout = 1, iters = 200, random_ids = 0, i, g;
	uint32_t max_len = 0, no_coalesce = 0;
	struct kvp_engine_desc pe = { 0 }, de = { 0 };
	struct kvp_plan_attr attr = { 0 };
	struct kvp_plan_info info;
	struct kvp_model m;
	kvp_layout *local = NULL, *remote = NULL;
	kvp_plan *plan = NULL;
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	struct kvp_ids ids[4];
	uint32_t *lid, *rid, maxw, maxs, state_lid = 0, state_rid = 0;
	double *t, sum = 0;
	char msg[256] = "";
	int err, n = 0, bad;
	uint64_t seed = 42;
	const struct tool_opt opts[] = {
		{ "--model", TOOL_STR, &model, 0 },
		{ "--remote-tp", TOOL_U32, &P, 0 },
		{ "--local-tp", TOOL_U32, &D, 0 },
		{ "--num-blocks", TOOL_U32, &nblocks, 0 },
		{ "--request", TOOL_U32, &req, 0 },
		{ "--max-sge", TOOL_U32, &max_sge, 0 },
		{ "--iters", TOOL_U32, &iters, 0 },
		{ "--layout", TOOL_LAYOUT, &layout, 0 },
		{ "--random", TOOL_FLAG, &random_ids, 0 },
		{ "--max-len", TOOL_U32, &max_len, 0 },
		{ "--no-coalesce", TOOL_FLAG, &no_coalesce, 0 },
		{ NULL, TOOL_STR, NULL, 0 },
	};

	bad = tool_parse_args(argc, argv, "kvpull-bench", opts);
	if (bad == TOOL_ARGS_HELP)
		usage(stdout);
	if (bad)
		return bad == TOOL_ARGS_BAD ? 2 : 0;
	if (!iters)
		return tool_bad_arg("kvpull-bench", "--iters: must be at least 1");
	if (!req || req > nblocks)
		return tool_bad_arg("kvpull-bench", "--request: %u is out of "
				    "range (1 to --num-blocks, %u)", req,
				    nblocks);
	err = kvp_model_preset(model, &m);
	if (err) {
		fprintf(stderr, "kvpull-bench: %s: %s\n", model, kvp_strerror(err));
		return 1;
	}
	pe.engine_id = 1;
	pe.tp_size = P;
	pe.block_tokens = de.block_tokens = 16;
	pe.num_blocks = de.num_blocks = nblocks;
	pe.kv_layout = de.kv_layout = layout;
	de.engine_id = 2;
	de.tp_size = D;
	err = kvp_layout_build(&m, &pe, &remote);
	err = err ?: kvp_layout_build(&m, &de, &local);
	if (err) {
		fprintf(stderr, "kvpull-bench: layout: %s\n", kvp_strerror(err));
		return 1;
	}
	attr.max_sge = max_sge;
	attr.comp_mask = KVP_PLAN_ATTR_MAX_LEN | KVP_PLAN_ATTR_FLAGS;
	attr.max_len = max_len;
	attr.flags = no_coalesce ? KVP_PLAN_NO_COALESCE : 0;
	t = calloc(iters, sizeof(*t));
	for (i = 0; i < iters; i++) {
		double t0 = now_ns();

		kvp_plan_destroy(plan);
		plan = NULL;
		err = kvp_plan_compile(local, remote, &attr, &plan, msg,
				       sizeof(msg));
		t[i] = now_ns() - t0;
		if (err) {
			fprintf(stderr, "kvpull-bench: compile: %s: %s\n",
				kvp_strerror(err), msg);
			return 1;
		}
	}
	qsort(t, iters, sizeof(*t), cmp_double);
	kvp_plan_get_info(plan, &info);
	printf("model %s, %u layers, TP %u -> %u (consumer rank 0), %u blocks, layout %s, max_sge %u\n",
	       model, m.layers, P, D, nblocks, tool_layout_names[layout], max_sge);
	printf("compile: median %.1f us, min %.1f us (%u runs)\n",
	       t[iters / 2] / 1e3, t[0] / 1e3, iters);
	printf("plan: %llu bytes, %u sources, %u streams, %u piece templates\n",
	       (unsigned long long)info.bytes, info.nsrc, info.nstreams,
	       info.npieces);

	lid = calloc(req, sizeof(*lid));
	rid = calloc(req, sizeof(*rid));
	for (i = 0; i < req; i++) {
		if (random_ids) {
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			lid[i] = (uint32_t)((seed >> 33) % nblocks);
			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			rid[i] = (uint32_t)((seed >> 33) % nblocks);
		} else {
			lid[i] = 1000 + i;
			rid[i] = 5000 + i;
		}
	}
	/* Token groups read `req` blocks; a state group one whole state. */
	for (g = 0; g < info.ngroups && g < 4; g++) {
		struct kvp_plan_group pg;

		if (kvp_plan_get_group(plan, g, &pg))
			return 1;
		ids[g].local = lid;
		ids[g].remote = rid;
		ids[g].nlocal = ids[g].nremote = req;
		ids[g].tokens = 0;
		if (pg.kind == KVP_GROUP_STATE) {
			state_lid = pg.local_blocks / 2;
			state_rid = pg.remote_blocks / 2;
			ids[g].local = &state_lid;
			ids[g].remote = &state_rid;
			ids[g].nlocal = ids[g].nremote = 1;
		}
	}
	kvp_plan_emit_bound(plan, req, &maxw, &maxs);
	wr = calloc(maxw, sizeof(*wr));
	sge = calloc(maxs, sizeof(*sge));
	{
		uint32_t reps = 2000;
		double t0 = now_ns(), dt;
		uint64_t sges = 0;

		for (i = 0; i < reps; i++) {
			n = kvp_plan_emit(plan, ids, wr, maxw, sge, maxs, NULL);
			if (n < 0) {
				fprintf(stderr, "kvpull-bench: emit: %s\n",
					kvp_strerror(n));
				return 1;
			}
			sum += n;
		}
		dt = now_ns() - t0;
		for (i = 0; i < (uint32_t)n; i++)
			sges += wr[i].nsge;
		printf("emit: %d WRs, %llu SGEs per %u-block request (%s ids); %.2f ns per WR, %.2f ns per SGE, %.1f us per request\n",
		       n, (unsigned long long)sges, req,
		       random_ids ? "random" : "consecutive", dt / sum,
		       dt / reps / (double)sges, dt / reps / 1e3);
	}
	{
		/* The same requests source by source, in windows: memory is
		 * WINDOW_WRS WRs whatever the request. */
		uint32_t reps = 2000, ws = WINDOW_WRS * max_sge, s;
		struct kvp_wr *w = calloc(WINDOW_WRS, sizeof(*w));
		struct kvp_sge *ss = calloc(ws, sizeof(*ss));
		uint64_t nw = 0, windows = 0;
		double t0 = now_ns(), dt;

		for (i = 0; i < reps; i++) {
			err = kvp_plan_emit_check(plan, ids);
			for (s = 0; !err && s < info.nsrc; s++) {
				struct kvp_emit_pos pos;

				err = kvp_plan_emit_start(plan, ids, s, &pos);
				while (!err && !kvp_plan_emit_done(&pos)) {
					int k = kvp_plan_emit_window(
						plan, ids, &pos, w, WINDOW_WRS,
						ss, ws, NULL);

					if (k < 0)
						err = k;
					nw += k > 0 ? (uint32_t)k : 0;
					windows++;
				}
			}
			if (err) {
				fprintf(stderr, "kvpull-bench: windows: %s\n",
					kvp_strerror(err));
				return 1;
			}
		}
		dt = now_ns() - t0;
		printf("windows of %u WRs: %llu WRs in %llu windows per request; %.2f ns per WR, %.1f us per request; %zu bytes of arrays (whole: %zu)\n",
		       WINDOW_WRS, (unsigned long long)(nw / reps),
		       (unsigned long long)(windows / reps), dt / (double)nw,
		       dt / reps / 1e3,
		       WINDOW_WRS * sizeof(*w) + ws * sizeof(*ss),
		       maxw * sizeof(*wr) + maxs * sizeof(*sge));
		free(w);
		free(ss);
	}
	free(t);
	free(lid);
	free(rid);
	free(wr);
	free(sge);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(local);
	kvp_layout_destroy(remote);
	return 0;
}
