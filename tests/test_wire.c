// SPDX-License-Identifier: MIT
/*
 * Metadata blob: round trips, size queries and every rejection path, with
 * exact error codes and untouched outputs. Public API only; record offsets
 * follow the format documented at the top of plan/wire.c.
 *
 * With KVP_WIRE_SEED_DIR set, also writes the valid blobs it builds into
 * that directory (seed corpus for tests/fuzz/fuzz_meta.c).
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "kvassert.h"
#include "kvpull.h"

#define HDR_LEN 56u
#define GROUP_LEN 8u
#define REGION_LEN 24u
#define VIEW_LEN 32u
#define FIELD_LEN 128u

/* A pointer no decode may write over *out on failure. */
#define SENTINEL ((kvp_layout *)(uintptr_t)0x5a5a5a5a)

struct blob {
	uint8_t *p;
	size_t len;
	uint32_t ngroups, nregions, nviews, nfields;
};

static uint32_t rd32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static void wr32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static uint64_t rd64(const uint8_t *p)
{
	return rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

static void wr64(uint8_t *p, uint64_t v)
{
	wr32(p, (uint32_t)v);
	wr32(p + 4, (uint32_t)(v >> 32));
}

static size_t off_region(const struct blob *b, uint32_t i)
{
	return HDR_LEN + b->ngroups * GROUP_LEN + i * REGION_LEN;
}

static size_t off_view(const struct blob *b, uint32_t i)
{
	return off_region(b, b->nregions) + i * VIEW_LEN;
}

static size_t off_field(const struct blob *b, uint32_t i)
{
	return off_view(b, b->nviews) + i * FIELD_LEN;
}

static void seed_write(const char *name, const struct blob *b)
{
	const char *dir = getenv("KVP_WIRE_SEED_DIR");
	char path[512];
	FILE *f;

	if (!dir)
		return;
	snprintf(path, sizeof(path), "%s/%s", dir, name);
	f = fopen(path, "wb");
	assert_non_null(f);
	assert_int_equal(fwrite(b->p, 1, b->len, f), b->len);
	assert_int_equal(fclose(f), 0);
}

static void encode(const kvp_layout *l, struct blob *b)
{
	struct kvp_layout_info info;
	size_t len = 0, len2 = 0;

	kvp_layout_get_info(l, &info);
	assert_int_equal(kvp_meta_encode(l, NULL, 0, &len), -EMSGSIZE);
	assert_int_equal(len, HDR_LEN + info.ngroups * GROUP_LEN +
				      info.nregions * REGION_LEN +
				      info.nviews * VIEW_LEN +
				      info.nfields * FIELD_LEN);
	b->p = malloc(len);
	assert_non_null(b->p);
	assert_int_equal(kvp_meta_encode(l, b->p, len, &len2), 0);
	assert_int_equal(len2, len);
	b->len = len;
	b->ngroups = info.ngroups;
	b->nregions = info.nregions;
	b->nviews = info.nviews;
	b->nfields = info.nfields;
}

/* Plans compiled against `orig` and against its decoded copy `dec` must
 * match, with `peer` on the other side of each. */
static void assert_same_plans(const kvp_layout *orig, const kvp_layout *dec,
			      const kvp_layout *peer)
{
	struct kvp_plan_attr attr = { .max_sge = 4 };
	kvp_plan *pa, *pb;

	assert_int_equal(kvp_plan_compile(peer, orig, &attr, &pa, NULL, 0), 0);
	assert_int_equal(kvp_plan_compile(peer, dec, &attr, &pb, NULL, 0), 0);
	kva_plans_equal(pa, pb);
	kvp_plan_destroy(pa);
	kvp_plan_destroy(pb);
	assert_int_equal(kvp_plan_compile(orig, peer, &attr, &pa, NULL, 0), 0);
	assert_int_equal(kvp_plan_compile(dec, peer, &attr, &pb, NULL, 0), 0);
	kva_plans_equal(pa, pb);
	kvp_plan_destroy(pa);
	kvp_plan_destroy(pb);
}

static kvp_layout *build_conv(const char *preset, uint64_t engine,
			      uint32_t tp, uint32_t rank, uint32_t block,
			      uint32_t kernel, uint32_t layout, uint32_t conv)
{
	struct kvp_engine_desc e = { 0 };
	struct kvp_model m;
	kvp_layout *l = NULL;

	assert_int_equal(kvp_model_preset(preset, &m), 0);
	e.engine_id = engine;
	e.tp_size = tp;
	e.tp_rank = rank;
	e.block_tokens = block;
	e.kernel_block_tokens = kernel;
	e.num_blocks = 40;
	e.kv_layout = layout;
	e.conv_layout = conv;
	assert_int_equal(kvp_layout_build(&m, &e, &l), 0);
	return l;
}

static kvp_layout *build(const char *preset, uint64_t engine, uint32_t tp,
			 uint32_t rank, uint32_t block, uint32_t kernel,
			 uint32_t layout)
{
	return build_conv(preset, engine, tp, rank, block, kernel, layout,
			  KVP_CONV_DS);
}

/* Distinct, recognisable keys, as a transport would set after registering
 * each region. */
static void set_keys(kvp_layout *l)
{
	struct kvp_layout_info info;
	uint32_t i;

	kvp_layout_get_info(l, &info);
	for (i = 0; i < info.nregions; i++)
		assert_int_equal(kvp_layout_set_region_key(l, i,
				0x7f0000000000ull + (uint64_t)i * 0x10000000,
				0xab000000u + i),
				 0);
}

static void dim(struct kvp_field_desc *f, uint32_t axis, uint32_t size,
		uint64_t stride)
{
	f->dim[f->ndim].axis = axis;
	f->dim[f->ndim].size = size;
	f->dim[f->ndim].stride = stride;
	f->ndim++;
}

static void field(kvp_layout *l, uint32_t view, uint32_t kind, uint32_t elem,
		  uint64_t offset, uint32_t shard_dim, uint32_t shard_total,
		  void (*dims)(struct kvp_field_desc *))
{
	struct kvp_field_desc f;

	memset(&f, 0, sizeof(f));
	f.kind = kind;
	f.elem_size = elem;
	f.offset = offset;
	f.shard_dim = shard_dim;
	f.shard_total = shard_total;
	dims(&f);
	assert_int_equal(kvp_layout_add_field(l, view, &f), 0);
}

static void dims_k(struct kvp_field_desc *f)
{
	dim(f, KVP_AXIS_HEAD, 4, 2048);
	dim(f, KVP_AXIS_TOKEN, 16, 128);
	dim(f, KVP_AXIS_DIM, 64, 2);
}

static void dims_conv(struct kvp_field_desc *f)
{
	dim(f, KVP_AXIS_CHANNEL, 128, 8);
	dim(f, KVP_AXIS_STATE, 4, 2);
}

static void dims_ssm(struct kvp_field_desc *f)
{
	dim(f, KVP_AXIS_HEAD, 4, 8192);
	dim(f, KVP_AXIS_DIM, 64, 64);
	dim(f, KVP_AXIS_STATE, 16, 4);
}

static void dims_swa(struct kvp_field_desc *f)
{
	dim(f, KVP_AXIS_TOKEN, 2, 4096);
	dim(f, KVP_AXIS_TOKEN, 16, 256);
	dim(f, KVP_AXIS_DIM, 64, 2);
}

/* A hybrid rank no preset builds: full attention, a Mamba-style state group
 * sharing the attention layer's region, and a sliding window group with two
 * kernel pages per block and an unsharded field. */
static kvp_layout *build_hybrid(void)
{
	struct kvp_layout_attr attr = { .engine_id = 0x1122334455667788ull,
					.tp_size = 2,
					.tp_rank = 1 };
	struct kvp_group_desc g = { 0 };
	struct kvp_view_desc v = { 0 };
	uint32_t r0, r1, g0, g1, g2, v0, v1, v2;
	kvp_layout *l;

	assert_int_equal(kvp_layout_create(&attr, &l), 0);
	g.kind = KVP_GROUP_FULL;
	g.block_tokens = 16;
	assert_int_equal(kvp_layout_add_group(l, &g, &g0), 0);
	g.kind = KVP_GROUP_STATE;
	g.block_tokens = 0;
	assert_int_equal(kvp_layout_add_group(l, &g, &g1), 0);
	g.kind = KVP_GROUP_SLIDING;
	g.block_tokens = 32;
	assert_int_equal(kvp_layout_add_group(l, &g, &g2), 0);
	assert_int_equal(kvp_layout_add_region(l, 1 << 20, &r0), 0);
	assert_int_equal(kvp_layout_add_region(l, 32768, &r1), 0);

	v.group = g0;
	v.region = r0;
	v.layer = 0;
	v.num_blocks = 8;
	v.stride = 8192;
	assert_int_equal(kvp_layout_add_view(l, &v, &v0), 0);
	v.group = g1;
	v.layer = 1;
	v.num_blocks = 4;
	v.offset = 65536;
	v.stride = 65536;
	assert_int_equal(kvp_layout_add_view(l, &v, &v1), 0);
	v.group = g2;
	v.region = r1;
	v.offset = 0;
	v.stride = 8192;
	assert_int_equal(kvp_layout_add_view(l, &v, &v2), 0);

	field(l, v0, KVP_FIELD_K, 2, 0, 0, 8, dims_k);
	field(l, v1, KVP_FIELD_CONV_X, 2, 0, 0, 256, dims_conv);
	field(l, v1, KVP_FIELD_SSM, 4, 1024, 0, 8, dims_ssm);
	field(l, v2, KVP_FIELD_K, 2, 0, KVP_NO_SHARD, 0, dims_swa);
	field(l, v2, KVP_FIELD_V, 2, 128, KVP_NO_SHARD, 0, dims_swa);
	set_keys(l);
	return l;
}

/* Decodes b, checks the result equals `l` and re-encodes to the same bytes. */
static kvp_layout *round_trip(const kvp_layout *l, const struct blob *b)
{
	struct blob again;
	kvp_layout *dec = NULL;

	assert_int_equal(kvp_meta_decode(b->p, b->len, &dec), 0);
	assert_non_null(dec);
	kva_layouts_equal(l, dec, 1);
	encode(dec, &again);
	assert_int_equal(again.len, b->len);
	assert_memory_equal(again.p, b->p, b->len);
	free(again.p);
	return dec;
}

static void test_round_trip_llama(void **state)
{
	kvp_layout *l, *dec, *peer;
	struct blob b;

	(void)state;
	l = build("llama-3.1-8b", 42, 2, 1, 64, 16, KVP_KV_FLASH_HND);
	set_keys(l);
	encode(l, &b);
	seed_write("llama-tp2r1-hnd", &b);
	dec = round_trip(l, &b);
	peer = build("llama-3.1-8b", 7, 4, 2, 16, 0, KVP_KV_FLASH_NHD);
	assert_same_plans(l, dec, peer);
	kvp_layout_destroy(peer);
	kvp_layout_destroy(dec);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_round_trip_deepseek(void **state)
{
	kvp_layout *l, *dec, *peer;
	struct blob b;

	(void)state;
	l = build("deepseek-v3", 9, 4, 3, 64, 0, 0);
	set_keys(l);
	encode(l, &b);
	seed_write("deepseek-v3-tp4r3", &b);
	dec = round_trip(l, &b);
	peer = build("deepseek-v3", 10, 8, 5, 32, 0, 0);
	assert_same_plans(l, dec, peer);
	kvp_layout_destroy(peer);
	kvp_layout_destroy(dec);
	kvp_layout_destroy(l);
	free(b.p);
}

/* Pooled hybrid presets: state and attention views sharing regions. */
static void test_round_trip_hybrid_presets(void **state)
{
	static const char *const names[] = { "nemotron-h-8b",
					     "qwen3-next-80b-a3b",
					     "gemma-3-12b" };
	struct kvp_layout_info info;
	uint32_t i;

	(void)state;
	for (i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		kvp_layout *l, *dec, *peer;
		struct blob b;

		l = build_conv(names[i], 5, 2, 1, 32, 16, KVP_KV_FLASH_HND,
			       KVP_CONV_DS);
		kvp_layout_get_info(l, &info);
		assert_true(info.ngroups >= 2);
		set_keys(l);
		encode(l, &b);
		if (i == 0)
			seed_write("nemotron-h-8b-tp2r1", &b);
		dec = round_trip(l, &b);
		peer = build_conv(names[i], 6, 4, 3, 16, 0, KVP_KV_FLASH_NHD,
				  KVP_CONV_SD);
		assert_same_plans(l, dec, peer);
		kvp_layout_destroy(peer);
		kvp_layout_destroy(dec);
		kvp_layout_destroy(l);
		free(b.p);
	}
}

static void test_round_trip_all_presets(void **state)
{
	const char *name;
	uint32_t i, lay;

	(void)state;
	for (i = 0; (name = kvp_model_preset_name(i)); i++) {
		for (lay = 0; lay < KVP_KV_LAYOUT_COUNT; lay++) {
			kvp_layout *l = build(name, i, 2, 0, 32, 16, lay);
			kvp_layout *dec;
			struct blob b;

			encode(l, &b);
			dec = round_trip(l, &b);
			kvp_layout_destroy(dec);
			kvp_layout_destroy(l);
			free(b.p);
		}
	}
}

static void test_round_trip_hybrid(void **state)
{
	kvp_layout *l = build_hybrid(), *dec;
	struct blob b;

	(void)state;
	encode(l, &b);
	seed_write("hybrid", &b);
	dec = round_trip(l, &b);
	kvp_layout_destroy(dec);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_encode_errors(void **state)
{
	kvp_layout *l = build_hybrid();
	uint8_t buf[4096], ref[sizeof(buf)];
	size_t need = 0, len;

	(void)state;
	assert_int_equal(kvp_meta_encode(l, NULL, 0, &need), -EMSGSIZE);
	assert_true(need > HDR_LEN && need < sizeof(buf));

	memset(buf, 0xa5, sizeof(buf));
	memcpy(ref, buf, sizeof(buf));
	len = 1;
	assert_int_equal(kvp_meta_encode(l, buf, need - 1, &len), -EMSGSIZE);
	assert_int_equal(len, need);
	assert_memory_equal(buf, ref, sizeof(buf));
	len = 1;
	assert_int_equal(kvp_meta_encode(l, buf, 1, &len), -EMSGSIZE);
	assert_int_equal(len, need);
	assert_memory_equal(buf, ref, sizeof(buf));

	len = 1;
	assert_int_equal(kvp_meta_encode(NULL, buf, sizeof(buf), &len),
			 -EINVAL);
	assert_int_equal(kvp_meta_encode(l, buf, sizeof(buf), NULL), -EINVAL);
	assert_int_equal(kvp_meta_encode(l, NULL, sizeof(buf), &len), -EINVAL);
	assert_int_equal(len, 1);
	assert_memory_equal(buf, ref, sizeof(buf));

	/* A key whose range wraps is refused on both ends. */
	assert_int_equal(kvp_layout_set_region_key(l, 1, UINT64_MAX - 100, 1),
			 0);
	assert_int_equal(kvp_meta_encode(l, buf, sizeof(buf), &len), -EINVAL);
	assert_int_equal(len, 1);
	assert_memory_equal(buf, ref, sizeof(buf));

	/* Exactly `need` bytes suffice and nothing past them is written. */
	assert_int_equal(kvp_layout_set_region_key(l, 1, 0, 0), 0);
	assert_int_equal(kvp_meta_encode(l, buf, need, &len), 0);
	assert_int_equal(len, need);
	assert_memory_equal(buf + need, ref + need, sizeof(buf) - need);
	kvp_layout_destroy(l);
}

static void expect_decode(const struct blob *b, size_t len, int err)
{
	kvp_layout *out = SENTINEL;

	assert_int_equal(kvp_meta_decode(b->p, len, &out), err);
	assert_ptr_equal(out, SENTINEL);
}

/* Decodes a copy of b with one u32 replaced. */
static void expect_patched32(const struct blob *b, size_t off, uint32_t v,
			     int err)
{
	uint8_t save[4];

	memcpy(save, b->p + off, 4);
	wr32(b->p + off, v);
	expect_decode(b, b->len, err);
	memcpy(b->p + off, save, 4);
}

static void expect_patched64(const struct blob *b, size_t off, uint64_t v,
			     int err)
{
	uint8_t save[8];

	memcpy(save, b->p + off, 8);
	wr64(b->p + off, v);
	expect_decode(b, b->len, err);
	memcpy(b->p + off, save, 8);
}

/* A layout without a field encodes (56 bytes), but no peer can use it: its
 * blob is refused, as too short; with groups, a region and views but still
 * no field, as malformed. */
static void test_no_field_refused(void **state)
{
	struct kvp_layout_attr attr = { .engine_id = 3, .tp_size = 1 };
	struct kvp_group_desc g = { .kind = KVP_GROUP_FULL,
				    .block_tokens = 16 };
	struct kvp_view_desc v = { .num_blocks = 4, .stride = 1024 };
	kvp_layout *l;
	struct blob b;
	uint32_t i;

	(void)state;
	assert_int_equal(kvp_layout_create(&attr, &l), 0);
	encode(l, &b);
	assert_int_equal(b.len, HDR_LEN);
	expect_decode(&b, b.len, -EMSGSIZE);
	free(b.p);

	assert_int_equal(kvp_layout_add_group(l, &g, NULL), 0);
	assert_int_equal(kvp_layout_add_region(l, 4096, NULL), 0);
	for (i = 0; i < 6; i++) {
		v.layer = i;
		assert_int_equal(kvp_layout_add_view(l, &v, NULL), 0);
	}
	encode(l, &b);
	assert_true(b.len >= KVP_META_MIN_LEN);
	expect_decode(&b, b.len, -EPROTO);
	kvp_layout_destroy(l);
	free(b.p);
}

/* The smallest layout a decoder accepts: one record of each kind. */
static kvp_layout *build_minimal(uint32_t tp, uint32_t rank)
{
	struct kvp_layout_attr attr = { .engine_id = 9, .tp_size = tp,
					.tp_rank = rank };
	struct kvp_group_desc g = { .kind = KVP_GROUP_MLA,
				    .block_tokens = 16 };
	struct kvp_view_desc v;
	struct kvp_field_desc f;
	kvp_layout *l;

	memset(&v, 0, sizeof(v));
	v.num_blocks = 4;
	v.stride = 1024;
	memset(&f, 0, sizeof(f));
	f.kind = KVP_FIELD_LATENT;
	f.elem_size = 2;
	f.shard_dim = KVP_NO_SHARD;
	dim(&f, KVP_AXIS_TOKEN, 16, 64);
	dim(&f, KVP_AXIS_DIM, 32, 2);
	assert_int_equal(kvp_layout_create(&attr, &l), 0);
	assert_int_equal(kvp_layout_add_group(l, &g, NULL), 0);
	assert_int_equal(kvp_layout_add_region(l, 4096, NULL), 0);
	assert_int_equal(kvp_layout_add_view(l, &v, NULL), 0);
	assert_int_equal(kvp_layout_add_field(l, 0, &f), 0);
	return l;
}

static void test_min_len(void **state)
{
	kvp_layout *l = build_minimal(1, 0), *dec;
	struct blob b, t;
	uint8_t *junk;

	(void)state;
	assert_int_equal(KVP_META_MIN_LEN,
			 HDR_LEN + GROUP_LEN + REGION_LEN + VIEW_LEN +
				 FIELD_LEN);
	encode(l, &b);
	assert_int_equal(b.len, KVP_META_MIN_LEN);
	dec = round_trip(l, &b);
	kvp_layout_destroy(dec);

	/* One byte shorter: refused unread, whatever it holds (each buffer
	 * exactly that long, so ASan sees any read past it). */
	t = b;
	t.p = malloc(KVP_META_MIN_LEN - 1);
	assert_non_null(t.p);
	memcpy(t.p, b.p, KVP_META_MIN_LEN - 1);
	expect_decode(&t, KVP_META_MIN_LEN - 1, -EMSGSIZE);
	t.p[0] = 'X';
	expect_decode(&t, KVP_META_MIN_LEN - 1, -EMSGSIZE);
	expect_decode(&t, 8, -EMSGSIZE);
	free(t.p);
	/* At the minimum length, a foreign blob is what it is. */
	junk = malloc(KVP_META_MIN_LEN);
	assert_non_null(junk);
	memset(junk, 'X', KVP_META_MIN_LEN);
	t.p = junk;
	expect_decode(&t, KVP_META_MIN_LEN, -EPROTO);
	free(junk);
	kvp_layout_destroy(l);
	free(b.p);
}

/* A peer's field whose token dims multiply to block_tokens only modulo
 * 2^64: 16 (2^31 + 1)^2 (2^31 - 1)^2, strides 0. Refused as malformed. */
static void test_token_wrap(void **state)
{
	kvp_layout *l = build_minimal(1, 0);
	size_t f0, d;
	struct blob b;

	(void)state;
	encode(l, &b);
	f0 = off_field(&b, 0);
	wr32(b.p + f0 + 12, 6);
	for (d = 2; d < 6; d++) {
		uint8_t *q = b.p + f0 + 32 + 16 * d;

		wr64(q, 0);
		wr32(q + 8, d & 1 ? (1u << 31) - 1 : (1u << 31) + 1);
		wr32(q + 12, KVP_AXIS_TOKEN);
	}
	expect_decode(&b, b.len, -EPROTO);
	kvp_layout_destroy(l);
	free(b.p);
}

/* TP sizes above KVP_MAX_TP_SIZE are refused, also from a peer. The field is
 * replicated, so only the cap can tell 1024 from 1025. */
static void test_tp_cap(void **state)
{
	kvp_layout *l = build_minimal(KVP_MAX_TP_SIZE, KVP_MAX_TP_SIZE - 1);
	kvp_layout *dec;
	struct kvp_layout_info li;
	struct blob b;

	(void)state;
	encode(l, &b);
	dec = round_trip(l, &b);
	kvp_layout_get_info(dec, &li);
	assert_int_equal(li.tp_size, KVP_MAX_TP_SIZE);
	kvp_layout_destroy(dec);
	expect_patched32(&b, 32, KVP_MAX_TP_SIZE + 1, -EPROTO);
	expect_patched32(&b, 32, 65535, -EPROTO);
	expect_patched32(&b, 32, UINT32_MAX, -EPROTO);
	/* a smaller TP size that still holds the rank decodes */
	wr32(b.p + 32, KVP_MAX_TP_SIZE - 1);
	wr32(b.p + 36, 7);
	assert_int_equal(kvp_meta_decode(b.p, b.len, &dec), 0);
	kvp_layout_destroy(dec);
	kvp_layout_destroy(l);
	free(b.p);
}

/* Many layers (~2.3 MiB with 8,000 views and 16,000 fields): the blob
 * round-trips, and a duplicate field at its very end is still found.
 * Decoding took 0.14 s here with a per-field scan of all earlier fields
 * (quadratic: 11.5 s at 16 MiB), 0.01 s with the field set. */
#define BIG_VIEWS 8000u

static void test_big_blob(void **state)
{
	struct kvp_layout_attr attr = { .engine_id = 5, .tp_size = 1 };
	struct kvp_group_desc g = { .kind = KVP_GROUP_FULL,
				    .block_tokens = 16 };
	struct kvp_field_desc f;
	kvp_layout *l, *dec;
	struct kvp_layout_info li;
	struct blob b;
	uint32_t i, k, view;

	(void)state;
	assert_int_equal(kvp_layout_create(&attr, &l), 0);
	assert_int_equal(kvp_layout_add_group(l, &g, NULL), 0);
	assert_int_equal(kvp_layout_add_region(l, 1 << 20, NULL), 0);
	for (i = 0; i < BIG_VIEWS; i++) {
		struct kvp_view_desc v;

		/* padding too: the layouts are compared bytewise */
		memset(&v, 0, sizeof(v));
		v.layer = i;
		v.num_blocks = 4;
		v.stride = 4096;
		assert_int_equal(kvp_layout_add_view(l, &v, &view), 0);
		for (k = 0; k < 2; k++) {
			memset(&f, 0, sizeof(f));
			f.kind = k ? KVP_FIELD_V : KVP_FIELD_K;
			f.elem_size = 2;
			f.offset = k * 2048;
			f.shard_dim = KVP_NO_SHARD;
			dim(&f, KVP_AXIS_TOKEN, 16, 128);
			dim(&f, KVP_AXIS_DIM, 64, 2);
			assert_int_equal(kvp_layout_add_field(l, view, &f), 0);
		}
	}
	encode(l, &b);
	assert_true(b.len > 2u << 20);
	dec = round_trip(l, &b);
	kvp_layout_get_info(dec, &li);
	assert_int_equal(li.nviews, BIG_VIEWS);
	assert_int_equal(li.nfields, 2 * BIG_VIEWS);
	kvp_layout_destroy(dec);
	/* The last field (V of the last layer) moved to the first view: a
	 * second V in layer 0. Also with the kind changed to K, in the middle
	 * of the layers. */
	expect_patched32(&b, off_field(&b, 2 * BIG_VIEWS - 1), 0, -EPROTO);
	expect_patched32(&b, off_field(&b, 2 * BIG_VIEWS - 1) + 4,
			 KVP_FIELD_K, -EPROTO);
	expect_patched32(&b, off_field(&b, BIG_VIEWS + 1) + 4, KVP_FIELD_K,
			 -EPROTO);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_decode_args(void **state)
{
	kvp_layout *l = build_hybrid(), *out = SENTINEL;
	struct blob b;

	(void)state;
	encode(l, &b);
	assert_int_equal(kvp_meta_decode(b.p, b.len, NULL), -EINVAL);
	assert_int_equal(kvp_meta_decode(NULL, b.len, &out), -EINVAL);
	assert_ptr_equal(out, SENTINEL);
	assert_int_equal(kvp_meta_decode(NULL, 0, &out), -EMSGSIZE);
	assert_ptr_equal(out, SENTINEL);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_truncated(void **state)
{
	kvp_layout *l = build("llama-3.1-8b", 42, 2, 1, 64, 16,
			      KVP_KV_FLASH_HND);
	struct blob b;
	uint8_t *longer;
	size_t n;

	(void)state;
	set_keys(l);
	encode(l, &b);
	/* Each prefix in its own allocation, so ASan sees any read past it. */
	for (n = 0; n < b.len; n++) {
		struct blob t = b;

		t.p = malloc(n ? n : 1);
		assert_non_null(t.p);
		memcpy(t.p, b.p, n);
		expect_decode(&t, n, -EMSGSIZE);
		free(t.p);
	}
	/* Trailing bytes past total_len are not ours: a length mismatch. */
	longer = calloc(1, b.len + 1);
	assert_non_null(longer);
	memcpy(longer, b.p, b.len);
	{
		struct blob t = b;

		t.p = longer;
		expect_decode(&t, b.len + 1, -EPROTO);
	}
	free(longer);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_header(void **state)
{
	kvp_layout *l = build_hybrid(), *out;
	struct blob b;
	uint8_t v;

	(void)state;
	encode(l, &b);
	/* magic */
	for (v = 0; v < 4; v++) {
		b.p[v] ^= 0x20;
		expect_decode(&b, b.len, -EPROTO);
		b.p[v] ^= 0x20;
	}
	/* A foreign blob is rejected as such; below KVP_META_MIN_LEN as
	 * too short, unread. */
	b.p[0] = 'X';
	expect_decode(&b, KVP_META_MIN_LEN, -EPROTO);
	expect_decode(&b, KVP_META_MIN_LEN - 1, -EMSGSIZE);
	expect_decode(&b, 8, -EMSGSIZE);
	b.p[0] = 'K';
	/* version, header length: u16 at 4 and 6 */
	b.p[4] = 2;
	expect_decode(&b, b.len, -EPROTO);
	b.p[4] = 0;
	expect_decode(&b, b.len, -EPROTO);
	b.p[4] = 1;
	b.p[5] = 1;
	expect_decode(&b, b.len, -EPROTO);
	b.p[5] = 0;
	b.p[6] = HDR_LEN + 8;
	expect_decode(&b, b.len, -EPROTO);
	b.p[6] = HDR_LEN - 8;
	expect_decode(&b, b.len, -EPROTO);
	b.p[6] = HDR_LEN;
	/* total length: smaller than the header, than the blob, larger */
	expect_patched32(&b, 8, HDR_LEN - 1, -EPROTO);
	expect_patched32(&b, 8, 0, -EPROTO);
	expect_patched32(&b, 8, (uint32_t)b.len - 1, -EPROTO);
	expect_patched32(&b, 8, (uint32_t)b.len + 1, -EMSGSIZE);
	expect_patched32(&b, 8, UINT32_MAX, -EMSGSIZE);
	/* reserved */
	expect_patched32(&b, 12, 1, -EPROTO);
	expect_patched32(&b, 12, 0x80000000u, -EPROTO);
	/* TP: rank out of range, size zero; the builders refuse both */
	expect_patched32(&b, 32, 0, -EPROTO);
	expect_patched32(&b, 36, 2, -EPROTO);
	expect_patched32(&b, 36, UINT32_MAX, -EPROTO);
	/* Rank 0 holds shards of the same sizes, and the hash ignores ranks:
	 * a blob claiming another rank decodes. The transport must check the
	 * rank against the peer it connected to. */
	wr32(b.p + 36, 0);
	assert_int_equal(kvp_meta_decode(b.p, b.len, &out), 0);
	kvp_layout_destroy(out);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_hash(void **state)
{
	kvp_layout *l = build_hybrid(), *out = SENTINEL;
	struct blob b;
	uint32_t i;

	(void)state;
	encode(l, &b);
	for (i = 0; i < 64; i++) {
		b.p[16 + i / 8] ^= (uint8_t)(1u << (i % 8));
		expect_decode(&b, b.len, -EPROTO);
		b.p[16 + i / 8] ^= (uint8_t)(1u << (i % 8));
	}
	/* Valid records describing another model: the hash tells. View 1
	 * (the state group's) moves from layer 1 to layer 2. */
	wr32(b.p + off_view(&b, 1) + 8, 2);
	expect_decode(&b, b.len, -EPROTO);
	wr32(b.p + off_view(&b, 1) + 8, 1);
	/* The engine id is not in the hash; the blob still decodes. */
	b.p[24] ^= 1;
	assert_int_equal(kvp_meta_decode(b.p, b.len, &out), 0);
	kvp_layout_destroy(out);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_counts(void **state)
{
	kvp_layout *l = build_hybrid();
	struct blob b;
	uint32_t i;

	(void)state;
	encode(l, &b);
	for (i = 0; i < 4; i++) {
		size_t off = 40 + 4 * i;
		uint32_t n = rd32(b.p + off);

		expect_patched32(&b, off, n + 1, -EPROTO);
		if (n)
			expect_patched32(&b, off, n - 1, -EPROTO);
		expect_patched32(&b, off, UINT32_MAX, -EPROTO);
		expect_patched32(&b, off, 0x80000000u, -EPROTO);
		/* 0x02000000 * 128 wraps a u32 to 0: caught, not wrapped */
		expect_patched32(&b, off, 0x02000000u, -EPROTO);
	}
	/* Counts that add up to the right length but misframe the records:
	 * three more groups (24 bytes), one region fewer (24 bytes). */
	wr32(b.p + 40, b.ngroups + 3);
	wr32(b.p + 44, b.nregions - 1);
	expect_decode(&b, b.len, -EPROTO);
	wr32(b.p + 40, b.ngroups);
	wr32(b.p + 44, b.nregions);
	/* Four views more, one field fewer (128 bytes each way). */
	wr32(b.p + 48, b.nviews + 4);
	wr32(b.p + 52, b.nfields - 1);
	expect_decode(&b, b.len, -EPROTO);
	wr32(b.p + 48, b.nviews);
	wr32(b.p + 52, b.nfields);
	kvp_layout_destroy(l);
	free(b.p);
}

static void test_records(void **state)
{
	kvp_layout *l = build_hybrid();
	struct blob b;
	size_t g1 = HDR_LEN + GROUP_LEN, r0, r1, v0, v1, f0, f1, f3;

	(void)state;
	encode(l, &b);
	r0 = off_region(&b, 0);
	r1 = off_region(&b, 1);
	v0 = off_view(&b, 0);
	v1 = off_view(&b, 1);
	f0 = off_field(&b, 0);
	f1 = off_field(&b, 1);
	f3 = off_field(&b, 3);

	/* groups: unknown kind, STATE with tokens, FULL without */
	expect_patched32(&b, HDR_LEN, KVP_GROUP_KIND_COUNT, -EPROTO);
	expect_patched32(&b, g1 + 4, 16, -EPROTO);
	expect_patched32(&b, HDR_LEN + 4, 0, -EPROTO);

	/* regions: zero size, reserved, a wrapping key range; too small for
	 * the views on it */
	expect_patched64(&b, r0, 0, -EPROTO);
	expect_patched32(&b, r0 + 20, 1, -EPROTO);
	expect_patched64(&b, r1 + 8, UINT64_MAX - 1000, -EPROTO);
	expect_patched64(&b, r1, 8192 * 4 - 1, -EPROTO);

	/* views: missing group or region, zero blocks or stride, past the
	 * region */
	expect_patched32(&b, v0, 3, -EPROTO);
	expect_patched32(&b, v0 + 4, 2, -EPROTO);
	expect_patched32(&b, v0 + 12, 0, -EPROTO);
	expect_patched64(&b, v0 + 24, 0, -EPROTO);
	expect_patched64(&b, v1 + 16, (1 << 20) - 1, -EPROTO);
	expect_patched64(&b, v1 + 16, UINT64_MAX, -EPROTO);

	/* fields: view missing, kind unknown, elem_size 0 */
	expect_patched32(&b, f0, 3, -EPROTO);
	expect_patched32(&b, f0 + 4, KVP_FIELD_KIND_COUNT, -EPROTO);
	expect_patched32(&b, f0 + 8, 0, -EPROTO);
	/* ndim 0, past the maximum, or hiding a used dim */
	expect_patched32(&b, f0 + 12, 0, -EPROTO);
	expect_patched32(&b, f0 + 12, KVP_MAX_DIMS + 1, -EPROTO);
	expect_patched32(&b, f0 + 12, UINT32_MAX, -EPROTO);
	expect_patched32(&b, f0 + 12, 2, -EPROTO);
	/* an unused dim that is not zero, in each of its words */
	expect_patched32(&b, f0 + 32 + 3 * 16, 1, -EPROTO);
	expect_patched32(&b, f0 + 32 + 5 * 16 + 8, 1, -EPROTO);
	expect_patched32(&b, f0 + 32 + 5 * 16 + 12, 1, -EPROTO);
	/* shard range: wrong total for the dim's size, a total TP does not
	 * divide, dim out of range, a token dim, a total with no shard dim */
	expect_patched32(&b, f0 + 28, 16, -EPROTO);
	expect_patched32(&b, f0 + 28, 3, -EPROTO);
	expect_patched32(&b, f0 + 28, 0, -EPROTO);
	expect_patched32(&b, f0 + 24, 3, -EPROTO);
	expect_patched32(&b, f0 + 24, 1, -EPROTO);
	expect_patched32(&b, f0 + 24, KVP_NO_SHARD, -EPROTO);
	expect_patched32(&b, f3 + 28, 4, -EPROTO);
	/* dims: the shard dim's size, a token count that is not the block,
	 * a token dim in a STATE group, an unknown axis, zero size */
	expect_patched32(&b, f0 + 32 + 8, 8, -EPROTO);
	expect_patched32(&b, f0 + 32 + 16 + 8, 8, -EPROTO);
	expect_patched32(&b, f1 + 32 + 16 + 12, KVP_AXIS_TOKEN, -EPROTO);
	expect_patched32(&b, f0 + 32 + 12, KVP_AXIS_COUNT, -EPROTO);
	expect_patched32(&b, f0 + 32 + 32 + 8, 0, -EPROTO);
	/* extents: past the page run of the region, overflowing */
	expect_patched64(&b, f0 + 16, 1 << 20, -EPROTO);
	expect_patched64(&b, f0 + 32, UINT64_MAX / 2, -EPROTO);
	/* a duplicate kind in one (group, layer) */
	expect_patched32(&b, off_field(&b, 4) + 4, KVP_FIELD_K, -EPROTO);
	kvp_layout_destroy(l);
	free(b.p);
}

/* A keyed region of size 0 (no key at all) after the keyed region at r0
 * would count the key table one key short; with total_len cut to that
 * count, the first region's keys ran 4 bytes past the blob (found by
 * fuzz_meta; tests/fuzz/crashes/meta-short-key-table). Refused, read in a
 * buffer of exactly its length so that ASan sees any byte past it. */
static void expect_short_table(const struct blob *b, size_t r0)
{
	size_t r1 = r0 + REGION_LEN, len = b->len - 4;
	kvp_layout *out = SENTINEL;
	uint8_t *p = malloc(len);

	assert_non_null(p);
	memcpy(p, b->p, len);
	wr32(p + 8, (uint32_t)len);
	wr64(p + r1, 0);
	wr32(p + r1 + 20, 20);
	if (getenv("KVP_WIRE_CRASH_DIR")) {
		struct blob c = *b;
		char path[512];
		FILE *f;

		c.p = p;
		c.len = len;
		snprintf(path, sizeof(path), "%s/meta-short-key-table",
			 getenv("KVP_WIRE_CRASH_DIR"));
		f = fopen(path, "wb");
		assert_non_null(f);
		assert_int_equal(fwrite(c.p, 1, c.len, f), c.len);
		assert_int_equal(fclose(f), 0);
	}
	assert_int_equal(kvp_meta_decode(p, len, &out), -EPROTO);
	assert_ptr_equal(out, SENTINEL);
	/* The same with the size-0 region first: refused too. */
	wr64(p + r1, rd64(b->p + r1));
	wr32(p + r1 + 20, 0);
	wr64(p + r0, 0);
	assert_int_equal(kvp_meta_decode(p, len, &out), -EPROTO);
	assert_ptr_equal(out, SENTINEL);
	free(p);
}

/* A region registered as several MRs: its keys, set and read back, on the
 * wire as version 2 with a key table, and refused when the table or the
 * shift does not add up. */
static void test_region_keys(void **state)
{
	kvp_layout *l, *dec = NULL, *c = NULL;
	struct blob b1, b2;
	uint32_t keys[64], got[64], shift, n, i;
	uint64_t size, addr;
	size_t len = 0, r0;

	(void)state;
	l = build("llama-3.1-8b", 42, 2, 1, 64, 16, KVP_KV_FLASH_HND);
	set_keys(l);
	encode(l, &b1);
	assert_int_equal(b1.p[4], 1);
	assert_int_equal(kvp_layout_get_region(l, 0, &size), 0);
	n = (uint32_t)((size + (1u << 20) - 1) >> 20);
	assert_true(n >= 2 && n <= 64);
	for (i = 0; i < n; i++)
		keys[i] = 0xc0de0000u + i;

	/* Bad shifts and counts change nothing. */
	assert_int_equal(kvp_layout_set_region_keys(l, 0, 1, 14, keys, n),
			 -EINVAL);
	assert_int_equal(kvp_layout_set_region_keys(l, 0, 1, 63, keys, n),
			 -EINVAL);
	assert_int_equal(kvp_layout_set_region_keys(l, 0, 1, 20, keys, n - 1),
			 -EINVAL);
	assert_int_equal(kvp_layout_set_region_keys(l, 0, 1, 20, keys, n + 1),
			 -EINVAL);
	assert_int_equal(kvp_layout_set_region_keys(l, 0, 1, 0, keys, 2),
			 -EINVAL);
	assert_int_equal(kvp_layout_set_region_keys(l, 0, 1, 20, NULL, n),
			 -EINVAL);
	assert_int_equal(kvp_layout_set_region_keys(l, b1.nregions, 1, 20,
						    keys, n),
			 -EINVAL);
	assert_int_equal(kvp_layout_get_region_keys(l, 0, &addr, &shift, got,
						    64),
			 1);
	assert_int_equal(shift, 0);
	assert_int_equal(got[0], 0xab000000u);

	assert_int_equal(kvp_layout_set_region_keys(l, 0, 0x7f0000000000ull, 20,
						    keys, n),
			 0);
	assert_int_equal(kvp_layout_get_region_keys(l, 0, &addr, &shift, NULL,
						    0),
			 (int)n);
	memset(got, 0, sizeof(got));
	assert_int_equal(kvp_layout_get_region_keys(l, 0, &addr, &shift, got,
						    2),
			 (int)n);
	assert_int_equal(got[1], keys[1]);
	assert_int_equal(got[2], 0);
	assert_int_equal(kvp_layout_get_region_keys(l, 0, &addr, &shift, got,
						    64),
			 (int)n);
	assert_int_equal(shift, 20);
	assert_int_equal(addr, 0x7f0000000000ull);
	assert_memory_equal(got, keys, n * sizeof(*keys));

	/* Version 2: the region record carries the shift, the table keys 1
	 * to n - 1 after the fields. */
	assert_int_equal(kvp_meta_encode(l, NULL, 0, &len), -EMSGSIZE);
	assert_int_equal(len, b1.len + 4 * (n - 1));
	b2 = b1;
	b2.p = malloc(len);
	assert_non_null(b2.p);
	assert_int_equal(kvp_meta_encode(l, b2.p, len, &b2.len), 0);
	assert_int_equal(b2.len, len);
	assert_int_equal(b2.p[4], 2);
	seed_write("llama-tp2r1-hnd-keys", &b2);
	r0 = off_region(&b2, 0);
	assert_int_equal(rd32(b2.p + r0 + 16), keys[0]);
	assert_int_equal(rd32(b2.p + r0 + 20), 20);
	for (i = 1; i < n; i++)
		assert_int_equal(rd32(b2.p + b1.len + 4 * (i - 1)), keys[i]);
	assert_int_equal(kvp_meta_decode(b2.p, b2.len, &dec), 0);
	memset(got, 0, sizeof(got));
	assert_int_equal(kvp_layout_get_region_keys(dec, 0, &addr, &shift, got,
						    64),
			 (int)n);
	assert_int_equal(shift, 20);
	assert_memory_equal(got, keys, n * sizeof(*keys));
	kvp_layout_destroy(dec);
	assert_int_equal(kvp_layout_clone(l, &c), 0);
	memset(got, 0, sizeof(got));
	assert_int_equal(kvp_layout_get_region_keys(c, 0, &addr, &shift, got,
						    64),
			 (int)n);
	assert_memory_equal(got, keys, n * sizeof(*keys));
	kvp_layout_destroy(c);

	/* Shifts out of range, or one that makes the table another length;
	 * no keyed region in version 2; a keyed region in version 1; a
	 * table cut short. */
	expect_patched32(&b2, r0 + 20, 14, -EPROTO);
	expect_patched32(&b2, r0 + 20, 63, -EPROTO);
	expect_patched32(&b2, r0 + 20, 0x100000u, -EPROTO);
	expect_patched32(&b2, r0 + 20, 19, -EPROTO);
	expect_patched32(&b2, r0 + 20, 21, -EPROTO);
	expect_patched32(&b2, r0 + 20, 0, -EPROTO);
	b2.p[4] = 1;
	expect_decode(&b2, b2.len, -EPROTO);
	b2.p[4] = 2;
	expect_patched32(&b2, 8, (uint32_t)b2.len - 4, -EPROTO);
	expect_decode(&b2, b2.len - 4, -EMSGSIZE);
	expect_short_table(&b2, r0);

	/* One key again: version 1, byte for byte as before. */
	assert_int_equal(kvp_layout_set_region_key(l, 0, 0x7f0000000000ull,
						   0xab000000u),
			 0);
	free(b2.p);
	encode(l, &b2);
	assert_int_equal(b2.len, b1.len);
	assert_memory_equal(b2.p, b1.p, b1.len);
	free(b2.p);
	free(b1.p);
	kvp_layout_destroy(l);
}

/* Every byte, flipped three ways: the blob decodes to a layout that encodes
 * back to exactly those bytes, or it fails cleanly. */
static void flip_all(const kvp_layout *l)
{
	static const uint8_t masks[] = { 0x01, 0x80, 0xff };
	kvp_layout *out;
	struct blob b;
	size_t i, m, ok = 0;

	encode(l, &b);
	for (i = 0; i < b.len; i++) {
		for (m = 0; m < sizeof(masks); m++) {
			int err;

			b.p[i] ^= masks[m];
			out = SENTINEL;
			err = kvp_meta_decode(b.p, b.len, &out);
			if (err) {
				assert_ptr_equal(out, SENTINEL);
				assert_true(err == -EPROTO ||
					    err == -EMSGSIZE);
				if (i >= 16 && i < 24)
					assert_int_equal(err, -EPROTO);
			} else {
				struct blob again;

				assert_true(i < 16 || i >= 24);
				encode(out, &again);
				assert_int_equal(again.len, b.len);
				assert_memory_equal(again.p, b.p, b.len);
				free(again.p);
				kvp_layout_destroy(out);
				ok++;
			}
			b.p[i] ^= masks[m];
		}
	}
	/* Keys, ids and offsets are not all checkable: some flips decode. */
	assert_true(ok > 0);
	free(b.p);
}

static void test_flips(void **state)
{
	kvp_layout *l = build_hybrid();

	(void)state;
	flip_all(l);
	kvp_layout_destroy(l);
	l = build("llama-3.1-8b", 42, 2, 1, 64, 16, KVP_KV_FLASH_HND);
	set_keys(l);
	flip_all(l);
	kvp_layout_destroy(l);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_round_trip_llama),
		cmocka_unit_test(test_round_trip_deepseek),
		cmocka_unit_test(test_round_trip_hybrid_presets),
		cmocka_unit_test(test_round_trip_all_presets),
		cmocka_unit_test(test_round_trip_hybrid),
		cmocka_unit_test(test_no_field_refused),
		cmocka_unit_test(test_min_len),
		cmocka_unit_test(test_tp_cap),
		cmocka_unit_test(test_token_wrap),
		cmocka_unit_test(test_big_blob),
		cmocka_unit_test(test_encode_errors),
		cmocka_unit_test(test_decode_args),
		cmocka_unit_test(test_truncated),
		cmocka_unit_test(test_header),
		cmocka_unit_test(test_hash),
		cmocka_unit_test(test_counts),
		cmocka_unit_test(test_records),
		cmocka_unit_test(test_region_keys),
		cmocka_unit_test(test_flips),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
