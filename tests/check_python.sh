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
# pytest's last line: "81 passed in 2.05s", "1 failed, 80 passed in ...",
# "2 errors in ..."
last=$(echo "$out" | tail -n 1)
num() { echo "$last" | grep -oE "[0-9]+ $1" | head -n 1 | cut -d' ' -f1; }
p=$(num passed)
f=$(num failed)
e=$(num error)
p=${p:-0}
f=$((${f:-0} + ${e:-0}))
[ "$st" -ne 0 ] && [ "$f" -eq 0 ] && f=1
echo "$p passed, $f failed"
[ "$st" -eq 0 ]
