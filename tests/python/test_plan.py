# SPDX-License-Identifier: MIT
"""Plans: compile, inspection, dumps and emission, pinned against what
kvpull-plan prints for the same engines and request (its --json document
and its summary), and the errors with their exact codes and lines."""
import array
import ctypes
import errno
import gc

import numpy as np
import pytest

from conftest import layouts, run_tool, tool_json

import kvpull
from kvpull import Error, Layout, Plan, Request

# (layouts() options, plan options, request options of kvpull-plan)
CASES = [
    (dict(model="llama-3.1-8b", remote_tp=2), {}, ["--request", 4]),
    (dict(model="llama-3.1-70b", local_tp=2, remote_tp=8), {},
     ["--request", 40]),
    (dict(model="llama-3.1-70b", local_tp=2, rank=1, remote_tp=8),
     dict(max_sge=4, max_read=1 << 20), ["--request", 70, "--hit", 3]),
    (dict(model="llama-3.1-8b", local_tp=4, rank=3, remote_tp=2,
          local_layout="flash_nhd", remote_layout="flashinfer",
          local_block=32, remote_kernel=8), {},
     ["--request", 7, "--hit", 1, "--tokens", 100]),
    (dict(model="qwen2.5-1.5b", local_tp=4, rank=2, remote_layout="packed"),
     dict(max_sge=1), ["--request", 5]),
    (dict(model="deepseek-v2-lite", remote_tp=2), dict(max_sge=2),
     ["--request", 3]),
    (dict(model="gemma-2-9b", local_tp=2, remote_tp=4), {},
     ["--request", 5, "--tokens", 70]),
    (dict(model="nemotron-h-8b", local_tp=2, rank=1, remote_tp=1), {},
     ["--remote-ids", "40-43", "--local-ids", "100-103",
      "--remote-ids", "1", "--local-ids", "2"]),
    (dict(model="qwen3-next-80b-a3b", remote_tp=4, local_conv="sd",
          remote_conv="sd", num_blocks=2048), dict(max_sge=3),
     ["--remote-ids", "600-601", "--local-ids", "600-601",
      "--remote-ids", "1", "--local-ids", "2"]),
    (dict(model="llama-3.1-8b", remote_tp=2), {},
     ["--local-ids", "4,9,10-13", "--remote-ids", "0-5"]),
]


def _id(case):
    cfg, opts, req = case
    return "-".join([cfg["model"]] + ["%s%s" % (k[:5], v) for k, v in
                                      list(cfg.items())[1:] +
                                      list(opts.items())] +
                    [str(x).lstrip("-")[:8] for x in req])


def compile_case(cfg, opts):
    """The layouts, the plan as kvpull-plan compiles it (an agent's
    attributes: max_sge 16 and READs up to 2^31 unless given), and the
    tool's options."""
    loc, rem, args = layouts(**cfg)
    plan = Plan.compile(loc, rem, max_sge=opts.get("max_sge", 16),
                        max_len=opts.get("max_read", 1 << 31))
    if "max_sge" in opts:
        args += ["--max-sge", opts["max_sge"]]
    if "max_read" in opts:
        args += ["--max-read", opts["max_read"]]
    return loc, rem, plan, args


def tool_request(doc, req_opts):
    """The request kvpull-plan emitted: its ids per group, and the tokens
    it passed (--tokens, else 0)."""
    tokens = 0
    if "--tokens" in req_opts:
        tokens = req_opts[req_opts.index("--tokens") + 1]
    return Request([(np.array(g["local_ids"], np.uint32),
                     np.array(g["remote_ids"], np.uint32), tokens)
                    for g in doc["request"]["groups"]])


def plan_section(text):
    """The summary from its "plan:" line to the end of the group tables."""
    start = text.index("\nplan: ") + 1
    end = text.find("\nrequest:\n")
    return text[start:] if end < 0 else text[start:end]


