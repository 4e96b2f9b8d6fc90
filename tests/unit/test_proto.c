/*
 * test_proto.c — the replicator's wire codec, message by message: every
 * message type survives encode -> decode with its fields intact; every
 * required field, when missing or of the wrong type, is rejected by the
 * decoder (-EBADMSG with a reason) and by the encoder (-EINVAL); values and
 * limits, and the hostile headers (duplicate keys, other versions) are
 * refused.  Frames, payloads and real sockets are test_proto_wire.c.
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

#include "ctl.h"
#include "proto.h"

#include "proto_util.h"

/* ---- round trips ---- */

static void test_type_names(void **state)
{
	assert_string_equal(proto_type_name(P_HELLO), "HELLO");
	assert_string_equal(proto_type_name(P_COMMIT_REQ), "COMMIT_REQ");
	assert_string_equal(proto_type_name(P_MISSING), "MISSING");
	assert_string_equal(proto_type_name((enum proto_type)0), "?");
	assert_string_equal(proto_type_name((enum proto_type)20), "?");
	assert_string_equal(proto_type_name((enum proto_type)-1), "?");
}

static void test_roundtrip_every_type(void **state)
{
	for (int t = P_HELLO; t <= P_MISSING; t++) {
		json_t *f = valid_fields(t);
		struct proto_msg m = {0};
		size_t plen, hlen;
		const char *pl = valid_payload(t, &plen);
		char *hdr = NULL, err[256];
		const void *fr[2];
		size_t fl[2];

		assert_int_equal(proto_encode(t, f, plen, &hdr, &hlen), 0);
		assert_int_equal(strlen(hdr), hlen);
		assert_int_equal(strncmp(hdr, "{\"v\":2,\"t\":\"", 12), 0);
		fr[0] = hdr;
		fl[0] = hlen;
		fr[1] = pl;
		fl[1] = plen;
		assert_int_equal(proto_decode_frames(fr, fl, takes_payload(t) ? 2 : 1, &m, err,
						     sizeof(err)),
				 0);
		assert_string_equal(err, "");
		assert_fields_equal(&m, t, f);
		{
			char *again = json_dumps(m.h, JSON_COMPACT); /* compact, as sent */

			assert_string_equal(again, hdr);
			free(again);
		}
		if (takes_payload(t)) {
			assert_ptr_equal(m.payload, pl);
			assert_int_equal(m.payload_len, plen);
		} else {
			assert_null(m.payload);
			assert_int_equal(m.payload_len, 0);
		}
		assert_null(m.priv);
		proto_msg_clear(&m);
		assert_null(m.h);
		proto_msg_clear(&m); /* twice is harmless */
		free(hdr);
		json_decref(f);
	}
}

static void test_encode_null_fields(void **state)
{
	struct proto_msg m = {0};
	char *hdr, err[256];
	size_t len;

	assert_int_equal(proto_encode(P_PING, NULL, 0, &hdr, &len), 0);
	assert_string_equal(hdr, "{\"v\":2,\"t\":\"PING\"}");
	assert_int_equal(len, strlen(hdr));
	assert_int_equal(dec(hdr, NULL, 0, 0, &m, err, sizeof(err)), 0);
	assert_int_equal(m.type, P_PING);
	proto_msg_clear(&m);
	free(hdr);
	assert_int_equal(proto_encode(P_PONG, NULL, 0, &hdr, &len), 0);
	assert_string_equal(hdr, "{\"v\":2,\"t\":\"PONG\"}");
	free(hdr);
	/* NULL fields for a type with required fields is an invalid message. */
	assert_enc_invalid(P_HELLO, NULL, 0);
}

static void test_encode_rules(void **state)
{
	json_t *f = valid_fields(P_COMMIT), *g;
	char *hdr;
	size_t len;

	/* Unknown type. */
	assert_enc_invalid((enum proto_type)0, f, 0);
	assert_enc_invalid((enum proto_type)20, f, 0);
	/* Fields must be an object. */
	g = json_array();
	assert_enc_invalid(P_PING, g, 0);
	json_decref(g);
	/* "v"/"t" may repeat the right values (re-sending a decoded header) ... */
	g = json_deep_copy(f);
	json_object_set_new(g, "v", json_integer(PROTO_VERSION));
	json_object_set_new(g, "t", json_string("COMMIT"));
	assert_int_equal(proto_encode(P_COMMIT, g, 0, &hdr, &len), 0);
	free(hdr);
	/* ... but not override them. */
	json_object_set_new(g, "t", json_string("ABORT"));
	assert_enc_invalid(P_COMMIT, g, 0);
	json_object_set_new(g, "t", json_string("COMMIT"));
	json_object_set_new(g, "v", json_integer(PROTO_VERSION + 1));
	assert_enc_invalid(P_COMMIT, g, 0);
	json_object_set_new(g, "v", json_string("1"));
	assert_enc_invalid(P_COMMIT, g, 0);
	json_decref(g);
	/* The fields are not stolen. */
	assert_int_equal(f->refcount, 1);
	json_decref(f);
	/* Bad arguments. */
	assert_int_equal(proto_encode(P_PING, NULL, 0, NULL, &len), -EINVAL);
	assert_int_equal(proto_encode(P_PING, NULL, 0, &hdr, NULL), -EINVAL);
}

