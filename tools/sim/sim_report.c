/*
 * sim_report.c — the result of a run (sim_run()'s object; docs/sim.md says
 * what each member means): every node's convergence time, bytes and CPU;
 * the bytes of every link; the critical path (the last node's last shard,
 * back through who sent it); the utilisation of the busiest uplink, agent
 * thread, codec pool, I/O threads and the host's cores, and from them what
 * bounds the run; and the parameters the run used.
 *
 * sim_result() builds it in steps: tally() walks the nodes once (their
 * entries, and who was the busiest at what), then the links, the critical
 * path, the bottleneck and the parameters each have their own function.
 * Members are added in the order docs/sim.md lists them (jansson keeps it).
 */
#define _GNU_SOURCE
#include <stdio.h>

#include "sim_i.h"

/* What tally() finds: the sums and the busiest of each kind. */
struct tally {
	json_t *nodes;       /* the "nodes" array */
	double cpu;          /* CPU seconds of every node */
	double up, agent, agent2, codec, enc, io; /* busy seconds of the busiest */
	const char *up_n, *agent_n, *agent2_n, *codec_n, *io_n; /* and whose */
	const char *agent_what, *agent2_what; /* what the two busiest agent threads did most */
	struct snode *last;  /* the receiver that converged last */
	size_t converged, expected; /* receivers alive at the end: complete, all */
};

/* Node @n's entry of "nodes". */
static json_t *node_json(const struct sim *s, const struct snode *n)
{
	json_t *dn = json_array();

	for (size_t d = 0; d < n->nd; d++)
		json_array_append_new(dn, json_string(s->n[n->donors[d]].name));
	return json_pack("{s:s, s:o, s:f, s:I, s:I, s:o, s:b, s:b, s:f}",
		"node", n->name, "converged_s", n->origin ? json_real(0) :
		n->complete ? json_real(n->t_done) : json_null(), "joined_s", n->t_join,
		"bytes_in", (json_int_t)n->bytes_in, "bytes_out", (json_int_t)n->bytes_out,
		"donors", dn, "delta", n->delta, "alive", n->alive,
		"cpu_s", n->net_s + n->recv_s + n->rebuild_s + n->encode_s + n->send_s);
}

/* Count @n's agent thread in @t if it is one of the two busiest so far. */
static void tally_agent(struct tally *t, const struct snode *n)
{
	const char *w = n->encode_s > n->recv_s && n->encode_s > n->rebuild_s ? "encode" :
			n->rebuild_s > n->recv_s ? "rebuild" : "receive: copy + hash";

	if (n->agent.busy <= t->agent2)
		return;
	if (n->agent.busy > t->agent) {
		t->agent2 = t->agent;
		t->agent2_n = t->agent_n;
		t->agent2_what = t->agent_what;
		t->agent = n->agent.busy;
		t->agent_n = n->name;
		t->agent_what = w;
	} else {
		t->agent2 = n->agent.busy;
		t->agent2_n = n->name;
		t->agent2_what = w;
	}
}

/* Walk the nodes once: their entries into t->nodes, the sums and the busiest. */
static void tally(struct sim *s, struct tally *t)
{
	for (size_t i = 0; i < s->nn; i++) {
		struct snode *n = &s->n[i];

		json_array_append_new(t->nodes, node_json(s, n));
		t->cpu += n->net_s + n->recv_s + n->rebuild_s + n->encode_s + n->send_s;
		if (!n->origin && n->alive) {
			t->expected++;
			if (n->complete) {
				t->converged++;
				if (!t->last || n->t_done > t->last->t_done)
					t->last = n;
			}
		}
		if (n->up_busy_s > t->up) {
			t->up = n->up_busy_s;
			t->up_n = n->name;
		}
		tally_agent(t, n);
		if (n->io.busy > t->io) {
			t->io = n->io.busy;
			t->io_n = n->name;
		}
		if (n->codec.busy > t->codec) {
			t->codec = n->codec.busy;
			t->codec_n = n->name;
		}
		if (n->origin)
			t->enc = n->encode_s;
	}
}

/* "links": the bytes sent on each link, in the order the links were first used. */
static json_t *links_json(const struct sim *s)
{
	json_t *links = json_array();

	for (size_t i = 0; i < s->n_edges; i++)
		json_array_append_new(links, json_pack("{s:s, s:s, s:I}", "from",
			s->n[s->edges[i].from].name, "to", s->n[s->edges[i].to].name, "bytes",
			(json_int_t)s->edges[i].bytes));
	return links;
}