def reads_section(text):
    """The READs table of the summary's request."""
    start = text.index("  READs: src = producer rank")
    start = text.index("\n", start) + 1
    return text[start:text.index("  total: ", start)]


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_plan_and_emission_match_tool(case):
    cfg, opts, req_opts = case
    loc, rem, plan, args = compile_case(cfg, opts)
    doc = tool_json(*args, *req_opts)
    # the plan, member by member
    assert plan.to_dict() == doc["plan"]
    assert plan.notify_expected() == doc["notify_expected"]
    # the request's READs, record by record
    req = tool_request(doc, req_opts)
    em = plan.emit(req)
    assert em.to_list() == doc["request"]["wrs"]
    assert em.nbytes == doc["request"]["bytes"]
    assert len(em.sges) == sum(w["nsge"] for w in
                               (dict(zip(kvpull.WR_DTYPE.names, r))
                                for r in em.wrs.tolist()))
    # src_end: one past each source's last WR, sources in order
    ends = [0] + em.src_end.tolist()
    for s in range(plan.info.nsrc):
        assert (em.wrs["src"][ends[s]:ends[s + 1]] == s).all()
    assert ends[-1] == len(em.wrs)
    # the summary: plan section and READs table, same bytes
    text = run_tool(*args, *req_opts)[1]
    assert plan.dump() == plan_section(text)
    assert em.dump() == reads_section(text)
    brief = run_tool("--brief", *args, *req_opts)[1]
    assert plan.dump(brief=True) == plan_section(brief)
    plan.close()


def test_bench_pair_values():
    """The pair of bench_emit.py and kvpull-bench, pinned."""
    loc, rem, _ = layouts("llama-3.1-70b", local_tp=2, remote_tp=8,
                          num_blocks=100000)
    with Plan.compile(loc, rem, max_sge=16, max_len=0) as plan:
        i = plan.info
        assert (i.ngroups, i.nsrc, i.nnotify, i.nstreams, i.npieces,
                i.local_tp, i.local_rank, i.remote_tp, i.max_sge,
                i.max_len, i.bytes) == (1, 4, 4, 640, 8, 2, 0, 8, 16,
                                        1 << 31, 16176)
        assert plan.sources == [0, 1, 2, 3] == plan.notify_ranks
        assert plan.emit_bound(1000) == (641280, 641280)
        ids = np.arange(1000, 1128, dtype=np.uint32)
        wrs, sges = plan.emit([(ids, ids + 4000)])
        # 640 streams x 128 blocks, 16 SGEs (blocks) per READ
        assert (len(wrs), len(sges)) == (5120, 81920)
        assert (wrs["len"] == 16 * 4096).all() and (wrs["nsge"] == 16).all()
        assert (sges["len"] == 4096).all()
        # remote pages of 1 head (4 KiB), local pages of 4 heads (16 KiB)
        assert wrs[0].tolist() == (5000 * 4096, 65536, 0, 0, 0, 16, 0)
        assert sges[:2].tolist() == [(1000 * 16384, 4096, 0),
                                     (1001 * 16384, 4096, 0)]


def test_plan_getters(llama8b_pair):
    loc, rem = llama8b_pair
    plan = Plan.compile(loc, rem, max_sge=16)
    assert plan.ngroups == 1 and len(plan.groups) == 1
    g = plan.group(0)
    assert (g.kind, g.local_tokens, g.remote_tokens, g.period_tokens,
            g.local_blocks, g.src_mask) == (0, 16, 16, 16, 1024, 3)
    st = plan.stream(1)
    assert (st.src, st.local_view, st.remote_view, st.npieces,
            st.bytes_per_period, st.layer) == (0, 1, 1, 1, 16384, 0)
    assert plan.piece(1).to_dict() == dict(
        remote_offset=0, local_offset=16384, len=16384, remote_block=0,
        local_block=0)
    assert plan.stream_gather(0) == 1
    assert (plan.source(1), plan.notify(1)) == (1, 1)
    assert plan.serves(0, 1)
    for get in (plan.source, plan.notify, plan.group, plan.stream,
                plan.piece, plan.stream_gather):
        with pytest.raises(Error) as ei:
            get(1000)
        assert ei.value.code == -errno.EINVAL
    assert len(plan.streams) == 128 and len(plan.pieces) == 4
    assert repr(plan) == ("<kvpull.Plan consumer rank 0 of TP 1 <- TP 2: "
                          "1 groups, 2 sources, 128 streams, 4 pieces>")
    assert plan.to_json().startswith('{"info": {"ngroups": 1, "nsrc": 2')


# ---- ranges and windows --------------------------------------------------

