// SPDX-License-Identifier: MIT
/*
 * Seed corpora for the fuzz targets, from the model presets. Public API
 * only; built by `make fuzz` with the library (no fuzzer runtime).
 *
 *   build/fuzz/seeds DIR
 *
 * writes DIR/meta (metadata blobs: fuzz_meta), DIR/spec (spec texts in both
 * forms: fuzz_spec) and DIR/plan (consumer and producer blobs with a request:
 * fuzz_plan, input format at the top of tests/fuzz/fuzz_plan.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvpull.h"

static const char *const kinds[] = { "k",	"v",	  "latent", "conv_x",
				     "conv_b", "conv_c", "ssm",	    "conv_q",
				     "conv_k", "conv_v" };
static const char *const axes[] = { "token",   "head",	"dim",
				    "channel", "state", "aux" };
static const char *const groups[] = { "full", "sliding", "mla", "state" };
static const char *const kv[] = { "flash_nhd", "flash_hnd", "flashinfer",
				  "packed" };

static const char *dir;
static unsigned nseeds;

static void die(const char *what)
{
	fprintf(stderr, "seeds: %s\n", what);
	exit(1);
}

static void put(const char *sub, const char *name, const void *p, size_t n)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s/%s", dir, sub, name);
	f = fopen(path, "wb");
	if (!f || fwrite(p, 1, n, f) != n || fclose(f))
		die(path);
	nseeds++;
}

static kvp_layout *build(const char *model, uint32_t layers, uint32_t tp,
			 uint32_t rank, uint32_t block, uint32_t layout)
{
	struct kvp_engine_desc e = { 0 };
	struct kvp_model m;
	kvp_layout *l;

	if (kvp_model_preset(model, &m))
		die(model);
	/* few layers: small seeds the fuzzer mutates quickly */
	if (m.layers > layers)
		m.layers = layers;
	if (m.state_layers > layers)
		m.state_layers = layers;
	if (m.sliding_layers > m.layers)
		m.sliding_layers = m.layers / 2;
	e.engine_id = 7;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = block;
	e.num_blocks = 16;
	e.kv_layout = layout;
	return kvp_layout_build(&m, &e, &l) ? NULL : l;
}

static uint8_t *blob(const kvp_layout *l, size_t *len)
{
	uint8_t *b;

	if (kvp_meta_encode(l, NULL, 0, len) != -EMSGSIZE)
		die("encode size");
	b = malloc(*len);
	if (!b || kvp_meta_encode(l, b, *len, len))
		die("encode");
	return b;
}

/* Every region registered as MRs of the smallest stride, keys 1, 2, ... */
static void keyed(kvp_layout *l)
{
	struct kvp_layout_info li;
	uint64_t size, n, k;
	uint32_t i, *keys;

	kvp_layout_get_info(l, &li);
	for (i = 0; i < li.nregions; i++) {
		if (kvp_layout_get_region(l, i, &size))
			die("region");
		n = (size + (1ull << KVP_MR_SHIFT_MIN) - 1) >> KVP_MR_SHIFT_MIN;
		keys = malloc(n * sizeof(*keys));
		if (!keys)
			die("memory");
		for (k = 0; k < n; k++)
			keys[k] = (uint32_t)(k + 1);
		if (kvp_layout_set_region_keys(l, i, 0x10000ull << i,
					       KVP_MR_SHIFT_MIN, keys,
					       (uint32_t)n))
			die("keys");
		free(keys);
	}
}

/* Growing text buffer. */
struct text {
	char *p;
	size_t n, cap;
};

static void say(struct text *t, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));

static void say(struct text *t, const char *fmt, ...)
{
	va_list ap;
	int k;

	for (;;) {
		va_start(ap, fmt);
		k = vsnprintf(t->p + t->n, t->cap - t->n, fmt, ap);
		va_end(ap);
		if (k < 0)
			die("format");
		if ((size_t)k < t->cap - t->n)
			break;
		t->cap = t->cap * 2 + (size_t)k + 64;
		t->p = realloc(t->p, t->cap);
		if (!t->p)
			die("memory");
	}
	t->n += (size_t)k;
}

/* The explicit spec form of a layout (see plan/spec.c). The first byte is
 * fuzz_spec's message length. */
static void explicit_spec(const kvp_layout *l, struct text *t)
{
	struct kvp_layout_info li;
	struct kvp_group_desc g;
	struct kvp_view_desc v;
	struct kvp_field_desc f;
	uint64_t size;
	uint32_t i, d, view;

	kvp_layout_get_info(l, &li);
	say(t, "%cengine tp_size=%u tp_rank=%u engine_id=%llu\n", 200,
	    li.tp_size, li.tp_rank, (unsigned long long)li.engine_id);
	for (i = 0; i < li.ngroups; i++) {
		if (kvp_layout_get_group(l, i, &g))
			die("group");
		say(t, "group kind=%s block_tokens=%u\n", groups[g.kind],
		    g.block_tokens);
	}
	for (i = 0; i < li.nregions; i++) {
		if (kvp_layout_get_region(l, i, &size))
			die("region");
		say(t, "region size=%llu\n", (unsigned long long)size);
	}
	for (i = 0; i < li.nviews; i++) {
		if (kvp_layout_get_view(l, i, &v))
			die("view");
		say(t, "view group=%u region=%u layer=%u num_blocks=%u offset=%llu stride=%llu\n",
		    v.group, v.region, v.layer, v.num_blocks,
		    (unsigned long long)v.offset, (unsigned long long)v.stride);
	}
	for (i = 0; i < li.nfields; i++) {
		if (kvp_layout_get_field(l, i, &view, &f))
			die("field");
		say(t, "field view=%u kind=%s elem=%u offset=%llu", view,
		    kinds[f.kind], f.elem_size, (unsigned long long)f.offset);
		if (f.shard_dim != KVP_NO_SHARD)
			say(t, " shard=%u total=%u", f.shard_dim,
			    f.shard_total);
		for (d = 0; d < f.ndim; d++)
			say(t, "%s%s:%u:%llu", d ? "," : " dims=",
			    axes[f.dim[d].axis], f.dim[d].size,
			    (unsigned long long)f.dim[d].stride);
		say(t, "\n");
	}
}

