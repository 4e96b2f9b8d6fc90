/*
 * engine_registry.c — the registry of watchers, engines and leases, the event
 * fan-out and the commit barrier (see engine_registry.h and docs/engines.md).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "metrics.h"
#include "engine_registry.h"
#include "tunables.h"

/* What an engine's shadow version is doing (docs/engines.md, status "state"). */
enum eng_state { ENG_IDLE, ENG_LOADING, ENG_LOADED, ENG_REFUSED };

/*
 * Barriers an engine remembers having sent "prepare" for.  Barriers run at
 * once only when local commits overlap each other or the agent's PREPARE;
 * past this many, the oldest is forgotten and, if still checked, sends its
 * prepare again (harmless: prepare asks for what the engine may have done).
 */
#define ENGINE_PREP_SLOTS 4

struct watcher {
	int fd;                         /* the connection (owned by its handler) */
	pid_t pid;
	int engine;                     /* 1: a registered engine */
	int gpu;                        /* an engine whose readiness is the device load on
					 * this GPU (engines_set_gpu_hook()); -1: its reports */
	char name[HWFS_ENGINE_NAME_MAX + 1]; /* engines only */
	pthread_mutex_t send_mu;        /* one writer at a time on fd */
	int dead;                       /* dropped: no more sends, not counted by the barrier */
	/*
	 * Engine state, under reg->mu.  A version is known by its name and its
	 * seq on this node (struct version): a name removed and used again is
	 * another version, with a new seq, that no earlier report speaks for.
	 */
	char *serving, *shadow, *reason;
	uint64_t serving_seq, shadow_seq;
	enum eng_state state;
	uint64_t refused_ns; /* monotonic time of the refusal in @reason */
	uint64_t last_pause_us, swaps;
	/* the last swap's pause split, when the engine reported it (-1: it did not) */
	int64_t last_drain_us, last_swap_us;
	uint64_t loading_ns; /* monotonic time of the last "loading" report (0: none) */
	int bad_logged; /* an ignored report of this engine was logged */
	/* the barriers (version seq, start) it was sent "prepare" by, a ring */
	struct {
		uint64_t seq, started;
	} prepared[ENGINE_PREP_SLOTS];
	unsigned prep_next;
	struct watcher *next;
};

struct lease {
	char *version;
	pid_t pid;
	struct lease *next;
};

struct engines {
	struct ns *ns;
	pthread_mutex_t mu;
	pthread_cond_t cv; /* CLOCK_MONOTONIC: a report or a disconnect happened */
	struct watcher *watchers;
	struct lease *leases;
	void (*wake)(void *arg);
	void *wake_arg;
	int (*gpu_ready)(void *arg, const char *version, int gpu, uint64_t started_ns, char *err,
			 size_t errlen);
	void *gpu_arg;
	uint64_t current_gen; /* ns_current_gen() when the last "current" event was sent */
};

/*
 * An empty registry for @ns (see engine_registry.h), which has announced every commit
 * so far; warns about an engine_deadline_ms the coordinator would cut short.
 * Returns 0 or -ENOMEM.
 */
int engines_create(struct ns *ns, struct engines **out)
{
	struct engines *reg = calloc(1, sizeof(*reg));
	pthread_condattr_t ca;

	if (!reg)
		return -ENOMEM;
	reg->ns = ns;
	pthread_mutex_init(&reg->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&reg->cv, &ca);
	pthread_condattr_destroy(&ca);
	free(ns_current_gen(ns, &reg->current_gen));
	/* the barrier's answer must reach the coordinator before it gives up */
	if (hwfs_tun.engine_deadline_ms >= hwfs_tun.commit_deadline_ms)
		LOG_WARN("engines: engine_deadline_ms (%llu) is not below commit_deadline_ms (%llu): "
			 "a cluster commit waiting for a silent engine is aborted by the coordinator's "
			 "deadline, without naming the engine; lower engine_deadline_ms",
			 (unsigned long long)hwfs_tun.engine_deadline_ms,
			 (unsigned long long)hwfs_tun.commit_deadline_ms);
	*out = reg;
	return 0;
}

