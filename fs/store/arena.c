/*
 * arena.c — the shard arena: one file, mapped once, carved into extents.
 *
 * The arena file is opened (or created), grown to its capacity with
 * ftruncate() and mapped MAP_SHARED at full size, so a shard is an offset and
 * reading it is a pointer add.  Transparent huge pages are requested with
 * madvise() on a best-effort basis; tmpfs honours that only when mounted or
 * configured for it, and nothing depends on it.
 *
 * Free space is a dynamic array of runs {off, len}, sorted by offset and
 * always coalesced: no two runs overlap or touch.  Lookups are binary
 * searches (run_upper() finds the first run starting after an offset), so
 * freeing and reserving stay cheap with thousands of runs; allocation is a
 * linear first-fit scan, which is what first-fit means.  Runs are
 * byte-granular because ingest frees sub-ranges of staging allocations at
 * tensor boundaries, but every allocation starts on a page boundary: within
 * a run the candidate start is the run's offset rounded up to a page, and the
 * unaligned head in front of it simply stays free as its own run.
 *
 * Backing pages are fallocate()d when a range is handed out (alloc, extend),
 * so a full tmpfs says -ENOSPC here rather than SIGBUS on first touch.  That
 * fallocate() runs outside the mutex: once the range is out of the free list
 * no other thread can touch it, and a failure hands it back through the
 * ordinary free path.  Filesystems without fallocate() (EOPNOTSUPP) are
 * accepted as they are.
 *
 * On free, the whole pages inside the merged free run are punched out with
 * FALLOC_FL_PUNCH_HOLE so the memory really goes back to the system.  A page
 * that still holds a live byte of a neighbour is never punched (that would
 * zero it).  Only pages that intersect the newly freed range are considered:
 * pages already wholly free were punched when they became so, and re-punching
 * a large run on every small free would be wasted work.  Punching happens
 * under the mutex, so a page cannot be handed out again and written to while
 * its hole is still being punched.
 *
 * A preallocated arena (arena_preallocate(), `hwfs mount --preallocate`)
 * owns its whole capacity from then on: every page is allocated and touched
 * once, optionally locked, and never punched again.  Allocation then never
 * waits on the page allocator (nor, in a virtual machine, on the host backing
 * a guest page on first touch), which is what a node that receives a new
 * version of the weights many times a day wants; the price is the whole
 * capacity in RAM from the start.
 *
 * Writers fill fresh ranges with arena_write()/arena_zero(): pwrite() on the
 * arena file, so a fallocate()d page is filled in place without a page fault
 * (and without the zeroing the fault would do first); in a preallocated arena
 * those are memcpy()/memset() through the mapping, whose pages are all there.
 *
 * Reserve (start-up: ranges the index says hold shards) takes a range out of
 * the free list without fallocate(): those bytes already exist in the file.
 * Free pages that held data from an earlier run of the daemon and are never
 * reserved are released by arena_trim(), which start-up calls once every
 * known range has been reserved.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "arena.h"

struct run {
	uint64_t off;
	uint64_t len;
};

struct arena {
	int fd;
	uint8_t *base;
	uint64_t cap;
	uint64_t page;

	pthread_mutex_t mu;
	uint64_t used;   /* bytes allocated or reserved */
	struct run *runs; /* free runs, sorted by off, coalesced */
	size_t n;
	size_t nalloc;
	int resident;     /* preallocated: pages are never punched; set before the arena is shared */
	int locked;       /* arena_preallocate(a, 1) locked every page (mlock succeeded) */
};

static uint64_t round_up(uint64_t x, uint64_t page)
{
	return (x + page - 1) / page * page;
}

static uint64_t round_down(uint64_t x, uint64_t page)
{
	return x / page * page;
}

