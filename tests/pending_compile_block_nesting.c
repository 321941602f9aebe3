// SPDX-License-Identifier: MIT
/*
 * PENDING -- FAILS while kvp_plan_compile() refuses block sizes that do not
 * nest. Not built by `make unit` (only tests/test_*.c are); move the cases
 * into tests/test_matrix.c (mixed pairs) once they pass -- or, if only
 * nesting sizes are to be supported, say so in include/kvpull.h and delete
 * this file.
 *
 * DESIGN.md: "Block-size mismatch is arithmetic on the token axis"; the plan
 * holds WR templates "for one *period* of blocks (a period covers lcm of the
 * two block sizes in tokens)", and period_of() does compute the lcm. But
 * field_pieces() refines both sides' token dims into one mixed-radix index
 * space, which exists only when every block and kernel-page boundary of one
 * side nests with the other's, so compilation fails with -EPROTO "the two
 * layouts have no common refinement (block sizes or dims do not nest)" for
 * every pair of block sizes where neither divides the other, and for
 * nesting block sizes when a kernel page of one side does not nest with
 * the other side's block. A plan exists for all of them (split pieces at
 * multiples of gcd of the sizes). Repro (1 layer, 2 kv heads, head dim 4,
 * 2-byte elements, TP 1 both, FLASH_HND producer, FLASH_NHD consumer, 8
 * blocks a region):
 *   consumer 16-token blocks <- producer 24-token blocks: -EPROTO
 *   consumer 24 <- producer 16: -EPROTO
 *   consumer 24 <- producer 48 with 16-token kernel pages: -EPROTO
 *   consumer 48 with 16-token kernel pages <- producer 24: -EPROTO
 *   consumer 32 <- producer 48: -EPROTO
 *   consumer 32 <- producer 528 with 16-token kernel pages (the kind of
 *   block size vLLM picks to align hybrid attention pages with Mamba
 *   state pages): -EPROTO
 * Sweep: of 289 pairs of blocks {8,16,24,32,48,64,96} x kernels {0,8,16},
 * all 86 non-nesting pairs and 8 nesting ones are refused.
 * Expected: each compiles, and kvt_check_pull() proves the bytes.
 *
 * Build and run by hand:
 *   make build/libkvpull_plan.a build/tests/lib/kvtest.o
 *   cc -std=gnu11 -Iinclude -Iplan -Itests/lib \
 *      tests/pending_compile_block_nesting.c build/tests/lib/kvtest.o \
 *      build/libkvpull_plan.a -lcmocka \
 *      -o build/pending_compile_block_nesting && \
 *      build/pending_compile_block_nesting
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "kvtest.h"

struct bp {
	uint32_t cblock, ckernel, pblock, pkernel;
};

static const struct bp cases[] = {
	{ 16, 0, 24, 0 },  { 24, 0, 16, 0 }, { 24, 0, 48, 16 },
	{ 48, 16, 24, 0 }, { 32, 0, 48, 0 }, { 32, 0, 528, 16 },
};

static void test_block_sizes_that_do_not_nest(void **state)
{
	struct kvp_model m = { 0 };
	uint32_t i, P, c, bad = 0;
	uint64_t seed = 5;

	(void)state;
	m.layers = 1;
	m.kv_heads = 2;
	m.head_dim = 4;
	m.dtype_bytes = 2;
	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		const struct bp *b = &cases[i];

		for (P = 1; P <= 2; P++) {
			kvp_layout *rem[2], *loc;
			uint32_t lids[8], rids[8];
			/* 2.5 producer blocks of tokens, the tail read */
			uint64_t tokens = b->pblock * 2 + b->pblock / 2;
			uint32_t nr = 3;
			uint32_t nl = (uint32_t)((tokens + b->cblock - 1) /
						 b->cblock);
			struct kvp_ids ids;
			kvp_plan *plan;
			char msg[256] = "";
			int err;

			for (c = 0; c < P; c++)
				assert_non_null(
					rem[c] = kvt_build(&m, P, c, b->pblock,
							   b->pkernel, 8,
							   KVP_KV_FLASH_HND));
			assert_non_null(loc = kvt_build(&m, 1, 0, b->cblock,
							b->ckernel, 40,
							KVP_KV_FLASH_NHD));
			err = kvp_plan_compile(loc, rem[0], NULL, &plan, msg,
					       sizeof(msg));
			if (err) {
				print_error(
					"consumer %u/k%u <- producer %u/k%u (TP %u): compile %d: %s\n",
					b->cblock, b->ckernel, b->pblock,
					b->pkernel, P, err, msg);
				bad++;
			} else {
				kvp_plan_destroy(plan);
				kvt_random_ids(&seed, rids, nr, 8);
				kvt_random_ids(&seed, lids, nl, 40);
				ids.local = lids;
				ids.remote = rids;
				ids.nremote = nr;
				ids.nlocal = nl > 1 ? nl - 1 : nl;
				ids.tokens = tokens;
				if (kvt_check_pull(loc, rem, 4, &ids, NULL,
						   NULL)) {
					print_error(
						"consumer %u/k%u <- producer %u/k%u (TP %u): identity check failed\n",
						b->cblock, b->ckernel,
						b->pblock, b->pkernel, P);
					bad++;
				}
			}
			kvp_layout_destroy(loc);
			for (c = 0; c < P; c++)
				kvp_layout_destroy(rem[c]);
		}
	}
	if (bad)
		fail_msg("%u of %u block-size pairs have no plan", bad,
			 (uint32_t)(2 * sizeof(cases) / sizeof(cases[0])));
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_block_sizes_that_do_not_nest),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
