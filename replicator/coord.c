/*
 * coord.c — the coordinator: have-table, planner, two-phase commit.
 *
 * Nodes send HELLO every heartbeat_ms (it is the heartbeat); a node not
 * heard from for node_dead_ms (tunables.h) is not alive.  The first HELLO of
 * a node (also after a coordinator restart) is answered with WELCOME, upon
 * which the node announces every version it holds with its manifest, so a
 * restarted coordinator relearns the cluster from the nodes themselves; only
 * the committed version is kept on disk (--state), which is what prevents a
 * restart from forgetting a commit.
 *
 * Planning is deterministic: when a version is announced, the alive nodes
 * that lack it, in join order, are its receivers.  chain: receiver i pulls
 * from receiver i-1 (the first from the announcer), with the announcer as
 * fallback; star: everyone pulls from the announcer.  A node that asks later
 * (late join) gets every complete holder as donor.
 *
 * Commit: PREPARE to every alive node; all READY within the deadline ->
 * COMMIT to all, committed recorded once every node ACKed; any refusal or the
 * deadline -> ABORT to all, nobody flips.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zmq.h>

#include "coord.h"
#include "metrics.h"
#include "delta_base.h"
#include "engines.h"
#include "keys.h"
#include "manifest.h"
#include "proto.h"
#include "tunables.h"

/* policy (node_dead_ms, node_expiry_s) is in the tunables table; these are not policy */
#define MAX_NODES 1024             /* a memory bound of the have-table (protocol limit) */
#define TICK_MS 100                /* longest poll: how late a deadline or a death is noticed */
#define MIN_COMMIT_DEADLINE_MS 100 /* a COMMIT_REQ.deadline_ms below this is raised to it */
#define MAX_COMMIT_DEADLINE_MS 3600000 /* and one above (the tunable's own bound) cut to it */
#define MAX_NODE_ENGINES 64        /* engines of one node kept from its HELLO (a memory bound) */
#define MAX_NODE_REASON 1024       /* bytes of a node's READY or ACK reason kept (longer: cut) */
#define MAX_VERSION_NAME 255       /* longest version name (ns_tree.c, valid_name) */
#define PICK_BASE_CANDIDATES 8     /* newest held versions pick_base() compares */

struct cnode {
	char *name;
	char *addr;
	char *key; /* its public key, with CURVE (what its pullers are told) */
	char *bound_key; /* with CURVE: the authenticated key it joined with; its name is bound to it */
	double last_seen;
	int was_alive;      /* for noticing deaths */
	int welcome_due;    /* it died: its next HELLO is a rejoin, whatever it sent before */
	char *session;      /* the agent incarnation (HELLO.session): a new one is a rejoin */
	uint64_t bad_shards; /* reported by its pullers */
	uint64_t join_seq;
	json_t *versions; /* name -> {digest, complete, bytes_held, bytes_needed} */
	json_t *engines;  /* its engines as of its last HELLO (checked: engines_from_hello) */
	uint64_t wire_rx, wire_tx; /* its replication wire bytes, as of its last HELLO */
};

struct cversion {
	char *name;
	char digest[HWFS_HASH_HEX];
	void *manifest;
	size_t mlen;
	char *origin;
	uint64_t bytes; /* distinct shard bytes: what a complete holder holds */
	struct hwfs_vrec *rec; /* the manifest parsed, once a plan needed it (pick_base) */
	json_t *affinity;      /* digest of another version -> bytes of this one with a base there */
	double announced;      /* first ANNOUNCE (monotonic s) */
	double converge_s;     /* announce -> complete on every live node; < 0: not yet */
};

struct tx {
	int active;
	uint64_t txid;
	char *version;
	char requester[256];
	uint64_t req;
	int phase; /* 1 prepare, 2 commit */
	json_t *pending; /* node names still to answer (at the end: the unknown ones) */
	json_t *nodes;   /* the participants */
	json_t *done;    /* nodes that ACKed the flip */
	json_t *failed;  /* node -> reason: refused READY, or ACKed a failed flip */
	double deadline;
	double started;  /* the COMMIT_REQ (monotonic s) */
	json_t *ready_s; /* node -> seconds from the request to its READY */
};

struct coord {
	const struct coord_opts *o;
	char endpoint[256]; /* what we listen on; a :* port resolved (ZMQ_LAST_ENDPOINT) */
	void *ctx, *sock;
	struct keys *keys;
	struct cnode *nodes;
	size_t n_nodes;
	uint64_t join_seq;
	struct cversion *vers;
	size_t n_vers;
	char *committed;
	uint64_t epoch; /* commit decisions so far (with --state, across restarts) */
	struct tx tx;
	uint64_t next_txid;
	uint64_t refused;     /* messages dropped from peers that are not joined nodes */
	char warned[64][160]; /* "peer|reason" already logged (refuse()) */
	size_t n_warned;
	json_t *commits;  /* the last COORD_HISTORY commits, oldest first (status) */
	double status_at; /* next coord_opts.status call (monotonic s) */
};

#define COORD_HISTORY 20 /* commits and versions the status keeps */

