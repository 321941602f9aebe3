#!/usr/bin/env bash
# The main job, on a fresh Debian 12 machine as root:
#   bash scripts/main.sh [--verbose] [kvpull-demo options]
# Installs what it needs, builds kvpull, then runs two end-to-end demos in
# one soft-RoCE VM (scripts/rxe-vm.sh; or directly on a machine with an
# RDMA device): a prefill engine and a decode engine of a model preset
# (llama-3.1-8b, TP 2 -> TP 1 unless options say otherwise) pulling a
# synthetic KV cache with RDMA READs and verifying every byte, then the
# hybrid nemotron-h-8b (attention and Mamba2 state pooled in shared
# regions, two KV-cache groups) with its defaults, then a streamed pull
# beside a bulk one while the producer simulates a paced prefill
# (kvpull-stream-bench --case dense-layerwise). See scripts/README.md.
set -euo pipefail
cd "$(dirname "$0")/.."

usage() {
	cat <<'EOF'
Usage: bash scripts/main.sh [--verbose] [kvpull-demo options]

Installs what is missing (scripts/install-deps.sh), builds kvpull, and runs
in one soft-RoCE VM (or on the host's RDMA device) two end-to-end demos:
  1. build/tools/kvpull-demo [kvpull-demo options]
     (default: llama-3.1-8b, prefill TP 2 -> decode TP 1, 8 requests)
  2. build/tools/kvpull-demo --model nemotron-h-8b   (hybrid, defaults)
  3. build/tools/kvpull-stream-bench --case dense-layerwise
Each demo prints the two engines, the plan, the transfer and its
verification; the third, a streamed pull beside a bulk one during a paced
prefill: exposed time of each (last publish to DONE), wrong and early
bytes.

  --verbose, -v   also print the install and build output, the plan dump of
                  llama-3.1-70b (producer TP 8 -> consumer TP 2) and the VM
                  harness's own lines (console, markers, timing)
  -h, --help      this text
kvpull-demo options (passed to the first demo; see kvpull-demo --help):
  --model NAME --prefill-tp P --decode-tp D --requests N --tokens T
  --block B --prefill-layout L --decode-layout L --ids runs|random|contiguous
  --layers N --state-layers N --sliding-layers N --num-blocks N --max-sge S
  --seed N
Exit status: 0 both demos verified every byte; 1 a step failed; 2 bad
options.
EOF
}

verbose=0
demo_args=()
while [[ $# -gt 0 ]]; do
	case $1 in
	-v|--verbose) verbose=1 ;;
	-h|--help) usage; exit 0 ;;
	*) demo_args+=("$1") ;;
	esac
	shift
done

t_start=$SECONDS
step() { echo "== $*" >&2; }
# run_quiet LOG CMD...: CMD's output goes to LOG, or to the terminal with
# --verbose; on failure LOG is printed.
run_quiet() {
	local log=$1 rc=0
	shift
	if ((verbose)); then
		"$@" || rc=$?
	else
		"$@" >"$log" 2>&1 || rc=$?
		((rc == 0)) || cat "$log" >&2
	fi
	return "$rc"
}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvp-main.XXXXXX")
trap 'rm -rf "$tmp"' EXIT

step "checking dependencies (scripts/install-deps.sh; a fresh machine: a few minutes)"
run_quiet "$tmp/deps.log" bash scripts/install-deps.sh
step "building kvpull (make all)"
run_quiet "$tmp/build.log" make -s all BUILD=build WERROR=1
if [[ ! -x build/tools/kvpull-demo ]]; then
	echo "main: build/tools/kvpull-demo was not built" >&2
	exit 1
fi
# Bad demo options fail here, not after a VM boot.
if ! build/tools/kvpull-demo --dry-run ${demo_args[@]+"${demo_args[@]}"} \
	>/dev/null; then
	echo "main: bad kvpull-demo options (bash scripts/main.sh --help)" >&2
	exit 2
fi

if ((verbose)); then
	step "plan dump: llama-3.1-70b, producer TP 8 -> consumer TP 2 (rank 0)"
	build/tools/kvpull-plan --model llama-3.1-70b --remote-tp 8 \
		--local-tp 2 --rank 0 --local-layout flash_hnd \
		--remote-layout flash_hnd --num-blocks 100000 --max-sge 16 \
		--request 128 --brief
fi

demo="build/tools/kvpull-demo"
if [[ ${#demo_args[@]} -gt 0 ]]; then
	demo+=$(printf ' %q' "${demo_args[@]}")
fi
hybrid="build/tools/kvpull-demo --model nemotron-h-8b"
stream="build/tools/kvpull-stream-bench --case dense-layerwise --runs 1"
vm_flags=(--timeout 600 --files "$PWD/build/tools/kvpull-demo"
	--files "$PWD/build/tools/kvpull-stream-bench")
((verbose)) || vm_flags+=(--quiet)
# A blank line between the demos' outputs; echo runs in the VM too.
rc=0
# The streamed pull's three requests of 32 layers take ~350 MB in the VM.
KVP_VM_MEM=${KVP_VM_MEM:-2048} scripts/rxe-vm.sh "${vm_flags[@]}" -- \
	"$demo" "echo; $hybrid" \
	"echo; echo 'streamed pull beside bulk (llama-3.1-8b, 32 layers, prefill paced at 2 layer transfers a layer; exposed: last publish to DONE):'; $stream" ||
	rc=$?
if ((rc != 0)); then
	echo "main: FAILED (scripts/rxe-vm.sh exit $rc; rerun with --verbose" \
		"for the VM's console)" >&2
	exit 1
fi
echo
echo "main: OK in $((SECONDS - t_start)) s: 2 demos and a streamed pull, every byte verified"
