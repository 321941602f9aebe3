// SPDX-License-Identifier: MIT
/* kvpull-plan --json: one document (docs/tools.md, "JSON schema"). */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "dump.h"

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

/* "key": [v, ...] on one line. */
static void j_u32s(struct jw *j, const char *key, const uint32_t *v,
		   uint32_t n)
{
	uint32_t i;

	j_open(j, key, '[', 1);
	for (i = 0; i < n; i++)
		j_u64(j, NULL, v[i]);
	j_close(j, ']');
}

static void j_ints(struct jw *j, const char *key, const int *v, uint32_t n)
{
	uint32_t i;

	j_open(j, key, '[', 1);
	for (i = 0; i < n; i++)
		j_int(j, NULL, v[i]);
	j_close(j, ']');
}

/*
 * Members of a public struct that print as they are: a uint32_t or
 * uint64_t as a number, or, with a name table, as the name of the value.
 * A table of them lists an object's members in schema order.
 */
struct jmember {
	const char *key;
	size_t off, size;
	const char *const *names;
	uint32_t nnames;
};

#define JM_AS(key, type, m)                                                \
	{ key, offsetof(type, m), sizeof(((type *)0)->m), NULL, 0 }
#define JM(type, m) JM_AS(#m, type, m)
#define JM_NAME(type, m, table)                                            \
	{ #m, offsetof(type, m), sizeof(((type *)0)->m), table,             \
	  TOOL_NELEM(table) }
#define NMEMBERS(t) (sizeof(t) / sizeof((t)[0]))

static void j_members(struct jw *j, const void *obj,
		      const struct jmember *m, size_t n)
{
	for (; n--; m++) {
		const char *p = (const char *)obj + m->off;
		uint64_t v64;
		uint32_t v32;

		if (m->size == sizeof(v64)) {
			memcpy(&v64, p, sizeof(v64));
		} else if (m->size == sizeof(v32)) {
			memcpy(&v32, p, sizeof(v32));
			v64 = v32;
		} else {
			die("JSON member %s: not a uint32_t or uint64_t",
			    m->key);
		}
		if (m->names)
			j_str(j, m->key,
			      tool_name_of(m->names, m->nnames, (uint32_t)v64));
		else
			j_u64(j, m->key, v64);
	}
}

/* An inline object of the members of *obj. */
static void j_object(struct jw *j, const char *key, const void *obj,
		     const struct jmember *m, size_t n)
{
	j_open(j, key, '{', 1);
	j_members(j, obj, m, n);
	j_close(j, '}');
}

/* "key": [ one inline object per element i < n, written by item() ] */
typedef void j_item_fn(struct jw *j, const void *ctx, uint32_t i);

static void j_objects(struct jw *j, const char *key, int inl, uint32_t n,
		      j_item_fn *item, const void *ctx)
{
	uint32_t i;

	j_open(j, key, '[', inl);
	for (i = 0; i < n; i++) {
		j_open(j, NULL, '{', 1);
		item(j, ctx, i);
		j_close(j, '}');
	}
	j_close(j, ']');
}

/* ---- an engine --------------------------------------------------------- */

#define T struct kvp_model
static const struct jmember model_members[] = {
	JM(T, layers), JM(T, kv_heads), JM(T, head_dim), JM(T, dtype_bytes),
	JM(T, mla_latent), JM(T, sliding_layers),
	JM_NAME(T, state_kind, tool_state_names), JM(T, state_layers),
	JM(T, conv_kernel), JM(T, ssm_heads), JM(T, ssm_head_dim),
	JM(T, ssm_state), JM(T, ssm_groups), JM(T, state_dtype_bytes),
};
#undef T

#define T struct kvp_engine_desc
static const struct jmember engine_members[] = {
	JM(T, block_tokens), JM(T, kernel_block_tokens), JM(T, num_blocks),
	JM_NAME(T, kv_layout, tool_layout_names),
	JM_NAME(T, conv_layout, tool_conv_names),
};
#undef T

#define T struct kvp_group_desc
static const struct jmember group_members[] = {
	JM_NAME(T, kind, tool_group_names), JM(T, block_tokens),
};
#undef T

#define T struct kvp_view_desc
static const struct jmember view_members[] = {
	JM(T, group), JM(T, region), JM(T, layer), JM(T, num_blocks),
	JM(T, offset), JM(T, stride),
};
#undef T

#define T struct kvp_dim
static const struct jmember dim_members[] = {
	JM_NAME(T, axis, tool_axis_names), JM(T, size), JM(T, stride),
};
#undef T

static void json_group(struct jw *j, const void *l, uint32_t i)
{
	struct kvp_group_desc g;

	checked(kvp_layout_get_group(l, i, &g), "group", i);
	j_members(j, &g, group_members, NMEMBERS(group_members));
}

