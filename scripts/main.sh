#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine as root:
#   bash scripts/main.sh
# Installs what it needs, builds kvpull, prints the plan of a real model pair
# (Llama-3.1-70B, producer TP 8 -> consumer TP 2, one 128-block request), then
# runs the end-to-end demo: a prefill engine (TP 2) and a decode engine
# (TP 1) pulling a synthetic KV cache over RDMA READs on soft-RoCE in a VM
# (scripts/rxe-vm.sh), or directly on a machine with an RDMA device; then,
# in the same VM, the same demo with the hybrid nemotron-h-8b (attention
# and Mamba2 state pooled in shared regions, two KV-cache groups).
# Arguments are passed to the first demo (see build/tools/kvpull-demo
# --help); the hybrid one runs with its defaults.
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/install-deps.sh
make -s all

echo "==== plan: llama-3.1-70b, producer TP 8 -> consumer TP 2 (rank 0)"
build/tools/kvpull-plan --model llama-3.1-70b --remote-tp 8 --local-tp 2 \
	--rank 0 --local-layout flash_hnd --remote-layout flash_hnd \
	--num-blocks 100000 --max-sge 16 --request 128 --brief

if [[ ! -x build/tools/kvpull-demo ]]; then
	echo "main: build/tools/kvpull-demo was not built" >&2
	exit 1
fi
echo "==== demo: prefill TP 2 -> decode TP 1 over RDMA READs"
demo="build/tools/kvpull-demo $*"
hybrid="build/tools/kvpull-demo --model nemotron-h-8b"
scripts/rxe-vm.sh --timeout 600 --files "$PWD/build/tools/kvpull-demo" -- \
	"$demo" "$hybrid"
