/*
 * agent.c — the node side of replication (see agent.h for the model): the
 * session with the coordinator and the agent thread.
 *
 * This file holds HELLO/WELCOME and the heartbeat, announcing sealed
 * versions, the requests of agent_call() (a table by op: an unknown op is an
 * EOPNOTSUPP reply), the loop that polls every socket and dispatches what
 * arrives (a table by message type), and the public API.  The commit is in
 * agent_commit.c, pulling in agent_recv.c and agent_pull.c, serving in
 * agent_serve.c; what they share is in agent_i.h.  The files call one way:
 * agent.c -> agent_commit.c -> agent_recv.c -> agent_pull.c -> agent_serve.c
 * -> agent_pool.c (agent_i.h).  The node itself (its
 * namespace, mount and engines) is reached only through the hooks of
 * agent_opts (agent.h).
 *
 * Everything below runs on the agent thread, except agent_sealed(),
 * agent_call(), agent_pulls() and agent_counters(), which only touch the
 * queues under a->mu and the atomic fields.  The loop polls the coordinator
 * socket, the serving ROUTER, one DEALER per donor, the wake-up pipe and the
 * codec workers' eventfd (agent_pool.h: encodes and rebuilds finished); each
 * pass also refills the request windows, feeds the encode-ahead runs, sends
 * the heartbeat (HELLO) and fails over from silent donors.
 */
#define _GNU_SOURCE
#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "agent_i.h"
#include "keys.h"
#include "manifest.h"

/*
 * The agent context's ZeroMQ thread-name prefix: its threads are "2/ZMQbg/IO/0"
 * and so on, told from an embedded coordinator's (io_cpu_ns()).
 */
#define AGENT_ZMQ_PREFIX 2

/*
 * ZeroMQ I/O threads for the agent's context: the tunable zmq_io_threads, or
 * for 0 (the default) one per two online CPUs, at least 2 (a relay receives
 * from upstream and sends downstream on different ones) and at most 8.
 */
static int io_threads(void)
{
	long ncpu;

	if (hwfs_tun.zmq_io_threads)
		return (int)hwfs_tun.zmq_io_threads;
	ncpu = sysconf(_SC_NPROCESSORS_ONLN);
	return (int)HWFS_MAX(2, HWFS_MIN(8, ncpu / 2));
}

/* Make the loop's zmq_poll() return now (any thread; never blocks). */
static void wake(struct agent *a)
{
	char c = 1;

	if (write(a->pipe[1], &c, 1) < 0 && errno != EAGAIN)
		LOG_WARN("agent: wake-up pipe: %s", strerror(errno));
}

/* ------------------------------------------------------------- coordinator */

static void announce(struct agent *a, const char *name)
{
	struct hwfs_vrec *rec = NULL;
	char *js = NULL;
	size_t len;

	if (a->o.hooks->snapshot(a->o.arg, name, &rec) < 0 || rec->state != HWFS_V_SEALED ||
	    manifest_build(rec, &js, &len) < 0)
		goto out;
	agent_send_coord(a, P_ANNOUNCE, json_pack("{s:s, s:o}", "version", name, "digest",
					    hwfs_hash_json(&rec->digest)),
		   js, len);
out:
	free(js);
	hwfs_vrec_free(rec);
}

/*
 * hello() - send the heartbeat: this node's versions, current, the last
 * cluster decision it applied (so a coordinator restarted without --state
 * relearns the committed version and never repeats an epoch), engines
 * (@engines, consumed, when the caller read them already; else read here).
 * The engines sent are kept: an early HELLO is due only when they change.
 */
