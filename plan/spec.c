// SPDX-License-Identifier: MIT
/*
 * Layout spec files: a text form of one engine rank's layout.
 *
 * Line based. '#' starts a comment; blank lines are ignored; a value is one
 * word (no blanks); keys are lower case, names (presets, kinds, axes,
 * layouts) are matched without regard to case. Integers are decimal or 0x
 * hex; sizes, offsets and strides may end in K, M or G (binary units).
 * The first line that is not blank decides the form:
 *
 * Model form, `key = value` (or `key=value`) lines in any order:
 *   model = <preset>     optional; the model keys below override it
 *   model keys (struct kvp_model): layers, kv_heads, head_dim, dtype_bytes,
 *   mla_latent, sliding_layers, state_kind (none, mamba2 or gdn),
 *   state_layers, conv_kernel, ssm_heads, ssm_head_dim, ssm_state,
 *   ssm_groups, state_dtype_bytes
 *   engine keys (struct kvp_engine_desc): engine_id (0), tp_size (1),
 *   tp_rank (0), block_tokens, kernel_block_tokens (0: block_tokens),
 *   num_blocks, kv_layout (flash_nhd, flash_hnd, flashinfer or packed;
 *   flash_hnd, as the tools' and vLLM's layout for disaggregated serving
 *   with TP mismatches; tools/lib/defaults.h), conv_layout (ds or sd; ds)
 * The layout is kvp_layout_build()'s. block_tokens and num_blocks are
 * required; without a preset so are dtype_bytes, layers (or state_layers)
 * and either mla_latent or kv_heads and head_dim. layers + state_layers is
 * at most KVP_MAX_LAYERS (4096), tp_size at most KVP_MAX_TP_SIZE (1024).
 *
 * Explicit form, one builder call per line, ids counting from 0 in order:
 *   engine tp_size=N tp_rank=R engine_id=E      first, once (1, 0, 0)
 *   group kind=full|sliding|mla|state block_tokens=N
 *   region size=BYTES
 *   view group=G region=R layer=L num_blocks=N offset=O stride=S
 *   field view=V kind=K elem=E offset=O [shard=DIM total=T]
 *         dims=axis:size:stride,axis:size:stride,...
 * Field kinds: k v latent conv_x conv_b conv_c ssm conv_q conv_k conv_v.
 * Axes: token head dim channel state aux, outermost first. offset defaults
 * to 0; `shard` is an index into dims. block_tokens may be left out of a
 * state group.
 *
 * The parser works on (pointer, length) pairs only and never reads past
 * text[len]: the buffer need not be NUL-terminated.
 */
#include <errno.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "internal.h"

#define MAX_PAIRS 8
#define KVP_STR_(x) #x
#define KVP_STR(x) KVP_STR_(x)
#define TOK_SHOW 40 /* characters of a word quoted in a message */

struct tok {
	const char *p;
	size_t n;
};

struct parser {
	const char *text;
	size_t len, pos;
	uint32_t line; /* current line, from 1 */
	char *msg;
	size_t msglen;
};

/* Writes "line N: <fmt>" into the caller's message buffer; returns err. */
__attribute__((format(printf, 3, 4))) static int fail(struct parser *ps,
						      int err, const char *fmt,
						      ...)
{
	char buf[320];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	kvp__msg(ps->msg, ps->msglen, "line %u: %s", ps->line, buf);
	return err;
}

static int show_len(const struct tok *t)
{
	return t->n > TOK_SHOW ? TOK_SHOW : (int)t->n;
}

static int is_blank(char c)
{
	return c == ' ' || c == '\t' || c == '\r';
}

static int tok_is(const struct tok *t, const char *s)
{
	return t->n == strlen(s) && !memcmp(t->p, s, t->n);
}

static int tok_is_nocase(const struct tok *t, const char *s)
{
	return t->n == strlen(s) && !strncasecmp(t->p, s, t->n);
}

/* Index of `t` in names[n] (case-insensitive), or -1. */
static int lookup(const struct tok *t, const char *const *names, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (names[i] && tok_is_nocase(t, names[i]))
			return (int)i;
	return -1;
}

/*
 * Advances to the next line holding something, stripped of its comment and
 * of surrounding blanks. Returns 1 with [*p, *e), 0 at the end of the text,
 * or a negative errno for a control character.
 */
