/*
 * test_engines.c — unit tests for the registry of watchers and engines and
 * the commit barrier (fs/daemon/engine_registry.c).
 *
 * Each test opens a real store and namespace in a fresh /dev/shm directory
 * (with a sealed version "v1" made through the namespace API, as a mount
 * would) and plays the clients over socketpairs: the daemon's end goes to the
 * registry, the test reads events from and writes nothing on the other end
 * (reports go straight to engines_report(), as the connection thread would
 * pass them).
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "engine_registry.h"
#include "ns.h"
#include "tmpdir.h"
#include "tunables.h"

#define CAP (16ull << 20)

struct fx {
	char dir[64];
	struct store *st;
	struct ns *ns;
	struct engines *reg;
};

/* Make an empty version @name and seal it, as a mount would.  Returns 0 or -errno. */
static int make_sealed(struct fx *f, const char *name)
{
	struct node *v = NULL;
	int r;

	r = ns_mkdir(f->ns, ns_versions_dir(f->ns), name, 040755, 0, 0, &v);
	return r < 0 ? r : ns_seal(f->ns, name, NULL, 0, NULL, 0);
}

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	snprintf(f->dir, sizeof(f->dir), "/dev/shm/hwfs-test-engines-XXXXXX");
	if (!mkdtemp(f->dir) || store_open(f->dir, CAP, &f->st) < 0 || ns_create(f->st, &f->ns) < 0 ||
	    engines_create(f->ns, &f->reg) < 0)
		return -1;
	if (make_sealed(f, "v1") < 0)
		return -1;
	hwfs_tun.engine_deadline_ms = 8000;
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	engines_destroy(f->reg);
	ns_destroy(f->ns);
	store_close(f->st);
	rm_rf(f->dir);
	free(f);
	return 0;
}

/* A client: its end @c, the daemon's end @d, and the registry's watcher. */
struct cli {
	int c, d;
	struct watcher *w;
};

/* Register a watcher (@name NULL) or engine and check its first line. */
static void cli_open(struct fx *f, struct cli *k, const char *name)
{
	int sv[2];
	char buf[256];
	ssize_t n;

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	k->c = sv[0];
	k->d = sv[1];
	assert_int_equal(engines_watch(f->reg, k->d, 4242, name, &k->w), 0);
	n = read(k->c, buf, sizeof(buf) - 1);
	assert_true(n > 0);
	buf[n] = '\0';
	assert_string_equal(buf, "{\"ok\":true,\"current\":null}\n");
}

static void cli_close(struct fx *f, struct cli *k)
{
	engines_unwatch(f->reg, k->w);
	close(k->c);
	close(k->d);
}

/* The next line the client got, or "" when none is waiting. */
static const char *next_line(struct cli *k, char *buf, size_t len)
{
	size_t i = 0;

	while (i + 1 < len) {
		ssize_t n = recv(k->c, buf + i, 1, MSG_DONTWAIT);

		if (n <= 0)
			break;
		if (buf[i++] == '\n')
			break;
	}
	buf[i] = '\0';
	return buf;
}

/* engine_report() of the JSON text @js. */
static int report(struct fx *f, struct cli *k, const char *js)
{
	json_t *m = json_loads(js, 0, NULL);
	int r;

	assert_non_null(m);
	r = engines_report(f->reg, k->w, m);
	json_decref(m);
	return r;
}

static void test_names(void **state)
{
	char long_name[HWFS_ENGINE_NAME_MAX + 2];

	(void)state;
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[sizeof(long_name) - 1] = '\0';
	assert_true(hwfs_engine_name_valid("llama-a.v1_2"));
	assert_false(hwfs_engine_name_valid(""));
	assert_false(hwfs_engine_name_valid("a b"));
	assert_false(hwfs_engine_name_valid("a/b"));
	assert_false(hwfs_engine_name_valid(long_name));
	long_name[HWFS_ENGINE_NAME_MAX] = '\0';
	assert_true(hwfs_engine_name_valid(long_name));
}

