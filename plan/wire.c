// SPDX-License-Identifier: MIT
/*
 * The metadata blob: one engine rank's layout, with region keys, on the wire.
 *
 * Every integer is little endian, written and read byte by byte, so the
 * format does not depend on the host or on struct padding. Offsets are in
 * bytes. Version 1:
 *
 * Header, 56 bytes:
 *    0  u8[4] magic        "KVPM"
 *    4  u16   version      KVP_META_VERSION (1), or KVP_META_VERSION_KEYS
 *                          (2) when a region has several keys
 *    6  u16   header_len   56; the records start here
 *    8  u32   total_len    bytes in the whole blob, header included
 *   12  u32   reserved     0
 *   16  u64   compat_hash  kvp_layout_compat_hash() of the layout
 *   24  u64   engine_id
 *   32  u32   tp_size
 *   36  u32   tp_rank
 *   40  u32   ngroups
 *   44  u32   nregions
 *   48  u32   nviews
 *   52  u32   nfields
 *
 * Then ngroups group records, nregions region records, nviews view records
 * and nfields field records, in that order and in id order, with no gaps:
 * total_len == header_len + 8 * ngroups + 24 * nregions + 32 * nviews +
 * 128 * nfields (version 2: plus the key table).
 *
 * Group, 8 bytes:
 *    0  u32   kind         enum kvp_group_kind
 *    4  u32   block_tokens
 *
 * Region, 24 bytes:
 *    0  u64   size         bytes
 *    8  u64   addr         address on the owner (0: not registered)
 *   16  u32   rkey         (of the first MR, when it has several)
 *   20  u32   mr_shift     version 1: 0. Version 2: 0, or the log2 of the
 *                          region's MR stride, KVP_MR_SHIFT_MIN to
 *                          KVP_MR_SHIFT_MAX (kvp_layout_set_region_keys())
 *
 * Version 2 only, after the field records: the key table. For each region
 * whose mr_shift is not 0, in region order, its keys but the first: n - 1
 * u32 where n = ceil(size / 2^mr_shift), at most KVP_MR_MAX_KEYS. Then
 * total_len == header_len + the records + 4 * those counts. A layout
 * without such a region encodes as version 1, byte for byte as before.
 *
 * View, 32 bytes:
 *    0  u32   group
 *    4  u32   region
 *    8  u32   layer
 *   12  u32   num_blocks
 *   16  u64   offset
 *   24  u64   stride
 *
 * Field, 128 bytes (fields in the order of the layout's field ids):
 *    0  u32   view
 *    4  u32   kind         enum kvp_field_kind
 *    8  u32   elem_size
 *   12  u32   ndim
 *   16  u64   offset
 *   24  u32   shard_dim    dim index or KVP_NO_SHARD
 *   28  u32   shard_total
 *   32  dim[KVP_MAX_DIMS], 16 bytes each:
 *         0  u64  stride
 *         8  u32  size
 *        12  u32  axis      enum kvp_axis
 *       dims at and past ndim are all zero.
 *
 * The descriptors' comp_mask fields are not carried: they are 0 in every
 * valid layout. A decoder rejects the whole blob on any mismatch: magic,
 * version, header_len, lengths (the key table's included, computed from
 * the region records before anything is allocated), non-zero reserved
 * bytes or unused dims, an mr_shift out of range or in version 1, any
 * record the layout builders refuse, a region whose [addr, addr + size)
 * wraps, or a compat_hash that differs from the rebuilt layout's.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#include "le.h"

#define HDR_LEN 56u
#define GROUP_LEN 8u
#define REGION_LEN 24u
#define VIEW_LEN 32u
#define DIM_LEN 16u
#define FIELD_DIMS_OFF 32u
#define FIELD_LEN (FIELD_DIMS_OFF + KVP_MAX_DIMS * DIM_LEN)

_Static_assert(KVP_META_MIN_LEN ==
		       HDR_LEN + GROUP_LEN + REGION_LEN + VIEW_LEN + FIELD_LEN,
	       "KVP_META_MIN_LEN is one record of each kind");

static const uint8_t meta_magic[4] = { 'K', 'V', 'P', 'M' };

/* Blob length for the given counts, or 0 when it does not fit a u32. */
static uint32_t blob_len(uint32_t ngroups, uint32_t nregions, uint32_t nviews,
			 uint32_t nfields)
{
	uint64_t n = HDR_LEN, t;

	if (__builtin_mul_overflow((uint64_t)ngroups, GROUP_LEN, &t) ||
	    __builtin_add_overflow(n, t, &n) ||
	    __builtin_mul_overflow((uint64_t)nregions, REGION_LEN, &t) ||
	    __builtin_add_overflow(n, t, &n) ||
	    __builtin_mul_overflow((uint64_t)nviews, VIEW_LEN, &t) ||
	    __builtin_add_overflow(n, t, &n) ||
	    __builtin_mul_overflow((uint64_t)nfields, FIELD_LEN, &t) ||
	    __builtin_add_overflow(n, t, &n) || n > UINT32_MAX)
		return 0;
	return (uint32_t)n;
}

