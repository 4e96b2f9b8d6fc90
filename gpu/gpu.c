/*
 * gpu.c — the node's GPU state (gpu.h): the runtime probed once at start-up,
 * the pinned arena, and status's "gpu" object.
 *
 * gpu_open() asks cudart_open() for the runtime.  Whatever stands in the way
 * (no library, a library without a driver, no device) is kept as one line in
 * why[] and the node runs without a GPU: status says why, and `hwfs mount
 * --pin` falls back to mlock().
 *
 * Pinning: with a GPU the whole arena is registered with
 * cudaHostRegister(PORTABLE), so a host-to-device copy from any version reads
 * page-locked memory straight away, on every device, with no staging buffer.
 * Without one, mlock() keeps the same promise to the host side (the pages stay
 * resident, never swapped, never punched: the arena is preallocated first).
 * mlock() is called as the system call: sanitizer runtimes replace the libc
 * function with one that does nothing and succeeds, and status must never
 * claim a lock that is not there.
 *
 * The pin state is under mu, as are the device queries of gpu_json() (status
 * runs in any control thread; the CUDA current device is per thread, so each
 * query sets it first).
 *
 * Contexts: a CUDA context costs some 0.3-0.5 GiB of a device's memory, and
 * on a device in EXCLUSIVE_PROCESS compute mode it locks every other process
 * out.  So status never makes one: a device's free and total memory
 * (cudaMemGetInfo, which needs the device current, and cudaSetDevice creates
 * its primary context) are asked only of devices this daemon has a context on
 * already: device 0 once the arena is registered (cudaHostRegister makes
 * one), and the devices gpu_mark_used() names (the loads code marks a device
 * before its first CUDA call on it).  Of the others status gives the index,
 * the PCI address and the compute capability, which the runtime answers
 * without a context (cudaDeviceGetPCIBusId, cudaDeviceGetAttribute).
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "cudart.h"
#include "gpu.h"
#include "hwfs_common.h"

enum pin_mode { PIN_NONE, PIN_CUDA, PIN_MLOCK };

struct gpu {
	struct cudart *rt; /* NULL: no usable GPU (why[] says why); immutable after gpu_open() */
	char why[512];
	pthread_mutex_t mu;
	enum pin_mode mode; /* under mu */
	void *base;         /* the pinned range, under mu */
	uint64_t len;
	unsigned char *used;/* rt->devices flags, under mu: this process has a context there */
};

int gpu_open(struct gpu **out)
{
	struct gpu *g = calloc(1, sizeof(*g));
	int r;

	*out = NULL;
	if (!g)
		return -ENOMEM;
	pthread_mutex_init(&g->mu, NULL);
	r = cudart_open(&g->rt, g->why, sizeof(g->why));
	if (r == -ENOMEM) {
		pthread_mutex_destroy(&g->mu);
		free(g);
		return r;
	}
	if (r < 0) {
		g->rt = NULL;
		if (!g->why[0])
			snprintf(g->why, sizeof(g->why), "no CUDA runtime: %s", strerror(-r));
		/* one line, whatever dlerror() or the runtime said */
		for (char *p = g->why; *p; p++)
			if ((unsigned char)*p < 0x20 || *p == 0x7f)
				*p = ' ';
		/* the one GPU line of a mount (the daemon adds none) */
		LOG_INFO("gpu: none (%s); hwfs load is refused", g->why);
	} else {
		g->why[0] = '\0';
		g->used = calloc((size_t)g->rt->devices, 1);
		if (!g->used) {
			cudart_close(g->rt);
			pthread_mutex_destroy(&g->mu);
			free(g);
			return -ENOMEM;
		}
		LOG_INFO("gpu: %d CUDA device(s), runtime %d, driver %d (%s)", g->rt->devices,
			 g->rt->runtime, g->rt->driver, g->rt->path);
	}
	*out = g;
	return 0;
}

