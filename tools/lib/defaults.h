/* SPDX-License-Identifier: MIT */
/*
 * The defaults kvpull-plan and kvpull-demo share, so that a plan dump with
 * default options shows the READs the demo's consumer agent posts: the
 * agent's own (kvpull.h: KVP_DEFAULT_MAX_SGE, KVP_DEFAULT_MAX_READ), one KV
 * layout and one block size. Header-only: tests/rdma_dump.c compiles its
 * plans through tool_plan_attr() too, and checks them against the agent's.
 */
#ifndef KVP_TOOL_DEFAULTS_H
#define KVP_TOOL_DEFAULTS_H

#include <stdint.h>
#include <string.h>

#include "kvpull.h"

/* FLASH_HND: a page per (block, layer) of (heads, tokens, dim), so a
 * producer rank's heads are one run per page and TP N -> M pulls coalesce
 * (docs/planner.md: the layouts table); vLLM's NIXL connector asks for HND
 * on the prefill side for the same reason. A spec file without kv_layout
 * gets it too (plan/spec.c). An engine states its own layout: only
 * kvp_engine_desc.kv_layout 0, the enum's first value, is FLASH_NHD. */
#define TOOL_DEFAULT_KV_LAYOUT KVP_KV_FLASH_HND
#define TOOL_DEFAULT_BLOCK_TOKENS 16

/* The plan attributes of a consumer agent opened with kvp_agent_attr
 * max_sge and max_read (0: the defaults), as verbs/plans.c sets them
 * before the device's clamps (SGEs to max_sge_rd, READs to the port's
 * max_msg_sz). */
static inline void tool_plan_attr(struct kvp_plan_attr *pa, uint32_t max_sge,
				  uint32_t max_read)
{
	memset(pa, 0, sizeof(*pa));
	pa->max_sge = max_sge ? max_sge : KVP_DEFAULT_MAX_SGE;
	pa->comp_mask = KVP_PLAN_ATTR_MAX_LEN;
	pa->max_len = max_read ? max_read : KVP_DEFAULT_MAX_READ;
}

#endif
