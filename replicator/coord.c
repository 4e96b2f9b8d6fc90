/*
 * coord.c — the coordinator (see coord.h): the nodes and the cluster's state,
 * and the loop that serves them.
 *
 * Nodes send HELLO every heartbeat_ms (it is the heartbeat); a node not
 * heard from for node_dead_ms (tunables.h) is not alive.  The first HELLO of
 * a node (also after a coordinator restart) is answered with WELCOME, upon
 * which the node announces every version it holds with its manifest, so a
 * restarted coordinator relearns the cluster from the nodes themselves.  The
 * committed version and the epoch are kept on disk (--state); without it, a
 * restarted coordinator relearns them too, from the last decision each node
 * applied (HELLO "applied"/"epoch"), so it never repeats an epoch.
 *
 * This file holds the have-table (which node holds which version), HELLO,
 * ANNOUNCE, HAVE and status, the state directory, expiry of silent nodes,
 * and coord_run().  Planning is in coord_plan.c, the two-phase commit in
 * coord_commit.c; what they share is in coord_i.h.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "coord_i.h"
#include "names.h"
#include "keys.h"
#include "manifest.h"

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

void coord_send(struct coord *c, const char *node, enum proto_type t, json_t *fields,
		    const void *payload, size_t len)
{
	int r = proto_send(c->sock, node, strlen(node), t, fields, payload, len);

	if (r < 0)
		LOG_WARN("coord: sending %s to %s: %s", proto_type_name(t), node, strerror(-r));
	json_decref(fields);
}

int coord_alive(const struct cnode *n)
{
	return hwfs_mono_s() - n->last_seen < (double)hwfs_tun.node_dead_ms / 1000.0;
}

/* Copy @in to @out (@len bytes) with anything but printable ASCII as '?', for logs. */
static void printable(const char *in, char *out, size_t len)
{
	size_t i;

	for (i = 0; in[i] && i + 1 < len; i++)
		out[i] = in[i] >= 0x20 && in[i] < 0x7f ? in[i] : '?';
	out[i] = '\0';
}

/*
 * refuse() - drop a message of type @t from peer @from because of @why:
 * count it (refused_messages in status --cluster) and log it once per peer
 * and reason (the first 64 such pairs; later ones are only counted, so a
 * flood cannot flood the log).
 */
static void refuse(struct coord *c, const char *from, enum proto_type t, const char *why)
{
	char who[64], key[160];

	c->refused++;
	printable(from, who, sizeof(who));
	snprintf(key, sizeof(key), "%s|%s", who, why);
	for (size_t i = 0; i < c->n_warned; i++)
		if (!strcmp(c->warned[i], key))
			return;
	if (c->n_warned < HWFS_ARRAY_SIZE(c->warned))
		snprintf(c->warned[c->n_warned++], sizeof(c->warned[0]), "%s", key);
	LOG_WARN("coord: dropped %s from peer \"%s\": %s (logged once; every drop is counted in "
		 "refused_messages of status --cluster)",
		 t ? proto_type_name(t) : "a malformed message", who, why);
}

struct cnode *coord_node(struct coord *c, const char *name)
{
	for (size_t i = 0; i < c->n_nodes; i++)
		if (!strcmp(c->nodes[i].name, name))
			return &c->nodes[i];
	return NULL;
}

struct cversion *coord_version(struct coord *c, const char *name)
{
	for (size_t i = 0; i < c->n_vers; i++)
		if (!strcmp(c->vers[i].name, name))
			return &c->vers[i];
	return NULL;
}

int coord_node_has(const struct cnode *n, const struct cversion *v)
{
	json_t *e = json_object_get(n->versions, v->name);

	return e && json_is_true(json_object_get(e, "complete")) &&
	       !strcmp(json_string_value(json_object_get(e, "digest")) ?: "", v->digest);
}

void coord_set_have(struct cnode *n, const char *version, const char *digest, int complete,
		     json_int_t held, json_int_t needed)
{
	json_object_set_new(n->versions, version,
			    json_pack("{s:s, s:b, s:I, s:I}", "digest", digest, "complete", complete,
				      "bytes_held", held, "bytes_needed", needed));
}

/* --------------------------------------------------------------- state dir */

