/*
 * tunables.c — the table behind tunables.h.  Adding a tunable means one field
 * in struct hwfs_tunables and one row below (name, default, range, help);
 * the defaults, parsing, environment lookup and the --help listing all follow
 * from the row.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "tunables.h"

struct row {
	const char *name;
	size_t field; /* offsetof into struct hwfs_tunables */
	uint64_t def, min, max;
	const char *help;
};

/* ROW(name, default, min, max, help): the one place a tunable is defined. */
#define ROW(n, d, lo, hi, h) {#n, offsetof(struct hwfs_tunables, n), d, lo, hi, h}
static const struct row rows[] = {
	ROW(max_shard, 64ull << 20, 4096, 1ull << 30, "largest shard; tensors above it are cut in pieces"),
	ROW(fixed_chunk, 4ull << 20, 4096, 1ull << 30, "shard size for files that are not safetensors"),
	ROW(staging_min, 256ull << 10, 4096, 1ull << 30, "first staging allocation of a file being written"),
	ROW(staging_step, 256ull << 20, 1ull << 20, 1ull << 34, "largest staging growth step"),
	ROW(read_ahead_kb, 8192, 128, 1u << 20, "read-ahead of the mount (bdi read_ahead_kb)"),
	ROW(max_threads, 8, 1, 256, "FUSE worker threads"),
	ROW(max_background, 64, 1, 65535, "async FUSE requests in flight (read-ahead)"),
	ROW(publish_io, 8ull << 20, 4096, 1ull << 30, "read size of hwfs publish"),
	ROW(ctl_drain_ms, 10000, 1, 3600000, "at shutdown, wait this long (ms) for control connections"),
	ROW(ctl_conns_per_uid, 64, 1, 65536,
	    "live control connections one user (other than root) may hold; more are refused"),
	ROW(node_expiry_s, 600, 1, 1ull << 32,
	    "coordinator: a node dead this long is forgotten, with the versions no live node holds"),
	ROW(donor_silence_ms, 5000, 100, 3600000, "a donor silent this long with requests out: next donor"),
	ROW(donor_backoff_ms, 200, 1, 3600000, "first pause before re-asking a donor that failed"),
	ROW(donor_backoff_max_ms, 5000, 1, 3600000, "largest pause before re-asking a failing donor"),
	ROW(space_retry_ms, 1000, 10, 3600000, "first retry of a pull stopped for lack of space"),
	ROW(space_retry_max_ms, 30000, 10, 3600000, "largest period between retries for lack of space"),
	ROW(pull_window_bytes, 256ull << 20, 4096, 1ull << 40,
	    "shard bytes requested and not yet received, per version being pulled"),
	ROW(get_batch_bytes, 64ull << 20, 4096, 1ull << 40, "shard bytes asked for in one GET"),
	/* the most a receiver accepts is the protocol's PROTO_MAX_PAYLOAD (1 GiB), whatever its own */
	ROW(piece_bytes, 4ull << 20, 4096, 1ull << 30, "a shard served to a puller travels in pieces of this size"),
	ROW(missing_retry_ms, 200, 1, 3600000,
	    "a donor answered MISSING (it may not have its plan yet): ask it again after this"),
	ROW(missing_tries, 5, 1, 1000, "MISSING answers from one donor before asking the next one"),
	ROW(progress_ms, 500, 10, 3600000, "period of a pull's progress reports to the coordinator"),
	ROW(reconnect_ms, 100, 1, 3600000, "first reconnect delay of a node's sockets"),
	ROW(reconnect_max_ms, 2000, 1, 3600000, "largest reconnect delay (it doubles up to this)"),
	ROW(heartbeat_ms, 1000, 10, 3600000, "period of a node's heartbeat (HELLO) to the coordinator"),
	ROW(coord_silence_ms, 3500, 10, 3600000,
	    "the coordinator silent this long: unreachable (commits and status fail at once)"),
	ROW(node_dead_ms, 3000, 10, 3600000, "coordinator: a node silent this long is dead"),
	ROW(commit_deadline_ms, 10000, 100, 3600000,
	    "deadline of a cluster commit: every node's READY, then every node's ACK"),
	ROW(commit_wait_ms, 30000, 100, 3600000, "hwfs commit waits this long for the coordinator's answer"),
	ROW(status_wait_ms, 10000, 100, 3600000,
	    "hwfs status --cluster waits this long for the coordinator's answer"),
	ROW(engine_deadline_ms, 8000, 10, 3600000,
	    "a commit waits this long for each registered engine to report the version loaded; "
	    "keep it below commit_deadline_ms (a daemon started otherwise logs a warning)"),
	ROW(delta, 1, 0, 1,
	    "1: a shard whose receiver holds an earlier version of its tensor travels as an "
	    "element-level delta (XOR + zstd); 0: whole shards only"),
	ROW(delta_max_pct, 50, 1, 100, "a delta larger than this percentage of its shard is not used"),
	ROW(delta_level, 1, 1, 3,
	    "zstd level of the deltas a donor encodes (higher levels gain nothing on weight deltas "
	    "and cost seconds per shard on the replication thread)"),
	ROW(delta_cache_bytes, 64ull << 20, 0, 1ull << 40,
	    "encoded deltas a node keeps to send again to the next receiver (encode once)"),
	ROW(diff_threads, 1, 1, 256,
	    "hwfs diff --elements: diffs computing at once in the whole daemon; more wait "
	    "(diff_queue_ms)"),
	ROW(diff_per_uid, 2, 1, 1024,
	    "hwfs diff --elements: diffs one user may have computing or waiting; more are "
	    "refused at once (EBUSY)"),
	ROW(diff_queue_ms, 10000, 0, 3600000,
	    "hwfs diff --elements: a diff waits this long for a thread or memory, then is refused "
	    "(EBUSY)"),
	ROW(diff_mem_bytes, 512ull << 20, 1ull << 20, 1ull << 40,
	    "hwfs diff --elements: memory all computing diffs may take together (an estimate per "
	    "diff); a diff needing more than all of it is refused (ENOMEM)"),
	ROW(diff_cache, 8, 1, 4096,
	    "hwfs diff --elements: results kept per pair of version digests (identical requests "
	    "compute once)"),
	ROW(gpu_mem_pct, 90, 1, 100,
	    "hwfs load: one load may take this percentage of the device's free memory (at load "
	    "time); a version needing more is refused"),
	ROW(gpu_streams, 4, 1, 64, "hwfs load: CUDA copy streams per load"),
	ROW(gpu_bucket_bytes, 1ull << 30, 1ull << 20, 1ull << 50,
	    "hwfs load: the largest device buffer (bucket); a tensor larger than a bucket gets "
	    "one of its own"),
};
static uint64_t *field(struct hwfs_tunables *t, const struct row *r)
{
	return (uint64_t *)((char *)t + r->field);
}