RANGE_CASES = [
    (dict(model="llama-3.1-8b", remote_tp=2), ["--request", 4], "3:10",
     (3, 10, 0, kvpull.TOKENS_END)),
    (dict(model="llama-3.1-8b", remote_tp=2), ["--request", 6],
     "0:32:16:48", (0, 32, 16, 48)),
    (dict(model="nemotron-h-8b", remote_tp=2),
     ["--remote-ids", "40-43", "--local-ids", "100-103",
      "--remote-ids", "1", "--local-ids", "2"], "0:28:0:end",
     (0, 28, 0, kvpull.TOKENS_END)),
]


@pytest.mark.parametrize("cfg,req_opts,spec,rng", RANGE_CASES)
def test_emit_range_matches_tool(cfg, req_opts, spec, rng):
    loc, rem, plan, args = compile_case(cfg, {})
    doc = tool_json(*args, *req_opts, "--range", spec)
    req = tool_request(doc, req_opts)
    em = plan.emit_range(req, kvpull.emit_range(*rng))
    assert em.to_list() == doc["request"]["wrs"]
    assert em.nbytes == doc["request"]["bytes"]
    text = run_tool(*args, *req_opts, "--range", spec)[1]
    assert em.dump() == reads_section(text)


def _merged(intervals):
    """(region, start, end) intervals, adjacent ones merged, in order."""
    out = []
    for r, a, b in intervals:
        if out and out[-1][0] == r and out[-1][2] == a:
            out[-1][2] = b
        else:
            out.append([r, a, b])
    return out


def _remote(wrs):
    return _merged((int(w["region"]), int(w["offset"]),
                    int(w["offset"]) + int(w["len"])) for w in wrs)


def _local(sges):
    return _merged((int(s["region"]), int(s["offset"]),
                    int(s["offset"]) + int(s["len"])) for s in sges)


def test_windows_cover_the_emission():
    loc, rem, _ = layouts("llama-3.1-70b", local_tp=2, remote_tp=8)
    plan = Plan.compile(loc, rem, max_sge=16)
    ids = np.arange(0, 37, dtype=np.uint32)
    req = Request([(ids, ids + 100)])
    em = plan.emit(req)
    ends = [0] + em.src_end.tolist()
    for s in range(plan.info.nsrc):
        part = em.wrs[ends[s]:ends[s + 1]]
        base = int(part[0]["sge_first"])
        psge = em.sges[base:base + int(part["nsge"].sum())]
        # large windows: exactly emit()'s WRs and SGEs for the source
        wins = list(plan.windows(req, s, wr_cap=100000, sge_cap=1000000))
        assert len(wins) == 1
        w = wins[0].wrs.copy()
        assert (w["sge_first"] == part["sge_first"] - base).all()
        for name in ("offset", "len", "region", "src", "nsge", "group"):
            assert (w[name] == part[name]).all()
        assert (wins[0].sges == psge).all()
        assert wins[0].bytes == int(part["len"].sum())
        # small windows: the same bytes, remote and local, in order
        rw, rs, total = [], [], 0
        for win in plan.windows(req, s, wr_cap=7, sge_cap=20):
            assert len(win.wrs) <= 7 and len(win.sges) <= 20
            rw.extend(win.wrs.copy())
            rs.extend(win.sges.copy())
            total += win.bytes
        assert total == wins[0].bytes
        assert _remote(rw) == _remote(part) and _local(rs) == _local(psge)


def test_emit_positions():
    loc, rem, _ = layouts("llama-3.1-8b", remote_tp=2)
    plan = Plan.compile(loc, rem, max_sge=4)
    ids = np.arange(8, dtype=np.uint32)
    req = plan.request([(ids, ids)])
    pos = plan.emit_start(req, 1)
    assert not pos.done and pos.src == 1
    saved = pos.copy()
    wr = np.zeros(3, kvpull.WR_DTYPE)
    sge = np.zeros(12, kvpull.SGE_DTYPE)
    w1 = plan.emit_window(req, pos, wr, sge)
    assert len(w1.wrs) == 3 and pos != saved
    assert (w1.wrs["src"] == 1).all()
    assert kvpull.EmitPos().done            # a zeroed position is finished
    with pytest.raises(Error) as ei:
        plan.emit_start(req, 2)             # two sources
    assert ei.value.code == -errno.EINVAL
    empty = plan.emit_range(req, kvpull.emit_range(40, 50))   # no layer 40
    assert len(empty) == 0 and empty.src_end.tolist() == [0, 0]


