/*
 * test_proto_wire.c — the replicator's wire codec on the wire: the frame
 * and payload rules (oversize or extra frames refused), the accessors, and
 * proto_send()/proto_recv() carrying messages over real PAIR (inproc://) and
 * ROUTER/DEALER (ipc://) sockets, dropping a hostile multipart message whole
 * so the next good one still arrives.  Message fields are test_proto.c.
 */
#define _GNU_SOURCE
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <cmocka.h>

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zmq.h>

#include "proto.h"

#include "proto_util.h"

/* ---- frames and payloads ---- */

static void test_frames(void **state)
{
	static const char ping[] = "{\"v\":2,\"t\":\"PING\"}";
	const void *fr[4] = {ping, "x", "y", "z"};
	size_t fl[4] = {strlen(ping), 1, 1, 1};
	struct proto_msg m = {0};
	char err[256];

	assert_int_equal(proto_decode_frames(fr, fl, 1, &m, err, sizeof(err)), 0);
	proto_msg_clear(&m);
	assert_bad(proto_decode_frames(fr, fl, 0, &m, err, sizeof(err)), err);
	assert_bad(proto_decode_frames(fr, fl, 3, &m, err, sizeof(err)), err);
	assert_non_null(strstr(err, "3 frames"));
	assert_bad(proto_decode_frames(fr, fl, 4, &m, err, sizeof(err)), err);
	/* A payload frame on a type that takes none, even an empty one. */
	assert_bad(proto_decode_frames(fr, fl, 2, &m, err, sizeof(err)), err);
	assert_non_null(strstr(err, "PING"));
	fl[1] = 0;
	assert_bad(proto_decode_frames(fr, fl, 2, &m, err, sizeof(err)), err);
	/* Caller bugs. */
	assert_int_equal(proto_decode_frames(NULL, fl, 1, &m, err, sizeof(err)), -EINVAL);
	assert_int_equal(proto_decode_frames(fr, NULL, 1, &m, err, sizeof(err)), -EINVAL);
	assert_int_equal(proto_decode_frames(fr, fl, 1, NULL, err, sizeof(err)), -EINVAL);
	fr[0] = NULL;
	assert_int_equal(proto_decode_frames(fr, fl, 1, &m, err, sizeof(err)), -EINVAL);
	/* A NULL empty frame is an empty header: invalid JSON. */
	fl[0] = 0;
	assert_bad(proto_decode_frames(fr, fl, 1, &m, err, sizeof(err)), err);
}

static void test_payload_rules(void **state)
{
	char err[256], *hdr;
	size_t len;

	for (int t = P_HELLO; t <= P_MISSING; t++) {
		json_t *f = valid_fields(t);
		struct proto_msg m = {0};
		char *h = raw_header(PROTO_VERSION, proto_type_name(t), f);

		if (takes_payload(t)) {
			/* Without its payload frame. */
			assert_bad(dec(h, NULL, 0, 0, &m, err, sizeof(err)), err);
			assert_non_null(strstr(err, "payload"));
		} else {
			/* With one it does not take. */
			assert_bad(dec(h, "abc", 3, 1, &m, err, sizeof(err)), err);
			assert_non_null(strstr(err, "payload"));
			assert_enc_invalid(t, f, 3);
		}
		free(h);
		json_decref(f);
	}

	/* Manifests are never empty. */
	{
		json_t *f = valid_fields(P_ANNOUNCE);
		char *h = raw_header(PROTO_VERSION, "ANNOUNCE", f);
		struct proto_msg m;

		assert_bad(dec(h, "", 0, 1, &m, err, sizeof(err)), err);
		assert_enc_invalid(P_ANNOUNCE, f, 0);
		free(h);
		json_decref(f);
	}

	/* SHARD: payload exactly `size` bytes; size 0 means an empty frame. */
	{
		json_t *f = valid_fields(P_SHARD);
		char *h = raw_header(PROTO_VERSION, "SHARD", f);
		struct proto_msg m;

		assert_bad(dec(h, SHARD_BYTES, 10, 1, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "size"));
		assert_bad(dec(h, SHARD_BYTES "!", 12, 1, &m, err, sizeof(err)), err);
		assert_enc_invalid(P_SHARD, f, 10);
		free(h);
		json_object_set_new(f, "size", json_integer(0));
		h = raw_header(PROTO_VERSION, "SHARD", f);
		assert_int_equal(dec(h, NULL, 0, 1, &m, err, sizeof(err)), 0);
		assert_non_null(m.payload); /* present, empty */
		assert_int_equal(m.payload_len, 0);
		proto_msg_clear(&m);
		assert_int_equal(proto_encode(P_SHARD, f, 0, &hdr, &len), 0);
		free(hdr);
		free(h);
		json_decref(f);
	}

	/* Over PROTO_MAX_PAYLOAD: refused on the length alone (the bytes are not read). */
	{
		json_t *f = valid_fields(P_SHARD);
		char *h;
		struct proto_msg m;

		json_object_set_new(f, "size", json_integer((json_int_t)PROTO_MAX_PAYLOAD + 1));
		h = raw_header(PROTO_VERSION, "SHARD", f);
		assert_bad(dec(h, "x", (size_t)PROTO_MAX_PAYLOAD + 1, 1, &m, err, sizeof(err)),
			   err);
		assert_non_null(strstr(err, "limit"));
		assert_enc_invalid(P_SHARD, f, (size_t)PROTO_MAX_PAYLOAD + 1);
		/* Exactly the limit passes. */
		json_object_set_new(f, "size", json_integer((json_int_t)PROTO_MAX_PAYLOAD));
		assert_int_equal(proto_encode(P_SHARD, f, (size_t)PROTO_MAX_PAYLOAD, &hdr, &len),
				 0);
		free(hdr);
		free(h);
		json_decref(f);
	}
}

