/*
 * proto.c — the replicator's wire codec (see proto.h and docs/protocol.md).
 *
 * The protocol is described by one table: for every message type its name,
 * whether it carries a payload frame, and its required and optional fields
 * with their types.  Decoding is parse (jansson, duplicate keys rejected,
 * size checked first) -> "v" -> "t" -> the fields of that type -> the
 * payload rules.  Each step fails with -EBADMSG and one line naming the
 * type and field, never echoing received bytes.  Encoding builds the header,
 * dumps it and runs the bytes through that same decoder, so the two sides
 * cannot disagree about what is valid.
 *
 * proto_recv() reads a whole multipart message whatever it holds: frames
 * beyond the ones the protocol allows are received and dropped, so a hostile
 * peer cannot leave the socket in the middle of a message.  The payload frame
 * stays in its zmq_msg_t (struct proto_msg.priv) until proto_msg_clear(), so
 * shards are not copied on the way in.
 */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <zmq.h>

#include "ctl.h"
#include "proto.h"

/* ------------------------------------------------------------------ */
/* the protocol table                                                  */
/* ------------------------------------------------------------------ */

enum fkind {
	F_STR,      /* non-empty string, <= PROTO_MAX_STR bytes, no NUL */
	F_STR_NULL, /* F_STR or null (the key must still be there) */
	F_INT,      /* integer in [0, PROTO_MAX_INT] */
	F_BOOL,     /* true or false */
	F_HEX,      /* 32 lowercase hex digits */
	F_OBJ,      /* any object (contents not checked) */
	F_STRS,     /* array of F_STR, <= PROTO_MAX_ARRAY */
	F_HASHES,   /* array of F_HEX, 1..PROTO_MAX_GET */
	F_WIDTHS,   /* array of F_INT, 1..PROTO_MAX_GET */
	F_VERSIONS, /* array of {name:str, digest:hex, complete:bool}, <= PROTO_MAX_ARRAY */
	F_DONORS,   /* array of {node:str, addr:str}, <= PROTO_MAX_ARRAY */
	F_ERRNO,    /* anything: read only through proto_errno(), which maps a bad one */
};

struct field {
	const char *key;
	enum fkind kind;
	int optional; /* may be absent or null */
};

#define MAX_FIELDS 9

struct schema {
	const char *name;
	int payload;                    /* 1: frame 1 required, 0: forbidden */
	struct field f[MAX_FIELDS + 1]; /* ends at key == NULL */
};