static void hello(struct agent *a, json_t *engines)
{
	json_t *vers = a->o.hooks->versions(a->o.arg), *v;
	char *cur = a->o.hooks->current(a->o.arg);
	size_t i;

	json_array_foreach(vers, i, v)
		json_object_set_new(v, "complete", json_true());
	json_t *h = json_pack("{s:s, s:s, s:o, s:o}", "node", a->o.node, "listen", a->o.listen,
			      "versions", vers ?: json_array(), "current",
			      cur ? json_string(cur) : json_null());

	json_object_set_new(h, "session", json_string(a->session));
	/* for the coordinator's status page (wire bytes per node) */
	json_object_set_new(h, "wire_bytes_received",
			    json_integer((json_int_t)__atomic_load_n(&a->wire_rx, __ATOMIC_RELAXED)));
	json_object_set_new(h, "wire_bytes_sent",
			    json_integer((json_int_t)__atomic_load_n(&a->wire_tx, __ATOMIC_RELAXED)));
	if (a->commit.applied) { /* docs/protocol.md, HELLO.applied */
		json_object_set_new(h, "applied", json_string(a->commit.applied));
		json_object_set_new(h, "epoch", json_integer((json_int_t)a->commit.applied_epoch));
	}
	if (a->o.hooks->engines && !engines) {
		__atomic_store_n(&a->engines_changed, 0, __ATOMIC_RELAXED); /* before the read */
		engines = a->o.hooks->engines(a->o.arg);
	}
	if (a->o.hooks->engines) { /* the coordinator shows them in `hwfs status --cluster` */
		json_decref(a->hello_engines);
		a->hello_engines = engines ? json_incref(engines) : NULL;
		json_object_set_new(h, "engines", engines ?: json_array());
	}
	if (a->keys) /* pullers reach our data socket with it */
		json_object_set_new(h, "key", json_string(keys_public(a->keys)));
	agent_send_coord(a, P_HELLO, h, NULL, 0);
	free(cur);
	a->last_hello = now_s();
}

static void on_welcome(struct agent *a, struct proto_msg *m)
{
	json_t *vers = a->o.hooks->versions(a->o.arg), *v;
	size_t i;

	LOG_INFO("agent: joined %s as %s", a->o.coordinator, a->o.node);
	/* a (re)started coordinator learns our versions from their manifests */
	json_array_foreach(vers, i, v)
		announce(a, json_string_value(json_object_get(v, "name")));
	json_decref(vers);
	commit_learn(a, proto_str(m, "committed"), proto_int(m, "epoch"));
}

static void on_result(struct agent *a, struct proto_msg *m)
{
	uint64_t id = proto_int(m, "req");

	pthread_mutex_lock(&a->mu);
	for (struct call **pp = &a->calls_wait; *pp; pp = &(*pp)->next) {
		struct call *c = *pp;

		if (c->id != id)
			continue;
		c->res = json_deep_copy(m->h);
		json_object_del(c->res, "v");
		json_object_del(c->res, "t");
		json_object_del(c->res, "req");
		c->done = 1;
		*pp = c->next;
		pthread_cond_signal(&c->cv);
		break;
	}
	pthread_mutex_unlock(&a->mu);
}

/* ------------------------------------------------------------- requests */

/* The fields of COMMIT_REQ for agent_call() @req, request id @id (NULL without memory). */
static json_t *commit_req(const json_t *req, uint64_t id)
{
	return json_pack("{s:I, s:O, s:i}", "req", (json_int_t)id, "version",
			 json_object_get(req, "version"), "deadline_ms",
			 (json_int_t)hwfs_tun.commit_deadline_ms);
}

/* The fields of STATUS_REQ, request id @id (NULL without memory). */
static json_t *status_req(const json_t *req, uint64_t id)
{
	(void)req;
	return json_pack("{s:I}", "req", (json_int_t)id);
}

/*
 * What agent_call() may ask the coordinator, by "op" (agent.h): the message
 * it becomes and how its fields are made.  An op not in this table is
 * answered at once, by agent_call(), with an EOPNOTSUPP error reply.
 */
static const struct agent_req {
	const char *op;
	enum proto_type t;
	json_t *(*fields)(const json_t *req, uint64_t id);
} agent_reqs[] = {
	{"commit", P_COMMIT_REQ, commit_req},
	{"cluster", P_STATUS_REQ, status_req},
};

/* The entry of agent_reqs for request @req's "op", or NULL (none, or not a string). */
static const struct agent_req *agent_req_of(const json_t *req)
{
	const char *op = json_string_value(json_object_get(req, "op"));

	for (size_t i = 0; op && i < HWFS_ARRAY_SIZE(agent_reqs); i++)
		if (!strcmp(agent_reqs[i].op, op))
			return &agent_reqs[i];
	return NULL;
}

