/*
 * hwfs_sim.c — `hwfs sim`: predict how one version replicates over a
 * modelled cluster (tools/sim/sim.h; the model, its assumptions and limits
 * are docs/sim.md; the options are docs/cli.md and hwfs(1)).
 *
 *   hwfs sim [--nodes N] [--size BYTES] [--link RATE] [--topology T] ... [--json]
 *
 * Rates not given are measured on this machine first (sim_calibrate(): a few
 * hundred MiB of XXH3, memcpy and the delta codec), so a run without them
 * predicts this machine's kind of CPU; give every rate for a deterministic
 * run.  Output: each node's convergence time, bytes per link, the critical
 * path and what bounds the run; --json prints sim_run()'s object.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hwfs_cli.h"
#include "../sim/sim.h"
#include "tunables.h"

#define SIM_USAGE                                                                              \
	"hwfs sim [--nodes N] [--size BYTES] [--link RATE] [--latency TIME]\n"                 \
	"                [--topology chain|tree:K|star] [--shard BYTES] [--piece BYTES]\n"      \
	"                [--delta FRACTION] [--delta-ratio R] [--relay store|cut]\n"            \
	"                [--encode first-request|ahead] [--codec-workers N] [--io-threads N]\n" \
	"                [--host-cores N | --node-cores N] [--hash GIB/S] [--copy GIB/S]\n"     \
	"                [--encode-rate GIB/S] [--decode GIB/S] [--net-cpu S/GIB]\n"            \
	"                [--overhead F] [--control TIME] [--finish TIME] [--finish-cpu TIME]\n"  \
	"                [--rebuild separate|fused]\n"                                       \
	"                [--late-join TIME]... [--kill NODE@TIME]... [--calibrate-mib N] [--json]"

static void help(void)
{
	printf("usage: %s\n\n"
	       "Simulates replicating one version from `pub` to N receivers with the\n"
	       "coordinator's own planner (docs/sim.md).  Defaults: 1 receiver, 1GiB, 1gbit\n"
	       "links, %gus latency, chain, shards of max_shard, pieces of piece_bytes,\n"
	       "whole shards; rates not given are measured here first.\n\n"
	       "  --nodes N            receivers (the publisher is one more)\n"
	       "  --size BYTES         the version (K/M/G/T suffixes, powers of 2)\n"
	       "  --link RATE          each node's link, each way: 1gbit, 100gbit, 400g, 800mbit\n"
	       "  --latency TIME       one way per hop: 50us, 1ms, 0.001\n"
	       "  --topology T         chain, tree:K or star (hwfs coord --topology)\n"
	       "  --delta FRACTION     an update: every node holds the previous version and\n"
	       "                       FRACTION of the elements changed (deltas)\n"
	       "  --delta-ratio R      delta bytes / shard bytes (default: the codec's on bf16\n"
	       "                       with FRACTION changed, measured here)\n"
	       "  --relay store|cut    a relay forwards a delta after rebuilding its shard\n"
	       "                       (store, today) or as its pieces arrive (cut)\n"
	       "  --encode first-request|ahead\n"
	       "                       the publisher encodes the whole version at the first\n"
	       "                       request (today) or each shard ahead, in codec workers\n"
	       "  --codec-workers N    codec threads per node; 0: the agent thread (today)\n"
	       "  --io-threads N       ZeroMQ I/O threads per node, the sockets' CPU (default 1)\n"
	       "  --host-cores N       every node on one host of N cores (make bench-cluster: 2)\n"
	       "  --node-cores N       else cores per node (default 0: never short)\n"
	       "  --hash, --copy, --encode-rate, --decode GIB/S   CPU rates of one core\n"
	       "  --net-cpu S/GIB      socket CPU per GiB, each side (default %g)\n"
	       "  --overhead F         wire bytes per payload byte (default %g)\n"
	       "  --control TIME       announce -> first request (default %gs)\n"
	       "  --finish TIME        last shard -> version visible (default %gs)\n"
	       "  --finish-cpu TIME    CPU of that step (import, seal) on the agent thread\n"
	       "                       and a core; it takes the longer of the two (default 0)\n"
	       "  --rebuild separate|fused\n"
	       "                       a rebuild costs decode + hash + copy (separate, default)\n"
	       "                       or the decode rate alone (fused: delta_decode_hash\n"
	       "                       straight into the staged range, as the codec workers do)\n"
	       "  --late-join TIME     a node joins then (striped from the complete holders)\n"
	       "  --kill NODE@TIME     receiver NODE (r3) dies then; the coordinator notices\n"
	       "                       node_dead_ms later and re-plans\n"
	       "  --calibrate-mib N    MiB the calibration runs over (default %d)\n"
	       "  --json               the whole result as JSON\n",
	       SIM_USAGE, SIM_LATENCY_S * 1e6, SIM_NET_CPU_S, SIM_OVERHEAD, SIM_CONTROL_S, SIM_FINISH_S, SIM_CALIBRATE_MIB);
}

/* "100gbit", "400g", "800mbit", "1e9": bits per second. */
static int parse_rate(const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end), mul = 1;

	if (end == s || v <= 0)
		return -EINVAL;
	switch (tolower((unsigned char)*end)) {
	case 'k':
		mul = 1e3;
		end++;
		break;
	case 'm':
		mul = 1e6;
		end++;
		break;
	case 'g':
		mul = 1e9;
		end++;
		break;
	case 't':
		mul = 1e12;
		end++;
		break;
	}
	if (*end && strcasecmp(end, "bit") && strcasecmp(end, "bps") && strcasecmp(end, "bit/s"))
		return -EINVAL;
	*out = v * mul;
	return 0;
}

