#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <cmocka.h>
#include "kvtest.h"

static void one(uint32_t P, uint32_t D, uint32_t lay, const char *preset)
{
	struct kvp_model m;
	kvp_layout *rem[16], *loc;
	uint32_t r, c, lids[8], rids[8];
	struct kvp_ids ids;
	uint64_t s = 1;

	assert_int_equal(kvp_model_preset(preset, &m), 0);
	m.layers = 2;
	for (r = 0; r < P; r++)
		assert_non_null(rem[r] = kvt_build(&m, P, r, 16, 0, 32, lay));
	kvt_random_ids(&s, lids, 8, 32);
	kvt_random_ids(&s, rids, 8, 32);
	ids.local = lids; ids.remote = rids; ids.nlocal = 8; ids.nremote = 8; ids.tokens = 0;
	for (c = 0; c < D; c++) {
		uint32_t nwr; uint64_t bytes;
		assert_non_null(loc = kvt_build(&m, D, c, 16, 0, 32, lay));
		if (kvt_check_pull(loc, rem, 4, &ids, &nwr, &bytes)) {
			fprintf(stderr, "FAIL P=%u D=%u c=%u layout=%u %s\n", P, D, c, lay, preset);
			fail();
		}
		kvp_layout_destroy(loc);
	}
	for (r = 0; r < P; r++)
		kvp_layout_destroy(rem[r]);
}

static void test_smoke(void **state)
{
	(void)state;
	for (unsigned lay = 0; lay < 4; lay++)
		for (unsigned p = 1; p <= 8; p *= 2)
			for (unsigned d = 1; d <= 8; d *= 2) {
				one(p, d, lay, "llama-3.1-8b");
				one(p, d, lay, "qwen2.5-1.5b");
			}
	for (unsigned p = 1; p <= 8; p *= 2)
		for (unsigned d = 1; d <= 8; d *= 2)
			one(p, d, 0, "deepseek-v3");
}

int main(void)
{
	const struct CMUnitTest t[] = { cmocka_unit_test(test_smoke) };
	return cmocka_run_group_tests(t, NULL, NULL);
}
