#!/bin/sh
# SPDX-License-Identifier: MIT
# Checks kvpull-plan --svg: for five scenarios (llama-3.1-70b TP 8 -> 2 and
# TP 8 -> 1, the hybrid nemotron-h-8b TP 2 -> 1, llama-3.1-8b TP 2 -> 16
# whose KV heads are replicated, and that one with --svg-all-ranks) the SVG
# is well formed XML, the same bytes twice, no two arrowheads overlap, and
# headless Chromium renders it to a PNG that is not trivial (a real size,
# and more than one colour).
#
#   sh tests/check_svg.sh [path/to/kvpull-plan]
#
# Needs python3 and chromium (Debian: apt-get install -y chromium); xmllint
# (libxml2-utils) is used too when present. KVP_SVG_KEEP=DIR keeps the SVG
# and PNG files in DIR to look at. Prints "N passed, N failed"; exits 0 when
# every check passes, 1 otherwise (2 when a tool is missing).
set -u

top=$(cd "$(dirname "$0")/.." && pwd)
plan=${1:-${KVPULL_PLAN:-$top/build/tools/kvpull-plan}}
if [ ! -x "$plan" ]; then
	echo "check_svg: $plan not found; run 'make' first" >&2
	exit 2
fi
for t in python3 chromium; do
	if ! command -v "$t" >/dev/null 2>&1; then
		echo "check_svg: $t not found (install-deps: chromium, python3)" >&2
		exit 2
	fi
done
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpull-svg.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
out=${KVP_SVG_KEEP:-$tmp}
mkdir -p "$out"

pass=0
fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }

# well_formed FILE: xmllint when present, python3's parser always.
well_formed() {
	if command -v xmllint >/dev/null 2>&1; then
		if xmllint --noout "$1" 2>"$tmp/xml.err"; then ok; else
			bad "$1: xmllint: $(head -3 "$tmp/xml.err")"
		fi
	fi
	if python3 -c 'import sys, xml.etree.ElementTree as E
r = E.parse(sys.argv[1]).getroot()
sys.exit(r.tag != "{http://www.w3.org/2000/svg}svg")' "$1" 2>"$tmp/py.err"; then
		ok
	else
		bad "$1: not an <svg> document: $(tail -1 "$tmp/py.err")"
	fi
}

# render SVG PNG: headless Chromium, 1200x800.
render() {
	prof=$(mktemp -d "$tmp/profile.XXXXXX")
	timeout 120 chromium --headless --no-sandbox --disable-gpu \
		--disable-background-networking --disable-component-update \
		--disable-sync --no-first-run --user-data-dir="$prof" \
		--screenshot="$2" --window-size=1200,800 "file://$1" \
		>"$tmp/chromium.log" 2>&1
	if [ -s "$2" ]; then ok; else
		bad "$1: chromium made no PNG: $(tail -3 "$tmp/chromium.log")"
	fi
}

