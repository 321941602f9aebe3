// SPDX-License-Identifier: MIT
/*
 * libFuzzer target for the planning path a consumer runs on a producer's
 * metadata: decode two blobs -> kvp_plan_compile() -> kvp_plan_emit().
 *
 * Input: a 16-byte header, the consumer's blob, the producer's blob, then
 * bytes that make the request's id lists.
 *    0  u32  consumer blob length (clamped to what the input holds)
 *    4  u32  producer blob length (clamped)
 *    8  u16  max_sge for kvp_plan_compile() (0 means 1)
 *   10  u8   capacity: < 200 the emit bound, else (byte - 200) WRs and SGEs
 *   11  u8   producer rank for kvp_notify_expected()
 *   12  u32  reserved
 * Each blob is fixed up before decoding so that mutations reach the
 * planner: magic, version, header length and reserved word set, record
 * counts cut to what the blob holds, total_len set, and compat_hash
 * recomputed from the records (rebuilt with the public builders).
 *
 * Checks, beyond the sanitizers: compile fails only with -EPROTO, -EINVAL,
 * -EFBIG (over KVP_PLAN_MAX_WORK) or -ENOMEM, leaving the plan untouched and the message terminated; emit fails
 * only with -ERANGE, -EINVAL or -ENOSPC and then writes nothing (WR, SGE and
 * src_end arrays are filled with a canary and compared); on success every
 * WR reads inside its remote region and names a valid source and group, its
 * SGEs lie inside the local regions and add up to its length, at most
 * max_sge of them, SGE ranges lie inside what was written, WRs are ordered
 * by source and src_end is monotone and ends at the WR count, and nothing
 * past the written WRs and SGEs changes. For consumer engines of TP <= 64,
 * kvp_notify_expected() equals its definition (one plan per consumer rank,
 * notify lists counted), refusal included, or is -EFBIG (its compilations
 * share one KVP_PLAN_MAX_WORK); and the producer's handshake count
 * (kvp__notify_count(), no plan made) equals the definition wherever every
 * plan compiles.
 *
 *   make fuzz && build/fuzz/seeds corpus
 *   build/fuzz/fuzz_plan -max_total_time=60 corpus/plan
 */
#include <errno.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h" /* struct kvp_layout: the reference count's ranks */
#include "compile.h" /* kvp__notify_count() */
#include "le.h"
#include "kvpull.h"

#define HDR 16u
#define META_HDR 56u
#define FIELD_LEN 128u
#define MAX_IDS 32u
#define MAX_CAP (1u << 16)
#define CANARY 0xa5
#define PLAN_SENTINEL ((kvp_plan *)(uintptr_t)0x5a5a5a5a)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The layout of a blob's header and records (format in plan/wire.c),
 * rebuilt with the public builders, ignoring the hash: NULL if any record
 * is refused. */
static kvp_layout *rebuild(const uint8_t *b, const uint32_t *count)
{
	struct kvp_layout_attr a = { 0 };
	kvp_layout *l;

	a.engine_id = kvp__get64(b + 24);
	a.tp_size = kvp__get32(b + 32);
	a.tp_rank = kvp__get32(b + 36);
	if (kvp_layout_create(&a, &l))
		return NULL;
	if (kvp__meta_records(l, b + META_HDR, count, NULL, 0)) {
		kvp_layout_destroy(l);
		return NULL;
	}
	return l;
}

/* Copies blob in[n] into a new buffer with the header fixed up (see the
 * top of the file); *len receives its length. */
static uint8_t *fix_blob(const uint8_t *in, size_t n, size_t *len)
{
	static const uint32_t rec[4] = { 8, 24, 32, FIELD_LEN };
	uint8_t *b = malloc(n ? n : 1);
	uint32_t count[4], i;
	uint64_t avail, total = META_HDR;
	kvp_layout *l;

	if (!b)
		abort();
	memcpy(b, in, n);
	*len = n;
	if (n < META_HDR)
		return b;
	memcpy(b, "KVPM", 4);
	b[4] = KVP_META_VERSION;
	b[5] = 0;
	b[6] = META_HDR;
	b[7] = 0;
	kvp__put32(b + 12, 0);
	avail = n - META_HDR;
	for (i = 0; i < 4; i++) {
		count[i] = kvp__get32(b + 40 + 4 * i);
		if (count[i] > avail / rec[i])
			count[i] = (uint32_t)(avail / rec[i]);
		avail -= (uint64_t)count[i] * rec[i];
		total += (uint64_t)count[i] * rec[i];
		kvp__put32(b + 40 + 4 * i, count[i]);
	}
	kvp__put32(b + 8, (uint32_t)total);
	*len = total;
	l = rebuild(b, count);
	if (l) {
		kvp__put64(b + 16, kvp_layout_compat_hash(l));
		kvp_layout_destroy(l);
	}
	return b;
}

/* The request's bytes, read as a stream of zeros once exhausted. */
struct rd {
	const uint8_t *p, *e;
};

