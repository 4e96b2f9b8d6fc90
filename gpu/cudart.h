/*
 * cudart.h — the CUDA runtime, loaded at run time (a host-only header).
 *
 * hwfs never includes a CUDA header and never links libcudart: the runtime is
 * opened with dlopen() when a GPU is wanted, so one binary runs on machines
 * with and without a GPU and the build needs no CUDA toolkit.  This header
 * declares the handful of runtime types, constants and functions hwfs uses,
 * with the values of the CUDA 12/13 ABI (tests/gpu/cuda_abi_check.c checks
 * them against the real headers where those exist).
 *
 * The library is looked for, in order: the file named by $HWFS_CUDART (only
 * that one when set; read with secure_getenv(), so a set-id program that links
 * libhwfs never loads a library its caller names), libcudart.so.13, libcudart.so.12 (the loader's search
 * path), then the same names under /usr/local/cuda/lib64.  A runtime that
 * loads but finds the NVIDIA driver older than itself
 * (cudaErrorInsufficientDriver with a driver present: CUDA 13 on a 550-570
 * driver) is passed over for the next one; so is one that lacks a function
 * hwfs needs.  A refused runtime stays loaded (RTLD_LOCAL, never used): a
 * runtime that ran is never dlclose()d.  When none is usable, the reason of
 * the one that got farthest is given.
 *
 * Errors: cudart_open() returns 0 or a negative errno with a one-line
 * sentence; every function of the table returns a cudart_err (0 = success),
 * which cudart_strerror() turns into words.  The table is immutable once
 * opened and may be used by any thread; the CUDA current device is
 * per-thread, so a thread calls SetDevice() before it works on a device.
 */
#ifndef HWFS_CUDART_H
#define HWFS_CUDART_H

#include <stddef.h>

/* cudaError_t: 0 is success. */
typedef int cudart_err;

/* Values of the CUDA runtime ABI (driver_types.h). */
#define CUDART_SUCCESS 0
#define CUDART_ERR_MEMORY_ALLOCATION 2    /* cudaErrorMemoryAllocation */
#define CUDART_ERR_INSUFFICIENT_DRIVER 35 /* cudaErrorInsufficientDriver */
#define CUDART_ERR_NO_DEVICE 100          /* cudaErrorNoDevice */
#define CUDART_HOST_REGISTER_PORTABLE 0x01 /* cudaHostRegisterPortable */
#define CUDART_MEMCPY_H2H 0               /* cudaMemcpyHostToHost */
#define CUDART_MEMCPY_H2D 1               /* cudaMemcpyHostToDevice */
#define CUDART_MEMCPY_D2H 2               /* cudaMemcpyDeviceToHost */
#define CUDART_STREAM_NON_BLOCKING 0x01   /* cudaStreamNonBlocking */
#define CUDART_IPC_LAZY_PEER_ACCESS 0x01  /* cudaIpcMemLazyEnablePeerAccess */
#define CUDART_ATTR_CC_MAJOR 75           /* cudaDevAttrComputeCapabilityMajor */
#define CUDART_ATTR_CC_MINOR 76           /* cudaDevAttrComputeCapabilityMinor */
#define CUDART_IPC_HANDLE_SIZE 64         /* CUDA_IPC_HANDLE_SIZE */

/* cudaIpcMemHandle_t: passed by value, as the runtime does. */
typedef struct {
	char reserved[CUDART_IPC_HANDLE_SIZE];
} cudart_ipc_handle;

typedef void *cudart_stream; /* cudaStream_t */
typedef void *cudart_event;  /* cudaEvent_t */

/* The opened runtime: its functions (names as in the runtime, "cuda" dropped). */
struct cudart {
	void *dl;           /* dlopen() handle */
	char path[256];     /* the file that was opened */
	int runtime;        /* cudaRuntimeGetVersion(): 13000 = 13.0 */
	int driver;         /* cudaDriverGetVersion(): 0 when no driver */
	int devices;        /* cudaGetDeviceCount() at open */

	cudart_err (*GetDeviceCount)(int *count);
	cudart_err (*DriverGetVersion)(int *v);
	cudart_err (*RuntimeGetVersion)(int *v);
	cudart_err (*SetDevice)(int dev);
	cudart_err (*DeviceGetAttribute)(int *value, int attr, int dev);
	cudart_err (*DeviceGetPCIBusId)(char *id, int len, int dev);
	cudart_err (*DeviceGetByPCIBusId)(int *dev, const char *id);
	cudart_err (*MemGetInfo)(size_t *free_bytes, size_t *total_bytes);
	cudart_err (*HostRegister)(void *p, size_t len, unsigned int flags);
	cudart_err (*HostUnregister)(void *p);
	cudart_err (*Malloc)(void **p, size_t len);
	cudart_err (*Free)(void *p);
	cudart_err (*MallocHost)(void **p, size_t len);
	cudart_err (*FreeHost)(void *p);
	cudart_err (*Memcpy)(void *dst, const void *src, size_t len, int kind);
	cudart_err (*MemcpyAsync)(void *dst, const void *src, size_t len, int kind,
				  cudart_stream s);
	cudart_err (*StreamCreateWithFlags)(cudart_stream *s, unsigned int flags);
	cudart_err (*StreamSynchronize)(cudart_stream s);
	cudart_err (*StreamDestroy)(cudart_stream s);
	cudart_err (*EventCreate)(cudart_event *e);
	cudart_err (*EventRecord)(cudart_event e, cudart_stream s);
	cudart_err (*EventSynchronize)(cudart_event e);
	cudart_err (*EventElapsedTime)(float *ms, cudart_event start, cudart_event end);
	cudart_err (*EventDestroy)(cudart_event e);
	cudart_err (*IpcGetMemHandle)(cudart_ipc_handle *h, void *p);
	cudart_err (*IpcOpenMemHandle)(void **p, cudart_ipc_handle h, unsigned int flags);
	cudart_err (*IpcCloseMemHandle)(void *p);
	cudart_err (*DeviceSynchronize)(void);
	const char *(*GetErrorString)(cudart_err e);
	const char *(*GetErrorName)(cudart_err e);
};

/**
 * cudart_open() - load the CUDA runtime and count its devices.  *@out is the
 * table (free with cudart_close()).  Returns 0 (at least one device), or,
 * with a one-line sentence in @why (e.g. "no CUDA runtime: libcudart.so.13,
 * libcudart.so.12 not found", "no CUDA driver: ...", "no CUDA device: cudaErrorNoDevice (no
 * CUDA-capable device is detected)"): -ENOENT (no runtime library, or one
 * without a function hwfs needs), -ENODEV (a runtime but no usable device or
 * driver), -ENOMEM.
 */
int cudart_open(struct cudart **out, char *why, size_t whylen);

/** Unload @rt (NULL is a no-op); every pointer it gave must be released first. */
void cudart_close(struct cudart *rt);

/**
 * cudart_strerror() - "cudaErrorNoDevice (no CUDA-capable device is
 * detected)" for @e into @buf (@len bytes); returns @buf.
 */
const char *cudart_strerror(const struct cudart *rt, cudart_err e, char *buf, size_t len);

#endif /* HWFS_CUDART_H */
