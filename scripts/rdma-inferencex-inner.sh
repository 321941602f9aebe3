#!/bin/sh
# SPDX-License-Identifier: MIT
# rdma-inferencex-inner.sh: the guest side of scripts/rdma-bench.sh
# --inferencex (docs/inferencex.md): InferenceX's kv-transfer suite
# (bench/run_kv.py, unchanged, $INFERENCEX_KV) with the kvpull backend on
# CPU memory, target on $KVP_ADDR0, initiator on $KVP_ADDR1 (or $KVP_ADDR0
# with one device), through python/kvpull/integrations/inferencex_run.py.
#
#   sh scripts/rdma-inferencex-inner.sh RUN_KV_ARGS...
#
# Prints the run's output, then the suite's result file between the lines
# "== result.json" and "== end" (the host keeps it in build/), then one
# line per row: inferencex: isl=I page=P batch=B descs=D reads=R prep_ms=X
# p50_ms=Y gbps=Z verify=ok. Exit status: the run's, or 1 when a row did
# not verify or a line could not be made.
set -u
[ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd   # the guest has none
py=${PYTHON:-/usr/bin/python3}
out=${TMPDIR:-/tmp}/inferencex
mkdir -p "$out"
rc=0
"$py" -m kvpull.integrations.inferencex_run \
	--timeout "${KVP_IX_RUN_TIMEOUT:-6600}" -- "$@" \
	--out "$out/result.json" >"$out/log" 2>&1 || rc=$?
cat "$out/log"
echo "== result.json"
[ -f "$out/result.json" ] && cat "$out/result.json"
echo
echo "== end"
lines=$("$py" -m kvpull.integrations.inferencex_run --summary "$out/log" \
	"$out/result.json") || { [ "$rc" -ne 0 ] || rc=1; }
echo "$lines"
case $lines in *verify=FAILED*|*reads=-1*|"") [ "$rc" -ne 0 ] || rc=1 ;; esac
exit "$rc"
