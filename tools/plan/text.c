// SPDX-License-Identifier: MIT
/* kvpull-plan: the summary (docs/tools.md, "The summary"). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>

#include "dump.h"

/* Prints ids, runs of consecutive ids as a-b. */
static void print_ids(const uint32_t *id, uint32_t n)
{
	uint32_t i = 0, j;

	if (!n)
		printf("none");
	while (i < n) {
		for (j = i; j + 1 < n && id[j + 1] == id[j] + 1; j++)
			;
		printf("%s%u", i ? "," : "", id[i]);
		if (j > i)
			printf("-%u", id[j]);
		i = j + 1;
	}
}

static void text_side(const struct side *s)
{
	struct kvp_layout_info li;
	uint64_t total = 0, size;
	uint32_t i, g;
	char h[32];

	kvp_layout_get_info(s->l, &li);
	printf("%-7s", s->what);
	if (s->spec) {
		printf("spec %s\n", s->spec);
	} else {
		const struct kvp_model *m = &s->m;

		printf("%s: layers %u", m->name, m->layers);
		if (m->mla_latent)
			printf(", MLA latent %u", m->mla_latent);
		else
			printf(", kv_heads %u, head_dim %u", m->kv_heads,
			       m->head_dim);
		printf(", dtype_bytes %u", m->dtype_bytes);
		if (m->sliding_layers)
			printf(", sliding_layers %u", m->sliding_layers);
		printf("\n");
		if (m->state_layers)
			printf("       state: %s x %u layers, conv_kernel %u, ssm heads %u x head_dim %u x state %u, groups %u, state dtype_bytes %u\n",
			       TOOL_NAME(tool_state_names, m->state_kind),
			       m->state_layers, m->conv_kernel, m->ssm_heads,
			       m->ssm_head_dim, m->ssm_state, m->ssm_groups,
			       m->state_dtype_bytes ? m->state_dtype_bytes :
						      m->dtype_bytes);
	}
	printf("       TP %u rank %u, engine id %" PRIu64, li.tp_size,
	       li.tp_rank, li.engine_id);
	if (!s->spec) {
		printf(", block %u tokens (kernel %u), %s", s->e.block_tokens,
		       s->e.kernel_block_tokens ? s->e.kernel_block_tokens :
						  s->e.block_tokens,
		       TOOL_NAME(tool_layout_names, s->e.kv_layout));
		if (s->m.state_layers)
			printf(", conv %s",
			       TOOL_NAME(tool_conv_names, s->e.conv_layout));
		printf(", %u blocks", s->e.num_blocks);
	}
	printf("\n");
	for (i = 0; i < li.nregions; i++) {
		checked(kvp_layout_get_region(s->l, i, &size), "region", i);
		total += size;
	}
	printf("       %u group%s, %u regions (%s), %u views, %u fields\n",
	       li.ngroups, PLURAL(li.ngroups), li.nregions,
	       human(total, h, sizeof(h)), li.nviews, li.nfields);
	for (g = 0; g < li.ngroups; g++) {
		struct kvp_group_desc gd;
		uint32_t nv = 0, lo = UINT32_MAX, hi = 0;

		checked(kvp_layout_get_group(s->l, g, &gd), "group", g);
		for (i = 0; i < li.nviews; i++) {
			struct kvp_view_desc v;

			checked(kvp_layout_get_view(s->l, i, &v), "view", i);
			if (v.group != g)
				continue;
			nv++;
			lo = v.layer < lo ? v.layer : lo;
			hi = v.layer > hi ? v.layer : hi;
		}
		printf("       group %u: %s", g,
		       TOOL_NAME(tool_group_names, gd.kind));
		if (gd.kind != KVP_GROUP_STATE)
			printf(", %u tokens per block", gd.block_tokens);
		printf(", %u views", nv);
		if (nv)
			printf(", layers %u..%u", lo, hi);
		printf("\n");
	}
}