/* clang-format off */
static const struct schema schemas[] = {
	/* node -> coordinator */
	[P_HELLO] = {"HELLO",
		     0,
		     {{"node", F_STR, 0},
		      {"listen", F_STR, 0},
		      {"versions", F_VERSIONS, 0},
		      {"current", F_STR_NULL, 0},
		      {"applied", F_STR, 1},
		      {"epoch", F_INT, 1}}},
	[P_ANNOUNCE] = {"ANNOUNCE", 1, {{"version", F_STR, 0}, {"digest", F_HEX, 0}}},
	[P_HAVE] = {"HAVE",
		    0,
		    {{"version", F_STR, 0},
		     {"digest", F_HEX, 0},
		     {"complete", F_BOOL, 0},
		     {"bytes_held", F_INT, 0},
		     {"bytes_needed", F_INT, 0},
		     {"waiting", F_STR, 1}}},
	[P_READY] = {"READY",
		     0,
		     {{"txid", F_INT, 0}, {"version", F_STR, 0}, {"ok", F_BOOL, 0}, {"reason", F_STR, 1},
		      {"errno", F_ERRNO, 1}}},
	[P_ACK] = {"ACK",
		   0,
		   {{"txid", F_INT, 0}, {"version", F_STR, 0}, {"ok", F_BOOL, 0}, {"reason", F_STR, 1},
		    {"errno", F_ERRNO, 1}}},
	[P_COMMIT_REQ] = {"COMMIT_REQ",
			  0,
			  {{"req", F_INT, 0}, {"version", F_STR, 0}, {"deadline_ms", F_INT, 0}}},
	[P_STATUS_REQ] = {"STATUS_REQ", 0, {{"req", F_INT, 0}}},
	[P_PING] = {"PING", 0, {{NULL, F_STR, 0}}},
	/* coordinator -> node */
	[P_WELCOME] = {"WELCOME",
		       0,
		       {{"coordinator", F_STR, 0}, {"committed", F_STR_NULL, 0}, {"epoch", F_INT, 1}}},
	[P_PLAN] = {"PLAN",
		    1,
		    {{"version", F_STR, 0}, {"digest", F_HEX, 0}, {"donors", F_DONORS, 0},
		     {"base", F_STR, 1}}},
	[P_PREPARE] = {"PREPARE",
		       0,
		       {{"txid", F_INT, 0}, {"version", F_STR, 0}, {"digest", F_HEX, 0}}},
	[P_COMMIT] = {"COMMIT", 0, {{"txid", F_INT, 0}, {"version", F_STR, 0}, {"epoch", F_INT, 1}}},
	[P_ABORT] = {"ABORT",
		     0,
		     {{"txid", F_INT, 0}, {"version", F_STR, 0}, {"reason", F_STR, 0},
		      {"errno", F_ERRNO, 1}}},
	[P_COMMIT_RES] = {"COMMIT_RES",
			  0,
			  {{"req", F_INT, 0},
			   {"ok", F_BOOL, 0},
			   {"reason", F_STR, 1},
			   {"nodes", F_STRS, 0},
			   {"outcome", F_STR, 1},
			   {"committed", F_STRS, 1},
			   {"failed", F_OBJ, 1},
			   {"unknown", F_STRS, 1},
			   {"errno", F_ERRNO, 1}}},
	[P_STATUS_RES] = {"STATUS_RES", 0, {{"req", F_INT, 0}, {"cluster", F_OBJ, 0}}},
	[P_PONG] = {"PONG", 0, {{"committed", F_STR, 1}, {"epoch", F_INT, 1}}},
	/* node <-> node */
	/* bases[i], widths[i]: a base the puller holds for hashes[i] (zero: none), its element width */
	[P_GET] = {"GET", 0, {{"req", F_INT, 0}, {"hashes", F_HASHES, 0}, {"bases", F_HASHES, 1},
			      {"widths", F_WIDTHS, 1}}},
	/*
	 * a piece [offset, offset+size) of `total` bytes (defaults: 0, size): of
	 * the shard, or with "enc" of its delta against shard "base"
	 */
	[P_SHARD] = {"SHARD", 1, {{"req", F_INT, 0}, {"hash", F_HEX, 0}, {"size", F_INT, 0},
				  {"offset", F_INT, 1}, {"total", F_INT, 1}, {"enc", F_STR, 1},
				  {"base", F_HEX, 1}}},
	[P_MISSING] = {"MISSING", 0, {{"req", F_INT, 0}, {"hash", F_HEX, 0}, {"errno", F_ERRNO, 1}}},
};

/* Entries of the "versions" and "donors" arrays. */
static const struct field version_entry[] = {
	{"name", F_STR, 0}, {"digest", F_HEX, 0}, {"complete", F_BOOL, 0}, {NULL, F_STR, 0}};
static const struct field donor_entry[] = {{"node", F_STR, 0}, {"addr", F_STR, 0}, {NULL, F_STR, 0}};
/* clang-format on */

static const struct schema *schema_of(enum proto_type t)
{
	if ((int)t < P_HELLO || (int)t > P_MISSING)
		return NULL;
	return &schemas[t];
}

const char *proto_type_name(enum proto_type t)
{
	const struct schema *s = schema_of(t);

	return s ? s->name : "?";
}

static int type_by_name(const char *name, enum proto_type *out)
{
	for (int t = P_HELLO; t <= P_MISSING; t++) {
		if (!strcmp(schemas[t].name, name)) {
			*out = (enum proto_type)t;
			return 0;
		}
	}
	return -ENOENT;
}