/*
 * Queued work from other threads: seal announcements and calls.  The calls'
 * requests are made under the lock (a caller that times out takes its call
 * back) and sent after the announcements: a version is sealed before its
 * publisher can ask to commit it, and the coordinator refuses a commit of a
 * version no node has announced, so the ANNOUNCE must go first when both
 * wait in the same drain.
 */
static void drain_queues(struct agent *a)
{
	char buf[64];
	char **sealed;
	size_t n, n_out = 0;
	struct call *calls;
	struct {
		enum proto_type t;
		json_t *body;
	} *out = NULL;

	while (read(a->pipe[0], buf, sizeof(buf)) > 0)
		;
	pthread_mutex_lock(&a->mu);
	sealed = a->sealed_q;
	n = a->n_sealed;
	a->sealed_q = NULL;
	a->n_sealed = 0;
	calls = a->calls_new;
	a->calls_new = NULL;
	for (struct call *c = calls; c; c = c->next)
		n_out++;
	out = n_out ? calloc(n_out, sizeof(*out)) : NULL;
	n_out = 0;
	for (struct call *c = calls; c && out; c = c->next) {
		c->id = ++a->next_req;
		out[n_out].t = c->rq->t; /* agent_call() queued only ops of agent_reqs */
		out[n_out].body = c->rq->fields(c->req, c->id);
		n_out++;
	}
	while (calls) { /* unsent ones (no memory) time out at their caller */
		struct call *c = calls;

		calls = c->next;
		c->next = a->calls_wait;
		a->calls_wait = c;
	}
	pthread_mutex_unlock(&a->mu);
	for (size_t i = 0; i < n; i++) {
		announce(a, sealed[i]);
		serve_ahead_sealed(a, sealed[i]);
		free(sealed[i]);
	}
	free(sealed);
	for (size_t i = 0; i < n_out; i++)
		agent_send_coord(a, out[i].t, out[i].body, NULL, 0);
	free(out);
}

/* ------------------------------------------------------------- the loop */

/*
 * The agent thread's CPU since @t0 was receiving, but for what agent_recv.c
 * counted as forwarding meanwhile (cpu_fwd_ns grew from @fwd0): count it so.
 */
static void recv_count(struct agent *a, uint64_t t0, uint64_t fwd0)
{
	uint64_t spent = hwfs_self_cpu_ns() - t0;
	uint64_t fwd = __atomic_load_n(&a->cpu_fwd_ns, __ATOMIC_RELAXED) - fwd0;

	__atomic_add_fetch(&a->cpu_recv_ns, spent > fwd ? spent - fwd : 0, __ATOMIC_RELAXED);
}

/* The codec workers finished jobs: act on them (agent_serve.c, agent_recv.c). */
static void pool_results(struct agent *a)
{
	struct pool_job *j = pool_take_done(a->pool), *next;

	for (; j; j = next) {
		uint64_t t0 = hwfs_self_cpu_ns();

		next = j->next;
		if (j->kind == POOL_ENCODE) {
			serve_on_encoded(a, j);
			__atomic_add_fetch(&a->cpu_serve_ns, hwfs_self_cpu_ns() - t0, __ATOMIC_RELAXED);
		} else {
			uint64_t fwd0 = __atomic_load_n(&a->cpu_fwd_ns, __ATOMIC_RELAXED);

			recv_on_rebuilt(a, j);
			recv_count(a, t0, fwd0);
		}
	}
}

/* Where a message came from: its socket, and the ROUTER identity of a puller. */
struct rx_from {
	void *sock;
	int is_router;           /* the serving ROUTER: @ident names the puller */
	const uint8_t *ident;
	size_t ident_len;
	const char *what;        /* for logs: "the coordinator", "a puller", a donor's address */
};

static void rx_pong(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	commit_learn(a, proto_str(m, "committed"), proto_int(m, "epoch"));
}

static void rx_welcome(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	on_welcome(a, m);
}

static void rx_plan(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	pull_on_plan(a, m);
}

static void rx_prepare(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	commit_on_prepare(a, m);
}

static void rx_commit(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	commit_on_commit(a, m);
}

static void rx_abort(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	commit_on_abort(a, m);
}

static void rx_result(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	on_result(a, m);
}

