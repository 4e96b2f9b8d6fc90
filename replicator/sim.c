/*
 * sim.c — `hwfs sim`: replicating one version over a modelled cluster, as a
 * discrete-event simulation that plans with the coordinator's own planner
 * (sim.h; the model and its limits are docs/sim.md).
 *
 * The planner: a struct coord of our own (no sockets) holds the nodes in
 * join order and the versions with manifests made here (one file whose
 * extents are the shards; with deltas, the previous version has the same
 * layout, so pick_base() finds every shard a base).  coord_plan.c's
 * plan_all(), plan_for() and plan_deaths() run unchanged; their plans come
 * to sim_plan_out() through struct coord's plan_out hook instead of going out
 * as PLAN messages.  coord_alive() reads last_seen against the monotonic
 * clock: an alive node here has last_seen +inf, a dead one -inf.
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
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "coord_i.h"
#include "delta.h"
#include "hwfs_common.h"
#include "manifest.h"
#include "sim.h"
#include "tunables.h"

#define GIB 1073741824.0

enum { EV_UP_FREE, EV_ARRIVE, EV_READY, EV_SHARD, EV_DONE, EV_ENCODED, EV_JOIN, EV_DIE,
       EV_NOTICE, EV_RELEASED };

struct ev {
	double t;
	uint64_t seq;
	uint32_t type, node, shard, piece, gen, from;
};

/* A pool of servers (threads or cores): when each is next free, and its busy time. */
struct pool {
	unsigned n;
	double *free;
	double busy;
};

/* What a node knows of one shard of the version. */
struct nshard {
	float t;       /* done (s): complete here; for the origin, encoded */
	float t_rb;    /* a delta: when its rebuild here ends (reserved), 0 before */
	uint16_t rdy;  /* pieces received and processed (they arrive in order) */
	uint16_t from; /* the node the last piece came from */
	uint8_t done, enc;
};

/* A receiver pulling from a donor: the next piece it gets from it. */
struct pair {
	uint32_t kid, gen, s, k;
	int state; /* 0 finished, 1 ready (in the ring), 2 blocked */
};

struct snode {
	char name[32];
	size_t cn;            /* its entry in coord.nodes */
	int alive, joined, complete, origin, delta, stripe;
	int planned;          /* a new plan came: plans_apply() sets up its pulls */
	double t_join, t_done, t_die;
	uint32_t gen;         /* plan generation: pieces of older plans are dropped */
	uint32_t *donors;
	size_t nd;
	struct nshard *sh;
	uint32_t shards_done;
	struct pair *kids;    /* receivers pulling from this node */
	size_t n_kids, cap_kids;
	uint32_t *ring;       /* ready pairs, round robin */
	size_t ring_head, ring_len, ring_cap;
	int up_busy;
	double up_free_at, down_free, up_busy_s, down_busy_s;
	struct pool io, agent, codec, cores;
	double net_s, recv_s, rebuild_s, encode_s, send_s; /* CPU seconds by kind */
	uint64_t bytes_in, bytes_out;
};

struct edge {
	uint32_t from, to;
	uint64_t bytes;
};

struct sim {
	const struct sim_params *p;
	struct coord c;
	struct coord_opts copts;
	struct snode *n;
	size_t nn, cap_n;
	struct cversion *v; /* the version replicated: c.vers[n_vers - 1] */
	uint64_t n_shards, piece;
	struct pool host;
	struct ev *heap;
	size_t nh, cap_h;
	uint64_t seq, events;
	struct edge *edges;
	size_t n_edges, cap_edges;
	double rate; /* bytes/s of a link */
	int encoding_started;
	int oom;
};

/* ------------------------------------------------------------------ events */

static void push(struct sim *s, double t, uint32_t type, uint32_t node, uint32_t shard,
		 uint32_t piece, uint32_t gen, uint32_t from)
{
	size_t i;

	if (s->nh == s->cap_h) {
		size_t cap = s->cap_h ? 2 * s->cap_h : 1024;
		struct ev *h = realloc(s->heap, cap * sizeof(*h));

		if (!h) {
			s->oom = 1;
			return;
		}
		s->heap = h;
		s->cap_h = cap;
	}
	i = s->nh++;
	struct ev e = {t, s->seq++, type, node, shard, piece, gen, from};

	while (i) {
		size_t up = (i - 1) / 2;

		if (s->heap[up].t < t || (s->heap[up].t == t && s->heap[up].seq < e.seq))
			break;
		s->heap[i] = s->heap[up];
		i = up;
	}
	s->heap[i] = e;
}

static int ev_less(const struct ev *a, const struct ev *b)
{
	return a->t < b->t || (a->t == b->t && a->seq < b->seq);
}

static struct ev pop(struct sim *s)
{
	struct ev top = s->heap[0], last = s->heap[--s->nh];
	size_t i = 0;

	for (;;) {
		size_t l = 2 * i + 1, m = i;

		if (l >= s->nh)
			break;
		m = l + 1 < s->nh && ev_less(&s->heap[l + 1], &s->heap[l]) ? l + 1 : l;
		if (!ev_less(&s->heap[m], &last))
			break;
		s->heap[i] = s->heap[m];
		i = m;
	}
	if (s->nh)
		s->heap[i] = last;
	return top;
}

/* ------------------------------------------------------------------ pools */