static void test_unknown_fields_ignored(void **state)
{
	char err[256];
	json_t *f = valid_fields(P_HELLO);

	/* Top level, and inside an entry of "versions". */
	json_object_set_new(f, "future", json_pack("{s:[i, f, n]}", "x", 1, 2.5));
	json_object_set_new(json_array_get(json_object_get(f, "versions"), 0), "shadow",
			    json_true());
	assert_int_equal(dec_fields(P_HELLO, f, err, sizeof(err)), 0);
	json_decref(f);
	f = valid_fields(P_PLAN);
	json_object_set_new(json_array_get(json_object_get(f, "donors"), 1), "rate",
			    json_integer(-5));
	assert_int_equal(dec_fields(P_PLAN, f, err, sizeof(err)), 0);
	json_decref(f);
}

static void test_optional_and_nullable(void **state)
{
	char err[256], *hdr;
	size_t len;
	json_t *f;

	/* reason is optional in READY/ACK/COMMIT_RES: absent or null is fine. */
	for (enum proto_type t = P_READY; t <= P_ACK; t++) {
		f = valid_fields(t);
		json_object_del(f, "reason");
		assert_int_equal(dec_fields(t, f, err, sizeof(err)), 0);
		json_object_set_new(f, "reason", json_null());
		assert_int_equal(dec_fields(t, f, err, sizeof(err)), 0);
		assert_int_equal(proto_encode(t, f, 0, &hdr, &len), 0);
		free(hdr);
		/* but when given it is a str. */
		json_object_set_new(f, "reason", json_string(""));
		assert_bad(dec_fields(t, f, err, sizeof(err)), err);
		json_decref(f);
	}
	f = valid_fields(P_COMMIT_RES);
	json_object_set_new(f, "reason", json_string("n3 timed out"));
	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	json_object_set_new(f, "reason", json_integer(3));
	assert_bad(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), err);
	json_decref(f);
	/* ABORT's reason is required. */
	f = valid_fields(P_ABORT);
	json_object_set_new(f, "reason", json_null());
	assert_bad(dec_fields(P_ABORT, f, err, sizeof(err)), err);
	json_decref(f);
	/* current/committed: str or null, but present. */
	f = valid_fields(P_HELLO);
	json_object_set_new(f, "current", json_null());
	assert_int_equal(dec_fields(P_HELLO, f, err, sizeof(err)), 0);
	json_object_set_new(f, "current", json_string(""));
	assert_bad(dec_fields(P_HELLO, f, err, sizeof(err)), err);
	json_decref(f);
	f = valid_fields(P_WELCOME);
	json_object_set_new(f, "committed", json_string("v7"));
	assert_int_equal(dec_fields(P_WELCOME, f, err, sizeof(err)), 0);
	json_object_del(f, "committed");
	assert_bad(dec_fields(P_WELCOME, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "committed"));
	json_decref(f);
	/* Empty arrays are fine where no minimum is set. */
	f = json_pack("{s:s, s:s, s:[], s:n}", "node", "n1", "listen", "x", "versions", "current");
	assert_int_equal(dec_fields(P_HELLO, f, err, sizeof(err)), 0);
	json_decref(f);
	f = json_pack("{s:i, s:b, s:[]}", "req", 1, "ok", 0, "nodes");
	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	json_decref(f);
}

/*
 * HELLO.applied/epoch (the decision a node applied, relearnt by a coordinator
 * without --state): optional, a str and an int when given.
 */
