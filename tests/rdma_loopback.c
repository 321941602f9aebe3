// SPDX-License-Identifier: MIT
/*
 * Loopback pulls over real verbs (soft-RoCE in the VM): every TP pairing,
 * replicated KV heads, MLA, hybrid models (Mamba2 and GDN state pooled with
 * attention), block-size (nesting or not), memory-layout and conv-layout
 * mismatches, prefix and full hits, and two devices across a veth pair. Each case forks a
 * producer engine and a consumer engine, one process per rank, and checks
 * the consumers' whole memory byte for byte (tests/rdma/harness.h).
 *
 *   rdma_loopback [NAME-FILTER]
 *
 * KVP_QUICK_CASES=1 runs only the cases marked quick (scripts/test.sh,
 * under ASan): one of each transport path the matrix reaches.
 *
 * Needs KVP_ADDR0 (and KVP_ADDR1 for the cross-device cases), as set by
 * scripts/rxe-vm.sh. Exits 77 without an RDMA device.
 */
#include "rdma/harness.h"

/* Each case is a default set of fields followed by its overrides. */
#ifdef __clang__
#pragma clang diagnostic ignored "-Winitializer-overrides"
#else
#pragma GCC diagnostic ignored "-Woverride-init"
#endif

#define FHND KVP_KV_FLASH_HND
#define FNHD KVP_KV_FLASH_NHD

/* llama-3.1-8b: 8 KV heads of 128, bf16; 2 layers. 16-token blocks of
 * 32 KiB per K or V page. */
#define LLAMA(nm, p, d)                                                  \
	.name = nm, .model = "llama-3.1-8b", .layers = 2, .P = p, .D = d, \
	.pblock = 16, .dblock = 16, .playout = FHND, .dlayout = FHND,    \
	.pblocks = 48, .dblocks = 48, .nreq = 4, .tokens = 120,          \
	.kill_rank = -1

