#!/bin/sh
# check_python.sh: the Python binding's tests (tests/python, pytest) on the
# shared library of one build directory.
#
#   sh tests/check_python.sh [LIB [KVPULL_PLAN]]
#
# LIB: the libkvpull.so.0 to load [build/libkvpull.so.0]; KVPULL_PLAN: the
# kvpull-plan the tests compare with [build/tools/kvpull-plan]. Runs Debian's
# /usr/bin/python3 (python3-numpy, python3-pytest: scripts/install-deps.sh)
# unless $PYTHON names another. Prints pytest's lines, then
# "N passed, N failed"; exit status 0 when every test passed.
set -u
cd "$(dirname "$0")/.." || exit 2
lib=${1:-build/libkvpull.so.0}
tool=${2:-build/tools/kvpull-plan}
py=${PYTHON:-/usr/bin/python3}
if [ ! -f "$lib" ]; then
	echo "check_python.sh: $lib not found (make)" >&2
	echo "0 passed, 1 failed"
	exit 1
fi
out=$(KVPULL_LIB=$(cd "$(dirname "$lib")" && pwd)/$(basename "$lib") \
	KVPULL_PLAN=$(cd "$(dirname "$tool")" && pwd)/$(basename "$tool") \
	PYTHONPATH=python PYTHONDONTWRITEBYTECODE=1 \
	"$py" -m pytest -q -p no:cacheprovider tests/python 2>&1)
st=$?
echo "$out"
echo "$out" | sh tests/pytest_counts.sh "$st"
[ "$st" -eq 0 ]
