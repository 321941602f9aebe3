#!/bin/sh
# run-vm.sh: the Python binding's transport tests (tests/python_rdma, pytest)
# in the soft-RoCE VM of scripts/rxe-vm.sh, or on a host with an RDMA device
# (KVP_RDMA_DIRECT=1). A stage of scripts/test.sh, after the other VM
# stages; see README.md here.
#
#   sh tests/python_rdma/run-vm.sh [LIB]
#
# LIB: the libkvpull.so.0 the tests load [build/libkvpull.so.0]. Carries
# into the VM, at the same paths, Debian's /usr/bin/python3, its standard
# library, numpy, pytest and torch (python3-torch, what import needs;
# tests/python_rdma/vm_files.py lists them; rxe-vm.sh adds every ELF file's
# ldd closure), the package, the library, python/examples and these tests,
# and InferenceX's kv-transfer suite when present ($INFERENCEX_KV, else
# ../shared/third_party/inferencex-kv beside the repository);
# gives the guest 4 GiB (KVP_VM_MEM; torch's closure is ~500 MB unpacked in
# RAM, and a test may run two torch processes); links /dev/fd (the guest has
# none; the InferenceX lane's torch runs need it); runs pytest there
# on 2 devices (KVP_ADDR0, and KVP_ADDR1 for the example's decode worker).
# Prints pytest's lines, then "N passed, N failed" as tests/check_python.sh
# does. Any test here may import torch when the host has it.
set -u
cd "$(dirname "$0")/../.." || exit 2
lib=${1:-build/libkvpull.so.0}
py=${PYTHON:-/usr/bin/python3}
if [ ! -f "$lib" ]; then
	echo "run-vm.sh: $lib not found (make)" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
lib=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib")
files=$(PYTHONDONTWRITEBYTECODE=1 "$py" tests/python_rdma/vm_files.py "$lib") || exit 2
out=$(KVP_VM_MEM=${KVP_VM_MEM:-4096} scripts/rxe-vm.sh --devices 2 \
	--timeout "${PY_VM_TIMEOUT:-900}" --files "$files" \
	--env "KVPULL_LIB=$lib" --env PYTHONDONTWRITEBYTECODE=1 \
	--env "PYTHONPATH=$PWD/python" \
	${INFERENCEX_KV:+--env "INFERENCEX_KV=$INFERENCEX_KV"} \
	-- "{ [ -e /dev/fd ] || ln -s /proc/self/fd /dev/fd; } &&
	    $py -m pytest -q --color=no -p no:cacheprovider -rs tests/python_rdma" 2>&1)
st=$?
echo "$out"
echo "$out" | sh tests/pytest_counts.sh "$st"
[ "$st" -eq 0 ] || [ "$st" -eq 77 ]
