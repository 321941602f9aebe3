/* SPDX-License-Identifier: MIT */
/* Internal structures of plan/: layouts and compiled plans. Never installed. */
#ifndef KVP_PLAN_INTERNAL_H
#define KVP_PLAN_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include "kvpull.h"

#define kvp_likely(x) __builtin_expect(!!(x), 1)
#define kvp_unlikely(x) __builtin_expect(!!(x), 0)
#define KVP_HIDDEN __attribute__((visibility("hidden")))
#define MAX_WR_LEN (1u << 31) /* IB's largest message */

struct kvp_field {
	struct kvp_field_desc d;
	uint32_t view;
};

struct kvp_layout {
	struct kvp_layout_attr attr;
	struct kvp_group_desc *groups;
	uint64_t *regions; /* sizes */
	uint64_t *raddr;   /* per region: address on its owner, or 0 */
	uint32_t *rkey;	   /* per region: remote key, or 0 */
	/* Per region: 0, or the log2 of its MR stride when it has several
	 * keys (kvp_layout_set_region_keys()); then xkeys[i] holds its keys
	 * 1 to n - 1 (rkey[i] is key 0), else NULL. */
	uint8_t *mrshift;
	uint32_t **xkeys;
	struct kvp_view_desc *views;
	struct kvp_field *fields;
	uint32_t ngroups, nregions, nviews, nfields;
	uint32_t cap_groups, cap_regions, cap_views, cap_fields;
	/* Open-addressed set of the fields' (group, layer, kind) keys, so a
	 * duplicate is found in O(1) and a decode stays linear: slot = field
	 * index + 1, 0 when free; nslots is 0 or a power of two above twice
	 * nfields. */
	uint32_t *fslots;
	uint32_t nslots;
};

/* A piece template, relative to the pages of one period. */
struct kvp_piece {
	uint32_t roff, loff, len;
	uint16_t rbi, lbi;
};

/* Pieces shared by every stream of the same geometry. */
struct kvp_pset {
	uint32_t first, count;
	uint32_t group;
	uint32_t bytes; /* per period */
};

struct kvp_pstream {
	uint32_t lview, rview;	/* model layer: kvp_plan.rlayer[rview] */
	uint16_t src, set;
	/* On the first stream of a gather: its index + 1 in the plan's
	 * gathers, and emission reads the gather's streams (this one and the
	 * n - 1 after it) as one; GATHER_MEMBER on the others, which emission
	 * never visits on their own; 0 on a stream read alone. */
	uint32_t gather;
};
#define GATHER_MEMBER UINT32_MAX

/*
 * A gather: streams of one source, group and remote region (same page
 * stride, views less than a page apart) whose pieces are remote-adjacent,
 * emitted as one walk over their pieces merged in remote order, so that a
 * READ runs across streams with one SGE per local piece. Decided at compile
 * time: emission stays a flat walk.
 */
struct kvp_pgather {
	uint32_t set;	/* into gsets */
	uint32_t rview; /* the view gpieces' remote offsets count from */
	uint32_t n;	/* streams */
};

/* A gather's pieces: gpieces[first .. first + count), shared by gathers
 * of the same member sets and view distances (one per layer, typically). */
struct kvp_gset {
	uint32_t first, count;
};

/* A piece of a gather: as struct kvp_piece, its remote offset counted from
 * the gather's remote view, and `m`: the stream (from the gather's first)
 * whose local view it lands in. */
struct kvp_gpiece {
	uint32_t roff, loff, len;
	uint16_t rbi, lbi;
	uint32_t m;
};

struct kvp_pview {
	uint64_t offset;
	uint32_t region;
	uint32_t stride;
};

struct kvp_pgroup {
	uint32_t kind;
	uint32_t ltok, rtok, period;
	uint32_t lper, rper;
	uint32_t lblocks, rblocks;
	uint64_t pieces; /* per period, all streams of the group */
	uint64_t src_mask;
};

