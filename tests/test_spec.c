// SPDX-License-Identifier: MIT
/* kvp_layout_parse(): both spec forms, equality with kvp_layout_build(),
 * every rejection with its exact code, buffers without a terminator. */
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

#define SENTINEL ((kvp_layout *)(uintptr_t)0x5a5a5a5a)

static kvp_layout *parse_ok(const char *text)
{
	kvp_layout *l = NULL;
	char msg[256] = "";
	int err = kvp_layout_parse(text, strlen(text), &l, msg, sizeof(msg));

	if (err)
		fprintf(stderr, "parse failed (%d): %s\n--- spec ---\n%s\n", err,
			msg, text);
	assert_int_equal(err, 0);
	assert_non_null(l);
	return l;
}

static kvp_layout *build(const char *preset, uint32_t layers,
			 const struct kvp_engine_desc *e)
{
	struct kvp_model m;
	kvp_layout *l = NULL;

	assert_int_equal(kvp_model_preset(preset, &m), 0);
	if (layers)
		m.layers = layers;
	assert_int_equal(kvp_layout_build(&m, e, &l), 0);
	return l;
}

/* ---- model form ------------------------------------------------------- */

static void test_model_preset(void **state)
{
	struct kvp_engine_desc e = { .engine_id = 0xdeadbeef,
				     .tp_size = 2,
				     .tp_rank = 1,
				     .block_tokens = 16,
				     .kernel_block_tokens = 8,
				     .num_blocks = 64,
				     .kv_layout = KVP_KV_FLASH_HND };
	kvp_layout *a, *b;

	(void)state;
	a = parse_ok("# llama on two GPUs\n"
		     "model = llama-3.1-8b\n"
		     "\n"
		     "tp_size = 2\n"
		     "tp_rank=1   # the second one\n"
		     "  block_tokens\t=\t16\n"
		     "kernel_block_tokens = 8\r\n"
		     "num_blocks = 0x40\n"
		     "kv_layout = FLASH_HND\n"
		     "engine_id = 0xDEADBEEF");
	b = build("llama-3.1-8b", 0, &e);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);
}

static void test_model_overrides(void **state)
{
	/* kv_layout: a spec's default, FLASH_HND */
	struct kvp_engine_desc e = { .tp_size = 1,
				     .block_tokens = 32,
				     .num_blocks = 10,
				     .kv_layout = KVP_KV_FLASH_HND };
	struct kvp_model m = { .name = "x",
			       .layers = 3,
			       .kv_heads = 4,
			       .head_dim = 64,
			       .dtype_bytes = 1 };
	kvp_layout *a, *b;

	(void)state;
	/* Overrides may come before the preset line. */
	a = parse_ok("layers = 2\nmodel = deepseek-v3\nblock_tokens = 32\n"
		     "num_blocks = 10\n");
	b = build("deepseek-v3", 2, &e);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);

	/* No preset: every number given. */
	a = parse_ok("layers = 3\nkv_heads = 4\nhead_dim = 64\n"
		     "dtype_bytes = 1\nblock_tokens = 32\nnum_blocks = 10\n");
	assert_int_equal(kvp_layout_build(&m, &e, &b), 0);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);

	/* No preset, MLA. */
	a = parse_ok("layers=2\nmla_latent=576\ndtype_bytes=2\n"
		     "block_tokens=32\nnum_blocks=10\nkv_layout=packed\n");
	b = build("deepseek-v3", 2, &e);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);

	/* A preset with its numbers changed; head_dim overridden. */
	a = parse_ok("model = QWEN2.5-1.5B\nhead_dim = 64\nlayers = 1\n"
		     "tp_size = 4\ntp_rank = 3\nblock_tokens = 32\n"
		     "num_blocks = 10\nkv_layout = flashinfer\n");
	m = (struct kvp_model){ .name = "y",
				.layers = 1,
				.kv_heads = 2,
				.head_dim = 64,
				.dtype_bytes = 2 };
	e.tp_size = 4;
	e.tp_rank = 3;
	e.kv_layout = KVP_KV_FLASHINFER;
	assert_int_equal(kvp_layout_build(&m, &e, &b), 0);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);
}

