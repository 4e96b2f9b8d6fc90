/*
 * daemon_http.c — a node's HTTP endpoint (--http HOST:PORT, docs/operations.md):
 * /metrics (Prometheus text 0.0.4), /healthz and /readyz, served by the
 * bounded server of fs/common/http.c in its own threads.
 *
 * A scrape reads atomics only: the instruments of hwfs_nm, the store's byte
 * count (store_used_bytes), the agent's counters, and a snapshot of the
 * version count and `current` that the seal, current and remove hooks
 * refresh (daemon_http_refresh(), under http_mu, which no data path takes).
 * The engines' registry lock is taken briefly for their count and states.
 * So a scrape costs the same with 10 000 versions as with one, and never
 * waits for the namespace, a FUSE request, a commit or a publish.
 *
 * /healthz is the one request that touches the mount: a getxattr of its root,
 * made on a thread of its own (struct health_probe) so that a FUSE session
 * that does not answer holds that thread, never one of the server's, and
 * /healthz says 503 after http_health_ms instead of hanging.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "daemon_i.h"
#include "tunables.h"

void daemon_http_refresh(struct daemon *d)
{
	char **names = NULL, *cur;
	size_t n = 0;

	if (!d->o->http)
		return;
	if (ns_list(d->ns, &names, &n) == 0) {
		for (size_t i = 0; i < n; i++)
			free(names[i]);
		free(names);
		__atomic_store_n(&d->http_versions, (uint64_t)n, __ATOMIC_RELAXED);
	}
	cur = ns_current(d->ns);
	pthread_mutex_lock(&d->http_mu);
	snprintf(d->http_current, sizeof(d->http_current), "%s", cur ? cur : "");
	pthread_mutex_unlock(&d->http_mu);
	free(cur);
}

/* Engines registered and leases held, and whether an engine is loading a shadow. */
static void engine_counts(struct daemon *d, uint64_t *engines, uint64_t *leases, int *loading)
{
	json_t *e = engines_json(d->engines), *l = engines_leases_json(d->engines), *x;
	size_t i;

	*engines = json_array_size(e);
	*leases = json_array_size(l);
	*loading = 0;
	json_array_foreach(e, i, x) {
		const char *st = json_string_value(json_object_get(x, "state"));

		if (st && !strcmp(st, "loading"))
			*loading = 1;
	}
	json_decref(e);
	json_decref(l);
}

/* A gauge family of one sample. */
static void gauge1(struct mbuf *b, const char *name, const char *help, uint64_t v)
{
	metrics_family(b, name, "gauge", help);
	metrics_sample_u64(b, name, NULL, NULL, v);
}

/* A counter family of one sample, its value from @obj's integer member @key. */
static void counter_json(struct mbuf *b, const char *name, const char *help, json_t *obj,
			 const char *key)
{
	json_t *v = json_object_get(obj, key);

	metrics_family(b, name, "counter", help);
	if (json_is_real(v))
		metrics_sample(b, name, NULL, NULL, json_real_value(v));
	else
		metrics_sample_u64(b, name, NULL, NULL, (uint64_t)json_integer_value(v));
}

