// SPDX-License-Identifier: MIT
/*
 * SHA-256 and HMAC-SHA-256: see hmac.h. Written for clarity over speed: the
 * handshake hashes a few hundred bytes per connection.
 */
#include <string.h>

#include "hmac.h"

static const uint32_t K[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1,
	0x923f82a4, 0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3,
	0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
	0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
	0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147,
	0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
	0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
	0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
	0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208,
	0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

static inline uint32_t ror(uint32_t x, unsigned n)
{
	return x >> n | x << (32 - n);
}

static void block(uint32_t h[8], const uint8_t p[64])
{
	uint32_t w[64], v[8], t1, t2;
	unsigned i;

	for (i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	for (i = 16; i < 64; i++)
		w[i] = w[i - 16] + w[i - 7] +
		       (ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ w[i - 15] >> 3) +
		       (ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ w[i - 2] >> 10);
	memcpy(v, h, sizeof(v));
	for (i = 0; i < 64; i++) {
		t1 = v[7] + (ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25)) +
		     ((v[4] & v[5]) ^ (~v[4] & v[6])) + K[i] + w[i];
		t2 = (ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22)) +
		     ((v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]));
		memmove(v + 1, v, 7 * sizeof(v[0]));
		v[4] += t1;
		v[0] = t1 + t2;
	}
	for (i = 0; i < 8; i++)
		h[i] += v[i];
}

void kvp__sha256_init(struct kvp_sha256 *s)
{
	static const uint32_t iv[8] = {
		0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
		0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
	};

	memcpy(s->h, iv, sizeof(iv));
	s->len = 0;
	s->fill = 0;
}

void kvp__sha256_update(struct kvp_sha256 *s, const void *data,
				       size_t n)
{
	const uint8_t *p = data;
	size_t take;

	s->len += n;
	while (n) {
		take = 64 - s->fill < n ? 64 - s->fill : n;
		memcpy(s->buf + s->fill, p, take);
		s->fill += (uint32_t)take;
		p += take;
		n -= take;
		if (s->fill == 64) {
			block(s->h, s->buf);
			s->fill = 0;
		}
	}
}

void kvp__sha256_final(struct kvp_sha256 *s,
				      uint8_t out[KVP_SHA256_LEN])
{
	uint64_t bits = s->len * 8;
	unsigned i;

	s->buf[s->fill++] = 0x80;
	if (s->fill > 56) {
		memset(s->buf + s->fill, 0, 64 - s->fill);
		block(s->h, s->buf);
		s->fill = 0;
	}
	memset(s->buf + s->fill, 0, 56 - s->fill);
	for (i = 0; i < 8; i++)
		s->buf[56 + i] = (uint8_t)(bits >> (56 - 8 * i));
	block(s->h, s->buf);
	for (i = 0; i < 8; i++) {
		out[4 * i] = (uint8_t)(s->h[i] >> 24);
		out[4 * i + 1] = (uint8_t)(s->h[i] >> 16);
		out[4 * i + 2] = (uint8_t)(s->h[i] >> 8);
		out[4 * i + 3] = (uint8_t)s->h[i];
	}
	memset(s, 0, sizeof(*s));
}

void kvp__hmac_sha256(const void *key, size_t klen,
				     const void *const *msg, const size_t *len,
				     size_t nmsg, uint8_t out[KVP_SHA256_LEN])
{
	uint8_t k[64], pad[64], inner[KVP_SHA256_LEN];
	struct kvp_sha256 s;
	size_t i;

	memset(k, 0, sizeof(k));
	if (klen > sizeof(k)) {
		kvp__sha256_init(&s);
		kvp__sha256_update(&s, key, klen);
		kvp__sha256_final(&s, k);
	} else if (klen) {
		memcpy(k, key, klen);
	}
	for (i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x36;
	kvp__sha256_init(&s);
	kvp__sha256_update(&s, pad, 64);
	for (i = 0; i < nmsg; i++)
		kvp__sha256_update(&s, msg[i], len[i]);
	kvp__sha256_final(&s, inner);
	for (i = 0; i < 64; i++)
		pad[i] = k[i] ^ 0x5c;
	kvp__sha256_init(&s);
	kvp__sha256_update(&s, pad, 64);
	kvp__sha256_update(&s, inner, sizeof(inner));
	kvp__sha256_final(&s, out);
	memset(k, 0, sizeof(k));
	memset(pad, 0, sizeof(pad));
	memset(inner, 0, sizeof(inner));
}

int kvp__ct_equal(const void *a, const void *b, size_t n)
{
	const volatile uint8_t *x = a, *y = b;
	uint8_t d = 0;
	size_t i;

	for (i = 0; i < n; i++)
		d |= x[i] ^ y[i];
	return d == 0;
}
