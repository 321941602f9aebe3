// SPDX-License-Identifier: MIT
/*
 * kvpull-plan --svg FILE: the plan as a picture, plain SVG written by hand.
 *
 * One band per group. In a band, one row per producer rank the consumer
 * reads from: the producer's box on the left, an arrow to the consumer's box
 * on the right, and on the arrow what it carries: the head range (the
 * sharded axis of the group's first sharded field), the layers, and the
 * READs and bytes of a request of N remote blocks per group (--request N, or
 * --svg-request N, else 16). Producer ranks nothing is read from are listed
 * under the bands.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dump.h"

#define SVG_W 1200
#define ROW_H 30
#define HEAD_H 40
#define TOP 64
#define PROD_X 20
#define PROD_W 150
#define CONS_X 1010
#define CONS_W 170
#define DEFAULT_SVG_REQUEST 16
/* A white outline behind text, so that it reads over lines. */
#define HALO "stroke=\"#ffffff\" stroke-width=\"3\" paint-order=\"stroke\""

/* Per (group, source): what the arrow says. */
struct arrow {
	uint32_t layers, lay_lo, lay_hi;
	uint64_t wrs, bytes;
};

/* The band colour and the arrow colour of each group kind. */
static const char *const band_fill[KVP_GROUP_KIND_COUNT] = {
	"#dbe9f6", "#e2f0d9", "#efe0f3", "#fcefd4",
};
static const char *const line_col[KVP_GROUP_KIND_COUNT] = {
	"#2b6cb0", "#2f855a", "#805ad5", "#b7791f",
};

/* Text with &, < and > escaped. */
static void xml_text(FILE *f, const char *s)
{
	for (; *s; s++) {
		if (*s == '&')
			fputs("&amp;", f);
		else if (*s == '<')
			fputs("&lt;", f);
		else if (*s == '>')
			fputs("&gt;", f);
		else
			fputc(*s, f);
	}
}

__attribute__((format(printf, 6, 7))) static void text(FILE *f, int x, int y,
						       const char *attrs,
						       const char *anchor,
						       const char *fmt, ...)
{
	char buf[512];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	fprintf(f, "<text x=\"%d\" y=\"%d\" text-anchor=\"%s\" %s>", x, y,
		anchor, attrs);
	xml_text(f, buf);
	fputs("</text>\n", f);
}

/* "a-b" of an index range [lo, hi), or "a" when it holds one index. */
static const char *range(uint32_t lo, uint32_t hi, char *buf, size_t n)
{
	if (hi - lo <= 1)
		snprintf(buf, n, "%u", lo);
	else
		snprintf(buf, n, "%u-%u", lo, hi - 1);
	return buf;
}

/* The first sharded field of group g in layout l: 0 and *f, or -1. */
static int sharded_field(const kvp_layout *l, uint32_t g,
			 struct kvp_field_desc *f)
{
	struct kvp_layout_info li;
	struct kvp_view_desc v;
	uint32_t i, view;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nfields; i++) {
		checked(kvp_layout_get_field(l, i, &view, f), "field", i);
		checked(kvp_layout_get_view(l, view, &v), "view", view);
		if (v.group == g && f->shard_dim != KVP_NO_SHARD)
			return 0;
	}
	return -1;
}

/* Emits a request of n remote blocks per group (ids from 0; local ids
 * from 0 covering them) and adds its READs and bytes into a[g * nsrc + s]. */
