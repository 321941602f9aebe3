/* SPDX-License-Identifier: MIT */
/*
 * Latency histograms at constant cost per observation: fixed buckets, one
 * per power of two of nanoseconds, so that an observation's bucket is a
 * count of leading zeros, never a search; no allocation (the counts live
 * in the agent). Pure: no verbs call, tests/test_metrics.c runs it on the
 * host. expo.c writes them out (Prometheus histograms, JSON).
 *
 * Bucket i (0 <= i < KVP_HIST_FINITE) counts observations of at most
 * 2^(KVP_HIST_LOG2_MIN + i) ns and more than the bucket below's bound:
 * 256 ns, 512 ns, ... 2^35 ns (34.4 s). The last bucket counts what lies
 * beyond (Prometheus' le="+Inf" is the total). Counts are kept per bucket
 * and made cumulative when written.
 */
#ifndef KVP_VERBS_HIST_H
#define KVP_VERBS_HIST_H

#include <stdint.h>

#define KVP_HIST_LOG2_MIN 8u
#define KVP_HIST_LOG2_MAX 35u
#define KVP_HIST_FINITE (KVP_HIST_LOG2_MAX - KVP_HIST_LOG2_MIN + 1u)
#define KVP_HIST_BUCKETS (KVP_HIST_FINITE + 1u) /* and the overflow */

struct kvp_hist {
	uint64_t n[KVP_HIST_BUCKETS];
	uint64_t sum_ns;
};

/* The bucket of an observation of ns nanoseconds: the first whose bound
 * 2^k ns is >= ns (k = ceil(log2 ns)), clamped to the range. */
static inline uint32_t kvp__hist_bucket(uint64_t ns)
{
	uint32_t k = ns > 1 ? 64u - (uint32_t)__builtin_clzll(ns - 1) : 0u;

	k = k < KVP_HIST_LOG2_MIN ? 0u : k - KVP_HIST_LOG2_MIN;
	return k < KVP_HIST_FINITE ? k : KVP_HIST_FINITE;
}

/* Bucket i's bound in ns (i < KVP_HIST_FINITE). */
static inline uint64_t kvp__hist_bound_ns(uint32_t i)
{
	return 1ull << (KVP_HIST_LOG2_MIN + i);
}

static inline void kvp__hist_add(struct kvp_hist *h, uint64_t ns)
{
	h->n[kvp__hist_bucket(ns)]++;
	h->sum_ns += ns;
}

static inline uint64_t kvp__hist_count(const struct kvp_hist *h)
{
	uint64_t t = 0;
	uint32_t i;

	for (i = 0; i < KVP_HIST_BUCKETS; i++)
		t += h->n[i];
	return t;
}

#endif