static void print_ranks(const int *r, uint32_t n)
{
	uint32_t i;

	for (i = 0; i < n; i++)
		printf(" %d", r[i]);
	if (!n)
		printf(" none");
	printf("\n");
}

static void text_streams(const struct dump *d, uint32_t g)
{
	const struct opts *o = d->o;
	uint64_t *per_src = xcalloc(d->info.nsrc, sizeof(uint64_t));
	uint32_t *nstreams = xcalloc(d->info.nsrc, sizeof(uint32_t));
	uint64_t total = 0;
	uint32_t i, k;
	char h[32];

	if (!o->brief)
		printf("  streams:\n"
		       "    %4s %5s %-24s %12s %12s %7s %13s  %s\n",
		       "src", "layer", "fields", "local v/r", "remote v/r",
		       "pieces", "bytes/period", "piece lengths");
	for (i = 0; i < d->info.nstreams; i++) {
		struct kvp_plan_stream st;
		uint32_t lmin = UINT32_MAX, lmax = 0;
		char lv[32], rv[32], kinds[64];

		checked(kvp_plan_get_stream(d->plan, i, &st), "stream", i);
		if (st.group != g)
			continue;
		per_src[st.src] += st.bytes_per_period;
		nstreams[st.src]++;
		total += st.bytes_per_period;
		if (o->brief)
			continue;
		for (k = 0; k < st.npieces; k++) {
			struct kvp_plan_piece pc;
			uint32_t pi = st.piece_first + k;

			checked(kvp_plan_get_piece(d->plan, pi, &pc), "piece",
				pi);
			lmin = pc.len < lmin ? pc.len : lmin;
			lmax = pc.len > lmax ? pc.len : lmax;
		}
		snprintf(lv, sizeof(lv), "%u/%u", st.local_view,
			 st.local_region);
		snprintf(rv, sizeof(rv), "%u/%u", st.remote_view,
			 st.remote_region);
		/* the kinds this stream carries: in both views */
		kinds_name(d->lkinds[st.local_view] &
				   d->rkinds[st.remote_view],
			   kinds, sizeof(kinds));
		printf("    %4d %5u %-24s %12s %12s %7u %13" PRIu64 "  ",
		       d->src_rank[st.src],
		       view_layer(o->loc.l, st.local_view), kinds, lv, rv,
		       st.npieces, st.bytes_per_period);
		if (lmin == lmax)
			printf("%u\n", lmin);
		else
			printf("%u..%u\n", lmin, lmax);
	}
	printf("  bytes per local block, by source rank:\n");
	for (i = 0; i < d->info.nsrc; i++) {
		if (!nstreams[i])
			continue;
		printf("    rank %d: %u streams, %" PRIu64
		       " bytes per period, %" PRIu64 " per local block (%s)\n",
		       d->src_rank[i], nstreams[i], per_src[i],
		       per_src[i] / d->pg[g].local_per_period,
		       human(per_src[i] / d->pg[g].local_per_period, h,
			     sizeof(h)));
	}
	printf("    total: %" PRIu64 " bytes per local block (%s)\n",
	       total / d->pg[g].local_per_period,
	       human(total / d->pg[g].local_per_period, h, sizeof(h)));
	free(per_src);
	free(nstreams);
}

