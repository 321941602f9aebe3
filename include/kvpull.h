/* SPDX-License-Identifier: MIT */
/*
 * kvpull: pull KV-cache blocks between LLM inference engines with RDMA READs.
 *
 * The one public header. Two halves:
 *  - planning (pure, no I/O): describe each engine's KV-cache layout, compile
 *    a transfer plan for one consumer rank against a producer engine, and emit
 *    the work requests of a request into caller-provided arrays;
 *  - transport (libibverbs/librdmacm): agents, handshake, pull, poll.
 *
 * Conventions, everywhere:
 *  - Functions return 0 (or a count >= 0) on success and a negative errno on
 *    failure; they never set errno. kvp_strerror() describes every code.
 *  - A failed call changes nothing: out-parameters are left untouched and
 *    partially built resources are released.
 *  - Opaque handles are created by one call and released by the matching
 *    *_destroy(), which accepts NULL.
 *  - Structs passed in are copied unless a prototype says otherwise.
 */
#ifndef KVPULL_H
#define KVPULL_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVP_VERSION_MAJOR 0
#define KVP_VERSION_MINOR 2
#define KVP_VERSION_PATCH 0

#if defined(__GNUC__) || defined(__clang__)
#define KVP_API __attribute__((visibility("default")))
#define KVP_MUST_CHECK __attribute__((warn_unused_result))
#else
#define KVP_API
#define KVP_MUST_CHECK
#endif

/* Returns the library's version as (major << 16) | (minor << 8) | patch. */
KVP_API uint32_t kvp_version(void);

/* Returns a static, human-readable description of `err` (a negative errno
 * returned by any kvp_ call, or 0). Never NULL; thread-safe. */
KVP_API const char *kvp_strerror(int err);

/* Why a call, a handshake or a transfer was refused or failed, beyond its
 * errno: a code an engine can switch on. The errno says what kind of
 * failure it is (-EPROTO, -EPERM, -ETIMEDOUT...), the reason which check
 * made it; a line for an operator comes with it (kvp_agent_last_error(),
 * struct kvp_engine_info.why). Carried by KVP_EV_ENGINE_DOWN, FAILED,
 * DISCONNECTED and EXPIRED events, by kvp_agent_engine_info() and by
 * kvp_agent_last_error() for the calls that refuse. A producer that
 * refuses a consumer sends its reason: the consumer's engine goes down
 * with KVP_REASON_PEER_REFUSED and the producer's code in peer_reason. */
enum kvp_reason {
	KVP_REASON_NONE = 0,
	/* the handshake (either side) */
	KVP_REASON_MALFORMED,	  /* a blob or message fails its checks */
	KVP_REASON_TP_SIZE,	  /* the peer engine's TP size is not the
				   * number of ranks given */
	KVP_REASON_RANK,	  /* a rank's blob names another rank:
				   * swapped or misaddressed */
	KVP_REASON_ENGINE_ID,	  /* a blob of another engine than the
				   * rest of its ranks' */
	KVP_REASON_MODEL,	  /* compatibility hashes differ: another
				   * model (kvp_layout_compat_hash()) */
	KVP_REASON_LAYOUT,	  /* the planner cannot match the layouts
				   * (the line says which field and why) */
	KVP_REASON_PLAN_COST,	  /* the plan would exceed KVP_PLAN_MAX_WORK */
	KVP_REASON_CARRIED,	  /* a carried blob differs from the one its
				   * rank sends: restarted or stale */
	KVP_REASON_AUTH,	  /* shared secrets differ, or one side has
				   * none */
	KVP_REASON_PEER_FULL,	  /* the peer is at a connection, handshake or
				   * memory limit: retry later */
	KVP_REASON_MR_WINDOW,	  /* a producer rank's MR window is below
				   * the plan's READ length */
	KVP_REASON_UNREACHABLE,	  /* address or route resolution failed, or
				   * nobody listens */
	KVP_REASON_TIMEOUT,	  /* not up within timeout_ms; EXPIRED: the
				   * deadline passed */
	KVP_REASON_PEER_REFUSED,  /* the producer refused us: peer_reason */
	/* after the handshake */
	KVP_REASON_TRANSPORT,	  /* a completion error or a reset */
	KVP_REASON_STALL,	  /* stall_ms passed without progress */
	KVP_REASON_CLOSED,	  /* the peer closed its agent: a clean
				   * close, status 0 */
	KVP_REASON_REMOVED,	  /* kvp_agent_remove_engine() */
	KVP_REASON_DEVICE,	  /* port down, device fatal, QP fatal */
	/* the calls (kvp_agent_last_error()) */
	KVP_REASON_ARGS,	  /* NULL or out-of-range arguments */
	KVP_REASON_IDS_UNEVEN,	  /* more local ids than remote in a group */
	KVP_REASON_IDS_MAX,	  /* an id list longer than max_ids */
	KVP_REASON_IDS_TOKENS,	  /* tokens past the blocks given */
	KVP_REASON_IDS_RANGE,	  /* a block id past num_blocks */
	KVP_REASON_NO_ENGINE,	  /* an unknown engine handle */
	KVP_REASON_IN_FLIGHT,	  /* this req_id is being pulled from this
				   * engine */
	KVP_REASON_BUSY,	  /* max_inflight requests or a full queue */
	KVP_REASON_NOT_UP,	  /* the engine is not up */
	/* producer events */
	KVP_REASON_OTHER_ENGINE,  /* EXPIRED: notifications for req_id came
				   * from another consumer engine, never
				   * from the one expected */
	KVP_REASON_EVICTED,	  /* ENGINE_DOWN: closed to make room within
				   * max_qps; reconnected on demand */
	KVP_REASON_LEASE,	  /* FAILED (-ESTALE): a producer rank did not
				   * hold the request when its bytes were
				   * read (never expected, released,
				   * expired, or another request's lease):
				   * nothing vouches for them */
	KVP_REASON_VERSION,	  /* ENGINE_DOWN (-EPROTONOSUPPORT): the
				   * peer speaks another handshake version;
				   * the reason's line names both versions
				   * (kvpull 0.2.0 and later) */
	KVP_REASON_COUNT
};

/* Room for a reason's line, its terminating NUL included. */
#define KVP_WHY_LEN 128

/* A static, human-readable name of reason `r` ("unknown reason" past the
 * list). Never NULL; thread-safe. */
KVP_API const char *kvp_reason_str(uint32_t r);

/* ------------------------------------------------------------------------
 * Layout model
 *
 * An engine's KV cache is a set of registered *regions* (tensors). A *group*
 * is a KV-cache group with its own block table. A *view* is how one group
 * sees one region for one layer: the page of block b starts at
 * `offset + b * stride` and holds the view's *fields*. A field is a strided
 * sub-tensor of the page: dims with a size, a byte stride and a named axis.
 * Dims that share an axis compose in mixed radix, the first listed being the
 * most significant (a logical block of 64 tokens stored as 4 kernel pages of
 * 16 tokens is two KVP_AXIS_TOKEN dims: {4, kernel page stride}, {16, ...}).
 * The innermost unit is an element of `elem_size` bytes.
 *
 * At most one dim may be sharded across TP ranks. The field then records the
 * axis' global extent (`shard_total`); the rank's range follows from the
 * engine's TP size and rank with kvp_shard_range(), and the dim's size must
 * equal the range's length. A field without a sharded dim is replicated: every
 * rank holds all of it (MLA).
 *
 * A byte's identity is (group, layer, field kind, coordinate on every axis),
 * the token coordinate being the position in the request's sequence. A
 * transfer copies every byte of the consumer's requested blocks from the
 * producer byte of the same identity.
 * ---------------------------------------------------------------------- */

enum kvp_axis {
	KVP_AXIS_TOKEN = 0, /* position in the block, in tokens */
	KVP_AXIS_HEAD,	    /* attention or SSM head */
	KVP_AXIS_DIM,	    /* head dim, latent dim */
	KVP_AXIS_CHANNEL,   /* conv channel */
	KVP_AXIS_STATE,	    /* conv window position, SSM state dim */
	KVP_AXIS_AUX,	    /* anything else that is never sharded */
	KVP_AXIS_COUNT
};

/* Field kinds: the field's name in the identity. Both engines must use the
 * same kind for the same data. */
enum kvp_field_kind {
	KVP_FIELD_K = 0,
	KVP_FIELD_V,
	KVP_FIELD_LATENT,  /* MLA compressed KV (+ rope part) */
	KVP_FIELD_CONV_X,  /* conv state, x part of the channels */
	KVP_FIELD_CONV_B,  /* conv state, B part */
	KVP_FIELD_CONV_C,  /* conv state, C part */
	KVP_FIELD_SSM,	   /* SSM / recurrent state */
	KVP_FIELD_CONV_Q,  /* linear attention conv, q part */
	KVP_FIELD_CONV_K,  /* linear attention conv, k part */
	KVP_FIELD_CONV_V,  /* linear attention conv, v part */
	KVP_FIELD_KIND_COUNT
};

enum kvp_group_kind {
	KVP_GROUP_FULL = 0, /* full attention: blocks of tokens, tail on a hit */
	KVP_GROUP_SLIDING,  /* sliding window: like FULL, reads only the tail */
	KVP_GROUP_MLA,	    /* MLA: like FULL, fields replicated */
	KVP_GROUP_STATE,    /* Mamba / linear-attention state: whole states,
			     * never trimmed, never split by tokens */
	KVP_GROUP_KIND_COUNT
};

#define KVP_MAX_DIMS 6
#define KVP_NO_SHARD 0xffu

struct kvp_dim {
	uint64_t stride; /* bytes between consecutive indices */
	uint32_t size;	 /* indices held by this rank */
	uint32_t axis;	 /* enum kvp_axis */
};

struct kvp_field_desc {
	uint32_t kind;	    /* enum kvp_field_kind */
	uint32_t elem_size; /* bytes per element (dtype size) */
	uint64_t offset;    /* byte offset of element 0 in the page */
	uint32_t ndim;	    /* 1..KVP_MAX_DIMS */
	uint32_t shard_dim; /* index into dim[] or KVP_NO_SHARD */
	uint32_t shard_total; /* global extent of the sharded axis */
	uint32_t comp_mask;   /* must be 0 */
	struct kvp_dim dim[KVP_MAX_DIMS];
};

struct kvp_group_desc {
	uint32_t kind;	       /* enum kvp_group_kind */
	uint32_t block_tokens; /* tokens per block id; 0 for STATE groups */
	uint32_t comp_mask;    /* must be 0 */
};

struct kvp_view_desc {
	uint32_t group;	     /* from kvp_layout_add_group() */
	uint32_t region;     /* from kvp_layout_add_region() */
	uint32_t layer;	     /* model layer this view belongs to */
	uint32_t num_blocks; /* pages addressable through this view */
	uint64_t offset;     /* byte offset of page 0 in the region */
	uint64_t stride;     /* bytes between consecutive pages */
	uint32_t comp_mask;  /* must be 0 */
};

struct kvp_layout_attr {
	uint64_t engine_id;
	uint32_t tp_size;
	uint32_t tp_rank;
	uint32_t comp_mask; /* must be 0 */
};

typedef struct kvp_layout kvp_layout;

/* Computes the global range [*start, *start + *len) of an axis of global
 * extent `total` held by `rank` of `tp_size`: total/tp_size indices per rank
 * when tp_size divides total, one index replicated on tp_size/total ranks
 * when total divides tp_size. Returns 0, or -EINVAL when neither divides or
 * rank >= tp_size (outputs untouched). Pure; thread-safe. */
KVP_API KVP_MUST_CHECK int kvp_shard_range(uint32_t total, uint32_t tp_size,
					   uint32_t rank, uint32_t *start,
					   uint32_t *len);

/* The largest TP size a layout may have (a bound on the ranks a plan or a
 * handshake ever walks, whatever a peer claims). */
#define KVP_MAX_TP_SIZE 1024

/* Creates an empty layout for one rank of an engine. Returns 0 and a layout
 * owned by the caller (kvp_layout_destroy()), -EINVAL if tp_rank >= tp_size,
 * tp_size is 0 or tp_size > KVP_MAX_TP_SIZE, -ENOMEM. */
KVP_API KVP_MUST_CHECK int kvp_layout_create(const struct kvp_layout_attr *attr,
					     kvp_layout **out);

/* Releases a layout. NULL is a no-op. */
KVP_API void kvp_layout_destroy(kvp_layout *layout);

/* Copies a layout. Returns 0 and a new layout owned by the caller, -ENOMEM. */
KVP_API KVP_MUST_CHECK int kvp_layout_clone(const kvp_layout *layout,
					    kvp_layout **out);

/* Adds a group, a region of `size` bytes, or a view. Each returns 0 and the
 * new object's index in *id (ids count from 0 in order of addition), or
 * -EINVAL for a bad description (the layout is unchanged), -ENOMEM. A view
 * must reference an existing group and region. */
KVP_API KVP_MUST_CHECK int kvp_layout_add_group(kvp_layout *layout,
						const struct kvp_group_desc *g,
						uint32_t *id);
KVP_API KVP_MUST_CHECK int kvp_layout_add_region(kvp_layout *layout,
						 uint64_t size, uint32_t *id);
KVP_API KVP_MUST_CHECK int kvp_layout_add_view(kvp_layout *layout,
					       const struct kvp_view_desc *v,
					       uint32_t *id);

/* Adds a field to view `view`. Returns 0, or -EINVAL (layout unchanged) when
 * the field is malformed: no dims or too many, a zero size or element size,
 * a sharded dim whose size is not the rank's shard length, a sharded axis
 * that also appears in another dim, a token axis whose dims do not compose to
 * the group's block_tokens, a token axis in a STATE group, a kind already
 * present in another field of the same (group, layer), or an extent that
 * runs past the region for the view's last block. -ENOMEM. */
KVP_API KVP_MUST_CHECK int kvp_layout_add_field(kvp_layout *layout,
						uint32_t view,
						const struct kvp_field_desc *f);

/* Read-only inspection. Counts never fail (a NULL layout reads as all
 * zeros, a NULL info is left alone); the getters return 0, or -EINVAL for
 * a NULL or an index out of range (output untouched). */
struct kvp_layout_info {
	uint64_t engine_id;
	uint32_t tp_size, tp_rank;
	uint32_t ngroups, nregions, nviews, nfields;
};
KVP_API void kvp_layout_get_info(const kvp_layout *layout,
				 struct kvp_layout_info *info);
KVP_API KVP_MUST_CHECK int kvp_layout_get_group(const kvp_layout *layout,
						uint32_t i,
						struct kvp_group_desc *g);
KVP_API KVP_MUST_CHECK int kvp_layout_get_region(const kvp_layout *layout,
						 uint32_t i, uint64_t *size);
KVP_API KVP_MUST_CHECK int kvp_layout_get_view(const kvp_layout *layout,
					       uint32_t i,
					       struct kvp_view_desc *v);
/* Field i (fields are numbered across views in order of addition); *view
 * receives the index of the view holding it. */
KVP_API KVP_MUST_CHECK int kvp_layout_get_field(const kvp_layout *layout,
						uint32_t i, uint32_t *view,
						struct kvp_field_desc *f);

/* A 64-bit hash of everything that must agree between engines for a plan to
 * exist (groups, layers, field kinds, global axis extents, element sizes),
 * independent of TP size, rank, block size and memory layout. 0 for a
 * NULL layout (no layout hashes to 0 but by chance). */
KVP_API uint64_t kvp_layout_compat_hash(const kvp_layout *layout);

/* Where a region lives on its owner, for remote access: set by the transport
 * (or by a user carrying metadata over their own channel) and carried by the
 * metadata blob. Both return 0, or -EINVAL for a bad index. */
