#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""connector.py: a disaggregated prefill/decode pair, shaped like a serving
engine's KV connector (vLLM's NIXL connector, reduced to what kvpull does).

Two processes, as two serving instances would be:

 - the prefill worker, TP 2: two ranks, each with its own KV cache and its
   own producer agent (kvpull.Agent(..., "producer")) listening on its own
   port; it "computes" 4 prompts (fills their blocks with a pattern that
   names every element: request, layer, K or V, global head, token, dim),
   tells the decode worker which blocks hold each prompt (vLLM's
   kv_transfer_params: remote block ids, sequence length) and waits until
   every rank has RELEASED every request;
 - the decode worker, TP 1: one rank with all 8 KV heads, a consumer agent
   that adds the prefill engine (with the ranks' metadata blobs carried
   over the control socket, as a connector's side channel carries them),
   pulls each request into its own, other block ids (one request with a
   prefix-cache hit of 2 blocks: only the tail is pulled), waits for DONE,
   and then checks EVERY byte of its whole KV cache: the pulled blocks hold
   the pattern of the prefill's heads 0-3 (rank 0) and 4-7 (rank 1) at the
   right tokens, the other blocks still hold what they held.

KV caches are numpy arrays in vLLM's per-layer shape: for FlashAttention,
``(2, num_blocks, block_size, num_kv_heads, head_size)`` per layer (K and
V), allocated in the HND order vLLM uses for disaggregated serving (its
stride order (0, 1, 3, 2, 4): memory ``(2, num_blocks, num_kv_heads,
block_size, head_size)``, the logical tensor a transposed view). kvpull's
layout of each rank (``Layout.build(..., kv_layout="flash_hnd")``) says
which region is which layer's K or V; the worker checks that the layout and
the arrays agree (sizes and strides) before registering them.

Metadata and requests travel as JSON lines over a TCP socket (the
connector's side channel). Both workers sleep on their agents' file
descriptors (agent.fileno(), agent.arm()) in a selectors loop, with the
control socket, instead of spinning.

    connector.py pair [--addr A] [--stream]     # both workers, checked
    connector.py prefill --addr A               # one worker each
    connector.py decode --addr A

--addr is an IP address of an RDMA device ($KVP_ADDR0 by default, as
scripts/rxe-vm.sh sets it); --decode-addr another one for the decode worker
($KVP_ADDR1 in a VM with two devices). --stream pulls while the prefill is
still "computing": the decode worker calls pull_stream() when the request
arrives, the prefill publishes each layer as it finishes it
(agent.publish()), ARRIVED events report the layers that landed.
KVPULL_SECRET, if set (16 to 256 bytes), is the shared secret of both.
--metrics-port P serves each worker's agents' metrics at
http://CTRL-ADDR:P/metrics (the prefill worker, its two ranks merged) and
P + 1 (the decode worker), with the standard library's HTTP server
(kvpull.metrics.serve()); each worker reads its own endpoint once its
requests are done and checks that it counted them.

Exit status: 0 when every byte checked and every request was released, 1
on failure, 2 for bad usage, 77 without an RDMA device (a skip for
scripts/rxe-vm.sh). `pair` prints "1 passed, 0 failed" or "0 passed, 1
failed" last, as examples/run-pair.sh does.
"""
import argparse
import base64
import errno
import json
import os
import selectors
import socket
import subprocess
import sys
import threading
import time
import urllib.request

import numpy as np

try:
    import kvpull
except ImportError:                      # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(
        __file__)), ".."))
    import kvpull
import kvpull.metrics                   # noqa: E402

MODEL = "llama-3.1-8b"
LAYERS = 4                # cut from 32 to keep the caches small
BLOCK = 16                # tokens per block (both engines)
NUM_BLOCKS = 64           # blocks per KV cache tensor
KV_LAYOUT = "flash_hnd"
PREFILL_TP, DECODE_TP = 2, 1
PREFILL_ENGINE = 0x50524546     # engine ids, as the scheduler knows them
DECODE_ENGINE = 0x4445434F
# The requests: (id, prompt tokens, decode-side prefix-cache hit in blocks)
REQUESTS = [(1001, 100, 0), (1002, 37, 0), (1003, 256, 2), (1004, 161, 0)]
BACKGROUND = 0xB0B0       # what the decode cache holds before any pull
EXIT_SKIP = 77
HEAD_DIM = kvpull.Model.preset(MODEL).head_dim


def log(who, msg):
    print("%s: %s" % (who, msg), flush=True)


def blocks_of(tokens):
    return -(-tokens // BLOCK)


# ---- the KV cache of one rank -----------------------------------------------


def kv_values(req, layer, kv, head0, heads, tok0):
    """The pattern of one block page (heads, BLOCK, head_dim) in HND order:
    each element names its request, layer, K (0) or V (1), global head,
    token position in the sequence and dim (16-bit mix, bf16-sized)."""
    u = np.uint64
    h = np.arange(head0, head0 + heads, dtype=u)[:, None, None]
    t = np.arange(tok0, tok0 + BLOCK, dtype=u)[None, :, None]
    d = np.arange(HEAD_DIM, dtype=u)[None, None, :]
    x = (u(req) * u(0x9E3779B1) + u(layer) * u(0x85EBCA77) +
         u(kv) * u(0xC2B2AE3D)) + h * u(0x27D4EB2F) + t * u(0x165667B1) + \
        d * u(0x2545F491)
    x ^= x >> u(29)
    return (x & u(0xFFFF)).astype(np.uint16)


class KVCache:
    """One rank's KV cache as the serving engine holds it, and which
    layout region each tensor is."""

    def __init__(self, layout):
        d = layout.to_dict()
        heads = set()
        regions = {}
        for f in d["fields"]:
            v = d["views"][f["view"]]
            dims = {x["axis"]: x for x in f["dims"]}
            heads.add((f["shard_start"] or 0, dims["head"]["size"]))
            regions[v["region"]] = (v["layer"], {"k": 0, "v": 1}[f["kind"]],
                                    v, dims)
        assert len(heads) == 1, heads
        self.head0, self.heads = heads.pop()
        # per layer: memory (2, num_blocks, heads, block, head_dim) ...
        self.mem = [np.zeros((2, NUM_BLOCKS, self.heads, BLOCK, HEAD_DIM),
                             np.uint16) for _ in range(LAYERS)]
        # ... and vLLM's logical view (2, num_blocks, block, heads, dim)
        self.kv_caches = [m.transpose(0, 1, 3, 2, 4) for m in self.mem]
        self.regions = []
        for r in range(len(regions)):
            layer, kv, view, dims = regions[r]
            t = self.mem[layer][kv]          # one contiguous tensor
            # the layout describes exactly this tensor
            assert layout.region_size(r) == t.nbytes, r
            assert view["stride"] == t.strides[0], r
            assert view["num_blocks"] == NUM_BLOCKS, r
            for axis, size, stride in (("head", self.heads, t.strides[1]),
                                       ("token", BLOCK, t.strides[2]),
                                       ("dim", HEAD_DIM, t.strides[3])):
                assert (dims[axis]["size"], dims[axis]["stride"]) == \
                    (size, stride), (r, axis)
            self.regions.append(t)

    def fill(self, req, layer, blocks):
        """Prefill: "compute" layer `layer` of request `req` into `blocks`
        (whole blocks: past the sequence too, with the same pattern)."""
        for kv in (0, 1):
            for j, b in enumerate(blocks):
                self.mem[layer][kv][b] = kv_values(req, layer, kv, self.head0,
                                                   self.heads, j * BLOCK)


def build_layout(tp_size, tp_rank, engine_id):
    model = kvpull.Model.preset(MODEL).replace(layers=LAYERS)
    return kvpull.Layout.build(model, tp_size=tp_size, tp_rank=tp_rank,
                               engine_id=engine_id, block_tokens=BLOCK,
                               num_blocks=NUM_BLOCKS, kv_layout=KV_LAYOUT)


def expect_pulled(expected, heads, req, local, hit):
    """What the decode worker's blocks `local` must hold once request
    `req` is pulled: the sequence's blocks hit, hit + 1, ... (the local ids
    cover the tail of the sequence), every head."""
    for j, b in enumerate(local):
        for layer in range(LAYERS):
            for kv in (0, 1):
                expected[layer][kv][b] = kv_values(req, layer, kv, 0, heads,
                                                   (hit + j) * BLOCK)


def wrong_bytes(cache, expected):
    """Bytes of the whole cache that differ from what is expected."""
    bad = 0
    for m, x in zip(cache.mem, expected):
        diff = m.view(np.uint8) != x.view(np.uint8)
        bad += int(np.count_nonzero(diff))
    return bad


def open_agent(who, layout, role, **attrs):
    secret = os.environ.get("KVPULL_SECRET")
    if secret:
        attrs["secret"] = secret.encode()
    try:
        return kvpull.Agent(layout, role, max_peers=8, **attrs)
    except kvpull.Error as e:
        if e.code == -errno.ENODEV:
            log(who, "no RDMA device (%s): skipped" % e)
            sys.exit(EXIT_SKIP)
        raise


# ---- the side channel and the loop ------------------------------------------


class Channel:
    """JSON lines over a TCP socket (non-blocking reads)."""

    def __init__(self, sock):
        self.sock = sock
        sock.setblocking(False)
        self.buf = b""
        self.msgs = []
        self.eof = False

    def send(self, obj):
        self.sock.setblocking(True)
        try:
            self.sock.sendall((json.dumps(obj) + "\n").encode())
        finally:
            self.sock.setblocking(False)

    def pump(self):
        while True:
            try:
                data = self.sock.recv(1 << 16)
            except (BlockingIOError, InterruptedError):
                break
            if not data:
                self.eof = True
                break
            self.buf += data
        while b"\n" in self.buf:
            line, self.buf = self.buf.split(b"\n", 1)
            self.msgs.append(json.loads(line))

    def take(self):
        self.pump()
        msgs, self.msgs = self.msgs, []
        return msgs


class Loop:
    """An engine's wait: every agent polled; when nothing came, sleep on the
    agents' descriptors and the sockets until one is readable or an agent's
    timer is due (agent.arm()), at most `cap` seconds."""

    def __init__(self, agents, timeout):
        self.agents = agents
        self.sel = selectors.DefaultSelector()
        for a in agents:
            self.sel.register(a, selectors.EVENT_READ)
        self.deadline = time.monotonic() + timeout

    def watch(self, sock):
        self.sel.register(sock, selectors.EVENT_READ)

    def step(self, cap=0.05):
        """Returns [(agent index, kvpull.Event)]."""
        evs = []
        for i, a in enumerate(self.agents):
            evs += [(i, e) for e in a.poll(64)]
        if evs:
            return evs
        if time.monotonic() > self.deadline:
            raise TimeoutError("no progress before the deadline")
        wait = cap
        for a in self.agents:
            ready, wake = a.arm()
            if ready:
                return evs              # something waits: poll again now
            if wake is not None:
                wait = min(wait, max(wake - time.monotonic_ns(), 0) / 1e9)
        self.sel.select(wait)
        return evs


# ---- the prefill worker (TP 2) ----------------------------------------------


def serve_metrics(who, agents, args, offset):
    """The agents' /metrics on --metrics-port + offset (None without
    it)."""
    port = getattr(args, "metrics_port", 0)
    if not port:
        return None
    port += offset
    srv = kvpull.metrics.serve(agents, (args.ctrl_addr, port))
    log(who, "metrics at http://%s:%d/metrics" % (args.ctrl_addr, port))
    return srv


def check_metrics(who, srv, family, want, label=None):
    """Reads srv's /metrics (what a Prometheus scrape gets) and checks
    that `family`'s samples (those with `label`, a (name, value) pair)
    sum to `want`; closes srv."""
    if srv is None:
        return True
    url = "http://%s:%d/metrics" % srv.server_address[:2]
    with urllib.request.urlopen(url, timeout=10) as r:
        text = r.read().decode()
    srv.shutdown()
    srv.server_close()
    samples = kvpull.metrics.parse_text(text)
    got = sum(v for lab, v in samples.get(family, [])
              if label is None or lab.get(label[0]) == label[1])
    log(who, "/metrics: %d series, %s%s %d (want %d)" % (
        sum(len(v) for v in samples.values()), family,
        "{%s=%r}" % label if label else "", got, want))
    return got == want


def run_prefill(args):
    who = "prefill"
    ranks = []
    for r in range(PREFILL_TP):
        layout = build_layout(PREFILL_TP, r, PREFILL_ENGINE)
        cache = KVCache(layout)
        agent = open_agent(who, layout, "producer", addr=args.addr)
        agent.register_all(cache.regions)    # numpy arrays, kept referenced
        agent.listen(args.addr, args.port + r)
        ranks.append((layout, cache, agent))
        log(who, "rank %d: heads %d-%d, %d regions registered, listening on "
            "%s port %d" % (r, cache.head0, cache.head0 + cache.heads - 1,
                            len(cache.regions), args.addr, args.port + r))
    agents = [a for _, _, a in ranks]
    msrv = serve_metrics(who, agents, args, 0)
    loop = Loop(agents, args.timeout)
    srv = socket.create_server((args.ctrl_addr, args.ctrl_port))
    srv.setblocking(False)
    loop.watch(srv)
    log(who, "ready: side channel on %s port %d"
        % (args.ctrl_addr, args.ctrl_port))
    conn = None
    while conn is None:                 # keep polling: handshakes run there
        loop.step()
        try:
            conn, _ = srv.accept()
        except BlockingIOError:
            pass
    ch = Channel(conn)
    loop.watch(conn)
    msgs = []
    while not msgs:
        loop.step()
        msgs = ch.take()
        if ch.eof and not msgs:
            raise RuntimeError("the decode worker left")
    hello = msgs[0]
    consumer = hello["engine_id"]
    log(who, "decode engine %#x connected to the side channel" % consumer)
    # what a connector's handshake hands the other side: every rank's
    # address and blob (addresses and rkeys of its registered memory)
    ch.send({"engine_id": PREFILL_ENGINE, "tp_size": PREFILL_TP,
             "ranks": [{"addr": args.addr, "port": args.port + r,
                        "meta": base64.b64encode(a.meta()).decode()}
                       for r, a in enumerate(agents)]})

    rng = np.random.default_rng(22)
    free = list(rng.permutation(NUM_BLOCKS))
    released = [set() for _ in agents]
    for req, tokens, _hit in REQUESTS:
        blocks = [int(free.pop()) for _ in range(blocks_of(tokens))]
        for a in agents:                # blocks held until RELEASED
            a.expect(consumer, req, timeout=args.timeout)
        if args.stream:
            # the decode side starts pulling now; each layer is published
            # as soon as it is "computed"
            ch.send({"req_id": req, "tokens": tokens,
                     "remote_block_ids": blocks})
            for layer in range(LAYERS):
                for (_l, cache, a) in ranks:
                    cache.fill(req, layer, blocks)
                    a.publish(consumer, req,
                              (0, kvpull.TOKENS_END, layer + 1))
                for i, e in loop.step(0):
                    _prefill_event(who, e, i, released)
            for (_l, _c, a) in ranks:
                a.publish(consumer, req, (kvpull.TOKENS_END,
                                          kvpull.TOKENS_END, LAYERS))
        else:
            for layer in range(LAYERS):
                for (_l, cache, _a) in ranks:
                    cache.fill(req, layer, blocks)
            ch.send({"req_id": req, "tokens": tokens,
                     "remote_block_ids": blocks})
        log(who, "request %d: %d tokens in blocks %s" % (req, tokens,
                                                          blocks))
    ch.send({"done": True})
    result = None
    want = {r for r, _t, _h in REQUESTS}
    while result is None or any(s != want for s in released):
        for i, e in loop.step():
            _prefill_event(who, e, i, released)
        for m in ch.take():
            if "result" in m:
                result = m
        if ch.eof and result is None:
            raise RuntimeError("the decode worker left without a result")
    # every rank released every request
    mok = check_metrics(who, msrv, "kvpull_requests_reported_total",
                        len(REQUESTS) * len(agents), ("outcome", "released"))
    for r, a in enumerate(agents):
        st = a.stats()
        log(who, "rank %d: %d released, %d notifications, %d connects, "
            "%d progress writes" % (r, st.released, st.notes_recv,
                                    st.connects, st.progress_writes))
        a.close()
    ok = result["result"] == "ok" and mok
    log(who, "every request released by both ranks; decode says %s"
        % result["result"])
    return 0 if ok else 1


def _prefill_event(who, e, rank, released):
    if e.type == kvpull.EventType.RELEASED:
        released[rank].add(e.req_id)
    elif e.type == kvpull.EventType.EXPIRED:
        raise RuntimeError("rank %d: request %d expired (%s)"
                           % (rank, e.req_id, e.reason))
    elif e.type == kvpull.EventType.DISCONNECTED:
        log(who, "rank %d: %r" % (rank, e))


# ---- the decode worker (TP 1) -----------------------------------------------


def run_decode(args):
    who = "decode"
    layout = build_layout(DECODE_TP, 0, DECODE_ENGINE)
    cache = KVCache(layout)
    for m in cache.mem:
        m[...] = BACKGROUND
    expected = [m.copy() for m in cache.mem]
    agent = open_agent(who, layout, "consumer", addr=args.decode_addr,
                       max_ids=64, max_inflight=16,
                       stream_events=1 if args.stream else 0)
    agent.register_all(cache.regions)
    msrv = serve_metrics(who, [agent], args, 1)
    loop = Loop([agent], args.timeout)

    end = time.monotonic() + 30
    while True:
        try:
            sock = socket.create_connection((args.ctrl_addr,
                                             args.ctrl_port), timeout=5)
            break
        except OSError:
            if time.monotonic() > end:
                raise
            time.sleep(0.2)
    ch = Channel(sock)
    loop.watch(sock)
    ch.send({"engine_id": DECODE_ENGINE})
    msgs = []
    while not msgs:
        loop.step()
        msgs = ch.take()
        if ch.eof and not msgs:
            raise RuntimeError("the prefill worker left")
    info, pending = msgs[0], msgs[1:]
    peers = [(r["addr"], r["port"], base64.b64decode(r["meta"]))
             for r in info["ranks"]]
    engine = agent.add_engine(peers, timeout_ms=int(args.timeout * 1000))
    up = False
    while not up:
        for _i, e in loop.step():
            if e.type == kvpull.EventType.ENGINE_UP:
                up = True
            elif e.type == kvpull.EventType.ENGINE_DOWN:
                raise e.error
        pending += ch.take()
    plan = agent.plan(engine)
    pi = plan.info
    log(who, "prefill engine %#x up (handle %d): the plan reads from ranks "
        "%s, %d streams, max_sge %d" % (info["engine_id"], engine,
                                        plan.sources, pi.nstreams,
                                        pi.max_sge))
    rng = np.random.default_rng(1)
    free = list(rng.permutation(NUM_BLOCKS))
    hits = {r: h for r, _t, h in REQUESTS}
    todo = list(pending)
    done, arrived, moved, pulled = set(), {}, 0, 0
    while len(done) < len(REQUESTS):
        for m in todo:
            if m.get("done"):
                continue
            req, tokens = m["req_id"], m["tokens"]
            remote = np.array(m["remote_block_ids"], np.uint32)
            hit = hits[req]
            # a prefix-cache hit: the first `hit` blocks are ours already;
            # the local ids cover the tail of the sequence
            local = np.array([free.pop() for _ in range(len(remote) - hit)],
                             np.uint32)
            ids = [(local, remote, tokens)]
            while True:
                try:
                    if args.stream:
                        agent.pull_stream(engine, req, ids)
                    else:
                        agent.pull_from(engine, req, ids)
                    break
                except kvpull.Error as e:
                    if e.code not in (-errno.EBUSY, -errno.EAGAIN):
                        raise
                    moved += _decode_events(loop.step(), done, arrived)
            pulled += len(local)
            expect_pulled(expected, cache.heads, req, local, hit)
        moved += _decode_events(loop.step(), done, arrived)
        todo = ch.take()
        if ch.eof and len(done) < len(REQUESTS):
            raise RuntimeError("the prefill worker left")
    # every byte of the cache: the pulled blocks and all the others
    bad = wrong_bytes(cache, expected)
    total = sum(m.nbytes for m in cache.mem)
    per_block = sum(t[0].nbytes for t in cache.regions)
    ok = bad == 0
    if not args.stream and moved != pulled * per_block:
        log(who, "DONE events say %d bytes, %d blocks of %d bytes were "
            "pulled" % (moved, pulled, per_block))
        ok = False
    st = agent.stats()
    log(who, "%d requests done, %d blocks (%d bytes) pulled in %d READs; "
        "%d of %d bytes of the cache wrong%s" % (
            len(done), pulled, pulled * per_block, st.reads, bad, total,
            "; ARRIVED layers %s" % {r: arrived.get(r, []) for r in done}
            if args.stream else ""))
    if ok:
        log(who, "every byte checked: %d bytes in %d layers x K,V, TP %d "
            "-> TP %d" % (total, LAYERS, PREFILL_TP, DECODE_TP))
    # every pull counted once in the pull histogram
    if not check_metrics(who, msrv, "kvpull_pull_duration_seconds_count",
                         len(REQUESTS)):
        ok = False
    ch.send({"result": "ok" if ok else "%d bad bytes" % bad})
    plan.close()
    agent.close()                       # sends the notifications it owes
    return 0 if ok else 1


def _decode_events(evs, done, arrived):
    moved = 0
    for _i, e in evs:
        if e.type == kvpull.EventType.DONE:
            done.add(e.req_id)
            moved += e.bytes
        elif e.type == kvpull.EventType.ARRIVED:
            arrived.setdefault(e.req_id, []).append(e.layers)
        elif e.type in (kvpull.EventType.FAILED,
                        kvpull.EventType.ENGINE_DOWN):
            raise RuntimeError("%r: %s" % (e, e.error))
    return moved


# ---- both -------------------------------------------------------------------


def run_pair(args):
    me = [sys.executable, os.path.abspath(__file__)]
    common = ["--addr", args.addr, "--decode-addr", args.decode_addr,
              "--port", str(args.port), "--ctrl-addr", args.ctrl_addr,
              "--ctrl-port", str(args.ctrl_port), "--timeout",
              str(args.timeout)] + (["--stream"] if args.stream else []) + \
        (["--metrics-port", str(args.metrics_port)]
         if args.metrics_port else [])
    prod = subprocess.Popen(me + ["prefill"] + common, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    lines = []
    ready = threading.Event()

    def read():                         # the prefill's output, as it comes
        for line in prod.stdout:
            lines.append(line)
            if "ready:" in line:
                ready.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    end = time.monotonic() + 60
    while not ready.wait(0.2):
        if time.monotonic() > end or prod.poll() is not None:
            break
    if not ready.is_set():
        prod.kill()
        prod.wait()
        reader.join(5)
        sys.stdout.write("".join(lines))
        if prod.returncode == EXIT_SKIP:
            print("connector.py: skipped (no RDMA device)")
            return EXIT_SKIP
        print("connector.py: the prefill worker did not get ready")
        print("0 passed, 1 failed")
        return 1
    try:
        cons = subprocess.run(me + ["decode"] + common, capture_output=True,
                              text=True, timeout=args.timeout + 30)
        crc, cout = cons.returncode, cons.stdout + cons.stderr
    except subprocess.TimeoutExpired as e:
        crc, cout = 1, "%s\ndecode: timed out\n" % (e.stdout or "")
    try:
        prod.wait(timeout=args.timeout)
    except subprocess.TimeoutExpired:
        prod.kill()
        prod.wait()
    reader.join(10)
    sys.stdout.write("".join(lines))
    sys.stdout.write(cout)
    print("connector.py: prefill exit %d, decode exit %d"
          % (prod.returncode, crc))
    ok = prod.returncode == 0 and crc == 0
    print("1 passed, 0 failed" if ok else "0 passed, 1 failed")
    return 0 if ok else 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("role", choices=("pair", "prefill", "decode"))
    p.add_argument("--addr", default=os.environ.get("KVP_ADDR0"),
                   help="RDMA device address [$KVP_ADDR0]")
    p.add_argument("--decode-addr", default=None,
                   help="the decode worker's device address [--addr]")
    p.add_argument("--port", type=int, default=18950,
                   help="prefill rank r listens on PORT + r [18950]")
    p.add_argument("--ctrl-addr", default="127.0.0.1",
                   help="side channel address [127.0.0.1]")
    p.add_argument("--ctrl-port", type=int, default=18960,
                   help="side channel port [18960]")
    p.add_argument("--timeout", type=float, default=120,
                   help="seconds each worker may take [120]")
    p.add_argument("--stream", action="store_true",
                   help="pull each request while it is being prefilled")
    p.add_argument("--metrics-port", type=int, default=0,
                   help="serve /metrics on this port (prefill) and the "
                   "next (decode) [0: none]")
    args = p.parse_args()
    if not args.addr:
        p.error("no address: give --addr or set KVP_ADDR0")
    args.decode_addr = args.decode_addr or args.addr
    try:
        if args.role == "pair":
            return run_pair(args)
        if args.role == "prefill":
            return run_prefill(args)
        return run_decode(args)
    except (kvpull.Error, RuntimeError, TimeoutError, AssertionError) as e:
        log(args.role, "failed: %r" % (e,))
        return 1


if __name__ == "__main__":
    sys.exit(main())
