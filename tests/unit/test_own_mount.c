/*
 * test_own_mount.c — unit tests for fs/daemon/own_mount.c's child (the one a
 * daemon makes for its calls through its own mount): with a session
 * descriptor set the calls run in a clone(CLONE_VM|CLONE_VFORK) child (a
 * fork() under ThreadSanitizer), here on a scratch directory under /dev/shm
 * instead of a mount.  A rename replaces its target and a failed one returns
 * the call's errno; hundreds of calls in a row work (the child runs on the
 * calling thread's stack).  (The flip of `current` makes its symlink in the
 * namespace and only the rename through the mount: daemon_commit.c.)
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "own_mount.h"
#include "tmpdir.h"

struct fx {
	char dir[64], tmp[128], cur[128];
	int fd;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	assert_non_null(f);
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-om-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->tmp, sizeof(f->tmp), "%s/.tmp", f->dir);
	snprintf(f->cur, sizeof(f->cur), "%s/current", f->dir);
	/* any descriptor: own_mount only needs to know a session exists */
	f->fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	assert_true(f->fd >= 0);
	own_mount_set_fd(f->fd);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	own_mount_set_fd(-1);
	close(f->fd);
	rm_rf(f->dir);
	free(f);
	return 0;
}

static void assert_link(const char *path, const char *want)
{
	char buf[256];
	ssize_t n = readlink(path, buf, sizeof(buf) - 1);

	assert_true(n > 0);
	buf[n] = '\0';
	assert_string_equal(buf, want);
}

static void test_rename_replaces_the_link(void **state)
{
	struct fx *f = *state;

	assert_int_equal(symlink("versions/a", f->cur), 0);
	assert_int_equal(symlink("versions/b", f->tmp), 0);
	assert_int_equal(own_mount_rename(f->tmp, f->cur), 0);
	assert_link(f->cur, "versions/b");
	assert_int_equal(access(f->tmp, F_OK), -1); /* renamed away */
}

static void test_rename_failure_is_the_errno(void **state)
{
	struct fx *f = *state;
	char dir_target[160], sub[160];

	/* onto a non-empty directory */
	assert_int_equal(symlink("versions/b", f->tmp), 0);
	snprintf(dir_target, sizeof(dir_target), "%s/d", f->dir);
	assert_int_equal(mkdir(dir_target, 0700), 0);
	snprintf(sub, sizeof(sub), "%s/d/x", f->dir);
	assert_int_equal(mkdir(sub, 0700), 0);
	assert_int_equal(own_mount_rename(f->tmp, dir_target), -EISDIR);
	assert_int_equal(errno, EISDIR);
	assert_link(f->tmp, "versions/b"); /* nothing moved */
}

static void test_rename_alone(void **state)
{
	struct fx *f = *state;
	char other[160];

	assert_int_equal(symlink("versions/c", f->tmp), 0);
	assert_link(f->tmp, "versions/c");
	snprintf(other, sizeof(other), "%s/other", f->dir);
	assert_int_equal(own_mount_rename(f->tmp, other), 0);
	assert_link(other, "versions/c");
	assert_int_equal(own_mount_rename(f->tmp, other), -ENOENT);
	assert_int_equal(errno, ENOENT);
}

static void test_many_renames_in_a_row(void **state)
{
	struct fx *f = *state;
	char target[32];

	/* the calling thread's stack carries the child: a few hundred in a row must all work */
	for (int i = 0; i < 200; i++) {
		snprintf(target, sizeof(target), "versions/v%d", i);
		assert_int_equal(symlink(target, f->tmp), 0);
		assert_int_equal(own_mount_rename(f->tmp, f->cur), 0);
	}
	assert_link(f->cur, "versions/v199");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_rename_replaces_the_link, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_failure_is_the_errno, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_renames_in_a_row, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
