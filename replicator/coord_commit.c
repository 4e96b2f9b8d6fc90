/*
 * coord_commit.c — the coordinator's two-phase commit.
 *
 * One transaction at a time: PREPARE to every alive node; all READY within
 * the deadline -> the decision (committed version, a new epoch) is recorded
 * (--state) and COMMIT goes to all; committed is answered once every node
 * ACKed its flip.  Any refusal or the deadline in the first phase -> ABORT to
 * all, nobody flips.  What a node says (its reasons) is cleaned before it is
 * repeated to the requester's terminal.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "coord_i.h"

/*
 * A reason a node sent (READY, ACK) as the coordinator keeps and repeats it
 * to `hwfs commit`: control characters blanked and at most MAX_NODE_REASON
 * bytes (hwfs_clean_text), @def when there is none.  A remote node must
 * not reach the requester's terminal.  Returns a new JSON string, NULL
 * without memory.
 */
static json_t *node_reason(struct proto_msg *m, const char *def)
{
	const char *why = proto_str(m, "reason");
	char *c = hwfs_clean_text(why ? why : def, MAX_NODE_REASON);
	json_t *j = c ? json_string(c) : NULL;

	free(c);
	return j;
}

void commit_tx_free(struct tx *tx)
{
	free(tx->version);
	json_decref(tx->pending);
	json_decref(tx->nodes);
	json_decref(tx->done);
	json_decref(tx->failed);
	json_decref(tx->ready_s);
	json_decref(tx->ack_s);
	json_decref(tx->prepare_us);
	json_decref(tx->flip_us);
	memset(tx, 0, sizeof(*tx));
}

/*
 * tx_finish() - answer the requester with exactly what happened and end the
 * transaction.  @outcome: "committed" (every participant ACKed its flip: the
 * only ok result), "partial" (the decision was commit, but some nodes failed
 * to flip or did not ACK before the deadline: "unknown"), or "aborted"
 * (nobody was told to flip).  Every answer but "committed" carries "errno":
 * @err, or when it is 0 EINPROGRESS (partial) or ECANCELED (aborted); an
 * abort has the refusing node's errno (its READY's) or ETIMEDOUT (the
 * deadline); a refused COMMIT_REQ has EBUSY or ENOENT (docs/protocol.md).
 */
static void tx_finish(struct coord *c, const char *outcome, const char *reason, int err)
{
	json_t *res = json_pack("{s:I, s:b, s:s, s:O, s:s, s:O, s:O, s:O}", "req",
				(json_int_t)c->tx.req, "ok", !strcmp(outcome, "committed"), "reason",
				reason, "nodes", c->tx.nodes, "outcome", outcome, "committed",
				c->tx.done, "failed", c->tx.failed, "unknown", c->tx.pending);

	if (!err)
		err = strcmp(outcome, "partial") ? ECANCELED : EINPROGRESS;
	if (res && strcmp(outcome, "committed")) /* the node relays it (protocol.md) */
		json_object_set_new(res, "errno", json_integer(err));
	coord_send(c, c->tx.requester, P_COMMIT_RES, res, NULL, 0);
	coord_record_commit(c, outcome, reason);
	commit_tx_free(&c->tx);
}

/* Send @t {txid, version[, @key: @val][, errno: @err]} to every node of the transaction. */
static void tx_send_all(struct coord *c, enum proto_type t, const char *key, const char *val,
			int err)
{
	size_t i;
	json_t *nm;

	json_array_foreach(c->tx.nodes, i, nm) {
		json_t *f = json_pack("{s:I, s:s}", "txid", (json_int_t)c->tx.txid, "version",
				      c->tx.version);

		if (f && key)
			json_object_set_new(f, key, json_string(val));
		if (f && err)
			json_object_set_new(f, "errno", json_integer(err));
		if (f && t == P_COMMIT) /* the decision's epoch: the node records what it applied */
			json_object_set_new(f, "epoch", json_integer((json_int_t)c->epoch));
		coord_send(c, json_string_value(nm), t, f, NULL, 0);
	}
}

/* Abort the transaction for @reason, errno @err: ABORT to its nodes, the answer to its requester. */
static void tx_abort(struct coord *c, const char *reason, int err)
{
	LOG_WARN("coord: commit of %s aborted: %s (%s)", c->tx.version, reason, strerror(err));
	tx_send_all(c, P_ABORT, "reason", reason, err);
	tx_finish(c, "aborted", reason, err);
}

void commit_on_req(struct coord *c, const char *from, struct proto_msg *m)
{
	const char *name = proto_str(m, "version");
	struct cversion *v = coord_version(c, name);
	uint64_t req = proto_int(m, "req");
	json_t *nodes;

	if (c->tx.active || !v) {
		coord_send(c, from, P_COMMIT_RES,
			json_pack("{s:I, s:b, s:s, s:[], s:s, s:i}", "req", (json_int_t)req, "ok", 0,
				  "reason", c->tx.active ? "another commit is in progress"
							 : "no node has announced that version",
				  "nodes", "outcome", "aborted", "errno",
				  c->tx.active ? EBUSY : ENOENT),
			NULL, 0);
		return;
	}
	nodes = json_array();
	for (size_t i = 0; i < c->n_nodes; i++)
		if (coord_alive(&c->nodes[i]))
			json_array_append_new(nodes, json_string(c->nodes[i].name));
	c->tx = (struct tx){.active = 1, .txid = ++c->next_txid, .version = strdup(name),
			    .req = req, .phase = 1, .pending = json_deep_copy(nodes), .nodes = nodes,
			    .done = json_array(), .failed = json_object(),
			    .started = hwfs_mono_s(), .ready_s = json_object(),
			    .ack_s = json_object(), .prepare_us = json_object(),
			    .flip_us = json_object(),
			    .deadline = hwfs_mono_s() +
					HWFS_MIN(HWFS_MAX(proto_int(m, "deadline_ms"),
							  MIN_COMMIT_DEADLINE_MS),
						 MAX_COMMIT_DEADLINE_MS) / 1000.0};
	snprintf(c->tx.requester, sizeof(c->tx.requester), "%s", from);
	LOG_INFO("coord: commit %s: prepare on %zu node(s)", name, json_array_size(nodes));
	tx_send_all(c, P_PREPARE, "digest", v->digest, 0);
}

