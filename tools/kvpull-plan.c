// SPDX-License-Identifier: MIT
/*
 * kvpull-plan: compiles the transfer plan of one consumer rank against a
 * producer engine and prints it, as a readable summary or as one JSON
 * document (schema in tools/README.md). Optionally emits one request and
 * prints its work requests. Public API only.
 *
 * Exit status: 0 done, 1 the library refused (layout, spec, plan, request)
 * or a file could not be read, 2 bad usage.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvpull.h"

#define PROG "kvpull-plan"
#define MAX_GROUPS 64
#define DEFAULT_NUM_BLOCKS 1024
#define DEFAULT_BLOCK 16

static const char *const group_names[KVP_GROUP_KIND_COUNT] = {
	"full",
	"sliding",
	"mla",
	"state",
};

static const char *const field_names[KVP_FIELD_KIND_COUNT] = {
	"k",	  "v",	 "latent", "conv_x", "conv_b",
	"conv_c", "ssm", "conv_q", "conv_k", "conv_v",
};

static const char *const axis_names[KVP_AXIS_COUNT] = {
	"token", "head", "dim", "channel", "state", "aux",
};

static const char *const layout_names[KVP_KV_LAYOUT_COUNT] = {
	"flash_nhd",
	"flash_hnd",
	"flashinfer",
	"packed",
};

static const char *const conv_names[KVP_CONV_LAYOUT_COUNT] = { "ds", "sd" };

static const char *const state_names[KVP_STATE_KIND_COUNT] = {
	"none",
	"mamba2",
	"gdn",
};

static const char *name_of(const char *const *names, uint32_t n, uint32_t i)
{
	return i < n ? names[i] : "?";
}

#define NAME(table, i) name_of(table, sizeof(table) / sizeof(table[0]), i)
#define PLURAL(n) ((n) == 1 ? "" : "s")

/* ---- errors ----------------------------------------------------------- */

__attribute__((noreturn, format(printf, 1, 2))) static void usage_error(
	const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '" PROG " --help'.\n");
	exit(2);
}

__attribute__((noreturn, format(printf, 1, 2))) static void die(
	const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, PROG ": ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	exit(1);
}

static void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);

	if (!p)
		die("%s", kvp_strerror(-ENOMEM));
	return p;
}

/* ---- options ---------------------------------------------------------- */

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
	uint32_t max_sge;
	int json, brief, timing;
	int have_request, have_hit, have_tokens;
	uint32_t request, hit;
	uint64_t tokens;
	struct idlist lids[MAX_GROUPS], rids[MAX_GROUPS];
	uint32_t nlids, nrids;
};

static uint64_t parse_u64(const char *opt, const char *s, uint64_t max)
{
	unsigned long long v;
	char *end;

	if (*s < '0' || *s > '9')
		usage_error("%s: '%s' is not a number", opt, s);
	errno = 0;
	v = strtoull(s, &end, 0);
	if (errno || *end || v > max)
		usage_error("%s: bad number '%s'", opt, s);
	return v;
}

static uint32_t parse_u32(const char *opt, const char *s)
{
	return (uint32_t)parse_u64(opt, s, UINT32_MAX);
}

static uint32_t parse_name(const char *opt, const char *s,
			   const char *const *names, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (!strcmp(s, names[i]))
			return i;
	usage_error("%s: unknown value '%s'", opt, s);
}

/* "a,b-c,..." into a new list; ranges are inclusive. */
static void parse_ids(const char *opt, const char *s, struct idlist *out)
{
	uint32_t cap = 16, n = 0;
	uint32_t *id = xcalloc(cap, sizeof(*id));
	const char *p = s;

	while (*p) {
		unsigned long long a, b;
		char *end;

		if (*p < '0' || *p > '9')
			usage_error("%s: bad id list '%s'", opt, s);
		errno = 0;
		a = b = strtoull(p, &end, 0);
		if (*end == '-') {
			p = end + 1;
			if (*p < '0' || *p > '9')
				usage_error("%s: bad id list '%s'", opt, s);
			b = strtoull(p, &end, 0);
		}
		if (errno || a > UINT32_MAX || b > UINT32_MAX || b < a ||
		    (*end && *end != ',') || b - a >= (1u << 24))
			usage_error("%s: bad id list '%s'", opt, s);
		for (; a <= b; a++) {
			if (n == cap) {
				cap *= 2;
				id = realloc(id, cap * sizeof(*id));
				if (!id)
					die("%s", kvp_strerror(-ENOMEM));
			}
			id[n++] = (uint32_t)a;
		}
		p = *end ? end + 1 : end;
		if (*end && !*p)
			usage_error("%s: bad id list '%s'", opt, s);
	}
	if (!n)
		usage_error("%s: empty id list", opt);
	out->id = id;
	out->n = n;
}

static void usage(FILE *f)
{
	size_t col;
	uint32_t i;

	fprintf(f,
"usage: " PROG " [options]\n"
"\n"
"Compiles the transfer plan of one consumer (local) rank pulling from a\n"
"producer (remote) engine and prints it. Each engine is either a model\n"
"preset with overrides (--model, applies to both sides) or a spec file.\n"
"\n"
"Engines:\n"
"  --model NAME            model preset for both sides (list below)\n"
"  --local-spec FILE       local engine rank from a spec file\n"
"  --remote-spec FILE      remote engine rank from a spec file\n"
"  --layers N --kv-heads N --head-dim N --dtype-bytes N\n"
"                          override the preset's numbers (both sides)\n"
"  --num-blocks N          blocks per region, both sides (default %u)\n"
"  --local-tp N --remote-tp N          TP sizes (default 1)\n"
"  --rank R                consumer rank, below --local-tp (default 0)\n"
"  --remote-rank R         remote rank whose layout is shown (default 0)\n"
"  --local-block N --remote-block N    block size in tokens (default %u)\n"
"  --local-kernel-block N --remote-kernel-block N\n"
"                          attention kernel block size (default: block)\n"
"  --local-layout L --remote-layout L  flash_nhd (default), flash_hnd,\n"
"                          flashinfer or packed\n"
"  --local-conv-layout C --remote-conv-layout C\n"
"                          conv state order of hybrid models: ds (default)\n"
"                          or sd\n"
"  A side given by a spec file takes none of the preset options; its TP\n"
"  size and rank come from the spec.\n"
"\n"
"Plan:\n"
"  --max-sge N             local SGEs per READ (default 0: the library's\n"
"                          default, 1)\n"
"\n"
"Request (any of these emits one request):\n"
"  --request N             N remote blocks per group, ids 0..N-1\n"
"  --hit K                 prefix-cache hit: the first K local blocks of\n"
"                          each token group are not read (default 0)\n"
"  --tokens T              sequence length (default: the remote blocks are\n"
"                          full)\n"
"  --local-ids LIST --remote-ids LIST\n"
"                          explicit ids of one group, e.g. 4,9,10-13;\n"
"                          repeat the option once per group, in group\n"
"                          order; groups not given use the defaults\n"
"  Default local ids of a token group: K..n-1, n = ceil(tokens / local\n"
"  block size) (block i of the sequence is local block i); of a state\n"
"  group: the same count as its remote ids, from 0. Groups that pool memory\n"
"  (hybrid models) need disjoint local ids; the tool warns when the\n"
"  request writes a local byte twice.\n"
"\n"
"Output:\n"
"  --json                  one JSON document (schema: tools/README.md)\n"
"  --brief                 summary without the stream and WR tables\n"
"  --no-timing             leave the compile time out (diffable text)\n"
"  --help                  this text\n"
"\n"
"The summary shows both engines (model numbers, TP, block sizes, layouts,\n"
"groups, regions), then the plan: its sources (producer ranks read from),\n"
"the producer ranks notified, its size and compile time; per group the\n"
"block sizes and period, source ranks, one line per stream (source rank,\n"
"layer, fields, local and remote view/region, pieces and bytes per period)\n"
"and the bytes per local block from each source; the notifications each\n"
"producer rank expects per request. With a request: the ids per group,\n"
"every READ (source rank, remote region+offset, length, local SGEs as\n"
"region+offset/length), the READ count beside the count of a design that\n"
"posts one descriptor per block per region (per stream, the local blocks\n"
"of the request it touches, summed), and the bytes read.\n"
"\n"
"Exit status: 0, 1 when the library refuses (layout, spec, plan, request)\n"
"or a file cannot be read, 2 for bad usage.\n"
"\n"
"Presets:",
		DEFAULT_NUM_BLOCKS, DEFAULT_BLOCK);
	for (i = 0, col = 8; kvp_model_preset_name(i); i++) {
		const char *name = kvp_model_preset_name(i);

		if (col + 1 + strlen(name) > 78) {
			fprintf(f, "\n ");
			col = 1;
		}
		col += fprintf(f, " %s", name);
	}
	fprintf(f, "\n");
}

