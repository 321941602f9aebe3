// SPDX-License-Identifier: MIT
/*
 * Reasons: which check refused a call, a handshake or a transfer, and a
 * line that says so (enum kvp_reason in kvpull.h). A floor below every
 * other file of verbs/: it records, it calls nothing but libc.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"

int kvp__why(struct kvp_why *w, int err, uint32_t reason, const char *fmt, ...)
{
	va_list ap;

	if (w->reason)
		return err;
	w->reason = reason;
	w->line = NULL;
	va_start(ap, fmt);
	vsnprintf(w->msg, sizeof(w->msg), fmt, ap);
	va_end(ap);
	return err;
}

void kvp__why_errno(struct kvp_why *w, int err)
{
	uint32_t r;

	switch (err) {
	case -ETIMEDOUT:
		r = KVP_REASON_TIMEOUT;
		break;
	case -ECONNRESET:
	case -EIO:
	case -EACCES:
		r = KVP_REASON_TRANSPORT;
		break;
	case -ECANCELED:
		r = KVP_REASON_REMOVED;
		break;
	case -ENETDOWN:
	case -ENODEV:
		r = KVP_REASON_DEVICE;
		break;
	case -EPERM:
		r = KVP_REASON_AUTH;
		break;
	case -EPROTO:
		r = KVP_REASON_MALFORMED;
		break;
	case -EBUSY:
	case -EUSERS:
	case -ENOSPC:
	case -ENOMEM:
		r = KVP_REASON_PEER_FULL;
		break;
	case -ECONNREFUSED:
	case -EHOSTUNREACH:
	case -ENETUNREACH:
	case -EADDRNOTAVAIL:
	case -ECONNABORTED:
		r = KVP_REASON_UNREACHABLE;
		break;
	case -ESTALE:
		r = KVP_REASON_LEASE;
		break;
	default:
		return;
	}
	kvp__why(w, err, r, "%s: %s", kvp_reason_str(r), kvp_strerror(err));
}

/* "kvpull 0.2" from a kvp_version() value, "kvpull before 0.2" for 0 (an
 * agent whose handshake carries no library version). */
static void lib_str(char *b, size_t n, uint32_t lib)
{
	if (lib)
		snprintf(b, n, "kvpull %u.%u", lib >> 16, (lib >> 8) & 0xff);
	else
		snprintf(b, n, "kvpull before 0.2");
}

int kvp__why_version(struct kvp_why *w, const char *who, uint32_t rank,
		     uint32_t version, uint32_t lib)
{
	char theirs[24], ours[24];

	lib_str(theirs, sizeof(theirs), lib);
	lib_str(ours, sizeof(ours), kvp_version());
	return kvp__why(w, -EPROTONOSUPPORT, KVP_REASON_VERSION,
			"%s rank %u speaks handshake version %u (%s), we %u (%s)",
			who, rank, version, theirs, KVP_HELLO_VERSION, ours);
}

int kvp__call_err(struct kvp_why *w, int err)
{
	uint32_t r;

	if (err >= 0 || w->reason)
		return err;
	switch (err) {
	case -EINVAL:
		r = KVP_REASON_ARGS;
		break;
	case -ENOENT:
		r = KVP_REASON_NO_ENGINE;
		break;
	case -EALREADY:
		r = KVP_REASON_IN_FLIGHT;
		break;
	case -ERANGE:
		r = KVP_REASON_IDS_RANGE;
		break;
	case -EBUSY:
		r = KVP_REASON_BUSY;
		break;
	case -EAGAIN:
	case -ENOTCONN:
		r = KVP_REASON_NOT_UP;
		break;
	case -ENOSPC: /* our own limits, in a call: not the peer's */
	case -ENOMEM:
		r = KVP_REASON_BUSY;
		break;
	case -ENXIO:
	case -EISCONN:
		r = KVP_REASON_ARGS;
		break;
	default:
		kvp__why_errno(w, err);
		return err;
	}
	return kvp__why(w, err, r, "%s", kvp_reason_str(r));
}

uint32_t kvp_agent_last_error(const kvp_agent *a, char *buf, size_t len)
{
	if (!a)
		return KVP_REASON_NONE;
	if (buf && len)
		snprintf(buf, len, "%s",
			 !a->last.reason ? "" :
			 a->last.line	 ? a->last.line :
					   a->last.msg);
	return a->last.reason;
}
