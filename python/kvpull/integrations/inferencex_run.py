# SPDX-License-Identifier: MIT
"""The CPU lane of InferenceX's kv-transfer suite with the kvpull backend:
the suite's own ``bench/run_kv.py`` (two ranks, gloo for the exchange and
the barriers, its pattern fill and verification), unchanged, with its pools
in CPU memory (docs/inferencex.md).

    python3 -m kvpull.integrations.inferencex_run [options] -- RUN_KV_ARGS
    python3 -m kvpull.integrations.inferencex_run --one-rank [--gpu] \
        [--suite DIR] -- RUN_KV_ARGS
    python3 -m kvpull.integrations.inferencex_run --summary LOG JSON
    python3 -m kvpull.integrations.inferencex_run --prep -- RUN_KV_ARGS

Launches rank 0 (target) and rank 1 (initiator) on this host, each
``run_kv.py --backend kvpull RUN_KV_ARGS`` after patching, at run time, the
suite's CUDA-only spots: ``torch.cuda.set_device`` and ``synchronize``
(no-ops), ``get_device_name`` (says "cpu"), ``kv_pool.TorchPool`` (CPU
tensors), and the backend choice (``--backend kvpull`` loads
:class:`kvpull.integrations.inferencex.KvpullBackend`).  Options:

  --suite DIR     the suite (its bench/ and configs/) [$INFERENCEX_KV, else
                  ../shared/third_party/inferencex-kv beside the repository,
                  else /work/shared/third_party/inferencex-kv]
  --addr0/--addr1 the ranks' RDMA addresses (KVPULL_ADDR) [$KVP_ADDR0,
                  $KVP_ADDR1 or $KVP_ADDR0]
  --timeout S     bound on the run; both ranks are killed after it [3600]
  --verify-all    besides the suite's 16 sampled spots per request, check
                  every byte the request pulled, after painting those
                  destination pages with the complement of what they must
                  receive (prints "[kvpull] verify-all ... ok")
  --one-rank      run this process as the one rank its launcher's RANK,
                  WORLD_SIZE, MASTER_ADDR, MASTER_PORT and KVPULL_ADDR say
                  (torchrun, srun: one per node), instead of both here
  --gpu           with --one-rank: leave torch.cuda and the pools as the
                  suite has them (GPU memory, registered through dma-buf);
                  only the backend choice is added

``--prep`` times the backend's ``make_paged`` on this host's CPU, with a
stand-in agent (no device), for every point of the grid and the requests
of its largest burst, new and seen before (a request of an earlier burst),
one line a point: ``prep: isl=I page=P first_ms=F new_ms=N seen_ms=S`` (medians).

``--summary LOG JSON`` prints, from a run's output and its result file, one
line per row: ``inferencex: isl=I page=P batch=B descs=D reads=R
prep_ms=X p50_ms=Y gbps=Z verify=ok`` (descs and reads for the whole burst,
prep_ms per request, gbps as the suite's gbps_p50 but to 4 decimals; the
bulk rows say page=bulk and, the suite verifying none, verify=none).
"""
import argparse
import json
import os
import re
import resource
import runpy
import signal
import socket
import subprocess
import sys
import time
import types

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))


def suite_dir(path=None):
    """The suite's directory (the one holding bench/run_kv.py)."""
    for d in (path, os.environ.get("INFERENCEX_KV"),
              os.path.join(REPO, "..", "shared", "third_party",
                           "inferencex-kv"),
              "/work/shared/third_party/inferencex-kv"):  # a clone elsewhere
        if d and os.path.isfile(os.path.join(d, "bench", "run_kv.py")):
            return os.path.abspath(d)
    raise SystemExit("inferencex_run: the suite is not at %r: give --suite "
                     "or set INFERENCEX_KV" % (path or os.environ.get(
                         "INFERENCEX_KV") or "../shared/third_party/"
                         "inferencex-kv"))


def _expected(pool_offsets):
    """The suite's pattern byte at each offset (kv_workload._chunk_byte)."""
    return (((pool_offsets >> 8) * 131 + 7) & 0xFF).astype(np.uint8)


def _pages(cfg, dst_tables, src_tables):
    """Per region and layer: (destination byte offsets, source byte
    offsets), pages x page_bytes int64 arrays."""
    for r in cfg["regions"]:
        j = np.arange(r["page_bytes"], dtype=np.int64)
        for layer in range(r["layers"]):
            base = r["base"] + layer * r["pool_pages"] * r["page_bytes"]
            yield tuple(base + t[r["name"]].astype(np.int64)[:, None]
                        * r["page_bytes"] + j
                        for t in (dst_tables, src_tables))


def paint_complement(arr, cfg, dst_tables, src_tables):
    """Write into each destination page the complement of what the pull
    must put there."""
    for dst, src in _pages(cfg, dst_tables, src_tables):
        arr[dst] = ~_expected(src)