/* Keep @m's @key (a node's own microseconds, when it sends them) as @node's in @obj. */
static void tx_node_us(json_t *obj, const char *node, struct proto_msg *m, const char *key)
{
	if (json_is_integer(json_object_get(m->h, key)))
		json_object_set_new(obj, node, json_integer((json_int_t)proto_int(m, key)));
}

/* Remove @node from the pending list; 1 if it was pending. */
static int tx_answered(struct coord *c, const char *node)
{
	size_t i;
	json_t *nm;

	json_array_foreach(c->tx.pending, i, nm)
		if (!strcmp(json_string_value(nm), node)) {
			json_array_remove(c->tx.pending, i);
			return 1;
		}
	return 0;
}

void commit_on_ready(struct coord *c, const char *from, struct proto_msg *m)
{
	char reason[MAX_NODE_REASON + 512];
	double t0;

	if (!c->tx.active || c->tx.phase != 1 || proto_int(m, "txid") != c->tx.txid ||
	    !tx_answered(c, from))
		return;
	json_object_set_new(c->tx.ready_s, from, json_real(hwfs_mono_s() - c->tx.started));
	tx_node_us(c->tx.prepare_us, from, m, "prepare_us");
	if (!proto_bool(m, "ok")) {
		json_t *why = node_reason(m, "not ready");

		/* @from is a joined node's name: no control characters (on_hello) */
		snprintf(reason, sizeof(reason), "node %s is not ready: %s", from,
			 why ? json_string_value(why) : "not ready");
		json_object_set_new(c->tx.failed, from, why ?: json_string("not ready"));
		/* a node that predates errno: ECANCELED, as before; a bad one: EPROTO */
		tx_abort(c, reason, proto_errno(m, ECANCELED));
		return;
	}
	if (json_array_size(c->tx.pending))
		return;
	/* everyone is ready: the decision is made, and recorded before it is sent */
	free(c->committed);
	c->committed = strdup(c->tx.version);
	c->epoch++;
	t0 = hwfs_mono_s();
	coord_save_committed(c);
	c->tx.record_s = hwfs_mono_s() - t0;
	c->tx.phase = 2;
	json_decref(c->tx.pending);
	c->tx.pending = json_deep_copy(c->tx.nodes);
	tx_send_all(c, P_COMMIT, NULL, NULL, 0);
	c->tx.decided_s = hwfs_mono_s() - c->tx.started;
}

void commit_on_ack(struct coord *c, const char *from, struct proto_msg *m)
{
	if (!c->tx.active || c->tx.phase != 2 || proto_int(m, "txid") != c->tx.txid ||
	    !tx_answered(c, from))
		return;
	json_object_set_new(c->tx.ack_s, from, json_real(hwfs_mono_s() - c->tx.started));
	tx_node_us(c->tx.flip_us, from, m, "flip_us");
	if (proto_bool(m, "ok")) {
		json_array_append_new(c->tx.done, json_string(from));
	} else {
		json_t *why = node_reason(m, "?");

		LOG_ERR("coord: %s could not flip to %s: %s (%s; it retries on its heartbeats)",
			from, c->tx.version, why ? json_string_value(why) : "?",
			strerror(proto_errno(m, EIO)));
		json_object_set_new(c->tx.failed, from, why ?: json_string("?"));
	}
	if (json_array_size(c->tx.pending))
		return;
	if (json_object_size(c->tx.failed) == 0) {
		LOG_INFO("coord: %s committed on %zu node(s)", c->tx.version,
			 json_array_size(c->tx.nodes));
		tx_finish(c, "committed", "committed", 0);
	} else {
		LOG_ERR("coord: %s committed on %zu of %zu node(s); %zu failed to flip",
			c->tx.version, json_array_size(c->tx.done), json_array_size(c->tx.nodes),
			json_object_size(c->tx.failed));
		tx_finish(c, "partial", "some nodes failed to flip", 0);
	}
}

void commit_tick(struct coord *c)
{
	char reason[600];

	if (!c->tx.active || hwfs_mono_s() < c->tx.deadline)
		return;
	snprintf(reason, sizeof(reason), "deadline passed waiting for %s%s",
		 json_string_value(json_array_get(c->tx.pending, 0)) ?: "?",
		 json_array_size(c->tx.pending) > 1 ? " and others" : "");
	if (c->tx.phase == 1) {
		tx_abort(c, reason, ETIMEDOUT);
	} else { /* decided already: report exactly who flipped; the rest catch up */
		LOG_ERR("coord: commit of %s decided, but %s: %zu node(s) ACKed, %zu failed, %zu "
			"unknown", c->tx.version, reason, json_array_size(c->tx.done),
			json_object_size(c->tx.failed), json_array_size(c->tx.pending));
		tx_finish(c, "partial", reason, 0);
	}
}