static void count_request(const struct dump *d, uint32_t n, struct arrow *a)
{
	struct kvp_ids ids[MAX_GROUPS];
	uint32_t g, i, maxids = n, maxw, maxs, *rid, *lid;
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	int got;

	for (g = 0; g < d->info.ngroups; g++) {
		const struct kvp_plan_group *pg = &d->pg[g];
		uint64_t nl = n;

		if (pg->kind != KVP_GROUP_STATE)
			nl = ((uint64_t)n * pg->remote_tokens +
			      pg->local_tokens - 1) /
			     pg->local_tokens;
		if (nl > maxids)
			maxids = (uint32_t)nl;
		ids[g].nremote = n;
		ids[g].nlocal = (uint32_t)nl;
		ids[g].tokens = 0;
	}
	/* One list 0..maxids-1 serves every group. */
	rid = xcalloc(maxids, sizeof(*rid));
	for (i = 0; i < maxids; i++)
		rid[i] = i;
	lid = rid;
	for (g = 0; g < d->info.ngroups; g++) {
		ids[g].remote = rid;
		ids[g].local = lid;
	}
	kvp_plan_emit_bound(d->plan, maxids, &maxw, &maxs);
	wr = xcalloc(maxw, sizeof(*wr));
	sge = xcalloc(maxs, sizeof(*sge));
	got = kvp_plan_emit(d->plan, ids, wr, maxw, sge, maxs, NULL);
	if (got < 0)
		die("--svg: a request of %u blocks per group: %s%s", n,
		    kvp_strerror(got),
		    got == -ERANGE ? " (give a smaller --svg-request)" : "");
	for (i = 0; i < (uint32_t)got; i++) {
		struct arrow *x = &a[wr[i].group * d->info.nsrc + wr[i].src];

		x->wrs++;
		x->bytes += wr[i].len;
	}
	free(wr);
	free(sge);
	free(rid);
}

/* Layers each (group, source) reads, from the streams: a layer counts once
 * however many streams (K and V regions) carry it. One pass over the
 * streams per source, with a bitmap of the layers per group. */
static void count_layers(const struct dump *d, struct arrow *a)
{
	const kvp_layout *l = d->o->loc.l;
	struct kvp_layout_info li;
	struct kvp_plan_stream st;
	struct kvp_view_desc v;
	uint32_t i, s, layer, nlayers = 0;
	uint8_t *seen;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nviews; i++) {
		checked(kvp_layout_get_view(l, i, &v), "view", i);
		if (v.layer >= nlayers)
			nlayers = v.layer + 1;
	}
	seen = xcalloc((size_t)d->info.ngroups * nlayers, 1);
	for (s = 0; s < d->info.nsrc; s++) {
		memset(seen, 0, (size_t)d->info.ngroups * nlayers);
		for (i = 0; i < d->info.nstreams; i++) {
			struct arrow *x;
			uint8_t *b;

			checked(kvp_plan_get_stream(d->plan, i, &st), "stream",
				i);
			if (st.src != s)
				continue;
			layer = view_layer(l, st.local_view);
			b = &seen[(size_t)st.group * nlayers + layer];
			if (*b)
				continue;
			*b = 1;
			x = &a[st.group * d->info.nsrc + s];
			if (!x->layers || layer < x->lay_lo)
				x->lay_lo = layer;
			if (!x->layers || layer > x->lay_hi)
				x->lay_hi = layer;
			x->layers++;
		}
	}
	free(seen);
}

static const char *layers_text(const struct arrow *x, char *buf, size_t n)
{
	if (x->layers == 1)
		snprintf(buf, n, "layer %u", x->lay_lo);
	else if (x->lay_hi - x->lay_lo + 1 == x->layers)
		snprintf(buf, n, "layers %u-%u", x->lay_lo, x->lay_hi);
	else
		snprintf(buf, n, "%u layers in %u-%u", x->layers, x->lay_lo,
			 x->lay_hi);
	return buf;
}