static const struct rt_case cases[] = {
	{ LLAMA("llama 1->1", 1, 1), .extra_expire = 2, .late_expect = 1 },
	{ LLAMA("llama 2->1", 2, 1) },
	{ LLAMA("llama 1->2", 1, 2) },
	{ LLAMA("llama 4->2", 4, 2), .max_sge = 2 },
	{ LLAMA("llama 2->4", 2, 4) },
	{ LLAMA("llama 2->2 nhd->hnd, blocks 16->32", 2, 2), .quick = 1,
	  .playout = FNHD, .dblock = 32, .dblocks = 24, .max_sge = 8 },
	{ LLAMA("llama 1->1 kernel 16 in 64, sq 8", 1, 1), .quick = 1, .pblock = 64,
	  .pkernel = 16, .pblocks = 12, .sq_depth = 8, .nreq = 6,
	  .max_inflight = 2, .striped = 1 },
	{ LLAMA("llama 2->1 prefix hit", 2, 1), .hit_tokens = 48 },
	/* One READ in flight per queue pair (kvp_agent_attr.read_window 1,
	 * read_window_bytes at its least): every READ but the first of
	 * each queue pair waits in the agent; notifications, lease and
	 * credit READs still go (two receive buffers per producer rank). */
	{ LLAMA("llama 2->1, READ window 1 (credit reads)", 2, 1), .quick = 1,
	  .prq = 2, .nreq = 16, .tokens = 32, .max_inflight = 16,
	  .read_window = 1, .read_window_bytes = KVP_READ_WINDOW_BYTES_MIN },
	{ LLAMA("llama 2->2 nhd->hnd, READ window 3, striped", 2, 2),
	  .quick = 1, .playout = FNHD, .read_window = 3, .striped = 1 },
	/* Two receive buffers per producer rank for 16 notifications each:
	 * the consumer reads the producers' credit counters again and
	 * again. */
	{ LLAMA("llama 2->1, producer receive depth 2 (credit reads)", 2, 1), .quick = 1,
	  .prq = 2, .nreq = 16, .tokens = 32, .max_inflight = 16 },
	/* The same, and plain, with a receive queue per producer QP (what
	 * a device without shared receive queues gets). */
	{ LLAMA("llama 2->1, receive queues per QP, depth 2 (credit reads)",
		2, 1), .quick = 1, .srq_off = 1, .prq = 2, .nreq = 16,
	  .tokens = 32, .max_inflight = 16 },
	{ LLAMA("llama 2->2 nhd->hnd, receive queues per QP", 2, 2),
	  .quick = 1, .srq_off = 1, .playout = FNHD },
	/* Both sides registered through kvp_agent_register_dmabuf():
	 * soft-RoCE cannot, so each falls back to the address. */
	{ LLAMA("llama 2->1, dma-buf registration (fallback)", 2, 1),
	  .dmabuf = 1 },
	/* MRs capped at 64 KiB on both sides (a device's max_mr_size, made
	 * small): every region registered as overlapping MRs, the keys in
	 * the blob, READs and SGEs cut to the 4 KiB window; with a layout
	 * conversion, so SGEs land across the consumer's seams too. */
	{ LLAMA("llama 2->2 nhd->hnd, 64 KiB MRs (regions split)", 2, 2),
	  .playout = FNHD, .max_sge = 8, .max_mr = 65536 },
	{ LLAMA("llama 2->1, dma-buf fallback, 64 KiB MRs", 2, 1), .quick = 1,
	  .dmabuf = 1, .max_mr = 65536 },
	/* Producer rank 1 registered in 64 KiB MRs, rank 0 (whose blob the
	 * plan is compiled from) in one: the plan's 8 MiB READs would cross
	 * rank 1's seams, so the engine is refused, nothing read. */
	{ LLAMA("llama 2->1, ranks registered unalike: refused", 2, 1),
	  .max_mr_odd = 65536, .connect_err = -EPROTO, .nreq = 0 },
	/* READs cut at 4 KiB (32 KiB pages, coalesced runs of several). */
	{ LLAMA("llama 2->1, 4 KiB READ slices", 2, 1), .quick = 1, .max_read = 4096 },
	/* DSCP 26 (AF31) on every connection of both engines. */
	{ LLAMA("llama 2->1, traffic class DSCP 26", 2, 1), .quick = 1,
	  .tos = (26 << 2) + 1 },
	{ LLAMA("llama 2->2 full hit", 2, 2), .full_hit = 1 },
	/* Full hits through few slots: nothing to read, so nothing queued
	 * on a rank's other queue pairs, and the slots come back. */
	{ LLAMA("llama 2->1 full hit, 16 requests through 4 slots", 2, 1), .quick = 1,
	  .full_hit = 1, .nreq = 16, .tokens = 32, .max_inflight = 4 },
	{ .name = "qwen2.5-1.5b 4->2 (2 KV heads)", .model = "qwen2.5-1.5b",
	  .layers = 3, .P = 4, .D = 2, .pblock = 16, .dblock = 16,
	  .playout = FHND, .dlayout = FNHD, .pblocks = 64, .dblocks = 64,
	  .nreq = 4, .tokens = 200, .kill_rank = -1 },
	{ .name = "qwen2.5-1.5b 1->4 (2 KV heads)", .model = "qwen2.5-1.5b",
	  .layers = 3, .P = 1, .D = 4, .pblock = 16, .dblock = 16,
	  .playout = FHND, .dlayout = FHND, .pblocks = 64, .dblocks = 64,
	  .nreq = 4, .tokens = 200, .kill_rank = -1 },
	{ .name = "deepseek-v3 MLA 2->1", .model = "deepseek-v3",
	  .layers = 3, .P = 2, .D = 1, .pblock = 64, .dblock = 64,
	  .pblocks = 16, .dblocks = 16, .nreq = 3, .tokens = 300,
	  .kill_rank = -1 },
	{ .name = "deepseek-v3 MLA 1->2, blocks 64->16", .quick = 1, .model = "deepseek-v3",
	  .layers = 2, .P = 1, .D = 2, .pblock = 64, .dblock = 16,
	  .pblocks = 16, .dblocks = 64, .nreq = 3, .tokens = 250,
	  .kill_rank = -1 },
	{ LLAMA("cross-device llama 2->1 (rxe1 -> veth -> rxe0)", 2, 1),
	  .cross = 1, .nreq = 2, .tokens = 64 },
	{ LLAMA("llama 2->1 blocks 24->16 (not nesting)", 2, 1),
	  .pblock = 24, .pblocks = 32 },
	/* Hybrids: state pages pooled with attention pages in each layer's
	 * region; 1 attention layer and 2 state layers. Conv DS -> SD is a
	 * transpose: one SGE per 2-byte element, 15,360 per state layer and
	 * consumer rank, so the WR arrays sized at connect for max_ids per
	 * group are kept to 16 ids. */
	{ .name = "nemotron-h-8b 2->1 (Mamba2 + attention)",
	  .model = "nemotron-h-8b", .layers = 1, .state_layers = 2, .P = 2,
	  .D = 1, .pblock = 16, .dblock = 16, .playout = FHND,
	  .dlayout = FHND, .pblocks = 144, .dblocks = 144, .nreq = 2,
	  .tokens = 64, .kill_rank = -1 },
	{ .name = "nemotron-h-8b 1->2, blocks 16->32, nhd->hnd, conv DS->SD", .quick = 1,
	  .model = "nemotron-h-8b", .layers = 1, .state_layers = 2, .P = 1,
	  .D = 2, .pblock = 16, .dblock = 32, .playout = FNHD,
	  .dlayout = FHND, .pconv = KVP_CONV_DS, .dconv = KVP_CONV_SD,
	  .pblocks = 144, .dblocks = 80, .nreq = 2, .tokens = 64,
	  .max_sge = 4, .max_ids = 16, .kill_rank = -1 },
	{ .name = "qwen3-next-80b-a3b 2->1 (GDN + attention), blocks 32->16", .quick = 1,
	  .model = "qwen3-next-80b-a3b", .layers = 1, .state_layers = 2,
	  .P = 2, .D = 1, .pblock = 32, .dblock = 16, .playout = FHND,
	  .dlayout = FHND, .pblocks = 80, .dblocks = 144, .nreq = 2,
	  .tokens = 64, .kill_rank = -1 },
	{ .name = "cross-device qwen2.5-1.5b 1->2", .model = "qwen2.5-1.5b",
	  .layers = 2, .P = 1, .D = 2, .pblock = 16, .dblock = 16,
	  .playout = FHND, .dlayout = FHND, .pblocks = 16, .dblocks = 16,
	  .nreq = 2, .tokens = 64, .cross = 1, .kill_rank = -1 },
};

int main(int argc, char **argv)
{
	return rt_main(cases, sizeof(cases) / sizeof(cases[0]),
		       argc > 1 ? argv[1] : NULL, 19000);
}
