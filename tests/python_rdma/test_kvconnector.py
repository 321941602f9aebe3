# SPDX-License-Identifier: MIT
"""kvpull.connector over real agents (issue 36): a prefill worker and a
decode worker in this process, polled in turn, KV caches as torch tensors
in vLLM's FlashAttention HND shape (the layouts from the tensors):

 - a streamed request's life: expect at allocation, each layer published
   by save_kv_layer and awaited by wait_for_layer_load (its bytes there
   when it returns, the next layer's not yet published), DONE in
   get_finished's second set, RELEASED in the prefill's first;
 - load errors: a request the prefill never expected ends FAILED, its
   blocks in get_block_ids_with_load_errors;
 - cancel: both sides cancel a request after its first layer; the decode
   side stops awaiting it, the prefill stops publishing, the pull fails
   on its stall_ms, and each side reports it finished (its blocks as load
   errors on the decode side);
 - the default max_ids: a 128k-token prompt (8,192 blocks of 16 tokens)
   pulls with the agent's default attributes.
"""
import time

import numpy as np
import pytest

from conftest import ADDR

import kvpull
from kvpull.connector import (ConnectorConfig, KVPullScheduler, KVPullWorker,
                              Request, request_key)
from kvpull.vllm import HND_STRIDE_ORDER

torch = pytest.importorskip("torch")    # carried in when the host has it

PREFILL, DECODE = 0x4B50, 0x4B44
LAYERS, BS, HEADS, DIM = 3, 16, 2, 16


def caches(nb, fill=None, layers=LAYERS, heads=HEADS, dim=DIM):
    """Per layer (2, nb, BS, heads, dim) float32 over HND memory; ``fill``
    a seed for random contents (else zeros)."""
    g = torch.Generator().manual_seed(fill or 0)
    out = {}
    for i in range(layers):
        mem = torch.randn(2, nb, heads, BS, dim, generator=g) if fill \
            else torch.zeros(2, nb, heads, BS, dim)
        out["model.layers.%d.self_attn.attn" % i] = mem.permute(0, 1, 3, 2, 4)
    return out


def pump(workers, until, timeout=60):
    end = time.monotonic() + timeout
    while not until():
        if time.monotonic() > end:
            raise AssertionError("condition not met within %ss" % timeout)
        for w in workers:
            w.poll()
        time.sleep(0.001)


class Pair:
    """A prefill and a decode worker, each with its scheduler, the engine
    up."""

    def __init__(self, port, nb=32, dec_attrs=None, stream=True, **shape):
        pc = ConnectorConfig(PREFILL, "producer", addr=ADDR, port=port,
                             consumer_engine=DECODE,
                             stride_order=HND_STRIDE_ORDER,
                             agent=dict(max_peers=8))
        dc = ConnectorConfig(DECODE, "consumer", addr=ADDR, stream=stream,
                             stride_order=HND_STRIDE_ORDER, load_timeout=30,
                             agent=dict(max_peers=8, **(dec_attrs or {})))
        self.ps, self.pw = KVPullScheduler(pc), KVPullWorker(pc)
        self.ds, self.dw = KVPullScheduler(dc), KVPullWorker(dc)
        self.pkv, self.dkv = caches(nb, 36, **shape), caches(nb, **shape)
        self.pw.register_kv_caches(self.pkv)
        self.dw.register_kv_caches(self.dkv)
        self.ps.set_xfer_handshake_metadata(
            {0: self.pw.get_handshake_metadata()})
        self.dw.add_remote_engine(PREFILL, [(ADDR, port)])
        eng = self.dw._engines[PREFILL]
        pump([self.pw, self.dw], lambda: eng.up)

    def both(self):
        return [self.pw, self.dw]

    def prefill_alloc(self, rid, tokens, blocks):
        req = Request(rid, range(tokens), {"do_remote_decode": True})
        self.ps.update_state_after_alloc(req, [blocks], 0)

        class Out:
            num_scheduled_tokens = {rid: tokens}
        self.pw.bind_connector_metadata(self.ps.build_connector_meta(Out))
        self.pw.start_load_kv()
        return req

    def decode_load(self, rid, tokens, params, local):
        req = Request(rid, range(tokens), params)
        n, load_async = self.ds.get_num_new_matched_tokens(req, 0)
        assert (n, load_async) == (tokens, True)
        self.ds.update_state_after_alloc(req, [local], n)
        self.dw.bind_connector_metadata(self.ds.build_connector_meta())
        self.dw.start_load_kv()

    def same(self, layer, local, remote):
        name = "model.layers.%d.self_attn.attn" % layer
        a = self.dkv[name][:, local]
        b = self.pkv[name][:, remote]
        return a.numpy().tobytes() == b.numpy().tobytes()

    def finish_both(self, rid):
        """Poll until the prefill reports ``rid`` done sending and the
        decode side done receiving, each once."""
        got = [set(), set()]

        def finished():
            got[0].update(self.pw.get_finished()[0])
            got[1].update(self.dw.get_finished()[1])
            return got == [{rid}, {rid}]
        pump(self.both(), finished)

    def close(self):
        self.dw.shutdown()
        self.pw.shutdown()


