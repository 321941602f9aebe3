// SPDX-License-Identifier: MIT
/*
 * The metrics' pure parts (verbs/hist.h, verbs/expo.c, compiled in here:
 * no verbs call): the histograms' buckets at their exact bounds, the
 * seconds and integers as they are written, and the exposition writer's
 * bytes in both formats, escaping included, and its snprintf() contract
 * (the length needed, what fits and a NUL). kvp_agent_metrics() on a
 * live agent is checked by tests/rdma_metrics.c, with promtool.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../verbs/expo.c"

static void test_bucket_bounds(void **state)
{
	(void)state;
	assert_int_equal(KVP_HIST_FINITE, 28);
	assert_int_equal(kvp__hist_bucket(0), 0);
	assert_int_equal(kvp__hist_bucket(1), 0);
	assert_int_equal(kvp__hist_bucket(256), 0);
	assert_int_equal(kvp__hist_bucket(257), 1);
	assert_int_equal(kvp__hist_bucket(512), 1);
	assert_int_equal(kvp__hist_bucket(513), 2);
	assert_int_equal(kvp__hist_bucket(1000000), 12); /* le 1.048576 ms */
	assert_int_equal(kvp__hist_bucket(1ull << 35), 27);
	assert_int_equal(kvp__hist_bucket((1ull << 35) + 1), 28);
	assert_int_equal(kvp__hist_bucket(UINT64_MAX), 28);
	/* every bound lands in its own bucket, one past it in the next */
	for (uint32_t i = 0; i < KVP_HIST_FINITE; i++) {
		assert_int_equal(kvp__hist_bucket(kvp__hist_bound_ns(i)), i);
		assert_int_equal(kvp__hist_bucket(kvp__hist_bound_ns(i) + 1),
				 i + 1);
	}
}

static void test_hist_add(void **state)
{
	struct kvp_hist h;

	(void)state;
	memset(&h, 0, sizeof(h));
	assert_int_equal(kvp__hist_count(&h), 0);
	kvp__hist_add(&h, 300);
	kvp__hist_add(&h, 300);
	kvp__hist_add(&h, 1ull << 40);
	assert_int_equal(kvp__hist_count(&h), 3);
	assert_int_equal(h.n[1], 2);
	assert_int_equal(h.n[KVP_HIST_FINITE], 1);
	assert_int_equal(h.sum_ns, 600 + (1ull << 40));
}

static void check_seconds(uint64_t ns, const char *want)
{
	char b[KVP_SECONDS_LEN];
	size_t n = kvp__fmt_seconds(b, ns);

	assert_int_equal(n, strlen(want));
	assert_memory_equal(b, want, n);
}

static void test_numbers(void **state)
{
	char b[20];

	(void)state;
	check_seconds(0, "0");
	check_seconds(1, "0.000000001");
	check_seconds(256, "0.000000256");
	check_seconds(1000000000, "1");
	check_seconds(1500000000, "1.5");
	check_seconds(1ull << 35, "34.359738368");
	check_seconds(UINT64_MAX, "18446744073.709551615");
	assert_int_equal(kvp__fmt_u64(b, 0), 1);
	assert_memory_equal(b, "0", 1);
	assert_int_equal(kvp__fmt_u64(b, UINT64_MAX), 20);
	assert_memory_equal(b, "18446744073709551615", 20);
}

/* A counter (no labels, then two with a value to escape), an empty gauge
 * family and a histogram of three observations (one past the last
 * bound). */
static size_t sample(char *buf, size_t cap, int json)
{
	struct kvp_label l[2] = { { "mode", "bulk" },
				  { "peer", "a\"b\\c\nd" } };
	struct kvp_expo w;
	struct kvp_hist h;

	memset(&h, 0, sizeof(h));
	kvp__hist_add(&h, 300);
	kvp__hist_add(&h, 1000000);
	kvp__hist_add(&h, 100000000000ull);
	kvp__expo_init(&w, buf, cap, json);
	kvp__expo_family(&w, "x_total", KVP_MT_COUNTER, "Help \\ me\nnow.");
	kvp__expo_value(&w, NULL, 0, 7);
	kvp__expo_value(&w, l, 2, UINT64_MAX);
	kvp__expo_family(&w, "g", KVP_MT_GAUGE, "G.");
	kvp__expo_family(&w, "h_seconds", KVP_MT_HISTOGRAM, "H.");
	kvp__expo_hist(&w, l, 1, &h);
	return kvp__expo_end(&w);
}

