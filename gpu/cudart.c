/*
 * cudart.c — load the CUDA runtime with dlopen() and fill the function table
 * of cudart.h.  Nothing here runs CUDA work; it finds the library, resolves
 * every function hwfs uses (a library that lacks one is refused, not used
 * half), and asks how many devices there are.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cudart.h"

/* The sonames tried, newest first, and the toolkit's directory tried after the loader's path. */
static const char *const sonames[] = {"libcudart.so.13", "libcudart.so.12"};
static const char toolkit_dir[] = "/usr/local/cuda/lib64";

/* One entry of the function table: its symbol and where it goes. */
struct sym {
	const char *name;
	size_t off; /* offsetof(struct cudart, member) */
};

#define SYM(m) {"cuda" #m, offsetof(struct cudart, m)}
static const struct sym syms[] = {
	SYM(GetDeviceCount),	SYM(DriverGetVersion),	   SYM(RuntimeGetVersion),
	SYM(SetDevice),		SYM(DeviceGetAttribute),   SYM(DeviceGetPCIBusId),
	SYM(DeviceGetByPCIBusId),
	SYM(MemGetInfo),	SYM(HostRegister),	   SYM(HostUnregister),
	SYM(Malloc),		SYM(Free),		   SYM(MallocHost),
	SYM(FreeHost),		SYM(Memcpy),		   SYM(MemcpyAsync),
	SYM(StreamCreateWithFlags), SYM(StreamSynchronize), SYM(StreamDestroy),
	SYM(EventCreate),	SYM(EventRecord),	   SYM(EventSynchronize),
	SYM(EventElapsedTime),	SYM(EventDestroy),	   SYM(IpcGetMemHandle),
	SYM(IpcOpenMemHandle),	SYM(IpcCloseMemHandle),	   SYM(DeviceSynchronize),
	SYM(GetErrorString),	SYM(GetErrorName),
};
#undef SYM

/* dlopen() @p; NULL (with dlerror() into @err) when it cannot be loaded. */
static void *load(const char *p, char *err, size_t errlen)
{
	void *dl = dlopen(p, RTLD_NOW | RTLD_LOCAL);

	if (!dl)
		snprintf(err, errlen, "%s", dlerror());
	return dl;
}

/* How far a refused candidate got: the reason of the farthest is the one said. */
enum reach { REACH_NONE, REACH_NOT_USABLE, REACH_NO_DRIVER, REACH_OLD_DRIVER, REACH_NO_DEVICE };

/*
 * Resolve the table from @rt->dl and count the devices.  Returns 0 (at least
 * one device), or -ENOENT / -ENODEV with the sentence in @why and how far
 * it got in *@got: a function hwfs needs is missing (NOT_USABLE), no NVIDIA
 * driver (NO_DRIVER), a driver older than this runtime (OLD_DRIVER), or no
 * device (NO_DEVICE).
 */
static int probe(struct cudart *rt, enum reach *got, char *why, size_t whylen)
{
	char eb[256];
	cudart_err e;

	*got = REACH_NOT_USABLE;
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *f = dlsym(rt->dl, syms[i].name);

		if (!f) {
			snprintf(why, whylen, "no usable CUDA runtime: %s has no %s", rt->path,
				 syms[i].name);
			return -ENOENT;
		}
		memcpy((char *)rt + syms[i].off, &f, sizeof(f));
	}
	rt->RuntimeGetVersion(&rt->runtime);
	if (rt->DriverGetVersion(&rt->driver) != CUDART_SUCCESS)
		rt->driver = 0;
	e = rt->GetDeviceCount(&rt->devices);
	if (e == CUDART_SUCCESS && rt->devices > 0)
		return 0;
	*got = REACH_NO_DEVICE;
	if (e == CUDART_SUCCESS) {
		snprintf(why, whylen, "no CUDA device (%s reports none)", rt->path);
	} else if (e == CUDART_ERR_INSUFFICIENT_DRIVER && rt->driver == 0) {
		*got = REACH_NO_DRIVER;
		snprintf(why, whylen, "no CUDA driver: %s loads, but no NVIDIA driver is "
			 "installed (%s)", rt->path, cudart_strerror(rt, e, eb, sizeof(eb)));
	} else if (e == CUDART_ERR_INSUFFICIENT_DRIVER) {
		*got = REACH_OLD_DRIVER;
		snprintf(why, whylen, "no CUDA device: the NVIDIA driver (CUDA %d.%d) is "
			 "older than the runtime %s (CUDA %d.%d)", rt->driver / 1000,
			 rt->driver % 1000 / 10, rt->path, rt->runtime / 1000,
			 rt->runtime % 1000 / 10);
	} else {
		snprintf(why, whylen, "no CUDA device: %s", cudart_strerror(rt, e, eb, sizeof(eb)));
	}
	rt->devices = 0;
	return -ENODEV;
}

