// SPDX-License-Identifier: MIT
#include <string.h>

#include "names.h"

const char *const tool_group_names[KVP_GROUP_KIND_COUNT] = {
	"full",
	"sliding",
	"mla",
	"state",
};

const char *const tool_field_names[KVP_FIELD_KIND_COUNT] = {
	"k",	  "v",	 "latent", "conv_x", "conv_b",
	"conv_c", "ssm", "conv_q", "conv_k", "conv_v",
};

const char *const tool_axis_names[KVP_AXIS_COUNT] = {
	"token", "head", "dim", "channel", "state", "aux",
};

const char *const tool_layout_names[KVP_KV_LAYOUT_COUNT] = {
	"flash_nhd",
	"flash_hnd",
	"flashinfer",
	"packed",
};

const char *const tool_conv_names[KVP_CONV_LAYOUT_COUNT] = { "ds", "sd" };

const char *const tool_state_names[KVP_STATE_KIND_COUNT] = {
	"none",
	"mamba2",
	"gdn",
};

const char *tool_name_of(const char *const *names, uint32_t n, uint32_t i)
{
	return i < n ? names[i] : "?";
}

int tool_name_index(const char *const *names, uint32_t n, const char *s)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		if (!strcmp(s, names[i]))
			return (int)i;
	return -1;
}