enum {
	O_MODEL = 256,
	O_LSPEC,
	O_RSPEC,
	O_LAYERS,
	O_KV_HEADS,
	O_HEAD_DIM,
	O_DTYPE,
	O_NBLOCKS,
	O_LTP,
	O_RTP,
	O_RANK,
	O_RRANK,
	O_LBLOCK,
	O_RBLOCK,
	O_LKBLOCK,
	O_RKBLOCK,
	O_LLAYOUT,
	O_RLAYOUT,
	O_LCONV,
	O_RCONV,
	O_MAX_SGE,
	O_REQUEST,
	O_HIT,
	O_TOKENS,
	O_LIDS,
	O_RIDS,
	O_JSON,
	O_BRIEF,
	O_NO_TIMING,
	O_HELP,
};

static const struct option long_opts[] = {
	{ "model", required_argument, NULL, O_MODEL },
	{ "local-spec", required_argument, NULL, O_LSPEC },
	{ "remote-spec", required_argument, NULL, O_RSPEC },
	{ "layers", required_argument, NULL, O_LAYERS },
	{ "kv-heads", required_argument, NULL, O_KV_HEADS },
	{ "head-dim", required_argument, NULL, O_HEAD_DIM },
	{ "dtype-bytes", required_argument, NULL, O_DTYPE },
	{ "num-blocks", required_argument, NULL, O_NBLOCKS },
	{ "local-tp", required_argument, NULL, O_LTP },
	{ "remote-tp", required_argument, NULL, O_RTP },
	{ "rank", required_argument, NULL, O_RANK },
	{ "remote-rank", required_argument, NULL, O_RRANK },
	{ "local-block", required_argument, NULL, O_LBLOCK },
	{ "remote-block", required_argument, NULL, O_RBLOCK },
	{ "local-kernel-block", required_argument, NULL, O_LKBLOCK },
	{ "remote-kernel-block", required_argument, NULL, O_RKBLOCK },
	{ "local-layout", required_argument, NULL, O_LLAYOUT },
	{ "remote-layout", required_argument, NULL, O_RLAYOUT },
	{ "local-conv-layout", required_argument, NULL, O_LCONV },
	{ "remote-conv-layout", required_argument, NULL, O_RCONV },
	{ "max-sge", required_argument, NULL, O_MAX_SGE },
	{ "request", required_argument, NULL, O_REQUEST },
	{ "hit", required_argument, NULL, O_HIT },
	{ "tokens", required_argument, NULL, O_TOKENS },
	{ "local-ids", required_argument, NULL, O_LIDS },
	{ "remote-ids", required_argument, NULL, O_RIDS },
	{ "json", no_argument, NULL, O_JSON },
	{ "brief", no_argument, NULL, O_BRIEF },
	{ "no-timing", no_argument, NULL, O_NO_TIMING },
	{ "help", no_argument, NULL, O_HELP },
	{ NULL, 0, NULL, 0 },
};

static void side_opt(struct side *s, int which, const char *opt,
		     const char *arg)
{
	switch (which) {
	case O_LTP:
	case O_RTP:
		s->e.tp_size = parse_u32(opt, arg);
		s->have_tp = 1;
		break;
	case O_RANK:
	case O_RRANK:
		s->e.tp_rank = parse_u32(opt, arg);
		s->have_rank = 1;
		break;
	case O_LBLOCK:
	case O_RBLOCK:
		s->e.block_tokens = parse_u32(opt, arg);
		s->have_block = 1;
		break;
	case O_LKBLOCK:
	case O_RKBLOCK:
		s->e.kernel_block_tokens = parse_u32(opt, arg);
		s->have_kblock = 1;
		break;
	case O_LLAYOUT:
	case O_RLAYOUT:
		s->e.kv_layout = parse_name(opt, arg, layout_names,
					    KVP_KV_LAYOUT_COUNT);
		s->have_layout = 1;
		break;
	default:
		s->e.conv_layout = parse_name(opt, arg, conv_names,
					      KVP_CONV_LAYOUT_COUNT);
		s->have_conv = 1;
		break;
	}
}

static void parse_opts(int argc, char **argv, struct opts *o)
{
	int c, idx;

	memset(o, 0, sizeof(*o));
	o->loc.what = "local";
	o->rem.what = "remote";
	o->timing = 1;
	while ((c = getopt_long(argc, argv, "h", long_opts, &idx)) != -1) {
		const char *a = optarg;
		char opt[32] = "";

		if (c >= O_MODEL)
			snprintf(opt, sizeof(opt), "--%s", long_opts[idx].name);
		switch (c) {
		case O_MODEL:
			o->model = a;
			break;
		case O_LSPEC:
			o->loc.spec = a;
			break;
		case O_RSPEC:
			o->rem.spec = a;
			break;
		case O_LAYERS:
			o->layers = parse_u32(opt, a);
			o->have_layers = 1;
			break;
		case O_KV_HEADS:
			o->kv_heads = parse_u32(opt, a);
			o->have_kv_heads = 1;
			break;
		case O_HEAD_DIM:
			o->head_dim = parse_u32(opt, a);
			o->have_head_dim = 1;
			break;
		case O_DTYPE:
			o->dtype = parse_u32(opt, a);
			o->have_dtype = 1;
			break;
		case O_NBLOCKS:
			o->nblocks = parse_u32(opt, a);
			o->have_nblocks = 1;
			break;
		case O_LTP:
		case O_RANK:
		case O_LBLOCK:
		case O_LKBLOCK:
		case O_LLAYOUT:
		case O_LCONV:
			side_opt(&o->loc, c, opt, a);
			break;
		case O_RTP:
		case O_RRANK:
		case O_RBLOCK:
		case O_RKBLOCK:
		case O_RLAYOUT:
		case O_RCONV:
			side_opt(&o->rem, c, opt, a);
			break;
		case O_MAX_SGE:
			o->max_sge = parse_u32(opt, a);
			break;
		case O_REQUEST:
			o->request = parse_u32(opt, a);
			o->have_request = 1;
			break;
		case O_HIT:
			o->hit = parse_u32(opt, a);
			o->have_hit = 1;
			break;
		case O_TOKENS:
			o->tokens = parse_u64(opt, a, UINT64_MAX);
			o->have_tokens = 1;
			break;
		case O_LIDS:
		case O_RIDS: {
			struct idlist *l = c == O_LIDS ? o->lids : o->rids;
			uint32_t *n = c == O_LIDS ? &o->nlids : &o->nrids;

			if (*n == MAX_GROUPS)
				usage_error("%s: more than %u groups", opt,
					    MAX_GROUPS);
			parse_ids(opt, a, &l[(*n)++]);
			break;
		}
		case O_JSON:
			o->json = 1;
			break;
		case O_BRIEF:
			o->brief = 1;
			break;
		case O_NO_TIMING:
			o->timing = 0;
			break;
		case O_HELP:
		case 'h':
			usage(stdout);
			exit(0);
		default:
			/* getopt_long has printed what is wrong. */
			fprintf(stderr, "Try '" PROG " --help'.\n");
			exit(2);
		}
	}
	if (optind < argc)
		usage_error("unexpected argument '%s'", argv[optind]);
}