KVP_API KVP_MUST_CHECK int kvp_layout_set_region_key(kvp_layout *layout,
						     uint32_t region,
						     uint64_t addr,
						     uint32_t rkey);
KVP_API KVP_MUST_CHECK int kvp_layout_get_region_key(const kvp_layout *layout,
						     uint32_t region,
						     uint64_t *addr,
						     uint32_t *rkey);

/* A region registered as several memory regions (MRs), because the device
 * caps one MR below the region's size (max_mr_size: 2 GiB on some), has one
 * key per 2^shift bytes: MR k covers the region's bytes from k << shift,
 * 2^shift + 2^(shift - 3) bytes long (clipped at the region's end), so that
 * MRs overlap by KVP_MR_WINDOW(shift) bytes and any access of at most that
 * many bytes lies in the MR of the piece it starts in: key[offset >> shift].
 * A peer keeps its READs that short. nkeys must be exactly
 * ceil(size / 2^shift), at most KVP_MR_MAX_KEYS; shift KVP_MR_SHIFT_MIN to KVP_MR_SHIFT_MAX, or 0
 * with one key (what kvp_layout_set_region_key() sets). Returns 0, or
 * -EINVAL for a bad index, shift or key count; -ENOMEM. */
#define KVP_MR_SHIFT_MIN 15
#define KVP_MR_SHIFT_MAX 62
#define KVP_MR_MAX_KEYS (1u << 20)
#define KVP_MR_WINDOW(shift) (1ull << ((shift) - 3))
KVP_API KVP_MUST_CHECK int kvp_layout_set_region_keys(kvp_layout *layout,
						      uint32_t region,
						      uint64_t addr,
						      uint32_t shift,
						      const uint32_t *keys,
						      uint32_t nkeys);
/* Region `region`'s address, shift (0: one key) and keys: copies the first
 * min(nkeys, cap) keys to keys[] (NULL with cap 0 to count them). Returns
 * nkeys (at least 1), or -EINVAL. */
KVP_API KVP_MUST_CHECK int kvp_layout_get_region_keys(const kvp_layout *layout,
						      uint32_t region,
						      uint64_t *addr,
						      uint32_t *shift,
						      uint32_t *keys,
						      uint32_t cap);

/* ------------------------------------------------------------------------
 * Metadata blob: a layout (with region keys) on the wire.
 *
 * Magic "KVPM", version, section lengths, fixed-width little-endian fields,
 * the compatibility hash. Decoding checks every length and every field
 * before building anything and rejects the blob whole on any error.
 * ---------------------------------------------------------------------- */

/* Version 1, or 2 when a region has several keys (a key table follows the
 * records); kvp_meta_decode() reads both. */
#define KVP_META_VERSION 1
#define KVP_META_VERSION_KEYS 2

/* The length of the shortest blob kvp_meta_decode() can accept: a header
 * (56 bytes) and one group (8), one region (24), one view (32) and one field
 * (128) record, since a layout without a field is refused. kvp_meta_decode()
 * refuses any shorter input with -EMSGSIZE before reading it; a transport
 * may refuse a peer-declared length below it just as early. */
#define KVP_META_MIN_LEN 248

/* Encodes `layout` into buf[cap]. Returns 0 and the blob length in *len;
 * -EMSGSIZE when cap is too small (then *len receives the size needed and
 * buf is untouched); -EINVAL. buf may be NULL with cap 0 to query the size. */
KVP_API KVP_MUST_CHECK int kvp_meta_encode(const kvp_layout *layout, void *buf,
					   size_t cap, size_t *len);

/* Decodes a blob. Returns 0 and a new layout owned by the caller; -EPROTO
 * for anything malformed (bad magic, unknown version, a length that does not
 * add up, a TP size above KVP_MAX_TP_SIZE or a rank not below it, no field,
 * an invalid group, view or field, a hash that does not match); -EMSGSIZE
 * for a truncated blob or any len below KVP_META_MIN_LEN; -ENOMEM. Never
 * reads past buf[len]; time and memory are linear in len. A layout without
 * a field encodes, but its blob does not decode. */
KVP_API KVP_MUST_CHECK int kvp_meta_decode(const void *buf, size_t len,
					   kvp_layout **out);

/* ------------------------------------------------------------------------
 * Models and engine layouts
 * ---------------------------------------------------------------------- */

/* Memory layouts engines use today. */
enum kvp_kv_layout {
	KVP_KV_FLASH_NHD = 0, /* vLLM FlashAttention: K and V tensors per layer,
			       * page (block_size, kv_heads, head_dim) */
	KVP_KV_FLASH_HND,     /* same, page (kv_heads, block_size, head_dim) */
	KVP_KV_FLASHINFER,    /* one tensor per layer, page (2, kv_heads,
			       * block_size, head_dim): K then V (HND) */
	KVP_KV_PACKED,	      /* one tensor per layer, page (kv_heads,
			       * block_size, 2 * head_dim): K|V per token */
	KVP_KV_LAYOUT_COUNT
};

/* State layers of hybrid models. */
enum kvp_state_kind {
	KVP_STATE_NONE = 0,
	KVP_STATE_MAMBA2, /* conv state (x | B | C) + SSM state */
	KVP_STATE_GDN,	  /* gated delta net: conv (q | k | v) + recurrent */
	KVP_STATE_KIND_COUNT
};

/* Conv state memory order: channel-major (DS, vLLM's) or state-major. */
enum kvp_conv_layout {
	KVP_CONV_DS = 0, /* (channels, conv_kernel - 1) */
	KVP_CONV_SD,	 /* (conv_kernel - 1, channels) */
	KVP_CONV_LAYOUT_COUNT
};

/* A model's public configuration numbers. */
struct kvp_model {
	char name[48];
	uint32_t layers;      /* attention (or MLA) layers, full + sliding */
	uint32_t kv_heads;    /* KV heads (ignored for MLA) */
	uint32_t head_dim;    /* per head */
	uint32_t dtype_bytes; /* KV cache element size */
	uint32_t mla_latent;  /* MLA: kv_lora_rank + qk_rope_head_dim; 0 if
			       * the model has no MLA */
	uint32_t comp_mask;   /* must be 0 */
	/* Sliding-window attention: how many of `layers` use a window (they
	 * form their own group; full layers are spread evenly among them). */
	uint32_t sliding_layers;
	/* State layers (hybrid models), a group of their own. Mamba2: heads,
	 * head_dim, state = d_state, groups = n_groups. GDN: heads = value
	 * heads, head_dim = value head dim, state = key head dim, groups =
	 * key heads. */
	uint32_t state_kind;  /* enum kvp_state_kind */
	uint32_t state_layers;
	uint32_t conv_kernel; /* the conv state holds conv_kernel - 1 steps */
	uint32_t ssm_heads, ssm_head_dim, ssm_state, ssm_groups;
	uint32_t state_dtype_bytes; /* SSM / recurrent state element size */
};

/* How one engine runs a model. */
struct kvp_engine_desc {
	uint64_t engine_id;
	uint32_t tp_size, tp_rank;
	uint32_t block_tokens;	      /* logical block size in tokens */
	uint32_t kernel_block_tokens; /* attention kernel block size; 0 means
				       * block_tokens. Must divide it. */
	uint32_t num_blocks;	      /* logical blocks per region */
	uint32_t kv_layout;	      /* enum kvp_kv_layout (ignored for MLA) */
	uint32_t comp_mask;	      /* must be 0 */
	uint32_t conv_layout;	      /* enum kvp_conv_layout (state layers) */
};

/* Fills *m with the preset `name` (case-insensitive), see kvp_model_preset_name().
 * Returns 0, or -ENOENT (m untouched). */
KVP_API KVP_MUST_CHECK int kvp_model_preset(const char *name,
					    struct kvp_model *m);

/* Name of the i-th preset, or NULL past the last. Static strings. */
KVP_API const char *kvp_model_preset_name(uint32_t i);

/* The most layers (m->layers + m->state_layers) kvp_layout_build() and
 * spec files accept: far above any model's, low enough that a hostile spec
 * cannot make a layout of millions of regions. */
#define KVP_MAX_LAYERS 4096

/* Builds the layout of one rank of an engine running model `m`.
 *
 * Groups, in order: full attention (or MLA) if any full layers, sliding
 * window if m->sliding_layers, state if m->state_layers. Without state
 * layers every attention layer has its own regions (K and V apart for the
 * FLASH layouts). With state layers, memory is pooled as in vLLM's hybrid
 * allocator: region i is shared by attention layer i and state layer i; the
 * attention view pages hold K then V (each NHD or HND per kv_layout, or
 * packed), and a state page spans the smallest whole number of attention
 * pages that holds conv + SSM state (its "physical blocks per logical
 * block"), so state block ids count in those larger pages (num_blocks /
 * ratio of them).
 *
 * Returns 0 and a layout owned by the caller, -EINVAL when the numbers do
 * not make a layout (TP size neither dividing nor divided by the KV heads or
 * a sharded state dimension, or above KVP_MAX_TP_SIZE; kernel block size not
 * dividing the block size; more than KVP_MAX_LAYERS layers; zeros; sizes
 * overflowing), -ENOMEM. Time and memory are linear in the layers. */
KVP_API KVP_MUST_CHECK int kvp_layout_build(const struct kvp_model *m,
					    const struct kvp_engine_desc *e,
					    kvp_layout **out);

/* kvp_layout_build(), and on failure, if `msg` is not NULL, a one-line
 * reason naming the rule broken and its numbers in msg[msglen] (truncated
 * to fit, always NUL-terminated when msglen > 0), e.g. "TP 3 does not
 * divide and is not divided by 8 KV heads", "kernel block 5 does not divide
 * the block size 16", "TP size must be at least 1". The numbers are checked
 * in the order of the list above; the reason names the first rule broken.
 * On success msg is untouched. -ENOMEM leaves msg untouched too. */
KVP_API KVP_MUST_CHECK int kvp_layout_build_msg(const struct kvp_model *m,
						const struct kvp_engine_desc *e,
						kvp_layout **out, char *msg,
						size_t msglen);

/* Builds a layout from a text spec (see docs/guide.md, "Spec files"). On
 * failure returns -EINVAL (or -ENOMEM, -ENOENT for an unknown preset) and,
 * if `msg` is not NULL, a one-line reason with the line number in
 * msg[msglen]. The
 * limits are kvp_layout_build()'s and the builders': tp_size at most
 * KVP_MAX_TP_SIZE, layers + state_layers at most KVP_MAX_LAYERS. Time is
 * linear in len and in the layers. */
KVP_API KVP_MUST_CHECK int kvp_layout_parse(const char *text, size_t len,
					    kvp_layout **out, char *msg,
					    size_t msglen);

/* ------------------------------------------------------------------------
 * Plans
 * ---------------------------------------------------------------------- */

typedef struct kvp_plan kvp_plan;

/* kvp_plan_attr.comp_mask: which fields after comp_mask are set. A field
 * whose bit is clear is not read (binaries built against a header without it
 * pass a shorter struct) and takes its default. */
enum {
	KVP_PLAN_ATTR_MAX_LEN = 1u << 0, /* max_len is set */
	KVP_PLAN_ATTR_FLAGS = 1u << 1,	 /* flags is set */
};

/* kvp_plan_attr.flags */
enum {
	/* A benchmark aid, not for production: no coalescing at all, one
	 * READ of one SGE per piece template per period, as connectors that
	 * post one descriptor per block per region do (each piece is one
	 * contiguous range of one page on both sides). Lets a benchmark
	 * compare that design with coalesced emission on the same plan. */
	KVP_PLAN_NO_COALESCE = 1u << 0,
};

struct kvp_plan_attr {
	uint32_t max_sge;   /* local SGEs per work request; 0 means 1 */
	uint32_t comp_mask; /* KVP_PLAN_ATTR_* bits; others must be 0 */
	/* Bytes per READ, with KVP_PLAN_ATTR_MAX_LEN: 0 (or the bit clear)
	 * means 2^31, IB's largest message; otherwise 1 to 2^31, any value
	 * (READs need no alignment; a power of two or a multiple of the
	 * element size keeps READ edges on element edges, nothing more).
	 * Pass the port's max_msg_sz, or a smaller slice (1 MiB) to bound
	 * how long one READ holds the link. Coalescing stops where a READ
	 * would pass it, and piece templates longer than it are cut into
	 * max_len-byte chunks at compile time, so a READ is never longer. */
	uint32_t max_len;
	uint32_t flags; /* with KVP_PLAN_ATTR_FLAGS: KVP_PLAN_* bits */
};

/* Compiles the plan for the consumer rank described by `local` pulling from
 * the producer engine described by `remote` (any rank's layout of it: the
 * other ranks' shards follow from its TP size). Returns 0 and a plan owned by
 * the caller (kvp_plan_destroy()); -EPROTO when the layouts cannot be matched
 * (different groups, layers, fields, extents, element sizes; block sizes
 * whose least common multiple exceeds 65,535 blocks of either side), with a
 * one-line reason naming what differs in msg[msglen] when msg is not NULL;
 * -EINVAL for bad arguments (unknown comp_mask or flags bits, max_len above
 * 2^31); -EFBIG when the plan would take more than KVP_PLAN_MAX_WORK
 * piece templates to make (counted before they are made, so a refusal
 * costs microseconds: a layout whose dims are reversed against the other
 * side's, with coprime block sizes, asks for millions; real layouts need
 * under 2^15), with the field or the max_len to blame in msg; -ENOMEM. A
 * max_len so small that one set would hold more than 2^20 piece templates
 * is -EPROTO. Any two block sizes and kernel block
 * sizes are otherwise matched, nesting or not (16 and 24 tokens: a period
 * of 48). Inputs are not referenced after the call. The plan is immutable
 * and may be shared between threads. */
/* The most piece templates one kvp_plan_compile() makes (before merging):
 * a bound on the time and memory a peer's layout can cost. */
#define KVP_PLAN_MAX_WORK (1u << 16)
KVP_API KVP_MUST_CHECK int kvp_plan_compile(const kvp_layout *local,
					    const kvp_layout *remote,
					    const struct kvp_plan_attr *attr,
					    kvp_plan **out, char *msg,
					    size_t msglen);

KVP_API void kvp_plan_destroy(kvp_plan *plan);

/* The block ids of one group of a request. `remote` are the producer's
 * blocks holding the sequence from its first token; `local` the consumer's
 * blocks to fill. For token groups the local blocks cover the tail of the
 * sequence: a prefix-cache hit or a sliding window needs fewer of them, and
 * the leading ceil(tokens / local block size) - nlocal local blocks are not
 * read. `tokens` is the sequence length; 0 means the remote blocks are full
 * (nremote * remote block size). For STATE groups both lists have the same
 * length, block i pairs with block i, and `tokens` is ignored.
 *
 * The partial last block: READs cover whole blocks, never a part of one.
 * Token positions at and past `tokens` in the last local block are
 * overwritten with the producer's bytes at the same positions (whatever
 * its blocks hold past the sequence: stale or zero) where the remote blocks
 * given hold those positions, and left as they were where they do not
 * (remote blocks smaller than local ones). Either way they are not part of
 * the sequence: an engine must treat them as unwritten KV. Pinned by
 * tests/test_emit_window.c test_partial_last_block. */
struct kvp_ids {
	const uint32_t *local;
	const uint32_t *remote;
	uint32_t nlocal, nremote;
	uint64_t tokens;
};

/* One RDMA READ: `len` bytes at `offset` of remote region `region` of source
 * rank `src` (an index into the plan's source list, kvp_plan_source()),
 * scattered into `nsge` local pieces starting at sge[sge_first]. */
