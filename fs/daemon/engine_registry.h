/*
 * engine_registry.h — the daemon's registry of watchers, engines and leases
 * (docs/engines.md).
 *
 * A watcher is one open `watch` or `engine` control connection: the daemon
 * sends it events ({"event": "arrived" | "current" | "removed", "version"}),
 * and an engine also gets {"event": "prepare"} from the commit barrier and
 * sends reports ({"report": "loading" | "loaded" | "refused" | "swapped"}).
 * A lease is one open `map` connection: the shard references are held by its
 * handler (daemon_engine_ops.c); the registry only records {version, pid} for
 * `hwfs status`.
 *
 * Events are sent with non-blocking sends, whole lines or nothing: a watcher
 * whose socket buffer is full (it does not read) is dropped — marked dead, its
 * socket shut down so that its connection thread sees EOF and unregisters it —
 * and the drop is logged.  No FUSE thread, control thread or the agent thread
 * ever blocks on a watcher.
 *
 * The barrier: engines_barrier() is the non-blocking check the agent runs on
 * PREPARE (and again on every loop pass while it is pending);
 * engines_barrier_wait() is the blocking form for a local commit.  Reports and
 * disconnects wake both (a condition variable, and the wake hook the daemon
 * points at the agent).
 *
 * Locking: reg->mu guards the lists and every engine's state; each watcher's
 * send mutex guards its socket's writes (taken under reg->mu, never the other
 * way round).  reg->mu may be taken with no namespace lock held and then take
 * the namespace lock (ns_current); nothing holds a namespace lock while it
 * takes reg->mu.
 */
#ifndef HWFS_ENGINE_REGISTRY_H
#define HWFS_ENGINE_REGISTRY_H

#include <jansson.h>
#include <stdint.h>
#include <sys/types.h>

#include "names.h"
#include "ns.h"

struct engines;
struct watcher;
struct lease;

/**
 * Make an empty registry for namespace @ns; logs a warning when
 * engine_deadline_ms is not below commit_deadline_ms (docs/engines.md).
 * Returns 0 or -ENOMEM.
 */
int engines_create(struct ns *ns, struct engines **out);
/** Free @reg (NULL is a no-op); every watcher and lease must be gone. */
void engines_destroy(struct engines *reg);

/**
 * engines_set_wake() - call @wake(@arg) whenever an engine reports or goes
 * away (the agent re-checks a pending barrier then); @wake NULL: nobody.
 * @wake runs under the registry lock and must not block.
 */
void engines_set_wake(struct engines *reg, void (*wake)(void *arg), void *arg);

/**
 * engines_watch() - register the connection @fd of process @pid as a watcher
 * (@name NULL) or as engine @name, and send it the first reply {"ok": true,
 * "current": ...} while holding the registry lock, so that no event is lost
 * or comes before it.  *@out is the watcher, for engines_report() and
 * engines_unwatch().  Returns 0, -EINVAL (bad name), -EEXIST (a live engine
 * has that name), -ENOMEM, or the -errno of the reply's send (nothing is
 * registered then).
 */
int engines_watch(struct engines *reg, int fd, pid_t pid, const char *name, struct watcher **out);

/**
 * engines_watch_gpu() - engines_watch() of engine @name whose readiness is
 * not its reports but the device load of the committed version on GPU @gpu
 * (-1: an ordinary engine): the barrier asks the hook of
 * engines_set_gpu_hook() about it.  Same returns.
 */
int engines_watch_gpu(struct engines *reg, int fd, pid_t pid, const char *name, int gpu,
		      struct watcher **out);