def test_progress_ranges():
    r = kvpull.progress_ranges(None, (0, 32, 4))
    assert [x.to_dict() for x in r] == [dict(
        layer0=0, layer1=4, tok0=0, tok1=32, comp_mask=0, pad=0)]
    r = kvpull.progress_ranges((0, 32, 4), (32, 64, 2))
    assert [(x.layer0, x.layer1, x.tok0, x.tok1) for x in r] == [
        (0, 2, 32, 64), (4, 0xFFFFFFFF, 0, 32)]
    end = kvpull.TOKENS_END
    r = kvpull.progress_ranges(kvpull.Progress(tokens_cur=32, layers_cur=4),
                               (end, end))
    assert [(x.layer0, x.layer1, x.tok0, x.tok1) for x in r] == [
        (0, 4, 32, end), (4, 0xFFFFFFFF, 0, end)]
    assert kvpull.progress_ranges((8, 8), (8, 8)) == []
    for a, b, code in (((5, 4), (6, 6), -errno.EINVAL),
                       ((0, 32, 4), (0, 16, 4), -errno.ERANGE)):
        with pytest.raises(Error) as ei:
            kvpull.progress_ranges(a, b)
        assert (ei.value.code, ei.value.func) == (code,
                                                  "kvp_progress_ranges")


# ---- sinks -----------------------------------------------------------------

# struct ibv_send_wr's offsets on x86-64 (wr_id, next, sg_list, num_sge,
# opcode, send_flags, imm, then rdma.remote_addr, rdma.rkey)
IBV = dict(off_wr_id=0, off_sg_list=16, off_num_sge=24, off_remote_addr=40,
           off_rkey=48)


def test_emit_window_into_sink():
    loc, rem, _ = layouts("llama-3.1-8b", remote_tp=2)
    plan = Plan.compile(loc, rem, max_sge=4)
    ids = np.arange(10, dtype=np.uint32)
    req = Request([(ids, ids + 3)])
    nreg = loc.info.nregions
    lmaps = [(0x100000000 * (r + 1), 1000 + r) for r in range(nreg)]
    rmaps = [kvpull.RegionMap(0x7000000000 + (r << 28), [2000 + r])
             for r in range(rem.info.nregions)]
    recs = np.zeros((50, 64), np.uint8)
    sge = np.zeros(200, kvpull.EMIT_SGE_DTYPE)
    sink = kvpull.EmitSink(recs, 64, sge=sge, local=lmaps, remote=rmaps,
                           wr_id=0xabcdef, **IBV)
    assert (sink.wr_cap, sink.sge_cap) == (50, 200)
    pos = plan.emit_start(req, 0)
    ref_pos = pos.copy()
    n, nsge, nbytes = plan.emit_window_into(req, pos, sink)
    ref = plan.emit_window(req, ref_pos, np.zeros(50, kvpull.WR_DTYPE),
                           np.zeros(200, kvpull.SGE_DTYPE))
    assert pos == ref_pos
    assert (n, nsge, nbytes) == (len(ref.wrs), len(ref.sges), ref.bytes)
    r = sink.records(n)
    f = lambda off, t: r[:, off:off + np.dtype(t).itemsize].copy().view(t)[:, 0]  # noqa
    assert (f(0, np.uint64) == 0xabcdef).all()
    sge_addr = sge.ctypes.data
    assert (f(16, np.uint64) == sge_addr + 16 * ref.wrs["sge_first"]).all()
    assert (f(24, np.int32) == ref.wrs["nsge"]).all()
    def raddr_of(wrs):
        addrs = np.array([m.addr for m in rmaps], np.uint64)
        return addrs[wrs["region"]] + wrs["offset"]
    assert (f(40, np.uint64) == raddr_of(ref.wrs)).all()
    assert (f(48, np.uint32) == 2000 + ref.wrs["region"]).all()
    assert (f(28, np.uint32) == 0).all()        # opcode: the caller's
    s = sge[:nsge]
    assert (s["addr"] == 0x100000000 * (ref.sges["region"] + 1) +
            ref.sges["offset"]).all()
    assert (s["length"] == ref.sges["len"]).all()
    assert (s["key"] == 1000 + ref.sges["region"]).all()
    # a range: the same READs as emit_window() with that range
    rng = kvpull.emit_range(2, 5)
    pos, ref_pos = plan.emit_start(req, 1, rng), plan.emit_start(req, 1, rng)
    n, nsge, nbytes = plan.emit_window_into(req, pos, sink, wr_cap=4,
                                            range=rng)
    ref = plan.emit_window(req, ref_pos, np.zeros(4, kvpull.WR_DTYPE),
                           np.zeros(200, kvpull.SGE_DTYPE), range=rng)
    assert (n, nsge, nbytes, pos) == (4, len(ref.sges), ref.bytes, ref_pos)
    r = sink.records(n)
    assert (f(40, np.uint64) == raddr_of(ref.wrs)).all()
    assert set(ref.wrs["region"].tolist()) <= set(range(4, 10))
    # caps above the sink, too few maps, too few keys: refused before C
    with pytest.raises(Error) as ei:
        plan.emit_window_into(req, pos, sink, wr_cap=51)
    assert ei.value.code == -errno.EINVAL
    short = kvpull.EmitSink(recs, 64, sge=sge, local=lmaps[:-1],
                            remote=rmaps, **IBV)
    with pytest.raises(Error) as ei:
        plan.emit_window_into(req, pos, short)
    assert ei.value.why == "63 local region maps for 64 regions"
    few = kvpull.EmitSink(recs, 64, sge=sge, local=[(0, [1], 20)] * nreg,
                          remote=rmaps, **IBV)
    with pytest.raises(Error) as ei:
        plan.emit_window_into(req, pos, few)
    assert ei.value.why == ("local region 0: 1 keys, its 33554432 bytes "
                            "need 32")
    bad = kvpull.EmitSink(recs, 30, sge=sge, local=lmaps, remote=rmaps,
                          **IBV)                # stride below 32
    with pytest.raises(Error) as ei:
        plan.emit_window_into(req, pos, bad)
    assert (ei.value.code, ei.value.func) == (-errno.EINVAL,
                                              "kvp_plan_emit_window_into")