struct kvp_wr {
	uint64_t offset;
	uint32_t len;
	uint32_t region;
	uint32_t src;
	uint32_t sge_first;
	uint32_t nsge;
	uint32_t group;
};

struct kvp_sge {
	uint64_t offset; /* in local region `region` */
	uint32_t len;
	uint32_t region;
};

/* Upper bounds on the WRs and SGEs kvp_plan_emit() can write for a request
 * whose id lists hold at most `max_ids` ids each. A NULL plan gives 0 and 0;
 * a NULL output pointer is skipped. */
KVP_API void kvp_plan_emit_bound(const kvp_plan *plan, uint32_t max_ids,
				 uint32_t *max_wrs, uint32_t *max_sges);

/* Writes the READs of one request: ids[g] for each group g of the plan.
 * WRs come out ordered by source index, coalesced: consecutive pieces that
 * are contiguous on the remote side share a WR (up to max_sge local SGEs
 * and max_len bytes), and local pieces that are contiguous share an SGE.
 * Pieces are walked stream by stream, period by period, except that the
 * streams of a gather (kvp_plan_stream_gather()) are walked as one, each
 * period's pieces in remote order, so that one READ runs across streams
 * (one producer page feeding several consumer regions). No WR is longer
 * than the plan's max_len.
 * Returns the number of WRs written (0 on a full prefix hit), -ERANGE when a
 * block id is out of range, -EINVAL for id lists that do not fit the group
 * (more local blocks than the remote ones cover, unequal STATE lists),
 * -ENOSPC when wr_cap or sge_cap is below this request's bound (one WR and
 * one SGE per piece template per period the request walks, before any
 * coalescing; kvp_plan_emit_bound() with the request's largest id count is
 * always enough), -EOVERFLOW when that bound exceeds INT_MAX (the count
 * could not be returned: split the request). Every check runs before
 * anything is written: on error
 * wr, sge and src_end are untouched. Allocation-free and thread-safe. If
 * src_end is not NULL, src_end[s] receives one past the last WR of source s
 * (kvp_plan_info.nsrc entries). */
KVP_API KVP_MUST_CHECK int kvp_plan_emit(const kvp_plan *plan,
					 const struct kvp_ids *ids,
					 struct kvp_wr *wr, uint32_t wr_cap,
					 struct kvp_sge *sge, uint32_t sge_cap,
					 uint32_t *src_end);

/* A position in the READs of one source (an index into the plan's source
 * list, kvp_plan_source()) of one request: lets a transport emit a request
 * in windows that fit a send queue's free room, with memory bounded by the
 * queue's depth rather than by the request's size. Plain data: copy freely.
 * Set it with kvp_plan_emit_start(); a zeroed position is a finished one
 * (kvp_plan_emit_done() is 1). 20 bytes. */
struct kvp_emit_pos {
	uint32_t stream; /* next stream (kvp_plan_get_stream() index; the
			  * first of its gather if it is in one) */
	uint32_t end;	 /* one past the source's last stream */
	uint32_t period; /* next period of that stream, counted from the
			  * first one the request walks in it */
	uint32_t piece;	 /* next piece within the period (of the gather's
			  * pieces merged in remote order, in a gather) */
	uint32_t src;	 /* the source index, as in kvp_wr.src */
};

/* Checks a request's ids exactly as kvp_plan_emit() does, without writing
 * anything: 0, -EINVAL (NULL plan or ids, and kvp_plan_emit()'s -EINVAL
 * cases), -ERANGE (a block id out of range). O(ids), allocation-free and
 * thread-safe. */
KVP_API KVP_MUST_CHECK int kvp_plan_emit_check(const kvp_plan *plan,
					       const struct kvp_ids *ids);

/* Sets *pos at the first READ of source index `src` (0 to
 * kvp_plan_info.nsrc - 1: a producer rank only notified, listed by
 * kvp_plan_notify() and not by kvp_plan_source(), has no source index and
 * nothing to read) for the request `ids`, which must have passed
 * kvp_plan_emit_check(). A source the request reads nothing from (a full
 * prefix hit) is done at once. Returns 0, or -EINVAL (src out of range,
 * NULLs, ids that kvp_plan_emit_check() refuses for their lengths) with
 * *pos untouched. O(log streams + streams of the source), reads no id,
 * allocation-free and thread-safe. */
KVP_API KVP_MUST_CHECK int kvp_plan_emit_start(const kvp_plan *plan,
					       const struct kvp_ids *ids,
					       uint32_t src,
					       struct kvp_emit_pos *pos);

/* Writes up to wr_cap READs, using at most sge_cap SGEs, of pos's source
 * for the request `ids` (the same ids that kvp_plan_emit_start() saw),
 * continuing where pos stands, and advances pos past them. WRs and SGEs are
 * laid out as kvp_plan_emit()'s (sge_first counts from this call's sge;
 * src is the source index) and coalesced the same way within the window,
 * across consecutive streams of the source too; the window's last READ is
 * closed there, never continued by the next call. Every byte of the
 * source's READs is written by exactly one window. With caps at least
 * kvp_plan_emit()'s for the source, one window writes exactly the WRs and
 * SGEs kvp_plan_emit() writes for it.
 * Returns the number of WRs written, and in *bytes (if not NULL) the bytes
 * they read. Returns 0 with pos untouched when wr_cap or sge_cap is 0;
 * otherwise 0 only when the source is finished (kvp_plan_emit_done()).
 * -EINVAL (nothing written, pos untouched) for NULLs, a pos whose end is
 * past the plan's streams, or ids whose lengths no longer fit the plan.
 * Ids are not checked against the block bounds again: ids that did not
 * pass kvp_plan_emit_check() are undefined behaviour. Allocation-free;
 * thread-safe on distinct positions. */
KVP_API KVP_MUST_CHECK int kvp_plan_emit_window(const kvp_plan *plan,
						const struct kvp_ids *ids,
						struct kvp_emit_pos *pos,
						struct kvp_wr *wr,
						uint32_t wr_cap,
						struct kvp_sge *sge,
						uint32_t sge_cap,
						uint64_t *bytes);

/* Emission straight into a transport's own work requests: a verbs
 * provider's struct ibv_send_wr and struct ibv_sge, or any records with
 * such fields, with addresses and keys resolved on the way, so that no
 * conversion pass follows. kvpull's plan/ does not include verbs.h: the
 * sink names the record's size and its fields' offsets (offsetof() of
 * struct ibv_send_wr), and scatter entries have struct ibv_sge's layout.
 *
 * A region's map: its byte `off` is at addr + off, under the key
 * key[off >> shift] (shift 63: one key; several: the MRs of a region
 * registered in pieces, kvp_layout_set_region_keys(), whose window the
 * plan's max_len must not exceed). */
struct kvp_emit_map {
	uint64_t addr;
	const uint32_t *key;
	uint32_t shift;
	uint32_t comp_mask; /* must be 0 */
};

/* struct ibv_sge's layout. */
struct kvp_emit_sge {
	uint64_t addr;
	uint32_t length;
	uint32_t key;
};

struct kvp_emit_sink {
	void *wr;	    /* wr_cap records of wr_stride bytes */
	uint32_t wr_stride; /* at least 32, a multiple of 8 */
	uint32_t comp_mask; /* must be 0 */
	/* Byte offsets in a record, each of a field of the type named, each
	 * aligned to its size: u64 wr_id, pointer sg_list (to the record's
	 * first scatter entry), int num_sge, u64 remote_addr, u32 rkey. The
	 * record's other fields (next, opcode, flags) are the caller's. */
	uint32_t off_wr_id, off_sg_list, off_num_sge, off_remote_addr,
		off_rkey;
	uint64_t wr_id;		   /* stored in every record */
	struct kvp_emit_sge *sge;  /* sge_cap entries */
	/* Per region of the plan's local layout, and per region of the
	 * producer rank that pos's source reads. */
	const struct kvp_emit_map *local, *remote;
};

/* kvp_plan_emit_window() into a sink: the same READs, SGEs and bytes in the
 * same order, each WR's remote address and key and each SGE's address and
 * key resolved through the maps; the position advances the same way.
 * Returns the number of WRs written and, if not NULL, in *nsge the SGEs
 * used and in *bytes the bytes read; -EINVAL as kvp_plan_emit_window(), and
 * for a sink with NULL records, scatter entries or maps, a non-zero
 * comp_mask, a stride or an offset that does not fit. A map is checked
 * when the window reaches the first stream that reads its region: a NULL
 * key table, a shift of 64 or more or a non-zero comp_mask there ends the
 * window before that stream (the WRs of the streams before it are
 * returned) and makes the next call return -EINVAL with nothing written
 * and pos untouched. The key arrays' lengths cannot be checked: a key
 * table shorter than its region's MR count is undefined behaviour.
 * Allocation-free; thread-safe on distinct positions and sinks. */
KVP_API KVP_MUST_CHECK int
kvp_plan_emit_window_into(const kvp_plan *plan, const struct kvp_ids *ids,
			  struct kvp_emit_pos *pos,
			  const struct kvp_emit_sink *sink, uint32_t wr_cap,
			  uint32_t sge_cap, uint32_t *nsge, uint64_t *bytes);

/* ---- Streaming: a request's READs in the order its bytes are written ----
 *
 * A producer that publishes its prefill's progress lets a consumer read
 * each part as soon as it is written, from the same plan. Progress, per
 * request and producer rank, only grows:
 *   tokens [0, tokens_all) are written in every layer, and
 *   tokens [tokens_all, tokens_cur) in model layers [0, layers_cur).
 * A layer-wise prefill moves layers_cur; a chunked prefill moves
 * tokens_all chunk by chunk. The last chunk is published as
 * KVP_TOKENS_END: "to the end of the sequence", which also completes the
 * recurrent state of STATE groups (Mamba2, GDN), whole only once the last
 * chunk went through its layer. tokens_all = tokens_cur = KVP_TOKENS_END
 * is a finished prefill. */
#define KVP_TOKENS_END UINT64_MAX

struct kvp_progress {
	uint64_t tokens_all;
	uint64_t tokens_cur;  /* >= tokens_all */
	uint32_t layers_cur;  /* ignored when tokens_cur == tokens_all */
	uint32_t comp_mask;   /* must be 0 */
};

/* A part of a request: of each stream whose model layer (a gather's last
 * one: kvp_plan_stream_gather()) is in [layer0, layer1), the blocks whose
 * last token of the sequence lies in (tok0, tok1]. Token groups count in
 * periods of period_tokens (kvp_plan_group): period k ends at
 * min((k + 1) * period_tokens, tokens), so a consumer block that straddles
 * a chunk boundary is read with the later chunk. A STATE group's blocks
 * are in the range with tok1 == KVP_TOKENS_END (and tok0 below it), in no
 * other. Ranges that partition layers x (0, KVP_TOKENS_END] partition the
 * request's READs: every byte kvp_plan_emit() reads is read by exactly one
 * of them, and (coalescing aside) by a READ of the same pieces. */
struct kvp_emit_range {
	uint32_t layer0, layer1; /* layer0 <= layer1 */
	uint64_t tok0, tok1;	 /* tok0 <= tok1 */
	uint32_t comp_mask;	 /* must be 0 */
	uint32_t pad;		 /* 0 */
};

/* What became readable between two progresses of one producer rank: at
 * most 3 ranges into out[], the layers [a, b) whose readable tokens grew,
 * each with the tokens they grew by; their READs are exactly those of
 * `next` that `prev` did not cover. Returns how many (0 when nothing
 * grew); -EINVAL for a NULL, tokens_all > tokens_cur or a non-zero
 * comp_mask; -ERANGE when next covers less than prev in some layer
 * (progress only grows). Pure arithmetic, O(1). A zeroed progress is
 * "nothing written". */
KVP_API KVP_MUST_CHECK int kvp_progress_ranges(const struct kvp_progress *prev,
					       const struct kvp_progress *next,
					       struct kvp_emit_range out[3]);

/* kvp_plan_emit_start(), kvp_plan_emit_window() and
 * kvp_plan_emit_window_into() for the part of the request in range r: the
 * same READs, coalesced the same way within what the range holds. Pass the
 * same range to every window of one position. -EINVAL also for a NULL or
 * malformed range (comp_mask, layer0 > layer1, tok0 > tok1). A range that
 * holds nothing of the source is done at once. */
KVP_API KVP_MUST_CHECK int
kvp_plan_emit_range_start(const kvp_plan *plan, const struct kvp_ids *ids,
			  uint32_t src, const struct kvp_emit_range *r,
			  struct kvp_emit_pos *pos);
KVP_API KVP_MUST_CHECK int
kvp_plan_emit_range_window(const kvp_plan *plan, const struct kvp_ids *ids,
			   const struct kvp_emit_range *r,
			   struct kvp_emit_pos *pos, struct kvp_wr *wr,
			   uint32_t wr_cap, struct kvp_sge *sge,
			   uint32_t sge_cap, uint64_t *bytes);
KVP_API KVP_MUST_CHECK int
kvp_plan_emit_range_window_into(const kvp_plan *plan,
				const struct kvp_ids *ids,
				const struct kvp_emit_range *r,
				struct kvp_emit_pos *pos,
				const struct kvp_emit_sink *sink,
				uint32_t wr_cap, uint32_t sge_cap,
				uint32_t *nsge, uint64_t *bytes);

/* 1 when every READ of pos's source has been written, else 0; -EINVAL
 * for a NULL pos. */
KVP_API KVP_MUST_CHECK int
kvp_plan_emit_done(const struct kvp_emit_pos *pos);

/* Plan inspection (for tools and the transport). */
struct kvp_plan_info {
	uint32_t ngroups;
	uint32_t nsrc;	   /* producer ranks read from, all groups */
	uint32_t nnotify;  /* producer ranks this consumer notifies */
	uint32_t nstreams; /* (source, local view, remote view) pairs */
	uint32_t npieces;  /* distinct piece templates */
	uint32_t local_tp, local_rank, remote_tp;
	uint32_t max_sge;
	uint32_t max_len;  /* bytes per READ at most (kvp_plan_attr.max_len) */
	uint64_t bytes;	   /* plan size in memory */
};
/* A NULL plan reads as all zeros; a NULL info is left alone. */
KVP_API void kvp_plan_get_info(const kvp_plan *plan, struct kvp_plan_info *info);

/* Producer rank of source index i, or -EINVAL. */
KVP_API KVP_MUST_CHECK int kvp_plan_source(const kvp_plan *plan, uint32_t i);
/* Producer rank of notify index i, or -EINVAL. */
KVP_API KVP_MUST_CHECK int kvp_plan_notify(const kvp_plan *plan, uint32_t i);

struct kvp_plan_group {
	uint32_t kind;
	uint32_t local_tokens, remote_tokens; /* block sizes, 0 for STATE */
	uint32_t period_tokens;		      /* lcm of the two, 0 for STATE */
	uint32_t local_per_period, remote_per_period; /* blocks per period */
	uint32_t local_blocks, remote_blocks; /* valid id bounds (exclusive) */
	uint64_t src_mask; /* bit s: source index s serves this group
			    * (sources beyond 64 are all set) */
};
KVP_API KVP_MUST_CHECK int kvp_plan_get_group(const kvp_plan *plan, uint32_t g,
					      struct kvp_plan_group *out);

/* A stream: what one source reads for one (local view, remote view) pair.
 * Its pieces repeat every period of the group. */
struct kvp_plan_stream {
	uint32_t src, group;
	uint32_t local_view, remote_view;
	uint32_t local_region, remote_region;
	uint32_t piece_first, npieces;
	uint64_t bytes_per_period;
	uint32_t layer; /* the model layer of its views (ranges: below) */
	uint32_t pad;	/* 0 */
};
KVP_API KVP_MUST_CHECK int kvp_plan_get_stream(const kvp_plan *plan,
					       uint32_t i,
					       struct kvp_plan_stream *out);

