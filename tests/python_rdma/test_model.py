# SPDX-License-Identifier: MIT
"""python/examples/model.py over real agents, small (issue 36): a 2-layer
model, a 40-token prompt (its last block partial), 4 decode steps; the
prefill worker (a TP 2 and a TP 1 engine) in a thread of this process and
the decode worker in this thread (torch is imported once: ~30 s under
TCG), over the side channel and two devices when there are two.  Every
request -- bulk, streamed, streamed with a prefix-cache hit, from each
engine -- decodes with logits bitwise equal to the reference's (prefill
and decode in one process, no kvpull), no load errors, and the model:
line has issue 36's fields.  `scripts/rdma-bench.sh --model` runs the
full size in two processes and prints the figures."""
import argparse
import importlib.util
import os
import re
import threading

import pytest

from conftest import ADDR, REPO

torch = pytest.importorskip("torch")    # carried in when the host has it

PATH = os.path.join(REPO, "python", "examples", "model.py")
SIZES = dict(layers=2, d_model=64, heads=4, kv_heads=2, ffn=128, vocab=97,
             prompt=40, decode=4, hit_blocks=1, rounds=1)


def test_model_decodes_bitwise(port):
    spec = importlib.util.spec_from_file_location("model", PATH)
    M = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(M)
    cfg = M.Config(**SIZES)
    args = argparse.Namespace(
        addr=ADDR, decode_addr=os.environ.get("KVP_ADDR1") or ADDR,
        port=port, ctrl_addr="127.0.0.1", ctrl_port=port + 5, timeout=120,
        stall_ms=60000, tps=[2, 1])
    rc, ready = [], threading.Event()
    t = threading.Thread(target=lambda: rc.append(M.run_prefill(args, cfg,
                                                                ready)))
    t.start()
    try:
        assert ready.wait(120), "the prefill did not get ready"
        res = M.decode_result(args, cfg)
    finally:
        t.join(180)
    assert rc == [0]
    assert res["errors"] == []
    assert sorted(res["match"]) == [
        "tp%d-%s" % (tp, r) for tp in (1, 2) for r in ("A1", "B1", "C", "W")]
    for name, (n, same) in res["match"].items():
        assert (n, same) == (cfg.decode + 1, cfg.decode + 1), name
    modes = {n: (f["mode"], f["hit_blocks"]) for n, f in
             res["figures"].items()}
    assert modes["tp2-A1"] == ("bulk", 0)
    assert modes["tp2-B1"] == ("stream", 0)
    assert modes["tp2-C"] == ("stream", 1)
    # a streamed request's layers land as it is computed, in order
    b = res["figures"]["tp2-B1"]
    assert len(b["arrived_ms"]) == cfg.layers
    assert b["arrived_ms"] == sorted(b["arrived_ms"])
    for tp in (2, 1):
        line, ok = M.summary(cfg, tp, res)
        assert ok
        assert re.fullmatch(
            r"model: layers=2 prompt_tokens=40 decode_tokens=4 tp=%d->1 "
            r"match=bitwise prefill_ms=[0-9.]+ ttft_bulk_ms=[0-9.]+ "
            r"ttft_stream_ms=[0-9.]+ exposed_bulk_ms=[0-9.]+ "
            r"exposed_stream_ms=[0-9.]+ layer_xfer_ms=[0-9.]+" % tp, line)
