/*
 * planner.h — the coordinator's planner with no coordinator around it: a
 * cluster held in memory (no sockets, no clock) that coord_plan.c plans
 * over, unchanged, each plan handed to a callback instead of going out as a
 * PLAN message.  It is for models of a replication that must plan exactly
 * as the coordinator does: the simulator of `hwfs sim` (tools/sim/) drives
 * it from its events.
 *
 * A planner knows nodes (by index, in the order they were added, which is
 * their join order) and versions (by name).  A node is alive from the
 * moment it is added until planner_node_dead(); what it holds is what
 * planner_set_have() recorded.  Planning reads hwfs_tun.delta (whether
 * plans name a delta base) as the coordinator does.
 *
 * Not thread-safe: one thread uses a planner.
 */
#ifndef HWFS_PLANNER_H
#define HWFS_PLANNER_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

/*
 * The most nodes the coordinator keeps (its MAX_NODES, a protocol limit).
 * The planner's buffers are sized for it: the caller adds no more nodes.
 */
#define PLANNER_MAX_NODES 1024

/**
 * planner_out_fn - where a plan goes: node @node is to pull @version as
 * @fields say (a PLAN message's fields, docs/protocol.md: "version",
 * "digest", "donors" (an array of {"node", "addr"}), "stripe", and "base"
 * when it takes deltas; NULL when they could not be made).  The callback
 * owns @fields (json_decref() it).
 */
typedef void (*planner_out_fn)(void *arg, const char *node, const char *version, json_t *fields);

struct planner;

/**
 * planner_new() - an empty planner whose plans arrange receivers with fan-out
 * @fanout (1 chain, K tree:K, 0 star: coord_opts.fanout) and go to @out with
 * @arg.  Returns NULL when out of memory.
 */
struct planner *planner_new(unsigned fanout, planner_out_fn out, void *arg);

/** Free @pl and everything it holds.  NULL is a no-op. */
void planner_free(struct planner *pl);

/**
 * planner_add_node() - node @name, reachable at @addr (what its pullers are
 * told), joins alive.  Returns its index (0, 1, ...: the number of nodes
 * before it), -ENOSPC past PLANNER_MAX_NODES + 1 nodes (a publisher and
 * PLANNER_MAX_NODES receivers), or -ENOMEM.
 */
int planner_add_node(struct planner *pl, const char *name, const char *addr);

/**
 * planner_add_version() - version @name, announced by node @origin, with
 * its manifest (@manifest, @mlen bytes of manifest_build(): copied), its
 * digest @digest (hex, manifest_digest()) and its distinct shard bytes
 * @bytes.  Returns 0 or -ENOMEM.
 */
int planner_add_version(struct planner *pl, const char *name, const char *origin,
			const void *manifest, size_t mlen, const char *digest, uint64_t bytes);

/**
 * planner_set_have() - node @node holds version @version complete (its
 * digest the version's), @held of @needed bytes (what the have-table
 * records beside it).  Returns 0, or -ENOENT for an unknown node or version.
 */
int planner_set_have(struct planner *pl, size_t node, const char *version, uint64_t held,
		     uint64_t needed);

/**
 * planner_announce() - @version was announced: plan it for every alive node
 * that lacks it (the coordinator's plan_all()).  Returns 0 or -ENOENT.
 */
int planner_announce(struct planner *pl, const char *version);

/**
 * planner_join() - node @node joined late: plan every version it lacks, from
 * all their complete holders, striped (plan_for()).  Returns 0 or -ENOENT.
 */
int planner_join(struct planner *pl, size_t node);

/**
 * planner_node_dead() - node @node is noticed dead: the nodes that pulled
 * from it are re-planned onto its own live donors (plan_deaths()).  Returns
 * 0 or -ENOENT.
 */
int planner_node_dead(struct planner *pl, size_t node);

#endif /* HWFS_PLANNER_H */