static int next_line(struct parser *ps, const char **p, const char **e)
{
	while (ps->pos < ps->len) {
		const char *s = ps->text + ps->pos, *end;
		const char *nl = memchr(s, '\n', ps->len - ps->pos);
		const char *hash, *c;

		end = nl ? nl : ps->text + ps->len;
		ps->pos = (size_t)(end - ps->text) + (nl ? 1 : 0);
		ps->line++;
		for (c = s; c < end; c++)
			if (((unsigned char)*c < 0x20 && !is_blank(*c) &&
			     *c != '\n') ||
			    *c == 0x7f)
				return fail(ps, -EINVAL,
					    "control character 0x%02x",
					    (unsigned char)*c);
		hash = memchr(s, '#', (size_t)(end - s));
		if (hash)
			end = hash;
		while (s < end && is_blank(*s))
			s++;
		while (end > s && is_blank(end[-1]))
			end--;
		if (s < end) {
			*p = s;
			*e = end;
			return 1;
		}
	}
	return 0;
}

static const char *skip_blanks(const char *p, const char *e)
{
	while (p < e && is_blank(*p))
		p++;
	return p;
}

/* A word: a run of characters other than blanks and '='. */
static const char *word(const char *p, const char *e, struct tok *t)
{
	t->p = p;
	while (p < e && !is_blank(*p) && *p != '=')
		p++;
	t->n = (size_t)(p - t->p);
	return p;
}

/* Parses `= value` after a key; the value is a run of non-blanks. */
static int value(struct parser *ps, const struct tok *key, const char **pp,
		 const char *e, struct tok *v)
{
	const char *p = skip_blanks(*pp, e);

	if (p == e || *p != '=')
		return fail(ps, -EINVAL, "expected '=' after '%.*s'",
			    show_len(key), key->p);
	p = skip_blanks(p + 1, e);
	v->p = p;
	while (p < e && !is_blank(*p))
		p++;
	v->n = (size_t)(p - v->p);
	if (!v->n || memchr(v->p, '=', v->n))
		return fail(ps, -EINVAL, "missing value for '%.*s'",
			    show_len(key), key->p);
	*pp = p;
	return 0;
}

/*
 * Collects the `key=value` pairs of a directive line into vals[], indexed
 * like keys[] (unset values have p == NULL). Rejects unknown and repeated
 * keys.
 */
static int pairs(struct parser *ps, const char *p, const char *e,
		 const char *what, const char *const *keys, uint32_t nkeys,
		 struct tok *vals)
{
	uint32_t i;
	int err;

	for (i = 0; i < nkeys; i++)
		vals[i].p = NULL;
	for (;;) {
		struct tok k, v;

		p = skip_blanks(p, e);
		if (p == e)
			return 0;
		p = word(p, e, &k);
		if (!k.n)
			return fail(ps, -EINVAL, "missing key before '='");
		err = value(ps, &k, &p, e, &v);
		if (err)
			return err;
		for (i = 0; i < nkeys && !tok_is(&k, keys[i]); i++)
			;
		if (i == nkeys)
			return fail(ps, -EINVAL, "unknown key '%.*s' for %s",
				    show_len(&k), k.p, what);
		if (vals[i].p)
			return fail(ps, -EINVAL, "duplicate key '%s'", keys[i]);
		vals[i] = v;
	}
}

/*
 * Parses an unsigned integer: decimal or 0x hex, and with `sizes` a K, M or
 * G suffix (binary). Returns 0, or -EINVAL (bad syntax), -ERANGE (above
 * `max`); *out is set on success only.
 */