/* "critical_path": @last's last shard, back through who sent it (empty without @last). */
static json_t *critical_path(struct sim *s, struct snode *last)
{
	json_t *path = json_array();
	uint64_t sh_last = 0;
	float best = -1;

	if (!last)
		return path;
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
	return path;
}

/*
 * The utilisation of the busiest of each kind over @makespan into @util,
 * and what bounds the run: the busiest of them, or two agent threads busy
 * in series (written in @serial), or, when nothing is busy enough, the
 * critical path's depth.  "" when @makespan is 0.
 */
static const char *bottleneck(const struct sim *s, const struct tally *t, double makespan,
			      json_t *util, char *serial, size_t len)
{
	const struct sim_params *p = s->p;
	double lu, au, cu, iu, hu, best;
	const char *what = "link";

	if (makespan <= 0)
		return "";
	lu = t->up / makespan;
	au = t->agent / makespan;
	cu = t->codec / makespan;
	iu = t->io / makespan / (p->io_threads ? p->io_threads : 1);
	hu = p->host_cores ? s->host.busy / p->host_cores / makespan : 0;
	best = lu;
	json_object_set_new(util, "busiest_uplink", json_pack("{s:s, s:f}", "node", t->up_n,
							      "busy", lu));
	json_object_set_new(util, "busiest_agent_thread",
			    json_pack("{s:s, s:f, s:s}", "node", t->agent_n, "busy", au, "work",
				      t->agent_what));
	if (p->codec_workers)
		json_object_set_new(util, "busiest_codec_pool",
				    json_pack("{s:s, s:f}", "node", t->codec_n, "busy",
					      cu / p->codec_workers));
	json_object_set_new(util, "busiest_io_threads", json_pack("{s:s, s:f}", "node", t->io_n,
								  "busy", iu));
	json_object_set_new(util, "encode_s", json_real(t->enc));
	if (p->host_cores)
		json_object_set_new(util, "host_cores", json_real(hu));
	if (au > best) {
		best = au;
		what = t->agent_what;
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
	if (best < 0.6 && au + t->agent2 / makespan >= 0.8) {
		/* two threads, each busy half the run: one's work waits for the other's */
		snprintf(serial, len, "%s on %s, then %s on %s (in series)", t->agent_what,
			 t->agent_n, t->agent2_what, t->agent2_n);
		what = serial;
	} else if (best < 0.6) {
		what = "critical path depth (latency and pipeline fill per hop)";
	}
	return what;
}

/* "params": what the run used (the piece size it modelled, "model_piece_bytes", too). */
static json_t *params_json(const struct sim *s)
{
	const struct sim_params *p = s->p;
	json_t *params = json_object();

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
	return params;
}

json_t *sim_result(struct sim *s, double makespan)
{
	struct tally t = {.nodes = json_array(), .up_n = "", .agent_n = "", .agent2_n = "",
			  .codec_n = "", .io_n = "", .agent_what = "receive: copy + hash",
			  .agent2_what = ""};
	const struct sim_params *p = s->p;
	json_t *out = json_object(), *links, *path, *util = json_object();
	char serial[160];
	const char *what;
	int all = 0;

	tally(s, &t);
	links = links_json(s);
	path = critical_path(s, t.last);
	what = bottleneck(s, &t, makespan, util, serial, sizeof(serial));
	all = t.last && t.converged == t.expected;
	json_object_set_new(out, "params", params_json(s));
	json_object_set_new(out, "converged_s", all ? json_real(t.last->t_done) : json_null());
	json_object_set_new(out, "converged_nodes", json_integer((json_int_t)t.converged));
	json_object_set_new(out, "s_over_b", json_real((double)p->size * 8 / p->link_bps));
	if (all)
		json_object_set_new(out, "x_s_over_b",
				    json_real(t.last->t_done / ((double)p->size * 8 / p->link_bps)));
	json_object_set_new(out, "cpu_s", json_real(t.cpu));
	json_object_set_new(out, "bottleneck", json_string(what));
	json_object_set_new(out, "utilisation", util);
	json_object_set_new(out, "critical_path", path);
	json_object_set_new(out, "critical_path_depth",
			    json_integer(json_array_size(path) ? (json_int_t)json_array_size(path) - 1 : 0));
	json_object_set_new(out, "events", json_integer((json_int_t)s->events));
	json_object_set_new(out, "nodes", t.nodes);
	json_object_set_new(out, "links", links);
	return out;
}