/* "50us", "1ms", "2s", "0.5": seconds. */
static int parse_time(const char *s, double *out)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || v < 0)
		return -EINVAL;
	if (!strcmp(end, "us"))
		v /= 1e6;
	else if (!strcmp(end, "ms"))
		v /= 1e3;
	else if (*end && strcmp(end, "s"))
		return -EINVAL;
	*out = v;
	return 0;
}

static double num(const char *opt, const char *s, double lo)
{
	char *end;
	double v = strtod(s, &end);

	if (end == s || *end || v < lo)
		die("%s: not a number >= %g: %s", opt, lo, s);
	return v;
}

static double cpu_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

static const char *gib(json_int_t b, char *buf, size_t len)
{
	snprintf(buf, len, "%.2f GiB", (double)b / (1ull << 30));
	return buf;
}

static void print_human(json_t *res, double cpu)
{
	json_t *p = json_object_get(res, "params"), *nodes = json_object_get(res, "nodes");
	json_t *links = json_object_get(res, "links"), *path = json_object_get(res, "critical_path");
	json_t *u = json_object_get(res, "utilisation"), *x;
	json_t *conv = json_object_get(res, "converged_s");
	size_t i, np = json_array_size(path), nn = json_array_size(nodes);
	char b1[32];

	printf("simulated: %s, %s, %s, to %lld receivers; links %.4g Gbit/s; %s\n",
	       json_string_value(json_object_get(p, "topology")),
	       gib(json_integer_value(json_object_get(p, "size")), b1, sizeof(b1)),
	       json_is_true(json_object_get(p, "delta")) ? "deltas" : "whole shards",
	       (long long)json_integer_value(json_object_get(p, "nodes")),
	       json_real_value(json_object_get(p, "link_bps")) / 1e9,
	       json_integer_value(json_object_get(p, "host_cores")) ? "all nodes on one host"
								      : "a host per node");
	if (json_is_real(conv))
		printf("converged: %.3f s = %.3f x S/B (S/B %.3f s); bottleneck: %s\n",
		       json_real_value(conv), json_real_value(json_object_get(res, "x_s_over_b")),
		       json_real_value(json_object_get(res, "s_over_b")),
		       json_string_value(json_object_get(res, "bottleneck")));
	else
		printf("NOT converged: %lld receivers complete\n",
		       (long long)json_integer_value(json_object_get(res, "converged_nodes")));
	printf("\nnode        converged s    in         out        donors\n");
	for (i = 0; i < nn; i++) {
		json_t *n = json_array_get(nodes, i), *c = json_object_get(n, "converged_s"), *d;
		char b2[32], b3[32], b4[32], dn[256] = "";
		size_t j, off = 0;

		if (nn > 24 && i >= 12 && i + 12 < nn) {
			if (i == 12)
				printf("  ... %zu more ...\n", nn - 24);
			continue;
		}
		json_array_foreach(json_object_get(n, "donors"), j, d)
			if (off < sizeof(dn) - 40)
				off += snprintf(dn + off, sizeof(dn) - off, "%s%s", j ? "," : "",
						json_string_value(d));
		printf("%-10s %10s  %10s %10s  %s%s\n", json_string_value(json_object_get(n, "node")),
		       json_is_real(c) ? (snprintf(b4, sizeof(b4), "%.3f", json_real_value(c)), b4) :
		       json_is_true(json_object_get(n, "alive")) ? "-" : "dead",
		       gib(json_integer_value(json_object_get(n, "bytes_in")), b2, sizeof(b2)),
		       gib(json_integer_value(json_object_get(n, "bytes_out")), b3, sizeof(b3)), dn,
		       json_is_true(json_object_get(n, "delta")) ? " (delta)" : "");
	}
	printf("\nlinks: %zu (from -> to: wire bytes)", json_array_size(links));
	for (i = 0; i < json_array_size(links) && i < 12; i++) {
		x = json_array_get(links, i);
		printf("%s %s->%s %s", i ? "," : "", json_string_value(json_object_get(x, "from")),
		       json_string_value(json_object_get(x, "to")),
		       gib(json_integer_value(json_object_get(x, "bytes")), b1, sizeof(b1)));
	}
	printf("%s\n", json_array_size(links) > 12 ? ", ..." : "");
	printf("critical path (the last shard of the last node, back to pub), depth %zu:\n ",
	       np ? np - 1 : 0);
	for (i = 0; i < np; i++) {
		if (np > 16 && i >= 8 && i + 8 < np) {
			if (i == 8)
				printf(" <- ...");
			continue;
		}
		x = json_array_get(path, i);
		printf("%s%s %.3f", i ? " <- " : " ", json_string_value(json_object_get(x, "node")),
		       json_real_value(json_object_get(x, "t")));
	}
	{
		char *us = json_dumps(u, JSON_COMPACT);

		printf("\nutilisation: %s\n", us ? us : "");
		free(us);
	}
	printf("model pieces %lld bytes; %lld events; %.2f CPU s\n",
	       (long long)json_integer_value(json_object_get(p, "model_piece_bytes")),
	       (long long)json_integer_value(json_object_get(res, "events")), cpu);
}

