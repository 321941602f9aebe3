// SPDX-License-Identifier: MIT
/*
 * The hello and the refusal as bytes (verbs/hello.c, compiled in: no verbs
 * call): their exact layout, another handshake version told apart from a
 * malformed hello, and refusals of each length an agent may meet.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../verbs/hello.c"

static struct kvp_hello sample(void)
{
	struct kvp_hello h;
	int i;

	memset(&h, 0, sizeof(h));
	h.version = KVP_HELLO_VERSION;
	h.role = KVP_ROLE_CONSUMER;
	h.tp_size = 8;
	h.tp_rank = 3;
	h.blob_len = 0x1234;
	h.flags = KVP_HELLO_AUTH | 2u << KVP_HELLO_QPS_SHIFT |
		  1u << KVP_HELLO_QI_SHIFT;
	h.lib = 0x000207; /* 0.2.7: the patch level does not travel */
	h.engine_id = 0x1122334455667788ull;
	for (i = 0; i < KVP_NONCE_LEN; i++)
		h.nonce[i] = (uint8_t)(0xa0 + i);
	return h;
}

/* Every byte of a hello, and its round trip. */
static void test_hello_bytes(void **state)
{
	static const uint8_t want[KVP_HELLO_LEN] = {
		0x48, 0x50, 0x56, 0x4b, 0x06, 0x00, 0x01, 0x00, /* magic, 6, C */
		0x08, 0x00, 0x00, 0x00, 0x03, 0x00, 0x00, 0x00, /* TP 8, rank 3 */
		0x34, 0x12, 0x00, 0x00, 0x01, 0x12, 0x02, 0x00, /* blob, flags */
		0x88, 0x77, 0x66, 0x55, 0x44, 0x33, 0x22, 0x11, /* engine */
		0xa0, 0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, /* nonce */
		0xa8, 0xa9, 0xaa, 0xab, 0xac, 0xad, 0xae, 0xaf,
	};
	struct kvp_hello h = sample(), g;
	uint8_t p[KVP_HELLO_LEN];

	(void)state;
	kvp__hello_put(p, &h);
	assert_memory_equal(p, want, sizeof(want));
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), 0);
	assert_int_equal(g.version, KVP_HELLO_VERSION);
	assert_int_equal(g.role, KVP_ROLE_CONSUMER);
	assert_int_equal(g.tp_size, 8);
	assert_int_equal(g.tp_rank, 3);
	assert_int_equal(g.blob_len, 0x1234);
	assert_int_equal(g.flags, h.flags);
	assert_int_equal(g.lib, 0x000200);
	assert_true(g.engine_id == h.engine_id);
	assert_memory_equal(g.nonce, h.nonce, KVP_NONCE_LEN);
}

/* Another version is told apart from a malformed hello, whatever follows
 * its first 8 bytes; from version 6 on its library version is read. */
static void test_other_version(void **state)
{
	struct kvp_hello h = sample(), g;
	uint8_t p[KVP_HELLO_LEN];

	(void)state;
	kvp__hello_put(p, &h);
	/* version 5 (kvpull 0.1): flags had no library bits */
	p[4] = 5;
	memset(&g, 0xee, sizeof(g));
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), -EPROTONOSUPPORT);
	assert_int_equal(g.version, 5);
	assert_int_equal(g.lib, 0);
	/* a later version, library 9.3, a hello of another length and
	 * garbage past its version */
	p[4] = 7;
	p[22] = 0x03;
	p[23] = 0x09;
	memset(p + 8, 0xff, 12);
	assert_int_equal(kvp__hello_get(p, 40, &g), -EPROTONOSUPPORT);
	assert_int_equal(g.version, 7);
	assert_int_equal(g.lib, 0x090300);
	/* even 8 bytes name the version */
	assert_int_equal(kvp__hello_get(p, 8, &g), -EPROTONOSUPPORT);
	assert_int_equal(g.lib, 0);
	p[4] = 0;
	p[5] = 1; /* 256 */
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), -EPROTONOSUPPORT);
	assert_int_equal(g.version, 256);
}