/* Hybrid models: the state keys, with and without a preset. */
static void test_model_hybrid(void **state)
{
	struct kvp_engine_desc e = { .tp_size = 2,
				     .tp_rank = 1,
				     .block_tokens = 16,
				     .num_blocks = 64,
				     .kv_layout = KVP_KV_FLASH_HND,
				     .conv_layout = KVP_CONV_SD };
	struct kvp_model m;
	kvp_layout *a, *b;

	(void)state;
	a = parse_ok("model = nemotron-h-8b\nlayers = 2\nstate_layers = 3\n"
		     "tp_size = 2\ntp_rank = 1\nblock_tokens = 16\n"
		     "num_blocks = 64\nkv_layout = flash_hnd\n"
		     "conv_layout = SD\n");
	assert_int_equal(kvp_model_preset("nemotron-h-8b", &m), 0);
	m.layers = 2;
	m.state_layers = 3;
	assert_int_equal(kvp_layout_build(&m, &e, &b), 0);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);

	/* A gated delta net model given number by number. */
	a = parse_ok("layers = 1\nkv_heads = 2\nhead_dim = 256\n"
		     "dtype_bytes = 2\nstate_kind = gdn\nstate_layers = 3\n"
		     "conv_kernel = 4\nssm_heads = 32\nssm_head_dim = 128\n"
		     "ssm_state = 128\nssm_groups = 16\n"
		     "state_dtype_bytes = 4\ntp_size = 2\nblock_tokens = 16\n"
		     "num_blocks = 256\n");
	m = (struct kvp_model){ .name = "gdn",
				.layers = 1,
				.kv_heads = 2,
				.head_dim = 256,
				.dtype_bytes = 2,
				.state_kind = KVP_STATE_GDN,
				.state_layers = 3,
				.conv_kernel = 4,
				.ssm_heads = 32,
				.ssm_head_dim = 128,
				.ssm_state = 128,
				.ssm_groups = 16,
				.state_dtype_bytes = 4 };
	e.tp_rank = 0;
	e.num_blocks = 256;
	e.kv_layout = KVP_KV_FLASH_HND; /* a spec's default */
	e.conv_layout = KVP_CONV_DS;
	assert_int_equal(kvp_layout_build(&m, &e, &b), 0);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);

	/* Sliding-window layers. */
	a = parse_ok("model = gemma-2-9b\nlayers = 4\nsliding_layers = 2\n"
		     "block_tokens = 16\nnum_blocks = 8\n");
	assert_int_equal(kvp_model_preset("gemma-2-9b", &m), 0);
	m.layers = 4;
	m.sliding_layers = 2;
	e = (struct kvp_engine_desc){ .tp_size = 1,
				      .block_tokens = 16,
				      .num_blocks = 8,
				      .kv_layout = KVP_KV_FLASH_HND };
	assert_int_equal(kvp_layout_build(&m, &e, &b), 0);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);
}

/* ---- explicit form ---------------------------------------------------- */

/* qwen2.5-1.5b, one layer, TP 2 rank 1, blocks of 16 tokens in kernel pages
 * of 8, FlashInfer: one head per rank, page (2, 1, 8, 128) x 2 kernel pages,
 * K at 0 and V at 2048 in each kernel page of 4096 bytes. */
static void test_explicit_reproduces_build(void **state)
{
	struct kvp_engine_desc e = { .engine_id = 7,
				     .tp_size = 2,
				     .tp_rank = 1,
				     .block_tokens = 16,
				     .kernel_block_tokens = 8,
				     .num_blocks = 4,
				     .kv_layout = KVP_KV_FLASHINFER };
	kvp_layout *a, *b;

	(void)state;
	a = parse_ok(
		"engine tp_size=2 tp_rank=1 engine_id=7\n"
		"group kind=full block_tokens=16\n"
		"region size=32K\n"
		"view group=0 region=0 layer=0 num_blocks=4 offset=0 stride=8K\n"
		"# K: head (sharded: 1 of 2), kernel page, token, dim\n"
		"field view=0 kind=k elem=2 shard=0 total=2 "
		"dims=head:1:2048,token:2:4K,token:8:256,dim:128:2\n"
		"field view = 0 kind = V elem = 2 offset = 0x800 shard=0 "
		"total=2 dims=HEAD:1:0x800,token:2:4096,token:8:256,dim:128:2\n");
	b = build("qwen2.5-1.5b", 1, &e);
	kva_layouts_equal(a, b, 0);
	kvp_layout_destroy(a);
	kvp_layout_destroy(b);
}

static const char *const kind_spec[] = { "k",	   "v",	     "latent",
					 "conv_x", "conv_b", "conv_c",
					 "ssm",	   "conv_q", "conv_k",
					 "conv_v" };
static const char *const axis_spec[] = { "token",   "head",  "dim",
					 "channel", "state", "aux" };
static const char *const group_spec[] = { "full", "sliding", "mla",
					  "state" };

/* Writes the explicit spec of a layout, read through the getters. */
static char *write_spec(const kvp_layout *l)
{
	struct kvp_layout_info li;
	char *text = NULL;
	size_t n = 0;
	FILE *f = open_memstream(&text, &n);
	uint32_t i, d;

	assert_non_null(f);
	kvp_layout_get_info(l, &li);
	fprintf(f, "engine tp_size=%u tp_rank=%u engine_id=0x%llx\n",
		li.tp_size, li.tp_rank, (unsigned long long)li.engine_id);
	for (i = 0; i < li.ngroups; i++) {
		struct kvp_group_desc g;

		assert_int_equal(kvp_layout_get_group(l, i, &g), 0);
		fprintf(f, "group kind=%s block_tokens=%u\n",
			group_spec[g.kind], g.block_tokens);
	}
	for (i = 0; i < li.nregions; i++) {
		uint64_t size;

		assert_int_equal(kvp_layout_get_region(l, i, &size), 0);
		if (size % 1024 == 0)
			fprintf(f, "region size=%lluK\n",
				(unsigned long long)size / 1024);
		else
			fprintf(f, "region size=%llu\n",
				(unsigned long long)size);
	}
	for (i = 0; i < li.nviews; i++) {
		struct kvp_view_desc v;

		assert_int_equal(kvp_layout_get_view(l, i, &v), 0);
		fprintf(f,
			"view group=%u region=%u layer=%u num_blocks=%u offset=0x%llx stride=%llu\n",
			v.group, v.region, v.layer, v.num_blocks,
			(unsigned long long)v.offset,
			(unsigned long long)v.stride);
	}
	for (i = 0; i < li.nfields; i++) {
		struct kvp_field_desc fd;
		uint32_t view;

		assert_int_equal(kvp_layout_get_field(l, i, &view, &fd), 0);
		fprintf(f, "field view=%u kind=%s elem=%u offset=%llu", view,
			kind_spec[fd.kind], fd.elem_size,
			(unsigned long long)fd.offset);
		if (fd.shard_dim != KVP_NO_SHARD)
			fprintf(f, " shard=%u total=%u", fd.shard_dim,
				fd.shard_total);
		fprintf(f, " dims=");
		for (d = 0; d < fd.ndim; d++)
			fprintf(f, "%s%s:%u:%llu", d ? "," : "",
				axis_spec[fd.dim[d].axis], fd.dim[d].size,
				(unsigned long long)fd.dim[d].stride);
		fprintf(f, "\n");
	}
	assert_int_equal(fclose(f), 0);
	return text;
}