/* The replication counters of the agent (zeros when the node is not joined). */
static void replication(struct mbuf *b, struct agent *agent)
{
	json_t *c = agent ? agent_counters(agent) : NULL, *delta;

	if (!c)
		c = json_object();
	delta = json_object_get(c, "delta");
	counter_json(b, "hwfs_replication_bytes_received_total",
		     "shard bytes received by replication (a shard sent as a delta counts whole)",
		     c, "bytes_received");
	counter_json(b, "hwfs_replication_bytes_sent_total",
		     "shard bytes served to other nodes (a shard sent as a delta counts whole)", c,
		     "bytes_sent");
	counter_json(b, "hwfs_replication_wire_bytes_received_total",
		     "shard payload bytes received, as they crossed the wire", c,
		     "wire_bytes_received");
	counter_json(b, "hwfs_replication_wire_bytes_sent_total",
		     "shard payload bytes sent, as they crossed the wire", c, "wire_bytes_sent");
	counter_json(b, "hwfs_replication_retries_total",
		     "shard requests moved to another donor (silent, missing or bad)", c, "retries");
	{
		json_t *cpu = json_object_get(c, "cpu");
		static const struct {
			const char *name, *key, *help;
		} cpus[] = {
			{"hwfs_replication_agent_cpu_seconds_total", "agent_s",
			 "CPU seconds of the replication agent thread"},
			{"hwfs_replication_receive_cpu_seconds_total", "receive_s",
			 "of the agent thread's: taking shard pieces in (copy into the arena, hash, "
			 "intern)"},
			{"hwfs_replication_forward_cpu_seconds_total", "forward_s",
			 "of the agent thread's: passing arriving pieces on to pullers (cut-through)"},
			{"hwfs_replication_serve_cpu_seconds_total", "serve_s",
			 "of the agent thread's: answering shard requests (GET)"},
			{"hwfs_replication_io_cpu_seconds_total", "io_s",
			 "CPU seconds of the replication ZeroMQ I/O threads (socket reads and writes)"},
			{"hwfs_replication_codec_cpu_seconds_total", "codec_s",
			 "CPU seconds of the replication codec workers (delta encode and rebuild)"},
		};

		for (size_t i = 0; i < HWFS_ARRAY_SIZE(cpus); i++)
			counter_json(b, cpus[i].name, cpus[i].help, cpu, cpus[i].key);
	}
	counter_json(b, "hwfs_delta_encode_seconds_total",
		     "CPU seconds spent encoding element-level deltas", delta, "encode_cpu_s");
	counter_json(b, "hwfs_delta_decode_seconds_total",
		     "CPU seconds spent decoding element-level deltas", delta, "decode_cpu_s");
	json_decref(c);
}

/* /metrics of a node: everything, in text format 0.0.4. */
static void node_metrics(struct daemon *d, struct http_resp *r)
{
	struct mbuf b = {0};
	char cur[sizeof(d->http_current)];
	uint64_t engines, leases;
	size_t len;
	int loading;

	pthread_mutex_lock(&d->http_mu);
	memcpy(cur, d->http_current, sizeof(cur));
	pthread_mutex_unlock(&d->http_mu);
	engine_counts(d, &engines, &leases, &loading);
	metrics_build_info(&b);
	gauge1(&b, "hwfs_store_used_bytes", "bytes of distinct shards held in the store",
	       store_used_bytes(d->st));
	gauge1(&b, "hwfs_store_capacity_bytes", "capacity of the store's arena",
	       arena_capacity(store_arena(d->st)));
	gauge1(&b, "hwfs_versions", "versions on this node (sealed and open)",
	       __atomic_load_n(&d->http_versions, __ATOMIC_RELAXED));
	metrics_family(&b, "hwfs_current_info", "gauge",
		       "the version `current` names; one series, absent when none");
	if (cur[0])
		metrics_sample_u64(&b, "hwfs_current_info", "version", cur, 1);
	gauge1(&b, "hwfs_engines", "engines registered on this node", engines);
	gauge1(&b, "hwfs_leases", "leases held (versions mapped or loaded by a process)", leases);
	gauge1(&b, "hwfs_updating", "1 while a commit, publish, load or engine shadow-load runs",
	       hwfs_updating(hwfs_mono_ns()) || loading);
	replication(&b, daemon_agent(d));
	metrics_node(&b);
	if (d->o->coordinator)
		metrics_coord(&b);
	len = b.len;
	http_body(r, HWFS_METRICS_TYPE, mbuf_take(&b), len);
}

/*
 * The mount probe of /healthz.  One getxattr at a time, on a detached thread:
 * a request while it runs waits for it (up to http_health_ms from its start)
 * and shares its result, and a probe still hanging past that is answered at
 * once, without a second thread blocked behind it.  A result less than
 * HEALTH_REUSE_NS old is given again without a new probe, so a flood of
 * /healthz costs the mount one getxattr a second and the server's threads
 * at most one wait each.  The probe is shared by the daemon and the running
 * thread (refs), so a stopping daemon does not wait for a getxattr that may
 * never return.
 */
