/*
 * daemon_ns_hooks.c — the namespace's two hooks (ns_set_seal_hook,
 * ns_set_current_hook), set by daemon.c: after a seal and after a commit,
 * they tell whoever follows the node — the watchers and engines (the engine
 * registry's events), the scrape of --http, the replication agent (through
 * daemon_repl.c) and the device loads of the commit barrier (daemon_gpu.c).
 * They run with no namespace lock held, the current hook possibly on a FUSE
 * thread: neither blocks.
 */
#define _GNU_SOURCE
#include "daemon_i.h"

/* Seal hook: "arrived" to the watchers, then the agent's announcement (when joined). */
void daemon_sealed(void *arg, const char *name)
{
	struct daemon *d = arg;

	engines_event(d->engines, "arrived", name);
	daemon_http_refresh(d);
	daemon_repl_sealed(d, name);
}

/*
 * Current hook: "current" to the watchers and engines, after any commit
 * through the mount (hwfs commit, the agent's COMMIT, a manual mv -T); the
 * registry reads what `current` names (see engines_event()); then the
 * device loads the commit barrier made of other versions go.
 */
void daemon_current(void *arg)
{
	struct daemon *d = arg;

	engines_event(d->engines, "current", NULL);
	daemon_http_refresh(d);
	daemon_gpu_current(d);
}
