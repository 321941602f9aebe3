#!/bin/sh
# check_links.sh: every relative link of the docs resolves.
#
#   sh tests/check_links.sh [FILE...]
#
# FILE: markdown files [README.md docs/*.md tests/README.md tools/README.md
# scripts/README.md]. Each link [text](target) outside fenced code blocks
# whose target is not a URL (http:, https:, mailto:) must name a file or
# directory that exists, relative to the file that links (a target ending
# in "/" a directory); a "#anchor" must be a heading of the target (of the
# file itself for a bare "#anchor"), as GitHub makes anchors: lower case,
# every character but letters, digits, spaces, "-" and "_" dropped, spaces
# made "-", a repeated heading suffixed "-1", "-2"... Anchors into files
# that are not markdown are not checked.
# Each file is one check (so that the count moves only when a file is
# added, not with every link), every bad link printed. Prints "N passed, N
# failed"; exit status 0 when nothing failed.
set -u
cd "$(dirname "$0")/.." || exit 2
[ $# -gt 0 ] || set -- README.md docs/*.md tests/README.md tools/README.md \
	scripts/README.md
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvpull-links.XXXXXX") || exit 2
trap 'rm -rf "$tmp"' EXIT INT TERM
pass=0
fail=0

# anchors FILE: the anchors of FILE's headings, one a line
anchors() {
	awk '
		/^(```|~~~)/ { code = !code; next }
		code { next }
		/^#+ / {
			h = $0
			sub(/^#+ +/, "", h); sub(/ +#* *$/, "", h)
			h = tolower(h)
			gsub(/[^a-z0-9 _-]/, "", h)
			gsub(/ /, "-", h)
			if (h in seen) { seen[h]++; h = h "-" seen[h] } else seen[h] = 0
			print h
		}' "$1"
}

# links FILE: "LINE<TAB>TARGET" for every link outside fenced code
links() {
	awk '
		/^(```|~~~)/ { code = !code; next }
		code { next }
		{
			s = $0
			# inline code spans hold no links
			gsub(/`[^`]*`/, "", s)
			while (match(s, /\]\([^) \t]+( "[^"]*")?\)/)) {
				t = substr(s, RSTART + 2, RLENGTH - 3)
				sub(/ ".*/, "", t)
				print NR "\t" t
				s = substr(s, RSTART + RLENGTH)
			}
		}' "$1"
}

for md in "$@"; do
	if [ ! -f "$md" ]; then
		echo "FAILED: $md: no such file"
		fail=$((fail + 1))
		continue
	fi
	dir=$(dirname "$md")
	links "$md" >"$tmp/links"
	bad=0
	while IFS='	' read -r line target; do
		case $target in
		http:* | https:* | mailto:*) continue ;;
		esac
		path=${target%%#*}
		anchor=
		case $target in *'#'*) anchor=${target#*#} ;; esac
		if [ -z "$path" ]; then
			file=$md
		else
			file=$dir/$path
		fi
		why=
		if [ ! -e "$file" ]; then
			why="$path does not exist"
		elif [ -n "$anchor" ] && [ -f "$file" ]; then
			case $file in
			*.md)
				anchors "$file" >"$tmp/anchors"
				grep -qxF -- "$anchor" "$tmp/anchors" ||
					why="no heading of ${path:-$md} makes #$anchor"
				;;
			esac
		fi
		if [ -n "$why" ]; then
			bad=$((bad + 1))
			echo "FAILED: $md:$line: ($target): $why"
		fi
	done <"$tmp/links"
	if [ $bad -eq 0 ]; then
		pass=$((pass + 1))
	else
		fail=$((fail + 1))
	fi
done

echo "$pass passed, $fail failed"
[ $fail -eq 0 ]