/* ---- building the two layouts ----------------------------------------- */

static void read_file(const char *path, char **buf, size_t *len)
{
	size_t cap = 4096, n = 0;
	char *p = xcalloc(cap, 1);
	FILE *f = fopen(path, "rb");

	if (!f)
		die("%s: %s", path, strerror(errno));
	for (;;) {
		size_t got = fread(p + n, 1, cap - n, f);

		n += got;
		if (n < cap)
			break;
		cap *= 2;
		p = realloc(p, cap);
		if (!p)
			die("%s: %s", path, kvp_strerror(-ENOMEM));
	}
	if (ferror(f))
		die("%s: read error", path);
	fclose(f);
	*buf = p;
	*len = n;
}

static void build_side(struct opts *o, struct side *s)
{
	char msg[256] = "";
	int err;

	if (s->spec) {
		char *text;
		size_t len;

		if (s->have_tp || s->have_rank || s->have_block ||
		    s->have_kblock || s->have_layout || s->have_conv)
			usage_error(
				"--%s-spec: the spec sets the engine; drop the other --%s-* options%s",
				s->what, s->what,
				s->have_rank ? " (and --rank/--remote-rank)" :
					       "");
		read_file(s->spec, &text, &len);
		/* The buffer holds the file exactly, without a NUL. */
		err = kvp_layout_parse(text, len, &s->l, msg, sizeof(msg));
		free(text);
		if (err)
			die("%s: %s (%s)", s->spec, msg[0] ? msg : "error",
			    kvp_strerror(err));
		return;
	}
	if (!o->model)
		usage_error("no %s engine: give --model NAME or --%s-spec FILE",
			    s->what, s->what);
	err = kvp_model_preset(o->model, &s->m);
	if (err)
		usage_error("--model: unknown preset '%s' (see --help)",
			    o->model);
	if (o->have_layers)
		s->m.layers = o->layers;
	if (o->have_kv_heads)
		s->m.kv_heads = o->kv_heads;
	if (o->have_head_dim)
		s->m.head_dim = o->head_dim;
	if (o->have_dtype)
		s->m.dtype_bytes = o->dtype;
	if (!s->have_tp)
		s->e.tp_size = 1;
	if (!s->have_block)
		s->e.block_tokens = DEFAULT_BLOCK;
	s->e.num_blocks = o->have_nblocks ? o->nblocks : DEFAULT_NUM_BLOCKS;
	if (s->e.tp_rank >= s->e.tp_size)
		usage_error("--%s: rank %u is not below the %s TP size %u",
			    s == &o->loc ? "rank" : "remote-rank",
			    s->e.tp_rank, s->what, s->e.tp_size);
	err = kvp_layout_build(&s->m, &s->e, &s->l);
	if (err)
		die("%s layout: %s: %s on TP %u rank %u, blocks of %u tokens (kernel %u), %s, %u blocks: the numbers make no layout",
		    s->what, kvp_strerror(err), s->m.name, s->e.tp_size,
		    s->e.tp_rank, s->e.block_tokens,
		    s->e.kernel_block_tokens ? s->e.kernel_block_tokens :
					       s->e.block_tokens,
		    NAME(layout_names, s->e.kv_layout),
		    s->e.num_blocks);
}

static void check_usage(struct opts *o)
{
	if (o->model && o->loc.spec && o->rem.spec)
		usage_error("--model: both sides come from spec files");
	if (!o->model && (o->have_layers || o->have_kv_heads ||
			  o->have_head_dim || o->have_dtype ||
			  o->have_nblocks))
		usage_error("model overrides need --model");
}

/* ---- derived numbers -------------------------------------------------- */

/* What a request needs of one group: the rule of kvp_ids (kvpull.h). */
struct need {
	uint32_t skip, lend, rend;
	uint64_t tokens;
};

static void group_need(const struct kvp_plan_group *pg,
		       const struct kvp_ids *id, struct need *n)
{
	uint64_t nl;

	if (pg->kind == KVP_GROUP_STATE) {
		n->skip = 0;
		n->lend = n->rend = id->nlocal;
		n->tokens = 0;
		return;
	}
	n->tokens = id->tokens ? id->tokens :
				 (uint64_t)id->nremote * pg->remote_tokens;
	nl = (n->tokens + pg->local_tokens - 1) / pg->local_tokens;
	n->lend = (uint32_t)nl;
	n->skip = nl > id->nlocal ? (uint32_t)(nl - id->nlocal) : 0;
	n->rend = (uint32_t)((n->tokens + pg->remote_tokens - 1) /
			     pg->remote_tokens);
}

/*
 * The READs of a design that posts one descriptor per block per region: for
 * each stream, the local blocks of the request that it touches (a block is
 * touched when one of the stream's pieces lands in it from a remote block
 * the request holds), summed over streams.
 */
static uint64_t naive_wrs(const kvp_plan *plan, const struct kvp_plan_group *pg,
			  const struct kvp_ids *ids, uint64_t *per_group)
{
	struct kvp_plan_info info;
	uint64_t total = 0;
	uint32_t s, maxl = 1, g, *mark;

	kvp_plan_get_info(plan, &info);
	for (g = 0; g < info.ngroups; g++) {
		struct need n;

		group_need(&pg[g], &ids[g], &n);
		if (n.lend > maxl)
			maxl = n.lend;
		per_group[g] = 0;
	}
	mark = xcalloc(maxl, sizeof(*mark));
	for (s = 0; s < info.nstreams; s++) {
		struct kvp_plan_stream st;
		const struct kvp_plan_group *p;
		struct need n;
		uint32_t k, i, count = 0;

		if (kvp_plan_get_stream(plan, s, &st))
			die("stream %u: unreadable", s);
		p = &pg[st.group];
		group_need(p, &ids[st.group], &n);
		if (n.skip >= n.lend)
			continue;
		for (k = n.skip / p->local_per_period;
		     k * p->local_per_period < n.lend; k++) {
			for (i = 0; i < st.npieces; i++) {
				struct kvp_plan_piece pc;
				uint32_t L, R;

				if (kvp_plan_get_piece(plan, st.piece_first + i,
						       &pc))
					die("piece %u: unreadable",
					    st.piece_first + i);
				L = k * p->local_per_period + pc.local_block;
				R = k * p->remote_per_period + pc.remote_block;
				if (L < n.skip || L >= n.lend || R >= n.rend ||
				    mark[L] == s + 1)
					continue;
				mark[L] = s + 1;
				count++;
			}
		}
		per_group[st.group] += count;
		total += count;
	}
	free(mark);
	return total;
}

