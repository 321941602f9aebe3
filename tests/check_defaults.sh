#!/bin/sh
# check_defaults.sh: a default is stated the same wherever it is stated.
#
#   sh tests/check_defaults.sh
#
# The table between "<!-- defaults: begin -->" and "<!-- defaults: end -->"
# in docs/operations.md is the one list of struct kvp_agent_attr's
# defaults: | `attribute` | side | `0: text` | values | rule |. Checked:
# 1. Each row's attribute is a field of struct kvp_agent_attr in
#    include/kvpull.h whose comment says "0: TEXT" (the comment's part for
#    the row's side when it has a "Producer:" and a "Consumer:" part), and
#    an entry of man/man3/kvp_agent_open.3 that says the same; a macro
#    named in TEXT with a value in parentheses ("KVP_READ_WINDOW (16)") is
#    #define'd to that value in the header.
# 2. Every field whose comment states a "0: " default has a row (a comment
#    over several fields: "FIELD 0: ...").
# 3. Wherever README.md, docs/*.md, tests/README.md, tools/README.md,
#    scripts/README.md or a man page of section 3 or 7 (rendered by
#    mandoc; section 1 pages give the tools' own defaults) names an
#    attribute of the table and, in the same sentence and before another
#    attribute is named, says "default N" (N a number other than 0, with a
#    unit or not, not a product "N x ..."),
#    N is one of the row's values (the fourth column, ";" between them;
#    "10 s" and "10000" are the same for an attribute in ms).
# Each row's statement in 1, each field in 2 and each file in 3 is one
# check. Prints "N passed, N failed"; exit status 0 when
# nothing failed.
set -u
cd "$(dirname "$0")/.." || exit 2
py=${PYTHON:-python3}
if ! command -v "$py" >/dev/null 2>&1; then
	echo "check_defaults.sh: $py not found" >&2
	exit 2
fi
exec "$py" - <<'EOF'
import glob, os, re, subprocess, sys

passed = failed = 0


def ok():
    global passed
    passed += 1


def ko(msg):
    global failed
    failed += 1
    print("FAILED: " + msg)


def norm(s):
    s = re.sub(r"\s+", " ", s).strip()
    s = re.sub(r" ([,.;:)])", r"\1", s)
    s = re.sub(r"\( ", "(", s)
    return s


# --- the table ---------------------------------------------------------
ops = "docs/operations.md"
text = open(ops).read()
m = re.search(r"<!-- defaults: begin -->\n(.*?)<!-- defaults: end -->", text, re.S)
if not m:
    ko(ops + ": no <!-- defaults: begin --> ... <!-- defaults: end --> table")
    print("%d passed, %d failed" % (passed, failed))
    sys.exit(1)
rows = []
for line in m.group(1).splitlines():
    cells = [c.strip() for c in line.strip().strip("|").split("|")]
    if len(cells) < 4 or not cells[0].startswith("`") or cells[0] == "attribute":
        continue
    name = cells[0].strip("`")
    side = cells[1]
    zero = cells[2].strip("`")
    values = [v.strip() for v in cells[3].split(";") if v.strip()]
    rows.append((name, side, zero, values))
if not rows:
    ko(ops + ": the defaults table has no row")

# --- the header --------------------------------------------------------
hdr = open("include/kvpull.h").read()
sm = re.search(r"struct kvp_agent_attr \{(.*?)\n\};", hdr, re.S)
fields = {}
shared = {}
if not sm:
    ko("include/kvpull.h: no struct kvp_agent_attr")
else:
    comment = []
    run = []  # the fields one comment covers (declared one after another)
    for line in sm.group(1).splitlines():
        t = line.strip()
        fm = re.match(r"(?:const )?[a-z_0-9]+ \**([a-z_0-9]+);\s*(/\*.*\*/)?$", t)
        if fm:
            if comment or fm.group(2) or not run:
                c = " ".join(comment)
                if fm.group(2):
                    c += " " + fm.group(2)
                c = norm(re.sub(r"/\*|\*/|^\*|\s\*\s", " ", c).replace("*", " "))
                run = []
            else:
                c = fields[run[0]]
            run.append(fm.group(1))
            fields[fm.group(1)] = c
            shared[fm.group(1)] = run
            comment = []
        elif t.startswith("/*") or t.startswith("*"):
            comment.append(re.sub(r"^/?\*+/?", "", t).replace("*/", ""))
defines = dict(re.findall(r"^#define (KVP_[A-Z0-9_]+) (.+)$", hdr, re.M))

# --- the man page ------------------------------------------------------
man = "man/man3/kvp_agent_open.3"
entries = {}
cur = None
for line in open(man).read().splitlines():
    im = re.match(r"\.It Fa (\S+)", line)
    if im:
        cur = im.group(1)
        entries[cur] = []
        continue
    if line.startswith(".It") or line.startswith(".El") or line.startswith(".Sh") or line.startswith(".Ss"):
        cur = None
        continue
    if cur is None:
        continue
    if line.startswith("."):
        toks = line.split()[1:]
        toks = [t for t in toks if not re.fullmatch(r"[A-Z][a-z]", t)]
        line = " ".join(toks)
    entries[cur].append(line)
entries = {k: norm(" ".join(v).replace(" Ns ", "")) for k, v in entries.items()}


def part(s, side):
    """The part of s about side, when s has a Producer: and a Consumer: part."""
    if side not in ("producer", "consumer") or "Producer:" not in s or "Consumer:" not in s:
        return s
    p, c = s.index("Producer:"), s.index("Consumer:")
    if side == "producer":
        return s[p:c] if p < c else s[p:]
    return s[c:p] if c < p else s[c:]


