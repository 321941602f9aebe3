# kvpull: one plain Makefile. Targets: all tests unit check-tool test
# check-floors check-rdma fuzz install uninstall clean bench print-build.
# Variables: PREFIX DESTDIR CC SANITIZE=1 WERROR=1 BUILD.
#
# Every configuration builds in its own directory, so that no sequence of
# commands mixes objects of two configurations:
#   make                     build/             (cc: gcc on Debian)
#   make SANITIZE=1          build/asan/        (ASan + UBSan)
#   make CC=clang            build/clang/
#   make CC=clang SANITIZE=1 build/clang-asan/
#   make fuzz                build/fuzz/        (clang, libFuzzer; FUZZ_BUILD)
# BUILD=DIR overrides the choice. Within a directory, a change of compiler
# or flags (CC, CFLAGS, LDFLAGS, WERROR) rebuilds everything: they are
# recorded in $(BUILD)/config. `make clean` removes every configuration.
PREFIX ?= /usr/local
LIBDIR ?= $(PREFIX)/lib
INCDIR ?= $(PREFIX)/include
BINDIR ?= $(PREFIX)/bin
PKGDIR ?= $(LIBDIR)/pkgconfig
DATADIR ?= $(PREFIX)/share/kvpull

VERSION := 0.2.0
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

# The build directory of this configuration: the compiler by the name it is
# called (clang, clang-14, /usr/bin/clang: "clang"; anything else is the
# default) and the sanitizers.
CC_KIND := $(if $(findstring clang,$(notdir $(firstword $(CC)))),clang)
SAN_KIND := $(if $(filter 1,$(SANITIZE)),asan)
BUILD_TAG := $(CC_KIND)$(if $(CC_KIND),$(if $(SAN_KIND),-))$(SAN_KIND)
BUILD ?= build$(if $(BUILD_TAG),/$(BUILD_TAG))
FUZZ_BUILD ?= build/fuzz

# $(BUILD)/config holds what the objects depend on besides their sources;
# it is rewritten (and everything rebuilt) only when that changes. Not for
# goals that build nothing.
NOBUILD_GOALS := clean print-build uninstall fuzz $(FUZZ_BUILD)/%
BUILDS := $(if $(MAKECMDGOALS),$(filter-out $(NOBUILD_GOALS),$(MAKECMDGOALS)),all)
BUILD_CONFIG := CC=$(CC) CXX=$(CXX) CFLAGS=$(ALL_CFLAGS) LDFLAGS=$(LDFLAGS)
ifneq ($(BUILDS),)
ifneq ($(BUILD_CONFIG),$(file <$(BUILD)/config))
$(shell mkdir -p $(BUILD))
$(file >$(BUILD)/config,$(BUILD_CONFIG))
endif
endif

