// SPDX-License-Identifier: MIT
/*
 * cmocka assertions shared by the unit tests: two layouts or two plans are
 * equal when everything the public getters show is equal. The getters'
 * structs are zeroed before each call, so padding compares equal too.
 * Include after <cmocka.h>.
 */
#ifndef KVP_TEST_KVASSERT_H
#define KVP_TEST_KVASSERT_H

#include <string.h>

#include "kvpull.h"

/* Getter `get(obj, i, &out)` returns the same thing for a and b. */
#define KVA_SAME(type, get, a, b, i)                                         \
	do {                                                                 \
		type x_, y_;                                                 \
		memset(&x_, 0, sizeof(x_));                                  \
		memset(&y_, 0, sizeof(y_));                                  \
		assert_int_equal(get(a, i, &x_), 0);                         \
		assert_int_equal(get(b, i, &y_), 0);                         \
		assert_memory_equal(&x_, &y_, sizeof(x_));                   \
	} while (0)

static inline void kva_plans_equal(const kvp_plan *a, const kvp_plan *b)
{
	struct kvp_plan_info ia, ib;
	uint32_t i;

	memset(&ia, 0, sizeof(ia));
	memset(&ib, 0, sizeof(ib));
	kvp_plan_get_info(a, &ia);
	kvp_plan_get_info(b, &ib);
	assert_memory_equal(&ia, &ib, sizeof(ia));
	for (i = 0; i < ia.nsrc; i++)
		assert_int_equal(kvp_plan_source(a, i), kvp_plan_source(b, i));
	for (i = 0; i < ia.nnotify; i++)
		assert_int_equal(kvp_plan_notify(a, i), kvp_plan_notify(b, i));
	for (i = 0; i < ia.ngroups; i++)
		KVA_SAME(struct kvp_plan_group, kvp_plan_get_group, a, b, i);
	for (i = 0; i < ia.nstreams; i++)
		KVA_SAME(struct kvp_plan_stream, kvp_plan_get_stream, a, b, i);
	for (i = 0; i < ia.npieces; i++)
		KVA_SAME(struct kvp_plan_piece, kvp_plan_get_piece, a, b, i);
}

/* Layouts: info, groups, region sizes (and, if `keys`, region addresses
 * and keys), views, fields with their views, compatibility hash. */
static inline void kva_layouts_equal(const kvp_layout *a, const kvp_layout *b,
				     int keys)
{
	struct kvp_layout_info ia, ib;
	uint32_t i;

	memset(&ia, 0, sizeof(ia));
	memset(&ib, 0, sizeof(ib));
	kvp_layout_get_info(a, &ia);
	kvp_layout_get_info(b, &ib);
	assert_memory_equal(&ia, &ib, sizeof(ia));
	for (i = 0; i < ia.ngroups; i++)
		KVA_SAME(struct kvp_group_desc, kvp_layout_get_group, a, b, i);
	for (i = 0; i < ia.nregions; i++) {
		uint64_t sa, sb, aa, ab;
		uint32_t ka, kb;

		assert_int_equal(kvp_layout_get_region(a, i, &sa), 0);
		assert_int_equal(kvp_layout_get_region(b, i, &sb), 0);
		assert_true(sa == sb);
		if (!keys)
			continue;
		assert_int_equal(kvp_layout_get_region_key(a, i, &aa, &ka), 0);
		assert_int_equal(kvp_layout_get_region_key(b, i, &ab, &kb), 0);
		assert_true(aa == ab);
		assert_int_equal(ka, kb);
	}
	for (i = 0; i < ia.nviews; i++)
		KVA_SAME(struct kvp_view_desc, kvp_layout_get_view, a, b, i);
	for (i = 0; i < ia.nfields; i++) {
		struct kvp_field_desc fa, fb;
		uint32_t wa, wb;

		memset(&fa, 0, sizeof(fa));
		memset(&fb, 0, sizeof(fb));
		assert_int_equal(kvp_layout_get_field(a, i, &wa, &fa), 0);
		assert_int_equal(kvp_layout_get_field(b, i, &wb, &fb), 0);
		assert_int_equal(wa, wb);
		assert_memory_equal(&fa, &fb, sizeof(fa));
	}
	assert_true(kvp_layout_compat_hash(a) == kvp_layout_compat_hash(b));
}

#endif