/* Free @reg; anything still registered is a bug, logged (its memory is its thread's). */
void engines_destroy(struct engines *reg)
{
	if (!reg)
		return;
	if (reg->watchers || reg->leases)
		LOG_ERR("engines: registry freed with watchers or leases left");
	pthread_cond_destroy(&reg->cv);
	pthread_mutex_destroy(&reg->mu);
	free(reg);
}

/* Point the wake hook at @wake(@arg), or at nobody (see engine_registry.h). */
void engines_set_wake(struct engines *reg, void (*wake)(void *arg), void *arg)
{
	pthread_mutex_lock(&reg->mu);
	reg->wake = wake;
	reg->wake_arg = arg;
	pthread_mutex_unlock(&reg->mu);
}

/* Point the device-load hook at @ready(@arg, ...), or at nobody (see engine_registry.h). */
void engines_set_gpu_hook(struct engines *reg,
			  int (*ready)(void *arg, const char *version, int gpu,
				       uint64_t started_ns, char *err, size_t errlen),
			  void *arg)
{
	pthread_mutex_lock(&reg->mu);
	reg->gpu_ready = ready;
	reg->gpu_arg = arg;
	pthread_mutex_unlock(&reg->mu);
}

/* Tell whoever waits on a barrier that something changed (reg->mu held). */
static void barrier_kick(struct engines *reg)
{
	pthread_cond_broadcast(&reg->cv);
	if (reg->wake)
		reg->wake(reg->wake_arg);
}

/* Something a barrier waits for changed outside the registry (a device load ended). */
void engines_kick(struct engines *reg)
{
	pthread_mutex_lock(&reg->mu);
	barrier_kick(reg);
	pthread_mutex_unlock(&reg->mu);
}

/* Free @w and its strings (it is on no list). */
static void watcher_free(struct watcher *w)
{
	pthread_mutex_destroy(&w->send_mu);
	free(w->serving);
	free(w->shadow);
	free(w->reason);
	free(w);
}

/*
 * Send the @len bytes of @line to @w (reg->mu held), all at once or not at
 * all: a socket that cannot take the whole line now (its reader is behind, or
 * gone) would otherwise make us block or leave half a line.  Such a watcher
 * is dropped: marked dead and its socket shut down, so that its connection
 * thread sees EOF and unregisters it.  Returns 0 or -EPIPE (dropped).
 */
