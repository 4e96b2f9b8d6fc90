/*
 * chunker.c — where shards begin and end.
 *
 * chunker_next_cut() is a pure function of (header, position).  For a parsed
 * safetensors header the file falls into three regions:
 *
 *   [0, data_start)                 the header: one shard;
 *   [data_start, data_end)          the tensors: one shard per non-empty
 *                                   tensor, cut every max_shard bytes from
 *                                   the tensor's own start;
 *   [data_end, ...)                 anything after the last tensor: the
 *                                   fixed_chunk grid counted from data_end.
 *
 * Finding the tensor that holds @pos is a binary search, because ingest asks
 * once per write on files with hundreds of thousands of tensors.  The search
 * relies only on what st_parse() guarantees: tensors sorted by offset, tiling
 * the data region.  Zero-length tensors sit exactly on a boundary, possibly
 * sharing their offset with one non-empty tensor, so "the largest tensor
 * offset <= pos" is the start of the non-empty tensor holding pos, and "the
 * smallest tensor offset > pos" (or data_end) is its end — no matter how
 * ties between equal offsets are ordered.
 *
 * All arithmetic saturates at UINT64_MAX; the caller clamps the result to
 * the file size anyway.  A zero max_shard or fixed_chunk (a caller bug)
 * means "no further cut" rather than a division by zero.
 */
#include "chunker.h"

/* The first point start + k * step (k >= 1) strictly after @pos >= @start. */
static uint64_t next_on_grid(uint64_t start, uint64_t pos, uint64_t step)
{
	uint64_t k, delta, cut;

	if (step == 0)
		return UINT64_MAX;
	k = (pos - start) / step + 1;
	if (__builtin_mul_overflow(k, step, &delta) ||
	    __builtin_add_overflow(start, delta, &cut))
		return UINT64_MAX;
	return cut;
}

uint64_t chunker_next_cut(const struct st_header *h, uint64_t pos, uint64_t max_shard,
			uint64_t fixed_chunk)
{
	uint64_t data_end, start, end, cut;
	size_t lo, hi;

	if (!h)
		return next_on_grid(0, pos, fixed_chunk);
	if (pos < h->data_start)
		return h->data_start;
	if (__builtin_add_overflow(h->data_start, h->data_len, &data_end))
		data_end = UINT64_MAX;
	if (pos >= data_end)
		return next_on_grid(data_end, pos, fixed_chunk);
	if (h->n == 0) /* not from st_parse(): data but no tensors */
		return next_on_grid(h->data_start, pos, fixed_chunk);

	/* lo = index of the first tensor with off > pos. */
	lo = 0;
	hi = h->n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (h->t[mid].off <= pos)
			lo = mid + 1;
		else
			hi = mid;
	}
	start = lo > 0 ? h->t[lo - 1].off : h->data_start;
	end = lo < h->n ? h->t[lo].off : data_end;
	cut = next_on_grid(start, pos, max_shard);
	return HWFS_MIN(cut, end);
}
