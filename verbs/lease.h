/* SPDX-License-Identifier: MIT */
/*
 * Leases: how a consumer proves, with one READ and no producer CPU, that
 * the bytes it read were held for its request while it read them.
 *
 * A producer rank keeps a lease table in memory registered for remote
 * READ (one MR, registered at listen): KVP_LEASE_BUCKET entries per
 * bucket, a power of two of buckets, at least 2 per request it can hold
 * (max_inflight), so that a bucket holds one lease on average every
 * fourth and a full bucket (all eight taken) is a chance below 1e-7 per
 * expect(). A lease's bucket follows from its key, (consumer engine id,
 * req_id): the consumer knows where to READ without asking. An entry is
 *   u64 gen   the lease's generation: the producer's incarnation (32
 *             random bits drawn at agent open) above a counter of grants
 *             (never 0); 0 when the entry is free or withdrawn
 *   u64 fp    kvp__lease_fp(engine, req_id, gen)
 * and a request holds a lease from kvp_agent_expect() until the producer
 * reports it RELEASED or EXPIRED: it is withdrawn (gen zeroed, then a full
 * fence) before the event is queued, so before the engine can hear of it
 * and reuse a block.
 *
 * The consumer READs the key's bucket (KVP_LEASE_READ bytes) on that
 * rank's first queue pair: right behind the request's READs from that
 * rank when that queue pair carried all of them (its READs execute in
 * order), else once all of them completed. It looks for an entry whose
 * fp matches its key and the
 * entry's own gen, of the producer's incarnation (learned at GO) and, for
 * a streamed pull, of the generation the progress records carried. Found:
 * the lease was held when the bucket was read, after the data READs had
 * completed, so while they ran (the engine reuses blocks only after the
 * withdrawal). Not found (never expected, withdrawn, another request in
 * the entry, another generation): the request ends FAILED, -ESTALE,
 * KVP_REASON_LEASE. A bucket read while the producer writes one of its
 * entries fails closed: gen and fp are written one after the other, and
 * a mix of two grants does not match (fp covers gen, gens never repeat).
 *
 * The same key granted again while a pull of its first grant still reads
 * (the ABA case a generation cannot catch in a bulk pull, whose consumer
 * learns no generation before its READs): the producer refuses
 * kvp_agent_expect() of a reported key for its linger (30 s) while its
 * tombstone lasts, so this takes a scheduler that reuses a request id for
 * the same consumer engine.
 *
 * Pure arithmetic on byte buffers: tests/test_lease.c compiles it alone.
 */
#ifndef KVP_VERBS_LEASE_H
#define KVP_VERBS_LEASE_H

#include <stdint.h>

#define KVP_LEASE_ENT 16
#define KVP_LEASE_BUCKET 8
#define KVP_LEASE_READ (KVP_LEASE_ENT * KVP_LEASE_BUCKET)
/* Buckets per request held, and the most a GO may announce (2^log2). */
#define KVP_LEASE_PER_REQ 2
#define KVP_LEASE_LOG2_MAX 24

/* A 64-bit finaliser (splitmix64's): hashes and fingerprints. */
static inline uint64_t kvp__mix64(uint64_t x)
{
	x ^= x >> 30;
	x *= 0xbf58476d1ce4e5b9ull;
	x ^= x >> 27;
	x *= 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

/* The bucket of (engine, req_id) among 2^log2. */
uint32_t kvp__lease_bucket(uint64_t engine, uint64_t req_id, uint32_t log2);

/* An entry's fingerprint: covers the key and the entry's generation. */
uint64_t kvp__lease_fp(uint64_t engine, uint64_t req_id, uint64_t gen);

/* Grants a lease for (engine, req_id) of generation gen (non-zero) in
 * bucket b (KVP_LEASE_READ bytes): the index of its entry, or -ENOSPC
 * when the bucket is full. */
int kvp__lease_grant(uint8_t *b, uint64_t engine, uint64_t req_id,
		     uint64_t gen);

/* Withdraws entry i of bucket b, then fences: a READ that follows sees it
 * gone. */
void kvp__lease_withdraw(uint8_t *b, uint32_t i);

/* A bucket as READ by a consumer: 0 when it holds a lease for (engine,
 * req_id) of incarnation `inc` (the gen's upper 32 bits) and, when want
 * is not 0, of generation `want`; its gen in *gen. -ESTALE otherwise. */
int kvp__lease_check(const uint8_t *b, uint64_t engine, uint64_t req_id,
		     uint32_t inc, uint64_t want, uint64_t *gen);

/* SipHash-2-4 (Aumasson and Bernstein) of n little-endian 64-bit words,
 * keyed by k[0], k[1]: the check of a progress record, keyed per
 * connection, so that only the two ends of that connection can make a
 * record that passes. */
uint64_t kvp__siphash(const uint64_t k[2], const uint64_t *w, uint32_t n);

#endif
