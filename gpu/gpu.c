/*
 * gpu.c — a minimal stand-in for the node's GPU state (gpu.h), written on the
 * `loads` branch only so that the device shadow-load compiles and runs before
 * the real module (branch `node`) is merged; that one replaces this file.  It
 * probes the runtime once and keeps the reason there is none; pinning is not
 * done here (gpu_pin() answers -EOPNOTSUPP, the mode is always "none").
 */
#define _GNU_SOURCE
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "cudart.h"
#include "gpu.h"

struct gpu {
	struct cudart *rt; /* NULL: no usable GPU, see why */
	char why[512];
};

int gpu_open(struct gpu **out)
{
	struct gpu *g = calloc(1, sizeof(*g));

	if (!g)
		return -ENOMEM;
	if (cudart_open(&g->rt, g->why, sizeof(g->why)) < 0)
		g->rt = NULL;
	else
		g->why[0] = '\0';
	*out = g;
	return 0;
}

void gpu_close(struct gpu *g)
{
	if (!g)
		return;
	cudart_close(g->rt);
	free(g);
}

struct cudart *gpu_runtime(const struct gpu *g)
{
	return g->rt;
}

const char *gpu_why(const struct gpu *g)
{
	return g->rt ? "" : g->why;
}

int gpu_devices(const struct gpu *g)
{
	return g->rt ? g->rt->devices : 0;
}

int gpu_pin(struct gpu *g, void *base, uint64_t len, char *msg, size_t msglen)
{
	snprintf(msg, msglen, "pinning is not built in this stand-in");
	return -EOPNOTSUPP;
}

void gpu_unpin(struct gpu *g)
{
}

const char *gpu_pin_mode(const struct gpu *g)
{
	return "none";
}

uint64_t gpu_pinned_bytes(const struct gpu *g)
{
	return 0;
}

json_t *gpu_json(struct gpu *g)
{
	return json_null();
}
