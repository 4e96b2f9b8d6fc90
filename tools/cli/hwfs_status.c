/*
 * hwfs_status.c — `hwfs status`: the node as its daemon reports it (store,
 * GPU, current, the last refused commit, versions, engines, leases, space
 * held by open files, replication), and with --cluster the coordinator's
 * table of nodes and versions (--watch: redrawn until nothing replicates);
 * --json prints the daemon's answer.  The versions table is `hwfs ls`'s too
 * (cli_print_versions()).  A client verb: in build/hwfs and build/hwfs-core
 * (hwfs_cli.h), on the helpers of hwfs_client.h.
 */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "hwfs_api.h" /* first: the public API beside hwfs_common.h */
#include "hwfs_cli.h"
#include "hwfs_client.h"

/* The versions table of status and ls: name, state, files, tensors, bytes, digest, parse errors. */
void cli_print_versions(json_t *vers)
{
	size_t i;
	json_t *v;

	printf("%-24s %-8s %6s %8s %12s  %s\n", "VERSION", "STATE", "FILES", "TENSORS", "BYTES",
	       "DIGEST");
	json_array_foreach(vers, i, v) {
		char sz[32];
		json_t *errs = json_object_get(v, "errors"), *e;
		size_t k;

		printf("%-24s %-8s %6lld %8lld %12s  %s\n", cli_jstr(v, "name"), cli_jstr(v, "state"),
		       (long long)cli_jint(v, "files"), (long long)cli_jint(v, "tensors"),
		       hwfs_fmt_size((uint64_t)cli_jint(v, "bytes"), sz, sizeof(sz)),
		       cli_jstr(v, "digest"));
		json_array_foreach(errs, k, e)
			printf("    %s: not parsed as safetensors: %s\n", cli_jshown(e, "file"),
			       cli_jshown(e, "error"));
	}
}

/*
 * One line per registered engine of @engines (status's "engines"): what it
 * serves, the version it shadow-loads and how that stands, its last swap.
 */
static void print_engines(const char *indent, json_t *engines)
{
	size_t k;
	json_t *e;

	json_array_foreach(engines, k, e) {
		json_t *shadow = json_object_get(e, "shadow"), *reason = json_object_get(e, "reason");

		printf("%sengine:  %s (pid %lld): serving %s", indent, cli_jstr(e, "name"),
		       (long long)cli_jint(e, "pid"),
		       json_is_string(json_object_get(e, "serving")) ? cli_jstr(e, "serving")
								     : "nothing");
		if (json_is_string(shadow))
			printf(", shadow %s %s%s%s", json_string_value(shadow), cli_jstr(e, "state"),
			       json_is_string(reason) ? ": " : "",
			       json_is_string(reason) ? json_string_value(reason) : "");
		if (cli_jint(e, "swaps"))
			printf("; last swap paused %lld us (%lld swaps)",
			       (long long)cli_jint(e, "last_swap_pause_us"), (long long)cli_jint(e, "swaps"));
		if (json_is_integer(json_object_get(e, "last_drain_us")))
			printf(", drain %lld us", (long long)cli_jint(e, "last_drain_us"));
		if (json_is_integer(json_object_get(e, "last_swap_us")))
			printf(", swap %lld us", (long long)cli_jint(e, "last_swap_us"));
		printf("\n");
	}
}

/*
 * status's gpu line: "gpu: none (why)", or the devices (PCI address, compute
 * capability, free of total memory), the runtime and driver versions and how
 * much of the arena is pinned for CUDA.
 */
