/*
 * test_gpu.c — unit tests for the node's GPU state (gpu/gpu.c).
 *
 * They run the real probe: on a machine without a GPU (CI, development)
 * gpu_open() finds no runtime or a runtime without a driver, and gpu_pin()
 * takes its mlock fallback; on a machine with one it registers with CUDA.
 * The tests check whichever path the machine has.  Locking is observed from
 * outside, in /proc/self/status (VmLck), not from gpu.c's own bookkeeping; a
 * refused pin uses a range with a hole in it, which mlock() and
 * cudaHostRegister() both refuse, so no privilege games are needed.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cudart.h"
#include "gpu.h"

#define LEN (1u << 20)

/* VmLck of this process in bytes, from /proc/self/status. */
static uint64_t vm_locked(void)
{
	char line[256];
	unsigned long long kb = 0;
	FILE *f = fopen("/proc/self/status", "r");

	assert_non_null(f);
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "VmLck: %llu kB", &kb) == 1)
			break;
	fclose(f);
	return (uint64_t)kb * 1024;
}

/* A shared mapping of @len bytes, like the arena's (MAP_SHARED shmem), every page touched. */
static void *map_shared(size_t len)
{
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);

	assert_true(p != MAP_FAILED);
	memset(p, 0x5a, len);
	return p;
}

static void test_open(void **state)
{
	struct gpu *g = NULL;
	json_t *j;

	assert_int_equal(gpu_open(&g), 0);
	assert_non_null(g);
	j = gpu_json(g);
	assert_non_null(j);
	if (!gpu_runtime(g)) {
		/* "no CUDA runtime: ..." (no library) or "no CUDA device: ..." (no driver/device) */
		assert_non_null(strstr(gpu_why(g), "no CUDA"));
		assert_null(strchr(gpu_why(g), '\n'));
		assert_int_equal(gpu_devices(g), 0);
		assert_true(json_is_null(j));
	} else {
		assert_string_equal(gpu_why(g), "");
		assert_true(gpu_devices(g) > 0);
		assert_true(json_is_object(j));
		assert_int_equal(json_array_size(json_object_get(j, "devices")),
				 (size_t)gpu_devices(g));
		assert_true(json_is_string(json_object_get(j, "runtime")));
	}
	assert_string_equal(gpu_pin_mode(g), "none");
	assert_int_equal(gpu_pinned_bytes(g), 0);
	json_decref(j);
	gpu_close(g);
}

/* $HWFS_CUDART names the only library tried; a missing one is the reason given. */
static void test_env_library(void **state)
{
	struct gpu *g = NULL;

	assert_int_equal(setenv("HWFS_CUDART", "/nonexistent/libcudart.so", 1), 0);
	assert_int_equal(gpu_open(&g), 0);
	unsetenv("HWFS_CUDART");
	assert_null(gpu_runtime(g));
	assert_non_null(strstr(gpu_why(g), "HWFS_CUDART=/nonexistent/libcudart.so"));
	assert_int_equal(gpu_devices(g), 0);
	gpu_close(g);
}

static void test_pin_unpin(void **state)
{
	struct gpu *g = NULL;
	uint8_t *p = map_shared(LEN);
	uint64_t before = vm_locked();
	char msg[1024] = "";

	assert_int_equal(gpu_open(&g), 0);
	assert_int_equal(gpu_pin(g, p, LEN, msg, sizeof(msg)), 0);
	assert_int_equal(gpu_pinned_bytes(g), LEN);
	if (gpu_runtime(g)) {
		assert_string_equal(gpu_pin_mode(g), "cuda");
		assert_non_null(strstr(msg, "pinned for CUDA"));
	} else {
		assert_string_equal(gpu_pin_mode(g), "mlock");
		assert_non_null(strstr(msg, "arena locked with mlock instead"));
		assert_non_null(strstr(msg, gpu_why(g)));
		assert_true(vm_locked() >= before + LEN);
	}
	/* a second pin while pinned is refused and changes nothing */
	assert_int_equal(gpu_pin(g, p, LEN, msg, sizeof(msg)), -EBUSY);
	assert_int_equal(gpu_pinned_bytes(g), LEN);
	gpu_unpin(g);
	assert_string_equal(gpu_pin_mode(g), "none");
	assert_int_equal(gpu_pinned_bytes(g), 0);
	assert_int_equal(vm_locked(), before);
	gpu_unpin(g); /* nothing pinned: a no-op */
	/* and it can be pinned again */
	assert_int_equal(gpu_pin(g, p, LEN, msg, sizeof(msg)), 0);
	gpu_unpin(g);
	gpu_close(g);
	assert_int_equal(p[LEN - 1], 0x5a); /* contents untouched */
	munmap(p, LEN);
}