/* Index of the first run whose offset is > @off (n when none). */
static size_t run_upper(const struct arena *a, uint64_t off)
{
	size_t lo = 0, hi = a->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;

		if (a->runs[mid].off <= off)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Make room for at least @want runs. Returns 0 or -ENOMEM. */
static int runs_reserve(struct arena *a, size_t want)
{
	struct run *r;
	size_t nalloc;

	if (want <= a->nalloc)
		return 0;
	nalloc = a->nalloc ? a->nalloc * 2 : 16;
	while (nalloc < want)
		nalloc *= 2;
	r = realloc(a->runs, nalloc * sizeof(*r));
	if (!r)
		return -ENOMEM;
	a->runs = r;
	a->nalloc = nalloc;
	return 0;
}

/*
 * Take [off, off+len) out of run @i, which must contain it.  Splitting a run
 * in two needs one more slot. Returns 0 or -ENOMEM (nothing changed).
 */
static int run_take(struct arena *a, size_t i, uint64_t off, uint64_t len)
{
	struct run *r = &a->runs[i];
	uint64_t head = off - r->off;
	uint64_t tail = r->off + r->len - (off + len);
	int ret = 0;

	if (head && tail) {
		ret = runs_reserve(a, a->n + 1);
		if (ret)
			goto out;
		r = &a->runs[i];
		memmove(&a->runs[i + 2], &a->runs[i + 1], (a->n - i - 1) * sizeof(*r));
		a->runs[i + 1].off = off + len;
		a->runs[i + 1].len = tail;
		r->len = head;
		a->n++;
	} else if (head) {
		r->len = head;
	} else if (tail) {
		r->off = off + len;
		r->len = tail;
	} else {
		memmove(&a->runs[i], &a->runs[i + 1], (a->n - i - 1) * sizeof(*r));
		a->n--;
	}
	a->used += len;
out:
	return ret;
}

/* Back [off, off+len) with memory. Returns 0, -ENOSPC or -errno. */
static int back_range(struct arena *a, uint64_t off, uint64_t len)
{
	int ret;

	do {
		ret = fallocate(a->fd, 0, (off_t)off, (off_t)len);
	} while (ret < 0 && errno == EINTR);
	if (ret == 0)
		return 0;
	switch (errno) {
	case EOPNOTSUPP:
		return 0;
	case ENOSPC:
	case EFBIG:
	case ENOMEM:
		return -ENOSPC;
	default:
		return -errno;
	}
}

/*
 * Punch the whole pages that intersect [off, off+len) and lie inside the free
 * run [rs, re). A run that reaches the end of the arena owns the partial page
 * at the end of the file too. Caller holds the mutex.
 */
static void punch_pages(struct arena *a, uint64_t off, uint64_t len, uint64_t rs, uint64_t re)
{
	uint64_t lo, hi, ps, pe;
	int ret;

	if (re == a->cap)
		re = round_up(re, a->page);
	lo = HWFS_MAX(rs, round_down(off, a->page));
	hi = HWFS_MIN(re, round_up(off + len, a->page));
	ps = round_up(lo, a->page);
	pe = round_down(hi, a->page);

	if (pe <= ps || a->resident)
		return;
	do {
		ret = fallocate(a->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)ps,
				(off_t)(pe - ps));
	} while (ret < 0 && errno == EINTR);
	if (ret < 0 && errno != EOPNOTSUPP)
		LOG_WARN("arena: punching [%llu, %llu): %s", (unsigned long long)ps,
			 (unsigned long long)pe, strerror(errno));
}

/* Free [off, off+len); caller holds the mutex and has checked the bounds. */
static void free_locked(struct arena *a, uint64_t off, uint64_t len)
{
	uint64_t end = off + len, rs, re;
	size_t pos = run_upper(a, off);
	struct run *prev = pos > 0 ? &a->runs[pos - 1] : NULL;
	struct run *next = pos < a->n ? &a->runs[pos] : NULL;
	int join_prev, join_next;

	if ((prev && prev->off + prev->len > off) || (next && next->off < end)) {
		LOG_ERR("arena: freeing [%llu, %llu) which is partly free already; ignored",
			(unsigned long long)off, (unsigned long long)end);
		return;
	}
	join_prev = prev && prev->off + prev->len == off;
	join_next = next && next->off == end;
	if (join_prev && join_next) {
		prev->len += len + next->len;
		rs = prev->off;
		re = prev->off + prev->len;
		memmove(&a->runs[pos], &a->runs[pos + 1], (a->n - pos - 1) * sizeof(*prev));
		a->n--;
	} else if (join_prev) {
		prev->len += len;
		rs = prev->off;
		re = end;
	} else if (join_next) {
		next->off = off;
		next->len += len;
		rs = off;
		re = next->off + next->len;
	} else {
		if (runs_reserve(a, a->n + 1)) {
			LOG_ERR("arena: out of memory freeing [%llu, %llu); range leaked",
				(unsigned long long)off, (unsigned long long)end);
			return;
		}
		memmove(&a->runs[pos + 1], &a->runs[pos], (a->n - pos) * sizeof(*a->runs));
		a->runs[pos].off = off;
		a->runs[pos].len = len;
		a->n++;
		rs = off;
		re = end;
	}
	a->used -= len;
	punch_pages(a, off, len, rs, re);
}

