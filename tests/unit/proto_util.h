/*
 * proto_util.h — what the two unit tests of the wire codec share
 * (test_proto.c: fields, values and headers; test_proto_wire.c: frames,
 * payloads, accessors and real sockets): a valid body of every message type,
 * raw headers, decoding and encoding that must fail.  Included by a test file
 * only; a test that does not use a helper is not warned about it.
 */
#ifndef HWFS_TEST_PROTO_UTIL_H
#define HWFS_TEST_PROTO_UTIL_H

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wunused-function"

#define HA "0123456789abcdef0123456789abcdef"
#define HB "fedcba9876543210fedcba9876543210"
#define MANIFEST "{\"format\":\"hwfs-manifest/1\",\"name\":\"v2\"}"
#define SHARD_BYTES "hello world"

/* ---- helpers ---- */

/* A valid set of fields for each type (a new reference). */
static json_t *valid_fields(enum proto_type t)
{
	json_t *f = NULL;

	switch (t) {
	case P_HELLO:
		f = json_pack("{s:s, s:s, s:[{s:s, s:s, s:b}, {s:s, s:s, s:b}], s:s}", "node", "n1",
			      "listen", "tcp://10.0.0.1:7100", "versions", "name", "v1", "digest",
			      HA, "complete", 1, "name", "v2", "digest", HB, "complete", 0,
			      "current", "v1");
		break;
	case P_ANNOUNCE:
		f = json_pack("{s:s, s:s}", "version", "v2", "digest", HB);
		break;
	case P_HAVE:
		f = json_pack("{s:s, s:s, s:b, s:I, s:I}", "version", "v2", "digest", HB,
			      "complete", 0, "bytes_held", (json_int_t)123,
			      "bytes_needed", (json_int_t)1 << 40);
		break;
	case P_READY:
		f = json_pack("{s:I, s:s, s:b, s:s}", "txid", (json_int_t)7, "version", "v2", "ok",
			      1, "reason", "shadow-loaded");
		break;
	case P_ACK:
		f = json_pack("{s:I, s:s, s:b, s:s}", "txid", (json_int_t)7, "version", "v2", "ok",
			      0, "reason", "disk full");
		break;
	case P_COMMIT_REQ:
		f = json_pack("{s:I, s:s, s:I}", "req", (json_int_t)1, "version", "v2",
			      "deadline_ms", (json_int_t)30000);
		break;
	case P_STATUS_REQ:
		f = json_pack("{s:I}", "req", (json_int_t)2);
		break;
	case P_PING:
	case P_PONG:
		f = json_object();
		break;
	case P_WELCOME:
		f = json_pack("{s:s, s:n}", "coordinator", "c0", "committed");
		break;
	case P_PLAN:
		f = json_pack("{s:s, s:s, s:[{s:s, s:s}, {s:s, s:s}]}", "version", "v2", "digest",
			      HB, "donors", "node", "n1", "addr", "tcp://10.0.0.1:7101", "node",
			      "n2", "addr", "tcp://10.0.0.2:7101");
		break;
	case P_PREPARE:
		f = json_pack("{s:I, s:s, s:s}", "txid", (json_int_t)8, "version", "v2", "digest",
			      HB);
		break;
	case P_COMMIT:
		f = json_pack("{s:I, s:s}", "txid", (json_int_t)8, "version", "v2");
		break;
	case P_ABORT:
		f = json_pack("{s:I, s:s, s:s}", "txid", (json_int_t)8, "version", "v2", "reason",
			      "n2 not ready");
		break;
	case P_COMMIT_RES:
		f = json_pack("{s:I, s:b, s:[s, s]}", "req", (json_int_t)1, "ok", 1, "nodes", "n1",
			      "n2");
		break;
	case P_STATUS_RES:
		f = json_pack("{s:I, s:{s:{s:s}, s:n}}", "req", (json_int_t)2, "cluster", "nodes",
			      "n1", "state", "ready", "committed");
		break;
	case P_GET:
		f = json_pack("{s:I, s:[s, s]}", "req", (json_int_t)9, "hashes", HA, HB);
		break;
	case P_SHARD:
		f = json_pack("{s:I, s:s, s:I}", "req", (json_int_t)9, "hash", HA, "size",
			      (json_int_t)strlen(SHARD_BYTES));
		break;
	case P_MISSING:
		f = json_pack("{s:I, s:s}", "req", (json_int_t)9, "hash", HB);
		break;
	}
	assert_non_null(f);
	return f;
}