/* ---- accessors ---- */

static void test_accessors(void **state)
{
	json_t *f = valid_fields(P_HELLO);
	struct proto_msg m = {0};
	char *h, err[256];
	hwfs_hash_t x, want;

	h = raw_header(PROTO_VERSION, "HELLO", f);
	assert_int_equal(dec(h, NULL, 0, 0, &m, err, sizeof(err)), 0);
	assert_string_equal(proto_str(&m, "node"), "n1");
	assert_string_equal(proto_str(&m, "current"), "v1");
	assert_null(proto_str(&m, "nope"));
	assert_null(proto_str(&m, "versions"));
	assert_string_equal(proto_str(&m, "t"), "HELLO");
	assert_int_equal(proto_int(&m, "v"), PROTO_VERSION);
	assert_int_equal(proto_int(&m, "nope"), 0);
	assert_int_equal(proto_hash(&m, "node", &x), -EINVAL);
	assert_int_equal(proto_hash(&m, "nope", &x), -EINVAL);
	proto_msg_clear(&m);
	free(h);
	json_decref(f);

	f = valid_fields(P_HAVE);
	h = raw_header(PROTO_VERSION, "HAVE", f);
	assert_int_equal(dec(h, NULL, 0, 0, &m, err, sizeof(err)), 0);
	assert_int_equal(proto_int(&m, "bytes_held"), 123);
	assert_int_equal(proto_int(&m, "bytes_needed"), 1ull << 40);
	assert_int_equal(proto_bool(&m, "complete"), 0);
	assert_int_equal(proto_hash(&m, "digest", &x), 0);
	assert_int_equal(hwfs_hash_parse(HB, &want), 0);
	assert_int_equal(hwfs_hash_cmp(&x, &want), 0);
	proto_msg_clear(&m);
	free(h);
	json_decref(f);

	f = valid_fields(P_WELCOME);
	h = raw_header(PROTO_VERSION, "WELCOME", f);
	assert_int_equal(dec(h, NULL, 0, 0, &m, err, sizeof(err)), 0);
	assert_null(proto_str(&m, "committed")); /* null */
	assert_int_equal(proto_bool(&m, "committed"), 0);
	proto_msg_clear(&m);
	free(h);
	json_decref(f);

	f = valid_fields(P_READY);
	h = raw_header(PROTO_VERSION, "READY", f);
	assert_int_equal(dec(h, NULL, 0, 0, &m, err, sizeof(err)), 0);
	assert_int_equal(proto_bool(&m, "ok"), 1);
	assert_int_equal(proto_int(&m, "txid"), 7);
	assert_string_equal(proto_str(&m, "reason"), "shadow-loaded");
	proto_msg_clear(&m);
	free(h);
	json_decref(f);

	/* On an empty message. */
	assert_null(proto_str(&m, "x"));
	assert_int_equal(proto_int(&m, "x"), 0);
	assert_int_equal(proto_bool(&m, "x"), 0);
	assert_int_equal(proto_hash(&m, "x", &x), -EINVAL);
	proto_msg_clear(NULL);
}

