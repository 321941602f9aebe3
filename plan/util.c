// SPDX-License-Identifier: MIT
#include <errno.h>

#include "internal.h"

uint32_t kvp_version(void)
{
	return (KVP_VERSION_MAJOR << 16) | (KVP_VERSION_MINOR << 8) |
	       KVP_VERSION_PATCH;
}

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
		return "output arrays too small";
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
	default:
		return "unknown error";
	}
}
