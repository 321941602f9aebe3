// SPDX-License-Identifier: MIT
/*
 * Device and port limits (verbs/limits.c, compiled in here: it calls no
 * verbs function) against faked attributes of real devices: what an agent
 * asks for is cut to what each device reports, and nothing the device
 * cannot do is ever asked of it.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "../verbs/limits.c"

/* Device attributes as their providers report them (the fields kvpull
 * reads; values from ibv_devinfo -v of each device, rounded where they
 * vary by firmware). */
static struct ibv_device_attr connectx6(void)
{
	struct ibv_device_attr d;

	memset(&d, 0, sizeof(d));
	d.max_qp_wr = 32768;
	d.max_sge = 30;
	d.max_sge_rd = 30;
	d.max_cqe = 4194303;
	d.max_qp_rd_atom = 16;
	d.max_qp_init_rd_atom = 16;
	return d;
}

static struct ibv_device_attr cxgb4(void)
{
	struct ibv_device_attr d = connectx6();

	d.max_qp_wr = 16384;
	d.max_sge = 4;
	d.max_sge_rd = 1;
	d.max_cqe = 32768;
	d.max_qp_rd_atom = 8;
	d.max_qp_init_rd_atom = 8;
	return d;
}

static struct ibv_device_attr rxe(void)
{
	struct ibv_device_attr d = connectx6();

	d.max_qp_wr = 16384;
	d.max_sge = 32;
	d.max_sge_rd = 32;
	d.max_cqe = 32767;
	d.max_qp_rd_atom = 128;
	d.max_qp_init_rd_atom = 128;
	return d;
}

static struct kvp_want consumer_want(void)
{
	struct kvp_want w;

	memset(&w, 0, sizeof(w));
	w.ncons = 64;
	w.sq_depth = 512;
	w.max_sge = 4;
	w.consumer = 1;
	return w;
}

static struct kvp_want producer_want(void)
{
	struct kvp_want w;

	memset(&w, 0, sizeof(w));
	w.nprod = 64;
	w.rq_depth = 128;
	w.prod_sq = 5;
	w.producer = 1;
	return w;
}

static void test_connectx(void **st)
{
	struct ibv_device_attr d = connectx6();
	struct ibv_port_attr p;
	struct kvp_want w = consumer_want();
	struct kvp_limits l;

	(void)st;
	memset(&p, 0, sizeof(p));
	p.max_msg_sz = 1u << 30;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.sq_depth, 512);
	assert_int_equal(l.max_sge, 4);
	/* A READ never exceeds the port's message size (the emitter would
	 * otherwise coalesce up to 2^31). */
	assert_int_equal(l.max_len, 1u << 30);
	assert_int_equal(l.rd_atom, 16);
	assert_int_equal(l.cqe, 16 + 64 * (512 + 5));
	assert_int_equal(l.sink_access,
			 IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING);
	/* A slice asked for: 1 MiB READs. */
	w.max_read = 1u << 20;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_len, 1u << 20);
	/* More SGEs than the device has: its count. */
	w.max_sge = 64;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_sge, 30);
}

static void test_iwarp_one_read_sge(void **st)
{
	struct ibv_device_attr d = cxgb4();
	struct kvp_want w = consumer_want();
	struct kvp_limits l;

	(void)st;
	/* cxgb4: 4 SGEs for sends, 1 for READs; the first multi-SGE READ
	 * would kill the connection. No port attributes: 2^31. */
	assert_int_equal(kvp__limits(&d, NULL, 1, &w, &l), 0);
	assert_int_equal(l.max_sge, 1);
	assert_int_equal(l.max_len, 1u << 31);
	/* iWARP lands a READ's response as an RDMA WRITE: the sink needs
	 * remote write there, and only there. */
	assert_int_equal(l.sink_access, IBV_ACCESS_LOCAL_WRITE |
						IBV_ACCESS_REMOTE_WRITE |
						IBV_ACCESS_RELAXED_ORDERING);
	assert_int_equal(l.src_access,
			 IBV_ACCESS_REMOTE_READ | IBV_ACCESS_RELAXED_ORDERING);
	/* hns-like: max_sge_rd 0 means "not reported": max_sge counts. */
	d.max_sge_rd = 0;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.max_sge, 4);
}

