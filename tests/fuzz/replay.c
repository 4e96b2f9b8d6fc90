/*
 * replay.c — a main() for the libFuzzer targets without libFuzzer: replays
 * the files of the corpus directories (or single files) given as arguments
 * through LLVMFuzzerTestOneInput(), once each, in name order, and exits 0
 * when every input ran.  It is what `make test` runs (fuzz-replay in
 * tests/fuzz/fuzz.mk, built with gcc under ASan/UBSan): a target's own
 * invariant (die(), abort()) or a sanitizer report ends the process with a
 * non-zero status, after a line naming the input that did it.
 *
 * Like libFuzzer, it calls LLVMFuzzerInitialize() first when the target has
 * one, and hands every input in a buffer of exactly its size, so that
 * AddressSanitizer sees a read past its end.
 *
 *   build-asan/fuzz-replay/fuzz_proto tests/fuzz/corpus/proto
 *   -> fuzz_proto: 25 inputs replayed (tests/fuzz/corpus/proto)
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerInitialize(int *argc, char ***argv) __attribute__((weak));

/* From the sanitizer runtime (sanitizer/common_interface_defs.h). */
void __sanitizer_set_death_callback(void (*callback)(void)) __attribute__((weak));

static const char *prog = "replay";
static char current[4096]; /* the input being run, for the crash line */

/* Name the input that crashed (async-signal-safe: write(2) only). */
static void say_current(void)
{
	static const char pre[] = ": crashed on input ";

	if (!current[0])
		return;
	if (write(2, "\n", 1) < 0 || write(2, prog, strlen(prog)) < 0 ||
	    write(2, pre, sizeof(pre) - 1) < 0 || write(2, current, strlen(current)) < 0 ||
	    write(2, "\n", 1) < 0)
		return;
}

/* abort() (a target's die()) or a signal no sanitizer handles: name the input, die by it. */
static void on_signal(int sig)
{
	say_current();
	signal(sig, SIG_DFL);
	raise(sig);
}

static void fail(const char *what, const char *path)
{
	fprintf(stderr, "%s: %s: %s: %s\n", prog, what, path, strerror(errno));
	exit(2);
}

/* Run the file at @path through the target. */
static void replay_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	struct stat st;
	uint8_t *buf;
	size_t n;

	if (!f)
		fail("cannot open", path);
	if (fstat(fileno(f), &st) < 0)
		fail("cannot stat", path);
	n = (size_t)st.st_size;
	buf = malloc(n ? n : 1);
	if (!buf)
		fail("out of memory for", path);
	if (n && fread(buf, 1, n, f) != n)
		fail("cannot read", path);
	fclose(f);
	snprintf(current, sizeof(current), "%s", path);
	if (n == 0) { /* as libFuzzer: a valid pointer to no bytes */
		free(buf);
		buf = malloc(0);
	}
	LLVMFuzzerTestOneInput(buf, n);
	free(buf);
	current[0] = '\0';
}

static int by_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Replay every regular file directly in @dir, in name order; returns how many. */
static size_t replay_dir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char **names = NULL;
	size_t n = 0, cap = 0, done = 0;

	if (!d)
		fail("cannot open directory", dir);
	while ((errno = 0, e = readdir(d))) {
		char *p;
		struct stat st;

		if (e->d_name[0] == '.')
			continue;
		if (asprintf(&p, "%s/%s", dir, e->d_name) < 0)
			fail("out of memory in", dir);
		if (stat(p, &st) < 0)
			fail("cannot stat", p);
		if (!S_ISREG(st.st_mode)) {
			free(p);
			continue;
		}
		if (n == cap) {
			cap = cap ? cap * 2 : 64;
			names = realloc(names, cap * sizeof(*names));
			if (!names)
				fail("out of memory in", dir);
		}
		names[n++] = p;
	}
	if (errno)
		fail("cannot read directory", dir);
	closedir(d);
	if (n)
		qsort(names, n, sizeof(*names), by_name);
	for (size_t i = 0; i < n; i++) {
		replay_file(names[i]);
		free(names[i]);
		done++;
	}
	free(names);
	return done;
}

int main(int argc, char **argv)
{
	static const int sigs[] = {SIGABRT, SIGBUS, SIGFPE, SIGILL, SIGSEGV};
	size_t total = 0;
	const char *slash = strrchr(argv[0], '/');

	prog = slash ? slash + 1 : argv[0];
	if (argc < 2) {
		fprintf(stderr, "usage: %s CORPUS_DIR|FILE...\n", prog);
		return 2;
	}
	for (size_t i = 0; i < sizeof(sigs) / sizeof(sigs[0]); i++) {
		struct sigaction old;

		/* where a sanitizer handles the signal, its report (and death callback) does */
		if (sigaction(sigs[i], NULL, &old) == 0 && old.sa_handler == SIG_DFL)
			signal(sigs[i], on_signal);
	}
	if (__sanitizer_set_death_callback)
		__sanitizer_set_death_callback(say_current);
	if (LLVMFuzzerInitialize)
		LLVMFuzzerInitialize(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		struct stat st;

		if (stat(argv[i], &st) < 0)
			fail("cannot stat", argv[i]);
		if (S_ISDIR(st.st_mode)) {
			size_t n = replay_dir(argv[i]);

			if (!n) { /* an empty corpus tests nothing: a mistake */
				fprintf(stderr, "%s: no inputs in %s\n", prog, argv[i]);
				return 2;
			}
			total += n;
		} else {
			replay_file(argv[i]);
			total++;
		}
	}
	printf("%s: %zu inputs replayed (", prog, total);
	for (int i = 1; i < argc; i++)
		printf("%s%s", i > 1 ? " " : "", argv[i]);
	printf(")\n");
	return 0;
}