/* Every preset, memory layout, kernel page split and TP rank: the explicit
 * spec written from kvp_layout_build()'s layout parses back to it. */
static void test_explicit_roundtrip_presets(void **state)
{
	struct kvp_model m;
	const char *name;
	uint32_t i, lay, tp, k, n = 0;

	(void)state;
	for (i = 0; (name = kvp_model_preset_name(i)); i++) {
		for (lay = 0; lay < KVP_KV_LAYOUT_COUNT; lay++) {
			for (tp = 1; tp <= 16; tp *= 4) {
				for (k = 0; k < 2; k++) {
					struct kvp_engine_desc e = { 0 };
					kvp_layout *a, *b;
					char *text;

					e.engine_id = i;
					e.tp_size = tp;
					e.tp_rank = tp - 1;
					e.block_tokens = 32;
					e.kernel_block_tokens = k ? 8 : 0;
					e.num_blocks = 64;
					e.kv_layout = lay;
					assert_int_equal(kvp_model_preset(name,
									  &m),
							 0);
					if (m.layers > 2)
						m.layers = 2;
					if (m.sliding_layers > 1)
						m.sliding_layers = 1;
					if (m.state_layers > 3)
						m.state_layers = 3;
					e.conv_layout = k;
					/* Hybrid TP limits: a refusal here is
					 * kvp_layout_build()'s business. */
					if (kvp_layout_build(&m, &e, &b) ==
					    -EINVAL)
						continue;
					assert_non_null(b);
					n++;
					text = write_spec(b);
					a = parse_ok(text);
					kva_layouts_equal(a, b, 0);
					free(text);
					kvp_layout_destroy(a);
					kvp_layout_destroy(b);
				}
			}
		}
	}
	assert_true(n >= 8 * i);
}

/* A hybrid engine no preset describes: a full-attention group and a Mamba
 * state group whose layers view the same region. */
static const char hybrid[] =
	"engine tp_size=2 tp_rank=0\n"
	"group kind=full block_tokens=16\n"
	"group kind=state\n"
	"region size=1M\n"
	"view group=0 region=0 layer=0 num_blocks=8 stride=64K\n"
	"view group=1 region=0 layer=1 num_blocks=8 stride=64K\n"
	"field view=0 kind=K elem=2 shard=1 total=4 "
	"dims=token:16:512,head:2:256,dim:128:2\n"
	"field view=0 kind=V elem=2 offset=16K shard=1 total=4 "
	"dims=token:16:512,head:2:256,dim:128:2\n"
	"field view=1 kind=conv_x elem=2 shard=1 total=1024 "
	"dims=state:3:1024,channel:512:2\n"
	"field view=1 kind=ssm elem=4 offset=0x1000 shard=0 total=8 "
	"dims=head:4:8K,dim:64:128,state:32:4\n";

static void test_explicit_hybrid(void **state)
{
	struct kvp_layout_info li;
	struct kvp_group_desc g;
	struct kvp_view_desc v;
	struct kvp_field_desc f;
	struct kvp_plan_info pi;
	kvp_plan *plan = NULL;
	kvp_layout *l;
	uint64_t size;
	uint32_t view;

	(void)state;
	l = parse_ok(hybrid);
	kvp_layout_get_info(l, &li);
	assert_int_equal(li.tp_size, 2);
	assert_int_equal(li.tp_rank, 0);
	assert_true(li.engine_id == 0);
	assert_int_equal(li.ngroups, 2);
	assert_int_equal(li.nregions, 1);
	assert_int_equal(li.nviews, 2);
	assert_int_equal(li.nfields, 4);
	assert_int_equal(kvp_layout_get_group(l, 1, &g), 0);
	assert_int_equal(g.kind, KVP_GROUP_STATE);
	assert_int_equal(g.block_tokens, 0);
	assert_int_equal(kvp_layout_get_region(l, 0, &size), 0);
	assert_true(size == 1 << 20);
	assert_int_equal(kvp_layout_get_view(l, 1, &v), 0);
	assert_int_equal(v.group, 1);
	assert_int_equal(v.layer, 1);
	assert_true(v.offset == 0 && v.stride == 65536);
	assert_int_equal(kvp_layout_get_field(l, 1, &view, &f), 0);
	assert_int_equal(f.kind, KVP_FIELD_V);
	assert_true(f.offset == 16384);
	assert_int_equal(kvp_layout_get_field(l, 3, &view, &f), 0);
	assert_int_equal(view, 1);
	assert_int_equal(f.kind, KVP_FIELD_SSM);
	assert_int_equal(f.elem_size, 4);
	assert_true(f.offset == 4096);
	assert_int_equal(f.ndim, 3);
	assert_int_equal(f.shard_dim, 0);
	assert_int_equal(f.shard_total, 8);
	assert_int_equal(f.dim[0].axis, KVP_AXIS_HEAD);
	assert_int_equal(f.dim[0].size, 4);
	assert_true(f.dim[0].stride == 8192);
	assert_int_equal(f.dim[2].axis, KVP_AXIS_STATE);
	assert_int_equal(f.dim[2].size, 32);
	assert_true(f.dim[2].stride == 4);
	/* The layout is usable: it plans against itself. */
	assert_int_equal(kvp_plan_compile(l, l, NULL, &plan, NULL, 0), 0);
	kvp_plan_get_info(plan, &pi);
	assert_int_equal(pi.ngroups, 2);
	assert_int_equal(pi.nsrc, 1);
	kvp_plan_destroy(plan);
	kvp_layout_destroy(l);
}

