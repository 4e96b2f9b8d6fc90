/*
 * tunables.h — every knob of the daemon, each defined once, in HWFS_TUNABLES.
 *
 * Each tunable has a name, a default, a `hwfs mount -o NAME=VALUE` option and
 * an environment variable (HWFS_NAME in upper case).  Precedence: option >
 * environment > default.  `hwfs mount --help` prints the table.  The
 * coordinator (`hwfs coord`, or the one embedded in a daemon) reads the same
 * table from the environment.
 *
 * HWFS_TUNABLES(X) is the one list (an X-macro): it expands X once per
 * tunable, and both struct hwfs_tunables (a uint64_t field per row, below)
 * and the table in tunables.c (defaults, ranges, parsing, environment lookup,
 * --help) are generated from it, so the two cannot disagree.
 */
#ifndef HWFS_TUNABLES_H
#define HWFS_TUNABLES_H

#include "hwfs_common.h"

/*
 * Adding a tunable is adding one row here, and nothing else:
 *
 *   X(name, default, min, max, "help")
 *
 *   name     the field hwfs_tun.name, the option `-o name=VALUE` and the
 *            environment variable HWFS_NAME (the name upper-cased): both are
 *            derived from it, so they are not columns
 *   default  the value before any option or environment (uint64_t)
 *   min/max  the accepted range, inclusive; a value outside it is -EINVAL
 *   help     the line `hwfs mount --help` prints
 *
 * Every tunable is a uint64_t, parsed by hwfs_parse_size (so sizes take the
 * K/M/G/T suffixes); times are integers in the unit their name ends with
 * (_ms, _s).  Rows are printed by --help in this order.
 *
 * (Before this list, a tunable was a field of the struct plus a row
 * ROW(name, default, min, max, help) in tunables.c: such a pair becomes one
 * X(...) line here with the same five arguments, and the field goes.)
 */