static int takes_payload(enum proto_type t)
{
	return t == P_ANNOUNCE || t == P_PLAN || t == P_SHARD;
}

/* The payload that goes with valid_fields(@t), or NULL. */
static const char *valid_payload(enum proto_type t, size_t *len)
{
	const char *p = NULL;

	if (t == P_ANNOUNCE || t == P_PLAN)
		p = MANIFEST;
	else if (t == P_SHARD)
		p = SHARD_BYTES;
	*len = p ? strlen(p) : 0;
	return p;
}

static int is_optional(enum proto_type t, const char *key)
{
	return !strcmp(key, "reason") && (t == P_READY || t == P_ACK || t == P_COMMIT_RES);
}

/* Header text of type name @tname (may be NULL: no "t") + @fields, with "v" = @v. */
static char *raw_header(int v, const char *tname, json_t *fields)
{
	json_t *h = json_object();
	char *s;

	assert_non_null(h);
	assert_int_equal(json_object_set_new(h, "v", json_integer(v)), 0);
	if (tname)
		assert_int_equal(json_object_set_new(h, "t", json_string(tname)), 0);
	if (fields)
		assert_int_equal(json_object_update(h, fields), 0);
	s = json_dumps(h, JSON_COMPACT);
	assert_non_null(s);
	json_decref(h);
	return s;
}

/* Decode @hdr (NUL-terminated) with an optional payload frame. */
static int dec(const char *hdr, const void *pl, size_t plen, int with_payload,
	       struct proto_msg *m, char *err, size_t errlen)
{
	const void *fr[2] = {hdr, pl};
	size_t fl[2] = {strlen(hdr), plen};

	return proto_decode_frames(fr, fl, with_payload ? 2 : 1, m, err, errlen);
}

/* Decode type @t with @fields (raw, not through proto_encode) and the valid payload. */
static int dec_fields(enum proto_type t, json_t *fields, char *err, size_t errlen)
{
	struct proto_msg m = {0};
	size_t plen;
	const char *pl = valid_payload(t, &plen);
	char *hdr = raw_header(PROTO_VERSION, proto_type_name(t), fields);
	int r = dec(hdr, pl, plen, takes_payload(t), &m, err, errlen);

	free(hdr);
	if (r == 0) {
		assert_int_equal(m.type, t);
		proto_msg_clear(&m);
	}
	return r;
}

/* The rejected message must come with a reason: one line of printable ASCII. */
static void assert_bad(int r, const char *err)
{
	assert_int_equal(r, -EBADMSG);
	assert_true(err[0] != '\0');
	for (const char *p = err; *p; p++)
		assert_true(*p >= 0x20 && *p < 0x7f);
}

/* proto_encode() logs why it refused; keep expected refusals off the test output. */
static int enc_quiet(enum proto_type t, json_t *fields, size_t plen, char **hdr, size_t *len)
{
	int saved = dup(2), devnull = open("/dev/null", O_WRONLY), r;

	assert_true(saved >= 0 && devnull >= 0);
	fflush(stderr);
	dup2(devnull, 2);
	r = proto_encode(t, fields, plen, hdr, len);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	close(devnull);
	return r;
}

static void assert_enc_invalid(enum proto_type t, json_t *fields, size_t plen)
{
	char *hdr = NULL;
	size_t len = 0;

	assert_int_equal(enc_quiet(t, fields, plen, &hdr, &len), -EINVAL);
	assert_null(hdr);
}

/* Every key of @fields is in @m with an equal value; "v" and "t" are right. */
static void assert_fields_equal(const struct proto_msg *m, enum proto_type t, json_t *fields)
{
	const char *key;
	json_t *val;

	assert_int_equal(m->type, t);
	assert_int_equal(json_integer_value(json_object_get(m->h, "v")), PROTO_VERSION);
	assert_string_equal(json_string_value(json_object_get(m->h, "t")), proto_type_name(t));
	assert_int_equal(json_object_size(m->h), json_object_size(fields) + 2);
	json_object_foreach(fields, key, val)
	{
		assert_true(json_equal(json_object_get(m->h, key), val));
	}
}


#pragma GCC diagnostic pop

#endif /* HWFS_TEST_PROTO_UTIL_H */