/* ---- numbers ---------------------------------------------------------- */

static uint64_t region0(const char *size)
{
	char text[256];
	kvp_layout *l;
	uint64_t s;

	snprintf(text, sizeof(text),
		 "engine\ngroup kind=state\nregion size=%s\n"
		 "view group=0 region=0 layer=0 num_blocks=1 stride=1\n"
		 "field view=0 kind=ssm elem=1 dims=aux:1:1\n",
		 size);
	l = parse_ok(text);
	assert_int_equal(kvp_layout_get_region(l, 0, &s), 0);
	kvp_layout_destroy(l);
	return s;
}

static void test_numbers(void **state)
{
	(void)state;
	assert_true(region0("1") == 1);
	assert_true(region0("4096") == 4096);
	assert_true(region0("0x1000") == 4096);
	assert_true(region0("0XfF") == 255);
	assert_true(region0("4K") == 4096);
	assert_true(region0("3k") == 3072);
	assert_true(region0("2M") == 2u << 20);
	assert_true(region0("0x10M") == 16u << 20);
	assert_true(region0("5G") == 5ull << 30);
	assert_true(region0("18446744073709551615") == UINT64_MAX);
	assert_true(region0("0xffffffffffffffff") == UINT64_MAX);
	assert_true(region0("17179869183G") == 17179869183ull << 30);
}

/* ---- rejections ------------------------------------------------------- */

struct bad {
	const char *text;
	int err;
	const char *line; /* the message's prefix */
	const char *says; /* a part of the message */
};

#define LLAMA "model = llama-3.1-8b\n"
#define ENGINE "engine tp_size=1\n"
#define GROUP ENGINE "group kind=full block_tokens=16\n"
#define VIEW GROUP "region size=64K\nview group=0 region=0 layer=0 num_blocks=4 stride=16K\n"

