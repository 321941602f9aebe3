# SPDX-License-Identifier: MIT
"""kvpull.connector on the host (issue 36, item 3): the scheduler side's
decisions (pure Python) and the worker side's calls into the agent on the
stand-in library (fakelib.py), driven by the events C would report: a
request's life on both sides (expect, publish per layer, pull_stream with
the prefix hit's tail, ARRIVED per layer, DONE, RELEASED), load errors
(FAILED's ids), cancellation (before and after the pull started, on the
prefill side), an engine that goes down.  The same lifecycle over real
agents runs in the VM (tests/python_rdma/test_kvconnector.py)."""
import errno
import hashlib

import pytest

import kvpull
from kvpull import _structs as S
from kvpull.connector import (ConnectorConfig, KVPullScheduler, KVPullWorker,
                              Request, request_key)
from kvpull.vllm import HND_STRIDE_ORDER
from test_agent import fake  # noqa: F401 (the stand-in library)

import torch  # noqa: E402 (python3-torch, scripts/install-deps.sh)

LAYERS, NB, BS, HEADS, DIM = 3, 16, 16, 2, 64
PREFILL, DECODE = 0x50, 0xD0
ET = kvpull.EventType


class Blocks:
    """vLLM's KVCacheBlocks, as the connector reads it."""

    def __init__(self, *groups):
        self.groups = groups

    def get_block_ids(self):
        return self.groups


class SchedOut:
    def __init__(self, **n):
        self.num_scheduled_tokens = n


def caches(heads=HEADS):
    out = {}
    for i in range(LAYERS):
        mem = torch.zeros(2, NB, heads, BS, DIM, dtype=torch.float32)
        out["model.layers.%d.self_attn.attn" % i] = mem.permute(0, 1, 3, 2, 4)
    return out


def ev(type, req_id=0, engine=0, layers=0, **kw):
    return S.EventStruct(type=int(type), req_id=req_id, engine=engine,
                         layers=layers, **kw)


def prefill_pair():
    cfg = ConnectorConfig(PREFILL, "producer", addr="10.0.0.1", port=18500,
                          consumer_engine=DECODE,
                          stride_order=HND_STRIDE_ORDER)
    sched = KVPullScheduler(cfg)
    w = KVPullWorker(cfg)
    return sched, w


def test_request_key():
    assert request_key("cmpl-1") == request_key("cmpl-1")
    assert request_key("cmpl-1") != request_key("cmpl-2")
    assert 0 <= request_key("x") < 1 << 64
    assert request_key("abc") == int.from_bytes(
        hashlib.blake2b(b"abc", digest_size=8).digest(), "little")


def test_prefill_side_lifecycle(fake):
    sched, w = prefill_pair()
    w.register_kv_caches(caches())
    assert fake.seen["listen"] == (b"10.0.0.1", 18500)
    assert [c[0] for c in fake.calls].count("register") == 2 * LAYERS
    sched.set_xfer_handshake_metadata({0: w.get_handshake_metadata()})
    req = Request("cmpl-7", range(40), {"do_remote_decode": True})
    assert sched.get_num_new_matched_tokens(req, 0) == (0, False)
    sched.update_state_after_alloc(req, Blocks([5, 9, 2]), 0)
    params = sched.stream_params("cmpl-7")
    key = request_key("cmpl-7")
    assert params == {
        "do_remote_prefill": True, "do_remote_decode": False,
        "remote_engine_id": PREFILL, "remote_block_ids": [5, 9, 2],
        "remote_ranks": [["10.0.0.1", 18500]], "tp_size": 1,
        "kvpull_req_id": key, "kvpull_stream": True, "num_tokens": 40}
    # the step that computes it: 32 tokens, then 8
    meta = sched.build_connector_meta(SchedOut(**{"cmpl-7": 32}))
    assert list(meta.reqs_to_send) == ["cmpl-7"]
    w.bind_connector_metadata(meta)
    w.start_load_kv()
    c, rid, deadline = fake.seen["expect"]
    assert (c, rid) == (DECODE, key)
    pubs = []
    for layer in range(LAYERS):
        w.save_kv_layer("model.layers.%d.self_attn.attn" % layer)
        pubs.append(fake.seen["publish"][2])
    w.wait_for_save()
    w.clear_connector_metadata()
    meta = sched.build_connector_meta(SchedOut(**{"cmpl-7": 8}))
    assert meta.reqs_to_send == {}
    w.bind_connector_metadata(meta)
    w.start_load_kv()
    for layer in range(LAYERS):
        w.save_kv_layer(layer)
        pubs.append(fake.seen["publish"][2])
    end = kvpull.TOKENS_END
    assert [(p["tokens_all"], p["tokens_cur"], p["layers_cur"])
            for p in pubs] == [
        (0, 32, 1), (0, 32, 2), (32, 32, 3),
        (32, end, 1), (32, end, 2), (end, end, 3)]
    # finished: blocks held, the params for the decode side
    delay, p2 = sched.request_finished(req, [5, 9, 2])
    assert delay is True and p2 == dict(params, kvpull_stream=False)
    assert w.get_finished() == (set(), set())
    fake.events.append([ev(ET.RELEASED, key, engine_id=DECODE)])
    assert w.get_finished() == ({"cmpl-7"}, set())
    assert w.get_finished() == (set(), set())          # once
    # a request the decode side does not take is not held
    other = Request("cmpl-8", range(4))
    assert sched.request_finished(other, [1]) == (False, None)
    w.shutdown()