static void test_events_and_duplicates(void **state)
{
	struct fx *f = *state;
	struct cli a, e, e2;
	struct watcher *w = NULL;
	char buf[256];

	cli_open(f, &a, NULL);
	cli_open(f, &e, "e1");
	assert_int_equal(engines_watch(f->reg, e.d, 1, "e1", &w), -EEXIST);
	assert_int_equal(engines_watch(f->reg, e.d, 1, "bad name", &w), -EINVAL);
	engines_event(f->reg, "arrived", "v1");
	engines_event(f->reg, "arrived", ".hwfs-staging"); /* never announced */
	assert_string_equal(next_line(&a, buf, sizeof(buf)),
			    "{\"event\":\"arrived\",\"version\":\"v1\"}\n");
	assert_string_equal(next_line(&a, buf, sizeof(buf)), "");
	assert_string_equal(next_line(&e, buf, sizeof(buf)),
			    "{\"event\":\"arrived\",\"version\":\"v1\"}\n");
	/* a watcher is not an engine: its reports are ignored, it never holds a barrier */
	assert_int_equal(report(f, &a, "{\"report\":\"loaded\",\"version\":\"v1\"}"), -EINVAL);
	cli_close(f, &e);
	cli_open(f, &e2, "e1"); /* the name is free again */
	cli_close(f, &e2);
	cli_close(f, &a);
}

static void test_barrier_states(void **state)
{
	struct fx *f = *state;
	struct cli e;
	char buf[700], err[600];
	uint64_t t0 = hwfs_mono_ns();
	json_t *js;

	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), 0); /* no engine */
	cli_open(f, &e, "e1");
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)),
			    "{\"event\":\"prepare\",\"version\":\"v1\"}\n");
	/* asked once per barrier */
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)), "");
	/* reports that are not one change nothing */
	assert_int_equal(report(f, &e, "{\"report\":\"loaded\",\"version\":\"nope\"}"), -EINVAL);
	assert_int_equal(report(f, &e, "{\"report\":\"boom\",\"version\":\"v1\"}"), -EINVAL);
	assert_int_equal(report(f, &e, "{\"report\":\"loaded\"}"), -EINVAL);
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -EINPROGRESS);
	/* a refusal decides at once, its reason cut and cleaned */
	memset(buf, 'r', 600);
	buf[0] = '\n';
	buf[600] = '\0';
	js = json_pack("{s:s, s:s, s:s}", "report", "refused", "version", "v1", "reason", buf);
	assert_int_equal(engines_report(f->reg, e.w, js), 0);
	json_decref(js);
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -ECANCELED);
	assert_memory_equal(err, "engine e1 refused v1:  rrr", 26);
	assert_int_equal(strlen(err), strlen("engine e1 refused v1: ") + HWFS_ENGINE_REASON_MAX);
	/*
	 * a new barrier asks again, and the earlier refusal waits for the answer
	 * (the engine may load it now); it loads it: ready
	 */
	t0 = hwfs_mono_ns();
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)),
			    "{\"event\":\"prepare\",\"version\":\"v1\"}\n");
	assert_int_equal(report(f, &e, "{\"report\":\"loaded\",\"version\":\"v1\"}"), 0);
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), 0);
	/* serving it is ready too; swapped to it clears the shadow */
	assert_int_equal(report(f, &e, "{\"report\":\"swapped\",\"version\":\"v1\",\"pause_us\":7}"), 0);
	assert_int_equal(engines_barrier(f->reg, "v1", hwfs_mono_ns(), err, sizeof(err)), 0);
	js = engines_json(f->reg);
	assert_string_equal(json_string_value(json_object_get(json_array_get(js, 0), "state")), "idle");
	assert_true(json_is_null(json_object_get(json_array_get(js, 0), "shadow")));
	assert_int_equal(json_integer_value(json_object_get(json_array_get(js, 0), "swaps")), 0);
	json_decref(js);
	cli_close(f, &e);
}

/*
 * A refusal reported during a barrier decides it at once; one reported before
 * it (an earlier commit) does not: the new barrier sends prepare and waits for
 * the engine's new answer, until the deadline, whose sentence recalls the
 * earlier refusal.
 */