/* ---- over zmq ---- */

static void set_timeouts(void *s)
{
	int ms = 5000, zero = 0;

	assert_int_equal(zmq_setsockopt(s, ZMQ_RCVTIMEO, &ms, sizeof(ms)), 0);
	assert_int_equal(zmq_setsockopt(s, ZMQ_SNDTIMEO, &ms, sizeof(ms)), 0);
	assert_int_equal(zmq_setsockopt(s, ZMQ_LINGER, &zero, sizeof(zero)), 0);
}

static void send_raw(void *s, const char *const *frames, const size_t *lens, size_t n)
{
	for (size_t i = 0; i < n; i++)
		assert_true(zmq_send(s, frames[i], lens[i], i + 1 < n ? ZMQ_SNDMORE : 0) >= 0);
}

/* Receive on @s and check it is type @t with valid_fields(t) and the valid payload. */
static void recv_valid(void *s, void *ident, size_t *ident_len, enum proto_type t)
{
	struct proto_msg m = {0};
	json_t *f = valid_fields(t);
	size_t plen;
	const char *pl = valid_payload(t, &plen);
	char err[256];

	assert_int_equal(proto_recv(s, ident, ident_len, 0, &m, err, sizeof(err)), 0);
	assert_fields_equal(&m, t, f);
	if (pl) {
		assert_int_equal(m.payload_len, plen);
		assert_memory_equal(m.payload, pl, plen);
		assert_non_null(m.priv);
	} else {
		assert_null(m.payload);
		assert_null(m.priv);
	}
	proto_msg_clear(&m);
	json_decref(f);
}

static void send_valid(void *s, const void *ident, size_t ident_len, enum proto_type t)
{
	json_t *f = valid_fields(t);
	size_t plen;
	const char *pl = valid_payload(t, &plen);

	assert_int_equal(proto_send(s, ident, ident_len, t, f, pl, plen), 0);
	json_decref(f);
}

/*
 * One PAIR connection through its cases in order: nothing there, every type
 * both ways, hostile multipart messages each followed by a good one, many
 * frames (long: the cases share the socket on purpose, so that each shows the
 * next message still arrives).
 */
