/*
 * coord_status.c — what the coordinator shows: the cluster status that
 * STATUS_RES carries (`hwfs status --cluster`) and that the HTTP endpoint of
 * `hwfs coord --http` serves (coord_opts.status, every COORD_STATUS_MS), the
 * history it keeps for them (the last commits with their outcome, duration,
 * each node's time to READY and to ACK, the decision's time and the nodes' own
 * prepare and flip times — where a commit's time went; each version's
 * convergence time), and the
 * coordinator's instruments of fs/common/metrics.h (hwfs_cm).
 *
 * Everything here runs on the coordinator's thread, like the rest of it.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "coord_i.h"
#include "metrics.h"

void coord_record_commit(struct coord *c, const char *outcome, const char *reason)
{
	double took = hwfs_mono_s() - c->tx.started;
	enum hwfs_commit_outcome o = !strcmp(outcome, "committed") ? HWFS_COMMIT_OK
				     : !strcmp(outcome, "aborted") ? HWFS_COMMIT_REFUSED
								   : HWFS_COMMIT_FAILED;

	hwfs_count(&hwfs_cm.commits[o], 1);
	hwfs_hist_observe_ns(&hwfs_cm.commit, (uint64_t)(took * 1e9));
	json_array_append_new(c->commits,
			      json_pack("{s:s, s:s, s:s, s:f, s:O, s:o, s:f, s:O, s:O, s:O}", "version",
					c->tx.version, "outcome", outcome, "reason", reason,
					"duration_s", took, "ready_s", c->tx.ready_s, "decided_s",
					c->tx.phase == 2 ? json_real(c->tx.decided_s) : json_null(),
					"record_s", c->tx.record_s, "ack_s", c->tx.ack_s,
					"prepare_us", c->tx.prepare_us, "flip_us", c->tx.flip_us));
	if (json_array_size(c->commits) > COORD_HISTORY)
		json_array_remove(c->commits, 0);
	c->status_at = 0; /* the next pass hands the status over */
}

void coord_converge_check(struct coord *c)
{
	double now = hwfs_mono_s();

	for (size_t i = 0; i < c->n_vers; i++) {
		struct cversion *v = &c->vers[i];
		size_t live = 0, have = 0;

		if (v->converge_s >= 0)
			continue;
		for (size_t k = 0; k < c->n_nodes; k++) {
			json_t *e = json_object_get(c->nodes[k].versions, v->name);

			if (!coord_alive(&c->nodes[k]))
				continue;
			live++;
			have += e && json_is_true(json_object_get(e, "complete")) &&
				!strcmp(json_string_value(json_object_get(e, "digest")) ?: "",
					v->digest);
		}
		if (live && have == live) {
			v->converge_s = now - v->announced;
			hwfs_hist_observe_ns(&hwfs_cm.converge, (uint64_t)(v->converge_s * 1e9));
			LOG_INFO("coord: %s is on every live node (%zu), %.3f s after its announce",
				 v->name, live, v->converge_s);
		}
	}
}

/* Is live node @n's `current` other than the cluster's committed version (if any)? */
static int diverged(const struct coord *c, const struct cnode *n)
{
	return c->committed && coord_alive(n) && (!n->current || strcmp(n->current, c->committed));
}

