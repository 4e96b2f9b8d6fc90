/*
 * coord_plan.c — the coordinator's planner: who pulls which version from
 * whom (see coord.c for the have-table it reads).
 *
 * Planning is deterministic: when a version is announced, the alive nodes
 * that lack it, in join order, are its receivers.  chain: receiver i pulls
 * from receiver i-1 (the first from the announcer), with the announcer as
 * fallback; tree:K: position p pulls from position (p-1)/K; star: everyone
 * pulls from the announcer.  A node that asks later (late join, a rejoin)
 * gets every complete holder as donor, striped.  Each plan names the version
 * to take deltas against (pick_base(), docs/delta.md).  The donors of the
 * last plan each node was sent are kept (cnode.plans): when a node dies, only
 * the nodes that pulled from it (its orphans) are re-planned, onto the dead
 * node's own donors (plan_deaths()): the chain or tree closes over the gap.
 *
 * Nothing here does I/O: a plan goes to struct coord's plan_out hook, which
 * the coordinator (coord.c) sends as a PLAN and planner.c hands to a model
 * (the simulator of `hwfs sim`, tools/sim/), so both run this same code.  What the planner reads is the
 * have-table (coord_node_has(), coord_alive()) and the versions' manifests.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "coord_i.h"
#include "delta_base.h"
#include "manifest.h"

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
		struct cnode *n = coord_node(c, json_string_value(json_object_get(d, "node")));

		if (i >= upto)
			break;
		if (!n || !coord_node_has(n, b))
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
	json_t *known = v->affinity ? json_object_get(v->affinity, b->digest) : NULL;
	uint64_t bytes;

	if (known)
		return (uint64_t)json_integer_value(known);
	bytes = delta_base_bytes(cversion_rec(v), cversion_rec(b), NULL, NULL);
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

			if (b == v || !coord_node_has(to, b) || !donors_have(c, donors, b, pass ? 1 : nd))
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

/* Keep the donors (names) of the plan @to is sent for @v: plan_deaths() reads them. */
static void record_plan(struct cnode *to, struct cversion *v, json_t *donors, int stripe)
{
	json_t *names = json_array(), *d;
	size_t i;

	if (!to->plans)
		to->plans = json_object();
	json_array_foreach(donors, i, d)
		json_array_append(names, json_object_get(d, "node"));
	json_object_set_new(to->plans, v->name,
			    json_pack("{s:o, s:b}", "donors", names, "stripe", stripe));
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
	record_plan(to, v, donors, stripe);
	c->plan_out(c, to, v, f);
}

/*
 * Plan @v for every alive node that lacks it: receivers in join order form a
 * tree of the configured fan-out under the announcer (position 0); position p
 * pulls from position (p-1)/K, with the announcer as fallback.
 */
void plan_all(struct coord *c, struct cversion *v)
{
	struct cnode *pos[MAX_NODES + 1], *origin = coord_node(c, v->origin);
	unsigned k = c->o->fanout;
	size_t n = 0;

	if (!origin || !coord_node_has(origin, v)) { /* announcer gone: any holder leads */
		origin = NULL;
		for (size_t i = 0; i < c->n_nodes && !origin; i++)
			if (coord_alive(&c->nodes[i]) && coord_node_has(&c->nodes[i], v))
				origin = &c->nodes[i];
	}
	if (!origin)
		return;
	pos[0] = origin;
	for (size_t i = 0; i < c->n_nodes && n < MAX_NODES; i++)
		if (coord_alive(&c->nodes[i]) && !coord_node_has(&c->nodes[i], v))
			pos[1 + n++] = &c->nodes[i];
	qsort(pos + 1, n, sizeof(*pos), cmp_join);
	for (size_t p = 1; p <= n; p++) {
		struct cnode *parent = k ? pos[(p - 1) / k] : origin;
		json_t *donors = json_array();

		json_array_append_new(donors, donor(parent));
		if (parent != origin)
			json_array_append_new(donors, donor(origin));
		send_plan(c, pos[p], v, donors, 0);
		coord_set_have(pos[p], v->name, v->digest, 0, 0, 0);
	}
	if (n)
		LOG_INFO("coord: %s planned for %zu node(s), fan-out %u from %s", v->name, n, k,
			 origin->name);
}