static void test_zmq_pair(void **state)
{
	void *ctx = zmq_ctx_new(), *a, *b;
	struct proto_msg m = {0}, big = {0}, small = {0};
	char err[256];

	assert_non_null(ctx);
	a = zmq_socket(ctx, ZMQ_PAIR);
	b = zmq_socket(ctx, ZMQ_PAIR);
	set_timeouts(a);
	set_timeouts(b);
	assert_int_equal(zmq_bind(a, "inproc://test-proto-pair"), 0);
	assert_int_equal(zmq_connect(b, "inproc://test-proto-pair"), 0);

	/* Nothing there yet. */
	assert_int_equal(proto_recv(a, NULL, NULL, 1, &m, err, sizeof(err)), -EAGAIN);

	/* Every type, in both directions. */
	for (int t = P_HELLO; t <= P_MISSING; t++) {
		send_valid(b, NULL, 0, t);
		recv_valid(a, NULL, NULL, t);
		send_valid(a, NULL, 0, t);
		recv_valid(b, NULL, NULL, t);
	}

	/* A hostile 3-frame message is read whole and dropped; the next one arrives. */
	{
		static const char ping[] = "{\"v\":2,\"t\":\"PING\"}";
		const char *fr[3] = {ping, "junk", "more junk"};
		size_t fl[3] = {strlen(ping), 4, 9};

		send_raw(b, fr, fl, 3);
		send_valid(b, NULL, 0, P_PING);
		assert_bad(proto_recv(a, NULL, NULL, 0, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "3 frames"));
		recv_valid(a, NULL, NULL, P_PING);
		assert_int_equal(proto_recv(a, NULL, NULL, 1, &m, err, sizeof(err)), -EAGAIN);
	}
	/* Many frames. */
	{
		const char *fr[100];
		size_t fl[100];

		for (int i = 0; i < 100; i++) {
			fr[i] = "{}";
			fl[i] = 2;
		}
		send_raw(b, fr, fl, 100);
		send_valid(b, NULL, 0, P_GET);
		assert_bad(proto_recv(a, NULL, NULL, 0, &m, err, sizeof(err)), err);
		recv_valid(a, NULL, NULL, P_GET);
	}
	/* A bad header, an oversize header, a payload on PING, an empty message. */
	{
		size_t n = PROTO_MAX_HEADER + 1;
		char *huge = malloc(n);
		static const char ping[] = "{\"v\":2,\"t\":\"PING\"}";
		const char *fr[2] = {ping, "payload"};
		size_t fl[2] = {strlen(ping), 7};

		assert_non_null(huge);
		memset(huge, '[', n);
		assert_true(zmq_send(b, "not json", 8, 0) == 8);
		assert_true(zmq_send(b, huge, n, 0) == (int)n);
		send_raw(b, fr, fl, 2);
		assert_true(zmq_send(b, "", 0, 0) == 0);
		send_valid(b, NULL, 0, P_SHARD);
		assert_bad(proto_recv(a, NULL, NULL, 0, &m, err, sizeof(err)), err);
		assert_bad(proto_recv(a, NULL, NULL, 0, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "limit"));
		assert_bad(proto_recv(a, NULL, NULL, 0, &m, err, sizeof(err)), err);
		assert_bad(proto_recv(a, NULL, NULL, 1, &m, err, sizeof(err)), err);
		recv_valid(a, NULL, NULL, P_SHARD);
		free(huge);
	}
	/* Payloads stay valid until proto_msg_clear, small (inside the zmq_msg_t) and large. */
	{
		size_t n = 3u << 20;
		char *bytes = malloc(n);
		json_t *f;

		assert_non_null(bytes);
		for (size_t i = 0; i < n; i++)
			bytes[i] = (char)(i * 7 + 3);
		f = json_pack("{s:i, s:s, s:I}", "req", 1, "hash", HA, "size", (json_int_t)n);
		assert_int_equal(proto_send(b, NULL, 0, P_SHARD, f, bytes, n), 0);
		json_object_set_new(f, "size", json_integer(5));
		assert_int_equal(proto_send(b, NULL, 0, P_SHARD, f, "abcde", 5), 0);
		json_decref(f);
		send_valid(b, NULL, 0, P_ANNOUNCE);
		assert_int_equal(proto_recv(a, NULL, NULL, 0, &big, err, sizeof(err)), 0);
		assert_int_equal(proto_recv(a, NULL, NULL, 0, &small, err, sizeof(err)), 0);
		recv_valid(a, NULL, NULL, P_ANNOUNCE);
		assert_int_equal(big.payload_len, n);
		assert_memory_equal(big.payload, bytes, n);
		assert_int_equal(small.payload_len, 5);
		assert_memory_equal(small.payload, "abcde", 5);
		assert_int_equal(proto_int(&big, "size"), n);
		proto_msg_clear(&big);
		proto_msg_clear(&small);
		free(bytes);
	}
	/* An empty SHARD. */
	{
		json_t *f = json_pack("{s:i, s:s, s:i}", "req", 1, "hash", HA, "size", 0);

		assert_int_equal(proto_send(b, NULL, 0, P_SHARD, f, NULL, 0), 0);
		assert_int_equal(proto_recv(a, NULL, NULL, 0, &m, err, sizeof(err)), 0);
		assert_int_equal(m.type, P_SHARD);
		assert_non_null(m.payload);
		assert_int_equal(m.payload_len, 0);
		proto_msg_clear(&m);
		json_decref(f);
	}
	/* Invalid messages are not sent at all. */
	{
		json_t *f = valid_fields(P_COMMIT);
		int saved = dup(2), devnull = open("/dev/null", O_WRONLY);

		dup2(devnull, 2);
		json_object_del(f, "txid");
		assert_int_equal(proto_send(b, NULL, 0, P_COMMIT, f, NULL, 0), -EINVAL);
		dup2(saved, 2);
		close(saved);
		close(devnull);
		json_decref(f);
		f = valid_fields(P_PING);
		assert_int_equal(proto_send(b, NULL, 0, P_PING, f, "x", 1), -EINVAL);
		assert_int_equal(proto_send(b, NULL, 0, P_PING, f, "x", 0), -EINVAL);
		json_decref(f);
		f = valid_fields(P_SHARD);
		assert_int_equal(proto_send(b, NULL, 0, P_SHARD, f, NULL, 11), -EINVAL);
		json_decref(f);
		assert_int_equal(proto_recv(a, NULL, NULL, 1, &m, err, sizeof(err)), -EAGAIN);
	}

	zmq_close(a);
	zmq_close(b);
	assert_int_equal(zmq_ctx_term(ctx), 0);
}

