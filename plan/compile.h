/* SPDX-License-Identifier: MIT */
/*
 * What the files of plan compilation share (no other file includes it):
 * their work state and the functions one of them calls in another. The
 * files stand in floors, each calling only files below it (and layout.c's
 * kvp__msg()):
 *
 *   notify.c   kvp_notify_expected()           compile.c, match.c
 *   compile.c  kvp_plan_compile(): the steps,  match.c, refine.c,
 *              bounds, the plan's layout        streams.c, gather.c, imap.c
 *   gather.c   gathers across streams          imap.c
 *   streams.c  shapes, piece sets, streams     match.c, refine.c, imap.c
 *   refine.c   pieces of one period            match.c
 *   match.c    fields matched, ranks' boxes    spec.c (kvp__group_name())
 *   imap.c     the hash map                    nothing
 *
 * tests/check_floors.sh fails the build's checks on a call cycle.
 */
#ifndef KVP_PLAN_COMPILE_H
#define KVP_PLAN_COMPILE_H

#include <stddef.h>
#include <stdint.h>

#include "internal.h"

#define MAX_GROUPS 64
#define MAX_PIECES_PER_SET (1u << 20)

/* ---- match.c ---------------------------------------------------------- */

/* Field kind names for messages ("K", "V", "latent", ...). */
KVP_HIDDEN extern const char *const kvp__kind_name[KVP_FIELD_KIND_COUNT];

/* Per-axis view of one field: the rank's range and the global extent. */
struct axes {
	uint32_t start[KVP_AXIS_COUNT], len[KVP_AXIS_COUNT];
	uint32_t total[KVP_AXIS_COUNT];
	int sharded; /* axis index or -1 */
};

/* The axes of field f on rank `rank` of tp; -EPROTO when
 * kvp_shard_range() refuses f's shard. */
KVP_HIDDEN int kvp__field_axes(const struct kvp_field_desc *f, uint32_t tp,
			       uint32_t rank, struct axes *a);

/* A matched pair of fields and what the consumer needs of it. */
struct match {
	uint32_t lf, rf;
};

/* l's field indices sorted by (group, layer, kind), for kvp__find_field();
 * NULL when out of memory. The caller frees. */
KVP_HIDDEN uint32_t *kvp__sorted_fields(const kvp_layout *l);
/* The field of r (idx: kvp__sorted_fields(r)) with the key of l's field lf,
 * or -1. */
KVP_HIDDEN int kvp__find_field(const kvp_layout *r, const uint32_t *idx,
			       const kvp_layout *l, uint32_t lf);
/* 0 when l and r have the same groups (count and kinds), else -EPROTO and
 * the reason in msg. */
KVP_HIDDEN int kvp__check_groups(const kvp_layout *l, const kvp_layout *r,
				 char *msg, size_t msglen);
/* 0 when every field of each side has its match (ridx: r's sorted
 * fields) holding the same data; -EPROTO and the reason, or -ENOMEM. */
KVP_HIDDEN int kvp__match_fields(const kvp_layout *l, const kvp_layout *r,
				 const uint32_t *ridx, char *msg,
				 size_t msglen);

/* One box of a field pair read from one producer rank. */
struct seg {
	uint32_t rank;
	uint32_t axis; /* remote sharded axis, or KVP_AXIS_COUNT */
	uint32_t lo, hi;
};

/* The boxes consumer rank `rank` reads of a field pair, one per producer
 * rank: at most max written, their count returned, or -EPROTO. */
KVP_HIDDEN int kvp__segments(const struct kvp_field_desc *lfd, uint32_t ltp,
			     uint32_t rank, const struct kvp_field_desc *rfd,
			     uint32_t rtp, struct seg *out, uint32_t max);

/* ---- refine.c --------------------------------------------------------- */

/* A growing array of piece templates. */
struct pvec {
	struct kvp_piece *p;
	uint32_t n, cap;
	/* Piece templates still allowed to be made (generated, before any
	 * merge) in this compilation: KVP_PLAN_MAX_WORK at its start. */
	uint64_t budget;
};

