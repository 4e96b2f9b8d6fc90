/*
 * sim.h — `hwfs sim`: a discrete-event simulator of replicating one version
 * over a modelled cluster (docs/sim.md).
 *
 * The planner is the coordinator's own (coord_plan.c, unchanged, through
 * replicator/planner.h): the simulator hands it the announce, each late
 * join and each death the coordinator notices, and moves bytes as its plans
 * say.
 * What it models: every node's link (rate each way, latency), pieces
 * forwarded cut-through by relays, the publisher's encode, each receiver's
 * rebuild of a delta (store-and-forward or cut-through relays, on the agent
 * thread or a pool of codec workers), the per-byte CPU of the sockets (on
 * ZeroMQ's I/O threads) and of copying and hashing (the agent thread), and cores shared by every node of one host (--host-cores) or
 * each node's own.  Results: each node's convergence time, bytes per link,
 * the critical path and what bounds the run.
 */
#ifndef HWFS_SIM_H
#define HWFS_SIM_H

#include <jansson.h>
#include <stdint.h>

#define SIM_MAX_EVENTS_PER_RUN (1ull << 25) /* piece-hops before pieces are coarsened */
/*
 * The model's defaults (sim_defaults(); docs/sim.md says where each comes from).
 * They describe the simulated cluster, not this daemon: the daemon's own knobs
 * (piece_bytes, max_shard, node_dead_ms) are read from hwfs_tun.
 */
#define SIM_LATENCY_S 50e-6     /* one way per hop */
#define SIM_OVERHEAD 1.046      /* wire bytes per payload byte: bench-cluster's tbf count */
#define SIM_NET_CPU_S 0.375     /* socket CPU s per GiB each side: the VM's raw TCP link check / 2 */
#define SIM_CONTROL_S 0.005     /* a plan to its first request */
#define SIM_FINISH_S 0.020      /* a node's last shard to its version visible */
#define SIM_CALIBRATE_MIB 128   /* what sim_calibrate() runs over by default */
#define SIM_MAX_LATE 64                     /* late joiners of one run */
#define SIM_MAX_KILLS 64                    /* deaths of one run */

/** How a relay forwards a delta: after rebuilding its shard, or piece by piece. */
enum sim_relay { SIM_RELAY_STORE = 0, SIM_RELAY_CUT = 1 };
/** When the publisher encodes: the whole version at the first request (before issue 20), or ahead. */
enum sim_encode { SIM_ENCODE_FIRST_REQUEST = 0, SIM_ENCODE_AHEAD = 1 };

/** CPU rates, GiB/s of shard bytes (net: CPU seconds per GiB sent or received). */
struct sim_rates {
	double hash;    /* XXH3 of a received or rebuilt shard */
	double copy;    /* writing a rebuilt shard into the arena */
	double encode;  /* delta_encode of a shard against its base */
	double decode;  /* delta_decode (rebuild) of a shard */
	double net_send_s, net_recv_s; /* CPU s per GiB through the sockets, each side */
	double delta_ratio; /* delta bytes / shard bytes at the run's changed fraction */
};

/** One run's parameters (sim_defaults() fills them). */
struct sim_params {
	unsigned nodes;        /* receivers (the publisher is one more) */
	uint64_t size;         /* bytes of the version */
	uint64_t shard_bytes;  /* its shards (the last may be shorter) */
	uint64_t piece_bytes;  /* hwfs_tun.piece_bytes: what a relay forwards at once */
	double link_bps;       /* bits/s of each node's link, each way */
	double latency_s;      /* one way, per hop */
	double overhead;       /* wire bytes / payload bytes (Ethernet/IP/TCP framing) */
	unsigned fanout;       /* 1 chain, K tree:K, 0 star (coord_opts.fanout) */
	int delta;             /* every node holds the previous version: deltas against it */
	double changed;        /* fraction of elements changed (informative with delta_ratio) */
	enum sim_relay relay;
	enum sim_encode encode;
	unsigned codec_workers; /* per node; 0: the agent thread does the codec work (before issue 20) */
	unsigned io_threads;    /* per node: ZeroMQ's I/O threads (the sockets' CPU) */
	unsigned host_cores;    /* > 0: every node on one host of this many cores */
	unsigned node_cores;    /* with host_cores 0: cores per node (0: never short) */
	double control_s;       /* announce -> plan -> first request */
	double finish_s;        /* a node's last shard -> the version visible */
	double finish_cpu_s;    /* CPU of that step (import, seal), on the agent thread and a core */
	int rebuild_fused;      /* the decode rate covers the hash and the write (delta_decode_hash
				   straight into the staged range): a rebuild costs decode only */
	struct sim_rates r;
	double late[SIM_MAX_LATE]; /* late joiners' join times (s) */
	unsigned n_late;
	char kill_name[SIM_MAX_KILLS][32]; /* nodes that die, and when (s) */
	double kill_at[SIM_MAX_KILLS];
	unsigned n_kill;
};

/** Defaults: 1 receiver, tunables' piece and shard sizes, rates unset (<= 0). */
void sim_defaults(struct sim_params *p);

/**
 * sim_calibrate() - measure on this machine the rates of @r still <= 0: XXH3,
 * memcpy, the delta codec (encode, decode, and the delta's size for a bf16
 * tensor with @changed of its elements changed) over @mib MiB.  The socket
 * CPU is not measured (DESIGN.md §8's figure is the default).  Returns 0 or
 * -ENOMEM.
 */
int sim_calibrate(struct sim_rates *r, double changed, unsigned mib);

/**
 * sim_run() - simulate @p.  *@out gets the result (docs/sim.md: "converged_s",
 * "nodes", "links", "critical_path", "bottleneck", "utilisation", ...), a new
 * object.  Returns 0, -EINVAL (@err says why) or -ENOMEM.
 */
int sim_run(const struct sim_params *p, json_t **out, char *err, size_t errlen);

#endif /* HWFS_SIM_H */