static void test_soft_roce(void **st)
{
	struct ibv_device_attr d = rxe();
	struct ibv_port_attr p;
	struct kvp_want w = consumer_want();
	struct kvp_limits l;

	(void)st;
	memset(&p, 0, sizeof(p));
	p.max_msg_sz = 0x800000; /* rxe: 8 MiB */
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_len, 0x800000);
	assert_int_equal(l.rd_atom, 128);
	/* Initiator depth goes through a u8 in rdma_cm. */
	d.max_qp_init_rd_atom = 1000;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.rd_atom, 255);
}

static void test_cq_bounds_queues(void **st)
{
	struct ibv_device_attr d = connectx6();
	struct kvp_want w = consumer_want();
	struct kvp_limits l;

	(void)st;
	/* 64 QPs of 512 do not fit one CQ of 8192 CQEs, and the device
	 * allows one CQ: the queues shrink until they do, rather than the
	 * CQ being clamped and overrun. */
	d.max_cqe = 8192;
	d.max_cq = 1;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.ncq_cons, 1);
	assert_true(l.cqe <= 8192);
	assert_int_equal(l.sq_depth, 64);
	assert_int_equal(l.cqe, 16 + 64 * (64 + 5));
	/* A producer: the notification buffers shrink. */
	w = producer_want();
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.cqe <= 8192);
	assert_int_equal(l.rq_depth, 64);
	/* Both sides: a CQ each, at least. */
	d.max_cq = 2;
	w.ncons = 64;
	w.sq_depth = 512;
	w.max_sge = 4;
	w.consumer = 1;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.cqe <= 2 * 8192);
	assert_int_equal(l.ncq_prod + l.ncq_cons, 2);
	/* One CQ for two sides: refused, not shared and overrun. */
	d.max_cq = 1;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
	/* Too small for the slots at all: refused, not overrun. */
	d.max_cq = 2;
	d.max_cqe = 256;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
}

/* Fleet defaults on soft-RoCE (max_cqe 32767): 2,048 producer QPs with
 * 128 notification buffers each, 128 consumer QPs of 512 send entries.
 * Several CQs, each within max_cqe, and no queue shrinks; the slots'
 * runs cover every QP. */
static void test_cq_split(void **st)
{
	struct ibv_device_attr d = rxe();
	struct kvp_want w = producer_want();
	struct kvp_limits l;
	uint32_t prod = 5 + 128 + 2, cons = 512 + 5;

	(void)st;
	w.nprod = 2048;
	w.ncons = 128;
	w.sq_depth = 512;
	w.max_sge = 16;
	w.consumer = 1;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.rq_depth, 128);
	assert_int_equal(l.sq_depth, 512);
	assert_int_equal(l.prod_cqe, prod);
	assert_int_equal(l.cons_cqe, cons);
	assert_int_equal(l.prod_per_cq, (32767 - 16) / prod); /* 242 */
	assert_int_equal(l.ncq_prod, (2048 + 241) / 242);    /* 9 */
	assert_int_equal(l.cons_per_cq, (32767 - 16) / cons); /* 63 */
	assert_int_equal(l.ncq_cons, 3);
	assert_true(16 + (uint64_t)l.prod_per_cq * prod <= 32767);
	assert_true(16 + (uint64_t)l.cons_per_cq * cons <= 32767);
	assert_int_equal(l.cqe, 16 * 12 + 2048 * prod + 128 * cons);
	/* ConnectX: one CQ a side. */
	d = connectx6();
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.ncq_prod, 1);
	assert_int_equal(l.ncq_cons, 1);
	assert_int_equal(l.prod_per_cq, 2048);
	/* More CQs than KVP_MAX_CQS would take: the queues shrink to fit
	 * that many (65,535 producer QPs: 64 CQs of at most 32767). */
	d = rxe();
	w.nprod = 65535;
	w.ncons = 0;
	w.consumer = 0;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.ncq_prod <= KVP_MAX_CQS);
	assert_true(l.rq_depth < 128);
	assert_true(16 + (uint64_t)l.prod_per_cq * l.prod_cqe <= 32767);
	assert_true((uint64_t)l.prod_per_cq * l.ncq_prod >= 65535);
	/* The device's max_cq is obeyed too. */
	w.nprod = 2048;
	d.max_cq = 4;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.ncq_prod <= 4);
	assert_true(l.rq_depth < 128);
	assert_true((uint64_t)l.prod_per_cq * l.ncq_prod >= 2048);
}

/* A producer with a shared receive queue: its QPs need completions for
 * their sends alone, and each producer CQ room for every buffer of the
 * queue (a consumer past its credit may fill it through one QP). */
