/*
 * test_safetensors.c — unit tests for the safetensors header parser.
 *
 * Every test builds a real file image in memory (8-byte little-endian N,
 * the JSON text, optional space padding, then a data buffer filled with a
 * pattern) and runs it through st_header_size(), st_parse() and
 * st_check_size().  Malformed images must fail with -EINVAL and an error
 * line that names the problem; valid ones must produce exactly the expected
 * tensors, offsets and lengths.
 */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdlib.h>
#include <string.h>

#include "safetensors.h"

struct img {
	uint8_t *buf;
	size_t len;
};

static void put_le64(uint8_t *p, uint64_t v)
{
	for (int i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
}

/* Image with header length field @n (whatever the JSON's real length). */
static struct img build_raw(uint64_t n, const char *json, size_t pad, size_t data_len)
{
	struct img im;
	size_t jl = strlen(json);

	im.len = 8 + jl + pad + data_len;
	im.buf = malloc(im.len ? im.len : 1);
	assert_non_null(im.buf);
	put_le64(im.buf, n);
	memcpy(im.buf + 8, json, jl);
	memset(im.buf + 8 + jl, ' ', pad);
	for (size_t i = 0; i < data_len; i++)
		im.buf[8 + jl + pad + i] = (uint8_t)(i * 7 + 1);
	return im;
}

/* A well-framed image: N = strlen(json) + pad. */
static struct img build(const char *json, size_t pad, size_t data_len)
{
	return build_raw(strlen(json) + pad, json, pad, data_len);
}

static void img_free(struct img *im)
{
	free(im->buf);
	im->buf = NULL;
}

/* Parse @json + @data_len bytes of data with the real file size; must fail. */
static void expect_fail(const char *json, size_t data_len, const char *needle)
{
	struct img im = build(json, 0, data_len);
	struct st_header *h = (struct st_header *)0x1;
	char err[256] = "";
	int ret;

	ret = st_parse(im.buf, im.len, im.len, &h, err, sizeof(err));
	if (ret != -EINVAL || !strstr(err, needle))
		print_error("json %s: ret %d err '%s', wanted '%s'\n", json, ret, err, needle);
	assert_int_equal(ret, -EINVAL);
	assert_ptr_equal(h, (struct st_header *)0x1); /* untouched on failure */
	assert_non_null(strstr(err, needle));
	assert_null(strchr(err, '\n'));
	img_free(&im);
}

static struct st_header *expect_ok(const struct img *im, uint64_t file_size)
{
	struct st_header *h = NULL;
	char err[256] = "";
	int ret;

	ret = st_parse(im->buf, im->len, file_size, &h, err, sizeof(err));
	if (ret)
		print_error("st_parse: %d %s\n", ret, err);
	assert_int_equal(ret, 0);
	assert_non_null(h);
	return h;
}

static void test_dtype_bits(void **state)
{
	(void)state;
	assert_int_equal(st_dtype_bits("F32"), 32);
	assert_int_equal(st_dtype_bits("BF16"), 16);
	assert_int_equal(st_dtype_bits("F4"), 4);
	assert_int_equal(st_dtype_bits("F6_E2M3"), 6);
	assert_int_equal(st_dtype_bits("F6_E3M2"), 6);
	assert_int_equal(st_dtype_bits("F8_E8M0"), 8);
	assert_int_equal(st_dtype_bits("BOOL"), 8);
	assert_int_equal(st_dtype_bits("C64"), 64);
	assert_int_equal(st_dtype_bits("U64"), 64);
	assert_int_equal(st_dtype_bits("F99"), 0);
	assert_int_equal(st_dtype_bits("f32"), 0);
	assert_int_equal(st_dtype_bits(""), 0);
	assert_int_equal(st_dtype_bits("F32XXXXXXXXXXXXXXXXXXXX"), 0);
	assert_int_equal(st_dtype_bits(NULL), 0);
}

static void test_valid_several(void **state)
{
	/* Listed out of order on purpose; metadata in the middle. */
	const char *json =
		"{\"b.weight\":{\"dtype\":\"F16\",\"shape\":[2,3],\"data_offsets\":[24,36]},"
		"\"__metadata__\":{\"format\":\"pt\",\"note\":\"hi\"},"
		"\"a.weight\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
		"\"c.bias\":{\"dtype\":\"I8\",\"shape\":[5],\"data_offsets\":[36,41]},"
		"\"d.scalar\":{\"dtype\":\"F64\",\"shape\":[],\"data_offsets\":[41,49]}}";
	struct img im = build(json, 0, 49);
	struct st_header *h;
	uint64_t ds = 8 + strlen(json);

	(void)state;
	h = expect_ok(&im, im.len);
	assert_int_equal(h->header_len, strlen(json));
	assert_int_equal(h->data_start, ds);
	assert_int_equal(h->data_len, 49);
	assert_int_equal(h->n, 4);
	assert_string_equal(h->t[0].name, "a.weight");
	assert_string_equal(h->t[0].dtype, "F32");
	assert_int_equal(h->t[0].ndim, 2);
	assert_int_equal(h->t[0].shape[0], 2);
	assert_int_equal(h->t[0].shape[1], 3);
	assert_int_equal(h->t[0].off, ds);
	assert_int_equal(h->t[0].len, 24);
	assert_string_equal(h->t[1].name, "b.weight");
	assert_string_equal(h->t[1].dtype, "F16");
	assert_int_equal(h->t[1].off, ds + 24);
	assert_int_equal(h->t[1].len, 12);
	assert_string_equal(h->t[2].name, "c.bias");
	assert_int_equal(h->t[2].ndim, 1);
	assert_int_equal(h->t[2].shape[0], 5);
	assert_int_equal(h->t[2].off, ds + 36);
	assert_int_equal(h->t[2].len, 5);
	assert_string_equal(h->t[3].name, "d.scalar");
	assert_int_equal(h->t[3].ndim, 0);
	assert_null(h->t[3].shape);
	assert_int_equal(h->t[3].off, ds + 41);
	assert_int_equal(h->t[3].len, 8);
	st_free(h);

	/* Same header, size unknown, then checked separately. */
	h = expect_ok(&im, UINT64_MAX);
	assert_int_equal(st_check_size(h, im.len, NULL, 0), 0);
	st_free(h);

	/* Only the header bytes given: still parses when the size is unknown. */
	{
		struct st_header *h2 = NULL;
		char err[128];

		assert_int_equal(st_parse(im.buf, ds, UINT64_MAX, &h2, err, sizeof(err)), 0);
		assert_int_equal(h2->n, 4);
		st_free(h2);
	}
	img_free(&im);
}

static void test_zero_tensors(void **state)
{
	struct img im = build("{}", 0, 0);
	struct img im2 = build("{\"__metadata__\":{\"a\":\"b\"}}", 6, 0);
	struct st_header *h;

	(void)state;
	h = expect_ok(&im, im.len);
	assert_int_equal(h->n, 0);
	assert_null(h->t);
	assert_int_equal(h->data_len, 0);
	assert_int_equal(h->data_start, 10);
	st_free(h);

	h = expect_ok(&im2, im2.len);
	assert_int_equal(h->n, 0);
	assert_int_equal(h->data_start, im2.len);
	st_free(h);
	img_free(&im);
	img_free(&im2);
}

static void test_zero_length_tensor(void **state)
{
	/* "e" and "z" are empty; "z" shares its offset with non-empty "b". */
	const char *json =
		"{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		"\"z\":{\"dtype\":\"F32\",\"shape\":[0,7],\"data_offsets\":[4,4]},"
		"\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[4,6]},"
		"\"e\":{\"dtype\":\"F32\",\"shape\":[3,0],\"data_offsets\":[6,6]}}";
	struct img im = build(json, 0, 6);
	struct st_header *h;
	uint64_t ds = 8 + strlen(json);

	(void)state;
	h = expect_ok(&im, im.len);
	assert_int_equal(h->n, 4);
	assert_int_equal(h->data_len, 6);
	/* Sorted by offset then name. */
	assert_string_equal(h->t[0].name, "a");
	assert_string_equal(h->t[1].name, "b");
	assert_int_equal(h->t[1].off, ds + 4);
	assert_int_equal(h->t[1].len, 2);
	assert_string_equal(h->t[2].name, "z");
	assert_int_equal(h->t[2].off, ds + 4);
	assert_int_equal(h->t[2].len, 0);
	assert_string_equal(h->t[3].name, "e");
	assert_int_equal(h->t[3].off, ds + 6);
	assert_int_equal(h->t[3].len, 0);
	st_free(h);
	img_free(&im);

	/* Only empty tensors: data_len 0. */
	im = build("{\"x\":{\"dtype\":\"F16\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0, 0);
	h = expect_ok(&im, im.len);
	assert_int_equal(h->n, 1);
	assert_int_equal(h->data_len, 0);
	assert_int_equal(h->t[0].len, 0);
	st_free(h);
	img_free(&im);

	/* A zero dimension wins over huge ones: no overflow, length 0. */
	im = build("{\"x\":{\"dtype\":\"F64\",\"shape\":[4294967296,4294967296,0],"
		   "\"data_offsets\":[0,0]}}",
		   0, 0);
	h = expect_ok(&im, im.len);
	assert_int_equal(h->t[0].len, 0);
	st_free(h);
	img_free(&im);
}

static void test_padding(void **state)
{
	const char *json = "{\"w\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]}}";
	struct img im = build(json, 13, 8);
	struct st_header *h;

	(void)state;
	h = expect_ok(&im, im.len);
	assert_int_equal(h->header_len, strlen(json) + 13);
	assert_int_equal(h->data_start, 8 + strlen(json) + 13);
	assert_int_equal(h->t[0].off, h->data_start);
	assert_int_equal(h->t[0].len, 8);
	assert_int_equal(h->data_start + h->data_len, im.len);
	st_free(h);
	img_free(&im);
}

static void test_subbyte(void **state)
{
	struct img im;
	struct st_header *h;

	(void)state;
	/* 10 x F4 = 40 bits = 5 bytes. */
	im = build("{\"q\":{\"dtype\":\"F4\",\"shape\":[2,5],\"data_offsets\":[0,5]}}", 0, 5);
	h = expect_ok(&im, im.len);
	assert_int_equal(h->t[0].len, 5);
	st_free(h);
	img_free(&im);
	/* 4 x F6 = 24 bits = 3 bytes. */
	im = build("{\"q\":{\"dtype\":\"F6_E2M3\",\"shape\":[4],\"data_offsets\":[0,3]}}", 0, 3);
	h = expect_ok(&im, im.len);
	assert_int_equal(h->t[0].len, 3);
	st_free(h);
	img_free(&im);
	/* 3 x F4 = 12 bits: not whole bytes. */
	expect_fail("{\"q\":{\"dtype\":\"F4\",\"shape\":[3],\"data_offsets\":[0,2]}}", 2,
		    "whole bytes");
	/* 5 x F6 = 30 bits. */
	expect_fail("{\"q\":{\"dtype\":\"F6_E3M2\",\"shape\":[5],\"data_offsets\":[0,4]}}", 4,
		    "whole bytes");
}

static void test_header_size(void **state)
{
	uint8_t b[16];
	uint64_t total = 12345;

	(void)state;
	memset(b, 0, sizeof(b));
	assert_int_equal(st_header_size(b, 0, &total), -EAGAIN);
	assert_int_equal(st_header_size(NULL, 0, &total), -EAGAIN);
	put_le64(b, 100);
	b[8] = '{';
	assert_int_equal(st_header_size(b, 7, &total), -EAGAIN);
	/* 8 bytes: N is fine but the '{' is not visible yet. */
	assert_int_equal(st_header_size(b, 8, &total), -EAGAIN);
	assert_int_equal(total, 12345);
	assert_int_equal(st_header_size(b, 9, &total), 0);
	assert_int_equal(total, 108);
	/* Bad N is visible with 8 bytes already. */
	put_le64(b, 0);
	assert_int_equal(st_header_size(b, 8, &total), -EINVAL);
	put_le64(b, (uint64_t)ST_MAX_HEADER + 1);
	assert_int_equal(st_header_size(b, 8, &total), -EINVAL);
	put_le64(b, UINT64_MAX);
	assert_int_equal(st_header_size(b, 16, &total), -EINVAL);
	put_le64(b, ST_MAX_HEADER);
	assert_int_equal(st_header_size(b, 9, &total), 0);
	assert_int_equal(total, 8 + (uint64_t)ST_MAX_HEADER);
	/* Not '{'. */
	put_le64(b, 100);
	b[8] = ' ';
	assert_int_equal(st_header_size(b, 9, &total), -EINVAL);
	b[8] = '[';
	assert_int_equal(st_header_size(b, 9, &total), -EINVAL);
	/* Little-endian: 0x0100 = 256. */
	memset(b, 0, sizeof(b));
	b[1] = 1;
	b[8] = '{';
	assert_int_equal(st_header_size(b, 9, &total), 0);
	assert_int_equal(total, 264);
}

static void test_bad_framing(void **state)
{
	struct img im;
	struct st_header *h = NULL;
	char err[256];

	(void)state;
	/* N too big. */
	im = build_raw(123456789012ull, "{}", 0, 0);
	assert_int_equal(st_parse(im.buf, im.len, UINT64_MAX, &h, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "header length 123456789012 exceeds limit");
	img_free(&im);
	/* N == 0. */
	im = build_raw(0, "{}", 0, 0);
	assert_int_equal(st_parse(im.buf, im.len, UINT64_MAX, &h, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "is 0"));
	img_free(&im);
	/* N larger than what was supplied. */
	im = build_raw(50, "{}", 0, 0);
	assert_int_equal(st_parse(im.buf, im.len, UINT64_MAX, &h, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "incomplete"));
	img_free(&im);
	/* Fewer than 8 bytes. */
	assert_int_equal(st_parse((const uint8_t *)"abc", 3, UINT64_MAX, &h, err, sizeof(err)),
			 -EINVAL);
	/* Leading whitespace is valid JSON but not a valid header. */
	im = build(" {}", 0, 0);
	assert_int_equal(st_parse(im.buf, im.len, UINT64_MAX, &h, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "'{'"));
	img_free(&im);
	assert_null(h);
}

static void test_bad_json(void **state)
{
	(void)state;
	expect_fail("{\"a\":", 0, "invalid JSON");
	expect_fail("{\"a\":{}} x", 0, "invalid JSON");
	expect_fail("{nope}", 0, "invalid JSON");
	expect_fail("{\"\xff\xfe\":{}}", 0, "invalid JSON"); /* bad UTF-8 */
	expect_fail("{\"a\\u0000b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
		    "invalid JSON");
	/* N covers an embedded NUL byte. */
	{
		uint8_t buf[] = {4, 0, 0, 0, 0, 0, 0, 0, '{', '}', 0, ' '};
		struct st_header *h = NULL;
		char err[256];

		assert_int_equal(st_parse(buf, sizeof(buf), sizeof(buf), &h, err, sizeof(err)),
				 -EINVAL);
		assert_non_null(strstr(err, "invalid JSON"));
		assert_null(h);
	}
}

static void test_duplicate_key(void **state)
{
	(void)state;
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
		    "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
		    2, "duplicate");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
		    1, "duplicate");
}

static void test_bad_dtype(void **state)
{
	(void)state;
	expect_fail("{\"a.weight\":{\"dtype\":\"F99\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4,
		    "tensor 'a.weight': unknown dtype 'F99'");
	expect_fail("{\"a\":{\"dtype\":\"F32AAAAAAAAAAAAAAAAAAAAAAA\",\"shape\":[1],"
		    "\"data_offsets\":[0,4]}}",
		    4, "unknown dtype");
	expect_fail("{\"a\":{\"dtype\":32,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
	expect_fail("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "dtype");
}

static void test_bad_shape(void **state)
{
	(void)state;
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[-1],\"data_offsets\":[0,0]}}", 0,
		    "shape[0]");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2.0],\"data_offsets\":[0,2]}}", 2,
		    "shape[0]");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,true],\"data_offsets\":[0,1]}}", 1,
		    "shape[1]");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[\"1\"],\"data_offsets\":[0,1]}}", 1,
		    "shape[0]");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":3,\"data_offsets\":[0,3]}}", 3, "shape");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,3]}}", 3, "shape");
	/* 33 dimensions. */
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,"
		    "1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}",
		    1, "dimensions");
	/* Element count overflows. */
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296],"
		    "\"data_offsets\":[0,0]}}",
		    0, "overflows");
	/* Count fits but count * bits does not. */
	expect_fail("{\"a\":{\"dtype\":\"F64\",\"shape\":[4294967296,1073741824],"
		    "\"data_offsets\":[0,0]}}",
		    0, "overflows");
}

