// SPDX-License-Identifier: MIT
/* kvpull-plan: the command line, and the two engines it describes. */
#include <errno.h>
#include <getopt.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump.h"

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
	int i = tool_name_index(names, n, s);
	char valid[256] = "";
	size_t k = 0;
	uint32_t j;

	if (i >= 0)
		return (uint32_t)i;
	for (j = 0; j < n && k < sizeof(valid); j++)
		k += (size_t)snprintf(valid + k, sizeof(valid) - k, "%s%s",
				      j ? ", " : "", names[j]);
	usage_error("%s: unknown value '%s' (valid: %s)", opt, s, valid);
}

/* A bad id list: what is wrong, at which character of it (from 1). */
__attribute__((noreturn, format(printf, 4, 5))) static void
bad_ids(const char *opt, const char *s, const char *at, const char *fmt, ...)
{
	char what[160];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	usage_error("%s %s: character %zu: %s (want ids and ranges a-b separated by commas, e.g. 4,9,10-13)",
		    opt, s, (size_t)(at - s) + 1, what);
}

/* One id of a list at p (a digit): its value, *end past it. */
static unsigned long long list_id(const char *opt, const char *s,
				  const char *p, char **end)
{
	unsigned long long v;

	errno = 0;
	v = strtoull(p, end, 0);
	if (errno || v > UINT32_MAX)
		bad_ids(opt, s, p, "id %.*s is above %u", (int)(*end - p), p,
			UINT32_MAX);
	return v;
}

/* "a,b-c,..." into a new list; ranges are inclusive. */
static void parse_ids(const char *opt, const char *s, struct idlist *out)
{
	uint32_t cap = 16, n = 0;
	uint32_t *id = xcalloc(cap, sizeof(*id));
	const char *p = s;

	if (!*s)
		usage_error("%s: empty id list (want ids and ranges a-b separated by commas, e.g. 4,9,10-13)",
			    opt);
	while (*p) {
		unsigned long long a, b;
		const char *first = p;
		int ranged = 0;
		char *end;

		if (*p == ',')
			bad_ids(opt, s, p, "empty entry");
		if (*p < '0' || *p > '9')
			bad_ids(opt, s, p, "'%c' is not a digit", *p);
		a = b = list_id(opt, s, p, &end);
		if (*end == '-') {
			ranged = 1;
			p = end + 1;
			if (!*p || *p == ',')
				bad_ids(opt, s, first, "range %.*s has no end",
					(int)(p - first), first);
			if (*p < '0' || *p > '9')
				bad_ids(opt, s, p, "'%c' is not a digit", *p);
			b = list_id(opt, s, p, &end);
			if (b < a)
				bad_ids(opt, s, first, "range %.*s runs backwards",
					(int)(end - first), first);
			if (b - a >= (1u << 24))
				bad_ids(opt, s, first,
					"range %.*s holds %llu ids, more than %u",
					(int)(end - first), first, b - a + 1,
					1u << 24);
		}
		if (*end && *end != ',')
			bad_ids(opt, s, end, "'%c' after %s %.*s is not %s",
				*end, ranged ? "range" : "id",
				(int)(end - first), first,
				ranged ? "','" : "',' or '-'");
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
			bad_ids(opt, s, end, "trailing comma");
	}
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
"  --local-layout L --remote-layout L  flash_nhd, flash_hnd (default),\n"
"                          flashinfer or packed\n"
"  --local-conv-layout C --remote-conv-layout C\n"
"                          conv state order of hybrid models: ds (default)\n"
"                          or sd\n"
"  A side given by a spec file takes none of the preset options; its TP\n"
"  size and rank come from the spec.\n"
"\n"
"Plan (the defaults are a consumer agent's, kvp_agent_attr 0):\n"
"  --max-sge N             local SGEs per READ (default %u); an agent\n"
"                          clamps it to the device's max_sge_rd\n"
"  --max-read N            bytes per READ at most (default %u: 2 GiB);\n"
"                          an agent also stops at its port's max_msg_sz\n"
"                          (8388608 on soft-RoCE)\n"
"\n"
"Request (any of these emits one request):\n"
"  --request N             N remote blocks per group, ids 0..N-1\n"
"  --hit K                 prefix-cache hit: the first K local blocks of\n"
"                          each token group are not read (default 0)\n"
"  --tokens T              sequence length (default: the remote blocks are\n"
"                          full)\n"
"  --range L0:L1[:T0:T1]   only the READs of model layers [L0, L1) and\n"
"                          (T0, T1] of the tokens (default: all; T1 may\n"
"                          be 'end'): what a streamed pull reads once a\n"
"                          producer rank published that part\n"
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
"  --json                  one JSON document (schema: " KVP_SCHEMA ")\n"
"  --brief                 summary without the stream and WR tables\n"
"  --no-timing             leave the compile time out (diffable text)\n"
"  --svg FILE              also draw the plan as an SVG picture: producer\n"
"                          ranks feeding the consumer, one band per group\n"
"                          with layers, head ranges and READs per request\n"
"  --svg-request N         blocks per group of the request the SVG counts\n"
"                          READs for (default: --request, else 16)\n"
"  --svg-all-ranks         the SVG draws every consumer rank, a panel each\n"
"                          (consumer TP at most 16)\n"
"  --list                  the model presets and their numbers\n"
"  --version               " PROG " and the library version\n"
"  --help                  this text\n"
"\n"
"The summary's title line says what the plan was made with: both engines'\n"
"TP and KV layout, max_sge and the READ cap, and whether they are an\n"
"agent's defaults. Then both engines (model numbers, TP, block sizes, layouts,\n"
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
		DEFAULT_NUM_BLOCKS, DEFAULT_BLOCK, KVP_DEFAULT_MAX_SGE,
		KVP_DEFAULT_MAX_READ);
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