/* ------------------------------------------------------------------ */
/* validation                                                          */
/* ------------------------------------------------------------------ */

struct ectx {
	char *err;
	size_t errlen;
};

/*
 * A refusal: the reason into e->err as one line of printable ASCII whatever
 * the input held (jansson quotes the bytes near a syntax error), so that it
 * can be logged or put in a JSON string as it is; -EBADMSG.
 */
#define fail(e, ...) hwfs_fail(-EBADMSG, (e)->err, (e)->errlen, HWFS_ERR_ASCII, __VA_ARGS__)

static int is_hex32(const json_t *v)
{
	const char *s = json_string_value(v);

	if (!s || json_string_length(v) != 2 * HWFS_HASH_LEN)
		return 0;
	for (size_t i = 0; i < 2 * HWFS_HASH_LEN; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return 0;
	return 1;
}

static int check_fields(struct ectx *e, const char *tname, const char *where, const json_t *obj,
			const struct field *f);

/*
 * Check one value @v of kind @k; @tname and @path (e.g. "versions[3].digest")
 * name it in the reason.
 */
static int check_value(struct ectx *e, const char *tname, const char *path, const json_t *v,
		       enum fkind k)
{
	char sub[128];
	size_t n, max;

	switch (k) {
	case F_STR_NULL:
		if (json_is_null(v))
			return 0;
		/* fall through */
	case F_STR:
		if (!json_is_string(v))
			return fail(e, "%s: \"%s\" is not a string%s", tname, path,
				    k == F_STR_NULL ? " or null" : "");
		n = json_string_length(v);
		if (n == 0)
			return fail(e, "%s: \"%s\" is empty", tname, path);
		if (n > PROTO_MAX_STR)
			return fail(e, "%s: \"%s\" is %zu bytes (limit %d)", tname, path, n,
				    PROTO_MAX_STR);
		if (strlen(json_string_value(v)) != n)
			return fail(e, "%s: \"%s\" contains a NUL", tname, path);
		return 0;
	case F_INT:
		if (!json_is_integer(v))
			return fail(e, "%s: \"%s\" is not an integer", tname, path);
		if (json_integer_value(v) < 0)
			return fail(e, "%s: \"%s\" is negative", tname, path);
		if ((uint64_t)json_integer_value(v) > PROTO_MAX_INT)
			return fail(e, "%s: \"%s\" is above 2^53", tname, path);
		return 0;
	case F_BOOL:
		if (!json_is_boolean(v))
			return fail(e, "%s: \"%s\" is not a boolean", tname, path);
		return 0;
	case F_HEX:
		if (!is_hex32(v))
			return fail(e, "%s: \"%s\" is not 32 lowercase hex digits", tname, path);
		return 0;
	case F_OBJ:
		if (!json_is_object(v))
			return fail(e, "%s: \"%s\" is not an object", tname, path);
		return 0;
	case F_ERRNO: /* a bad one costs the peer its errno (proto_errno()), not the message */
		return 0;
	case F_STRS:
	case F_HASHES:
	case F_WIDTHS:
	case F_VERSIONS:
	case F_DONORS:
		break;
	}

	/* Arrays. */
	if (!json_is_array(v))
		return fail(e, "%s: \"%s\" is not an array", tname, path);
	n = json_array_size(v);
	max = k == F_HASHES || k == F_WIDTHS ? PROTO_MAX_GET : PROTO_MAX_ARRAY;
	if (n > max)
		return fail(e, "%s: \"%s\" has %zu entries (limit %zu)", tname, path, n, max);
	if ((k == F_HASHES || k == F_WIDTHS) && n == 0)
		return fail(e, "%s: \"%s\" is empty", tname, path);
	for (size_t i = 0; i < n; i++) {
		const json_t *x = json_array_get(v, i);
		int r;

		snprintf(sub, sizeof(sub), "%s[%zu]", path, i);
		switch (k) {
		case F_STRS:
			r = check_value(e, tname, sub, x, F_STR);
			break;
		case F_HASHES:
			r = check_value(e, tname, sub, x, F_HEX);
			break;
		case F_WIDTHS:
			r = check_value(e, tname, sub, x, F_INT);
			break;
		case F_VERSIONS:
			r = check_fields(e, tname, sub, x, version_entry);
			break;
		default: /* F_DONORS */
			r = check_fields(e, tname, sub, x, donor_entry);
			break;
		}
		if (r)
			return r;
	}
	return 0;
}

/*
 * Check that @obj is an object holding every field of @f (NULL-key
 * terminated) with its kind.  @where is the path of @obj ("" for the header).
 */
static int check_fields(struct ectx *e, const char *tname, const char *where, const json_t *obj,
			const struct field *f)
{
	char path[160];

	if (!json_is_object(obj))
		return fail(e, "%s: \"%s\" is not an object", tname, where);
	for (; f->key; f++) {
		const json_t *v = json_object_get(obj, f->key);
		int r;

		snprintf(path, sizeof(path), "%s%s%s", where, *where ? "." : "", f->key);
		if (!v || (f->optional && json_is_null(v))) {
			if (f->optional)
				continue;
			return fail(e, "%s: missing field \"%s\"", tname, path);
		}
		r = check_value(e, tname, path, v, f->kind);
		if (r)
			return r;
	}
	return 0;
}

/* Is optional field @key of @h there (present and not null)? */
static int present(const json_t *h, const char *key)
{
	const json_t *v = json_object_get(h, key);

	return v && !json_is_null(v);
}

/*
 * check_relations() - the rules that tie fields of one message together,
 * after each field passed on its own: a GET's "bases" and "widths" have one
 * entry per hash, each width is 1, 2, 4 or 8; a SHARD with "enc" names the
 * only encoding there is (PROTO_ENC_DELTA) and its "base", and a "base"
 * comes only with "enc".
 */
static int check_relations(struct ectx *e, enum proto_type t, const json_t *h)
{
	if (t == P_GET) {
		size_t n = json_array_size(json_object_get(h, "hashes"));
		const json_t *w = json_object_get(h, "widths"), *x;
		size_t i;

		if (present(h, "bases") && json_array_size(json_object_get(h, "bases")) != n)
			return fail(e, "GET: \"bases\" has %zu entries, \"hashes\" %zu",
				    json_array_size(json_object_get(h, "bases")), n);
		if (!present(h, "widths"))
			return 0;
		if (json_array_size(w) != n)
			return fail(e, "GET: \"widths\" has %zu entries, \"hashes\" %zu",
				    json_array_size(w), n);
		json_array_foreach(w, i, x) {
			json_int_t v = json_integer_value(x);

			if (v != 1 && v != 2 && v != 4 && v != 8)
				return fail(e, "GET: \"widths[%zu]\" is %lld, not 1, 2, 4 or 8", i,
					    (long long)v);
		}
	}
	if (t == P_SHARD) {
		const char *enc = json_string_value(json_object_get(h, "enc"));

		if (enc && strcmp(enc, PROTO_ENC_DELTA))
			return fail(e, "SHARD: unknown encoding \"enc\" (only \"%s\")",
				    PROTO_ENC_DELTA);
		if (enc && !present(h, "base"))
			return fail(e, "SHARD: \"enc\" without \"base\"");
		if (!enc && present(h, "base"))
			return fail(e, "SHARD: \"base\" without \"enc\"");
	}
	return 0;
}

/* A type name short and tame enough to quote in a reason. */
static int printable_name(const json_t *v)
{
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);

	if (n == 0 || n > 32)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= 'a' && s[i] <= 'z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '_'))
			return 0;
	return 1;
}