struct hwfs_tunables hwfs_tun;

/* Every tunable at its default, before main() (unit tests read them too). */
__attribute__((constructor)) static void set_defaults(void)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++)
		*field(&hwfs_tun, &rows[i]) = rows[i].def;
}

static int set_row(const struct row *r, const char *val)
{
	uint64_t v;

	if (hwfs_parse_size(val, &v) < 0 || v < r->min || v > r->max)
		return -EINVAL;
	*field(&hwfs_tun, r) = v;
	return 0;
}

int hwfs_tunables_set(const char *opt)
{
	const char *eq = strchr(opt, '=');

	if (!eq)
		return -ENOENT;
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++)
		if (strlen(rows[i].name) == (size_t)(eq - opt) &&
		    !strncmp(rows[i].name, opt, (size_t)(eq - opt)))
			return set_row(&rows[i], eq + 1);
	return -ENOENT;
}

int hwfs_tunables_load(const char *const *opts, size_t n_opts)
{
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++) {
		char env[64];
		const char *v;
		size_t j;

		snprintf(env, sizeof(env), "HWFS_%s", rows[i].name);
		for (j = 5; env[j]; j++)
			env[j] = (char)toupper((unsigned char)env[j]);
		v = getenv(env);
		if (v && set_row(&rows[i], v) < 0) {
			LOG_ERR("bad value for %s: %s", env, v);
			return -EINVAL;
		}
	}
	for (size_t i = 0; i < n_opts; i++) {
		int r = hwfs_tunables_set(opts[i]);

		if (r < 0)
			return r;
	}
	return 0;
}

void hwfs_tunables_print(FILE *f)
{
	fprintf(f, "Tunables (-o NAME=VALUE, or environment HWFS_NAME):\n");
	for (size_t i = 0; i < HWFS_ARRAY_SIZE(rows); i++) {
		fprintf(f, "  %-20s default %-12llu %s\n", rows[i].name,
			(unsigned long long)rows[i].def, rows[i].help);
	}
}