static int pool_init(struct pool *p, unsigned n)
{
	p->n = n;
	p->busy = 0;
	p->free = n ? calloc(n, sizeof(double)) : NULL;
	return n && !p->free ? -ENOMEM : 0;
}

/*
 * The server of @p to start work at @t on: of those free by then, the one
 * free the latest (best fit: the gaps left between reservations are small),
 * else the one free the soonest.
 */
static unsigned pool_pick(const struct pool *p, double t)
{
	unsigned m = 0, fit = p->n;

	for (unsigned i = 0; i < p->n; i++) {
		if (p->free[i] < p->free[m])
			m = i;
		if (p->free[i] <= t && (fit == p->n || p->free[i] > p->free[fit]))
			fit = i;
	}
	return fit < p->n ? fit : m;
}

/*
 * Reserve @dur seconds of one server of @a (when not NULL) and one core
 * (the host's, or @nd's own when it has a number of them) from @t on, first
 * come first served: returns when the work ends.
 */
static double reserve(struct sim *s, struct snode *nd, struct pool *a, double t, double dur)
{
	struct pool *cores = s->p->host_cores ? &s->host : nd->cores.n ? &nd->cores : NULL;
	unsigned ia = a && a->n ? pool_pick(a, t) : 0, ic;
	double start = t;

	if (a && a->n && a->free[ia] > start)
		start = a->free[ia];
	ic = cores ? pool_pick(cores, start) : 0;
	if (cores && cores->free[ic] > start)
		start = cores->free[ic];
	if (a && a->n) {
		a->free[ia] = start + dur;
		a->busy += dur;
	}
	if (cores) {
		cores->free[ic] = start + dur;
		cores->busy += dur;
	}
	return start + dur;
}

/* ------------------------------------------------------------------ shapes */

static uint64_t shard_len(const struct sim *s, uint64_t sh)
{
	uint64_t off = sh * s->p->shard_bytes;

	return s->p->size - off < s->p->shard_bytes ? s->p->size - off : s->p->shard_bytes;
}

/* Bytes that travel for shard @sh: the delta (header included) or the shard. */
static uint64_t travel_len(const struct sim *s, uint64_t sh, int delta)
{
	uint64_t len = shard_len(s, sh);

	return delta ? (uint64_t)ceil((double)len * s->p->r.delta_ratio) + DELTA_HDR : len;
}

static uint32_t n_pieces(const struct sim *s, uint64_t sh, int delta)
{
	return (uint32_t)((travel_len(s, sh, delta) + s->piece - 1) / s->piece);
}

static uint64_t piece_len(const struct sim *s, uint64_t sh, uint32_t k, int delta)
{
	uint64_t len = travel_len(s, sh, delta), off = (uint64_t)k * s->piece;

	return len - off < s->piece ? len - off : s->piece;
}

/* ------------------------------------------------------------------ pulls */

/* Can donor @d send piece @k of shard @sh to a receiver that wants deltas (@delta)? */
static int avail(const struct sim *s, const struct snode *d, uint64_t sh, uint32_t k, int delta)
{
	const struct nshard *x = &d->sh[sh];

	if (d->origin)
		return !delta || x->enc;
	if (d->complete || x->done)
		return 1;
	if (delta != d->delta)
		return 0;
	if (delta && s->p->relay == SIM_RELAY_STORE)
		return 0;
	return x->rdy > k;
}

/* Does @kid pull shard @sh from donor @d (its @di-th)? */
static int pulls(const struct snode *kid, uint64_t sh, size_t di)
{
	return !kid->sh[sh].done && (kid->stripe ? sh % kid->nd == di : di == 0);
}

/* Advance @p to the next piece its kid pulls from @d; 0 when there is none. */
static int pair_next(struct sim *s, struct snode *d, struct pair *p, int first)
{
	struct snode *kid = &s->n[p->kid];
	size_t di;

	for (di = 0; di < kid->nd && &s->n[kid->donors[di]] != d; di++)
		;
	if (!first && p->k + 1 < n_pieces(s, p->s, kid->delta)) {
		p->k++;
		return 1;
	}
	for (uint64_t sh = first ? p->s : p->s + 1; sh < s->n_shards; sh++)
		if (pulls(kid, sh, di)) {
			p->s = (uint32_t)sh;
			p->k = 0;
			return 1;
		}
	return 0;
}

static void ring_push(struct sim *s, struct snode *d, uint32_t i)
{
	if (d->ring_len == d->ring_cap) {
		size_t cap = d->ring_cap ? 2 * d->ring_cap : 8;
		uint32_t *r = malloc(cap * sizeof(*r));

		if (!r) {
			s->oom = 1;
			return;
		}
		for (size_t j = 0; j < d->ring_len; j++)
			r[j] = d->ring[(d->ring_head + j) % d->ring_cap];
		free(d->ring);
		d->ring = r;
		d->ring_cap = cap;
		d->ring_head = 0;
	}
	d->ring[(d->ring_head + d->ring_len++) % d->ring_cap] = i;
	d->kids[i].state = 1;
}

static int pair_stale(const struct sim *s, const struct pair *p)
{
	const struct snode *kid = &s->n[p->kid];

	return p->gen != kid->gen || !kid->alive || kid->complete;
}

/* Put @p in the ring if its piece is there, else block it. */
static void pair_place(struct sim *s, struct snode *d, uint32_t i)
{
	struct pair *p = &d->kids[i];

	if (avail(s, d, p->s, p->k, s->n[p->kid].delta))
		ring_push(s, d, i);
	else
		p->state = 2;
}