int arena_open(const char *path, uint64_t capacity, struct arena **out)
{
	struct arena *a = NULL;
	struct stat st;
	long page;
	void *p;
	int ret = 0;

	if (!path || !out || capacity == 0 || capacity > (uint64_t)INT64_MAX)
		return -EINVAL;
	a = calloc(1, sizeof(*a));
	if (!a)
		return -ENOMEM;
	a->fd = -1;
	a->base = MAP_FAILED;
	page = sysconf(_SC_PAGESIZE);
	a->page = page > 0 ? (uint64_t)page : 4096;
	ret = pthread_mutex_init(&a->mu, NULL);
	if (ret) {
		ret = -ret;
		free(a);
		return ret;
	}

	a->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (a->fd < 0) {
		ret = -errno;
		goto out;
	}
	if (fstat(a->fd, &st) < 0) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		ret = -EINVAL;
		goto out;
	}
	if ((uint64_t)st.st_size < capacity) {
		if (ftruncate(a->fd, (off_t)capacity) < 0) {
			ret = -errno;
			goto out;
		}
		a->cap = capacity;
	} else {
		a->cap = (uint64_t)st.st_size;
	}
	if (a->cap > SIZE_MAX) {
		ret = -EFBIG;
		goto out;
	}
	p = mmap(NULL, (size_t)a->cap, PROT_READ | PROT_WRITE, MAP_SHARED, a->fd, 0);
	if (p == MAP_FAILED) {
		ret = -errno;
		goto out;
	}
	a->base = p;
	(void)madvise(a->base, (size_t)a->cap, MADV_HUGEPAGE);

	ret = runs_reserve(a, 16);
	if (ret)
		goto out;
	a->runs[0].off = 0;
	a->runs[0].len = a->cap;
	a->n = 1;
	a->used = 0;
	*out = a;
	a = NULL;
out:
	if (a)
		arena_close(a);
	return ret;
}

void arena_close(struct arena *a)
{
	if (!a)
		return;
	if (a->base != MAP_FAILED && a->base)
		munmap(a->base, (size_t)a->cap);
	if (a->fd >= 0)
		close(a->fd);
	pthread_mutex_destroy(&a->mu);
	free(a->runs);
	free(a);
}

uint8_t *arena_base(const struct arena *a)
{
	return a->base;
}

uint64_t arena_capacity(const struct arena *a)
{
	return a->cap;
}

uint64_t arena_used(const struct arena *a)
{
	struct arena *m = (struct arena *)a;
	uint64_t used;

	pthread_mutex_lock(&m->mu);
	used = m->used;
	pthread_mutex_unlock(&m->mu);
	return used;
}

int arena_preallocated(const struct arena *a)
{
	return a->resident;
}

int arena_fd(const struct arena *a)
{
	return a->fd;
}

void arena_write(struct arena *a, uint64_t off, const void *buf, size_t len)
{
	const uint8_t *p = buf;

	/* preallocated: every page is present and mapped, the mapping is cheaper */
	while (len && !a->resident) {
		ssize_t n = pwrite(a->fd, p, len, (off_t)off);

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		p += n;
		off += (uint64_t)n;
		len -= (size_t)n;
	}
	if (len) /* a filesystem that refused: the mapping always takes it */
		memcpy(a->base + off, p, len);
}

void arena_zero(struct arena *a, uint64_t off, uint64_t len)
{
	static const uint8_t zeros[64 << 10];

	while (len) {
		size_t n = (size_t)HWFS_MIN(len, (uint64_t)sizeof(zeros));

		arena_write(a, off, zeros, n);
		off += n;
		len -= n;
	}
}