static const struct bad bad[] = {
	/* model form */
	/* 95 bytes that asked for 655,353 layers: quadratic, minutes */
	{ "model = gemma-2-9b\nlayers = 655353\nsliding_layers = 2\n"
	  "block_tokens = 16\nnum_blocks = 1024\n",
	  -EINVAL, "line 2: ",
	  "layers + state_layers is 655353, above the limit of 4096" },
	{ "block_tokens = 16\nnum_blocks = 4\nmodel = gemma-2-9b\n"
	  "sliding_layers = 2\nlayers = 4294967295\n",
	  -EINVAL, "line 5: ",
	  "layers + state_layers is 4294967295, above the limit of 4096" },
	{ "model = nemotron-h-8b\nblock_tokens = 16\nnum_blocks = 64\n"
	  "state_layers = 4093\n",
	  -EINVAL, "line 4: ",
	  "layers + state_layers is 4097, above the limit of 4096" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 64\ntp_size = 1025\n",
	  -EINVAL, "line 4: ", "tp_size 1025 above the limit of 1024" },
	/* an SSM state of 2^64 bytes wrapped to 0: division by zero */
	{ "model = nemotron-h-8b\nblock_tokens = 16\nnum_blocks = 64\n"
	  "ssm_state = 2147483648\nssm_head_dim = 2147483648\n",
	  -EINVAL, "line 5: ",
	  "the conv state's channels (128 x 2147483648 and more) do not fit 32 bits" },
	{ "layers = 2\nfoo = 1\n", -EINVAL, "line 2: ", "unknown key 'foo'" },
	{ LLAMA "num_blocks = 12x\nblock_tokens = 16\n", -EINVAL, "line 2: ",
	  "bad number '12x'" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 0x\n", -EINVAL, "line 3: ",
	  "bad number" },
	{ LLAMA "block_tokens = 16\nnum_blocks = -1\n", -EINVAL, "line 3: ",
	  "bad number" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 4294967296\n", -EINVAL,
	  "line 3: ", "out of range" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 99999999999999999999\n",
	  -EINVAL, "line 3: ", "out of range" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 4K\n", -EINVAL, "line 3: ",
	  "bad number '4K'" },
	{ LLAMA "layers =\nblock_tokens = 16\n", -EINVAL, "line 2: ",
	  "missing value for 'layers'" },
	{ LLAMA "layers = \t # none\n", -EINVAL, "line 2: ",
	  "missing value for 'layers'" },
	{ LLAMA "layers\n", -EINVAL, "line 2: ", "expected key = value" },
	{ LLAMA "= 3\n", -EINVAL, "line 2: ", "unknown key ''" },
	{ LLAMA "layers = 2 3\n", -EINVAL, "line 2: ", "text after the value" },
	{ LLAMA "layers = 2\nlayers = 3\n", -EINVAL, "line 3: ",
	  "duplicate key 'layers' (first on line 2)" },
	{ "block_tokens = 16\nmodel = llama-9\nnum_blocks = 8\n", -ENOENT,
	  "line 2: ", "unknown preset 'llama-9'" },
	{ "model = a-preset-name-that-is-far-too-long-for-any-buffer-at-all\n"
	  "block_tokens = 16\nnum_blocks = 8\n",
	  -ENOENT, "line 1: ", "unknown preset 'a-preset-name-that-is-far-too-long-for-" },
	{ LLAMA "kv_layout = nhd\nblock_tokens = 16\nnum_blocks = 8\n",
	  -EINVAL, "line 2: ", "unknown kv_layout 'nhd'" },
	{ LLAMA "state_kind = mamba3\nblock_tokens = 16\nnum_blocks = 8\n",
	  -EINVAL, "line 2: ", "unknown state_kind 'mamba3'" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 8\nconv_layout = dss\n",
	  -EINVAL, "line 4: ", "unknown conv_layout 'dss'" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 8\nengine_id = 0x1g\n",
	  -EINVAL, "line 4: ", "bad number '0x1g' for 'engine_id'" },
	{ "model = nemotron-h-8b\nconv_kernel = 1\nblock_tokens = 16\n"
	  "num_blocks = 64\n",
	  -EINVAL, "line 2: ",
	  "conv_kernel 1: a conv state needs a kernel of at least 2" },
	{ LLAMA "num_blocks = 8\n", -EINVAL, "line 2: ",
	  "missing key 'block_tokens'" },
	{ LLAMA "block_tokens = 8\n\n# end\n", -EINVAL, "line 4: ",
	  "missing key 'num_blocks'" },
	{ "kv_heads = 8\nhead_dim = 128\ndtype_bytes = 2\nblock_tokens = 16\n"
	  "num_blocks = 8\n",
	  -EINVAL, "line 5: ", "missing key 'layers' (no model preset)" },
	{ "layers = 2\nhead_dim = 128\ndtype_bytes = 2\nblock_tokens = 16\n"
	  "num_blocks = 8\n",
	  -EINVAL, "line 5: ", "'kv_heads' and 'head_dim', or 'mla_latent'" },
	/* every missing key at once */
	{ "head_dim = 128\n", -EINVAL, "line 1: ",
	  "missing keys 'dtype_bytes'; 'layers'; 'kv_heads' and 'head_dim', or 'mla_latent'; 'block_tokens'; 'num_blocks' (no model preset)" },
	{ LLAMA "tp_size = 2\n", -EINVAL, "line 2: ",
	  "missing keys 'block_tokens'; 'num_blocks'" },
	{ LLAMA "tp_size = 3\nblock_tokens = 16\nnum_blocks = 8\n", -EINVAL,
	  "line 2: ", "TP 3 does not divide and is not divided by 8 KV heads; they allow TP 1, 2, 4, 8, 16, 24, ..." },
	{ LLAMA "block_tokens = 16\nkernel_block_tokens = 5\nnum_blocks = 8\n",
	  -EINVAL, "line 3: ", "kernel block 5 does not divide the block size 16" },
	{ LLAMA "block_tokens = 16\nnum_blocks = 8\nengine tp_size=1\n",
	  -EINVAL, "line 4: ", "'engine' line in a model-form spec" },
	{ "", -EINVAL, "line 1: ", "empty spec" },
	{ "# nothing\n\n   \n", -EINVAL, "line 3: ", "empty spec" },
	{ LLAMA "layers = 2\x01\n", -EINVAL, "line 2: ",
	  "control character 0x01" },
	{ LLAMA "layers = 2\x7f\n", -EINVAL, "line 2: ",
	  "control character 0x7f" },
	/* explicit form */
	{ "group kind=full block_tokens=16\n", -EINVAL, "line 1: ",
	  "'group' before the 'engine' line" },
	{ "model llama-3.1-8b\n", -EINVAL, "line 1: ",
	  "expected engine, group, region, view or field, not 'model'" },
	{ ENGINE ENGINE, -EINVAL, "line 2: ", "a second 'engine' line" },
	{ "engine tp_size=2 tp_rank=2\n", -EINVAL, "line 1: ",
	  "engine rejected" },
	{ "engine tp_size=0x10000\n", -EINVAL, "line 1: ", "engine rejected" },
	{ "engine tp_size=2 tp_rank=2 tp_size=4\n", -EINVAL, "line 1: ",
	  "duplicate key 'tp_size'" },
	{ ENGINE "Engine\n", -EINVAL, "line 2: ", "expected engine" },
	{ ENGINE "regoin size=1\n", -EINVAL, "line 2: ",
	  "expected engine, group, region, view or field, not 'regoin'" },
	{ ENGINE "layers = 2\n", -EINVAL, "line 2: ",
	  "expected engine, group, region, view or field, not 'layers'" },
	{ "engine tp_size=1025\n", -EINVAL, "line 1: ",
	  "engine rejected: tp_size must be 1..1024 and tp_rank below it" },
	{ "engine tp_size=65535 tp_rank=1\n", -EINVAL, "line 1: ",
	  "engine rejected: tp_size must be 1..1024" },
	{ ENGINE "group kind=full block_tokens=16 foo=1\n", -EINVAL,
	  "line 2: ", "unknown key 'foo' for group" },
	{ ENGINE "group kind=full block_tokens\n", -EINVAL, "line 2: ",
	  "expected '=' after 'block_tokens'" },
	{ ENGINE "group kind=full =16\n", -EINVAL, "line 2: ",
	  "missing key before '='" },
	{ ENGINE "group kind= block_tokens=16\n", -EINVAL, "line 2: ",
	  "missing value for 'kind'" },
	{ ENGINE "group kind=fuller block_tokens=16\n", -EINVAL, "line 2: ",
	  "unknown kind 'fuller'" },
	{ ENGINE "group kind=full\n", -EINVAL, "line 2: ",
	  "missing key 'block_tokens'" },
	{ ENGINE "group block_tokens=16\n", -EINVAL, "line 2: ",
	  "missing key 'kind'" },
	{ ENGINE "group kind=state block_tokens=16\n", -EINVAL, "line 2: ",
	  "group rejected" },
	{ ENGINE "region size=0\n", -EINVAL, "line 2: ", "region rejected" },
	{ ENGINE "region size=16E\n", -EINVAL, "line 2: ",
	  "bad number '16E' for 'size'" },
	{ ENGINE "region size=16777216T\n", -EINVAL, "line 2: ",
	  "bad number" },
	{ ENGINE "region size=17179869184G\n", -EINVAL, "line 2: ",
	  "out of range" },
	{ GROUP "region size=1K\n"
		"view group=0 region=1 layer=0 num_blocks=1 stride=1K\n",
	  -EINVAL, "line 4: ", "view: no region 1 (1 defined)" },
	{ GROUP "region size=1K\n"
		"view group=1 region=0 layer=0 num_blocks=1 stride=1K\n",
	  -EINVAL, "line 4: ", "view: no group 1 (1 defined)" },
	{ GROUP "region size=1K\n"
		"view group=0 region=0 layer=0 num_blocks=2 stride=1K\n",
	  -EINVAL, "line 4: ", "view rejected" },
	{ GROUP "region size=1K\nview group=0 region=0 layer=0 num_blocks=1\n",
	  -EINVAL, "line 4: ", "missing key 'stride'" },
	{ VIEW "field view=0 kind=k elem=2 dims=token:8:256,dim:128:2\n",
	  -EINVAL, "line 5: ",
	  "field rejected: the token dims do not multiply to the group's block_tokens" },
	{ VIEW "field view=0 kind=k elem=2 dims=tok:16:256,dim:128:2\n",
	  -EINVAL, "line 5: ", "unknown axis 'tok'" },
	{ VIEW "field view=0 kind=k elem=2 dims=token:16\n", -EINVAL,
	  "line 5: ", "bad dim 'token:16'" },
	{ VIEW "field view=0 kind=k elem=2 dims=token:16:2:3\n", -EINVAL,
	  "line 5: ", "bad dim" },
	{ VIEW "field view=0 kind=k elem=2 dims=token:16:256,\n", -EINVAL,
	  "line 5: ", "bad dim ''" },
	{ VIEW "field view=0 kind=k elem=2 dims=token:x:256\n", -EINVAL,
	  "line 5: ", "bad number in dim 'token:x:256'" },
	{ VIEW "field view=0 kind=k elem=2 "
	       "dims=token:16:2,aux:1:1,aux:1:1,aux:1:1,aux:1:1,aux:1:1,aux:1:1\n",
	  -EINVAL, "line 5: ", "more than 6 dims" },
	{ VIEW "field view=0 kind=k elem=2 shard=0 dims=token:16:2\n", -EINVAL,
	  "line 5: ", "'shard' and 'total' go together" },
	{ VIEW "field view=0 kind=k elem=2 shard=1 total=8 "
	       "dims=token:16:256,head:4:2\n",
	  -EINVAL, "line 5: ", "not this rank's shard length" },
	{ VIEW "field view=0 kind=k elem=2 shard=2 total=8 "
	       "dims=token:16:256,head:8:2\n",
	  -EINVAL, "line 5: ", "shard names no dim" },
	{ VIEW "field view=0 kind=k elem=2 shard=255 total=8 "
	       "dims=token:16:256,head:8:2\n",
	  -EINVAL, "line 5: ", "shard names no dim" },
	{ VIEW "field view=1 kind=k elem=2 dims=token:16:2\n", -EINVAL,
	  "line 5: ", "field: no view 1 (1 defined)" },
	{ VIEW "field view=0 kind=kv elem=2 dims=token:16:2\n", -EINVAL,
	  "line 5: ", "unknown kind 'kv'" },
	{ VIEW "field view=0 kind=k dims=token:16:2\n", -EINVAL, "line 5: ",
	  "missing key 'elem'" },
	{ VIEW "field view=0 kind=k elem=2\n", -EINVAL, "line 5: ",
	  "missing key 'dims'" },
	{ VIEW "field view=0 kind=k elem=2 offset=16K dims=token:16:2\n",
	  -EINVAL, "line 5: ", "field rejected" },
	{ VIEW "field view=0 kind=k elem=2 dims=token:16:2\n"
	       "field view=0 kind=k elem=2 offset=64 dims=token:16:2\n",
	  -EINVAL, "line 6: ", "field rejected" },
	{ VIEW "# no field\n", -EINVAL, "line 5: ",
	  "the spec defines no field" },
	{ GROUP "\x1b[0m\n", -EINVAL, "line 3: ", "control character 0x1b" },
};