static void test_earlier_refusal_is_asked_again(void **state)
{
	struct fx *f = *state;
	struct cli e;
	char buf[700], err[600];
	uint64_t t0 = hwfs_mono_ns(), t1;
	const char *refuse = "{\"report\":\"refused\",\"version\":\"v1\",\"reason\":\"no memory\"}";

	cli_open(f, &e, "e1");
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -EINPROGRESS);
	assert_int_equal(report(f, &e, refuse), 0);
	assert_int_equal(engines_barrier(f->reg, "v1", t0, err, sizeof(err)), -ECANCELED);
	assert_string_equal(err, "engine e1 refused v1: no memory");
	assert_string_equal(next_line(&e, buf, sizeof(buf)),
			    "{\"event\":\"prepare\",\"version\":\"v1\"}\n");
	/* the next commit: asked again, pending (not refused from the old answer) */
	t1 = hwfs_mono_ns();
	assert_int_equal(engines_barrier(f->reg, "v1", t1, err, sizeof(err)), -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)),
			    "{\"event\":\"prepare\",\"version\":\"v1\"}\n");
	assert_int_equal(engines_barrier(f->reg, "v1", t1, err, sizeof(err)), -EINPROGRESS);
	/* refused again during this barrier: decided at once */
	assert_int_equal(report(f, &e, refuse), 0);
	assert_int_equal(engines_barrier(f->reg, "v1", t1, err, sizeof(err)), -ECANCELED);
	assert_string_equal(err, "engine e1 refused v1: no memory");
	/* a later barrier whose deadline passed with no new answer: the sentence recalls it */
	hwfs_tun.engine_deadline_ms = 10;
	t1 = hwfs_mono_ns();
	while (hwfs_mono_ns() - t1 < 20000000ull)
		usleep(1000);
	assert_int_equal(engines_barrier(f->reg, "v1", t1, err, sizeof(err)), -ECANCELED);
	assert_string_equal(err, "engine e1 did not report v1 loaded within 10 ms (it refused v1 "
				 "before: no memory)");
	cli_close(f, &e);
}

/*
 * Two barriers at once (a local commit and the agent's PREPARE): each sends
 * prepare to an engine once, however often each is checked.
 */
static void test_prepare_once_per_barrier(void **state)
{
	struct fx *f = *state;
	struct cli e;
	char buf[256], err[600];
	uint64_t ta = hwfs_mono_ns(), tb = ta + 1;
	const char *prep = "{\"event\":\"prepare\",\"version\":\"v1\"}\n";

	cli_open(f, &e, "e1");
	assert_int_equal(engines_barrier(f->reg, "v1", ta, err, sizeof(err)), -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)), prep);
	assert_int_equal(engines_barrier(f->reg, "v1", tb, err, sizeof(err)), -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)), prep);
	for (int i = 0; i < 5; i++) {
		assert_int_equal(engines_barrier(f->reg, "v1", ta, err, sizeof(err)), -EINPROGRESS);
		assert_int_equal(engines_barrier(f->reg, "v1", tb, err, sizeof(err)), -EINPROGRESS);
	}
	assert_string_equal(next_line(&e, buf, sizeof(buf)), "");
	cli_close(f, &e);
}

/* Remove version @name (hwfs rm: the namespace, then the "removed" event). */
static void remove_version(struct fx *f, const char *name)
{
	assert_int_equal(ns_remove_version(f->ns, name), 0);
	engines_event(f->reg, "removed", name);
}

/*
 * An engine's reports are about one version, not one name: after `hwfs rm v2`
 * and a new v2, neither a v2 loaded nor a v2 served before counts for a
 * commit of the new one, and the removed shadow is forgotten.
 */
