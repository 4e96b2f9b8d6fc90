/*
 * hwfs_cli.h — what the files of the `hwfs` command share: the error exits
 * (hwfs.c), the verbs that start and stop processes (hwfs_launch.c),
 * `hwfs watch` (hwfs_watch.c) and `hwfs sim` (hwfs_sim.c), which main()'s
 * table of verbs in hwfs.c dispatches to.
 *
 * Two programs are built from these files.  build/hwfs-core is all of them
 * with the daemon's modules (fs/, replicator/) and their libraries: every
 * verb, the daemon, the coordinator.  build/hwfs, the command people and
 * scripts run, is hwfs.c and hwfs_status.c (the client verbs, sharing
 * hwfs_client.h) with libhwfs and two helpers of fs/common
 * (util.c, names.c): the client verbs (status, commit, publish, ...) start
 * without loading FUSE, sqlite, ZeroMQ and the libraries behind them (0.65
 * against 4.3-4.8 ms of CPU per command here, `perf stat hwfs status`;
 * `hwfs commit` is on the path of every commit: docs/benchmarks.md, "Commit
 * latency").  The verbs of the
 * other files are declared HWFS_CORE_VERB (weak): not linked into build/hwfs,
 * they are NULL there, and main() hands such a command, argv unchanged, to
 * build/hwfs-core beside it (a verb added in a file of its own must be
 * declared so too, or build/hwfs does not link).
 */
#ifndef HWFS_CLI_H
#define HWFS_CLI_H

#include "hwfs_common.h"

/* A verb of build/hwfs-core only: NULL in build/hwfs, which then runs hwfs-core. */
#define HWFS_CORE_VERB __attribute__((weak))

/** Print "hwfs: error: ..." and a newline on stderr and exit(1). */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/** Print "usage: @usage" on stderr and exit(2). */
void usage_die(const char *usage) __attribute__((noreturn));

/**
 * parse_topology() - "chain" -> 1, "tree:K" (K 1..1024) -> K, "star" -> 0
 * (unbounded fan-out) into *@fanout, as `hwfs coord --topology` and `hwfs
 * sim --topology` take it.  0 or -EINVAL.
 */
int parse_topology(const char *s, unsigned *fanout);

/* hwfs_launch.c: each takes the verb's own argv (argv[0] is the verb), returns the exit status */
HWFS_CORE_VERB int cmd_mount(int argc, char **argv);
HWFS_CORE_VERB int cmd_umount(int argc, char **argv);
HWFS_CORE_VERB int cmd_coord(int argc, char **argv);
HWFS_CORE_VERB int cmd_keygen(int argc, char **argv);

#define HWFS_FSTYPE "fuse.hwfs" /* our mounts in mountinfo (subtype=hwfs) */
/**
 * hwfs_mount_source() - whether @path is a mount point in /proc/self/mountinfo
 * (with @fstype: a mount of that type); when it is and @src is not NULL, the
 * source field of the top one (an hwfs mount: "hwfs:STORE") into @src.
 * Returns 1 or 0 (0 when mountinfo is unreadable).  In build/hwfs-core only.
 */
int hwfs_mount_source(const char *path, const char *fstype, char *src, size_t len);

/* hwfs_coord_http.c */
struct coord_opts;
/**
 * coord_serve() - coord_run(@o), with /metrics, /healthz and /readyz served on
 * @http ("HOST:PORT") meanwhile when it is not NULL (@hosts: the --http-host
 * names, comma-separated, or NULL), and READY=1 sent to systemd
 * (NOTIFY_SOCKET) once it listens.  Returns the exit status.
 */
int coord_serve(struct coord_opts *o, const char *http, const char *hosts);
/* The coordinator's status page (built from tools/dashboards/status_page.html by the Makefile). */
extern const char hwfs_status_page[];

/* mount_hwfs.c: main() when called as mount.hwfs (mount(8)'s helper) */
HWFS_CORE_VERB int mount_helper_main(int argc, char **argv);

/* hwfs_watch.c */
HWFS_CORE_VERB int cmd_watch(int argc, char **argv);

/* hwfs_sim.c: `hwfs sim`, the replication simulator (tools/sim/sim.h) */
HWFS_CORE_VERB int cmd_sim(int argc, char **argv);

#endif /* HWFS_CLI_H */