static void test_pin_refused(void **state)
{
	struct gpu *g = NULL;
	long page = sysconf(_SC_PAGESIZE);
	uint8_t *p = map_shared(2 * (size_t)page);
	char msg[1024] = "";
	int r;

	assert_int_equal(gpu_open(&g), 0);
	assert_int_equal(gpu_pin(g, NULL, LEN, msg, sizeof(msg)), -EINVAL);
	assert_int_equal(gpu_pin(g, p, 0, msg, sizeof(msg)), -EINVAL);
	/* a hole in the range: neither mlock() nor cudaHostRegister() takes it */
	assert_int_equal(munmap(p + page, (size_t)page), 0);
	r = gpu_pin(g, p, 2 * (uint64_t)page, msg, sizeof(msg));
	assert_true(r < 0);
	if (!gpu_runtime(g)) {
		assert_int_equal(r, -ENOMEM);
		assert_non_null(strstr(msg, "mlock of"));
		assert_non_null(strstr(msg, "refused"));
	} else {
		assert_int_equal(r, -EIO);
		assert_non_null(strstr(msg, "cudaHostRegister"));
	}
	assert_string_equal(gpu_pin_mode(g), "none");
	assert_int_equal(gpu_pinned_bytes(g), 0);
	gpu_close(g);
	munmap(p, (size_t)page);
}

struct reader {
	struct gpu *g;
	int stop; /* atomic */
	int seen_pinned; /* atomic */
	int bad; /* atomic: a reader saw something impossible (asserted in the main thread) */
};

/* Status readers: what a control thread does while start-up or shutdown pins. */
static void *reader_main(void *arg)
{
	struct reader *rd = arg;

	while (!__atomic_load_n(&rd->stop, __ATOMIC_ACQUIRE)) {
		json_t *j = gpu_json(rd->g);
		uint64_t n = gpu_pinned_bytes(rd->g);
		const char *mode = gpu_pin_mode(rd->g);

		if (!j || (n != 0 && n != LEN))
			__atomic_store_n(&rd->bad, 1, __ATOMIC_RELAXED);
		json_decref(j);
		if (strcmp(mode, "none"))
			__atomic_store_n(&rd->seen_pinned, 1, __ATOMIC_RELAXED);
	}
	return NULL;
}

static void test_threads(void **state)
{
	struct gpu *g = NULL;
	uint8_t *p = map_shared(LEN);
	struct reader rd = {0};
	pthread_t t[3];
	char msg[1024];

	assert_int_equal(gpu_open(&g), 0);
	rd.g = g;
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_create(&t[i], NULL, reader_main, &rd), 0);
	for (int i = 0; i < 50; i++) {
		assert_int_equal(gpu_pin(g, p, LEN, msg, sizeof(msg)), 0);
		gpu_unpin(g);
	}
	assert_int_equal(gpu_pin(g, p, LEN, msg, sizeof(msg)), 0);
	/* up to 10 s: generous on a loaded machine; a reader normally sees it at once */
	for (int i = 0; i < 10000 && !__atomic_load_n(&rd.seen_pinned, __ATOMIC_RELAXED); i++)
		usleep(1000);
	__atomic_store_n(&rd.stop, 1, __ATOMIC_RELEASE);
	for (int i = 0; i < 3; i++)
		assert_int_equal(pthread_join(t[i], NULL), 0);
	/* the readers ran and saw the pin that stays (not only "none") ... */
	assert_int_equal(__atomic_load_n(&rd.seen_pinned, __ATOMIC_RELAXED), 1);
	/* ... and never a torn figure or a missing status */
	assert_int_equal(__atomic_load_n(&rd.bad, __ATOMIC_RELAXED), 0);
	assert_string_equal(gpu_pin_mode(g), gpu_runtime(g) ? "cuda" : "mlock");
	assert_int_equal(gpu_pinned_bytes(g), LEN);
	gpu_unpin(g);
	gpu_close(g);
	munmap(p, LEN);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_open),
		cmocka_unit_test(test_env_library),
		cmocka_unit_test(test_pin_unpin),
		cmocka_unit_test(test_pin_refused),
		cmocka_unit_test(test_threads),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
