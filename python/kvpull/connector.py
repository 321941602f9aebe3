# SPDX-License-Identifier: MIT
"""A KV connector with the methods of vLLM's ``KVConnectorBase_V1``, over
kvpull (issue 36).  It imports nothing of vLLM: requests, blocks and the
scheduler's output are read by duck typing (the attributes vLLM's own
objects have), so that plugging kvpull into vLLM is a thin subclass that
forwards each method, and other engines can drive it as it is::

    class KVPullVllmConnector(KVConnectorBase_V1):     # inside vLLM
        def __init__(self, vllm_config, role, kv_cache_config=None):
            super().__init__(vllm_config, role, kv_cache_config)
            cfg = kvpull.connector.ConnectorConfig(...)  # from kv_transfer_config
            self._impl = (kvpull.connector.KVPullScheduler(cfg)
                          if role == KVConnectorRole.SCHEDULER
                          else kvpull.connector.KVPullWorker(cfg))
        def __getattr__(self, name):                     # every method
            return getattr(self._impl, name)

Two sides, as in vLLM (one scheduler object per engine, one worker object
per TP rank):

- :class:`KVPullScheduler` decides what moves: ``get_num_new_matched_tokens``,
  ``update_state_after_alloc``, ``build_connector_meta`` (a
  :class:`ConnectorMetadata` the engine hands every worker for the step),
  ``request_finished`` (returns ``kv_transfer_params`` for the other
  side), ``set_xfer_handshake_metadata``, and :meth:`~KVPullScheduler.cancel`.
- :class:`KVPullWorker` moves it, one kvpull :class:`~kvpull.Agent` per
  rank: ``register_kv_caches`` (layout from the tensors, memory
  registered, a producer listens), ``get_handshake_metadata``,
  ``bind_connector_metadata``, ``start_load_kv`` (streamed or bulk pulls;
  a producer's ``expect``), ``wait_for_layer_load`` (ARRIVED),
  ``save_kv_layer`` (``publish``), ``wait_for_save``, ``get_finished``,
  ``get_block_ids_with_load_errors`` (FAILED's ids), ``cancel``,
  ``shutdown``.

What differs from vLLM's NIXL connector, on purpose: the decode side
*pulls while the prefill computes* (``kvpull_stream`` in the params: the
prefill publishes each layer as ``save_kv_layer`` is called, the decode
side's ``wait_for_layer_load`` returns as each layer lands), which needs
the prefill's block ids before it finishes: :meth:`KVPullScheduler.
stream_params` gives them at allocation (vLLM has no hook that sends
``kv_transfer_params`` before ``request_finished``; a proxy carries them,
as python/examples/model.py's side channel does).  A producer holds a
request's blocks from its allocation (``expect``) until every consumer
rank released them or its deadline (``expect_timeout``) passed: never
freed while a READ may still read them.

Request ids: vLLM's are strings, kvpull's 64-bit integers; the prefill
side names each request by :func:`request_key` of its id and puts that
key in the params (``kvpull_req_id``), so the two sides need not share
their string ids.
"""
import base64
import errno
import hashlib
import queue
import threading
import time

import numpy as np

from .agent import Agent
from .enums import TOKENS_END, EventType
from .errors import Error
from .vllm import layout_from_kv_caches

__all__ = ["ConnectorConfig", "ConnectorMetadata", "RecvReq", "SendReq",
           "KVPullScheduler", "KVPullWorker", "Request", "request_key"]


def request_key(request_id):
    """The 64-bit kvpull request id of an engine's request id (a string):
    the first 8 bytes of its BLAKE2b digest, little endian."""
    return int.from_bytes(hashlib.blake2b(str(request_id).encode(),
                                          digest_size=8).digest(), "little")