static void print_gpu(json_t *res)
{
	json_t *g = json_object_get(res, "gpu"), *dev;
	const char *note = cli_jstr(res, "gpu_note");
	char a[32], b[32];
	size_t k;

	if (!json_is_object(g)) {
		if (json_object_get(res, "gpu_note")) /* a daemon from before the GPU plane: nothing */
			printf("gpu:     none (%s)\n", *note ? note : "no usable CUDA device");
		return;
	}
	k = json_array_size(json_object_get(g, "devices"));
	printf("gpu:     %zu device%s (", k, k == 1 ? "" : "s");
	json_array_foreach(json_object_get(g, "devices"), k, dev) {
		if (json_is_string(json_object_get(dev, "error")))
			printf("%s%lld: %s", k ? "; " : "", (long long)cli_jint(dev, "index"),
			       cli_jstr(dev, "error"));
		else if (!json_object_get(dev, "free_bytes")) /* no context there: not asked */
			printf("%s%lld: %s cc %s, memory not queried", k ? "; " : "",
			       (long long)cli_jint(dev, "index"), cli_jstr(dev, "pci"), cli_jstr(dev, "cc"));
		else
			printf("%s%lld: %s cc %s, %s free of %s", k ? "; " : "",
			       (long long)cli_jint(dev, "index"), cli_jstr(dev, "pci"), cli_jstr(dev, "cc"),
			       hwfs_fmt_size((uint64_t)cli_jint(dev, "free_bytes"), a, sizeof(a)),
			       hwfs_fmt_size((uint64_t)cli_jint(dev, "total_bytes"), b, sizeof(b)));
	}
	printf("), runtime %s, driver %s, %s pinned\n", cli_jstr(g, "runtime"), cli_jstr(g, "driver"),
	       hwfs_fmt_size((uint64_t)cli_jint(g, "pinned_bytes"), a, sizeof(a)));
}

/* One line for the leases of status: each mapped version and the pid holding it. */
static void print_leases(json_t *leases)
{
	size_t k;
	json_t *l;

	if (!json_array_size(leases))
		return;
	printf("leases: ");
	json_array_foreach(leases, k, l)
		printf("%s %s (pid %lld)", k ? "," : "", cli_jstr(l, "version"), (long long)cli_jint(l, "pid"));
	printf("\n");
}

/*
 * status's "held" line, beside the leases: the space open files keep (files
 * of removed versions still open, files being written); nothing when none.
 */
/* A member of @o as a number (a JSON real or integer), 0 when absent. */
static double jnum(json_t *o, const char *k)
{
	return json_number_value(json_object_get(o, k));
}

/*
 * The replication CPU of the node (status replication.cpu), per GiB of what
 * it moved: the agent thread's receiving per GiB received, its serving and
 * forwarding per GiB sent, and every replication thread (agent, ZeroMQ I/O,
 * codec workers) per GiB received plus sent.  Nothing before a byte moved.
 */
static void print_repl_cpu(json_t *rep)
{
	json_t *cpu = json_object_get(rep, "cpu");
	double rx = (double)cli_jint(rep, "bytes_received") / (1 << 30);
	double tx = (double)cli_jint(rep, "bytes_sent") / (1 << 30);
	double all = jnum(cpu, "agent_s") + jnum(cpu, "io_s") + jnum(cpu, "codec_s");

	if (!cpu || rx + tx <= 0)
		return;
	printf("cpu:     %.2f s (agent thread %.2f, ZeroMQ I/O %.2f, codec %.2f): %.2f s per GiB "
	       "moved",
	       all, jnum(cpu, "agent_s"), jnum(cpu, "io_s"), jnum(cpu, "codec_s"), all / (rx + tx));
	if (rx > 0)
		printf("; receiving %.2f s/GiB received", jnum(cpu, "receive_s") / rx);
	if (tx > 0)
		printf("; serving and forwarding %.2f s/GiB sent",
		       (jnum(cpu, "serve_s") + jnum(cpu, "forward_s")) / tx);
	printf("\n");
}