def test_prefill_cancel_stops_publishing(fake):
    sched, w = prefill_pair()
    w.register_kv_caches(caches())
    req = Request("r1", range(16), {"do_remote_decode": True,
                                    "kvpull_consumer_engine": 0xD1})
    sched.update_state_after_alloc(req, Blocks([3]), 0)
    w.bind_connector_metadata(sched.build_connector_meta(SchedOut(r1=16)))
    w.start_load_kv()
    assert fake.seen["expect"][0] == 0xD1
    w.save_kv_layer(0)
    assert fake.seen["publish"][2]["layers_cur"] == 1
    w.cancel("r1")
    fake.seen.pop("publish")
    w.save_kv_layer(1)
    w.save_kv_layer(2)
    assert "publish" not in fake.seen
    # held until the agent says so (here: its deadline passed)
    assert w.get_finished() == (set(), set())
    fake.events.append([ev(ET.EXPIRED, request_key("r1"))])
    assert w.get_finished() == ({"r1"}, set())
    w.shutdown()


def decode_pair(stream=True):
    cfg = ConnectorConfig(DECODE, "consumer", addr="10.0.0.2",
                          stream=stream, load_timeout=5)
    return KVPullScheduler(cfg), KVPullWorker(cfg)


def params(key, blocks, stream=True, tokens=40):
    return {"do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": PREFILL, "remote_block_ids": blocks,
            "remote_ranks": [["10.0.0.1", 18500], ["10.0.0.1", 18501]],
            "tp_size": 2, "kvpull_req_id": key, "kvpull_stream": stream,
            "num_tokens": tokens}


def test_decode_side_lifecycle(fake):
    sched, w = decode_pair()
    w.register_kv_caches(caches())
    assert fake.seen["open"]["stream_events"] == 1
    req = Request("d1", range(40), params(77, [5, 9, 2]))
    # 16 tokens hit in the local prefix cache: 24 to load, asynchronously
    assert sched.get_num_new_matched_tokens(req, 16) == (24, True)
    sched.update_state_after_alloc(req, Blocks([11, 12]), 24)
    assert req.kv_transfer_params["do_remote_prefill"] is False
    meta = sched.build_connector_meta()
    assert list(meta.reqs_to_recv) == ["d1"]
    w.bind_connector_metadata(meta)
    fake.next_engine = 4
    w.start_load_kv()
    peers, n, _t = fake.seen["add_engine"]
    assert [p[:2] for p in peers] == [(b"10.0.0.1", 18500),
                                      (b"10.0.0.1", 18501)]
    assert "pull_stream" not in fake.seen         # the engine is not up
    fake.events.append([ev(ET.ENGINE_UP, engine=4)])
    w.poll()
    g = fake.seen["pull_stream"]
    assert (g["engine"], g["req_id"]) == (4, 77)
    assert g["groups"][0]["local"].tolist() == [11, 12]   # the tail
    assert g["groups"][0]["remote"].tolist() == [5, 9, 2]
    assert g["groups"][0]["tokens"] == 40
    # layers land one by one
    fake.events += [[ev(ET.ARRIVED, 77, 4, layers=1)],
                    [ev(ET.ARRIVED, 77, 4, layers=2)]]
    w.wait_for_layer_load("model.layers.0.self_attn.attn")
    w.wait_for_layer_load(1)
    fake.events.append([ev(ET.DONE, 77, 4)])
    w.wait_for_layer_load(2)                 # DONE ends the wait
    assert w.get_finished() == (set(), {"d1"})
    assert w.get_block_ids_with_load_errors() == set()
    w.shutdown()