static void test_rejections(void **state)
{
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		kvp_layout *out = SENTINEL;
		char msg[256];
		int err;

		memset(msg, 0, sizeof(msg));
		err = kvp_layout_parse(bad[i].text, strlen(bad[i].text), &out,
				       msg, sizeof(msg));
		if (err != bad[i].err || out != SENTINEL ||
		    strncmp(msg, bad[i].line, strlen(bad[i].line)) ||
		    !strstr(msg, bad[i].says) || strchr(msg, '\n')) {
			fprintf(stderr,
				"case %zu: err %d (want %d), msg '%s' (want '%s...%s')\n--- spec ---\n%s\n",
				i, err, bad[i].err, msg, bad[i].line,
				bad[i].says, bad[i].text);
			fail();
		}
		/* The same without a message buffer, and with a tiny one. */
		assert_int_equal(kvp_layout_parse(bad[i].text,
						  strlen(bad[i].text), &out,
						  NULL, 0),
				 bad[i].err);
		memset(msg, 'x', sizeof(msg));
		assert_int_equal(kvp_layout_parse(bad[i].text,
						  strlen(bad[i].text), &out,
						  msg, 5),
				 bad[i].err);
		assert_int_equal(msg[4], 0);
		assert_int_equal(msg[5], 'x');
		assert_ptr_equal(out, SENTINEL);
	}
}

