# SPDX-License-Identifier: MIT
"""Metrics of kvpull agents, for an operator: a dict, the Prometheus text
format, and a ``/metrics`` endpoint on the standard library's HTTP server.

The library writes them (``kvp_agent_metrics()``, docs/metrics.md lists
every family): counters since open (``kvpull_read_bytes_total``), gauges
(state now), and latency histograms of fixed power-of-two buckets
(``kvpull_pull_duration_seconds``, by ``mode`` bulk/stream and
``outcome`` done/failed; handshakes; a streamed pull's exposed time; a
producer's poll time).

    agent.metrics()                 # dict: {"counters": {...},
                                    #  "gauges": {...}, "histograms": {...}}
    agent.metrics("text")           # Prometheus text, one agent
    kvpull.metrics.prometheus_text(a0, a1)   # several agents, merged
    srv = kvpull.metrics.serve([a0, a1], ("0.0.0.0", 9400))
    ...
    srv.shutdown()

Several agents in one process (a prefill worker's ranks) are merged family
by family, each sample labelled ``agent="ROLE-ENGINE-RANK"`` so that their
series stay apart. Scraping takes each agent's lock for the length of one
``kvp_agent_metrics()`` call (a walk of its engines and slots, no system
call): safe beside a loop thread that polls the agent.
"""
import ctypes
import http.server
import json
import re
import threading

from ._lib import lib
from .errors import Error

#: The Content-Type of the Prometheus text format.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

_FIRST_CAP = 1 << 16


def _expose(clib, handle, fmt):
    """``kvp_agent_metrics()`` of ``handle`` in ``fmt`` as a str: a buffer
    of 64 KiB, or of the size the library says it needs."""
    cap = _FIRST_CAP
    for _ in range(4):
        buf = ctypes.create_string_buffer(cap)
        n = clib.kvp_agent_metrics(handle, fmt, buf, cap)
        if n < 0:
            raise Error(n, "kvp_agent_metrics")
        if n < cap:
            return buf.raw[:n].decode("utf-8")
        cap = n + 1
    raise Error(-11, "kvp_agent_metrics")     # grew four times: EAGAIN


def log_kind_str(kind):
    """The library's name of a log record's kind (``kvp_log_kind_str()``:
    ``"refused"``, ``"pull_completed"``...)."""
    return lib.kvp_log_kind_str(int(kind)).decode()


def _agent_label(agent):
    info = agent.metrics()["gauges"]["kvpull_agent_info"][0]["labels"]
    return "%s-%s-%s" % (info["role"], info["engine"], info["rank"])


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{(.*)\})? (.*)$")


def _families(text):
    """[(name, header lines, sample lines)] of one exposition, in order."""
    fams = []
    for line in text.splitlines():
        if line.startswith("# HELP "):
            fams.append((line.split(" ", 3)[2], [line], []))
        elif line.startswith("#"):
            fams[-1][1].append(line)
        elif line:
            fams[-1][2].append(line)
    return fams


def _labelled(line, label):
    m = _SAMPLE.match(line)
    name, labels, value = m.group(1), m.group(3), m.group(4)
    lab = 'agent="%s"' % label
    return "%s{%s%s} %s" % (name, lab, "," + labels if labels else "",
                            value)


def prometheus_text(*agents):
    """The Prometheus text exposition of one agent (as the library writes
    it) or of several, merged: each family once (its HELP and TYPE), the
    samples of every agent under it, labelled ``agent`` (its role, engine
    id and TP rank)."""
    if len(agents) == 1:
        return agents[0].metrics("text")
    merged = {}
    for a in agents:
        label = _agent_label(a)
        for name, head, samples in _families(a.metrics("text")):
            fam = merged.setdefault(name, (head, []))
            fam[1].extend(_labelled(s, label) for s in samples)
    out = []
    for head, samples in merged.values():
        out.extend(head)
        out.extend(samples)
    return "\n".join(out) + "\n" if out else ""


class _Handler(http.server.BaseHTTPRequestHandler):
    agents = ()

    def do_GET(self):                           # noqa: N802 (the stdlib's)
        if self.path.split("?")[0] != "/metrics":
            self.send_error(404, "only /metrics here")
            return
        try:
            body = prometheus_text(*self.agents).encode()
        except Error as e:
            self.send_error(500, str(e))
            return
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, fmt, *args):          # quiet: no stderr lines
        pass


def serve(agents, address=("127.0.0.1", 0)):
    """Serves ``GET /metrics`` (:func:`prometheus_text` of ``agents``) on
    ``address`` from a daemon thread; returns the server
    (``server.server_address`` says the port when 0 was asked;
    ``server.shutdown()`` stops it). Other paths answer 404."""
    handler = type("MetricsHandler", (_Handler,),
                   {"agents": tuple(agents)})
    srv = http.server.ThreadingHTTPServer(address, handler)
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True,
                     name="kvpull-metrics").start()
    return srv


def parse_text(text):
    """A Prometheus text exposition as ``{name: [(labels dict, value)]}``
    (sample names as written: ``_bucket``, ``_sum`` and ``_count`` apart),
    for checks and tests; values are ints where they are, else floats."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        labels = dict(re.findall(r'([a-zA-Z_]\w*)="((?:[^"\\]|\\.)*)"',
                                 m.group(3) or ""))
        v = m.group(4)
        try:
            value = int(v)
        except ValueError:
            value = float(v)
        out.setdefault(m.group(1), []).append((labels, value))
    return out


__all__ = ["CONTENT_TYPE", "prometheus_text", "serve", "parse_text",
           "log_kind_str"]
