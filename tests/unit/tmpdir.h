/*
 * tmpdir.h — scratch directories for unit tests that need a real store:
 * made under /dev/shm, removed with everything in them.  Header-only, for
 * tests/unit only.
 */
#ifndef HWFS_TEST_TMPDIR_H
#define HWFS_TEST_TMPDIR_H

#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* Remove @dir and everything below it. */
static inline void rm_rf(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[PATH_MAX];

	if (!d)
		return;
	while ((e = readdir(d))) {
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if ((size_t)snprintf(p, sizeof(p), "%s/%s", dir, e->d_name) >= sizeof(p))
			continue; /* cannot happen under /dev/shm/hwfs-test-* */
		if (unlink(p) < 0)
			rm_rf(p);
	}
	closedir(d);
	rmdir(dir);
}

#endif /* HWFS_TEST_TMPDIR_H */