static void json_region(struct jw *j, const void *l, uint32_t i)
{
	uint64_t size;

	checked(kvp_layout_get_region(l, i, &size), "region", i);
	j_u64(j, "size", size);
}

static void json_view(struct jw *j, const void *l, uint32_t i)
{
	struct kvp_view_desc v;

	checked(kvp_layout_get_view(l, i, &v), "view", i);
	j_members(j, &v, view_members, NMEMBERS(view_members));
}

static void json_dim(struct jw *j, const void *f, uint32_t i)
{
	const struct kvp_dim *dim = ((const struct kvp_field_desc *)f)->dim;

	j_members(j, &dim[i], dim_members, NMEMBERS(dim_members));
}

#define T struct kvp_field_desc
static const struct jmember field_members[] = {
	JM_NAME(T, kind, tool_field_names), JM(T, elem_size), JM(T, offset),
};
#undef T

static void json_field(struct jw *j, const void *l, uint32_t i)
{
	static const char *const shard_keys[] = { "shard_dim", "shard_total",
						  "shard_start", "shard_len" };
	struct kvp_layout_info li;
	struct kvp_field_desc f;
	uint32_t view, k, shard[4];

	kvp_layout_get_info(l, &li);
	checked(kvp_layout_get_field(l, i, &view, &f), "field", i);
	j_u64(j, "view", view);
	j_members(j, &f, field_members, NMEMBERS(field_members));
	shard[0] = f.shard_dim;
	shard[1] = f.shard_total;
	if (f.shard_dim != KVP_NO_SHARD &&
	    !kvp_shard_range(f.shard_total, li.tp_size, li.tp_rank, &shard[2],
			     &shard[3])) {
		for (k = 0; k < 4; k++)
			j_u64(j, shard_keys[k], shard[k]);
	} else {
		for (k = 0; k < 4; k++)
			j_null(j, shard_keys[k]);
	}
	j_objects(j, "dims", 1, f.ndim, json_dim, &f);
}

static void json_side(struct jw *j, const char *key, const struct side *s)
{
	struct kvp_layout_info li;
	char hash[24];

	kvp_layout_get_info(s->l, &li);
	j_open(j, key, '{', 0);
	if (s->spec) {
		j_str(j, "spec", s->spec);
		j_null(j, "model");
		j_null(j, "engine");
	} else {
		j_null(j, "spec");
		j_open(j, "model", '{', 1);
		j_str(j, "name", s->m.name);
		j_members(j, &s->m, model_members, NMEMBERS(model_members));
		j_close(j, '}');
		j_object(j, "engine", &s->e, engine_members,
			 NMEMBERS(engine_members));
	}
	j_u64(j, "engine_id", li.engine_id);
	j_u64(j, "tp_size", li.tp_size);
	j_u64(j, "tp_rank", li.tp_rank);
	snprintf(hash, sizeof(hash), "0x%016" PRIx64,
		 kvp_layout_compat_hash(s->l));
	j_str(j, "compat_hash", hash);
	j_objects(j, "groups", 0, li.ngroups, json_group, s->l);
	j_objects(j, "regions", 0, li.nregions, json_region, s->l);
	j_objects(j, "views", 0, li.nviews, json_view, s->l);
	j_objects(j, "fields", 0, li.nfields, json_field, s->l);
	j_close(j, '}');
}

/* ---- the plan ---------------------------------------------------------- */

#define T struct kvp_plan_info
static const struct jmember info_members[] = {
	JM(T, ngroups), JM(T, nsrc), JM(T, nnotify), JM(T, nstreams),
	JM(T, npieces), JM(T, local_tp), JM(T, local_rank), JM(T, remote_tp),
	JM(T, max_sge), JM(T, max_len), JM(T, bytes),
};
#undef T

#define T struct kvp_plan_group
static const struct jmember plan_group_members[] = {
	JM_NAME(T, kind, tool_group_names), JM(T, local_tokens),
	JM(T, remote_tokens), JM(T, period_tokens), JM(T, local_per_period),
	JM(T, remote_per_period), JM(T, local_blocks), JM(T, remote_blocks),
};
#undef T

/* A stream's members after "src_rank" and "layer", which the plan does not
 * hold. */
#define T struct kvp_plan_stream
static const struct jmember stream_members[] = {
	JM(T, local_view), JM(T, local_region), JM(T, remote_view),
	JM(T, remote_region), JM(T, piece_first), JM(T, npieces),
	JM(T, bytes_per_period),
};
#undef T

#define T struct kvp_plan_piece
static const struct jmember piece_members[] = {
	JM(T, remote_block), JM(T, remote_offset), JM(T, local_block),
	JM(T, local_offset), JM(T, len),
};
#undef T

