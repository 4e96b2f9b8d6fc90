/*
 * test_names.c — unit tests for the text helpers of fs/common: hwfs_escape()
 * (what the log, tp/README and `hwfs manifest` show of a name from a file)
 * renders every C0 control, DEL, C1 control and byte of invalid UTF-8 as
 * \xNN and a backslash as \\, keeps other UTF-8 whole, counts like snprintf
 * and cuts only between whole escapes or characters; hwfs_utf8_len() agrees
 * with hwfs_valid_name() on what is UTF-8.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "hwfs_common.h"
#include "names.h"

static void test_escape_controls_c1_and_backslash(void **state)
{
	static const char in[] = "a\x1b[31m\xc2\x9b" "2J\nb\x7f\\x\t\xc2\xa0\xe2\x82\xac";
	static const char want[] = "a\\x1b[31m\\xc2\\x9b2J\\x0ab\\x7f\\\\x\\x09\xc2\xa0\xe2\x82\xac";
	char *e = hwfs_escape_dup(in);

	assert_non_null(e);
	assert_string_equal(e, want);
	assert_int_equal(hwfs_escape(NULL, 0, in), strlen(want));
	assert_false(hwfs_has_controls(e));
	free(e);
}

static void test_escape_invalid_utf8_bytes(void **state)
{
	/* a stray continuation, an overlong form, a cut sequence at the end */
	char *e = hwfs_escape_dup("x\x9by\xc0\xafz\xe2\x82");

	assert_non_null(e);
	assert_string_equal(e, "x\\x9by\\xc0\\xafz\\xe2\\x82");
	free(e);
}

static void test_escape_cuts_between_whole_escapes(void **state)
{
	char buf[8];

	/* "ab" fits, \x1b does not, and the "c" after the cut is not written though it fits */
	assert_int_equal(hwfs_escape(buf, 6, "ab\x1b" "c"), 7);
	assert_string_equal(buf, "ab");
	assert_int_equal(hwfs_escape(buf, 7, "ab\x1b" "c"), 7);
	assert_string_equal(buf, "ab\\x1b");
	assert_int_equal(hwfs_escape(buf, sizeof(buf), "ab\x1b" "c"), 7);
	assert_string_equal(buf, "ab\\x1bc");
	/* a character of several bytes is never split */
	assert_int_equal(hwfs_escape(buf, 3, "a\xe2\x82\xac"), 4);
	assert_string_equal(buf, "a");
	assert_int_equal(hwfs_escape(buf, 1, "abc"), 3);
	assert_string_equal(buf, "");
}

static void test_utf8_len(void **state)
{
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"a"), 1);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"\xc2\x9b"), 2);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"\xe2\x82\xac"), 3);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"\xf0\x9f\x98\x80"), 4);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)""), 0);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"\x80"), 0);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"\xc1\xbf"), 0);
	assert_int_equal(hwfs_utf8_len((const unsigned char *)"\xe2\x82"), 0);
	assert_true(hwfs_valid_name("v\xe2\x82\xac"));
	assert_false(hwfs_valid_name("v\xc2\x9b"));
	assert_false(hwfs_valid_name("v\x80"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_escape_controls_c1_and_backslash),
		cmocka_unit_test(test_escape_invalid_utf8_bytes),
		cmocka_unit_test(test_escape_cuts_between_whole_escapes),
		cmocka_unit_test(test_utf8_len),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
