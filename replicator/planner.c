/*
 * planner.c — the coordinator's planner on a cluster held in memory
 * (planner.h): a struct coord with no sockets, no keys and no state
 * directory, whose have-table and versions are only what the caller
 * recorded, and whose plan_out hook hands each plan to the caller's
 * callback.  coord_plan.c's plan_all(), plan_for() and plan_deaths() run on
 * it unchanged, so a model plans exactly as the coordinator does.
 *
 * coord_alive() compares a node's last_seen with the monotonic clock: an
 * alive node here was last seen at +inf, a dead one at -inf, so no clock of
 * the model's is ever compared with the real one.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "coord_i.h"
#include "planner.h"

_Static_assert(PLANNER_MAX_NODES == MAX_NODES, "planner.h's bound is the coordinator's");

struct planner {
	struct coord c;
	struct coord_opts o;
	size_t cap_nodes;
	planner_out_fn out;
	void *arg;
};

/* struct coord's plan_out hook: the plan to the caller, by names. */
static void planner_plan_out(struct coord *c, struct cnode *to, struct cversion *v, json_t *f)
{
	struct planner *pl = c->plan_arg;

	pl->out(pl->arg, to->name, v->name, f);
}

struct planner *planner_new(unsigned fanout, planner_out_fn out, void *arg)
{
	struct planner *pl = calloc(1, sizeof(*pl));

	if (!pl)
		return NULL;
	pl->o.fanout = fanout;
	pl->c.o = &pl->o;
	pl->c.plan_out = planner_plan_out;
	pl->c.plan_arg = pl;
	pl->out = out;
	pl->arg = arg;
	return pl;
}

void planner_free(struct planner *pl)
{
	if (!pl)
		return;
	for (size_t i = 0; i < pl->c.n_nodes; i++)
		coord_cnode_free(&pl->c.nodes[i]);
	free(pl->c.nodes);
	for (size_t i = 0; i < pl->c.n_vers; i++)
		coord_cversion_free(&pl->c.vers[i]);
	free(pl->c.vers);
	free(pl);
}

int planner_add_node(struct planner *pl, const char *name, const char *addr)
{
	struct cnode *cn;

	if (pl->c.n_nodes > PLANNER_MAX_NODES) /* the publisher and PLANNER_MAX_NODES more */
		return -ENOSPC;
	if (pl->c.n_nodes == pl->cap_nodes) {
		size_t cap = pl->cap_nodes ? 2 * pl->cap_nodes : 16;
		struct cnode *m = realloc(pl->c.nodes, cap * sizeof(*m));

		if (!m)
			return -ENOMEM;
		pl->c.nodes = m;
		pl->cap_nodes = cap;
	}
	cn = &pl->c.nodes[pl->c.n_nodes++];
	memset(cn, 0, sizeof(*cn));
	cn->name = strdup(name);
	cn->addr = strdup(addr);
	cn->versions = json_object();
	cn->last_seen = INFINITY; /* alive for coord_alive() */
	cn->was_alive = 1;
	cn->join_seq = ++pl->c.join_seq;
	if (!cn->name || !cn->addr || !cn->versions)
		return -ENOMEM;
	return (int)(pl->c.n_nodes - 1);
}

int planner_add_version(struct planner *pl, const char *name, const char *origin,
			const void *manifest, size_t mlen, const char *digest, uint64_t bytes)
{
	struct cversion *v, *vs = realloc(pl->c.vers, (pl->c.n_vers + 1) * sizeof(*vs));

	if (!vs)
		return -ENOMEM;
	pl->c.vers = vs;
	v = &vs[pl->c.n_vers];
	memset(v, 0, sizeof(*v));
	snprintf(v->digest, sizeof(v->digest), "%s", digest);
	v->bytes = bytes;
	v->converge_s = -1;
	pl->c.n_vers++; /* what it holds so far is freed with the planner */
	v->name = strdup(name);
	v->origin = strdup(origin);
	v->manifest = malloc(mlen ? mlen : 1);
	if (!v->name || !v->origin || !v->manifest)
		return -ENOMEM;
	memcpy(v->manifest, manifest, mlen);
	v->mlen = mlen;
	return 0;
}

int planner_set_have(struct planner *pl, size_t node, const char *version, uint64_t held,
		     uint64_t needed)
{
	struct cversion *v = coord_version(&pl->c, version);

	if (node >= pl->c.n_nodes || !v)
		return -ENOENT;
	coord_set_have(&pl->c.nodes[node], v->name, v->digest, 1, (json_int_t)held,
		       (json_int_t)needed);
	return 0;
}

int planner_announce(struct planner *pl, const char *version)
{
	struct cversion *v = coord_version(&pl->c, version);

	if (!v)
		return -ENOENT;
	plan_all(&pl->c, v);
	return 0;
}

int planner_join(struct planner *pl, size_t node)
{
	if (node >= pl->c.n_nodes)
		return -ENOENT;
	plan_for(&pl->c, &pl->c.nodes[node]);
	return 0;
}

int planner_node_dead(struct planner *pl, size_t node)
{
	if (node >= pl->c.n_nodes)
		return -ENOENT;
	pl->c.nodes[node].last_seen = -INFINITY;
	plan_deaths(&pl->c);
	return 0;
}