static void test_hello_applied(void **state)
{
	char err[256];
	json_t *f = valid_fields(P_HELLO);

	json_object_set_new(f, "applied", json_string("v3"));
	json_object_set_new(f, "epoch", json_integer(4));
	assert_int_equal(dec_fields(P_HELLO, f, err, sizeof(err)), 0);
	json_object_set_new(f, "epoch", json_integer(-1));
	assert_bad(dec_fields(P_HELLO, f, err, sizeof(err)), err);
	json_object_set_new(f, "epoch", json_integer(4));
	json_object_set_new(f, "applied", json_integer(3));
	assert_bad(dec_fields(P_HELLO, f, err, sizeof(err)), err);
	json_decref(f);
}

/* What a coordinator keeps of a node's version names and of HELLO.engines. */
static void test_hello_engines(void **state)
{
	char big[HWFS_NAME_MAX + 2];
	json_t *in, *out, *e;

	assert_true(proto_version_name_ok("v1"));
	assert_false(proto_version_name_ok(NULL));
	assert_false(proto_version_name_ok(""));
	assert_false(proto_version_name_ok("v\x1b[2J"));
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	assert_false(proto_version_name_ok(big));
	big[HWFS_NAME_MAX] = '\0';
	assert_true(proto_version_name_ok(big));

	in = json_pack("[{s:s, s:i, s:s, s:s, s:s, s:i}, {s:s}, {s:s, s:i, s:s}]", "name", "e1",
		       "pid", 7, "serving", "v1", "state", "loaded", "reason", "a\nb", "swaps", -2,
		       "name", "bad name", "name", "e2", "pid", 1, "state", "dancing");
	out = proto_hello_engines(in);
	assert_non_null(out);
	assert_int_equal(json_array_size(out), 2); /* the entry without a valid name is left out */
	e = json_array_get(out, 0);
	assert_string_equal(json_string_value(json_object_get(e, "name")), "e1");
	assert_int_equal(json_integer_value(json_object_get(e, "pid")), 7);
	assert_string_equal(json_string_value(json_object_get(e, "serving")), "v1");
	assert_string_equal(json_string_value(json_object_get(e, "state")), "loaded");
	assert_string_equal(json_string_value(json_object_get(e, "reason")), "a b");
	assert_true(json_is_null(json_object_get(e, "swaps")));
	assert_true(json_is_null(json_object_get(e, "shadow")));
	assert_true(json_is_null(json_object_get(json_array_get(out, 1), "state")));
	json_decref(out);
	json_decref(in);
}

/* The optional fields added for commit results, commit catch-up and waiting pulls. */
/*
 * Version 2's delta fields: GET bases/widths (one per hash, widths 1/2/4/8),
 * SHARD enc (only "xor-zstd", with its base), PLAN base.
 */
static void test_delta_fields(void **state)
{
	char err[256];
	json_t *f;

	/* valid */
	f = json_pack("{s:i, s:[s,s], s:[s,s], s:[i,i]}", "req", 1, "hashes", HA, HB, "bases", HB,
		      "00000000000000000000000000000000", "widths", 2, 8);
	assert_int_equal(dec_fields(P_GET, f, err, sizeof(err)), 0);
	/* one base too few, one width too many, a width of 3, a bad base */
	json_object_set_new(f, "bases", json_pack("[s]", HB));
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "\"bases\" has 1 entries, \"hashes\" 2"));
	json_object_set_new(f, "bases", json_null());
	json_object_set_new(f, "widths", json_pack("[i,i,i]", 1, 1, 1));
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	json_object_set_new(f, "widths", json_pack("[i,i]", 1, 3));
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "widths[1]"));
	json_object_set_new(f, "widths", json_pack("[s,i]", "2", 1));
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	json_object_set_new(f, "widths", json_null());
	json_object_set_new(f, "bases", json_pack("[s,s]", HA, "XYZ"));
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	json_decref(f);

	/* SHARD: a delta piece, and what is refused */
	f = json_pack("{s:i, s:s, s:I, s:s, s:s}", "req", 1, "hash", HA, "size",
		      (json_int_t)strlen(SHARD_BYTES), "enc", PROTO_ENC_DELTA, "base", HB);
	assert_int_equal(dec_fields(P_SHARD, f, err, sizeof(err)), 0);
	json_object_set_new(f, "enc", json_string("gzip"));
	assert_bad(dec_fields(P_SHARD, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "unknown encoding"));
	json_object_del(f, "enc");
	assert_bad(dec_fields(P_SHARD, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "\"base\" without \"enc\""));
	json_object_set_new(f, "enc", json_string(PROTO_ENC_DELTA));
	json_object_del(f, "base");
	assert_bad(dec_fields(P_SHARD, f, err, sizeof(err)), err);
	json_decref(f);

	/* PLAN: base is a version name */
	f = json_pack("{s:s, s:s, s:[], s:s}", "version", "v2", "digest", HA, "donors", "base", "v1");
	assert_int_equal(dec_fields(P_PLAN, f, err, sizeof(err)), 0);
	json_object_set_new(f, "base", json_integer(1));
	assert_bad(dec_fields(P_PLAN, f, err, sizeof(err)), err);
	json_decref(f);
}

