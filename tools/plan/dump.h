/* SPDX-License-Identifier: MIT */
/*
 * kvpull-plan's pieces (tools/kvpull-plan.c is main): options and the two
 * engines (args.c), the plan and what is derived from it (dump.c), the
 * request (request.c), the other consumer ranks the picture draws or marks
 * as replicas (ranks.c), the outputs (text.c, json.c, svg.c), and the
 * errors all of them call (errors.c, which calls none). Public API only. Every
 * failure ends the program: usage_error() exits 2, die() 1.
 */
#ifndef KVP_TOOL_DUMP_H
#define KVP_TOOL_DUMP_H

#include <stddef.h>
#include <stdint.h>

#include "defaults.h"
#include "kvpull.h"
#include "names.h"

#define PROG "kvpull-plan"
/* Where `make install` puts the JSON schema of --json (the build may set
 * KVP_DATADIR to $(PREFIX)/share/kvpull); tools/ in the source tree. */
#ifndef KVP_DATADIR
#define KVP_DATADIR "/usr/local/share/kvpull"
#endif
#define KVP_SCHEMA KVP_DATADIR "/kvpull-plan.schema.json"
#define MAX_GROUPS 64
#define DEFAULT_NUM_BLOCKS 1024
#define DEFAULT_BLOCK TOOL_DEFAULT_BLOCK_TOKENS

#define PLURAL(n) ((n) == 1 ? "" : "s")

/* ---- options (args.c) ---- */

struct idlist {
	uint32_t *id;
	uint32_t n;
};

/* One engine: built from the preset, or parsed from a spec file. */
struct side {
	const char *what; /* "local" or "remote" */
	const char *spec; /* file, or NULL for the preset */
	struct kvp_model m;
	struct kvp_engine_desc e;
	int have_tp, have_rank, have_block, have_kblock, have_layout,
		have_conv;
	kvp_layout *l;
};

struct opts {
	struct side loc, rem;
	const char *model;
	int have_layers, have_kv_heads, have_head_dim, have_dtype, have_nblocks;
	uint32_t layers, kv_heads, head_dim, dtype, nblocks;
	uint32_t max_sge, max_read; /* 0: an agent's defaults (defaults.h) */
	int json, brief, timing;
	const char *svg; /* --svg FILE, or NULL */
	int svg_all_ranks; /* --svg-all-ranks: a panel per consumer rank */
	int have_svg_request;
	uint32_t svg_request;
	int have_request, have_hit, have_tokens;
	uint32_t request, hit;
	uint64_t tokens;
	struct idlist lids[MAX_GROUPS], rids[MAX_GROUPS];
	uint32_t nlids, nrids;
	const char *range; /* --range L0:L1[:T0:T1], or NULL */
};

/* Fills *o from the command line; --help prints the usage and exits 0. */
void parse_opts(int argc, char **argv, struct opts *o);
/* Builds o->loc.l and o->rem.l from the preset or the spec files. */
void build_sides(struct opts *o);
/* Frees the id lists and both layouts. */
void free_opts(struct opts *o);

/* ---- the request (request.c) ---- */

/* What a request needs of one group: the rule of kvp_ids (kvpull.h). */
struct need {
	uint32_t skip, lend, rend;
	uint64_t tokens;
};

struct request {
	struct kvp_ids ids[MAX_GROUPS];
	struct need need[MAX_GROUPS];
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	uint32_t nwr;
	uint64_t bytes, naive, naive_group[MAX_GROUPS], wrs_group[MAX_GROUPS];
	uint64_t bytes_group[MAX_GROUPS];
	int overlap;
	uint32_t overlap_g[2], overlap_region;
	int ranged;		   /* the READs are --range's only */
	struct kvp_emit_range range;
};

/* Builds the ids of every group from the options, emits the request into
 * *rq (zeroed by the caller) and counts it; warns on stderr when two local
 * SGEs overlap. */