/**
 * engines_set_gpu_hook() - the barrier's question for an engine registered
 * with a GPU: @ready(@arg, version, gpu, started_ns, err, errlen), asked by
 * the barrier that began at @started_ns (hwfs_mono_ns(); a failure from
 * before it is stale and the hook loads again), returns 0 (the version
 * is resident on that device), -EINPROGRESS (a load was started, or runs, in
 * a worker thread that calls engines_kick() when it ends) or -ECANCELED (the
 * load failed or cannot be: the reason in @err, which the barrier reports as
 * the engine's refusal "engine E refused V: <reason>").  @ready runs under
 * the registry lock: it must not block, and may take the namespace lock or
 * locks of its own that are never held while taking the registry's.  @ready
 * NULL: such engines refuse every version ("no device loader here").
 */
void engines_set_gpu_hook(struct engines *reg,
			  int (*ready)(void *arg, const char *version, int gpu,
				       uint64_t started_ns, char *err, size_t errlen),
			  void *arg);

/**
 * engines_kick() - wake the barrier's waiters (and the wake hook) because
 * something it asks about changed outside the registry: a device load
 * ended.  Takes the registry lock.
 */
void engines_kick(struct engines *reg);

/** Unregister and free @w (its connection ended); wakes the barrier's waiters. */
void engines_unwatch(struct engines *reg, struct watcher *w);

/**
 * engines_report() - apply report @msg of engine @w (docs/engines.md).  A
 * report that is not one (not an engine, unknown "report", no valid version,
 * a version this node does not hold sealed) is ignored; the first one of each
 * engine is logged.  Returns 0 when applied, -EINVAL when ignored.
 */
int engines_report(struct engines *reg, struct watcher *w, json_t *msg);

/**
 * engines_event() - send {"event": @event, "version": @version} to every
 * watcher (a hidden staging name is never announced); one whose socket
 * cannot take the whole line now is dropped.  "removed" also makes every
 * engine forget its shadow of that version.  "current" ignores @version
 * (pass NULL): it sends what `current` names now, and only when a commit
 * happened since the last "current" sent, so that hooks of two flips running
 * in either order never announce them out of order (see engine_registry.c).
 */
void engines_event(struct engines *reg, const char *event, const char *version);

/**
 * engines_barrier() - is every registered engine ready for a commit of
 * @version (docs/engines.md, "The barrier, exactly")?  @started_ns (monotonic)
 * is when this barrier began and, with the version, names it: engines not
 * ready are sent {"event": "prepare"} once per barrier, a refusal counts only
 * when reported since @started_ns (an earlier one waits for the engine's new
 * answer), and engine_deadline_ms counts from it.  Readiness is of this very
 * version: a report of a removed version of the same name does not count.
 * Never blocks.  Returns 0 (ready), -EINPROGRESS (waiting), or -ECANCELED (an
 * engine refused, the deadline passed, or the version is gone) with the
 * sentence in @err.
 */
int engines_barrier(struct engines *reg, const char *version, uint64_t started_ns, char *err,
		    size_t errlen);

/**
 * engines_barrier_wait() - engines_barrier() from now on, waiting until it is
 * no longer pending (at most engine_deadline_ms).  Returns 0 or -ECANCELED
 * with the sentence in @err.
 */
int engines_barrier_wait(struct engines *reg, const char *version, char *err, size_t errlen);

/**
 * engines_lease_add() - record that process @pid maps @version (for status).
 * Returns 0 or -ENOMEM.
 */
int engines_lease_add(struct engines *reg, const char *version, pid_t pid, struct lease **out);
/** Forget lease @l (NULL is a no-op). */
void engines_lease_del(struct engines *reg, struct lease *l);

/**
 * engines_json() - the engines as `hwfs status --json` shows them: a new
 * array of {"name", "pid", "serving", "shadow", "state", "reason",
 * "last_swap_pause_us", "swaps"} (and "gpu" for an engine registered with
 * one; "last_drain_us" and "last_swap_us" when its last "swapped" report
 * split the pause so), NULL without memory.
 */
json_t *engines_json(struct engines *reg);
/** The leases: a new array of {"version", "pid"}, NULL without memory. */
json_t *engines_leases_json(struct engines *reg);

#endif /* HWFS_ENGINE_REGISTRY_H */