PLAN_SRC := $(sort $(wildcard plan/*.c))
VERBS_SRC := $(sort $(wildcard verbs/*.c))
PLAN_OBJ := $(PLAN_SRC:%.c=$(BUILD)/%.o)
VERBS_OBJ := $(VERBS_SRC:%.c=$(BUILD)/%.o)
VERBS_LIBS := $(if $(VERBS_SRC),-lrdmacm -libverbs -lpthread)

UNIT_SRC := $(sort $(wildcard tests/test_*.c))
UNIT_BIN := $(UNIT_SRC:tests/%.c=$(BUILD)/tests/%)
# RDMA_SKIP: test names (rdma_loopback ...) check-rdma leaves out.
RDMA_SKIP ?=
RDMA_SRC := $(filter-out $(RDMA_SKIP:%=tests/%.c),$(sort $(wildcard tests/rdma_*.c)))
RDMA_BIN := $(RDMA_SRC:tests/%.c=$(BUILD)/tests/%)
TOOL_SRC := $(sort $(wildcard tools/*.c))
TOOL_BIN := $(TOOL_SRC:tools/%.c=$(BUILD)/tools/%)
# tools/lib/: shared by the tools (an archive: each takes what it uses);
# tools/plan/: the pieces of kvpull-plan.
TOOLLIB_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tools/lib/*.c)))
PLANTOOL_OBJ := $(patsubst %.c,$(BUILD)/%.o,$(sort $(wildcard tools/plan/*.c)))
TOOL_HDR := $(wildcard include/*.h tests/lib/*.h tools/*/*.h)
TESTLIB_SRC := $(sort $(wildcard tests/lib/*.c))
TESTLIB_OBJ := $(TESTLIB_SRC:%.c=$(BUILD)/%.o)

all: $(BUILD)/libkvpull.a $(BUILD)/libkvpull.so $(BUILD)/kvpull.pc $(TOOL_BIN)

$(BUILD)/%.o: %.c $(wildcard include/*.h plan/*.h verbs/*.h tests/lib/*.h) $(BUILD)/config
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

# plan/ and verbs/ are separate archives: plan/ must link without verbs.
$(BUILD)/libkvpull_plan.a: $(PLAN_OBJ)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libkvpull_verbs.a: $(VERBS_OBJ)
	rm -f $@ && ar rcs $@ $^
$(BUILD)/libkvpull.a: $(PLAN_OBJ) $(VERBS_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libkvpull.so: $(PLAN_OBJ) $(VERBS_OBJ) kvpull.map
	$(CC) -shared -Wl,-soname,libkvpull.so.$(SOMAJOR) -Wl,-z,defs \
		-Wl,--version-script=kvpull.map $(LDFLAGS) -o $(BUILD)/libkvpull.so.$(VERSION) \
		$(PLAN_OBJ) $(VERBS_OBJ) $(VERBS_LIBS)
	ln -sf libkvpull.so.$(VERSION) $(BUILD)/libkvpull.so.$(SOMAJOR)
	ln -sf libkvpull.so.$(VERSION) $@

# kvpull.pc says the PREFIX/LIBDIR/INCDIR of the command that makes it, and
# `make install` makes it again when they changed: `make` then
# `make install PREFIX=/opt/kvp` installs a kvpull.pc that says /opt/kvp.
# Directories under PREFIX are written relative to ${prefix}.
# $(BUILD)/pc.vars records them the way $(BUILD)/config records the flags.
PC_LIBDIR := $(patsubst $(PREFIX)/%,$${prefix}/%,$(LIBDIR))
PC_INCDIR := $(patsubst $(PREFIX)/%,$${prefix}/%,$(INCDIR))
PC_VARS := prefix=$(PREFIX) libdir=$(PC_LIBDIR) includedir=$(PC_INCDIR) libs=$(VERBS_LIBS) datadir=$(DATADIR)
ifneq ($(BUILDS),)
ifneq ($(PC_VARS),$(file <$(BUILD)/pc.vars))
$(shell mkdir -p $(BUILD))
$(file >$(BUILD)/pc.vars,$(PC_VARS))
endif
endif

$(BUILD)/kvpull.pc: $(BUILD)/pc.vars Makefile
	@mkdir -p $(@D)
	printf 'prefix=%s\nlibdir=%s\nincludedir=%s\n\nName: kvpull\nDescription: KV-cache block transfer over RDMA READs\nVersion: %s\nLibs: -L$${libdir} -lkvpull\nLibs.private: %s\nCflags: -I$${includedir}\n' \
		'$(PREFIX)' '$(PC_LIBDIR)' '$(PC_INCDIR)' '$(VERSION)' '$(VERBS_LIBS)' > $@

# Unit tests of the pure parts of verbs/ compile them in (test_hmac.c, test_credit.c,
# test_lease.c, test_limits.c).
VERBS_PURE := verbs/hmac.c verbs/hmac.h verbs/limits.c verbs/limits.h \
	verbs/hello.c verbs/hello.h \
	verbs/credit.c verbs/credit.h verbs/lease.c verbs/lease.h
# test_metrics.c: the histograms and the metrics exposition writer
VERBS_PURE += verbs/expo.c verbs/expo.h verbs/hist.h
$(BUILD)/tests/test_%: tests/test_%.c $(VERBS_PURE) $(BUILD)/config $(TESTLIB_OBJ) $(BUILD)/libkvpull_plan.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Iplan -Itests/lib $(LDFLAGS) -o $@ $< $(TESTLIB_OBJ) $(BUILD)/libkvpull_plan.a -lcmocka

$(BUILD)/tests/rdma_%: tests/rdma_%.c tests/rdma/harness.h tests/rdma/vrules.h tools/lib/defaults.h $(BUILD)/config $(TESTLIB_OBJ) $(BUILD)/libkvpull.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/lib $(LDFLAGS) -o $@ $< $(TESTLIB_OBJ) $(BUILD)/libkvpull.a $(VERBS_LIBS)

# The tools name installed files (kvpull-plan's JSON schema) under DATADIR:
# $(BUILD)/pc.vars records it, so a new PREFIX rebuilds them.
$(BUILD)/tools/%.o: tools/%.c $(TOOL_HDR) $(BUILD)/config $(BUILD)/pc.vars
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DKVP_DATADIR='"$(DATADIR)"' -Itests/lib -Itools/lib -c -o $@ $<

$(BUILD)/libkvpull_tools.a: $(TOOLLIB_OBJ)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/tools/kvpull-plan: $(PLANTOOL_OBJ)

$(BUILD)/tools/%: tools/%.c $(TOOL_HDR) $(BUILD)/config $(TESTLIB_OBJ) $(BUILD)/libkvpull_tools.a $(BUILD)/libkvpull.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Itests/lib -Itools/lib $(LDFLAGS) -o $@ $< $(filter $(BUILD)/tools/%.o,$^) $(BUILD)/libkvpull_tools.a $(TESTLIB_OBJ) $(BUILD)/libkvpull.a $(VERBS_LIBS)

# The header must compile alone, as C and as C++.
$(BUILD)/header-check: include/kvpull.h $(BUILD)/config
	@mkdir -p $(BUILD)
	echo '#include "kvpull.h"' | $(CC) -std=c11 -Wall -Wextra -Werror -Iinclude -x c -fsyntax-only -
	echo '#include "kvpull.h"' | $(CXX) -std=c++11 -Wall -Wextra -Werror -Iinclude -x c++ -fsyntax-only -
	touch $@

# Every test program, built and not run (the clang stage of scripts/test.sh).
tests: $(UNIT_BIN) $(RDMA_BIN) $(BUILD)/header-check

unit: $(UNIT_BIN) $(BUILD)/header-check fuzz-replay
	@pass=0; fail=0; \
	for t in $(UNIT_BIN); do \
		if $$t; then pass=$$((pass+1)); else fail=$$((fail+1)); echo "FAILED: $$t"; fi; \
	done; \
	if CC='$(CC)' sh tests/check_strerror.sh .; then pass=$$((pass+1)); else fail=$$((fail+1)); echo "FAILED: tests/check_strerror.sh"; fi; \
	echo "unit programs: $$pass passed, $$fail failed"; test $$fail -eq 0

# tests/test_tool.sh checks kvpull-plan and kvpull-demo from the outside;
# tests/check_doc_outputs.sh reruns the commands whose output README.md and
# tools/README.md show (<!-- doc-output --> and <!-- doc-text --> markers).
# Each prints "N passed, N failed", and runs whatever the other's result.
check-tool: $(BUILD)/tools/kvpull-plan $(BUILD)/tools/kvpull-demo $(BUILD)/tools/kvpull-bench \
	    $(BUILD)/tools/kvpull-stream-bench
	st=0; sh tests/test_tool.sh $(BUILD)/tools/kvpull-plan || st=1; \
	sh tests/check_doc_outputs.sh $(BUILD)/tools || st=1; exit $$st

# The Python binding's tests (python/, tests/python/, pytest) on this
# configuration's shared library: plan level, no RDMA device needed.
check-python: $(BUILD)/libkvpull.so $(BUILD)/tools/kvpull-plan
	sh tests/check_python.sh $(BUILD)/libkvpull.so.$(SOMAJOR) $(BUILD)/tools/kvpull-plan

# python/bench_pull.py's C loop (scripts/rdma-bench.sh --python): a shared
# object it loads with ctypes; it calls the library through pointers.
$(BUILD)/tools/libkvpull_pullbench.so: python/bench_pull.c include/kvpull.h $(BUILD)/config
	@mkdir -p $(@D)
	$(CC) $(ALL_CFLAGS) -shared $(LDFLAGS) -o $@ python/bench_pull.c

# Floors: no call cycle between the files of each directory here, as the
# symbol tables of their objects show it (tests/check_floors.sh); and in
# verbs/, the consumer's and the producer's files never call each other,
# and the connections (conn.c) and the floor below name neither side.
FLOORS_DIRS ?= plan tools/plan verbs
FLOORS_CONSUMER := connect,engine,plans,req,post,pull
FLOORS_PRODUCER := admit,listen,inbox,serve
FLOORS_BASE := conn,srq,reg,event,wrap,limits,hmac,lease,why,hello,log,expo
FLOORS_RULES := --never 'verbs:$(FLOORS_CONSUMER)>$(FLOORS_PRODUCER)' \
	--never 'verbs:$(FLOORS_PRODUCER)>$(FLOORS_CONSUMER)' \
	--never 'verbs:$(FLOORS_BASE)>$(FLOORS_CONSUMER),$(FLOORS_PRODUCER),agent'
FLOORS_OBJ := $(foreach d,$(FLOORS_DIRS),$(patsubst %.c,$(BUILD)/%.o,$(wildcard $(d)/*.c)))

check-floors: $(FLOORS_OBJ)
	BUILD=$(BUILD) bash tests/check_floors.sh $(FLOORS_RULES) $(FLOORS_DIRS)

.PHONY: check-floors

# kvpull-plan --svg rendered in headless Chromium (tests/check_svg.sh).
check-svg: $(BUILD)/tools/kvpull-plan
	sh tests/check_svg.sh $(BUILD)/tools/kvpull-plan

test: unit check-tool

bench: $(BUILD)/tools/kvpull-bench
	$(BUILD)/tools/kvpull-bench

install: all
	install -d $(DESTDIR)$(LIBDIR) $(DESTDIR)$(INCDIR) $(DESTDIR)$(PKGDIR) $(DESTDIR)$(BINDIR)
	install -m 644 include/kvpull.h $(DESTDIR)$(INCDIR)/
	install -m 644 $(BUILD)/libkvpull.a $(DESTDIR)$(LIBDIR)/
	install -m 755 $(BUILD)/libkvpull.so.$(VERSION) $(DESTDIR)$(LIBDIR)/
	ln -sf libkvpull.so.$(VERSION) $(DESTDIR)$(LIBDIR)/libkvpull.so.$(SOMAJOR)
	ln -sf libkvpull.so.$(SOMAJOR) $(DESTDIR)$(LIBDIR)/libkvpull.so
	install -m 644 $(BUILD)/kvpull.pc $(DESTDIR)$(PKGDIR)/
	$(if $(TOOL_BIN),install -m 755 $(TOOL_BIN) $(DESTDIR)$(BINDIR)/)
	install -d $(DESTDIR)$(DATADIR)
	install -m 644 tools/kvpull-plan.schema.json $(DESTDIR)$(DATADIR)/

uninstall:
	rm -f $(DESTDIR)$(INCDIR)/kvpull.h $(DESTDIR)$(LIBDIR)/libkvpull.a \
		$(DESTDIR)$(LIBDIR)/libkvpull.so* $(DESTDIR)$(PKGDIR)/kvpull.pc \
		$(addprefix $(DESTDIR)$(BINDIR)/,$(notdir $(TOOL_BIN))) \
		$(DESTDIR)$(DATADIR)/kvpull-plan.schema.json

clean:
	rm -rf build $(filter-out build build/%,$(BUILD) $(FUZZ_BUILD))

# The build directory of this configuration, for scripts:
#   tools=$(make -s print-build)/tools
print-build:
	@echo $(BUILD)

.SECONDARY:
.PHONY: all tests unit check-tool check-python check-svg test bench install uninstall clean print-build

# --- fuzz: libFuzzer targets, tests/fuzz/fuzz_*.c (clang only) -------------
# The plan/ sources are compiled once with the fuzzer's coverage
# instrumentation and ASan+UBSan, and linked into each target; fuzz_inbox
# (the producer's receive queues, on a fake device) links the verbs/
# sources too, compiled the same way.
# Run: build/fuzz/fuzz_meta CORPUS_DIR; scripts/fuzz.sh runs them all.
# Without the stack-depth feature: it measures the stack in bytes, which
# with ASan's aligned frames depends on where ASLR put the stack, so the
# same seed found other inputs on other runs (scripts/fuzz.sh's
# deterministic mode).
FUZZ_CC ?= clang
FUZZ_SRC := $(sort $(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BIN := $(FUZZ_SRC:tests/fuzz/%.c=$(FUZZ_BUILD)/%)
FUZZ_CFLAGS := -std=gnu11 $(WARN) -g -O1 -fno-omit-frame-pointer \
	-fsanitize=address,undefined -fno-sanitize-recover=undefined \
	-fno-sanitize-coverage=stack-depth -Iinclude -Iplan
FUZZ_PLAN_OBJ := $(PLAN_SRC:%.c=$(FUZZ_BUILD)/%.o)
FUZZ_VERBS_OBJ := $(VERBS_SRC:%.c=$(FUZZ_BUILD)/%.o)
# fuzz_inbox's fake device: the verbs, rdma_cm and clock calls of verbs/
# (and the libc ones that make a run depend on more than its input)
# redirected at link time to __wrap_SYM in tests/fuzz/fuzz_inbox.c, in its
# libFuzzer and replay builds only (the library is never built so).
FUZZ_INBOX_WRAP := clock_gettime getrandom poll \
	rdma_get_devices rdma_free_devices ibv_get_device_name \
	ibv_query_device ibv_query_port ibv_alloc_pd ibv_dealloc_pd \
	ibv_create_comp_channel ibv_destroy_comp_channel ibv_create_cq \
	ibv_destroy_cq ibv_get_cq_event ibv_ack_cq_events \
	ibv_get_async_event ibv_ack_async_event ibv_reg_mr ibv_reg_mr_iova2 \
	ibv_dereg_mr ibv_create_srq ibv_destroy_srq ibv_modify_qp \
	ibv_query_qp rdma_create_event_channel rdma_destroy_event_channel \
	rdma_create_id rdma_destroy_id rdma_bind_addr rdma_listen \
	rdma_set_option rdma_create_qp rdma_destroy_qp rdma_accept \
	rdma_reject rdma_disconnect rdma_get_cm_event rdma_ack_cm_event
FUZZ_INBOX_LINK := $(addprefix -Xlinker --wrap=,$(FUZZ_INBOX_WRAP)) \
	-lrdmacm -libverbs -lpthread

# build/fuzz/seeds DIR writes seed corpora from the presets (DIR/meta,
# DIR/spec, DIR/plan).

fuzz: $(FUZZ_BIN) $(FUZZ_BUILD)/seeds

$(FUZZ_BUILD)/plan/%.o: plan/%.c $(wildcard include/*.h plan/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_PLAN_OBJ) $(wildcard include/*.h plan/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_PLAN_OBJ)

$(FUZZ_BUILD)/verbs/%.o: verbs/%.c $(wildcard include/*.h plan/*.h verbs/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link -c -o $@ $<

$(FUZZ_BUILD)/fuzz_inbox: tests/fuzz/fuzz_inbox.c $(FUZZ_VERBS_OBJ) $(FUZZ_PLAN_OBJ) $(wildcard include/*.h plan/*.h verbs/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) -fsanitize=fuzzer -o $@ $< $(FUZZ_VERBS_OBJ) \
		$(FUZZ_PLAN_OBJ) $(FUZZ_INBOX_LINK)

# Without the sanitizers: seeds.c forms text from a NULL buffer of length 0.
$(FUZZ_BUILD)/seeds: tests/fuzz/seeds.c $(PLAN_SRC) $(wildcard include/*.h plan/*.h)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) -std=gnu11 $(WARN) -g -O1 -Iinclude -Iplan -o $@ $< $(PLAN_SRC)

# The regression tests of the fuzz targets, part of `make unit`: every
# reproducer of tests/fuzz/crashes/ (<target>-*) and every input of the
# regression corpus tests/fuzz/corpus/<target>/ (scripts/fuzz.sh
# --update-corpus) through the target's LLVMFuzzerTestOneInput(), built
# with this configuration's compiler and flags (tests/fuzz/replay.c). One
# test per target.
FUZZ_TARGETS := $(FUZZ_SRC:tests/fuzz/fuzz_%.c=%)
REPLAY_BIN := $(FUZZ_TARGETS:%=$(BUILD)/tests/fuzz/replay_%)

$(BUILD)/tests/fuzz/replay_%: tests/fuzz/replay.c tests/fuzz/fuzz_%.c $(wildcard include/*.h plan/*.h) $(BUILD)/config $(BUILD)/libkvpull_plan.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -Iplan -DFUZZ_TARGET='"fuzz_$*"' $(LDFLAGS) -o $@ \
		tests/fuzz/replay.c tests/fuzz/fuzz_$*.c $(BUILD)/libkvpull_plan.a

# fuzz_inbox: the whole library, its verbs calls on the fake device.
$(BUILD)/tests/fuzz/replay_inbox: tests/fuzz/replay.c tests/fuzz/fuzz_inbox.c $(wildcard include/*.h plan/*.h verbs/*.h) $(BUILD)/config $(BUILD)/libkvpull.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -DFUZZ_TARGET='"fuzz_inbox"' $(LDFLAGS) -o $@ \
		tests/fuzz/replay.c tests/fuzz/fuzz_inbox.c $(BUILD)/libkvpull.a \
		$(FUZZ_INBOX_LINK)

fuzz-replay: $(REPLAY_BIN)
	@pass=0; fail=0; \
	$(foreach t,$(FUZZ_TARGETS),if $(BUILD)/tests/fuzz/replay_$(t) \
		$(wildcard tests/fuzz/crashes/$(t)-*) \
		$(wildcard tests/fuzz/corpus/$(t)); \
	then pass=$$((pass+1)); else fail=$$((fail+1)); fi;) \
	echo "$$pass passed, $$fail failed"; test $$fail -eq 0

.PHONY: fuzz fuzz-replay
# --- end fuzz ---------------------------------------------------------------

# --- check-rdma: tests/rdma_*.c on soft-RoCE (scripts/rxe-vm.sh) ----------
# Builds every RDMA test and runs them, one command line each, in one VM
# with two rxe devices (rxe0, and rxe1 across a veth pair for the
# cross-device cases); on a host with RDMA devices, or with
# KVP_RDMA_DIRECT=1, rxe-vm.sh runs them directly. Each test prints
# "N passed, N failed"; the target fails if any command fails.
RDMA_VM_TIMEOUT ?= 600
RDMA_VM_FLAGS ?=

# rdma_metrics checks its expositions with promtool (Debian's prometheus
# package): carried into the VM when the host has it.
PROMTOOL_FILES := $(if $(wildcard /usr/bin/promtool),--files /usr/bin/promtool)

check-rdma: $(RDMA_BIN)
	scripts/rxe-vm.sh --devices 2 --timeout $(RDMA_VM_TIMEOUT) \
		$(RDMA_VM_FLAGS) --files "$(addprefix $(CURDIR)/,$(RDMA_BIN))" \
		$(if $(filter %/rdma_metrics,$(RDMA_BIN)),$(PROMTOOL_FILES)) \
		-- $(RDMA_BIN)

.PHONY: check-rdma
# --- end check-rdma ---------------------------------------------------------

# --- fragments: mk/*.mk ------------------------------------------------------
# Optional pieces plug in here (mk/docs.mk: the man pages). They come last so
# that they see everything above: outputs go under $(BUILD), installs use
# $(DESTDIR)$(PREFIX)... A fragment hooks into the existing targets by adding
# prerequisites (`all: $(BUILD)/man`, `install: install-man`) and declares
# its own .PHONY targets. No fragment, no error.
-include mk/*.mk