static void rx_get(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	uint64_t t0 = hwfs_self_cpu_ns();

	if (from->is_router) /* a GET comes only to the serving socket */
		serve_on_get(a, from->ident, from->ident_len, m);
	__atomic_add_fetch(&a->cpu_serve_ns, hwfs_self_cpu_ns() - t0, __ATOMIC_RELAXED);
}

static void rx_shard(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	uint64_t t0 = hwfs_self_cpu_ns(), fwd0 = __atomic_load_n(&a->cpu_fwd_ns, __ATOMIC_RELAXED);

	__atomic_add_fetch(&a->wire_rx, m->payload_len, __ATOMIC_RELAXED);
	recv_on_shard(a, m, from->what, from->sock);
	recv_count(a, t0, fwd0);
}

static void rx_missing(struct agent *a, struct proto_msg *m, const struct rx_from *from)
{
	pull_on_missing(a, m);
}

/*
 * What the agent does with each message it may receive, by type; a type
 * without an entry (one the nodes send the coordinator, say) is logged as
 * unexpected and dropped.
 */
static void (*const rx_table[P_MISSING + 1])(struct agent *, struct proto_msg *,
					      const struct rx_from *) = {
	[P_PONG] = rx_pong,	  [P_WELCOME] = rx_welcome, [P_PLAN] = rx_plan,
	[P_PREPARE] = rx_prepare, [P_COMMIT] = rx_commit,   [P_ABORT] = rx_abort,
	[P_COMMIT_RES] = rx_result, [P_STATUS_RES] = rx_result, [P_GET] = rx_get,
	[P_SHARD] = rx_shard,	  [P_MISSING] = rx_missing,
};

/* Take up to HANDLE_BURST messages from @sock (@what in logs) and dispatch them (rx_table). */
static void handle(struct agent *a, void *sock, int is_router, const char *what)
{
	for (int k = 0; k < HANDLE_BURST; k++) {
		uint8_t ident[256];
		size_t ident_len = sizeof(ident);
		struct proto_msg m;
		char err[256];
		int r = proto_recv(sock, is_router ? ident : NULL, is_router ? &ident_len : NULL, 1,
				   &m, err, sizeof(err));

		if (r == -EAGAIN)
			return;
		if (r < 0) {
			if (r != -EBADMSG)
				return;
			if (now_s() - a->badmsg_logged >= BADMSG_LOG_GAP_S) {
				LOG_WARN("agent: malformed message from %s dropped: %s (%llu more dropped "
					 "since the last of these lines)", what, err,
					 (unsigned long long)a->badmsg_quiet);
				a->badmsg_logged = now_s();
				a->badmsg_quiet = 0;
			} else {
				a->badmsg_quiet++;
			}
			continue;
		}
		if (sock == a->coord)
			__atomic_store_n(&a->last_coord_ns, (int64_t)(now_s() * 1e9), __ATOMIC_RELAXED);
		if ((size_t)m.type < HWFS_ARRAY_SIZE(rx_table) && rx_table[m.type]) {
			struct rx_from from = {sock, is_router, ident, ident_len, what};

			rx_table[m.type](a, &m, &from);
		} else {
			LOG_WARN("agent: unexpected %s from %s", proto_type_name(m.type), what);
		}
		proto_msg_clear(&m);
		/* a long burst of pieces must not starve the heartbeat */
		if (now_s() - a->last_hello >= ms_s(hwfs_tun.heartbeat_ms))
			hello(a, NULL);
	}
}

/*
 * hello_if_due() - send a HELLO when one is due: a heartbeat period since the
 * last one, or the engines' list differs from the one the last HELLO carried
 * (so `hwfs status --cluster` shows what engines serve right after a swap),
 * at most one such early HELLO per ENGINES_HELLO_GAP_S.  An engine's report
 * or disconnect only says "look" (engines_changed): a report that changes
 * nothing shown (the same report again) sends nothing.
 */
static void hello_if_due(struct agent *a)
{
	double since = now_s() - a->last_hello;
	json_t *eng;

	if (since >= ms_s(hwfs_tun.heartbeat_ms)) {
		hello(a, NULL);
		return;
	}
	if (!a->o.hooks->engines || since < ENGINES_HELLO_GAP_S ||
	    !__atomic_load_n(&a->engines_changed, __ATOMIC_RELAXED))
		return;
	__atomic_store_n(&a->engines_changed, 0, __ATOMIC_RELAXED); /* before the list is read */
	eng = a->o.hooks->engines(a->o.arg);
	if (eng && a->hello_engines && json_equal(eng, a->hello_engines)) {
		json_decref(eng);
		return;
	}
	hello(a, eng);
}