struct kvp_plan {
	uint32_t ngroups, nsrc, nnotify, nstreams, nsets, npieces;
	uint32_t nlviews, nrviews;
	uint32_t local_tp, local_rank, remote_tp, max_sge;
	uint32_t max_len;   /* bytes per READ at most; no piece is longer */
	uint32_t merge_len; /* a piece joins a READ only if the sum is at most
			     * this: max_len, or 0 with KVP_PLAN_NO_COALESCE */
	uint64_t bytes;
	struct kvp_pgroup *groups;
	uint16_t *src;	  /* producer rank per source index */
	uint16_t *notify; /* producer ranks to notify */
	struct kvp_pstream *streams;
	struct kvp_pset *sets;
	struct kvp_piece *pieces;
	struct kvp_pview *lviews, *rviews;
	uint16_t *rlayer; /* per remote view: its model layer (ranges; below
			   * KVP_MAX_LAYERS), apart so that a stream stays
			   * 16 bytes */
	uint32_t ngathers, ngsets, ngpieces;
	struct kvp_pgather *gathers;
	struct kvp_gset *gsets;
	struct kvp_gpiece *gpieces;
	/* everything above lives in this one allocation */
};

/* Formats a message into msg[msglen] if msg is not NULL. */
KVP_HIDDEN void kvp__msg(char *msg, size_t msglen, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* kvp_layout_build_msg(), and in *key (if not NULL) the name of the struct
 * kvp_model or kvp_engine_desc member most to blame for a failure, as the
 * spec's model form spells it, or NULL when no one member is (spec.c points
 * at that key's line). */
KVP_HIDDEN int kvp__layout_build(const struct kvp_model *m,
				 const struct kvp_engine_desc *e,
				 kvp_layout **out, char *msg, size_t msglen,
				 const char **key);

/* The spec name of a group kind ("full", "sliding", "mla", "state"), or
 * "?" out of range. */
KVP_HIDDEN const char *kvp__group_name(uint32_t kind);

/* Keys of a region of `size` bytes registered with MR stride 2^shift. */
static inline uint64_t kvp__region_nkeys(uint64_t size, uint32_t shift)
{
	return shift ? (size >> shift) + !!(size & ((1ull << shift) - 1)) : 1;
}

/* wire.c: adds a blob's records (p: after the header; count: groups,
 * regions, views, fields, checked against the blob's length by the caller)
 * to l with the public builders; keys: the version 2 key table and its
 * length in bytes (NULL, 0: none), never read past. 0, or
 * kvp_meta_decode()'s error. For kvp_meta_decode() and the fuzz target
 * that re-hashes mutated blobs. */
KVP_HIDDEN int kvp__meta_records(kvp_layout *l, const uint8_t *p,
				 const uint32_t *count, const uint8_t *keys,
				 uint64_t keys_len);

/* Producer ranks [lo, hi) that consumer rank c of D notifies to cover all
 * P producers. */
KVP_HIDDEN void kvp__notify_cover(uint32_t c, uint32_t D, uint32_t P,
				  uint32_t *lo, uint32_t *hi);

static inline uint64_t kvp__gcd(uint64_t a, uint64_t b)
{
	while (b) {
		uint64_t t = a % b;
		a = b;
		b = t;
	}
	return a;
}

/* need.c: what a request needs of one group, in the group's block
 * numbering. */
#define MAX_GROUPS 64 /* compile.c's limit; emit.c's needs hold one bit each */
struct need {
	uint32_t skip;	/* first local block of the sequence that is read */
	uint32_t lend;	/* one past the last local block */
	uint32_t rend;	/* remote blocks that hold tokens */
	uint32_t k0, k1; /* periods to walk */
	/* A range's periods (kvp_plan_emit_range_*()): k in [ka, kb) of the
	 * walk above; 0 and UINT32_MAX for the whole request. */
	uint32_t ka, kb;
	uint64_t tokens; /* the sequence's, for a range's clip; 0: STATE */
};

/* The need of one group: O(1), no id read. -EINVAL for lists that do not
 * fit the group (NULL with a length, unequal STATE lists, more local
 * blocks than the sequence spans, tokens past the remote blocks). */
KVP_HIDDEN int kvp__group_need(const struct kvp_pgroup *pg,
			       const struct kvp_ids *id, struct need *n);
/* Clips a group's need to the periods of range r. */
KVP_HIDDEN void kvp__need_clip(const struct kvp_pgroup *pg, struct need *n,
			       const struct kvp_emit_range *r);
/* Every group's need, then every id against its bound: all -EINVAL cases
 * before any -ERANGE one. */
KVP_HIDDEN int kvp__plan_prepare(const kvp_plan *p, const struct kvp_ids *ids,
				 struct need *nd);

#endif