/* A field line without dims= did pointer arithmetic on NULL (undefined;
 * clang's UBSan stops there): refused with its line, nothing returned. */
static void test_field_without_dims(void **state)
{
	static const char *const text[] = {
		VIEW "field view=0 kind=k elem=2\n",
		VIEW "field view=0 kind=k elem=2 shard=0 total=8 offset=64\n",
		VIEW "field view=0 kind=k elem=2 dims=token:16:2\n"
		     "\n# comment\nfield view=0 kind=v elem=2\n",
	};
	static const char *const want[] = {
		"line 5: missing key 'dims'",
		"line 5: missing key 'dims'",
		"line 8: missing key 'dims'",
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(text) / sizeof(text[0]); i++) {
		kvp_layout *out = SENTINEL;
		char msg[128];

		memset(msg, 'x', sizeof(msg));
		assert_int_equal(kvp_layout_parse(text[i], strlen(text[i]),
						  &out, msg, sizeof(msg)),
				 -EINVAL);
		assert_string_equal(msg, want[i]);
		assert_ptr_equal(out, SENTINEL);
	}
}

/* A field whose shard the layout refuses: the numbers, exactly. */
static void test_shard_numbers(void **state)
{
	static const struct {
		const char *text, *want;
	} c[] = {
		{ VIEW "field view=0 kind=k elem=2 shard=1 total=8 "
		       "dims=token:16:256,head:4:2\n",
		  "line 5: field rejected: the sharded dim's size 4 is not this rank's shard length 8 (total 8 over tp_size 1, rank 0)" },
		{ "engine tp_size=4 tp_rank=3\n"
		  "group kind=full block_tokens=16\nregion size=64K\n"
		  "view group=0 region=0 layer=0 num_blocks=4 stride=16K\n"
		  "field view=0 kind=k elem=2 shard=1 total=8 "
		  "dims=token:16:256,head:4:2\n",
		  "line 5: field rejected: the sharded dim's size 4 is not this rank's shard length 2 (total 8 over tp_size 4, rank 3)" },
		{ "engine tp_size=4\ngroup kind=full block_tokens=16\n"
		  "region size=64K\n"
		  "view group=0 region=0 layer=0 num_blocks=4 stride=16K\n"
		  "field view=0 kind=k elem=2 shard=1 total=6 "
		  "dims=token:16:256,head:2:2\n",
		  "line 5: field rejected: total 6 is neither a multiple nor a divisor of tp_size 4" },
		{ VIEW "field view=0 kind=k elem=2 shard=1 total=0 "
		       "dims=token:16:256,head:4:2\n",
		  "line 5: field rejected: total must be at least 1" },
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		kvp_layout *out = SENTINEL;
		char msg[256];

		memset(msg, 'x', sizeof(msg));
		assert_int_equal(kvp_layout_parse(c[i].text, strlen(c[i].text),
						  &out, msg, sizeof(msg)),
				 -EINVAL);
		assert_string_equal(msg, c[i].want);
		assert_ptr_equal(out, SENTINEL);
	}
}

/* A model-form spec the builder refuses: the exact message, on the line of
 * the key to blame (the preset's line when the number is the preset's, the
 * last line when no key is). */
static void test_build_reasons(void **state)
{
	static const struct {
		const char *text, *want;
		int err;
	} c[] = {
		{ "model = foo\nblock_tokens = 16\nnum_blocks = 8\n",
		  "line 1: unknown preset 'foo'", -ENOENT },
		{ LLAMA "tp_size = 3\nblock_tokens = 16\nnum_blocks = 8\n",
		  "line 2: TP 3 does not divide and is not divided by 8 KV heads; they allow TP 1, 2, 4, 8, 16, 24, ...",
		  -EINVAL },
		{ LLAMA "block_tokens = 16\nkernel_block_tokens = 5\n"
			"num_blocks = 8\n",
		  "line 3: kernel block 5 does not divide the block size 16",
		  -EINVAL },
		{ LLAMA "block_tokens = 16\nnum_blocks = 8\nlayers = 0\n",
		  "line 4: the model has no layers (layers and state_layers are 0)",
		  -EINVAL },
		{ LLAMA "block_tokens = 0\nnum_blocks = 8\n",
		  "line 2: block size must be at least 1 token", -EINVAL },
		{ LLAMA "tp_size = 0\nblock_tokens = 16\nnum_blocks = 8\n",
		  "line 2: TP size must be at least 1", -EINVAL },
		{ LLAMA "tp_size = 2\ntp_rank = 2\nblock_tokens = 16\n"
			"num_blocks = 8\n",
		  "line 3: rank 2 is not below the TP size 2", -EINVAL },
		/* the rule is the TP size's: its line */
		{ "model = qwen3-next-80b-a3b\ntp_size = 64\nblock_tokens = 16\n"
		  "num_blocks = 64\nssm_groups = 12\n",
		  "line 2: TP 64 does not divide and is not divided by 12 key heads (ssm_groups); they allow TP 1, 2, 3, 4, 6, 12, 24, 36, ...",
		  -EINVAL },
		{ "model = nemotron-h-8b\nblock_tokens = 16\nnum_blocks = 64\n"
		  "sliding_layers = 2\n",
		  "line 4: a model with state layers cannot have sliding layers (2)",
		  -EINVAL },
		{ "model = nemotron-h-8b\nblock_tokens = 16\nnum_blocks = 1\n",
		  "line 3: num_blocks 1 is below the 33 attention pages one state page spans",
		  -EINVAL },
	};
	size_t i;

	(void)state;
	for (i = 0; i < sizeof(c) / sizeof(c[0]); i++) {
		kvp_layout *out = SENTINEL;
		char msg[160];

		memset(msg, 'x', sizeof(msg));
		assert_int_equal(kvp_layout_parse(c[i].text, strlen(c[i].text),
						  &out, msg, sizeof(msg)),
				 c[i].err);
		assert_string_equal(msg, c[i].want);
		assert_ptr_equal(out, SENTINEL);
	}
}

