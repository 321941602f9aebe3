# SPDX-License-Identifier: MIT
"""InferenceX's kv-transfer suite with the kvpull backend, over real verbs
(docs/inferencex.md): one small point of the suite's own bench/run_kv.py
through the CPU lane (python/kvpull/integrations/inferencex_run.py), the
target on $KVP_ADDR0, the initiator on $KVP_ADDR1: kv-dsv4 fp8, ISL 2048,
64-token pages, a burst of 2 requests, op pull, plus the bulk row.  The
suite verifies 16 sampled 8-byte spots per request; --verify-all also
checks every byte each request pulled, its destination pages painted with
the complement of what they must receive before the burst.  The READs the
agent reports are exactly those its plan emits for the suite's block
tables (the same plan compiled here, soft-RoCE's 8 MiB READ bound)."""
import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np

from conftest import ADDR, REPO

import kvpull
from kvpull.integrations import inferencex_run as ixr

ISL, PAGE, BATCH = 2048, 64, 2
RUN = ["--workload-name", "kv-dsv4", "--precision", "fp8",
       "--isl-ladder", str(ISL), "--page-tokens", str(PAGE),
       "--batch-sizes", str(BATCH), "--ops", "pull", "--warmup", "0",
       "--reps", "1", "--trials", "1", "--runner", "rxe-vm"]


def planned_reads(suite):
    """READs per request of the point, from the consumer's plan compiled
    here for the suite's tables (as the agent compiles it)."""
    sys.path[:0] = [os.path.join(suite, "bench"), suite]
    import kv_workload
    import run_kv
    from kvpull.integrations import inferencex as ix
    ap = argparse.ArgumentParser()
    run_kv.add_kv_args(ap)
    args = ap.parse_args(RUN)
    cfgs = [c for c, _ in run_kv._grid(args)[0]]
    bulk = min(max(c["req_bytes"] for c in cfgs), run_kv.BULK_CAP)
    lay = [ix.build_layout(cfgs, cfgs[0]["pool_bytes"],
                           ix.bulk_sizes(args, bulk), bulk, e)
           for e in (ix.TARGET_ENGINE, ix.INITIATOR_ENGINE)]
    plan = kvpull.Plan.compile(lay[1][0], lay[0][0], max_sge=16,
                               max_len=8 << 20)
    cfg, groups = cfgs[0], lay[0][1][ix.geometry(cfgs[0])]
    out = []
    for r in range(BATCH):
        ids = [(ix._EMPTY, ix._EMPTY)] * lay[0][0].info.ngroups
        t = [kv_workload.block_table(cfg, kv_workload.table_seed(cfg, s), r)
             for s in ("local", "remote")]
        for reg, g in zip(cfg["regions"], groups):
            ids[g] = tuple(x[reg["name"]].astype(np.uint32) for x in t)
        out.append(len(plan.emit(ids).wrs))
    return cfg, out


def test_suite_point_verifies_every_byte(tmp_path):
    suite = ixr.suite_dir()
    cfg, reads = planned_reads(suite)
    res = tmp_path / "result.json"
    env = dict(os.environ, KVP_ADDR1=os.environ.get("KVP_ADDR1") or ADDR)
    p = subprocess.run(
        [sys.executable, "-m", "kvpull.integrations.inferencex_run",
         "--verify-all", "--timeout", "600", "--"] + RUN +
        ["--out", str(res)], capture_output=True, text=True, env=env,
        cwd=REPO, timeout=660)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "[run_kv] status=success rows=2" in out, out
    every = re.findall(r"^\[kvpull\] verify-all isl=2048 page=64 bytes=(\d+)"
                       r" (\S+)", out, re.M)
    assert every == [(str(cfg["req_bytes"]), "ok")] * BATCH, out
    got = [int(x) for x in re.findall(
        r"^\[kvpull\] isl=2048 page=64 request=\d descs=%d reads=(\d+) "
        r"bytes=%d$" % (cfg["descs"], cfg["req_bytes"]), out, re.M)]
    assert got == reads, out
    assert all(r <= cfg["descs"] for r in reads)
    doc = json.load(open(res))
    rows = doc["measurement"]["rows"]
    assert [(r["kind"], r["batch"], r["verify"]["passed"]) for r in rows] \
        == [("paged", BATCH, True), ("bulk", 1, True)]
    assert doc["implementation"]["name"] == "kvpull"
    assert doc["implementation"]["library_version"] == \
        "%d.%d.%d" % kvpull.version()
    assert doc["outcome"]["status"] == "success"
    log = tmp_path / "log"
    log.write_text(out)
    lines = ixr.summary(str(log), str(res))
    assert [re.sub(r" prep_ms=.*? verify=", " verify=", x) for x in lines] \
        == ["inferencex: isl=2048 page=64 batch=2 descs=%d reads=%d "
            "verify=ok" % (2 * cfg["descs"], sum(reads)),
            "inferencex: isl=2048 page=bulk batch=1 descs=1 reads=%d "
            "verify=none" % -(-rows[1]["req_bytes"] // (8 << 20))]
    # the posts: one burst after none of warm-up, so each request once
    stats = re.search(r"^\[kvpull\] stats reads=(\d+) read_bytes=(\d+) "
                      r"done_reads=(\d+)$", out, re.M)
    assert stats and int(stats[1]) == int(stats[3]) == sum(reads) + \
        -(-rows[1]["req_bytes"] // (8 << 20)), out