static volatile sig_atomic_t stop_flag;

static void on_signal(int sig)
{
	(void)sig;
	stop_flag = 1;
}

static void send_to(struct coord *c, const char *node, enum proto_type t, json_t *fields,
		    const void *payload, size_t len)
{
	int r = proto_send(c->sock, node, strlen(node), t, fields, payload, len);

	if (r < 0)
		LOG_WARN("coord: sending %s to %s: %s", proto_type_name(t), node, strerror(-r));
	json_decref(fields);
}

static int alive(const struct cnode *n)
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
 * Does @s hold a control character a terminal may obey: C0, DEL, or C1
 * (U+0080-U+009F, 0xC2 0x80-0x9F in UTF-8)?  Returns 1 or 0.
 */
static int has_controls(const char *s)
{
	for (const unsigned char *p = (const unsigned char *)s; *p; p++)
		if (*p < 0x20 || *p == 0x7f || (p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F))
			return 1;
	return 0;
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

static struct cnode *node_find(struct coord *c, const char *name)
{
	for (size_t i = 0; i < c->n_nodes; i++)
		if (!strcmp(c->nodes[i].name, name))
			return &c->nodes[i];
	return NULL;
}

static struct cversion *version_find(struct coord *c, const char *name)
{
	for (size_t i = 0; i < c->n_vers; i++)
		if (!strcmp(c->vers[i].name, name))
			return &c->vers[i];
	return NULL;
}

static int node_has(const struct cnode *n, const struct cversion *v)
{
	json_t *e = json_object_get(n->versions, v->name);

	return e && json_is_true(json_object_get(e, "complete")) &&
	       !strcmp(json_string_value(json_object_get(e, "digest")) ?: "", v->digest);
}

static void set_have(struct cnode *n, const char *version, const char *digest, int complete,
		     json_int_t held, json_int_t needed)
{
	json_object_set_new(n->versions, version,
			    json_pack("{s:s, s:b, s:I, s:I}", "digest", digest, "complete", complete,
				      "bytes_held", held, "bytes_needed", needed));
}

/* --------------------------------------------------------------- state dir */

static void save_committed(struct coord *c)
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

static void cnode_free(struct cnode *n)
{
	free(n->name);
	free(n->addr);
	free(n->key);
	free(n->bound_key);
	free(n->session);
	json_decref(n->versions);
	json_decref(n->engines);
}

static void cversion_free(struct cversion *v)
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
		cnode_free(n);
		memmove(n, n + 1, (c->n_nodes - i - 1) * sizeof(*n));
		c->n_nodes--;
	}
	for (size_t k = 0; c->n_nodes < before && k < c->n_vers;) {
		struct cversion *v = &c->vers[k];
		int held = 0;

		for (size_t i = 0; i < c->n_nodes && !held; i++)
			held = node_has(&c->nodes[i], v);
		if (held) {
			k++;
			continue;
		}
		LOG_WARN("coord: %s forgotten: no node holds it complete any more (its holders left "
			 "more than node_expiry_s ago)", v->name);
		for (size_t i = 0; i < c->n_nodes; i++) /* pulls of it lost their donors */
			json_object_del(c->nodes[i].versions, v->name);
		cversion_free(v);
		memmove(v, v + 1, (c->n_vers - k - 1) * sizeof(*v));
		c->n_vers--;
	}
}

/* --------------------------------------------------------------- planning */

static json_t *donor(const struct cnode *n)
{
	json_t *d = json_pack("{s:s, s:s}", "node", n->name, "addr", n->addr);

	if (n->key) /* the puller needs it to reach the donor over CURVE */
		json_object_set_new(d, "key", json_string(n->key));
	return d;
}

static int cmp_join(const void *x, const void *y)
{
	const struct cnode *a = *(struct cnode *const *)x, *b = *(struct cnode *const *)y;

	return a->join_seq < b->join_seq ? -1 : a->join_seq > b->join_seq;
}

/* Does every node of the first @upto entries of @donors (PLAN donor entries) hold @b complete? */
static int donors_have(struct coord *c, json_t *donors, const struct cversion *b, size_t upto)
{
	size_t i;
	json_t *d;

	json_array_foreach(donors, i, d) {
		struct cnode *n = node_find(c, json_string_value(json_object_get(d, "node")));

		if (i >= upto)
			break;
		if (!n || !node_has(n, b))
			return 0;
	}
	return 1;
}

/* @v's manifest, parsed once (NULL if it does not parse: it did when announced). */
static const struct hwfs_vrec *cversion_rec(struct cversion *v)
{
	char err[128];

	if (!v->rec && manifest_parse(v->manifest, v->mlen, &v->rec, err, sizeof(err)) < 0)
		v->rec = NULL;
	return v->rec;
}

/*
 * affinity() - how many shard bytes of @v have a base in @b by the rule of
 * delta_base.h (same file, tensor name, dtype, length): 0 for versions of
 * another model.  Computed once per pair and kept in @v.
 */