#define HEALTH_REUSE_NS 1000000000ull

struct health_probe {
	pthread_mutex_t mu;
	pthread_cond_t cv;   /* (CLOCK_MONOTONIC) a probe finished */
	int refs;            /* the daemon's, and the running thread's */
	int running;         /* a getxattr is in flight */
	uint64_t started_ns; /* when it began */
	uint64_t done;       /* probes finished so far */
	uint64_t done_ns;    /* when the last one finished */
	int err;             /* the last finished one's: 0 or an errno */
	char mnt[];          /* the mountpoint */
};

/* Drop a reference to @p; the last one frees it. */
static void probe_put(struct health_probe *p)
{
	int last;

	pthread_mutex_lock(&p->mu);
	last = --p->refs == 0;
	pthread_mutex_unlock(&p->mu);
	if (!last)
		return;
	pthread_cond_destroy(&p->cv);
	pthread_mutex_destroy(&p->mu);
	free(p);
}

/* The probe's thread: one getxattr of the mount's root (which the kernel never caches). */
static void *probe_main(void *arg)
{
	struct health_probe *p = arg;
	char buf[32];
	int err = getxattr(p->mnt, "user.hwfs.pid", buf, sizeof(buf)) < 0 ? errno : 0;

	pthread_mutex_lock(&p->mu);
	p->err = err;
	p->running = 0;
	p->done++;
	p->done_ns = hwfs_mono_ns();
	pthread_cond_broadcast(&p->cv);
	pthread_mutex_unlock(&p->mu);
	probe_put(p);
	return NULL;
}

/* A probe of @mnt, or NULL (out of memory). */
static struct health_probe *probe_new(const char *mnt)
{
	struct health_probe *p = calloc(1, sizeof(*p) + strlen(mnt) + 1);
	pthread_condattr_t ca;

	if (!p)
		return NULL;
	pthread_mutex_init(&p->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&p->cv, &ca);
	pthread_condattr_destroy(&ca);
	p->refs = 1;
	strcpy(p->mnt, mnt);
	return p;
}

/*
 * probe_mount() - does the mount answer?  The last result when it is recent,
 * else a probe (started unless one runs) waited for until http_health_ms
 * after its start.  Returns 0, an
 * errno of the getxattr (> 0), -ETIMEDOUT with *@waited_ns the probe's age
 * when it has not answered in time, or -EAGAIN (no thread).
 */
static int probe_mount(struct health_probe *p, uint64_t *waited_ns)
{
	pthread_attr_t attr;
	struct timespec ts;
	uint64_t seen, until;
	int r;

	pthread_mutex_lock(&p->mu);
	if (!p->running && p->done && hwfs_mono_ns() - p->done_ns < HEALTH_REUSE_NS) {
		r = p->err;
		pthread_mutex_unlock(&p->mu);
		return r;
	}
	if (!p->running) {
		pthread_t t;

		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		p->refs++;
		p->running = 1;
		p->started_ns = hwfs_mono_ns();
		if (pthread_create(&t, &attr, probe_main, p) != 0) {
			p->refs--;
			p->running = 0;
			pthread_mutex_unlock(&p->mu);
			pthread_attr_destroy(&attr);
			return -EAGAIN;
		}
		pthread_attr_destroy(&attr);
	}
	seen = p->done;
	until = p->started_ns + hwfs_tun.http_health_ms * 1000000ull;
	while (p->done == seen && hwfs_mono_ns() < until) {
		ts.tv_sec = (time_t)(until / 1000000000u);
		ts.tv_nsec = (long)(until % 1000000000u);
		pthread_cond_timedwait(&p->cv, &p->mu, &ts);
	}
	if (p->done != seen) {
		r = p->err;
	} else {
		r = -ETIMEDOUT;
		*waited_ns = hwfs_mono_ns() - p->started_ns;
	}
	pthread_mutex_unlock(&p->mu);
	return r;
}