static void test_cq_srq(void **st)
{
	struct ibv_device_attr d = rxe();
	struct kvp_want w = producer_want();
	struct kvp_limits l;
	const uint32_t bufs = 2560, prod = 14 + 2;

	(void)st;
	w.nprod = 2048;
	w.prod_sq = 14;
	w.srq_bufs = bufs;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.rq_depth, 128); /* the most one QP may hold */
	assert_int_equal(l.prod_cqe, prod);
	assert_int_equal(l.prod_cq_extra, bufs);
	assert_int_equal(l.prod_per_cq, (32767 - 16 - bufs) / prod); /* 1886 */
	assert_int_equal(l.ncq_prod, 2);
	assert_true(16 + bufs + (uint64_t)l.prod_per_cq * prod <= 32767);
	assert_int_equal(l.cqe, 2 * (16 + bufs) + 2048 * prod);
	/* Without it, the same producer's QPs each hold 128 buffers. */
	w.srq_bufs = 0;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.prod_cqe, 14 + 128 + 2);
	assert_int_equal(l.prod_cq_extra, 0);
	assert_int_equal(l.ncq_prod, 10);
}

static void test_unusable(void **st)
{
	struct ibv_device_attr d = connectx6();
	struct kvp_want w = consumer_want();
	struct kvp_limits l;

	(void)st;
	d.max_qp_init_rd_atom = 0; /* cannot READ */
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
	d = connectx6();
	w = producer_want();
	d.max_qp_rd_atom = 0; /* cannot be read from */
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
	d = connectx6();
	d.max_sge = 0;
	w = consumer_want();
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
	d = connectx6();
	d.max_qp_wr = 3;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
	/* Queue depths beyond the device: its own. */
	d = connectx6();
	d.max_qp_wr = 100;
	w.sq_depth = 512;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.sq_depth, 100);
	w = producer_want();
	w.rq_depth = 4096;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_int_equal(l.rq_depth, 98);
}

static void test_sq_usable(void **st)
{
	struct ibv_qp_cap got;

	(void)st;
	memset(&got, 0, sizeof(got));
	/* mlx5 may return fewer WRs than asked when it counts WQE blocks,
	 * or more: the posting path uses what is really there, never more
	 * than it asked. */
	got.max_send_wr = 256;
	assert_int_equal(kvp__sq_usable(512, &got), 256);
	got.max_send_wr = 1024;
	assert_int_equal(kvp__sq_usable(512, &got), 512);
	got.max_send_wr = 0;
	assert_int_equal(kvp__sq_usable(512, &got), 512);
}

/* A provider's QP creation, modelled: mlx5 sizes every send WQE for the
 * larger of max_send_sge data segments and max_inline_data (after 32
 * bytes of control and remote address segments, in 64-byte blocks) and
 * refuses a queue of more blocks than the device has; `inline_max` 0: a
 * provider that refuses any inline data. Each attempt is recorded. */
struct fake_qp {
	uint32_t blocks, inline_max, nsge_max;
	uint32_t n;
	struct ibv_qp_cap tried[64];
};

static uint64_t pow2_up(uint64_t v)
{
	uint64_t p = 1;

	while (p < v)
		p <<= 1;
	return p;
}

static int fake_create(void *arg, struct ibv_qp_init_attr *qa)
{
	struct fake_qp *f = arg;
	uint32_t data = 16 * qa->cap.max_send_sge,
		 in = qa->cap.max_inline_data ? 4 + qa->cap.max_inline_data : 0;
	uint64_t wqe = (32 + (data > in ? data : in) + 63) / 64 * 64;

	assert_true(f->n < 64);
	f->tried[f->n++] = qa->cap;
	/* A refused attempt may leave anything in the caps. */
	if (qa->cap.max_send_sge > f->nsge_max ||
	    qa->cap.max_inline_data > f->inline_max ||
	    pow2_up(qa->cap.max_send_wr * wqe) / 64 > f->blocks) {
		memset(&qa->cap, 0xff, sizeof(qa->cap));
		return -EINVAL;
	}
	/* What mlx5 reports: the WRs the blocks hold. */
	qa->cap.max_send_wr = (uint32_t)(pow2_up(qa->cap.max_send_wr * wqe) /
					 wqe);
	return 0;
}