void coord_save_committed(struct coord *c)
{
	char path[4096], tmp[4200];
	FILE *f;

	if (!c->o->state)
		return;
	snprintf(path, sizeof(path), "%s/committed", c->o->state);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f ||
	    fprintf(f, "%s\n%llu\n", c->committed ? c->committed : "",
		    (unsigned long long)c->epoch) < 0 || fflush(f) ||
	    fsync(fileno(f)) || fclose(f) || rename(tmp, path)) {
		LOG_ERR("coord: cannot record the committed version in %s: %s", path,
			strerror(errno));
		return;
	}
}

static void load_committed(struct coord *c)
{
	char path[4096], buf[512];
	FILE *f;

	if (!c->o->state)
		return;
	snprintf(path, sizeof(path), "%s/committed", c->o->state);
	f = fopen(path, "r");
	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f)) {
		buf[strcspn(buf, "\n")] = '\0';
		if (*buf)
			c->committed = strdup(buf);
	}
	if (fgets(buf, sizeof(buf), f)) /* the epoch; absent in older state files */
		c->epoch = strtoull(buf, NULL, 10);
	fclose(f);
}

void coord_cnode_free(struct cnode *n)
{
	free(n->name);
	free(n->addr);
	free(n->key);
	free(n->bound_key);
	free(n->session);
	free(n->current);
	json_decref(n->versions);
	json_decref(n->plans);
	json_decref(n->engines);
}

void coord_cversion_free(struct cversion *v)
{
	free(v->name);
	free(v->manifest);
	free(v->origin);
	hwfs_vrec_free(v->rec);
	json_decref(v->affinity);
}

/*
 * expire() - forget every node silent for node_dead_ms + node_expiry_s (it
 * left, or died for good), then every version no remaining node holds
 * complete: they leave status --cluster and the planner.  A forgotten node
 * that comes back joins as a new one and announces what it holds again.
 */
static void expire(struct coord *c)
{
	double now = hwfs_mono_s();
	double limit = (double)hwfs_tun.node_dead_ms / 1000.0 + (double)hwfs_tun.node_expiry_s;
	size_t before = c->n_nodes;

	for (size_t i = 0; i < c->n_nodes;) {
		struct cnode *n = &c->nodes[i];

		if (now - n->last_seen < limit) {
			i++;
			continue;
		}
		LOG_WARN("coord: node %s silent for %.0f s (node_expiry_s=%llu): forgotten", n->name,
			 now - n->last_seen, (unsigned long long)hwfs_tun.node_expiry_s);
		coord_cnode_free(n);
		memmove(n, n + 1, (c->n_nodes - i - 1) * sizeof(*n));
		c->n_nodes--;
	}
	for (size_t k = 0; c->n_nodes < before && k < c->n_vers;) {
		struct cversion *v = &c->vers[k];
		int held = 0;

		for (size_t i = 0; i < c->n_nodes && !held; i++)
			held = coord_node_has(&c->nodes[i], v);
		if (held) {
			k++;
			continue;
		}
		LOG_WARN("coord: %s forgotten: no node holds it complete any more (its holders left "
			 "more than node_expiry_s ago)", v->name);
		for (size_t i = 0; i < c->n_nodes; i++) /* pulls of it lost their donors */
			json_object_del(c->nodes[i].versions, v->name);
		coord_cversion_free(v);
		memmove(v, v + 1, (c->n_vers - k - 1) * sizeof(*v));
		c->n_vers--;
	}
}

/* --------------------------------------------------------------- messages */

/* {"committed": V|null, "epoch": N}: the cluster's last commit decision. */
static json_t *committed_fields(const struct coord *c)
{
	return json_pack("{s:o, s:I}", "committed",
			 c->committed ? json_string(c->committed) : json_null(), "epoch",
			 (json_int_t)c->epoch);
}

/*
 * forget_removed() - @vers is the list of versions node @n holds (its
 * HELLO): a version the have-table has as complete there and the list
 * lacks was removed on the node (hwfs rm), so neither the planner (a donor,
 * a delta base) nor commit counts on it there any more.  Linear in the
 * versions: the list's names go into a set first (a HELLO comes from every
 * node every heartbeat).
 */
