#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""model.py: a small decoder-only transformer served disaggregated through
kvpull.connector, whose decode continues bit for bit (issue 36).

The model: torch on the CPU, random weights from a fixed seed (by default
8 layers, d_model 128, 4 query heads, 2 KV heads of 32, RoPE, RMSNorm,
SwiGLU, fp32; a 128-token prompt, 16 decode steps; --d-model, --prompt
and the other size options change them), one thread (deterministic
kernels), a paged KV cache in
vLLM's FlashAttention shape ``(2, num_blocks, 16, kv_heads, 64)`` per
layer, allocated in the HND stride order vLLM uses for disaggregated
serving.  Attention always reads K and V back from the paged cache
through the request's block table, so that a prefill, a prefix-cache
continuation and a decode step run the same code wherever the bytes came
from.

Two processes, as two serving instances:

 - prefill: two prefill engines in one process, TP 2 (two ranks, each a
   KVPullWorker with its half of the KV heads in its own registered
   cache) and TP 1; each rank computes the layer whole and keeps its
   heads' slice (a GEMM over a slice of the heads may round differently
   from the whole), writes each layer's K and V into its paged cache and
   publishes it as it finishes (``save_kv_layer``);
 - decode: TP 1, its own block ids; per prefill engine, requests A pulled
   after the whole prefill (bulk), B pulled while it is computed
   (streamed: ``start_load_kv`` when the request arrives,
   ``wait_for_layer_load`` per layer), and C streamed with a prefix-cache
   hit (its first blocks are the last B's, already held on both sides:
   the prefill computes only the tail, the decode side pulls only the
   tail); each then generates N tokens greedily.

Then the decode process runs the reference itself, a fresh model and cache
without kvpull: the same requests' prefills and decodes in one process.
Every logit of every step (the prefill's last position, and each decode
step) must equal the reference's bit for bit.

    model.py pair [--addr A] [--decode-addr B] [size options]
    model.py prefill / decode ...         # one side each (pair runs both)

