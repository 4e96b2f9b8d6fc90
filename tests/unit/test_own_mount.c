/*
 * test_own_mount.c — unit tests for fs/daemon/own_mount.c's child (the one a
 * daemon makes for its calls through its own mount): with a session
 * descriptor set the calls run in a clone(CLONE_VM|CLONE_VFORK) child (a
 * fork() under ThreadSanitizer), here on a scratch directory under /dev/shm
 * instead of a mount.  A flip makes the symlink and renames it onto the
 * target; a flip that sees the daemon stopping after its symlink does not
 * rename and leaves no temporary behind; a failed symlink or rename says
 * which step failed with the call's errno; hundreds of calls in a row work
 * (the child runs on the calling thread's stack).
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

static void test_flip_replaces_the_link(void **state)
{
	struct fx *f = *state;
	int stopping = 0, step = -1;

	assert_int_equal(symlink("versions/a", f->cur), 0);
	assert_int_equal(own_mount_flip("versions/b", f->tmp, f->cur, &stopping, &step), 0);
	assert_int_equal(step, 0);
	assert_link(f->cur, "versions/b");
	assert_int_equal(access(f->tmp, F_OK), -1); /* renamed away */
}

static void test_flip_while_stopping_does_not_rename(void **state)
{
	struct fx *f = *state;
	int stopping = 1, step = -1;
	struct stat st;

	assert_int_equal(symlink("versions/a", f->cur), 0);
	assert_int_equal(own_mount_flip("versions/b", f->tmp, f->cur, &stopping, &step),
			 -ESHUTDOWN);
	assert_int_equal(errno, ESHUTDOWN);
	assert_int_equal(step, 0);
	assert_link(f->cur, "versions/a");
	assert_int_equal(lstat(f->tmp, &st), -1); /* the temporary is gone */
}

static void test_flip_says_which_step_failed(void **state)
{
	struct fx *f = *state;
	int stopping = 0, step = -1;
	char dir_target[160], missing[160];

	/* the symlink: its directory does not exist */
	snprintf(missing, sizeof(missing), "%s/no/such/dir/.tmp", f->dir);
	assert_int_equal(own_mount_flip("versions/b", missing, f->cur, &stopping, &step), -ENOENT);
	assert_int_equal(step, 1);
	/* the rename: onto a non-empty directory */
	snprintf(dir_target, sizeof(dir_target), "%s/d", f->dir);
	assert_int_equal(mkdir(dir_target, 0700), 0);
	snprintf(missing, sizeof(missing), "%s/d/x", f->dir);
	assert_int_equal(mkdir(missing, 0700), 0);
	assert_true(own_mount_flip("versions/b", f->tmp, dir_target, &stopping, &step) < 0);
	assert_int_equal(step, 2);
	assert_int_equal(access(f->tmp, F_OK), -1); /* unlinked after the failed rename */
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

static void test_many_flips_in_a_row(void **state)
{
	struct fx *f = *state;
	int stopping = 0, step;
	char target[32];

	/* the calling thread's stack carries the child: a few hundred in a row must all work */
	for (int i = 0; i < 200; i++) {
		snprintf(target, sizeof(target), "versions/v%d", i);
		assert_int_equal(own_mount_flip(target, f->tmp, f->cur, &stopping, &step), 0);
	}
	assert_link(f->cur, "versions/v199");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_flip_replaces_the_link, setup, teardown),
		cmocka_unit_test_setup_teardown(test_flip_while_stopping_does_not_rename, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_flip_says_which_step_failed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_rename_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(test_many_flips_in_a_row, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
