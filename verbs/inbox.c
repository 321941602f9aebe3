// SPDX-License-Identifier: MIT
/*
 * The messages of the producer's shared receive queue: each completion
 * names a queue pair, found in the QP number map (srq.c); its message goes
 * to the handshake (an AUTH, listen.c), to the credit rules (credit.h, a
 * GIVE) and to the requests (notifications, FOLLOW, TABLE, BYE: serve.c).
 */
#include <string.h>

#include "internal.h"

/* A message in the shared receive queue, from the queue pair its
 * completion names: the AUTH of a connection in its handshake, then only
 * what its credit allows once it is ready. Anything else (a second
 * message before GO, any message once refused or before its blob checked
 * out, one past its credit) drops the connection at once: a peer that has
 * not proved the secret keeps at most its own buffer busy. */
static void srq_msg(kvp_agent *a, struct kvp_conn *c, const uint8_t *m,
		    uint32_t len)
{
	uint32_t n = 0;
	int give;

	if (c->state == CS_CONNECTING && !c->auth_seen && !c->refused) {
		c->auth_seen = 1;
		kvp__auth_in(a, c, m, len);
		return;
	}
	give = len >= 8 && kvp__get32(m) == KVP_GIVE_MAGIC;
	if (give)
		n = kvp__get32(m + 4);
	if (c->state != CS_READY || c->refused ||
	    kvp__srq_took(a, c, give, n)) {
		a->st.credit_abuses++;
		kvp__conn_fail(a, c, -EPROTO);
		return;
	}
	if (give) {
		a->st.credit_gives++;
		c->psn_msgs++; /* one PSN: not a READ (kvp__rank_busy()) */
	}
	else
		kvp__note_msg(a, c, m, len);
}

void kvp__srq_wc(kvp_agent *a, const struct ibv_wc *wc)
{
	const uint32_t i = WRID_VALUE(wc->wr_id);
	const uint32_t len = wc->byte_len < KVP_CTL_LEN ? wc->byte_len :
							  KVP_CTL_LEN;
	uint8_t m[KVP_CTL_LEN];
	struct kvp_conn *c;

	if (i >= a->srq_n)
		return; /* unreachable: our own wr_id */
	/* The buffer goes back before the credit it frees is given. */
	memcpy(m, a->srq_buf + (size_t)i * KVP_CTL_LEN, len);
	kvp__srq_repost(a, i);
	c = kvp__qpn_find(a, wc->qp_num);
	if (!c || c->state >= CS_DRAINING)
		return; /* going: what it sent no longer counts */
	if (wc->status != IBV_WC_SUCCESS)
		kvp__conn_fail(a, c, kvp__wc_errno(wc->status));
	else
		srq_msg(a, c, m, len);
}
