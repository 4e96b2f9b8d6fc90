/*
 * stgen.c — deterministic safetensors files (see stgen.h).
 *
 * The header is built in memory (a fixed list of tensors whose shapes are
 * derived from the size asked for), padded with spaces to a multiple of 8
 * bytes as the reference writer does, and the data is streamed out in 8 MiB
 * blocks so that a 1 GiB file needs no 1 GiB buffer.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stgen.h"

#define STGEN_MIN_BYTES (64u << 10)
#define STGEN_BLOCK (8u << 20)
#define STGEN_HEADER_MAX 4096

struct st_tensor {
	char name[32];
	const char *dtype;
	unsigned elem;      /* bytes per element */
	int ndim;
	uint64_t shape[2];
	uint64_t len;       /* bytes */
};

/* xorshift64*: fast, and good enough that tensors never collide. */
static uint64_t rng_next(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return *s * 0x2545F4914F6CDD1Dull;
}

static void add(struct st_tensor *t, int *n, const char *name, const char *dtype, unsigned elem,
		int ndim, uint64_t d0, uint64_t d1)
{
	struct st_tensor *x = &t[(*n)++];

	snprintf(x->name, sizeof(x->name), "%s", name);
	x->dtype = dtype;
	x->elem = elem;
	x->ndim = ndim;
	x->shape[0] = d0;
	x->shape[1] = d1;
	x->len = elem * (ndim == 0 ? 1 : ndim == 1 ? d0 : d0 * d1);
}

/* The tensor list for a file of about @bytes bytes. */
static int plan(uint64_t bytes, struct st_tensor *t)
{
	int n = 0;
	char name[32];

	if (bytes < STGEN_MIN_BYTES)
		bytes = STGEN_MIN_BYTES;
	add(t, &n, "model.embed.weight", "BF16", 2, 2, (bytes * 30 / 100) / 1024, 512);
	add(t, &n, "model.big.weight", "F32", 4, 2, (bytes * 45 / 100) / 1024, 256);
	for (int i = 0; i < 6; i++) {
		snprintf(name, sizeof(name), "model.layers.%d.weight", i);
		if (i % 2)
			add(t, &n, name, "BF16", 2, 2, (bytes * 4 / 100) / 128, 64);
		else
			add(t, &n, name, "F32", 4, 2, (bytes * 4 / 100) / 256, 64);
	}
	add(t, &n, "model.odd.bias", "BF16", 2, 1, 7, 0);
	add(t, &n, "model.scale", "F32", 4, 0, 0, 0);
	add(t, &n, "model.positions", "I64", 8, 1, 333, 0);
	return n;
}

int stgen_write(const char *path, uint64_t seed, uint64_t bytes, char *err, size_t errlen)
{
	struct st_tensor t[16];
	int n = plan(bytes, t);
	char hdr[STGEN_HEADER_MAX];
	size_t hl = 0;
	uint64_t off = 0;
	uint8_t *buf = NULL;
	int fd = -1, r = 0;

	hl += snprintf(hdr + hl, sizeof(hdr) - hl, "{\"__metadata__\":{\"format\":\"pt\"}");
	for (int i = 0; i < n; i++) {
		hl += snprintf(hdr + hl, sizeof(hdr) - hl, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[",
			       t[i].name, t[i].dtype);
		for (int d = 0; d < t[i].ndim; d++)
			hl += snprintf(hdr + hl, sizeof(hdr) - hl, "%s%llu", d ? "," : "",
				       (unsigned long long)t[i].shape[d]);
		hl += snprintf(hdr + hl, sizeof(hdr) - hl, "],\"data_offsets\":[%llu,%llu]}",
			       (unsigned long long)off, (unsigned long long)(off + t[i].len));
		off += t[i].len;
	}
	hl += snprintf(hdr + hl, sizeof(hdr) - hl, "}");
	while (hl % 8 && hl < sizeof(hdr) - 1)
		hdr[hl++] = ' ';
	if (hl >= sizeof(hdr) - 1) {
		snprintf(err, errlen, "%s: header too long", path);
		return -EOVERFLOW;
	}

	buf = malloc(STGEN_BLOCK);
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0) {
		r = -errno;
		snprintf(err, errlen, "cannot create %s: %s", path, strerror(errno));
		goto out;
	}
	uint8_t len8[8];
	for (int i = 0; i < 8; i++)
		len8[i] = (uint8_t)((uint64_t)hl >> (8 * i));
	if (write(fd, len8, 8) != 8 || write(fd, hdr, hl) != (ssize_t)hl)
		goto werr;
	for (int i = 0; i < n; i++) {
		uint64_t s = (seed * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)(i + 1) << 32) ^ 0xD1B54A32D192ED03ull;
		uint64_t left = t[i].len;

		if (!s)
			s = 1;
		while (left) {
			size_t chunk = left < STGEN_BLOCK ? left : STGEN_BLOCK;

			for (size_t k = 0; k < chunk; k += 8) {
				uint64_t v = rng_next(&s);
				memcpy(buf + k, &v, chunk - k < 8 ? chunk - k : 8);
			}
			for (size_t done = 0; done < chunk;) {
				ssize_t w = write(fd, buf + done, chunk - done);
				if (w <= 0)
					goto werr;
				done += w;
			}
			left -= chunk;
		}
	}
	if (close(fd) < 0) {
		fd = -1;
		goto werr;
	}
	fd = -1;
	goto out;
werr:
	r = errno ? -errno : -EIO;
	snprintf(err, errlen, "cannot write %s: %s", path, strerror(-r));
out:
	if (fd >= 0)
		close(fd);
	free(buf);
	return r;
}
