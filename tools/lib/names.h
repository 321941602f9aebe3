/* SPDX-License-Identifier: MIT */
/*
 * The names the tools print and parse for the public enums: lower case, as
 * spec files spell them (tools/README.md). kvpull.h has no name lookup, so
 * the tools keep these tables; plan/spec.c keeps its own for the parser.
 */
#ifndef KVP_TOOL_NAMES_H
#define KVP_TOOL_NAMES_H

#include <stdint.h>

#include "kvpull.h"

extern const char *const tool_group_names[KVP_GROUP_KIND_COUNT];
extern const char *const tool_field_names[KVP_FIELD_KIND_COUNT];
extern const char *const tool_axis_names[KVP_AXIS_COUNT];
extern const char *const tool_layout_names[KVP_KV_LAYOUT_COUNT];
extern const char *const tool_conv_names[KVP_CONV_LAYOUT_COUNT];
extern const char *const tool_state_names[KVP_STATE_KIND_COUNT];

#define TOOL_NELEM(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

/* names[i] of a table of n, or "?" when i is out of range. */
const char *tool_name_of(const char *const *names, uint32_t n, uint32_t i);
#define TOOL_NAME(table, i) tool_name_of(table, TOOL_NELEM(table), i)

/* The index of `s` in a table of n names (exact match), or -1. */
int tool_name_index(const char *const *names, uint32_t n, const char *s);
#define TOOL_NAME_INDEX(table, s) tool_name_index(table, TOOL_NELEM(table), s)

#endif
