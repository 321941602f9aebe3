# mk/docs.mk: examples and man pages. Included by the Makefile
# (-include mk/*.mk). Targets:
#   examples              $(BUILD)/examples/{plan,producer,consumer}
#   check-examples        tests/check_examples.sh: every example built as
#                         C and C++ (gcc, clang), plan run, README quotes
#   check-examples-rdma   producer and consumer in the soft-RoCE VM
#   check-man             tests/check_man.sh: mandoc -Tlint, one page or
#                         link per exported symbol
#   check-links           tests/check_links.sh: every relative link of
#                         README.md, docs/ and the READMEs resolves
#   check-defaults        tests/check_defaults.sh: kvp_agent_attr's defaults
#                         agree between kvpull.h, kvp_agent_open(3) and docs
#   check-docs            check-examples, check-man, check-links and
#                         check-defaults
#   install-man, uninstall-man (prerequisites of install and uninstall)
# Variables: MANDIR (default $(PREFIX)/share/man).

# Keep the Makefile's default goal whatever the include's position.
docs_goal := $(.DEFAULT_GOAL)

MANDIR ?= $(PREFIX)/share/man
MAN_PAGES := $(sort $(wildcard man/man1/*.1 man/man3/*.3 man/man7/*.7))
EXAMPLE_SRC := $(sort $(wildcard examples/*.c))
EXAMPLE_BIN := $(EXAMPLE_SRC:examples/%.c=$(BUILD)/examples/%)
EXAMPLES_VM_TIMEOUT ?= 300
# The pair without, then with a shared secret (32 bytes).
EXAMPLES_PAIR = $(CURDIR)/examples/run-pair.sh $(abspath $(BUILD))/examples/producer $(abspath $(BUILD))/examples/consumer

$(BUILD)/examples/%: examples/%.c $(wildcard examples/*.h) include/kvpull.h $(BUILD)/libkvpull.a
	@mkdir -p $(dir $@)
	$(CC) -std=c11 -Wall -Wextra -Werror -Iinclude $(CFLAGS) $(LDFLAGS) \
		-o $@ $< $(BUILD)/libkvpull.a -lrdmacm -libverbs -lpthread

examples: $(EXAMPLE_BIN)

check-examples: $(BUILD)/libkvpull.a $(BUILD)/libkvpull.so
	sh tests/check_examples.sh $(BUILD)

check-examples-rdma: $(BUILD)/examples/producer $(BUILD)/examples/consumer
	scripts/rxe-vm.sh --timeout $(EXAMPLES_VM_TIMEOUT) $(RDMA_VM_FLAGS) \
		--files "$(abspath $(BUILD))/examples $(CURDIR)/examples/run-pair.sh" \
		-- "$(EXAMPLES_PAIR)" \
		'KVPULL_SECRET=kvpull-example-secret-32-bytes!! $(EXAMPLES_PAIR) "$$KVP_ADDR0" 18901'

check-man: $(BUILD)/libkvpull.so
	sh tests/check_man.sh man $(BUILD)/libkvpull.so

check-links:
	sh tests/check_links.sh

check-defaults:
	sh tests/check_defaults.sh

check-docs: check-examples check-man check-links check-defaults

# Each page's other names (its .Nm lines) become symbolic links to it, as
# liburing installs its pages: kvp_layout_destroy.3 -> kvp_layout_create.3.
install-man:
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man3 $(DESTDIR)$(MANDIR)/man7
	for p in $(MAN_PAGES); do \
		s=$$(basename $$(dirname $$p)); b=$$(basename $$p); \
		install -m 644 $$p $(DESTDIR)$(MANDIR)/$$s/ || exit 1; \
		for n in $$(sed -n 's/^\.Nm \([A-Za-z0-9_.-]*\).*/\1/p' $$p); do \
			[ "$$n.$${s#man}" = "$$b" ] || \
			ln -sf $$b $(DESTDIR)$(MANDIR)/$$s/$$n.$${s#man} || exit 1; \
		done; \
	done

uninstall-man:
	for p in $(MAN_PAGES); do \
		s=$$(basename $$(dirname $$p)); \
		for n in $$(sed -n 's/^\.Nm \([A-Za-z0-9_.-]*\).*/\1/p' $$p); do \
			rm -f $(DESTDIR)$(MANDIR)/$$s/$$n.$${s#man}; \
		done; \
		rm -f $(DESTDIR)$(MANDIR)/$$s/$$(basename $$p); \
	done

install: install-man
uninstall: uninstall-man

.PHONY: examples check-examples check-examples-rdma check-man check-docs \
	check-links check-defaults \
	install-man uninstall-man

.DEFAULT_GOAL := $(if $(docs_goal),$(docs_goal),all)
