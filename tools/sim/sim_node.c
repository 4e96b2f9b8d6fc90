/*
 * sim_node.c — the simulator's work at a node (sim_i.h): the publisher's
 * encode of the version's deltas (all at the first request, or each shard
 * ahead in its codec workers), a receiver's handling of each piece (socket
 * CPU, and the copy and hash of a whole shard's pieces on the agent
 * thread), the rebuild of a delta once all of it is here (decode, hash and
 * copy, or the decode alone when fused), and the import of the complete
 * version (--finish, or its CPU when longer).  Each step is CPU reserved on
 * the node's pools (sim_reserve()) and an event when it ends.
 */
#define _GNU_SOURCE
#include "sim_i.h"

/* The publisher encodes the version's deltas (first request: all, then serves). */
void sim_encode_start(struct sim *s, double now)
{
	struct snode *o = &s->n[0];
	int first = s->p->encode == SIM_ENCODE_FIRST_REQUEST;
	double t = now + (first ? s->p->control_s : 0), end = t;
	struct pool *pl = s->p->codec_workers ? &o->codec : &o->agent;

	s->encoding_started = 1;
	for (uint64_t sh = 0; sh < s->n_shards; sh++) {
		double c = (double)sim_shard_len(s, sh) / GIB / s->p->r.encode;

		end = sim_reserve(s, o, first ? &o->agent : pl, t, c);
		o->encode_s += c;
		if (!first)
			sim_push(s, end, EV_ENCODED, 0, (uint32_t)sh, 0, 0, 0);
	}
	if (first)
		for (uint64_t sh = 0; sh < s->n_shards; sh++)
			sim_push(s, end, EV_ENCODED, 0, (uint32_t)sh, 0, 0, 0);
}

/* Shard @sh is complete at @n at @t; the last one starts the import (EV_DONE). */
void sim_shard_done(struct sim *s, struct snode *n, uint64_t sh, double t)
{
	if (n->sh[sh].done)
		return;
	n->sh[sh].done = 1;
	n->sh[sh].t = (float)t;
	if (++n->shards_done == s->n_shards) {
		/* the import and seal: --finish of wall time, or its CPU when that is longer */
		double end = t + s->p->finish_s;

		if (s->p->finish_cpu_s > 0) {
			double c = sim_reserve(s, n, &n->agent, t, s->p->finish_cpu_s);

			n->recv_s += s->p->finish_cpu_s;
			end = c > end ? c : end;
		}
		sim_push(s, end, EV_DONE, (uint32_t)(n - s->n), 0, 0, n->gen, 0);
	}
	sim_wake(s, n, t);
}

/*
 * A piece is at its receiver: a cut-through relay's last piece of a delta
 * waits for the relay's own rebuild (EV_RELEASED); then the socket's CPU on
 * an I/O thread and, for a whole shard, the copy and hash on the agent
 * thread, after which it is ready (EV_READY).
 */
void sim_on_arrive(struct sim *s, const struct ev *e)
{
	struct snode *n = &s->n[e->node];
	uint64_t len;
	double c, end;

	if (e->gen != n->gen || !n->alive || n->sh[e->shard].done)
		return;
	if (e->type == EV_ARRIVE && n->delta && s->p->relay == SIM_RELAY_CUT &&
	    e->piece + 1 == sim_n_pieces(s, e->shard, 1)) {
		/* A cut-through relay releases a delta's last byte once its own rebuild of the
		 * shard matched: the piece is here but not complete before then. */
		const struct snode *d = &s->n[e->from];
		const struct nshard *x = &d->sh[e->shard];

		if (!d->origin && !d->complete && !x->done) {
			if (!d->alive)
				return; /* never released: this node's re-plan fetches it again */
			if (x->t_rb > 0) {
				sim_push(s, (x->t_rb > e->t ? x->t_rb : e->t) + s->p->latency_s,
				     EV_RELEASED, e->node, e->shard, e->piece, e->gen, e->from);
				return;
			}
			/* the relay was re-planned since (its rebuild dropped): not modelled
			 * (the daemon sends MISSING and the shard restarts); taken as released */
		}
	}
	len = sim_piece_len(s, e->shard, e->piece, n->delta);
	c = (double)len / GIB * s->p->r.net_recv_s; /* the socket: an I/O thread */
	n->net_s += c;
	end = sim_reserve(s, n, &n->io, e->t, c);
	if (!n->delta) { /* the agent thread copies it into the staged shard and hashes it */
		c = (double)len / GIB / s->p->r.hash + (double)len / GIB / s->p->r.copy;
		n->recv_s += c;
		end = sim_reserve(s, n, &n->agent, end, c);
	}
	n->sh[e->shard].from = (uint16_t)e->from;
	sim_push(s, end, EV_READY, e->node, e->shard, e->piece, e->gen, e->from);
}

/*
 * A piece is processed: the shard's next pieces can go on to this node's
 * receivers; with the last, a whole shard is done and a delta is rebuilt
 * (on a codec worker, or the agent thread), done when that ends (EV_SHARD).
 */
void sim_on_ready(struct sim *s, const struct ev *e)
{
	struct snode *n = &s->n[e->node];
	struct nshard *x = &n->sh[e->shard];

	if (e->gen != n->gen || !n->alive || x->done)
		return;
	x->rdy = (uint16_t)(e->piece + 1);
	if (x->rdy < sim_n_pieces(s, e->shard, n->delta)) {
		sim_wake(s, n, e->t);
		return;
	}
	if (!n->delta) {
		sim_shard_done(s, n, e->shard, e->t);
		return;
	}
	{ /* the delta is all here: rebuild (decode, hash, write into the arena; fused: one pass) */
		double len = (double)sim_shard_len(s, e->shard) / GIB;
		double c = len / s->p->r.decode +
			   (s->p->rebuild_fused ? 0 : len / s->p->r.hash + len / s->p->r.copy);
		struct pool *pl = s->p->codec_workers ? &n->codec : &n->agent;
		double end = sim_reserve(s, n, pl, e->t, c);

		n->rebuild_s += c;
		x->t_rb = (float)end;
		sim_push(s, end, EV_SHARD, e->node, e->shard, 0, e->gen, e->from);
		sim_wake(s, n, e->t); /* cut-through: the delta's pieces go on now */
	}
}

/* The version is imported at a node: the planner records it as a complete holder. */
void sim_on_done(struct sim *s, const struct ev *e)
{
	struct snode *n = &s->n[e->node];

	if (!n->alive || n->complete || n->shards_done < s->n_shards) /* a re-plan keeps done shards */
		return;
	n->complete = 1;
	n->t_done = e->t;
	planner_set_have(s->pl, n->cn, SIM_VERSION, s->p->size, s->p->size);
	sim_wake(s, n, e->t);
}