void gpu_close(struct gpu *g)
{
	if (!g)
		return;
	if (g->mode != PIN_NONE)
		LOG_WARN("gpu: closed with the arena still pinned (%s)", gpu_pin_mode(g));
	cudart_close(g->rt);
	pthread_mutex_destroy(&g->mu);
	free(g->used);
	free(g);
}

struct cudart *gpu_runtime(const struct gpu *g)
{
	return g->rt;
}

const char *gpu_why(const struct gpu *g)
{
	return g->why;
}

int gpu_devices(const struct gpu *g)
{
	return g->rt ? g->rt->devices : 0;
}

int gpu_pin(struct gpu *g, void *base, uint64_t len, char *msg, size_t msglen)
{
	char eb[256];
	int r = 0;

	if (!base || !len || len > SIZE_MAX) {
		hwfs_set_err(msg, msglen, "cannot pin an empty range");
		return -EINVAL;
	}
	pthread_mutex_lock(&g->mu);
	if (g->mode != PIN_NONE) {
		hwfs_set_err(msg, msglen, "the arena is pinned already (%s)",
			     g->mode == PIN_CUDA ? "cuda" : "mlock");
		r = -EBUSY;
		goto out;
	}
	if (g->rt) {
		cudart_err e = g->rt->HostRegister(base, (size_t)len, CUDART_HOST_REGISTER_PORTABLE);

		if (e != CUDART_SUCCESS) {
			hwfs_set_err(msg, msglen, "cannot pin the arena for CUDA: cudaHostRegister "
				     "of %llu bytes: %s", (unsigned long long)len,
				     cudart_strerror(g->rt, e, eb, sizeof(eb)));
			r = -EIO;
			goto out;
		}
		g->mode = PIN_CUDA;
		g->used[0] = 1; /* cudaHostRegister made device 0's primary context */
		hwfs_set_err(msg, msglen, "arena pinned for CUDA: %llu bytes registered",
			     (unsigned long long)len);
	} else {
		if (syscall(SYS_mlock, base, (size_t)len) < 0) {
			r = -errno;
			hwfs_set_err(msg, msglen, "no GPU (%s): arena not locked either: mlock of "
				     "%llu bytes refused: %s%s", g->why, (unsigned long long)len,
				     strerror(-r), r == -ENOMEM || r == -EPERM || r == -EAGAIN
						 ? " (RLIMIT_MEMLOCK: ulimit -l, or run as root)"
						 : "");
			goto out;
		}
		g->mode = PIN_MLOCK;
		hwfs_set_err(msg, msglen, "no GPU (%s): arena locked with mlock instead (%llu bytes)",
			     g->why, (unsigned long long)len);
	}
	g->base = base;
	g->len = len;
out:
	pthread_mutex_unlock(&g->mu);
	return r;
}

void gpu_unpin(struct gpu *g)
{
	char eb[256];

	if (!g)
		return;
	pthread_mutex_lock(&g->mu);
	if (g->mode == PIN_CUDA) {
		cudart_err e = g->rt->HostUnregister(g->base);

		if (e != CUDART_SUCCESS)
			LOG_WARN("gpu: cudaHostUnregister: %s",
				 cudart_strerror(g->rt, e, eb, sizeof(eb)));
	} else if (g->mode == PIN_MLOCK && syscall(SYS_munlock, g->base, (size_t)g->len) < 0) {
		LOG_WARN("gpu: munlock: %s", strerror(errno));
	}
	g->mode = PIN_NONE;
	g->base = NULL;
	g->len = 0;
	pthread_mutex_unlock(&g->mu);
}

void gpu_mark_used(struct gpu *g, int dev)
{
	if (!g->rt || dev < 0 || dev >= g->rt->devices)
		return;
	pthread_mutex_lock(&g->mu);
	g->used[dev] = 1;
	pthread_mutex_unlock(&g->mu);
}