def test_streamed_request_lifecycle(port):
    p = Pair(port)
    remote, local = [4, 9, 2], [30, 1, 17]
    p.prefill_alloc("r1", 48, remote)
    p.decode_load("r1", 48, p.ps.stream_params("r1"), local)
    for layer in range(LAYERS):
        assert not p.same(layer, local, remote)   # not published yet
        p.pw.save_kv_layer(layer)
        # the decode side's wait returns once the layer landed; the
        # prefill is polled meanwhile by this test (one process)
        pump(p.both(), lambda: p.dw._arrived.get("r1", LAYERS) > layer or
             "r1" not in p.dw._recv)
        # ARRIVED said so (the pull still runs but after the last layer)
        assert p.dw._arrived.get("r1") == layer + 1 or layer == LAYERS - 1
        p.dw.wait_for_layer_load(layer)
        assert p.same(layer, local, remote)
    p.pw.wait_for_save()
    delay, params = p.ps.request_finished(Request("r1", range(48)))
    assert delay and params["remote_block_ids"] == remote
    p.finish_both("r1")
    assert p.dw.get_block_ids_with_load_errors() == set()
    done = [e for e in p.dw.events if e.type == kvpull.EventType.DONE]
    assert [e.req_id for e in done] == [request_key("r1")]
    assert done[0].bytes == 3 * LAYERS * 2 * BS * HEADS * DIM * 4
    p.close()


def test_load_errors(port):
    p = Pair(port, stream=False)
    # params naming a request the prefill never allocated nor expected
    params = {"do_remote_prefill": True, "remote_engine_id": PREFILL,
              "remote_block_ids": [1, 2], "remote_ranks": [[ADDR, port]],
              "tp_size": 1, "kvpull_req_id": 777, "kvpull_stream": False,
              "num_tokens": 32}
    p.decode_load("never", 32, params, [5, 6])
    got = set()

    def finished():
        got.update(p.dw.get_finished()[1])
        return "never" in got
    pump(p.both(), finished)
    failed = [e for e in p.dw.events if e.type == kvpull.EventType.FAILED]
    assert [e.req_id for e in failed] == [777] and failed[0].status < 0
    assert p.dw.get_block_ids_with_load_errors() == {5, 6}
    p.close()


def test_cancel_on_both_sides(port):
    p = Pair(port, dec_attrs=dict(stall_ms=2000))
    remote, local = [3, 7], [11, 12]
    p.prefill_alloc("c1", 32, remote)
    p.decode_load("c1", 32, p.ps.stream_params("c1"), local)
    p.pw.save_kv_layer(0)
    pump(p.both(), lambda: p.dw._arrived.get("c1", 0) >= 1 or
         "c1" not in p.dw._recv)
    assert p.dw._arrived["c1"] == 1 and p.same(0, local, remote)
    p.dw.cancel("c1")
    p.pw.cancel("c1")
    p.dw.wait_for_layer_load(LAYERS - 1)    # no longer awaited: returns
    for layer in range(1, LAYERS):
        p.pw.save_kv_layer(layer)           # no longer published
    p.finish_both("c1")
    assert not p.same(LAYERS - 1, local, remote)
    assert p.dw.get_block_ids_with_load_errors() == {11, 12}
    assert p.pw.agent.stats().progress_writes >= 1
    p.close()


def test_default_max_ids_pulls_a_128k_prompt(port):
    nb = 8192 + 64
    p = Pair(port, nb=nb, stream=False, layers=1, heads=1, dim=4)
    assert "max_ids" not in p.dw.config.agent       # the default
    rng = np.random.default_rng(36)
    remote = (rng.permutation(nb // 64)[:128, None] * 64 +
              np.arange(64)).reshape(-1).tolist()
    local = (rng.permutation(nb // 64)[:128, None] * 64 +
             np.arange(64)).reshape(-1).tolist()
    tokens = 8192 * BS                               # 131,072
    p.prefill_alloc("big", tokens, remote)
    p.pw.save_kv_layer(0)                       # its one layer
    delay, params = p.ps.request_finished(Request("big", range(tokens)))
    p.decode_load("big", tokens, params, local)
    got = set()

    def finished():
        got.update(p.dw.get_finished()[1])
        return "big" in got
    pump(p.both(), finished, timeout=300)
    assert p.dw.get_block_ids_with_load_errors() == set()
    assert p.same(0, local, remote)
    p.close()