static void test_bad_offsets(void **state)
{
	(void)state;
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0]}}", 2,
		    "data_offsets");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2,4]}}", 2,
		    "data_offsets");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2.0]}}", 2,
		    "data_offsets");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[-2,0]}}", 2,
		    "data_offsets");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":\"0,2\"}}", 2,
		    "data_offsets");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[2]}}", 2, "data_offsets");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[4,2]}}", 4,
		    "begin 4 > end 2");
	/* Wrong length for dtype and shape. */
	expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,2],\"data_offsets\":[0,12]}}", 12,
		    "span 12 bytes, dtype and shape need 16");
}

static void test_bad_layout(void **state)
{
	(void)state;
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		    "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]}}",
		    6, "tensors 'a' and 'b' overlap");
	/* Same start, both non-empty. */
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		    "\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
		    4, "overlap");
	/* An empty tensor strictly inside another. */
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		    "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
		    4, "tensors 'a' and 'b' overlap");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		    "\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[5,9]}}",
		    9, "gap of 1 bytes between tensors 'a' and 'b'");
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[3,7]}}", 7,
		    "does not start at offset 0");
	/* An empty tensor beyond the end leaves a gap. */
	expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
		    "\"b\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[8,8]}}",
		    4, "gap");
}

static void test_bad_size(void **state)
{
	const char *json = "{\"a\":{\"dtype\":\"U8\",\"shape\":[10],\"data_offsets\":[0,10]}}";
	struct img im = build(json, 0, 10);
	struct st_header *h = NULL;
	char err[256];

	(void)state;
	/* Truncated: the file is shorter than the tensors need. */
	expect_fail(json, 9, "truncated data");
	assert_int_equal(st_parse(im.buf, im.len, im.len - 1, &h, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated data"));
	/* Trailing bytes. */
	expect_fail(json, 11, "trailing bytes after tensor data");
	assert_int_equal(st_parse(im.buf, im.len, im.len + 100, &h, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "trailing bytes after tensor data: 100 extra");
	assert_null(h);

	/* st_check_size on a header parsed without a size. */
	h = expect_ok(&im, UINT64_MAX);
	assert_int_equal(st_check_size(h, im.len, err, sizeof(err)), 0);
	assert_int_equal(st_check_size(h, im.len - 10, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated data"));
	assert_int_equal(st_check_size(h, 0, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "truncated data"));
	assert_int_equal(st_check_size(h, im.len + 1, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "trailing bytes"));
	assert_int_equal(st_check_size(h, UINT64_MAX - 1, err, sizeof(err)), -EINVAL);
	assert_int_equal(st_check_size(NULL, 0, err, sizeof(err)), -EINVAL);
	st_free(h);
	img_free(&im);

	/* Header with no tensors: data ends where the header ends. */
	im = build("{}", 0, 3);
	assert_int_equal(st_parse(im.buf, im.len, im.len, &h, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "trailing bytes"));
	img_free(&im);
}

static void test_bad_entries(void **state)
{
	(void)state;
	expect_fail("{\"__metadata__\":{\"a\":\"b\",\"n\":1}}", 0,
		    "__metadata__ value of 'n' is not a string");
	expect_fail("{\"__metadata__\":{\"a\":null}}", 0, "not a string");
	expect_fail("{\"__metadata__\":{\"a\":{\"b\":\"c\"}}}", 0, "not a string");
	expect_fail("{\"__metadata__\":\"x\"}", 0, "__metadata__ is not an object");
	expect_fail("{\"__metadata__\":[]}", 0, "__metadata__ is not an object");
	expect_fail("{\"a\":1}", 0, "tensor 'a': entry is not an object");
	expect_fail("{\"a\":[0]}", 0, "not an object");
	expect_fail("{\"a\":null}", 0, "not an object");
	expect_fail("{\"\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[0,0]}}", 0,
		    "empty tensor name");
}

static void test_hostile_names(void **state)
{
	struct img im;
	struct st_header *h = NULL;
	char err[512];
	char json[1024];
	char longname[301];

	(void)state;
	/* A newline in a name must not become a newline in the message. */
	expect_fail("{\"a\\nERROR forged\":{\"dtype\":\"F99\",\"shape\":[],\"data_offsets\":[0,0]}}",
		    0, "unknown dtype");
	/* A very long name is shortened in the message. */
	memset(longname, 'n', 300);
	longname[300] = '\0';
	snprintf(json, sizeof(json),
		 "{\"%s\":{\"dtype\":\"F99\",\"shape\":[],\"data_offsets\":[0,0]}}", longname);
	im = build(json, 0, 0);
	assert_int_equal(st_parse(im.buf, im.len, im.len, &h, err, sizeof(err)), -EINVAL);
	assert_true(strlen(err) < 120);
	assert_non_null(strstr(err, "..."));
	/* A tiny error buffer is fine too, and NULL err is allowed. */
	assert_int_equal(st_parse(im.buf, im.len, im.len, &h, err, 4), -EINVAL);
	assert_int_equal(strlen(err), 3);
	assert_int_equal(st_parse(im.buf, im.len, im.len, &h, NULL, 0), -EINVAL);
	assert_null(h);
	img_free(&im);
}

/* Many tensors in reverse order: sorting and tiling at scale. */
static void test_many_tensors(void **state)
{
	enum { N = 2000 };
	size_t cap = N * 80 + 16, pos = 0;
	char *json = malloc(cap);
	struct img im;
	struct st_header *h;

	(void)state;
	/* Tensor i has i % 3 elements of F32, so every third one is empty. */
	assert_non_null(json);
	{
		uint64_t offs[N + 1];

		offs[0] = 0;
		for (int i = 0; i < N; i++)
			offs[i + 1] = offs[i] + 4 * (uint64_t)(i % 3);
		pos = 0;
		json[pos++] = '{';
		for (int i = N - 1; i >= 0; i--)
			pos += (size_t)snprintf(json + pos, cap - pos,
						"%s\"t%05d\":{\"dtype\":\"F32\",\"shape\":[%d],"
						"\"data_offsets\":[%llu,%llu]}",
						i == N - 1 ? "" : ",", i, i % 3,
						(unsigned long long)offs[i],
						(unsigned long long)offs[i + 1]);
		json[pos++] = '}';
		json[pos] = '\0';
		im = build(json, 0, offs[N]);
		h = expect_ok(&im, im.len);
		assert_int_equal(h->n, N);
		assert_int_equal(h->data_len, offs[N]);
		for (size_t i = 1; i < h->n; i++)
			assert_true(h->t[i - 1].off < h->t[i].off ||
				    (h->t[i - 1].off == h->t[i].off &&
				     strcmp(h->t[i - 1].name, h->t[i].name) < 0));
		for (size_t i = 0; i < h->n; i++)
			assert_int_equal(h->t[i].off, h->data_start + offs[atoi(h->t[i].name + 1)]);
		st_free(h);
		img_free(&im);
	}
	free(json);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dtype_bits),
		cmocka_unit_test(test_valid_several),
		cmocka_unit_test(test_zero_tensors),
		cmocka_unit_test(test_zero_length_tensor),
		cmocka_unit_test(test_padding),
		cmocka_unit_test(test_subbyte),
		cmocka_unit_test(test_header_size),
		cmocka_unit_test(test_bad_framing),
		cmocka_unit_test(test_bad_json),
		cmocka_unit_test(test_duplicate_key),
		cmocka_unit_test(test_bad_dtype),
		cmocka_unit_test(test_bad_shape),
		cmocka_unit_test(test_bad_offsets),
		cmocka_unit_test(test_bad_layout),
		cmocka_unit_test(test_bad_size),
		cmocka_unit_test(test_bad_entries),
		cmocka_unit_test(test_hostile_names),
		cmocka_unit_test(test_many_tensors),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