static void json_plan_group(struct jw *j, const void *ctx, uint32_t g)
{
	const struct dump *d = ctx;
	uint32_t s;

	j_members(j, &d->pg[g], plan_group_members,
		  NMEMBERS(plan_group_members));
	j_open(j, "sources", '[', 1);
	for (s = 0; s < d->info.nsrc; s++)
		if (serves(d, g, s))
			j_u64(j, NULL, s);
	j_close(j, ']');
}

static void json_stream(struct jw *j, const void *ctx, uint32_t i)
{
	const struct dump *d = ctx;
	struct kvp_plan_stream st;

	checked(kvp_plan_get_stream(d->plan, i, &st), "stream", i);
	j_u64(j, "src", st.src);
	j_int(j, "src_rank", d->src_rank[st.src]);
	j_u64(j, "group", st.group);
	j_u64(j, "layer", view_layer(d->o->loc.l, st.local_view));
	j_members(j, &st, stream_members, NMEMBERS(stream_members));
}

static void json_piece(struct jw *j, const void *plan, uint32_t i)
{
	struct kvp_plan_piece pc;

	checked(kvp_plan_get_piece(plan, i, &pc), "piece", i);
	j_members(j, &pc, piece_members, NMEMBERS(piece_members));
}

static void json_plan(struct jw *j, const struct dump *d)
{
	j_open(j, "plan", '{', 0);
	j_object(j, "info", &d->info, info_members, NMEMBERS(info_members));
	j_ints(j, "sources", d->src_rank, d->info.nsrc);
	j_ints(j, "notify", d->notify_rank, d->info.nnotify);
	j_objects(j, "groups", 0, d->info.ngroups, json_plan_group, d);
	j_objects(j, "streams", 0, d->info.nstreams, json_stream, d);
	j_objects(j, "pieces", 0, d->info.npieces, json_piece, d->plan);
	j_close(j, '}');
}

/* ---- the request ------------------------------------------------------- */

#define T struct kvp_wr
static const struct jmember wr_members[] = {
	JM_AS("remote_region", T, region), JM_AS("remote_offset", T, offset),
	JM(T, len),
};
#undef T

#define T struct kvp_sge
static const struct jmember sge_members[] = {
	JM(T, region), JM(T, offset), JM(T, len),
};
#undef T

static void json_request_group(struct jw *j, const void *rq_, uint32_t g)
{
	const struct request *rq = rq_;

	j_u32s(j, "local_ids", rq->ids[g].local, rq->ids[g].nlocal);
	j_u32s(j, "remote_ids", rq->ids[g].remote, rq->ids[g].nremote);
	j_u64(j, "tokens", rq->need[g].tokens);
	j_u64(j, "skip", rq->need[g].skip);
	j_u64(j, "wrs", rq->wrs_group[g]);
	j_u64(j, "naive_wrs", rq->naive_group[g]);
	j_u64(j, "bytes", rq->bytes_group[g]);
}

static void json_sge(struct jw *j, const void *sge, uint32_t i)
{
	j_members(j, (const struct kvp_sge *)sge + i, sge_members,
		  NMEMBERS(sge_members));
}

static void json_wr(struct jw *j, const void *ctx, uint32_t i)
{
	const struct dump *d = ctx;
	const struct kvp_wr *w = &d->rq.wr[i];

	j_u64(j, "group", w->group);
	j_u64(j, "src", w->src);
	j_int(j, "src_rank", d->src_rank[w->src]);
	j_members(j, w, wr_members, NMEMBERS(wr_members));
	j_objects(j, "sges", 1, w->nsge, json_sge, &d->rq.sge[w->sge_first]);
}

static void json_request(struct jw *j, const struct dump *d)
{
	const struct request *rq = &d->rq;

	if (!d->have_request) {
		j_null(j, "request");
		return;
	}
	j_open(j, "request", '{', 0);
	j_objects(j, "groups", 0, d->info.ngroups, json_request_group, rq);
	j_objects(j, "wrs", 0, rq->nwr, json_wr, d);
	j_u64(j, "naive_wrs", rq->naive);
	j_u64(j, "bytes", rq->bytes);
	j_bool(j, "local_overlap", rq->overlap);
	j_close(j, '}');
}

void print_json(const struct dump *d)
{
	struct jw j;
	char title[768];

	memset(&j, 0, sizeof(j));
	plan_title(d, 1, title, sizeof(title));
	j_open(&j, NULL, '{', 0);
	j_u64(&j, "version", 1);
	j_str(&j, "title", title);
	json_side(&j, "local", &d->o->loc);
	json_side(&j, "remote", &d->o->rem);
	json_plan(&j, d);
	j_ints(&j, "notify_expected", d->expected, d->remote_tp);
	json_request(&j, d);
	j_close(&j, '}');
}