static int send_line(struct watcher *w, const char *line, size_t len)
{
	ssize_t n;
	int r = 0;

	pthread_mutex_lock(&w->send_mu);
	if (w->dead) {
		r = -EPIPE;
		goto out;
	}
	do
		n = send(w->fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	while (n < 0 && errno == EINTR);
	if (n == (ssize_t)len)
		goto out;
	w->dead = 1;
	shutdown(w->fd, SHUT_RDWR);
	LOG_WARN("engines: %s%s%s (pid %d) dropped: %s", w->engine ? "engine" : "watcher",
		 w->engine ? " " : "", w->name, (int)w->pid,
		 n >= 0 || errno == EAGAIN ? "it does not read its events (socket buffer full)"
					   : strerror(errno));
	r = -EPIPE;
out:
	pthread_mutex_unlock(&w->send_mu);
	return r;
}

/* @msg (consumed) as one line ending in '\n' (malloc'd; length in *@len), or NULL. */
static char *line_of(json_t *msg, size_t *len)
{
	char *s = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
	char *l;

	json_decref(msg);
	if (!s)
		return NULL;
	*len = strlen(s);
	l = realloc(s, *len + 2);
	if (!l) {
		free(s);
		return NULL;
	}
	l[(*len)++] = '\n';
	l[*len] = '\0';
	return l;
}

/* {"event": @event, "version": @v} as one line (see line_of()), or NULL. */
static char *event_line(const char *event, const char *v, size_t *len)
{
	return line_of(json_pack("{s:s, s:s}", "event", event, "version", v), len);
}

/* The live engine named @name (reg->mu held), or NULL. */
static struct watcher *engine_find(struct engines *reg, const char *name)
{
	for (struct watcher *w = reg->watchers; w; w = w->next)
		if (w->engine && !w->dead && !strcmp(w->name, name))
			return w;
	return NULL;
}

/*
 * Register connection @fd as a watcher or engine @name and send its first
 * reply, atomically with respect to events (see engine_registry.h).  Returns 0 or
 * -errno; nothing is registered on error.
 */
int engines_watch(struct engines *reg, int fd, pid_t pid, const char *name, struct watcher **out)
{
	return engines_watch_gpu(reg, fd, pid, name, -1, out);
}

/* engines_watch() of an engine whose readiness is the device load on @gpu (-1: none). */
int engines_watch_gpu(struct engines *reg, int fd, pid_t pid, const char *name, int gpu,
		      struct watcher **out)
{
	struct watcher *w;
	char *cur = NULL, *line = NULL;
	size_t len;
	int r = 0;

	if (name && !hwfs_engine_name_valid(name))
		return -EINVAL;
	w = calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->fd = fd;
	w->pid = pid;
	w->gpu = name ? gpu : -1;
	w->last_drain_us = w->last_swap_us = -1;
	pthread_mutex_init(&w->send_mu, NULL);
	if (name) {
		w->engine = 1;
		snprintf(w->name, sizeof(w->name), "%s", name);
	}
	pthread_mutex_lock(&reg->mu);
	if (name && engine_find(reg, name)) {
		r = -EEXIST;
		goto out;
	}
	/*
	 * `current` is read, and the reply sent, under reg->mu: a flip that
	 * happens after this read sends its event after the reply (events are
	 * sent under reg->mu too), so the watcher misses none.
	 */
	cur = ns_current(reg->ns);
	line = line_of(json_pack("{s:b, s:o}", "ok", 1, "current",
				 cur ? json_string(cur) : json_null()),
		       &len);
	if (!line) {
		r = -ENOMEM;
		goto out;
	}
	/* the first line, on an empty socket: it fits whole, or the client is gone */
	r = send(fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL) == (ssize_t)len ? 0 : -EPIPE;
	if (r < 0)
		goto out;
	w->next = reg->watchers;
	reg->watchers = w;
	*out = w;
	w = NULL;
	if (name && gpu >= 0)
		LOG_INFO("engines: engine %s registered (pid %d), ready when loaded on GPU %d", name,
			 (int)pid, gpu);
	else if (name)
		LOG_INFO("engines: engine %s registered (pid %d)", name, (int)pid);
out:
	pthread_mutex_unlock(&reg->mu);
	if (w)
		watcher_free(w);
	free(line);
	free(cur);
	return r;
}

/* Take @w off the registry, wake the barrier's waiters if it was an engine, free it. */
void engines_unwatch(struct engines *reg, struct watcher *w)
{
	pthread_mutex_lock(&reg->mu);
	for (struct watcher **pp = &reg->watchers; *pp; pp = &(*pp)->next)
		if (*pp == w) {
			*pp = w->next;
			break;
		}
	if (w->engine) {
		LOG_INFO("engines: engine %s (pid %d) unregistered", w->name, (int)w->pid);
		barrier_kick(reg); /* it stops counting */
	}
	pthread_mutex_unlock(&reg->mu);
	watcher_free(w);
}

/* Replace *@slot with a copy of @s (NULL: clear).  Returns 0 or -ENOMEM (unchanged). */
static int set_str(char **slot, const char *s)
{
	char *c = NULL;

	if (s && !(c = strdup(s)))
		return -ENOMEM;
	free(*slot);
	*slot = c;
	return 0;
}

/* Engine @w has no shadow version any more (reg->mu held). */
static void shadow_clear(struct watcher *w)
{
	set_str(&w->shadow, NULL);
	set_str(&w->reason, NULL);
	w->state = ENG_IDLE;
}

/* Is @w's shadow version @v (seq @seq)?  (reg->mu held) */
static int shadow_is(const struct watcher *w, const char *v, uint64_t seq)
{
	return w->shadow && w->shadow_seq == seq && !strcmp(w->shadow, v);
}

/*
 * The seq of version @v on this node, in *@seq: it must be a sealed (or
 * damaged) version, not open and not a staging name.  Takes the namespace's
 * read lock (reg->mu may be held: that order is allowed).  Returns 0,
 * -ENOENT (no such version) or -EBUSY (open).
 */
static int version_seq(struct engines *reg, const char *v, uint64_t *seq)
{
	enum hwfs_vstate state;
	uint64_t s;
	int r;

	if (ns_hidden_name(v))
		return -ENOENT;
	r = ns_version_state(reg->ns, v, &state, &s, NULL);
	if (r < 0)
		return r;
	if (state == HWFS_V_OPEN)
		return -EBUSY;
	*seq = s;
	return 0;
}

/*
 * Apply one report of engine @w to its state and wake the barrier's waiters;
 * a report that is not one is ignored (logged once per engine).  The version
 * is looked up under reg->mu, so a report and a removal's "removed" (which
 * forgets the removed version's shadow under reg->mu too) never cross: a
 * report of a removed version is either ignored or forgotten.  Returns 0,
 * -EINVAL (ignored) or -ENOMEM (state unchanged).
 */
/* An optional non-negative microsecond count of a report: its value, or -1. */
static int64_t opt_us(json_t *j)
{
	return json_is_integer(j) && json_integer_value(j) >= 0 ? (int64_t)json_integer_value(j) : -1;
}

int engines_report(struct engines *reg, struct watcher *w, json_t *msg)
{
	json_t *pj = json_object_get(msg, "pause_us");
	const char *what = json_string_value(json_object_get(msg, "report"));
	const char *v = json_string_value(json_object_get(msg, "version"));
	const char *why = json_string_value(json_object_get(msg, "reason"));
	const char *bad = NULL;
	char *reason = NULL;
	uint64_t seq = 0;
	int r = 0;

	if (!w->engine)
		bad = "it is not a registered engine";
	else if (!what || !v)
		bad = "it needs \"report\" and \"version\" strings";
	else if (strcmp(what, "loading") && strcmp(what, "loaded") && strcmp(what, "refused") &&
		 strcmp(what, "swapped"))
		bad = "unknown report";
	if (!bad && !strcmp(what, "refused") &&
	    !(reason = hwfs_clean_text(why && *why ? why : "no reason given", HWFS_ENGINE_REASON_MAX)))
		return -ENOMEM;
	pthread_mutex_lock(&reg->mu);
	if (!bad && version_seq(reg, v, &seq) < 0)
		bad = "no such sealed version here";
	if (bad) {
		if (!w->bad_logged) {
			w->bad_logged = 1;
			LOG_WARN("engines: ignored a report from %s (pid %d): %s (later ones are "
				 "ignored silently)", w->engine ? w->name : "a watcher", (int)w->pid,
				 bad);
		}
		r = -EINVAL;
		goto out;
	}
	if (strcmp(what, "swapped")) { /* loading, loaded, refused: about the shadow */
		r = set_str(&w->shadow, v);
		if (r == 0) {
			w->shadow_seq = seq;
			w->state = !strcmp(what, "loading")  ? ENG_LOADING
				   : !strcmp(what, "loaded") ? ENG_LOADED
							     : ENG_REFUSED;
			if (w->state == ENG_REFUSED) {
				w->refused_ns = hwfs_mono_ns();
				hwfs_count(&hwfs_nm.engine_refusals, 1);
			} else if (w->state == ENG_LOADING) {
				w->loading_ns = hwfs_mono_ns();
			} else if (w->loading_ns) { /* loaded: how long since "loading" */
				hwfs_hist_observe_ns(&hwfs_nm.engine_load,
						     hwfs_mono_ns() - w->loading_ns);
				w->loading_ns = 0;
			}
			free(w->reason); /* the refusal's, or none */
			w->reason = reason;
			reason = NULL;
		}
	} else {
		/* the first report of an engine serving what it loaded at start is not a swap */
		int swap = w->serving && (strcmp(w->serving, v) || w->serving_seq != seq);

		r = set_str(&w->serving, v);
		if (r == 0) {
			w->serving_seq = seq;
			if (swap) {
				w->swaps++;
				w->last_pause_us = json_is_integer(pj) && json_integer_value(pj) > 0
							   ? (uint64_t)json_integer_value(pj)
							   : 0;
				w->last_drain_us = opt_us(json_object_get(msg, "drain_us"));
				w->last_swap_us = opt_us(json_object_get(msg, "swap_us"));
				hwfs_hist_observe_ns(&hwfs_nm.swap_pause, w->last_pause_us * 1000);
			}
		}
		if (r == 0 && w->shadow && !strcmp(w->shadow, v))
			shadow_clear(w);
	}
	if (r == 0)
		barrier_kick(reg);
out:
	pthread_mutex_unlock(&reg->mu);
	free(reason);
	return r;
}

/*
 * Version @v was removed (reg->mu held): every engine forgets a shadow of it
 * (loaded, loading or refused), unless the name already stands for a newer
 * version that the shadow is of.  What an engine serves stays shown (it still
 * serves those bytes), but its seq matches no version any more.
 */
static void forget_removed(struct engines *reg, const char *v)
{
	uint64_t seq = 0;

	if (version_seq(reg, v, &seq) < 0)
		seq = 0; /* seqs start at 1: no shadow has it */
	for (struct watcher *w = reg->watchers; w; w = w->next)
		if (w->engine && w->shadow && !strcmp(w->shadow, v) && w->shadow_seq != seq)
			shadow_clear(w);
}

/*
 * Send {"event": @event, "version": @version} to every watcher, dropping
 * those that cannot take it now (see engine_registry.h).
 *
 * "current" is special.  The namespace calls its current hook after it
 * released its lock (ns_unlock_commit), so the hooks of two flips, A then B,
 * may run in either order, and sending the name each flip committed could
 * announce B then A while `current` names B.  So the version sent is the one
 * `current` names now, read under reg->mu (which orders every send) together
 * with the namespace's commit count; and it is sent only when a commit
 * happened since the last "current" sent.  The late hook of A then finds B
 * and the count it already announced, and sends nothing: watchers see the
 * flips in order and the last one always, an intermediate one perhaps not (it
 * was current only briefly; an engine only needs to serve what is current).
 * A commit of the version already current is a commit: announced again (a
 * way to retry an engine's failed swap).  @version is ignored for "current".
 */
void engines_event(struct engines *reg, const char *event, const char *version)
{
	int current = !strcmp(event, "current");
	char *line = NULL, *cur = NULL;
	uint64_t gen = 0;
	size_t len;

	if (!current && (!version || ns_hidden_name(version)))
		return;
	pthread_mutex_lock(&reg->mu);
	if (current) {
		cur = ns_current_gen(reg->ns, &gen);
		if (!cur || gen == reg->current_gen)
			goto out; /* announced already (or nothing to announce) */
		version = cur;
	}
	line = event_line(event, version, &len);
	if (!line) {
		LOG_ERR("engines: no memory for the %s event of %s", event, version);
		goto out;
	}
	if (current)
		reg->current_gen = gen;
	if (!strcmp(event, "removed"))
		forget_removed(reg, version);
	for (struct watcher *w = reg->watchers; w; w = w->next)
		if (send_line(w, line, len) < 0 && w->engine)
			barrier_kick(reg); /* a dropped engine stops counting */
out:
	pthread_mutex_unlock(&reg->mu);
	free(line);
	free(cur);
}

/* Has engine @w got version @v (seq @seq) ready: it serves it, or reported it loaded?  (reg->mu held) */
static int engine_ready(const struct watcher *w, const char *v, uint64_t seq)
{
	return (w->serving && w->serving_seq == seq && !strcmp(w->serving, v)) ||
	       (shadow_is(w, v, seq) && w->state == ENG_LOADED);
}

/* Did engine @w refuse version @v (seq @seq), at any time?  (reg->mu held) */
static int engine_refused(const struct watcher *w, const char *v, uint64_t seq)
{
	return shadow_is(w, v, seq) && w->state == ENG_REFUSED;
}

/*
 * Send "prepare" of @v to engine @w unless this barrier (@seq, @started)
 * sent it already (reg->mu held); a send remembers the barrier in the ring
 * of @w.  Returns 0, or -EPIPE when @w was dropped (it stops counting).
 */
static int prepare_once(struct watcher *w, const char *v, uint64_t seq, uint64_t started)
{
	size_t len;
	char *line;
	int r;

	for (unsigned i = 0; i < ENGINE_PREP_SLOTS; i++)
		if (w->prepared[i].seq == seq && w->prepared[i].started == started)
			return 0;
	line = event_line("prepare", v, &len);
	if (!line)
		return 0; /* no memory: asked on the next check */
	r = send_line(w, line, len);
	free(line);
	if (r == 0) {
		w->prepared[w->prep_next].seq = seq;
		w->prepared[w->prep_next].started = started;
		w->prep_next = (w->prep_next + 1) % ENGINE_PREP_SLOTS;
	}
	return r;
}

/*
 * engines_barrier() with reg->mu held.  The barrier is (the version's seq,
 * @started_ns): engines not ready get "prepare" once per barrier.  A refusal
 * reported since the barrier began decides it; one reported before (an
 * earlier commit's) is pending like silence, since the engine was asked again
 * and may load it now: only its new answer, or the deadline, decides.
 */
static int barrier_locked(struct engines *reg, const char *v, uint64_t started_ns, char *err,
			  size_t errlen)
{
	struct watcher *refused = NULL, *waiting = NULL;
	uint64_t ms = hwfs_tun.engine_deadline_ms, seq = 0;
	char gpu_why[HWFS_ENGINE_REASON_MAX] = "";
	int any = 0, r;

	for (struct watcher *w = reg->watchers; w && !any; w = w->next)
		any = w->engine && !w->dead;
	if (!any)
		return 0; /* no engine: as fast as without the barrier */
	r = version_seq(reg, v, &seq);
	if (r < 0) { /* removed (or never sealed) while the commit waited */
		snprintf(err, errlen, r == -EBUSY ? "version %s is open (not sealed)"
						  : "no such version: %s", v);
		return -ECANCELED;
	}
	for (struct watcher *w = reg->watchers; w; w = w->next) {
		int g = 0;

		if (!w->engine || w->dead)
			continue;
		if (w->gpu >= 0) { /* ready when the device load is: ask the hook */
			char why[HWFS_ENGINE_REASON_MAX] = "";

			if (reg->gpu_ready)
				g = reg->gpu_ready(reg->gpu_arg, v, w->gpu, started_ns, why,
						   sizeof(why));
			else
				g = -ECANCELED, snprintf(why, sizeof(why), "no device loader here");
			if (g == 0)
				continue;
			if (g == -ECANCELED && !refused)
				snprintf(gpu_why, sizeof(gpu_why), "%s", why[0] ? why : "load failed");
		} else if (engine_ready(w, v, seq)) {
			continue;
		}
		if (prepare_once(w, v, seq, started_ns) < 0)
			continue; /* dropped: it stops counting */
		if (g == -ECANCELED ||
		    (w->gpu < 0 && engine_refused(w, v, seq) && w->refused_ns >= started_ns)) {
			if (!refused)
				refused = w;
		} else if (!waiting) {
			waiting = w;
		}
	}
	if (refused) {
		snprintf(err, errlen, "engine %s refused %s: %s", refused->name, v,
			 refused->gpu >= 0 ? gpu_why
			 : refused->reason ? refused->reason : "no reason given");
		return -ECANCELED;
	}
	if (!waiting)
		return 0;
	if (hwfs_mono_ns() - started_ns >= ms * 1000000ull) {
		if (waiting->gpu >= 0)
			snprintf(err, errlen, "engine %s: %s was not loaded on GPU %d within %llu ms",
				 waiting->name, v, waiting->gpu, (unsigned long long)ms);
		else if (engine_refused(waiting, v, seq))
			snprintf(err, errlen,
				 "engine %s did not report %s loaded within %llu ms (it refused %s "
				 "before: %s)", waiting->name, v, (unsigned long long)ms, v,
				 waiting->reason ? waiting->reason : "no reason given");
		else
			snprintf(err, errlen, "engine %s did not report %s loaded within %llu ms",
				 waiting->name, v, (unsigned long long)ms);
		return -ECANCELED;
	}
	return -EINPROGRESS;
}

/* The non-blocking barrier check (see engine_registry.h): 0, -EINPROGRESS or -ECANCELED. */
int engines_barrier(struct engines *reg, const char *version, uint64_t started_ns, char *err,
		    size_t errlen)
{
	int r;

	pthread_mutex_lock(&reg->mu);
	r = barrier_locked(reg, version, started_ns, err, errlen);
	pthread_mutex_unlock(&reg->mu);
	return r;
}

/* The barrier from now on, waited for (at most engine_deadline_ms): 0 or -ECANCELED. */
int engines_barrier_wait(struct engines *reg, const char *version, char *err, size_t errlen)
{
	uint64_t started = hwfs_mono_ns();
	uint64_t until = started + hwfs_tun.engine_deadline_ms * 1000000ull;
	struct timespec ts = {(time_t)(until / 1000000000ull), (long)(until % 1000000000ull)};
	int r;

	pthread_mutex_lock(&reg->mu);
	/* past the deadline barrier_locked() decides, so the wait ends */
	while ((r = barrier_locked(reg, version, started, err, errlen)) == -EINPROGRESS)
		pthread_cond_timedwait(&reg->cv, &reg->mu, &ts);
	pthread_mutex_unlock(&reg->mu);
	return r;
}

/* Record the lease of @pid on @version for status.  Returns 0 or -ENOMEM. */
int engines_lease_add(struct engines *reg, const char *version, pid_t pid, struct lease **out)
{
	struct lease *l = calloc(1, sizeof(*l));

	if (!l || !(l->version = strdup(version))) {
		free(l);
		return -ENOMEM;
	}
	l->pid = pid;
	pthread_mutex_lock(&reg->mu);
	l->next = reg->leases;
	reg->leases = l;
	pthread_mutex_unlock(&reg->mu);
	*out = l;
	return 0;
}

/* Forget lease @l and free it (NULL: nothing). */
void engines_lease_del(struct engines *reg, struct lease *l)
{
	if (!l)
		return;
	pthread_mutex_lock(&reg->mu);
	for (struct lease **pp = &reg->leases; *pp; pp = &(*pp)->next)
		if (*pp == l) {
			*pp = l->next;
			break;
		}
	pthread_mutex_unlock(&reg->mu);
	free(l->version);
	free(l);
}

/* A JSON string of @s, or null. */
static json_t *str_or_null(const char *s)
{
	return s ? json_string(s) : json_null();
}

/* The live engines as status shows them: a new array, NULL without memory. */
json_t *engines_json(struct engines *reg)
{
	json_t *arr = json_array();

	if (!arr)
		return NULL;
	pthread_mutex_lock(&reg->mu);
	for (struct watcher *w = reg->watchers; w; w = w->next) {
		json_t *o;

		if (!w->engine || w->dead)
			continue;
		o = json_pack("{s:s, s:i, s:o, s:o, s:s, s:o, s:o, s:I}", "name", w->name,
				       "pid", (int)w->pid, "serving", str_or_null(w->serving),
				       "shadow", str_or_null(w->shadow), "state",
				       hwfs_engine_states[w->state], "reason", str_or_null(w->reason),
				       "last_swap_pause_us",
				       w->swaps ? json_integer((json_int_t)w->last_pause_us)
						: json_null(),
				       "swaps", (json_int_t)w->swaps);
		if (o && w->gpu >= 0)
			json_object_set_new(o, "gpu", json_integer(w->gpu));
		if (o && w->swaps && w->last_drain_us >= 0)
			json_object_set_new(o, "last_drain_us", json_integer(w->last_drain_us));
		if (o && w->swaps && w->last_swap_us >= 0)
			json_object_set_new(o, "last_swap_us", json_integer(w->last_swap_us));
		json_array_append_new(arr, o);
	}
	pthread_mutex_unlock(&reg->mu);
	return arr;
}

/* The leases as status shows them: a new array, NULL without memory. */
json_t *engines_leases_json(struct engines *reg)
{
	json_t *arr = json_array();

	if (!arr)
		return NULL;
	pthread_mutex_lock(&reg->mu);
	for (struct lease *l = reg->leases; l; l = l->next)
		json_array_append_new(arr, json_pack("{s:s, s:i}", "version", l->version, "pid",
						     (int)l->pid));
	pthread_mutex_unlock(&reg->mu);
	return arr;
}