static void test_bad_arguments(void **state)
{
	kvp_layout *out = SENTINEL;
	char msg[64] = "unchanged";

	(void)state;
	assert_int_equal(kvp_layout_parse(NULL, 4, &out, msg, sizeof(msg)),
			 -EINVAL);
	assert_int_equal(kvp_layout_parse("engine", 6, NULL, msg, sizeof(msg)),
			 -EINVAL);
	assert_int_equal(kvp_layout_parse(NULL, 0, &out, msg, sizeof(msg)),
			 -EINVAL);
	assert_string_equal(msg, "line 1: empty spec");
	assert_ptr_equal(out, SENTINEL);
}

/* ---- buffers without a terminator ------------------------------------- */

static const char model_spec[] =
	"model = llama-3.1-8b\nlayers = 2\nblock_tokens = 16\nnum_blocks = 64";

static void test_unterminated(void **state)
{
	size_t n = sizeof(model_spec) - 1, hn = sizeof(hybrid) - 1;
	char *buf = malloc(n + 8);
	struct kvp_view_desc v;
	kvp_layout *l = NULL, *out = SENTINEL;
	char msg[128];

	(void)state;
	assert_non_null(buf);
	/* Exactly len bytes, no NUL anywhere (ASan sees any overrun). */
	memcpy(buf, model_spec, n);
	assert_int_equal(kvp_layout_parse(buf, n, &l, msg, sizeof(msg)), 0);
	assert_int_equal(kvp_layout_get_view(l, 0, &v), 0);
	assert_int_equal(v.num_blocks, 64);
	kvp_layout_destroy(l);
	/* Digits past len are not part of the number. */
	memcpy(buf + n, "99", 2);
	assert_int_equal(kvp_layout_parse(buf, n, &l, msg, sizeof(msg)), 0);
	assert_int_equal(kvp_layout_get_view(l, 0, &v), 0);
	assert_int_equal(v.num_blocks, 64);
	kvp_layout_destroy(l);
	/* Cut inside the number and inside a key. */
	assert_int_equal(kvp_layout_parse(buf, n - 1, &l, msg, sizeof(msg)), 0);
	assert_int_equal(kvp_layout_get_view(l, 0, &v), 0);
	assert_int_equal(v.num_blocks, 6);
	kvp_layout_destroy(l);
	assert_int_equal(kvp_layout_parse(buf, n - 10, &out, msg, sizeof(msg)),
			 -EINVAL);
	assert_string_equal(msg, "line 4: expected key = value, not 'num_b'");
	assert_ptr_equal(out, SENTINEL);
	free(buf);

	/* The explicit form, exactly sized, then cut before its fields. */
	buf = malloc(hn);
	assert_non_null(buf);
	memcpy(buf, hybrid, hn);
	assert_int_equal(kvp_layout_parse(buf, hn, &l, msg, sizeof(msg)), 0);
	kvp_layout_destroy(l);
	assert_int_equal(kvp_layout_parse(buf, strstr(hybrid, "field") - hybrid,
					  &out, msg, sizeof(msg)),
			 -EINVAL);
	assert_string_equal(msg, "line 6: the spec defines no field");
	assert_ptr_equal(out, SENTINEL);
	free(buf);

	/* A NUL inside the buffer is a control character, not an end. */
	assert_int_equal(kvp_layout_parse("layers = 2\0\nfoo", 15, &out, msg,
					  sizeof(msg)),
			 -EINVAL);
	assert_string_equal(msg, "line 1: control character 0x00");
	assert_ptr_equal(out, SENTINEL);
}

int main(void)
{
	const struct CMUnitTest t[] = {
		cmocka_unit_test(test_model_preset),
		cmocka_unit_test(test_model_overrides),
		cmocka_unit_test(test_model_hybrid),
		cmocka_unit_test(test_explicit_reproduces_build),
		cmocka_unit_test(test_explicit_roundtrip_presets),
		cmocka_unit_test(test_explicit_hybrid),
		cmocka_unit_test(test_numbers),
		cmocka_unit_test(test_rejections),
		cmocka_unit_test(test_field_without_dims),
		cmocka_unit_test(test_shard_numbers),
		cmocka_unit_test(test_build_reasons),
		cmocka_unit_test(test_bad_arguments),
		cmocka_unit_test(test_unterminated),
	};

	return cmocka_run_group_tests(t, NULL, NULL);
}
