/*
 * fuzz_proto.c — libFuzzer target for the replicator's wire decoder.
 *
 * The input is cut into frames: the low two bits of the first byte give the
 * number of frames (1..4); every frame but the last is preceded by its
 * length (2 bytes, little-endian, clipped to what is left) and the last one
 * takes the rest.  proto_decode_frames() must reject them cleanly (-EBADMSG
 * with a reason: one line of printable ASCII) or accept them.  Whatever it accepts must
 * re-encode with proto_encode(), decode again to the same type and header,
 * and re-encode to the same bytes (the encoding is a fixed point).  A
 * violation aborts, which libFuzzer reports as a crash.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "proto.h"

#define FUZZ_NAME "fuzz_proto"
#include "fuzz_util.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const void *fr[4], *fr2[2];
	size_t fl[4], fl2[2], n, pos = 1, l1 = 0, l2 = 0;
	struct proto_msg m = {0}, m2 = {0};
	char err[256], *h1 = NULL, *h2 = NULL;
	int rc;

	if (size < 1)
		return 0;
	n = 1 + (data[0] & 3);
	for (size_t i = 0; i < n; i++) {
		size_t len;

		if (i + 1 < n) {
			len = pos + 2 <= size ? (size_t)(data[pos] | data[pos + 1] << 8) : 0;
			pos = pos + 2 <= size ? pos + 2 : size;
			len = len < size - pos ? len : size - pos;
		} else {
			len = size - pos;
		}
		fr[i] = data + pos;
		fl[i] = len;
		pos += len;
	}

	rc = proto_decode_frames(fr, fl, n, &m, err, sizeof(err));
	if (rc) {
		if (rc != -EBADMSG)
			die("unexpected error code", NULL);
		if (!one_line(err))
			die("rejected without a one-line printable reason", NULL);
		return 0;
	}
	if ((int)m.type < P_HELLO || (int)m.type > P_MISSING || !m.h)
		die("accepted an impossible message", NULL);
	if ((n == 2) != (m.payload != NULL) || (n == 2 && m.payload_len != fl[1]))
		die("payload does not match the frames", NULL);

	/* Re-encode.  Only a header near the size limit may legitimately grow
	 * past it (jansson prints 1e9 as 1000000000.0). */
	rc = proto_encode(m.type, m.h, m.payload_len, &h1, &l1);
	if (rc) {
		if (fl[0] <= PROTO_MAX_HEADER / 16)
			die("decoded message does not re-encode", NULL);
		goto out;
	}
	fr2[0] = h1;
	fl2[0] = l1;
	fr2[1] = m.payload;
	fl2[1] = m.payload_len;
	rc = proto_decode_frames(fr2, fl2, m.payload ? 2 : 1, &m2, err, sizeof(err));
	if (rc)
		die("re-encoded message does not decode", err);
	if (m2.type != m.type)
		die("type changed across re-encoding", proto_type_name(m2.type));
	if (!json_equal(m.h, m2.h))
		die("header changed across re-encoding", NULL);
	if (proto_encode(m2.type, m2.h, m2.payload_len, &h2, &l2))
		die("second encoding failed", NULL);
	if (l1 != l2 || memcmp(h1, h2, l1))
		die("encoding is not a fixed point", NULL);
out:
	free(h1);
	free(h2);
	proto_msg_clear(&m2);
	proto_msg_clear(&m);
	return 0;
}
