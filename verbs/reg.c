// SPDX-License-Identifier: MIT
/*
 * Memory registration: each region once, as one MR or as several
 * overlapping ones when the device caps an MR below the region's size
 * (limits.h: kvp__mr_shift()), from an address or a dma-buf. Registration
 * closes when the agent first makes its blob (listen, the first engine).
 */
#include <stdlib.h>
#include <string.h>

#include "internal.h"

/* The checks both registrations share: 0, or the documented error. */
static int reg_check(kvp_agent *a, uint32_t region, uint64_t len)
{
	uint64_t size;

	if (region >= a->li.nregions || a->lnkeys[region])
		return -EINVAL;
	if (a->started)
		return -EBUSY;
	if (kvp_layout_get_region(a->layout, region, &size) || len < size ||
	    len > SIZE_MAX)
		return -EINVAL;
	return 0;
}

/* Producer memory is only ever read remotely; consumer memory is only
 * written by our own READ responses (and, on iWARP, by RDMA WRITEs that
 * carry them). Nothing else is granted. */
static int reg_access(const kvp_agent *a)
{
	return (a->producer ? a->lim.src_access : 0) |
	       (a->consumer ? a->lim.sink_access : 0);
}

/* Where registration gets the memory of bytes [off, off + len) of a
 * region: an address, or a dma-buf. */
struct reg_src {
	char *addr;	  /* NULL: the dma-buf */
	int fd;
	uint64_t offset;  /* of the region in the dma-buf */
	uint64_t iova;	  /* the region's address in this process */
};

static int reg_piece(kvp_agent *a, const struct reg_src *src, uint64_t off,
		     uint64_t len, struct ibv_mr **mr)
{
	if (src->addr)
		return kvp__reg_mr(a->pd, src->addr + off, (size_t)len,
				   reg_access(a), mr);
	return kvp__reg_dmabuf_mr(a->pd, src->offset + off, (size_t)len,
				  src->iova + off, src->fd, reg_access(a), mr);
}

/* Registers region `region` (`len` bytes given, at least its size) as one
 * MR, or as several overlapping ones when the device caps an MR below it
 * (limits.h: kvp__mr_shift()); then only the region's own bytes are
 * registered. Nothing is kept on failure. */
static int reg_region(kvp_agent *a, uint32_t region, uint64_t len,
		      const struct reg_src *src)
{
	struct kvp_emit_map *lr = &a->lreg[region];
	uint64_t size = 0, n, k, off, piece;
	struct ibv_mr **mr;
	uint32_t *key;
	int shift, err = 0;

	if (kvp_layout_get_region(a->layout, region, &size))
		return -EINVAL; /* unreachable: reg_check() passed */
	shift = len <= a->lim.max_mr ? 0 : kvp__mr_shift(size, a->lim.max_mr);
	if (shift < 0)
		return -EINVAL;
	n = shift ? kvp__mr_count(size, (uint32_t)shift) : 1;
	mr = calloc(n, sizeof(*mr));
	key = calloc(n, sizeof(*key));
	if (!mr || !key) {
		err = -ENOMEM;
		goto out;
	}
	for (k = 0; k < n && !err; k++) {
		off = shift ? k << shift : 0;
		if (!shift)
			piece = len <= a->lim.max_mr ? len : size;
		else if (size - off > (1ull << shift) + KVP_MR_WINDOW(shift))
			piece = (1ull << shift) + KVP_MR_WINDOW(shift);
		else
			piece = size - off;
		err = reg_piece(a, src, off, piece, &mr[k]);
		if (!err)
			key[k] = mr[k]->lkey;
	}
	if (err)
		goto out;
	lr->addr = src->addr ? (uint64_t)(uintptr_t)src->addr : src->iova;
	lr->key = key;
	lr->shift = shift ? (uint32_t)shift : KVP_ONE_MR;
	a->lnkeys[region] = (uint32_t)n;
	a->mr[region] = mr;
	if (shift && KVP_MR_WINDOW(shift) < a->mr_window)
		a->mr_window = (uint32_t)KVP_MR_WINDOW(shift);
	return 0;
out:
	for (k = 0; mr && k < n; k++)
		kvp__dereg_mr(mr[k]);
	free(mr);
	free(key);
	return err;
}

void kvp__reg_drop(kvp_agent *a, uint32_t region)
{
	struct kvp_emit_map *lr = &a->lreg[region];
	uint32_t k;

	for (k = 0; k < a->lnkeys[region]; k++)
		kvp__dereg_mr(a->mr[region][k]);
	free(a->mr[region]);
	free((void *)lr->key);
	a->mr[region] = NULL;
	a->lnkeys[region] = 0;
	memset(lr, 0, sizeof(*lr));
}

int kvp_agent_register(kvp_agent *a, uint32_t region, void *addr, uint64_t len)
{
	struct reg_src src = { addr, -1, 0, 0 };
	int err;

	if (!a || !addr)
		return -EINVAL;
	err = reg_check(a, region, len);
	if (err)
		return err;
	return reg_region(a, region, len, &src);
}

int kvp_agent_register_dmabuf(kvp_agent *a, uint32_t region, int fd,
			      uint64_t offset, uint64_t len, void *addr)
{
	/* The region is known by addr (its virtual address in this process:
	 * a GPU's, for device memory) to the blob and to local scatter
	 * entries; without one, by its offset in the dma-buf. */
	struct reg_src src = { NULL, fd, offset,
			       addr ? (uint64_t)(uintptr_t)addr : offset };
	int err;

	if (!a || fd < 0)
		return -EINVAL;
	err = reg_check(a, region, len);
	if (err)
		return err;
	err = reg_region(a, region, len, &src);
	if (err != -ENOTSUP || !addr)
		return err;
	/* No dma-buf support in this provider: the address itself (host
	 * memory, or device memory a peer-memory module exposes). */
	src.addr = addr;
	err = reg_region(a, region, len, &src);
	if (err)
		return err;
	a->st.dmabuf_fallbacks++;
	return 1;
}