/*
 * Measure the rates @p lacks (over @cal_mib MiB), run the simulation and
 * print its result: as JSON with @json, else for people; the CPU since @t0
 * is the run's "sim_cpu_s".  A failure dies with its sentence.
 */
static void sim_and_print(struct sim_params *p, unsigned cal_mib, int json, double t0)
{
	char err[256];
	json_t *res;
	int r;

	if (p->r.hash <= 0 || p->r.copy <= 0 ||
	    (p->delta && (p->r.encode <= 0 || p->r.decode <= 0 || p->r.delta_ratio <= 0))) {
		if (!json)
			fprintf(stderr, "hwfs sim: measuring the rates not given (%u MiB)...\n", cal_mib);
		r = sim_calibrate(&p->r, p->changed, cal_mib);
		if (r < 0)
			die("calibration: %s", strerror(-r));
	}
	r = sim_run(p, &res, err, sizeof(err));
	if (r < 0)
		die("%s", err);
	json_object_set_new(res, "sim_cpu_s", json_real(cpu_now() - t0));
	if (json) {
		if (json_dumpf(res, stdout, JSON_INDENT(1)) < 0)
			die("cannot write the result");
		putchar('\n');
	} else {
		print_human(res, cpu_now() - t0);
	}
	json_decref(res);
}

