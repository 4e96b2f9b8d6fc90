/*
 * metrics.h — the process's instruments (atomic counters and fixed-bucket
 * histograms) and the Prometheus text format 0.0.4 they are written in.
 *
 * Every layer may count: the instruments are plain uint64_t fields of two
 * process-wide structs (hwfs_node_metrics for a node, hwfs_coord_metrics for
 * a coordinator), updated with relaxed atomics and never under a lock, so a
 * scrape (which only loads them) can never slow the data path, and the data
 * path never waits for a scrape.  The exposition helpers append to a growable
 * buffer; names are fixed by the callers and label values are escaped here
 * (backslash, double quote, line feed), so no caller writes a raw label.
 * No label takes an unbounded set of values: the FUSE op, the commit outcome
 * and phase come from fixed lists, and hwfs_current_info{version} is one
 * series (the current version).
 */
#ifndef HWFS_METRICS_H
#define HWFS_METRICS_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

/* Histogram bucket upper bounds, in seconds (the +Inf bucket is implicit). */
#define HWFS_HIST_BUCKETS 16
extern const double hwfs_hist_le[HWFS_HIST_BUCKETS];

/* A histogram: counts per bucket (not cumulative) and the sum, in ns. */
struct hwfs_hist {
	uint64_t b[HWFS_HIST_BUCKETS + 1]; /* atomic; the last is +Inf */
	uint64_t sum_ns;                   /* atomic */
};

/** Count one observation of @ns nanoseconds into @h (any thread, lock-free). */
void hwfs_hist_observe_ns(struct hwfs_hist *h, uint64_t ns);

/** Add @v to counter @c (any thread, lock-free). */
static inline void hwfs_count(uint64_t *c, uint64_t v)
{
	__atomic_fetch_add(c, v, __ATOMIC_RELAXED);
}

/** Read counter @c. */
static inline uint64_t hwfs_load(const uint64_t *c)
{
	return __atomic_load_n(c, __ATOMIC_RELAXED);
}

/* The FUSE operations counted (the `op` label of hwfs_fuse_requests_total). */
#define HWFS_FUSE_OPS(X)                                                                          \
	X(lookup) X(forget) X(getattr) X(setattr) X(readlink) X(mknod) X(mkdir) X(unlink)         \
	X(rmdir) X(symlink) X(rename) X(link) X(open) X(read) X(write) X(flush) X(release)        \
	X(fsync) X(opendir) X(readdir) X(releasedir) X(statfs) X(setxattr) X(getxattr)            \
	X(listxattr) X(removexattr) X(create)
enum hwfs_fuse_op {
#define HWFS_FOP_ENUM(n) HWFS_FOP_##n,
	HWFS_FUSE_OPS(HWFS_FOP_ENUM) HWFS_FOP_N
#undef HWFS_FOP_ENUM
};

/* Outcomes of a commit as a node sees it (hwfs_commits_total{outcome}). */
enum hwfs_commit_outcome { HWFS_COMMIT_OK, HWFS_COMMIT_REFUSED, HWFS_COMMIT_FAILED, HWFS_COMMIT_N };
extern const char *const hwfs_commit_outcome_name[HWFS_COMMIT_N];

/* A node's instruments (one per process: a daemon serves one mount). */
struct hwfs_node_metrics {
	uint64_t fuse[HWFS_FOP_N];        /* requests per op */
	uint64_t fuse_read_bytes;         /* bytes replied to reads */
	uint64_t commits[HWFS_COMMIT_N];  /* commits of this node by outcome */
	struct hwfs_hist commit_prepare;  /* PREPARE -> barrier answered */
	struct hwfs_hist commit_flip;     /* the flip of `current` */
	struct hwfs_hist publish;         /* hwfs publish, request -> sealed */
	struct hwfs_hist arrival;         /* PLAN (announce) -> sealed here */
	struct hwfs_hist engine_load;     /* "loading"/prepare -> "loaded" report */
	struct hwfs_hist swap_pause;      /* each engine's reported swap pause */
	uint64_t engine_refusals;         /* "refused" reports */
	uint64_t retries;                 /* shard requests moved to another donor */
	uint64_t updating;                /* commits, publishes and loads in progress */
	uint64_t preparing_ns;            /* monotonic ns of the last "not yet" of a cluster
					   * PREPARE's barrier (0: answered); see hwfs_updating() */
};
extern struct hwfs_node_metrics hwfs_nm;

