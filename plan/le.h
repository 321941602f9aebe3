/* SPDX-License-Identifier: MIT */
/*
 * Little-endian fixed-width fields, byte by byte (any alignment, any host):
 * the metadata blob (plan/wire.c), the handshake's hello, control messages
 * and notifications (verbs/), and the tests and fuzz targets that build
 * them by hand. Header-only; never installed.
 */
#ifndef KVP_LE_H
#define KVP_LE_H

#include <stdint.h>

static inline void kvp__put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}

static inline void kvp__put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static inline void kvp__put64(uint8_t *p, uint64_t v)
{
	kvp__put32(p, (uint32_t)v);
	kvp__put32(p + 4, (uint32_t)(v >> 32));
}

static inline uint16_t kvp__get16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (uint16_t)p[1] << 8);
}

static inline uint32_t kvp__get32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 |
	       (uint32_t)p[3] << 24;
}

static inline uint64_t kvp__get64(const uint8_t *p)
{
	return kvp__get32(p) | (uint64_t)kvp__get32(p + 4) << 32;
}

#endif