static void forget_removed(struct cnode *n, json_t *vers)
{
	json_t *listed = json_object(), *e, *x;
	const char *name;
	void *tmp;
	size_t i;

	if (!listed)
		return;
	json_array_foreach(vers, i, x)
		json_object_set(listed, json_string_value(json_object_get(x, "name")), json_true());
	json_object_foreach_safe(n->versions, tmp, name, e)
		if (json_is_true(json_object_get(e, "complete")) && !json_object_get(listed, name))
			json_object_del(n->versions, name); /* (one being pulled is not listed yet) */
	json_decref(listed);
}

/*
 * learn_decision() - the last cluster decision node @from applied (its
 * HELLO's "applied" and "epoch"), when it is newer than the coordinator's
 * own: a coordinator restarted without --state (or with an older one) takes
 * the newest decision any node reports, so `status --cluster` shows the
 * committed version and the next decision gets an epoch above every one a
 * node has seen: no (version, epoch) pair is ever decided twice.  An epoch
 * equal to the coordinator's fills in a committed version it does not know.
 */
static void learn_decision(struct coord *c, const char *from, struct proto_msg *m)
{
	const char *v = proto_str(m, "applied");
	uint64_t epoch = proto_int(m, "epoch");
	char *dup;

	if (!proto_version_name_ok(v) || !json_object_get(m->h, "epoch") || epoch >= PROTO_MAX_INT)
		return;
	if (epoch < c->epoch || (epoch == c->epoch && c->committed))
		return;
	dup = strdup(v);
	if (!dup)
		return; /* learnt from the next heartbeat */
	LOG_INFO("coord: %s reports the cluster's decision %s (epoch %llu): committed %s -> %s",
		 from, v, (unsigned long long)epoch, c->committed ? c->committed : "(none)", v);
	free(c->committed);
	c->committed = dup;
	c->epoch = epoch;
	coord_save_committed(c);
}

static void on_hello(struct coord *c, const char *from, struct proto_msg *m)
{
	struct cnode *n = coord_node(c, from);
	json_t *vers = json_object_get(m->h, "versions"), *e;
	const char *session = proto_str(m, "session");
	/*
	 * A new node, one that was dead (even if some other message of it came
	 * first), or one that restarted (new session): welcome it.
	 */
	int fresh = !n || !coord_alive(n) || n->welcome_due ||
		    (session && (!n->session || strcmp(session, n->session)));
	size_t i;

	if (strcmp(from, proto_str(m, "node"))) {
		refuse(c, from, P_HELLO, "its HELLO claims another node name than its routing id");
		return;
	}
	if (hwfs_has_controls(from)) { /* it would reach the terminals of status and commit */
		refuse(c, from, P_HELLO, "its node name holds control characters");
		return;
	}
	if (c->keys) { /* a name is bound to the key it joined with; a key to one live name */
		if (!*m->user_id) {
			refuse(c, from, P_HELLO, "no authenticated key");
			return;
		}
		if (n && n->bound_key && strcmp(n->bound_key, m->user_id)) {
			refuse(c, from, P_HELLO, "the name is bound to another key");
			return;
		}
		for (i = 0; i < c->n_nodes; i++)
			if (&c->nodes[i] != n && coord_alive(&c->nodes[i]) && c->nodes[i].bound_key &&
			    !strcmp(c->nodes[i].bound_key, m->user_id)) {
				refuse(c, from, P_HELLO, "its key is bound to another live node");
				return;
			}
	}
	if (!n) {
		struct cnode *nn = c->n_nodes < MAX_NODES
					   ? realloc(c->nodes, (c->n_nodes + 1) * sizeof(*nn))
					   : NULL;

		if (!nn)
			return;
		c->nodes = nn;
		n = &c->nodes[c->n_nodes++];
		memset(n, 0, sizeof(*n));
		n->name = strdup(from);
		n->bound_key = c->keys ? strdup(m->user_id) : NULL;
		n->versions = json_object();
		n->join_seq = ++c->join_seq;
		LOG_INFO("coord: node %s joined (%s)", from, proto_str(m, "listen"));
	}
	free(n->addr);
	n->addr = strdup(proto_str(m, "listen"));
	free(n->key);
	/* with CURVE, pullers get the key the node authenticated with, not what it claims */
	n->key = c->keys ? strdup(m->user_id)
			 : proto_str(m, "key") ? strdup(proto_str(m, "key")) : NULL;
	if (session && (!n->session || strcmp(session, n->session))) {
		free(n->session);
		n->session = strdup(session);
		plan_forget_pulls(c, n); /* gone with the old incarnation */
	}
	n->last_seen = hwfs_mono_s();
	n->welcome_due = 0;
	{ /* a name that is not a version name is shown as none */
		const char *cur = proto_str(m, "current");
		char *was = n->current;

		n->current = cur && hwfs_valid_name(cur) ? strdup(cur) : NULL;
		if (!was != !n->current || (was && n->current && strcmp(was, n->current)))
			c->status_at = 0; /* the status and /metrics show it at the next pass */
		free(was);
	}
	n->wire_rx = proto_int(m, "wire_bytes_received"); /* 0 from an older node */
	n->wire_tx = proto_int(m, "wire_bytes_sent");
	json_decref(n->engines); /* a node that sends none (an older one) shows none */
	n->engines = json_is_array(json_object_get(m->h, "engines"))
			     ? proto_hello_engines(json_object_get(m->h, "engines"))
			     : NULL;
	json_array_foreach(vers, i, e) {
		const char *vn = json_string_value(json_object_get(e, "name"));
		struct cversion *v = coord_version(c, vn);
		json_t *old = json_object_get(n->versions, vn);

		if (old && !json_is_true(json_object_get(old, "complete")))
			continue; /* being pulled: HAVE reports progress */
		coord_set_have(n, vn, json_string_value(json_object_get(e, "digest")),
			 json_is_true(json_object_get(e, "complete")),
			 v ? (json_int_t)v->bytes : 0, 0);
	}
	forget_removed(n, vers);
	learn_decision(c, from, m);
	if (!fresh) { /* heartbeat answered; the decision is repeated for nodes that missed it */
		coord_send(c, from, P_PONG, committed_fields(c), NULL, 0);
		return;
	}
	e = committed_fields(c);
	json_object_set_new(e, "coordinator", json_string(c->endpoint));
	coord_send(c, from, P_WELCOME, e, NULL, 0);
	plan_for(c, n);
	plan_rejoined(c, n);
}

