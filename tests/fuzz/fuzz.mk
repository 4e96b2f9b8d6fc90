# tests/fuzz/fuzz.mk — the fuzz targets' seed corpora as a normal test
# (tests/fuzz/README.md).  Included at the end of the Makefile, whose
# variables it uses (CC, INC_ALL, PKG_CFLAGS, LIBS).
#
#   make fuzz-replay   every target of FUZZ_TARGETS, built with $(CC) (gcc: no
#                      clang, no libFuzzer) and tests/fuzz/replay.c under
#                      ASan/UBSan against build-asan/libhwfs-core.a, replays
#                      every file of tests/fuzz/corpus/<target without fuzz_>/
#                      once; a violated invariant or any sanitizer report
#                      fails it.  Part of `make test`; seconds.
#   make fuzz-corpus   rewrite the generated seeds (tests/fuzz/gen_corpus.c)
#                      and check that every target still takes them all
#
# `make fuzz` (clang, libFuzzer) builds the same FUZZ_TARGETS for open-ended
# fuzzing, from the same seeds.

ifndef HWFS_FUZZ_MK
HWFS_FUZZ_MK := $(lastword $(MAKEFILE_LIST))

# Every libFuzzer target: tests/fuzz/<name>.c, seeds in tests/fuzz/corpus/<name without fuzz_>/.
FUZZ_TARGETS := fuzz_safetensors fuzz_manifest fuzz_proto fuzz_delta fuzz_partition
FUZZ_CORPUS  := tests/fuzz/corpus
FUZZ_REPLAY_DIR  := build-asan/fuzz-replay
FUZZ_REPLAY_BINS := $(FUZZ_TARGETS:%=$(FUZZ_REPLAY_DIR)/%)
FUZZ_ASAN_LIB    := build-asan/libhwfs-core.a
# The flags `make asan` builds build-asan/ with (the Makefile's asan rule).
FUZZ_ASAN_CFLAGS  := -fsanitize=address,undefined -fno-omit-frame-pointer -O1
FUZZ_ASAN_LDFLAGS := -fsanitize=address,undefined
# The targets themselves: every UBSan finding fatal too, warnings are errors.
FUZZ_REPLAY_CFLAGS := -std=gnu11 -g -O1 -Wall -Wextra -Werror -Wno-unused-parameter -pthread \
	-D_FILE_OFFSET_BITS=64 -fsanitize=address,undefined -fno-sanitize-recover=all \
	-fno-omit-frame-pointer $(INC_ALL) $(PKG_CFLAGS)
# The library was built with recoverable UBSan checks: halt_on_error makes
# them fatal as well (abort_on_error: by SIGABRT, so that replay.c names the
# input); leaks fail as under libFuzzer.  The caller's options come first, so
# these win.
FUZZ_REPLAY_ENV := ASAN_OPTIONS="$${ASAN_OPTIONS:+$$ASAN_OPTIONS:}detect_leaks=1:abort_on_error=0" \
	UBSAN_OPTIONS="$${UBSAN_OPTIONS:+$$UBSAN_OPTIONS:}print_stacktrace=1:halt_on_error=1:abort_on_error=1"
# A sub-make's options: it reads this file even where it was given with -f.
FUZZ_SUBMAKE = --no-print-directory -f $(firstword $(MAKEFILE_LIST)) -f $(HWFS_FUZZ_MK)

.PHONY: fuzz-replay fuzz-replay-build fuzz-corpus

fuzz-replay:
	@$(MAKE) --no-print-directory BUILD=build-asan EXTRA_CFLAGS="$(FUZZ_ASAN_CFLAGS)" \
		EXTRA_LDFLAGS="$(FUZZ_ASAN_LDFLAGS)" $(FUZZ_ASAN_LIB)
	@$(MAKE) $(FUZZ_SUBMAKE) fuzz-replay-build
	@set -e; start=$$(date +%s%N); total=0; \
	for t in $(FUZZ_TARGETS); do \
		out=$$($(FUZZ_REPLAY_ENV) $(FUZZ_REPLAY_DIR)/$$t $(FUZZ_CORPUS)/$${t#fuzz_}) || { \
			echo "$$out"; echo "fuzz-replay: FAILED: $$t (its report above)"; exit 1; }; \
		echo "$$out"; \
		total=$$((total + $$(echo "$$out" | awk '/ inputs replayed/ { print $$2 }'))); \
	done; \
	echo "fuzz-replay: $(words $(FUZZ_TARGETS)) targets, $$total inputs replayed under ASan/UBSan," \
		"no failure ($$(( ($$(date +%s%N) - start) / 1000000 )) ms)"

fuzz-replay-build: $(FUZZ_REPLAY_BINS)
	@:

$(FUZZ_REPLAY_DIR)/replay.o: tests/fuzz/replay.c
	@mkdir -p $(dir $@)
	$(CC) $(FUZZ_REPLAY_CFLAGS) -MMD -MP -c -o $@ $<

$(FUZZ_REPLAY_BINS): $(FUZZ_REPLAY_DIR)/%: tests/fuzz/%.c $(FUZZ_REPLAY_DIR)/replay.o $(FUZZ_ASAN_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(FUZZ_REPLAY_CFLAGS) -MMD -MP -MF $@.d -MT $@ -o $@ $< \
		$(FUZZ_REPLAY_DIR)/replay.o $(FUZZ_ASAN_LIB) $(LIBS)

# The seed generator: gen_corpus.c (the program, delta and proto seeds) and
# gen_corpus_files.c (the file parsers' seeds).
GEN_CORPUS_SRCS := tests/fuzz/gen_corpus.c tests/fuzz/gen_corpus_files.c
$(FUZZ_REPLAY_DIR)/gen_corpus: $(GEN_CORPUS_SRCS) tests/fuzz/gen_corpus.h $(FUZZ_ASAN_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(FUZZ_REPLAY_CFLAGS) -o $@ $(GEN_CORPUS_SRCS) $(FUZZ_ASAN_LIB) $(LIBS)

-include $(FUZZ_REPLAY_BINS:=.d) $(FUZZ_REPLAY_DIR)/replay.d

# The generated seeds (gen_corpus.c says which); the hand-written ones stay.
fuzz-corpus:
	@$(MAKE) --no-print-directory BUILD=build-asan EXTRA_CFLAGS="$(FUZZ_ASAN_CFLAGS)" \
		EXTRA_LDFLAGS="$(FUZZ_ASAN_LDFLAGS)" $(FUZZ_ASAN_LIB)
	@$(MAKE) $(FUZZ_SUBMAKE) $(FUZZ_REPLAY_DIR)/gen_corpus
	$(FUZZ_REPLAY_ENV) $(FUZZ_REPLAY_DIR)/gen_corpus $(FUZZ_CORPUS)
	@$(MAKE) $(FUZZ_SUBMAKE) fuzz-replay

endif
