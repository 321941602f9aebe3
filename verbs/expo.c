// SPDX-License-Identifier: MIT
/*
 * The metrics exposition writer (expo.h): Prometheus text and JSON into a
 * caller's buffer, snprintf()-style. Pure: no verbs call, no allocation,
 * no stdio (numbers are formatted here, exactly: seconds from integer
 * nanoseconds, never through a double).
 */
#include <string.h>

#include "expo.h"

static const char *const type_name[KVP_MT_COUNT] = { "counter", "gauge",
						      "histogram" };
static const char *const section_key[KVP_MT_COUNT] = { "counters", "gauges",
							"histograms" };

/* Appends n bytes: what fits before the last byte of the buffer (kept for
 * the NUL); the length grows by n whatever fits. */
static void put(struct kvp_expo *w, const char *s, size_t n)
{
	if (w->len < w->cap) {
		size_t room = w->cap - 1 - w->len;

		memcpy(w->buf + w->len, s, n < room ? n : room);
	}
	w->len += n;
}

static void puts_(struct kvp_expo *w, const char *s)
{
	put(w, s, strlen(s));
}

static void putc_(struct kvp_expo *w, char c)
{
	put(w, &c, 1);
}

size_t kvp__fmt_u64(char *out, uint64_t v)
{
	char t[20];
	size_t n = 0, i;

	do {
		t[n++] = (char)('0' + v % 10);
		v /= 10;
	} while (v);
	for (i = 0; i < n; i++)
		out[i] = t[n - 1 - i];
	return n;
}

size_t kvp__fmt_seconds(char *out, uint64_t ns)
{
	uint64_t frac = ns % 1000000000ull;
	size_t n = kvp__fmt_u64(out, ns / 1000000000ull);
	int d = 9;

	if (!frac)
		return n;
	while (frac % 10 == 0) {
		frac /= 10;
		d--;
	}
	out[n++] = '.';
	/* d digits, leading zeros included */
	for (int i = d - 1; i >= 0; i--) {
		out[n + (size_t)i] = (char)('0' + frac % 10);
		frac /= 10;
	}
	return n + (size_t)d;
}

static void put_u64(struct kvp_expo *w, uint64_t v)
{
	char t[20];

	put(w, t, kvp__fmt_u64(t, v));
}

static void put_seconds(struct kvp_expo *w, uint64_t ns)
{
	char t[KVP_SECONDS_LEN];

	put(w, t, kvp__fmt_seconds(t, ns));
}

/* A label value or HELP text, escaped: the text format escapes \ and
 * newline (and " in label values); JSON strings escape ", \ and control
 * characters. */
static void put_esc(struct kvp_expo *w, const char *s, int quote)
{
	static const char hex[] = "0123456789abcdef";

	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '\\' || (c == '"' && (quote || w->json))) {
			putc_(w, '\\');
			putc_(w, (char)c);
		} else if (c == '\n') {
			puts_(w, "\\n");
		} else if (w->json && c < 0x20) {
			char u[6] = { '\\', 'u', '0', '0', hex[c >> 4],
				      hex[c & 15] };

			put(w, u, sizeof(u));
		} else {
			putc_(w, (char)c);
		}
	}
}

void kvp__expo_init(struct kvp_expo *w, char *buf, size_t cap, int json)
{
	memset(w, 0, sizeof(*w));
	w->buf = buf;
	w->cap = buf ? cap : 0;
	w->json = json;
	if (json)
		putc_(w, '{');
}

/* JSON: the open family's list and the sections up to type t's. */
static void json_to(struct kvp_expo *w, uint32_t t)
{
	if (w->name)
		putc_(w, ']');
	w->name = NULL;
	while (w->section < t + 1) {
		if (w->section)
			puts_(w, "},");
		putc_(w, '"');
		puts_(w, section_key[w->section]);
		puts_(w, "\":{");
		w->section++;
		w->nfam = 0;
	}
}

void kvp__expo_family(struct kvp_expo *w, const char *name, uint32_t t,
		      const char *help)
{
	if (w->json) {
		json_to(w, t);
		if (w->nfam++)
			putc_(w, ',');
		putc_(w, '"');
		puts_(w, name);
		puts_(w, "\":[");
	} else {
		puts_(w, "# HELP ");
		puts_(w, name);
		putc_(w, ' ');
		put_esc(w, help, 0);
		puts_(w, "\n# TYPE ");
		puts_(w, name);
		putc_(w, ' ');
		puts_(w, type_name[t]);
		putc_(w, '\n');
	}
	w->name = name;
	w->nsample = 0;
}