static uint32_t rd8(struct rd *r)
{
	return r->p < r->e ? *r->p++ : 0;
}

static uint32_t rd16(struct rd *r)
{
	return rd8(r) | rd8(r) << 8;
}

static int all_canary(const void *p, size_t n)
{
	const uint8_t *b = p;
	size_t i;

	for (i = 0; i < n; i++)
		if (b[i] != CANARY)
			return 0;
	return 1;
}

static uint64_t region_size(const kvp_layout *l, uint32_t i)
{
	uint64_t size;

	if (kvp_layout_get_region(l, i, &size))
		abort(); /* the WR or SGE names a region that does not exist */
	return size;
}

/* Checks a successful emission of n WRs into arrays of cap entries. */
static void check_emit(const kvp_plan *plan, const kvp_layout *local,
		       const kvp_layout *remote, const struct kvp_wr *wr,
		       const struct kvp_sge *sge, const uint32_t *src_end,
		       uint32_t n, uint32_t cap)
{
	struct kvp_plan_info pi;
	uint32_t i, k, s, sge_end = 0, prev = 0;
	uint64_t sum;

	kvp_plan_get_info(plan, &pi);
	if (n > cap || !all_canary(wr + n, (cap - n) * sizeof(*wr)))
		abort();
	for (i = 0; i < n; i++) {
		const struct kvp_wr *w = &wr[i];

		if (w->src >= pi.nsrc || w->group >= pi.ngroups || !w->len ||
		    w->offset + w->len > region_size(remote, w->region) ||
		    w->offset + w->len < w->offset)
			abort();
		if (!w->nsge || w->nsge > (pi.max_sge ? pi.max_sge : 1) ||
		    w->sge_first > cap || w->nsge > cap - w->sge_first)
			abort();
		if (i && w->src < wr[i - 1].src)
			abort();
		if (w->src && src_end[w->src - 1] > i)
			abort();
		if (src_end[w->src] <= i)
			abort();
		for (sum = 0, k = w->sge_first; k < w->sge_first + w->nsge;
		     k++) {
			const struct kvp_sge *g = &sge[k];

			if (!g->len ||
			    g->offset + g->len > region_size(local, g->region) ||
			    g->offset + g->len < g->offset)
				abort();
			sum += g->len;
		}
		if (sum != w->len)
			abort();
		if (w->sge_first + w->nsge > sge_end)
			sge_end = w->sge_first + w->nsge;
	}
	if (!all_canary(sge + sge_end, (cap - sge_end) * sizeof(*sge)))
		abort();
	for (s = 0; s < pi.nsrc; s++) {
		if (src_end[s] < prev || src_end[s] > n)
			abort();
		prev = src_end[s];
	}
	if (pi.nsrc && src_end[pi.nsrc - 1] != n)
		abort();
	if (!all_canary(src_end + pi.nsrc, sizeof(*src_end)))
		abort();
}

static void emit(const kvp_plan *plan, const kvp_layout *local,
		 const kvp_layout *remote, struct rd *r, uint32_t capb)
{
	struct kvp_plan_info pi;
	struct kvp_plan_group pg;
	struct kvp_ids *ids;
	uint32_t *idbuf, g, i, mw, ms, cap, *src_end;
	struct kvp_wr *wr;
	struct kvp_sge *sge;
	int n;

	kvp_plan_get_info(plan, &pi);
	ids = calloc(pi.ngroups + 1, sizeof(*ids));
	idbuf = calloc((size_t)pi.ngroups * 2 * MAX_IDS + 1, sizeof(*idbuf));
	if (!ids || !idbuf)
		abort();
	for (g = 0; g < pi.ngroups; g++) {
		uint32_t *lids = idbuf + g * 2 * MAX_IDS, *rids = lids + MAX_IDS;
		uint32_t mode;

		if (kvp_plan_get_group(plan, g, &pg))
			abort();
		ids[g].nlocal = rd8(r) % (MAX_IDS + 1);
		ids[g].nremote = rd8(r) % (MAX_IDS + 1);
		mode = rd8(r);
		ids[g].tokens = mode & 1 ? rd16(r) : 0;
		/* a few ids past the bounds: -ERANGE */
		for (i = 0; i < ids[g].nlocal; i++)
			lids[i] = rd16(r) % (pg.local_blocks + 2);
		for (i = 0; i < ids[g].nremote; i++)
			rids[i] = rd16(r) % (pg.remote_blocks + 2);
		/* a NULL list with a count: -EINVAL */
		ids[g].local = mode & 2 ? NULL : lids;
		ids[g].remote = mode & 4 ? NULL : rids;
	}
	kvp_plan_emit_bound(plan, MAX_IDS, &mw, &ms);
	cap = mw > ms ? mw : ms;
	if (cap > MAX_CAP)
		cap = MAX_CAP;
	if (capb >= 200)
		cap = capb - 200;
	wr = malloc((cap + 1) * sizeof(*wr));
	sge = malloc((cap + 1) * sizeof(*sge));
	src_end = malloc((pi.nsrc + 1) * sizeof(*src_end));
	if (!wr || !sge || !src_end)
		abort();
	memset(wr, CANARY, (cap + 1) * sizeof(*wr));
	memset(sge, CANARY, (cap + 1) * sizeof(*sge));
	memset(src_end, CANARY, (pi.nsrc + 1) * sizeof(*src_end));
	n = kvp_plan_emit(plan, ids, wr, cap, sge, cap, src_end);
	if (n < 0) {
		if (n != -ERANGE && n != -EINVAL && n != -ENOSPC)
			abort();
		if (!all_canary(wr, (cap + 1) * sizeof(*wr)) ||
		    !all_canary(sge, (cap + 1) * sizeof(*sge)) ||
		    !all_canary(src_end, (pi.nsrc + 1) * sizeof(*src_end)))
			abort();
	} else {
		check_emit(plan, local, remote, wr, sge, src_end, (uint32_t)n,
			   cap);
	}
	free(wr);
	free(sge);
	free(src_end);
	free(ids);
	free(idbuf);
}

