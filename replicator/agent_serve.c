/*
 * agent_serve.c — serving shards to pullers (see agent.h for the model).
 *
 * GETs arrive on the node's ROUTER.  A shard the store holds is sent at once
 * in SHARD pieces, zero copy (each piece holds a reference on the shard); a
 * shard this node is itself still pulling is deferred and answered when it
 * arrives, and the pieces already here are forwarded as they come
 * (cut-through), which makes a chain of nodes a pipeline of pieces.  Anything
 * else, or a deferred shard whose pull ended without it, gets MISSING.  Runs
 * on the agent thread only.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "agent_i.h"

struct sent_ref {
	struct store *st;
	struct shard *sh;
};

static void sent_free(void *data, void *hint)
{
	struct sent_ref *r = hint;

	store_unref(r->st, r->sh);
	free(r);
}

/*
 * Send bytes [@pos, @pos+@len) of a shard of @total bytes as one SHARD piece.
 * With @sh, zero copy (the piece holds a reference on the shard); else @data
 * is copied (a shard still arriving here, forwarded before it is complete).
 */
static int send_piece(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		      const hwfs_hash_t *hash, uint64_t pos, uint64_t len, uint64_t total,
		      struct shard *sh, const void *data)
{
	json_t *f = json_pack("{s:I, s:o, s:I, s:I, s:I}", "req", (json_int_t)req, "hash",
			      proto_hash_json(hash), "size", (json_int_t)len, "offset", (json_int_t)pos,
			      "total", (json_int_t)total);
	struct sent_ref *ref = NULL;
	char *hdr = NULL;
	size_t hlen;
	zmq_msg_t m;
	int r = -ENOMEM;

	if (!f || proto_encode(P_SHARD, f, len, &hdr, &hlen) < 0)
		goto out;
	if (zmq_send(a->serve, ident, ident_len, ZMQ_SNDMORE) < 0 ||
	    zmq_send(a->serve, hdr, hlen, ZMQ_SNDMORE) < 0) {
		r = -errno;
		goto out;
	}
	if (sh) {
		ref = malloc(sizeof(*ref));
		if (!ref || zmq_msg_init_data(&m, (void *)(store_shard_data(a->st, sh) + pos), len,
					      sent_free, ref) < 0) {
			free(ref);
			zmq_send(a->serve, "", 0, 0); /* end the message: the receiver drops it */
			goto out;
		}
		store_ref(a->st, sh);
		*ref = (struct sent_ref){a->st, sh};
		if (zmq_msg_send(&m, a->serve, 0) < 0) {
			r = -errno;
			zmq_msg_close(&m);
			goto out;
		}
	} else if (zmq_send(a->serve, data, len, 0) < 0) {
		r = -errno;
		goto out;
	}
	__atomic_add_fetch(&a->tx, len, __ATOMIC_RELAXED);
	r = 0;
out:
	free(hdr);
	json_decref(f);
	return r;
}

/* Tell the puller @ident that this node does not have (any more) shard @h. */
static void send_missing(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
			 const hwfs_hash_t *h)
{
	json_t *mf = json_pack("{s:I, s:o}", "req", (json_int_t)req, "hash", proto_hash_json(h));

	proto_send(a->serve, ident, ident_len, P_MISSING, mf, NULL, 0);
	json_decref(mf);
}

/* Send shard @sh from byte @pos on, in pieces; drops the caller's reference. */
static void send_shard(struct agent *a, const void *ident, size_t ident_len, uint64_t req,
		       struct shard *sh, uint64_t pos)
{
	while (pos < sh->size) {
		uint64_t len = HWFS_MIN(hwfs_tun.piece_bytes, sh->size - pos);

		if (send_piece(a, ident, ident_len, req, &sh->hash, pos, len, sh->size, sh, NULL) < 0)
			break;
		pos += len;
	}
	store_unref(a->st, sh);
}