# ---- errors ----------------------------------------------------------------


def test_compile_refusal_exact(tmp_path):
    a = ("engine tp_size=1\ngroup kind=full block_tokens=16\n"
         "region size=64K\n"
         "view group=0 region=0 layer=0 num_blocks=16 offset=0 stride=4K\n"
         "field view=0 kind=k elem=2 dims=token:16:256,dim:128:2\n")
    b = a.replace("kind=full", "kind=sliding")
    with pytest.raises(Error) as ei:
        Plan.compile(Layout.parse(a), Layout.parse(b))
    e = ei.value
    why = "group 0 kind differs: local full, remote sliding"
    assert (e.code, e.errno, e.why) == (-errno.EPROTO, errno.EPROTO, why)
    assert str(e) == ("kvp_plan_compile: malformed or incompatible peer "
                      "data: " + why)
    (tmp_path / "a.spec").write_text(a)
    (tmp_path / "b.spec").write_text(b)
    _, _, err = run_tool("--local-spec", tmp_path / "a.spec",
                         "--remote-spec", tmp_path / "b.spec", check=False)
    assert err == "kvpull-plan: cannot plan: %s: %s\n" % (e.strerror, why)
    with pytest.raises(Error) as ei:
        Plan.compile(Layout.build("llama-3.1-8b", tp_size=1,
                                  block_tokens=16, num_blocks=64),
                     Layout.build("qwen2.5-7b", tp_size=1, block_tokens=16,
                                  num_blocks=64))
    assert ei.value.why == ("group 0 layer 0 K: head extent differs: "
                            "local 8, remote 4")


def test_compile_bad_attributes(llama8b_pair):
    loc, rem = llama8b_pair
    for attr in (kvpull.PlanAttr(comp_mask=4),
                 kvpull.PlanAttr(comp_mask=kvpull.PLAN_ATTR_FLAGS, flags=2),
                 kvpull.PlanAttr(comp_mask=kvpull.PLAN_ATTR_MAX_LEN,
                                 max_len=(1 << 31) + 1)):
        with pytest.raises(Error) as ei:
            Plan.compile(loc, rem, attr)
        assert (ei.value.code, ei.value.why) == (-errno.EINVAL, None)
    with pytest.raises(Error) as ei:
        Plan.compile(loc, rem, max_len=(1 << 31) + 1)
    assert ei.value.code == -errno.EINVAL
    with pytest.raises(Error) as ei:
        Plan.compile(loc, rem, max_sge=-1)
    assert ei.value.why == "max_sge: -1 is not a uint32"
    with pytest.raises(TypeError):
        Plan.compile(loc, rem, kvpull.PlanAttr(), max_sge=2)
    with pytest.raises(TypeError):
        Plan.compile(loc, "remote")
    # the plan's attributes as given, and an agent's defaults
    p = Plan.compile(loc, rem, kvpull.PlanAttr(max_sge=0))
    assert (p.info.max_sge, p.info.max_len) == (1, 1 << 31)
    p = Plan.compile(loc, rem, max_sge=kvpull.DEFAULT_MAX_SGE,
                     max_len=1000)
    assert (p.info.max_sge, p.info.max_len) == (16, 1000)