/* One period of a group: tokens (0 for a state group), and blocks of each
 * side in it. */
struct period {
	uint32_t tokens, lper, rper;
};

/* Group g's period into *p; -EPROTO (reason in msg) when it has none. */
KVP_HIDDEN int kvp__period_of(const kvp_layout *l, const kvp_layout *r,
			      uint32_t g, struct period *p, char *msg,
			      size_t msglen);
/* notify.c: kvp_notify_expected() for a producer's handshake, with no
 * piece made: the layouts' field-level checks (groups, periods, every
 * field matched; the reason in msg), then each consumer rank's sources
 * from its segments. Equal to kvp_notify_expected() whenever every
 * consumer rank's plan compiles; a consumer rank whose plan cannot be
 * built (dims that do not refine, over KVP_PLAN_MAX_WORK) is counted as
 * its sources would be, and refuses itself. Linear in consumer ranks x
 * field kinds x segments: a peer's blob costs a producer no compilation.
 * The count (>= 1), -EPROTO, -EINVAL, -ENOMEM. */
KVP_HIDDEN int kvp__notify_count(const kvp_layout *prod,
				 const kvp_layout *cons, uint32_t producer,
				 char *msg, size_t msglen);

/* kvp_plan_compile() with *budget piece templates to make at most (the
 * rest left there on return, on success or failure): kvp_notify_expected()
 * spends one KVP_PLAN_MAX_WORK over all its compilations. */
KVP_HIDDEN int kvp__plan_compile(const kvp_layout *l, const kvp_layout *r,
				 const struct kvp_plan_attr *attr,
				 kvp_plan **out, char *msg, size_t msglen,
				 uint64_t *budget);

/* Appends to out the pieces of one field pair's segment sg for one period;
 * 0, -EPROTO (the sides do not refine, or a limit), -EFBIG (more pieces
 * than out->budget, counted before any is made) or -ENOMEM. */
KVP_HIDDEN int kvp__field_pieces(const struct kvp_field_desc *lf, uint32_t ltp,
				 uint32_t lrank,
				 const struct kvp_field_desc *rf, uint32_t rtp,
				 const struct seg *sg, const struct period *per,
				 struct pvec *out);
/* Sorts p[n] in remote order, merges neighbours; returns the new count. */
KVP_HIDDEN uint32_t kvp__merge_pieces(struct kvp_piece *p, uint32_t n);
/* Cuts v's pieces from `first` on into pieces of at most cap bytes; 0,
 * -EPROTO (too many) or -ENOMEM. */
KVP_HIDDEN int kvp__split_pieces(struct pvec *v, uint32_t first, uint32_t cap);

/* ---- imap.c ----------------------------------------------------------- */

/* An open-addressing map from a 32-bit hash to indices, the caller's
 * callback deciding equality: lookups in O(1) where a linear search over
 * peer-declared views or shape pairs would make compilation quadratic. */
struct imap {
	uint32_t *slot; /* index + 1, 0 for empty */
	uint32_t *hash;
	uint32_t n, used;
};

/* Makes room for one more entry: 0 or -ENOMEM. */
KVP_HIDDEN int kvp__imap_reserve(struct imap *m);
KVP_HIDDEN void kvp__imap_free(struct imap *m);

/* The slot holding an index equal (by eq) to the key of hash h, or the
 * empty slot where it goes. Call kvp__imap_reserve() first. */
static inline uint32_t kvp__imap_probe(const struct imap *m, uint32_t h,
				       int (*eq)(const void *ctx, uint32_t idx),
				       const void *ctx)
{
	uint32_t s;

	for (s = h & (m->n - 1); m->slot[s]; s = (s + 1) & (m->n - 1))
		if (m->hash[s] == h && eq(ctx, m->slot[s] - 1))
			break;
	return s;
}

/* Puts idx into the empty slot s found for hash h. */
static inline void kvp__imap_put(struct imap *m, uint32_t s, uint32_t h,
				 uint32_t idx)
{
	m->slot[s] = idx + 1;
	m->hash[s] = h;
	m->used++;
}

