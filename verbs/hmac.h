/* SPDX-License-Identifier: MIT */
/*
 * SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), for the handshake's
 * shared-secret proof. Self-contained: no verbs header, no allocation, so
 * that a unit test can compile hmac.c alone against the RFC 4231 vectors.
 */
#ifndef KVP_VERBS_HMAC_H
#define KVP_VERBS_HMAC_H

#include <stddef.h>
#include <stdint.h>

#define KVP_SHA256_LEN 32

struct kvp_sha256 {
	uint32_t h[8];
	uint64_t len; /* bytes hashed so far */
	uint8_t buf[64];
	uint32_t fill;
};

void kvp__sha256_init(struct kvp_sha256 *s);
void kvp__sha256_update(struct kvp_sha256 *s, const void *p, size_t n);
void kvp__sha256_final(struct kvp_sha256 *s, uint8_t out[KVP_SHA256_LEN]);

/* HMAC-SHA-256 of the concatenation of msg[0..nmsg) (pieces of len[i]
 * bytes), keyed by key[0..klen). */
void kvp__hmac_sha256(const void *key, size_t klen, const void *const *msg,
		      const size_t *len, size_t nmsg,
		      uint8_t out[KVP_SHA256_LEN]);

/* 1 when a[0..n) equals b[0..n), in time independent of where they
 * differ. */
int kvp__ct_equal(const void *a, const void *b, size_t n);

#endif