static void print_held(json_t *held)
{
	int64_t rf = cli_jint(held, "removed_files"), wf = cli_jint(held, "writing_files");
	char a[32], b[32];

	if (!rf && !wf)
		return;
	printf("held:    ");
	if (rf)
		printf("%lld removed file%s still open (%s)", (long long)rf,
		       rf == 1 ? "" : "s",
		       hwfs_fmt_size((uint64_t)cli_jint(held, "removed_bytes"), a, sizeof(a)));
	if (wf)
		printf("%s%lld file%s being written (%s)", rf ? ", " : "", (long long)wf,
		       wf == 1 ? "" : "s",
		       hwfs_fmt_size((uint64_t)cli_jint(held, "writing_bytes"), b, sizeof(b)));
	printf("\n");
}

/*
 * Percent of a version a node holds, 0..100.  The coordinator keeps a node's
 * last HAVE: bytes_held (distinct shard bytes here) and bytes_needed (those
 * still missing), so the version's size is their sum; dividing by
 * bytes_needed alone showed 44% as 77% and overflowed the bar past 50%.
 */
static int progress_pct(int64_t held, int64_t missing, int complete)
{
	if (complete)
		return 100;
	if (held <= 0)
		return 0;
	if (missing <= 0)
		return 99; /* all bytes here, the version not built yet */
	return (int)HWFS_MIN(99.0, 100.0 * (double)held / ((double)held + (double)missing));
}

/* Print the cluster table once; returns how many (node, version) are still replicating. */
static int print_cluster(json_t *cl)
{
	int busy = 0;
	json_t *n, *v;
	size_t i, k;
	char a[32], b[32];

	printf("coordinator %s, committed: %s\n", cli_jstr(cl, "coordinator"),
	       json_is_string(json_object_get(cl, "committed")) ? cli_jstr(cl, "committed") : "(none)");
	json_array_foreach(json_object_get(cl, "nodes"), i, n) {
		printf("%-16s %-5s %s  current: %s%s\n", cli_jstr(n, "name"),
		       json_is_true(json_object_get(n, "alive")) ? "up" : "DOWN", cli_jstr(n, "addr"),
		       json_is_string(json_object_get(n, "current")) ? cli_jstr(n, "current") : "(none)",
		       json_is_true(json_object_get(n, "diverged")) ? "  DIVERGED from the committed version"
								    : "");
		json_array_foreach(json_object_get(n, "versions"), k, v) {
			int64_t held = cli_jint(v, "bytes_held"), missing = cli_jint(v, "bytes_needed");
			int complete = json_is_true(json_object_get(v, "complete")), w = 30;
			int pct = progress_pct(held, missing, complete), fill = pct * w / 100;

			printf("    %-20s [%.*s%*s] %3d%% ", cli_jstr(v, "name"), fill,
			       "##############################", w - fill, "", pct);
			if (complete)
				printf("complete\n");
			else
				printf("(%s of %s) %s\n",
				       hwfs_fmt_size((uint64_t)HWFS_MAX(held, 0), a, sizeof(a)),
				       hwfs_fmt_size((uint64_t)HWFS_MAX(held, 0) +
						     (uint64_t)HWFS_MAX(missing, 0), b, sizeof(b)),
				       json_is_string(json_object_get(v, "waiting"))
					       ? cli_jstr(v, "waiting") : "replicating");
			busy += !complete && json_is_true(json_object_get(n, "alive"));
		}
		print_engines("    ", json_object_get(n, "engines"));
	}
	return busy;
}

/*
 * status --cluster: the coordinator's have-table, through this node.  With
 * --watch, redraw every second until nothing is replicating.
 */
static int status_cluster(void)
{
	for (;;) {
		json_t *res = cli_call(json_pack("{s:s}", "op", "cluster"), 1);
		json_t *cl = json_object_get(res, "cluster");
		int busy;

		if (cli_json) {
			json_dumpf(cl, stdout, JSON_INDENT(2));
			fputc('\n', stdout);
			json_decref(res);
			return 0;
		}
		if (cli_watch && isatty(1))
			printf("\033[H\033[2J");
		busy = print_cluster(cl);
		json_decref(res);
		fflush(stdout);
		if (!cli_watch || !busy)
			return 0;
		sleep(1);
	}
}