/* --list: one line per preset with the numbers that decide its layouts. */
static void list_presets(void)
{
	struct kvp_model m;
	uint32_t i;

	for (i = 0; kvp_model_preset_name(i); i++) {
		if (kvp_model_preset(kvp_model_preset_name(i), &m))
			die("preset %u: %s", i, kvp_strerror(-ENOENT));
		printf("%-20s %3u layers", m.name, m.layers);
		if (m.mla_latent)
			printf(", MLA latent %u", m.mla_latent);
		else
			printf(", %u KV heads x %u", m.kv_heads, m.head_dim);
		if (m.sliding_layers)
			printf(", %u sliding", m.sliding_layers);
		if (m.state_layers)
			printf(", %u %s state layers (%u heads)",
			       m.state_layers,
			       TOOL_NAME(tool_state_names, m.state_kind),
			       m.ssm_heads);
		printf("\n");
	}
}

/*
 * Every option, in --help order: what its value is and which member of
 * struct opts it sets, and for some the member that records it was given.
 * getopt_long()'s table is made from this one.
 */
enum arg {
	A_U32,
	A_U64,
	A_STR,
	A_LAYOUT, /* a name of tool_layout_names, as uint32_t */
	A_CONV,	  /* a name of tool_conv_names, as uint32_t */
	A_IDS,	  /* one more struct idlist of lids or rids */
	A_TRUE,	  /* no value: sets an int to 1 */
	A_FALSE,  /* no value: sets an int to 0 */
	A_HELP,
	A_VERSION,
	A_LIST,
};

struct optdef {
	const char *name;
	enum arg arg;
	size_t at, size; /* the member set */
	size_t have;	 /* the int set to 1, or 0 for none */
};

#define OPT(n, a, m)                                                       \
	{ n, a, offsetof(struct opts, m), sizeof(((struct opts *)0)->m), 0 }
#define OPT_HAVE(n, a, m, h)                                               \
	{ n, a, offsetof(struct opts, m), sizeof(((struct opts *)0)->m),     \
	  offsetof(struct opts, h) }

/* One option for each side: member m of struct side, flag h. */
#define SIDES(lname, rname, a, m, h)                                       \
	OPT_HAVE(lname, a, loc.m, loc.h), OPT_HAVE(rname, a, rem.m, rem.h)

static const struct optdef optdefs[] = {
	OPT("model", A_STR, model),
	OPT("local-spec", A_STR, loc.spec),
	OPT("remote-spec", A_STR, rem.spec),
	OPT_HAVE("layers", A_U32, layers, have_layers),
	OPT_HAVE("kv-heads", A_U32, kv_heads, have_kv_heads),
	OPT_HAVE("head-dim", A_U32, head_dim, have_head_dim),
	OPT_HAVE("dtype-bytes", A_U32, dtype, have_dtype),
	OPT_HAVE("num-blocks", A_U32, nblocks, have_nblocks),
	SIDES("local-tp", "remote-tp", A_U32, e.tp_size, have_tp),
	SIDES("rank", "remote-rank", A_U32, e.tp_rank, have_rank),
	SIDES("local-block", "remote-block", A_U32, e.block_tokens,
	      have_block),
	SIDES("local-kernel-block", "remote-kernel-block", A_U32,
	      e.kernel_block_tokens, have_kblock),
	SIDES("local-layout", "remote-layout", A_LAYOUT, e.kv_layout,
	      have_layout),
	SIDES("local-conv-layout", "remote-conv-layout", A_CONV, e.conv_layout,
	      have_conv),
	OPT("max-sge", A_U32, max_sge),
	OPT("max-read", A_U32, max_read),
	OPT_HAVE("request", A_U32, request, have_request),
	OPT_HAVE("hit", A_U32, hit, have_hit),
	OPT_HAVE("tokens", A_U64, tokens, have_tokens),
	OPT("range", A_STR, range),
	OPT("local-ids", A_IDS, lids),
	OPT("remote-ids", A_IDS, rids),
	OPT("json", A_TRUE, json),
	OPT("brief", A_TRUE, brief),
	OPT("no-timing", A_FALSE, timing),
	OPT("svg", A_STR, svg),
	OPT_HAVE("svg-request", A_U32, svg_request, have_svg_request),
	OPT("svg-all-ranks", A_TRUE, svg_all_ranks),
	{ "list", A_LIST, 0, 0, 0 },
	{ "version", A_VERSION, 0, 0, 0 },
	{ "help", A_HELP, 0, 0, 0 },
};