/* One node as the status shows it. */
static json_t *node_json(const struct coord *c, const struct cnode *n, double now)
{
	json_t *vers = json_array(), *e;
	const char *k;

	json_object_foreach(n->versions, k, e) {
		json_t *ve = json_pack("{s:s, s:O, s:O, s:O, s:O}", "name", k, "digest",
				       json_object_get(e, "digest"), "complete",
				       json_object_get(e, "complete"), "bytes_held",
				       json_object_get(e, "bytes_held"), "bytes_needed",
				       json_object_get(e, "bytes_needed"));

		if (ve && json_object_get(e, "waiting"))
			json_object_set(ve, "waiting", json_object_get(e, "waiting"));
		if (ve && !json_is_true(json_object_get(e, "complete")) && n->plans &&
		    json_object_get(n->plans, k)) /* whom it pulls from: its last plan's donors */
			json_object_set(ve, "donors",
					json_object_get(json_object_get(n->plans, k), "donors"));
		json_array_append_new(vers, ve);
	}
	/* a dead node's engines are gone with it (their connections ended) */
	return json_pack("{s:s, s:s, s:b, s:f, s:I, s:I, s:I, s:o, s:o, s:o, s:b}", "name", n->name,
			 "addr", n->addr ?: "", "alive", coord_alive(n), "last_seen_s",
			 now - n->last_seen, "bad_shards", (json_int_t)n->bad_shards,
			 "wire_bytes_received", (json_int_t)n->wire_rx, "wire_bytes_sent",
			 (json_int_t)n->wire_tx, "versions", vers, "engines",
			 n->engines && coord_alive(n) ? json_deep_copy(n->engines) : json_array(),
			 "current", n->current ? json_string(n->current) : json_null(), "diverged",
			 diverged(c, n));
}

/*
 * node_metrics() - each live node's `current` and whether it diverges from
 * the committed version, for /metrics (metrics_coord_set_nodes()).
 */
static void node_metrics(const struct coord *c)
{
	struct mbuf b = {0};
	char *text;

	metrics_family(&b, "hwfs_coord_node_current", "gauge",
		       "1 for the version each live node's current names (version=\"\" when none)");
	for (size_t i = 0; i < c->n_nodes; i++) {
		if (!coord_alive(&c->nodes[i]))
			continue;
		mbuf_printf(&b, "hwfs_coord_node_current{node=\"");
		mbuf_label_value(&b, c->nodes[i].name);
		mbuf_printf(&b, "\",version=\"");
		mbuf_label_value(&b, c->nodes[i].current ?: "");
		mbuf_printf(&b, "\"} 1\n");
	}
	metrics_family(&b, "hwfs_coord_node_diverged", "gauge",
		       "1 when a live node's current is not the cluster's committed version");
	for (size_t i = 0; i < c->n_nodes; i++)
		if (coord_alive(&c->nodes[i]))
			metrics_sample_u64(&b, "hwfs_coord_node_diverged", "node", c->nodes[i].name,
					   (uint64_t)diverged(c, &c->nodes[i]));
	text = mbuf_take(&b);
	if (text)
		metrics_coord_set_nodes(text);
	free(text);
}

json_t *coord_status_json(struct coord *c)
{
	json_t *nodes = json_array(), *recent = json_array();
	double now = hwfs_mono_s();

	for (size_t i = 0; i < c->n_nodes; i++)
		json_array_append_new(nodes, node_json(c, &c->nodes[i], now));
	for (size_t i = c->n_vers > COORD_HISTORY ? c->n_vers - COORD_HISTORY : 0; i < c->n_vers;
	     i++)
		json_array_append_new(recent, json_pack("{s:s, s:s, s:o}", "name", c->vers[i].name,
							"origin", c->vers[i].origin, "converge_s",
							c->vers[i].converge_s >= 0
								? json_real(c->vers[i].converge_s)
								: json_null()));
	return json_pack("{s:s, s:o, s:I, s:o, s:I, s:O, s:o}", "coordinator", c->endpoint,
			 "committed", c->committed ? json_string(c->committed) : json_null(),
			 "epoch", (json_int_t)c->epoch, "nodes", nodes, "refused_messages",
			 (json_int_t)c->refused, "commits", c->commits, "recent_versions", recent);
}

void coord_status_tick(struct coord *c)
{
	json_t *st;

	if (hwfs_mono_s() < c->status_at)
		return;
	c->status_at = hwfs_mono_s() + COORD_STATUS_MS / 1000.0;
	node_metrics(c);
	if (!c->o->status)
		return;
	st = coord_status_json(c);
	if (st)
		c->o->status(c->o->status_arg, st);
	json_decref(st);
}