/*
 * check_manifest() - does the manifest of an ANNOUNCE describe version @name
 * with digest @digest?  Returns 0 with its shard bytes in *@bytes, or -EINVAL
 * with the reason logged: a node would refuse such a plan, and the first
 * announcer of a name must not poison it for everyone.
 */
static int check_manifest(const char *from, const char *name, const char *digest,
			  const struct proto_msg *m, uint64_t *bytes)
{
	struct hwfs_vrec *rec = NULL;
	char err[256], hex[HWFS_HASH_HEX];
	hwfs_hash_t d;
	int r = -EINVAL;

	if (manifest_parse(m->payload, m->payload_len, &rec, err, sizeof(err)) < 0) {
		LOG_ERR("coord: %s announced %s with a bad manifest: %s", from, name, err);
		return r;
	}
	if (strcmp(rec->name, name)) {
		LOG_ERR("coord: %s announced %s with the manifest of %s; ignored", from, name,
			rec->name);
	} else if (manifest_digest(rec, &d) < 0 || (hwfs_hash_hex(&d, hex), strcmp(hex, digest))) {
		LOG_ERR("coord: %s announced %s with digest %s, but its manifest's is %s; ignored",
			from, name, digest, hex);
	} else {
		*bytes = manifest_shard_bytes(rec);
		r = 0;
	}
	hwfs_vrec_free(rec);
	return r;
}

static void on_announce(struct coord *c, const char *from, struct proto_msg *m)
{
	const char *name = proto_str(m, "version"), *digest = proto_str(m, "digest");
	struct cnode *n = coord_node(c, from);
	struct cversion *v = coord_version(c, name), *nv;
	uint64_t bytes = 0;

	if (!n)
		return;
	if (v) { /* a known version announced again: a receiver finished, or a node rejoined */
		if (strcmp(v->digest, digest)) {
			LOG_ERR("coord: %s announced %s with digest %s, but the cluster has %s; "
				"ignored", from, name, digest, v->digest);
			return;
		}
		coord_set_have(n, name, digest, 1, (json_int_t)v->bytes, 0);
		return;
	}
	if (check_manifest(from, name, digest, m, &bytes) < 0)
		return;
	nv = realloc(c->vers, (c->n_vers + 1) * sizeof(*nv));
	if (!nv)
		return;
	c->vers = nv;
	v = &c->vers[c->n_vers];
	memset(v, 0, sizeof(*v));
	v->name = strdup(name);
	v->manifest = malloc(m->payload_len ? m->payload_len : 1);
	v->origin = strdup(from);
	if (!v->name || !v->manifest || !v->origin) {
		free(v->name);
		free(v->manifest);
		free(v->origin);
		return;
	}
	c->n_vers++;
	v->announced = hwfs_mono_s();
	v->converge_s = -1;
	snprintf(v->digest, sizeof(v->digest), "%s", digest);
	memcpy(v->manifest, m->payload, m->payload_len);
	v->mlen = m->payload_len;
	v->bytes = bytes;
	coord_set_have(n, name, digest, 1, (json_int_t)v->bytes, 0);
	LOG_INFO("coord: %s announced %s", from, name);
	plan_all(c, v);
}

