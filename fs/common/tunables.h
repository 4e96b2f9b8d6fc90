/*
 * tunables.h — every knob of the daemon in one table.
 *
 * Each tunable has a name, a default, a `hwfs mount -o NAME=VALUE` option and
 * an environment variable (HWFS_NAME in upper case).  Precedence: option >
 * environment > default.  `hwfs mount --help` prints the table.  The
 * coordinator (`hwfs coord`, or the one embedded in a daemon) reads the same
 * table from the environment.
 */
#ifndef HWFS_TUNABLES_H
#define HWFS_TUNABLES_H

#include "hwfs_common.h"

struct hwfs_tunables {
	uint64_t max_shard;     /* largest shard; bigger tensors are cut in pieces */
	uint64_t fixed_chunk;   /* shard size for non-safetensors files */
	uint64_t staging_min;   /* first staging allocation of a file being written */
	uint64_t staging_step;  /* staging growth step */
	uint64_t read_ahead_kb; /* bdi read-ahead of the mount */
	uint64_t max_threads;   /* FUSE worker threads */
	uint64_t max_background;/* FUSE async requests in flight (read-ahead) */
	uint64_t publish_io;    /* read size of `hwfs publish` */
	uint64_t ctl_drain_ms;  /* at shutdown, wait this long for control connections */
	uint64_t ctl_conns_per_uid; /* live control connections one non-root uid may hold */
	/* replication (replicator/, docs/protocol.md) */
	uint64_t node_expiry_s;        /* coordinator forgets a node dead this long, and its versions */
	uint64_t donor_silence_ms;     /* a donor silent this long with requests out: next donor */
	uint64_t donor_backoff_ms;     /* first pause before re-asking a donor that failed */
	uint64_t donor_backoff_max_ms; /* cap of the doubling per-donor pause */
	uint64_t space_retry_ms;       /* first retry of a pull that stopped for lack of space */
	uint64_t space_retry_max_ms;   /* cap of the doubling retry period */
	uint64_t pull_window_bytes; /* shard bytes asked for and not yet here, per version pulled */
	uint64_t get_batch_bytes;   /* shard bytes asked for in one GET */
	uint64_t piece_bytes;       /* a served shard travels in pieces of this size */
	uint64_t missing_retry_ms;  /* a donor answered MISSING: ask it again after this */
	uint64_t missing_tries;     /* MISSING answers before moving on to the next donor */
	uint64_t progress_ms;       /* period of a pull's progress reports (HAVE, status) */
	uint64_t reconnect_ms;      /* first reconnect delay of a node's sockets (ZeroMQ) */
	uint64_t reconnect_max_ms;  /* cap of the doubling reconnect delay */
	uint64_t heartbeat_ms;      /* period of a node's HELLO to the coordinator */
	uint64_t coord_silence_ms;  /* no answer from the coordinator this long: unreachable */
	uint64_t node_dead_ms;      /* coordinator: no HELLO from a node this long: dead */
	uint64_t commit_deadline_ms; /* a cluster commit's deadline (READY and ACK of every node) */
	uint64_t commit_wait_ms;     /* how long `hwfs commit` waits for the coordinator's answer */
	uint64_t status_wait_ms;     /* how long `hwfs status --cluster` waits for it */
	/* engines (docs/engines.md) */
	uint64_t engine_deadline_ms; /* the commit barrier waits this long for every engine's report */
	/* element-level deltas (docs/delta.md) */
	uint64_t delta;             /* 1: shards travel as deltas against a base the receiver holds */
	uint64_t delta_max_pct;     /* a delta above this percentage of its shard: the whole shard */
	uint64_t delta_level;       /* zstd level of the deltas a donor encodes */
	uint64_t delta_cache_bytes; /* encoded deltas a node keeps to serve again (encode once) */
	/* `hwfs diff --elements` (fs/daemon/daemon_diff.c) */
	uint64_t diff_threads;    /* element diffs computing at once, the whole daemon */
	uint64_t diff_per_uid;    /* element diffs one uid may have computing or queued */
	uint64_t diff_queue_ms;   /* a diff waits this long for a thread or memory, then EBUSY */
	uint64_t diff_mem_bytes;  /* memory all computing element diffs may take together */
	uint64_t diff_cache;      /* element diff results kept, per pair of version digests */
	/* device shadow-load (docs/gpu.md) */
	uint64_t gpu_mem_pct;      /* one load may take this percentage of a device's free memory */
	uint64_t gpu_streams;      /* copy streams per load */
	uint64_t gpu_bucket_bytes; /* the largest device bucket (a bigger tensor gets its own) */
};

/** The process-wide values (defaults until hwfs_tunables_load()). */
extern struct hwfs_tunables hwfs_tun;

/** Apply the environment, then "name=value" option strings. Returns 0 or -EINVAL. */
int hwfs_tunables_load(const char *const *opts, size_t n_opts);

/** Try one "name=value"; returns 0, -ENOENT (not a tunable) or -EINVAL. */
int hwfs_tunables_set(const char *opt);

/** Print the table (name, default, meaning) to @f, for --help. */
void hwfs_tunables_print(FILE *f);

#endif /* HWFS_TUNABLES_H */
