/*
 * sim_i.h — what the files of the simulator share (private: only the
 * files of tools/sim/ include it; the API is sim.h).
 *
 *   sim.c            the run: parameters, the nodes and versions set up, the
 *                    planner's plans received, the event loop, the result
 *   sim_queue.c      time and servers: the event queue, the CPU pools
 *   sim_net.c        the network: pieces, who pulls what from whom, the
 *                    uplinks, the plans turned into pulls
 *   sim_node.c       the work at a node: encode, receive, rebuild, done
 *   sim_report.c     the result object: nodes, links, critical path,
 *                    utilisation and what bounds the run
 *   sim_calibrate.c  sim_calibrate(): the CPU rates measured here
 *
 * One thread runs a simulation; nothing here is shared between runs.
 */
#ifndef HWFS_SIM_I_H
#define HWFS_SIM_I_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

#include "planner.h"
#include "sim.h"

#define SIM_VERSION "next" /* the version replicated; "prev" is its base (with deltas) */

#define GIB 1073741824.0

enum { EV_UP_FREE, EV_ARRIVE, EV_READY, EV_SHARD, EV_DONE, EV_ENCODED, EV_JOIN, EV_DIE,
       EV_NOTICE, EV_RELEASED };

/* An event: at time @t, of @type, about a node, a shard's piece, a plan generation, a sender. */
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
	size_t cn;            /* its index in the planner */
	int alive, joined, complete, origin, delta, stripe;
	int planned;          /* a new plan came: sim_plans_apply() sets up its pulls */
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

/* Bytes sent on the wire from one node to another. */
struct edge {
	uint32_t from, to;
	uint64_t bytes;
};

/* One run: its nodes (the publisher first), the planner, the event queue. */
struct sim {
	const struct sim_params *p;
	struct planner *pl; /* the coordinator's planner (replicator/planner.h) */
	struct snode *n;    /* in join order, as the planner's nodes */
	size_t nn, cap_n;
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

/* sim_queue.c: events and CPU pools */

/** Queue an event (on no memory s->oom is set and the event lost: the run fails). */
void sim_push(struct sim *s, double t, uint32_t type, uint32_t node, uint32_t shard,
	      uint32_t piece, uint32_t gen, uint32_t from);
/** Take the earliest event (ties: the first queued).  The queue must not be empty. */
struct ev sim_pop(struct sim *s);
/** A pool of @n servers, all free at 0.  Returns 0 or -ENOMEM. */
int sim_pool_init(struct pool *p, unsigned n);
/**
 * Reserve @dur seconds of one server of @a (when not NULL) and one core (the
 * host's, or @nd's own when it has a number of them) from @t on, first come
 * first served.  Returns when the work ends.
 */
double sim_reserve(struct sim *s, struct snode *nd, struct pool *a, double t, double dur);

/* sim_net.c: pieces, pulls, uplinks */

/** Bytes of shard @sh of the version (the last may be shorter). */
uint64_t sim_shard_len(const struct sim *s, uint64_t sh);
/** Pieces that travel for shard @sh: of its delta (@delta) or of the shard. */
uint32_t sim_n_pieces(const struct sim *s, uint64_t sh, int delta);
/** Bytes of piece @k of shard @sh (of its delta when @delta). */
uint64_t sim_piece_len(const struct sim *s, uint64_t sh, uint32_t k, int delta);
/** @d has something new: its blocked receivers whose piece is there are sent it. */
void sim_wake(struct sim *s, struct snode *d, double now);
/** @d's uplink is idle: send the next ready piece, round robin over its receivers. */
void sim_up_kick(struct sim *s, struct snode *d, double now);
/** Every receiver with a new plan starts pulling from its donors (after control_s). */
void sim_plans_apply(struct sim *s, double now);

/* sim_node.c: the work at a node */

/** The publisher starts encoding the version's deltas (at its first delta request). */
void sim_encode_start(struct sim *s, double now);
/** Shard @sh is complete at @n at @t (the last one: the version follows). */
void sim_shard_done(struct sim *s, struct snode *n, uint64_t sh, double t);
/** A piece arrived (EV_ARRIVE) or a relay released a delta's last piece (EV_RELEASED). */
void sim_on_arrive(struct sim *s, const struct ev *e);
/** A piece was processed at its receiver (EV_READY): the shard goes on or is rebuilt. */
void sim_on_ready(struct sim *s, const struct ev *e);
/** A node's import of the complete version ended (EV_DONE). */
void sim_on_done(struct sim *s, const struct ev *e);

/* sim_report.c: the result */

/** The result of run @s whose last event was at @makespan (sim_run()'s object), or NULL. */
json_t *sim_result(struct sim *s, double makespan);

#endif /* HWFS_SIM_I_H */
