# kvpull: one plain Makefile. Targets: all tests test check-rdma install uninstall
# clean bench. Variables: PREFIX DESTDIR CC SANITIZE=1 WERROR=1.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
PKGDIR ?= $(LIBDIR)/pkgconfig

VERSION := 0.1.0
SOMAJOR := 0

CC ?= cc
CFLAGS ?= -O2 -g
WARN := -Wall -Wextra -Wmissing-prototypes -Wformat=2 -Wshadow -Wno-unused-parameter
ifeq ($(WERROR),1)
WARN += -Werror
endif
ifdef CI
WARN += -Werror
endif
ifeq ($(SANITIZE),1)
CFLAGS += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ALL_CFLAGS := -std=gnu11 $(WARN) -fPIC -fvisibility=hidden -Iinclude $(CFLAGS)

PLAN_SRC := $(sort $(wildcard plan/*.c))
VERBS_SRC := $(sort $(wildcard verbs/*.c))
PLAN_OBJ := $(PLAN_SRC:%.c=build/%.o)
VERBS_OBJ := $(VERBS_SRC:%.c=build/%.o)
VERBS_LIBS := $(if $(VERBS_SRC),-lrdmacm -libverbs -lpthread)

UNIT_SRC := $(sort $(wildcard tests/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/%.c=build/tests/%)
RDMA_SRC := $(sort $(wildcard tests/rdma_*.c))
RDMA_BIN := $(RDMA_SRC:tests/%.c=build/tests/%)
TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_BIN := $(TOOL_SRC:tools/%.c=build/tools/%)
# tools/lib/: shared by the tools (an archive: each takes what it uses);
# tools/plan/: the pieces of kvpull-plan.
TOOLLIB_OBJ := $(patsubst %.c,build/%.o,$(sort $(wildcard tools/lib/*.c)))
PLANTOOL_OBJ := $(patsubst %.c,build/%.o,$(sort $(wildcard tools/plan/*.c)))
TOOL_HDR := $(wildcard include/*.h tests/lib/*.h tools/*/*.h)
TESTLIB_SRC := $(sort $(wildcard tests/lib/*.c))
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=build/%.o)

all: build/libkvpull.a build/libkvpull.so build/kvpull.pc $(TOOL_BIN)

build/%.o: %.c $(wildcard include/*.h plan/*.h verbs/*.h tests/lib/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

# plan/ and verbs/ are separate archives: plan/ must link without verbs.
build/libkvpull_plan.a: $(PLAN_OBJ)
	rm -f $@ && ar rcs $@ $^
build/libkvpull_verbs.a: $(VERBS_OBJ)
	rm -f $@ && ar rcs $@ $^
build/libkvpull.a: $(PLAN_OBJ) $(VERBS_OBJ)
	rm -f $@ && ar rcs $@ $^

build/libkvpull.so: $(PLAN_OBJ) $(VERBS_OBJ) kvpull.map
	$(CC) -shared -Wl,-soname,libkvpull.so.$(SOMAJOR) -Wl,-z,defs \
		-Wl,--version-script=kvpull.map $(LDFLAGS) -o build/libkvpull.so.$(VERSION) \
		$(PLAN_OBJ) $(VERBS_OBJ) $(VERBS_LIBS)
	ln -sf libkvpull.so.$(VERSION) build/libkvpull.so.$(SOMAJOR)
	ln -sf libkvpull.so.$(VERSION) $@

build/kvpull.pc: Makefile
	@mkdir -p build
	printf 'prefix=%s\nlibdir=%s\nincludedir=%s\n\nName: kvpull\nDescription: KV-cache block transfer over RDMA READs\nVersion: %s\nLibs: -L$${libdir} -lkvpull\nLibs.private: %s\nCflags: -I$${includedir}\n' \
		'$(PREFIX)' '$(LIBDIR)' '$(INCDIR)' '$(VERSION)' '$(VERBS_LIBS)' > $@

build/tests/test_%: tests/test_%.c $(TESTLIB_OBJ) build/libkvpull_plan.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Iplan -Itests/lib $(LDFLAGS) -o $@ $< $(TESTLIB_OBJ) build/libkvpull_plan.a -lcmocka

build/tests/rdma_%: tests/rdma_%.c $(TESTLIB_OBJ) build/libkvpull.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/lib $(LDFLAGS) -o $@ $< $(TESTLIB_OBJ) build/libkvpull.a $(VERBS_LIBS)

build/tools/%.o: tools/%.c $(TOOL_HDR)
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/lib -Itools/lib -c -o $@ $<

build/libkvpull_tools.a: $(TOOLLIB_OBJ)
	rm -f $@ && ar rcs $@ $^

build/tools/kvpull-plan: $(PLANTOOL_OBJ)

build/tools/%: tools/%.c $(TOOL_HDR) $(TESTLIB_OBJ) build/libkvpull_tools.a build/libkvpull.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/lib -Itools/lib $(LDFLAGS) -o $@ $< $(filter build/tools/%.o,$^) build/libkvpull_tools.a $(TESTLIB_OBJ) build/libkvpull.a $(VERBS_LIBS)

# The header must compile alone, as C and as C++.
build/header-check: include/kvpull.h
	@mkdir -p build
	echo '#include "kvpull.h"' | $(CC) -std=c11 -Wall -Wextra -Werror -Iinclude -x c -fsyntax-only -
	echo '#include "kvpull.h"' | $(CXX) -std=c++11 -Wall -Wextra -Werror -Iinclude -x c++ -fsyntax-only -
	touch $@

# Every test program, built and not run (the clang stage of scripts/test.sh).
tests: $(UNIT_BIN) $(RDMA_BIN) build/header-check

unit: $(UNIT_BIN) build/header-check
	@pass=0; fail=0; \
	for t in $(UNIT_BIN); do \
		if $$t; then pass=$$((pass+1)); else fail=$$((fail+1)); echo "FAILED: $$t"; fi; \
	done; \
	if CC='$(CC)' sh tests/check_strerror.sh .; then pass=$$((pass+1)); else fail=$$((fail+1)); echo "FAILED: tests/check_strerror.sh"; fi; \
	echo "unit programs: $$pass passed, $$fail failed"; test $$fail -eq 0

check-tool: build/tools/kvpull-plan
	sh tests/test_tool.sh build/tools/kvpull-plan

test: unit check-tool

bench: build/tools/kvpull-bench
	build/tools/kvpull-bench

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PKGDIR) $(DESTDIR)$(BINDIR)
	install -m 644 include/kvpull.h $(DESTDIR)$(INCDIR)/
	install -m 644 build/libkvpull.a $(DESTDIR)$(LIBDIR)/
	install -m 755 build/libkvpull.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvpull.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvpull.so.$(SOMAJOR)
	ln -sf libkvpull.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libkvpull.so
	install -m 644 build/kvpull.pc $(DESTDIR)$(PKGDIR)/
	$(if $(TOOL_BIN),install -m 755 $(TOOL_BIN) $(DESTDIR)$(BINDIR)/)

uninstall:
	rm -f $(DESTDIR)$(INCDIR)/kvpull.h $(DESTDIR)$(LIBDIR)/libkvpull.a \
		$(DESTDIR)$(LIBDIR)/libkvpull.so* $(DESTDIR)$(PKGDIR)/kvpull.pc \
		$(addprefix $(DESTDIR)$(BINDIR)/,$(notdir $(TOOL_BIN)))

clean:
	rm -rf build

.SECONDARY:
.PHONY: all tests unit check-tool test bench install uninstall clean

# --- fuzz: libFuzzer targets, tests/fuzz/fuzz_*.c (clang only) -------------
# The plan/ sources are compiled into each target so that they carry the
# fuzzer's coverage instrumentation. Run: build/fuzz/fuzz_meta CORPUS_DIR
FUZZ_CC ?= clang
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=build/fuzz/%)

# build/fuzz/seeds DIR writes seed corpora from the presets (DIR/meta,
# DIR/spec, DIR/plan); scripts/fuzz.sh runs every target for a bounded time.

fuzz: $(FUZZ_BIN) build/fuzz/seeds

build/fuzz/fuzz_%: tests/fuzz/fuzz_%.c $(PLAN_SRC) $(wildcard include/*.h plan/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=gnu11 $(WARN) -g -O1 -fno-omit-frame-pointer \
		-fsanitize=fuzzer,address,undefined \
		-fno-sanitize-recover=undefined -Iinclude -Iplan -o $@ $< \
		$(PLAN_SRC)

build/fuzz/seeds: tests/fuzz/seeds.c $(PLAN_SRC) $(wildcard include/*.h plan/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=gnu11 $(WARN) -g -O1 -Iinclude -Iplan -o $@ $< $(PLAN_SRC)

.PHONY: fuzz
# --- end fuzz ---------------------------------------------------------------

# --- check-rdma: tests/rdma_*.c on soft-RoCE (scripts/rxe-vm.sh) ----------
# Builds every RDMA test and runs them, one command line each, in one VM
# with two rxe devices (rxe0, and rxe1 across a veth pair for the
# cross-device cases); on a host with RDMA devices, or with
# KVP_RDMA_DIRECT=1, rxe-vm.sh runs them directly. Each test prints
# "N passed, N failed"; the target fails if any command fails.
RDMA_VM_TIMEOUT ?= 600
RDMA_VM_FLAGS ?=

check-rdma: $(RDMA_BIN)
	scripts/rxe-vm.sh --devices 2 --timeout $(RDMA_VM_TIMEOUT) \
		$(RDMA_VM_FLAGS) --files "$(addprefix $(CURDIR)/,$(RDMA_BIN))" \
		-- $(RDMA_BIN)

.PHONY: check-rdma
# --- end check-rdma ---------------------------------------------------------
