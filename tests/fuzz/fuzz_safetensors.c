/*
 * fuzz_safetensors.c — libFuzzer target for the safetensors parser and the
 * chunker.
 *
 * The input is a whole file image.  It goes through st_header_size(), then
 * st_parse() twice (size known and unknown), and for the unknown-size parse
 * st_check_size() with the real size.  The two parses must agree.  For every
 * header that parses, chunker_next_cut() is walked across the file with a
 * small max_shard and fixed_chunk derived from the input; each cut must move
 * forward and, within the tensor data, land on a tensor boundary or a
 * max_shard step.  The walk is bounded so a large file cannot stall the run.
 * Any violated invariant aborts, which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "chunker.h"
#include "safetensors.h"

#define MAX_STEPS 4096

static void walk(const struct st_header *h, uint64_t size, uint64_t max_shard, uint64_t fixed)
{
	uint64_t pos = 0;

	for (int step = 0; step < MAX_STEPS && pos < size; step++) {
		uint64_t cut = chunker_next_cut(h, pos, max_shard, fixed);

		if (cut <= pos)
			abort();
		if (h && pos < h->data_start && cut != h->data_start)
			abort();
		if (h && pos >= h->data_start && cut - pos > HWFS_MAX(max_shard, fixed))
			abort();
		/* A position inside the shard gives the same end. */
		if (chunker_next_cut(h, cut - 1, max_shard, fixed) != cut)
			abort();
		pos = cut;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct st_header *h1 = NULL, *h2 = NULL;
	char err[256];
	uint64_t total = 0;
	int r0, r1, r2;
	uint64_t max_shard, fixed;

	r0 = st_header_size(data, size, &total);
	if (r0 != 0 && r0 != -EAGAIN && r0 != -EINVAL)
		abort();
	if (r0 == 0 && (total < 9 || total > 8 + (uint64_t)ST_MAX_HEADER))
		abort();

	r1 = st_parse(data, size, size, &h1, err, sizeof(err));
	if (r1 && strchr(err, '\n'))
		abort();
	r2 = st_parse(data, size, UINT64_MAX, &h2, err, sizeof(err));
	if (r2 && strchr(err, '\n'))
		abort();
	if (r1 == 0 && (r0 != 0 || r2 != 0))
		abort();
	if (r2 == 0) {
		int r3 = st_check_size(h2, size, err, sizeof(err));

		if ((r3 == 0) != (r1 == 0))
			abort();
		if (h2->data_start != total || h2->data_start + h2->data_len < h2->data_start)
			abort();
	}

	/* Walk parameters from the input's last bytes: small, never zero. */
	max_shard = 1 + (size ? data[size - 1] % 64 : 0);
	fixed = 1 + (size > 1 ? data[size - 2] % 128 : 0);
	if (h1) {
		if (h1->data_start + h1->data_len != size)
			abort();
		walk(h1, size, max_shard, fixed);
	}
	if (h2)
		walk(h2, size + 256, max_shard, fixed);
	walk(NULL, size, max_shard, fixed);

	st_free(h1);
	st_free(h2);
	return 0;
}