static uint64_t affinity(struct cversion *v, struct cversion *b)
{
	const struct hwfs_vrec *vr = cversion_rec(v), *br = cversion_rec(b);
	json_t *known = v->affinity ? json_object_get(v->affinity, b->digest) : NULL;
	struct delta_bases *idx = NULL;
	uint64_t bytes = 0;

	if (known)
		return (uint64_t)json_integer_value(known);
	if (vr && br && delta_bases_new(br, &idx) == 0) {
		for (size_t i = 0; i < vr->n_files; i++)
			for (size_t j = 0; j < vr->files[i].n_ext; j++) {
				unsigned width;

				if (delta_base_of(idx, &vr->files[i], &vr->files[i].ext[j], &width, NULL))
					bytes += vr->files[i].ext[j].len;
			}
		delta_bases_free(idx);
	}
	if (!v->affinity)
		v->affinity = json_object();
	json_object_set_new(v->affinity, b->digest, json_integer((json_int_t)bytes));
	return bytes;
}

/*
 * pick_base() - the version @to should take deltas against when it pulls @v
 * from @donors (docs/delta.md, "Which base"): among the newest
 * PICK_BASE_CANDIDATES versions other than @v, in the order the cluster first
 * heard of them, that @to holds complete and every donor holds too (failing
 * any, that @to and its first donor hold), the one in which most of @v's
 * bytes have a base (affinity(); the newest of equals).  A version of
 * another model has none and is never picked.  Only the have-table and the
 * manifests decide, so a planner picks the same base for the same holdings.
 * NULL: none (whole shards), or deltas off.
 */
static const char *pick_base(struct coord *c, struct cversion *v, struct cnode *to,
			     json_t *donors)
{
	size_t nd = json_array_size(donors);

	if (!hwfs_tun.delta || nd == 0)
		return NULL;
	for (int pass = 0; pass < 2; pass++) {
		struct cversion *best = NULL;
		uint64_t best_bytes = 0;
		size_t seen = 0;

		for (size_t k = c->n_vers; k-- > 0 && seen < PICK_BASE_CANDIDATES;) {
			struct cversion *b = &c->vers[k];
			uint64_t bytes;

			if (b == v || !node_has(to, b) || !donors_have(c, donors, b, pass ? 1 : nd))
				continue;
			seen++;
			bytes = affinity(v, b);
			if (bytes > best_bytes) {
				best = b;
				best_bytes = bytes;
			}
		}
		if (best)
			return best->name;
	}
	return NULL;
}

/*
 * @stripe: every donor is complete, so the receiver spreads its requests over
 * all of them (late join); otherwise it asks the first and falls back in order.
 * The plan names the base pick_base() chose for @to.
 */
static void send_plan(struct coord *c, struct cnode *to, struct cversion *v, json_t *donors,
		      int stripe)
{
	const char *base = pick_base(c, v, to, donors);
	json_t *f = json_pack("{s:s, s:s, s:o, s:b}", "version", v->name, "digest", v->digest,
			      "donors", donors, "stripe", stripe);

	if (f && base)
		json_object_set_new(f, "base", json_string(base));
	send_to(c, to->name, P_PLAN, f, v->manifest, v->mlen);
}

/*
 * Plan @v for every alive node that lacks it: receivers in join order form a
 * tree of the configured fan-out under the announcer (position 0); position p
 * pulls from position (p-1)/K, with the announcer as fallback.
 */
static void plan_all(struct coord *c, struct cversion *v)
{
	struct cnode *pos[MAX_NODES + 1], *origin = node_find(c, v->origin);
	unsigned k = c->o->fanout;
	size_t n = 0;

	if (!origin || !node_has(origin, v)) { /* announcer gone: any holder leads */
		origin = NULL;
		for (size_t i = 0; i < c->n_nodes && !origin; i++)
			if (alive(&c->nodes[i]) && node_has(&c->nodes[i], v))
				origin = &c->nodes[i];
	}
	if (!origin)
		return;
	pos[0] = origin;
	for (size_t i = 0; i < c->n_nodes && n < MAX_NODES; i++)
		if (alive(&c->nodes[i]) && !node_has(&c->nodes[i], v))
			pos[1 + n++] = &c->nodes[i];
	qsort(pos + 1, n, sizeof(*pos), cmp_join);
	for (size_t p = 1; p <= n; p++) {
		struct cnode *parent = k ? pos[(p - 1) / k] : origin;
		json_t *donors = json_array();

		json_array_append_new(donors, donor(parent));
		if (parent != origin)
			json_array_append_new(donors, donor(origin));
		send_plan(c, pos[p], v, donors, 0);
		set_have(pos[p], v->name, v->digest, 0, 0, 0);
	}
	if (n)
		LOG_INFO("coord: %s planned for %zu node(s), fan-out %u from %s", v->name, n, k,
			 origin->name);
}

