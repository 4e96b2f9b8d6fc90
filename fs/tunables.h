/*
 * tunables.h — every knob of the daemon in one table.
 *
 * Each tunable has a name, a default, a `hwfs mount -o NAME=VALUE` option and
 * an environment variable (HWFS_NAME in upper case).  Precedence: option >
 * environment > default.  `hwfs mount --help` prints the table.
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
	/* replication (replicator/, docs/protocol.md) */
	uint64_t node_expiry_s;        /* coordinator forgets a node dead this long, and its versions */
	uint64_t donor_silence_ms;     /* a donor silent this long with requests out: next donor */
	uint64_t donor_backoff_ms;     /* first pause before re-asking a donor that failed */
	uint64_t donor_backoff_max_ms; /* cap of the doubling per-donor pause */
	uint64_t space_retry_ms;       /* first retry of a pull that stopped for lack of space */
	uint64_t space_retry_max_ms;   /* cap of the doubling retry period */
};

/** The process-wide values (defaults until hwfs_tunables_load()). */
extern struct hwfs_tunables hwfs_tun;

/** Apply the environment, then "name=value" option strings. Returns 0 or -EINVAL. */
int hwfs_tunables_load(const char *const *opts, size_t n_opts);

/** Try one "name=value"; returns 0, -ENOENT (not a tunable) or -EINVAL. */
int hwfs_tunables_set(const char *opt);

/** Print the table (name, default, current, env, meaning) to @f. */
void hwfs_tunables_print(FILE *f);

#endif /* HWFS_TUNABLES_H */