#define HWFS_TUNABLES(X) \
	/* the store, the mount and the daemon */ \
	X(max_shard, 64ull << 20, 4096, 1ull << 30, \
	  "largest shard; tensors above it are cut in pieces") \
	X(fixed_chunk, 4ull << 20, 4096, 1ull << 30, \
	  "shard size for files that are not safetensors") \
	X(staging_min, 256ull << 10, 4096, 1ull << 30, \
	  "first staging allocation of a file being written") \
	X(staging_step, 256ull << 20, 1ull << 20, 1ull << 34, "largest staging growth step") \
	X(read_ahead_kb, 8192, 128, 1u << 20, "read-ahead of the mount (bdi read_ahead_kb)") \
	X(max_threads, 8, 1, 256, "FUSE worker threads") \
	X(max_background, 64, 1, 65535, "async FUSE requests in flight (read-ahead)") \
	X(read_around_kb, 1024, 0, 65536, \
	  "a small read of a sealed file also fills this much around it (0: off)") \
	X(publish_io, 8ull << 20, 4096, 1ull << 30, "read size of hwfs publish") \
	X(ctl_drain_ms, 10000, 1, 3600000, \
	  "at shutdown, wait this long (ms) for control connections") \
	X(ctl_conns_per_uid, 64, 1, 65536, \
	  "live control connections one user (other than root) may hold; more are refused") \
	/* the HTTP endpoint (--http: /metrics, /healthz, /readyz; docs/operations.md) */ \
	X(http_conns, 256, 4, 4096, \
	  "--http: connections served at once; a newcomer past it closes the oldest one " \
	  "still waiting for its request headers (refused when none waits)") \
	X(http_conns_per_ip, 32, 1, 4096, \
	  "--http: connections from one address at once; a newcomer past it closes that " \
	  "address's oldest one still waiting for its request headers") \
	X(http_header_ms, 5000, 100, 3600000, \
	  "--http: a connection must send its complete request headers within this (ms) of " \
	  "connecting or of its previous answer, else it is closed") \
	X(http_timeout_s, 10, 1, 3600, "--http: an idle or slow connection is closed after this") \
	X(http_health_ms, 1000, 10, 600000, \
	  "--http: /healthz waits this long (ms) for the mount to answer, else 503") \
	X(http_conn_memory, 32768, 4096, 1u << 20, \
	  "--http: memory per connection; a request whose headers do not fit is refused") \
	/* replication (replicator/, docs/protocol.md) */ \
	X(node_expiry_s, 600, 1, 1ull << 32, \
	  "coordinator: a node dead this long is forgotten, with the versions no live node " \
	  "holds") \
	X(donor_silence_ms, 5000, 100, 3600000, \
	  "a donor silent this long with requests out: next donor") \
	X(donor_backoff_ms, 200, 1, 3600000, "first pause before re-asking a donor that failed") \
	X(donor_backoff_max_ms, 5000, 1, 3600000, \
	  "largest pause before re-asking a failing donor") \
	X(space_retry_ms, 1000, 10, 3600000, "first retry of a pull stopped for lack of space") \
	X(space_retry_max_ms, 30000, 10, 3600000, \
	  "largest period between retries for lack of space") \
	X(pull_window_bytes, 256ull << 20, 4096, 1ull << 40, \
	  "shard bytes requested and not yet received, per version being pulled") \
	X(get_batch_bytes, 64ull << 20, 4096, 1ull << 40, "shard bytes asked for in one GET") \
	/* a receiver accepts pieces up to PROTO_MAX_PAYLOAD (1 GiB), whatever its own */ \
	X(piece_bytes, 4ull << 20, 4096, 1ull << 30, \
	  "a shard served to a puller travels in pieces of this size") \
	X(missing_retry_ms, 200, 1, 3600000, \
	  "a donor answered MISSING (it may not have its plan yet): ask it again after this") \
	X(missing_tries, 5, 1, 1000, \
	  "MISSING answers from one donor before asking the next one") \
	X(progress_ms, 500, 10, 3600000, \
	  "period of a pull's progress reports to the coordinator") \
	X(reconnect_ms, 100, 1, 3600000, "first reconnect delay of a node's sockets") \
	X(reconnect_max_ms, 2000, 1, 3600000, "largest reconnect delay (it doubles up to this)") \
	X(heartbeat_ms, 1000, 10, 3600000, \
	  "period of a node's heartbeat (HELLO) to the coordinator") \
	X(coord_silence_ms, 3500, 10, 3600000, \
	  "the coordinator silent this long: unreachable (commits and status fail at once)") \
	X(node_dead_ms, 3000, 10, 3600000, "coordinator: a node silent this long is dead") \
	X(commit_deadline_ms, 10000, 100, 3600000, \
	  "deadline of a cluster commit: every node's READY, then every node's ACK") \
	X(commit_wait_ms, 30000, 100, 3600000, \
	  "hwfs commit waits this long for the coordinator's answer") \
	X(status_wait_ms, 10000, 100, 3600000, \
	  "hwfs status --cluster waits this long for the coordinator's answer") \
	/* engines (docs/engines.md) */ \
	X(engine_deadline_ms, 8000, 10, 3600000, \
	  "a commit waits this long for each registered engine to report the version loaded; " \
	  "keep it below commit_deadline_ms (a daemon started otherwise logs a warning)") \
	/* element-level deltas (docs/delta.md) */ \
	X(delta, 1, 0, 1, \
	  "1: a shard whose receiver holds an earlier version of its tensor travels as an " \
	  "element-level delta (XOR + zstd); 0: whole shards only") \
	X(delta_max_pct, 50, 1, 100, \
	  "a delta larger than this percentage of its shard is not used") \
	X(delta_level, 1, 1, 3, \
	  "zstd level of the deltas a donor encodes (higher levels gain nothing on weight " \
	  "deltas and cost seconds per shard on the replication thread)") \
	X(delta_cache_bytes, 64ull << 20, 0, 1ull << 40, \
	  "encoded deltas a node keeps to send again to the next receiver (encode once)") \
	X(delta_ahead, 1, 0, 1, \
	  "1: when a version is sealed here, encode its deltas against the version its " \
	  "receivers hold, in the background, into the delta cache (up to delta_cache_bytes)") \
	X(codec_threads, 0, 0, 256, \
	  "threads that encode and rebuild deltas for the replicator; 0: one per online CPU") \
	X(codec_idle_ms, 1000, 1, 3600000, \
	  "a codec thread idle this long gives its rebuild buffer (a shard's size) back") \
	X(zmq_io_threads, 0, 0, 64, \
	  "ZeroMQ I/O threads of a node's replication sockets: a relay's receiving from " \
	  "upstream and sending downstream can run on different ones; 0: one per two online " \
	  "CPUs, at least 2, at most 8") \
	/* `hwfs diff --elements` (fs/daemon/daemon_diff.c) */ \
	X(diff_threads, 1, 1, 256, \
	  "hwfs diff --elements: diffs computing at once in the whole daemon; more wait " \
	  "(diff_queue_ms)") \
	X(diff_per_uid, 2, 1, 1024, \
	  "hwfs diff --elements: diffs one user may have computing or waiting; more are " \
	  "refused at once (EBUSY)") \
	X(diff_queue_ms, 10000, 0, 3600000, \
	  "hwfs diff --elements: a diff waits this long for a thread or memory, then is " \
	  "refused (EBUSY)") \
	X(diff_mem_bytes, 512ull << 20, 1ull << 20, 1ull << 40, \
	  "hwfs diff --elements: memory all computing diffs may take together (an estimate " \
	  "per diff); a diff needing more than all of it is refused (ENOMEM)") \
	X(diff_cache, 8, 1, 4096, \
	  "hwfs diff --elements: results kept per pair of version digests (identical " \
	  "requests compute once)") \
	/* device shadow-load (docs/gpu.md) */ \
	X(gpu_mem_pct, 90, 1, 100, \
	  "hwfs load: one load may take this percentage of the device's free memory (at load " \
	  "time); a version needing more is refused") \
	X(gpu_streams, 4, 1, 64, "hwfs load: CUDA copy streams per load") \
	X(gpu_bucket_bytes, 1ull << 30, 1ull << 20, 1ull << 50, \
	  "hwfs load: the largest device buffer (bucket); a tensor larger than a bucket gets " \
	  "one of its own") \
	/* end of HWFS_TUNABLES */

/* The process-wide values, one uint64_t field per row of HWFS_TUNABLES. */
struct hwfs_tunables {
#define HWFS_TUNABLE_FIELD(name, def, min, max, help) uint64_t name;
	HWFS_TUNABLES(HWFS_TUNABLE_FIELD)
#undef HWFS_TUNABLE_FIELD
};

/** The process-wide values (defaults until hwfs_tunables_load()). */
extern struct hwfs_tunables hwfs_tun;

/** Apply the environment, then "name=value" option strings. Returns 0 or -EINVAL. */
int hwfs_tunables_load(const char *const *opts, size_t n_opts);

/** Try one "name=value"; returns 0, -ENOENT (not a tunable) or -EINVAL. */
int hwfs_tunables_set(const char *opt);

/** Print the table (name, default, meaning) to @f, for --help. */
void hwfs_tunables_print(FILE *f);
/** Is @name the name of a tunable?  1 or 0. */
int hwfs_tunable_known(const char *name);

#endif /* HWFS_TUNABLES_H */