/* A region's remote range must not wrap: the transport adds offsets to addr
 * and compares against addr + size. */
static int region_key_ok(uint64_t size, uint64_t addr)
{
	uint64_t end;

	return !__builtin_add_overflow(addr, size, &end);
}

static void encode_field(uint8_t *p, const struct kvp_field *f)
{
	uint32_t d;

	kvp__put32(p, f->view);
	kvp__put32(p + 4, f->d.kind);
	kvp__put32(p + 8, f->d.elem_size);
	kvp__put32(p + 12, f->d.ndim);
	kvp__put64(p + 16, f->d.offset);
	kvp__put32(p + 24, f->d.shard_dim);
	kvp__put32(p + 28, f->d.shard_total);
	memset(p + FIELD_DIMS_OFF, 0, KVP_MAX_DIMS * DIM_LEN);
	for (d = 0; d < f->d.ndim && d < KVP_MAX_DIMS; d++) {
		uint8_t *q = p + FIELD_DIMS_OFF + d * DIM_LEN;

		kvp__put64(q, f->d.dim[d].stride);
		kvp__put32(q + 8, f->d.dim[d].size);
		kvp__put32(q + 12, f->d.dim[d].axis);
	}
}

int kvp_meta_encode(const kvp_layout *l, void *buf, size_t cap, size_t *len)
{
	uint8_t *p = buf;
	uint32_t need, i;
	int keyed = 0;

	if (!l || !len || (!buf && cap))
		return -EINVAL;
	need = blob_len(l->ngroups, l->nregions, l->nviews, l->nfields);
	if (!need)
		return -EINVAL;
	for (i = 0; i < l->nregions; i++) {
		uint64_t n = kvp__region_nkeys(l->regions[i], l->mrshift[i]);

		if (!region_key_ok(l->regions[i], l->raddr[i]))
			return -EINVAL;
		if (l->mrshift[i])
			keyed = 1;
		if (need + 4 * (n - 1) > UINT32_MAX)
			return -EINVAL;
		need += (uint32_t)(4 * (n - 1));
	}
	if (cap < need) {
		*len = need;
		return -EMSGSIZE;
	}

	memcpy(p, meta_magic, sizeof(meta_magic));
	kvp__put16(p + 4, keyed ? KVP_META_VERSION_KEYS : KVP_META_VERSION);
	kvp__put16(p + 6, HDR_LEN);
	kvp__put32(p + 8, need);
	kvp__put32(p + 12, 0);
	kvp__put64(p + 16, kvp_layout_compat_hash(l));
	kvp__put64(p + 24, l->attr.engine_id);
	kvp__put32(p + 32, l->attr.tp_size);
	kvp__put32(p + 36, l->attr.tp_rank);
	kvp__put32(p + 40, l->ngroups);
	kvp__put32(p + 44, l->nregions);
	kvp__put32(p + 48, l->nviews);
	kvp__put32(p + 52, l->nfields);
	p += HDR_LEN;
	for (i = 0; i < l->ngroups; i++, p += GROUP_LEN) {
		kvp__put32(p, l->groups[i].kind);
		kvp__put32(p + 4, l->groups[i].block_tokens);
	}
	for (i = 0; i < l->nregions; i++, p += REGION_LEN) {
		kvp__put64(p, l->regions[i]);
		kvp__put64(p + 8, l->raddr[i]);
		kvp__put32(p + 16, l->rkey[i]);
		kvp__put32(p + 20, l->mrshift[i]);
	}
	for (i = 0; i < l->nviews; i++, p += VIEW_LEN) {
		const struct kvp_view_desc *v = &l->views[i];

		kvp__put32(p, v->group);
		kvp__put32(p + 4, v->region);
		kvp__put32(p + 8, v->layer);
		kvp__put32(p + 12, v->num_blocks);
		kvp__put64(p + 16, v->offset);
		kvp__put64(p + 24, v->stride);
	}
	for (i = 0; i < l->nfields; i++, p += FIELD_LEN)
		encode_field(p, &l->fields[i]);
	for (i = 0; i < l->nregions; i++) {
		uint64_t k, n = kvp__region_nkeys(l->regions[i], l->mrshift[i]);

		for (k = 1; k < n; k++, p += 4)
			kvp__put32(p, l->xkeys[i][k - 1]);
	}
	*len = need;
	return 0;
}