static void test_zmq_router_dealer(void **state)
{
	void *ctx = zmq_ctx_new(), *router, *dealer;
	char ep[128], err[256], ident[256];
	size_t ident_len;
	struct proto_msg m = {0};

	assert_non_null(ctx);
	snprintf(ep, sizeof(ep), "ipc:///tmp/hwfs-test-proto-%d.sock", (int)getpid());
	router = zmq_socket(ctx, ZMQ_ROUTER);
	dealer = zmq_socket(ctx, ZMQ_DEALER);
	set_timeouts(router);
	set_timeouts(dealer);
	assert_int_equal(zmq_setsockopt(dealer, ZMQ_ROUTING_ID, "node-1", 6), 0);
	assert_int_equal(zmq_bind(router, ep), 0);
	assert_int_equal(zmq_connect(dealer, ep), 0);

	/* node -> coordinator, with the identity; coordinator -> node, routed by it. */
	send_valid(dealer, NULL, 0, P_HELLO);
	ident_len = sizeof(ident);
	recv_valid(router, ident, &ident_len, P_HELLO);
	assert_int_equal(ident_len, 6);
	assert_memory_equal(ident, "node-1", 6);
	send_valid(router, ident, ident_len, P_WELCOME);
	recv_valid(dealer, NULL, NULL, P_WELCOME);
	send_valid(router, ident, ident_len, P_PLAN);
	recv_valid(dealer, NULL, NULL, P_PLAN);
	send_valid(dealer, NULL, 0, P_SHARD);
	ident_len = sizeof(ident);
	recv_valid(router, ident, &ident_len, P_SHARD);

	/* A hostile 3-frame message (4 with the identity), then a good one. */
	{
		static const char ping[] = "{\"v\":2,\"t\":\"PING\"}";
		const char *fr[3] = {ping, "a", "b"};
		size_t fl[3] = {strlen(ping), 1, 1};

		send_raw(dealer, fr, fl, 3);
		send_valid(dealer, NULL, 0, P_HAVE);
		ident_len = sizeof(ident);
		memset(ident, 0, sizeof(ident));
		assert_bad(proto_recv(router, ident, &ident_len, 0, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "3 frames"));
		assert_int_equal(ident_len, 6); /* who sent it is still known */
		assert_memory_equal(ident, "node-1", 6);
		ident_len = sizeof(ident);
		recv_valid(router, ident, &ident_len, P_HAVE);
	}
	/* An identity longer than the buffer: dropped whole. */
	{
		send_valid(dealer, NULL, 0, P_PING);
		send_valid(dealer, NULL, 0, P_STATUS_REQ);
		ident_len = 3;
		assert_bad(proto_recv(router, ident, &ident_len, 0, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "identity"));
		ident_len = sizeof(ident);
		recv_valid(router, ident, &ident_len, P_STATUS_REQ);
	}
	/* An empty message from the dealer: identity + empty header. */
	{
		assert_true(zmq_send(dealer, "", 0, 0) == 0);
		send_valid(dealer, NULL, 0, P_READY);
		ident_len = sizeof(ident);
		assert_bad(proto_recv(router, ident, &ident_len, 0, &m, err, sizeof(err)), err);
		ident_len = sizeof(ident);
		recv_valid(router, ident, &ident_len, P_READY);
	}
	/* Without an identity buffer, a ROUTER's identity frame is taken for the header. */
	{
		send_valid(dealer, NULL, 0, P_PING);
		assert_bad(proto_recv(router, NULL, NULL, 0, &m, err, sizeof(err)), err);
	}
	/* Bad arguments. */
	assert_int_equal(proto_recv(router, ident, NULL, 1, &m, err, sizeof(err)), -EINVAL);
	assert_int_equal(proto_recv(NULL, NULL, NULL, 1, &m, err, sizeof(err)), -EINVAL);
	assert_int_equal(proto_recv(router, NULL, NULL, 1, NULL, err, sizeof(err)), -EINVAL);
	ident_len = sizeof(ident);
	assert_int_equal(proto_recv(router, ident, &ident_len, 1, &m, err, sizeof(err)), -EAGAIN);

	zmq_close(router);
	zmq_close(dealer);
	assert_int_equal(zmq_ctx_term(ctx), 0);
	unlink(ep + strlen("ipc://"));
}


int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_frames),
		cmocka_unit_test(test_payload_rules),
		cmocka_unit_test(test_accessors),
		cmocka_unit_test(test_zmq_pair),
		cmocka_unit_test(test_zmq_router_dealer),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