/* ---- the request ------------------------------------------------------ */

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
};

struct span {
	uint64_t offset;
	uint32_t len, region, group;
};

static int span_cmp(const void *x, const void *y)
{
	const struct span *a = x, *b = y;

	if (a->region != b->region)
		return a->region < b->region ? -1 : 1;
	return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Whether two local SGEs of the request overlap. Groups that pool memory
 * (hybrid models) do when given the same ids; the default ids are. */
static int local_overlap(struct request *rq)
{
	struct span *sp;
	uint32_t i, k, n = 0;
	int found = 0;

	for (i = 0; i < rq->nwr; i++)
		n += rq->wr[i].nsge;
	sp = xcalloc(n, sizeof(*sp));
	for (i = 0, n = 0; i < rq->nwr; i++) {
		const struct kvp_sge *s = &rq->sge[rq->wr[i].sge_first];

		for (k = 0; k < rq->wr[i].nsge; k++, n++, s++) {
			sp[n].offset = s->offset;
			sp[n].len = s->len;
			sp[n].region = s->region;
			sp[n].group = rq->wr[i].group;
		}
	}
	qsort(sp, n, sizeof(*sp), span_cmp);
	for (i = 1; i < n && !found; i++) {
		if (sp[i].region == sp[i - 1].region &&
		    sp[i - 1].offset + sp[i - 1].len > sp[i].offset) {
			found = 1;
			rq->overlap_g[0] = sp[i - 1].group < sp[i].group ?
						   sp[i - 1].group :
						   sp[i].group;
			rq->overlap_g[1] = sp[i - 1].group ^ sp[i].group ^
					   rq->overlap_g[0];
			rq->overlap_region = sp[i].region;
		}
	}
	free(sp);
	return found;
}

static uint32_t *iota(uint32_t first, uint32_t n)
{
	uint32_t *id = xcalloc(n, sizeof(*id)), i;

	for (i = 0; i < n; i++)
		id[i] = first + i;
	return id;
}

static void make_request(const struct opts *o, const kvp_plan *plan,
			 const struct kvp_plan_group *pg, uint32_t ngroups,
			 struct request *rq)
{
	uint32_t g, i, maxids = 1, maxw, maxs;
	int n;

	if (o->nlids > ngroups || o->nrids > ngroups)
		usage_error("--%s-ids given %u times; the plan has %u group%s",
			    o->nlids > ngroups ? "local" : "remote",
			    o->nlids > ngroups ? o->nlids : o->nrids, ngroups,
			    PLURAL(ngroups));
	for (g = 0; g < ngroups; g++) {
		struct kvp_ids *id = &rq->ids[g];

		id->tokens = o->tokens;
		if (g < o->nrids) {
			id->remote = o->rids[g].id;
			id->nremote = o->rids[g].n;
		} else if (o->have_request) {
			id->remote = iota(0, o->request);
			id->nremote = o->request;
		} else {
			usage_error("group %u has no remote ids: give --request N or --remote-ids",
				    g);
		}
		if (g < o->nlids) {
			id->local = o->lids[g].id;
			id->nlocal = o->lids[g].n;
		} else if (pg[g].kind == KVP_GROUP_STATE) {
			id->local = iota(0, id->nremote);
			id->nlocal = id->nremote;
		} else {
			uint64_t t = o->tokens ? o->tokens :
						 (uint64_t)id->nremote *
							 pg[g].remote_tokens;
			uint64_t nl = (t + pg[g].local_tokens - 1) /
				      pg[g].local_tokens;

			if (o->hit > nl)
				usage_error("--hit %u: group %u has only %" PRIu64
					    " local blocks",
					    o->hit, g, nl);
			if (nl > UINT32_MAX)
				usage_error("--tokens: too many blocks");
			id->local = iota(o->hit, (uint32_t)(nl - o->hit));
			id->nlocal = (uint32_t)(nl - o->hit);
		}
		group_need(&pg[g], id, &rq->need[g]);
		if (pg[g].kind != KVP_GROUP_STATE &&
		    rq->need[g].tokens >
			    (uint64_t)id->nremote * pg[g].remote_tokens)
			usage_error("--tokens %" PRIu64
				    ": group %u's %u remote blocks hold %" PRIu64
				    " tokens",
				    o->tokens, g, id->nremote,
				    (uint64_t)id->nremote *
					    pg[g].remote_tokens);
		if (pg[g].kind != KVP_GROUP_STATE &&
		    id->nlocal > rq->need[g].lend)
			usage_error("group %u: %u local ids, but the sequence spans %u local blocks",
				    g, id->nlocal, rq->need[g].lend);
		if (id->nlocal > maxids)
			maxids = id->nlocal;
		if (id->nremote > maxids)
			maxids = id->nremote;
	}
	kvp_plan_emit_bound(plan, maxids, &maxw, &maxs);
	rq->wr = xcalloc(maxw, sizeof(*rq->wr));
	rq->sge = xcalloc(maxs, sizeof(*rq->sge));
	n = kvp_plan_emit(plan, rq->ids, rq->wr, maxw, rq->sge, maxs, NULL);
	if (n < 0)
		die("cannot emit the request: %s%s", kvp_strerror(n),
		    n == -EINVAL ? " (more local ids than the remote blocks cover, more tokens than the remote blocks hold, or state lists of unequal length)" :
		    n == -ERANGE ? " (ids must be below --num-blocks; state groups count fewer, larger blocks)" :
				   "");
	rq->nwr = (uint32_t)n;
	for (i = 0; i < rq->nwr; i++) {
		rq->bytes += rq->wr[i].len;
		rq->bytes_group[rq->wr[i].group] += rq->wr[i].len;
		rq->wrs_group[rq->wr[i].group]++;
	}
	rq->naive = naive_wrs(plan, pg, rq->ids, rq->naive_group);
	rq->overlap = local_overlap(rq);
	if (rq->overlap)
		fprintf(stderr,
			PROG ": warning: the request writes some local bytes twice (groups %u and %u, local region %u): groups that pool memory need disjoint ids (--local-ids)\n",
			rq->overlap_g[0], rq->overlap_g[1], rq->overlap_region);
}

/* ---- everything computed once ----------------------------------------- */

struct dump {
	struct opts *o;
	kvp_plan *plan;
	struct kvp_plan_info info;
	struct kvp_plan_group pg[MAX_GROUPS];
	int *src_rank, *notify_rank;
	int *expected; /* per producer rank */
	uint32_t remote_tp;
	double compile_us;
	char (*lfields)[64]; /* per local view: its field kinds */
	struct request rq;
	int have_request;
};

static void view_fields(const kvp_layout *l, char (**out)[64])
{
	struct kvp_layout_info li;
	char(*vf)[64];
	uint32_t i, view;

	kvp_layout_get_info(l, &li);
	vf = xcalloc(li.nviews, sizeof(*vf));
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;
		size_t n;

		if (kvp_layout_get_field(l, i, &view, &f) || view >= li.nviews)
			die("field %u: unreadable", i);
		n = strlen(vf[view]);
		snprintf(vf[view] + n, sizeof(vf[view]) - n, "%s%s",
			 n ? "+" : "", NAME(field_names, f.kind));
	}
	*out = vf;
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

static void compute(struct opts *o, struct dump *d)
{
	struct kvp_plan_attr attr = { 0 };
	struct kvp_layout_info ri;
	char msg[256] = "";
	uint32_t i;
	double t0;
	int err;

	attr.max_sge = o->max_sge;
	t0 = now_us();
	err = kvp_plan_compile(o->loc.l, o->rem.l, &attr, &d->plan, msg,
			       sizeof(msg));
	d->compile_us = now_us() - t0;
	if (err)
		die("cannot plan: %s%s%s", kvp_strerror(err), msg[0] ? ": " : "",
		    msg);
	kvp_plan_get_info(d->plan, &d->info);
	if (d->info.ngroups > MAX_GROUPS)
		die("more than %u groups", MAX_GROUPS);
	for (i = 0; i < d->info.ngroups; i++)
		if (kvp_plan_get_group(d->plan, i, &d->pg[i]))
			die("group %u: unreadable", i);
	d->src_rank = xcalloc(d->info.nsrc, sizeof(int));
	d->notify_rank = xcalloc(d->info.nnotify, sizeof(int));
	for (i = 0; i < d->info.nsrc; i++)
		d->src_rank[i] = kvp_plan_source(d->plan, i);
	for (i = 0; i < d->info.nnotify; i++)
		d->notify_rank[i] = kvp_plan_notify(d->plan, i);
	kvp_layout_get_info(o->rem.l, &ri);
	d->remote_tp = ri.tp_size;
	d->expected = xcalloc(ri.tp_size, sizeof(int));
	for (i = 0; i < ri.tp_size; i++) {
		d->expected[i] = kvp_notify_expected(o->rem.l, o->loc.l, i);
		if (d->expected[i] < 0)
			die("kvp_notify_expected(producer %u): %s", i,
			    kvp_strerror(d->expected[i]));
	}
	view_fields(o->loc.l, &d->lfields);
	d->have_request = o->have_request || o->have_hit || o->have_tokens ||
			  o->nlids || o->nrids;
	if (d->have_request)
		make_request(o, d->plan, d->pg, d->info.ngroups, &d->rq);
}

/* Whether source index s serves group g. kvp_plan_get_group() sets every
 * bit past 64 sources; the streams then say it exactly. */
static int serves(const struct dump *d, uint32_t g, uint32_t s)
{
	struct kvp_plan_stream st;
	uint32_t i;

	if (d->info.nsrc <= 64)
		return (d->pg[g].src_mask >> s) & 1;
	for (i = 0; i < d->info.nstreams; i++)
		if (!kvp_plan_get_stream(d->plan, i, &st) && st.src == s &&
		    st.group == g)
			return 1;
	return 0;
}

static uint32_t view_layer(const kvp_layout *l, uint32_t view)
{
	struct kvp_view_desc v;

	if (kvp_layout_get_view(l, view, &v))
		die("view %u: unreadable", view);
	return v.layer;
}

/* ---- text ------------------------------------------------------------- */

static const char *human(uint64_t b, char *buf, size_t n)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int u = 0;

	while (v >= 1024 && u < 4) {
		v /= 1024;
		u++;
	}
	if (u)
		snprintf(buf, n, "%.2f %s", v, unit[u]);
	else
		snprintf(buf, n, "%" PRIu64 " B", b);
	return buf;
}

