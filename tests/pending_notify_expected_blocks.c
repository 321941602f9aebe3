// SPDX-License-Identifier: MIT
/*
 * PENDING -- FAILS until kvp_notify_expected() refuses exactly the layout
 * pairs kvp_plan_compile() refuses. Not built by `make unit` (only
 * tests/test_*.c are); fold into tests/test_compile.c once it passes
 * (test_proto's compile_rejected() then becomes proto_rejected()).
 *
 * Contract (include/kvpull.h): kvp_notify_expected() returns "the count
 * (>= 1), -EPROTO if the layouts cannot be matched". Since f4ce063 it runs
 * the compiler's field matching, but not its block-size checks (period_of:
 * "no usable common period"; field_pieces: "no common refinement"), so
 * for pairs no plan exists for it still returns a count, and a producer
 * would wait for notifications from consumers that can never connect.
 * Repro, llama-3.1-8b cut to 1 layer, TP 2 consumer rank 0 / TP 4 producer:
 *   consumer blocks 16, producer blocks 24 (either FLASH layout):
 *     kvp_plan_compile -> -EPROTO "group 0 layer 0 K: the two layouts have
 *     no common refinement (block sizes or dims do not nest)";
 *     kvp_notify_expected(producer, consumer, 0) -> 1
 *   head dim 1, 1 kv head, 1-byte elements, TP 1, blocks 1 vs 65537:
 *     compile -> -EPROTO "group 0: block sizes 1 and 65537 have no usable
 *     common period"; kvp_notify_expected -> 1
 *   The sweep below (blocks {8,16,24,32,48,64,96} x kernels {0,8,16} on
 *   each side, 361 pairs): the compiler refuses 98, and
 *   kvp_notify_expected returns a count for every one of them.
 * Expected: for every pair, kvp_notify_expected() < 0 exactly when
 * kvp_plan_compile() fails (-EPROTO both).
 *
 * Build and run by hand:
 *   make build/libkvpull_plan.a build/tests/lib/kvtest.o
 *   cc -std=gnu11 -Iinclude -Iplan -Itests/lib \
 *      tests/pending_notify_expected_blocks.c build/tests/lib/kvtest.o \
 *      build/libkvpull_plan.a -lcmocka \
 *      -o build/pending_notify_expected_blocks && \
 *      build/pending_notify_expected_blocks
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include <cmocka.h>

#include "kvtest.h"

/* Returns 1 when compile and kvp_notify_expected disagree. */
static int disagree(const kvp_layout *c, const kvp_layout *p, uint32_t ptp,
		    const char *what)
{
	kvp_plan *plan;
	char msg[256] = "";
	int err = kvp_plan_compile(c, p, NULL, &plan, msg, sizeof(msg));
	uint32_t r;

	if (!err)
		kvp_plan_destroy(plan);
	for (r = 0; r < ptp; r++) {
		int n = kvp_notify_expected(p, c, r);

		if ((err == -EPROTO) != (n == -EPROTO)) {
			print_error(
				"%s: compile %d (%s), kvp_notify_expected(producer %u) %d\n",
				what, err, msg, r, n);
			return 1;
		}
	}
	return 0;
}

static void test_notify_expected_blocks(void **state)
{
	static const uint32_t bs[] = { 8, 16, 24, 32, 48, 64, 96 };
	static const uint32_t ks[] = { 0, 8, 16 };
	struct kvp_model m, x;
	uint32_t a, ka, b, kb, bad = 0, n = 0;
	kvp_layout *c, *p;
	char what[96];

	(void)state;
	assert_int_equal(kvp_model_preset("llama-3.1-8b", &m), 0);
	m.layers = 1;
	for (a = 0; a < 7; a++)
		for (ka = 0; ka < 3; ka++)
			for (b = 0; b < 7; b++)
				for (kb = 0; kb < 3; kb++) {
					if ((ks[ka] && bs[a] % ks[ka]) ||
					    (ks[kb] && bs[b] % ks[kb]))
						continue;
					c = kvt_build(&m, 2, 0, bs[a], ks[ka],
						      8, KVP_KV_FLASH_NHD);
					p = kvt_build(&m, 4, 1, bs[b], ks[kb],
						      8, KVP_KV_FLASH_HND);
					assert_non_null(c);
					assert_non_null(p);
					snprintf(what, sizeof(what),
						 "blocks %u/k%u <- %u/k%u",
						 bs[a], ks[ka], bs[b], ks[kb]);
					bad += disagree(c, p, 4, what);
					n++;
					kvp_layout_destroy(c);
					kvp_layout_destroy(p);
				}
	x = m, x.kv_heads = 1, x.head_dim = 1, x.dtype_bytes = 1;
	c = kvt_build(&x, 1, 0, 1, 0, 2, KVP_KV_FLASH_NHD);
	p = kvt_build(&x, 1, 0, 65537, 0, 2, KVP_KV_FLASH_NHD);
	assert_non_null(c);
	assert_non_null(p);
	bad += disagree(c, p, 1, "blocks 1 <- 65537");
	kvp_layout_destroy(c);
	kvp_layout_destroy(p);
	if (bad)
		fail_msg(
			"%u of %u pairs: kvp_notify_expected and kvp_plan_compile disagree",
			bad, n + 1);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_notify_expected_blocks),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
