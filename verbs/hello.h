/* SPDX-License-Identifier: MIT */
/*
 * The handshake's first words, as byte strings: the hello each side puts
 * in rdma_cm's private data, and a refusal (a connect reject's private
 * data, or a message on the connection). Pure: no verbs call, nothing but
 * these encoders and decoders reads or writes their bytes
 * (tests/test_hello.c pins them).
 */
#ifndef KVP_HELLO_H
#define KVP_HELLO_H

#include <stddef.h>
#include <stdint.h>

#ifndef KVP_HIDDEN
#define KVP_HIDDEN __attribute__((visibility("hidden")))
#endif

/* rdma_cm private data of connect (KVP_HELLO_LEN) and accept
 * (KVP_HELLO_ACCEPT_LEN: the hello, then the producer's proof). Both fit
 * the smallest private data rdma_cm carries on IB/RoCE: 56 bytes in a
 * connect request, 196 in an accept. */
#define KVP_HELLO_MAGIC 0x4b565048u /* "HPVK" read as LE: 'K','V','P','H' */
/* The handshake's version. Two agents talk only at the same version. The
 * hello's first 8 bytes (magic, version) and a refusal's layout
 * (KVP_REFUSE_*) never change, so that agents of any two versions tell
 * each other apart: a producer refuses another version's hello with
 * -EPROTONOSUPPORT, KVP_REASON_VERSION and its own versions, a consumer
 * fails an accept of another version the same way, and each side's
 * reason line names both versions. Version 6: the library's version in
 * the hello (flags bits 16-31) and in refusals. */
#define KVP_HELLO_VERSION 6
#define KVP_HELLO_LEN 48
/* With a secret, a consumer's connect request carries its hello and then
 * a proof of the secret over it: the first KVP_HELLO_TAG_LEN bytes of
 * HMAC-SHA-256(secret, "kvpull hello " || hello), 56 bytes in all. The
 * hello's nonce starts with the sender's clock (u64 seconds since the
 * epoch) and 8 random bytes; a producer refuses a request without a
 * valid proof, or one whose clock is more than KVP_HELLO_SKEW_S from its
 * own, before it creates a queue pair: a stranger without the secret
 * never reaches the shared receive queue, and a connect request captured
 * on the wire replays for that long at most (its AUTH, which covers the
 * producer's fresh nonce, cannot be replayed). */
#define KVP_HELLO_TAG_LEN 8
#define KVP_HELLO_REQ_LEN (KVP_HELLO_LEN + KVP_HELLO_TAG_LEN)
#define KVP_HELLO_SKEW_S 120
#define KVP_HELLO_ACCEPT_LEN (KVP_HELLO_LEN + KVP_MAC_LEN)
#define KVP_HELLO_AUTH 1u /* flags: the sender holds a shared secret */
/* flags bits 8-11: a consumer rank's queue pairs to each producer rank
 * (qps_per_peer; 0: not said), so that a producer admits them together */
#define KVP_HELLO_QPS_SHIFT 8
#define KVP_HELLO_QPS_MASK (0xfu << KVP_HELLO_QPS_SHIFT)
/* flags bits 12-15: which of them this connection is (0: the first, the
 * one that carries notifications, FOLLOW and TABLE; the others carry only
 * READs and a BYE), so that a producer posts notification buffers where
 * they are used */
#define KVP_HELLO_QI_SHIFT 12
#define KVP_HELLO_QI_MASK (0xfu << KVP_HELLO_QI_SHIFT)
/* flags bits 16-31: the sender's library version, major << 8 | minor
 * (struct kvp_hello's lib; informational, the handshake version decides) */
#define KVP_HELLO_LIB_SHIFT 16
/* Largest metadata blob a hello may announce (blob_len). */
#define KVP_META_MAX (16u << 20)
#define KVP_NONCE_LEN 16
#define KVP_MAC_LEN 32
struct kvp_hello {
	uint16_t version, role;
	uint32_t tp_size, tp_rank;
	uint32_t blob_len;
	uint32_t flags; /* below KVP_HELLO_LIB_SHIFT */
	uint32_t lib;	/* kvp_version() of the sender, patch level 0 */
	uint64_t engine_id;
	uint8_t nonce[KVP_NONCE_LEN];
};
/* Writes h as KVP_HELLO_LEN bytes (flags below KVP_HELLO_LIB_SHIFT, and
 * h->lib's major and minor above). */
KVP_HIDDEN void kvp__hello_put(uint8_t *p, const struct kvp_hello *h);
/* Reads len bytes at p: 0; -EPROTO when malformed (not a hello, short,
 * fields out of range, unknown flags); -EPROTONOSUPPORT when of another
 * handshake version, with only h->version and h->lib set (lib 0 before
 * version 6). */
KVP_HIDDEN int kvp__hello_get(const void *p, size_t len, struct kvp_hello *h);

#define KVP_REFUSE_MAGIC 0x4b565052u
#define KVP_REFUSE_LEN 12
/* A refusal in a connect reject may add u32 retry_after_ms: the producer
 * was full (KVP_REASON_PEER_FULL), and the consumer may come back then.
 * Consumers that read only the first KVP_REFUSE_LEN bytes are unaffected
 * (the transport pads a reject's private data anyway). */
#define KVP_REFUSE_HINT_LEN 16
/* Since handshake version 6 a refusal carries u32 the refuser's handshake
 * version and u32 its kvp_version() after the hint (0 when an older
 * agent's reject was padded). */
#define KVP_REFUSE_VER_LEN 24
struct kvp_refusal {
	int32_t err;	  /* the refuser's -errno */
	uint32_t reason;  /* enum kvp_reason (KVP_REASON_NONE past the list) */
	uint32_t retry_ms; /* a full producer's hint; 0: none */
	uint32_t version; /* the refuser's handshake version; 0: not said */
	uint32_t lib;	  /* its kvp_version(); 0: not said */
};
/* Writes r as KVP_REFUSE_VER_LEN bytes; returns that length. */
KVP_HIDDEN size_t kvp__refusal_put(uint8_t *p, const struct kvp_refusal *r);
/* Reads a refusal of len bytes (KVP_REFUSE_LEN, _HINT_LEN or _VER_LEN
 * exactly: a connect reject's private data, which transports pad, is cut
 * to KVP_REFUSE_VER_LEN by the caller): 0, or -EPROTO when it is none. */
KVP_HIDDEN int kvp__refusal_get(const uint8_t *p, size_t len,
				struct kvp_refusal *r);

#endif