/* status's last refused commit ({"version", "reason", "errno", "at"}), when there is one. */
static void print_refused(json_t *r)
{
	char when[32];
	time_t at;

	if (!json_is_object(r))
		return;
	at = (time_t)cli_jint(r, "at");
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&at));
	printf("last refused commit: %s at %s: %s\n", cli_jstr(r, "version"), when, cli_jstr(r, "reason"));
}

int cmd_status(int argc, char **argv)
{
	json_t *res, *st, *v;
	char a[32], b[32];
	size_t k;

	cli_opts(argc, argv, "hwfs status [-m MOUNT] [--json] [--cluster [--watch]]", 0, 0,
		    NULL);
	if (cli_cluster)
		return status_cluster();
	res = cli_call(json_pack("{s:s}", "op", "status"), 1);
	if (cli_json) {
		cli_print_json(res);
	} else {
		st = json_object_get(res, "store");
		printf("hwfs on %s (pid %lld)\n", cli_jstr(res, "mount"), (long long)cli_jint(res, "pid"));
		printf("store:   %s: %s of shards (%lld) in %s capacity", cli_jstr(st, "path"),
		       hwfs_fmt_size((uint64_t)cli_jint(st, "used_bytes"), a, sizeof(a)),
		       (long long)cli_jint(st, "shards"),
		       hwfs_fmt_size((uint64_t)cli_jint(st, "capacity_bytes"), b, sizeof(b)));
		if (!strcmp(cli_jstr(st, "pinned"), "cuda") || !strcmp(cli_jstr(st, "pinned"), "mlock"))
			printf(", %s %s", hwfs_fmt_size((uint64_t)cli_jint(st, "pinned_bytes"), a,
							sizeof(a)),
			       !strcmp(cli_jstr(st, "pinned"), "cuda") ? "pinned for CUDA"
								   : "locked (mlock)");
		else if (json_is_string(json_object_get(st, "pinned")))
			printf(", not pinned");
		printf("\n");
		print_gpu(res);
		printf("current: %s\n", json_is_string(json_object_get(res, "current"))
						? cli_jstr(res, "current")
						: "(none)");
		print_refused(json_object_get(res, "last_refused_commit"));
		cli_print_versions(json_object_get(res, "versions"));
		print_engines("", json_object_get(res, "engines"));
		print_leases(json_object_get(res, "leases"));
		print_held(json_object_get(res, "held"));
		if (json_object_get(res, "node")) {
			json_t *rep = json_object_get(res, "replication");

			char wa[32], wb[32];

			printf("node:    %s, coordinator %s; received %s (%s on the wire), sent %s "
			       "(%s on the wire)\n",
			       cli_jstr(res, "node"), cli_jstr(res, "coordinator"),
			       hwfs_fmt_size((uint64_t)cli_jint(rep, "bytes_received"), a, sizeof(a)),
			       hwfs_fmt_size((uint64_t)cli_jint(rep, "wire_bytes_received"), wa, sizeof(wa)),
			       hwfs_fmt_size((uint64_t)cli_jint(rep, "bytes_sent"), b, sizeof(b)),
			       hwfs_fmt_size((uint64_t)cli_jint(rep, "wire_bytes_sent"), wb, sizeof(wb)));
			print_repl_cpu(rep);
			json_array_foreach(json_object_get(rep, "pulls"), k, v)
				printf("pulling: %s, %s of %s%s%s\n", cli_jstr(v, "version"),
				       hwfs_fmt_size((uint64_t)cli_jint(v, "bytes_held"), a, sizeof(a)),
				       hwfs_fmt_size((uint64_t)cli_jint(v, "bytes_total"), b, sizeof(b)),
				       json_object_get(v, "waiting") ? "; " : "",
				       json_object_get(v, "waiting") ? cli_jstr(v, "waiting") : "");
		}
	}
	json_decref(res);
	return 0;
}