#define NOPTS (sizeof(optdefs) / sizeof(optdefs[0]))

/* The size each kind of value is stored in. */
static size_t arg_size(enum arg a)
{
	switch (a) {
	case A_U64:
		return sizeof(uint64_t);
	case A_STR:
		return sizeof(const char *);
	case A_IDS:
		return sizeof(((struct opts *)0)->lids);
	case A_TRUE:
	case A_FALSE:
		return sizeof(int);
	case A_HELP:
	case A_VERSION:
	case A_LIST:
		return 0;
	default:
		return sizeof(uint32_t);
	}
}

static void set_opt(struct opts *o, const struct optdef *d, const char *a)
{
	char *to = (char *)o + d->at, opt[32];

	if (d->size != arg_size(d->arg))
		die("--%s: stored in a member of the wrong size", d->name);
	snprintf(opt, sizeof(opt), "--%s", d->name);
	switch (d->arg) {
	case A_U32:
		*(uint32_t *)to = parse_u32(opt, a);
		break;
	case A_U64:
		*(uint64_t *)to = parse_u64(opt, a, UINT64_MAX);
		break;
	case A_STR:
		*(const char **)to = a;
		break;
	case A_LAYOUT:
		*(uint32_t *)to = parse_name(opt, a, tool_layout_names,
					     KVP_KV_LAYOUT_COUNT);
		break;
	case A_CONV:
		*(uint32_t *)to = parse_name(opt, a, tool_conv_names,
					     KVP_CONV_LAYOUT_COUNT);
		break;
	case A_IDS: {
		struct idlist *l = (struct idlist *)to;
		uint32_t *n = l == o->lids ? &o->nlids : &o->nrids;

		if (*n == MAX_GROUPS)
			usage_error("%s: more than %u groups", opt, MAX_GROUPS);
		parse_ids(opt, a, &l[(*n)++]);
		break;
	}
	case A_TRUE:
	case A_FALSE:
		*(int *)to = d->arg == A_TRUE;
		break;
	case A_HELP:
		usage(stdout);
		exit(0);
	case A_VERSION:
		printf(PROG " %u.%u.%u\n", kvp_version() >> 16,
		       (kvp_version() >> 8) & 0xff, kvp_version() & 0xff);
		exit(0);
	case A_LIST:
		list_presets();
		exit(0);
	}
	if (d->have)
		*(int *)((char *)o + d->have) = 1;
}