/* How emission reads stream i: 1 alone; n >= 2 when streams i .. i + n - 1
 * form a gather, read as one walk over their pieces merged in remote order
 * (streams of one source, group and remote region whose pieces touch on
 * the remote side: one producer page feeding several consumer regions), so
 * that one READ with several SGEs crosses from one stream to the next; 0
 * when stream i belongs to the gather of an earlier stream. -EINVAL for a
 * NULL plan or i out of range. A gather's streams are consecutive. */
KVP_API KVP_MUST_CHECK int kvp_plan_stream_gather(const kvp_plan *plan,
						  uint32_t i);

/* A piece template: `len` bytes at `remote_offset` in remote block
 * `remote_block` of the period land at `local_offset` in local block
 * `local_block` of the period (offsets relative to the page start). */
struct kvp_plan_piece {
	uint64_t remote_offset, local_offset;
	uint32_t len;
	uint32_t remote_block, local_block;
};
KVP_API KVP_MUST_CHECK int kvp_plan_get_piece(const kvp_plan *plan, uint32_t i,
					      struct kvp_plan_piece *out);

/* ------------------------------------------------------------------------
 * Notifications: one rule shared by both sides.
 * ---------------------------------------------------------------------- */

/* Each consumer rank notifies, after its reads, every producer rank it read
 * from plus the producers [floor(c*P/D), ceil((c+1)*P/D)) so every producer
 * hears of every request. kvp_notify_expected() returns how many consumer
 * notifications producer rank `producer` of engine `producer_layout` must
 * receive for a request before it frees its blocks, when the consumer engine
 * is `consumer_layout` (any rank's layout of each engine). Returns the count
 * (>= 1), -EPROTO exactly when kvp_plan_compile() refuses some consumer
 * rank's plan with -EPROTO, -EFBIG when its compilations together would
 * make more than KVP_PLAN_MAX_WORK piece templates (they share one
 * budget), -EINVAL, -ENOMEM. A producer agent's handshake does not call
 * it: it checks a consumer's layout field by field and counts each
 * consumer rank's sources from its segments, compiling nothing (a
 * consumer whose plan cannot be built refuses itself). Costs one plan compilation per class of
 * consumer ranks whose plans are alike up to a shift of producer ranks
 * (same ranges relative to their shards: a few, e.g. 16 for 128 SSM heads
 * on 8 producer ranks, whatever the consumer TP size D) plus work linear in
 * D times the segments a rank reads: handshake time, not the hot path. */
KVP_API KVP_MUST_CHECK int kvp_notify_expected(const kvp_layout *producer_layout,
					       const kvp_layout *consumer_layout,
					       uint32_t producer);

/* ---- Transport (verbs/) ---- */
/*
 * An agent is one engine rank's endpoint on one RDMA device: a protection
 * domain, the rank's registered regions, completion queues (as many as
 * its queue pairs need within the device's max_cqe), and RC queue pairs
 * to its peer ranks (a consumer: qps_per_peer to each producer rank it
 * reads from), set up over librdmacm. The tables for max_qps queue pairs
 * are sized at open; what a slot needs beyond them (its credit counter,
 * progress records, notification buffers) is set up when a peer first
 * takes it and kept. Its memory is registered once and serves every
 * peer engine for the agent's life, whatever comes and goes.
 *
 *   producer rank                         consumer rank
 *   kvp_agent_open(PRODUCER)              kvp_agent_open(CONSUMER)
 *   kvp_agent_register() every region     kvp_agent_register() every region
 *   kvp_agent_listen(ip, port)            kvp_agent_add_engine(ranks) -> h
 *                                         (any number of producer engines)
 *   kvp_agent_expect(req, deadline)       kvp_agent_pull_from(h, req, ids)
 *   kvp_agent_poll(): RELEASED/EXPIRED    kvp_agent_poll(): ENGINE_UP/DOWN,
 *                                         DONE/FAILED
 *
 * An agent opened with KVP_ROLE_BOTH does both with one registration.
 *
 * Handshake, per producer engine, driven by kvp_agent_poll(): a consumer
 * rank first connects to one producer rank, receives
 * its metadata blob (kvp_meta_encode(): layout, region addresses and rkeys),
 * compiles its plan with kvp_plan_compile(), then connects to exactly the
 * producer ranks the plan reads from or must notify (kvp_plan_source(),
 * kvp_plan_notify()) and checks that every rank's blob belongs to the same
 * engine (engine id, TP size, rank, kvp_layout_compat_hash(), geometry).
 * Each side also sends the other its own blob, so a producer rank learns how
 * many consumer notifications free a request (kvp_notify_expected()).
 *
 * Carried metadata: a rank's blob can also be taken with
 * kvp_agent_get_meta() and carried over the user's own channel (the
 * engines' control plane, a file, a key-value store). A consumer given
 * producer ranks' blobs in struct kvp_peer checks them and compiles its
 * plan before touching the network, skips the first connection above, and
 * still checks that each of those ranks sends the same bytes in-band.
 *
 * Requests: kvp_agent_pull() posts a request's RDMA READs, chained per
 * queue pair, one ibv_post_send() per queue pair and window; a rank's
 * READs are striped over its qps_per_peer queue pairs (windows taken in
 * turn from one emission cursor). Once all of a rank's data is in, it
 * sends that rank, on its first queue pair, one notification {req_id,
 * consumer engine id, consumer rank}, and notifies the other producer
 * ranks of its notify list.
 * A producer rank reports a request RELEASED once every consumer rank that
 * must notify it has done so, or EXPIRED when its deadline passes first.
 *
 * Trust model. An agent trusts whoever completes the handshake with it:
 *  - Without a shared secret (the default), anyone who can reach a
 *    producer's port and presents a blob of the same model receives every
 *    region's address and rkey, and may READ the producer's KV cache; a
 *    connected consumer rank can release the requests of its own consumer
 *    engine early (by notifying before it read). Run producers on a
 *    network only trusted engines reach.
 *  - With a shared secret (kvp_agent_attr.secret, the same bytes on every
 *    agent of a deployment), each side proves knowledge of it before the
 *    other reveals anything: HMAC-SHA-256 over both sides' hellos and
 *    fresh 16-byte nonces, never the secret itself. The connect request
 *    itself carries a proof (a truncated HMAC of the consumer's hello,
 *    whose nonce starts with its clock): a producer turns down a request
 *    without a valid one, or from a clock more than 120 s from its own,
 *    before it makes a queue pair, so a stranger without the secret
 *    costs a producer one rdma_cm request and reject, nothing more, and
 *    never reaches its shared receive queue, its slots or its wait
 *    queue. What a stranger can still cost: a connect request captured
 *    on the wire and replayed within those 120 s gets a queue pair and a
 *    handshake slot until its AUTH (which covers the producer's fresh
 *    nonce and cannot be replayed) fails; any message it sends but that
 *    AUTH drops it at the poll that sees it, so it holds at most the
 *    messages it sent before that poll in the shared receive queue.
 *    Hosts of a deployment keep their clocks within 120 s. A producer gives a
 *    consumer its blob (and so any rkey), registers a buffer for the
 *    consumer's blob, READs it (the consumer's one remotely readable
 *    memory: its blob, which holds no key unless the agent is a producer
 *    too, KVP_ROLE_BOTH: its one blob then carries its producer keys,
 *    which go only to a producer that proved the secret first) and posts
 *    the notification buffers only after the consumer's proof; a
 *    consumer reads from a producer only after the producer's proof, so
 *    a stranger can neither read nor feed it bytes.
 *    The secret authenticates the handshake, not the traffic: RDMA itself
 *    is not encrypted, and the rkeys it protects travel in clear to
 *    authenticated peers. A passive listener on the fabric sees the
 *    blobs.
 *  - Either way, nothing a peer sends is trusted: every length is checked
 *    before allocation (a consumer's blob: KVP_META_MIN_LEN up to 8 times
 *    the producer's own blob, at least 64 KiB, at most 16 MiB), a peer's
 *    TP size is at most KVP_MAX_TP_SIZE, each poll checks at most one
 *    received blob, and a producer keeps at most max_per_source
 *    consumer ranks per consumer address (at most 8 queue pairs each)
 *    and at most 64 (and half of max_qps) handshakes under way, each
 *    for at most handshake_ms, the connect requests beyond them waiting
 *    in arrival order for at most as long: idle or slow peers cannot
 *    hold every slot. One address has at most three quarters of the
 *    handshakes under way and of the waiting requests; a rank's queue
 *    pair that a handshake under way claims already is not claimed
 *    again until it ends; and a connection that has not sent its AUTH
 *    (or whose AUTH failed) is dropped at any other message. A
 *    consumer engine's notifications only
 *    ever count for its own requests (see kvp_agent_expect()). Each
 *    consumer rank's credit counter (see Liveness) is an MR of its own 8
 *    bytes: its key reads that counter and nothing else, so no peer
 *    learns another's notification progress. A consumer's progress
 *    records (streaming) are writable with a key per connection slot,
 *    but that key is per protection domain: any peer connected to the
 *    agent that learns it could WRITE there. So a record counts only if
 *    its check, SipHash-2-4 keyed by a key both ends derive from their
 *    hellos (an HMAC, with the secret if any), matches: another peer's
 *    record is ignored as if never written. The lease table (see
 *    kvp_agent_expect()) is readable, never writable, remotely; a peer
 *    reading it learns which (engine, req_id) fingerprints are held.
 *  - Fail closed: DONE is reported only over bytes each producer rank
 *    held for the request while they were read (kvp_agent_expect()'s
 *    leases); what cannot be proven so ends FAILED -ESTALE. The lease
 *    READ goes on the rank's first queue pair right behind the data
 *    READs when that queue pair carried all of them (a queue pair's
 *    READs are executed in order by the responder: IB's ordering rules),
 *    else once every data READ from that rank completed (their responses
 *    arrived: the producer's NIC read those bytes before it reads the
 *    lease). The producer's withdrawal is a CPU store, fenced before its
 *    event is queued, that a later DMA read sees (coherent DMA). Only
 *    hardware can show that a NIC never reads a later READ's memory
 *    before an earlier one's on one queue pair; soft-RoCE executes them
 *    one by one. KVP_LEASE_OFF=1 aside, nothing here is configurable.
 *
 * Threads: an agent is not thread-safe. All calls on one agent must be
 * serialised by the caller (typically: the engine's loop thread). Distinct
 * agents are independent. Nothing is called back but the log callback
 * (kvp_agent_attr.log_fn), from inside the agent's own calls; everything
 * is reported through kvp_agent_poll().
 *
 * Liveness: nothing waits without a bound. A producer rank gives each
 * consumer rank credit for its notifications at the handshake, and
 * counts in a counter the consumer READs the credits it gives back (the
 * receive buffers it re-posts, or lends from its shared receive queue,
 * kvp_agent_attr.srq): a consumer sends a notification only into a
 * posted buffer, so an RNR wait never holds its queue pair (for a peer that lies, RNR retries are
 * finite, 6, and a producer's RNR timer is 1.28 ms, not rdma_cm's
 * 655 ms). A producer that stops polling therefore holds back only
 * notifications; once one has waited stall_ms, or a pull's data is not in
 * after stall_ms, the engine goes down with -ETIMEDOUT (its requests not
 * DONE fail first) and is reconnected on demand. The device's
 * asynchronous events (a QP fatal, the port or the device failing) fail
 * the connections they hit. A producer learns of a consumer process that
 * died from rdma_cm's disconnect, and of a consumer host that went silent
 * (a crash, a cut link: no disconnect) from its liveness probe: a
 * zero-length READ to each connected consumer rank every second, which
 * the consumer's NIC answers without touching memory or checking a key
 * (a consumer accepts one incoming READ at a time: at the handshake the
 * producer READs the consumer's blob, then only probes); a probe
 * unanswered for
 * 5 s drops the connection and frees its slot (stats.probes counts the
 * answers). The requests expected from it expire as usual.
 *
 * Cost: once an engine is up, kvp_agent_pull_from() and kvp_agent_expect()
 * neither allocate nor make system calls other than ibv_post_send() (a
 * store to the NIC's doorbell on hardware; a system call on soft-RoCE).
 * Pull copies the request's ids and queues it; its READs are emitted from
 * the plan in windows that fit each send queue's free room, at pull time
 * and from kvp_agent_poll() as completions free room. kvp_agent_poll()
 * polls completions and, at most once per millisecond, reads the rdma_cm
 * channel without blocking; its cold paths (a producer accepting a consumer
 * rank, a connection failing or being torn down) register memory and create
 * or destroy queue pairs. What one call does is bounded whatever peers send:
 * at most 256 completions (over all its CQs), one accepted connection (one
 * QP created), one QP destroyed, one received blob decoded and checked,
 * 16 rdma_cm events, 8 consumer ranks closed for idleness, one evicted,
 * and a scan of the request table when a deadline passed.
 */

typedef struct kvp_agent kvp_agent;

enum kvp_role {
	KVP_ROLE_PRODUCER = 0, /* owns blocks that others read (prefill) */
	KVP_ROLE_CONSUMER,     /* reads blocks into its own (decode) */
	KVP_ROLE_BOTH,	       /* both, one registration of the memory: a
				* decode engine that also serves its prefix
				* cache to others */
	KVP_ROLE_COUNT
};

/* ---- Events and logs ----
 *
 * What an operator can act on, as records handed to a callback registered
 * at open (kvp_agent_attr.log_fn, with comp_mask KVP_AGENT_ATTR_LOG): a
 * producer's refusals of consumers (connect requests and handshakes,
 * with the reason and the consumer's address), its evictions and idle
 * closes, each request's life on a consumer (started, completed with its
 * bytes and READs, failed with its reason), engines up and down,
 * disconnections, releases and expiries. The library itself never prints
 * (no stderr, no stdout): this callback and kvp_agent_poll()'s events are
 * all it says.
 *
 * The callback runs on the thread that made the call that made the
 * record (kvp_agent_poll() mostly; kvp_agent_pull*() for STARTED), inside
 * that call, before the call returns and before kvp_agent_poll() hands
 * out any event of the same happening. It must not call the agent (any
 * kvp_agent_* call on it; other agents are fine) and should return
 * quickly: the agent's loop waits for it. The record and its strings are
 * the agent's, valid during the callback only. Records above the level
 * filter are not made at all (no formatting, no clock read): without a
 * callback, a test of one field per event and per pull is all they
 * cost. */
enum kvp_log_level {
	KVP_LOG_ERROR = 1,   /* failures of the device: -EIO, -ENETDOWN,
			      * -ENODEV */
	KVP_LOG_WARNING,     /* refusals, failed pulls, engines down,
			      * disconnections, expiries */
	KVP_LOG_INFO,	     /* evictions, idle closes, engines up */
	KVP_LOG_DEBUG,	     /* per request: started, completed, released,
			      * arrived */
};

enum kvp_log_kind {
	KVP_LOG_REFUSED = 1,	 /* producer: a consumer's connect request or
				  * handshake refused (reason, status, its
				  * address; engine_id and rank once its
				  * hello was read, else 0 and UINT32_MAX) */
	KVP_LOG_EVICTED,	 /* producer: a consumer rank disconnected to
				  * make room for a newcomer */
	KVP_LOG_IDLE_CLOSED,	 /* producer: a consumer rank disconnected
				  * after idle_ms */
	KVP_LOG_PULL_STARTED,	 /* consumer: a pull accepted (req_id,
				  * engine; reads 0; stream 1 for
				  * kvp_agent_pull_stream()) */
	KVP_LOG_PULL_COMPLETED,	 /* consumer: DONE, with bytes, reads,
				  * elapsed_ns */
	KVP_LOG_PULL_FAILED,	 /* consumer: FAILED, with status, reason,
				  * elapsed_ns */
	KVP_LOG_PULL_ARRIVED,	 /* consumer: ARRIVED (layers in reads) */
	KVP_LOG_ENGINE_UP,	 /* consumer: an engine can be pulled from */
	KVP_LOG_ENGINE_DOWN,	 /* consumer: an engine down (status,
				  * reason, peer_reason) */
	KVP_LOG_DISCONNECTED,	 /* a peer rank is gone */
	KVP_LOG_RELEASED,	 /* producer: a request released */
	KVP_LOG_EXPIRED,	 /* producer: a request expired (reason) */
};