# nontrivial PNG: above 10 KB, 1200x800, and not one colour (python3 reads
# the PNG itself: zlib and the filters, no imaging library).
nontrivial() {
	if python3 - "$1" <<'PY'; then ok; else bad "$1: trivial PNG"; fi
import struct, sys, zlib
data = open(sys.argv[1], "rb").read()
if len(data) < 10000 or data[:8] != b"\x89PNG\r\n\x1a\n":
    sys.exit("too small or not a PNG: %d bytes" % len(data))
pos, idat, hdr = 8, b"", None
while pos < len(data):
    n, kind = struct.unpack(">I4s", data[pos:pos + 8])
    body = data[pos + 8:pos + 8 + n]
    if kind == b"IHDR":
        hdr = struct.unpack(">IIBBBBB", body)
    elif kind == b"IDAT":
        idat += body
    pos += 12 + n
w, h, depth, ctype = hdr[:4]
if (w, h) != (1200, 800) or depth != 8 or ctype not in (2, 6):
    sys.exit("unexpected PNG: %dx%d depth %d type %d" % (w, h, depth, ctype))
bpp = 3 if ctype == 2 else 4
raw = zlib.decompress(idat)
stride = w * bpp
prev = bytearray(stride)
colours = set()
for y in range(h):
    f = raw[y * (stride + 1)]
    line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
    for i in range(stride):
        a = line[i - bpp] if i >= bpp else 0
        b = prev[i]
        c = prev[i - bpp] if i >= bpp else 0
        if f == 1: line[i] = (line[i] + a) & 255
        elif f == 2: line[i] = (line[i] + b) & 255
        elif f == 3: line[i] = (line[i] + (a + b) // 2) & 255
        elif f == 4:
            p = a + b - c
            pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
            line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
    if y % 4 == 0:
        for x in range(0, stride, bpp * 2):
            colours.add(bytes(line[x:x + 3]))
    prev = line
if len(colours) < 4:
    sys.exit("only %d colours" % len(colours))
PY
}

# apart SVG: in each panel, the arrows into the consumer's box end at
# least an arrowhead (the marker's height) plus 2 px apart, and the
# arrowheads are smaller than the rows.
apart() {
	if python3 - "$1" <<'PY'; then ok; else bad "$1: arrowheads overlap"; fi
import sys, xml.etree.ElementTree as E
ns = "{http://www.w3.org/2000/svg}"
root = E.parse(sys.argv[1]).getroot()
size = float(root.find(ns + "defs/" + ns + "marker").get("markerHeight"))
panels = [g for g in root.iter(ns + "g") if g.get("id", "").startswith("rank-")]
if not panels:
    sys.exit("no panel")
for g in panels:
    ends = []
    for e in g.iter():
        if not e.get("marker-end"):
            continue
        if e.tag == ns + "line":
            ends.append((float(e.get("x2")), float(e.get("y2"))))
        else:  # a polyline or path: its last point
            x, y = e.get("points", e.get("d", "")).replace(",", " ").split()[-2:]
            ends.append((float(x), float(y)))
    ends.sort()
    if not ends:
        continue
    for (x0, y0), (x1, y1) in zip(ends, ends[1:]):
        if x0 == x1 and y1 - y0 < size + 2:
            sys.exit("%s: arrows end %g px apart at x %g, arrowheads %g px"
                     % (g.get("id"), y1 - y0, x0, size))
PY
}

# scenario NAME ARGS...: the SVG of a plan, checked and rendered.
scenario() {
	name=$1
	shift
	if "$plan" "$@" --svg "$out/$name.svg" --brief >"$tmp/$name.out" \
		2>"$tmp/$name.err"; then
		ok
	else
		bad "$name: kvpull-plan failed: $(cat "$tmp/$name.err")"
		return
	fi
	well_formed "$out/$name.svg"
	"$plan" "$@" --svg "$tmp/$name.again.svg" --brief >/dev/null 2>&1
	cmp -s "$out/$name.svg" "$tmp/$name.again.svg" && ok ||
		bad "$name: two runs drew different SVGs"
	apart "$out/$name.svg"
	render "$out/$name.svg" "$out/$name.png"
	[ -s "$out/$name.png" ] && nontrivial "$out/$name.png"
}

scenario llama70b --model llama-3.1-70b --remote-tp 8 --local-tp 2
grep -qF 'producer rank 3' "$out/llama70b.svg" && ok ||
	bad "llama70b: no 'producer rank 3'"
grep -qF 'producer ranks not read from (4): 4 5 6 7' "$out/llama70b.svg" &&
	ok || bad "llama70b: idle ranks not listed"
scenario hybrid --model nemotron-h-8b --remote-tp 2 --local-tp 1
grep -qF 'group 1: state (whole states)' "$out/hybrid.svg" && ok ||
	bad "hybrid: no state band"
# Eight arrows into one consumer.
scenario converge --model llama-3.1-70b --remote-tp 8 --local-tp 1
n=$(grep -c 'marker-end="url(#arrow)"' "$out/converge.svg")
[ "$n" -eq 10 ] && ok || bad "converge: $n arrows, want 8 and the legend's 2"
# GQA: consumer ranks 0 and 1 read head 0 from producer rank 0.
scenario gqa --model llama-3.1-8b --remote-tp 2 --local-tp 16
grep -qF '>replica: consumer ranks 0-1 read the same producer bytes</text>' \
	"$out/gqa.svg" && ok || bad "gqa: no replica label"
scenario gqa_all --model llama-3.1-8b --remote-tp 2 --local-tp 16 \
	--svg-all-ranks
n=$(grep -c '^<g id="rank-[0-9]*">$' "$out/gqa_all.svg")
[ "$n" -eq 16 ] && ok || bad "gqa_all: $n panels, want 16"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