class ConnectorConfig:
    """What a connector needs to know (vLLM: ``kv_transfer_config`` and
    the parallel config).  ``engine_id`` (this engine's kvpull id, an
    int), ``role`` (``"producer"``: prefill, ``"consumer"``: decode),
    ``tp_size``, ``tp_rank``, ``addr`` (this rank's RDMA address),
    ``port`` (producer rank r listens on ``port``; give each rank its
    own), ``backend``/``num_kv_heads``/``stride_order`` (for
    :func:`~kvpull.vllm.layout_from_kv_caches`), ``stream`` (the prefill
    publishes per layer; the decode side pulls as it does), ``consumer_engine``
    (producer: the decode engine when a request's params do not name
    one), ``expect_timeout`` (seconds a producer holds blocks unread;
    NIXL's ``VLLM_NIXL_ABORT_REQUEST_TIMEOUT``), ``load_timeout`` (the
    bound of ``wait_for_layer_load``), ``agent`` (more
    :class:`~kvpull.Agent` attributes), ``progress_thread`` (a thread
    polls the agent, so that handshakes, a consumer's request to follow a
    streamed pull and progress records are served while the engine
    computes a layer; the worker's methods take the events it queued;
    NIXL's UCX backend has its progress thread too)."""

    def __init__(self, engine_id, role, tp_size=1, tp_rank=0, addr=None,
                 port=0, backend="flash", num_kv_heads=None,
                 stride_order=None, stream=True, consumer_engine=None,
                 expect_timeout=480.0, load_timeout=60.0, agent=None,
                 progress_thread=False):
        if role not in ("producer", "consumer"):
            raise ValueError("role must be 'producer' or 'consumer', not %r"
                             % (role,))
        self.engine_id = int(engine_id)
        self.role = role
        self.tp_size = int(tp_size)
        self.tp_rank = int(tp_rank)
        self.addr = addr
        self.port = int(port)
        self.backend = backend
        self.num_kv_heads = num_kv_heads
        self.stride_order = stride_order
        self.stream = bool(stream)
        self.consumer_engine = consumer_engine
        self.expect_timeout = float(expect_timeout)
        self.load_timeout = float(load_timeout)
        self.agent = dict(agent or {})
        self.progress_thread = bool(progress_thread)


class Request:
    """The attributes of vLLM's ``Request`` the connector reads:
    ``request_id``, ``prompt_token_ids``, ``kv_transfer_params``,
    ``num_computed_tokens`` (the prefix-cache hit at allocation)."""

    def __init__(self, request_id, prompt_token_ids, kv_transfer_params=None,
                 num_computed_tokens=0):
        self.request_id = request_id
        self.prompt_token_ids = list(prompt_token_ids)
        self.kv_transfer_params = kv_transfer_params
        self.num_computed_tokens = num_computed_tokens

    @property
    def num_tokens(self):
        """The prompt's length."""
        return len(self.prompt_token_ids)


def _block_ids(blocks):
    """Per group, a list of block ids: vLLM's ``KVCacheBlocks``
    (``get_block_ids()``), a tuple of lists, or one list."""
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    blocks = list(blocks)
    if blocks and not isinstance(blocks[0], (list, tuple, np.ndarray)):
        return [list(map(int, blocks))]
    return [list(map(int, g)) for g in blocks]


class RecvReq:
    """Decode side, one request to pull: ``key`` (kvpull id),
    ``local_block_ids`` (per group: the blocks not hit in the prefix
    cache), ``params`` (the prefill's ``kv_transfer_params``),
    ``num_tokens``, ``stream``."""

    def __init__(self, key, local_block_ids, params, num_tokens, stream):
        self.key = key
        self.local_block_ids = local_block_ids
        self.params = params
        self.num_tokens = num_tokens
        self.stream = stream


class SendReq:
    """Prefill side, one request whose blocks are read by a consumer
    engine: ``key``, ``consumer_engine``, ``start``/``end`` (the tokens
    this step computes), ``last`` (the prompt ends in this step)."""

    def __init__(self, key, consumer_engine, start=0, end=0, last=False):
        self.key = key
        self.consumer_engine = consumer_engine
        self.start = start
        self.end = end
        self.last = last


class ConnectorMetadata:
    """What the scheduler hands the workers for one step
    (``KVConnectorMetadata``): ``reqs_to_recv`` ({request id:
    :class:`RecvReq`}), ``reqs_to_send`` (requests to ``expect`` from
    now on, {id: :class:`SendReq`}), ``reqs_to_save`` (requests this step
    computes, {id: :class:`SendReq`} with their tokens), ``reqs_to_cancel``
    (ids)."""

    def __init__(self):
        self.reqs_to_recv = {}
        self.reqs_to_send = {}
        self.reqs_to_save = {}
        self.reqs_to_cancel = set()


# ---- the scheduler side -----------------------------------------------------


