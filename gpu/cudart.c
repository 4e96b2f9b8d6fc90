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

/* dlopen() the first library found; its path into @path. Returns the handle or NULL. */
static void *find_library(char *path, size_t len, char *why, size_t whylen)
{
	const char *env = getenv("HWFS_CUDART");
	void *dl;

	if (env && *env) {
		dl = dlopen(env, RTLD_NOW | RTLD_LOCAL);
		if (!dl)
			snprintf(why, whylen, "no CUDA runtime: HWFS_CUDART=%s cannot be loaded: %s",
				 env, dlerror());
		else
			snprintf(path, len, "%s", env);
		return dl;
	}
	for (int dir = 0; dir < 2; dir++) {
		for (size_t i = 0; i < sizeof(sonames) / sizeof(sonames[0]); i++) {
			char p[256];

			if (dir)
				snprintf(p, sizeof(p), "%s/%s", toolkit_dir, sonames[i]);
			else
				snprintf(p, sizeof(p), "%s", sonames[i]);
			dl = dlopen(p, RTLD_NOW | RTLD_LOCAL);
			if (dl) {
				snprintf(path, len, "%s", p);
				return dl;
			}
		}
	}
	snprintf(why, whylen, "no CUDA runtime: libcudart.so.13 and libcudart.so.12 not found "
		 "(set HWFS_CUDART to its path)");
	return NULL;
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
	struct cudart *rt = calloc(1, sizeof(*rt));
	char eb[256];
	cudart_err e;

	*out = NULL;
	if (!rt) {
		snprintf(why, whylen, "out of memory");
		return -ENOMEM;
	}
	rt->dl = find_library(rt->path, sizeof(rt->path), why, whylen);
	if (!rt->dl) {
		free(rt);
		return -ENOENT;
	}
	for (size_t i = 0; i < sizeof(syms) / sizeof(syms[0]); i++) {
		void *f = dlsym(rt->dl, syms[i].name);

		if (!f) {
			snprintf(why, whylen, "no usable CUDA runtime: %s has no %s", rt->path,
				 syms[i].name);
			cudart_close(rt);
			return -ENOENT;
		}
		memcpy((char *)rt + syms[i].off, &f, sizeof(f));
	}
	rt->RuntimeGetVersion(&rt->runtime);
	if (rt->DriverGetVersion(&rt->driver) != CUDART_SUCCESS)
		rt->driver = 0;
	e = rt->GetDeviceCount(&rt->devices);
	if (e != CUDART_SUCCESS || rt->devices <= 0) {
		if (e == CUDART_SUCCESS)
			snprintf(why, whylen, "no CUDA device (%s reports none)", rt->path);
		else if (e == CUDART_ERR_INSUFFICIENT_DRIVER && rt->driver == 0)
			snprintf(why, whylen, "no CUDA driver: %s loads, but no NVIDIA driver is "
				 "installed (%s)", rt->path, cudart_strerror(rt, e, eb, sizeof(eb)));
		else if (e == CUDART_ERR_INSUFFICIENT_DRIVER)
			snprintf(why, whylen, "no CUDA device: the NVIDIA driver (CUDA %d.%d) is "
				 "older than the runtime %s (CUDA %d.%d)", rt->driver / 1000,
				 rt->driver % 1000 / 10, rt->path, rt->runtime / 1000,
				 rt->runtime % 1000 / 10);
		else
			snprintf(why, whylen, "no CUDA device: %s",
				 cudart_strerror(rt, e, eb, sizeof(eb)));
		cudart_close(rt);
		return -ENODEV;
	}
	*out = rt;
	return 0;
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