/* Prints ids, runs of consecutive ids as a-b. */
static void print_ids(const uint32_t *id, uint32_t n)
{
	uint32_t i = 0, j;

	if (!n)
		printf("none");
	while (i < n) {
		for (j = i; j + 1 < n && id[j + 1] == id[j] + 1; j++)
			;
		printf("%s%u", i ? "," : "", id[i]);
		if (j > i)
			printf("-%u", id[j]);
		i = j + 1;
	}
}

static void text_side(const struct side *s)
{
	struct kvp_layout_info li;
	uint64_t total = 0, size;
	uint32_t i, g;
	char h[32];

	kvp_layout_get_info(s->l, &li);
	printf("%-7s", s->what);
	if (s->spec) {
		printf("spec %s\n", s->spec);
	} else {
		const struct kvp_model *m = &s->m;

		printf("%s: layers %u", m->name, m->layers);
		if (m->mla_latent)
			printf(", MLA latent %u", m->mla_latent);
		else
			printf(", kv_heads %u, head_dim %u", m->kv_heads,
			       m->head_dim);
		printf(", dtype_bytes %u", m->dtype_bytes);
		if (m->sliding_layers)
			printf(", sliding_layers %u", m->sliding_layers);
		printf("\n");
		if (m->state_layers)
			printf("       state: %s x %u layers, conv_kernel %u, ssm heads %u x head_dim %u x state %u, groups %u, state dtype_bytes %u\n",
			       NAME(state_names, m->state_kind),
			       m->state_layers, m->conv_kernel, m->ssm_heads,
			       m->ssm_head_dim, m->ssm_state, m->ssm_groups,
			       m->state_dtype_bytes ? m->state_dtype_bytes :
						      m->dtype_bytes);
	}
	printf("       TP %u rank %u, engine id %" PRIu64, li.tp_size,
	       li.tp_rank, li.engine_id);
	if (!s->spec) {
		printf(", block %u tokens (kernel %u), %s", s->e.block_tokens,
		       s->e.kernel_block_tokens ? s->e.kernel_block_tokens :
						  s->e.block_tokens,
		       NAME(layout_names, s->e.kv_layout));
		if (s->m.state_layers)
			printf(", conv %s", NAME(conv_names, s->e.conv_layout));
		printf(", %u blocks", s->e.num_blocks);
	}
	printf("\n");
	for (i = 0; i < li.nregions; i++)
		if (!kvp_layout_get_region(s->l, i, &size))
			total += size;
	printf("       %u group%s, %u regions (%s), %u views, %u fields\n",
	       li.ngroups, PLURAL(li.ngroups), li.nregions,
	       human(total, h, sizeof(h)), li.nviews, li.nfields);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc gd;
		uint32_t nv = 0, lo = UINT32_MAX, hi = 0;

		if (kvp_layout_get_group(s->l, g, &gd))
			die("group %u: unreadable", g);
		for (i = 0; i < li.nviews; i++) {
			struct kvp_view_desc v;

			if (kvp_layout_get_view(s->l, i, &v) || v.group != g)
				continue;
			nv++;
			lo = v.layer < lo ? v.layer : lo;
			hi = v.layer > hi ? v.layer : hi;
		}
		printf("       group %u: %s", g, NAME(group_names, gd.kind));
		if (gd.kind != KVP_GROUP_STATE)
			printf(", %u tokens per block", gd.block_tokens);
		printf(", %u views", nv);
		if (nv)
			printf(", layers %u..%u", lo, hi);
		printf("\n");
	}
}

static void print_ranks(const int *r, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		printf(" %d", r[i]);
	if (!n)
		printf(" none");
	printf("\n");
}