/*
 * Apply option @c of the cluster's shape (its argument @arg) to @p: nodes,
 * sizes, links, topology, timings, late joins and deaths.  A bad value
 * dies with its sentence.  Returns 1, or 0 when @c is not one of them.
 */
static int opt_cluster(int c, const char *arg, struct sim_params *p)
{
	switch (c) {
	case 'n':
		p->nodes = (unsigned)num("--nodes", arg, 1);
		return 1;
	case 's':
		if (hwfs_parse_size(arg, &p->size) < 0 || !p->size)
			die("--size: not a size: %s", arg);
		return 1;
	case 'l':
		if (parse_rate(arg, &p->link_bps) < 0)
			die("--link: not a rate (1gbit, 100gbit): %s", arg);
		return 1;
	case 'L':
		if (parse_time(arg, &p->latency_s) < 0)
			die("--latency: not a time (50us, 1ms): %s", arg);
		return 1;
	case 't':
		if (parse_topology(arg, &p->fanout) < 0)
			die("--topology: chain, tree:K (K 1..1024) or star: %s", arg);
		return 1;
	case 'S':
		if (hwfs_parse_size(arg, &p->shard_bytes) < 0 || !p->shard_bytes)
			die("--shard: not a size: %s", arg);
		return 1;
	case 'p':
		if (hwfs_parse_size(arg, &p->piece_bytes) < 0 || !p->piece_bytes)
			die("--piece: not a size: %s", arg);
		return 1;
	case 'o':
		p->overhead = num("--overhead", arg, 1);
		return 1;
	case 'T':
		if (parse_time(arg, &p->control_s) < 0)
			die("--control: not a time: %s", arg);
		return 1;
	case 'F':
		if (parse_time(arg, &p->finish_s) < 0)
			die("--finish: not a time: %s", arg);
		return 1;
	case 'P':
		if (parse_time(arg, &p->finish_cpu_s) < 0)
			die("--finish-cpu: not a time: %s", arg);
		return 1;
	case 'j':
		if (p->n_late == SIM_MAX_LATE || parse_time(arg, &p->late[p->n_late]) < 0)
			die("--late-join: a time, at most %d of them: %s", SIM_MAX_LATE, arg);
		p->n_late++;
		return 1;
	case 'k': {
		const char *at = strchr(arg, '@');

		if (p->n_kill == SIM_MAX_KILLS || !at || at == arg ||
		    (size_t)(at - arg) >= sizeof(p->kill_name[0]) ||
		    parse_time(at + 1, &p->kill_at[p->n_kill]) < 0)
			die("--kill: NODE@TIME (r3@2.5), at most %d: %s", SIM_MAX_KILLS, arg);
		snprintf(p->kill_name[p->n_kill], sizeof(p->kill_name[0]), "%.*s",
			 (int)(at - arg), arg);
		p->n_kill++;
		return 1;
	}
	}
	return 0;
}

/*
 * Apply option @c of the work's model (its argument @arg) to @p: deltas,
 * relays, encoding, threads, cores and CPU rates.  A bad value dies with
 * its sentence.  Returns 1, or 0 when @c is not one of them.
 */
