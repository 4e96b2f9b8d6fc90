/*
 * proto.h — the replicator's wire codec (protocol version 2).
 *
 * Every message between a node agent, the coordinator and other nodes is a
 * ZeroMQ multipart message of one or two frames (a ROUTER's routing-identity
 * frame comes before them and is the caller's business):
 *   frame 0  header: a UTF-8 JSON object {"v":2,"t":"TYPE", ...fields},
 *            at most PROTO_MAX_HEADER bytes, no duplicate keys;
 *   frame 1  payload, only for ANNOUNCE, PLAN (a manifest) and SHARD (the
 *            shard's bytes), at most PROTO_MAX_PAYLOAD bytes.
 * The fields each type requires, and their types, are in docs/protocol.md.
 * Unknown fields are ignored (forward compatibility); an unknown type, another
 * protocol version, a missing or ill-typed field, a payload frame where none
 * belongs (or none where one is needed) are -EBADMSG with a one-line reason.
 *
 * The decoder is the only place the replicator looks at untrusted bytes: once
 * proto_decode_frames()/proto_recv() returned 0, every required field is
 * present with its type, so the typed accessors below need no error path.
 * The encoder runs what it built through the same decoder, so whatever it
 * produces the other side accepts; a message that would not pass is -EINVAL.
 */
#ifndef HWFS_PROTO_H
#define HWFS_PROTO_H

#include <jansson.h>

#include "hwfs_common.h"
#include "names.h"

#define PROTO_VERSION 2
/* SHARD "enc" of a delta against "base" (fs/common/delta.h) */
#define PROTO_ENC_DELTA "xor-zstd"
#define PROTO_MAX_HEADER (1u << 20)
#define PROTO_MAX_PAYLOAD (1ull << 30)
#define PROTO_MAX_GET 1024
/* Further limits of the field types (docs/protocol.md, "Field types"). */
#define PROTO_MAX_STR 4096         /* bytes in a str field */
#define PROTO_MAX_ARRAY 65536      /* entries in an array field other than "hashes" */
#define PROTO_MAX_INT (1ull << 53) /* largest int field (exact in a double) */
#define PROTO_MAX_ENGINES 64       /* HELLO.engines entries a coordinator keeps per node */

enum proto_type {
	P_HELLO = 1,
	P_ANNOUNCE,
	P_HAVE,
	P_READY,
	P_ACK,
	P_COMMIT_REQ,
	P_STATUS_REQ,
	P_PING,
	P_WELCOME,
	P_PLAN,
	P_PREPARE,
	P_COMMIT,
	P_ABORT,
	P_COMMIT_RES,
	P_STATUS_RES,
	P_PONG,
	P_GET,
	P_SHARD,
	P_MISSING
};

/**
 * A decoded, validated message. @h is the header object (owned, it includes
 * "v" and "t"); @payload points into the caller's frame (not owned) or is NULL
 * when the type takes no payload (an empty payload frame gives a non-NULL
 * pointer and @payload_len 0).
 * @priv is private to proto.c: after proto_recv() it holds the zmq_msg_t of
 * the payload frame, so @payload stays valid until proto_msg_clear(); after
 * proto_decode_frames() it is NULL.  Do not touch it.
 */
struct proto_msg {
	enum proto_type type;
	json_t *h;
	const void *payload;
	size_t payload_len;
	void *priv;
	/*
	 * After proto_recv(): the sender's authenticated user id (the "User-Id"
	 * property of the message, which the ZAP handler of keys.c sets to the
	 * peer's CURVE public key in Z85), or "" without CURVE.
	 */
	char user_id[64];
};

/** Name of a type ("HELLO"), or "?" */
const char *proto_type_name(enum proto_type t);

/**
 * proto_decode_frames() - decode @nframes frames (pointers/lengths): header,
 * then the payload if any.  Returns 0 (*@out filled; free with
 * proto_msg_clear()) or -EBADMSG with a one-line reason in @err (*@out is not
 * touched).  -EINVAL only for a caller bug (NULL arrays, a NULL frame of
 * non-zero length).  @out->payload points into @frames[1].
 */
int proto_decode_frames(const void *const *frames, const size_t *lens, size_t nframes,
			struct proto_msg *out, char *err, size_t errlen);

/**
 * proto_payload_send() - send @m's payload frame (of a proto_recv()) as the
 * last frame of a message on @sock, by reference: the frame's buffer is
 * shared (zmq_msg_copy()), not copied, and lives until both @m is cleared
 * and the send is done.  @flags as zmq_msg_send()'s.  Returns 0, -EINVAL
 * when @m holds no received payload frame, or -errno of the send.
 */
int proto_payload_send(const struct proto_msg *m, void *sock, int flags);