class KVPullScheduler:
    """The scheduler side (``KVConnectorRole.SCHEDULER``); pure Python, no
    agent.  See the module for the flow."""

    def __init__(self, config):
        self.config = config
        self.ranks = {}           # tp rank -> handshake metadata
        self._recv = {}           # decode: request id -> RecvReq, next meta
        self._send = {}           # prefill: request id -> SendReq, next
        self._live = {}           # prefill: request id -> [SendReq, done,
        #                           prompt length, block ids]
        self._cancel = set()

    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        """How many tokens past ``num_computed_tokens`` (the local prefix
        hit) the connector will load, and whether asynchronously.  NIXL:
        a decode request with ``do_remote_prefill`` loads every prompt
        token not computed locally, asynchronously (``(n, True)``); the
        prefill side loads nothing (``(0, False)``).  The same here."""
        p = request.kv_transfer_params or {}
        if self.config.role == "consumer" and p.get("do_remote_prefill"):
            return max(len(request.prompt_token_ids) -
                       num_computed_tokens, 0), True
        return 0, False

    def update_state_after_alloc(self, request, blocks,
                                 num_external_tokens):
        """The engine allocated ``blocks`` for ``request``.  NIXL: a
        decode request to load remembers its new blocks (the ones past the
        prefix hit) for the next metadata and clears
        ``do_remote_prefill``.  Here too; and a prefill request headed for
        a decode engine (``do_remote_decode``) is expected from the next
        step on (NIXL only starts holding its blocks at
        ``request_finished``; a streamed pull reads them while they are
        being written)."""
        p = request.kv_transfer_params or {}
        rid = request.request_id
        if self.config.role == "consumer":
            if not p.get("do_remote_prefill") or not num_external_tokens:
                return
            ids = _block_ids(blocks)
            self._recv[rid] = RecvReq(
                int(p["kvpull_req_id"]), ids, dict(p),
                len(request.prompt_token_ids),
                bool(p.get("kvpull_stream")) and self.config.stream)
            p["do_remote_prefill"] = False
            return
        if not p.get("do_remote_decode") or rid in self._live:
            return
        consumer = p.get("kvpull_consumer_engine",
                         self.config.consumer_engine)
        if consumer is None:
            raise ValueError("request %s: no consumer engine (params' "
                             "kvpull_consumer_engine or the config's)"
                             % rid)
        s = SendReq(request_key(rid), int(consumer))
        self._send[rid] = s
        self._live[rid] = [s, int(getattr(request, "num_computed_tokens", 0)),
                           len(request.prompt_token_ids), _block_ids(blocks)]

    def build_connector_meta(self, scheduler_output=None):
        """The step's :class:`ConnectorMetadata`, and the scheduler's
        per-step state cleared (NIXL: ``reqs_to_recv``, ``reqs_to_send``,
        ``reqs_in_batch``, ``reqs_not_processed``).  ``scheduler_output``
        is read for ``num_scheduled_tokens`` ({request id: tokens}): each
        prefill request scheduled gets its token range, which
        ``save_kv_layer`` publishes layer by layer."""
        meta = ConnectorMetadata()
        meta.reqs_to_recv, self._recv = self._recv, {}
        meta.reqs_to_send, self._send = self._send, {}
        meta.reqs_to_cancel, self._cancel = self._cancel, set()
        sched = getattr(scheduler_output, "num_scheduled_tokens", None) or {}
        for rid, n in sched.items():
            live = self._live.get(rid)
            if live is None or rid in meta.reqs_to_cancel:
                continue
            s, done, total = live[0], live[1], live[2]
            end = min(done + int(n), total)
            live[1] = end
            meta.reqs_to_save[rid] = SendReq(s.key, s.consumer_engine, done,
                                             end, end >= total)
        return meta

    def _params(self, rid, stream):
        s, _done, total, blocks = self._live[rid]
        return {
            "do_remote_prefill": True, "do_remote_decode": False,
            "remote_engine_id": self.config.engine_id,
            "remote_block_ids": blocks[0] if len(blocks) == 1 else blocks,
            "remote_ranks": [[m["addr"], m["port"]] for _r, m in
                             sorted(self.ranks.items())],
            "tp_size": self.config.tp_size,
            "kvpull_req_id": s.key, "kvpull_stream": stream,
            "num_tokens": total,
        }

    def stream_params(self, request_id):
        """Prefill side: the ``kv_transfer_params`` of a request as soon
        as its blocks are allocated, for a decode engine that pulls it
        while it is computed (``kvpull_stream``).  KeyError for a request
        not headed for a decode engine."""
        return self._params(request_id, self.config.stream)

    def request_finished(self, request, block_ids=None):
        """The engine finished ``request``: ``(delay_free, params)``.
        NIXL: a prefill request headed for decode keeps its blocks
        (``True``) and returns the params the decode side needs (engine,
        block ids, host and port, TP size).  Here the same params, with
        kvpull's request key and its ranks' addresses; the worker reports
        the request in ``get_finished``'s first set once every consumer
        rank released it (or its deadline passed).  Anything else:
        ``(False, None)``."""
        rid = request.request_id
        if self.config.role != "producer" or rid not in self._live:
            return False, None
        params = self._params(rid, False)
        del self._live[rid]
        return True, params

    def cancel(self, request_id):
        """Cancel a request on the workers from the next step on (see
        :meth:`KVPullWorker.cancel`); its blocks are freed when
        ``get_finished`` reports it, never before."""
        self._cancel.add(request_id)
        self._recv.pop(request_id, None)
        self._live.pop(request_id, None)

    def set_xfer_handshake_metadata(self, metadata):
        """The workers' :meth:`KVPullWorker.get_handshake_metadata`, by TP
        rank (NIXL: each worker's agent metadata, served on its side
        channel): the prefill side puts the ranks' addresses in the
        params."""
        self.ranks = dict(metadata)


