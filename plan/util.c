// SPDX-License-Identifier: MIT
#include <errno.h>

#include "internal.h"

uint32_t kvp_version(void)
{
	return (KVP_VERSION_MAJOR << 16) | (KVP_VERSION_MINOR << 8) |
	       KVP_VERSION_PATCH;
}

/* Every code a kvp_ call returns has its own message here (never "unknown
 * error"): tests/check_strerror.sh fails the unit tests when plan/, verbs/
 * or the header use a code this switch does not name. */
const char *kvp_strerror(int err)
{
	switch (err) {
	case 0:
		return "success";
	case -EINVAL:
		return "invalid argument";
	case -ENOMEM:
		return "out of memory";
	case -EMSGSIZE:
		return "message too long or truncated";
	case -EPROTO:
		return "malformed or incompatible peer data";
	case -ERANGE:
		return "block id out of range";
	case -ENOSPC:
		return "no space (output arrays too small, or no free engine or connection slot)";
	case -ENOENT:
		return "no such preset, device or entry";
	case -ETIMEDOUT:
		return "timed out";
	case -EAGAIN:
		return "resource temporarily unavailable; try again";
	case -ENODEV:
		return "no RDMA device";
	case -ECONNREFUSED:
		return "connection refused";
	case -ECONNRESET:
		return "connection reset by peer";
	case -ENOTCONN:
		return "not connected";
	case -EALREADY:
		return "already in progress";
	case -EEXIST:
		return "already exists";
	case -EIO:
		return "I/O error (work completion failed)";
	case -EBUSY:
		return "busy";
	case -EACCES:
		return "access refused (remote access or protection error)";
	case -EISCONN:
		return "already connected";
	case -ENXIO:
		return "memory regions not registered";
	case -EADDRINUSE:
		return "address already in use";
	case -EHOSTUNREACH:
		return "host unreachable";
	case -ENETUNREACH:
		return "network unreachable (no route through this device)";
	case -EADDRNOTAVAIL:
		return "address not available (cannot resolve it on this device)";
	case -ECONNABORTED:
		return "connection aborted (connect error)";
	case -EFAULT:
		return "bad address (memory registration failed)";
	case -EPERM:
		return "authentication failed: wrong or missing shared secret";
	case -ENOTSUP:
		return "operation not supported";
	case -EOVERFLOW:
		return "value too large (count or size overflow)";
	case -EUSERS:
		return "too many connections from this peer or source";
	case -ENETDOWN:
		return "network down (the device's port failed)";
	case -ECANCELED:
		return "canceled (its engine was removed)";
	case -E2BIG:
		return "argument list too long (too many ids, ranks or regions)";
	default:
		return "unknown error";
	}
}