def test_no_coalesce(llama8b_pair):
    loc, rem = llama8b_pair
    ids = np.arange(6, dtype=np.uint32)
    doc = tool_json("--model", "llama-3.1-8b", "--remote-tp", 2,
                    "--request", 6)
    a = Plan.compile(loc, rem, max_sge=16).emit([(ids, ids)])
    b = Plan.compile(loc, rem, max_sge=16, no_coalesce=True).emit(
        [(ids, ids)])
    assert len(b.wrs) == doc["request"]["naive_wrs"] == 6 * 128
    assert (b.wrs["nsge"] == 1).all() and b.nbytes == a.nbytes
    assert len(a.wrs) == len(doc["request"]["wrs"]) == 128


def test_emit_errors_exact_and_nothing_written(llama8b_pair):
    loc, rem = llama8b_pair
    plan = Plan.compile(loc, rem, max_sge=16)
    wr = np.full(9 * 32, 0xAB, np.uint8).view(kvpull.WR_DTYPE)
    sge = np.full(18 * 16, 0xCD, np.uint8).view(kvpull.SGE_DTYPE)
    snap = (wr.copy(), sge.copy())
    ok = np.arange(4, dtype=np.uint32)
    cases = [
        ([(ok, np.array([0, 1, 2, 1024], np.uint32))], -errno.ERANGE,
         "block id out of range"),
        ([(ok, np.array([0, 1, 2, -1], np.int32))], -errno.ERANGE,
         "block id out of range"),
        ([(np.arange(5, dtype=np.uint32), ok)], -errno.EINVAL,
         "invalid argument"),                   # more local than remote
        ([(ok, ok)], -errno.ENOSPC, "no space (output arrays too small, "
         "or no free engine or connection slot)"),
    ]
    for ids, code, text in cases:
        with pytest.raises(Error) as ei:
            plan.emit(ids, out=(wr, sge))
        e = ei.value
        assert (e.code, e.strerror, e.func, e.why) == (code, text,
                                                       "kvp_plan_emit", None)
        assert str(e) == "kvp_plan_emit: " + text
        assert (wr.tobytes(), sge.tobytes()) == (snap[0].tobytes(),
                                                 snap[1].tobytes())
        if code != -errno.ENOSPC:
            with pytest.raises(Error) as ei:
                plan.emit_check(ids)
            assert ei.value.code == code
    plan.emit_check([(ok, ok)])
    with pytest.raises(Error) as ei:
        plan.emit([(ok, ok), (ok, ok)])
    assert (ei.value.code, ei.value.why) == (
        -errno.EINVAL, "the request has 2 groups, the plan 1")
    with pytest.raises(Error) as ei:
        plan.emit([(ok, np.array([0, -1], np.int64))])
    assert (ei.value.code, ei.value.why) == (
        -errno.ERANGE, "group 0 remote ids: -1 is not a uint32")
    with pytest.raises(TypeError):
        plan.emit([(ok, np.array([0.5]))])
    with pytest.raises(TypeError):
        plan.emit([(ok, ok)], out=(np.zeros(9, np.uint64), sge))
    with pytest.raises(ValueError):
        plan.emit([(ok, ok)], out=(wr[::2], sge))
    # the tool refuses the same id with its own words around the code's
    _, _, err = run_tool("--model", "llama-3.1-8b", "--remote-tp", 2,
                         "--remote-ids", "0-2,1024", "--local-ids", "0-3",
                         check=False)
    assert err.startswith("kvpull-plan: cannot emit the request: block id "
                          "out of range: ")


# ---- buffers and copies ------------------------------------------------------