static void test_a_new_version_of_the_same_name_is_not_ready(void **state)
{
	struct fx *f = *state;
	struct cli e;
	char buf[256], err[600];
	const char *prep = "{\"event\":\"prepare\",\"version\":\"v2\"}\n";
	json_t *js;

	assert_int_equal(make_sealed(f, "v2"), 0);
	cli_open(f, &e, "e1");
	next_line(&e, buf, sizeof(buf)); /* arrived v2? (no event: sealed before it registered) */
	assert_int_equal(report(f, &e, "{\"report\":\"loaded\",\"version\":\"v2\"}"), 0);
	assert_int_equal(engines_barrier(f->reg, "v2", hwfs_mono_ns(), err, sizeof(err)), 0);
	remove_version(f, "v2");
	assert_string_equal(next_line(&e, buf, sizeof(buf)),
			    "{\"event\":\"removed\",\"version\":\"v2\"}\n");
	js = engines_json(f->reg);
	assert_true(json_is_null(json_object_get(json_array_get(js, 0), "shadow")));
	assert_string_equal(json_string_value(json_object_get(json_array_get(js, 0), "state")), "idle");
	json_decref(js);
	assert_int_equal(make_sealed(f, "v2"), 0);
	assert_int_equal(engines_barrier(f->reg, "v2", hwfs_mono_ns(), err, sizeof(err)),
			 -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)), prep);
	/* serving: the same */
	assert_int_equal(report(f, &e, "{\"report\":\"swapped\",\"version\":\"v2\"}"), 0);
	assert_int_equal(engines_barrier(f->reg, "v2", hwfs_mono_ns(), err, sizeof(err)), 0);
	remove_version(f, "v2");
	next_line(&e, buf, sizeof(buf));
	assert_int_equal(make_sealed(f, "v2"), 0);
	assert_int_equal(engines_barrier(f->reg, "v2", hwfs_mono_ns(), err, sizeof(err)),
			 -EINPROGRESS);
	assert_string_equal(next_line(&e, buf, sizeof(buf)), prep);
	/* a barrier of a version removed while it waits ends */
	remove_version(f, "v2");
	assert_int_equal(engines_barrier(f->reg, "v2", hwfs_mono_ns(), err, sizeof(err)),
			 -ECANCELED);
	assert_string_equal(err, "no such version: v2");
	cli_close(f, &e);
}

/* Point `current` at @name through the namespace, as a rename through the mount does. */
static void flip(struct fx *f, const char *name)
{
	struct node *root, *tmp = NULL;
	char target[64];

	snprintf(target, sizeof(target), "versions/%s", name);
	root = ns_root(f->ns);
	assert_int_equal(ns_symlink(f->ns, root, ".flip", target, 0, 0, &tmp), 0);
	assert_int_equal(ns_rename(f->ns, root, ".flip", root, "current", 0), 0);
	ns_forget(f->ns, tmp, 1);
}

/*
 * "current" announces what `current` names when it is sent, once per commit:
 * the namespace's hook runs after its lock is released, so the hooks of two
 * flips may run late and in either order; they must neither announce a
 * stale version last nor repeat one.  A commit of the current version again
 * is a commit: announced.
 */
static void test_current_event_is_the_namespaces_and_in_order(void **state)
{
	struct fx *f = *state;
	struct cli w;
	char buf[256];
	const char *cur1 = "{\"event\":\"current\",\"version\":\"v1\"}\n";
	const char *cur2 = "{\"event\":\"current\",\"version\":\"v2\"}\n";

	assert_int_equal(make_sealed(f, "v2"), 0);
	cli_open(f, &w, NULL);
	engines_event(f->reg, "current", "v1"); /* no commit yet: nothing */
	assert_string_equal(next_line(&w, buf, sizeof(buf)), "");
	flip(f, "v1");
	engines_event(f->reg, "current", "v1");
	assert_string_equal(next_line(&w, buf, sizeof(buf)), cur1);
	/* flips to v2 then v1; their hooks run late, v1's first */
	flip(f, "v2");
	flip(f, "v1");
	engines_event(f->reg, "current", "v1");
	engines_event(f->reg, "current", "v2");
	assert_string_equal(next_line(&w, buf, sizeof(buf)), cur1);
	assert_string_equal(next_line(&w, buf, sizeof(buf)), "");
	/* v2's hook first: it announces v1 (current now), v1's hook nothing */
	flip(f, "v2");
	flip(f, "v1");
	engines_event(f->reg, "current", "v2");
	engines_event(f->reg, "current", "v1");
	assert_string_equal(next_line(&w, buf, sizeof(buf)), cur1);
	assert_string_equal(next_line(&w, buf, sizeof(buf)), "");
	/* the current version committed again: announced again */
	flip(f, "v1");
	engines_event(f->reg, "current", "v1");
	assert_string_equal(next_line(&w, buf, sizeof(buf)), cur1);
	flip(f, "v2");
	engines_event(f->reg, "current", "v2");
	assert_string_equal(next_line(&w, buf, sizeof(buf)), cur2);
	cli_close(f, &w);
}