def test_decode_load_errors_and_cancel(fake):
    sched, w = decode_pair(stream=False)
    w.register_kv_caches(caches())
    reqs = {}
    for rid, key, local in (("a", 1, [1, 2]), ("b", 2, [3]), ("c", 3, [4]),
                            ("d", 4, [6, 7])):
        reqs[rid] = Request(rid, range(20), params(key, [8, 9],
                                                   stream=False, tokens=20))
        sched.update_state_after_alloc(reqs[rid], Blocks(local), 20)
    # "d" is cancelled before any worker saw it
    sched.cancel("d")
    meta = sched.build_connector_meta()
    assert sorted(meta.reqs_to_recv) == ["a", "b", "c"]
    w.bind_connector_metadata(meta)
    w.start_load_kv()
    # "c" is cancelled while its engine is still connecting: dropped now
    w.cancel("c")
    assert w.get_finished() == (set(), {"c"})
    assert w.get_block_ids_with_load_errors() == {4}
    fake.events.append([ev(ET.ENGINE_UP, engine=fake.next_engine)])
    w.poll()
    assert fake.seen["pull_from"]["req_id"] == 2      # "a" then "b"
    # "b" cancelled in flight: reported when its READs end, not before
    w.cancel("b")
    assert w.get_finished() == (set(), set())
    fake.events.append([fake.failed_event(1, [[1, 2]], engine=5,
                                          status=-errno.ESTALE),
                        ev(ET.DONE, 2, 5)])
    done = w.get_finished()
    assert done == (set(), {"a", "b"})
    assert w.get_block_ids_with_load_errors() == {1, 2, 3}
    assert w.get_block_ids_with_load_errors() == set()
    w.shutdown()


def test_engine_down_fails_its_waiting_requests(fake):
    sched, w = decode_pair()
    w.register_kv_caches(caches())
    req = Request("x", range(20), params(9, [1, 2], tokens=20))
    sched.update_state_after_alloc(req, Blocks([5, 6]), 20)
    w.bind_connector_metadata(sched.build_connector_meta())
    w.start_load_kv()
    fake.events.append([ev(ET.ENGINE_DOWN, engine=fake.next_engine,
                           status=-errno.ECONNREFUSED)])
    assert w.get_finished() == (set(), {"x"})
    assert w.get_block_ids_with_load_errors() == {5, 6}
    w.shutdown()


def test_wait_for_layer_load_is_bounded(fake):
    sched, w = decode_pair()
    w.config.load_timeout = 0
    w.register_kv_caches(caches())
    req = Request("y", range(20), params(10, [1, 2], tokens=20))
    sched.update_state_after_alloc(req, Blocks([5, 6]), 20)
    w.bind_connector_metadata(sched.build_connector_meta())
    w.start_load_kv()
    with pytest.raises(TimeoutError, match=r"layer 0 of requests \['y'\] "
                       r"did not land within 0.0 s"):
        w.wait_for_layer_load(0)
    w.shutdown()