static struct ibv_qp_init_attr qp_want(uint32_t wr, uint32_t sge,
				       uint32_t in)
{
	struct ibv_qp_init_attr qa;

	memset(&qa, 0, sizeof(qa));
	qa.cap.max_send_wr = wr;
	qa.cap.max_recv_wr = 3;
	qa.cap.max_send_sge = sge;
	qa.cap.max_recv_sge = 1;
	qa.cap.max_inline_data = in;
	return qa;
}

static void test_qp_fit(void **st)
{
	struct fake_qp f = { .blocks = 32768, .inline_max = 512,
			     .nsge_max = 30 };
	struct ibv_qp_init_attr qa = qp_want(512, 16, 64);
	uint32_t asked = 0, i;

	(void)st;
	/* ConnectX, the defaults: accepted at once. */
	assert_int_equal(kvp__create_qp_fit(fake_create, &f, &qa, &asked), 0);
	assert_int_equal(f.n, 1);
	assert_int_equal(asked, 512);
	assert_int_equal(kvp__sq_usable(asked, &qa.cap), 512);

	/* 8192 entries of 16 SGEs (320-byte WQEs: 65,536 blocks) do not
	 * fit; without inline they still do not; 4096 with inline do. */
	memset(&f.tried, 0, sizeof(f.tried));
	f.n = 0;
	qa = qp_want(8192, 16, 64);
	assert_int_equal(kvp__create_qp_fit(fake_create, &f, &qa, &asked), 0);
	assert_int_equal(f.n, 3);
	assert_int_equal(f.tried[0].max_send_wr, 8192);
	assert_int_equal(f.tried[0].max_inline_data, 64);
	assert_int_equal(f.tried[1].max_send_wr, 8192);
	assert_int_equal(f.tried[1].max_inline_data, 0);
	assert_int_equal(f.tried[2].max_send_wr, 4096);
	assert_int_equal(f.tried[2].max_inline_data, 64);
	for (i = 0; i < f.n; i++) {
		/* SGEs and receives never shrink. */
		assert_int_equal(f.tried[i].max_send_sge, 16);
		assert_int_equal(f.tried[i].max_recv_wr, 3);
		assert_int_equal(f.tried[i].max_recv_sge, 1);
	}
	assert_int_equal(asked, 4096);
	assert_int_equal(kvp__sq_usable(asked, &qa.cap), 4096);
	/* The same queue of 4 SGEs (128-byte WQEs) fits as asked. */
	f.n = 0;
	qa = qp_want(8192, 4, 64);
	assert_int_equal(kvp__create_qp_fit(fake_create, &f, &qa, &asked), 0);
	assert_int_equal(f.n, 1);
	assert_int_equal(asked, 8192);

	/* A provider without inline data: each size tried without it. */
	f = (struct fake_qp){ .blocks = 32768, .inline_max = 0,
			      .nsge_max = 30 };
	qa = qp_want(512, 16, 64);
	assert_int_equal(kvp__create_qp_fit(fake_create, &f, &qa, &asked), 0);
	assert_int_equal(f.n, 2);
	assert_int_equal(f.tried[1].max_inline_data, 0);
	assert_int_equal(asked, 512);

	/* A provider that refuses every size (more SGEs than it has): the
	 * last error, after both variants of each size down to 4 entries,
	 * and nothing smaller. */
	f = (struct fake_qp){ .blocks = 32768, .inline_max = 512,
			      .nsge_max = 8 };
	qa = qp_want(512, 16, 64);
	assert_int_equal(kvp__create_qp_fit(fake_create, &f, &qa, &asked),
			 -EINVAL);
	assert_int_equal(f.n, 2 * 8); /* 512, 256, ..., 4 */
	assert_int_equal(f.tried[f.n - 1].max_send_wr, 4);
	assert_int_equal(f.tried[f.n - 1].max_inline_data, 0);
	/* A request without inline data never asks for it. */
	f.n = 0;
	qa = qp_want(16, 16, 0);
	assert_int_equal(kvp__create_qp_fit(fake_create, &f, &qa, &asked),
			 -EINVAL);
	assert_int_equal(f.n, 3); /* 16, 8, 4 */
	for (i = 0; i < f.n; i++)
		assert_int_equal(f.tried[i].max_inline_data, 0);
}

/* Regions above the device's max_mr_size (2 GiB on some devices) are
 * registered as overlapping MRs: each within the cap, and any access of
 * at most the window inside the MR of the piece it starts in. */