static void up_kick(struct sim *s, struct snode *d, double now);

/* @d has something new: blocked pairs whose piece is there go in the ring. */
static void wake(struct sim *s, struct snode *d, double now)
{
	int any = 0;

	for (size_t i = 0; i < d->n_kids; i++) {
		struct pair *p = &d->kids[i];

		if (p->state != 2)
			continue;
		if (pair_stale(s, p)) {
			p->state = 0;
			continue;
		}
		if (avail(s, d, p->s, p->k, s->n[p->kid].delta)) {
			ring_push(s, d, (uint32_t)i);
			any = 1;
		}
	}
	if (any)
		up_kick(s, d, now);
}

static void edge_add(struct sim *s, uint32_t from, uint32_t to, uint64_t bytes)
{
	for (size_t i = s->n_edges; i-- > 0 && i + 8 >= s->n_edges;) /* recent edges first */
		if (s->edges[i].from == from && s->edges[i].to == to) {
			s->edges[i].bytes += bytes;
			return;
		}
	for (size_t i = 0; i < s->n_edges; i++)
		if (s->edges[i].from == from && s->edges[i].to == to) {
			s->edges[i].bytes += bytes;
			return;
		}
	if (s->n_edges == s->cap_edges) {
		size_t cap = s->cap_edges ? 2 * s->cap_edges : 64;
		struct edge *e = realloc(s->edges, cap * sizeof(*e));

		if (!e) {
			s->oom = 1;
			return;
		}
		s->edges = e;
		s->cap_edges = cap;
	}
	s->edges[s->n_edges++] = (struct edge){from, to, bytes};
}

/* @d's uplink is idle: send the next ready piece, round robin over its receivers. */
static void up_kick(struct sim *s, struct snode *d, double now)
{
	while (!d->up_busy && d->alive && d->ring_len) {
		uint32_t i = d->ring[d->ring_head];
		struct pair *p = &d->kids[i];
		struct snode *kid = &s->n[p->kid];
		uint64_t len, wire;
		double start, dur;

		d->ring_head = (d->ring_head + 1) % d->ring_cap;
		d->ring_len--;
		if (pair_stale(s, p)) {
			p->state = 0;
			continue;
		}
		len = piece_len(s, p->s, p->k, kid->delta);
		wire = (uint64_t)((double)len * s->p->overhead);
		start = now > kid->down_free ? now : kid->down_free;
		dur = (double)wire / s->rate;
		d->up_busy = 1;
		d->up_free_at = start + dur;
		d->up_busy_s += dur;
		kid->down_free = start + dur;
		kid->down_busy_s += dur;
		d->bytes_out += wire;
		kid->bytes_in += wire;
		edge_add(s, (uint32_t)(d - s->n), p->kid, wire);
		if (s->p->r.net_send_s > 0) {
			double c = (double)len / GIB * s->p->r.net_send_s;

			reserve(s, d, &d->io, now, c);
			d->send_s += c;
		}
		push(s, start + dur, EV_UP_FREE, (uint32_t)(d - s->n), 0, 0, 0, 0);
		push(s, start + dur + s->p->latency_s, EV_ARRIVE, p->kid, p->s, p->k, p->gen,
		     (uint32_t)(d - s->n));
		if (pair_next(s, d, p, 0))
			pair_place(s, d, i);
		else
			p->state = 0;
	}
}

/* ------------------------------------------------------------------ the planner */

static struct snode *node_of(struct sim *s, const char *name)
{
	for (size_t i = 0; i < s->nn; i++)
		if (!strcmp(s->n[i].name, name))
			return &s->n[i];
	return NULL;
}

static void encode_start(struct sim *s, double t);