/* A node that (re)joined: plan every version it lacks, donors = all holders. */
static void plan_for(struct coord *c, struct cnode *to)
{
	for (size_t k = 0; k < c->n_vers; k++) {
		struct cversion *v = &c->vers[k];
		json_t *donors;

		if (node_has(to, v))
			continue;
		donors = json_array();
		for (size_t i = 0; i < c->n_nodes; i++)
			if (&c->nodes[i] != to && alive(&c->nodes[i]) && node_has(&c->nodes[i], v))
				json_array_append_new(donors, donor(&c->nodes[i]));
		if (json_array_size(donors) == 0) {
			json_decref(donors);
			continue;
		}
		send_plan(c, to, v, donors, 1);
		set_have(to, v->name, v->digest, 0, 0, 0);
	}
}

/* Forget the versions @n was still pulling: they are re-planned from scratch. */
static void forget_pulls(struct coord *c, struct cnode *n)
{
	for (size_t k = 0; k < c->n_vers; k++) {
		json_t *e = json_object_get(n->versions, c->vers[k].name);

		if (e && !json_is_true(json_object_get(e, "complete")))
			json_object_del(n->versions, c->vers[k].name);
	}
}

/*
 * A node that stopped answering: every node still pulling a version gets a
 * new plan from the complete holders that are alive, so nobody waits on a
 * dead donor.  (A puller also gives up on a silent donor by itself.)
 */