/* Mixes v into hash h (the maps' keys). */
static inline uint32_t kvp__mix(uint32_t h, uint64_t v)
{
	h ^= (uint32_t)v + 0x9e3779b9u + (h << 6) + (h >> 2);
	v >>= 32;
	h ^= (uint32_t)v + 0x9e3779b9u + (h << 6) + (h >> 2);
	return h;
}

/* ---- streams.c -------------------------------------------------------- */

/* Fields of each view: view v holds list[first[v] .. first[v + 1]). */
struct csr {
	uint32_t *first, *list;
};

/* c: the fields of each view of l; 0 or -ENOMEM (kvp__csr_free() either
 * way). */
KVP_HIDDEN int kvp__view_csr(const kvp_layout *l, struct csr *c);
KVP_HIDDEN void kvp__csr_free(struct csr *c);
/* shape[v]: the shape id of each view of l (c: its kvp__view_csr()); 0 or
 * -ENOMEM. */
KVP_HIDDEN int kvp__view_shapes(const kvp_layout *l, const struct csr *c,
				uint32_t *shape);

/* Where a set's farthest piece ends in a page, on each side. */
struct set_end {
	uint64_t l, r;
};

/* streams.c's own, and the gathers' (below) */
struct pair;
struct rseg;
struct set_key;
struct gwork;

/* One compilation's state: kvp_plan_compile() owns it; streams.c fills
 * the sets and streams, gather.c reads them. */
struct work {
	const kvp_layout *l, *r;
	char *msg;
	size_t msglen;
	uint32_t max_sge, max_len, flags;
	uint32_t *lshape, *rshape, *ridx;
	struct csr lcsr, rcsr;
	struct pair *pairs;
	uint32_t npairs, cap_pairs;
	struct imap pmap; /* (lshape, rshape) -> pair */
	struct rseg *rs;  /* segments of the view being planned, by rank */
	uint32_t nrs, cap_rs;
	uint32_t *entries;
	uint32_t nentries, cap_entries;
	struct period per[MAX_GROUPS];
	struct pvec pieces;
	struct kvp_pset *sets;
	struct set_key *keys;
	struct set_end *ends;
	uint32_t nsets, cap_sets;
	struct kvp_pstream *streams; /* src holds the rank until the end */
	uint32_t nstreams, cap_streams;
	uint8_t *used;	 /* per remote rank: read from */
	uint64_t *gmask; /* per group: ranks (< 64) read from */
	uint8_t *gused;	 /* per group x remote rank */
	struct gwork *gw; /* the gathers, once found */
};

/* Plans local view lv (m: room for twice its fields) into w's sets and
 * streams; 0, -EPROTO (reason in w->msg) or -ENOMEM. */
KVP_HIDDEN int kvp__plan_view(struct work *w, uint32_t lv, struct match *m);
/* Orders w's streams by source rank, stable; 0 or -ENOMEM. */
KVP_HIDDEN int kvp__sort_streams(struct work *w);

/* ---- gather.c --------------------------------------------------------- */

/* What kvp__gathers() builds, then build_plan() copies. */
struct gwork {
	struct kvp_pgather *g;
	uint32_t ng, cap_g;
	struct kvp_gset *sets;
	uint32_t *keys;	 /* per set: 2n words, (member set, view distance) */
	uint32_t *kfirst, *kn; /* per set: where its key starts, n */
	uint32_t nsets, cap_sets;
	uint32_t nkeys, cap_keys;
	struct kvp_gpiece *p;
	uint32_t np, cap_p;
	struct imap map; /* key -> set */
};

/* Finds w's gathers into g and moves their streams together (after
 * kvp__sort_streams()); 0 or -ENOMEM. */
KVP_HIDDEN int kvp__gathers(struct work *w, struct gwork *g);
KVP_HIDDEN void kvp__gwork_free(struct gwork *g);

#endif