/** Free what @m owns and zero it. NULL, a zeroed or an already cleared message are no-ops. */
void proto_msg_clear(struct proto_msg *m);

/**
 * proto_encode() - build the header {"v":2,"t":name} merged with @fields (not
 * stolen; may be NULL; it may hold "v"/"t" only with those same values, so a
 * decoded header can be sent on) and validate it with the decoder's rules,
 * together with a payload of @payload_len bytes: a type that takes a payload
 * always gets one (frame 1, possibly empty where allowed), a type that takes
 * none needs @payload_len 0.  *@hdr is malloc'd compact JSON, NUL-terminated,
 * *@hdr_len bytes not counting the NUL.  Payload bytes are not copied: the
 * caller sends them as frame 1.  Returns 0, -EINVAL (an invalid message; the
 * reason is logged with LOG_WARN) or -ENOMEM.
 */
int proto_encode(enum proto_type t, json_t *fields, size_t payload_len, char **hdr,
		 size_t *hdr_len);

/* Typed accessors on a decoded header (valid because decode validated them). */
/** String field @key, or NULL if absent, null or not a string. Owned by @m. */
const char *proto_str(const struct proto_msg *m, const char *key);
/** Integer field @key (0 if absent). */
uint64_t proto_int(const struct proto_msg *m, const char *key);
/**
 * proto_errno() - the "errno" of a reply that can fail (READY, ACK, ABORT,
 * MISSING, COMMIT_RES): @def when there is none (a peer that predates it),
 * an integer in 1..CTL_ERRNO_MAX as it is (ctl_errno(), the control socket's
 * check), and EPROTO for anything else (the wrong JSON type, zero, negative
 * or out of range: a peer's bytes).  Never fails.
 */
int proto_errno(const struct proto_msg *m, int def);
/** 1 if field @key is true, else 0. */
int proto_bool(const struct proto_msg *m, const char *key);
/** Parse hex field @key into *@out. Returns 0 or -EINVAL (absent, not 32 lowercase hex). */
int proto_hash(const struct proto_msg *m, const char *key, hwfs_hash_t *out);

/**
 * proto_version_name_ok() - is @s (NULL: no) a plausible version name as a
 * peer sends one: 1-HWFS_NAME_MAX bytes, no control character
 * (hwfs_has_controls())?  Returns 1 or 0.
 */
int proto_version_name_ok(const char *s);

/**
 * proto_hello_engines() - the engines a node reports in its HELLO (@in, the
 * "engines" array, as its `hwfs status` shows them), as a coordinator keeps
 * and shows them: at most PROTO_MAX_ENGINES entries; an entry without a valid
 * engine name is left out; any other field that is not what it should be (an
 * unknown state, a version name that cannot be one, a reason over
 * HWFS_ENGINE_REASON_MAX bytes, a negative or huge number) becomes null;
 * control characters of a reason are blanked.  Returns a new array (NULL
 * without memory).
 */
json_t *proto_hello_engines(json_t *in);

/* zmq helpers: */

/**
 * proto_send() - send a message on zmq socket @sock: the @ident frame first
 * when @ident is non-NULL (ROUTER), then the header, then @payload (copied;
 * it must be given, possibly empty, iff the type takes one: a non-NULL
 * @payload on a type without payload is -EINVAL).  Blocking (flags 0), EINTR
 * is retried; a socket ZMQ_SNDTIMEO gives -EAGAIN.  Returns 0, -EINVAL (see
 * proto_encode()), -ENOMEM or -errno of zmq_send().
 */
int proto_send(void *sock, const void *ident, size_t ident_len, enum proto_type t, json_t *fields,
	       const void *payload, size_t payload_len);

/**
 * proto_recv() - receive one multipart message (non-blocking with
 * ZMQ_DONTWAIT if @dontwait).  If @ident is non-NULL the first frame is the
 * routing identity, copied into @ident (at most *@ident_len bytes; *@ident_len
 * is set to its length); it is also copied when the rest of the message is
 * rejected with -EBADMSG, so the caller can tell who sent it.  Returns 0
 * (*@out filled; its payload stays valid until proto_msg_clear()), -EAGAIN
 * (nothing there, or ZMQ_RCVTIMEO passed), -EBADMSG (the whole message was
 * read and dropped, reason in @err: too many frames, an identity longer than
 * the buffer, anything proto_decode_frames() rejects), or -errno (-EINTR when
 * a signal interrupted the wait, -ETERM, ...).  Never reads past one message.
 */
int proto_recv(void *sock, void *ident, size_t *ident_len, int dontwait, struct proto_msg *out,
	       char *err, size_t errlen);

#endif /* HWFS_PROTO_H */