/* kvp_notify_expected()'s definition: every consumer rank's plan compiled,
 * the notify lists naming `prod` counted (or the first refusal). */
static int notify_reference(const kvp_layout *local, const kvp_layout *remote,
			    uint32_t prod)
{
	struct kvp_layout tmp = *local; /* read only: the same layout, rank c */
	struct kvp_plan_info pi;
	uint32_t c, i;
	kvp_plan *plan;
	int err, count = 0;

	for (c = 0; c < local->attr.tp_size; c++) {
		tmp.attr.tp_rank = c;
		err = kvp_plan_compile(&tmp, remote, NULL, &plan, NULL, 0);
		if (err)
			return err;
		kvp_plan_get_info(plan, &pi);
		for (i = 0; i < pi.nnotify; i++)
			count += kvp_plan_notify(plan, i) == (int)prod;
		kvp_plan_destroy(plan);
	}
	return count;
}

static kvp_layout *decode(const uint8_t *in, size_t n)
{
	kvp_layout *l = NULL;
	size_t len;
	uint8_t *b = fix_blob(in, n, &len);
	int err = kvp_meta_decode(b, len, &l);

	if (err && err != -EPROTO && err != -EMSGSIZE && err != -ENOMEM)
		abort();
	free(b);
	return err ? NULL : l;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct kvp_plan_attr attr = { 0 };
	struct kvp_layout_info li, ri;
	kvp_layout *local = NULL, *remote = NULL;
	kvp_plan *plan = PLAN_SENTINEL;
	size_t n1, n2, rest = size > HDR ? size - HDR : 0;
	char msg[128];
	struct rd r;
	int err;

	if (size < HDR)
		return 0;
	n1 = kvp__get32(data);
	n1 = n1 < rest ? n1 : rest;
	n2 = kvp__get32(data + 4);
	n2 = n2 < rest - n1 ? n2 : rest - n1;
	local = decode(data + HDR, n1);
	remote = decode(data + HDR + n1, n2);
	if (!local || !remote)
		goto out;
	attr.max_sge = (uint32_t)data[8] | (uint32_t)data[9] << 8;
	memset(msg, CANARY, sizeof(msg));
	err = kvp_plan_compile(local, remote, &attr, &plan, msg, sizeof(msg));
	if (err) {
		if (plan != PLAN_SENTINEL ||
		    (err != -EPROTO && err != -EINVAL && err != -EFBIG &&
		     err != -ENOMEM) ||
		    !memchr(msg, 0, sizeof(msg)))
			abort();
		goto out;
	}
	r.p = data + HDR + n1 + n2;
	r.e = data + size;
	emit(plan, local, remote, &r, data[10]);
	kvp_plan_destroy(plan);
	/* The producer's count, for small consumer engines only: it may
	 * compile one plan per consumer rank, and a mutated layout's plan can
	 * take milliseconds (the fuzzer's time limit is per input). */
	kvp_layout_get_info(local, &li);
	kvp_layout_get_info(remote, &ri);
	if (li.tp_size <= 64) {
		uint32_t prod = data[11] % ri.tp_size;
		int ref = notify_reference(local, remote, prod), cheap;

		err = kvp_notify_expected(remote, local, prod);
		if (err == 0 || (err < 0 && err != -EPROTO && err != -EFBIG &&
				 err != -ENOMEM))
			abort();
		if (err != -ENOMEM && err != -EFBIG && err != ref)
			abort();
		cheap = kvp__notify_count(remote, local, prod, NULL, 0);
		if (ref > 0 && cheap != ref && cheap != -ENOMEM)
			abort();
	}
out:
	kvp_layout_destroy(local);
	kvp_layout_destroy(remote);
	return 0;
}
