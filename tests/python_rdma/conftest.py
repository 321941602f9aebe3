# SPDX-License-Identifier: MIT
"""Shared helpers of the transport tests: the package from python/ of this
tree, the RDMA device's address from scripts/rxe-vm.sh ($KVP_ADDR0; every
test is skipped without it), a fresh port range per test, and small
drivers for agents polled from one thread."""
import os
import sys
import time

import numpy as np
import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO, "python"))

import kvpull  # noqa: E402

ADDR = os.environ.get("KVP_ADDR0") or None
PROD_ENGINE = 0x50524f44
CONS_ENGINE = 0x434f4e53
LAYERS = 2
NUM_BLOCKS = 32


def pytest_collection_modifyitems(config, items):
    if ADDR:
        return
    skip = pytest.mark.skip(reason="KVP_ADDR0 is not set (run under "
                            "scripts/rxe-vm.sh: tests/python_rdma/README.md)")
    for item in items:
        item.add_marker(skip)


_next_port = [int(os.environ.get("KVP_PY_PORT", "19100"))]


@pytest.fixture
def port():
    """A port range of 8 no other test of this run uses."""
    _next_port[0] += 8
    return _next_port[0]


def layout(tp=1, rank=0, engine_id=PROD_ENGINE):
    """llama-3.1-8b cut to 2 layers, 32 blocks of 16 tokens, flash_hnd."""
    m = kvpull.Model.preset("llama-3.1-8b").replace(layers=LAYERS)
    return kvpull.Layout.build(m, tp_size=tp, tp_rank=rank,
                               engine_id=engine_id, block_tokens=16,
                               num_blocks=NUM_BLOCKS, kv_layout="flash_hnd")


def pattern(region, size, rank=0):
    """A producer rank's bytes of a region (examples/example.h's byte, with
    the rank mixed in)."""
    k = np.arange(size, dtype=np.uint64)
    return ((k * 7 + (k >> 12) + region * 31 + rank * 101) &
            0xFF).astype(np.uint8)


def memory(lay, rank=None):
    """One numpy array per region of lay: the pattern of producer rank
    `rank`, or zeros."""
    return [pattern(r, s, rank) if rank is not None else
            np.zeros(s, np.uint8) for r, s in enumerate(lay.regions)]


def drive(agents, until, timeout=60):
    """Poll every agent until until(events) is true, events[i] the list of
    agent i's events so far; return events."""
    events = [[] for _ in agents]
    end = time.monotonic() + timeout
    while not until(events):
        if time.monotonic() > end:
            raise AssertionError("no such events within %ss: %r"
                                 % (timeout, events))
        got = False
        for i, a in enumerate(agents):
            ev = a.poll(64)
            if ev:
                events[i] += ev
                got = True
        if not got:
            time.sleep(0.001)
    return events


def has(events, type, req_id=None):
    """The events of `type` (an EventType; for `req_id` if given)."""
    return [e for e in events if e.type == type and
            (req_id is None or e.req_id == req_id)]


def fail_on(events, *types):
    for e in events:
        if e.type in types:
            raise AssertionError("%r: %s" % (e, e.error))


def execute(plan, request, producers, consumer):
    """What the consumer's memory must hold after `request`: its READs (the
    agent's own plan emitted on the host) done by numpy from the producer
    ranks' memory into a copy of the consumer's."""
    out = [m.copy() for m in consumer]
    em = plan.emit(request)
    ranks = plan.sources
    for off, ln, region, src, first, nsge, _g in em.wrs.tolist():
        data = producers[ranks[src]][region][off:off + ln]
        pos = 0
        for o, n, r in em.sges[first:first + nsge].tolist():
            out[r][o:o + n] = data[pos:pos + n]
            pos += n
    return out, em.nbytes