/* One band: the group header and a row per source serving it. */
static int band(FILE *f, const struct dump *d, uint32_t g, int y,
		const struct arrow *a, int cons_y0, uint32_t req)
{
	const struct kvp_plan_group *pg = &d->pg[g];
	const char *kind = TOOL_NAME(tool_group_names, pg->kind);
	const char *fill = pg->kind < KVP_GROUP_KIND_COUNT ?
				   band_fill[pg->kind] :
				   "#eeeeee";
	const char *col = pg->kind < KVP_GROUP_KIND_COUNT ? line_col[pg->kind] :
							     "#444444";
	struct kvp_field_desc lf;
	uint32_t s, rows = 0, lstart = 0, llen = 0, total = 0, axis = 0;
	uint64_t wrs = 0;
	char hdr[160], r1[32], r2[32], lt[48], hb[32];
	int have_shard, h, row;

	for (s = 0; s < d->info.nsrc; s++)
		if (serves(d, g, s))
			rows++;
	h = HEAD_H + (int)(rows ? rows : 1) * ROW_H + 8;
	fprintf(f,
		"<rect x=\"10\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"6\" fill=\"%s\" stroke=\"%s\" stroke-width=\"1\"/>\n",
		y, SVG_W - 20, h, fill, col);
	have_shard = !sharded_field(d->o->loc.l, g, &lf);
	if (have_shard) {
		total = lf.shard_total;
		axis = lf.dim[lf.shard_dim].axis;
		checked(kvp_shard_range(total, d->info.local_tp,
					d->info.local_rank, &lstart, &llen),
			"shard range", g);
	}
	if (pg->kind == KVP_GROUP_STATE)
		snprintf(hdr, sizeof(hdr), "group %u: %s (whole states)", g,
			 kind);
	else
		snprintf(hdr, sizeof(hdr),
			 "group %u: %s, blocks of %u tokens read from blocks of %u",
			 g, kind, pg->local_tokens, pg->remote_tokens);
	text(f, 24, y + 18, "font-weight=\"bold\" font-size=\"15\"", "start",
	     "%s", hdr);
	for (s = 0; s < d->info.nsrc; s++)
		wrs += a[g * d->info.nsrc + s].wrs;
	if (have_shard)
		text(f, 24, y + 34, "font-size=\"12\" fill=\"#333\"", "start",
		     "consumer holds %s %s of %u (field %s); %" PRIu64
		     " READs for %u blocks",
		     TOOL_NAME(tool_axis_names, axis),
		     range(lstart, lstart + llen, r1, sizeof(r1)), total,
		     TOOL_NAME(tool_field_names, lf.kind), wrs, req);
	else
		text(f, 24, y + 34, "font-size=\"12\" fill=\"#333\"", "start",
		     "fields replicated on every rank; %" PRIu64
		     " READs for %u blocks",
		     wrs, req);
	row = 0;
	for (s = 0; s < d->info.nsrc; s++) {
		const struct arrow *x = &a[g * d->info.nsrc + s];
		int p = d->src_rank[s], ry, ay;
		uint32_t pstart, plen, lo, hi;
		char what[64];

		if (!serves(d, g, s))
			continue;
		ry = y + HEAD_H + row * ROW_H;
		ay = ry + ROW_H / 2;
		fprintf(f,
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"4\" fill=\"#ffffff\" stroke=\"%s\"/>\n",
			PROD_X, ry + 3, PROD_W, ROW_H - 6, col);
		text(f, PROD_X + PROD_W / 2, ry + ROW_H / 2 + 5,
		     "font-size=\"13\"", "middle", "producer rank %d", p);
		/* Straight across under its label, then into the consumer. */
		fprintf(f,
			"<polyline points=\"%d,%d %d,%d %d,%d\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" marker-end=\"url(#arrow)\"/>\n",
			PROD_X + PROD_W, ay, CONS_X - 70, ay, CONS_X - 4,
			cons_y0 + (ay - cons_y0) / 8, col);
		what[0] = 0;
		if (have_shard && !kvp_shard_range(total, d->remote_tp,
						   (uint32_t)p, &pstart,
						   &plen)) {
			lo = pstart > lstart ? pstart : lstart;
			hi = pstart + plen < lstart + llen ? pstart + plen :
							     lstart + llen;
			snprintf(what, sizeof(what), "%s %s of %u, ",
				 TOOL_NAME(tool_axis_names, axis),
				 range(lo, hi > lo ? hi : lo + 1, r2,
				       sizeof(r2)),
				 total);
		}
		text(f, (PROD_X + PROD_W + CONS_X - 70) / 2, ay - 6,
		     "font-size=\"12\" fill=\"#111\" " HALO, "middle",
		     "%s%s: %" PRIu64 " READs, %s", what,
		     layers_text(x, lt, sizeof(lt)), x->wrs,
		     human(x->bytes, hb, sizeof(hb)));
		row++;
	}
	return h;
}