/* Parse and validate a header frame: on success *@out is the object and *@t its type. */
static int parse_header(struct ectx *e, const void *buf, size_t len, json_t **out,
			enum proto_type *t)
{
	json_error_t jerr;
	const json_t *v, *tv;
	json_t *h = NULL;
	enum proto_type type;
	int r;

	if (len > PROTO_MAX_HEADER)
		return fail(e, "header is %zu bytes (limit %u)", len, PROTO_MAX_HEADER);
	h = json_loadb(buf ? buf : "", len, JSON_REJECT_DUPLICATES, &jerr);
	if (!h)
		return fail(e, "header is not valid JSON (line %d column %d): %s", jerr.line,
			    jerr.column, jerr.text);
	if (!json_is_object(h)) {
		r = fail(e, "header is not a JSON object");
		goto out;
	}
	v = json_object_get(h, "v");
	if (!v) {
		r = fail(e, "header has no protocol version \"v\"");
		goto out;
	}
	if (!json_is_integer(v)) {
		r = fail(e, "protocol version \"v\" is not an integer");
		goto out;
	}
	if (json_integer_value(v) != PROTO_VERSION) {
		r = fail(e, "protocol version %lld not supported (this side speaks %d)",
			 (long long)json_integer_value(v), PROTO_VERSION);
		goto out;
	}
	tv = json_object_get(h, "t");
	if (!json_is_string(tv)) {
		r = fail(e, "header has no message type \"t\" string");
		goto out;
	}
	if (type_by_name(json_string_value(tv), &type) ||
	    strlen(json_string_value(tv)) != json_string_length(tv)) {
		r = printable_name(tv) ? fail(e, "unknown message type \"%s\"", json_string_value(tv))
				       : fail(e, "unknown message type");
		goto out;
	}
	r = check_fields(e, schemas[type].name, "", h, schemas[type].f);
	if (!r)
		r = check_relations(e, type, h);
	if (r)
		goto out;
	*out = h;
	*t = type;
	h = NULL;
out:
	json_decref(h);
	return r;
}