static const char want_text[] =
	"# HELP x_total Help \\\\ me\\nnow.\n"
	"# TYPE x_total counter\n"
	"x_total 7\n"
	"x_total{mode=\"bulk\",peer=\"a\\\"b\\\\c\\nd\"} 18446744073709551615\n"
	"# HELP g G.\n"
	"# TYPE g gauge\n"
	"# HELP h_seconds H.\n"
	"# TYPE h_seconds histogram\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000000256\"} 0\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000000512\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000001024\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000002048\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000004096\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000008192\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000016384\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000032768\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000065536\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000131072\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000262144\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.000524288\"} 1\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.001048576\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.002097152\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.004194304\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.008388608\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.016777216\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.033554432\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.067108864\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.134217728\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.268435456\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"0.536870912\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"1.073741824\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"2.147483648\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"4.294967296\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"8.589934592\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"17.179869184\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"34.359738368\"} 2\n"
	"h_seconds_bucket{mode=\"bulk\",le=\"+Inf\"} 3\n"
	"h_seconds_sum{mode=\"bulk\"} 100.0010003\n"
	"h_seconds_count{mode=\"bulk\"} 3\n";

static const char want_json[] =
	"{\"counters\":{\"x_total\":[{\"labels\":{},\"value\":7},{\"labels\""
	":{\"mode\":\"bulk\",\"peer\":\"a\\\"b\\\\c\\nd\"},\"value\":184467"
	"44073709551615}]},\"gauges\":{\"g\":[]},\"histograms\":{\"h_second"
	"s\":[{\"labels\":{\"mode\":\"bulk\"},\"count\":3,\"sum\":100.00100"
	"03,\"buckets\":[[0.000000256,0],[0.000000512,1],[0.000001024,1],[0"
	".000002048,1],[0.000004096,1],[0.000008192,1],[0.000016384,1],[0.0"
	"00032768,1],[0.000065536,1],[0.000131072,1],[0.000262144,1],[0.000"
	"524288,1],[0.001048576,2],[0.002097152,2],[0.004194304,2],[0.00838"
	"8608,2],[0.016777216,2],[0.033554432,2],[0.067108864,2],[0.1342177"
	"28,2],[0.268435456,2],[0.536870912,2],[1.073741824,2],[2.147483648"
	",2],[4.294967296,2],[8.589934592,2],[17.179869184,2],[34.359738368"
	",2]]}]}}";

static void test_text(void **state)
{
	static char b[4096];

	(void)state;
	memset(b, 'x', sizeof(b));
	assert_int_equal(sample(b, sizeof(b), 0), strlen(want_text));
	assert_string_equal(b, want_text);
}

static void test_json(void **state)
{
	static char b[4096];

	(void)state;
	assert_int_equal(sample(b, sizeof(b), 1), strlen(want_json));
	assert_string_equal(b, want_json);
}

/* Nothing but what the caller asked for is written, and the length
 * needed comes back, as snprintf() does. */
static void test_short_buffer(void **state)
{
	char b[64];
	const size_t n = strlen(want_text);

	(void)state;
	assert_int_equal(sample(NULL, 0, 0), n);
	memset(b, 'x', sizeof(b));
	assert_int_equal(sample(b, 0, 0), n);
	assert_int_equal(b[0], 'x');
	assert_int_equal(sample(b, 1, 0), n);
	assert_int_equal(b[0], 0);
	assert_int_equal(b[1], 'x');
	assert_int_equal(sample(b, 40, 0), n);
	assert_memory_equal(b, want_text, 39);
	assert_int_equal(b[39], 0);
	assert_int_equal(b[40], 'x');
	assert_int_equal(sample(b, 40, 1), strlen(want_json));
	assert_memory_equal(b, want_json, 39);
	assert_int_equal(b[39], 0);
}

/* JSON keeps every section, empty or not. */
static void test_json_empty(void **state)
{
	struct kvp_expo w;
	char b[128];
	static const char none[] =
		"{\"counters\":{},\"gauges\":{},\"histograms\":{}}";

	(void)state;
	kvp__expo_init(&w, b, sizeof(b), 1);
	assert_int_equal(kvp__expo_end(&w), sizeof(none) - 1);
	assert_string_equal(b, none);
	kvp__expo_init(&w, b, sizeof(b), 1);
	kvp__expo_family(&w, "g", KVP_MT_GAUGE, "G.");
	kvp__expo_value(&w, NULL, 0, 0);
	kvp__expo_family(&w, "h", KVP_MT_GAUGE, "H.");
	(void)kvp__expo_end(&w);
	assert_string_equal(b, "{\"counters\":{},\"gauges\":{\"g\":[{\"labels\":{},\"value\":0}],\"h\":[]},\"histograms\":{}}");
	kvp__expo_init(&w, b, sizeof(b), 0);
	assert_int_equal(kvp__expo_end(&w), 0);
	assert_string_equal(b, "");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_bucket_bounds),
		cmocka_unit_test(test_hist_add),
		cmocka_unit_test(test_numbers),
		cmocka_unit_test(test_text),
		cmocka_unit_test(test_json),
		cmocka_unit_test(test_short_buffer),
		cmocka_unit_test(test_json_empty),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