/*
 * A cluster PREPARE waits for the engine barrier: the agent asks it again at
 * least once a heartbeat while it waits, so a "not yet" older than this means
 * the wait ended without an answer (the commit was aborted elsewhere).
 */
#define HWFS_PREPARING_NS (2 * 1000000000ull)

/**
 * hwfs_updating() - is the node busy with an update right now: a commit,
 * publish or load in progress, or a cluster PREPARE waiting (as of @now_ns,
 * monotonic)?  1 or 0.
 */
static inline int hwfs_updating(uint64_t now_ns)
{
	uint64_t p = hwfs_load(&hwfs_nm.preparing_ns);

	return hwfs_load(&hwfs_nm.updating) || (p && now_ns - p < HWFS_PREPARING_NS);
}

/** Count one FUSE request of @op. */
static inline void hwfs_count_fuse(enum hwfs_fuse_op op)
{
	hwfs_count(&hwfs_nm.fuse[op], 1);
}

/* A coordinator's instruments. */
struct hwfs_coord_metrics {
	uint64_t commits[HWFS_COMMIT_N]; /* cluster commits by outcome */
	struct hwfs_hist commit;         /* request -> every ACK (or abort) */
	struct hwfs_hist converge;       /* first announce -> every live node sealed */
};
extern struct hwfs_coord_metrics hwfs_cm;

/* ------------------------------------------------------------- exposition */

/* The content type of the text format. */
#define HWFS_METRICS_TYPE "text/plain; version=0.0.4; charset=utf-8"

/* A growable text buffer; on allocation failure it sets oom and stops growing. */
struct mbuf {
	char *p;
	size_t len, cap;
	int oom;
};

/** Append printf-style text to @b. */
void mbuf_printf(struct mbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/** The text of @b (NULL if it ran out of memory: freed); @b is left empty. */
char *mbuf_take(struct mbuf *b);
/** Append @v escaped as a label value (\\ \" \n) to @b. */
void mbuf_label_value(struct mbuf *b, const char *v);

/** "# HELP name help\n# TYPE name type\n" (help must not hold a line feed). */
void metrics_family(struct mbuf *b, const char *name, const char *type, const char *help);
/**
 * metrics_sample() - one sample line: @name, then {@lk="@lv"} when @lk is not
 * NULL (@lv escaped), then @v (integers printed exactly).
 */
void metrics_sample(struct mbuf *b, const char *name, const char *lk, const char *lv, double v);
/** The same with an unsigned 64-bit value, printed exactly. */
void metrics_sample_u64(struct mbuf *b, const char *name, const char *lk, const char *lv,
			uint64_t v);
/**
 * metrics_hist() - the _bucket{[lk="lv",]le}, _sum and _count lines of @h
 * under @name (its family line is the caller's: once per name).
 */
void metrics_hist(struct mbuf *b, const char *name, const char *lk, const char *lv,
		  const struct hwfs_hist *h);

/** hwfs_build_info{version} 1, and the process's start time (both families). */
void metrics_build_info(struct mbuf *b);

/** The node's instruments of hwfs_nm (families and samples). */
void metrics_node(struct mbuf *b);
/** The coordinator's instruments of hwfs_cm (families and samples), and its per-node samples. */
void metrics_coord(struct mbuf *b);
/**
 * metrics_coord_set_nodes() - the per-node families metrics_coord() prints
 * after hwfs_cm's (each live node's current, and whether it diverges from
 * the committed version), rendered by the coordinator on each status pass:
 * @text is copied (NULL: none).  Any thread.
 */
void metrics_coord_set_nodes(const char *text);

#endif /* HWFS_METRICS_H */
