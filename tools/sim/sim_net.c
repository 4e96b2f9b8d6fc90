/*
 * sim_net.c — the simulator's network (sim_i.h): what travels for a shard
 * (the shard, or its delta with its header, in pieces of the run's piece
 * size), who pulls which piece from whom, and the uplinks.
 *
 * A plan (sim.c receives it from the planner) gives a receiver its donors;
 * sim_plans_apply() makes one pair per donor, a pair being the next piece
 * that receiver gets from that donor (striped: every donor its share of
 * the shards; else the first donor all of them).  A donor's pairs whose
 * piece is there wait in its ring; the others are blocked until the donor
 * has something new (sim_wake()).  An uplink sends one piece at a time,
 * round robin over its ring, the piece also holding the receiver's
 * downlink; its bytes count on the link's edge and its socket CPU on the
 * sender's I/O threads.
 */
#define _GNU_SOURCE
#include <math.h>
#include <stdlib.h>

#include "delta.h"
#include "sim_i.h"

/* ------------------------------------------------------------------ shapes */

/* Bytes of shard @sh of the version (the last may be shorter). */
uint64_t sim_shard_len(const struct sim *s, uint64_t sh)
{
	uint64_t off = sh * s->p->shard_bytes;

	return s->p->size - off < s->p->shard_bytes ? s->p->size - off : s->p->shard_bytes;
}

/* Bytes that travel for shard @sh: the delta (header included) or the shard. */
static uint64_t travel_len(const struct sim *s, uint64_t sh, int delta)
{
	uint64_t len = sim_shard_len(s, sh);

	return delta ? (uint64_t)ceil((double)len * s->p->r.delta_ratio) + DELTA_HDR : len;
}

uint32_t sim_n_pieces(const struct sim *s, uint64_t sh, int delta)
{
	return (uint32_t)((travel_len(s, sh, delta) + s->piece - 1) / s->piece);
}

uint64_t sim_piece_len(const struct sim *s, uint64_t sh, uint32_t k, int delta)
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
	if (!first && p->k + 1 < sim_n_pieces(s, p->s, kid->delta)) {
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

/* @d has something new: blocked pairs whose piece is there go in the ring. */
void sim_wake(struct sim *s, struct snode *d, double now)
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
		sim_up_kick(s, d, now);
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
void sim_up_kick(struct sim *s, struct snode *d, double now)
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
		len = sim_piece_len(s, p->s, p->k, kid->delta);
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

			sim_reserve(s, d, &d->io, now, c);
			d->send_s += c;
		}
		sim_push(s, start + dur, EV_UP_FREE, (uint32_t)(d - s->n), 0, 0, 0, 0);
		sim_push(s, start + dur + s->p->latency_s, EV_ARRIVE, p->kid, p->s, p->k, p->gen,
		     (uint32_t)(d - s->n));
		if (pair_next(s, d, p, 0))
			pair_place(s, d, i);
		else
			p->state = 0;
	}
}

/* Every receiver with a new plan starts pulling from its donors (after control_s). */
void sim_plans_apply(struct sim *s, double now)
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
					sim_encode_start(s, now);
				sim_up_kick(s, d, now);
			}
		}
	}
}