static void test_optional_result_fields(void **state)
{
	char err[256];
	json_t *f = json_pack("{s:i, s:b, s:s, s:[s], s:s, s:[s], s:{s:s}, s:[]}", "req", 1, "ok", 0,
			      "reason", "some nodes failed to flip", "nodes", "A", "outcome",
			      "partial", "committed", "A", "failed", "C", "symlink: ENOENT", "unknown");

	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	json_object_set_new(f, "failed", json_string("C"));   /* an object, not a string */
	assert_bad(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), err);
	json_object_set_new(f, "failed", json_object());
	json_object_set_new(f, "committed", json_pack("[i]", 3)); /* node names */
	assert_bad(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), err);
	json_object_set_new(f, "committed", json_array());
	json_object_set_new(f, "errno", json_integer(EINPROGRESS)); /* relayed by the node */
	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	/* a bad errno costs the message its errno (proto_errno(): EPROTO), not the message */
	json_object_set_new(f, "errno", json_string("EINPROGRESS"));
	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	json_object_set_new(f, "errno", json_integer(-EINPROGRESS));
	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	json_decref(f);

	f = json_pack("{s:s, s:i}", "committed", "v2", "epoch", 4);
	assert_int_equal(dec_fields(P_PONG, f, err, sizeof(err)), 0);
	json_object_set_new(f, "committed", json_null()); /* nothing committed yet */
	assert_int_equal(dec_fields(P_PONG, f, err, sizeof(err)), 0);
	json_object_set_new(f, "epoch", json_real(1.5));
	assert_bad(dec_fields(P_PONG, f, err, sizeof(err)), err);
	json_decref(f);

	f = valid_fields(P_HAVE);
	json_object_set_new(f, "waiting", json_string("waiting for space: need 24.0M, free 15.9M"));
	assert_int_equal(dec_fields(P_HAVE, f, err, sizeof(err)), 0);
	json_object_set_new(f, "waiting", json_integer(1));
	assert_bad(dec_fields(P_HAVE, f, err, sizeof(err)), err);
	json_decref(f);
}

/*
 * The errno of every reply that can fail (READY, ACK, ABORT, MISSING,
 * COMMIT_RES): absent or null -> the caller's default, 1..CTL_ERRNO_MAX as
 * sent, anything else (a hostile peer: the wrong JSON type, zero, negative,
 * out of range) -> EPROTO; the message itself is accepted every time.
 */
static void test_errno_field(void **state)
{
	static const enum proto_type types[] = {P_READY, P_ACK, P_ABORT, P_MISSING, P_COMMIT_RES};
	struct {
		json_t *val; /* NULL: absent */
		int want;    /* with ECANCELED as the default */
	} cases[] = {
		{NULL, ECANCELED},
		{json_null(), ECANCELED},
		{json_integer(ETIMEDOUT), ETIMEDOUT},
		{json_integer(ENOSPC), ENOSPC},
		{json_integer(CTL_ERRNO_MAX), CTL_ERRNO_MAX},
		{json_integer(CTL_ERRNO_MAX + 1), EPROTO},
		{json_integer(0), EPROTO},
		{json_integer(-5), EPROTO},
		{json_integer((json_int_t)1 << 62), EPROTO},
		{json_string("ETIMEDOUT"), EPROTO},
		{json_real(110.0), EPROTO},
		{json_true(), EPROTO},
		{json_pack("[i]", ETIMEDOUT), EPROTO},
		{json_pack("{s:i}", "errno", ETIMEDOUT), EPROTO},
	};

	for (size_t t = 0; t < sizeof(types) / sizeof(types[0]); t++) {
		for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
			json_t *f = valid_fields(types[t]);
			size_t plen;
			const char *pl = valid_payload(types[t], &plen);
			struct proto_msg m;
			char err[256], *hdr;

			if (cases[i].val)
				json_object_set(f, "errno", cases[i].val);
			hdr = raw_header(PROTO_VERSION, proto_type_name(types[t]), f);
			assert_int_equal(dec(hdr, pl, plen, takes_payload(types[t]), &m, err,
					     sizeof(err)),
					 0);
			assert_int_equal(proto_errno(&m, ECANCELED), cases[i].want);
			proto_msg_clear(&m);
			free(hdr);
			json_decref(f);
		}
	}
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		json_decref(cases[i].val);
}