static int number(const struct tok *t, int sizes, uint64_t max, uint64_t *out)
{
	const char *p = t->p, *e = t->p + t->n;
	unsigned int base = 10, shift = 0;
	uint64_t v = 0;
	int digits = 0;

	if (e - p > 2 && p[0] == '0' && (p[1] == 'x' || p[1] == 'X')) {
		base = 16;
		p += 2;
	}
	/* K, M and G are no hex digits: a suffix is never ambiguous. */
	if (sizes && p < e) {
		char c = (char)(e[-1] | 0x20);

		shift = c == 'k' ? 10 : c == 'm' ? 20 : c == 'g' ? 30 : 0;
		if (shift)
			e--;
	}
	for (; p < e; p++, digits++) {
		unsigned int d;

		if (*p >= '0' && *p <= '9')
			d = (unsigned int)(*p - '0');
		else if (base == 16 && *p >= 'a' && *p <= 'f')
			d = (unsigned int)(*p - 'a' + 10);
		else if (base == 16 && *p >= 'A' && *p <= 'F')
			d = (unsigned int)(*p - 'A' + 10);
		else
			return -EINVAL;
		if (__builtin_mul_overflow(v, base, &v) ||
		    __builtin_add_overflow(v, d, &v))
			return -ERANGE;
	}
	if (!digits)
		return -EINVAL;
	if (shift && v > (UINT64_MAX >> shift))
		return -ERANGE;
	v <<= shift;
	if (v > max)
		return -ERANGE;
	*out = v;
	return 0;
}

/* Converts the value of key `key`; `def` when unset, or an error when
 * unset and `def` is NULL. */
static int num_val(struct parser *ps, const struct tok *v, const char *key,
		   int sizes, uint64_t max, const uint64_t *def, uint64_t *out)
{
	int err;

	if (!v->p) {
		if (!def)
			return fail(ps, -EINVAL, "missing key '%s'", key);
		*out = *def;
		return 0;
	}
	err = number(v, sizes, max, out);
	if (err == -ERANGE)
		return fail(ps, -EINVAL, "value '%.*s' of '%s' out of range",
			    show_len(v), v->p, key);
	if (err)
		return fail(ps, -EINVAL, "bad number '%.*s' for '%s'",
			    show_len(v), v->p, key);
	return 0;
}

static int u32_val(struct parser *ps, const struct tok *v, const char *key,
		   const uint64_t *def, uint32_t *out)
{
	uint64_t x;
	int err = num_val(ps, v, key, 0, UINT32_MAX, def, &x);

	if (!err)
		*out = (uint32_t)x;
	return err;
}

static int name_val(struct parser *ps, const struct tok *v, const char *key,
		    const char *const *names, uint32_t n, uint32_t *out)
{
	int i;

	if (!v->p)
		return fail(ps, -EINVAL, "missing key '%s'", key);
	i = lookup(v, names, n);
	if (i < 0)
		return fail(ps, -EINVAL, "unknown %s '%.*s'", key, show_len(v),
			    v->p);
	*out = (uint32_t)i;
	return 0;
}

static const char *const group_names[KVP_GROUP_KIND_COUNT] = {
	"full",
	"sliding",
	"mla",
	"state",
};

const char *kvp__group_name(uint32_t kind)
{
	return kind < KVP_GROUP_KIND_COUNT ? group_names[kind] : "?";
}

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

/* Explains a builder's error: -ENOMEM passes through, anything else is the
 * description's fault. */
static int rejected(struct parser *ps, int err, const char *what,
		    const char *why)
{
	if (err == -ENOMEM)
		return fail(ps, err, "out of memory adding %s", what);
	return fail(ps, -EINVAL, "%s rejected: %s", what, why);
}

/* ---- model form ------------------------------------------------------- */

static const char *const state_names[KVP_STATE_KIND_COUNT] = {
	"none",
	"mamba2",
	"gdn",
};

static const char *const conv_names[KVP_CONV_LAYOUT_COUNT] = {
	"ds",
	"sd",
};

enum { MT_PRESET, MT_U32, MT_U64, MT_NAME };

/* A model-form key: where its value goes (struct kvp_model when `engine`
 * is 0, struct kvp_engine_desc otherwise) and how it is read. */
struct mkey {
	const char *name;
	uint8_t type, engine;
	uint16_t off;
	const char *const *names;
	uint32_t nnames;
};

