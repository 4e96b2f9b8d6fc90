/*
 * hwfs_cli.h — what the files of the `hwfs` command share: the error exits
 * (hwfs.c), the verbs that start and stop processes (hwfs_daemon.c),
 * `hwfs watch` (hwfs_watch.c) and `hwfs sim` (hwfs_sim.c), which main()'s table of verbs in hwfs.c
 * dispatches to.
 */
#ifndef HWFS_CLI_H
#define HWFS_CLI_H

#include "hwfs_common.h"

/** Print "hwfs: error: ..." and a newline on stderr and exit(1). */
void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
/** Print "usage: @usage" on stderr and exit(2). */
void usage_die(const char *usage) __attribute__((noreturn));

/* hwfs_daemon.c: each takes the verb's own argv (argv[0] is the verb), returns the exit status */
int cmd_mount(int argc, char **argv);
int cmd_umount(int argc, char **argv);
int cmd_coord(int argc, char **argv);
int cmd_keygen(int argc, char **argv);

/* hwfs_coord_http.c */
struct coord_opts;
/**
 * coord_serve() - coord_run(@o), with /metrics, /healthz and /readyz served on
 * @http ("HOST:PORT") meanwhile when it is not NULL, and READY=1 sent to
 * systemd (NOTIFY_SOCKET) once it listens.  Returns the exit status.
 */
int coord_serve(struct coord_opts *o, const char *http);
/* The coordinator's status page (built from tools/status_page.html by the Makefile). */
extern const char hwfs_status_page[];

/* mount_hwfs.c: main() when called as mount.hwfs (mount(8)'s helper) */
int mount_helper_main(int argc, char **argv);

/* hwfs_watch.c */
int cmd_watch(int argc, char **argv);

/* hwfs_sim.c: `hwfs sim`, the replication simulator (replicator/sim.h) */
int cmd_sim(int argc, char **argv);

#endif /* HWFS_CLI_H */
