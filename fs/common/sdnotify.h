/*
 * sdnotify.h — tell systemd about the daemon's state (Type=notify units),
 * without libsystemd.
 *
 * The notification protocol is one datagram of "KEY=VALUE" lines to the unix
 * socket named by $NOTIFY_SOCKET (a path, or "@name" for the abstract
 * namespace), which systemd documents as a stable interface (sd_notify(3),
 * "Notes").  Linking libsystemd for these two lines made every command of
 * the daemon's program (build/hwfs-core, then the whole CLI) load it and its
 * libraries (docs/benchmarks.md, "Commit latency").
 */
#ifndef HWFS_SDNOTIFY_H
#define HWFS_SDNOTIFY_H

/**
 * hwfs_sd_notify() - send the state @fmt (printf-style, e.g. "READY=1\n
 * STATUS=...") to $NOTIFY_SOCKET.  Returns 1 when sent, 0 when the process
 * runs without NOTIFY_SOCKET (nothing to do), -errno when it could not be
 * sent.  The environment is left as it is.
 */
int hwfs_sd_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif /* HWFS_SDNOTIFY_H */
