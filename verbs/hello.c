// SPDX-License-Identifier: MIT
/*
 * The hello and the refusal as bytes (hello.h). No verbs call.
 */
#include <errno.h>
#include <string.h>

#include "kvpull.h"
#include "../plan/le.h"
#include "hello.h"

void kvp__hello_put(uint8_t *p, const struct kvp_hello *h)
{
	memset(p, 0, KVP_HELLO_LEN);
	kvp__put32(p, KVP_HELLO_MAGIC);
	p[4] = (uint8_t)h->version;
	p[5] = (uint8_t)(h->version >> 8);
	p[6] = (uint8_t)h->role;
	p[7] = (uint8_t)(h->role >> 8);
	kvp__put32(p + 8, h->tp_size);
	kvp__put32(p + 12, h->tp_rank);
	kvp__put32(p + 16, h->blob_len);
	kvp__put32(p + 20, (h->flags & 0xffffu) |
				   ((h->lib >> 8) & 0xffffu) << KVP_HELLO_LIB_SHIFT);
	kvp__put64(p + 24, h->engine_id);
	memcpy(p + 32, h->nonce, KVP_NONCE_LEN);
}

int kvp__hello_get(const void *buf, size_t len, struct kvp_hello *h)
{
	const uint8_t *p = buf;

	if (!p || len < 8 || kvp__get32(p) != KVP_HELLO_MAGIC)
		return -EPROTO;
	h->version = (uint16_t)(p[4] | p[5] << 8);
	h->lib = 0;
	if (h->version != KVP_HELLO_VERSION) {
		/* Versions 6 on keep the library's there. */
		if (h->version >= 6 && len >= 24)
			h->lib = (kvp__get32(p + 20) >> KVP_HELLO_LIB_SHIFT) << 8;
		return -EPROTONOSUPPORT;
	}
	if (len < KVP_HELLO_LEN)
		return -EPROTO;
	h->role = (uint16_t)(p[6] | p[7] << 8);
	h->tp_size = kvp__get32(p + 8);
	h->tp_rank = kvp__get32(p + 12);
	h->blob_len = kvp__get32(p + 16);
	h->flags = kvp__get32(p + 20);
	h->lib = (h->flags >> KVP_HELLO_LIB_SHIFT) << 8;
	h->flags &= (1u << KVP_HELLO_LIB_SHIFT) - 1;
	h->engine_id = kvp__get64(p + 24);
	memcpy(h->nonce, p + 32, KVP_NONCE_LEN);
	if (h->role >= KVP_ROLE_COUNT ||
	    !h->tp_size || h->tp_rank >= h->tp_size || !h->blob_len ||
	    h->blob_len > KVP_META_MAX || (h->flags & ~(KVP_HELLO_AUTH | KVP_HELLO_QPS_MASK |
			 KVP_HELLO_QI_MASK)))
		return -EPROTO;
	return 0;
}

size_t kvp__refusal_put(uint8_t *p, const struct kvp_refusal *r)
{
	kvp__put32(p, KVP_REFUSE_MAGIC);
	kvp__put32(p + 4, (uint32_t)r->err);
	kvp__put32(p + 8, r->reason);
	kvp__put32(p + 12, r->retry_ms);
	kvp__put32(p + 16, r->version);
	kvp__put32(p + 20, r->lib);
	return KVP_REFUSE_VER_LEN;
}

int kvp__refusal_get(const uint8_t *p, size_t len, struct kvp_refusal *r)
{
	memset(r, 0, sizeof(*r));
	if ((len != KVP_REFUSE_LEN && len != KVP_REFUSE_HINT_LEN &&
	     len != KVP_REFUSE_VER_LEN) ||
	    kvp__get32(p) != KVP_REFUSE_MAGIC)
		return -EPROTO;
	r->err = (int32_t)kvp__get32(p + 4);
	r->reason = kvp__get32(p + 8);
	if (r->reason >= KVP_REASON_COUNT)
		r->reason = KVP_REASON_NONE;
	if (len >= KVP_REFUSE_HINT_LEN)
		r->retry_ms = kvp__get32(p + 12);
	if (len >= KVP_REFUSE_VER_LEN) {
		r->version = kvp__get32(p + 16);
		r->lib = kvp__get32(p + 20);
	}
	return 0;
}
