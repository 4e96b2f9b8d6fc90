/*
 * gpu.h — the node's GPU state: whether this machine has a usable CUDA
 * runtime and device (probed once at start-up through gpu/cudart.h, never a
 * CUDA header), the pinning of the arena for `hwfs mount --pin`, and the
 * "gpu" object of `hwfs status`.
 *
 * No GPU is not an error: gpu_open() always gives a state, whose runtime is
 * NULL with the reason in gpu_why() when there is no library, no driver or no
 * device.  Every function may be called from any thread; the pin state and
 * the device queries of gpu_json() are serialised by a mutex inside.
 */
#ifndef HWFS_GPU_H
#define HWFS_GPU_H

#include <jansson.h>
#include <stddef.h>
#include <stdint.h>

struct gpu;
struct cudart;

/**
 * gpu_open() - probe the CUDA runtime (cudart_open()) and keep it, or keep
 * the reason there is none.  *@out is the state (free with gpu_close()).
 * Returns 0, or -ENOMEM only: no GPU is not an error.
 */
int gpu_open(struct gpu **out);

/** Free @g (NULL is a no-op); call gpu_unpin() first if it pinned anything. */
void gpu_close(struct gpu *g);

/** The runtime's function table, or NULL when this node has no usable GPU. */
struct cudart *gpu_runtime(const struct gpu *g);

/**
 * Why gpu_runtime() is NULL, one line ("no CUDA driver: libcudart.so.13 loads, but
 * no NVIDIA driver is installed (...)", "no CUDA runtime: ...", "no CUDA device: ..."),
 * or "" when there is a GPU.
 */
const char *gpu_why(const struct gpu *g);

/** How many CUDA devices this node has: 0 when none. */
int gpu_devices(const struct gpu *g);

/**
 * gpu_pin() - `hwfs mount --pin`: register [@base, @base+@len) with
 * cudaHostRegister(PORTABLE) when there is a GPU, else mlock() it.  The caller
 * has preallocated the arena (arena_preallocate(a, 0)) first, so no page of
 * the range is ever punched while pinned.  Returns 0 with a sentence in @msg
 * saying what was done ("arena pinned for CUDA: N bytes registered" / "no GPU
 * (<why>): arena locked with mlock instead (N bytes)"), or -errno with the
 * reason in @msg: -EINVAL (empty range), -EBUSY (already pinned), the mlock's
 * error (-ENOMEM, -EPERM, -EAGAIN: RLIMIT_MEMLOCK), -EIO (cudaHostRegister
 * failed).  Nothing stays pinned after an error.
 */
int gpu_pin(struct gpu *g, void *base, uint64_t len, char *msg, size_t msglen);

/** Undo gpu_pin() (a no-op when nothing is pinned); at shutdown, before the arena is unmapped. */
void gpu_unpin(struct gpu *g);

/**
 * gpu_mark_used() - this process has (or is about to make) a CUDA context on
 * device @dev: status may then ask its free and total memory (which needs the
 * device current, and so its context).  The loads code calls it before its
 * first CUDA call on a device; gpu_pin() marks device 0 (cudaHostRegister
 * makes its context).  Out of range, or no GPU: a no-op.
 */
void gpu_mark_used(struct gpu *g, int dev);

/** How the arena is pinned: "cuda" (registered), "mlock" or "none". */
const char *gpu_pin_mode(const struct gpu *g);

/** Bytes pinned by gpu_pin(): 0 when none. */
uint64_t gpu_pinned_bytes(const struct gpu *g);

/**
 * gpu_json() - status's "gpu": json_null() when there is no usable GPU, else
 * {"library", "runtime": "13.0", "driver": "13.0", "devices": [{"index", "pci",
 * "cc", "total_bytes", "free_bytes"}], "pinned_bytes"} (a device whose query
 * fails has "error" instead of its figures).  Memory is asked only of devices
 * this process has a context on (gpu_mark_used(), gpu_pin()); the others have
 * "memory": "not queried (no context on this device)" instead of the two
 * byte counts: status never makes a context.  Returns a new reference, NULL
 * only when out of memory.
 */
json_t *gpu_json(struct gpu *g);

#endif /* HWFS_GPU_H */
