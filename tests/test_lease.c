// SPDX-License-Identifier: MIT
/*
 * Leases (verbs/lease.c, compiled in: no verbs call): a bucket's grants
 * and withdrawals as the consumer's check sees them, a full bucket, a
 * bucket read while an entry is written (every mix of its old and new
 * words), and SipHash-2-4 against its reference vectors.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../verbs/lease.c"

#define INC 0x5eedu
#define G(n) ((uint64_t)INC << 32 | (n))

static void test_grant_check_withdraw(void **state)
{
	uint8_t b[KVP_LEASE_READ] = { 0 };
	uint64_t gen = 0;
	int i;

	(void)state;
	/* Absent: FAILED. */
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, 0, &gen), -ESTALE);
	i = kvp__lease_grant(b, 7, 100, G(1));
	assert_int_equal(i, 0);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, 0, &gen), 0);
	assert_true(gen == G(1));
	/* Another engine's request of the same id, another id, another
	 * incarnation, another generation: not held for them. */
	assert_int_equal(kvp__lease_check(b, 8, 100, INC, 0, &gen), -ESTALE);
	assert_int_equal(kvp__lease_check(b, 7, 101, INC, 0, &gen), -ESTALE);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC + 1, 0, &gen),
			 -ESTALE);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, G(2), &gen),
			 -ESTALE);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, G(1), &gen), 0);
	kvp__lease_withdraw(b, (uint32_t)i);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, 0, &gen), -ESTALE);
	/* The entry is taken by another request: still not ours. */
	assert_int_equal(kvp__lease_grant(b, 9, 5, G(2)), 0);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, 0, &gen), -ESTALE);
	assert_int_equal(kvp__lease_check(b, 9, 5, INC, 0, &gen), 0);
	/* The same key granted again: a new generation. */
	assert_int_equal(kvp__lease_grant(b, 7, 100, G(3)), 1);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, G(1), &gen),
			 -ESTALE);
	assert_int_equal(kvp__lease_check(b, 7, 100, INC, 0, &gen), 0);
	assert_true(gen == G(3));
}

static void test_full_bucket(void **state)
{
	uint8_t b[KVP_LEASE_READ] = { 0 };
	uint64_t gen;
	uint32_t i;

	(void)state;
	for (i = 0; i < KVP_LEASE_BUCKET; i++)
		assert_int_equal(kvp__lease_grant(b, 1, i, G(i + 1)), (int)i);
	assert_int_equal(kvp__lease_grant(b, 1, 99, G(99)), -ENOSPC);
	for (i = 0; i < KVP_LEASE_BUCKET; i++)
		assert_int_equal(kvp__lease_check(b, 1, i, INC, 0, &gen), 0);
	kvp__lease_withdraw(b, 3);
	assert_int_equal(kvp__lease_grant(b, 1, 99, G(100)), 3);
	assert_int_equal(kvp__lease_check(b, 1, 3, INC, 0, &gen), -ESTALE);
}

/* A READ that lands while the producer writes an entry sees each of its
 * two words old or new: no mix passes for a key the entry does not hold
 * for that generation. */
static void test_torn_reads(void **state)
{
	uint8_t old[KVP_LEASE_READ] = { 0 }, nw[KVP_LEASE_READ], mixb[KVP_LEASE_READ];
	uint64_t gen;
	uint32_t m;

	(void)state;
	/* K = (7, 100) held at G(1), withdrawn; K' = (7, 200) granted
	 * into the same entry at G(2). */
	assert_int_equal(kvp__lease_grant(old, 7, 100, G(1)), 0);
	kvp__lease_withdraw(old, 0);
	memcpy(nw, old, sizeof(nw));
	assert_int_equal(kvp__lease_grant(nw, 7, 200, G(2)), 0);
	for (m = 0; m < 4; m++) {
		memcpy(mixb, m & 1 ? nw : old, 8);
		memcpy(mixb + 8, (m & 2 ? nw : old) + 8, 8);
		assert_int_equal(kvp__lease_check(mixb, 7, 100, INC, 0, &gen),
				 -ESTALE);
		assert_int_equal(kvp__lease_check(mixb, 7, 200, INC, 0, &gen),
				 m == 3 ? 0 : -ESTALE);
	}
	/* A withdrawal is one word. */
	assert_int_equal(kvp__lease_check(old, 7, 100, INC, 0, &gen), -ESTALE);
}

/* Keys spread over the buckets: at 1 lease per 2 buckets (the table's
 * load when max_inflight are held), no bucket of 8 fills in a million
 * grants' worth of random tables. */
static void test_spread(void **state)
{
	enum { LOG2 = 10, NB = 1 << LOG2, HELD = NB / KVP_LEASE_PER_REQ };
	static uint8_t cnt[NB];
	uint64_t x = 0x9e3779b97f4a7c15ull;
	uint32_t t, i, most = 0;

	(void)state;
	for (t = 0; t < 2000; t++) {
		memset(cnt, 0, sizeof(cnt));
		for (i = 0; i < HELD; i++) {
			uint32_t k;

			x = x * 6364136223846793005ull + 1442695040888963407ull;
			k = kvp__lease_bucket(x >> 20, t * HELD + i, LOG2);
			assert_true(k < NB);
			if (++cnt[k] > most)
				most = cnt[k];
		}
	}
	assert_true(most < KVP_LEASE_BUCKET);
	assert_int_equal(kvp__lease_bucket(1, 2, 0), 0);
}

/* The reference vectors of SipHash-2-4 (key 00..0f, message 00..n-1) for
 * whole words. */
static void test_siphash(void **state)
{
	const uint64_t k[2] = { 0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull };
	const uint64_t w[2] = { 0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull };

	(void)state;
	assert_true(kvp__siphash(k, w, 0) == 0x726fdb47dd0e0e31ull);
	assert_true(kvp__siphash(k, w, 1) == 0x93f5f5799a932462ull);
	assert_true(kvp__siphash(k, w, 2) == 0x3f2acc7f57c29bdbull);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_grant_check_withdraw),
		cmocka_unit_test(test_full_bucket),
		cmocka_unit_test(test_torn_reads),
		cmocka_unit_test(test_spread),
		cmocka_unit_test(test_siphash),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