/*
 * /healthz: the process is alive and its FUSE session answers a getxattr of
 * the mount's root within http_health_ms (probe_mount()).
 */
static void healthz(struct daemon *d, struct http_resp *r)
{
	uint64_t waited = 0;
	int err;

	if (!__atomic_load_n(&d->fuse_up, __ATOMIC_ACQUIRE)) {
		http_text(r, 503, "starting: FUSE not initialised yet");
		return;
	}
	err = probe_mount(d->http_probe, &waited);
	if (err == -ETIMEDOUT)
		http_text(r, 503, "FUSE not answering on %s: a getxattr has waited %.1f s",
			  d->o->mountpoint, (double)waited / 1e9);
	else if (err < 0)
		http_text(r, 503, "cannot probe %s: %s", d->o->mountpoint, strerror(-err));
	else if (err > 0)
		http_text(r, 503, "FUSE not answering on %s: %s", d->o->mountpoint, strerror(err));
	else
		http_text(r, 200, "ok");
}

/*
 * /readyz: mounted, joined when --join was given (the coordinator answers the
 * heartbeats), not shutting down.  A commit, publish, device load or an
 * engine's shadow-load in progress is "updating" and still ready.
 */
static void readyz(struct daemon *d, struct http_resp *r)
{
	struct agent *agent = daemon_agent(d);
	uint64_t engines, leases;
	int loading;

	if (__atomic_load_n(&d->stopping, __ATOMIC_ACQUIRE)) {
		http_text(r, 503, "stopping");
		return;
	}
	if (!__atomic_load_n(&d->fuse_up, __ATOMIC_ACQUIRE)) {
		http_text(r, 503, "not mounted yet");
		return;
	}
	if (d->o->join && !agent) {
		http_text(r, 503, "not joined yet");
		return;
	}
	if (agent && !agent_coord_reachable(agent)) {
		http_text(r, 503, "coordinator unreachable");
		return;
	}
	engine_counts(d, &engines, &leases, &loading);
	if (hwfs_updating(hwfs_mono_ns()) || loading)
		http_text(r, 200, "ready: updating");
	else
		http_text(r, 200, "ready");
}

/* The HTTP handler of a node. */
static void route(void *arg, const char *path, struct http_resp *r)
{
	struct daemon *d = arg;

	if (!strcmp(path, "/metrics"))
		node_metrics(d, r);
	else if (!strcmp(path, "/healthz"))
		healthz(d, r);
	else if (!strcmp(path, "/readyz"))
		readyz(d, r);
	else
		http_text(r, 404, "not found (try /metrics, /healthz, /readyz)");
}

int daemon_http_start(struct daemon *d, char *msg, size_t len)
{
	int r;

	if (!d->o->http)
		return 0;
	daemon_http_refresh(d);
	d->http_probe = probe_new(d->o->mountpoint);
	if (!d->http_probe) {
		snprintf(msg, len, "error: --http %s: %s\n", d->o->http, strerror(ENOMEM));
		return -ENOMEM;
	}
	r = http_start(d->o->http, d->o->http_hosts, route, d, &d->http);
	if (r < 0) {
		snprintf(msg, len, "error: --http %s: %s\n", d->o->http,
			 r == -EINVAL ? "not HOST:PORT" : strerror(-r));
		return r;
	}
	snprintf(d->http_addr, sizeof(d->http_addr), "%s", http_bound(d->http));
	LOG_INFO("http: serving /metrics, /healthz, /readyz on %s", d->http_addr);
	return 0;
}

void daemon_http_stop(struct daemon *d)
{
	http_stop(d->http); /* no request runs after this */
	d->http = NULL;
	if (d->http_probe)
		probe_put(d->http_probe); /* a hanging getxattr keeps it until it returns */
	d->http_probe = NULL;
}
