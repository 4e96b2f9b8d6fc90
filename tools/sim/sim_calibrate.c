/*
 * sim_calibrate.c — sim_calibrate() (sim.h): the CPU rates of this machine
 * that a run without given rates uses: XXH3 and memcpy over a buffer, and
 * the delta codec's encode, decode and delta size on a bf16 tensor of
 * N(0, 0.02) weights with a fraction of its elements changed by one or two
 * units in the last place, as an RL step changes them.  CPU time of this
 * process, not wall time.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "delta.h"
#include "hwfs_common.h"
#include "sim_i.h"
#include "tunables.h"

/* CPU seconds this process has used. */
static double cpu_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
	return ts.tv_sec + ts.tv_nsec / 1e9;
}

/* @f as bf16, rounded to nearest even. */
static uint16_t bf16_of(float f)
{
	uint32_t u;

	memcpy(&u, &f, sizeof(u));
	return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}

int sim_calibrate(struct sim_rates *r, double changed, unsigned mib)
{
	size_t len = (size_t)(mib ? mib : SIM_CALIBRATE_MIB) << 20, n = len / 2;
	uint16_t *a = malloc(len), *b = malloc(len);
	uint8_t *enc = malloc(len + 4096), *out = malloc(len);
	struct delta_ctx *cx = delta_ctx_new(hwfs_tun.delta_level);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	hwfs_hash_t h;
	double t;
	ssize_t el;
	int rc = -ENOMEM;

	if (!a || !b || !enc || !out || !cx)
		goto out;
	for (size_t i = 0; i < n; i++) { /* ~N(0, 0.02) weights, a fraction changed a little */
		double u1, u2, g;

		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		u1 = ((x >> 11) + 1) * (1.0 / 9007199254740993.0);
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		u2 = (x >> 11) * (1.0 / 9007199254740992.0);
		g = sqrt(-2 * log(u1)) * cos(2 * M_PI * u2);
		a[i] = bf16_of((float)(0.02 * g));
		b[i] = a[i];
		if (u2 * 1e6 - floor(u2 * 1e6) < changed)
			b[i] = (uint16_t)(a[i] + ((x >> 3) & 1 ? 1 : -1) * (1 + (int)((x >> 5) & 1)));
	}
	memcpy(out, a, len); /* touch */
	if (r->hash <= 0) {
		t = cpu_s();
		for (int i = 0; i < 2; i++)
			hwfs_hash_buf(i ? a : b, len, &h);
		r->hash = 2 * len / GIB / (cpu_s() - t + 1e-9);
	}
	if (r->copy <= 0) {
		t = cpu_s();
		for (int i = 0; i < 2; i++)
			memcpy(out, i ? a : b, len);
		r->copy = 2 * len / GIB / (cpu_s() - t + 1e-9);
	}
	t = cpu_s();
	el = delta_encode(cx, a, b, len, 2, enc, len + 4096);
	if (el < 0) {
		rc = (int)el;
		goto out;
	}
	if (r->encode <= 0)
		r->encode = len / GIB / (cpu_s() - t + 1e-9);
	if (r->delta_ratio <= 0)
		r->delta_ratio = (double)el / len;
	t = cpu_s();
	if (delta_decode(cx, a, len, enc, (size_t)el, out, NULL, 0) < 0) {
		rc = -EINVAL;
		goto out;
	}
	if (r->decode <= 0)
		r->decode = len / GIB / (cpu_s() - t + 1e-9);
	rc = 0;
out:
	delta_ctx_free(cx);
	free(a);
	free(b);
	free(enc);
	free(out);
	return rc;
}
