/*
 * fuse_readaround.c — read-around for small reads of immutable files: after
 * a small read of a sealed file or tensor (a random pread, an mmap fault
 * under MADV_RANDOM), the whole aligned window around it (read_around_kb) is
 * stored into the kernel's page cache with FUSE_NOTIFY_STORE, so the next
 * small reads there hit the page cache instead of each paying a FUSE round
 * trip.
 *
 * Why (docs/benchmarks.md, "Parallel readers"): the kernel sends a cold
 * random 4 KiB read as one 4 KiB request (it does no read-ahead for random
 * reads, and an mmap fault under MADV_RANDOM reads one page), and on this
 * VM a request costs 10-15 us of two context switches and two system calls
 * whatever its size, so four random readers reached 0.18x tmpfs and four
 * mmap readers 0.27x.  Filling 1 MiB windows instead moves the cost to the
 * page-cache fill (1.2-1.4 GB/s here), which is what bounds every cold read
 * through this kernel's FUSE page cache.  max_threads 2, 4, 8 and 16 were
 * measured too and move these rows within the noise (each request still
 * costs its round trip); read_ahead_kb does not apply to random reads.
 *
 * Only immutable data is pushed (sealed regular files and tensors): their
 * pages can never go stale, which is also why they get keep_cache.  Large
 * reads (read-ahead of sequential readers) are left alone: read-ahead already
 * fills their windows.
 *
 * The push runs on threads of its own (RA_THREADS), never on a FUSE worker:
 * storing a page waits for its page lock, and a page may be locked by a
 * reader whose own request waits for a worker, so workers that pushed could
 * all end up waiting on each other.  The push threads depend on no one.
 *
 * Which windows are on their way is kept in a small table (hash of node and
 * window -> queued or done); a collision only costs a push too many or a
 * push too few, never a wrong byte.  A small read in a window marked done
 * means the kernel dropped those pages (drop_caches, memory pressure): the
 * window is pushed again.  A queued window holds an open reference on its
 * node (ns_open), so the node, its inode number and its extents stay valid
 * until the push; if the kernel has forgotten the inode by then, the
 * notification fails with ENOENT and is dropped.  The queue is bounded;
 * when it is full the window is simply not pushed (the reads stay correct,
 * only slower).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "fuse_ops.h"
#include "ns_i.h"
#include "tunables.h"

#define RA_SLOTS 4096u       /* windows remembered (power of 2) */
#define RA_QUEUE 256u        /* windows waiting to be pushed */
#define RA_SMALL (32u << 10) /* a read of at most this is "small" */
/*
 * Push threads: the fill is the kernel's page allocation and copy, on the
 * pushing thread's CPU; two fill about 1.4 GB/s on this 2-core VM against
 * 1.2 for one (four random readers, 1 MiB windows, medians of 3).
 */
#define RA_THREADS 2u
#define RA_QUEUED 1ull
#define RA_DONE 2ull

struct ra_item {
	struct node *n;
	fuse_ino_t ino; /* the kernel's number for it */
	uint64_t off;   /* window start, in the node's bytes */
	uint64_t tag;   /* slot value without the state bits */
	uint32_t slot;
};

struct readaround {
	struct ns *ns;
	struct fuse_session *se;
	uint64_t win; /* window bytes */
	unsigned nthreads;
	pthread_t thread[RA_THREADS];
	pthread_mutex_t mu;
	pthread_cond_t cv;
	int stop;
	uint32_t head, count;
	struct ra_item q[RA_QUEUE];
	uint64_t slots[RA_SLOTS]; /* tag | RA_QUEUED or RA_DONE; 0: empty */
};

static uint64_t mix64(uint64_t x)
{
	x ^= x >> 33;
	x *= 0xff51afd7ed558ccdull;
	x ^= x >> 33;
	x *= 0xc4ceb9fe1a85ec53ull;
	return x ^ (x >> 33);
}

struct push_ctx {
	struct readaround *ra;
	fuse_ino_t ino;
	uint64_t off;
};

/* ns_read's emit: store the window's runs in the kernel's page cache. */
static int push_emit(void *arg, const struct iovec *iov, int cnt)
{
	struct push_ctx *p = arg;
	struct fuse_bufvec *bv;
	int r;

	if (cnt == 0)
		return 0;
	bv = calloc(1, sizeof(*bv) + sizeof(bv->buf[0]) * (size_t)cnt);
	if (!bv)
		return -ENOMEM;
	bv->count = (size_t)cnt;
	for (int i = 0; i < cnt; i++) {
		bv->buf[i].mem = iov[i].iov_base;
		bv->buf[i].size = iov[i].iov_len;
		bv->buf[i].pos = -1;
	}
	r = fuse_lowlevel_notify_store(p->ra->se, p->ino, (off_t)p->off, bv, 0);
	free(bv);
	return r;
}