static void test_deadline(void **state)
{
	struct fx *f = *state;
	struct cli e;
	char err[600];

	hwfs_tun.engine_deadline_ms = 10;
	cli_open(f, &e, "slow");
	/* a barrier that began 20 ms ago with the engine still silent: refused now */
	assert_int_equal(engines_barrier(f->reg, "v1", hwfs_mono_ns() - 20000000ull, err,
					 sizeof(err)), -ECANCELED);
	assert_string_equal(err, "engine slow did not report v1 loaded within 10 ms");
	/* the blocking form ends by itself */
	assert_int_equal(engines_barrier_wait(f->reg, "v1", err, sizeof(err)), -ECANCELED);
	cli_close(f, &e);
}

struct later {
	struct fx *f;
	struct cli *k;
	int unwatch; /* 1: go away; 0: report loaded */
};

/* Once the engine was asked (its prepare arrived), answer: report loaded or go away. */
static void *answer_later(void *arg)
{
	struct later *l = arg;
	struct pollfd p = {l->k->c, POLLIN, 0};
	char buf[256];

	if (poll(&p, 1, 5000) == 1 && read(l->k->c, buf, sizeof(buf)) > 0) {
		if (l->unwatch) {
			engines_unwatch(l->f->reg, l->k->w);
		} else {
			json_t *m = json_pack("{s:s, s:s}", "report", "loaded", "version", "v1");

			engines_report(l->f->reg, l->k->w, m);
			json_decref(m);
		}
	}
	return NULL;
}

static void test_wait_ends_on_report_and_on_disconnect(void **state)
{
	struct fx *f = *state;
	char err[600];

	for (int unwatch = 0; unwatch < 2; unwatch++) {
		struct cli e;
		struct later l = {f, &e, unwatch};
		pthread_t t;

		cli_open(f, &e, "e1");
		assert_int_equal(pthread_create(&t, NULL, answer_later, &l), 0);
		assert_int_equal(engines_barrier_wait(f->reg, "v1", err, sizeof(err)), 0);
		pthread_join(t, NULL);
		if (!unwatch)
			engines_unwatch(f->reg, e.w);
		close(e.c);
		close(e.d);
	}
}

static void test_full_socket_drops_the_engine(void **state)
{
	struct fx *f = *state;
	struct cli e;
	char err[600];
	int sndbuf = 4096, i;
	json_t *js;

	cli_open(f, &e, "deaf");
	setsockopt(e.d, SOL_SOCKET, SO_SNDBUF, &sndbuf, sizeof(sndbuf));
	for (i = 0; i < 100000; i++) { /* the client never reads: its buffer fills */
		engines_event(f->reg, "arrived", "v1");
		js = engines_json(f->reg);
		if (json_array_size(js) == 0) {
			json_decref(js);
			break;
		}
		json_decref(js);
	}
	assert_true(i < 100000);
	/* dropped: it no longer counts for the barrier, and its socket was shut down */
	assert_int_equal(engines_barrier(f->reg, "v1", hwfs_mono_ns(), err, sizeof(err)), 0);
	assert_int_equal(send(e.c, "x", 1, MSG_NOSIGNAL), -1);
	cli_close(f, &e);
}

static void test_leases(void **state)
{
	struct fx *f = *state;
	struct lease *a = NULL, *b = NULL;
	json_t *js;

	assert_int_equal(engines_lease_add(f->reg, "v1", 11, &a), 0);
	assert_int_equal(engines_lease_add(f->reg, "v1", 12, &b), 0);
	js = engines_leases_json(f->reg);
	assert_int_equal(json_array_size(js), 2);
	json_decref(js);
	engines_lease_del(f->reg, a);
	js = engines_leases_json(f->reg);
	assert_int_equal(json_array_size(js), 1);
	assert_int_equal(json_integer_value(json_object_get(json_array_get(js, 0), "pid")), 12);
	json_decref(js);
	engines_lease_del(f->reg, b);
	engines_lease_del(f->reg, NULL);
}

#define T(fn) cmocka_unit_test_setup_teardown(fn, fx_setup, fx_teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_names),
		T(test_events_and_duplicates),
		T(test_barrier_states),
		T(test_earlier_refusal_is_asked_again),
		T(test_prepare_once_per_barrier),
		T(test_a_new_version_of_the_same_name_is_not_ready),
		T(test_current_event_is_the_namespaces_and_in_order),
		T(test_deadline),
		T(test_wait_ends_on_report_and_on_disconnect),
		T(test_full_socket_drops_the_engine),
		T(test_leases),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