static void on_have(struct coord *c, const char *from, struct proto_msg *m)
{
	struct cnode *n = coord_node(c, from), *bad;
	const char *bad_donor = proto_str(m, "bad_donor");

	if (bad_donor && (bad = coord_node(c, bad_donor))) {
		bad->bad_shards++;
		LOG_ERR("coord: %s received a corrupt shard of %s from %s", from,
			proto_str(m, "version"), bad_donor);
	}

	if (n) {
		coord_set_have(n, proto_str(m, "version"), proto_str(m, "digest"),
			 proto_bool(m, "complete"), (json_int_t)proto_int(m, "bytes_held"),
			 (json_int_t)proto_int(m, "bytes_needed"));
		if (proto_str(m, "waiting")) /* why it does not move, for status --cluster */
			json_object_set_new(json_object_get(n->versions, proto_str(m, "version")),
					    "waiting", json_string(proto_str(m, "waiting")));
	}
}

static void on_status(struct coord *c, const char *from, struct proto_msg *m)
{
	coord_send(c, from, P_STATUS_RES,
		   json_pack("{s:I, s:o}", "req", (json_int_t)proto_int(m, "req"), "cluster",
			     coord_status_json(c) ?: json_object()),
		   NULL, 0);
}

static void handle(struct coord *c)
{
	for (int k = 0; k < 1024; k++) {
		char ident[256], err[256];
		size_t ident_len = sizeof(ident) - 1;
		struct proto_msg m;
		int r = proto_recv(c->sock, ident, &ident_len, 1, &m, err, sizeof(err));

		if (r == -EAGAIN)
			return;
		if (r < 0) {
			if (r == -EBADMSG) { /* (a peer of another protocol version, too) */
				ident[HWFS_MIN(ident_len, sizeof(ident) - 1)] = '\0';
				refuse(c, ident, 0, err);
				continue;
			}
			return;
		}
		ident[ident_len] = '\0';
		if (strlen(ident) != ident_len || !*ident) {
			refuse(c, "(unnamed)", m.type, "no routing id: not an hwfs node");
			proto_msg_clear(&m);
			continue;
		}
		/*
		 * Only joined nodes are heard: a routing id that completed HELLO
		 * and, with keys, speaks with the key it joined with.  HELLO
		 * refreshes liveness itself, after deciding whether it is a rejoin.
		 */
		if (m.type != P_HELLO) {
			struct cnode *n = coord_node(c, ident);

			if (!n || (c->keys && (!n->bound_key || strcmp(n->bound_key, m.user_id)))) {
				refuse(c, ident, m.type,
				       n ? "sent with another key than the node joined with"
					 : "not joined (no HELLO accepted from it)");
				proto_msg_clear(&m);
				continue;
			}
			n->last_seen = hwfs_mono_s();
		}
		switch (m.type) {
		case P_HELLO:
			on_hello(c, ident, &m);
			break;
		case P_ANNOUNCE:
			on_announce(c, ident, &m);
			break;
		case P_HAVE:
			on_have(c, ident, &m);
			break;
		case P_COMMIT_REQ:
			commit_on_req(c, ident, &m);
			break;
		case P_READY:
			commit_on_ready(c, ident, &m);
			break;
		case P_ACK:
			commit_on_ack(c, ident, &m);
			break;
		case P_STATUS_REQ:
			on_status(c, ident, &m);
			break;
		case P_PING:
			break;
		default:
			LOG_WARN("coord: unexpected %s from %s", proto_type_name(m.type), ident);
		}
		proto_msg_clear(&m);
	}
}

