/*
 * sim_queue.c — the simulator's time and servers (sim_i.h): the event queue,
 * a binary heap ordered by time and, at equal times, by the order events
 * were queued (so a run is deterministic); and the pools of servers (a
 * node's agent thread, codec workers, I/O threads, cores) on which CPU work
 * is reserved first come, first served.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>

#include "sim_i.h"

/* ------------------------------------------------------------------ events */

void sim_push(struct sim *s, double t, uint32_t type, uint32_t node, uint32_t shard,
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

struct ev sim_pop(struct sim *s)
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

int sim_pool_init(struct pool *p, unsigned n)
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
double sim_reserve(struct sim *s, struct snode *nd, struct pool *a, double t, double dur)
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

