/*
 * fuzz_util.h — what the libFuzzer targets share: die() reports a violated
 * invariant and aborts (libFuzzer reports a crash), one_line() checks that a
 * decoder's reason is fit to be logged.  Define FUZZ_NAME (the target's name,
 * the prefix of die's line) before including it.
 */
#ifndef HWFS_FUZZ_UTIL_H
#define HWFS_FUZZ_UTIL_H

#include <stdio.h>
#include <stdlib.h>

#ifndef FUZZ_NAME
#error "define FUZZ_NAME before including fuzz_util.h"
#endif

/* Print "FUZZ_NAME: @what[: @err]" to stderr and abort. */
static inline void __attribute__((noreturn)) die(const char *what, const char *err)
{
	fprintf(stderr, FUZZ_NAME ": %s%s%s\n", what, err ? ": " : "", err ? err : "");
	abort();
}

/* A reason is one non-empty line of printable ASCII. */
static inline int one_line(const char *s)
{
	if (!*s)
		return 0;
	for (; *s; s++)
		if (*s < 0x20 || *s >= 0x7f)
			return 0;
	return 1;
}

#endif
