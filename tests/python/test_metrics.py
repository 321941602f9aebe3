# SPDX-License-Identifier: MIT
"""kvpull.metrics and Agent.metrics() on the host: the buffer handed to
kvp_agent_metrics() (the stand-in library's, fakelib), the merge of
several agents' expositions (checked by promtool), the /metrics
endpoint, and the names of the log kinds (the real library). The
exposition of live agents is tests/rdma_metrics.c's, in the VM."""
import json
import shutil
import subprocess
import urllib.error
import urllib.request

import pytest

import kvpull
import kvpull.metrics as M
from kvpull.enums import LogKind
from test_agent import fake  # noqa: F401 (the stand-in library)

TEXT = """\
# HELP kvpull_pulls_total Pulls accepted.
# TYPE kvpull_pulls_total counter
kvpull_pulls_total 5
# HELP kvpull_agent_info This agent.
# TYPE kvpull_agent_info gauge
kvpull_agent_info{role="consumer",engine="7",rank="%d",tp_size="2"} 1
# HELP kvpull_pull_duration_seconds Pulls.
# TYPE kvpull_pull_duration_seconds histogram
kvpull_pull_duration_seconds_bucket{mode="bulk",le="0.000000256"} 0
kvpull_pull_duration_seconds_bucket{mode="bulk",le="+Inf"} 5
kvpull_pull_duration_seconds_sum{mode="bulk"} 0.0125
kvpull_pull_duration_seconds_count{mode="bulk"} 5
"""


def _json(rank):
    return json.dumps({
        "counters": {"kvpull_pulls_total": [{"labels": {}, "value": 5}]},
        "gauges": {"kvpull_agent_info": [{"labels": {
            "role": "consumer", "engine": "7", "rank": str(rank),
            "tp_size": "2"}, "value": 1}]},
        "histograms": {}})


class Stub:
    """An agent as prometheus_text() and serve() use it."""

    def __init__(self, rank):
        self.rank = rank

    def metrics(self, format="dict"):
        if format == "text":
            return TEXT % self.rank
        return json.loads(_json(self.rank))


@pytest.fixture
def agent(fake):  # noqa: F811
    lay = kvpull.Layout.build("llama-3.1-8b", tp_size=1, tp_rank=0,
                              block_tokens=16, num_blocks=64)
    a = kvpull.Agent(lay, "consumer")
    yield a
    a.close()
    lay.close()


def test_agent_metrics_formats(fake, agent):
    fake.exposition = {0: TEXT % 0, 1: _json(0)}
    assert agent.metrics() == json.loads(_json(0))
    assert agent.metrics("json") == _json(0)
    assert agent.metrics("text") == TEXT % 0
    # one call each, into a 64 KiB buffer: JSON, JSON, text
    assert fake.seen["metrics"] == [(1, 1 << 16), (1, 1 << 16),
                                    (0, 1 << 16)]


def test_agent_metrics_grows_its_buffer(fake, agent):
    big = "# HELP x_total X.\n# TYPE x_total counter\n" + \
        "".join('x_total{i="%06d"} %d\n' % (i, i) for i in range(4000))
    assert len(big) > 1 << 16
    fake.exposition = {0: big, 1: "{}"}
    assert agent.metrics("text") == big
    assert fake.seen["metrics"] == [(0, 1 << 16), (0, len(big) + 1)]


def test_agent_metrics_errors(fake, agent):
    with pytest.raises(ValueError, match="format 'xml'"):
        agent.metrics("xml")
    assert "metrics" not in fake.seen
    fake.ret["metrics"] = -22
    with pytest.raises(kvpull.Error) as ei:
        agent.metrics()
    assert ei.value.code == -22


MERGED = """\
# HELP kvpull_pulls_total Pulls accepted.
# TYPE kvpull_pulls_total counter
kvpull_pulls_total{agent="consumer-7-0"} 5
kvpull_pulls_total{agent="consumer-7-1"} 5
# HELP kvpull_agent_info This agent.
# TYPE kvpull_agent_info gauge
kvpull_agent_info{agent="consumer-7-0",role="consumer",engine="7",\
rank="0",tp_size="2"} 1
kvpull_agent_info{agent="consumer-7-1",role="consumer",engine="7",\
rank="1",tp_size="2"} 1
# HELP kvpull_pull_duration_seconds Pulls.
# TYPE kvpull_pull_duration_seconds histogram
kvpull_pull_duration_seconds_bucket{agent="consumer-7-0",mode="bulk",\
le="0.000000256"} 0
kvpull_pull_duration_seconds_bucket{agent="consumer-7-0",mode="bulk",\
le="+Inf"} 5
kvpull_pull_duration_seconds_sum{agent="consumer-7-0",mode="bulk"} 0.0125
kvpull_pull_duration_seconds_count{agent="consumer-7-0",mode="bulk"} 5
kvpull_pull_duration_seconds_bucket{agent="consumer-7-1",mode="bulk",\
le="0.000000256"} 0
kvpull_pull_duration_seconds_bucket{agent="consumer-7-1",mode="bulk",\
le="+Inf"} 5
kvpull_pull_duration_seconds_sum{agent="consumer-7-1",mode="bulk"} 0.0125
kvpull_pull_duration_seconds_count{agent="consumer-7-1",mode="bulk"} 5
"""


