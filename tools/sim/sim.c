/*
 * sim.c — `hwfs sim`: replicating one version over a modelled cluster, as a
 * discrete-event simulation that plans with the coordinator's own planner
 * (sim.h; the model and its limits are docs/sim.md).  This file is the run:
 * the parameters checked, the cluster set up, the planner's plans received,
 * the event loop; the model itself is in sim_net.c (the network) and
 * sim_node.c (the work at each node), time and servers in sim_queue.c, the
 * result in sim_report.c, calibration in sim_calibrate.c (sim_i.h).
 *
 * The planner (replicator/planner.h): coord_plan.c run unchanged on a
 * cluster in memory that holds the nodes in join order and the versions
 * with manifests made here (one file whose extents are the shards; with
 * deltas, the previous version has the same layout, so the planner finds
 * every shard a base).  The announce, each late join and each death the
 * coordinator notices are handed to it; its plans come to sim_plan_out()
 * instead of going out as PLAN messages.
 *
 * The model, per node: a link each way (rate, latency, framing overhead); an
 * uplink sends one piece at a time, round robin over the receivers that
 * pull from it and have a piece ready, a piece also holding the receiver's
 * downlink; the agent thread (receiving: socket CPU and the hash of a whole
 * shard's pieces; and with --codec-workers 0 the codec work); codec workers;
 * cores (each node's own, or one host's shared by all).  CPU work is
 * reserved first come, first served on the earliest free server.  A relay
 * forwards a whole shard's piece once it is received (cut-through); a delta
 * after rebuilding its shard (store-and-forward, before issue 20) or as it
 * arrives (cut-through), its last piece only once its own rebuild of the
 * shard ended.  A rebuild costs decode + hash + copy, or the decode alone
 * (fused).  The publisher encodes the whole version at the first request or
 * each shard ahead, in its codec workers.  A node's import of a complete
 * version takes --finish, or its CPU (--finish-cpu) on a core when longer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "hwfs_common.h"
#include "manifest.h"
#include "sim_i.h"
#include "tunables.h"

/* ------------------------------------------------------------------ the planner */

static struct snode *node_of(struct sim *s, const char *name)
{
	for (size_t i = 0; i < s->nn; i++)
		if (!strcmp(s->n[i].name, name))
			return &s->n[i];
	return NULL;
}

/*
 * The planner's plan for @node: pull @version from the donors @f names,
 * from now on (sim_plans_apply() starts the pulls).  Consumes @f.
 */
static void sim_plan_out(void *arg, const char *node, const char *version, json_t *f)
{
	struct sim *s = arg;
	struct snode *kid = node_of(s, node);
	json_t *donors = json_object_get(f, "donors"), *d;
	size_t i;

	if (!kid || strcmp(version, SIM_VERSION)) {
		json_decref(f);
		return;
	}
	kid->gen++;
	kid->planned = 1;
	kid->delta = json_object_get(f, "base") != NULL;
	kid->stripe = json_is_true(json_object_get(f, "stripe"));
	free(kid->donors);
	kid->nd = 0;
	kid->donors = calloc(json_array_size(donors) + 1, sizeof(*kid->donors));
	if (!kid->donors) {
		s->oom = 1;
		json_decref(f);
		return;
	}
	json_array_foreach(donors, i, d) {
		struct snode *dn = node_of(s, json_string_value(json_object_get(d, "node")) ?: "");

		if (dn)
			kid->donors[kid->nd++] = (uint32_t)(dn - s->n);
	}
	for (uint64_t sh = 0; sh < s->n_shards; sh++)
		if (!kid->sh[sh].done) {
			kid->sh[sh].rdy = 0; /* a partial shard starts over */
			kid->sh[sh].t_rb = 0;
		}
	json_decref(f);
}

/* ------------------------------------------------------------------ setup */

/* Node @name joins at @t, alive, here and in the planner.  Returns 0 or -ENOMEM. */
static int add_node(struct sim *s, const char *name, double t)
{
	struct snode *n;
	int cn;

	if (s->nn == s->cap_n) {
		size_t cap = s->cap_n ? 2 * s->cap_n : 16;
		struct snode *m = realloc(s->n, cap * sizeof(*m));

		if (!m)
			return -ENOMEM;
		s->n = m;
		s->cap_n = cap;
	}
	n = &s->n[s->nn];
	memset(n, 0, sizeof(*n));
	snprintf(n->name, sizeof(n->name), "%s", name);
	n->alive = n->joined = 1;
	n->t_join = t;
	n->t_done = -1;
	n->t_die = -1;
	n->sh = calloc(s->n_shards, sizeof(*n->sh));
	if (!n->sh || sim_pool_init(&n->io, s->p->io_threads ? s->p->io_threads : 1) ||
	    sim_pool_init(&n->agent, 1) || sim_pool_init(&n->codec, s->p->codec_workers) ||
	    sim_pool_init(&n->cores, s->p->host_cores ? 0 : s->p->node_cores))
		return -ENOMEM;
	s->nn++;
	cn = planner_add_node(s->pl, name, "tcp://sim:0");
	if (cn < 0)
		return cn;
	n->cn = (size_t)cn;
	return 0;
}