/*
 * How long the loop may sleep in zmq_poll() (ms): LOOP_TICK_MS, but no later
 * than the deadline of a PREPARE waiting for the engine barrier (so a silent
 * engine's not-ready goes out at engine_deadline_ms, not up to a tick late)
 * and than the end of the early-HELLO gap when an engine changed.
 */
static long loop_timeout_ms(struct agent *a)
{
	double left = ms_s(LOOP_TICK_MS);

	left = commit_wait_left(a, left);
	if (__atomic_load_n(&a->engines_changed, __ATOMIC_RELAXED))
		left = HWFS_MIN(left, a->last_hello + ENGINES_HELLO_GAP_S - now_s());
	/* rounded up: waking a hair early would only poll again */
	return left > 0 ? (long)(left * 1000.0) + 1 : 0;
}

static void *agent_main(void *arg)
{
	struct agent *a = arg;

	hello(a, NULL);
	while (!__atomic_load_n(&a->stop, __ATOMIC_RELAXED)) {
		size_t np = 0, i = 0;
		struct peer *p;
		zmq_pollitem_t *items;

		for (p = a->pull.peers; p; p = p->next)
			np++;
		items = calloc(4 + np, sizeof(*items));
		if (!items)
			break;
		items[0] = (zmq_pollitem_t){a->coord, 0, ZMQ_POLLIN, 0};
		items[1] = (zmq_pollitem_t){a->router, 0, ZMQ_POLLIN, 0};
		items[2] = (zmq_pollitem_t){NULL, a->pipe[0], ZMQ_POLLIN, 0};
		items[3] = (zmq_pollitem_t){NULL, pool_fd(a->pool), ZMQ_POLLIN, 0};
		for (p = a->pull.peers, i = 4; p; p = p->next, i++)
			items[i] = (zmq_pollitem_t){p->sock, 0, ZMQ_POLLIN, 0};
		if (zmq_poll(items, (int)(4 + np), loop_timeout_ms(a)) < 0 && errno != EINTR) {
			free(items);
			break;
		}
		free(items);
		drain_queues(a);
		pool_results(a);
		handle(a, a->coord, 0, "the coordinator");
		handle(a, a->router, 1, "a puller");
		for (p = a->pull.peers; p; p = p->next)
			handle(a, p->sock, 0, p->addr);
		pool_results(a); /* (what finished while the sockets were handled) */
		pull_pump(a);
		serve_ahead_pump(a);
		commit_barrier_check(a);
		hello_if_due(a);
	}
	return NULL;
}