struct kvp_log_record {
	uint32_t kind;	      /* enum kvp_log_kind */
	uint32_t level;	      /* enum kvp_log_level */
	uint64_t time_ns;     /* CLOCK_MONOTONIC, when it was made */
	int32_t status;	      /* 0, or -errno */
	uint32_t reason;      /* enum kvp_reason, 0: none */
	uint32_t peer_reason; /* with KVP_REASON_PEER_REFUSED */
	uint32_t rank;	      /* the peer rank, UINT32_MAX: not known */
	uint64_t req_id;      /* request records */
	uint64_t engine_id;   /* the peer engine's id, 0: not known */
	uint32_t engine;      /* consumer: the engine handle, 0: none */
	uint32_t stream;      /* request records: 1 for a streamed pull */
	uint64_t bytes;	      /* COMPLETED: bytes the READs moved */
	uint32_t reads;	      /* COMPLETED: READs; ARRIVED: layers */
	uint32_t pad;
	uint64_t elapsed_ns;  /* COMPLETED, FAILED: since the pull */
	const char *peer_addr; /* the peer's numeric IP address, "" when
				* not known */
	const char *line;      /* one line for an operator, e.g. "refused
				* 10.77.1.2 engine 7 rank 0: shared secrets
				* differ (auth, -EPERM)" */
};

/* The callback: user is kvp_agent_attr.log_user. */
typedef void (*kvp_log_fn)(void *user, const struct kvp_log_record *rec);

/* A static name of kind k ("refused", "pull_completed"...; "unknown" past
 * the list). Never NULL; thread-safe. */
KVP_API const char *kvp_log_kind_str(uint32_t k);

/* What a consumer agent with default attributes plans with, before the
 * device's clamps; kvpull-plan with default options dumps that plan.
 * KVP_DEFAULT_MAX_SGE: kvp_agent_attr.max_sge 0, local SGEs per READ.
 * KVP_DEFAULT_MAX_READ: bytes per READ at most with kvp_agent_attr.max_read
 * 0 (2^31, IB's largest message, and kvp_plan_attr.max_len 0); the agent
 * also stops at its port's max_msg_sz (8 MiB on soft-RoCE) and at the MR
 * window of a region registered as several MRs. */
#define KVP_DEFAULT_MAX_SGE 16
#define KVP_DEFAULT_MAX_READ (1u << 31)

struct kvp_agent_attr {
	uint32_t role;	    /* enum kvp_role */
	uint32_t comp_mask; /* 0, or KVP_AGENT_ATTR_LOG */
	/* RDMA device name as ibv_devices prints it; NULL: the device that
	 * `addr` belongs to, else the first device. */
	const char *device;
	/* Local numeric IP address, or NULL. Consumer: the source address of
	 * its connections (selects the device and the route). Producer: only
	 * selects the device; kvp_agent_listen() takes the address to bind. */
	const char *addr;
	/* This rank's layout (engine id, TP size and rank included). Copied;
	 * region keys in it are ignored. */
	const kvp_layout *layout;
	/* Consumer: the most ids any list of a request may hold (local or
	 * remote, any group). Sizes the request slots' copies of their ids
	 * (max_inflight x groups x 2 x max_ids x 4 bytes); the READs
	 * themselves are emitted in windows of the send queue's free room
	 * (kvp_plan_emit_window()), so nothing else grows with it. 0:
	 * 8192, a 128k-token prompt at 16-token blocks: 4 MiB per group at
	 * the default max_inflight (64 x 2 x 8192 x 4 bytes). */
	uint32_t max_ids;
	/* Consumer: pulls in flight (pulled, not yet reported by poll).
	 * Producer: requests tracked at once (expected and not yet reported).
	 * 0: 64. */
	uint32_t max_inflight;
	/* Peer ranks connected at once (ranks, not queue pairs: see
	 * max_qps). Producer: consumer ranks; 0: 1024. Consumer: producer
	 * ranks, over every producer engine added (and so at most that
	 * many engines); 0: 64. KVP_ROLE_BOTH: each side, with each side's
	 * default. At most 65535 (32767 for KVP_ROLE_BOTH); a producer's is
	 * clamped to max_qps. */
	uint32_t max_peers;
	/* Consumer: send queue entries per producer rank; 0: 512. Clamped to
	 * the device's limits. */
	uint32_t sq_depth;
	/* Consumer: local scatter entries per READ (kvp_plan_attr.max_sge);
	 * 0: KVP_DEFAULT_MAX_SGE (16). Clamped to the device's limits (max_send_sge, max_sge_rd).
	 * More entries mean longer READs where a remote-contiguous run lands
	 * in scattered local pieces (TP N -> M HND: one head page per block),
	 * so fewer work requests; on soft-RoCE, 16 moved llama-3.1-70b TP
	 * 8 -> 2 contiguous blocks 8-10% faster than 4 (docs/benchmarks.md). */
	uint32_t max_sge;
	/* Optional shared secret, secret_len bytes (KVP_SECRET_MIN to
	 * KVP_SECRET_MAX; use 32 random bytes), copied. When set, the
	 * handshake proves both sides know it (see "Trust model"); a peer
	 * without it, or with another, is refused with -EPERM. NULL and 0:
	 * no secret (then a peer that has one is refused too). */
	const void *secret;
	uint32_t secret_len;
	/* Producer: consumer ranks (handshaking or connected) from one IP
	 * address at once; a rank is its engine id and TP rank, and its
	 * queue pairs count once: a rank that holds a slot gets its next
	 * queue pairs (up to 8, as qps_per_peer allows), a new rank beyond
	 * this is refused with -EUSERS. Consumer engines' ranks on one host
	 * share an address: allow their count. 0: max_peers (one host may
	 * fill the producer); clamped to max_peers. Every queue pair still
	 * takes one of max_qps' slots. */
	uint32_t max_per_source;
	/* Producer: bound on one handshake, from connect request to ready,
	 * in ms; a consumer not done by then is dropped. 0: 10000; at most
	 * 3,600,000. */
	uint32_t handshake_ms;
	/* Consumer: stall bound, in ms. A pull whose data is not all in
	 * stall_ms after kvp_agent_pull(), or a notification that waits
	 * that long for the producer rank's receive credit (a producer that
	 * stopped polling), fails the producer engine it uses: its requests
	 * not yet DONE are reported FAILED with -ETIMEDOUT, the engine goes
	 * down (KVP_EV_ENGINE_DOWN, -ETIMEDOUT) and is reconnected on
	 * demand. A streamed pull (kvp_agent_pull_stream()) is bounded by
	 * its progress instead: a producer rank that publishes nothing new
	 * for stall_ms fails that request alone. 0: 10000; at most
	 * 3,600,000. */
	uint32_t stall_ms;
	/* Producer: the notification credit of a consumer rank, what it
	 * may send before it must read how many credits the producer gave
	 * back. With a receive queue per QP (srq): the receive buffers on a
	 * rank's first queue pair, which carries its notifications
	 * (KVP_NOTE_LEN bytes each; its others get one, for their BYE);
	 * with the shared receive queue, the most one connection may hold,
	 * the pool being 4 x rq_depth. 0: max_inflight, at
	 * least 128; at most 65536; clamped to the device's limit. */
	uint32_t rq_depth;
	/* Consumer: bytes per READ at most (a slice, for fairness between
	 * requests on a link). 0: the port's max_msg_sz, at most
	 * KVP_DEFAULT_MAX_READ (2^31). */
	uint32_t max_read;
	/* Consumer: RC queue pairs per producer rank read from; a request's
	 * READs from a rank are striped over them (one QP allows only the
	 * device's max_qp_init_rd_atom READs in flight: 16 on ConnectX) and
	 * its notification follows on the first once all are in. Each
	 * takes one of the producer's max_qps slots (its rank counts once
	 * against max_peers and max_per_source). 0: 2; at most 8. */
	uint32_t qps_per_peer;
	/* Traffic class of every connection, so that KV traffic can ride the
	 * fabric's lossless class: the IP type of service byte plus one (0:
	 * the device's default; 1 to 256: ToS 0 to 255, e.g. DSCP 26 is
	 * (26 << 2) + 1). RoCE v2 puts it in the packets' traffic class; on
	 * InfiniBand the subnet administrator maps it to a service level.
	 * Set through rdma_cm on a consumer's connections before their route
	 * is resolved, and on a producer's listening id (its connections
	 * inherit it). */
	uint32_t tos;
	/* Consumer: kvp_plan_attr.flags of every plan the agent compiles
	 * (KVP_PLAN_NO_COALESCE: one READ per piece, as connectors that post
	 * one descriptor per block per region do; for comparisons). 0: none;
	 * unknown bits: -EINVAL. */
	uint32_t plan_flags;
	/* Bytes one memory registration may cover at most. 0: the device's
	 * max_mr_size. A region longer than that is registered as several
	 * overlapping MRs (see kvp_agent_register()); a smaller value than
	 * the device's only tests that path. At least KVP_MR_MIN. */
	uint64_t max_mr;
	/* Consumer: 1: a streamed pull (kvp_agent_pull_stream()) reports
	 * KVP_EV_ARRIVED as its leading model layers land (each producer
	 * rank's READs of a part end with a signalled one, one more
	 * completion per part and queue pair). 0: no such events; other
	 * values: -EINVAL. */
	uint32_t stream_events;
	/* Queue pairs connected (or connecting) at once, over every peer
	 * rank: the agent's QP budget. Producer: 0: 2 x max_peers (two per
	 * consumer rank, the consumers' default qps_per_peer); a newcomer
	 * that finds them all taken evicts the least recently used idle
	 * consumer rank (see kvp_agent_listen()). Consumer: 0: max_peers x
	 * qps_per_peer; an engine whose handshake finds too few free closes
	 * the least recently used engine that is up with nothing in flight
	 * and no notification owed (a pull is DONE once its data is in; its
	 * notifications follow, and closing the engine before they are sent
	 * would leave the producer holding the blocks until their deadline)
	 * and that is not kvp_agent_connect()'s: ENGINE_DOWN -ENOSPC with
	 * KVP_REASON_EVICTED, stats.evictions; its next
	 * kvp_agent_pull_from() reconnects it, nothing registered again.
	 * The handshake waits for the slots to drain, or for engines that
	 * only owe notifications to send them (within its timeout); when
	 * even every such engine's slots would not do, it goes down with
	 * -ENOSPC. At least 1; at most 65535 (32767 for KVP_ROLE_BOTH). */
	uint32_t max_qps;
	/* Producer: a READY consumer rank that sent no notification or
	 * FOLLOW for idle_ms is disconnected with all its queue pairs
	 * (KVP_EV_DISCONNECTED, -ETIMEDOUT, and stats.idle_closes here; the
	 * consumer's engine goes down and is reconnected on demand), unless
	 * its engine has something in flight here then (a request expected
	 * or early, or followed): it is checked again idle_ms later. 0:
	 * 300,000 (5 minutes); KVP_IDLE_NEVER: never; at least 1,000. */
	uint32_t idle_ms;
	/* Producer: where the messages consumers send (AUTH, notifications,
	 * FOLLOW, TABLE, BYE: 64 bytes at most; a consumer's blob is READ,
	 * never sent) are received. 0: one shared receive queue (SRQ) for
	 * every queue pair, when the device has one (max_srq; max_srq_wr
	 * for two buffers per QP slot and a pool of 4 x rq_depth; max_cqe
	 * for twice that): receive memory does not grow with the queue
	 * pairs (128 bytes per slot taken, registered 64 buffers at a
	 * time, and the pool). Each connection holds credits of its own
	 * that nobody else borrows: two on a rank's first QP (its TABLE
	 * and FOLLOW, so that a streamed pull can always start), one on
	 * the others (their BYE). First QPs borrow from the pool, up to 8
	 * at the handshake, then as they send, each up to its fair share
	 * (the pool over the first QPs connected, and rq_depth in all);
	 * one above its share (others came since) gives a loan back with
	 * each message, and one gone quiet hands its loans back (the
	 * consumer sends GIVE). The queue never empties under consumers
	 * that keep to their credit, and none that does is ever dropped:
	 * the credit given during a poll is published when it ends, so
	 * one message past what was published is a consumer that ignored
	 * its credit, dropped then (-EPROTO, stats.credit_abuses). A
	 * connection that has not proved the secret (or, without one, not
	 * yet sent its AUTH) is dropped at any message but its AUTH. Until
	 * the poll that sees it, an abuser may empty the queue, and
	 * other consumers' messages are retried by their NICs (RNR: 6
	 * times, 1.28 ms apart) while the next poll refills it, so poll a
	 * producer more often than every few milliseconds. KVP_SRQ_OFF,
	 * or a device without SRQs: a receive queue per QP, which
	 * isolates consumers from each other (rq_depth buffers of 32 bytes
	 * per consumer rank). stats.srq_bufs says which. Other values:
	 * -EINVAL. */
	uint32_t srq;
	/* Consumer: READs in flight per queue pair, at most: posted and not
	 * yet completed. The rest wait in the agent (their requests resume
	 * as READs complete), never in the send queue or on the wire. A
	 * burst larger than the path holds is loss on a lossy fabric, and
	 * RC recovers from any loss or reordering by going back N: every
	 * READ in flight after the gap is sent again (soft-RoCE across two
	 * devices: about 60 duplicate requests per retry at the device's
	 * 128; docs/benchmarks.md, "READs in flight"). 0: KVP_READ_WINDOW
	 * (16), at most the device's max_qp_init_rd_atom. A value set is clamped to
	 * sq_depth only (above max_qp_init_rd_atom the device queues READs
	 * in its send queue: 65535 is no window); at most 65535 (more:
	 * -EINVAL). Notifications, lease and credit READs are not held by
	 * it (they go first, and count in it while in flight). When neither
	 * this nor read_window_bytes is set, a queue pair whose peer is the
	 * device's own port (same GID: a loopback, nothing on a wire) has
	 * no window. */
	uint32_t read_window;
	/* Consumer: bytes of READs in flight per queue pair, at most (the
	 * window in READs shrinks for larger READs: the window is sized by
	 * the plan's READ size, then by the average READ each doorbell
	 * posted); one READ is always allowed. 0: KVP_READ_WINDOW_PKTS (16)
	 * packets of the port's active MTU (64 KiB at MTU 4096); at least
	 * KVP_READ_WINDOW_BYTES_MIN (4096; less: -EINVAL). */
	uint32_t read_window_bytes;
	/* Read only when comp_mask has KVP_AGENT_ATTR_LOG (so that a caller
	 * built against an older header, whose struct ends above, is never
	 * read past its end): the event and log callback, its argument and
	 * its level filter (see "Events and logs" above); the callback must
	 * stay callable until kvp_agent_close() returns. log_fn NULL: no
	 * records; log_level 0: KVP_LOG_INFO; above KVP_LOG_DEBUG: -EINVAL. */
	kvp_log_fn log_fn;
	void *log_user;
	uint32_t log_level;
};

