#!/bin/sh
# pytest_counts.sh: "N passed, N failed" from pytest's summary line.
#
#   sh tests/pytest_counts.sh STATUS < PYTEST_OUTPUT
#
# Reads the last line of pytest's output that counts tests ("81 passed in
# 2.05s", "1 failed, 80 passed in ...", "2 errors in ..."); errors count
# as failures, and a non-zero STATUS (other than 77: skipped) with no
# failure counted as one.
st=${1:?usage: pytest_counts.sh STATUS}
last=$(grep -E '[0-9]+ (passed|failed|error|skipped)' | tail -n 1)
num() { echo "$last" | grep -oE "[0-9]+ $1" | head -n 1 | cut -d' ' -f1; }
p=$(num passed)
f=$(num failed)
e=$(num error)
p=${p:-0}
f=$((${f:-0} + ${e:-0}))
[ "$st" -ne 0 ] && [ "$st" -ne 77 ] && [ "$f" -eq 0 ] && f=1
echo "$p passed, $f failed"
