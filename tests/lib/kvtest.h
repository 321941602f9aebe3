/* SPDX-License-Identifier: MIT */
/*
 * Test support: identity patterns and the memcpy executor.
 *
 * Every element a producer holds is filled with bytes derived from its
 * identity (group, layer, field kind, global coordinate on every axis, token
 * position in the sequence). A consumer's expected memory is computed the
 * same way from its own layout, so a transfer is right exactly when the
 * consumer's buffers equal the expected ones byte for byte.
 * Uses only the public API.
 */
#ifndef KVTEST_H
#define KVTEST_H

#include <stddef.h>
#include <stdint.h>

#include "kvpull.h"

/* One rank's memory: a buffer per region of its layout. */
struct kvt_mem {
	uint32_t nregions;
	uint8_t **buf;
	uint64_t *size;
};

int kvt_mem_alloc(const kvp_layout *l, struct kvt_mem *m);
void kvt_mem_free(struct kvt_mem *m);
/* dst shaped as src (its regions), its bytes copied (copy) or zero; -1
 * when out of memory (dst then holds what was allocated: kvt_mem_free()
 * it). kvt_mem_copy(): copied. */
int kvt_mem_like(struct kvt_mem *dst, const struct kvt_mem *src, int copy);
int kvt_mem_copy(struct kvt_mem *dst, const struct kvt_mem *src);

/* Fills every byte with a per-(rank, region, offset) background value that
 * no identity pattern uses the same way. */
void kvt_fill_background(struct kvt_mem *m, uint32_t salt);

/* One request's ids, per group, with owned storage. */
struct kvt_req {
	uint32_t ngroups;
	struct kvp_ids *ids;
};

/* Writes the identity pattern of every element of the remote blocks listed
 * in `req` into a producer rank's memory (layout `l`). Token positions come
 * from each block's index in the remote list. */
void kvt_fill_producer(const kvp_layout *l, struct kvt_mem *m,
		       const struct kvp_ids *ids);

/* kvt_fill_producer() for a part of the sequence only, as a prefill writes
 * it: the elements of layers [layer0, layer1) at token positions
 * [from, to), and (to == KVP_TOKENS_END: the last chunk) the STATE
 * groups' blocks of those layers. */
void kvt_fill_producer_part(const kvp_layout *l, struct kvt_mem *m,
			    const struct kvp_ids *ids, uint32_t layer0,
			    uint32_t layer1, uint64_t from, uint64_t to);

/* Writes into `m` (a copy of the consumer's memory before the transfer)
 * what the consumer must hold after it: identity patterns in every element
 * of the local blocks that the request reads. Also marks those bytes in
 * `need` (one byte per memory byte, same shape) when not NULL. */
void kvt_expect_consumer(const kvp_layout *local, const kvp_layout *remote,
			 struct kvt_mem *m, struct kvt_mem *need,
			 const struct kvp_ids *ids);

/* Executes WRs with memcpy from producer memories prod[rank] into `local`.
 * Checks every range against the region sizes and marks written bytes in
 * `seen` (counting: a byte written twice is reported). Returns 0, or -1 with
 * a reason printed to stderr. Adds the bytes read to *bytes. */
int kvt_execute(const kvp_plan *plan, const struct kvp_wr *wr, uint32_t nwr,
		const struct kvp_sge *sge, struct kvt_mem *const *prod,
		struct kvt_mem *local, struct kvt_mem *seen, uint64_t *bytes);

/* Compares two memories; prints the first difference (region, offset) and
 * returns -1 when they differ. */
int kvt_mem_compare(const struct kvt_mem *a, const struct kvt_mem *b,
		    const char *what);

/* Builds a layout from a model preset or model struct. */
kvp_layout *kvt_build(const struct kvp_model *m, uint32_t tp, uint32_t rank,
		      uint32_t block_tokens, uint32_t kernel_tokens,
		      uint32_t num_blocks, uint32_t kv_layout);

/* Full identity check of one consumer rank pulling one request from a
 * producer engine: builds every producer rank's memory, emits, executes,
 * compares the consumer's whole memory with the expectation, checks that
 * every needed byte was written exactly once and nothing else was. `max_sge`
 * as in kvp_plan_attr. Returns 0 or -1 (reason on stderr); *nwr_out and
 * *bytes_out (when not NULL) receive the WR count and bytes read. */
int kvt_check_pull(const kvp_layout *local, kvp_layout *const *remote,
		   uint32_t max_sge, const struct kvp_ids *ids,
		   uint32_t *nwr_out, uint64_t *bytes_out);

/* Deterministic pseudo-random numbers for tests. */
uint64_t kvt_rand(uint64_t *state);

/* Fills ids with distinct random block ids below `bound`. */
/* The blob of tests/fuzz/crashes/meta-short-key-table made from layout l
 * (two regions at least, the first over 64 KiB): version 2, region 0 in
 * 32 KiB MRs, region 1 of size 0 with an MR shift, so that its key table
 * counts one key short, and the blob cut to that count. A decoder that
 * trusts the count reads 4 bytes past the blob. 0 and a malloc'd *blob,
 * or -1. */
int kvt_short_key_table(const kvp_layout *l, uint8_t **blob, size_t *len);

void kvt_random_ids(uint64_t *state, uint32_t *ids, uint32_t n,
		    uint32_t bound);

/* One past the highest model layer of l's views. */
uint32_t kvt_layers(const kvp_layout *l);

/* The tokens progress p says are written in layer l (struct kvp_progress,
 * written out apart from kvp_progress_ranges()). */
uint64_t kvt_ready(const struct kvp_progress *p, uint32_t l);

#endif