/*
 * plan_holders() - plan @v for @to with every alive complete holder as donor,
 * striped.  Returns 1 if a plan went out, 0 if nobody alive holds @v.
 */
static int plan_holders(struct coord *c, struct cnode *to, struct cversion *v)
{
	json_t *donors = json_array();

	for (size_t i = 0; i < c->n_nodes; i++)
		if (&c->nodes[i] != to && coord_alive(&c->nodes[i]) && coord_node_has(&c->nodes[i], v))
			json_array_append_new(donors, donor(&c->nodes[i]));
	if (json_array_size(donors) == 0) {
		json_decref(donors);
		return 0;
	}
	send_plan(c, to, v, donors, 1);
	coord_set_have(to, v->name, v->digest, 0, 0, 0);
	return 1;
}

/* A node that (re)joined: plan every version it lacks, donors = all holders. */
void plan_for(struct coord *c, struct cnode *to)
{
	for (size_t k = 0; k < c->n_vers; k++)
		if (!coord_node_has(to, &c->vers[k]))
			plan_holders(c, to, &c->vers[k]);
}

/* Forget the versions @n was still pulling: they are re-planned from scratch. */
void plan_forget_pulls(struct coord *c, struct cnode *n)
{
	for (size_t k = 0; k < c->n_vers; k++) {
		json_t *e = json_object_get(n->versions, c->vers[k].name);

		if (e && !json_is_true(json_object_get(e, "complete"))) {
			json_object_del(n->versions, c->vers[k].name);
			if (n->plans)
				json_object_del(n->plans, c->vers[k].name);
		}
	}
}

/*
 * stand_ins() - append to @out (node names, each once) the live nodes that
 * stand in for donor @d of @to's pull of @v: @d itself if it is alive, else,
 * in order, the stand-ins of the donors of @d's own last plan for @v (its
 * upstream: in a chain its parent then the announcer).  A dead node with no
 * plan for @v (a complete holder, the announcer) has none.  @seen (one byte
 * per node) stops a node being walked twice, so a cycle or a diamond costs
 * nothing more.
 */
static void stand_ins(struct coord *c, struct cnode *to, struct cversion *v, struct cnode *d,
		      json_t *out, unsigned char *seen)
{
	json_t *p, *name;
	size_t i;

	if (d == to || seen[d - c->nodes])
		return;
	seen[d - c->nodes] = 1;
	if (coord_alive(d)) {
		json_array_append_new(out, json_string(d->name));
		return;
	}
	p = d->plans ? json_object_get(json_object_get(d->plans, v->name), "donors") : NULL;
	json_array_foreach(p, i, name) {
		struct cnode *up = coord_node(c, json_string_value(name));

		if (up)
			stand_ins(c, to, v, up, out, seen);
	}
}

/* "a, b, c": the names of @a (JSON strings) for a log line, into @buf. */
static const char *names_str(json_t *a, char *buf, size_t len)
{
	json_t *e;
	size_t i, o = 0;

	buf[0] = '\0';
	json_array_foreach(a, i, e) {
		int w = snprintf(buf + o, len - o, "%s%s", i ? ", " : "", json_string_value(e));

		if (w < 0 || (size_t)w >= len - o)
			break;
		o += (size_t)w;
	}
	return buf;
}

/*
 * replan_orphan() - @to pulls @v after @plan's donors lost someone: the new
 * donors are the stand-ins of the old ones, in order (a relay's parent takes
 * the relay's place, still receiving: it serves what it has and forwards the
 * rest as it comes, docs/protocol.md).  The plan keeps its shape: a chain or
 * tree plan stays one (the first donor asked, the others its fallbacks, so
 * the announcer's uplink is not shared with orphans), a striped one (a late
 * joiner's) stays striped if every stand-in is complete.  With no stand-in
 * left, every alive complete holder, striped.
 */