const char *gpu_pin_mode(const struct gpu *g)
{
	struct gpu *m = (struct gpu *)g;
	enum pin_mode mode;

	pthread_mutex_lock(&m->mu);
	mode = m->mode;
	pthread_mutex_unlock(&m->mu);
	return mode == PIN_CUDA ? "cuda" : mode == PIN_MLOCK ? "mlock" : "none";
}

uint64_t gpu_pinned_bytes(const struct gpu *g)
{
	struct gpu *m = (struct gpu *)g;
	uint64_t len;

	pthread_mutex_lock(&m->mu);
	len = m->len;
	pthread_mutex_unlock(&m->mu);
	return len;
}

/* A CUDA version number (13000, 12040) as people write it ("13.0", "12.4"); @buf returned. */
static const char *cuda_version(int v, char *buf, size_t len)
{
	snprintf(buf, len, "%d.%d", v / 1000, (v % 1000) / 10);
	return buf;
}

/*
 * One entry of "devices": device @dev's PCI address and compute capability,
 * and its memory when this process has a context there already (mu held).
 */
static json_t *device_json(struct gpu *g, int dev)
{
	struct cudart *rt = g->rt;
	int major = 0, minor = 0;
	size_t free_b = 0, total_b = 0;
	char pci[64] = "", cc[16], eb[256];
	json_t *o = json_pack("{s:i}", "index", dev);
	cudart_err e;

	if (!o)
		return NULL;
	/* no context needed for these two */
	e = rt->DeviceGetPCIBusId(pci, (int)sizeof(pci), dev);
	if (e == CUDART_SUCCESS)
		e = rt->DeviceGetAttribute(&major, CUDART_ATTR_CC_MAJOR, dev);
	if (e == CUDART_SUCCESS)
		e = rt->DeviceGetAttribute(&minor, CUDART_ATTR_CC_MINOR, dev);
	/* cudaSetDevice makes the primary context: only where there is one already */
	if (e == CUDART_SUCCESS && g->used[dev])
		e = rt->SetDevice(dev);
	if (e == CUDART_SUCCESS && g->used[dev])
		e = rt->MemGetInfo(&free_b, &total_b);
	if (e != CUDART_SUCCESS) {
		json_object_set_new(o, "error", json_string(cudart_strerror(rt, e, eb, sizeof(eb))));
		return o;
	}
	pci[sizeof(pci) - 1] = '\0';
	for (char *p = pci; *p; p++)
		*p = (char)tolower((unsigned char)*p);
	snprintf(cc, sizeof(cc), "%d.%d", major, minor);
	json_object_set_new(o, "pci", json_string(pci));
	json_object_set_new(o, "cc", json_string(cc));
	if (g->used[dev]) {
		json_object_set_new(o, "total_bytes", json_integer((json_int_t)total_b));
		json_object_set_new(o, "free_bytes", json_integer((json_int_t)free_b));
	} else {
		json_object_set_new(o, "memory", json_string("not queried (no context on this "
							     "device)"));
	}
	return o;
}

json_t *gpu_json(struct gpu *g)
{
	char rv[16], dv[16];
	json_t *o, *devs;

	if (!g->rt)
		return json_null();
	o = json_pack("{s:s, s:s, s:s, s:[]}", "library", g->rt->path, "runtime",
		      cuda_version(g->rt->runtime, rv, sizeof(rv)), "driver",
		      cuda_version(g->rt->driver, dv, sizeof(dv)), "devices");
	if (!o)
		return NULL;
	devs = json_object_get(o, "devices");
	pthread_mutex_lock(&g->mu);
	for (int i = 0; i < g->rt->devices; i++) {
		json_t *d = device_json(g, i);

		if (d)
			json_array_append_new(devs, d);
	}
	json_object_set_new(o, "pinned_bytes", json_integer((json_int_t)g->len));
	pthread_mutex_unlock(&g->mu);
	return o;
}
