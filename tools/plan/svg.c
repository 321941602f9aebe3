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
 *
 * The consumer's box spans its bands and each arrow runs straight along
 * its row into the box's edge: arrowheads (ARROW_PX) sit ROW_H apart
 * however many producer ranks feed the consumer. An arrow whose producer
 * bytes other consumer ranks read too (KV heads replicated because the
 * consumer's TP is above the KV heads, MLA latents) is dashed and says
 * which ranks (find_replicas(), ranks.c). --svg-all-ranks draws a panel
 * per consumer rank, SVG_MAX_RANKS at most. A legend ends the picture.
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
#define ARROW_PX 12  /* arrowhead size, below ROW_H */
#define PANEL_H 32   /* --svg-all-ranks: a panel's heading */
#define IDLE_H 32    /* the line of producer ranks not read from */
#define LEGEND_H 56  /* two entries */
#define SVG_MAX_RANKS 16
#define DASH "stroke-dasharray=\"8 4\""
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

/* "consumer rank 1", "producer ranks 0-1", "3 consumer ranks in 1-9". */
static const char *ranks_text(const char *side, uint32_t n, uint32_t lo,
			      uint32_t hi, char *buf, size_t len)
{
	if (n == 1)
		snprintf(buf, len, "%s rank %u", side, lo);
	else if (hi - lo + 1 == n)
		snprintf(buf, len, "%s ranks %u-%u", side, lo, hi);
	else
		snprintf(buf, len, "%u %s ranks in %u-%u", n, side, lo, hi);
	return buf;
}

/* The ranks of TP tp holding the shard rank r holds of an axis of extent
 * total (r among them): how many, the lowest and the highest. More than
 * one when TP is above the extent (GQA: KV heads replicated). */
static uint32_t same_shard(uint32_t total, uint32_t tp, uint32_t r,
			   uint32_t *lo, uint32_t *hi)
{
	uint32_t c, st, ln, mst, mln, n = 0;

	if (kvp_shard_range(total, tp, r, &mst, &mln))
		return 0;
	for (c = 0; c < tp; c++) {
		if (kvp_shard_range(total, tp, c, &st, &ln) || st != mst ||
		    ln != mln)
			continue;
		if (!n++)
			*lo = c;
		*hi = c;
	}
	return n;
}

/* The rows of group g: one per source serving it, at least one. */
static uint32_t band_rows(const struct dump *d, uint32_t g)
{
	uint32_t s, rows = 0;

	for (s = 0; s < d->info.nsrc; s++)
		rows += (uint32_t)serves(d, g, s);
	return rows ? rows : 1;
}

static int band_height(const struct dump *d, uint32_t g)
{
	return HEAD_H + (int)band_rows(d, g) * ROW_H + 8;
}

/* A panel: the bands of one consumer rank, its box and its idle ranks. */
static int panel_height(const struct dump *d, int all)
{
	uint32_t g;
	int h = (all ? PANEL_H : 0) + IDLE_H;

	for (g = 0; g < d->info.ngroups; g++)
		h += band_height(d, g) + 10;
	return h;
}

/* One consumer rank's picture: its request counted, and for each (group,
 * source) what other consumer ranks read of the same producer bytes. */
struct panel {
	const struct dump *d;
	struct arrow *a;
	struct share *sh;
};

/* ", replicated on consumer ranks 0-1 (GQA)" when other consumer ranks
 * hold the same shard of the field, else "". */
static void replicated_text(const struct dump *d, uint32_t g, uint32_t total,
			    uint32_t axis, char *buf, size_t len)
{
	uint32_t n, lo = 0, hi = 0;
	char r[48];

	buf[0] = 0;
	n = same_shard(total, d->info.local_tp, d->info.local_rank, &lo, &hi);
	if (n > 1)
		snprintf(buf, len, ", replicated on %s%s",
			 ranks_text("consumer", n, lo, hi, r, sizeof(r)),
			 axis == KVP_AXIS_HEAD &&
					 d->pg[g].kind != KVP_GROUP_STATE ?
				 " (GQA)" :
				 "");
}

/* One band: the group header and a row per source serving it. */
static int band(FILE *f, const struct panel *pn, uint32_t g, int y,
		uint32_t req)
{
	const struct dump *d = pn->d;
	const struct kvp_plan_group *pg = &d->pg[g];
	const char *kind = TOOL_NAME(tool_group_names, pg->kind);
	const char *fill = pg->kind < KVP_GROUP_KIND_COUNT ?
				   band_fill[pg->kind] :
				   "#eeeeee";
	const char *col = pg->kind < KVP_GROUP_KIND_COUNT ? line_col[pg->kind] :
							     "#444444";
	struct kvp_field_desc lf;
	uint32_t s, lstart = 0, llen = 0, total = 0, axis = 0;
	uint64_t wrs = 0;
	char hdr[160], r1[32], r2[32], lt[48], hb[32], rep[96], who[48];
	uint32_t me = d->info.local_rank;
	int have_shard, h = band_height(d, g), row;

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
		replicated_text(d, g, total, axis, rep, sizeof(rep));
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
		wrs += pn->a[g * d->info.nsrc + s].wrs;
	if (have_shard)
		text(f, 24, y + 34, "font-size=\"12\" fill=\"#333\"", "start",
		     "consumer holds %s %s of %u (field %s)%s; %" PRIu64
		     " READs for %u blocks",
		     TOOL_NAME(tool_axis_names, axis),
		     range(lstart, lstart + llen, r1, sizeof(r1)), total,
		     TOOL_NAME(tool_field_names, lf.kind), rep, wrs, req);
	else
		text(f, 24, y + 34, "font-size=\"12\" fill=\"#333\"", "start",
		     "fields replicated on every rank; %" PRIu64
		     " READs for %u blocks",
		     wrs, req);
	row = 0;
	for (s = 0; s < d->info.nsrc; s++) {
		const struct arrow *x = &pn->a[g * d->info.nsrc + s];
		const struct share *sh = &pn->sh[g * d->info.nsrc + s];
		int p = d->src_rank[s], ry, ay, mid;
		uint32_t pstart, plen, lo, hi, nheld, hlo = 0, hhi = 0;
		char what[112], held[64] = "";

		if (!serves(d, g, s))
			continue;
		ry = y + HEAD_H + row * ROW_H;
		ay = ry + ROW_H / 2;
		mid = (PROD_X + PROD_W + CONS_X - 70) / 2;
		fprintf(f,
			"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"4\" fill=\"#ffffff\" stroke=\"%s\"/>\n",
			PROD_X, ry + 3, PROD_W, ROW_H - 6, col);
		text(f, PROD_X + PROD_W / 2, ry + ROW_H / 2 + 5,
		     "font-size=\"13\"", "middle", "producer rank %d", p);
		/* Straight along its row into the consumer's box: each
		 * arrowhead has its own place on the box's edge. */
		fprintf(f,
			"<line class=\"read%s\" x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"2\"%s marker-end=\"url(#arrow)\"/>\n",
			sh->n ? " replica" : "", PROD_X + PROD_W, ay,
			CONS_X - 3, ay, col, sh->n ? " " DASH : "");
		what[0] = 0;
		if (have_shard && !kvp_shard_range(total, d->remote_tp,
						   (uint32_t)p, &pstart,
						   &plen)) {
			lo = pstart > lstart ? pstart : lstart;
			hi = pstart + plen < lstart + llen ? pstart + plen :
							     lstart + llen;
			/* A shard several producer ranks hold: say which. */
			nheld = same_shard(total, d->remote_tp, (uint32_t)p,
					   &hlo, &hhi);
			if (nheld > 1)
				snprintf(held, sizeof(held), " (held by %s)",
					 ranks_text("producer", nheld, hlo, hhi,
						    who, sizeof(who)));
			snprintf(what, sizeof(what), "%s %s of %u%s, ",
				 TOOL_NAME(tool_axis_names, axis),
				 range(lo, hi > lo ? hi : lo + 1, r2,
				       sizeof(r2)),
				 total, held);
		}
		text(f, mid, ay - 6, "font-size=\"12\" fill=\"#111\" " HALO,
		     "middle", "%s%s: %" PRIu64 " READs, %s", what,
		     layers_text(x, lt, sizeof(lt)), x->wrs,
		     human(x->bytes, hb, sizeof(hb)));
		/* The ranks reading these bytes, this one among them. */
		if (sh->n)
			text(f, mid, ay + 13,
			     "class=\"replica\" font-size=\"11\" font-style=\"italic\" fill=\"#111\" " HALO,
			     "middle", "replica: %s %s",
			     ranks_text("consumer", sh->n + 1,
					me < sh->lo ? me : sh->lo,
					me > sh->hi ? me : sh->hi, who,
					sizeof(who)),
			     sh->partial ? "share some of these producer bytes" :
					   "read the same producer bytes");
		row++;
	}
	return h;
}

/* One consumer rank: with `all`, a heading; the bands; the consumer's box
 * beside them; the producer ranks not read from. Returns the y below. */
static int panel(FILE *f, const struct panel *pn, int y, uint32_t req,
		 int all)
{
	const struct dump *d = pn->d;
	uint32_t g, s, p, nidle = 0;
	uint64_t wrs = 0, bytes = 0;
	char *read_from, hb[32];
	int top, mid;

	fprintf(f, "<g id=\"rank-%u\">\n", d->info.local_rank);
	if (all) {
		for (s = 0; s < d->info.ngroups * d->info.nsrc; s++) {
			wrs += pn->a[s].wrs;
			bytes += pn->a[s].bytes;
		}
		fprintf(f,
			"<line x1=\"10\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"#999\"/>\n",
			y + 2, SVG_W - 10, y + 2);
		text(f, 20, y + 22, "font-size=\"15\" font-weight=\"bold\"",
		     "start",
		     "consumer rank %u of TP %u: %u producer rank%s read from, %" PRIu64
		     " READs, %s",
		     d->info.local_rank, d->info.local_tp, d->info.nsrc,
		     PLURAL(d->info.nsrc), wrs, human(bytes, hb, sizeof(hb)));
		y += PANEL_H;
	}
	top = y;
	for (g = 0; g < d->info.ngroups; g++)
		y += band(f, pn, g, y, req) + 10;
	/* Drawn after the bands so that it sits on top; it spans them. */
	mid = (top + y - 10) / 2;
	fprintf(f,
		"<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" rx=\"6\" fill=\"#ffffff\" stroke=\"#222\" stroke-width=\"2\"/>\n",
		CONS_X, top, CONS_W, y - 10 - top);
	text(f, CONS_X + CONS_W / 2, mid - 4,
	     "font-size=\"15\" font-weight=\"bold\"", "middle",
	     "consumer rank %u", d->info.local_rank);
	text(f, CONS_X + CONS_W / 2, mid + 14, "font-size=\"12\"", "middle",
	     "of TP %u", d->info.local_tp);
	read_from = xcalloc(d->remote_tp, 1);
	for (s = 0; s < d->info.nsrc; s++)
		if ((uint32_t)d->src_rank[s] < d->remote_tp)
			read_from[d->src_rank[s]] = 1;
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
	free(read_from);
	fputs("</g>\n", f);
	return y + IDLE_H;
}

/* What the arrows mean. */
static void legend(FILE *f, int y)
{
	fprintf(f,
		"<g id=\"legend\">\n"
		"<line x1=\"20\" y1=\"%d\" x2=\"70\" y2=\"%d\" stroke=\"#444\" stroke-width=\"2\" marker-end=\"url(#arrow)\"/>\n",
		y + 14, y + 14);
	text(f, 80, y + 18, "font-size=\"12\" fill=\"#333\"", "start",
	     "READs from one producer rank: its heads (or channels), layers, and the request's READs and bytes");
	fprintf(f,
		"<line x1=\"20\" y1=\"%d\" x2=\"70\" y2=\"%d\" stroke=\"#444\" stroke-width=\"2\" " DASH
		" marker-end=\"url(#arrow)\"/>\n",
		y + 38, y + 38);
	text(f, 80, y + 42, "font-size=\"12\" fill=\"#333\"", "start",
	     "replica: several consumer ranks read the same producer bytes, or some of them (GQA: consumer TP above the KV heads; MLA)");
	fputs("</g>\n", f);
}

void write_svg(const struct dump *d)
{
	struct opts *o = d->o;
	uint32_t req = o->have_svg_request ? o->svg_request :
		       o->have_request	   ? o->request :
					     DEFAULT_SVG_REQUEST;
	uint32_t i, n = 1;
	const struct dump **pd;
	struct dump *other;
	struct panel *pn;
	struct share **sh;
	char title[768];
	int y, h = TOP + LEGEND_H, all = o->svg_all_ranks;
	FILE *f;

	if (!req)
		usage_error("--svg-request 0: a request needs at least 1 block");
	if (all && d->info.local_tp > SVG_MAX_RANKS)
		usage_error("--svg-all-ranks: consumer TP %u is above %u, the most ranks one picture draws; draw one rank with --rank R",
			    d->info.local_tp, SVG_MAX_RANKS);
	if (all)
		n = d->info.local_tp;
	pd = xcalloc(n, sizeof(*pd));
	other = xcalloc(n, sizeof(*other));
	pn = xcalloc(n, sizeof(*pn));
	sh = xcalloc(n, sizeof(*sh));
	for (i = 0; i < n; i++) {
		if (!all || i == d->info.local_rank)
			pd[i] = d;
		else {
			plan_at_rank(o, i, &other[i]);
			pd[i] = &other[i];
		}
	}
	find_replicas(o, pd, n, sh);
	for (i = 0; i < n; i++) {
		pn[i].d = pd[i];
		pn[i].sh = sh[i];
		pn[i].a = xcalloc((size_t)pd[i]->info.ngroups *
					  (pd[i]->info.nsrc ? pd[i]->info.nsrc :
							      1),
				  sizeof(*pn[i].a));
		count_request(pd[i], req, pn[i].a);
		count_layers(pd[i], pn[i].a);
		h += panel_height(pd[i], all);
	}

	f = fopen(o->svg, "w");
	if (!f)
		die("--svg %s: %s", o->svg, strerror(errno));
	fprintf(f,
		"<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
		"<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n",
		SVG_W, h, SVG_W, h);
	/* The document's title says whether these are an agent's defaults;
	 * the heading, what the plan was made with. */
	plan_title(d, TITLE_TAIL | (all ? TITLE_ALL_RANKS : 0), title,
		   sizeof(title));
	fputs("<title>", f);
	xml_text(f, title);
	fputs("</title>\n", f);
	fprintf(f,
		"<defs><marker id=\"arrow\" viewBox=\"0 0 10 10\" refX=\"9\" refY=\"5\" markerUnits=\"userSpaceOnUse\" markerWidth=\"%d\" markerHeight=\"%d\" orient=\"auto-start-reverse\"><path d=\"M0,0 L10,5 L0,10 z\" fill=\"#333\"/></marker></defs>\n"
		"<rect width=\"100%%\" height=\"100%%\" fill=\"#ffffff\"/>\n",
		ARROW_PX, ARROW_PX);
	plan_title(d, all ? TITLE_ALL_RANKS : 0, title, sizeof(title));
	text(f, 20, 26, "font-size=\"16\" font-weight=\"bold\"", "start",
	     "%s", title);
	if (all)
		text(f, 20, 48, "font-size=\"13\" fill=\"#444\"", "start",
		     "READs and bytes per request of %u remote blocks per group (ids 0-%u); %u consumer rank%s, a panel each",
		     req, req - 1, n, PLURAL(n));
	else
		text(f, 20, 48, "font-size=\"13\" fill=\"#444\"", "start",
		     "READs and bytes per request of %u remote blocks per group (ids 0-%u); %u producer rank%s read from",
		     req, req - 1, d->info.nsrc, PLURAL(d->info.nsrc));
	y = TOP;
	for (i = 0; i < n; i++)
		y = panel(f, &pn[i], y, req, all);
	legend(f, y);
	fputs("</svg>\n", f);
	if (fclose(f))
		die("--svg %s: write error", o->svg);
	for (i = 0; i < n; i++) {
		free(pn[i].a);
		free(sh[i]);
		if (pd[i] == &other[i])
			free_dump(&other[i]);
	}
	free(pd);
	free(other);
	free(pn);
	free(sh);
}
