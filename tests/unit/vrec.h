/*
 * vrec.h — building version records (struct hwfs_vrec) by hand in unit
 * tests: a distinct hash per (version, tag) and a file's extents laid end to
 * end.  Header-only, for tests/unit only; include it after <cmocka.h>.
 */
#ifndef HWFS_TEST_VREC_H
#define HWFS_TEST_VREC_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hwfs_common.h"

/*
 * A distinct hash per (@ver, @tag), so a test sees which shard it got back;
 * @ver NULL hashes "/tag", the same for every version (a shared shard).
 */
static inline hwfs_hash_t H(const char *ver, const char *tag)
{
	char buf[320];
	hwfs_hash_t h;

	snprintf(buf, sizeof(buf), "%s/%s", ver ? ver : "", tag);
	hwfs_hash_buf(buf, strlen(buf), &h);
	return h;
}

/* Give @f @n extents of lengths @lens and hashes @hs, end to end from 0; its size is their sum. */
static inline void set_ext(struct hwfs_frec *f, size_t n, const uint64_t *lens,
			   const hwfs_hash_t *hs)
{
	uint64_t off = 0;

	f->n_ext = n;
	f->ext = calloc(n, sizeof(*f->ext));
	assert_non_null(f->ext);
	for (size_t i = 0; i < n; i++) {
		f->ext[i].off = off;
		f->ext[i].len = lens[i];
		f->ext[i].hash = hs[i];
		off += lens[i];
	}
	f->size = off;
}

#endif /* HWFS_TEST_VREC_H */