void parse_opts(int argc, char **argv, struct opts *o)
{
	struct option lo[NOPTS + 1];
	size_t i;
	int c;

	memset(lo, 0, sizeof(lo));
	for (i = 0; i < NOPTS; i++) {
		lo[i].name = optdefs[i].name;
		lo[i].has_arg = optdefs[i].arg < A_TRUE ? required_argument :
							  no_argument;
		lo[i].val = 256 + (int)i;
	}
	memset(o, 0, sizeof(*o));
	o->loc.what = "local";
	o->rem.what = "remote";
	o->timing = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (c >= 256) {
			set_opt(o, &optdefs[c - 256], optarg);
		} else if (c == 'h') {
			usage(stdout);
			exit(0);
		} else {
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
	FILE *f = fopen(path, "rb");
	char *p;

	if (!f)
		die("%s: %s", path, strerror(errno));
	p = xcalloc(cap, 1);
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

/* The rules one option breaks alone, named by the option; the library's
 * message covers the rest (rules between numbers, such as TP and heads). */
static void check_side(const struct opts *o, const struct side *s)
{
	const char *local = s == &o->loc ? "local" : "remote";
	const struct kvp_model *m = &s->m;

	if (!s->e.tp_size)
		usage_error("--%s-tp 0: TP size must be at least 1", local);
	if (s->e.tp_rank >= s->e.tp_size)
		usage_error("--%s %u: rank is not below the %s TP size %u",
			    s == &o->loc ? "rank" : "remote-rank",
			    s->e.tp_rank, s->what, s->e.tp_size);
	if (!s->e.block_tokens)
		usage_error("--%s-block 0: block size must be at least 1 token",
			    local);
	if (s->have_kblock && s->e.kernel_block_tokens &&
	    s->e.block_tokens % s->e.kernel_block_tokens)
		usage_error("--%s-kernel-block %u: kernel block does not divide the block size %u",
			    local, s->e.kernel_block_tokens, s->e.block_tokens);
	if (!s->e.num_blocks)
		usage_error("--num-blocks 0: num_blocks must be at least 1");
	if (o->have_layers && !m->layers && !m->state_layers)
		usage_error("--layers 0: %s has no state layers; it needs at least 1 layer",
			    m->name);
	if (o->have_layers && m->sliding_layers > m->layers)
		usage_error("--layers %u: %s has %u sliding-window layers",
			    m->layers, m->name, m->sliding_layers);
	if (o->have_dtype && !m->dtype_bytes)
		usage_error("--dtype-bytes 0: dtype_bytes must be at least 1");
	if (o->have_kv_heads && !m->kv_heads && !m->mla_latent)
		usage_error("--kv-heads 0: kv_heads must be at least 1");
	if (o->have_head_dim && !m->head_dim && !m->mla_latent)
		usage_error("--head-dim 0: head_dim must be at least 1");
}

/* Whether the layout the library refused builds on one GPU: then the TP
 * size is what is wrong (TP against the heads), and its option is named. */
static int tp_to_blame(const struct side *s)
{
	struct kvp_engine_desc e = s->e;
	kvp_layout *l;

	if (e.tp_size == 1)
		return 0;
	e.tp_size = 1;
	e.tp_rank = 0;
	if (kvp_layout_build(&s->m, &e, &l))
		return 0;
	kvp_layout_destroy(l);
	return 1;
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
		if (err == -ENOENT)
			die("%s: %s (see " PROG " --list)", s->spec, msg);
		if (err)
			die("%s: %s", s->spec,
			    msg[0] ? msg : kvp_strerror(err));
		return;
	}
	if (!o->model)
		usage_error("no %s engine: give --model NAME or --%s-spec FILE",
			    s->what, s->what);
	err = kvp_model_preset(o->model, &s->m);
	if (err) {
		char valid[512] = "";
		const char *nm;
		size_t k = 0;
		uint32_t v;

		for (v = 0; (nm = kvp_model_preset_name(v)) && k < sizeof(valid);
		     v++)
			k += (size_t)snprintf(valid + k, sizeof(valid) - k,
					      "%s%s", v ? ", " : "", nm);
		usage_error("--model: unknown preset '%s' (presets: %s)",
			    o->model, valid);
	}
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
	if (!s->have_layout)
		s->e.kv_layout = TOOL_DEFAULT_KV_LAYOUT;
	s->e.num_blocks = o->have_nblocks ? o->nblocks : DEFAULT_NUM_BLOCKS;
	check_side(o, s);
	err = kvp_layout_build_msg(&s->m, &s->e, &s->l, msg, sizeof(msg));
	if (err && err != -ENOMEM && tp_to_blame(s))
		die("--%s-tp %u: %s (%s)", s->what, s->e.tp_size, msg,
		    s->m.name);
	if (err)
		die("%s layout: %s (%s)", s->what,
		    msg[0] ? msg : kvp_strerror(err), s->m.name);
}

static void check_usage(struct opts *o)
{
	if (o->model && o->loc.spec && o->rem.spec)
		usage_error("--model: both sides come from spec files");
	if (!o->model && (o->have_layers || o->have_kv_heads ||
			  o->have_head_dim || o->have_dtype ||
			  o->have_nblocks))
		usage_error("model overrides need --model");
	if (o->svg_all_ranks && !o->svg)
		usage_error("--svg-all-ranks: give --svg FILE to draw the picture");
	if (o->max_read > KVP_DEFAULT_MAX_READ)
		usage_error("--max-read %u: above %u (2^31, IB's largest message)",
			    o->max_read, KVP_DEFAULT_MAX_READ);
}

void build_sides(struct opts *o)
{
	check_usage(o);
	build_side(o, &o->loc);
	build_side(o, &o->rem);
}

void free_opts(struct opts *o)
{
	uint32_t g;

	for (g = 0; g < o->nlids; g++)
		free(o->lids[g].id);
	for (g = 0; g < o->nrids; g++)
		free(o->rids[g].id);
	kvp_layout_destroy(o->loc.l);
	kvp_layout_destroy(o->rem.l);
}