static int opt_work(int c, const char *arg, struct sim_params *p)
{
	switch (c) {
	case 'd':
		p->delta = 1;
		p->changed = num("--delta", arg, 0);
		if (p->changed > 1)
			die("--delta: a fraction (0.02 = 2%%): %s", arg);
		return 1;
	case 'R':
		p->r.delta_ratio = num("--delta-ratio", arg, 1e-9);
		return 1;
	case 'r':
		if (strcmp(arg, "store") && strcmp(arg, "cut"))
			die("--relay: store or cut: %s", arg);
		p->relay = strcmp(arg, "cut") ? SIM_RELAY_STORE : SIM_RELAY_CUT;
		return 1;
	case 'e':
		if (strcmp(arg, "first-request") && strcmp(arg, "ahead"))
			die("--encode: first-request or ahead: %s", arg);
		p->encode = strcmp(arg, "ahead") ? SIM_ENCODE_FIRST_REQUEST : SIM_ENCODE_AHEAD;
		return 1;
	case 'w':
		p->codec_workers = (unsigned)num("--codec-workers", arg, 0);
		return 1;
	case 'I':
		p->io_threads = (unsigned)num("--io-threads", arg, 1);
		return 1;
	case 'H':
		p->host_cores = (unsigned)num("--host-cores", arg, 0);
		return 1;
	case 'N':
		p->node_cores = (unsigned)num("--node-cores", arg, 0);
		return 1;
	case 'x':
		p->r.hash = num("--hash", arg, 1e-6);
		return 1;
	case 'c':
		p->r.copy = num("--copy", arg, 1e-6);
		return 1;
	case 'E':
		p->r.encode = num("--encode-rate", arg, 1e-6);
		return 1;
	case 'D':
		p->r.decode = num("--decode", arg, 1e-6);
		return 1;
	case 'C':
		p->r.net_send_s = p->r.net_recv_s = num("--net-cpu", arg, 0);
		return 1;
	case 'B':
		if (strcmp(arg, "separate") && strcmp(arg, "fused"))
			die("--rebuild: separate or fused: %s", arg);
		p->rebuild_fused = !strcmp(arg, "fused");
		return 1;
	}
	return 0;
}

int cmd_sim(int argc, char **argv)
{
	static const struct option lo[] = {
		{"nodes", required_argument, NULL, 'n'},      {"size", required_argument, NULL, 's'},
		{"link", required_argument, NULL, 'l'},       {"latency", required_argument, NULL, 'L'},
		{"topology", required_argument, NULL, 't'},   {"shard", required_argument, NULL, 'S'},
		{"piece", required_argument, NULL, 'p'},      {"delta", required_argument, NULL, 'd'},
		{"delta-ratio", required_argument, NULL, 'R'}, {"relay", required_argument, NULL, 'r'},
		{"encode", required_argument, NULL, 'e'},     {"codec-workers", required_argument, NULL, 'w'},
		{"host-cores", required_argument, NULL, 'H'}, {"node-cores", required_argument, NULL, 'N'},
		{"hash", required_argument, NULL, 'x'},       {"copy", required_argument, NULL, 'c'},
		{"encode-rate", required_argument, NULL, 'E'}, {"decode", required_argument, NULL, 'D'},
		{"net-cpu", required_argument, NULL, 'C'},    {"overhead", required_argument, NULL, 'o'},
		{"control", required_argument, NULL, 'T'},    {"finish", required_argument, NULL, 'F'},
		{"late-join", required_argument, NULL, 'j'},  {"kill", required_argument, NULL, 'k'},
		{"calibrate-mib", required_argument, NULL, 'M'}, {"json", no_argument, NULL, 'J'},
		{"io-threads", required_argument, NULL, 'I'},
		{"finish-cpu", required_argument, NULL, 'P'}, {"rebuild", required_argument, NULL, 'B'},
		{"help", no_argument, NULL, 'h'},             {NULL, 0, NULL, 0}};
	struct sim_params p;
	unsigned cal_mib = SIM_CALIBRATE_MIB;
	int json = 0, c;
	double t0 = cpu_now();

	sim_defaults(&p);
	opterr = 0;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", lo, NULL)) != -1) {
		if (opt_cluster(c, optarg, &p) || opt_work(c, optarg, &p))
			continue;
		switch (c) {
		case 'M':
			cal_mib = (unsigned)num("--calibrate-mib", optarg, 1);
			break;
		case 'J':
			json = 1;
			break;
		case 'h':
			help();
			return 0;
		default:
			usage_die(SIM_USAGE);
		}
	}
	if (optind < argc)
		usage_die(SIM_USAGE);
	sim_and_print(&p, cal_mib, json, t0);
	return 0;
}