#define MODEL_U32(f) { #f, MT_U32, 0, offsetof(struct kvp_model, f), NULL, 0 }
#define ENGINE_U32(f)                                                        \
	{ #f, MT_U32, 1, offsetof(struct kvp_engine_desc, f), NULL, 0 }
#define NAMES(a) a, sizeof(a) / sizeof(a[0])

static const struct mkey mkeys[] = {
	{ "model", MT_PRESET, 0, 0, NULL, 0 },
	MODEL_U32(layers),
	MODEL_U32(kv_heads),
	MODEL_U32(head_dim),
	MODEL_U32(dtype_bytes),
	MODEL_U32(mla_latent),
	MODEL_U32(sliding_layers),
	{ "state_kind", MT_NAME, 0, offsetof(struct kvp_model, state_kind),
	  NAMES(state_names) },
	MODEL_U32(state_layers),
	MODEL_U32(conv_kernel),
	MODEL_U32(ssm_heads),
	MODEL_U32(ssm_head_dim),
	MODEL_U32(ssm_state),
	MODEL_U32(ssm_groups),
	MODEL_U32(state_dtype_bytes),
	{ "engine_id", MT_U64, 1, offsetof(struct kvp_engine_desc, engine_id),
	  NULL, 0 },
	ENGINE_U32(tp_size),
	ENGINE_U32(tp_rank),
	ENGINE_U32(block_tokens),
	ENGINE_U32(kernel_block_tokens),
	ENGINE_U32(num_blocks),
	{ "kv_layout", MT_NAME, 1, offsetof(struct kvp_engine_desc, kv_layout),
	  NAMES(layout_names) },
	{ "conv_layout", MT_NAME, 1,
	  offsetof(struct kvp_engine_desc, conv_layout), NAMES(conv_names) },
};

#undef MODEL_U32
#undef ENGINE_U32
#undef NAMES

#define NMKEYS (sizeof(mkeys) / sizeof(mkeys[0]))

struct model_spec {
	struct tok val[NMKEYS];
	uint32_t line[NMKEYS];
};

static int mkey_index(const char *name)
{
	uint32_t i;

	for (i = 0; i < NMKEYS; i++)
		if (!strcmp(mkeys[i].name, name))
			return (int)i;
	return -1;
}

static int mkey_set(const struct model_spec *s, const char *name)
{
	return s->val[mkey_index(name)].p != NULL;
}

/* Records one `key = value` line of the model form. */
static int model_line(struct parser *ps, struct model_spec *s, const char *p,
		      const char *e)
{
	struct tok k, v;
	uint32_t i;
	int err;

	p = word(p, e, &k);
	err = value(ps, &k, &p, e, &v);
	if (err)
		return err;
	if (skip_blanks(p, e) != e)
		return fail(ps, -EINVAL, "text after the value of '%.*s'",
			    show_len(&k), k.p);
	for (i = 0; i < NMKEYS && !tok_is(&k, mkeys[i].name); i++)
		;
	if (i == NMKEYS)
		return fail(ps, -EINVAL, "unknown key '%.*s'", show_len(&k),
			    k.p);
	if (s->val[i].p)
		return fail(ps, -EINVAL, "duplicate key '%s' (first on line %u)",
			    mkeys[i].name, s->line[i]);
	s->val[i] = v;
	s->line[i] = ps->line;
	return 0;
}

/* Stores the value of key i into the model or the engine. */
static int model_key(struct parser *ps, const struct tok *v,
		     const struct mkey *k, struct kvp_model *m,
		     struct kvp_engine_desc *e)
{
	char *base = k->engine ? (char *)e : (char *)m;
	uint64_t x;
	uint32_t u;
	int err;

	switch (k->type) {
	case MT_U64:
		err = num_val(ps, v, k->name, 0, UINT64_MAX, NULL, &x);
		if (!err)
			memcpy(base + k->off, &x, sizeof(x));
		return err;
	case MT_NAME:
		err = name_val(ps, v, k->name, k->names, k->nnames, &u);
		break;
	default:
		err = u32_val(ps, v, k->name, NULL, &u);
		break;
	}
	if (!err)
		memcpy(base + k->off, &u, sizeof(u));
	return err;
}

static int model_build(struct parser *ps, const struct model_spec *s,
		       kvp_layout **out)
{
	struct kvp_engine_desc e = { 0 };
	struct kvp_model m = { 0 };
	uint32_t end = ps->line, i, nmiss = 0, preset_keys;
	const char *key = NULL, *miss[5];
	char why[200] = "";
	int err;

	if (mkey_set(s, "model")) {
		const struct tok *t = &s->val[mkey_index("model")];
		char name[sizeof(m.name)];

		ps->line = s->line[mkey_index("model")];
		if (t->n >= sizeof(name))
			return fail(ps, -ENOENT, "unknown preset '%.*s'",
				    show_len(t), t->p);
		memcpy(name, t->p, t->n);
		name[t->n] = 0;
		if (kvp_model_preset(name, &m))
			return fail(ps, -ENOENT, "unknown preset '%s'",
				    name);
		ps->line = end;
	} else {
		strcpy(m.name, "custom");
	}
	/* Every missing key in one message. */
	if (!mkey_set(s, "model")) {
		if (!mkey_set(s, "dtype_bytes"))
			miss[nmiss++] = "'dtype_bytes'";
		if (!mkey_set(s, "layers") && !mkey_set(s, "state_layers"))
			miss[nmiss++] = "'layers'";
		if (!mkey_set(s, "mla_latent") &&
		    (!mkey_set(s, "kv_heads") || !mkey_set(s, "head_dim")))
			miss[nmiss++] = "'kv_heads' and 'head_dim', or 'mla_latent'";
	}
	preset_keys = nmiss;
	if (!mkey_set(s, "block_tokens"))
		miss[nmiss++] = "'block_tokens'";
	if (!mkey_set(s, "num_blocks"))
		miss[nmiss++] = "'num_blocks'";
	if (nmiss) {
		char list[200] = "";
		size_t k = 0;

		for (i = 0; i < nmiss && k < sizeof(list); i++)
			k += (size_t)snprintf(list + k, sizeof(list) - k,
					      "%s%s", i ? "; " : "", miss[i]);
		return fail(ps, -EINVAL, "missing key%s %s%s",
			    nmiss > 1 ? "s" : "", list,
			    preset_keys ? " (no model preset)" : "");
	}
	e.tp_size = 1;
	e.kv_layout = KVP_KV_FLASH_HND;
	e.conv_layout = KVP_CONV_DS;
	for (i = 1; i < NMKEYS; i++) {
		if (!s->val[i].p)
			continue;
		ps->line = s->line[i];
		err = model_key(ps, &s->val[i], &mkeys[i], &m, &e);
		if (err)
			return err;
	}
	if (m.layers > KVP_MAX_LAYERS ||
	    m.state_layers > KVP_MAX_LAYERS - m.layers) {
		ps->line = s->line[mkey_index(mkey_set(s, "layers") ?
						      "layers" :
						      "state_layers")];
		if (!ps->line)
			ps->line = end;
		return fail(ps, -EINVAL,
			    "layers + state_layers is %llu, above the limit of %u",
			    (unsigned long long)m.layers + m.state_layers,
			    KVP_MAX_LAYERS);
	}
	if (e.tp_size > KVP_MAX_TP_SIZE) {
		ps->line = s->line[mkey_index("tp_size")];
		return fail(ps, -EINVAL, "tp_size %u above the limit of %u",
			    e.tp_size, KVP_MAX_TP_SIZE);
	}
	ps->line = end;
	err = kvp__layout_build(&m, &e, out, why, sizeof(why), &key);
	if (err == -ENOMEM)
		return fail(ps, err, "out of memory building the layout");
	if (err) {
		/* The line of the key to blame; the preset's line when the
		 * number is the preset's; else the last line. */
		int k = key ? mkey_index(key) : -1;

		if (k >= 0 && s->val[k].p)
			ps->line = s->line[k];
		else if (k >= 0 && mkey_set(s, "model") && !mkeys[k].engine)
			ps->line = s->line[mkey_index("model")];
		return fail(ps, -EINVAL, "%s", why);
	}
	return 0;
}

/* ---- explicit form ---------------------------------------------------- */

enum { D_ENGINE, D_GROUP, D_REGION, D_VIEW, D_FIELD, D_COUNT };

static const char *const directives[D_COUNT] = {
	"engine", "group", "region", "view", "field",
};

static int do_engine(struct parser *ps, const struct tok *v, kvp_layout **l)
{
	struct kvp_layout_attr a = { 0 };
	const uint64_t one = 1, zero = 0;
	int err;

	err = u32_val(ps, &v[0], "tp_size", &one, &a.tp_size);
	err = err ?: u32_val(ps, &v[1], "tp_rank", &zero, &a.tp_rank);
	err = err ?: num_val(ps, &v[2], "engine_id", 0, UINT64_MAX, &zero,
			     &a.engine_id);
	if (err)
		return err;
	err = kvp_layout_create(&a, l);
	if (err)
		return rejected(ps, err, "engine",
				"tp_size must be 1.." KVP_STR(KVP_MAX_TP_SIZE)
				" and tp_rank below it");
	return 0;
}

static int do_group(struct parser *ps, const struct tok *v, kvp_layout *l)
{
	struct kvp_group_desc g = { 0 };
	const uint64_t zero = 0;
	int err;

	err = name_val(ps, &v[0], "kind", group_names, KVP_GROUP_KIND_COUNT,
		       &g.kind);
	if (err)
		return err;
	err = u32_val(ps, &v[1], "block_tokens",
		      g.kind == KVP_GROUP_STATE ? &zero : NULL,
		      &g.block_tokens);
	if (err)
		return err;
	err = kvp_layout_add_group(l, &g, NULL);
	if (err)
		return rejected(ps, err, "group",
				"block_tokens must be 0 for a state group and not 0 otherwise");
	return 0;
}

static int do_region(struct parser *ps, const struct tok *v, kvp_layout *l)
{
	uint64_t size;
	int err;

	err = num_val(ps, &v[0], "size", 1, UINT64_MAX, NULL, &size);
	if (err)
		return err;
	err = kvp_layout_add_region(l, size, NULL);
	if (err)
		return rejected(ps, err, "region", "size must not be 0");
	return 0;
}

static int do_view(struct parser *ps, const struct tok *v, kvp_layout *l)
{
	struct kvp_view_desc d = { 0 };
	struct kvp_layout_info li;
	const uint64_t zero = 0;
	int err;

	err = u32_val(ps, &v[0], "group", NULL, &d.group);
	err = err ?: u32_val(ps, &v[1], "region", NULL, &d.region);
	err = err ?: u32_val(ps, &v[2], "layer", NULL, &d.layer);
	err = err ?: u32_val(ps, &v[3], "num_blocks", NULL, &d.num_blocks);
	err = err ?: num_val(ps, &v[4], "offset", 1, UINT64_MAX, &zero,
			     &d.offset);
	err = err ?: num_val(ps, &v[5], "stride", 1, UINT64_MAX, NULL,
			     &d.stride);
	if (err)
		return err;
	kvp_layout_get_info(l, &li);
	if (d.group >= li.ngroups)
		return fail(ps, -EINVAL, "view: no group %u (%u defined)",
			    d.group, li.ngroups);
	if (d.region >= li.nregions)
		return fail(ps, -EINVAL, "view: no region %u (%u defined)",
			    d.region, li.nregions);
	err = kvp_layout_add_view(l, &d, NULL);
	if (err)
		return rejected(ps, err, "view",
				"num_blocks and stride must not be 0, stride must fit 32 bits, and every page must start inside the region");
	return 0;
}

/* Parses `axis:size:stride,...` into f->dim[]. */
static int dims_val(struct parser *ps, const struct tok *v,
		    struct kvp_field_desc *f)
{
	const char *p, *e;

	/* An unset value has p == NULL: no arithmetic on it. */
	if (!v->p)
		return fail(ps, -EINVAL, "missing key 'dims'");
	p = v->p;
	e = v->p + v->n;
	for (;;) {
		const char *c = memchr(p, ',', (size_t)(e - p));
		const char *end = c ? c : e, *q = p;
		struct tok part[3];
		uint64_t size, stride;
		int axis, k;

		for (k = 0; k < 3; k++) {
			const char *colon = memchr(q, ':', (size_t)(end - q));

			part[k].p = q;
			part[k].n = (size_t)((colon ? colon : end) - q);
			q = colon ? colon + 1 : end;
			if (!colon && k < 2)
				break;
		}
		if (k < 3 || (part[2].p + part[2].n) != end)
			return fail(ps, -EINVAL,
				    "bad dim '%.*s' (expected axis:size:stride)",
				    (int)((end - p) > TOK_SHOW ? TOK_SHOW :
								   end - p),
				    p);
		if (f->ndim == KVP_MAX_DIMS)
			return fail(ps, -EINVAL, "more than %u dims",
				    KVP_MAX_DIMS);
		axis = lookup(&part[0], axis_names, KVP_AXIS_COUNT);
		if (axis < 0)
			return fail(ps, -EINVAL, "unknown axis '%.*s'",
				    show_len(&part[0]), part[0].p);
		if (number(&part[1], 0, UINT32_MAX, &size) ||
		    number(&part[2], 1, UINT64_MAX, &stride))
			return fail(ps, -EINVAL, "bad number in dim '%.*s'",
				    (int)((end - p) > TOK_SHOW ? TOK_SHOW :
								   end - p),
				    p);
		f->dim[f->ndim].axis = (uint32_t)axis;
		f->dim[f->ndim].size = (uint32_t)size;
		f->dim[f->ndim].stride = stride;
		f->ndim++;
		if (!c)
			return 0;
		p = c + 1;
	}
}

/* Names the most likely reason kvp_layout_add_field() refuses a field,
 * with its numbers where it has some (in buf[n]). */
static const char *field_why(const kvp_layout *l, uint32_t view,
			     const struct kvp_field_desc *f, char *buf,
			     size_t n)
{
	struct kvp_layout_info li;
	struct kvp_view_desc vd;
	struct kvp_group_desc gd;
	uint64_t tokens = 1;
	uint32_t i, ntok = 0, start, len;

	kvp_layout_get_info(l, &li);
	if (kvp_layout_get_view(l, view, &vd) ||
	    kvp_layout_get_group(l, vd.group, &gd))
		return "no such view";
	for (i = 0; i < f->ndim; i++) {
		if (!f->dim[i].size)
			return "a dim has size 0";
		if (f->dim[i].axis == KVP_AXIS_TOKEN) {
			tokens *= f->dim[i].size;
			ntok++;
		}
	}
	if (gd.kind == KVP_GROUP_STATE && ntok)
		return "a state group's field has no token dim";
	if (gd.kind != KVP_GROUP_STATE && tokens != gd.block_tokens)
		return "the token dims do not multiply to the group's block_tokens";
	if (f->shard_dim != KVP_NO_SHARD) {
		if (f->shard_dim >= f->ndim)
			return "shard names no dim";
		if (!f->shard_total)
			return "total must be at least 1";
		if (kvp_shard_range(f->shard_total, li.tp_size, li.tp_rank,
				    &start, &len)) {
			snprintf(buf, n,
				 "total %u is neither a multiple nor a divisor of tp_size %u",
				 f->shard_total, li.tp_size);
			return buf;
		}
		if (f->dim[f->shard_dim].size != len) {
			snprintf(buf, n,
				 "the sharded dim's size %u is not this rank's shard length %u (total %u over tp_size %u, rank %u)",
				 f->dim[f->shard_dim].size, len, f->shard_total,
				 li.tp_size, li.tp_rank);
			return buf;
		}
	}
	return "elem 0, a sharded token or aux axis, a sharded axis in two dims, a kind already in this group and layer, or an extent past the region";
}

static int do_field(struct parser *ps, const struct tok *v, kvp_layout *l)
{
	struct kvp_field_desc f;
	struct kvp_layout_info li;
	const uint64_t zero = 0;
	uint32_t view;
	char why[160];
	int err;

	memset(&f, 0, sizeof(f));
	f.shard_dim = KVP_NO_SHARD;
	err = u32_val(ps, &v[0], "view", NULL, &view);
	err = err ?: name_val(ps, &v[1], "kind", field_names,
			      KVP_FIELD_KIND_COUNT, &f.kind);
	err = err ?: u32_val(ps, &v[2], "elem", NULL, &f.elem_size);
	err = err ?: num_val(ps, &v[3], "offset", 1, UINT64_MAX, &zero,
			     &f.offset);
	if (err)
		return err;
	if (!v[4].p != !v[5].p)
		return fail(ps, -EINVAL, "'shard' and 'total' go together");
	if (v[4].p) {
		err = u32_val(ps, &v[4], "shard", NULL, &f.shard_dim);
		err = err ?: u32_val(ps, &v[5], "total", NULL, &f.shard_total);
		if (err)
			return err;
		if (f.shard_dim == KVP_NO_SHARD)
			return fail(ps, -EINVAL, "field rejected: %s",
				    "shard names no dim");
	}
	err = dims_val(ps, &v[6], &f);
	if (err)
		return err;
	kvp_layout_get_info(l, &li);
	if (view >= li.nviews)
		return fail(ps, -EINVAL, "field: no view %u (%u defined)", view,
			    li.nviews);
	err = kvp_layout_add_field(l, view, &f);
	if (err)
		return rejected(ps, err, "field",
				field_why(l, view, &f, why, sizeof(why)));
	return 0;
}

static const char *const engine_keys[] = { "tp_size", "tp_rank",
					   "engine_id" };
static const char *const group_keys[] = { "kind", "block_tokens" };
static const char *const region_keys[] = { "size" };
static const char *const view_keys[] = { "group",      "region", "layer",
					 "num_blocks", "offset", "stride" };
static const char *const field_keys[] = { "view",  "kind",  "elem", "offset",
					  "shard", "total", "dims" };

static const struct {
	const char *const *keys;
	uint32_t n;
} directive_keys[D_COUNT] = {
#define KEYS(a) { a, sizeof(a) / sizeof(a[0]) }
	KEYS(engine_keys), KEYS(group_keys), KEYS(region_keys),
	KEYS(view_keys),   KEYS(field_keys),
#undef KEYS
};

/* Whether a line is `key = value` rather than a directive. */
static int is_pair_line(const char *p, const char *e)
{
	struct tok k;

	p = skip_blanks(word(p, e, &k), e);
	return p < e && *p == '=';
}

static int explicit_line(struct parser *ps, kvp_layout **l, const char *p,
			 const char *e)
{
	struct tok d, v[MAX_PAIRS];
	int k, err;

	p = word(p, e, &d);
	for (k = 0; k < D_COUNT && !tok_is(&d, directives[k]); k++)
		;
	if (k == D_COUNT || is_pair_line(d.p, e))
		return fail(ps, -EINVAL,
			    "expected engine, group, region, view or field, not '%.*s'",
			    show_len(&d), d.p);
	if (k == D_ENGINE && *l)
		return fail(ps, -EINVAL, "a second 'engine' line");
	if (k != D_ENGINE && !*l)
		return fail(ps, -EINVAL, "'%s' before the 'engine' line",
			    directives[k]);
	err = pairs(ps, p, e, directives[k], directive_keys[k].keys,
		    directive_keys[k].n, v);
	if (err)
		return err;
	switch (k) {
	case D_ENGINE:
		return do_engine(ps, v, l);
	case D_GROUP:
		return do_group(ps, v, *l);
	case D_REGION:
		return do_region(ps, v, *l);
	case D_VIEW:
		return do_view(ps, v, *l);
	default:
		return do_field(ps, v, *l);
	}
}

/* ---- entry ------------------------------------------------------------ */

int kvp_layout_parse(const char *text, size_t len, kvp_layout **out,
		     char *msg, size_t msglen)
{
	struct parser ps = { text, len, 0, 0, msg, msglen };
	struct model_spec ms;
	kvp_layout *l = NULL;
	const char *p = NULL, *e = NULL;
	int err, form = -1; /* 0 model, 1 explicit */
	struct kvp_layout_info li;

	if ((!text && len) || !out)
		return -EINVAL;
	memset(&ms, 0, sizeof(ms));
	while ((err = next_line(&ps, &p, &e)) > 0) {
		int pair = is_pair_line(p, e);

		if (form < 0)
			form = !pair;
		if (form == 0 && !pair) {
			struct tok w;

			word(p, e, &w);
			err = fail(&ps, -EINVAL,
				   lookup(&w, directives, D_COUNT) >= 0 ?
					   "'%.*s' line in a model-form spec (it starts with key = value)" :
					   "expected key = value, not '%.*s'",
				   show_len(&w), w.p);
		} else if (form == 0) {
			err = model_line(&ps, &ms, p, e);
		} else {
			err = explicit_line(&ps, &l, p, e);
		}
		if (err)
			goto err;
	}
	if (err)
		goto err;
	if (ps.line == 0)
		ps.line = 1;
	if (form < 0) {
		err = fail(&ps, -EINVAL, "empty spec");
	} else if (form == 0) {
		err = model_build(&ps, &ms, &l);
	} else {
		/* The explicit form starts with its engine line: l is set. */
		kvp_layout_get_info(l, &li);
		if (!li.nfields)
			err = fail(&ps, -EINVAL, "the spec defines no field");
	}
	if (err)
		goto err;
	*out = l;
	return 0;
err:
	kvp_layout_destroy(l);
	return err;
}