for name, side, zero, values in rows:
    want = "0: " + norm(zero)
    where = "%s (%s)" % (name, side)
    if name not in fields:
        ko("%s: no field %s in struct kvp_agent_attr" % (ops, name))
    elif want not in part(fields[name], side):
        ko("%s: the table says \"%s\"; include/kvpull.h's comment does not: %s"
           % (where, want, part(fields[name], side)[:300]))
    else:
        ok()
    if name not in entries:
        ko("%s: %s has no entry for %s" % (where, man, name))
    elif want not in part(entries[name], side):
        ko("%s: the table says \"%s\"; %s does not: %s"
           % (where, want, man, part(entries[name], side)[:300]))
    else:
        ok()
    for macro, val in re.findall(r"(KVP_[A-Z0-9_]+) \(([^)]*)\)", zero):
        if defines.get(macro, "").strip() == val:
            ok()
        else:
            ko("%s: the table says %s (%s); include/kvpull.h: #define %s %s"
               % (where, macro, val, macro, defines.get(macro, "(none)")))

named = {r[0] for r in rows}
for f, c in sorted(fields.items()):
    # a comment of one field states its default as "0: ..."; one shared by
    # several fields (log_fn, log_user, log_level) as "FIELD 0: ..."
    own = len(shared[f]) == 1
    if re.search(r"(^|[ (])0: ", c) if own else re.search(r"\b%s 0: " % f, c):
        if f in named:
            ok()
        else:
            ko("include/kvpull.h: kvp_agent_attr.%s states a default (0: ...); %s's table has no row for it" % (f, ops))

# --- the prose ---------------------------------------------------------
UNITS = {"ms": 1, "s": 1000, "second": 1000, "seconds": 1000, "min": 60000,
         "minute": 60000, "minutes": 60000, "KiB": 1024, "MiB": 1 << 20,
         "GiB": 1 << 30, "B": 1, "bytes": 1}


def quantity(s):
    """(number, unit or '') of '10 s', '1,024', '64 KiB', '16 packets'."""
    qm = re.match(r"([0-9][0-9,]*(?:\.[0-9]+)?)(?: ?([A-Za-z]+))?", s)
    if not qm:
        return None
    n = float(qm.group(1).replace(",", ""))
    u = qm.group(2) or ""
    return n, u


def same(a, b, name):
    (na, ua), (nb, ub) = a, b
    if ua in UNITS or ub in UNITS or name.endswith("_ms"):
        fa = UNITS.get(ua, 1 if (ua == "" and name.endswith("_ms")) else None)
        fb = UNITS.get(ub, 1 if (ub == "" and name.endswith("_ms")) else None)
        if fa is None or fb is None:
            return ua == ub and na == nb
        return na * fa == nb * fb
    return na == nb and (ua == ub or not ua or not ub)


vals = {}
for name, side, zero, values in rows:
    vals.setdefault(name, []).extend(v for v in (quantity(x) for x in values) if v)

docs = ["README.md"] + sorted(glob.glob("docs/*.md")) + [
    "tests/README.md", "tools/README.md", "scripts/README.md"]
texts = []
for d in docs:
    if os.path.exists(d):
        paras = re.split(r"\n\s*\n", open(d).read())
        texts += [(d, p, True) for p in paras]
# (section 1: the tools' options have defaults of their own)
for p in sorted(glob.glob("man/man[37]/*.[37]")):
    try:
        out = subprocess.run(["mandoc", "-Tascii", "-Owidth=1000", p],
                             capture_output=True, text=True).stdout
    except OSError:
        print("check_defaults.sh: mandoc not found: man pages' prose not checked")
        break
    out = re.sub(r".\x08", "", out)
    texts += [(p, para, False) for para in re.split(r"\n\s*\n", out)]

names_re = "|".join(re.escape(n) for n in sorted(named, key=len, reverse=True))
bad = {}  # file -> its wrong statements (a file is one check)
for where, para, md in texts:
    bad.setdefault(where, [])
    if md and "<!-- defaults: begin -->" in para:
        continue
    flat = re.sub(r"\s+", " ", para)
    pat = r"`(%s)`" % names_re if md else r"\b(%s)\b" % names_re
    hits = list(re.finditer(pat, flat))
    for i, h in enumerate(hits):
        end = hits[i + 1].start() if i + 1 < len(hits) else len(flat)
        seg = flat[h.end():end]
        dot = re.search(r"\. ", seg)
        if dot:
            seg = seg[:dot.start()]
        for dm in re.finditer(r"\bdefault:? (?:is |of )?([0-9][0-9,.]*(?: ?[A-Za-z]+)?)", seg):
            q = quantity(dm.group(1))
            rest = seg[dm.end():dm.end() + 3]
            if not q or rest.startswith(" x") or dm.group(1).endswith(" x"):
                continue
            if q[0] == 0:  # "default 0": the library's default, as 0 means
                continue
            name = h.group(1)
            if not any(same(q, v, name) for v in vals.get(name, [])):
                bad[where].append("%s: \"%s ... default %s\": %s's table says %s"
                   % (where, name, dm.group(1), ops,
                      "; ".join(v for r in rows if r[0] == name for v in r[3]) or "no value"))
for where in sorted(bad):
    if not bad[where]:
        ok()
        continue
    for msg in bad[where][1:]:
        print("FAILED: " + msg)
    ko(bad[where][0])

print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
EOF