static void text_streams(const struct dump *d, uint32_t g)
{
	const struct opts *o = d->o;
	uint64_t *per_src = xcalloc(d->info.nsrc, sizeof(uint64_t));
	uint32_t *nstreams = xcalloc(d->info.nsrc, sizeof(uint32_t));
	uint64_t total = 0;
	uint32_t i, k;
	char h[32];

	if (!o->brief)
		printf("  streams:\n"
		       "    %4s %5s %-24s %12s %12s %7s %13s  %s\n",
		       "src", "layer", "fields", "local v/r", "remote v/r",
		       "pieces", "bytes/period", "piece lengths");
	for (i = 0; i < d->info.nstreams; i++) {
		struct kvp_plan_stream st;
		uint32_t lmin = UINT32_MAX, lmax = 0;
		char lv[32], rv[32];

		if (kvp_plan_get_stream(d->plan, i, &st))
			die("stream %u: unreadable", i);
		if (st.group != g)
			continue;
		per_src[st.src] += st.bytes_per_period;
		nstreams[st.src]++;
		total += st.bytes_per_period;
		if (o->brief)
			continue;
		for (k = 0; k < st.npieces; k++) {
			struct kvp_plan_piece pc;

			if (kvp_plan_get_piece(d->plan, st.piece_first + k,
					       &pc))
				die("piece %u: unreadable",
				    st.piece_first + k);
			lmin = pc.len < lmin ? pc.len : lmin;
			lmax = pc.len > lmax ? pc.len : lmax;
		}
		snprintf(lv, sizeof(lv), "%u/%u", st.local_view,
			 st.local_region);
		snprintf(rv, sizeof(rv), "%u/%u", st.remote_view,
			 st.remote_region);
		printf("    %4d %5u %-24s %12s %12s %7u %13" PRIu64 "  ",
		       d->src_rank[st.src],
		       view_layer(o->loc.l, st.local_view),
		       d->lfields[st.local_view], lv, rv, st.npieces,
		       st.bytes_per_period);
		if (lmin == lmax)
			printf("%u\n", lmin);
		else
			printf("%u..%u\n", lmin, lmax);
	}
	printf("  bytes per local block, by source rank:\n");
	for (i = 0; i < d->info.nsrc; i++) {
		if (!nstreams[i])
			continue;
		printf("    rank %d: %u streams, %" PRIu64
		       " bytes per period, %" PRIu64 " per local block (%s)\n",
		       d->src_rank[i], nstreams[i], per_src[i],
		       per_src[i] / d->pg[g].local_per_period,
		       human(per_src[i] / d->pg[g].local_per_period, h,
			     sizeof(h)));
	}
	printf("    total: %" PRIu64 " bytes per local block (%s)\n",
	       total / d->pg[g].local_per_period,
	       human(total / d->pg[g].local_per_period, h, sizeof(h)));
	free(per_src);
	free(nstreams);
}

static void text_request(const struct dump *d)
{
	const struct request *rq = &d->rq;
	uint32_t g, i, k;
	char h[32];

	printf("\nrequest:\n");
	for (g = 0; g < d->info.ngroups; g++) {
		const struct kvp_ids *id = &rq->ids[g];

		printf("  group %u: local ids ", g);
		print_ids(id->local, id->nlocal);
		printf(" (%u), remote ids ", id->nlocal);
		print_ids(id->remote, id->nremote);
		printf(" (%u)", id->nremote);
		if (d->pg[g].kind != KVP_GROUP_STATE)
			printf(", %" PRIu64 " tokens, %u leading local block%s not read",
			       rq->need[g].tokens, rq->need[g].skip,
			       rq->need[g].skip == 1 ? "" : "s");
		printf("\n    %" PRIu64 " READs (one descriptor per block per region: %" PRIu64
		       "), %" PRIu64 " bytes\n",
		       rq->wrs_group[g], rq->naive_group[g],
		       rq->bytes_group[g]);
	}
	if (!d->o->brief) {
		printf("  READs: src = producer rank; rN+off = remote region N; local SGEs lN+off/len\n");
		for (i = 0; i < rq->nwr; i++) {
			const struct kvp_wr *w = &rq->wr[i];

			printf("    %5u  g%u src %d  r%u+0x%" PRIx64 "  %u  ",
			       i, w->group, d->src_rank[w->src], w->region,
			       w->offset, w->len);
			for (k = 0; k < w->nsge; k++) {
				const struct kvp_sge *s =
					&rq->sge[w->sge_first + k];

				printf("%sl%u+0x%" PRIx64 "/%u", k ? " " : "",
				       s->region, s->offset, s->len);
			}
			printf("\n");
		}
	}
	printf("  total: %u READs (one descriptor per block per region: %" PRIu64
	       "), %" PRIu64 " bytes (%s)\n",
	       rq->nwr, rq->naive, rq->bytes, human(rq->bytes, h, sizeof(h)));
}

static void text(const struct dump *d)
{
	const struct kvp_plan_info *in = &d->info;
	uint32_t g, s;
	char h[32];

	text_side(&d->o->loc);
	text_side(&d->o->rem);
	printf("\nplan: consumer rank %u of TP %u pulling from TP %u, max_sge %u\n",
	       in->local_rank, in->local_tp, in->remote_tp, in->max_sge);
	printf("  %u group%s, %u source%s, %u notified, %u streams, %u piece templates\n",
	       in->ngroups, PLURAL(in->ngroups), in->nsrc, PLURAL(in->nsrc),
	       in->nnotify, in->nstreams, in->npieces);
	printf("  plan size %" PRIu64 " bytes (%s)", in->bytes,
	       human(in->bytes, h, sizeof(h)));
	if (d->o->timing)
		printf(", compiled in %.1f us", d->compile_us);
	printf("\n  source ranks (read from):");
	print_ranks(d->src_rank, in->nsrc);
	printf("  notify ranks:");
	print_ranks(d->notify_rank, in->nnotify);
	printf("  notifications each producer rank expects per request:");
	for (s = 0; s < d->remote_tp; s++)
		printf(" %u:%d", s, d->expected[s]);
	printf("\n");
	for (g = 0; g < in->ngroups; g++) {
		const struct kvp_plan_group *p = &d->pg[g];

		printf("\ngroup %u: %s\n", g, NAME(group_names, p->kind));
		if (p->kind == KVP_GROUP_STATE)
			printf("  whole states, one local block from one remote block\n");
		else
			printf("  blocks: local %u tokens, remote %u tokens; period %u tokens = %u local : %u remote\n",
			       p->local_tokens, p->remote_tokens,
			       p->period_tokens, p->local_per_period,
			       p->remote_per_period);
		printf("  ids: local < %u, remote < %u\n", p->local_blocks,
		       p->remote_blocks);
		printf("  source ranks:");
		for (s = 0; s < in->nsrc; s++)
			if (serves(d, g, s))
				printf(" %d", d->src_rank[s]);
		printf("\n");
		text_streams(d, g);
	}
	if (d->have_request)
		text_request(d);
}

/* ---- JSON ------------------------------------------------------------- */

/*
 * A small writer for stable, diffable JSON: objects and arrays are either
 * multi-line (one member per line, two-space indent) or inline (one line);
 * inline containers stay inline inside.
 */
#define JMAX 16

struct jw {
	int depth;
	uint8_t first[JMAX], inl[JMAX];
};

static void j_indent(int depth)
{
	printf("\n%*s", 2 * depth, "");
}