/* ---- rejections, field by field ---- */

static void test_missing_field_every_type(void **state)
{
	int rejected[P_MISSING + 1] = {0};

	for (int t = P_HELLO; t <= P_MISSING; t++) {
		json_t *f = valid_fields(t);
		const char *key;
		json_t *val;

		json_object_foreach(f, key, val)
		{
			json_t *g = json_deep_copy(f);
			char err[256];

			json_object_del(g, key);
			if (is_optional(t, key)) {
				assert_int_equal(dec_fields(t, g, err, sizeof(err)), 0);
			} else {
				assert_bad(dec_fields(t, g, err, sizeof(err)), err);
				assert_non_null(strstr(err, key));
				assert_non_null(strstr(err, proto_type_name(t)));
				assert_enc_invalid(t, g, takes_payload(t) ? 11 : 0);
				rejected[t]++;
			}
			json_decref(g);
		}
		json_decref(f);
	}
	for (int t = P_HELLO; t <= P_MISSING; t++)
		if (t != P_PING && t != P_PONG) /* no fields to miss */
			assert_true(rejected[t] > 0);
}

/* A value of another JSON type than @v. */
static json_t *wrong_value(const json_t *v, int variant)
{
	switch (json_typeof(v)) {
	case JSON_STRING:
		return variant ? json_integer(5) : json_true();
	case JSON_INTEGER:
		return variant ? json_string("5") : json_real(5.0);
	case JSON_TRUE:
	case JSON_FALSE:
		return variant ? json_integer(1) : json_string("true");
	case JSON_ARRAY:
		return variant ? json_object() : json_string("[]");
	case JSON_OBJECT:
		return variant ? json_array() : json_true();
	case JSON_NULL:
		return variant ? json_integer(0) : json_false();
	default:
		return json_null();
	}
}

static void test_wrong_type_every_type(void **state)
{
	int rejected[P_MISSING + 1] = {0};

	for (int t = P_HELLO; t <= P_MISSING; t++) {
		json_t *f = valid_fields(t);
		const char *key;
		json_t *val;

		json_object_foreach(f, key, val)
		{
			for (int variant = 0; variant < 2; variant++) {
				json_t *g = json_deep_copy(f);
				char err[256];

				json_object_set_new(g, key, wrong_value(val, variant));
				assert_bad(dec_fields(t, g, err, sizeof(err)), err);
				assert_non_null(strstr(err, key));
				assert_enc_invalid(t, g, takes_payload(t) ? 11 : 0);
				rejected[t]++;
				json_decref(g);
			}
		}
		json_decref(f);
	}
	for (int t = P_HELLO; t <= P_MISSING; t++)
		if (t != P_PING && t != P_PONG)
			assert_true(rejected[t] >= 2);
}

static void test_nested_entries(void **state)
{
	static const struct {
		enum proto_type t;
		const char *arr, *key;
		int idx;
		const char *json; /* new value of entry[idx].key; NULL: delete it */
	} bad[] = {
		{P_HELLO, "versions", "digest", 1, NULL},
		{P_HELLO, "versions", "name", 0, NULL},
		{P_HELLO, "versions", "complete", 0, NULL},
		{P_HELLO, "versions", "digest", 1, "\"0123456789ABCDEF0123456789ABCDEF\""},
		{P_HELLO, "versions", "digest", 0, "\"0123456789abcdef\""},
		{P_HELLO, "versions", "name", 1, "\"\""},
		{P_HELLO, "versions", "complete", 1, "\"yes\""},
		{P_PLAN, "donors", "addr", 1, NULL},
		{P_PLAN, "donors", "node", 0, "7"},
		{P_PLAN, "donors", "addr", 0, "null"},
	};

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(bad); i++) {
		json_t *f = valid_fields(bad[i].t);
		json_t *e = json_array_get(json_object_get(f, bad[i].arr), bad[i].idx);
		char err[256], want[64];

		if (bad[i].json)
			json_object_set_new(e, bad[i].key,
					    json_loads(bad[i].json, JSON_DECODE_ANY, NULL));
		else
			json_object_del(e, bad[i].key);
		assert_bad(dec_fields(bad[i].t, f, err, sizeof(err)), err);
		snprintf(want, sizeof(want), "%s[%d].%s", bad[i].arr, bad[i].idx, bad[i].key);
		assert_non_null(strstr(err, want));
		json_decref(f);
	}

	/* Entries that are not objects; arrays of the wrong element type. */
	{
		json_t *f = valid_fields(P_HELLO);
		char err[256];

		json_array_append_new(json_object_get(f, "versions"), json_string("v3"));
		assert_bad(dec_fields(P_HELLO, f, err, sizeof(err)), err);
		assert_non_null(strstr(err, "versions[2]"));
		json_decref(f);
		f = valid_fields(P_COMMIT_RES);
		json_array_append_new(json_object_get(f, "nodes"), json_integer(3));
		assert_bad(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), err);
		assert_non_null(strstr(err, "nodes[2]"));
		json_decref(f);
		f = valid_fields(P_GET);
		json_array_append_new(json_object_get(f, "hashes"), json_string("xyz"));
		assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
		json_decref(f);
	}
}