def _promtool(text):
    tool = shutil.which("promtool")
    if not tool:
        pytest.fail("promtool is not installed (scripts/install-deps.sh)")
    p = subprocess.run([tool, "check", "metrics"], input=text,
                       capture_output=True, text=True)
    return p.returncode, p.stdout + p.stderr


def test_prometheus_text_one_and_merged():
    assert M.prometheus_text(Stub(0)) == TEXT % 0
    merged = M.prometheus_text(Stub(0), Stub(1))
    assert merged == MERGED
    assert _promtool(merged) == (0, "")
    # the same agents' samples without the agent label collide
    rc, said = _promtool(TEXT % 0 + (TEXT % 0).split("\n", 3)[3])
    assert rc != 0 and said


def test_parse_text():
    got = M.parse_text(MERGED)
    assert got["kvpull_pulls_total"] == [({"agent": "consumer-7-0"}, 5),
                                         ({"agent": "consumer-7-1"}, 5)]
    assert got["kvpull_pull_duration_seconds_sum"][1] == (
        {"agent": "consumer-7-1", "mode": "bulk"}, 0.0125)
    assert sum(v for _, v in got["kvpull_pull_duration_seconds_count"]) \
        == 10


def test_serve_metrics_endpoint():
    srv = M.serve([Stub(0), Stub(1)])
    try:
        url = "http://127.0.0.1:%d" % srv.server_address[1]
        with urllib.request.urlopen(url + "/metrics", timeout=10) as r:
            assert r.status == 200
            assert r.headers["Content-Type"] == M.CONTENT_TYPE
            assert r.read().decode() == MERGED
        with pytest.raises(urllib.error.HTTPError) as ei:
            urllib.request.urlopen(url + "/other", timeout=10)
        assert ei.value.code == 404
    finally:
        srv.shutdown()
        srv.server_close()


def test_log_kind_names():
    # the library's names are the enum's, lower case
    for k in LogKind:
        assert M.log_kind_str(k) == str(k)
    assert M.log_kind_str(0) == "unknown"
    assert M.log_kind_str(len(LogKind) + 1) == "unknown"


def test_log_callback(fake, agent):
    import ctypes
    import gc
    from kvpull import _structs as S
    from kvpull import agent as A
    from kvpull.enums import AGENT_ATTR_LOG, LogLevel, Reason
    assert fake.seen["open"]["comp_mask"] == 0      # no log_fn: no bit
    assert not fake.seen["open"]["log_fn"]
    got = []
    lay = agent.layout.clone()
    a = kvpull.Agent(lay, "producer", log_fn=got.append, log_level="debug")
    d = fake.seen["open"]
    assert d["comp_mask"] == AGENT_ATTR_LOG and d["log_level"] == 4
    fn = ctypes.cast(ctypes.c_void_p(d["log_fn"]), A._LOG_FN)
    gc.collect()            # the attr struct is gone; the agent keeps it
    rec = S.LogRecord(kind=1, level=2, time_ns=5, status=-1,
                      reason=int(Reason.AUTH), rank=0xFFFFFFFF,
                      peer_addr=b"10.77.1.2",
                      line=b"refused 10.77.1.2: auth")
    fn(None, ctypes.byref(rec))     # as the C library calls it
    assert got == [{
        "kind": LogKind.REFUSED, "level": LogLevel.WARNING, "time_ns": 5,
        "status": -1, "reason": Reason.AUTH, "peer_reason": Reason.NONE,
        "rank": None, "req_id": 0, "engine_id": 0, "engine": 0,
        "stream": False, "bytes": 0, "reads": 0, "elapsed_ns": 0,
        "peer_addr": "10.77.1.2", "line": "refused 10.77.1.2: auth"}]
    a.close()
    lay.close()
    n = len(fake.calls)
    with pytest.raises(TypeError, match="log_fn must be callable"):
        kvpull.Agent(agent.layout, "consumer", log_fn=42)
    with pytest.raises(ValueError, match="unknown LogLevel"):
        kvpull.Agent(agent.layout, "consumer", log_fn=print,
                     log_level="loud")
    assert len(fake.calls) == n