static void j_key(struct jw *j, const char *key)
{
	if (j->depth) {
		if (!j->first[j->depth])
			printf(j->inl[j->depth] ? ", " : ",");
		if (!j->inl[j->depth])
			j_indent(j->depth);
		j->first[j->depth] = 0;
	}
	if (key)
		printf("\"%s\": ", key);
}

static void j_open(struct jw *j, const char *key, char c, int inl)
{
	j_key(j, key);
	putchar(c);
	if (++j->depth >= JMAX)
		die("JSON nesting too deep");
	j->first[j->depth] = 1;
	j->inl[j->depth] = inl || j->inl[j->depth - 1];
}

static void j_close(struct jw *j, char c)
{
	int d = j->depth--;

	if (!j->inl[d] && !j->first[d])
		j_indent(j->depth);
	putchar(c);
	if (!j->depth)
		putchar('\n');
}

static void j_u64(struct jw *j, const char *key, uint64_t v)
{
	j_key(j, key);
	printf("%" PRIu64, v);
}

static void j_int(struct jw *j, const char *key, int64_t v)
{
	j_key(j, key);
	printf("%" PRId64, v);
}

static void j_bool(struct jw *j, const char *key, int v)
{
	j_key(j, key);
	printf(v ? "true" : "false");
}

static void j_null(struct jw *j, const char *key)
{
	j_key(j, key);
	printf("null");
}

static void j_str(struct jw *j, const char *key, const char *s)
{
	j_key(j, key);
	putchar('"');
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			printf("\\%c", c);
		else if (c < 0x20)
			printf("\\u%04x", c);
		else
			putchar(c);
	}
	putchar('"');
}

static void j_ids(struct jw *j, const char *key, const uint32_t *id,
		  uint32_t n)
{
	uint32_t i;

	j_open(j, key, '[', 1);
	for (i = 0; i < n; i++)
		j_u64(j, NULL, id[i]);
	j_close(j, ']');
}

static void json_side(struct jw *j, const char *key, const struct side *s)
{
	struct kvp_layout_info li;
	char hash[24];
	uint32_t i, k;

	kvp_layout_get_info(s->l, &li);
	j_open(j, key, '{', 0);
	if (s->spec)
		j_str(j, "spec", s->spec);
	else
		j_null(j, "spec");
	if (s->spec) {
		j_null(j, "model");
		j_null(j, "engine");
	} else {
		const struct kvp_model *m = &s->m;
		const struct kvp_engine_desc *e = &s->e;

		j_open(j, "model", '{', 1);
		j_str(j, "name", m->name);
		j_u64(j, "layers", m->layers);
		j_u64(j, "kv_heads", m->kv_heads);
		j_u64(j, "head_dim", m->head_dim);
		j_u64(j, "dtype_bytes", m->dtype_bytes);
		j_u64(j, "mla_latent", m->mla_latent);
		j_u64(j, "sliding_layers", m->sliding_layers);
		j_str(j, "state_kind", NAME(state_names, m->state_kind));
		j_u64(j, "state_layers", m->state_layers);
		j_u64(j, "conv_kernel", m->conv_kernel);
		j_u64(j, "ssm_heads", m->ssm_heads);
		j_u64(j, "ssm_head_dim", m->ssm_head_dim);
		j_u64(j, "ssm_state", m->ssm_state);
		j_u64(j, "ssm_groups", m->ssm_groups);
		j_u64(j, "state_dtype_bytes", m->state_dtype_bytes);
		j_close(j, '}');
		j_open(j, "engine", '{', 1);
		j_u64(j, "block_tokens", e->block_tokens);
		j_u64(j, "kernel_block_tokens", e->kernel_block_tokens);
		j_u64(j, "num_blocks", e->num_blocks);
		j_str(j, "kv_layout", NAME(layout_names, e->kv_layout));
		j_str(j, "conv_layout", NAME(conv_names, e->conv_layout));
		j_close(j, '}');
	}
	j_u64(j, "engine_id", li.engine_id);
	j_u64(j, "tp_size", li.tp_size);
	j_u64(j, "tp_rank", li.tp_rank);
	snprintf(hash, sizeof(hash), "0x%016" PRIx64,
		 kvp_layout_compat_hash(s->l));
	j_str(j, "compat_hash", hash);
	j_open(j, "groups", '[', 0);
	for (i = 0; i < li.ngroups; i++) {
		struct kvp_group_desc g;

		if (kvp_layout_get_group(s->l, i, &g))
			die("group %u: unreadable", i);
		j_open(j, NULL, '{', 1);
		j_str(j, "kind", NAME(group_names, g.kind));
		j_u64(j, "block_tokens", g.block_tokens);
		j_close(j, '}');
	}
	j_close(j, ']');
	j_open(j, "regions", '[', 0);
	for (i = 0; i < li.nregions; i++) {
		uint64_t size;

		if (kvp_layout_get_region(s->l, i, &size))
			die("region %u: unreadable", i);
		j_open(j, NULL, '{', 1);
		j_u64(j, "size", size);
		j_close(j, '}');
	}
	j_close(j, ']');
	j_open(j, "views", '[', 0);
	for (i = 0; i < li.nviews; i++) {
		struct kvp_view_desc v;

		if (kvp_layout_get_view(s->l, i, &v))
			die("view %u: unreadable", i);
		j_open(j, NULL, '{', 1);
		j_u64(j, "group", v.group);
		j_u64(j, "region", v.region);
		j_u64(j, "layer", v.layer);
		j_u64(j, "num_blocks", v.num_blocks);
		j_u64(j, "offset", v.offset);
		j_u64(j, "stride", v.stride);
		j_close(j, '}');
	}
	j_close(j, ']');
	j_open(j, "fields", '[', 0);
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;
		uint32_t view, start, len;

		if (kvp_layout_get_field(s->l, i, &view, &f))
			die("field %u: unreadable", i);
		j_open(j, NULL, '{', 1);
		j_u64(j, "view", view);
		j_str(j, "kind", NAME(field_names, f.kind));
		j_u64(j, "elem_size", f.elem_size);
		j_u64(j, "offset", f.offset);
		if (f.shard_dim != KVP_NO_SHARD &&
		    !kvp_shard_range(f.shard_total, li.tp_size, li.tp_rank,
				     &start, &len)) {
			j_u64(j, "shard_dim", f.shard_dim);
			j_u64(j, "shard_total", f.shard_total);
			j_u64(j, "shard_start", start);
			j_u64(j, "shard_len", len);
		} else {
			j_null(j, "shard_dim");
			j_null(j, "shard_total");
			j_null(j, "shard_start");
			j_null(j, "shard_len");
		}
		j_open(j, "dims", '[', 1);
		for (k = 0; k < f.ndim; k++) {
			j_open(j, NULL, '{', 1);
			j_str(j, "axis", NAME(axis_names, f.dim[k].axis));
			j_u64(j, "size", f.dim[k].size);
			j_u64(j, "stride", f.dim[k].stride);
			j_close(j, '}');
		}
		j_close(j, ']');
		j_close(j, '}');
	}
	j_close(j, ']');
	j_close(j, '}');
}

