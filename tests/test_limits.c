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
	/* 64 QPs of 512 do not fit 8192 CQEs: the queues shrink until
	 * they do, rather than the CQ being clamped and overrun. */
	d.max_cqe = 8192;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.cqe <= 8192);
	assert_int_equal(l.sq_depth, 64);
	assert_int_equal(l.cqe, 16 + 64 * (64 + 5));
	/* A producer: the notification buffers shrink. */
	w = producer_want();
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.cqe <= 8192);
	assert_int_equal(l.rq_depth, 64);
	/* Both sides share the CQ. */
	w.ncons = 64;
	w.sq_depth = 512;
	w.max_sge = 4;
	w.consumer = 1;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), 0);
	assert_true(l.cqe <= 8192);
	/* Too small for the slots at all: refused, not overrun. */
	d.max_cqe = 256;
	assert_int_equal(kvp__limits(&d, NULL, 0, &w, &l), -ENODEV);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_connectx),
		cmocka_unit_test(test_iwarp_one_read_sge),
		cmocka_unit_test(test_soft_roce),
		cmocka_unit_test(test_cq_bounds_queues),
		cmocka_unit_test(test_unusable),
		cmocka_unit_test(test_sq_usable),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