def test_config_and_registration_refusals(fake):
    with pytest.raises(ValueError, match="role must be"):
        ConnectorConfig(1, "both")
    # the layout check runs before any agent is opened
    cfg = ConnectorConfig(1, "consumer", tp_size=2, num_kv_heads=2)
    w = KVPullWorker(cfg)
    with pytest.raises(kvpull.Error) as ei:
        w.register_kv_caches(caches(heads=2))
    assert "2 KV heads, TP rank 0 of 2 holds 1" in ei.value.why
    assert "open" not in fake.seen
    # a prefill request without a consumer engine
    sched = KVPullScheduler(ConnectorConfig(1, "producer"))
    with pytest.raises(ValueError, match="no consumer engine"):
        sched.update_state_after_alloc(
            Request("z", [1], {"do_remote_decode": True}), [0], 0)


def test_progress_thread_queues_the_events(fake):
    cfg = ConnectorConfig(PREFILL, "producer", addr="10.0.0.1", port=18500,
                          consumer_engine=DECODE, progress_thread=True)
    sched, w = KVPullScheduler(cfg), KVPullWorker(cfg)
    w.register_kv_caches(caches())
    assert w._thread.is_alive()
    req = Request("t1", range(16), {"do_remote_decode": True})
    sched.update_state_after_alloc(req, Blocks([3]), 0)
    w.bind_connector_metadata(sched.build_connector_meta(SchedOut(t1=16)))
    w.start_load_kv()
    # the thread's poll takes the event; get_finished applies it
    fake.events.append([ev(ET.RELEASED, request_key("t1"))])
    got = set()
    for _ in range(200):
        got |= w.get_finished()[0]
        if got:
            break
        w.poll(timeout=0.05)
    assert got == {"t1"}
    w.shutdown()
    assert w._thread is None


def test_publish_after_an_early_release_is_not_an_error(fake):
    sched, w = prefill_pair()
    w.register_kv_caches(caches())
    req = Request("e1", range(16), {"do_remote_decode": True})
    sched.update_state_after_alloc(req, Blocks([3]), 0)
    w.bind_connector_metadata(sched.build_connector_meta(SchedOut(e1=16)))
    w.start_load_kv()
    # the consumer's pull failed (say its stall_ms passed): the agent
    # released the request, its next publish is -ENOENT
    fake.ret["publish"] = -errno.ENOENT
    w.save_kv_layer(0)
    calls = len([c for c in fake.calls if c[0] == "publish"])
    w.save_kv_layer(1)
    w.save_kv_layer(2)
    assert len([c for c in fake.calls if c[0] == "publish"]) == calls
    fake.events.append([ev(ET.RELEASED, request_key("e1"))])
    assert w.get_finished() == ({"e1"}, set())
    w.shutdown()


def test_an_engine_that_went_down_is_reconnected_by_the_next_pull(fake):
    sched, w = decode_pair(stream=False)
    w.register_kv_caches(caches())
    fake.next_engine = 4
    w.add_remote_engine(PREFILL, [("10.0.0.1", 18500)])
    fake.events.append([ev(ET.ENGINE_UP, engine=4)])
    w.poll()
    # closed while idle (say idle_ms passed between two requests)
    fake.events.append([ev(ET.ENGINE_DOWN, engine=4, status=-errno.ETIMEDOUT)])
    w.poll()
    req = Request("n1", range(20), params(5, [1, 2], stream=False, tokens=20))
    sched.update_state_after_alloc(req, Blocks([7, 8]), 20)
    w.bind_connector_metadata(sched.build_connector_meta())
    fake.ret["pull_from"] = -errno.EAGAIN        # the reconnect starts
    w.start_load_kv()
    assert fake.names().count("pull_from") == 1
    del fake.ret["pull_from"]
    w.poll()
    assert fake.names().count("pull_from") == 1  # waits for ENGINE_UP
    fake.events.append([ev(ET.ENGINE_UP, engine=4)])
    w.poll()
    assert fake.names().count("pull_from") == 2
    assert fake.seen["pull_from"]["groups"][0]["local"].tolist() == [7, 8]
    fake.events.append([ev(ET.DONE, 5, 4)])
    assert w.get_finished() == (set(), {"n1"})
    w.shutdown()
