# hwfs — build, test, demo, benchmark.
#
#   make          build/hwfs and the unit tests
#   make test     install missing dependencies, build, run unit + integration tests
#   make demo     install missing dependencies, build, run the end-to-end demo
#   make bench    install missing dependencies, build, run the single-node benchmark
#   make asan     build with AddressSanitizer/UBSan into build-asan/
#   make fuzz     libFuzzer targets (clang) for every parser of untrusted bytes
#   make bench-cluster  replication benchmark in network namespaces
#
# Dependencies are found with pkg-config; tools/install-deps.sh installs the
# Debian and Python packages that are missing.

BUILD   ?= build
CC      ?= cc
PKGS    := fuse3 sqlite3 libzmq libxxhash jansson
PKG_CFLAGS := $(shell pkg-config --cflags $(PKGS) 2>/dev/null)
PKG_LIBS   := $(shell pkg-config --libs $(PKGS) 2>/dev/null)
CMOCKA_LIBS := $(shell pkg-config --libs cmocka 2>/dev/null)

CFLAGS  ?= -O2 -g
CFLAGS  += -std=gnu11 -Wall -Wextra -Werror -Wno-unused-parameter -pthread \
           -Iinclude -D_FILE_OFFSET_BITS=64 $(PKG_CFLAGS) $(EXTRA_CFLAGS)
LDFLAGS += -pthread $(EXTRA_LDFLAGS)
LIBS    := $(PKG_LIBS) -ldl

LIB_SRCS := $(wildcard fs/*.c replicator/*.c gpu/*.c)
LIB_OBJS := $(LIB_SRCS:%.c=$(BUILD)/%.o)
TOOL_SRCS := $(wildcard tools/*.c)
TOOL_OBJS := $(TOOL_SRCS:%.c=$(BUILD)/%.o)
UNIT_SRCS := $(wildcard tests/unit/test_*.c)
UNIT_BINS := $(UNIT_SRCS:tests/unit/%.c=$(BUILD)/tests/%)

.PHONY: all deps test unit integration integration-asan demo bench bench-cluster asan clean fuzz format

all: $(BUILD)/hwfs $(UNIT_BINS)

$(BUILD)/%.o: %.c $(wildcard include/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c -o $@ $<

$(BUILD)/libhwfs.a: $(LIB_OBJS)
	@mkdir -p $(dir $@)
	rm -f $@ && ar rcs $@ $^

$(BUILD)/hwfs: $(TOOL_OBJS) $(BUILD)/libhwfs.a
	$(CC) $(LDFLAGS) -o $@ $(TOOL_OBJS) $(BUILD)/libhwfs.a $(LIBS)

$(BUILD)/tests/%: tests/unit/%.c $(BUILD)/libhwfs.a $(wildcard include/*.h)
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) $(LDFLAGS) -o $@ $< $(BUILD)/libhwfs.a $(LIBS) $(CMOCKA_LIBS)

deps:
	@tools/install-deps.sh

unit: all
	@set -e; for t in $(UNIT_BINS); do echo "== $$t"; $$t; done

integration: all
	python3 -m pytest -q tests/integration

# The README's test command: installs what is missing, builds with
# -Werror, runs the unit tests under ASan/UBSan and optimised, then the
# integration tests twice: against the optimised daemon, and against the
# ASan/UBSan daemon (any sanitizer report fails the run).
test: deps
	$(MAKE) all
	$(MAKE) asan
	@set -e; for t in $(UNIT_BINS:$(BUILD)/%=build-asan/%); do echo "== $$t"; $$t; done
	$(MAKE) unit
	python3 -m pytest -q -p no:cacheprovider tests/integration
	$(MAKE) integration-asan

SAN_LOG := build-asan/sanitizer-logs
integration-asan: asan
	rm -rf $(SAN_LOG) && mkdir -p $(SAN_LOG)
	HWFS_BIN=$(CURDIR)/build-asan/hwfs \
	ASAN_OPTIONS=detect_leaks=1:log_path=$(CURDIR)/$(SAN_LOG)/asan \
	UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:log_path=$(CURDIR)/$(SAN_LOG)/ubsan \
		python3 -m pytest -q -p no:cacheprovider tests/integration
	@if [ -n "$$(ls -A $(SAN_LOG))" ]; then cat $(SAN_LOG)/*; \
		echo "sanitizer reports above"; exit 1; fi
	@echo "integration-asan: no sanitizer reports"

demo: deps
	$(MAKE) all
	tools/demo.sh

bench: deps
	$(MAKE) all
	python3 tools/bench.py

# Replication across nodes in network namespaces with tc-capped links
# (needs root, iproute2, rsync; about half an hour: every point 3 times).
bench-cluster: deps
	$(MAKE) all
	python3 tools/bench_cluster.py --reps 3

asan:
	$(MAKE) BUILD=build-asan EXTRA_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -O1" \
		EXTRA_LDFLAGS="-fsanitize=address,undefined" all

fuzz:
	$(MAKE) BUILD=build-fuzz CC=clang EXTRA_CFLAGS="-fsanitize=fuzzer-no-link,address,undefined" \
		EXTRA_LDFLAGS="-fsanitize=address,undefined" build-fuzz/libhwfs.a
	@mkdir -p build-fuzz
	clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude $(PKG_CFLAGS) \
		-o build-fuzz/fuzz_safetensors tests/fuzz/fuzz_safetensors.c build-fuzz/libhwfs.a $(LIBS)
	clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude $(PKG_CFLAGS) \
		-o build-fuzz/fuzz_manifest tests/fuzz/fuzz_manifest.c build-fuzz/libhwfs.a $(LIBS)
	clang -std=gnu11 -g -O1 -fsanitize=fuzzer,address,undefined -Iinclude $(PKG_CFLAGS) \
		-o build-fuzz/fuzz_proto tests/fuzz/fuzz_proto.c build-fuzz/libhwfs.a $(LIBS)
	@echo "run e.g.: build-fuzz/fuzz_proto -max_total_time=60"

format:
	clang-format -i fs/*.c tools/*.c include/*.h tests/unit/*.c

clean:
	rm -rf build build-asan build-fuzz
