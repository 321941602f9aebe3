// SPDX-License-Identifier: MIT
/*
 * SHA-256 and HMAC-SHA-256 of the handshake's shared-secret proof
 * (verbs/hmac.c, compiled in here: it has no verbs dependency) against
 * FIPS 180-4 examples and RFC 4231's test cases, including a key longer
 * than a block and messages straddling the padding boundary, fed whole
 * and in pieces.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "../verbs/hmac.c"

static void hex(const uint8_t *d, char *out)
{
	int i;

	for (i = 0; i < KVP_SHA256_LEN; i++)
		sprintf(out + 2 * i, "%02x", d[i]);
}

static void sha_check(const void *p, size_t n, size_t piece, const char *want)
{
	struct kvp_sha256 s;
	uint8_t d[KVP_SHA256_LEN];
	char h[2 * KVP_SHA256_LEN + 1];
	size_t off, k;

	kvp__sha256_init(&s);
	for (off = 0; off < n; off += k) {
		k = n - off < piece ? n - off : piece;
		kvp__sha256_update(&s, (const uint8_t *)p + off, k);
	}
	kvp__sha256_final(&s, d);
	hex(d, h);
	assert_string_equal(h, want);
}

static void test_sha256(void **state)
{
	static const size_t pieces[] = { 1, 7, 64, 1000000 };
	uint8_t *a = malloc(1000000);
	char x[64];
	size_t i;

	(void)state;
	assert_non_null(a);
	memset(a, 'a', 1000000);
	memset(x, 'x', sizeof(x));
	for (i = 0; i < sizeof(pieces) / sizeof(pieces[0]); i++) {
		sha_check("", 0, pieces[i],
			  "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
		sha_check("abc", 3, pieces[i],
			  "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
		sha_check(x, 55, pieces[i],
			  "d5e285683cd4efc02d021a5c62014694958901005d6f71e89e0989fac77e4072");
		sha_check(x, 56, pieces[i],
			  "04c26261370ee7541549d16dee320c723e3fd14671e66a099afe0a377c16888e");
		sha_check(x, 64, pieces[i],
			  "7ce100971f64e7001e8fe5a51973ecdfe1ced42befe7ee8d5fd6219506b5393c");
	}
	sha_check(a, 1000000, 4096,
		  "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
	free(a);
}

static void hmac_check(const void *key, size_t klen, const char *msg,
		       size_t split, const char *want)
{
	const void *m[2] = { msg, msg + split };
	size_t l[2] = { split, strlen(msg) - split };
	uint8_t d[KVP_SHA256_LEN];
	char h[2 * KVP_SHA256_LEN + 1];

	kvp__hmac_sha256(key, klen, m, l, 2, d);
	hex(d, h);
	assert_string_equal(h, want);
}

/* RFC 4231 test cases 1, 2 and 6. */
static void test_hmac(void **state)
{
	uint8_t k1[20], k6[131];
	const char *m6 = "Test Using Larger Than Block-Size Key - Hash Key First";
	size_t s;

	(void)state;
	memset(k1, 0x0b, sizeof(k1));
	memset(k6, 0xaa, sizeof(k6));
	for (s = 0; s < 8; s++) {
		hmac_check(k1, sizeof(k1), "Hi There", s,
			   "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
		hmac_check("Jefe", 4, "what do ya want for nothing?", s,
			   "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
		hmac_check(k6, sizeof(k6), m6, s,
			   "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
	}
}

static void test_ct_equal(void **state)
{
	uint8_t a[32], b[32];
	int i;

	(void)state;
	memset(a, 7, sizeof(a));
	memcpy(b, a, sizeof(b));
	assert_int_equal(kvp__ct_equal(a, b, sizeof(a)), 1);
	assert_int_equal(kvp__ct_equal(a, b, 0), 1);
	for (i = 0; i < 32; i++) {
		b[i] ^= 0x80;
		assert_int_equal(kvp__ct_equal(a, b, sizeof(a)), 0);
		b[i] ^= 0x80;
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_sha256),
		cmocka_unit_test(test_hmac),
		cmocka_unit_test(test_ct_equal),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