Prints a ``model-request:`` line per request (its figures, the prefill's
per-layer times and the decode side's per-layer arrivals) and per prefill
engine
``model: layers=L prompt_tokens=T decode_tokens=N tp=2->1 match=bitwise
prefill_ms=P ttft_bulk_ms=A ttft_stream_ms=B exposed_bulk_ms=X
exposed_stream_ms=Y layer_xfer_ms=Z``, medians over ``--rounds`` pairs of
fresh prompts (A bulk, B streamed, after a warm-up request W): prefill,
the prefill's forward pass; TTFT, from the prompt's arrival at the
prefill to the decode's first token (same machine: one monotonic clock);
exposed, from the end of the prefill's last layer (its K and V written)
to the decode side's DONE; layer_xfer, the bulk pull's time (its DONE's
elapsed_ns) over the layers; match, over every request of the engine.
Exit 0 when every logit matched, 1 otherwise, 77 without an RDMA device.
"""
import argparse
import base64
import json
import math
import os
import select
import socket
import subprocess
import sys
import time

import numpy as np
import torch

try:
    import kvpull
except ImportError:                      # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), ".."))
    import kvpull
from kvpull.connector import (ConnectorConfig, KVPullScheduler, KVPullWorker,
                              Request)
from kvpull.vllm import HND_STRIDE_ORDER

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from connector import Channel  # noqa: E402 (the example's side channel)

EXIT_SKIP = 77
PREFILL_ENGINE = 0x4D50       # + TP size
DECODE_ENGINE = 0x4D44


class Config:
    """The model's and the run's sizes (passed to both processes)."""

    # The defaults fit scripts/rdma-bench.sh --model in one VM boot on a
    # shared 2-core machine (a forward pass of the prompt takes ~3.5 s
    # under TCG; the run ~5 min); --d-model 512 --heads 8 --ffn 1024
    # --prompt 512 is the larger form.
    FIELDS = dict(layers=8, d_model=128, heads=4, kv_heads=2, ffn=256,
                  vocab=2048, block=16, seed=36, dtype="float32",
                  prompt=128, decode=16, hit_blocks=2, rounds=2,
                  num_blocks=0)

    def __init__(self, **kw):
        for k, v in self.FIELDS.items():
            setattr(self, k, kw.pop(k, v))
        if kw:
            raise TypeError("unknown sizes %s" % sorted(kw))
        self.head_dim = self.d_model // self.heads
        if not self.num_blocks:     # every request of both engines, kept
            per = -(-(self.prompt + self.decode) // self.block) + 1
            self.num_blocks = (4 * self.rounds + 6) * per
        self.torch_dtype = getattr(torch, self.dtype)

    def to_dict(self):
        return {k: getattr(self, k) for k in self.FIELDS}


# ---- the model ------------------------------------------------------------


class Model:
    """Weights from the seed; :meth:`forward` over a :class:`Paged` KV."""

    def __init__(self, cfg):
        self.cfg = c = cfg
        g = torch.Generator().manual_seed(c.seed)
        dt = c.torch_dtype

        def w(n_in, n_out):
            return (torch.randn(n_in, n_out, generator=g) /
                    math.sqrt(n_in)).to(dt)

        H, KV, hd, D, F = c.heads, c.kv_heads, c.head_dim, c.d_model, c.ffn
        self.embed = torch.randn(c.vocab, D, generator=g).to(dt)
        self.layers = []
        for _ in range(c.layers):
            self.layers.append(dict(
                wq=w(D, H * hd), wk=w(D, KV * hd), wv=w(D, KV * hd),
                wo=w(H * hd, D), w1=w(D, F), w3=w(D, F), w2=w(F, D),
                n1=(1 + 0.1 * torch.randn(D, generator=g)).to(dt),
                n2=(1 + 0.1 * torch.randn(D, generator=g)).to(dt)))
        self.norm = torch.ones(D, dtype=dt)
        self.head = w(D, c.vocab)
        self.inv_freq = 1.0 / (10000.0 ** (torch.arange(0, hd, 2,
                                                        dtype=torch.float64)
                                           / hd))

    @staticmethod
    def _rms(x, wt):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * wt

    def _rope(self, x, pos):
        ang = (pos[:, None].double() * self.inv_freq[None, :])
        cos = ang.cos().to(x.dtype)[:, None, :]
        sin = ang.sin().to(x.dtype)[:, None, :]
        half = x.shape[-1] // 2
        x1, x2 = x[..., :half], x[..., half:]
        return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], -1)

    def forward(self, tokens, pos0, kv, before_layer=None, after_layer=None):
        """Run ``tokens`` at positions ``pos0...``: each layer writes its
        K and V through ``kv`` and attends over positions ``[0, pos0 +
        len(tokens))`` read back from it; returns the last position's
        logits (a ``(vocab,)`` tensor).  ``before_layer(l)`` /
        ``after_layer(l)``: the connector's per-layer hooks."""
        c = self.cfg
        H, KV, hd = c.heads, c.kv_heads, c.head_dim
        T = len(tokens)
        x = self.embed[torch.as_tensor(tokens, dtype=torch.long)]
        pos = torch.arange(pos0, pos0 + T)
        ctx = pos0 + T
        mask = pos[:, None] < torch.arange(ctx)[None, :]        # future
        for li, L in enumerate(self.layers):
            if before_layer:
                before_layer(li)
            h = self._rms(x, L["n1"])
            q = self._rope((h @ L["wq"]).view(T, H, hd), pos)
            k = self._rope((h @ L["wk"]).view(T, KV, hd), pos)
            v = (h @ L["wv"]).view(T, KV, hd)
            kv.write(li, pos0, k, v)
            K, V = kv.read(li, ctx)
            K = K.repeat_interleave(H // KV, dim=1).permute(1, 2, 0)
            V = V.repeat_interleave(H // KV, dim=1).transpose(0, 1)
            s = (q.transpose(0, 1) @ K) / math.sqrt(hd)      # (H, T, ctx)
            s = s.masked_fill(mask[None], float("-inf")).softmax(-1)
            o = (s @ V).transpose(0, 1).reshape(T, H * hd)
            x = x + o @ L["wo"]
            h = self._rms(x, L["n2"])
            x = x + (torch.nn.functional.silu(h @ L["w1"]) *
                     (h @ L["w3"])) @ L["w2"]
            if after_layer:
                after_layer(li)
        return (self._rms(x[-1:], self.norm) @ self.head)[0]


def kv_caches(cfg, heads):
    """One rank's paged cache: per layer vLLM's logical FlashAttention
    tensor (2, blocks, block, heads, dim) over HND memory."""
    out = {}
    for i in range(cfg.layers):
        mem = torch.zeros(2, cfg.num_blocks, heads, cfg.block, cfg.head_dim,
                          dtype=cfg.torch_dtype)
        out["model.layers.%d.self_attn.attn" % i] = mem.permute(0, 1, 3, 2,
                                                                4)
    return out


class Paged:
    """A request's KV through its block table: writes go to every
    ``(caches, head0, heads)`` of ``writes`` (the heads' slice), reads come
    from ``read`` (a cache with every head)."""

    def __init__(self, cfg, table, read, writes):
        self.cfg = cfg
        self.table = torch.as_tensor(table, dtype=torch.long)
        self.read_c = list(read.values())
        self.writes = [(list(c.values()), h0, n) for c, h0, n in writes]

    def write(self, layer, pos0, k, v):
        bs = self.cfg.block
        p = torch.arange(pos0, pos0 + k.shape[0])
        b, o = self.table[p // bs], p % bs
        for caches, h0, n in self.writes:
            c = caches[layer]
            c[0, b, o] = k[:, h0:h0 + n]
            c[1, b, o] = v[:, h0:h0 + n]

    def read(self, layer, ctx):
        bs = self.cfg.block
        nb = -(-ctx // bs)
        c = self.read_c[layer]
        idx = self.table[:nb]
        shape = (nb * bs, c.shape[3], c.shape[4])
        return (c[0][idx].reshape(shape)[:ctx], c[1][idx].reshape(shape)[:ctx])


def requests(cfg, tp):
    """The requests for the prefill engine of TP ``tp``, in order: (name,
    tokens, mode, prefix), prefix ``(name, blocks)`` sharing that
    request's first blocks.  W warms up (a 2-block bulk pull: the first
    pull and the first forward pay one-time costs), then ``rounds`` pairs
    of fresh prompts, A pulled in bulk and B streamed, then C streamed
    with a prefix-cache hit of the last B's first ``hit_blocks`` blocks."""
    g = torch.Generator().manual_seed(cfg.seed * 1000 + tp)

    def t(n):
        return torch.randint(0, cfg.vocab, (n,), generator=g).tolist()
    base = "tp%d-" % tp
    out = [(base + "W", t(2 * cfg.block), "bulk", None)]
    for r in range(1, cfg.rounds + 1):
        out += [(base + "A%d" % r, t(cfg.prompt), "bulk", None),
                (base + "B%d" % r, t(cfg.prompt), "stream", None)]
    hit = cfg.hit_blocks * cfg.block
    b = out[-1]
    out.append((base + "C", b[1][:hit] + t(cfg.prompt - hit), "stream",
                (b[0], cfg.hit_blocks)))
    return out


class Blocks:
    """Block allocation from a seeded permutation (the two sides differ)."""

    def __init__(self, cfg, seed):
        self.free = np.random.default_rng(seed).permutation(
            cfg.num_blocks).tolist()
        self.tables = {}

    def take(self, n):
        out, self.free = self.free[:n], self.free[n:]
        if len(out) < n:
            raise RuntimeError("out of blocks")
        return [int(x) for x in out]


def log(who, msg):
    print("%s: %s" % (who, msg), flush=True)


def _tensor_bytes(t):
    return base64.b64encode(t.contiguous().numpy().tobytes()).decode()


def _from_bytes(s, dtype):
    return torch.from_numpy(np.frombuffer(base64.b64decode(s),
                                          dtype=dtype).copy())


def decode(model, kv, T, tok, n, on_first=None):
    """``n`` greedy steps from token ``tok`` at position ``T``: the logits
    of each step; ``on_first()`` once the first step's token is known."""
    out = []
    for step in range(n):
        out.append(model.forward([tok], T + step, kv))
        tok = int(out[-1].argmax())
        if step == 0 and on_first:
            on_first()
    return out


# ---- the reference: one process ----------------------------------------------


def reference(cfg, tps):
    """Every request of every engine, prefill and decode in one process
    with one cache, no kvpull: {name: [prefill logits, step logits...]}."""
    model = Model(cfg)
    cache = kv_caches(cfg, cfg.kv_heads)
    blocks = Blocks(cfg, 7)
    out = {}
    for tp in tps:
        for name, toks, _mode, prefix in requests(cfg, tp):
            T = len(toks)
            table = []
            done = 0
            if prefix:
                table = blocks.tables[prefix[0]][:prefix[1]]
                done = prefix[1] * cfg.block
            need = -(-(T + cfg.decode) // cfg.block)
            table = table + blocks.take(need - len(table))
            blocks.tables[name] = table
            kv = Paged(cfg, table, cache, [(cache, 0, cfg.kv_heads)])
            first = model.forward(toks[done:], done, kv)
            out[name] = [first] + decode(model, kv, T, int(first.argmax()),
                                         cfg.decode)
    return out


# ---- the prefill process -----------------------------------------------------


def run_prefill(args, cfg, ready=None):
    """The prefill process (``ready``: a threading.Event set once the side
    channel listens, for a caller that runs this in a thread)."""
    who = "prefill"
    torch.set_num_threads(1)
    model = Model(cfg)
    full = kv_caches(cfg, cfg.kv_heads)       # every head: what attends
    blocks = Blocks(cfg, 3)
    engines = {}
    port = args.port
    for tp in args.tps:
        workers, writes, scheds = [], [], None
        for r in range(tp):
            start, n = kvpull.shard_range(cfg.kv_heads, tp, r)
            caches = kv_caches(cfg, n)
            c = ConnectorConfig(PREFILL_ENGINE + tp, "producer", tp_size=tp,
                                tp_rank=r, addr=args.addr, port=port,
                                num_kv_heads=cfg.kv_heads,
                                stride_order=HND_STRIDE_ORDER,
                                consumer_engine=DECODE_ENGINE,
                                expect_timeout=args.timeout,
                                agent=dict(max_peers=8),
                                progress_thread=True)
            port += 1
            w = KVPullWorker(c)
            try:
                w.register_kv_caches(caches)
            except kvpull.Error as e:
                if e.code == -19:       # ENODEV
                    log(who, "no RDMA device (%s): skipped" % e)
                    sys.exit(EXIT_SKIP)
                raise
            workers.append(w)
            writes.append((caches, start, n))
            if scheds is None:
                scheds = KVPullScheduler(c)
        scheds.set_xfer_handshake_metadata(
            {r: w.get_handshake_metadata() for r, w in enumerate(workers)})
        engines[tp] = (scheds, workers, writes)
    allw = [w for _s, ws, _w in engines.values() for w in ws]
    srv = socket.create_server((args.ctrl_addr, args.ctrl_port))
    log(who, "ready: engines %s, side channel on port %d"
        % (", ".join("TP %d" % t for t in args.tps), args.ctrl_port))
    if ready is not None:
        ready.set()
    srv.settimeout(0.05)
    conn = None
    end = time.monotonic() + args.timeout
    while conn is None:                 # keep polling: handshakes run there
        for w in allw:
            w.poll()
        try:
            conn, _ = srv.accept()
        except socket.timeout:
            if time.monotonic() > end:
                raise TimeoutError("no decode worker")
    ch = Channel(conn)
    ch.send({"engines": {str(tp): s.ranks for tp, (s, _w, _x) in
                         engines.items()}})
    held, bye = set(), False
    while not bye or held:
        msgs = ch.take()
        for w in allw:
            done, _r = w.get_finished()
            held -= done
        if not msgs:
            if ch.eof and not bye:
                raise RuntimeError("the decode worker left")
            if time.monotonic() > end:
                raise TimeoutError("requests still held: %s" % sorted(held))
            for w in allw:
                w.poll(timeout=0.002)
            continue
        for m in msgs:
            if m.get("bye"):
                bye = True
                continue
            _prefill_one(cfg, model, full, blocks, engines, ch, m)
            held.add(m["req"])
    for w in allw:
        st = w.agent.stats()
        log(who, "engine %#x rank %d: %d released, %d progress writes" % (
            w.config.engine_id, w.config.tp_rank, st.released,
            st.progress_writes))
        w.shutdown()
    return 0


def _prefill_one(cfg, model, full, blocks, engines, ch, m):
    t_arrive = time.monotonic_ns()
    name, toks, tp = m["req"], m["tokens"], m["tp"]
    sched, workers, writes = engines[tp]
    done = 0
    table = []
    if m.get("prefix"):
        pname, k = m["prefix"]
        table = blocks.tables[pname][:k]     # the prefix cache's blocks
        done = k * cfg.block
    need = -(-len(toks) // cfg.block)
    table = table + blocks.take(need - len(table))
    blocks.tables[name] = table
    req = Request(name, toks, {"do_remote_decode": True},
                  num_computed_tokens=done)
    sched.update_state_after_alloc(req, [table], 0)
    if m["mode"] == "stream":           # the decode side starts now
        ch.send({"req": name, "params": sched.stream_params(name),
                 "t_arrive": t_arrive})

    class Out:
        num_scheduled_tokens = {name: len(toks) - done}
    meta = sched.build_connector_meta(Out)
    for w in workers:
        w.bind_connector_metadata(meta)
        w.start_load_kv()
    kv = Paged(cfg, table, full, [(full, 0, cfg.kv_heads)] + writes)
    t0 = time.monotonic_ns()
    layer_ns = []

    def after(layer):
        layer_ns.append(time.monotonic_ns())     # computed, not published
        for w in workers:
            w.save_kv_layer(layer)
    logits = model.forward(toks[done:], done, kv, after_layer=after)
    t_fwd = time.monotonic_ns()
    t_end = layer_ns[-1]                # the last layer's K and V written
    first = int(logits.argmax())
    for w in workers:
        w.wait_for_save()
        w.clear_connector_metadata()
    _delay, params = sched.request_finished(req)
    ch.send({"req": name, "params": params, "first_token": first,
             "t_arrive": t_arrive, "t_end": t_end,
             "prefill_ns": t_fwd - t0,
             "layer_ns": [t - t0 for t in layer_ns],
             "logits": _tensor_bytes(logits)})


# ---- the decode process ------------------------------------------------------


def run_decode(args, cfg):
    res = decode_result(args, cfg)
    print("model-result: " + json.dumps(res), flush=True)
    return 0


def decode_result(args, cfg):
    """The decode side's run: {"figures": {request: ...}, "errors": [load
    errors], "match": {request: [logits compared, bitwise equal]}}."""
    who = "decode"
    torch.set_num_threads(1)
    model = Model(cfg)
    cache = kv_caches(cfg, cfg.kv_heads)
    c = ConnectorConfig(DECODE_ENGINE, "consumer", addr=args.decode_addr,
                        num_kv_heads=cfg.kv_heads,
                        stride_order=HND_STRIDE_ORDER,
                        load_timeout=args.timeout,
                        # a streamed pull fails when its prefill publishes
                        # nothing for stall_ms: more than a layer's compute
                        # (seconds under TCG, on a shared machine)
                        agent=dict(max_peers=8, stall_ms=args.stall_ms))
    sched, w = KVPullScheduler(c), KVPullWorker(c)
    try:
        w.register_kv_caches(cache)
    except kvpull.Error as e:
        if e.code == -19:
            log(who, "no RDMA device (%s): skipped" % e)
            sys.exit(EXIT_SKIP)
        raise
    # the prefill listens before it says "ready:" (start it first)
    ch = Channel(socket.create_connection((args.ctrl_addr, args.ctrl_port),
                                          timeout=30))
    hello = _wait_msg(w, ch, lambda m: "engines" in m, args.timeout)
    for tp in args.tps:                 # handshakes before the requests
        ranks = hello["engines"][str(tp)]       # {rank: handshake metadata}
        w.add_remote_engine(PREFILL_ENGINE + tp,
                            [(ranks[str(r)]["addr"], ranks[str(r)]["port"])
                             for r in range(tp)], wait=args.timeout)
    blocks = Blocks(cfg, 11)
    got, figures = {}, {}
    for tp in args.tps:
        for name, toks, mode, prefix in requests(cfg, tp):
            got[name], figures[name] = _decode_one(
                cfg, model, cache, w, sched, ch, blocks, name, toks, mode,
                prefix, tp, args.timeout)
    ch.send({"bye": True})
    errors = w.get_block_ids_with_load_errors()
    w.shutdown()
    log(who, "pulled %d requests, load errors %s; the reference in one "
        "process..." % (len(got), sorted(errors) or "none"))
    ref = reference(cfg, args.tps)
    result = {"figures": figures, "errors": sorted(errors), "match": {}}
    for name, logits in got.items():
        same = [a.numpy().tobytes() == b.numpy().tobytes()
                for a, b in zip(logits, ref[name])]
        result["match"][name] = [len(same), sum(same)]
    return result


def _wait_msg(w, ch, pred, timeout):
    """Poll the worker (its pulls progress inside poll) until the side
    channel brings a message that satisfies pred."""
    end = time.monotonic() + timeout
    while True:
        ch.pump()
        for i, m in enumerate(ch.msgs):
            if pred(m):
                del ch.msgs[i]          # the others wait for their turn
                return m
        if ch.eof:
            raise RuntimeError("the prefill worker left")
        if time.monotonic() > end:
            raise TimeoutError("no message from the prefill worker")
        w.poll(timeout=0.001)


def _decode_one(cfg, model, cache, w, sched, ch, blocks, name, toks, mode,
                prefix, tp, timeout):
    T = len(toks)
    hit = prefix[1] if prefix else 0
    table = blocks.tables[prefix[0]][:hit] if prefix else []
    tail = blocks.take(-(-T // cfg.block) - hit)
    table = table + tail
    ch.send({"req": name, "tokens": toks, "mode": mode, "tp": tp,
             "prefix": list(prefix) if prefix else None})

    def load(params):
        req = Request(name, toks, params)
        n, _async = sched.get_num_new_matched_tokens(req, hit * cfg.block)
        sched.update_state_after_alloc(req, [tail], n)
        w.bind_connector_metadata(sched.build_connector_meta())
        w.start_load_kv()

    arrived = []
    t_params = None
    if mode == "stream":
        m = _wait_msg(w, ch, lambda m: m.get("req") == name and
                      "first_token" not in m, timeout)
        t_params = time.monotonic_ns()
        load(m["params"])
        for layer in range(cfg.layers):  # each layer as it lands
            w.wait_for_layer_load(layer)
            arrived.append(time.monotonic_ns())
    done = _wait_msg(w, ch, lambda m: m.get("req") == name and
                     "first_token" in m, timeout)
    if mode == "bulk":
        load(done["params"])
        for layer in range(cfg.layers):
            w.wait_for_layer_load(layer)
            arrived.append(time.monotonic_ns())
    w.wait_for_recv([name], timeout)
    w.clear_connector_metadata()
    t_kv = w.finished_ns[name]
    key = done["params"]["kvpull_req_id"]
    ev = [e for e in w.events if e.req_id == key and
          e.type in (kvpull.EventType.DONE, kvpull.EventType.FAILED)][-1]
    if ev.type != kvpull.EventType.DONE:
        raise RuntimeError("%s: %r" % (name, ev))
    # decode: the blocks for the new tokens, then N greedy steps
    table = table + blocks.take(-(-(T + cfg.decode) // cfg.block) -
                                len(table))
    blocks.tables[name] = table
    kv = Paged(cfg, table, cache, [(cache, 0, cfg.kv_heads)])
    firsts = []
    logits = [_from_bytes(done["logits"], np.dtype(cfg.dtype))] + decode(
        model, kv, T, done["first_token"], cfg.decode,
        lambda: firsts.append(time.monotonic_ns()))
    t_first = firsts[0]
    ms = 1e-6
    fig = {"mode": mode, "tp": tp, "tokens": T, "hit_blocks": hit,
           "prefill_ms": done["prefill_ns"] * ms,
           "ttft_ms": (t_first - done["t_arrive"]) * ms,
           "exposed_ms": (t_kv - done["t_end"]) * ms,
           "pull_ms": ev.elapsed_ns * ms, "bytes": ev.bytes,
           "reads": ev.reads,
           "publish_ms": [round(x * ms, 2) for x in done["layer_ns"]],
           "arrived_ms": [round((a - done["t_arrive"]) * ms, 2)
                          for a in arrived]}
    if t_params is not None:
        fig["params_ms"] = (t_params - done["t_arrive"]) * ms
    return logits, fig


# ---- both, and the figures ---------------------------------------------------


def _median(xs):
    xs = sorted(xs)
    return xs[len(xs) // 2] if len(xs) % 2 else \
        (xs[len(xs) // 2 - 1] + xs[len(xs) // 2]) / 2


def summary(cfg, tp, res):
    """The model: line of engine TP ``tp`` from the decode's result:
    medians over the rounds' A (bulk) and B (streamed) requests; match
    over every request of the engine (W and C included); ``(line, ok)``."""
    figs = res["figures"]
    pre = "tp%d-" % tp
    a = [f for n, f in figs.items() if n.startswith(pre + "A")]
    b = [f for n, f in figs.items() if n.startswith(pre + "B")]

    def med(fs, k):
        return _median([f[k] for f in fs])
    ok = all(n == m and n == cfg.decode + 1 for k, (n, m) in
             res["match"].items() if k.startswith(pre)) and \
        not res["errors"]
    return ("model: layers=%d prompt_tokens=%d decode_tokens=%d tp=%d->1 "
            "match=%s prefill_ms=%.1f ttft_bulk_ms=%.1f ttft_stream_ms=%.1f "
            "exposed_bulk_ms=%.1f exposed_stream_ms=%.1f layer_xfer_ms=%.2f"
            % (cfg.layers, cfg.prompt, cfg.decode, tp,
               "bitwise" if ok else "DIFFERENT", med(a, "prefill_ms"),
               med(a, "ttft_ms"), med(b, "ttft_ms"), med(a, "exposed_ms"),
               med(b, "exposed_ms"), med(a, "pull_ms") / cfg.layers)), ok


def run_pair(args, cfg):
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--addr", args.addr, "--decode-addr", args.decode_addr,
              "--port", str(args.port), "--ctrl-addr", args.ctrl_addr,
              "--ctrl-port", str(args.ctrl_port), "--timeout",
              str(args.timeout), "--stall-ms", str(args.stall_ms),
              "--tps", ",".join(map(str, args.tps)),
              "--cfg", json.dumps(cfg.to_dict())]
    # the prefill first, until it says it listens; its few lines wait in
    # its pipe until it exits
    prod = subprocess.Popen(me + ["prefill"] + common, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    end = time.monotonic() + args.timeout
    while not lines or "ready:" not in lines[-1]:
        left = end - time.monotonic()
        line = prod.stdout.readline() if left > 0 and select.select(
            [prod.stdout], [], [], left)[0] else ""
        if not line:
            prod.kill()
            sys.stdout.write("".join(lines) + prod.communicate()[0])
            return EXIT_SKIP if prod.returncode == EXIT_SKIP else 1
        lines.append(line)
    cons = subprocess.Popen(me + ["decode"] + common, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        cout = cons.communicate(timeout=args.timeout * 3)[0]
        pout = prod.communicate(timeout=args.timeout)[0]
    except subprocess.TimeoutExpired:
        cons.kill()
        prod.kill()
        cout, pout = cons.communicate()[0], prod.communicate()[0]
    sys.stdout.write("".join(lines) + pout)
    crc = cons.returncode
    res = None
    for line in cout.splitlines():
        if line.startswith("model-result: "):
            res = json.loads(line[len("model-result: "):])
        else:
            print(line)
    if res is None or crc or prod.returncode:
        print("model.py: prefill exit %s, decode exit %d, no result"
              % (prod.returncode, crc))
        return 1
    for name, f in sorted(res["figures"].items()):
        print("model-request: %s %s match=%d/%d" % (
            name, json.dumps(f, sort_keys=True), res["match"][name][1],
            res["match"][name][0]))
    ok = True
    for tp in args.tps:
        line, good = summary(cfg, tp, res)
        print(line)
        ok = ok and good
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=("pair", "prefill", "decode",
                                    "reference"))
    p.add_argument("--addr", default=os.environ.get("KVP_ADDR0"))
    p.add_argument("--decode-addr", default=None)
    p.add_argument("--port", type=int, default=18970)
    p.add_argument("--ctrl-addr", default="127.0.0.1")
    p.add_argument("--ctrl-port", type=int, default=18990)
    p.add_argument("--timeout", type=float, default=600)
    p.add_argument("--stall-ms", type=int, default=300000,
                   help="the decode agent's stall_ms [300000]")
    p.add_argument("--tps", default="2,1",
                   help="prefill engines' TP sizes [2,1]")
    p.add_argument("--cfg", default=None, help="sizes, JSON (pair passes "
                   "them on)")
    for k, v in Config.FIELDS.items():
        p.add_argument("--" + k.replace("_", "-"), type=type(v), default=None)
    args = p.parse_args()
    sizes = json.loads(args.cfg) if args.cfg else {}
    for k in Config.FIELDS:
        v = getattr(args, k)
        if v is not None:
            sizes[k] = v
    cfg = Config(**sizes)
    args.tps = [int(x) for x in args.tps.split(",")]
    if args.role == "reference":
        ref = reference(cfg, args.tps)
        for name, logits in sorted(ref.items()):
            print(name, [float(x.max()) for x in logits][:3])
        return 0
    if not args.addr:
        p.error("no address: give --addr or set KVP_ADDR0")
    args.decode_addr = args.decode_addr or args.addr
    try:
        if args.role == "pair":
            return run_pair(args, cfg)
        if args.role == "prefill":
            return run_prefill(args, cfg)
        return run_decode(args, cfg)
    except (kvpull.Error, RuntimeError, TimeoutError) as e:
        log(args.role, "failed: %r" % (e,))
        return 1


if __name__ == "__main__":
    sys.exit(main())