def verify_every_byte(arr, cfg, dst_tables, src_tables):
    """(ok, detail, bytes): every byte of the request's destination pages
    holds the source pool's pattern at the matching offset."""
    n = 0
    for dst, src in _pages(cfg, dst_tables, src_tables):
        bad = np.flatnonzero(arr[dst] != _expected(src))
        if bad.size:
            return False, "byte at offset %d: %d, expected %d" % (
                dst.flat[bad[0]], arr[dst.flat[bad[0]]],
                _expected(src.flat[bad[0]])), n
        n += dst.size
    return True, "", n


def cpu_lane(verify_all=False, gpu=False):
    """Patch the suite (imported from sys.path) for CPU memory (unless
    ``gpu``) and the kvpull backend."""
    import argparse as ap
    import kv_workload
    from kvpull.integrations.inferencex import KvpullBackend

    if not gpu:
        import torch
        import kv_pool
        torch.cuda.set_device = lambda device: None
        torch.cuda.synchronize = lambda device=None: None
        torch.cuda.get_device_name = lambda device=None: "cpu"

        class CpuPool(kv_pool.TorchPool):
            def __init__(self, nbytes, device):  # the suite's, on the CPU
                self._t = torch.empty(nbytes, dtype=torch.uint8)
                self._torch = torch
                self.ptr, self.nbytes, self.device = (
                    self._t.data_ptr(), nbytes, device)
        kv_pool.TorchPool = CpuPool

    backend = KvpullBackend
    if verify_all:
        class Verifying(KvpullBackend):
            def register(self, pool, bulk):
                self.arr = pool._t.numpy()
                super().register(pool, bulk)

            def make_paged(self, cfg, op, local_tables, remote_tables):
                made = super().make_paged(cfg, op, local_tables,
                                          remote_tables)
                paint_complement(self.arr, cfg, local_tables, remote_tables)
                return made
        backend = Verifying
        sampled = kv_workload.verify_transfer

        def verify_transfer(read8, cfg, dst, src, *a, **kw):
            ok, detail = sampled(read8, cfg, dst, src, *a, **kw)
            if ok:
                ok, detail, n = verify_every_byte(read8.__self__._t.numpy(),
                                                  cfg, dst, src)
                print("[kvpull] verify-all isl=%d page=%d bytes=%d %s" % (
                    cfg["isl"], cfg["page_tokens"], n,
                    "ok" if ok else "FAILED " + detail), flush=True)
            return ok, detail
        kv_workload.verify_transfer = verify_transfer

    add = ap.ArgumentParser.add_argument

    def add_argument(self, *names, **kw):
        if names == ("--backend",) and "choices" in kw:
            kw["choices"] = list(kw["choices"]) + ["kvpull"]
        return add(self, *names, **kw)
    ap.ArgumentParser.add_argument = add_argument
    # run_kv.py imports kv_nixl for a backend it does not name.
    sys.modules["kv_nixl"] = types.SimpleNamespace(NIXLBackend=backend)


def rank(opts, run_args):
    """One rank: patch, then run run_kv.py as its own __main__."""
    suite = suite_dir(opts.suite)
    sys.path[:0] = [os.path.join(suite, "bench"), suite]
    cpu_lane(opts.verify_all, opts.gpu)
    path = os.path.join(suite, "bench", "run_kv.py")
    sys.argv = [path, "--backend", "kvpull"] + run_args
    runpy.run_path(path, run_name="__main__")


def launch(opts, run_args):
    """Both ranks on this host; the worse exit status."""
    addr0 = opts.addr0 or os.environ.get("KVP_ADDR0")
    addr1 = opts.addr1 or os.environ.get("KVP_ADDR1") or addr0
    if not addr0:
        raise SystemExit("inferencex_run: no RDMA address: --addr0 or "
                         "$KVP_ADDR0")
    try:  # registration pins the pools: what a launcher's --propagate does
        resource.setrlimit(resource.RLIMIT_MEMLOCK, (resource.RLIM_INFINITY,
                                                     resource.RLIM_INFINITY))
    except (ValueError, OSError):
        pass  # run_kv.py says what it needs
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, WORLD_SIZE="2", LOCAL_RANK="0",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=os.pathsep.join(
                   [os.path.join(REPO, "python")] +
                   [p for p in [os.environ.get("PYTHONPATH")] if p]))
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")
    cmd = [sys.executable, "-m", "kvpull.integrations.inferencex_run",
           "--one-rank"] + (["--suite", opts.suite] if opts.suite else []) + \
        (["--verify-all"] if opts.verify_all else []) + ["--"] + run_args
    procs = [subprocess.Popen(cmd, start_new_session=True, env=dict(
        env, RANK=str(r), KVPULL_ADDR=a)) for r, a in ((0, addr0),
                                                      (1, addr1))]
    end, rc = time.monotonic() + opts.timeout, 0
    for p in procs:
        try:
            rc = max(rc, abs(p.wait(max(end - time.monotonic(), 0.1))))
        except subprocess.TimeoutExpired:
            print("inferencex_run: timed out after %d s" % opts.timeout,
                  file=sys.stderr, flush=True)
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            return 124
    return rc