/* The payload rules of type @t with its validated header @h. */
static int check_payload(struct ectx *e, enum proto_type t, const json_t *h, int have,
			 size_t len)
{
	const struct schema *s = &schemas[t];

	if (s->payload && !have)
		return fail(e, "%s: payload frame missing", s->name);
	if (!s->payload && have)
		return fail(e, "%s: takes no payload frame", s->name);
	if (!have)
		return 0;
	if (len > PROTO_MAX_PAYLOAD)
		return fail(e, "%s: payload is %zu bytes (limit %llu)", s->name, len,
			    PROTO_MAX_PAYLOAD);
	if ((t == P_ANNOUNCE || t == P_PLAN) && len == 0)
		return fail(e, "%s: manifest payload is empty", s->name);
	if (t == P_SHARD) {
		uint64_t size = (uint64_t)json_integer_value(json_object_get(h, "size"));

		if (size != len)
			return fail(e, "SHARD: \"size\" is %llu but the payload is %zu bytes",
				    (unsigned long long)size, len);
	}
	return 0;
}

/* ------------------------------------------------------------------ */
/* decode / encode                                                     */
/* ------------------------------------------------------------------ */

int proto_decode_frames(const void *const *frames, const size_t *lens, size_t nframes,
			struct proto_msg *out, char *err, size_t errlen)
{
	struct ectx e = {err, errlen};
	enum proto_type t;
	json_t *h = NULL;
	int r;

	if (err && errlen)
		err[0] = '\0';
	if (!out || (nframes && (!frames || !lens)))
		return -EINVAL;
	for (size_t i = 0; i < nframes && i < 2; i++)
		if (!frames[i] && lens[i])
			return -EINVAL;
	if (nframes == 0)
		return fail(&e, "empty message (no header frame)");
	if (nframes > 2)
		return fail(&e, "%zu frames (at most 2: header, payload)", nframes);
	r = parse_header(&e, frames[0], lens[0], &h, &t);
	if (r)
		return r;
	r = check_payload(&e, t, h, nframes == 2, nframes == 2 ? lens[1] : 0);
	if (r)
		goto out;
	memset(out, 0, sizeof(*out));
	out->type = t;
	out->h = h;
	h = NULL;
	if (nframes == 2) {
		out->payload = frames[1] ? frames[1] : (const void *)"";
		out->payload_len = lens[1];
	}
out:
	json_decref(h);
	return r;
}