static void deaths(struct coord *c)
{
	int died = 0;

	for (size_t i = 0; i < c->n_nodes; i++) {
		int a = alive(&c->nodes[i]);

		if (c->nodes[i].was_alive && !a) {
			LOG_WARN("coord: node %s stopped answering", c->nodes[i].name);
			c->nodes[i].welcome_due = 1;
			died = 1;
		}
		c->nodes[i].was_alive = a;
	}
	if (!died)
		return;
	for (size_t i = 0; i < c->n_nodes; i++) {
		struct cnode *n = &c->nodes[i];

		if (!alive(n))
			continue;
		forget_pulls(c, n);
		plan_for(c, n); /* donors: the alive complete holders, striped */
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
 * replan_pullers_of() - @holder (re)joined holding versions: every other
 * alive node still pulling one of them gets a new plan with all alive
 * complete holders as donors, so nobody waits for its own donor-failure
 * timers to find a restarted publisher again.
 */
static void replan_pullers_of(struct coord *c, struct cnode *holder)
{
	for (size_t i = 0; i < c->n_nodes; i++) {
		struct cnode *o = &c->nodes[i];
		int pulling = 0;

		if (o == holder || !alive(o))
			continue;
		for (size_t k = 0; k < c->n_vers && !pulling; k++) {
			json_t *e = json_object_get(o->versions, c->vers[k].name);

			pulling = e && !json_is_true(json_object_get(e, "complete")) &&
				  node_has(holder, &c->vers[k]);
		}
		if (pulling) {
			LOG_INFO("coord: %s is back: re-planning %s, which pulls what it holds",
				 holder->name, o->name);
			plan_for(c, o);
		}
	}
}

/* @v if it is a plausible version name (1-255 bytes, no control character), else NULL. */
static const char *version_or_null(json_t *v)
{
	const char *s = json_string_value(v);
	size_t n = s ? strlen(s) : 0;

	return n < 1 || n > MAX_VERSION_NAME || has_controls(s) ? NULL : s;
}

/*
 * A reason a node sent (READY, ACK) as the coordinator keeps and repeats it
 * to `hwfs commit`: control characters blanked and at most MAX_NODE_REASON
 * bytes (engines_clean_text), @def when there is none.  A remote node must
 * not reach the requester's terminal.  Returns a new JSON string, NULL
 * without memory.
 */
static json_t *node_reason(struct proto_msg *m, const char *def)
{
	const char *why = proto_str(m, "reason");
	char *c = engines_clean_text(why ? why : def, MAX_NODE_REASON);
	json_t *j = c ? json_string(c) : NULL;

	free(c);
	return j;
}

/* @v as a JSON integer if it is one in [0, PROTO_MAX_INT], else JSON null. */
static json_t *count_or_null(json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0 &&
			       (uint64_t)json_integer_value(v) <= PROTO_MAX_INT
		       ? json_integer(json_integer_value(v))
		       : json_null();
}

/*
 * engines_from_hello() - the engines a node reports in its HELLO (its
 * `hwfs status` "engines"), as the coordinator keeps and shows them: at most
 * MAX_NODE_ENGINES entries; an entry without a valid engine name is left out;
 * any other field that is not what it should be (an unknown state,
 * a version name that cannot be one, a reason over ENGINE_REASON_MAX bytes, a
 * negative or huge number) becomes null; control characters of a reason are
 * blanked (engines_clean_text).  A node is trusted with its own engines, not
 * with the coordinator's memory, the shape of its answers or the terminal of
 * whoever runs `hwfs status --cluster`.
 * Returns a new array (NULL without memory).
 */
static json_t *engines_from_hello(json_t *in)
{
	json_t *out = json_array(), *e;
	size_t i;

	json_array_foreach(in, i, e) {
		const char *name = json_string_value(json_object_get(e, "name"));
		const char *state = json_string_value(json_object_get(e, "state"));
		const char *reason = json_string_value(json_object_get(e, "reason"));
		const char *sv = version_or_null(json_object_get(e, "serving"));
		const char *sh = version_or_null(json_object_get(e, "shadow"));
		char *clean;

		if (!out || json_array_size(out) >= MAX_NODE_ENGINES)
			break;
		if (!name || !engines_valid_name(name))
			continue;
		if (reason && strlen(reason) > ENGINE_REASON_MAX)
			reason = NULL;
		clean = reason ? engines_clean_text(reason, ENGINE_REASON_MAX) : NULL;
		json_array_append_new(
			out, json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "name", name, "pid",
				       count_or_null(json_object_get(e, "pid")), "serving",
				       sv ? json_string(sv) : json_null(), "shadow",
				       sh ? json_string(sh) : json_null(), "state",
				       engines_valid_state(state) ? json_string(state) : json_null(),
				       "reason", clean ? json_string(clean) : json_null(),
				       "last_swap_pause_us",
				       count_or_null(json_object_get(e, "last_swap_pause_us")), "swaps",
				       count_or_null(json_object_get(e, "swaps"))));
		free(clean);
	}
	return out;
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

static void on_hello(struct coord *c, const char *from, struct proto_msg *m)
{
	struct cnode *n = node_find(c, from);
	json_t *vers = json_object_get(m->h, "versions"), *e;
	const char *session = proto_str(m, "session");
	/*
	 * A new node, one that was dead (even if some other message of it came
	 * first), or one that restarted (new session): welcome it.
	 */
	int fresh = !n || !alive(n) || n->welcome_due ||
		    (session && (!n->session || strcmp(session, n->session)));
	size_t i;

	if (strcmp(from, proto_str(m, "node"))) {
		refuse(c, from, P_HELLO, "its HELLO claims another node name than its routing id");
		return;
	}
	if (has_controls(from)) { /* it would reach the terminals of status and commit */
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
			if (&c->nodes[i] != n && alive(&c->nodes[i]) && c->nodes[i].bound_key &&
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
		forget_pulls(c, n); /* gone with the old incarnation */
	}
	n->last_seen = hwfs_mono_s();
	n->welcome_due = 0;
	n->wire_rx = (uint64_t)proto_int(m, "wire_bytes_received"); /* 0 from an older node */
	n->wire_tx = (uint64_t)proto_int(m, "wire_bytes_sent");
	json_decref(n->engines); /* a node that sends none (an older one) shows none */
	n->engines = json_is_array(json_object_get(m->h, "engines"))
			     ? engines_from_hello(json_object_get(m->h, "engines"))
			     : NULL;
	json_array_foreach(vers, i, e) {
		const char *vn = json_string_value(json_object_get(e, "name"));
		struct cversion *v = version_find(c, vn);
		json_t *old = json_object_get(n->versions, vn);

		if (old && !json_is_true(json_object_get(old, "complete")))
			continue; /* being pulled: HAVE reports progress */
		set_have(n, vn, json_string_value(json_object_get(e, "digest")),
			 json_is_true(json_object_get(e, "complete")),
			 v ? (json_int_t)v->bytes : 0, 0);
	}
	forget_removed(n, vers);
	if (!fresh) { /* heartbeat answered; the decision is repeated for nodes that missed it */
		send_to(c, from, P_PONG, committed_fields(c), NULL, 0);
		return;
	}
	e = committed_fields(c);
	json_object_set_new(e, "coordinator", json_string(c->endpoint));
	send_to(c, from, P_WELCOME, e, NULL, 0);
	plan_for(c, n);
	replan_pullers_of(c, n);
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
	struct cnode *n = node_find(c, from);
	struct cversion *v = version_find(c, name), *nv;
	uint64_t bytes = 0;

	if (!n)
		return;
	if (v) { /* a known version announced again: a receiver finished, or a node rejoined */
		if (strcmp(v->digest, digest)) {
			LOG_ERR("coord: %s announced %s with digest %s, but the cluster has %s; "
				"ignored", from, name, digest, v->digest);
			return;
		}
		set_have(n, name, digest, 1, (json_int_t)v->bytes, 0);
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
	set_have(n, name, digest, 1, (json_int_t)v->bytes, 0);
	LOG_INFO("coord: %s announced %s", from, name);
	plan_all(c, v);
}

static void on_have(struct coord *c, const char *from, struct proto_msg *m)
{
	struct cnode *n = node_find(c, from), *bad;
	const char *bad_donor = proto_str(m, "bad_donor");

	if (bad_donor && (bad = node_find(c, bad_donor))) {
		bad->bad_shards++;
		LOG_ERR("coord: %s received a corrupt shard of %s from %s", from,
			proto_str(m, "version"), bad_donor);
	}

	if (n) {
		set_have(n, proto_str(m, "version"), proto_str(m, "digest"),
			 proto_bool(m, "complete"), (json_int_t)proto_int(m, "bytes_held"),
			 (json_int_t)proto_int(m, "bytes_needed"));
		if (proto_str(m, "waiting")) /* why it does not move, for status --cluster */
			json_object_set_new(json_object_get(n->versions, proto_str(m, "version")),
					    "waiting", json_string(proto_str(m, "waiting")));
	}
}

/*
 * record_commit() - the transaction ends with @outcome: count it (/metrics:
 * committed; aborted is "refused", partial "failed") and keep it in the
 * status's history with its duration and each node's time to READY.
 */
static void record_commit(struct coord *c, const char *outcome, const char *reason)
{
	double took = hwfs_mono_s() - c->tx.started;
	enum hwfs_commit_outcome o = !strcmp(outcome, "committed") ? HWFS_COMMIT_OK
				     : !strcmp(outcome, "aborted") ? HWFS_COMMIT_REFUSED
								   : HWFS_COMMIT_FAILED;

	hwfs_count(&hwfs_cm.commits[o], 1);
	hwfs_hist_observe_ns(&hwfs_cm.commit, (uint64_t)(took * 1e9));
	json_array_append_new(c->commits,
			      json_pack("{s:s, s:s, s:s, s:f, s:O}", "version", c->tx.version,
					"outcome", outcome, "reason", reason, "duration_s", took,
					"ready_s", c->tx.ready_s ?: json_object()));
	if (json_array_size(c->commits) > COORD_HISTORY)
		json_array_remove(c->commits, 0);
	c->status_at = 0; /* the next pass hands the status over */
}

static void tx_free(struct tx *tx)
{
	free(tx->version);
	json_decref(tx->pending);
	json_decref(tx->nodes);
	json_decref(tx->done);
	json_decref(tx->failed);
	json_decref(tx->ready_s);
	memset(tx, 0, sizeof(*tx));
}

/*
 * tx_finish() - answer the requester with exactly what happened and end the
 * transaction.  @outcome: "committed" (every participant ACKed its flip: the
 * only ok result), "partial" (the decision was commit, but some nodes failed
 * to flip or did not ACK before the deadline: "unknown"), or "aborted"
 * (nobody was told to flip).  Every answer but "committed" carries "errno":
 * EINPROGRESS (partial) or ECANCELED (aborted); a refused COMMIT_REQ has
 * EBUSY or ENOENT (docs/protocol.md).
 */
static void tx_finish(struct coord *c, const char *outcome, const char *reason)
{
	json_t *res = json_pack("{s:I, s:b, s:s, s:O, s:s, s:O, s:O, s:O}", "req",
				(json_int_t)c->tx.req, "ok", !strcmp(outcome, "committed"), "reason",
				reason, "nodes", c->tx.nodes, "outcome", outcome, "committed",
				c->tx.done, "failed", c->tx.failed, "unknown", c->tx.pending);

	if (res && strcmp(outcome, "committed")) /* the node relays it (protocol.md) */
		json_object_set_new(res, "errno", json_integer(strcmp(outcome, "partial")
								       ? ECANCELED
								       : EINPROGRESS));
	send_to(c, c->tx.requester, P_COMMIT_RES, res, NULL, 0);
	record_commit(c, outcome, reason);
	tx_free(&c->tx);
}

/* Send @t {txid, version[, @key: @val]} to every node of the transaction. */
static void tx_send_all(struct coord *c, enum proto_type t, const char *key, const char *val)
{
	size_t i;
	json_t *nm;

	json_array_foreach(c->tx.nodes, i, nm) {
		json_t *f = json_pack("{s:I, s:s}", "txid", (json_int_t)c->tx.txid, "version",
				      c->tx.version);

		if (f && key)
			json_object_set_new(f, key, json_string(val));
		if (f && t == P_COMMIT) /* the decision's epoch: the node records what it applied */
			json_object_set_new(f, "epoch", json_integer((json_int_t)c->epoch));
		send_to(c, json_string_value(nm), t, f, NULL, 0);
	}
}

static void tx_abort(struct coord *c, const char *reason)
{
	LOG_WARN("coord: commit of %s aborted: %s", c->tx.version, reason);
	tx_send_all(c, P_ABORT, "reason", reason);
	tx_finish(c, "aborted", reason);
}

static void on_commit_req(struct coord *c, const char *from, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	struct cversion *v = version_find(c, name);
	uint64_t req = proto_int(m, "req");
	json_t *nodes;

	if (c->tx.active || !v) {
		send_to(c, from, P_COMMIT_RES,
			json_pack("{s:I, s:b, s:s, s:[], s:s, s:i}", "req", (json_int_t)req, "ok", 0,
				  "reason", c->tx.active ? "another commit is in progress"
							 : "no node has announced that version",
				  "nodes", "outcome", "aborted", "errno",
				  c->tx.active ? EBUSY : ENOENT),
			NULL, 0);
		return;
	}
	nodes = json_array();
	for (size_t i = 0; i < c->n_nodes; i++)
		if (alive(&c->nodes[i]))
			json_array_append_new(nodes, json_string(c->nodes[i].name));
	c->tx = (struct tx){.active = 1, .txid = ++c->next_txid, .version = strdup(name),
			    .req = req, .phase = 1, .pending = json_deep_copy(nodes), .nodes = nodes,
			    .done = json_array(), .failed = json_object(),
			    .started = hwfs_mono_s(), .ready_s = json_object(),
			    .deadline = hwfs_mono_s() +
					HWFS_MIN(HWFS_MAX(proto_int(m, "deadline_ms"),
							  MIN_COMMIT_DEADLINE_MS),
						 MAX_COMMIT_DEADLINE_MS) / 1000.0};
	snprintf(c->tx.requester, sizeof(c->tx.requester), "%s", from);
	LOG_INFO("coord: commit %s: prepare on %zu node(s)", name, json_array_size(nodes));
	tx_send_all(c, P_PREPARE, "digest", v->digest);
}

/* Remove @node from the pending list; 1 if it was pending. */
static int tx_answered(struct coord *c, const char *node)
{
	size_t i;
	json_t *nm;

	json_array_foreach(c->tx.pending, i, nm)
		if (!strcmp(json_string_value(nm), node)) {
			json_array_remove(c->tx.pending, i);
			return 1;
		}
	return 0;
}

static void on_ready(struct coord *c, const char *from, struct proto_msg *m)
{
	char reason[MAX_NODE_REASON + 512];

	if (!c->tx.active || c->tx.phase != 1 || proto_int(m, "txid") != c->tx.txid ||
	    !tx_answered(c, from))
		return;
	json_object_set_new(c->tx.ready_s, from, json_real(hwfs_mono_s() - c->tx.started));
	if (!proto_bool(m, "ok")) {
		json_t *why = node_reason(m, "not ready");

		/* @from is a joined node's name: no control characters (on_hello) */
		snprintf(reason, sizeof(reason), "node %s is not ready: %s", from,
			 why ? json_string_value(why) : "not ready");
		json_object_set_new(c->tx.failed, from, why ?: json_string("not ready"));
		tx_abort(c, reason);
		return;
	}
	if (json_array_size(c->tx.pending))
		return;
	/* everyone is ready: the decision is made, and recorded before it is sent */
	free(c->committed);
	c->committed = strdup(c->tx.version);
	c->epoch++;
	save_committed(c);
	c->tx.phase = 2;
	json_decref(c->tx.pending);
	c->tx.pending = json_deep_copy(c->tx.nodes);
	tx_send_all(c, P_COMMIT, NULL, NULL);
}

static void on_ack(struct coord *c, const char *from, struct proto_msg *m)
{
	if (!c->tx.active || c->tx.phase != 2 || proto_int(m, "txid") != c->tx.txid ||
	    !tx_answered(c, from))
		return;
	if (proto_bool(m, "ok")) {
		json_array_append_new(c->tx.done, json_string(from));
	} else {
		json_t *why = node_reason(m, "?");

		LOG_ERR("coord: %s could not flip to %s: %s (it retries on its heartbeats)", from,
			c->tx.version, why ? json_string_value(why) : "?");
		json_object_set_new(c->tx.failed, from, why ?: json_string("?"));
	}
	if (json_array_size(c->tx.pending))
		return;
	if (json_object_size(c->tx.failed) == 0) {
		LOG_INFO("coord: %s committed on %zu node(s)", c->tx.version,
			 json_array_size(c->tx.nodes));
		tx_finish(c, "committed", "committed");
	} else {
		LOG_ERR("coord: %s committed on %zu of %zu node(s); %zu failed to flip",
			c->tx.version, json_array_size(c->tx.done), json_array_size(c->tx.nodes),
			json_object_size(c->tx.failed));
		tx_finish(c, "partial", "some nodes failed to flip");
	}
}

static void tx_tick(struct coord *c)
{
	char reason[600];

	if (!c->tx.active || hwfs_mono_s() < c->tx.deadline)
		return;
	snprintf(reason, sizeof(reason), "deadline passed waiting for %s%s",
		 json_string_value(json_array_get(c->tx.pending, 0)) ?: "?",
		 json_array_size(c->tx.pending) > 1 ? " and others" : "");
	if (c->tx.phase == 1) {
		tx_abort(c, reason);
	} else { /* decided already: report exactly who flipped; the rest catch up */
		LOG_ERR("coord: commit of %s decided, but %s: %zu node(s) ACKed, %zu failed, %zu "
			"unknown", c->tx.version, reason, json_array_size(c->tx.done),
			json_object_size(c->tx.failed), json_array_size(c->tx.pending));
		tx_finish(c, "partial", reason);
	}
}

/*
 * converge_check() - versions now complete on every live node: their time
 * from the first announce (hwfs_coord_version_converge_seconds, and the
 * status's "recent_versions").  Run after every message that may complete one.
 */
static void converge_check(struct coord *c)
{
	double now = hwfs_mono_s();

	for (size_t i = 0; i < c->n_vers; i++) {
		struct cversion *v = &c->vers[i];
		size_t live = 0, have = 0;

		if (v->converge_s >= 0)
			continue;
		for (size_t k = 0; k < c->n_nodes; k++) {
			json_t *e = json_object_get(c->nodes[k].versions, v->name);

			if (!alive(&c->nodes[k]))
				continue;
			live++;
			have += e && json_is_true(json_object_get(e, "complete")) &&
				!strcmp(json_string_value(json_object_get(e, "digest")) ?: "",
					v->digest);
		}
		if (live && have == live) {
			v->converge_s = now - v->announced;
			hwfs_hist_observe_ns(&hwfs_cm.converge, (uint64_t)(v->converge_s * 1e9));
			LOG_INFO("coord: %s is on every live node (%zu), %.3f s after its announce",
				 v->name, live, v->converge_s);
		}
	}
}

/*
 * status_json() - the cluster as `hwfs status --cluster` shows it: the
 * coordinator, the committed version, every node (alive, seconds since it
 * was last heard, its versions and progress, engines, wire bytes), the last
 * commits (outcome, duration, each node's time to READY) and the newest
 * versions with their convergence time.  A new object, NULL without memory.
 */
static json_t *status_json(struct coord *c)
{
	json_t *nodes = json_array(), *recent = json_array();
	double now = hwfs_mono_s();

	for (size_t i = 0; i < c->n_nodes; i++) {
		struct cnode *n = &c->nodes[i];
		json_t *vers = json_array(), *e;
		const char *k;

		json_object_foreach(n->versions, k, e) {
			json_t *ve = json_pack("{s:s, s:O, s:O, s:O, s:O}", "name", k, "digest",
					       json_object_get(e, "digest"), "complete",
					       json_object_get(e, "complete"), "bytes_held",
					       json_object_get(e, "bytes_held"), "bytes_needed",
					       json_object_get(e, "bytes_needed"));

			if (ve && json_object_get(e, "waiting"))
				json_object_set(ve, "waiting", json_object_get(e, "waiting"));
			json_array_append_new(vers, ve);
		}
		/* a dead node's engines are gone with it (their connections ended) */
		json_array_append_new(
			nodes, json_pack("{s:s, s:s, s:b, s:f, s:I, s:I, s:I, s:o, s:o}", "name",
					 n->name, "addr", n->addr ?: "", "alive", alive(n),
					 "last_seen_s", now - n->last_seen, "bad_shards",
					 (json_int_t)n->bad_shards, "wire_bytes_received",
					 (json_int_t)n->wire_rx, "wire_bytes_sent",
					 (json_int_t)n->wire_tx, "versions", vers, "engines",
					 n->engines && alive(n) ? json_deep_copy(n->engines)
								: json_array()));
	}
	for (size_t i = c->n_vers > COORD_HISTORY ? c->n_vers - COORD_HISTORY : 0; i < c->n_vers;
	     i++)
		json_array_append_new(recent, json_pack("{s:s, s:s, s:o}", "name", c->vers[i].name,
							"origin", c->vers[i].origin, "converge_s",
							c->vers[i].converge_s >= 0
								? json_real(c->vers[i].converge_s)
								: json_null()));
	return json_pack("{s:s, s:o, s:o, s:I, s:O, s:o}", "coordinator", c->endpoint,
			 "committed", c->committed ? json_string(c->committed) : json_null(),
			 "nodes", nodes, "refused_messages", (json_int_t)c->refused, "commits",
			 c->commits, "recent_versions", recent);
}

static void on_status(struct coord *c, const char *from, struct proto_msg *m)
{
	send_to(c, from, P_STATUS_RES,
		json_pack("{s:I, s:o}", "req", (json_int_t)proto_int(m, "req"), "cluster",
			  status_json(c) ?: json_object()),
		NULL, 0);
}

/* Hand the status to coord_opts.status every COORD_STATUS_MS (or sooner when asked). */
static void status_tick(struct coord *c)
{
	json_t *st;

	if (!c->o->status || hwfs_mono_s() < c->status_at)
		return;
	c->status_at = hwfs_mono_s() + COORD_STATUS_MS / 1000.0;
	st = status_json(c);
	if (st)
		c->o->status(c->o->status_arg, st);
	json_decref(st);
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
			struct cnode *n = node_find(c, ident);

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
			converge_check(c);
			break;
		case P_ANNOUNCE:
			on_announce(c, ident, &m);
			converge_check(c);
			break;
		case P_HAVE:
			on_have(c, ident, &m);
			converge_check(c);
			break;
		case P_COMMIT_REQ:
			on_commit_req(c, ident, &m);
			break;
		case P_READY:
			on_ready(c, ident, &m);
			break;
		case P_ACK:
			on_ack(c, ident, &m);
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

int coord_run(const struct coord_opts *o)
{
	struct coord c = {.o = o, .commits = json_array()};
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
		tx_tick(&c);
		deaths(&c);
		expire(&c);
		status_tick(&c);
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
		cnode_free(&c.nodes[i]);
	free(c.nodes);
	for (size_t i = 0; i < c.n_vers; i++)
		cversion_free(&c.vers[i]);
	free(c.vers);
	free(c.committed);
	json_decref(c.commits);
	if (c.tx.active)
		tx_free(&c.tx);
	return r;
}