static void test_malformed_hello(void **state)
{
	struct kvp_hello h = sample(), g;
	uint8_t p[KVP_HELLO_LEN];

	(void)state;
	kvp__hello_put(p, &h);
	assert_int_equal(kvp__hello_get(NULL, sizeof(p), &g), -EPROTO);
	assert_int_equal(kvp__hello_get(p, 7, &g), -EPROTO);
	assert_int_equal(kvp__hello_get(p, KVP_HELLO_LEN - 1, &g), -EPROTO);
	p[0] ^= 1; /* not a hello */
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), -EPROTO);
	p[0] ^= 1;
	p[20] |= 0x02; /* flags bit 1: unknown */
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), -EPROTO);
	h.tp_rank = h.tp_size;
	kvp__hello_put(p, &h);
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), -EPROTO);
	h = sample();
	h.blob_len = KVP_META_MAX + 1;
	kvp__hello_put(p, &h);
	assert_int_equal(kvp__hello_get(p, sizeof(p), &g), -EPROTO);
}

/* A refusal's bytes; one of each length read back; what is not one. */
static void test_refusal(void **state)
{
	static const uint8_t want[KVP_REFUSE_VER_LEN] = {
		0x52, 0x50, 0x56, 0x4b, 0xa3, 0xff, 0xff, 0xff, /* -EPROTONOSUPPORT */
		0x20, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, /* VERSION, 0 */
		0x06, 0x00, 0x00, 0x00, 0x00, 0x02, 0x00, 0x00, /* 6, 0.2.0 */
	};
	const struct kvp_refusal r = { .err = -EPROTONOSUPPORT,
				       .reason = KVP_REASON_VERSION,
				       .version = 6, .lib = 0x000200 };
	struct kvp_refusal g;
	uint8_t p[32];

	(void)state;
	assert_int_equal(KVP_REASON_VERSION, 0x20);
	assert_int_equal(kvp__refusal_put(p, &r), KVP_REFUSE_VER_LEN);
	assert_memory_equal(p, want, sizeof(want));
	assert_int_equal(kvp__refusal_get(p, KVP_REFUSE_VER_LEN, &g), 0);
	assert_int_equal(g.err, -EPROTONOSUPPORT);
	assert_int_equal(g.reason, KVP_REASON_VERSION);
	assert_int_equal(g.retry_ms, 0);
	assert_int_equal(g.version, 6);
	assert_int_equal(g.lib, 0x000200);
	/* an older agent's: no versions, or no hint either */
	kvp__put32(p + 8, KVP_REASON_PEER_FULL);
	kvp__put32(p + 12, 250);
	assert_int_equal(kvp__refusal_get(p, KVP_REFUSE_HINT_LEN, &g), 0);
	assert_int_equal(g.reason, KVP_REASON_PEER_FULL);
	assert_int_equal(g.retry_ms, 250);
	assert_int_equal(g.version, 0);
	assert_int_equal(g.lib, 0);
	assert_int_equal(kvp__refusal_get(p, KVP_REFUSE_LEN, &g), 0);
	assert_int_equal(g.retry_ms, 0);
	/* a reason past the list reads as none */
	kvp__put32(p + 8, KVP_REASON_COUNT);
	assert_int_equal(kvp__refusal_get(p, KVP_REFUSE_LEN, &g), 0);
	assert_int_equal(g.reason, KVP_REASON_NONE);
	/* other lengths, another magic: not a refusal */
	assert_int_equal(kvp__refusal_get(p, 20, &g), -EPROTO);
	assert_int_equal(kvp__refusal_get(p, 32, &g), -EPROTO);
	assert_int_equal(kvp__refusal_get(p, 8, &g), -EPROTO);
	p[0] ^= 1;
	assert_int_equal(kvp__refusal_get(p, KVP_REFUSE_LEN, &g), -EPROTO);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_hello_bytes),
		cmocka_unit_test(test_other_version),
		cmocka_unit_test(test_malformed_hello),
		cmocka_unit_test(test_refusal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