/* Where the planner's plans go here: a PLAN to the node, with the version's manifest. */
static void plan_send_msg(struct coord *c, struct cnode *to, struct cversion *v, json_t *fields)
{
	coord_send(c, to->name, P_PLAN, fields, v->manifest, v->mlen);
}

int coord_run(const struct coord_opts *o)
{
	struct coord c = {.o = o, .commits = json_array(), .plan_out = plan_send_msg};
	struct sigaction sa = {.sa_handler = on_signal};
	int linger = 0, r = 0, mandatory = 0;
	char msg[512];

	if (o->state && mkdir(o->state, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		snprintf(msg, sizeof(msg), "error: state dir %s: %s\n", o->state, strerror(errno));
		goto fail;
	}
	load_committed(&c);
	c.ctx = zmq_ctx_new();
	c.sock = c.ctx ? zmq_socket(c.ctx, ZMQ_ROUTER) : NULL;
	if (!c.sock) {
		r = -EIO;
		snprintf(msg, sizeof(msg), "error: cannot create a socket\n");
		goto fail;
	}
	zmq_setsockopt(c.sock, ZMQ_LINGER, &linger, sizeof(linger));
	zmq_setsockopt(c.sock, ZMQ_ROUTER_MANDATORY, &mandatory, sizeof(mandatory));
	if (o->keys) {
		r = keys_load(o->keys, &c.keys);
		if (r == 0)
			r = keys_start_zap(c.keys, c.ctx);
		if (r == 0)
			r = keys_server(c.keys, c.sock);
		if (r < 0) {
			snprintf(msg, sizeof(msg), "error: keys %s: %s\n", o->keys, strerror(-r));
			goto fail;
		}
	}
	if (zmq_bind(c.sock, o->listen) < 0) {
		r = -errno;
		snprintf(msg, sizeof(msg), "error: cannot listen on %s: %s\n", o->listen,
			 zmq_strerror(errno));
		goto fail;
	}
	{
		size_t len = sizeof(c.endpoint);

		if (zmq_getsockopt(c.sock, ZMQ_LAST_ENDPOINT, c.endpoint, &len) < 0)
			snprintf(c.endpoint, sizeof(c.endpoint), "%s", o->listen);
		if (o->bound)
			snprintf(o->bound, o->bound_len, "%s", c.endpoint);
	}
	if (!o->stop) {
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
		signal(SIGPIPE, SIG_IGN);
	}
	LOG_INFO("coord: listening on %s (committed: %s)", c.endpoint,
		 c.committed ? c.committed : "none");
	if (o->notify_fd >= 0) {
		if (write(o->notify_fd, "ok\n", 3) < 0)
			LOG_WARN("coord: cannot notify the starting process");
		close(o->notify_fd);
	}
	/* the host's thread writes *o->stop: an atomic read (coord.h) */
	while (!(o->stop ? __atomic_load_n(o->stop, __ATOMIC_ACQUIRE) : stop_flag)) {
		zmq_pollitem_t it = {c.sock, 0, ZMQ_POLLIN, 0};

		if (zmq_poll(&it, 1, TICK_MS) < 0 && errno != EINTR)
			break;
		handle(&c);
		commit_tick(&c);
		plan_deaths(&c);
		expire(&c);
		coord_converge_check(&c);
		coord_status_tick(&c);
	}
	LOG_INFO("coord: stopped");
	goto out;
fail:
	LOG_ERR("%.*s", (int)strcspn(msg, "\n"), msg);
	if (o->notify_fd >= 0) {
		if (write(o->notify_fd, msg, strlen(msg)) < 0)
			LOG_WARN("coord: cannot notify the starting process");
		close(o->notify_fd);
	}
out:
	if (c.sock)
		zmq_close(c.sock);
	keys_free(c.keys);
	if (c.ctx)
		zmq_ctx_term(c.ctx);
	for (size_t i = 0; i < c.n_nodes; i++)
		coord_cnode_free(&c.nodes[i]);
	free(c.nodes);
	for (size_t i = 0; i < c.n_vers; i++)
		coord_cversion_free(&c.vers[i]);
	free(c.vers);
	free(c.committed);
	json_decref(c.commits);
	if (c.tx.active)
		commit_tx_free(&c.tx);
	return r;
}
