// SPDX-License-Identifier: MIT
/* kvpull-plan: the plan and what is derived from it once. */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dump.h"

uint32_t view_layer(const kvp_layout *l, uint32_t view)
{
	struct kvp_view_desc v;

	checked(kvp_layout_get_view(l, view, &v), "view", view);
	return v.layer;
}

/* ---- everything computed once ----------------------------------------- */

/* Per view of l: a bit per field kind it holds. */
static uint32_t *view_kinds(const kvp_layout *l)
{
	struct kvp_layout_info li;
	uint32_t *vk, i, view;

	kvp_layout_get_info(l, &li);
	vk = xcalloc(li.nviews, sizeof(*vk));
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc f;

		if (kvp_layout_get_field(l, i, &view, &f) || view >= li.nviews)
			die("field %u: unreadable", i);
		vk[view] |= 1u << f.kind;
	}
	return vk;
}

void kinds_name(uint32_t kinds, char *buf, size_t len)
{
	uint32_t k;
	size_t n = 0;

	buf[0] = 0;
	for (k = 0; k < 32 && n < len; k++)
		if (kinds & (1u << k))
			n += (size_t)snprintf(buf + n, len - n, "%s%s",
					      n ? "+" : "",
					      TOOL_NAME(tool_field_names, k));
}

static double now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

/* ranks[i] = rank(plan, i) for i < n, in a new array. */
static int *ranks(const kvp_plan *plan, uint32_t n,
		  int (*rank)(const kvp_plan *, uint32_t))
{
	int *r = xcalloc(n, sizeof(int));
	uint32_t i;

	for (i = 0; i < n; i++)
		r[i] = rank(plan, i);
	return r;
}

void compile_plan(struct opts *o, const kvp_layout *local, struct dump *d)
{
	struct kvp_plan_attr attr;
	struct kvp_layout_info li, ri;
	char msg[256] = "", who[48] = "";
	uint32_t i;
	double t0;
	int err;

	d->o = o;
	/* What an agent with these max_sge and max_read plans with. */
	tool_plan_attr(&attr, o->max_sge, o->max_read);
	t0 = now_us();
	err = kvp_plan_compile(local, o->rem.l, &attr, &d->plan, msg,
			       sizeof(msg));
	d->compile_us = now_us() - t0;
	if (err && local != o->loc.l) {
		kvp_layout_get_info(local, &li);
		snprintf(who, sizeof(who), "consumer rank %u: ", li.tp_rank);
	}
	if (err)
		die("%scannot plan: %s%s%s", who, kvp_strerror(err),
		    msg[0] ? ": " : "", msg);
	kvp_plan_get_info(d->plan, &d->info);
	if (d->info.ngroups > MAX_GROUPS)
		die("more than %u groups", MAX_GROUPS);
	for (i = 0; i < d->info.ngroups; i++)
		checked(kvp_plan_get_group(d->plan, i, &d->pg[i]), "group", i);
	d->src_rank = ranks(d->plan, d->info.nsrc, kvp_plan_source);
	kvp_layout_get_info(o->rem.l, &ri);
	d->remote_tp = ri.tp_size;
}

void compute(struct opts *o, struct dump *d)
{
	uint32_t i;

	compile_plan(o, o->loc.l, d);
	d->notify_rank = ranks(d->plan, d->info.nnotify, kvp_plan_notify);
	d->expected = xcalloc(d->remote_tp, sizeof(int));
	for (i = 0; i < d->remote_tp; i++) {
		d->expected[i] = kvp_notify_expected(o->rem.l, o->loc.l, i);
		if (d->expected[i] < 0)
			die("kvp_notify_expected(producer %u): %s", i,
			    kvp_strerror(d->expected[i]));
	}
	d->lkinds = view_kinds(o->loc.l);
	d->rkinds = view_kinds(o->rem.l);
	d->have_request = o->have_request || o->have_hit || o->have_tokens ||
			  o->nlids || o->nrids || o->range;
	if (d->have_request)
		make_request(o, d->plan, d->pg, d->info.ngroups, &d->rq);
}

void free_dump(struct dump *d)
{
	if (d->have_request)
		free_request(&d->rq, d->o, d->info.ngroups);
	free(d->src_rank);
	free(d->notify_rank);
	free(d->expected);
	free(d->lkinds);
	free(d->rkinds);
	kvp_plan_destroy(d->plan);
}

/* "2 GiB", "1 MiB", "4 KiB" when exact, else "1000000 B". */
static const char *cap_text(uint32_t b, char *buf, size_t n)
{
	static const char *const unit[] = { "B", "KiB", "MiB", "GiB" };
	uint32_t u = 0;

	while (u < 3 && b && !(b & 1023)) {
		b >>= 10;
		u++;
	}
	snprintf(buf, n, "%u %s", b, unit[u]);
	return buf;
}

/* "TP 2 (flash_hnd)", "llama-3.1-8b TP 1 rank 0 (flash_hnd)" (`named`),
 * "TP 2 (MLA)", "spec FILE, TP 2"; `rank` 1 names the layout's rank, 2
 * every rank ("TP 4 ranks 0-3"). */
static void side_title(const struct side *s, int rank, int named, char *buf,
		       size_t n)
{
	struct kvp_layout_info li;
	char r[32] = "";

	kvp_layout_get_info(s->l, &li);
	if (rank == 2 && li.tp_size > 1)
		snprintf(r, sizeof(r), " ranks 0-%u", li.tp_size - 1);
	else if (rank)
		snprintf(r, sizeof(r), " rank %u", rank == 2 ? 0 : li.tp_rank);
	if (s->spec)
		snprintf(buf, n, "spec %s, TP %u%s", s->spec, li.tp_size, r);
	else
		snprintf(buf, n, "%s%sTP %u%s (%s)", named ? s->m.name : "",
			 named ? " " : "", li.tp_size, r,
			 s->m.mla_latent ?
				 "MLA" :
				 TOOL_NAME(tool_layout_names, s->e.kv_layout));
}

void plan_title(const struct dump *d, int flags, char *buf, size_t len)
{
	const struct opts *o = d->o;
	char p[300], c[300], cap[32], dcap[32];
	int spec = o->loc.spec || o->rem.spec;
	size_t k;

	/* The model once when both sides are the preset's. */
	side_title(&o->rem, 0, spec, p, sizeof(p));
	side_title(&o->loc, flags & TITLE_ALL_RANKS ? 2 : 1, spec, c,
		   sizeof(c));
	k = (size_t)snprintf(buf, len, "%s%sproducer %s -> consumer %s; max_sge %u, READ cap %s",
			     spec ? "" : o->model, spec ? "" : ", ", p, c,
			     d->info.max_sge,
			     cap_text(d->info.max_len, cap, sizeof(cap)));
	if (!(flags & TITLE_TAIL) || k >= len)
		return;
	if (d->info.max_sge == KVP_DEFAULT_MAX_SGE &&
	    d->info.max_len == KVP_DEFAULT_MAX_READ)
		snprintf(buf + k, len - k, ": an agent's defaults");
	else
		snprintf(buf + k, len - k,
			 " (an agent's defaults: max_sge %u, READ cap %s)",
			 KVP_DEFAULT_MAX_SGE,
			 cap_text(KVP_DEFAULT_MAX_READ, dcap, sizeof(dcap)));
}

/* kvp_plan_get_group() sets every bit past 64 sources; the streams then say
 * it exactly. */
int serves(const struct dump *d, uint32_t g, uint32_t s)
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

const char *human(uint64_t b, char *buf, size_t n)
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