/* kvp_agent_attr.comp_mask: the log fields are set. */
#define KVP_AGENT_ATTR_LOG (1u << 0)

#define KVP_READ_WINDOW 16
#define KVP_READ_WINDOW_PKTS 16
#define KVP_READ_WINDOW_BYTES_MIN 4096

#define KVP_IDLE_NEVER UINT32_MAX
#define KVP_SRQ_OFF 1

#define KVP_MR_MIN (1ull << 16)

#define KVP_SECRET_MIN 16
#define KVP_SECRET_MAX 256

/* Opens an agent on an RDMA device. Every limit it obeys is queried from
 * the device, never assumed: send queue depths (max_qp_wr), SGEs per READ
 * (max_sge and max_sge_rd: cxgb4 and older hns allow 1), bytes per READ
 * (the first port's max_msg_sz, and max_read), READs in flight per queue
 * pair (max_qp_init_rd_atom), and the completion queues (max_cqe and
 * max_cq: the queue pairs' completions are spread over as many CQs of at
 * most max_cqe as they need, at most 64 and max_cq; only beyond that do
 * the queue depths shrink, rather than risk an overrun). How many peers a
 * device serves at the default depths: a producer QP needs 16 completion
 * entries (14 sends, 2) and each producer CQ room for every buffer of
 * the shared receive queue (srq; without it, a QP is sized for 144: its
 * rq_depth 128 notification buffers too), a consumer QP 517 (sq_depth
 * 512, 5), 16 more per CQ; so on soft-RoCE (32,767 entries a CQ) the
 * shared receive queue serves up to 7,904 producer QPs (its 16,320
 * buffers fill half a CQ; above that a receive queue per QP: 64 CQs
 * hold 14,528 producer QPs, 7,264 consumer ranks of two), and 64 CQs
 * hold 4,032 consumer QPs; ConnectX's 4,194,303 entries far more than max_qps
 * allows; the device's max_qp bounds them too. Each queue pair's depth is
 * what rdma_create_qp() returned when less than asked, or, when the
 * provider refuses the depth asked for (mlx5 sizes each WQE for max_sge
 * and has a fixed number of WQE blocks), the largest halving of it that
 * it accepts, down to 4; notifications are sent inline when the provider
 * allows it. Returns 0 and an agent owned by the caller
 * (kvp_agent_close()); -EINVAL for a bad attribute (unknown role, non-zero
 * comp_mask, no layout, a device name and an address of different
 * devices, max_inflight above 2^20, max_peers or max_qps above 65535
 * (32767 for KVP_ROLE_BOTH), idle_ms below 1,000, max_ids above 2^24, handshake_ms or stall_ms above
 * 3,600,000, rq_depth above 65536, qps_per_peer above 8, tos above 256,
 * srq above KVP_SRQ_OFF,
 * a secret NULL with a length or a length outside
 * KVP_SECRET_MIN..KVP_SECRET_MAX); -ENODEV when there is no RDMA device or
 * no device of that name or address, or the device cannot serve
 * (no READ in flight, no SGE, queues and completion queues too small for
 * max_qps slots even at their smallest); -ENOMEM; another -errno from the
 * device. Sizes the tables of max_qps queue pairs; each slot's own
 * buffers and MRs are set up when a peer first takes it (see
 * kvp_agent_stats.mem_bytes). Blocks only as long as opening the device
 * does. */
KVP_API KVP_MUST_CHECK int kvp_agent_open(const struct kvp_agent_attr *attr,
					  kvp_agent **out);

/* Disconnects every peer, deregisters memory and releases the agent. A
 * consumer first sends the notifications it still owes (of requests DONE,
 * or whose data is on the way), waiting for them for at most one second,
 * so that producers release those requests rather than let them expire.
 * Pulls and expected requests in flight are then dropped without events;
 * producer memory must stay valid until this returns. NULL is a no-op. */
KVP_API void kvp_agent_close(kvp_agent *agent);

/* Registers the memory of layout region `region`: `len` bytes at `addr`,
 * at least the region's size. A producer's memory is registered for remote
 * READ only, a consumer's for local write only (and remote write on iWARP,
 * whose READ responses land as RDMA WRITEs; on no other transport), a
 * KVP_ROLE_BOTH agent's for both; all with relaxed ordering, an optional
 * flag providers without it ignore. The memory is borrowed: it must stay
 * valid until kvp_agent_close(). A region longer than one MR may cover (the
 * device's max_mr_size, or kvp_agent_attr.max_mr) is registered as several
 * overlapping MRs, its own size only: stride 2^s, the largest with 2^s +
 * KVP_MR_WINDOW(s) within the cap, every key in the blob
 * (kvp_layout_set_region_keys()), READs no longer than the window.
 * Every region must be registered, once, before kvp_agent_listen() or the
 * first kvp_agent_add_engine() (or kvp_agent_connect()); it then serves
 * every peer engine, added, failed or reconnected, until close. Returns 0;
 * -EINVAL for a bad region index, a NULL address, a length below the
 * region's size, or a region already registered; -EBUSY after listen or
 * the first engine; another -errno from memory registration (-ENOMEM,
 * -EFAULT). */
KVP_API KVP_MUST_CHECK int kvp_agent_register(kvp_agent *agent,
					      uint32_t region, void *addr,
					      uint64_t len);

/* Registers region `region` from a dma-buf: `len` bytes at `offset` of
 * the dma-buf `fd` (GPU memory exported by its driver, e.g. CUDA's
 * cuMemGetHandleForAddressRange() or ROCm's
 * hsa_amd_portable_export_dmabuf(); kvpull links no GPU runtime and only
 * takes the fd). `addr`, if not NULL, is the address the memory has in
 * this process (the GPU virtual address): the region is known by it in
 * the blob and in local scatter entries (the registration's IOVA);
 * without it, by `offset`. Access and relaxed ordering as for
 * kvp_agent_register(); the fd may be closed on return.
 *
 * Where the provider cannot register dma-bufs at all (ibv_reg_dmabuf_mr()
 * fails with EOPNOTSUPP: soft-RoCE, older kernels and providers), `addr`
 * is registered with ibv_reg_mr() instead (host memory, or device memory
 * a peer-memory module such as nvidia-peermem exposes), and
 * stats.dmabuf_fallbacks counts it. Returns 0 (registered from the
 * dma-buf), 1 (fell back to addr); -ENOTSUP when dma-bufs cannot be
 * registered and addr is NULL; -EINVAL (fd < 0, and as
 * kvp_agent_register()); -EBUSY as kvp_agent_register(); another -errno
 * from the registration (-EINVAL for an fd that is not a dma-buf or a
 * range outside it, -EFAULT, -ENOMEM). Only hardware proves the dma-buf
 * path itself (a NIC and a GPU driver that export and import dma-bufs:
 * ConnectX with CUDA 11.7+ and Linux 5.12+); soft-RoCE proves the
 * detection and the fallback (tests/rdma_loopback.c). */
KVP_API int kvp_agent_register_dmabuf(kvp_agent *agent, uint32_t region,
				      int fd, uint64_t offset, uint64_t len,
				      void *addr);

/* Producer: listens for consumer ranks on numeric IP address `ip` (NULL:
 * every address of the agent's device) and `port`. Non-blocking; incoming
 * connections are accepted and handshaken inside kvp_agent_poll(), which the
 * producer must therefore keep calling (a handshake not finished within
 * handshake_ms is dropped; a consumer whose metadata does not match is
 * told why and fails with that error). At most max_peers consumer ranks
 * and max_qps queue pairs are connected at once, of at most
 * max_per_source consumer ranks from one address, and at most half of
 * max_qps (rounded up), and at most 64, handshake at once. Connect
 * requests beyond those 64 wait, in arrival order, for a handshake to end
 * (at most max_qps of them, each at most handshake_ms: rdma_cm tells the
 * consumer to expect a late answer); beyond the other limits they are
 * refused with a retry hint (see kvp_agent_connect() for what the
 * consumer sees and how it retries). A rank's queue pairs are admitted
 * together: a new rank only when the free slots, less those held for
 * other ranks, take all of them (its hello says how many: qps_per_peer),
 * the slots for its next ones held until they come or the rank goes; so
 * no rank holds part of what it needs while others do the same. With no
 * attribute set, that is 1,024 ranks of two queue pairs each, all from
 * one host if need be.
 *
 * A rank has a request in flight here while its engine has one expected
 * or early that this rank has not notified yet (it may be reading or
 * following it); one that notified every such request has none, whatever
 * its engine's other ranks do. A rank that sent a message within idle_ms
 * also has one while its queue pairs took a READ within the last 200 ms:
 * a pull before kvp_agent_expect() shows nowhere else (its notification
 * comes after the READs), so the producer reads each of the rank's queue
 * pairs' next expected PSN when it weighs the rank for eviction or
 * idleness (a system call each; a firmware command on some devices), and
 * a PSN moved by more than the messages it took is READs. A consumer rank
 * idle for idle_ms (no
 * notification or FOLLOW, and nothing in flight when that is checked) is
 * disconnected with all its queue pairs (-ETIMEDOUT; stats.idle_closes).
 * A newcomer that finds no room (its address at max_per_source ranks,
 * max_peers ranks or every slot taken) makes some (stats.evictions): the
 * least recently used connected consumer rank (its last notification or
 * FOLLOW, or its handshake) with nothing in flight is disconnected with
 * all its queue pairs (KVP_EV_DISCONNECTED here, -ECONNRESET there: that
 * consumer's engine goes down and is reconnected on demand), and the
 * newcomer, refused with -EBUSY and a 20 ms hint, gets the slots once
 * they drain. A rank with a request in flight is never evicted; while one
 * rank's queue pairs drain no other is. Returns 0; -EINVAL (not a producer, bad address,
 * an address of another device); -EBUSY when already listening; -ENXIO when
 * a region is not registered; -EADDRINUSE; another -errno. */
KVP_API KVP_MUST_CHECK int kvp_agent_listen(kvp_agent *agent, const char *ip,
					    uint16_t port);

/* This rank's metadata blob, byte for byte what the built-in handshake
 * hands the peer (a producer sends its blob; a producer READs a
 * consumer's): kvp_meta_encode() of the agent's layout, with the region
 * addresses and rkeys of kvp_agent_register() on a producer (a consumer's
 * KV memory is not remotely accessible, so its blob carries no keys). For a
 * user to carry to consumers over their own channel (struct kvp_peer).
 * Producers and consumers, before or after listen and connect. Writes the
 * blob to buf[cap] and its length to *len. Returns 0; -ENXIO until every
 * region is registered; -ENOSPC when cap is too small: *len receives the
 * size needed and buf is untouched (buf may be NULL with cap 0 to query
 * the size); -EMSGSIZE when the blob exceeds the 16 MiB the handshake
 * carries (listen and connect then fail too); -EINVAL (agent or len NULL,
 * buf NULL with cap > 0); -ENOMEM. Allocates (handshake time, not the hot
 * path). The blob is valid until the rank's agent is closed: a rank
 * re-opened or re-registered has another one. */
KVP_API KVP_MUST_CHECK int kvp_agent_get_meta(const kvp_agent *agent,
					      void *buf, size_t cap,
					      size_t *len);

/* Where producer rank i listens: numeric IP address and port; and,
 * optionally, its blob (kvp_agent_get_meta() on that rank), carried by the
 * user. meta NULL and meta_len 0: none; the blob is learnt in-band. Borrowed
 * for the duration of kvp_agent_connect() only. Zero-initialise the struct
 * (or use designated initialisers) so that later fields stay 0. */
struct kvp_peer {
	const char *addr;
	uint16_t port;
	const void *meta;
	uint32_t meta_len;
};

/* Consumer: connects to the producer engine whose rank i listens at
 * ranks[i], i < n, n being the producer's TP size. Runs the handshake
 * described above and leaves the agent ready to pull. Blocks for at most
 * `timeout_ms` milliseconds in total (> 0), the producer ranks' polling
 * included. A convenience over kvp_agent_add_engine() for an agent that
 * pulls from one producer engine: it adds the engine, drives the agent
 * until the engine is up or down (queueing no ENGINE_UP, ENGINE_DOWN or
 * DISCONNECTED event of it meanwhile), and makes it the engine of
 * kvp_agent_pull() and kvp_agent_plan(). Connect succeeds once per agent;
 * other engines may be added beside it.
 *
 * Carried blobs (ranks[i].meta, for any subset of the ranks) are decoded
 * and checked first, without a device call or a network exchange: each
 * must be well formed, of TP size n and rank i, with every region's
 * address set, and of the same engine and geometry as the lowest rank's
 * carried blob; the plan is compiled from that one. Connect then reaches
 * only the ranks the plan reads from or notifies, and each of them whose
 * blob was carried must send exactly those bytes in-band (a producer rank
 * re-opened since, with other addresses or rkeys, fails with -EPROTO).
 * Carried blobs of ranks the plan does not need are checked as above but
 * never compared in-band. Ranks without a carried blob are checked as in
 * the handshake above.
 *
 * Returns 0; -EINVAL (not a consumer, bad arguments, n of 0 or above
 * KVP_MAX_TP_SIZE, a NULL address, meta NULL with meta_len > 0 or meta_len
 * 0 with meta set); -EISCONN when
 * already connected; -ENXIO when a region is not registered; -EPROTO when
 * a producer's metadata, carried or in-band, is malformed (a truncated or
 * corrupt blob, larger than 16 MiB) or does not match (engine id, TP size
 * other than n, rank, compatibility hash, geometry, layouts that cannot be
 * matched by kvp_plan_compile(), a carried blob its rank does not send
 * byte for byte), or a producer refused our metadata for that reason;
 * -EPERM when the shared secrets differ or only one side has one;
 * -EUSERS when a producer rank holds max_per_source consumer ranks from
 * this address; -EBUSY when a producer rank is at its connection or
 * handshake limit or out of resources; -ETIMEDOUT; -ECONNREFUSED
 * (nobody listens, or a refusal without a reason); -EHOSTUNREACH, -ENETUNREACH, -EADDRNOTAVAIL when an address
 * cannot be resolved or routed; -ECONNRESET when a producer disconnected
 * during the handshake; -ENOMEM. A carried blob that fails its checks
 * fails the call before any connection is attempted. On failure nothing
 * is left behind: no connection, no plan, and connect may be called
 * again.
 *
 * A producer rank that is full (-EUSERS or -EBUSY with
 * KVP_REASON_PEER_FULL) says when to come back: the queue pair it refused
 * is tried again after that hint (20 ms while handshakes are under way,
 * 250 ms while ranks hold the slots; a hint is read as 10 ms to 60 s),
 * doubled at each refusal of the same handshake up to 64 times, jittered
 * to 50-150 % so that refused ranks do not return together; the call
 * (and kvp_agent_add_engine()'s handshake) fails with the refusal's code
 * only once the next try would be past its deadline or the deadline
 * passes while a queue pair tried again is still connecting, with the
 * reason
 * "producer full: refused N times before the handshake's deadline". A
 * refusal that is retried raises no event. */
KVP_API KVP_MUST_CHECK int kvp_agent_connect(kvp_agent *agent,
					     const struct kvp_peer *ranks,
					     uint32_t n, int timeout_ms);

/* Why the agent's most recent call of kvp_agent_connect(),
 * kvp_agent_add_engine(), kvp_agent_reconnect_engine(),
 * kvp_agent_remove_engine(), kvp_agent_pull(), kvp_agent_pull_from() or
 * kvp_agent_pull_stream() failed: returns its reason (enum kvp_reason; KVP_REASON_NONE when that
 * call succeeded) and copies its line into buf (len bytes at most, NUL
 * included; buf may be NULL). E.g. after kvp_agent_pull_from() returned
 * -EINVAL: KVP_REASON_IDS_MAX, "group 0: 300 local and 300 remote ids,
 * max_ids 256". Not thread-safe against those calls (no call of an agent
 * is). */