int proto_payload_send(const struct proto_msg *m, void *sock, int flags)
{
	zmq_msg_t out;
	int r;

	if (!m || !m->priv)
		return -EINVAL;
	zmq_msg_init(&out);
	if (zmq_msg_copy(&out, m->priv) < 0) {
		r = -errno;
		zmq_msg_close(&out);
		return r;
	}
	if (zmq_msg_send(&out, sock, flags) < 0) {
		r = -errno;
		zmq_msg_close(&out);
		return r;
	}
	return 0;
}

void proto_msg_clear(struct proto_msg *m)
{
	if (!m)
		return;
	json_decref(m->h);
	if (m->priv) {
		zmq_msg_close(m->priv);
		free(m->priv);
	}
	memset(m, 0, sizeof(*m));
}

int proto_encode(enum proto_type t, json_t *fields, size_t payload_len, char **hdr,
		 size_t *hdr_len)
{
	const struct schema *s = schema_of(t);
	char why[256] = "";
	struct ectx e = {why, sizeof(why)};
	json_t *h = NULL, *chk = NULL;
	enum proto_type t2;
	char *buf = NULL;
	size_t len;
	int r;

	if (!s || !hdr || !hdr_len || (fields && !json_is_object(fields)))
		return -EINVAL;
	h = json_object();
	if (!h || json_object_set_new(h, "v", json_integer(PROTO_VERSION)) ||
	    json_object_set_new(h, "t", json_string(s->name))) {
		r = -ENOMEM;
		goto out;
	}
	if (fields && json_object_update(h, fields)) {
		r = -ENOMEM;
		goto out;
	}
	/* "v"/"t" in @fields may only repeat what we wrote. */
	if (json_integer_value(json_object_get(h, "v")) != PROTO_VERSION ||
	    !json_is_integer(json_object_get(h, "v")) ||
	    !json_is_string(json_object_get(h, "t")) ||
	    strcmp(json_string_value(json_object_get(h, "t")), s->name)) {
		snprintf(why, sizeof(why), "fields override \"v\" or \"t\"");
		r = -EINVAL;
		goto out;
	}
	buf = json_dumps(h, JSON_COMPACT);
	if (!buf) {
		snprintf(why, sizeof(why), "header does not serialise (cycle or bad string)");
		r = -EINVAL;
		goto out;
	}
	len = strlen(buf);
	/* The receiver's rules, on the receiver's bytes. */
	r = parse_header(&e, buf, len, &chk, &t2);
	if (!r)
		r = check_payload(&e, t2, chk, s->payload || payload_len, payload_len);
	if (r) {
		r = -EINVAL;
		goto out;
	}
	*hdr = buf;
	*hdr_len = len;
	buf = NULL;
out:
	if (r == -EINVAL)
		LOG_WARN("proto_encode(%s): %s", s->name, why);
	free(buf);
	json_decref(chk);
	json_decref(h);
	return r;
}

/* ------------------------------------------------------------------ */
/* accessors                                                           */
/* ------------------------------------------------------------------ */

static const json_t *get(const struct proto_msg *m, const char *key)
{
	return m && m->h && key ? json_object_get(m->h, key) : NULL;
}

const char *proto_str(const struct proto_msg *m, const char *key)
{
	return json_string_value(get(m, key));
}

uint64_t proto_int(const struct proto_msg *m, const char *key)
{
	const json_t *v = get(m, key);

	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return 0;
	return (uint64_t)json_integer_value(v);
}