/*
 * A version named @name, one file whose extents are the shards (their
 * hashes made from @salt), with its manifest, into the planner.  Returns 0,
 * or manifest_build()'s and the planner's errors.
 */
static int add_version(struct sim *s, const char *name, unsigned salt)
{
	struct hwfs_vrec vr = {.name = (char *)name, .state = HWFS_V_SEALED};
	struct hwfs_frec f = {.path = "model.bin", .kind = HWFS_K_REG, .mode = 0644,
			      .size = s->p->size};
	char *manifest = NULL, digest[HWFS_HASH_HEX];
	size_t mlen = 0;
	hwfs_hash_t dg;
	int r;

	f.n_ext = s->n_shards;
	f.ext = calloc(s->n_shards, sizeof(*f.ext));
	if (!f.ext)
		return -ENOMEM;
	for (uint64_t i = 0; i < s->n_shards; i++) {
		uint64_t key[2] = {i, salt};

		f.ext[i].off = i * s->p->shard_bytes;
		f.ext[i].len = sim_shard_len(s, i);
		hwfs_hash_buf(key, sizeof(key), &f.ext[i].hash);
	}
	vr.n_files = 1;
	vr.files = &f;
	r = manifest_build(&vr, &manifest, &mlen);
	if (r == 0)
		r = manifest_digest(&vr, &dg);
	free(f.ext);
	if (r == 0) {
		hwfs_hash_hex(&dg, digest);
		r = planner_add_version(s->pl, name, "pub", manifest, mlen, digest, s->p->size);
	}
	free(manifest);
	return r;
}

/*
 * Check @p and size the run's pieces: the piece size, coarsened (powers of
 * two) until the run's piece-hops fit SIM_MAX_EVENTS_PER_RUN.  Returns 0 or
 * -EINVAL with the reason in @err.
 */
static int sim_check(struct sim *s, const struct sim_params *p, char *err, size_t errlen)
{
	if (p->nodes < 1 || p->nodes + p->n_late > PLANNER_MAX_NODES || p->size == 0 ||
	    p->shard_bytes == 0 || p->piece_bytes == 0 || p->link_bps <= 0 || p->overhead < 1 ||
	    p->r.hash <= 0 || p->r.copy <= 0 || (p->delta && (p->r.encode <= 0 ||
	    p->r.decode <= 0 || p->r.delta_ratio <= 0))) {
		hwfs_set_err(err, errlen, "bad parameters: 1 to %d receivers, sizes > 0, rates > 0",
			  PLANNER_MAX_NODES);
		return -EINVAL;
	}
	s->n_shards = (p->size + p->shard_bytes - 1) / p->shard_bytes;
	s->piece = p->piece_bytes < p->shard_bytes ? p->piece_bytes : p->shard_bytes;
	while ((p->size / s->piece) * (uint64_t)(p->nodes + p->n_late) > SIM_MAX_EVENTS_PER_RUN &&
	       s->piece < p->shard_bytes)
		s->piece = 2 * s->piece < p->shard_bytes ? 2 * s->piece : p->shard_bytes;
	if (p->shard_bytes / s->piece > 65535) {
		hwfs_set_err(err, errlen, "more than 65535 pieces in a shard");
		return -EINVAL;
	}
	return 0;
}

/*
 * The cluster at time 0: the publisher "pub" holding the version (and, with
 * deltas, every node the previous one), receivers r1..rN, the late joins
 * and the deaths queued; then the announce, planned.  Returns 0 or -ENOMEM.
 */
static int sim_setup(struct sim *s)
{
	const struct sim_params *p = s->p;
	char name[32];

	s->rate = p->link_bps / 8;
	s->pl = planner_new(p->fanout, sim_plan_out, s);
	if (!s->pl || sim_pool_init(&s->host, p->host_cores) || add_node(s, "pub", 0))
		return -ENOMEM;
	s->n[0].origin = s->n[0].complete = 1;
	for (unsigned i = 1; i <= p->nodes; i++) {
		snprintf(name, sizeof(name), "r%u", i);
		if (add_node(s, name, 0))
			return -ENOMEM;
	}
	if (p->delta) { /* every node holds the previous version, same layout */
		if (add_version(s, "prev", 1))
			return -ENOMEM;
		for (size_t i = 0; i < s->nn; i++)
			planner_set_have(s->pl, i, "prev", 0, 0);
	}
	if (add_version(s, SIM_VERSION, 2))
		return -ENOMEM;
	for (uint64_t sh = 0; sh < s->n_shards; sh++)
		s->n[0].sh[sh].done = 1;
	planner_set_have(s->pl, 0, SIM_VERSION, 0, 0);
	for (unsigned i = 0; i < p->n_late; i++)
		sim_push(s, p->late[i], EV_JOIN, i, 0, 0, 0, 0);
	for (unsigned i = 0; i < p->n_kill; i++)
		sim_push(s, p->kill_at[i], EV_DIE, i, 0, 0, 0, 0);
	planner_announce(s->pl, SIM_VERSION);
	sim_plans_apply(s, 0);
	return 0;
}

