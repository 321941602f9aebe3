/* SPDX-License-Identifier: MIT */
/*
 * The metrics exposition writer (kvp_agent_metrics()): metric families
 * written into a caller's buffer, in the Prometheus text format (version
 * 0.0.4) or in JSON, as snprintf() writes: what fits, NUL-terminated, and
 * the length the whole needs. No allocation, no system call, no stdio.
 * Pure: tests/test_metrics.c checks its bytes on the host; metrics.c walks
 * an agent with it.
 *
 * Families come grouped by type, counters first, then gauges, then
 * histograms (JSON keeps them apart under "counters", "gauges" and
 * "histograms"; the text format needs no order but gets the same):
 *
 *   struct kvp_expo w;
 *   kvp__expo_init(&w, buf, cap, 0);
 *   kvp__expo_family(&w, "kvpull_pulls_total", KVP_MT_COUNTER, "...");
 *   kvp__expo_value(&w, NULL, 0, 12);
 *   ...
 *   len = kvp__expo_end(&w);
 *
 * JSON: {"counters":{NAME:[{"labels":{..},"value":V},..],..},
 *        "gauges":{..},
 *        "histograms":{NAME:[{"labels":{..},"count":N,"sum":S,
 *                             "buckets":[[LE,CUMULATIVE],..]},..]}}
 * with every finite bucket (its bound in seconds), "count" standing for
 * +Inf; every section present, empty or not.
 */
#ifndef KVP_VERBS_EXPO_H
#define KVP_VERBS_EXPO_H

#include <stddef.h>
#include <stdint.h>

#include "hist.h"

enum { KVP_MT_COUNTER, KVP_MT_GAUGE, KVP_MT_HISTOGRAM, KVP_MT_COUNT };

struct kvp_label {
	const char *name;
	const char *value;
};

struct kvp_expo {
	char *buf;
	size_t cap;
	size_t len;	    /* bytes the exposition needs so far */
	int json;
	uint32_t section;   /* JSON: sections opened (type + 1), 0: none */
	uint32_t nfam;	    /* JSON: families in the section */
	uint32_t nsample;   /* samples in the family */
	const char *name;   /* the family's */
};

void kvp__expo_init(struct kvp_expo *w, char *buf, size_t cap, int json);
/* Starts family `name` of type t (KVP_MT_*, not below the last one's). */
void kvp__expo_family(struct kvp_expo *w, const char *name, uint32_t t,
		      const char *help);
/* A sample of a counter or gauge family, labels l[0..nl). */
void kvp__expo_value(struct kvp_expo *w, const struct kvp_label *l,
		     uint32_t nl, uint64_t v);
/* A histogram of a histogram family, labels l[0..nl) (no "le"). */
void kvp__expo_hist(struct kvp_expo *w, const struct kvp_label *l,
		    uint32_t nl, const struct kvp_hist *h);
/* Ends the exposition: JSON closed, the buffer NUL-terminated (when cap >
 * 0, at min(len, cap - 1)). Returns the whole's length, NUL excluded. */
size_t kvp__expo_end(struct kvp_expo *w);

/* Writes ns as seconds in decimal ("0.000000256", "34.359738368", "0"):
 * exact, no trailing zeros. out: at least KVP_SECONDS_LEN bytes; returns
 * the length (no NUL written). */
#define KVP_SECONDS_LEN 32
size_t kvp__fmt_seconds(char *out, uint64_t ns);
/* v in decimal; out: at least 20 bytes; returns the length. */
size_t kvp__fmt_u64(char *out, uint64_t v);

#endif
