#!/bin/sh
# SPDX-License-Identifier: MIT
# rdma-model-inner.sh: the inside of `scripts/rdma-bench.sh --model` (issue
# 36), run in the soft-RoCE VM (or on a host with RDMA devices): the model
# demo python/examples/model.py, its prefill on the first device and its
# decode on the second when there are two, both prefill engines (TP 2 and
# TP 1) against the TP 1 decode, in one pair of processes. Prints
# model.py's lines: a model-request: line per request (its figures: the
# prefill's per-layer publish times and the decode's per-layer arrivals,
# from the prompt's arrival) and the model: line per prefill engine.
#
#   sh scripts/rdma-model-inner.sh [model.py size options]
#
# Runs with Debian's /usr/bin/python3 ($PYTHON) and the tree's package
# (PYTHONPATH, KVPULL_LIB as rdma-bench.sh sets them).
set -eu
py=${PYTHON:-/usr/bin/python3}
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd   # the guest has none
addr1=${KVP_ADDR1:-${KVP_ADDR0:?no RDMA device address (KVP_ADDR0)}}
exec "$py" "$(dirname "$0")/../python/examples/model.py" pair \
	--addr "$KVP_ADDR0" --decode-addr "$addr1" "$@"