int arena_reserve(struct arena *a, uint64_t off, uint64_t len)
{
	size_t i;
	int ret = 0;

	if (off > a->cap || len > a->cap - off)
		return -ERANGE;
	if (len == 0)
		return 0;
	pthread_mutex_lock(&a->mu);
	i = run_upper(a, off);
	if (i == 0 || a->runs[i - 1].off + a->runs[i - 1].len < off + len) {
		ret = -EEXIST;
		goto out;
	}
	ret = run_take(a, i - 1, off, len);
out:
	pthread_mutex_unlock(&a->mu);
	return ret;
}

static int arena_alloc_flags(struct arena *a, uint64_t len, int back, uint64_t *off);

int arena_alloc(struct arena *a, uint64_t len, uint64_t *off)
{
	return arena_alloc_flags(a, len, 1, off);
}

int arena_alloc_unbacked(struct arena *a, uint64_t len, uint64_t *off)
{
	return arena_alloc_flags(a, len, 0, off);
}

static int arena_alloc_flags(struct arena *a, uint64_t len, int back, uint64_t *off)
{
	uint64_t start = 0;
	size_t i;
	int ret = -ENOSPC;

	if (len == 0)
		return -EINVAL;
	pthread_mutex_lock(&a->mu);
	for (i = 0; i < a->n; i++) {
		uint64_t end = a->runs[i].off + a->runs[i].len;

		start = round_up(a->runs[i].off, a->page);
		if (start < end && end - start >= len) {
			ret = run_take(a, i, start, len);
			break;
		}
	}
	pthread_mutex_unlock(&a->mu);
	if (ret)
		goto out;

	ret = back && !a->resident ? back_range(a, start, len) : 0;
	if (ret) {
		pthread_mutex_lock(&a->mu);
		free_locked(a, start, len);
		pthread_mutex_unlock(&a->mu);
		goto out;
	}
	*off = start;
out:
	return ret;
}

int arena_extend(struct arena *a, uint64_t off, uint64_t len, uint64_t newlen)
{
	uint64_t at = off + len, more = newlen - len;
	size_t i;
	int ret = -ENOSPC;

	if (newlen < len)
		return -EINVAL;
	if (newlen == len)
		return 0;
	if (off > a->cap || len > a->cap - off)
		return -ENOSPC;
	pthread_mutex_lock(&a->mu);
	i = run_upper(a, at);
	if (i > 0 && a->runs[i - 1].off == at && a->runs[i - 1].len >= more)
		ret = run_take(a, i - 1, at, more);
	pthread_mutex_unlock(&a->mu);
	if (ret)
		goto out;

	ret = back_range(a, at, more);
	if (ret) {
		pthread_mutex_lock(&a->mu);
		free_locked(a, at, more);
		pthread_mutex_unlock(&a->mu);
	}
out:
	return ret;
}

void arena_free(struct arena *a, uint64_t off, uint64_t len)
{
	if (len == 0)
		return;
	if (off > a->cap || len > a->cap - off) {
		LOG_ERR("arena: freeing [%llu, +%llu) outside the arena; ignored",
			(unsigned long long)off, (unsigned long long)len);
		return;
	}
	pthread_mutex_lock(&a->mu);
	free_locked(a, off, len);
	pthread_mutex_unlock(&a->mu);
}

void arena_trim(struct arena *a)
{
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->n; i++)
		punch_pages(a, a->runs[i].off, a->runs[i].len, a->runs[i].off,
			    a->runs[i].off + a->runs[i].len);
	pthread_mutex_unlock(&a->mu);
}

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

int arena_preallocate(struct arena *a, int lock)
{
	int ret = back_range(a, 0, a->cap);

	if (ret)
		return ret;
	if (madvise(a->base, (size_t)a->cap, MADV_POPULATE_WRITE) < 0) {
		if (errno != EINVAL)
			return errno == ENOMEM ? -ENOSPC : -errno;
		/* Before Linux 5.14: a read fault allocates and clears the page. */
		for (uint64_t off = 0; off < a->cap; off += a->page)
			(void)*(volatile uint8_t *)(a->base + off);
	}
	if (lock) {
		if (mlock(a->base, (size_t)a->cap) == 0)
			a->locked = 1;
		else
			LOG_WARN("arena: mlock of %llu bytes: %s (pages stay allocated, not locked)",
				 (unsigned long long)a->cap, strerror(errno));
	}
	a->resident = 1;
	return 0;
}

int arena_locked(const struct arena *a)
{
	return a->locked;
}