/*
 * A fetch ended: requests that waited on its shards get the shard if it
 * arrived, else MISSING, so their pullers move on at once.
 */
void serve_flush_deferred(struct agent *a)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;
		struct shard *sh;

		if (pull_find_want(a, &d->hash, NULL)) {
			pp = &d->next;
			continue;
		}
		sh = store_get(a->st, &d->hash);
		if (sh) {
			send_shard(a, d->ident, d->ident_len, d->req, sh, 0);
		} else {
			send_missing(a, d->ident, d->ident_len, d->req, &d->hash);
		}
		*pp = d->next;
		free(d);
	}
}

/* Answer requests that waited for @sh to arrive here (the rest, if forwarded in part). */
void serve_arrived(struct agent *a, struct shard *sh)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, &sh->hash)) {
			pp = &d->next;
			continue;
		}
		store_ref(a->st, sh);
		send_shard(a, d->ident, d->ident_len, d->req, sh, d->sent);
		*pp = d->next;
		free(d);
	}
}

/*
 * Cut-through: a piece of @w just arrived; pass what waiting pullers have not
 * had yet straight on, before the whole shard is here and verified (they
 * verify it themselves).  This makes a chain a pipeline of pieces, not of
 * shards.
 */
void serve_forward(struct agent *a, struct want *w)
{
	const uint8_t *base = store_stage_data(a->st, w->roff);

	for (struct deferred *d = a->deferred; d; d = d->next) {
		if (hwfs_hash_cmp(&d->hash, &w->hash))
			continue;
		while (d->sent < w->got) {
			uint64_t len = HWFS_MIN(hwfs_tun.piece_bytes, w->got - d->sent);

			if (send_piece(a, d->ident, d->ident_len, d->req, &w->hash, d->sent, len,
				       w->size, NULL, base + d->sent) < 0)
				break;
			d->sent += len;
		}
	}
}

/* A shard that was forwarded in part turned out bad: those pullers must start over. */
void serve_abort_forwarded(struct agent *a, const hwfs_hash_t *h)
{
	for (struct deferred **pp = &a->deferred; *pp;) {
		struct deferred *d = *pp;

		if (hwfs_hash_cmp(&d->hash, h) || d->sent == 0) {
			pp = &d->next;
			continue;
		}
		send_missing(a, d->ident, d->ident_len, d->req, h);
		*pp = d->next;
		free(d);
	}
}

/* A GET on the serving socket. */
void serve_on_get(struct agent *a, const void *ident, size_t ident_len, struct proto_msg *m)
{
	json_t *hashes = json_object_get(m->h, "hashes"), *hj;
	uint64_t req = proto_int(m, "req");
	size_t i;

	__atomic_add_fetch(&a->req_rx, json_array_size(hashes), __ATOMIC_RELAXED);
	json_array_foreach(hashes, i, hj) {
		hwfs_hash_t h;
		struct shard *sh;
		struct want *w;

		if (hwfs_hash_parse(json_string_value(hj), &h) < 0)
			continue;
		sh = store_get(a->st, &h);
		if (sh) {
			send_shard(a, ident, ident_len, req, sh, 0);
			continue;
		}
		w = pull_find_want(a, &h, NULL);
		if (w && ident_len <= sizeof(((struct deferred *)0)->ident)) {
			struct deferred *d = calloc(1, sizeof(*d));

			if (d) {
				memcpy(d->ident, ident, ident_len);
				d->ident_len = ident_len;
				d->req = req;
				d->hash = h;
				d->next = a->deferred;
				a->deferred = d;
				if (w->xs && w->got) /* arriving: pass on what is here */
					serve_forward(a, w);
				continue;
			}
		}
		send_missing(a, ident, ident_len, req, &h);
	}
}

/* agent_stop(), after the thread ended: forget the requests still waiting (no answer). */
void serve_free(struct agent *a)
{
	while (a->deferred) {
		struct deferred *d = a->deferred;

		a->deferred = d->next;
		free(d);
	}
}