/* ------------------------------------------------------------------ the run */

void sim_defaults(struct sim_params *p)
{
	memset(p, 0, sizeof(*p));
	p->nodes = 1;
	p->size = 1ull << 30;
	p->shard_bytes = hwfs_tun.max_shard;
	p->piece_bytes = hwfs_tun.piece_bytes;
	p->link_bps = 1e9;
	p->latency_s = SIM_LATENCY_S;
	p->overhead = SIM_OVERHEAD;
	p->fanout = 1;
	p->changed = 0.02;
	p->io_threads = 1;
	p->control_s = SIM_CONTROL_S;
	p->finish_s = SIM_FINISH_S;
	p->r.net_send_s = p->r.net_recv_s = SIM_NET_CPU_S;
	p->r.delta_ratio = -1;
}

static void sim_free(struct sim *s)
{
	for (size_t i = 0; i < s->nn; i++) {
		free(s->n[i].sh);
		free(s->n[i].donors);
		free(s->n[i].kids);
		free(s->n[i].ring);
		free(s->n[i].io.free);
		free(s->n[i].agent.free);
		free(s->n[i].codec.free);
		free(s->n[i].cores.free);
	}
	free(s->n);
	planner_free(s->pl);
	free(s->host.free);
	free(s->heap);
	free(s->edges);
}

/*
 * Handle event @e.  Returns 0, -ENOMEM, or -EINVAL (@err says why) for a
 * death of a node that is no receiver.
 */
static int sim_step(struct sim *s, const struct ev *e, char *err, size_t errlen)
{
	struct snode *n = &s->n[e->node];
	char name[32];

	switch (e->type) {
	case EV_UP_FREE:
		n->up_busy = 0;
		sim_up_kick(s, n, e->t);
		break;
	case EV_ARRIVE:
	case EV_RELEASED:
		sim_on_arrive(s, e);
		break;
	case EV_READY:
		sim_on_ready(s, e);
		break;
	case EV_SHARD:
		if (e->gen == n->gen && n->alive)
			sim_shard_done(s, n, e->shard, e->t);
		break;
	case EV_DONE:
		sim_on_done(s, e);
		break;
	case EV_ENCODED:
		n->sh[e->shard].enc = 1;
		n->sh[e->shard].t = (float)e->t;
		sim_wake(s, n, e->t);
		break;
	case EV_JOIN:
		snprintf(name, sizeof(name), "j%u", e->node + 1);
		if (add_node(s, name, e->t))
			return -ENOMEM;
		planner_join(s->pl, s->n[s->nn - 1].cn);
		sim_plans_apply(s, e->t);
		break;
	case EV_DIE: {
		struct snode *d = node_of(s, s->p->kill_name[e->node]);

		if (!d || d->origin) {
			hwfs_set_err(err, errlen, "--kill %s: no such receiver",
				  s->p->kill_name[e->node]);
			return -EINVAL;
		}
		d->alive = 0;
		d->t_die = e->t;
		sim_push(s, e->t + hwfs_tun.node_dead_ms / 1000.0, EV_NOTICE,
			 (uint32_t)(d - s->n), 0, 0, 0, 0);
		break;
	}
	case EV_NOTICE: /* the coordinator notices the death and re-plans */
		planner_node_dead(s->pl, n->cn);
		sim_plans_apply(s, e->t);
		break;
	}
	return 0;
}

int sim_run(const struct sim_params *p, json_t **out, char *err, size_t errlen)
{
	struct sim s = {.p = p};
	unsigned saved_delta = hwfs_tun.delta;
	double makespan = 0;
	int r;

	*out = NULL;
	r = sim_check(&s, p, err, errlen);
	if (r < 0)
		return r;
	hwfs_tun.delta = p->delta ? 1 : 0; /* the planner names delta bases as the coordinator would */
	r = sim_setup(&s);
	while (r == 0 && s.nh && !s.oom) {
		struct ev e = sim_pop(&s);

		s.events++;
		r = sim_step(&s, &e, err, errlen);
		if (r == 0 && e.t > makespan && e.type != EV_NOTICE && e.type != EV_DIE)
			makespan = e.t;
	}
	if (r == 0 && s.oom)
		r = -ENOMEM;
	if (r == 0) {
		*out = sim_result(&s, makespan);
		r = *out ? 0 : -ENOMEM;
	}
	hwfs_tun.delta = saved_delta;
	if (r == -ENOMEM)
		hwfs_set_err(err, errlen, "out of memory");
	sim_free(&s);
	return r;
}
