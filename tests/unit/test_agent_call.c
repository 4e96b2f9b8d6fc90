/*
 * test_agent_call.c — unit tests for agent_call()'s request table
 * (replicator/agent.c): an op the table does not hold is refused at once with
 * an EOPNOTSUPP error reply (it used to become a STATUS_REQ), whether or not
 * the coordinator is there; an op it holds goes to the coordinator (here
 * none answers: -EHOSTUNREACH at once).
 *
 * A real agent thread on a real store under /dev/shm, joined to a
 * coordinator endpoint nobody listens on, with hooks that hold nothing.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "tmpdir.h"

static json_t *h_versions(void *arg)
{
	return json_array();
}

static int h_lookup(void *arg, const char *name, enum hwfs_vstate *state, hwfs_hash_t *digest)
{
	return -ENOENT;
}

static int h_snapshot(void *arg, const char *name, struct hwfs_vrec **out)
{
	return -ENOENT;
}

static char *h_current(void *arg)
{
	return NULL;
}

static int h_committable(void *arg, const char *name, const hwfs_hash_t *digest, char *err,
			 size_t errlen)
{
	snprintf(err, errlen, "no versions here");
	return -ENOENT;
}

static int h_import(void *arg, struct hwfs_vrec *rec, char *err, size_t errlen)
{
	snprintf(err, errlen, "no imports here");
	return -EPERM;
}

static int h_flip(void *arg, const char *version, char *err, size_t errlen)
{
	snprintf(err, errlen, "no flips here");
	return -EPERM;
}

static const struct agent_hooks hooks = {
	.versions = h_versions,
	.lookup = h_lookup,
	.snapshot = h_snapshot,
	.current = h_current,
	.committable = h_committable,
	.import = h_import,
	.flip_current = h_flip,
};

struct fx {
	char dir[64];
	struct store *s;
	struct agent *a;
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	struct agent_opts o = {.node = "unit", .listen = "tcp://127.0.0.1:*",
			       .coordinator = "tcp://127.0.0.1:1", .hooks = &hooks};

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-XXXXXX");
	if (!mkdtemp(f->dir) || store_open(f->dir, 16ull << 20, &f->s) < 0)
		return -1;
	o.st = f->s;
	if (agent_start(&o, &f->a) < 0)
		return -1;
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	agent_stop(f->a);
	store_close(f->s);
	rm_rf(f->dir);
	free(f);
	return 0;
}

/* agent_call(@req) answers at once with an EOPNOTSUPP error reply naming the op. */
static void assert_refused(struct agent *a, json_t *req, const char *shown)
{
	json_t *res = NULL;

	assert_int_equal(agent_call(a, req, &res, 60000), 0);
	assert_non_null(res);
	assert_true(json_is_false(json_object_get(res, "ok")));
	assert_int_equal(json_integer_value(json_object_get(res, "errno")), EOPNOTSUPP);
	assert_non_null(strstr(json_string_value(json_object_get(res, "error")), shown));
	json_decref(res);
	json_decref(req);
}

static void test_unknown_op_is_eopnotsupp(void **state)
{
	struct fx *f = *state;

	assert_refused(f->a, json_pack("{s:s}", "op", "status"), "status");
	assert_refused(f->a, json_pack("{s:s, s:s}", "op", "Commit", "version", "v1"), "Commit");
	assert_refused(f->a, json_pack("{s:s}", "op", ""), "request");
	assert_refused(f->a, json_pack("{s:i}", "op", 1), "(no op)");
	assert_refused(f->a, json_object(), "(no op)");
}

static void test_known_ops_go_to_the_coordinator(void **state)
{
	struct fx *f = *state;
	json_t *res = NULL, *req = json_pack("{s:s}", "op", "cluster");

	/* nobody answers at the coordinator's endpoint: unreachable, not refused */
	assert_int_equal(agent_call(f->a, req, &res, 60000), -EHOSTUNREACH);
	assert_null(res);
	json_decref(req);
	req = json_pack("{s:s, s:s}", "op", "commit", "version", "v1");
	assert_int_equal(agent_call(f->a, req, &res, 60000), -EHOSTUNREACH);
	json_decref(req);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_unknown_op_is_eopnotsupp, setup, teardown),
		cmocka_unit_test_setup_teardown(test_known_ops_go_to_the_coordinator, setup,
						teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