/* The layout builders answer -EINVAL for a bad description; coming from the
 * wire, that is a malformed blob. */
static int wire_err(int err)
{
	return err == -EINVAL ? -EPROTO : err;
}

static int decode_field(const uint8_t *p, uint32_t *view,
			struct kvp_field_desc *f)
{
	uint32_t d, i;

	memset(f, 0, sizeof(*f));
	*view = kvp__get32(p);
	f->kind = kvp__get32(p + 4);
	f->elem_size = kvp__get32(p + 8);
	f->ndim = kvp__get32(p + 12);
	f->offset = kvp__get64(p + 16);
	f->shard_dim = kvp__get32(p + 24);
	f->shard_total = kvp__get32(p + 28);
	if (f->ndim > KVP_MAX_DIMS)
		return -EPROTO;
	for (d = 0; d < KVP_MAX_DIMS; d++) {
		const uint8_t *q = p + FIELD_DIMS_OFF + d * DIM_LEN;

		if (d < f->ndim) {
			f->dim[d].stride = kvp__get64(q);
			f->dim[d].size = kvp__get32(q + 8);
			f->dim[d].axis = kvp__get32(q + 12);
			continue;
		}
		for (i = 0; i < DIM_LEN; i++)
			if (q[i])
				return -EPROTO;
	}
	return 0;
}

/* Region id's keys: `first` from its record, the others from the key
 * table at *keys, advanced past them; *left: the table's bytes not yet
 * read. A table too short for the region's count is malformed: nothing
 * past it is read, whatever the caller checked before. */
static int region_keys(kvp_layout *l, uint32_t id, uint64_t addr,
		       uint32_t shift, uint32_t first, const uint8_t **keys,
		       uint64_t *left)
{
	uint64_t size = 0, n, k;
	uint32_t *v;
	int err;

	if (shift < KVP_MR_SHIFT_MIN || shift > KVP_MR_SHIFT_MAX ||
	    kvp_layout_get_region(l, id, &size))
		return -EPROTO;
	n = kvp__region_nkeys(size, shift);
	if (!n || n > KVP_MR_MAX_KEYS || 4 * (n - 1) > *left)
		return -EPROTO;
	*left -= 4 * (n - 1);
	v = malloc(n * sizeof(*v));
	if (!v)
		return -ENOMEM;
	v[0] = first;
	for (k = 1; k < n; k++, *keys += 4)
		v[k] = kvp__get32(*keys);
	err = kvp_layout_set_region_keys(l, id, addr, shift, v, (uint32_t)n);
	free(v);
	return err;
}

/* The key table's length for the region records at p (count of them), or
 * UINT64_MAX for an mr_shift out of range, for a keyed region without a
 * key (size 0: it would count the table one key short) or for no region
 * with one (the encoder writes version 2 only for those: one encoding per
 * layout). Linear in count. */
static uint64_t key_table_len(const uint8_t *p, uint32_t count)
{
	uint64_t len = 0, n;
	uint32_t i, shift, keyed = 0;

	for (i = 0; i < count; i++, p += REGION_LEN) {
		shift = kvp__get32(p + 20);
		if (!shift)
			continue;
		if (shift < KVP_MR_SHIFT_MIN || shift > KVP_MR_SHIFT_MAX)
			return UINT64_MAX;
		n = kvp__region_nkeys(kvp__get64(p), shift);
		if (!n || n > KVP_MR_MAX_KEYS)
			return UINT64_MAX;
		len += 4 * (n - 1); /* < 2^32 * 2^22: no overflow */
		keyed = 1;
	}
	return keyed ? len : UINT64_MAX;
}

/* Rebuilds the layout from records whose lengths have been checked, through
 * the public builders only, so remote data meets every check local data
 * does. */
