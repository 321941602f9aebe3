// SPDX-License-Identifier: MIT
/*
 * Leases as arithmetic on byte buffers (lease.h): the bucket of a key, an
 * entry's fingerprint, grant, withdrawal and the consumer's check; and
 * SipHash-2-4 for the progress records' keyed check. No verbs call.
 */
#include <errno.h>
#include <stddef.h>
#include <string.h>

#include "lease.h"

static inline uint64_t get64(const uint8_t *p)
{
	uint64_t v;

	memcpy(&v, p, 8);
	return v; /* little endian hosts only (the library's wire rule) */
}

static inline void put64(uint8_t *p, uint64_t v)
{
	/* One 8-byte store: a reader sees the old or the new value. */
	__atomic_store_n((uint64_t *)(void *)p, v, __ATOMIC_RELEASE);
}

uint32_t kvp__lease_bucket(uint64_t engine, uint64_t req_id, uint32_t log2)
{
	uint64_t h = kvp__mix64(req_id ^ kvp__mix64(engine ^ 0x6c65617365ull));

	return log2 ? (uint32_t)(h >> (64 - log2)) : 0;
}

uint64_t kvp__lease_fp(uint64_t engine, uint64_t req_id, uint64_t gen)
{
	return kvp__mix64(gen ^ kvp__mix64(req_id ^ kvp__mix64(engine)));
}

int kvp__lease_grant(uint8_t *b, uint64_t engine, uint64_t req_id,
		     uint64_t gen)
{
	uint32_t i;

	for (i = 0; i < KVP_LEASE_BUCKET; i++) {
		uint8_t *e = b + i * KVP_LEASE_ENT;

		if (get64(e))
			continue;
		/* fp first: until gen is set the entry matches nothing, and
		 * a read between the two stores mixes this grant's fp with
		 * gen 0 or an old gen (neither matches). */
		put64(e + 8, kvp__lease_fp(engine, req_id, gen));
		put64(e, gen);
		return (int)i;
	}
	return -ENOSPC;
}

void kvp__lease_withdraw(uint8_t *b, uint32_t i)
{
	put64(b + (size_t)i * KVP_LEASE_ENT, 0);
	/* Before anything that follows (the event, hence the engine's
	 * reuse of the request's blocks). */
	__atomic_thread_fence(__ATOMIC_SEQ_CST);
}

int kvp__lease_check(const uint8_t *b, uint64_t engine, uint64_t req_id,
		     uint32_t inc, uint64_t want, uint64_t *gen)
{
	uint32_t i;

	for (i = 0; i < KVP_LEASE_BUCKET; i++) {
		const uint8_t *e = b + i * KVP_LEASE_ENT;
		uint64_t g = get64(e);

		if (!g || (uint32_t)(g >> 32) != inc || (want && g != want) ||
		    get64(e + 8) != kvp__lease_fp(engine, req_id, g))
			continue;
		*gen = g;
		return 0;
	}
	return -ESTALE;
}

/* ---- SipHash-2-4 ------------------------------------------------------- */

#define ROTL(x, b) (((x) << (b)) | ((x) >> (64 - (b))))

#define SIPROUND                                                        \
	do {                                                            \
		v0 += v1;                                               \
		v1 = ROTL(v1, 13);                                      \
		v1 ^= v0;                                               \
		v0 = ROTL(v0, 32);                                      \
		v2 += v3;                                               \
		v3 = ROTL(v3, 16);                                      \
		v3 ^= v2;                                               \
		v0 += v3;                                               \
		v3 = ROTL(v3, 21);                                      \
		v3 ^= v0;                                               \
		v2 += v1;                                               \
		v1 = ROTL(v1, 17);                                      \
		v1 ^= v2;                                               \
		v2 = ROTL(v2, 32);                                      \
	} while (0)

uint64_t kvp__siphash(const uint64_t k[2], const uint64_t *w, uint32_t n)
{
	uint64_t v0 = k[0] ^ 0x736f6d6570736575ull;
	uint64_t v1 = k[1] ^ 0x646f72616e646f6dull;
	uint64_t v2 = k[0] ^ 0x6c7967656e657261ull;
	uint64_t v3 = k[1] ^ 0x7465646279746573ull;
	uint64_t m;
	uint32_t i;

	for (i = 0; i <= n; i++) {
		/* The last block: the length in bytes in its top byte (a
		 * whole number of words: no tail bytes). */
		m = i < n ? w[i] : (uint64_t)(n * 8) << 56;
		v3 ^= m;
		SIPROUND;
		SIPROUND;
		v0 ^= m;
	}
	v2 ^= 0xff;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	SIPROUND;
	return v0 ^ v1 ^ v2 ^ v3;
}