int agent_start(const struct agent_opts *o, struct agent **out)
{
	struct agent *a = calloc(1, sizeof(*a));
	int linger = 0, r = -ENOMEM;

	if (!a)
		return -ENOMEM;
	a->pipe[0] = a->pipe[1] = -1;
	pthread_mutex_init(&a->mu, NULL);
	a->o = *o;
	a->o.keys = NULL; /* used by agent_start() only */
	a->pull.arrived = commit_arrived; /* the hooks that keep the files calling one way */
	a->serve.find_want = pull_find_want;
	a->o.node = strdup(o->node);
	a->o.listen = strdup(o->listen);
	a->o.coordinator = strdup(o->coordinator);
	if (!a->o.node || !a->o.listen || !a->o.coordinator)
		goto fail;
	r = pool_new(o->st, (unsigned)hwfs_tun.codec_threads, (int)hwfs_tun.delta_level, &a->ds,
		     &a->pool);
	if (r < 0)
		goto fail;
	r = -ENOMEM;
	commit_load_applied(a);
	{
		hwfs_hash_t h;
		struct {
			pid_t pid;
			int64_t t;
			void *p;
		} seed = {getpid(), hwfs_now_ns(), a};

		hwfs_hash_buf(&seed, sizeof(seed), &h);
		hwfs_hash_hex(&h, a->session);
	}
	if (pipe2(a->pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		r = -errno;
		goto fail;
	}
	a->ctx = zmq_ctx_new();
	/* before the first socket: the context starts its I/O threads then */
	if (a->ctx && zmq_ctx_set(a->ctx, ZMQ_IO_THREADS, io_threads()) < 0)
		LOG_WARN("agent: %d ZeroMQ I/O threads refused (%s); keeping the default",
			 io_threads(), zmq_strerror(zmq_errno()));
	/* their names start "AGENT_ZMQ_PREFIX/", which io_cpu_ns() counts (not a coordinator's) */
	if (a->ctx)
		zmq_ctx_set(a->ctx, ZMQ_THREAD_NAME_PREFIX, AGENT_ZMQ_PREFIX);
	a->coord = a->ctx ? zmq_socket(a->ctx, ZMQ_DEALER) : NULL;
	a->router = a->ctx ? zmq_socket(a->ctx, ZMQ_ROUTER) : NULL;
	if (!a->coord || !a->router) {
		r = -EIO;
		goto fail;
	}
	agent_set_backoff(a->coord);
	zmq_setsockopt(a->router, ZMQ_LINGER, &linger, sizeof(linger));
	if (o->keys) {
		r = keys_load(o->keys, &a->keys);
		if (r == 0 && !keys_coordinator(a->keys)) {
			LOG_ERR("agent: %s/coordinator.pub is missing", o->keys);
			r = -ENOENT;
		}
		if (r == 0)
			r = keys_start_zap(a->keys, a->ctx);
		if (r == 0)
			r = keys_server(a->keys, a->router);
		if (r == 0)
			r = keys_client(a->keys, a->coord, keys_coordinator(a->keys));
		if (r < 0)
			goto fail;
	}
	if (zmq_setsockopt(a->coord, ZMQ_ROUTING_ID, a->o.node, strlen(a->o.node)) < 0 ||
	    zmq_connect(a->coord, a->o.coordinator) < 0) {
		r = -errno;
		LOG_ERR("agent: coordinator %s: %s", a->o.coordinator, zmq_strerror(errno));
		goto fail;
	}
	if (zmq_bind(a->router, a->o.listen) < 0) {
		r = -errno;
		LOG_ERR("agent: cannot listen on %s: %s", a->o.listen, zmq_strerror(errno));
		goto fail;
	}
	{ /* a :* port: tell the coordinator (and status) the one bound */
		char ep[256];
		size_t len = sizeof(ep);
		char *dup;

		if (zmq_getsockopt(a->router, ZMQ_LAST_ENDPOINT, ep, &len) == 0 && (dup = strdup(ep))) {
			free((char *)a->o.listen);
			a->o.listen = dup;
		}
	}
	if (pthread_create(&a->thread, NULL, agent_main, a) != 0) {
		r = -EAGAIN;
		goto fail;
	}
	a->running = 1;
	/* published with release: other threads read the pointer with an acquire load (agent.h) */
	__atomic_store_n(out, a, __ATOMIC_RELEASE);
	return 0;
fail:
	agent_stop(a);
	return r;
}

void agent_stop(struct agent *a)
{
	if (!a)
		return;
	if (a->running) {
		__atomic_store_n(&a->stop, 1, __ATOMIC_RELAXED);
		wake(a);
		pthread_join(a->thread, NULL);
	}
	pool_free(a->pool); /* first: its jobs hold what the fetches and requests point to */
	a->pool = NULL;
	pull_free(a);
	serve_free(a);
	if (a->coord)
		zmq_close(a->coord);
	if (a->router)
		zmq_close(a->router);
	keys_free(a->keys);
	if (a->ctx)
		zmq_ctx_term(a->ctx);
	pthread_mutex_lock(&a->mu);
	for (size_t i = 0; i < a->n_sealed; i++)
		free(a->sealed_q[i]);
	free(a->sealed_q);
	/* callers still waiting time out on their own */
	pthread_mutex_unlock(&a->mu);
	if (a->pipe[0] >= 0)
		close(a->pipe[0]);
	if (a->pipe[1] >= 0)
		close(a->pipe[1]);
	commit_free(a);
	json_decref(a->hello_engines);
	json_decref(a->pull.pulls);
	free((char *)a->o.node);
	free((char *)a->o.listen);
	free((char *)a->o.coordinator);
	pthread_mutex_destroy(&a->mu);
	free(a);
}

/* Wake the agent's loop now (any thread): see agent.h. */
void agent_wake(void *agent)
{
	struct agent *a = agent;

	__atomic_store_n(&a->engines_changed, 1, __ATOMIC_RELAXED);
	wake(a);
}

void agent_sealed(void *agent, const char *name)
{
	struct agent *a = agent;
	char **q;

	pthread_mutex_lock(&a->mu);
	q = realloc(a->sealed_q, (a->n_sealed + 1) * sizeof(*q));
	if (q) {
		a->sealed_q = q;
		q[a->n_sealed] = strdup(name);
		if (q[a->n_sealed])
			a->n_sealed++;
	}
	pthread_mutex_unlock(&a->mu);
	wake(a);
}

/* The coordinator answers every heartbeat: has it been silent past coord_silence_ms?  Any thread. */
static int coord_silent(struct agent *a)
{
	return now_s() - __atomic_load_n(&a->last_coord_ns, __ATOMIC_RELAXED) / 1e9 >
	       ms_s(hwfs_tun.coord_silence_ms);
}

int agent_coord_reachable(struct agent *a)
{
	return !coord_silent(a);
}

int agent_call(struct agent *a, json_t *req, json_t **res, int timeout_ms)
{
	struct call c = {.req = req, .rq = agent_req_of(req)};
	struct timespec dl;
	int r = 0;

	if (!c.rq) { /* not a request of the table: refused, never guessed */
		const char *op = json_string_value(json_object_get(req, "op"));

		*res = json_pack("{s:b, s:s+, s:i}", "ok", 0, "error", "unknown replication request ",
				 op ? op : "(no op)", "errno", EOPNOTSUPP);
		return *res ? 0 : -ENOMEM;
	}
	if (coord_silent(a)) /* unreachable */
		return -EHOSTUNREACH;
	pthread_cond_init(&c.cv, NULL);
	clock_gettime(CLOCK_REALTIME, &dl);
	dl.tv_sec += timeout_ms / 1000;
	dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
	if (dl.tv_nsec >= 1000000000) {
		dl.tv_sec++;
		dl.tv_nsec -= 1000000000;
	}
	pthread_mutex_lock(&a->mu);
	c.next = a->calls_new;
	a->calls_new = &c;
	pthread_mutex_unlock(&a->mu);
	wake(a);
	pthread_mutex_lock(&a->mu);
	while (!c.done && r == 0) {
		struct timespec slice;

		/* wake every CALL_CHECK_MS to notice a coordinator that went away */
		clock_gettime(CLOCK_REALTIME, &slice);
		slice.tv_nsec += CALL_CHECK_MS * 1000000L;
		if (slice.tv_nsec >= 1000000000) {
			slice.tv_sec++;
			slice.tv_nsec -= 1000000000;
		}
		if (slice.tv_sec > dl.tv_sec || (slice.tv_sec == dl.tv_sec && slice.tv_nsec > dl.tv_nsec))
			slice = dl;
		if (pthread_cond_timedwait(&c.cv, &a->mu, &slice) == ETIMEDOUT && !c.done) {
			if (slice.tv_sec == dl.tv_sec && slice.tv_nsec == dl.tv_nsec)
				r = -ETIMEDOUT;
			else if (coord_silent(a))
				r = -ECONNRESET;
		}
	}
	if (!c.done) { /* take it back from whichever list holds it */
		for (struct call **lists[] = {&a->calls_new, &a->calls_wait}, ***l = lists;
		     l < lists + 2; l++)
			for (struct call **pp = *l; *pp; pp = &(*pp)->next)
				if (*pp == &c) {
					*pp = c.next;
					break;
				}
	}
	pthread_mutex_unlock(&a->mu);
	pthread_cond_destroy(&c.cv);
	if (!c.done)
		return r ? r : -ETIMEDOUT;
	*res = c.res;
	return c.res ? 0 : -ENOMEM;
}

const char *agent_endpoint(const struct agent *a)
{
	return a->o.listen;
}

json_t *agent_pulls(struct agent *a)
{
	json_t *r;

	pthread_mutex_lock(&a->mu);
	r = a->pull.pulls ? json_deep_copy(a->pull.pulls) : json_array();
	pthread_mutex_unlock(&a->mu);
	return r;
}

/*
 * The CPU nanoseconds of this process's threads named "N/ZMQbg/IO/..." (N:
 * AGENT_ZMQ_PREFIX): the agent context's ZeroMQ I/O threads, which do the
 * kernel's socket copies of every SHARD piece sent and received (an
 * embedded coordinator's context has no prefix).  0 where /proc cannot be
 * read.
 */
static uint64_t io_cpu_ns(void)
{
	char want[24], path[300], comm[32];
	uint64_t ns = 0;
	struct dirent *e;
	DIR *d = opendir("/proc/self/task");
	int n;

	if (!d)
		return 0;
	n = snprintf(want, sizeof(want), "%d/ZMQbg/IO/", AGENT_ZMQ_PREFIX);
	while ((e = readdir(d))) {
		FILE *f;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		f = fopen(path, "re");
		if (!f)
			continue;
		if (fgets(comm, sizeof(comm), f) && !strncmp(comm, want, (size_t)n))
			ns += hwfs_tid_cpu_ns((pid_t)atoi(e->d_name));
		fclose(f);
	}
	closedir(d);
	return ns;
}

/* @ns nanoseconds as JSON seconds. */
static json_t *ns_seconds(uint64_t ns)
{
	return json_real((double)ns / 1e9);
}

/*
 * The replication CPU of this node (status replication.cpu): the threads'
 * own clocks (the agent thread, the context's I/O threads, the codec
 * workers) and, of the agent thread's, what receiving, forwarding and
 * serving took (the rest: the session, the loop, pulling's bookkeeping).
 */
static json_t *cpu_json(struct agent *a)
{
	return json_pack("{s:o, s:o, s:o, s:o, s:o, s:o}", "agent_s",
			 ns_seconds(hwfs_thread_cpu_ns(a->thread)), "io_s",
			 ns_seconds(io_cpu_ns()), "codec_s", ns_seconds(pool_cpu_ns(a->pool)),
			 "receive_s", ns_seconds(__atomic_load_n(&a->cpu_recv_ns, __ATOMIC_RELAXED)),
			 "forward_s", ns_seconds(__atomic_load_n(&a->cpu_fwd_ns, __ATOMIC_RELAXED)),
			 "serve_s", ns_seconds(__atomic_load_n(&a->cpu_serve_ns, __ATOMIC_RELAXED)));
}

/* An atomic counter as a JSON integer. */
static json_t *counter(uint64_t *c)
{
	return json_integer((json_int_t)__atomic_load_n(c, __ATOMIC_RELAXED));
}

/* An atomic nanosecond counter as JSON seconds. */
static json_t *seconds(uint64_t *ns)
{
	return json_real((double)__atomic_load_n(ns, __ATOMIC_RELAXED) / 1e9);
}

json_t *agent_counters(struct agent *a)
{
	struct delta_stats *d = &a->ds;

	return json_pack("{s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:{s:o, s:o, s:o, s:o, s:o, "
			 "s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}}",
			 "io_threads", zmq_ctx_get(a->ctx, ZMQ_IO_THREADS), "cpu", cpu_json(a),
			 "bytes_received",
			 counter(&a->rx), "wire_bytes_received", counter(&a->wire_rx), "bytes_sent",
			 counter(&a->tx), "wire_bytes_sent", counter(&a->wire_tx), "requests_received",
			 counter(&a->serve.req_rx), "requests_sent", counter(&a->pull.req_tx), "retries",
			 counter(&a->pull.retries), "delta", "encoded",
			 counter(&d->encoded), "encode_bytes", counter(&d->encode_bytes),
			 "encode_cpu_s", seconds(&d->encode_ns), "decoded", counter(&d->decoded),
			 "decode_bytes", counter(&d->decode_bytes), "decode_cpu_s",
			 seconds(&d->decode_ns), "sent", counter(&d->sent), "received",
			 counter(&d->received), "failed", counter(&d->failed), "whole",
			 counter(&d->whole), "ahead_encoded", counter(&d->ahead_encoded),
			 "ahead_hits", counter(&d->ahead_hits), "ahead_cancelled",
			 counter(&d->ahead_cancelled), "forwarded", counter(&d->forwarded), "asked",
			 counter(&d->asked));
}