static void spec_seeds(const char *model, uint32_t tp, uint32_t layout,
		       unsigned k)
{
	struct text t = { 0 };
	kvp_layout *l = build(model, 2, tp, tp - 1, 16, layout);
	char name[64];

	if (!l)
		return;
	say(&t, "%c# model form\nmodel = %s\nlayers = 2\ntp_size = %u\ntp_rank = %u\nblock_tokens = 16\nnum_blocks = 16\nkv_layout = %s\n",
	    (int)(k % 2 ? 1 : 128), model, tp, tp - 1, kv[layout]);
	snprintf(name, sizeof(name), "model-%u", k);
	put("spec", name, t.p, t.n);
	t.n = 0;
	explicit_spec(l, &t);
	snprintf(name, sizeof(name), "explicit-%u", k);
	put("spec", name, t.p, t.n);
	free(t.p);
	kvp_layout_destroy(l);
}

/* A consumer (TP D, rank D - 1) and producer (TP P) pair with a request of
 * n blocks per group. */
static void plan_seed(const char *model, uint32_t P, uint32_t D,
		      uint32_t cb, uint32_t pb, uint32_t play, uint32_t clay,
		      unsigned k)
{
	kvp_layout *c = build(model, 2, D, D - 1, cb, clay);
	kvp_layout *p = build(model, 2, P, 0, pb, play);
	struct kvp_layout_info li;
	uint8_t *bc, *bp, *in, *q;
	size_t nc, np, n;
	uint32_t g, i;
	char name[64];

	if (!c || !p) {
		kvp_layout_destroy(c);
		kvp_layout_destroy(p);
		return;
	}
	kvp_layout_get_info(c, &li);
	bc = blob(c, &nc);
	bp = blob(p, &np);
	n = 16 + nc + np + li.ngroups * (3 + 2 * 2 * 4);
	in = calloc(1, n);
	if (!in)
		die("memory");
	in[0] = (uint8_t)nc;
	in[1] = (uint8_t)(nc >> 8);
	in[2] = (uint8_t)(nc >> 16);
	in[4] = (uint8_t)np;
	in[5] = (uint8_t)(np >> 8);
	in[6] = (uint8_t)(np >> 16);
	in[8] = (uint8_t)(1 + k % 16); /* max_sge */
	in[11] = (uint8_t)k;
	memcpy(in + 16, bc, nc);
	memcpy(in + 16 + nc, bp, np);
	q = in + 16 + nc + np;
	for (g = 0; g < li.ngroups; g++) {
		/* 4 ids each side (3 + a prefix hit on odd seeds), full blocks */
		*q++ = (uint8_t)(k & 1 ? 3 : 4);
		*q++ = 4;
		*q++ = 0;
		for (i = 0; i < 8; i++) {
			*q++ = (uint8_t)((i * 5 + k) % 16);
			*q++ = 0;
		}
	}
	snprintf(name, sizeof(name), "pair-%u", k);
	put("plan", name, in, n);
	free(in);
	free(bc);
	free(bp);
	kvp_layout_destroy(c);
	kvp_layout_destroy(p);
}

int main(int argc, char **argv)
{
	static const uint32_t tp[][2] = { { 1, 1 }, { 2, 1 }, { 1, 2 },
					  { 4, 2 }, { 2, 4 }, { 8, 16 } };
	static const uint32_t bs[][2] = { { 16, 16 }, { 16, 32 }, { 16, 24 } };
	const char *name;
	unsigned k = 0, m, i;

	if (argc != 2) {
		fprintf(stderr, "usage: seeds DIR\n");
		return 2;
	}
	dir = argv[1];
	mkdir(dir, 0755);
	for (i = 0; i < 3; i++) {
		char path[1024];

		snprintf(path, sizeof(path), "%s/%s", dir,
			 (const char *[]){ "meta", "spec", "plan" }[i]);
		mkdir(path, 0755);
	}
	for (m = 0; (name = kvp_model_preset_name(m)) != NULL; m++) {
		for (i = 0; i < 6; i++, k++) {
			kvp_layout *l = build(name, 2, tp[i][0], 0, 16, i % 4);
			char file[64];
			uint8_t *b;
			size_t n;

			spec_seeds(name, tp[i][1], (i + 1) % 4, k);
			plan_seed(name, tp[i][0], tp[i][1], bs[i % 3][0],
				  bs[i % 3][1], i % 4, (i + 2) % 4, k);
			if (!l)
				continue;
			b = blob(l, &n);
			snprintf(file, sizeof(file), "blob-%u", k);
			put("meta", file, b, n);
			free(b);
			if (!i) { /* version 2: regions with several keys */
				keyed(l);
				b = blob(l, &n);
				snprintf(file, sizeof(file), "blob-keys-%u", k);
				put("meta", file, b, n);
				free(b);
			}
			kvp_layout_destroy(l);
		}
	}
	printf("seeds: %u files in %s/{meta,spec,plan}\n", nseeds, dir);
	return 0;
}