int proto_errno(const struct proto_msg *m, int def)
{
	const json_t *v = get(m, "errno");

	if (!v || json_is_null(v))
		return def;
	return ctl_errno(m->h) ?: EPROTO; /* the control socket's range check */
}

int proto_bool(const struct proto_msg *m, const char *key)
{
	return json_is_true(get(m, key));
}

int proto_hash(const struct proto_msg *m, const char *key, hwfs_hash_t *out)
{
	const json_t *v = get(m, key);

	if (!out || !is_hex32(v))
		return -EINVAL;
	return hwfs_hash_parse(json_string_value(v), out);
}

/* ------------------------------------------------------------------ */
/* HELLO.engines, as the coordinator keeps it                          */
/* ------------------------------------------------------------------ */

int proto_version_name_ok(const char *s)
{
	size_t n = s ? strlen(s) : 0;

	return n >= 1 && n <= HWFS_NAME_MAX && !hwfs_has_controls(s);
}

/* @v if it is a plausible version name (proto_version_name_ok()), else NULL. */
static const char *version_or_null(json_t *v)
{
	const char *s = json_string_value(v);

	return proto_version_name_ok(s) ? s : NULL;
}

/* @v as a JSON integer if it is one in [0, PROTO_MAX_INT], else JSON null. */
static json_t *count_or_null(json_t *v)
{
	return json_is_integer(v) && json_integer_value(v) >= 0 &&
			       (uint64_t)json_integer_value(v) <= PROTO_MAX_INT
		       ? json_integer(json_integer_value(v))
		       : json_null();
}

/*
 * proto_hello_engines() - the engines a node reports in its HELLO (its
 * `hwfs status` "engines"), as the coordinator keeps and shows them: at most
 * PROTO_MAX_ENGINES entries; an entry without a valid engine name is left out;
 * any other field that is not what it should be (an unknown state,
 * a version name that cannot be one, a reason over HWFS_ENGINE_REASON_MAX bytes, a
 * negative or huge number) becomes null; control characters of a reason are
 * blanked (hwfs_clean_text).  A node is trusted with its own engines, not
 * with the coordinator's memory, the shape of its answers or the terminal of
 * whoever runs `hwfs status --cluster`.
 * Returns a new array (NULL without memory).
 */
json_t *proto_hello_engines(json_t *in)
{
	json_t *out = json_array(), *e;
	size_t i;

	json_array_foreach(in, i, e) {
		const char *name = json_string_value(json_object_get(e, "name"));
		const char *state = json_string_value(json_object_get(e, "state"));
		const char *reason = json_string_value(json_object_get(e, "reason"));
		const char *sv = version_or_null(json_object_get(e, "serving"));
		const char *sh = version_or_null(json_object_get(e, "shadow"));
		char *clean;

		if (!out || json_array_size(out) >= PROTO_MAX_ENGINES)
			break;
		if (!name || !hwfs_engine_name_valid(name))
			continue;
		if (reason && strlen(reason) > HWFS_ENGINE_REASON_MAX)
			reason = NULL;
		clean = reason ? hwfs_clean_text(reason, HWFS_ENGINE_REASON_MAX) : NULL;
		json_array_append_new(
			out, json_pack("{s:s, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "name", name, "pid",
				       count_or_null(json_object_get(e, "pid")), "serving",
				       sv ? json_string(sv) : json_null(), "shadow",
				       sh ? json_string(sh) : json_null(), "state",
				       hwfs_engine_state_valid(state) ? json_string(state) : json_null(),
				       "reason", clean ? json_string(clean) : json_null(),
				       "last_swap_pause_us",
				       count_or_null(json_object_get(e, "last_swap_pause_us")), "swaps",
				       count_or_null(json_object_get(e, "swaps"))));
		free(clean);
	}
	return out;
}

/* ------------------------------------------------------------------ */
/* zmq                                                                 */
/* ------------------------------------------------------------------ */

static int send_part(void *sock, const void *buf, size_t len, int flags)
{
	for (;;) {
		if (zmq_send(sock, buf, len, flags) >= 0)
			return 0;
		if (errno != EINTR)
			return -errno;
	}
}

