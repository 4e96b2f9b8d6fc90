/*
 * safetensors.h — a strict parser for the safetensors header.
 *
 * File layout: 8 bytes little-endian N, then N bytes of UTF-8 JSON (an object,
 * may be right-padded with spaces), then the data buffer.  The JSON maps tensor
 * names to {"dtype": STR, "shape": [INT...], "data_offsets": [BEGIN, END]}
 * (offsets relative to the start of the data buffer) plus an optional
 * "__metadata__" object of string -> string.
 *
 * The parser trusts nothing: every rule of the format is checked and the first
 * violation is reported in words.  A file that fails any check is stored by
 * hwfs as a plain file, so these functions never abort and never read past
 * the buffer they are given.
 */
#ifndef HWFS_SAFETENSORS_H
#define HWFS_SAFETENSORS_H

#include "hwfs_common.h"

/** Largest header accepted (the reference implementation uses 100 MB). */
#define ST_MAX_HEADER (100u * 1000u * 1000u)
/** Most dimensions a tensor may have. */
#define ST_MAX_NDIM 32

struct st_tensor {
	char *name;
	char dtype[16];
	uint32_t ndim;
	uint64_t *shape; /* ndim entries, NULL when ndim == 0 */
	uint64_t off;    /* absolute offset in the file: 8 + N + data_offsets[0] */
	uint64_t len;    /* data_offsets[1] - data_offsets[0] */
};

struct st_header {
	uint64_t header_len; /* N */
	uint64_t data_start; /* 8 + N */
	uint64_t data_len;   /* sum of tensor lengths == end of the last tensor's range */
	size_t n;            /* tensors, sorted by off (then name) */
	struct st_tensor *t;
};

/**
 * st_header_size() - how many leading bytes hold the whole header.
 * @buf, @len: the first bytes of the file (any length).
 * @total: out, 8 + N.
 * Returns 0, -EAGAIN when fewer than 8 bytes (or fewer than 9 to see the
 * opening '{') are available, -EINVAL when N is 0, larger than ST_MAX_HEADER,
 * or the header does not start with '{'.
 */
int st_header_size(const uint8_t *buf, size_t len, uint64_t *total);

/**
 * st_parse() - parse and validate a complete header.
 * @buf, @len: at least the first 8 + N bytes of the file.
 * @file_size: the file's final size, or UINT64_MAX when not known yet (then
 *             only the checks that do not need it run; call st_check_size()
 *             once the size is known).
 * @out: on success a new header, free with st_free().
 * @err, @errlen: on failure, one line saying what is wrong.
 * Checks: length and '{', valid UTF-8 JSON object (duplicate keys rejected),
 * known dtype, shape of non-negative integers (at most ST_MAX_NDIM),
 * data_offsets two integers with begin <= end, end - begin equal to
 * product(shape) * element size (bits-based for sub-byte dtypes), ranges
 * neither overlapping nor leaving holes and starting at 0, "__metadata__" a
 * string->string object, no other top-level non-object values, and (when
 * @file_size is known) data_start + data_len == file_size.
 * Returns 0 or -EINVAL (also -ENOMEM).
 */
int st_parse(const uint8_t *buf, size_t len, uint64_t file_size, struct st_header **out,
	     char *err, size_t errlen);

/**
 * st_check_size() - the check st_parse() skipped when the size was unknown:
 * the data buffer must end exactly at @file_size (shorter: "truncated data",
 * longer: "trailing bytes"). Returns 0 or -EINVAL with @err set.
 */
int st_check_size(const struct st_header *h, uint64_t file_size, char *err, size_t errlen);

/** Element size in bits of a dtype name ("F32" -> 32, "F4" -> 4), or 0 if unknown. */
unsigned st_dtype_bits(const char *dtype);

/** Free a header from st_parse(). NULL is a no-op. */
void st_free(struct st_header *h);

#endif /* HWFS_SAFETENSORS_H */