static void json_plan(struct jw *j, const struct dump *d)
{
	const struct kvp_plan_info *in = &d->info;
	uint32_t i, s;

	j_open(j, "plan", '{', 0);
	j_open(j, "info", '{', 1);
	j_u64(j, "ngroups", in->ngroups);
	j_u64(j, "nsrc", in->nsrc);
	j_u64(j, "nnotify", in->nnotify);
	j_u64(j, "nstreams", in->nstreams);
	j_u64(j, "npieces", in->npieces);
	j_u64(j, "local_tp", in->local_tp);
	j_u64(j, "local_rank", in->local_rank);
	j_u64(j, "remote_tp", in->remote_tp);
	j_u64(j, "max_sge", in->max_sge);
	j_u64(j, "bytes", in->bytes);
	j_close(j, '}');
	j_open(j, "sources", '[', 1);
	for (i = 0; i < in->nsrc; i++)
		j_int(j, NULL, d->src_rank[i]);
	j_close(j, ']');
	j_open(j, "notify", '[', 1);
	for (i = 0; i < in->nnotify; i++)
		j_int(j, NULL, d->notify_rank[i]);
	j_close(j, ']');
	j_open(j, "groups", '[', 0);
	for (i = 0; i < in->ngroups; i++) {
		const struct kvp_plan_group *p = &d->pg[i];

		j_open(j, NULL, '{', 1);
		j_str(j, "kind", NAME(group_names, p->kind));
		j_u64(j, "local_tokens", p->local_tokens);
		j_u64(j, "remote_tokens", p->remote_tokens);
		j_u64(j, "period_tokens", p->period_tokens);
		j_u64(j, "local_per_period", p->local_per_period);
		j_u64(j, "remote_per_period", p->remote_per_period);
		j_u64(j, "local_blocks", p->local_blocks);
		j_u64(j, "remote_blocks", p->remote_blocks);
		j_open(j, "sources", '[', 1);
		for (s = 0; s < in->nsrc; s++)
			if (serves(d, i, s))
				j_u64(j, NULL, s);
		j_close(j, ']');
		j_close(j, '}');
	}
	j_close(j, ']');
	j_open(j, "streams", '[', 0);
	for (i = 0; i < in->nstreams; i++) {
		struct kvp_plan_stream st;

		if (kvp_plan_get_stream(d->plan, i, &st))
			die("stream %u: unreadable", i);
		j_open(j, NULL, '{', 1);
		j_u64(j, "src", st.src);
		j_int(j, "src_rank", d->src_rank[st.src]);
		j_u64(j, "group", st.group);
		j_u64(j, "layer", view_layer(d->o->loc.l, st.local_view));
		j_u64(j, "local_view", st.local_view);
		j_u64(j, "local_region", st.local_region);
		j_u64(j, "remote_view", st.remote_view);
		j_u64(j, "remote_region", st.remote_region);
		j_u64(j, "piece_first", st.piece_first);
		j_u64(j, "npieces", st.npieces);
		j_u64(j, "bytes_per_period", st.bytes_per_period);
		j_close(j, '}');
	}
	j_close(j, ']');
	j_open(j, "pieces", '[', 0);
	for (i = 0; i < in->npieces; i++) {
		struct kvp_plan_piece pc;

		if (kvp_plan_get_piece(d->plan, i, &pc))
			die("piece %u: unreadable", i);
		j_open(j, NULL, '{', 1);
		j_u64(j, "remote_block", pc.remote_block);
		j_u64(j, "remote_offset", pc.remote_offset);
		j_u64(j, "local_block", pc.local_block);
		j_u64(j, "local_offset", pc.local_offset);
		j_u64(j, "len", pc.len);
		j_close(j, '}');
	}
	j_close(j, ']');
	j_close(j, '}');
}

static void json_request(struct jw *j, const struct dump *d)
{
	const struct request *rq = &d->rq;
	uint32_t i, k;

	if (!d->have_request) {
		j_null(j, "request");
		return;
	}
	j_open(j, "request", '{', 0);
	j_open(j, "groups", '[', 0);
	for (i = 0; i < d->info.ngroups; i++) {
		j_open(j, NULL, '{', 1);
		j_ids(j, "local_ids", rq->ids[i].local, rq->ids[i].nlocal);
		j_ids(j, "remote_ids", rq->ids[i].remote, rq->ids[i].nremote);
		j_u64(j, "tokens", rq->need[i].tokens);
		j_u64(j, "skip", rq->need[i].skip);
		j_u64(j, "wrs", rq->wrs_group[i]);
		j_u64(j, "naive_wrs", rq->naive_group[i]);
		j_u64(j, "bytes", rq->bytes_group[i]);
		j_close(j, '}');
	}
	j_close(j, ']');
	j_open(j, "wrs", '[', 0);
	for (i = 0; i < rq->nwr; i++) {
		const struct kvp_wr *w = &rq->wr[i];

		j_open(j, NULL, '{', 1);
		j_u64(j, "group", w->group);
		j_u64(j, "src", w->src);
		j_int(j, "src_rank", d->src_rank[w->src]);
		j_u64(j, "remote_region", w->region);
		j_u64(j, "remote_offset", w->offset);
		j_u64(j, "len", w->len);
		j_open(j, "sges", '[', 1);
		for (k = 0; k < w->nsge; k++) {
			const struct kvp_sge *s = &rq->sge[w->sge_first + k];

			j_open(j, NULL, '{', 1);
			j_u64(j, "region", s->region);
			j_u64(j, "offset", s->offset);
			j_u64(j, "len", s->len);
			j_close(j, '}');
		}
		j_close(j, ']');
		j_close(j, '}');
	}
	j_close(j, ']');
	j_u64(j, "naive_wrs", rq->naive);
	j_u64(j, "bytes", rq->bytes);
	j_bool(j, "local_overlap", rq->overlap);
	j_close(j, '}');
}

static void json(const struct dump *d)
{
	struct jw j;
	uint32_t i;

	memset(&j, 0, sizeof(j));
	j_open(&j, NULL, '{', 0);
	j_u64(&j, "version", 1);
	json_side(&j, "local", &d->o->loc);
	json_side(&j, "remote", &d->o->rem);
	json_plan(&j, d);
	j_open(&j, "notify_expected", '[', 1);
	for (i = 0; i < d->remote_tp; i++)
		j_int(&j, NULL, d->expected[i]);
	j_close(&j, ']');
	json_request(&j, d);
	j_close(&j, '}');
}

/* ---- main ------------------------------------------------------------- */

static void free_ids(struct kvp_ids *id, const struct opts *o, uint32_t g)
{
	if (g >= o->nlids)
		free((void *)id->local);
	if (g >= o->nrids)
		free((void *)id->remote);
}

int main(int argc, char **argv)
{
	struct opts o;
	struct dump d;
	uint32_t g;

	parse_opts(argc, argv, &o);
	check_usage(&o);
	build_side(&o, &o.loc);
	build_side(&o, &o.rem);
	memset(&d, 0, sizeof(d));
	d.o = &o;
	compute(&o, &d);
	if (o.json)
		json(&d);
	else
		text(&d);
	if (fflush(stdout) || ferror(stdout))
		die("write error");

	if (d.have_request)
		for (g = 0; g < d.info.ngroups; g++)
			free_ids(&d.rq.ids[g], &o, g);
	for (g = 0; g < o.nlids; g++)
		free(o.lids[g].id);
	for (g = 0; g < o.nrids; g++)
		free(o.rids[g].id);
	free(d.rq.wr);
	free(d.rq.sge);
	free(d.src_rank);
	free(d.notify_rank);
	free(d.expected);
	free(d.lfields);
	kvp_plan_destroy(d.plan);
	kvp_layout_destroy(o.loc.l);
	kvp_layout_destroy(o.rem.l);
	return 0;
}