/* ---- values and limits ---- */

static void test_hex(void **state)
{
	static const char *const bad[] = {
		"0123456789ABCDEF0123456789ABCDEF", /* uppercase */
		"0123456789abcdef0123456789abcdeF", /* one uppercase digit */
		"0123456789abcdef0123456789abcdeg", /* not hex */
		"0123456789abcdef0123456789abcde",  /* 31 */
		"0123456789abcdef0123456789abcdef0", /* 33 */
		" 123456789abcdef0123456789abcdef", "",
	};
	char err[256];

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(bad); i++) {
		json_t *f = valid_fields(P_MISSING);

		json_object_set_new(f, "hash", json_string(bad[i]));
		assert_bad(dec_fields(P_MISSING, f, err, sizeof(err)), err);
		assert_non_null(strstr(err, "hash"));
		assert_enc_invalid(P_MISSING, f, 0);
		json_decref(f);
	}
}

static void test_ints(void **state)
{
	static const struct {
		const char *text;
		int ok;
	} cases[] = {
		{"0", 1},
		{"9007199254740992", 1},  /* 2^53 */
		{"9007199254740993", 0},  /* 2^53 + 1 */
		{"9223372036854775807", 0},
		{"99999999999999999999", 0}, /* not even an int64: invalid JSON for jansson */
		{"-1", 0},
		{"-9223372036854775808", 0},
		{"1.0", 0},
		{"1e3", 0},
		{"\"1\"", 0},
		{"true", 0},
		{"null", 0},
	};
	char hdr[256], err[256];

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(cases); i++) {
		struct proto_msg m = {0};
		int r;

		snprintf(hdr, sizeof(hdr), "{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":%s}",
			 cases[i].text);
		r = dec(hdr, NULL, 0, 0, &m, err, sizeof(err));
		if (cases[i].ok) {
			assert_int_equal(r, 0);
			assert_int_equal(proto_int(&m, "req"), strtoull(cases[i].text, NULL, 10));
			proto_msg_clear(&m);
		} else {
			assert_bad(r, err);
		}
	}
	/* The encoder applies the same bounds. */
	{
		json_t *f = json_pack("{s:I}", "req", (json_int_t)(1ll << 53) + 1);

		assert_enc_invalid(P_STATUS_REQ, f, 0);
		json_object_set_new(f, "req", json_integer(-1));
		assert_enc_invalid(P_STATUS_REQ, f, 0);
		json_decref(f);
	}
}