static void replan_orphan(struct coord *c, struct cnode *to, struct cversion *v, json_t *plan,
			  unsigned char *seen)
{
	json_t *old = json_object_get(plan, "donors"), *names = json_array(), *donors, *e;
	char was[512], now[512];
	int complete = 1;
	size_t i;

	memset(seen, 0, c->n_nodes);
	json_array_foreach(old, i, e) {
		struct cnode *d = coord_node(c, json_string_value(e));

		if (d)
			stand_ins(c, to, v, d, names, seen);
	}
	names_str(old, was, sizeof(was));
	if (json_array_size(names) == 0) {
		json_decref(names);
		LOG_INFO("coord: %s lost its donors of %s (%s): re-planned from the complete holders",
			 to->name, v->name, was);
		plan_holders(c, to, v);
		return;
	}
	donors = json_array();
	json_array_foreach(names, i, e) {
		struct cnode *d = coord_node(c, json_string_value(e));

		complete = complete && coord_node_has(d, v);
		json_array_append_new(donors, donor(d));
	}
	LOG_INFO("coord: %s lost a donor of %s: now pulls from %s (was %s)", to->name, v->name,
		 names_str(names, now, sizeof(now)), was);
	json_decref(names);
	send_plan(c, to, v, donors,
		  json_is_true(json_object_get(plan, "stripe")) && complete &&
			  json_array_size(donors) > 1);
}

/*
 * plan_deaths() - notice the nodes that stopped answering, and re-plan their
 * orphans: each alive node still pulling a version whose plan's first donor
 * (the one it pulls from) is dead, or, for a striped plan, any donor.  Its
 * new donors are the dead node's own donors (stand_ins()): in a chain, the
 * orphan pulls from the relay before the dead one and the chain closes over
 * the gap; in a tree, the dead node's children go to its parent.  Nobody
 * else is re-planned: a plan whose only dead donor is a fallback stays (the
 * puller moves past a silent donor by itself, and a later death re-plans
 * around both).  A node pulling with no plan recorded here (planned by an
 * earlier coordinator) gets the complete holders, as a late joiner.
 */
void plan_deaths(struct coord *c)
{
	/* stand_ins()'s, per orphan: a coordinator keeps MAX_NODES nodes, the
	 * simulator's planner (planner.h) its publisher beside as many receivers */
	unsigned char seen[MAX_NODES + 1];
	int died = 0;

	for (size_t i = 0; i < c->n_nodes; i++) {
		int a = coord_alive(&c->nodes[i]);

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

		if (!coord_alive(n))
			continue;
		for (size_t k = 0; k < c->n_vers; k++) {
			struct cversion *v = &c->vers[k];
			json_t *e = json_object_get(n->versions, v->name), *plan, *ds, *d;
			int orphan = 0;
			size_t j;

			if (!e || json_is_true(json_object_get(e, "complete")))
				continue;
			plan = n->plans ? json_object_get(n->plans, v->name) : NULL;
			ds = json_object_get(plan, "donors");
			if (!plan) { /* not planned by us: as before, the complete holders */
				plan_holders(c, n, v);
				continue;
			}
			json_array_foreach(ds, j, d) {
				struct cnode *dn = coord_node(c, json_string_value(d));

				if ((j == 0 || json_is_true(json_object_get(plan, "stripe"))) &&
				    (!dn || !coord_alive(dn)))
					orphan = 1;
			}
			if (orphan) {
				json_incref(plan); /* send_plan() replaces it */
				replan_orphan(c, n, v, plan, seen);
				json_decref(plan);
			}
		}
	}
}

/*
 * plan_rejoined() - @holder (re)joined holding versions: every other
 * alive node still pulling one of them gets a new plan with all alive
 * complete holders as donors, so nobody waits for its own donor-failure
 * timers to find a restarted publisher again.
 */
void plan_rejoined(struct coord *c, struct cnode *holder)
{
	for (size_t i = 0; i < c->n_nodes; i++) {
		struct cnode *o = &c->nodes[i];
		int pulling = 0;

		if (o == holder || !coord_alive(o))
			continue;
		for (size_t k = 0; k < c->n_vers && !pulling; k++) {
			json_t *e = json_object_get(o->versions, c->vers[k].name);

			pulling = e && !json_is_true(json_object_get(e, "complete")) &&
				  coord_node_has(holder, &c->vers[k]);
		}
		if (pulling) {
			LOG_INFO("coord: %s is back: re-planning %s, which pulls what it holds",
				 holder->name, o->name);
			plan_for(c, o);
		}
	}
}
