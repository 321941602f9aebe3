// SPDX-License-Identifier: MIT
#include <errno.h>

#include "internal.h"

uint32_t kvp_version(void)
{
	return (KVP_VERSION_MAJOR << 16) | (KVP_VERSION_MINOR << 8) |
	       KVP_VERSION_PATCH;
}

static const char *const reasons[KVP_REASON_COUNT] = {
	[KVP_REASON_NONE] = "no reason recorded",
	[KVP_REASON_MALFORMED] = "malformed peer data",
	[KVP_REASON_TP_SIZE] = "TP size differs from the ranks given",
	[KVP_REASON_RANK] = "blob of another rank (swapped or misaddressed)",
	[KVP_REASON_ENGINE_ID] = "blob of another engine",
	[KVP_REASON_MODEL] = "another model (compatibility hashes differ)",
	[KVP_REASON_LAYOUT] = "layouts cannot be matched",
	[KVP_REASON_PLAN_COST] = "plan too costly to compile",
	[KVP_REASON_CARRIED] = "carried blob differs from the rank's own",
	[KVP_REASON_AUTH] = "shared secrets differ or one side has none",
	[KVP_REASON_PEER_FULL] = "peer at its limits",
	[KVP_REASON_MR_WINDOW] = "producer MR window below the plan's READ length",
	[KVP_REASON_UNREACHABLE] = "peer unreachable",
	[KVP_REASON_TIMEOUT] = "timed out (handshake bound, or deadline)",
	[KVP_REASON_PEER_REFUSED] = "refused by the producer",
	[KVP_REASON_TRANSPORT] = "transport error",
	[KVP_REASON_STALL] = "stalled: no progress within stall_ms",
	[KVP_REASON_CLOSED] = "peer closed cleanly",
	[KVP_REASON_REMOVED] = "engine removed",
	[KVP_REASON_DEVICE] = "device or port failure",
	[KVP_REASON_ARGS] = "invalid arguments",
	[KVP_REASON_IDS_UNEVEN] = "more local ids than remote ids",
	[KVP_REASON_IDS_MAX] = "id list longer than max_ids",
	[KVP_REASON_IDS_TOKENS] = "tokens past the blocks given",
	[KVP_REASON_IDS_RANGE] = "block id out of range",
	[KVP_REASON_NO_ENGINE] = "no engine with that handle",
	[KVP_REASON_IN_FLIGHT] = "request already being pulled",
	[KVP_REASON_BUSY] = "request slots or queues full",
	[KVP_REASON_NOT_UP] = "engine not up",
	[KVP_REASON_OTHER_ENGINE] = "notified by another consumer engine only",
	[KVP_REASON_EVICTED] = "closed to make room within max_qps",
	[KVP_REASON_LEASE] = "the producer did not hold the request when read",
	[KVP_REASON_VERSION] = "peer speaks another handshake version",
};

const char *kvp_reason_str(uint32_t r)
{
	return r < KVP_REASON_COUNT ? reasons[r] : "unknown reason";
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
	case -EPROTONOSUPPORT:
		return "peer speaks another handshake version";
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
	case -ESTALE:
		return "stale: the producer did not hold the request when it was read";
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
	case -EFBIG:
		return "plan too costly to compile (over KVP_PLAN_MAX_WORK)";
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