KVP_API uint32_t kvp_agent_last_error(const kvp_agent *agent, char *buf,
				      size_t len);

/* Consumer: the plan of kvp_agent_connect()'s engine, or NULL before
 * connect and while that engine is not up. Borrowed: valid while the
 * engine is up (kvp_agent_engine_info() gives any engine's). */
KVP_API const kvp_plan *kvp_agent_plan(const kvp_agent *agent);

/* Consumer: starts pulling request `req_id`: ids[g] for each group g of the
 * layout (as in kvp_plan_emit()), no list longer than max_ids. Posts the
 * READs and notifications right away as far as the send queues have room;
 * the rest waits in preallocated queues and is posted from kvp_agent_poll().
 * Allocation-free. The local id lists are copied (they come back with a
 * FAILED event); the caller's arrays may be reused on return. The local
 * blocks must not be read until DONE is reported for req_id.
 * DONE is reported once the last READ from every producer rank has
 * completed (the data is in) and each of those ranks was found still
 * holding the request after them: one more READ per rank, of its lease
 * (see kvp_agent_expect()). A rank that no longer held it (or never did)
 * ends the request FAILED -ESTALE, KVP_REASON_LEASE, its local ids listed:
 * those bytes may be another request's. KVP_LEASE_OFF=1 in the
 * environment at kvp_agent_open() switches that check off, for measuring
 * its cost only (scripts/rdma-bench.sh --races): never in service. The
 * notifications that free the producer's blocks follow, and the request's
 * slot is reused once they completed.
 * The engine is kvp_agent_connect()'s (see kvp_agent_pull_from() for
 * others).
 * Returns 0, and exactly one DONE or FAILED event follows for req_id;
 * -EINVAL (bad arguments, a list longer than max_ids, lists that do not fit
 * the group); -ERANGE for a block id out of range; -EALREADY when req_id
 * is being pulled from that engine already (from its pull until its
 * event is delivered and its notifications are sent: the producer would
 * release the blocks after one of the two); -EBUSY when max_inflight
 * requests are held (not yet reported, or their notifications not yet
 * sent) or a connection's queue of requests is full (poll, then retry);
 * -ENOTCONN before connect or while its engine is not up (a producer rank
 * was lost: kvp_agent_pull_from() reconnects it). On error nothing was
 * posted and no event follows; kvp_agent_last_error() tells which rule
 * the request broke (KVP_REASON_IDS_MAX, IDS_UNEVEN, IDS_TOKENS,
 * IDS_RANGE, IN_FLIGHT, BUSY, NOT_UP...). */
KVP_API KVP_MUST_CHECK int kvp_agent_pull(kvp_agent *agent, uint64_t req_id,
					  const struct kvp_ids *ids);

/* ---- Producer engines (consumer side) ----
 *
 * A consumer agent pulls from any number of producer engines at once, each
 * known by a handle (a uint32_t, never 0, unique for the agent's life). Its
 * memory is registered once, before the first engine is added; engines
 * come, fail, reconnect and go without touching it.
 *
 *   kvp_agent_add_engine(ranks) -> handle   (non-blocking)
 *   kvp_agent_poll(): KVP_EV_ENGINE_UP      (or ENGINE_DOWN: why)
 *   kvp_agent_pull_from(handle, req, ids):  DONE / FAILED events
 *   a rank lost: FAILED for that engine's requests only, ENGINE_DOWN
 *   kvp_agent_pull_from() again: -EAGAIN, reconnecting; ENGINE_UP
 *   kvp_agent_remove_engine(handle)
 *
 * Engines whose layouts have the same geometry (TP size, memory layout,
 * block sizes: everything but engine id, addresses and keys) share one
 * compiled plan: adding the second such engine compiles nothing, and a
 * restarted engine re-handshakes against the plan it had.
 */

/* Adds producer engine `ranks[0..n)` (as in kvp_agent_connect(): n is
 * its TP size; carried blobs optional) and starts its handshake without
 * blocking: carried blobs are decoded and checked here, the rest is driven
 * by kvp_agent_poll(), which reports KVP_EV_ENGINE_UP once the engine can
 * be pulled from, or KVP_EV_ENGINE_DOWN with the reason (the errors of
 * kvp_agent_connect(); -ETIMEDOUT when it is not up within timeout_ms).
 * Only the producer ranks the plan reads from or notifies are connected.
 * The addresses are copied (for reconnects); carried blobs are decoded and
 * kept for the in-band check of the first handshake only.
 * Returns 0 and the handle in *engine; -EINVAL (not a consumer, bad
 * arguments as for kvp_agent_connect(), timeout_ms 0); -ENXIO when a region
 * is not registered; -EPROTO for a carried blob that fails its checks;
 * -ENOSPC when max_peers engines are held or too few of max_qps' connection
 * slots are free for the engine's notify ranks, even once every idle engine
 * is closed (see kvp_agent_attr.max_qps; known only once its plan is: then
 * it is ENGINE_DOWN -ENOSPC); -ENOMEM. */
KVP_API KVP_MUST_CHECK int kvp_agent_add_engine(kvp_agent *agent,
						const struct kvp_peer *ranks,
						uint32_t n, uint32_t timeout_ms,
						uint32_t *engine);

/* Re-handshakes an engine that is down (ENGINE_DOWN reported), with new
 * addresses and carried blobs (ranks, n: as for kvp_agent_add_engine(), n
 * may differ: a restarted engine may have another TP size), or with the
 * addresses it had and no carried blob (ranks NULL, n 0). The plan is
 * reused when the geometry is unchanged, recompiled (or taken from the
 * cache) otherwise. Reported as for kvp_agent_add_engine(). Returns 0;
 * -ENOENT for an unknown handle; -EBUSY when the engine is up or
 * connecting; the errors of kvp_agent_add_engine(). */
KVP_API KVP_MUST_CHECK int kvp_agent_reconnect_engine(kvp_agent *agent,
						      uint32_t engine,
						      const struct kvp_peer *ranks,
						      uint32_t n,
						      uint32_t timeout_ms);

/* Removes an engine: its connections are torn down, its requests not yet
 * DONE are reported FAILED with -ECANCELED (ids included), and no event of
 * it follows but those. The handle is invalid on return. Returns 0, or
 * -ENOENT for an unknown handle. */
KVP_API int kvp_agent_remove_engine(kvp_agent *agent, uint32_t engine);

/* Consumer: starts pulling request `req_id` from engine `engine`, as
 * kvp_agent_pull() does. Returns what kvp_agent_pull() returns, and
 * -ENOENT for an unknown handle; -EAGAIN while the engine is connecting,
 * or when it is down: then a reconnect with its last addresses and
 * timeout_ms starts here (ENGINE_UP or ENGINE_DOWN follows), so a pull
 * retried after ENGINE_UP succeeds; -ENOSPC when it is down and no
 * connection slot is free nor any engine idle to make room
 * (kvp_agent_attr.max_qps); -ENOTCONN while the engine is going down. */
KVP_API KVP_MUST_CHECK int kvp_agent_pull_from(kvp_agent *agent,
					       uint32_t engine,
					       uint64_t req_id,
					       const struct kvp_ids *ids);

/* Consumer: kvp_agent_pull_from() while the producer engine is still
 * writing the request (its prefill running): each of its ranks this rank
 * reads from is told to follow the request, and the READs of each part go
 * out as soon as that rank publishes it (kvp_agent_publish()), from the
 * same plan (kvp_plan_emit_range_*()), never a byte before. Several parts
 * published meanwhile are read as one range, so a lagging consumer posts
 * no more READs than a bulk pull. With kvp_agent_attr.stream_events,
 * KVP_EV_ARRIVED reports the leading model layers that landed, as they
 * do. DONE comes once every byte landed, as
 * for a bulk pull; the producer then releases on the notifications, as
 * ever. A rank that publishes nothing new for stall_ms fails the request
 * alone: no more of its READs go out, the posted ones complete, then
 * FAILED (-ETIMEDOUT, KVP_REASON_STALL, its local ids) and its
 * notifications, so that the producer releases it; the engine and its
 * other requests go on. (A bulk pull's stall_ms runs from the pull and
 * fails the engine: no data means no transport.)
 *
 * The producer may publish before this call, or call kvp_agent_expect()
 * after it: a rank that learns of the request late sends what is
 * published so far at once. A producer rank holds the requests followed
 * before its kvp_agent_expect() as it holds early notifications (at most
 * max_inflight / 8, at least 8, per consumer rank; max_inflight in all),
 * and at most its max_inflight followed requests per consumer rank: a
 * FOLLOW past those is dropped (stats.notes_dropped) and the request
 * stalls (stall_ms). A consumer rank follows a request until its
 * notification of it reaches the producer rank (after DONE or FAILED),
 * even while the producer holds the request for other ranks: then it
 * gets no more progress records of it, and its record and follower slot
 * serve its later requests. Same returns as kvp_agent_pull_from().
 *
 * GPU memory: DONE means the READs completed at this rank's NIC, as for a
 * bulk pull; on platforms where that does not make the bytes visible to a
 * GPU kernel, the engine flushes (its usual post-transfer fence) before
 * use.
 *
 * Queue pairs: the FOLLOW and the progress record travel on each rank's
 * first queue pair; the READs are striped over its qps_per_peer queue
 * pairs as a bulk pull's are. A streamed request that waits for progress
 * holds no queue pair: the READs of pulls queued after it (streamed or
 * bulk) go out meanwhile, and their DONE events come when their data is
 * in. Their notifications, however, go in pull order on each rank: a
 * producer releases a request pulled after a streamed one once that one's
 * data is in too. */
KVP_API KVP_MUST_CHECK int kvp_agent_pull_stream(kvp_agent *agent,
						 uint32_t engine,
						 uint64_t req_id,
						 const struct kvp_ids *ids);

enum kvp_engine_state {
	KVP_ENGINE_CONNECTING = 1, /* handshake under way */
	KVP_ENGINE_UP,		   /* can be pulled from */
	KVP_ENGINE_FAILING,	   /* a rank was lost; draining */
	KVP_ENGINE_DOWN,	   /* reconnect or remove */
};

/* Per-engine counters and facts, and the same summed over engines in
 * struct kvp_agent_stats. */
struct kvp_engine_info {
	uint32_t state;	    /* enum kvp_engine_state */
	int32_t status;	    /* DOWN: why (-errno) */
	uint64_t engine_id; /* the producer engine's id, once known */
	uint32_t tp_size;   /* producer TP size */
	uint32_t conns;	    /* connections: each producer rank of the notify
			     * list, with qps queue pairs to the ranks read
			     * from */
	uint32_t qps;	    /* queue pairs per producer rank read from */
	const kvp_plan *plan; /* NULL before the first UP; borrowed: valid
			       * until the engine is removed or reconnected */
	uint64_t plan_bytes;  /* the plan's size (shared with engines of the
			       * same geometry) */
	uint64_t table_bytes; /* this engine's own tables: addresses, keys,
			       * connection state, rank maps */
	uint64_t pulls, done, failed;
	uint64_t reads, read_bytes;
	uint64_t transport_failures; /* ranks lost: errors, disconnects */
	uint64_t stalls;	     /* stall_ms passed (-ETIMEDOUT): the engine
				      * failed, or a streamed request */
	uint64_t handshake_failures;
	uint64_t reconnects;	     /* handshakes after the first */
	uint64_t add_ns;	     /* last handshake: add or reconnect call
				      * to UP */
	uint32_t plan_cached;	     /* last handshake reused a plan */
	/* DOWN: why (enum kvp_reason), the producer's own reason when it
	 * refused us (KVP_REASON_PEER_REFUSED), and a line for an operator,
	 * e.g. "producer rank 1: group 0 layer 0 K: head extent differs:
	 * local 4, remote 8". Cleared when a handshake starts. */
	uint32_t reason, peer_reason;
	char why[KVP_WHY_LEN];
};

/* Copies engine `engine`'s facts into *info. Returns 0, -ENOENT for an
 * unknown handle, -EINVAL. */
KVP_API KVP_MUST_CHECK int kvp_agent_engine_info(const kvp_agent *agent,
						 uint32_t engine,
						 struct kvp_engine_info *info);

/* Consumer: a copy of producer rank `rank`'s layout as engine `engine`
 * described it at its last handshake (in-band or carried metadata, with
 * its regions' addresses and keys), to check or debug a transfer: e.g.
 * kvp_plan_compile(local, *out, ...) and kvp_plan_emit() say which remote
 * bytes each local byte of a request comes from (kvpull-plan does the same
 * from spec files). engine 0: kvp_agent_connect()'s. The caller destroys
 * it (kvp_layout_destroy()). Returns 0; -EINVAL (NULLs, not a consumer);
 * -ENOENT for an unknown handle; -ERANGE when rank is not below the
 * engine's TP size; -EAGAIN while the engine is not up; -ENOMEM. On
 * failure *out is untouched. */
KVP_API KVP_MUST_CHECK int kvp_agent_engine_layout(const kvp_agent *agent,
						   uint32_t engine,
						   uint32_t rank,
						   kvp_layout **out);

/* Producer: consumer engine `consumer_engine` will pull request `req_id`;
 * its blocks must stay untouched until RELEASED (every consumer rank that
 * must notify this producer rank did) or EXPIRED (`deadline_ns`,
 * CLOCK_MONOTONIC, passed first) is reported for it.
 *
 * `consumer_engine` is the consumer engine's id: the engine_id of its
 * layout (struct kvp_layout_attr, the same on every rank of that engine),
 * which its notifications carry and its handshake announces. The
 * scheduler that tells the consumer to pull tells the producer this id.
 * An EXPIRED event's reason is KVP_REASON_OTHER_ENGINE when no rank of
 * that engine notified the request but a rank of another engine did
 * (the two sides were told different engines; best effort: a later
 * request id may overwrite that evidence, then it reads
 * KVP_REASON_TIMEOUT), KVP_REASON_TIMEOUT otherwise.
 *
 * Requests are keyed by (consumer engine, req_id): notifications from one
 * consumer engine never count for another engine's request, and each
 * consumer rank counts once. The count that releases a request is fixed
 * when first known: here if a rank of that engine is connected, else at
 * its first notification. Notifications that arrive before expect are kept
 * (for up to 30 s; at most max_inflight of them, max_inflight / 8 but
 * at least 8 per consumer rank, and once half of them are taken, at most
 * max_inflight over the number of consumer engines connected per engine,
 * so that one engine's ranks cannot take every slot) and counted.
 *
 * Uniqueness and reuse: a (consumer engine, req_id) pair names one
 * transfer. Once reported, RELEASED or EXPIRED, it is remembered for 30 s
 * (the most recent max_inflight of them): notifications for it are dropped
 * (stats.notes_dropped) rather than counted for a later request, and
 * expecting it again returns -EALREADY. A retried transfer therefore
 * needs a fresh req_id (e.g. an attempt number in the high bits) unless
 * 30 s have passed.
 *
 * Leases (fail closed): from this call until its RELEASED or EXPIRED
 * event, the request holds a lease in a table the consumer ranks READ
 * (one READ per producer rank, after that rank's data READs, with no CPU
 * of ours); it is withdrawn before the event is queued, so before the
 * engine can hear of it and reuse a block. A consumer whose check finds no
 * lease for its request ends it FAILED -ESTALE (KVP_REASON_LEASE), never
 * DONE: a pull before this call, or after the request was reported, fails
 * closed. So call it before the request's block ids can reach a consumer:
 * the check proves the request held when its lease was read, after the
 * READs; a lease granted between a READ and that check (a pull racing
 * ahead of this call, its blocks still being written) would vouch for
 * bytes read before it. The window is microseconds when a rank's READs
 * went on one queue pair (the lease READ is chained behind them), a
 * completion's round trip when they were striped over several.
 * Such pulls still notify (flagged): stats.unheld counts them.
 *
 * Returns 0, and exactly one RELEASED or EXPIRED event follows; -EINVAL
 * (not a producer); -EEXIST when the pair is already expected; -EALREADY
 * when it was reported within the last 30 s; -EBUSY when max_inflight
 * requests are expected or unreported; -ENOSPC (stats.lease_full) when
 * the lease table's bucket of the pair is full (8 leases in a bucket of
 * 2 x max_inflight: well below 1e-7 per call at max_inflight held; try
 * again once a request is reported). Notifications land in receive
 * buffers that kvp_agent_poll() re-posts: a producer that stops polling
 * holds its consumers' notifications back until it polls again (their
 * DONE events do not wait for them: see stall_ms). */