# ---- the worker side --------------------------------------------------------


class _Engine:
    __slots__ = ("handle", "up", "down", "waiting")

    def __init__(self, handle):
        self.handle = handle
        self.up = False
        self.down = False        # went down: the next pull reconnects it
        self.waiting = []        # request ids to pull once up


class KVPullWorker:
    """One TP rank's side (``KVConnectorRole.WORKER``): its
    :class:`~kvpull.Agent` and requests.  Never blocks but in
    ``wait_for_layer_load`` and ``wait_for_save`` (bounded)."""

    def __init__(self, config):
        self.config = config
        self.agent = None
        self.kv = None            # kvpull.vllm.KVCacheLayout
        self.meta = None          # the bound ConnectorMetadata
        self._engines = {}        # remote engine id -> _Engine
        self._recv = {}           # request id -> RecvReq (pulls)
        self._by_key = {}         # kvpull key -> request id
        self._arrived = {}        # request id -> layers landed
        self._pulling = set()     # request ids pulled, not DONE/FAILED
        self._cancelled = set()
        self._send = {}           # request id -> SendReq (expected)
        self._cancelled_send = set()
        self._done_sending = set()
        self._done_recving = set()
        self._errors = set()
        self.events = []          # every event seen, for the caller
        self._thread = None       # the progress thread, if any
        self._stop = False
        self._queue = queue.SimpleQueue()
        #: request id -> time.monotonic_ns() when its load ended (DONE,
        #: FAILED or cancelled), for the engine's own figures
        self.finished_ns = {}

    # ---- registration --------------------------------------------------

    def register_kv_caches(self, kv_caches):
        """vLLM hands the per-layer KV tensors once.  NIXL registers each
        with its agent and starts its side-channel listener.  Here: the
        layout from the tensors (:func:`~kvpull.vllm.layout_from_kv_caches`,
        shapes and strides checked), an agent (``Agent(layout, role,
        **config.agent)``), every region registered where it is, and a
        producer listens on ``config.addr``, ``config.port``."""
        c = self.config
        self.kv = layout_from_kv_caches(
            kv_caches, c.backend, num_kv_heads=c.num_kv_heads,
            tp_size=c.tp_size, tp_rank=c.tp_rank, engine_id=c.engine_id,
            stride_order=c.stride_order)
        attrs = dict(c.agent)
        if c.role == "consumer" and c.stream:
            attrs.setdefault("stream_events", 1)
        self.agent = Agent(self.kv.layout, c.role, addr=c.addr, **attrs)
        self.agent.register_all(self.kv.regions)
        if c.role == "producer":
            self.agent.listen(c.addr, c.port)
        self._layer = {n: i for i, n in enumerate(self.kv.layer_names)}
        if c.progress_thread:
            self._thread = threading.Thread(target=self._progress,
                                            name="kvpull-progress",
                                            daemon=True)
            self._thread.start()

    def get_handshake_metadata(self):
        """This rank's handshake metadata (NIXL: its agent metadata and
        side-channel port): ``engine_id``, ``tp_rank``, ``tp_size``,
        ``addr``, ``port`` and ``meta`` (the rank's kvpull blob, base64:
        a consumer may carry it instead of the built-in exchange)."""
        c = self.config
        return {"engine_id": c.engine_id, "tp_rank": c.tp_rank,
                "tp_size": c.tp_size, "addr": c.addr, "port": c.port,
                "meta": base64.b64encode(self.agent.meta()).decode()}

    def add_remote_engine(self, engine_id, ranks, wait=None):
        """Consumer: start the handshake with prefill engine ``engine_id``
        whose rank ``i`` listens at ``ranks[i]`` (``(addr, port)``), as
        ``start_load_kv`` does on its first request (NIXL:
        ``add_remote_agent`` after its side-channel handshake); with
        ``wait`` (seconds), poll until it is up.  Returns the agent's
        engine handle.  :class:`TimeoutError` when ``wait`` passed,
        :class:`~kvpull.Error` when it went down."""
        eid = int(engine_id)
        eng = self._engines.get(eid)
        if eng is None:
            eng = _Engine(self.agent.add_engine([tuple(x) for x in ranks]))
            self._engines[eid] = eng
        if wait is not None:
            end = time.monotonic() + wait
            while not eng.up:
                left = end - time.monotonic()
                if left <= 0:
                    raise TimeoutError("engine %#x not up within %.1f s"
                                       % (eid, wait))
                for e in self.poll(timeout=min(left, 1.0)):
                    if e.type == EventType.ENGINE_DOWN and \
                            e.engine == eng.handle:
                        raise e.error
        return eng.handle

    # ---- metadata -------------------------------------------------------

    def bind_connector_metadata(self, meta):
        """The step's :class:`ConnectorMetadata` (vLLM binds it before the
        forward pass)."""
        self.meta = meta

    def clear_connector_metadata(self):
        """After the forward pass."""
        self.meta = None

    # ---- loading (decode) -------------------------------------------------

    def start_load_kv(self, forward_context=None, **kwargs):
        """Start the step's loads.  NIXL: for each request to receive,
        handshake with its engine in the background if new, else post
        the READs; and start holding the blocks of requests to send.
        Here: a new prefill engine is added (``add_engine``: its ranks'
        addresses from the params; its pulls start at ENGINE_UP), each
        request is pulled (``pull_stream`` when the params say
        ``kvpull_stream``, else ``pull_from``); a producer ``expect``s
        the requests to send (blocks held until RELEASED or EXPIRED).
        Cancellations of the step apply first."""
        meta = self.meta or ConnectorMetadata()
        for rid in meta.reqs_to_cancel:
            self.cancel(rid)
        for rid, s in meta.reqs_to_send.items():
            self.agent.expect(s.consumer_engine, s.key,
                              timeout=self.config.expect_timeout)
            self._send[rid] = s
            self._by_key[s.key] = rid
        for rid, r in meta.reqs_to_recv.items():
            self._recv[rid] = r
            self._by_key[r.key] = rid
            eid = int(r.params["remote_engine_id"])
            self.add_remote_engine(eid, r.params["remote_ranks"])
            self._engines[eid].waiting.append(rid)
        self._start_waiting()
        self.poll()

    def _start_waiting(self):
        for eng in self._engines.values():
            if not eng.up and not (eng.down and eng.waiting):
                continue
            left = []
            for rid in eng.waiting:
                if rid in self._cancelled:
                    self._finish_recv(rid, failed=True)
                    continue
                r = self._recv[rid]
                local = [np.asarray(g, np.uint32) for g in r.local_block_ids]
                remote = r.params["remote_block_ids"]
                if not remote or not isinstance(remote[0], list):
                    remote = [remote]
                ids = [(lo, np.asarray(re, np.uint32), r.num_tokens)
                       for lo, re in zip(local, remote)]
                fn = self.agent.pull_stream if r.stream else \
                    self.agent.pull_from
                try:
                    fn(eng.handle, r.key, ids)
                except Error as e:
                    if e.code == -errno.EAGAIN:
                        # down (idle, evicted, lost): this pull started its
                        # reconnect; the requests start at ENGINE_UP
                        eng.up = eng.down = False
                        left.append(rid)
                        continue
                    if e.code == -errno.EBUSY:
                        left.append(rid)     # retried at the next poll
                        continue
                    self._finish_recv(rid, failed=True)
                    continue
                self._pulling.add(rid)
                self._arrived[rid] = 0
            eng.waiting = left

    def _finish_recv(self, rid, failed):
        self.finished_ns[rid] = time.monotonic_ns()
        r = self._recv.pop(rid, None)
        self._pulling.discard(rid)
        self._arrived.pop(rid, None)
        if r is not None:
            self._by_key.pop(r.key, None)
            if failed or rid in self._cancelled:
                for g in r.local_block_ids:
                    self._errors.update(int(b) for b in g)
        self._cancelled.discard(rid)
        self._done_recving.add(rid)

    def _drain(self, evs):
        """Apply events: engines up or down, pulls landed, done, failed;
        producer requests released or expired."""
        for e in evs:
            self.events.append(e)
            t = e.type
            if t == EventType.ENGINE_UP:
                for eng in self._engines.values():
                    if eng.handle == e.engine:
                        eng.up = True
            elif t == EventType.ENGINE_DOWN:
                for eid, eng in list(self._engines.items()):
                    if eng.handle == e.engine:
                        for rid in eng.waiting:
                            self._finish_recv(rid, failed=True)
                        eng.waiting = []
                        eng.up = False
                        eng.down = True
            elif t == EventType.ARRIVED:
                rid = self._by_key.get(e.req_id)
                if rid in self._arrived:
                    self._arrived[rid] = max(self._arrived[rid], e.layers)
            elif t in (EventType.DONE, EventType.FAILED):
                rid = self._by_key.get(e.req_id)
                if rid is None or rid not in self._recv:
                    continue
                if t == EventType.FAILED and e.ids is not None:
                    for a in e.ids:
                        self._errors.update(int(b) for b in a)
                self._finish_recv(rid, failed=t == EventType.FAILED)
            elif t in (EventType.RELEASED, EventType.EXPIRED):
                rid = self._by_key.pop(e.req_id, None)
                if rid is not None and self._send.pop(rid, None):
                    self._cancelled_send.discard(rid)
                    self._done_sending.add(rid)
        self._start_waiting()

    def poll(self, timeout=0):
        """Drive the agent once (handshakes, completions, progress), up to
        ``timeout`` seconds if nothing comes; apply its events and return
        them.  With ``config.progress_thread`` the thread polls and this
        takes what it queued."""
        if self._thread is None:
            evs = self.agent.poll(64, timeout=timeout)
        else:
            evs = []
            try:
                evs.append(self._queue.get(timeout=timeout or None)
                           if timeout else self._queue.get_nowait())
                while True:
                    evs.append(self._queue.get_nowait())
            except queue.Empty:
                pass
        self._drain(evs)
        return evs

    def _progress(self):
        """The progress thread: polls the agent (sleeping on its file
        descriptors, the GIL released) and queues the events."""
        while not self._stop:
            for e in self.agent.poll(64, timeout=0.05):
                self._queue.put(e)

    def wait_for_layer_load(self, layer_name):
        """Block until layer ``layer_name`` (a name of ``kv_caches``, or
        its index) of every request this step loads has landed.  NIXL
        loads asynchronously and returns at once.  Here a streamed pull's
        ARRIVED events are awaited (the layers that landed); a request
        that ends (DONE, FAILED: see ``get_block_ids_with_load_errors``)
        or is cancelled stops being awaited.  :class:`TimeoutError` after
        ``config.load_timeout`` seconds."""
        layer = layer_name if isinstance(layer_name, int) else \
            self._layer[layer_name]
        want = [rid for rid in (self.meta.reqs_to_recv if self.meta else
                                self._recv) if rid in self._recv]
        end = time.monotonic() + self.config.load_timeout
        while True:
            pending = [rid for rid in want if rid in self._recv and
                       rid not in self._cancelled and
                       self._arrived.get(rid, 0) <= layer]
            if not pending:
                return
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("layer %d of requests %s did not land "
                                   "within %.1f s" % (layer, pending,
                                                      self.config.load_timeout))
            self.poll(timeout=min(left, 1.0))

    def wait_for_recv(self, request_ids, timeout=None):
        """Block until each of ``request_ids`` is done receiving (DONE or
        FAILED, as ``get_finished`` will report it); bounded by
        ``timeout`` (default ``config.load_timeout``)."""
        end = time.monotonic() + (self.config.load_timeout
                                  if timeout is None else timeout)
        while any(rid in self._recv for rid in request_ids):
            left = end - time.monotonic()
            if left <= 0:
                raise TimeoutError("requests %s not received"
                                   % [r for r in request_ids
                                      if r in self._recv])
            self.poll(timeout=min(left, 1.0))

    # ---- saving (prefill) -------------------------------------------------

    def save_kv_layer(self, layer_name, kv_layer=None, attn_metadata=None,
                      **kwargs):
        """The forward pass wrote layer ``layer_name`` (a name or an
        index) of this step's requests.  NIXL does nothing here (the
        decode side reads after ``request_finished``).  Here each request
        the step computes is published (``publish``): its tokens
        ``[start, end)`` in layers ``[0, layer + 1)`` (``[start,
        TOKENS_END)`` in the prompt's last step: a layer is whole, and
        ARRIVED reports it, only then); after the last layer, ``[0,
        end)`` in every layer (``TOKENS_END`` when the prompt ended), so
        that a streamed pull reads each layer as soon as it is written.  The KV bytes themselves are already in the
        registered tensors (``kv_layer`` is not read)."""
        if self.meta is None:
            return
        layer = layer_name if isinstance(layer_name, int) else \
            self._layer[layer_name]
        nlayers = len(self.kv.layer_names)
        for rid, s in self.meta.reqs_to_save.items():
            if rid not in self._send or rid in self._cancelled_send:
                continue            # cancelled, or released already
            if layer + 1 < nlayers:
                # the prompt's last chunk goes "to the end": only then are
                # the layers whole, and ARRIVED reports them
                prog = (s.start, TOKENS_END if s.last else s.end, layer + 1)
            elif s.last:
                prog = (TOKENS_END, TOKENS_END, nlayers)
            else:
                prog = (s.end, s.end, nlayers)
            try:
                self.agent.publish(s.consumer_engine, s.key, prog)
            except Error as e:
                if e.code != -errno.ENOENT:
                    raise
                # no longer held: every consumer rank released it early
                # (its pull failed or was cancelled) or it expired; the
                # event says which, and get_finished reports it
                self._cancelled_send.add(rid)
        self.poll()

    def wait_for_save(self):
        """After the forward pass.  NIXL: nothing (or a copy to host
        buffers).  Here one poll: the progress records go out, the
        handshakes of new consumers run."""
        self.poll()

    # ---- results -----------------------------------------------------------

    def get_finished(self, finished_req_ids=()):
        """``(done_sending, done_recving)``: request ids whose blocks this
        rank no longer needs to hold (every consumer rank released them,
        or they expired) and ids whose load ended (DONE, FAILED or
        cancelled).  NIXL: notifications counted per producer, its own
        expiry timer, and transfers polled.  Here the agent's events; each
        id is reported once."""
        self.poll()
        s, r = self._done_sending, self._done_recving
        self._done_sending, self._done_recving = set(), set()
        return s, r

    def get_block_ids_with_load_errors(self):
        """Local block ids whose load failed since the last call (a FAILED
        pull's ids, a cancelled pull's blocks): the engine recomputes
        them.  NIXL: the same set, of its failed transfers."""
        out, self._errors = self._errors, set()
        return out

    def cancel(self, request_id):
        """Cancel one request on this rank.  Decode side: a pull not yet
        started (its engine still connecting) is dropped at once; one in
        flight is no longer awaited by ``wait_for_layer_load``, and is
        reported by ``get_finished`` when its READs end (DONE or FAILED:
        its blocks are never reused while a READ may still write them),
        with its blocks in ``get_block_ids_with_load_errors``.  Prefill
        side: its layers are no longer published (a consumer's streamed
        pull of it then fails after its ``stall_ms``); its blocks are
        held until RELEASED or EXPIRED, reported by ``get_finished``.
        kvpull has no call that stops one pull's posted READs; removing
        its engine (``agent.remove_engine``) stops all of that engine's."""
        if request_id in self._recv:
            self._cancelled.add(request_id)
            if request_id not in self._pulling:
                for eng in self._engines.values():
                    if request_id in eng.waiting:
                        eng.waiting.remove(request_id)
                self._finish_recv(request_id, failed=True)
        elif request_id in self._send:
            self._cancelled_send.add(request_id)

    def shutdown(self):
        """Stop the progress thread, close the agent (a consumer first
        sends the notifications it owes) and free the layout."""
        if self._thread is not None:
            self._stop = True
            self._thread.join()
            self._thread = None
        if self.agent is not None:
            self.agent.close()
            self.agent = None
        if self.kv is not None:
            self.kv.close()
            self.kv = None