static void text_request(const struct dump *d)
{
	const struct request *rq = &d->rq;
	uint32_t g, i, k;
	char h[32];

	printf("\nrequest:\n");
	for (g = 0; g < d->info.ngroups; g++) {
		const struct kvp_ids *id = &rq->ids[g];

		printf("  group %u: local ids ", g);
		print_ids(id->local, id->nlocal);
		printf(" (%u), remote ids ", id->nlocal);
		print_ids(id->remote, id->nremote);
		printf(" (%u)", id->nremote);
		if (d->pg[g].kind != KVP_GROUP_STATE)
			printf(", %" PRIu64 " tokens, %u leading local block%s not read",
			       rq->need[g].tokens, rq->need[g].skip,
			       rq->need[g].skip == 1 ? "" : "s");
		printf("\n    %" PRIu64 " READs (one descriptor per block per region: %" PRIu64
		       "), %" PRIu64 " bytes\n",
		       rq->wrs_group[g], rq->naive_group[g],
		       rq->bytes_group[g]);
	}
	if (!d->o->brief) {
		printf("  READs: src = producer rank; rN+off = remote region N; local SGEs lN+off/len\n");
		for (i = 0; i < rq->nwr; i++) {
			const struct kvp_wr *w = &rq->wr[i];

			printf("    %5u  g%u src %d  r%u+0x%" PRIx64 "  %u  ",
			       i, w->group, d->src_rank[w->src], w->region,
			       w->offset, w->len);
			for (k = 0; k < w->nsge; k++) {
				const struct kvp_sge *s =
					&rq->sge[w->sge_first + k];

				printf("%sl%u+0x%" PRIx64 "/%u", k ? " " : "",
				       s->region, s->offset, s->len);
			}
			printf("\n");
		}
	}
	printf("  total: %u READs (one descriptor per block per region: %" PRIu64
	       "), %" PRIu64 " bytes (%s)\n",
	       rq->nwr, rq->naive, rq->bytes, human(rq->bytes, h, sizeof(h)));
	if (rq->ranged) {
		printf("  range: layers [%u, %u), tokens (%" PRIu64 ", ",
		       rq->range.layer0, rq->range.layer1, rq->range.tok0);
		if (rq->range.tok1 == KVP_TOKENS_END)
			printf("end]");
		else
			printf("%" PRIu64 "]", rq->range.tok1);
		printf(": the READs and bytes above are this part's (one descriptor per block per region: the whole request's)\n");
	}
}

void print_text(const struct dump *d)
{
	const struct kvp_plan_info *in = &d->info;
	uint32_t g, s;
	char h[32], title[768];

	plan_title(d, 1, title, sizeof(title));
	printf(PROG ": %s\n\n", title);
	text_side(&d->o->loc);
	text_side(&d->o->rem);
	printf("\nplan: consumer rank %u of TP %u pulling from TP %u, max_sge %u\n",
	       in->local_rank, in->local_tp, in->remote_tp, in->max_sge);
	printf("  %u group%s, %u source%s, %u notified, %u streams, %u piece templates\n",
	       in->ngroups, PLURAL(in->ngroups), in->nsrc, PLURAL(in->nsrc),
	       in->nnotify, in->nstreams, in->npieces);
	printf("  plan size %" PRIu64 " bytes (%s)", in->bytes,
	       human(in->bytes, h, sizeof(h)));
	if (d->o->timing)
		printf(", compiled in %.1f us", d->compile_us);
	printf("\n  source ranks (read from):");
	print_ranks(d->src_rank, in->nsrc);
	printf("  notify ranks:");
	print_ranks(d->notify_rank, in->nnotify);
	printf("  notifications each producer rank expects per request:");
	for (s = 0; s < d->remote_tp; s++)
		printf(" %u:%d", s, d->expected[s]);
	printf("\n");
	for (g = 0; g < in->ngroups; g++) {
		const struct kvp_plan_group *p = &d->pg[g];

		printf("\ngroup %u: %s\n", g,
		       TOOL_NAME(tool_group_names, p->kind));
		if (p->kind == KVP_GROUP_STATE)
			printf("  whole states, one local block from one remote block\n");
		else
			printf("  blocks: local %u tokens, remote %u tokens; period %u tokens = %u local : %u remote\n",
			       p->local_tokens, p->remote_tokens,
			       p->period_tokens, p->local_per_period,
			       p->remote_per_period);
		printf("  ids: local < %u, remote < %u\n", p->local_blocks,
		       p->remote_blocks);
		printf("  source ranks:");
		for (s = 0; s < in->nsrc; s++)
			if (serves(d, g, s))
				printf(" %d", d->src_rank[s]);
		printf("\n");
		text_streams(d, g);
	}
	if (d->have_request)
		text_request(d);
}
