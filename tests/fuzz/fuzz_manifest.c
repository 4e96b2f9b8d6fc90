/*
 * fuzz_manifest.c — libFuzzer target for the manifest decoder.
 *
 * Any input must be rejected cleanly or parsed.  Whatever parses must
 * re-encode, the canonical encoding must parse again, describe the same
 * version (same name, same number of files) and be a fixed point: encoding
 * the second parse gives the same bytes, and its digest equals
 * manifest_digest() of the first.  A violation aborts.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "manifest.h"

#define FUZZ_NAME "fuzz_manifest"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct hwfs_vrec *v = NULL, *w = NULL;
	char err[256], *j1 = NULL, *j2 = NULL;
	size_t l1 = 0, l2 = 0;
	hwfs_hash_t d;
	int rc;

	rc = manifest_parse((const char *)data, size, &v, err, sizeof(err));
	if (rc) {
		if (rc != -EINVAL && rc != -ENOMEM)
			die("unexpected error code", NULL);
		if (rc == -EINVAL && !err[0])
			die("rejected without a reason", NULL);
		return 0;
	}
	if (manifest_build(v, &j1, &l1))
		die("parsed manifest does not re-encode", NULL);
	if (manifest_parse(j1, l1, &w, err, sizeof(err)))
		die("canonical manifest does not parse", err);
	if (strcmp(v->name, w->name) != 0 || v->n_files != w->n_files)
		die("canonical manifest describes another version", NULL);
	if (manifest_build(w, &j2, &l2))
		die("second encoding failed", NULL);
	if (l1 != l2 || memcmp(j1, j2, l1) != 0)
		die("encoding is not a fixed point", NULL);
	if (manifest_digest(v, &d) || hwfs_hash_cmp(&d, &w->digest) != 0)
		die("digest differs from the hash of the canonical bytes", NULL);
	free(j1);
	free(j2);
	hwfs_vrec_free(v);
	hwfs_vrec_free(w);
	return 0;
}