static void test_strings(void **state)
{
	char err[256], *s = malloc(PROTO_MAX_STR + 2);
	json_t *f = valid_fields(P_COMMIT);

	assert_non_null(s);
	memset(s, 'x', PROTO_MAX_STR + 1);
	s[PROTO_MAX_STR] = '\0';
	json_object_set_new(f, "version", json_string(s)); /* exactly the limit */
	assert_int_equal(dec_fields(P_COMMIT, f, err, sizeof(err)), 0);
	s[PROTO_MAX_STR] = 'x';
	s[PROTO_MAX_STR + 1] = '\0';
	json_object_set_new(f, "version", json_string(s)); /* one over */
	assert_bad(dec_fields(P_COMMIT, f, err, sizeof(err)), err);
	assert_enc_invalid(P_COMMIT, f, 0);
	json_object_set_new(f, "version", json_string(""));
	assert_bad(dec_fields(P_COMMIT, f, err, sizeof(err)), err);
	assert_enc_invalid(P_COMMIT, f, 0);
	json_object_set_new(f, "version", json_stringn("a\0b", 3)); /* embedded NUL */
	assert_enc_invalid(P_COMMIT, f, 0);
	json_decref(f);
	free(s);

	/* NUL escapes and invalid UTF-8 never get through the parser. */
	{
		struct proto_msg m;
		static const char nul[] = "{\"v\":2,\"t\":\"COMMIT\",\"txid\":1,\"version\":\"a\\u0000b\"}";
		static const char bad_utf8[] = "{\"v\":2,\"t\":\"COMMIT\",\"txid\":1,\"version\":\"\xff\xfe\"}";
		static const char utf8[] = "{\"v\":2,\"t\":\"COMMIT\",\"txid\":1,\"version\":\"v\xc3\xa9\"}";

		assert_bad(dec(nul, NULL, 0, 0, &m, err, sizeof(err)), err);
		assert_bad(dec(bad_utf8, NULL, 0, 0, &m, err, sizeof(err)), err);
		assert_int_equal(dec(utf8, NULL, 0, 0, &m, err, sizeof(err)), 0);
		assert_string_equal(proto_str(&m, "version"), "v\xc3\xa9");
		proto_msg_clear(&m);
	}
}

static void test_get_limits(void **state)
{
	json_t *f = json_pack("{s:i, s:[]}", "req", 1, "hashes");
	json_t *a = json_object_get(f, "hashes");
	char err[256], *hdr;
	size_t len;

	/* 0 hashes: rejected. */
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	for (int i = 0; i < PROTO_MAX_GET; i++)
		json_array_append_new(a, json_string(i & 1 ? HA : HB));
	assert_int_equal(dec_fields(P_GET, f, err, sizeof(err)), 0);
	assert_int_equal(proto_encode(P_GET, f, 0, &hdr, &len), 0);
	free(hdr);
	json_array_append_new(a, json_string(HA)); /* 1025 */
	assert_bad(dec_fields(P_GET, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "hashes"));
	assert_enc_invalid(P_GET, f, 0);
	json_decref(f);
}

static void test_array_limit(void **state)
{
	json_t *f = json_pack("{s:i, s:b, s:[]}", "req", 1, "ok", 1, "nodes");
	json_t *a = json_object_get(f, "nodes");
	char err[256];

	for (int i = 0; i < PROTO_MAX_ARRAY; i++)
		json_array_append_new(a, json_string("n"));
	assert_int_equal(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), 0);
	json_array_append_new(a, json_string("n"));
	assert_bad(dec_fields(P_COMMIT_RES, f, err, sizeof(err)), err);
	assert_non_null(strstr(err, "nodes"));
	json_decref(f);
}

static void test_header_size_limit(void **state)
{
	/* {"v":1,"t":"PING","pad":"xxx..."}: unknown fields are not checked, the size is. */
	static const char pre[] = "{\"v\":2,\"t\":\"PING\",\"pad\":\"";
	const size_t n = PROTO_MAX_HEADER, plen = sizeof(pre) - 1;
	char *h = calloc(1, n + 3), err[256];
	struct proto_msg m;
	json_t *f;

	if (!h) { /* cmocka's fail() is not noreturn: tell the compiler */
		fail();
		return;
	}
	memcpy(h, pre, plen);
	memset(h + plen, 'x', n - plen);
	memcpy(h + n - 2, "\"}", 2); /* exactly PROTO_MAX_HEADER bytes */
	assert_int_equal(strlen(h), n);
	assert_int_equal(dec(h, NULL, 0, 0, &m, err, sizeof(err)), 0);
	proto_msg_clear(&m);
	memcpy(h + n - 2, "x\"}", 3); /* one byte over */
	assert_int_equal(strlen(h), n + 1);
	assert_bad(dec(h, NULL, 0, 0, &m, err, sizeof(err)), err);
	assert_non_null(strstr(err, "header is"));
	/* The encoder refuses to build one. */
	h[n - 1] = '\0';
	f = json_pack("{s:s}", "pad", h + plen);
	assert_non_null(f);
	assert_enc_invalid(P_PING, f, 0);
	json_decref(f);
	free(h);
}

/* ---- whole-header rejections ---- */