static void check_split(uint64_t size, uint64_t max_mr)
{
	int s = kvp__mr_shift(size, max_mr);
	uint64_t n, k, w, o, end, len;

	assert_true(s >= KVP_MR_SHIFT_MIN && s <= KVP_MR_SHIFT_MAX);
	n = kvp__mr_count(size, (uint32_t)s);
	w = KVP_MR_WINDOW(s);
	assert_true(n >= 2 && n <= KVP_MR_MAX_KEYS);
	/* The stride is the largest that fits. */
	assert_true((1ull << s) + w <= max_mr);
	assert_true(s == KVP_MR_SHIFT_MAX ||
		    (2ull << s) + 2 * w > max_mr);
	for (k = 0; k < n; k++) {
		end = (k << s) + (1ull << s) + w;
		if (end > size)
			end = size;
		len = end - (k << s);
		assert_true(len > 0 && len <= max_mr);
	}
	/* Accesses at every seam, and at the region's start and end. */
	for (k = 0; k < n; k++) {
		uint64_t at[4] = { k << s, (k << s) + 1, ((k + 1) << s) - 1,
				   ((k + 1) << s) - w / 2 };

		for (o = 0; o < 4; o++) {
			if (at[o] >= size)
				continue;
			end = ((at[o] >> s) << s) + (1ull << s) + w;
			if (end > size)
				end = size;
			len = size - at[o] < w ? size - at[o] : w;
			assert_true(at[o] + len <= end);
		}
	}
}

static void test_mr_split(void **st)
{
	struct ibv_device_attr d = connectx6();
	struct ibv_port_attr p = { .max_msg_sz = 1u << 30 };
	struct kvp_want w = consumer_want();
	struct kvp_limits l;

	(void)st;
	/* The cap: the device's, a smaller one asked for, none reported. */
	d.max_mr_size = 1ull << 31;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_mr, 1ull << 31);
	w.max_mr = 1u << 20;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_mr, 1u << 20);
	w.max_mr = 1ull << 40;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_mr, 1ull << 31);
	d.max_mr_size = 0;
	w.max_mr = 0;
	assert_int_equal(kvp__limits(&d, &p, 0, &w, &l), 0);
	assert_int_equal(l.max_mr, UINT64_MAX);

	/* 80 GiB of GPU memory under a 2 GiB cap: 80 MRs of 1 GiB stride,
	 * 1.125 GiB each, READs up to 128 MiB. */
	assert_int_equal(kvp__mr_shift(80ull << 30, 1ull << 31), 30);
	assert_int_equal(kvp__mr_count(80ull << 30, 30), 80);
	assert_int_equal(KVP_MR_WINDOW(30), 128u << 20);
	/* What fits is one MR. */
	assert_int_equal(kvp__mr_shift(1ull << 31, 1ull << 31), 0);
	assert_int_equal(kvp__mr_shift(1, KVP_MR_MIN), 0);
	assert_int_equal(kvp__mr_shift((1ull << 31) + 1, 1ull << 31), 30);
	assert_int_equal(kvp__mr_count((1ull << 31) + 1, 30), 3);
	/* The smallest cap kvp_agent_attr.max_mr allows: 32 KiB stride,
	 * 4 KiB window. */
	assert_int_equal(kvp__mr_shift(1u << 20, KVP_MR_MIN), 15);
	assert_int_equal(kvp__mr_shift(1u << 20, 36864), 15);
	assert_int_equal(kvp__mr_shift(1u << 20, 36863), -EINVAL);
	/* More MRs than a blob may carry keys for. */
	assert_int_equal(kvp__mr_shift(1ull << 36, KVP_MR_MIN), -EINVAL);
	assert_int_equal(kvp__mr_shift(1ull << 35, KVP_MR_MIN), 15);

	check_split(80ull << 30, 1ull << 31);
	check_split((1ull << 31) + 1, 1ull << 31);
	check_split((5ull << 20) + 12345, KVP_MR_MIN);
	check_split(1ull << 40, 3ull << 30);
	check_split(UINT64_MAX / 2, UINT64_MAX / 4);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connectx),
		cmocka_unit_test(test_iwarp_one_read_sge),
		cmocka_unit_test(test_soft_roce),
		cmocka_unit_test(test_cq_bounds_queues),
		cmocka_unit_test(test_cq_split),
		cmocka_unit_test(test_cq_srq),
		cmocka_unit_test(test_unusable),
		cmocka_unit_test(test_sq_usable),
		cmocka_unit_test(test_qp_fit),
		cmocka_unit_test(test_mr_split),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
