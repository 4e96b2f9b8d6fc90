/*
 * agent_pool.h — the replication agent's codec workers (docs/delta.md,
 * "Codec workers").
 *
 * The agent thread owns every socket and must never spend a whole shard's
 * encode or rebuild on itself: it hands those to a pool of worker threads
 * (codec_threads of them, 0: one per online CPU), each with its own codec
 * context (struct delta_ctx is not thread-safe) and scratch buffer.  A job
 * is one shard: encode a delta of it against a base (a GET's, or ahead of
 * demand when a version is sealed), or rebuild it from a delta that arrived
 * (decode, hash, stage).  Jobs of different shards run in parallel; demand
 * jobs (a puller waits) go before encode-ahead ones.
 *
 * The agent submits a job and goes on; a finished job is put on the pool's
 * done list and the pool's eventfd (pool_fd()) becomes readable, which the
 * agent's zmq_poll() watches; the agent then takes the finished jobs
 * (pool_take_done()) and acts on them on its own thread.  A job holds its
 * own references on the shards it reads, so it stays valid whatever the
 * agent does meanwhile (a fetch ended, a version removed); the agent tells a
 * stale result by the job's id and drops it.  Nothing a worker does is
 * visible to the node before the agent acts on the result: a worker only
 * stages a rebuilt shard (a staged range is no shard: nothing reads it), it
 * never interns, and it keeps the range staged only when the hash matched.
 */
#ifndef HWFS_AGENT_POOL_H
#define HWFS_AGENT_POOL_H

#include <stddef.h>
#include <stdint.h>

#include "hwfs_common.h"
#include "store.h"

struct pool;
struct delta_stats;

enum pool_kind {
	POOL_ENCODE,  /* a delta of @sh against @bsh */
	POOL_REBUILD, /* @sh's bytes from @bsh and the delta @enc, checked against @hash */
};

/*
 * One job.  The agent fills the "in" fields and submits it; the worker
 * fills the "out" fields; the agent takes it back from the done list and
 * frees it (pool_job_free()).  Between submit and take the agent reads only
 * @id, @hash, @base, @width, @size, @ahead and (a rebuild's) @enc, @enc_len;
 * it writes only @cancel (atomic).
 */
struct pool_job {
	enum pool_kind kind;
	uint64_t id; /* the agent's, to find what the result is for */
	int ahead;   /* encode ahead of demand (low priority); 0: a puller waits */
	int cancel;  /* atomic: set by the agent: do not run it (r = -ECANCELED) */
	/* in: the shards (one reference each, dropped by pool_job_free()) */
	struct shard *bsh; /* the base */
	struct shard *sh;  /* encode: the shard to encode (rebuild: NULL) */
	hwfs_hash_t base, hash;
	unsigned width; /* element width to shuffle by (encode) */
	uint64_t size;  /* shard bytes */
	/* encode: out (the delta, malloc'd); rebuild: in (owned by the job) */
	uint8_t *enc;
	size_t enc_len;
	/* out */
	int r;             /* 0; -E2BIG (encode: not worth it); -EBADMSG (rebuild: wrong
			      bytes, @err says why); -ENOSPC (no staging room); -ECANCELED */
	int base_bad;      /* rebuild failed and the base here does not match its hash */
	unsigned enc_width; /* rebuild: the width the delta declares */
	uint64_t roff;     /* rebuild, r == 0: the staged range holding the shard */
	int staged;        /* @roff is staged: pool_job_free() gives it back unless cleared */
	char err[160];
	struct pool_job *next;
};

/**
 * pool_new() - start @threads workers (0: one per online CPU) for store
 * @st, each with a codec context of zstd level @level; counters go to @ds
 * (atomics).  Returns 0 or -errno.
 */
int pool_new(struct store *st, unsigned threads, int level, struct delta_stats *ds,
	     struct pool **out);

/** Stop the workers (a job running ends first; queued ones are dropped) and free all. NULL ok. */
void pool_free(struct pool *p);

/** The eventfd that is readable when a job finished (for the agent's poll). */
int pool_fd(const struct pool *p);

/** CPU nanoseconds the workers' threads have used so far (their thread CPU clocks). */
uint64_t pool_cpu_ns(const struct pool *p);
/** How many workers there are. */
unsigned pool_threads(const struct pool *p);

/** Queue @j (ownership passes to the pool until pool_take_done() gives it back). */
void pool_submit(struct pool *p, struct pool_job *j);

/** @j (queued or running) is wanted by a puller now: move it before encode-ahead jobs. */
void pool_promote(struct pool *p, struct pool_job *j);

/**
 * pool_take_done() - the finished jobs, oldest first, as a list through
 * ->next (NULL: none); clears the eventfd.  The caller owns them.
 */
struct pool_job *pool_take_done(struct pool *p);

/** Drop @j's references (its shards in @st), its buffers and @j.  NULL ok. */
void pool_job_free(struct store *st, struct pool_job *j);

#endif /* HWFS_AGENT_POOL_H */