int proto_send(void *sock, const void *ident, size_t ident_len, enum proto_type t, json_t *fields,
	       const void *payload, size_t payload_len)
{
	const struct schema *s = schema_of(t);
	char *hdr = NULL;
	size_t hdr_len;
	int r;

	if (!sock || !s || (!payload && payload_len) || (!s->payload && payload))
		return -EINVAL;
	r = proto_encode(t, fields, payload_len, &hdr, &hdr_len);
	if (r)
		return r;
	if (ident) {
		r = send_part(sock, ident, ident_len, ZMQ_SNDMORE);
		if (r)
			goto out;
	}
	r = send_part(sock, hdr, hdr_len, s->payload ? ZMQ_SNDMORE : 0);
	if (r || !s->payload)
		goto out;
	r = send_part(sock, payload ? payload : "", payload_len, 0);
out:
	free(hdr);
	return r;
}

int proto_recv(void *sock, void *ident, size_t *ident_len, int dontwait, struct proto_msg *out,
	       char *err, size_t errlen)
{
	struct ectx e = {err, errlen};
	zmq_msg_t part[3]; /* [identity], header, payload */
	size_t want = ident ? 3 : 2, base = ident ? 1 : 0, got = 0, total = 0;
	const void *fr[2] = {NULL, NULL};
	size_t fl[2] = {0, 0};
	zmq_msg_t *keep = NULL;
	struct proto_msg m;
	int more = 1, r = 0;

	if (err && errlen)
		err[0] = '\0';
	if (!sock || !out || (ident && !ident_len))
		return -EINVAL;
	/* Read the whole message, keeping at most @want frames. */
	while (more) {
		zmq_msg_t scratch, *p = got < want ? &part[got] : &scratch;

		zmq_msg_init(p);
		if (zmq_msg_recv(p, sock, total == 0 && dontwait ? ZMQ_DONTWAIT : 0) < 0) {
			int en = errno;

			zmq_msg_close(p);
			if (en == EINTR && total > 0)
				continue; /* the rest of a message is already here */
			r = -en;
			goto out;
		}
		more = zmq_msg_more(p);
		total++;
		if (p == &scratch)
			zmq_msg_close(p);
		else
			got++;
	}
	if (ident) {
		size_t n = zmq_msg_size(&part[0]);

		if (n > *ident_len) {
			r = fail(&e, "routing identity is %zu bytes (buffer %zu)", n, *ident_len);
			goto out;
		}
		memcpy(ident, zmq_msg_data(&part[0]), n);
		*ident_len = n;
	}
	if (total - base > 2) {
		r = fail(&e, "%zu frames (at most 2: header, payload)", total - base);
		goto out;
	}
	for (size_t i = base; i < got; i++) {
		fr[i - base] = zmq_msg_data(&part[i]);
		fl[i - base] = zmq_msg_size(&part[i]);
	}
	r = proto_decode_frames(fr, fl, got - base, &m, err, errlen);
	if (r)
		goto out;
	{ /* who the transport authenticated (CURVE + ZAP), for the receiver's checks */
		const char *uid = zmq_msg_gets(&part[base], "User-Id");

		snprintf(m.user_id, sizeof(m.user_id), "%s", uid ? uid : "");
	}
	if (got - base == 2) {
		/* Keep the payload frame; a small one lives inside the zmq_msg_t. */
		keep = malloc(sizeof(*keep));
		if (!keep) {
			proto_msg_clear(&m);
			r = -ENOMEM;
			goto out;
		}
		zmq_msg_init(keep);
		zmq_msg_move(keep, &part[base + 1]);
		m.payload = zmq_msg_data(keep);
		if (!m.payload)
			m.payload = "";
		m.priv = keep;
	}
	*out = m;
out:
	for (size_t i = 0; i < got; i++)
		zmq_msg_close(&part[i]);
	return r;
}