def test_ids_used_in_place():
    u = np.arange(10, 14, dtype=np.uint32)
    i = np.arange(20, 24, dtype=np.int32)
    a = array.array("I", [1, 2, 3, 4])
    req = Request([(u, i), (a, [5, 6, 7, 8]), (u[::2], np.int64([1, 2]))])
    assert req[0].local is u and req[0].remote is i          # no copy
    assert req[1].local.ctypes.data == a.buffer_info()[0]     # no copy
    assert req[1].remote.dtype == np.uint32                   # converted
    assert not np.shares_memory(req[2].local, u)              # strided: copy
    assert req[2].local.tolist() == [10, 12]
    assert req.max_ids == 4 and len(req) == 3
    ids = kvpull.Ids.from_address(req.address)
    assert (ctypes.cast(ids.local, ctypes.c_void_p).value, ids.nlocal) == \
        (u.ctypes.data, 4)
    # the C calls read the caller's memory: a change shows in the next call
    loc, rem, _ = layouts("llama-3.1-8b", remote_tp=2)
    plan = Plan.compile(loc, rem, max_sge=16)
    local = np.arange(4, dtype=np.uint32)
    remote = np.arange(4, dtype=np.uint32)
    req = plan.request([(local, remote)])
    first = plan.emit(req).wrs.copy()
    remote += 100
    second = plan.emit(req).wrs
    assert (second["offset"] == first["offset"] + 100 * 16384).all()


def test_emit_buffers_reused():
    loc, rem, _ = layouts("llama-3.1-8b", remote_tp=2)
    plan = Plan.compile(loc, rem, max_sge=16)
    buf = plan.buffers(8)
    assert (len(buf.wr), len(buf.sge)) == plan.emit_bound(8) == (1280, 1280)
    ids = np.arange(8, dtype=np.uint32)
    e1 = plan.emit([(ids, ids)], out=buf)
    assert np.shares_memory(e1.wrs, buf.wr) and \
        np.shares_memory(e1.sges, buf.sge)
    assert e1.wrs.base is buf.wr or e1.wrs.base is buf.wr.base
    kept = e1.wrs.copy()
    e2 = plan.emit([(ids[:4], ids[4:])], out=buf)            # overwrites
    assert (e1.wrs["offset"][:len(e2.wrs)] == e2.wrs["offset"]).all()
    assert not np.array_equal(kept[:len(e2.wrs)], e2.wrs)
    assert len(plan.emit([(ids[:0], ids[:0])], out=buf)) == 0
    wr = np.empty(1280, kvpull.WR_DTYPE)
    sge = np.empty(1280, kvpull.SGE_DTYPE)
    end = np.empty(2, np.uint32)
    e3 = plan.emit([(ids, ids)], out=(wr, sge, end))
    assert e3.src_end is not None and e3.src_end.tolist() == [64, 128]
    assert np.array_equal(e3.wrs, kept)
    assert plan.emit([(ids, ids)], out=(wr, sge)).src_end is None


def test_plan_lifetime(monkeypatch):
    import kvpull.plan as P
    gc.collect()
    destroyed = []
    real = P.lib

    class Counting:
        def __getattr__(self, name):
            fn = getattr(real, name)
            if name == "kvp_plan_destroy":
                return lambda h: (destroyed.append(h), fn(h))[1]
            return fn

    monkeypatch.setattr(P, "lib", Counting())
    loc, rem, _ = layouts("llama-3.1-8b", remote_tp=2)
    with Plan.compile(loc, rem, max_sge=16) as plan:
        h = plan.handle
        ids = np.arange(3, dtype=np.uint32)
        em = plan.emit([(ids, ids)])
    assert plan.closed and destroyed == [h]
    assert plan.local.closed and plan.remote.closed
    assert len(em.wrs) == 128 and em.wrs[0]["len"] == 3 * 16384  # still ok
    with pytest.raises(ValueError):
        plan.emit([(ids, ids)])
    with pytest.raises(ValueError):
        plan.info
    plan.close()
    assert destroyed == [h]
    p2 = Plan.compile(loc, rem, max_sge=16)
    h2 = p2.handle
    del p2
    assert destroyed == [h, h2]
    # the plan keeps its own copies of the layouts
    loc.close()
    rem.close()
    p3 = Plan.compile(*layouts("llama-3.1-8b", remote_tp=2)[:2])
    assert "plan: consumer rank 0 of TP 1" in p3.dump()