void write_svg(const struct dump *d)
{
	const struct opts *o = d->o;
	uint32_t req = o->have_svg_request ? o->svg_request :
		       o->have_request	   ? o->request :
					     DEFAULT_SVG_REQUEST;
	uint32_t g, s, p, nidle = 0;
	struct arrow *a;
	char *read_from;
	char title[768];
	int y, h = TOP, cons_y0, cons_h;
	FILE *f;

	if (!req)
		usage_error("--svg-request 0: a request needs at least 1 block");
	a = xcalloc((size_t)d->info.ngroups * (d->info.nsrc ? d->info.nsrc : 1),
		    sizeof(*a));
	count_request(d, req, a);
	count_layers(d, a);
	/* The height: every band, then the idle ranks' line. */
	for (g = 0; g < d->info.ngroups; g++) {
		uint32_t rows = 0;

		for (s = 0; s < d->info.nsrc; s++)
			rows += (uint32_t)serves(d, g, s);
		h += HEAD_H + (int)(rows ? rows : 1) * ROW_H + 8 + 10;
	}
	h += 40;
	read_from = xcalloc(d->remote_tp, 1);
	for (s = 0; s < d->info.nsrc; s++)
		if ((uint32_t)d->src_rank[s] < d->remote_tp)
			read_from[d->src_rank[s]] = 1;

	f = fopen(o->svg, "w");
	if (!f)
		die("--svg %s: %s", o->svg, strerror(errno));
	fprintf(f,
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
		SVG_W, h, SVG_W, h);
	/* The document's title says whether these are an agent's defaults;
	 * the heading, what the plan was made with. */
	plan_title(d, 1, title, sizeof(title));
	fputs("<title>", f);
	xml_text(f, title);
	fputs("</title>\n", f);
	fprintf(f,
		"<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerWidth=\"7\" markerHeight=\"7\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#333\"/></marker></defs>\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n");
	plan_title(d, 0, title, sizeof(title));
	text(f, 20, 26, "font-size=\"16\" font-weight=\"bold\"", "start",
	     "%s", title);
	text(f, 20, 48, "font-size=\"13\" fill=\"#444\"", "start",
	     "READs and bytes per request of %u remote blocks per group (ids 0-%u); %u producer rank%s read from",
	     req, req - 1, d->info.nsrc, PLURAL(d->info.nsrc));
	/* The consumer's box sits in the middle of the bands. */
	cons_y0 = TOP;
	cons_h = h - TOP - 50;
	y = TOP;
	for (g = 0; g < d->info.ngroups; g++)
		y += band(f, d, g, y, a, cons_y0 + cons_h / 2, req) + 10;
	/* Drawn after the bands so that they sit on top. */
	fprintf(f,
		"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"6\" fill=\"#ffffff\" stroke=\"#222\" stroke-width=\"2\"/>\n",
		CONS_X, cons_y0 + cons_h / 2 - 30, CONS_W, 60);
	text(f, CONS_X + CONS_W / 2, cons_y0 + cons_h / 2 - 6,
	     "font-size=\"15\" font-weight=\"bold\"", "middle",
	     "consumer rank %u", d->info.local_rank);
	text(f, CONS_X + CONS_W / 2, cons_y0 + cons_h / 2 + 14,
	     "font-size=\"12\"", "middle", "of TP %u", d->info.local_tp);
	for (p = 0; p < d->remote_tp; p++)
		nidle += !read_from[p];
	if (nidle) {
		char list[256] = "";
		size_t n = 0;

		for (p = 0; p < d->remote_tp && n + 12 < sizeof(list); p++)
			if (!read_from[p])
				n += (size_t)snprintf(list + n,
						      sizeof(list) - n, "%s%u",
						      n ? " " : "", p);
		text(f, 20, y + 20, "font-size=\"13\" fill=\"#666\"", "start",
		     "producer ranks not read from (%u): %s", nidle, list);
	} else {
		text(f, 20, y + 20, "font-size=\"13\" fill=\"#666\"", "start",
		     "every producer rank is read from");
	}
	fputs("</svg>\n", f);
	if (fclose(f))
		die("--svg %s: write error", o->svg);
	free(read_from);
	free(a);
}