/* Text: `{a="x",b="y"` and, with le, `,le="..."`, then `}` (nothing at
 * all without labels). JSON: `"labels":{"a":"x",...}`. */
static void put_labels(struct kvp_expo *w, const struct kvp_label *l,
		       uint32_t nl, const char *le)
{
	uint32_t i;

	if (w->json) {
		puts_(w, "\"labels\":{");
		for (i = 0; i < nl; i++) {
			if (i)
				putc_(w, ',');
			putc_(w, '"');
			puts_(w, l[i].name);
			puts_(w, "\":\"");
			put_esc(w, l[i].value, 1);
			putc_(w, '"');
		}
		putc_(w, '}');
		return;
	}
	if (!nl && !le)
		return;
	putc_(w, '{');
	for (i = 0; i < nl; i++) {
		if (i)
			putc_(w, ',');
		puts_(w, l[i].name);
		puts_(w, "=\"");
		put_esc(w, l[i].value, 1);
		putc_(w, '"');
	}
	if (le) {
		puts_(w, nl ? ",le=\"" : "le=\"");
		puts_(w, le);
		putc_(w, '"');
	}
	putc_(w, '}');
}

/* JSON: a sample's opening, after the family's previous one. */
static void json_sample(struct kvp_expo *w, const struct kvp_label *l,
			uint32_t nl)
{
	if (w->nsample++)
		putc_(w, ',');
	putc_(w, '{');
	put_labels(w, l, nl, NULL);
}

void kvp__expo_value(struct kvp_expo *w, const struct kvp_label *l,
		     uint32_t nl, uint64_t v)
{
	if (w->json) {
		json_sample(w, l, nl);
		puts_(w, ",\"value\":");
		put_u64(w, v);
		putc_(w, '}');
		return;
	}
	puts_(w, w->name);
	put_labels(w, l, nl, NULL);
	putc_(w, ' ');
	put_u64(w, v);
	putc_(w, '\n');
}

/* Text: one line of the histogram, name + suffix, labels, le, value. */
static void hist_line(struct kvp_expo *w, const char *suffix,
		      const struct kvp_label *l, uint32_t nl, const char *le)
{
	puts_(w, w->name);
	puts_(w, suffix);
	put_labels(w, l, nl, le);
	putc_(w, ' ');
}

void kvp__expo_hist(struct kvp_expo *w, const struct kvp_label *l,
		    uint32_t nl, const struct kvp_hist *h)
{
	char le[KVP_SECONDS_LEN + 1];
	uint64_t cum = 0;
	uint32_t i;

	if (w->json) {
		json_sample(w, l, nl);
		puts_(w, ",\"count\":");
		put_u64(w, kvp__hist_count(h));
		puts_(w, ",\"sum\":");
		put_seconds(w, h->sum_ns);
		puts_(w, ",\"buckets\":[");
		for (i = 0; i < KVP_HIST_FINITE; i++) {
			cum += h->n[i];
			puts_(w, i ? ",[" : "[");
			put_seconds(w, kvp__hist_bound_ns(i));
			putc_(w, ',');
			put_u64(w, cum);
			putc_(w, ']');
		}
		puts_(w, "]}");
		return;
	}
	for (i = 0; i < KVP_HIST_FINITE; i++) {
		cum += h->n[i];
		le[kvp__fmt_seconds(le, kvp__hist_bound_ns(i))] = 0;
		hist_line(w, "_bucket", l, nl, le);
		put_u64(w, cum);
		putc_(w, '\n');
	}
	cum += h->n[KVP_HIST_FINITE];
	hist_line(w, "_bucket", l, nl, "+Inf");
	put_u64(w, cum);
	putc_(w, '\n');
	hist_line(w, "_sum", l, nl, NULL);
	put_seconds(w, h->sum_ns);
	putc_(w, '\n');
	hist_line(w, "_count", l, nl, NULL);
	put_u64(w, cum);
	putc_(w, '\n');
}

size_t kvp__expo_end(struct kvp_expo *w)
{
	if (w->json) {
		json_to(w, KVP_MT_COUNT - 1);
		puts_(w, "}}");
	}
	if (w->cap)
		w->buf[w->len < w->cap ? w->len : w->cap - 1] = 0;
	return w->len;
}