void make_request(const struct opts *o, const kvp_plan *plan,
		  const struct kvp_plan_group *pg, uint32_t ngroups,
		  struct request *rq);
void free_request(struct request *rq, const struct opts *o,
		  uint32_t ngroups);

/* ---- the plan and what is derived from it (dump.c) ---- */

struct dump {
	struct opts *o;
	kvp_plan *plan;
	struct kvp_plan_info info;
	struct kvp_plan_group pg[MAX_GROUPS];
	int *src_rank, *notify_rank;
	int *expected; /* per producer rank */
	uint32_t remote_tp;
	double compile_us;
	uint32_t *lkinds, *rkinds; /* per view: a bit per field kind */
	struct request rq;
	int have_request;
};

/* Compiles the plan of o's two layouts and fills *d (zeroed by the caller). */
void compute(struct opts *o, struct dump *d);
/* Only the plan of consumer layout `local` (o->loc.l, or the same engine's
 * layout at another rank) against o->rem.l: d's plan, info, groups,
 * sources and remote_tp (d zeroed by the caller; free_dump() frees it). */
void compile_plan(struct opts *o, const kvp_layout *local, struct dump *d);
void free_dump(struct dump *d);
/* plan_title()'s flags: whether they are an agent's defaults; every
 * consumer rank ("ranks 0-3") instead of the plan's one. */
#define TITLE_TAIL 1
#define TITLE_ALL_RANKS 2
/* The title line: both engines (TP, layout), max_sge and the READ cap
 * the plan was made with; flags as above. */
void plan_title(const struct dump *d, int flags, char *buf, size_t len);
/* Whether source index s serves group g. */
int serves(const struct dump *d, uint32_t g, uint32_t s);
uint32_t view_layer(const kvp_layout *l, uint32_t view);
/* A byte count for people: "2.50 MiB", or "512 B"; returns buf. */
const char *human(uint64_t b, char *buf, size_t n);
/* Field kinds of a bit set, as "k+v". */
void kinds_name(uint32_t kinds, char *buf, size_t len);

/* ---- other consumer ranks (ranks.c) ---- */

/* Fills *d (zeroed by the caller) with the plan of consumer rank `rank`
 * (below the local TP size): the local engine's layout at that rank
 * against the same producer; free_dump() frees it. */
void plan_at_rank(struct opts *o, uint32_t rank, struct dump *d);

/* What the other consumer ranks read of the producer bytes one (group,
 * source) of a plan reads: n ranks, the lowest and the highest; `partial`
 * when some of them read only part of those bytes. */
struct share {
	uint32_t n, lo, hi;
	int partial;
};

/* For the plans pd[0..n-1] of distinct consumer ranks of o's engines:
 * sh[i][g * nsrc + s] (nsrc of pd[i]) says which other consumer ranks read
 * some of the producer bytes that source s of pd[i] reads for group g.
 * Compiles the plan of every other rank whose shards overlap one of theirs
 * (none when the consumer's shards are disjoint). sh[i] are new arrays. */
void find_replicas(struct opts *o, const struct dump *const *pd, uint32_t n,
		   struct share **sh);

/* ---- output ---- */

void print_text(const struct dump *d); /* text.c */
void print_json(const struct dump *d); /* json.c */
/* Writes the SVG picture of the plan to o->svg (svg.c); dies on error. */
void write_svg(const struct dump *d);

/* ---- errors and checked accessors (errors.c) ---- */

__attribute__((noreturn, format(printf, 1, 2))) void usage_error(
	const char *fmt, ...);
__attribute__((noreturn, format(printf, 1, 2))) void die(const char *fmt,
							  ...);
/* calloc that dies on failure and never returns NULL for n == 0. */
void *xcalloc(size_t n, size_t size);

/* For the library's getters, called with indices below its counts:
 * checked(kvp_layout_get_view(l, i, &v), "view", i) dies if it refuses. */
void checked(int err, const char *what, uint32_t i);

#endif