def prep(opts, run_args):
    """--prep (see the module)."""
    import statistics
    suite = suite_dir(opts.suite)
    sys.path[:0] = [os.path.join(suite, "bench"), suite]
    import kv_workload
    import run_kv
    from kvpull.integrations import inferencex as ix

    class Mem:
        ptr, nbytes = 0, 0

    ap = argparse.ArgumentParser()
    run_kv.add_kv_args(ap)
    args = ap.parse_args(["--runner", "host"] + run_args)
    points = run_kv._grid(args)[0]
    pool, bulk = Mem(), Mem()
    pool.nbytes = max(c["pool_bytes"] for c, _ in points)
    bulk.nbytes = min(max(c["req_bytes"] for c, _ in points), run_kv.BULK_CAP)
    os.environ.setdefault("KVPULL_ADDR", "127.0.0.1")
    be = ix.KvpullBackend(args, "initiator", None)
    be.agent_class = lambda *a, **kw: types.SimpleNamespace(
        register=lambda *a, **kw: None)
    be.register(pool, bulk)
    for cfg, allowed in points:
        ms = {"new": [], "seen": []}
        for r in range(allowed[-1]):
            t = [kv_workload.block_table(cfg, kv_workload.table_seed(cfg, s),
                                         r) for s in ("local", "remote")]
            for k in ms:
                ms[k].append(be.make_paged(cfg, "pull", *t)[2] * 1e3)
        print("prep: isl=%d page=%d first_ms=%.3f new_ms=%.3f seen_ms=%.4f"
              % (cfg["isl"], cfg["page_tokens"], ms["new"][0],
                 statistics.median(ms["new"][1:] or ms["new"]),
                 statistics.median(ms["seen"])))
    return 0


def summary(log, result):
    """The run's lines (see the module), from its output and result file."""
    reads = {}
    for m in re.finditer(r"^\[kvpull\] (?:isl=(\d+) page=(\d+) request=(\d+)"
                         r"|bulk bytes=(\d+)) descs=\d+ reads=(\d+)",
                         open(log).read(), re.M):
        key = ("bulk", int(m[4]), 0) if m[4] else tuple(map(int, m.groups()
                                                            [:3]))
        reads[key] = int(m[5])
    out = []
    for row in json.load(open(result))["measurement"]["rows"]:
        b, bulk = row["batch"], row["kind"] == "bulk"
        keys = [("bulk", row["req_bytes"], 0)] if bulk else \
            [(row["isl"], row["page_tokens"], r) for r in range(b)]
        r = sum(reads[k] for k in keys) if all(k in reads for k in keys) \
            else -1
        ok = row["verify"]["passed"]
        out.append("inferencex: isl=%d page=%s batch=%d descs=%d reads=%d "
                   "prep_ms=%.3f p50_ms=%.1f gbps=%.4f verify=%s" % (
                       row["isl"], "bulk" if bulk else row["page_tokens"], b,
                       row["descs"] * b, r, row["prep_ms"] / b,
                       row["latency_ms"]["p50"], row["req_bytes"] * b /
                       row["latency_ms"]["p50"] / 1e6,
                       "none" if bulk else "ok" if ok else "FAILED"))
    return out


def main(argv=None):
    p = argparse.ArgumentParser(
        prog="inferencex_run", description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite")
    p.add_argument("--addr0")
    p.add_argument("--addr1")
    p.add_argument("--timeout", type=int, default=3600)
    p.add_argument("--verify-all", action="store_true")
    p.add_argument("--one-rank", action="store_true")
    p.add_argument("--gpu", action="store_true")
    p.add_argument("--summary", nargs=2, metavar=("LOG", "JSON"))
    p.add_argument("--prep", action="store_true")
    argv = sys.argv[1:] if argv is None else argv
    cut = argv.index("--") if "--" in argv else len(argv)
    opts, run_args = p.parse_args(argv[:cut]), argv[cut + 1:]
    if opts.summary:
        lines = summary(*opts.summary)
        print("\n".join(lines))
        return 0 if lines else 1
    if opts.gpu and opts.verify_all:
        p.error("--verify-all reads the pools as CPU memory: not with --gpu")
    if opts.prep:
        return prep(opts, run_args)
    if opts.one_rank:
        return rank(opts, run_args)
    return launch(opts, run_args)


if __name__ == "__main__":
    sys.exit(main())
