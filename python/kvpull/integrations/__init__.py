# SPDX-License-Identifier: MIT
"""Adapters that plug kvpull into other projects' harnesses.

``inferencex``: a backend for InferenceX's kv-transfer suite
(docs/inferencex.md); ``inferencex_run``: its CPU lane (the suite's own
``bench/run_kv.py`` on CPU memory, e.g. in the soft-RoCE VM).  Neither is
imported by ``import kvpull``.
"""