KVP_API KVP_MUST_CHECK int kvp_agent_expect(kvp_agent *agent,
					    uint64_t consumer_engine,
					    uint64_t req_id,
					    uint64_t deadline_ns);

/* Producer: publishes how much of an expected request is written
 * (struct kvp_progress: tokens [0, tokens_all) in every layer, tokens
 * [tokens_all, tokens_cur) in layers [0, layers_cur); the last chunk as
 * KVP_TOKENS_END), for consumer ranks that pull it in streaming mode
 * (kvp_agent_pull_stream()). Progress only grows. Call it as layers or
 * chunks finish; a finished prefill is tokens_all = KVP_TOKENS_END.
 * Costs O(consumer ranks following the request), never O(blocks), and
 * never blocks: each follower gets one RDMA WRITE of a 40-byte record at
 * a time, and what is published while one is in flight goes with the
 * next (the latest progress, once). A WRITE that cannot be posted fails
 * that consumer rank's connection (KVP_EV_DISCONNECTED follows); the
 * request's other followers still get the progress.
 *
 * On GPUs, publish only after the engine's own event says the kernels
 * that wrote those layers finished (the consumer's READs may start at
 * once).
 *
 * Returns 0 (also when nothing grew); -EINVAL (not a producer, NULL, a
 * malformed progress); -ENOENT when the request is not expected (call
 * kvp_agent_expect() first); -ERANGE when p covers less than a previous
 * publish in some layer. */
KVP_API KVP_MUST_CHECK int kvp_agent_publish(kvp_agent *agent,
					     uint64_t consumer_engine,
					     uint64_t req_id,
					     const struct kvp_progress *p);

enum kvp_event_type {
	KVP_EV_DONE = 1,     /* consumer: request pulled, blocks valid */
	KVP_EV_FAILED,	     /* consumer: request failed; recompute ids */
	KVP_EV_RELEASED,     /* producer: every consumer read; free blocks */
	KVP_EV_EXPIRED,	     /* producer: deadline passed; free blocks */
	KVP_EV_DISCONNECTED, /* a peer rank is gone (consumer: or its
			      * handshake failed; producer: a connected
			      * consumer rank only) */
	KVP_EV_ENGINE_UP,    /* consumer: a producer engine can be pulled
			      * from (added or reconnected) */
	KVP_EV_ENGINE_DOWN,  /* consumer: a producer engine's handshake
			      * failed, or it lost a rank and its requests
			      * failed; status says why */
	KVP_EV_ARRIVED,	     /* consumer: layers [0, layers) of a streamed
			      * request landed (stream_events) */
};

struct kvp_event {
	uint32_t type;	    /* enum kvp_event_type */
	int32_t status;	    /* 0, or -errno: FAILED, DISCONNECTED,
			     * ENGINE_DOWN */
	uint64_t req_id;    /* DONE, FAILED, RELEASED, EXPIRED */
	uint64_t engine_id; /* RELEASED: consumer engine; DISCONNECTED,
			     * ENGINE_UP, ENGINE_DOWN: producer engine (0
			     * when not yet known) */
	uint32_t rank;	    /* DISCONNECTED: peer rank */
	uint32_t ngroups;   /* FAILED: entries in ids */
	/* FAILED: the request's ids per group, local lists only (remote NULL,
	 * nremote 0): every one of these local blocks may hold partial data
	 * and must be recomputed. Owned by the agent, valid until the next
	 * kvp_agent_poll() or kvp_agent_close(). NULL otherwise. */
	const struct kvp_ids *ids;
	uint32_t engine;    /* consumer: the engine handle (DONE, FAILED,
			     * DISCONNECTED, ENGINE_UP, ENGINE_DOWN) */
	uint32_t reads;	    /* DONE: RDMA READs the request took */
	uint64_t bytes;	    /* DONE: bytes they moved */
	uint64_t elapsed_ns; /* DONE: from kvp_agent_pull() to the last
			      * READ's completion */
	uint32_t reason;      /* ENGINE_DOWN, FAILED, DISCONNECTED, EXPIRED:
			       * enum kvp_reason (0: none recorded) */
	uint32_t peer_reason; /* with KVP_REASON_PEER_REFUSED: the
			       * producer's reason */
	/* ARRIVED: every byte of model layers [0, layers) of the request,
	 * at every token, from every producer rank, has landed in the local
	 * blocks (the READs completed, as for DONE): an engine may start on
	 * those layers. Reported as that count grows, below the request's
	 * last layer (DONE ends it); several may come as one. A chunked
	 * prefill completes a layer only with its last chunk. */
	uint32_t layers;
};

/* Drives the agent without blocking: completions (polled in arrays), queued
 * work requests, connection events, deadlines. Writes up to `max` events
 * to ev[] and returns how many (>= 0), -EINVAL, or -EIO when polling the
 * completion queue failed (an overrun or a device error: the agent's
 * connections cannot recover; close it). Events not returned stay
 * queued for the next call. FAILED (and ENGINE_DOWN) status: -ECONNRESET
 * (a producer rank disconnected), -ETIMEDOUT (the transport gave up
 * retrying: a few seconds without an answer from a peer that vanished
 * without disconnecting; or stall_ms passed), -EACCES (remote access
 * refused), -EIO (other completion errors, a QP reported fatal by the
 * device), -ENETDOWN (the device's port went down), -ENODEV (the device
 * failed), -ECANCELED (kvp_agent_remove_engine()). A producer rank dying
 * mid-transfer fails its engine and every request of that engine not yet
 * DONE, and nothing else: the engine's queue pairs are moved to error,
 * every posted work request is flushed, and requests waiting to be posted
 * fail with them (waiting for the flush is bounded by 2 s) before
 * ENGINE_DOWN; kvp_agent_pull_from() then reconnects it on demand. */
KVP_API KVP_MUST_CHECK int kvp_agent_poll(kvp_agent *agent,
					  struct kvp_event *ev, int max);

#define KVP_AGENT_FDS 3
/* File descriptors to sleep on (epoll/poll for reading): the completion
 * channel's, the rdma_cm event channel's and the device's asynchronous
 * events' (port down, QP fatal: kvp_agent_poll() fails what they hit).
 * Writes up to `max` of them and returns how many there are
 * (KVP_AGENT_FDS), or -EINVAL (agent NULL, max < 0, fds NULL with max >
 * 0). Owned by the agent: do not read or close them. All are
 * non-blocking. To sleep:
 *   1. kvp_agent_arm(); if it returns > 0, poll instead of sleeping;
 *   2. wait for either fd to be readable, up to *wake_ns;
 *   3. kvp_agent_poll() (it consumes the fd's events and re-arms nothing:
 *      arm again before the next sleep). */
KVP_API KVP_MUST_CHECK int kvp_agent_fds(const kvp_agent *agent, int *fds,
					 int max);

/* Requests a completion-channel wakeup for the next completion and tells
 * when the agent next needs kvp_agent_poll() regardless of the fds: the
 * earliest producer deadline or internal timer, CLOCK_MONOTONIC ns, in
 * *wake_ns (UINT64_MAX: none). Returns 0 when it is safe to sleep, 1 when
 * events or completions are already waiting (call kvp_agent_poll() first),
 * or a negative errno. Makes system calls; not for busy-polling loops. */
KVP_API KVP_MUST_CHECK int kvp_agent_arm(kvp_agent *agent, uint64_t *wake_ns);

/* Counters since open. */
struct kvp_agent_stats {
	uint64_t pulls;	      /* consumer: pulls accepted */
	uint64_t done, failed;  /* consumer: requests reported */
	uint64_t reads;	      /* RDMA READs posted */
	uint64_t read_bytes;  /* bytes those READs move */
	uint64_t doorbells;   /* ibv_post_send() calls on the data path */
	uint64_t queued;      /* WRs that waited for send queue room */
	uint64_t notes_sent;  /* consumer: notifications posted */
	uint64_t notes_recv;  /* producer: notifications received */
	uint64_t notes_dropped; /* producer: malformed, duplicate, orphaned or
				 * over capacity */
	uint64_t released, expired; /* producer: requests reported */
	uint64_t connects, disconnects; /* peer ranks connected and lost */
	uint64_t refused; /* producer: connect requests and handshakes
			   * refused (limits, secret, metadata) */
	/* Consumer, summed over engines (struct kvp_engine_info has them per
	 * engine): */
	uint64_t transport_failures; /* producer ranks lost */
	uint64_t stalls;	     /* stall_ms passed: engines failed, and
				      * streamed requests */
	uint64_t handshake_failures; /* engine handshakes that failed */
	uint64_t reconnects;	     /* engine handshakes after the first */
	uint64_t credit_waits;	     /* times notifications to a producer
				      * rank had to wait for its receive
				      * credit (its counter is then read
				      * at most once a millisecond) */
	uint64_t plan_compiles, plan_hits; /* engine handshakes that compiled
					    * a plan / reused one */
	uint64_t probes; /* producer: liveness probes answered */
	uint64_t rnr_timer_unset; /* producer: connections whose RNR timer
				   * the provider would not change from
				   * rdma_cm's (655 ms) */
	uint64_t striped; /* consumer: a request's READs from one producer
			   * rank that went over more than one queue pair */
	uint64_t dmabuf_fallbacks; /* kvp_agent_register_dmabuf() calls
				    * that registered addr instead */
	uint64_t async_errors; /* device events that failed connections (QP
				* fatal, port down, device fatal) */
	/* Streaming (kvp_agent_pull_stream(), kvp_agent_publish()): */
	uint64_t publishes;	  /* producer: progresses published */
	uint64_t follows;	  /* producer: consumer ranks that followed a
				   * request */
	uint64_t progress_writes; /* producer: progress records written to
				   * followers (at most one in flight each:
				   * publishes meanwhile coalesce) */
	uint64_t progress_seen;	  /* consumer: new progresses read */
	uint64_t arrivals;	  /* consumer: KVP_EV_ARRIVED reported */
	uint64_t mem_bytes; /* what the agent allocated for its peers and its
			     * data path: connection slots, queues, request
			     * slots, posting window, plans and engine tables;
			     * not the registered memory itself */
	/* Fleet scale: */
	uint64_t peers;	     /* peer ranks connected now (producer:
			      * consumer ranks; consumer: producer ranks) */
	uint64_t qps;	     /* queue pairs open now, any state */
	uint64_t evictions;  /* producer: consumer ranks disconnected to make
			      * room for a newcomer; consumer: engines
			      * closed to make room within max_qps */
	uint64_t idle_closes; /* producer: consumer ranks disconnected after
			       * idle_ms */
	uint64_t srq_bufs;    /* producer: buffers in its shared receive
			       * queue now (0: a receive queue per queue
			       * pair; see kvp_agent_attr.srq) */
	uint64_t credit_abuses; /* producer: connections dropped for
				 * sending beyond their credit, or for
				 * anything but AUTH before proving it */
	uint64_t credit_gives;	/* consumer: GIVEs sent (a quiet first
				 * QP's loans handed back); producer: GIVEs
				 * taken */
	uint64_t srq_last_wqe;	/* producer, shared receive queue: whether
				 * the device reports a QP's last WQE
				 * (IBV_EVENT_QP_LAST_WQE_REACHED), which a
				 * QP's release waits for (without it, mlx5
				 * may lose a buffer): 0 not known yet, 1 it
				 * does, 2 it does not (found when the first
				 * QP's release waited 200 ms for it: later
				 * releases do not wait). Only a NIC shows
				 * 1; soft-RoCE shows which it does. */
	/* Fail closed (see "Leases"): */
	uint64_t lease_reads;	/* consumer: lease READs (one per producer
				 * rank read from, per request) */
	uint64_t lease_fails;	/* consumer: requests FAILED with
				 * KVP_REASON_LEASE */
	uint64_t unheld;	/* producer: consumer ranks that read a
				 * request this agent did not hold (their
				 * notification says so, or names a request
				 * already reported): a scheduler handing
				 * out stale references */
	uint64_t lease_full;	/* producer: kvp_agent_expect() refused with
				 * -ENOSPC, the request's lease bucket full */
};

/* Copies the agent's counters into *st. */
KVP_API void kvp_agent_get_stats(const kvp_agent *agent,
				 struct kvp_agent_stats *st);

/* ---- Metrics ----
 *
 * Formats of kvp_agent_metrics(): the Prometheus text exposition format
 * (version 0.0.4, what a /metrics endpoint serves:
 * "text/plain; version=0.0.4"), or one JSON object that keeps counters,
 * gauges and histograms apart. */
#define KVP_METRICS_TEXT 0
#define KVP_METRICS_JSON 1

/* Writes the agent's metrics into buf[cap], as snprintf() does: at most
 * cap - 1 bytes of the exposition and a NUL (nothing when cap is 0; buf
 * may then be NULL), and returns the length of the whole exposition, NUL
 * excluded: a return >= cap means it was cut, call again with a buffer of
 * at least the return + 1 bytes. Names, units and types follow
 * Prometheus' conventions (kvpull_read_bytes_total,
 * kvpull_pull_duration_seconds): counters since open (_total), gauges
 * (state now), and latency histograms of fixed buckets (2^8 ns to 2^35 ns,
 * a power of two each) kept by the agent at constant cost per event: a
 * consumer's pulls, from the pull to DONE or FAILED (labels mode="bulk" or
 * "stream", outcome="done" or "failed": every pull is counted once, when
 * its event is queued), its engines' handshakes, the exposed time of
 * streamed pulls (from the moment the last producer rank's final
 * progress was seen to DONE), a producer's consumer handshakes and the
 * time of its kvp_agent_poll() calls that took completions or returned
 * events. Series about a peer engine carry peer_engine (its id) and
 * handle (a consumer's engine handle); a consumer's per producer rank
 * series carry peer_rank; refusals carry reason (kvp_reason_str()'s
 * short name). docs/metrics.md lists every family. One agent's
 * exposition is one scrape's worth: to serve several agents from one
 * endpoint, merge their families (the Python binding's
 * kvpull.metrics.prometheus_text() does).
 *
 * Allocation-free and without system calls; reads only the agent's
 * memory (a walk of its engines and connection slots, as
 * kvp_agent_get_stats() does): cheap enough for a scrape every second,
 * not for the per-request path. Not thread-safe against the agent's
 * other calls (no call of an agent is). Returns the length (>= 0);
 * -EINVAL (agent NULL, an unknown format, buf NULL with cap > 0);
 * -EMSGSIZE when the exposition would pass INT_MAX bytes. */
KVP_API KVP_MUST_CHECK int kvp_agent_metrics(const kvp_agent *agent,
					     uint32_t format, char *buf,
					     size_t cap);
/* ---- end of transport ---- */

#ifdef __cplusplus
}
#endif

#endif /* KVPULL_H */