static void test_bad_headers(void **state)
{
	static const char *const bad[] = {
		"",
		"{",
		"{}x",
		"\x01",                                    /* jansson quotes these bytes ... */
		"{\"v\":2,\"t\":\"PING\",\"\x1b[31m\":1}",
		"{\"v\":2,\"t\":\"PING\",\"a\":\"\n\"}",
		"\xff\xfe",                                 /* ... and these */
		"[]",
		"\"PING\"",
		"1",
		"null",
		"{}",
		"{\"t\":\"PING\"}",                         /* no v */
		"{\"v\":1,\"t\":\"PING\"}",                 /* version 1: before deltas */
		"{\"v\":0,\"t\":\"PING\"}",
		"{\"v\":\"2\",\"t\":\"PING\"}",
		"{\"v\":2.0,\"t\":\"PING\"}",
		"{\"v\":2}",                                /* no t */
		"{\"v\":2,\"t\":5}",
		"{\"v\":2,\"t\":\"NOPE\"}",                 /* unknown type */
		"{\"v\":2,\"t\":\"ping\"}",
		"{\"v\":2,\"t\":\"\"}",
		"{\"v\":2,\"t\":\"PING\\u0000\"}",
		"{\"v\":2,\"t\":\"PING\",\"v\":2}",         /* duplicate keys */
		"{\"v\":2,\"t\":\"PING\",\"t\":\"PING\"}",
		"{\"v\":2,\"t\":\"PING\",\"x\":{\"a\":1,\"a\":2}}",
		"{\"v\":2,\"t\":\"STATUS_REQ\",\"req\":1,\"req\":2}",
		"{\"v\":2,\"t\":\"HELLO\",\"node\":\"n\",\"listen\":\"l\",\"current\":null,"
		"\"versions\":[{\"name\":\"a\",\"name\":\"b\",\"digest\":\"" HA "\",\"complete\":true}]}",
	};
	char err[256];

	for (size_t i = 0; i < HWFS_ARRAY_SIZE(bad); i++) {
		struct proto_msg m = {0};

		assert_bad(dec(bad[i], NULL, 0, 0, &m, err, sizeof(err)), err);
		assert_null(m.h); /* not touched */
	}
	/* Reasons that say what is wrong. */
	{
		struct proto_msg m;

		assert_bad(dec("{\"v\":1,\"t\":\"PING\"}", NULL, 0, 0, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "protocol version 1 not supported (this side speaks 2)"));
		assert_bad(dec("{\"v\":2,\"t\":\"NOPE\"}", NULL, 0, 0, &m, err, sizeof(err)), err);
		assert_non_null(strstr(err, "unknown message type \"NOPE\""));
		/* A hostile type name is not quoted back. */
		assert_bad(dec("{\"v\":2,\"t\":\"a\\nb\"}", NULL, 0, 0, &m, err, sizeof(err)), err);
		assert_string_equal(err, "unknown message type");
		/* A small err buffer truncates; no err buffer at all is fine. */
		assert_int_equal(dec("[]", NULL, 0, 0, &m, err, 4), -EBADMSG);
		assert_int_equal(strlen(err), 3);
		assert_int_equal(dec("[]", NULL, 0, 0, &m, NULL, 0), -EBADMSG);
	}
	/* A header with NUL bytes inside the frame. */
	{
		static const char h[] = "{\"v\":2,\"t\":\"PING\"}\0garbage";
		const void *fr[1] = {h};
		size_t fl[1] = {sizeof(h) - 1};
		struct proto_msg m;

		assert_bad(proto_decode_frames(fr, fl, 1, &m, err, sizeof(err)), err);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_type_names),
		cmocka_unit_test(test_roundtrip_every_type),
		cmocka_unit_test(test_encode_null_fields),
		cmocka_unit_test(test_encode_rules),
		cmocka_unit_test(test_unknown_fields_ignored),
		cmocka_unit_test(test_optional_and_nullable),
		cmocka_unit_test(test_hello_applied),
		cmocka_unit_test(test_hello_engines),
		cmocka_unit_test(test_missing_field_every_type),
		cmocka_unit_test(test_wrong_type_every_type),
		cmocka_unit_test(test_errno_field),
		cmocka_unit_test(test_nested_entries),
		cmocka_unit_test(test_hex),
		cmocka_unit_test(test_ints),
		cmocka_unit_test(test_strings),
		cmocka_unit_test(test_get_limits),
		cmocka_unit_test(test_array_limit),
		cmocka_unit_test(test_header_size_limit),
		cmocka_unit_test(test_bad_headers),
		cmocka_unit_test(test_optional_result_fields),
		cmocka_unit_test(test_delta_fields),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
