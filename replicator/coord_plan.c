/*
 * coord_plan.c — the coordinator's planner: who pulls which version from
 * whom (see coord.c for the have-table it reads).
 *
 * Planning is deterministic: when a version is announced, the alive nodes
 * that lack it, in join order, are its receivers.  chain: receiver i pulls
 * from receiver i-1 (the first from the announcer), with the announcer as
 * fallback; tree:K: position p pulls from position (p-1)/K; star: everyone
 * pulls from the announcer.  A node that asks later (late join, a rejoin, a
 * donor's death) gets every complete holder as donor, striped.  Each plan
 * names the version to take deltas against (pick_base(), docs/delta.md).
 *
 * Nothing here does I/O: a plan goes to struct coord's plan_out hook, which
 * the coordinator (coord.c) sends as a PLAN and the simulator (sim.c, `hwfs
 * sim`) records, so both run this same code.  What the planner reads is the
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

/* A node that (re)joined: plan every version it lacks, donors = all holders. */
void plan_for(struct coord *c, struct cnode *to)
{
	for (size_t k = 0; k < c->n_vers; k++) {
		struct cversion *v = &c->vers[k];
		json_t *donors;

		if (coord_node_has(to, v))
			continue;
		donors = json_array();
		for (size_t i = 0; i < c->n_nodes; i++)
			if (&c->nodes[i] != to && coord_alive(&c->nodes[i]) && coord_node_has(&c->nodes[i], v))
				json_array_append_new(donors, donor(&c->nodes[i]));
		if (json_array_size(donors) == 0) {
			json_decref(donors);
			continue;
		}
		send_plan(c, to, v, donors, 1);
		coord_set_have(to, v->name, v->digest, 0, 0, 0);
	}
}

/* Forget the versions @n was still pulling: they are re-planned from scratch. */
void plan_forget_pulls(struct coord *c, struct cnode *n)
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
void plan_deaths(struct coord *c)
{
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
		plan_forget_pulls(c, n);
		plan_for(c, n); /* donors: the alive complete holders, striped */
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