const char *cudart_strerror(const struct cudart *rt, cudart_err e, char *buf, size_t len)
{
	const char *name = rt && rt->GetErrorName ? rt->GetErrorName(e) : NULL;
	const char *text = rt && rt->GetErrorString ? rt->GetErrorString(e) : NULL;

	if (name && text)
		snprintf(buf, len, "%s (%s)", name, text);
	else
		snprintf(buf, len, "CUDA error %d", e);
	return buf;
}

int cudart_open(struct cudart **out, char *why, size_t whylen)
{
	const char *env = secure_getenv("HWFS_CUDART");
	const char *cands[2 * sizeof(sonames) / sizeof(sonames[0])];
	void *tried[sizeof(cands) / sizeof(cands[0])];
	char paths[sizeof(cands) / sizeof(cands[0])][256], reason[512], err[256];
	enum reach best = REACH_NONE;
	size_t n = 0, ntried = 0;
	int r, best_r = -ENOENT;

	*out = NULL;
	if (env && *env) {
		cands[n++] = env; /* only that file */
	} else {
		for (int dir = 0; dir < 2; dir++)
			for (size_t i = 0; i < sizeof(sonames) / sizeof(sonames[0]); i++, n++) {
				if (dir)
					snprintf(paths[n], sizeof(paths[n]), "%s/%s", toolkit_dir,
						 sonames[i]);
				else
					snprintf(paths[n], sizeof(paths[n]), "%s", sonames[i]);
				cands[n] = paths[n];
			}
	}
	for (size_t c = 0; c < n; c++) {
		struct cudart *rt;
		void *dl = load(cands[c], err, sizeof(err));
		enum reach got;
		size_t k;

		if (!dl) {
			if (env && *env)
				snprintf(why, whylen, "no CUDA runtime: HWFS_CUDART=%s cannot be "
					 "loaded: %s", env, err);
			continue;
		}
		for (k = 0; k < ntried && tried[k] != dl; k++)
			;
		if (k < ntried)
			continue; /* the same file by another name: refused already */
		tried[ntried++] = dl;
		rt = calloc(1, sizeof(*rt));
		if (!rt) {
			snprintf(why, whylen, "out of memory");
			return -ENOMEM;
		}
		rt->dl = dl;
		snprintf(rt->path, sizeof(rt->path), "%s", cands[c]);
		r = probe(rt, &got, reason, sizeof(reason));
		if (r == 0) {
			*out = rt;
			return 0;
		}
		/* refused: left loaded (see cudart_close()), never used */
		free(rt);
		if (got > best) {
			best = got;
			best_r = r;
			snprintf(why, whylen, "%s", reason);
		}
		/*
		 * Only a driver older than this runtime is worth another candidate:
		 * an older runtime (libcudart.so.12 on a CUDA 12 driver) may run.
		 * No driver, or no device, is the same with any runtime.
		 */
		if (got != REACH_OLD_DRIVER && got != REACH_NOT_USABLE)
			break;
	}
	if (best == REACH_NONE && !(env && *env))
		snprintf(why, whylen, "no CUDA runtime: libcudart.so.13 and libcudart.so.12 not "
			 "found (set HWFS_CUDART to its path)");
	return best == REACH_NONE ? -ENOENT : best_r;
}

void cudart_close(struct cudart *rt)
{
	if (!rt)
		return;
	/*
	 * The runtime is never dlclose()d: it keeps threads and atexit handlers
	 * of its own, and unloading it under them crashes at exit.  A second
	 * dlopen() of it costs nothing.
	 */
	free(rt);
}
