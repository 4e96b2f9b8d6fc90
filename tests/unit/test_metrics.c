/*
 * test_metrics.c — unit tests for the Prometheus text writer of
 * fs/common/metrics.c: label values escaped (backslash, quote, line feed),
 * histogram buckets cumulative with +Inf, _sum and _count agreeing with what
 * was observed (including an observation right on a bound, which belongs to
 * that bucket: le is "less than or equal"), and counters added from many
 * threads at once losing nothing.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics.h"

static void test_label_values_are_escaped(void **state)
{
	struct mbuf b = {0};

	metrics_sample_u64(&b, "hwfs_x", "version", "a\"b\\c\nd", 7);
	assert_false(b.oom);
	assert_string_equal(b.p, "hwfs_x{version=\"a\\\"b\\\\c\\nd\"} 7\n");
	free(b.p);
}

static void test_sample_without_labels_and_doubles(void **state)
{
	struct mbuf b = {0};

	metrics_sample_u64(&b, "hwfs_a", NULL, NULL, 18446744073709551615ull);
	metrics_sample(&b, "hwfs_b", NULL, NULL, 0.25);
	metrics_family(&b, "hwfs_c", "gauge", "help text");
	assert_string_equal(b.p, "hwfs_a 18446744073709551615\nhwfs_b 0.25\n"
				 "# HELP hwfs_c help text\n# TYPE hwfs_c gauge\n");
	free(b.p);
}

/* The value of the line starting with @prefix in @text, or -1. */
static double line_value(const char *text, const char *prefix)
{
	for (const char *p = text; p && *p; p = strchr(p, '\n') ? strchr(p, '\n') + 1 : NULL)
		if (!strncmp(p, prefix, strlen(prefix)))
			return strtod(p + strlen(prefix), NULL);
	return -1;
}

static void test_histogram_is_cumulative(void **state)
{
	struct hwfs_hist h;
	struct mbuf b = {0};

	memset(&h, 0, sizeof(h));
	hwfs_hist_observe_ns(&h, 500000);        /* 0.5 ms: le 0.001 */
	hwfs_hist_observe_ns(&h, 1000000);       /* exactly 1 ms: le 0.001 too */
	hwfs_hist_observe_ns(&h, 30000000);      /* 30 ms: le 0.05 */
	hwfs_hist_observe_ns(&h, 400000000000ull); /* 400 s: +Inf only */
	metrics_hist(&b, "hwfs_h", "phase", "flip", &h);
	assert_false(b.oom);
	assert_true(line_value(b.p, "hwfs_h_bucket{phase=\"flip\",le=\"0.001\"} ") == 2);
	assert_true(line_value(b.p, "hwfs_h_bucket{phase=\"flip\",le=\"0.025\"} ") == 2);
	assert_true(line_value(b.p, "hwfs_h_bucket{phase=\"flip\",le=\"0.05\"} ") == 3);
	assert_true(line_value(b.p, "hwfs_h_bucket{phase=\"flip\",le=\"300\"} ") == 3);
	assert_true(line_value(b.p, "hwfs_h_bucket{phase=\"flip\",le=\"+Inf\"} ") == 4);
	assert_true(line_value(b.p, "hwfs_h_count{phase=\"flip\"} ") == 4);
	assert_true(line_value(b.p, "hwfs_h_sum{phase=\"flip\"} ") > 400.03 &&
		    line_value(b.p, "hwfs_h_sum{phase=\"flip\"} ") < 400.04);
	free(b.p);
}

static uint64_t shared;

static void *adder(void *arg)
{
	for (int i = 0; i < 100000; i++)
		hwfs_count(&shared, 1);
	return NULL;
}

static void test_counters_lose_nothing_across_threads(void **state)
{
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		assert_int_equal(pthread_create(&t[i], NULL, adder, NULL), 0);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	assert_int_equal(hwfs_load(&shared), 400000);
}

static void test_node_families_present_once(void **state)
{
	static const char *const names[] = {
		"hwfs_commits_total",         "hwfs_commit_duration_seconds",
		"hwfs_publish_duration_seconds", "hwfs_version_arrival_seconds",
		"hwfs_engine_load_duration_seconds", "hwfs_engine_swap_pause_seconds",
		"hwfs_engine_refusals_total", "hwfs_fuse_requests_total",
		"hwfs_fuse_read_bytes_total"};
	struct mbuf b = {0};
	char want[128];

	metrics_node(&b);
	metrics_coord(&b);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		const char *p;

		snprintf(want, sizeof(want), "# TYPE %s ", names[i]);
		p = strstr(b.p, want);
		assert_non_null(p);
		assert_null(strstr(p + 1, want));
	}
	assert_non_null(strstr(b.p, "hwfs_fuse_requests_total{op=\"lookup\"} "));
	assert_non_null(strstr(b.p, "# TYPE hwfs_coord_version_converge_seconds histogram\n"));
	free(b.p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_label_values_are_escaped),
		cmocka_unit_test(test_sample_without_labels_and_doubles),
		cmocka_unit_test(test_histogram_is_cumulative),
		cmocka_unit_test(test_counters_lose_nothing_across_threads),
		cmocka_unit_test(test_node_families_present_once),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