/* coord_plan.c's plan for @to: pull @v from the donors it names, from now on. */
static void sim_plan_out(struct coord *c, struct cnode *to, struct cversion *v, json_t *f)
{
	struct sim *s = c->plan_arg;
	struct snode *kid = node_of(s, to->name);
	json_t *donors = json_object_get(f, "donors"), *d;
	size_t i;

	if (!kid || v != s->v) {
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

/* Every receiver with a new plan starts pulling from its donors (after control_s). */
static void plans_apply(struct sim *s, double now)
{
	for (size_t k = 0; k < s->nn; k++) {
		struct snode *kid = &s->n[k];

		if (!kid->planned)
			continue;
		kid->planned = 0;
		if (!kid->alive || kid->complete || kid->nd == 0)
			continue;
		{
			if (kid->down_free < now + s->p->control_s)
				kid->down_free = now + s->p->control_s;
			for (size_t di = 0; di < kid->nd; di++) {
				struct snode *d = &s->n[kid->donors[di]];
				struct pair p = {(uint32_t)k, kid->gen, 0, 0, 0};

				if (d->n_kids == d->cap_kids) {
					size_t cap = d->cap_kids ? 2 * d->cap_kids : 4;
					struct pair *q = realloc(d->kids, cap * sizeof(*q));

					if (!q) {
						s->oom = 1;
						return;
					}
					d->kids = q;
					d->cap_kids = cap;
				}
				if (!pair_next(s, d, &p, 1))
					continue;
				d->kids[d->n_kids] = p;
				pair_place(s, d, (uint32_t)d->n_kids++);
				if (kid->delta && d->origin && !s->encoding_started)
					encode_start(s, now);
				up_kick(s, d, now);
			}
		}
	}
}

/* ------------------------------------------------------------------ work */

/* The publisher encodes the version's deltas (first request: all, then serves). */
static void encode_start(struct sim *s, double now)
{
	struct snode *o = &s->n[0];
	int first = s->p->encode == SIM_ENCODE_FIRST_REQUEST;
	double t = now + (first ? s->p->control_s : 0), end = t;
	struct pool *pl = s->p->codec_workers ? &o->codec : &o->agent;

	s->encoding_started = 1;
	for (uint64_t sh = 0; sh < s->n_shards; sh++) {
		double c = (double)shard_len(s, sh) / GIB / s->p->r.encode;

		end = reserve(s, o, first ? &o->agent : pl, t, c);
		o->encode_s += c;
		if (!first)
			push(s, end, EV_ENCODED, 0, (uint32_t)sh, 0, 0, 0);
	}
	if (first)
		for (uint64_t sh = 0; sh < s->n_shards; sh++)
			push(s, end, EV_ENCODED, 0, (uint32_t)sh, 0, 0, 0);
}

static void shard_done(struct sim *s, struct snode *n, uint64_t sh, double t)
{
	if (n->sh[sh].done)
		return;
	n->sh[sh].done = 1;
	n->sh[sh].t = (float)t;
	if (++n->shards_done == s->n_shards) {
		/* the import and seal: --finish of wall time, or its CPU when that is longer */
		double end = t + s->p->finish_s;

		if (s->p->finish_cpu_s > 0) {
			double c = reserve(s, n, &n->agent, t, s->p->finish_cpu_s);

			n->recv_s += s->p->finish_cpu_s;
			end = c > end ? c : end;
		}
		push(s, end, EV_DONE, (uint32_t)(n - s->n), 0, 0, n->gen, 0);
	}
	wake(s, n, t);
}

static void on_arrive(struct sim *s, const struct ev *e)
{
	struct snode *n = &s->n[e->node];
	uint64_t len;
	double c, end;

	if (e->gen != n->gen || !n->alive || n->sh[e->shard].done)
		return;
	if (e->type == EV_ARRIVE && n->delta && s->p->relay == SIM_RELAY_CUT &&
	    e->piece + 1 == n_pieces(s, e->shard, 1)) {
		/* A cut-through relay releases a delta's last byte once its own rebuild of the
		 * shard matched: the piece is here but not complete before then. */
		const struct snode *d = &s->n[e->from];
		const struct nshard *x = &d->sh[e->shard];

		if (!d->origin && !d->complete && !x->done) {
			if (!d->alive)
				return; /* never released: this node's re-plan fetches it again */
			if (x->t_rb > 0) {
				push(s, (x->t_rb > e->t ? x->t_rb : e->t) + s->p->latency_s,
				     EV_RELEASED, e->node, e->shard, e->piece, e->gen, e->from);
				return;
			}
			/* the relay was re-planned since (its rebuild dropped): not modelled
			 * (the daemon sends MISSING and the shard restarts); taken as released */
		}
	}
	len = piece_len(s, e->shard, e->piece, n->delta);
	c = (double)len / GIB * s->p->r.net_recv_s; /* the socket: an I/O thread */
	n->net_s += c;
	end = reserve(s, n, &n->io, e->t, c);
	if (!n->delta) { /* the agent thread copies it into the staged shard and hashes it */
		c = (double)len / GIB / s->p->r.hash + (double)len / GIB / s->p->r.copy;
		n->recv_s += c;
		end = reserve(s, n, &n->agent, end, c);
	}
	n->sh[e->shard].from = (uint16_t)e->from;
	push(s, end, EV_READY, e->node, e->shard, e->piece, e->gen, e->from);
}

static void on_ready(struct sim *s, const struct ev *e)
{
	struct snode *n = &s->n[e->node];
	struct nshard *x = &n->sh[e->shard];

	if (e->gen != n->gen || !n->alive || x->done)
		return;
	x->rdy = (uint16_t)(e->piece + 1);
	if (x->rdy < n_pieces(s, e->shard, n->delta)) {
		wake(s, n, e->t);
		return;
	}
	if (!n->delta) {
		shard_done(s, n, e->shard, e->t);
		return;
	}
	{ /* the delta is all here: rebuild (decode, hash, write into the arena; fused: one pass) */
		double len = (double)shard_len(s, e->shard) / GIB;
		double c = len / s->p->r.decode +
			   (s->p->rebuild_fused ? 0 : len / s->p->r.hash + len / s->p->r.copy);
		struct pool *pl = s->p->codec_workers ? &n->codec : &n->agent;
		double end = reserve(s, n, pl, e->t, c);

		n->rebuild_s += c;
		x->t_rb = (float)end;
		push(s, end, EV_SHARD, e->node, e->shard, 0, e->gen, e->from);
		wake(s, n, e->t); /* cut-through: the delta's pieces go on now */
	}
}

static void on_done(struct sim *s, const struct ev *e)
{
	struct snode *n = &s->n[e->node];

	if (!n->alive || n->complete || n->shards_done < s->n_shards) /* a re-plan keeps done shards */
		return;
	n->complete = 1;
	n->t_done = e->t;
	coord_set_have(&s->c.nodes[n->cn], s->v->name, s->v->digest, 1, (json_int_t)s->p->size,
		       (json_int_t)s->p->size);
	wake(s, n, e->t);
}

/* ------------------------------------------------------------------ setup */

static int add_node(struct sim *s, const char *name, double t)
{
	struct snode *n;
	struct cnode *cn;

	if (s->nn == s->cap_n) {
		size_t cap = s->cap_n ? 2 * s->cap_n : 16;
		struct snode *m = realloc(s->n, cap * sizeof(*m));
		struct cnode *cm = realloc(s->c.nodes, cap * sizeof(*cm));

		if (m)
			s->n = m;
		if (cm)
			s->c.nodes = cm;
		if (!m || !cm)
			return -ENOMEM;
		s->cap_n = cap;
	}
	n = &s->n[s->nn];
	memset(n, 0, sizeof(*n));
	snprintf(n->name, sizeof(n->name), "%s", name);
	n->cn = s->c.n_nodes;
	n->alive = n->joined = 1;
	n->t_join = t;
	n->t_done = -1;
	n->t_die = -1;
	n->sh = calloc(s->n_shards, sizeof(*n->sh));
	if (!n->sh || pool_init(&n->io, s->p->io_threads ? s->p->io_threads : 1) ||
	    pool_init(&n->agent, 1) || pool_init(&n->codec, s->p->codec_workers) ||
	    pool_init(&n->cores, s->p->host_cores ? 0 : s->p->node_cores))
		return -ENOMEM;
	s->nn++;
	cn = &s->c.nodes[s->c.n_nodes++];
	memset(cn, 0, sizeof(*cn));
	cn->name = strdup(name);
	cn->addr = strdup("tcp://sim:0");
	cn->versions = json_object();
	cn->last_seen = INFINITY; /* alive for coord_alive() */
	cn->was_alive = 1;
	cn->join_seq = ++s->c.join_seq;
	if (!cn->name || !cn->addr || !cn->versions)
		return -ENOMEM;
	return 0;
}

/* A version named @name, one file whose extents are the shards, with its manifest. */
static int add_version(struct sim *s, const char *name, unsigned salt)
{
	struct hwfs_vrec vr = {.name = (char *)name, .state = HWFS_V_SEALED};
	struct hwfs_frec f = {.path = "model.bin", .kind = HWFS_K_REG, .mode = 0644,
			      .size = s->p->size};
	struct cversion *v, *vs = realloc(s->c.vers, (s->c.n_vers + 1) * sizeof(*vs));
	hwfs_hash_t dg;
	int r;

	if (!vs)
		return -ENOMEM;
	s->c.vers = vs;
	v = &vs[s->c.n_vers];
	memset(v, 0, sizeof(*v));
	f.n_ext = s->n_shards;
	f.ext = calloc(s->n_shards, sizeof(*f.ext));
	if (!f.ext)
		return -ENOMEM;
	for (uint64_t i = 0; i < s->n_shards; i++) {
		uint64_t key[2] = {i, salt};

		f.ext[i].off = i * s->p->shard_bytes;
		f.ext[i].len = shard_len(s, i);
		hwfs_hash_buf(key, sizeof(key), &f.ext[i].hash);
	}
	vr.n_files = 1;
	vr.files = &f;
	r = manifest_build(&vr, (char **)&v->manifest, &v->mlen);
	if (r == 0)
		r = manifest_digest(&vr, &dg);
	free(f.ext);
	if (r < 0)
		return r;
	hwfs_hash_hex(&dg, v->digest);
	v->name = strdup(name);
	v->origin = strdup("pub");
	v->bytes = s->p->size;
	v->converge_s = -1;
	s->c.n_vers++;
	return v->name && v->origin ? 0 : -ENOMEM;
}

/* ------------------------------------------------------------------ results */

static json_t *result(struct sim *s, double makespan)
{
	json_t *out = json_object(), *nodes = json_array(), *links = json_array(), *path = json_array();
	json_t *util = json_object(), *params = json_object();
	const struct sim_params *p = s->p;
	struct snode *last = NULL;
	double cpu = 0, up = 0, agent = 0, codec = 0, enc = 0, io = 0;
	const char *up_n = "", *agent_n = "", *codec_n = "", *io_n = "", *what = "";
	const char *agent_what = "receive: copy + hash", *agent2_n = "", *agent2_what = "";
	double agent2 = 0;
	char serial[160];
	uint64_t sh_last = 0;
	size_t converged = 0, expected = 0;

	for (size_t i = 0; i < s->nn; i++) {
		struct snode *n = &s->n[i];
		json_t *dn = json_array();

		for (size_t d = 0; d < n->nd; d++)
			json_array_append_new(dn, json_string(s->n[n->donors[d]].name));
		json_array_append_new(nodes, json_pack("{s:s, s:o, s:f, s:I, s:I, s:o, s:b, s:b, s:f}",
			"node", n->name, "converged_s", n->origin ? json_real(0) :
			n->complete ? json_real(n->t_done) : json_null(), "joined_s", n->t_join,
			"bytes_in", (json_int_t)n->bytes_in, "bytes_out", (json_int_t)n->bytes_out,
			"donors", dn, "delta", n->delta, "alive", n->alive,
			"cpu_s", n->net_s + n->recv_s + n->rebuild_s + n->encode_s + n->send_s));
		cpu += n->net_s + n->recv_s + n->rebuild_s + n->encode_s + n->send_s;
		if (!n->origin && n->alive) {
			expected++;
			if (n->complete) {
				converged++;
				if (!last || n->t_done > last->t_done)
					last = n;
			}
		}
		if (n->up_busy_s > up) {
			up = n->up_busy_s;
			up_n = n->name;
		}
		if (n->agent.busy > agent2) { /* the two busiest agent threads */
			const char *w = n->encode_s > n->recv_s && n->encode_s > n->rebuild_s ? "encode" :
					n->rebuild_s > n->recv_s ? "rebuild" : "receive: copy + hash";

			if (n->agent.busy > agent) {
				agent2 = agent;
				agent2_n = agent_n;
				agent2_what = agent_what;
				agent = n->agent.busy;
				agent_n = n->name;
				agent_what = w;
			} else {
				agent2 = n->agent.busy;
				agent2_n = n->name;
				agent2_what = w;
			}
		}
		if (n->io.busy > io) {
			io = n->io.busy;
			io_n = n->name;
		}
		if (n->codec.busy > codec) {
			codec = n->codec.busy;
			codec_n = n->name;
		}
		if (n->origin)
			enc = n->encode_s;
	}
	for (size_t i = 0; i < s->n_edges; i++)
		json_array_append_new(links, json_pack("{s:s, s:s, s:I}", "from",
			s->n[s->edges[i].from].name, "to", s->n[s->edges[i].to].name, "bytes",
			(json_int_t)s->edges[i].bytes));
	/* the critical path: the last node's last shard, back through who sent it */
	if (last) {
		float best = -1;

		for (uint64_t sh = 0; sh < s->n_shards; sh++)
			if (last->sh[sh].t > best) {
				best = last->sh[sh].t;
				sh_last = sh;
			}
		for (struct snode *n = last; n;) {
			struct snode *from = n->origin ? NULL : &s->n[n->sh[sh_last].from];

			json_array_append_new(path, json_pack("{s:s, s:f, s:s?}", "node", n->name,
				"t", n->origin ? 0.0 : (double)n->sh[sh_last].t, "from",
				from ? from->name : NULL));
			if (json_array_size(path) > s->nn)
				break;
			n = from;
		}
	}
	if (makespan > 0) {
		double lu = up / makespan, au = agent / makespan, cu = codec / makespan;
		double iu = io / makespan / (p->io_threads ? p->io_threads : 1);
		double hu = p->host_cores ? s->host.busy / p->host_cores / makespan : 0;
		double best = lu;

		what = "link";
		json_object_set_new(util, "busiest_uplink", json_pack("{s:s, s:f}", "node", up_n, "busy", lu));
		json_object_set_new(util, "busiest_agent_thread",
				    json_pack("{s:s, s:f, s:s}", "node", agent_n, "busy", au, "work", agent_what));
		if (p->codec_workers)
			json_object_set_new(util, "busiest_codec_pool",
					    json_pack("{s:s, s:f}", "node", codec_n, "busy",
						      cu / p->codec_workers));
		json_object_set_new(util, "busiest_io_threads", json_pack("{s:s, s:f}", "node", io_n,
									"busy", iu));
		json_object_set_new(util, "encode_s", json_real(enc));
		if (p->host_cores)
			json_object_set_new(util, "host_cores", json_real(hu));
		if (au > best) {
			best = au;
			what = agent_what;
		}
		if (iu > best) {
			best = iu;
			what = "socket I/O threads";
		}
		if (p->codec_workers && cu / p->codec_workers > best) {
			best = cu / p->codec_workers;
			what = "rebuild";
		}
		if (hu > best) {
			best = hu;
			what = "host CPU";
		}
		if (best < 0.6 && au + agent2 / makespan >= 0.8) {
			/* two threads, each busy half the run: one's work waits for the other's */
			snprintf(serial, sizeof(serial), "%s on %s, then %s on %s (in series)",
				 agent_what, agent_n, agent2_what, agent2_n);
			what = serial;
		} else if (best < 0.6) {
			what = "critical path depth (latency and pipeline fill per hop)";
		}
	}
	json_object_set_new(params, "nodes", json_integer(p->nodes));
	json_object_set_new(params, "size", json_integer((json_int_t)p->size));
	json_object_set_new(params, "shard_bytes", json_integer((json_int_t)p->shard_bytes));
	json_object_set_new(params, "piece_bytes", json_integer((json_int_t)p->piece_bytes));
	json_object_set_new(params, "model_piece_bytes", json_integer((json_int_t)s->piece));
	json_object_set_new(params, "link_bps", json_real(p->link_bps));
	json_object_set_new(params, "latency_s", json_real(p->latency_s));
	json_object_set_new(params, "overhead", json_real(p->overhead));
	json_object_set_new(params, "topology", p->fanout == 0 ? json_string("star") :
			    p->fanout == 1 ? json_string("chain") :
			    json_sprintf("tree:%u", p->fanout));
	json_object_set_new(params, "delta", json_boolean(p->delta));
	json_object_set_new(params, "delta_ratio", json_real(p->r.delta_ratio));
	json_object_set_new(params, "relay", json_string(p->relay == SIM_RELAY_CUT ? "cut" : "store"));
	json_object_set_new(params, "encode", json_string(p->encode == SIM_ENCODE_AHEAD ? "ahead" :
							  "first-request"));
	json_object_set_new(params, "codec_workers", json_integer(p->codec_workers));
	json_object_set_new(params, "rebuild", json_string(p->rebuild_fused ? "fused" : "separate"));
	json_object_set_new(params, "finish_s", json_real(p->finish_s));
	json_object_set_new(params, "finish_cpu_s", json_real(p->finish_cpu_s));
	json_object_set_new(params, "io_threads", json_integer(p->io_threads ? p->io_threads : 1));
	json_object_set_new(params, "host_cores", json_integer(p->host_cores));
	json_object_set_new(params, "node_cores", json_integer(p->node_cores));
	json_object_set_new(params, "rates", json_pack("{s:f, s:f, s:f, s:f, s:f, s:f}", "hash_gibps",
		p->r.hash, "copy_gibps", p->r.copy, "encode_gibps", p->r.encode, "decode_gibps",
		p->r.decode, "net_send_s_per_gib", p->r.net_send_s, "net_recv_s_per_gib",
		p->r.net_recv_s));
	json_object_set_new(out, "params", params);
	json_object_set_new(out, "converged_s", last && converged == expected ? json_real(last->t_done)
									  : json_null());
	json_object_set_new(out, "converged_nodes", json_integer((json_int_t)converged));
	json_object_set_new(out, "s_over_b", json_real((double)p->size * 8 / p->link_bps));
	if (last && converged == expected)
		json_object_set_new(out, "x_s_over_b",
				    json_real(last->t_done / ((double)p->size * 8 / p->link_bps)));
	json_object_set_new(out, "cpu_s", json_real(cpu));
	json_object_set_new(out, "bottleneck", json_string(what));
	json_object_set_new(out, "utilisation", util);
	json_object_set_new(out, "critical_path", path);
	json_object_set_new(out, "critical_path_depth",
			    json_integer(json_array_size(path) ? (json_int_t)json_array_size(path) - 1 : 0));
	json_object_set_new(out, "events", json_integer((json_int_t)s->events));
	json_object_set_new(out, "nodes", nodes);
	json_object_set_new(out, "links", links);
	return out;
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
	for (size_t i = 0; i < s->c.n_nodes; i++)
		coord_cnode_free(&s->c.nodes[i]);
	free(s->c.nodes);
	for (size_t i = 0; i < s->c.n_vers; i++)
		coord_cversion_free(&s->c.vers[i]);
	free(s->c.vers);
	free(s->host.free);
	free(s->heap);
	free(s->edges);
}

int sim_run(const struct sim_params *p, json_t **out, char *err, size_t errlen)
{
	struct sim s = {.p = p};
	unsigned saved_delta = hwfs_tun.delta;
	double makespan = 0;
	char name[32];
	int r = -ENOMEM;

	*out = NULL;
	if (p->nodes < 1 || p->nodes + p->n_late > MAX_NODES || p->size == 0 ||
	    p->shard_bytes == 0 || p->piece_bytes == 0 || p->link_bps <= 0 || p->overhead < 1 ||
	    p->r.hash <= 0 || p->r.copy <= 0 || (p->delta && (p->r.encode <= 0 ||
	    p->r.decode <= 0 || p->r.delta_ratio <= 0))) {
		hwfs_set_err(err, errlen, "bad parameters: 1 to %d receivers, sizes > 0, rates > 0",
			  MAX_NODES);
		return -EINVAL;
	}
	s.n_shards = (p->size + p->shard_bytes - 1) / p->shard_bytes;
	s.piece = p->piece_bytes < p->shard_bytes ? p->piece_bytes : p->shard_bytes;
	/* pieces coarsened (powers of two) until the run's piece-hops fit the budget */
	while ((p->size / s.piece) * (uint64_t)(p->nodes + p->n_late) > SIM_MAX_EVENTS_PER_RUN &&
	       s.piece < p->shard_bytes)
		s.piece = 2 * s.piece < p->shard_bytes ? 2 * s.piece : p->shard_bytes;
	if (p->shard_bytes / s.piece > 65535) {
		hwfs_set_err(err, errlen, "more than 65535 pieces in a shard");
		return -EINVAL;
	}
	s.rate = p->link_bps / 8;
	s.copts.fanout = p->fanout;
	s.c.o = &s.copts;
	s.c.plan_out = sim_plan_out;
	s.c.plan_arg = &s;
	hwfs_tun.delta = p->delta ? 1 : 0;
	if (pool_init(&s.host, p->host_cores) || add_node(&s, "pub", 0))
		goto out;
	s.n[0].origin = s.n[0].complete = 1;
	for (unsigned i = 1; i <= p->nodes; i++) {
		snprintf(name, sizeof(name), "r%u", i);
		if (add_node(&s, name, 0))
			goto out;
	}
	if (p->delta) { /* every node holds the previous version, same layout */
		if (add_version(&s, "prev", 1))
			goto out;
		for (size_t i = 0; i < s.c.n_nodes; i++)
			coord_set_have(&s.c.nodes[i], "prev", s.c.vers[0].digest, 1, 0, 0);
	}
	if (add_version(&s, "next", 2))
		goto out;
	s.v = &s.c.vers[s.c.n_vers - 1];
	for (uint64_t sh = 0; sh < s.n_shards; sh++)
		s.n[0].sh[sh].done = 1;
	coord_set_have(&s.c.nodes[0], "next", s.v->digest, 1, 0, 0);
	for (unsigned i = 0; i < p->n_late; i++)
		push(&s, p->late[i], EV_JOIN, i, 0, 0, 0, 0);
	for (unsigned i = 0; i < p->n_kill; i++)
		push(&s, p->kill_at[i], EV_DIE, i, 0, 0, 0, 0);
	plan_all(&s.c, s.v); /* the announce */
	plans_apply(&s, 0);
	while (s.nh && !s.oom) {
		struct ev e = pop(&s);
		struct snode *n = &s.n[e.node];

		s.events++;
		switch (e.type) {
		case EV_UP_FREE:
			n->up_busy = 0;
			up_kick(&s, n, e.t);
			break;
		case EV_ARRIVE:
		case EV_RELEASED:
			on_arrive(&s, &e);
			break;
		case EV_READY:
			on_ready(&s, &e);
			break;
		case EV_SHARD:
			if (e.gen == n->gen && n->alive)
				shard_done(&s, n, e.shard, e.t);
			break;
		case EV_DONE:
			on_done(&s, &e);
			break;
		case EV_ENCODED:
			n->sh[e.shard].enc = 1;
			n->sh[e.shard].t = (float)e.t;
			wake(&s, n, e.t);
			break;
		case EV_JOIN:
			snprintf(name, sizeof(name), "j%u", e.node + 1);
			if (add_node(&s, name, e.t))
				goto out;
			plan_for(&s.c, &s.c.nodes[s.nn - 1]);
			plans_apply(&s, e.t);
			break;
		case EV_DIE: {
			struct snode *d = node_of(&s, p->kill_name[e.node]);

			if (!d || d->origin) {
				hwfs_set_err(err, errlen, "--kill %s: no such receiver",
					  p->kill_name[e.node]);
				r = -EINVAL;
				goto out;
			}
			d->alive = 0;
			d->t_die = e.t;
			push(&s, e.t + hwfs_tun.node_dead_ms / 1000.0, EV_NOTICE,
			     (uint32_t)(d - s.n), 0, 0, 0, 0);
			break;
		}
		case EV_NOTICE: /* the coordinator notices the death and re-plans */
			s.c.nodes[n->cn].last_seen = -INFINITY;
			plan_deaths(&s.c);
			plans_apply(&s, e.t);
			break;
		}
		if (e.t > makespan && e.type != EV_NOTICE && e.type != EV_DIE)
			makespan = e.t;
	}
	if (s.oom)
		goto out;
	*out = result(&s, makespan);
	r = *out ? 0 : -ENOMEM;
out:
	hwfs_tun.delta = saved_delta;
	if (r == -ENOMEM)
		hwfs_set_err(err, errlen, "out of memory");
	sim_free(&s);
	return r;
}

/* ------------------------------------------------------------------ calibration */

static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static uint16_t bf16_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int sim_calibrate(struct sim_rates *r, double changed, unsigned mib)
{
	size_t len = (size_t)(mib ? mib : SIM_CALIBRATE_MIB) << 20, n = len / 2;
	uint16_t *a = malloc(len), *b = malloc(len);
	uint8_t *enc = malloc(len + 4096), *out = malloc(len);
	struct delta_ctx *cx = delta_ctx_new(hwfs_tun.delta_level);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	hwfs_hash_t h;
	double t;
	ssize_t el;
	int rc = -ENOMEM;

	if (!a || !b || !enc || !out || !cx)
		goto out;
	for (size_t i = 0; i < n; i++) { /* ~N(0, 0.02) weights, a fraction changed a little */
		double u1, u2, g;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		u1 = ((x >> 11) + 1) * (1.0 / 9007199254740993.0);
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		u2 = (x >> 11) * (1.0 / 9007199254740992.0);
		g = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
		a[i] = bf16_of((float)(0.02 * g));
		b[i] = a[i];
		if (u2 * 1e6 - floor(u2 * 1e6) < changed)
			b[i] = (uint16_t)(a[i] + ((x >> 3) & 1 ? 1 : -1) * (1 + (int)((x >> 5) & 1)));
	}
	memcpy(out, a, len); /* touch */
	if (r->hash <= 0) {
		t = cpu_s();
		for (int i = 0; i < 2; i++)
			hwfs_hash_buf(i ? a : b, len, &h);
		r->hash = 2 * len / GIB / (cpu_s() - t + 1e-9);
	}
	if (r->copy <= 0) {
		t = cpu_s();
		for (int i = 0; i < 2; i++)
			memcpy(out, i ? a : b, len);
		r->copy = 2 * len / GIB / (cpu_s() - t + 1e-9);
	}
	t = cpu_s();
	el = delta_encode(cx, a, b, len, 2, enc, len + 4096);
	if (el < 0) {
		rc = (int)el;
		goto out;
	}
	if (r->encode <= 0)
		r->encode = len / GIB / (cpu_s() - t + 1e-9);
	if (r->delta_ratio <= 0)
		r->delta_ratio = (double)el / len;
	t = cpu_s();
	if (delta_decode(cx, a, len, enc, (size_t)el, out, NULL, 0) < 0) {
		rc = -EINVAL;
		goto out;
	}
	if (r->decode <= 0)
		r->decode = len / GIB / (cpu_s() - t + 1e-9);
	rc = 0;
out:
	delta_ctx_free(cx);
	free(a);
	free(b);
	free(enc);
	free(out);
	return rc;
}