static void push(struct readaround *ra, const struct ra_item *it)
{
	struct push_ctx p = {ra, it->ino, it->off};
	uint64_t v = it->tag | RA_QUEUED;
	int r = ns_read(ra->ns, it->n, it->off, (size_t)ra->win, push_emit, &p);

	/* ENOENT: the kernel forgot the inode; ENODEV: unmounted.  Neither is news. */
	if (r < 0 && r != -ENOENT && r != -ENODEV)
		LOG_WARN("read-around of %llu bytes at %llu not stored: %s",
			 (unsigned long long)ra->win, (unsigned long long)it->off, strerror(-r));
	__atomic_compare_exchange_n(&ra->slots[it->slot], &v, r < 0 ? 0 : it->tag | RA_DONE, 0,
				    __ATOMIC_RELEASE, __ATOMIC_RELAXED);
	ns_release(ra->ns, it->n);
}

static void *ra_main(void *arg)
{
	struct readaround *ra = arg;
	struct ra_item it;

	pthread_mutex_lock(&ra->mu);
	for (;;) {
		while (!ra->stop && !ra->count)
			pthread_cond_wait(&ra->cv, &ra->mu);
		if (!ra->count) /* stopping, nothing left */
			break;
		it = ra->q[ra->head];
		ra->head = (ra->head + 1) % RA_QUEUE;
		ra->count--;
		pthread_mutex_unlock(&ra->mu);
		if (__atomic_load_n(&ra->stop, __ATOMIC_ACQUIRE)) { /* drain: references only */
			ns_release(ra->ns, it.n);
		} else {
			push(ra, &it);
		}
		pthread_mutex_lock(&ra->mu);
	}
	pthread_mutex_unlock(&ra->mu);
	return NULL;
}

int hwfs_readaround_start(struct fsctx *c, struct fuse_session *se)
{
	struct readaround *ra;

	if (!hwfs_tun.read_around_kb)
		return 0;
	ra = calloc(1, sizeof(*ra));
	if (!ra)
		return -ENOMEM;
	ra->ns = c->ns;
	ra->se = se;
	ra->win = hwfs_tun.read_around_kb << 10;
	pthread_mutex_init(&ra->mu, NULL);
	pthread_cond_init(&ra->cv, NULL);
	while (ra->nthreads < RA_THREADS &&
	       pthread_create(&ra->thread[ra->nthreads], NULL, ra_main, ra) == 0)
		ra->nthreads++;
	if (!ra->nthreads) {
		pthread_cond_destroy(&ra->cv);
		pthread_mutex_destroy(&ra->mu);
		free(ra);
		return -EAGAIN;
	}
	__atomic_store_n(&c->ra, ra, __ATOMIC_RELEASE);
	return 0;
}

void hwfs_readaround_stop(struct fsctx *c)
{
	struct readaround *ra = c->ra;

	if (!ra)
		return;
	__atomic_store_n(&c->ra, NULL, __ATOMIC_RELEASE);
	pthread_mutex_lock(&ra->mu);
	__atomic_store_n(&ra->stop, 1, __ATOMIC_RELEASE);
	pthread_cond_broadcast(&ra->cv);
	pthread_mutex_unlock(&ra->mu);
	for (unsigned i = 0; i < ra->nthreads; i++)
		pthread_join(ra->thread[i], NULL);
	pthread_cond_destroy(&ra->cv);
	pthread_mutex_destroy(&ra->mu);
	free(ra);
}

void hwfs_readaround_note(struct fsctx *c, struct node *n, fuse_ino_t ino, uint64_t off,
			  size_t size)
{
	struct readaround *ra = __atomic_load_n(&c->ra, __ATOMIC_ACQUIRE);
	uint64_t off0, h, tag, v;
	uint32_t slot;

	if (!ra || size > RA_SMALL)
		return;
	if (n->type != NT_TENSOR && (n->type != NT_REG || ns_writable(n)))
		return; /* only bytes that can never change */
	off0 = off / ra->win * ra->win;
	h = mix64((uint64_t)(uintptr_t)n ^ mix64(off0));
	tag = h & ~3ull;
	slot = (uint32_t)(h >> 52) & (RA_SLOTS - 1);
	v = __atomic_load_n(&ra->slots[slot], __ATOMIC_ACQUIRE);
	if (v == (tag | RA_QUEUED))
		return; /* on its way */
	if (!__atomic_compare_exchange_n(&ra->slots[slot], &v, tag | RA_QUEUED, 0, __ATOMIC_ACQ_REL,
					 __ATOMIC_RELAXED))
		return; /* another worker just took this slot */
	if (ns_open(ra->ns, n) == 0) {
		pthread_mutex_lock(&ra->mu);
		if (ra->count < RA_QUEUE && !ra->stop) {
			ra->q[(ra->head + ra->count) % RA_QUEUE] = (struct ra_item){n, ino, off0, tag, slot};
			ra->count++;
			pthread_cond_signal(&ra->cv);
			pthread_mutex_unlock(&ra->mu);
			return;
		}
		pthread_mutex_unlock(&ra->mu);
		ns_release(ra->ns, n);
	}
	v = tag | RA_QUEUED; /* not queued after all: forget the window */
	__atomic_compare_exchange_n(&ra->slots[slot], &v, 0, 0, __ATOMIC_RELEASE, __ATOMIC_RELAXED);
}