int kvp__meta_records(kvp_layout *l, const uint8_t *p, const uint32_t *count,
		      const uint8_t *keys, uint64_t keys_len)
{
	uint32_t i, id;
	int err;

	for (i = 0; i < count[0]; i++, p += GROUP_LEN) {
		struct kvp_group_desc g = { 0 };

		g.kind = kvp__get32(p);
		g.block_tokens = kvp__get32(p + 4);
		err = kvp_layout_add_group(l, &g, &id);
		if (err)
			return wire_err(err);
	}
	for (i = 0; i < count[1]; i++, p += REGION_LEN) {
		uint64_t size = kvp__get64(p), addr = kvp__get64(p + 8);

		uint32_t shift = kvp__get32(p + 20);

		if ((shift && !keys) || !region_key_ok(size, addr))
			return -EPROTO;
		err = kvp_layout_add_region(l, size, &id);
		if (!err && !shift)
			err = kvp_layout_set_region_key(l, id, addr,
							kvp__get32(p + 16));
		else if (!err)
			err = region_keys(l, id, addr, shift,
					  kvp__get32(p + 16), &keys, &keys_len);
		if (err)
			return wire_err(err);
	}
	for (i = 0; i < count[2]; i++, p += VIEW_LEN) {
		struct kvp_view_desc v = { 0 };

		v.group = kvp__get32(p);
		v.region = kvp__get32(p + 4);
		v.layer = kvp__get32(p + 8);
		v.num_blocks = kvp__get32(p + 12);
		v.offset = kvp__get64(p + 16);
		v.stride = kvp__get64(p + 24);
		err = kvp_layout_add_view(l, &v, &id);
		if (err)
			return wire_err(err);
	}
	for (i = 0; i < count[3]; i++, p += FIELD_LEN) {
		struct kvp_field_desc f;
		uint32_t view;

		err = decode_field(p, &view, &f);
		if (!err)
			err = wire_err(kvp_layout_add_field(l, view, &f));
		if (err)
			return err;
	}
	/* Every key read, none left over: the table held exactly the
	 * regions' counts. */
	return keys_len ? -EPROTO : 0;
}

int kvp_meta_decode(const void *buf, size_t len, kvp_layout **out)
{
	const uint8_t *p = buf, *keys = NULL;
	struct kvp_layout_attr attr = { 0 };
	uint32_t count[4], total, base, i;
	uint64_t hash, extra = 0;
	uint16_t version;
	kvp_layout *l;
	int err;

	if (!out || (!buf && len))
		return -EINVAL;
	/* Nothing shorter can hold a layout we accept: refuse it unread, so
	 * a transport's early length check and ours agree. */
	if (len < KVP_META_MIN_LEN)
		return -EMSGSIZE;
	version = kvp__get16(p + 4);
	if (memcmp(p, meta_magic, sizeof(meta_magic)) ||
	    (version != KVP_META_VERSION && version != KVP_META_VERSION_KEYS) ||
	    kvp__get16(p + 6) != HDR_LEN)
		return -EPROTO;
	total = kvp__get32(p + 8);
	if (total < HDR_LEN || kvp__get32(p + 12))
		return -EPROTO;
	if (total > len)
		return -EMSGSIZE;
	if (total < len)
		return -EPROTO;
	for (i = 0; i < 4; i++)
		count[i] = kvp__get32(p + 40 + 4 * i);
	/* A field needs a view, a view a group and a region. */
	base = blob_len(count[0], count[1], count[2], count[3]);
	if (!count[3] || !base || base > total)
		return -EPROTO;
	if (version == KVP_META_VERSION_KEYS) {
		/* The region records are inside the checked length. */
		extra = key_table_len(p + HDR_LEN + GROUP_LEN * count[0],
				      count[1]);
		keys = p + base;
	}
	if (extra != total - base)
		return -EPROTO;

	hash = kvp__get64(p + 16);
	attr.engine_id = kvp__get64(p + 24);
	attr.tp_size = kvp__get32(p + 32);
	attr.tp_rank = kvp__get32(p + 36);
	err = kvp_layout_create(&attr, &l);
	if (err)
		return wire_err(err);
	err = kvp__meta_records(l, p + HDR_LEN, count, keys, extra);
	if (!err && kvp_layout_compat_hash(l) != hash)
		err = -EPROTO;
	if (err) {
		kvp_layout_destroy(l);
		return err;
	}
	*out = l;
	return 0;
}
